//! The PostgreSQL lock service's tables and every statement it sends.
//!
//! Two ordinary (durable) tables in the database the URL names, created on first use:
//! `autocomp_lock_workers`, one row per lock service (process) with its `beat` counter and its
//! lease, and `autocomp_locks`, one row per held path naming its worker. A lock row cannot
//! outlive its worker row (foreign key, `ON DELETE CASCADE`): taking over a dead worker is
//! deleting its row, and its locks go with it in the same statement.
//!
//! No statement reads the server's clock (no `now()`, `clock_timestamp()`, ...): whether a
//! holder is alive is decided on the taker's own monotonic clock from the `beat` counter
//! alone, so a step of the database host's wall clock cannot end a lease early. A test below
//! keeps it so.

/// Everything the service needs, in one simple-protocol batch (one implicit transaction;
/// nothing prepared, so a PgBouncer in transaction mode passes it on).
pub const CREATE_TABLES: &str = "
CREATE TABLE IF NOT EXISTS autocomp_lock_workers (
    id       text   PRIMARY KEY,
    beat     bigint NOT NULL,
    lease_ms bigint NOT NULL CHECK (lease_ms > 0)
);
CREATE TABLE IF NOT EXISTS autocomp_locks (
    path      text   PRIMARY KEY,
    worker_id text   NOT NULL REFERENCES autocomp_lock_workers (id) ON DELETE CASCADE,
    claim     bigint NOT NULL,
    holder    text   NOT NULL
);
CREATE INDEX IF NOT EXISTS autocomp_locks_by_worker ON autocomp_locks (worker_id);
";

/// Whether both tables exist (in the search path): then no CREATE privilege is needed.
pub const TABLES_EXIST: &str =
    "SELECT to_regclass('autocomp_lock_workers') IS NOT NULL AND to_regclass('autocomp_locks') IS NOT NULL";

/// For `autocomp doctor`: the role, the schema the tables would be created in, whether the
/// role may create them there, and whether it may read and write each where it exists
/// (`has_table_privilege` with a list is true if ANY is held: each is asked on its own).
pub const PRIVILEGES: &str = "
SELECT current_user::text, current_schema()::text,
       COALESCE(has_schema_privilege(current_schema(), 'CREATE'), false),
       CASE WHEN to_regclass('autocomp_lock_workers') IS NULL THEN true
            ELSE has_table_privilege('autocomp_lock_workers', 'SELECT')
                 AND has_table_privilege('autocomp_lock_workers', 'INSERT')
                 AND has_table_privilege('autocomp_lock_workers', 'UPDATE')
                 AND has_table_privilege('autocomp_lock_workers', 'DELETE') END,
       CASE WHEN to_regclass('autocomp_locks') IS NULL THEN true
            ELSE has_table_privilege('autocomp_locks', 'SELECT')
                 AND has_table_privilege('autocomp_locks', 'INSERT')
                 AND has_table_privilege('autocomp_locks', 'DELETE') END";

/// $1 id, $2 lease in milliseconds: a new worker, not renewed yet.
pub const REGISTER: &str = "INSERT INTO autocomp_lock_workers (id, beat, lease_ms) VALUES ($1, 0, $2)";

/// $1 id: one renewal. No row: the worker was taken over (or deleted by hand).
pub const RENEW: &str = "UPDATE autocomp_lock_workers SET beat = beat + 1 WHERE id = $1 RETURNING beat";

/// $1 worker ids, $2 paths: the beat and lease of each of the workers a service watches (the
/// holders of locks it found busy), with those of `$2` each still holds. Only these rows are
/// read: a service that met no busy lock sends nothing.
pub const WATCHED: &str = "SELECT w.id, w.beat, w.lease_ms, ARRAY(SELECT l.path FROM autocomp_locks l \
                           WHERE l.worker_id = w.id AND l.path = ANY($2::text[])) \
                           FROM autocomp_lock_workers w WHERE w.id = ANY($1::text[])";

/// $1 id: the worker's beat and lease, for judging its liveness record (no row: it is gone).
pub const BEAT_OF: &str = "SELECT beat, lease_ms FROM autocomp_lock_workers WHERE id = $1";

/// $1 id, $2 beat: the takeover of a worker whose beat the taker saw unchanged for a lease;
/// it happens only if the beat is still that value, and takes every lock of the worker.
pub const TAKE_OVER: &str = "DELETE FROM autocomp_lock_workers WHERE id = $1 AND beat = $2 RETURNING id";

/// $1 path, $2 worker, $3 claim, $4 holder: takes the path if free. A row back: taken.
pub const TAKE: &str = "INSERT INTO autocomp_locks (path, worker_id, claim, holder) VALUES ($1, $2, $3, $4) \
                        ON CONFLICT (path) DO NOTHING RETURNING claim";

