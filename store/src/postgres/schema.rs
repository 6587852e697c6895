//! The PostgreSQL schema's versioned migrations and applying them: the SQL (tables and the
//! server-side functions every write goes through) is in `store/migrations/postgres/`.
//! Migrating takes a transaction-scoped advisory lock, so of two processes opening an empty
//! database at once one migrates and the other waits, then finds it done. A migration held up
//! by a long transaction's lock (`Patience`) is rolled back and tried again, so the writers
//! queued behind it go on meanwhile.

use std::time::Duration;

use tokio_postgres::Client;
use tokio_postgres::error::SqlState;

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
    migration!(19, "0019_feed_epochs"),
    migration!(20, "0020_feed_epochs_alone"),
    migration!(21, "0021_one_row_version"),
    migration!(22, "0022_key_lookups_by_index"),
    migration!(23, "0023_flat_judged_claim"),
    migration!(24, "0024_takers"),
    migration!(25, "0025_hand_on_announced"),
    migration!(26, "0026_hand_on_in_the_writers_row"),
    migration!(27, "0027_notify_triggers_without_rereads"),
    migration!(28, "0028_registration_writes_its_row_once"),
];

pub const LATEST_VERSION: i32 = MIGRATIONS[MIGRATIONS.len() - 1].0;
/// The oldest schema this release runs on: 19 has every function it calls, its writers
/// holding the old feed lock as well as their epoch's key (correct, and slower), for when 20
/// waits for a transaction left open (`AFTER_EARLIER_TRANSACTIONS`). Hand-ons need 24: below
/// it the store keeps no takers (`hand_on.rs`); from 25 a hand-on is announced to its taker.
pub const OLDEST_RUNNABLE: i32 = 19;

/// Advisory lock keys (per database). Every writer holds the key of a feed epoch, shared,
/// from before it takes a seq until it ends (`autocomp_feed_hold`); a horizon read, one at a
/// time (`FEED_READERS`), ends the epoch and confirms an ended epoch once its key is free, so
/// writers that begin meanwhile go on, and a look's read need not wait at all
/// (`autocomp_feed_horizon`, migration 19). Until schema 19 writers held
/// `FEED_LOCK` shared and a horizon read took it exclusively; at schema 19 writers hold both
/// and a read takes both, for the calls of the release before still under way; from schema
/// 20 writers hold their epoch's key alone, and a read still takes `FEED_LOCK` (at once, when
/// nobody holds it).
pub const MIGRATION_LOCK: i64 = 0x6175_746f_636f_6d01; // "autocom" + 1
pub const FEED_LOCK: i64 = 0x6175_746f_636f_6d02;
pub const FEED_READERS: i64 = 0x6175_746f_636f_6d03;
/// The first of the two integer keys an epoch's key is (the second: the epoch, modulo
/// 2^31 - 1): "auf" + 1, apart from every one-number key above.
pub const FEED_EPOCHS: i32 = 0x6175_6631;

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

/// Applies the missing migrations under the migration lock, in one transaction (two around a
/// migration that waits for earlier transactions); returns the versions applied (none when
/// another process got there first). How a migration meets a table's lock another
/// transaction holds: `patience`.
pub async fn migrate(client: &mut Client, target: &str, patience: Patience) -> StoreResult<Vec<i32>> {
    migrate_up_to(client, target, LATEST_VERSION, patience).await
}

/// How a migration meets a table's lock another transaction holds (a session left inside
/// `BEGIN`, a dump): while it waits for that lock PostgreSQL queues every writer of the
/// table behind it, so each try waits `deadlock_timeout` and half a second at most for each
/// lock (an autovacuum in its way is cancelled at `deadlock_timeout`, as for any waiter), is
/// then rolled back and tried again after `MIGRATION_RETRY_PAUSE`. Every try first waits for
/// the migration lock, which another process's try holds.
#[derive(Clone, Copy, Debug)]
pub enum Patience {
    /// A store's open that finds a schema this release runs on: one try (after another
    /// process's migration, if one holds the migration lock), and on a lock-out the process
    /// runs on that schema.
    Once,
    /// `autocomp-store migrate`, or an open that cannot run on the schema it found: tries
    /// again for this long after the first lock-out (and again after migration 20's wait for
    /// earlier transactions), then fails naming the transactions holding the store's tables.
    For(Duration),
}

