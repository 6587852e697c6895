//! The PostgreSQL schema's versioned migrations and applying them: the SQL (tables and the
//! server-side functions every write goes through) is in `store/migrations/postgres/`.
//! Migrating takes a transaction-scoped advisory lock, so of two processes opening an empty
//! database at once one migrates and the other waits, then finds it done.

use tokio_postgres::Client;

use crate::port::{StoreError, StoreResult};
use autocomp_model::{InvalidInput, WORK_MINUTES_IN_HOUR, WORK_MINUTES_KEPT};

/// One row of `MIGRATIONS`: the file `NNNN_<what>.sql` as version NNNN.
macro_rules! migration {
    ($version:literal, $name:literal) => {
        ($version, $name, include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/migrations/postgres/", $name, ".sql")))
    };
}

/// Ordered migrations: (version, name, SQL). Each one's SQL is a numbered file of
/// `store/migrations/postgres/`, compiled in (`include_str!`, so cargo rebuilds when a file
/// changes). Never edit a released one, append a new one.
const MIGRATIONS: &[(i32, &str, &str)] = &[
    migration!(1, "0001_batches_and_runs"),
    migration!(2, "0002_registry"),
    migration!(3, "0003_work_tallies"),
    migration!(4, "0004_claim_many"),
    migration!(5, "0005_batch_sizes"),
    migration!(6, "0006_steering"),
    migration!(7, "0007_history"),
    migration!(8, "0008_change_notify"),
    migration!(9, "0009_claim_ready"),
    migration!(10, "0010_change_concerns"),
    migration!(11, "0011_run_liveness"),
    migration!(12, "0012_acknowledged"),
    migration!(13, "0013_run_outputs"),
    migration!(14, "0014_pruned_histories"),
    migration!(15, "0015_registration_concern"),
    migration!(16, "0016_claim_judged"),
    migration!(17, "0017_register_batch"),
    migration!(18, "0018_kept_summaries"),
];

pub const LATEST_VERSION: i32 = MIGRATIONS[MIGRATIONS.len() - 1].0;

/// Advisory lock keys (per database). The feed key is held shared by every writer from the
/// moment it takes a seq until it commits, and taken exclusively for an instant by a feed
/// reader: see `autocomp_next_seq` and `autocomp_horizon`.
pub const MIGRATION_LOCK: i64 = 0x6175_746f_636f_6d01; // "autocom" + 1
pub const FEED_LOCK: i64 = 0x6175_746f_636f_6d02;

fn unavailable(error: tokio_postgres::Error) -> StoreError {
    StoreError::Unavailable(super::describe_error(&error))
}

/// The schema version the database is at (0: empty). One round trip: this runs at every
/// cron start.
pub async fn schema_version(client: &Client) -> StoreResult<i32> {
    match client.query_one("SELECT COALESCE(MAX(version), 0) FROM schema_version", &[]).await {
        Ok(row) => Ok(row.get(0)),
        Err(error) if error.code() == Some(&tokio_postgres::error::SqlState::UNDEFINED_TABLE) => Ok(0),
        Err(error) => Err(unavailable(error)),
    }
}

/// Refuses a database a newer release has migrated.
pub fn check_not_newer(current: i32) -> StoreResult<()> {
    if current > LATEST_VERSION {
        return Err(StoreError::SchemaNewer(format!(
            "the PostgreSQL store has schema version {current}, newer than this release knows \
             ({LATEST_VERSION}); upgrade autocomp before using it"
        )));
    }
    Ok(())
}

/// Applies the missing migrations in one transaction under the migration lock; returns the
/// versions applied (none when another process got there first).
pub async fn migrate(client: &mut Client, target: &str) -> StoreResult<Vec<i32>> {
    migrate_up_to(client, target, LATEST_VERSION).await
}

/// Applies the missing migrations up to `version` (a lower one builds the database an older
/// release left, for upgrade tests).
pub async fn migrate_up_to(client: &mut Client, target: &str, version: i32) -> StoreResult<Vec<i32>> {
    let tx = client.transaction().await.map_err(unavailable)?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK]).await.map_err(unavailable)?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS schema_version (
             version    integer PRIMARY KEY,
             applied_at bigint NOT NULL
         )",
    )
    .await
    .map_err(|e| privileges(e, target, "create tables"))?;
    let current: i32 =
        tx.query_one("SELECT COALESCE(MAX(version), 0) FROM schema_version", &[]).await.map_err(unavailable)?.get(0);
    check_not_newer(current)?;
    let mut applied = Vec::new();
    let up_to = version;
    for (version, _name, sql) in MIGRATIONS.iter().filter(|(version, _, _)| *version > current && *version <= up_to) {
        let sql = sql
            .replace("@FEED_LOCK@", &FEED_LOCK.to_string())
            .replace("@WORK_MINUTES_KEPT@", &WORK_MINUTES_KEPT.to_string())
            .replace("@WORK_MINUTES_IN_HOUR@", &WORK_MINUTES_IN_HOUR.to_string())
            .replace("@WORK_HOURS_KEPT@", &autocomp_model::WORK_HOURS_KEPT.to_string());
        tx.batch_execute(&sql).await.map_err(|e| {
            StoreError::Unavailable(format!("migration to schema {version} failed: {}", super::describe_error(&e)))
        })?;
        tx.execute(
            "INSERT INTO schema_version (version, applied_at) VALUES ($1, (extract(epoch FROM now()) * 1000)::bigint)",
            &[version],
        )
        .await
        .map_err(unavailable)?;
        applied.push(*version);
    }
    tx.commit().await.map_err(unavailable)?;
    Ok(applied)
}

fn privileges(error: tokio_postgres::Error, target: &str, what: &str) -> StoreError {
    if error.code() == Some(&tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE) {
        return InvalidInput::new(
            "store url",
            target,
            format!(
                "the role may not {what} in the database ({}); make it the database's owner",
                super::describe_error(&error)
            ),
        )
        .into();
    }
    unavailable(error)
}

#[cfg(test)]
mod tests {
    use super::MIGRATIONS;

    /// The table numbers its rows 1, 2, ... as their files are numbered, and names every file
    /// of the directory: a file added without its row would never be applied.
    #[test]
    fn the_table_names_every_migration_file_in_order() {
        for (index, (version, name, sql)) in MIGRATIONS.iter().enumerate() {
            assert_eq!(*version, index as i32 + 1);
            assert!(name.starts_with(&format!("{version:04}_")), "{name}");
            assert!(!sql.trim().is_empty(), "{name}");
        }
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/migrations/postgres");
        let mut files: Vec<String> =
            std::fs::read_dir(dir).unwrap().map(|entry| entry.unwrap().file_name().into_string().unwrap()).collect();
        files.sort();
        let named: Vec<String> = MIGRATIONS.iter().map(|(_, name, _)| format!("{name}.sql")).collect();
        assert_eq!(files, named);
    }
}