/// $1 path: who holds it, and that worker's beat and lease (none: the worker row is gone, only
/// if someone dropped the foreign key).
pub const HOLDER_OF: &str = "SELECT l.worker_id, l.claim, l.holder, w.beat, w.lease_ms FROM autocomp_locks l \
                             LEFT JOIN autocomp_lock_workers w ON w.id = l.worker_id WHERE l.path = $1";

/// $1 paths, $2 their claims, $3 worker, $4 holder: takes each free path in one statement (in
/// path order, so two takers of overlapping sets never wait on each other in a cycle). One row
/// per path asked, in the order asked: whether this statement took it, else who holds it (as
/// `HOLDER_OF` reads it; nothing when it was taken by a transaction this statement's snapshot
/// does not show: busy, or free again by now). A path held by `$3` with its claim was taken by
/// an earlier send of this very statement, whose answer was lost.
pub const TAKE_MANY: &str = "WITH asked AS (SELECT * FROM unnest($1::text[], $2::bigint[]) WITH ORDINALITY \
                             AS a(path, claim, n)), \
                             taken AS (INSERT INTO autocomp_locks (path, worker_id, claim, holder) \
                             SELECT path, $3, claim, $4 FROM asked ORDER BY path \
                             ON CONFLICT (path) DO NOTHING RETURNING path, claim) \
                             SELECT t.claim IS NOT NULL, l.worker_id, l.claim, l.holder, w.beat, w.lease_ms \
                             FROM asked a LEFT JOIN taken t ON t.path = a.path AND t.claim = a.claim \
                             LEFT JOIN autocomp_locks l ON t.path IS NULL AND l.path = a.path \
                             LEFT JOIN autocomp_lock_workers w ON w.id = l.worker_id ORDER BY a.n";

/// $1 path, $2 worker, $3 claim: the very lock one `try_lock` took.
pub const STILL_HELD: &str = "SELECT 1 FROM autocomp_locks WHERE path = $1 AND worker_id = $2 AND claim = $3";

/// $1 path, $2 worker, $3 claim: releases only the very lock one `try_lock` took.
pub const RELEASE: &str = "DELETE FROM autocomp_locks WHERE path = $1 AND worker_id = $2 AND claim = $3";

/// $1 paths, $2 their claims, $3 worker: releases, in one statement, only the very locks
/// these claims took.
pub const RELEASE_MANY: &str = "DELETE FROM autocomp_locks WHERE worker_id = $3 AND (path, claim) IN \
                                (SELECT * FROM unnest($1::text[], $2::bigint[]))";

/// How many workers and locks there are, for `autocomp doctor`.
pub const COUNTS: &str = "SELECT (SELECT count(*) FROM autocomp_lock_workers), (SELECT count(*) FROM autocomp_locks)";

/// The session's `synchronous_commit` (the server's, database's or role's): a lock row is
/// durable when acknowledged only with `on`, `remote_write` or `remote_apply`.
pub const SYNCHRONOUS_COMMIT: &str = "SELECT current_setting('synchronous_commit')";

/// Every held path with its stored holder, its worker, and that worker's beat and lease (none:
/// the worker row is gone, only if someone dropped the foreign key).
pub const HELD: &str = "SELECT l.path, l.holder, l.worker_id, w.beat, w.lease_ms FROM autocomp_locks l \
                        LEFT JOIN autocomp_lock_workers w ON w.id = l.worker_id";

/// $1 id: the worker's end at close, its locks with it.
pub const CLOSE: &str = "DELETE FROM autocomp_lock_workers WHERE id = $1";

#[cfg(test)]
mod tests {
    use super::*;

    /// Every statement of the service (the doctor's read of privileges aside, which decides
    /// nothing about leases).
    const LEASE_STATEMENTS: &[&str] = &[
        CREATE_TABLES,
        TABLES_EXIST,
        REGISTER,
        RENEW,
        WATCHED,
        BEAT_OF,
        TAKE_OVER,
        TAKE,
        TAKE_MANY,
        HOLDER_OF,
        STILL_HELD,
        RELEASE,
        RELEASE_MANY,
        HELD,
        CLOSE,
        COUNTS,
    ];

    #[test]
    fn no_statement_reads_the_servers_clock() {
        let clock_functions = [
            "now(",
            "clock_timestamp",
            "statement_timestamp",
            "transaction_timestamp",
            "current_timestamp",
            "current_time",
            "current_date",
            "localtime",
            "timeofday",
            "interval",
            "timestamptz",
            "age(",
            "pg_postmaster_start_time",
        ];
        for statement in LEASE_STATEMENTS.iter().chain([&PRIVILEGES]) {
            let lower = statement.to_lowercase();
            for function in clock_functions {
                assert!(!lower.contains(function), "{function} in {statement}");
            }
        }
    }
}