/// How long `autocomp-store migrate` tries again a migration held up by a table's lock.
pub const MIGRATION_PATIENCE: Duration = Duration::from_secs(60);
/// The pause between two tries, in which the writers queued behind the last one go on.
const MIGRATION_RETRY_PAUSE: Duration = Duration::from_millis(500);

/// Applies the missing migrations up to `version` (a lower one builds the database an older
/// release left, for upgrade tests). Those before a migration that must wait for earlier
/// transactions (`AFTER_EARLIER_TRANSACTIONS`) commit first; it is applied in a transaction
/// of its own once they have ended.
pub async fn migrate_up_to(
    client: &mut Client,
    target: &str,
    version: i32,
    patience: Patience,
) -> StoreResult<Vec<i32>> {
    let mut applied = Vec::new();
    let mut waited = None;
    let mut deadline = None;
    loop {
        let outcome = apply_until_a_wait(client, target, version, waited, &mut applied).await?;
        let (blocked, patience) = match (outcome, patience) {
            (Attempt::Applied(Some(next)), _) => {
                wait_for_earlier_transactions(client, next).await?;
                waited = Some(next);
                // The tries after that wait have their own time.
                deadline = None;
                continue;
            }
            (Attempt::Applied(None), _) => return Ok(applied),
            (Attempt::LockedOut(blocked), Patience::Once) => return Err(locked_out(client, blocked, None).await),
            (Attempt::LockedOut(blocked), Patience::For(patience)) => (blocked, patience),
        };
        let (now, first) = (tokio::time::Instant::now(), deadline.is_none());
        if now >= *deadline.get_or_insert(now + patience) {
            return Err(locked_out(client, blocked, Some(patience)).await);
        }
        if first {
            tracing::warn!(
                "migration to schema {blocked} waits for a table another transaction holds: trying again for up \
                 to {} s, each try holding the table's writers up about deadlock_timeout and half a second at most",
                patience.as_secs()
            );
        }
        tokio::time::sleep(MIGRATION_RETRY_PAUSE).await;
    }
}

/// How one transaction of migrations ended.
enum Attempt {
    /// Committed; the migration that waits for earlier transactions next, if one does.
    Applied(Option<i32>),
    /// Rolled back: this version's statements waited past the try's `lock_timeout` for a
    /// lock (or deadlocked with a writer).
    LockedOut(i32),
}

/// Why migration `version` gave up: the sessions of this database holding locks on the
/// store's tables in a transaction begun over a second ago, oldest first, and the prepared
/// transactions holding them (no session: `pg_locks` names none, so each is found by its
/// transaction id's lock and named by its gid). Another role's session shows no kind or age
/// to a role that is not a superuser (nor `pg_read_all_stats`): it is named by its pid alone.
async fn locked_out(client: &Client, version: i32, patience: Option<Duration>) -> StoreError {
    const HOLDERS: &str = "SELECT l.pid, a.backend_type,
                extract(epoch FROM now() - coalesce(a.xact_start, p.prepared))::bigint, p.gid
         FROM pg_locks l JOIN pg_class c ON c.oid = l.relation LEFT JOIN pg_stat_activity a ON a.pid = l.pid
         LEFT JOIN pg_locks x ON l.pid IS NULL AND x.pid IS NULL AND x.locktype = 'transactionid'
             AND x.virtualtransaction = l.virtualtransaction
         LEFT JOIN pg_prepared_xacts p ON p.transaction = x.transactionid
         WHERE l.granted AND l.pid IS DISTINCT FROM pg_backend_pid()
           AND c.relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = current_schema())
           AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
           AND (l.pid IS NOT NULL OR p.gid IS NOT NULL)
           AND (coalesce(a.xact_start, p.prepared) IS NULL
                OR coalesce(a.xact_start, p.prepared) < now() - interval '1 second')
         GROUP BY 1, 2, 3, 4 ORDER BY 3 DESC NULLS FIRST, 1";
    let holders = match client.query(HOLDERS, &[]).await {
        Ok(rows) if rows.is_empty() => "none now".to_owned(),
        Ok(rows) => rows.iter().map(holder).collect::<Vec<_>>().join(", "),
        Err(e) => format!("unknown ({})", super::describe_error(&e)),
    };
    let tried = match patience {
        Some(patience) => format!("within {} s of tries", patience.as_secs()),
        None => "in one try".to_owned(),
    };
    StoreError::Unavailable(format!(
        "migration to schema {version} could not lock its tables {tried} (each waits for a lock about \
         deadlock_timeout and half a second at most, holding writers up no longer); transactions holding the \
         store's tables: {holders} (pg_stat_activity names the sessions, pg_prepared_xacts the prepared); end a \
         long transaction, or migrate again later"
    ))
}

