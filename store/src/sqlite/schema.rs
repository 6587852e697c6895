//! The SQLite schema's migrations (the SQL is in `store/migrations/sqlite/`) and applying
//! them. A store file records the versions applied to it in `schema_version`; opening it
//! applies the missing ones in one immediate transaction, so a newer release upgrades a file
//! in place and concurrent openers cannot both migrate.

use rusqlite::{Connection, TransactionBehavior, params};

use crate::port::{StoreError, StoreResult};
use autocomp_model::Timestamp;

use super::unavailable;

/// One row of `MIGRATIONS`: the file `NNNN_<what>.sql` as version NNNN.
macro_rules! migration {
    ($version:literal, $name:literal) => {
        ($version, $name, include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/migrations/sqlite/", $name, ".sql")))
    };
}

/// Ordered migrations: (version, name, SQL). Each one's SQL is a numbered file of
/// `store/migrations/sqlite/`, compiled in (`include_str!`, so cargo rebuilds when a file
/// changes). Never edit a released one, append a new one.
/// Schemas 7 and 8 also need Rust: every batch's summary is filled in by
/// `summary::backfill` after the SQL (see `migrate_up_to`), not by a file here.
const MIGRATIONS: &[(i64, &str, &str)] = &[
    migration!(1, "0001_batches_and_runs"),
    migration!(2, "0002_checkpoints"),
    migration!(3, "0003_cancelled_runs"),
    migration!(4, "0004_claim_keys"),
    migration!(5, "0005_registry"),
    migration!(6, "0006_work_tallies"),
    migration!(7, "0007_batch_summaries"),
    migration!(8, "0008_batch_sizes"),
    migration!(9, "0009_steering"),
    migration!(10, "0010_history"),
    migration!(11, "0011_run_liveness"),
    migration!(12, "0012_run_outputs"),
    migration!(13, "0013_pruned_histories"),
    migration!(14, "0014_takers"),
];

pub const LATEST_VERSION: i64 = MIGRATIONS[MIGRATIONS.len() - 1].0;

pub fn migrate(conn: &mut Connection) -> StoreResult<()> {
    migrate_up_to(conn, LATEST_VERSION)
}

/// Applies the migrations up to `target` (a lower target builds old files for upgrade tests).
pub fn migrate_up_to(conn: &mut Connection, target: i64) -> StoreResult<()> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(unavailable)?;
    tx.execute_batch(
        "CREATE TABLE IF NOT EXISTS schema_version (
             version    INTEGER PRIMARY KEY,
             applied_at INTEGER NOT NULL
         )",
    )
    .map_err(unavailable)?;
    let current: i64 = tx
        .query_row("SELECT COALESCE(MAX(version), 0) FROM schema_version", [], |row| row.get(0))
        .map_err(unavailable)?;
    if current > LATEST_VERSION {
        return Err(StoreError::SchemaNewer(format!(
            "the store file has schema version {current}, newer than this release knows ({LATEST_VERSION}); \
             upgrade autocomp before opening it"
        )));
    }
    for (version, _name, sql) in MIGRATIONS.iter().filter(|(version, _, _)| *version > current && *version <= target) {
        tx.execute_batch(sql)
            .map_err(|e| StoreError::Unavailable(format!("migration to schema {version} failed: {e}")))?;
        tx.execute(
            "INSERT INTO schema_version (version, applied_at) VALUES (?1, ?2)",
            params![version, Timestamp::now().millis()],
        )
        .map_err(unavailable)?;
    }
    // Summaries came with schema 7; schema 8's release stores more of each effective event
    // in them (whether it was skipped, the content it was worked out from), so one written
    // before does not decode. Either way every batch's is computed here, once, instead of
    // from its log on every read.
    if current < 8 && target >= 7 {
        let filled = super::summary::backfill(&tx)?;
        if filled > 0 {
            tracing::info!(batches = filled, "store upgraded: batch summaries filled in");
        }
    }
    tx.commit().map_err(unavailable)
}

pub fn schema_version(conn: &Connection) -> StoreResult<i64> {
    conn.query_row("SELECT COALESCE(MAX(version), 0) FROM schema_version", [], |row| row.get(0)).map_err(unavailable)
}

#[cfg(test)]
mod tests {
    use super::MIGRATIONS;

    /// The table numbers its rows 1, 2, ... as their files are numbered, and names every file
    /// of the directory: a file added without its row would never be applied.
    #[test]
    fn the_table_names_every_migration_file_in_order() {
        for (index, (version, name, sql)) in MIGRATIONS.iter().enumerate() {
            assert_eq!(*version, index as i64 + 1);
            assert!(name.starts_with(&format!("{version:04}_")), "{name}");
            assert!(!sql.trim().is_empty(), "{name}");
        }
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/migrations/sqlite");
        let mut files: Vec<String> =
            std::fs::read_dir(dir).unwrap().map(|entry| entry.unwrap().file_name().into_string().unwrap()).collect();
        files.sort();
        let named: Vec<String> = MIGRATIONS.iter().map(|(_, name, _)| format!("{name}.sql")).collect();
        assert_eq!(files, named);
    }
}