/// One holder of `locked_out`'s list, as its row names it.
fn holder(row: &tokio_postgres::Row) -> String {
    let (pid, kind, secs) = (row.get::<_, Option<i32>>(0), row.get::<_, Option<String>>(1), row.get(2));
    match (pid, kind, secs, row.get::<_, Option<String>>(3)) {
        (None, _, Some::<i64>(secs), Some(gid)) => format!(
            "prepared transaction '{}' (prepared {secs} s ago; COMMIT PREPARED or ROLLBACK PREPARED ends it)",
            autocomp_toolkit::terminal::one_line(&gid)
        ),
        (Some(pid), Some(kind), Some(secs), _) => format!("pid {pid} ({kind}, in a transaction for {secs} s)"),
        (pid, ..) => format!("pid {} (another role's session)", pid.unwrap_or_default()),
    }
}

/// Migrations applied only once every transaction begun before they start has ended: 20
/// drops the old feed lock from the writers' hold, which a horizon read of the release
/// before 19 (a call begun before 19 committed) still counts on.
const AFTER_EARLIER_TRANSACTIONS: &[i32] = &[20];
/// How long a migration waits for them before it fails, naming the sessions that hold it.
const EARLIER_TRANSACTIONS_WAIT: Duration = Duration::from_secs(60);

/// One transaction under the migration lock: applies the missing migrations up to `up_to`,
/// stopping before one that waits for earlier transactions (unless `waited` is it), and says
/// which; or rolls back a try that waited too long for a lock.
async fn apply_until_a_wait(
    client: &mut Client,
    target: &str,
    up_to: i32,
    waited: Option<i32>,
    applied: &mut Vec<i32>,
) -> StoreResult<Attempt> {
    let tx = client.transaction().await.map_err(unavailable)?;
    begin_a_try(&tx).await?;
    let locked_out = |e: &tokio_postgres::Error| {
        [&SqlState::LOCK_NOT_AVAILABLE, &SqlState::T_R_DEADLOCK_DETECTED].iter().any(|code| e.code() == Some(code))
    };
    if waited.is_none() {
        let made = tx
            .batch_execute(
                "CREATE TABLE IF NOT EXISTS schema_version (
                     version    integer PRIMARY KEY,
                     applied_at bigint NOT NULL
                 )",
            )
            .await;
        match made {
            Err(e) if locked_out(&e) => return Ok(Attempt::LockedOut(up_to)),
            made => made.map_err(|e| privileges(e, target, "create tables"))?,
        }
    }
    let current = match tx.query_one("SELECT COALESCE(MAX(version), 0) FROM schema_version", &[]).await {
        Err(e) if locked_out(&e) => return Ok(Attempt::LockedOut(up_to)),
        read => read.map_err(unavailable)?.get::<_, i32>(0),
    };
    check_not_newer(current)?;
    let mut applied_now = Vec::new();
    let mut waits = None;
    for (version, _name, sql) in MIGRATIONS.iter().filter(|(version, _, _)| *version > current && *version <= up_to) {
        if AFTER_EARLIER_TRANSACTIONS.contains(version) && waited != Some(*version) {
            waits = Some(*version);
            break;
        }
        let sql = with_constants(sql);
        let recorded = "INSERT INTO schema_version (version, applied_at)
                        VALUES ($1, (extract(epoch FROM now()) * 1000)::bigint)";
        let done = match tx.batch_execute(&sql).await {
            Ok(()) => tx.execute(recorded, &[version]).await.map(drop),
            failed => failed,
        };
        match done {
            Err(e) if locked_out(&e) => return Ok(Attempt::LockedOut(*version)),
            Err(e) if e.code() == Some(&SqlState::INSUFFICIENT_PRIVILEGE) => {
                return Err(privileges(e, target, &format!("apply migration {version}")));
            }
            Err(e) => {
                let why = super::describe_error(&e);
                return Err(StoreError::Unavailable(format!("migration to schema {version} failed: {why}")));
            }
            Ok(()) => applied_now.push(*version),
        }
    }
    tx.commit().await.map_err(unavailable)?;
    applied.extend(applied_now);
    Ok(Attempt::Applied(waits))
}

/// Takes the migration lock in `tx` (waiting for another process's migration) and sets the
/// try's lock timeout.
async fn begin_a_try(tx: &tokio_postgres::Transaction<'_>) -> StoreResult<()> {
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK]).await.map_err(unavailable)?;
    // After the migration lock, which another migrating process holds for as long as it
    // takes. Past `deadlock_timeout`, so that a waiter cancels an autovacuum in its way first
    // (at most the largest timeout PostgreSQL takes); the notice of a `schema_version` already
    // made is left unsaid at every try.
    tx.batch_execute(
        "SELECT set_config('lock_timeout', LEAST(2147483647,
                (extract(epoch FROM current_setting('deadlock_timeout')::interval) * 1000)::bigint + 500)::text, true),
            set_config('client_min_messages', 'warning', true)",
    )
    .await
    .map_err(unavailable)?;
    Ok(())
}

/// A migration's SQL with the constants it names filled in.
fn with_constants(sql: &str) -> String {
    sql.replace("@FEED_LOCK@", &FEED_LOCK.to_string())
        .replace("@FEED_READERS@", &FEED_READERS.to_string())
        .replace("@FEED_EPOCHS@", &FEED_EPOCHS.to_string())
        .replace("@WORK_MINUTES_KEPT@", &WORK_MINUTES_KEPT.to_string())
        .replace("@WORK_MINUTES_IN_HOUR@", &WORK_MINUTES_IN_HOUR.to_string())
        .replace("@WORK_HOURS_KEPT@", &autocomp_model::WORK_HOURS_KEPT.to_string())
}

/// Waits until every session's transaction in the database open now (other than this
/// session's) has ended: each holds its own virtual transaction id's lock, which `pg_locks`
/// shows to every role, for as long as it runs. A session is a process with a user (a role's
/// `usesysid` shows to every role); autovacuum's workers have none and call no function of
/// the store. Fails after `EARLIER_TRANSACTIONS_WAIT`, naming the sessions.
async fn wait_for_earlier_transactions(client: &Client, version: i32) -> StoreResult<()> {
    const OPEN: &str = "SELECT l.virtualxid, l.pid FROM pg_locks l JOIN pg_stat_activity a USING (pid)
         WHERE l.locktype = 'virtualxid' AND l.granted AND l.pid <> pg_backend_pid()
           AND a.datname = current_database() AND a.usesysid IS NOT NULL
           AND ($1::text[] IS NULL OR l.virtualxid = ANY($1))";
    let earlier: Vec<String> =
        client.query(OPEN, &[&None::<Vec<String>>]).await.map_err(unavailable)?.iter().map(|r| r.get(0)).collect();
    let deadline = tokio::time::Instant::now() + EARLIER_TRANSACTIONS_WAIT;
    loop {
        let open = client.query(OPEN, &[&Some(&earlier)]).await.map_err(unavailable)?;
        if open.is_empty() {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            let pids: Vec<i32> = open.iter().map(|r| r.get(1)).collect();
            return Err(StoreError::Unavailable(format!(
                "migration to schema {version} waits for the transactions open when it began to end, and \
                 after {} s these sessions' are still open: pids {pids:?} (pg_stat_activity names them); \
                 end them or open the store again later",
                EARLIER_TRANSACTIONS_WAIT.as_secs()
            )));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
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
