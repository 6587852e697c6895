//! The SQLite schema and its migrations. A store file records the versions applied to it in
//! `schema_version`; opening it applies the missing ones in one immediate transaction, so a
//! newer release upgrades a file in place and concurrent openers cannot both migrate.

use rusqlite::{Connection, TransactionBehavior, params};

use crate::port::{StoreError, StoreResult};
use autocomp_model::Timestamp;

use super::unavailable;

/// Ordered migrations; never edit a released one, append a new one.
const MIGRATIONS: &[(i64, &str)] =
    &[(1, V1), (2, V2), (3, V3), (4, V4), (5, V5), (6, V6), (7, V7), (8, V8), (9, V9), (10, V10)];

pub const LATEST_VERSION: i64 = MIGRATIONS[MIGRATIONS.len() - 1].0;

const V1: &str = r#"
-- One counter for the whole store: events, claims and batch changes share it, so any two
-- seqs compare across kinds ("is this event older than the last content change?").
CREATE TABLE store_head (
    id  INTEGER PRIMARY KEY CHECK (id = 1),
    seq INTEGER NOT NULL
);
INSERT INTO store_head (id, seq) VALUES (1, 0);

CREATE TABLE batches (
    id           TEXT PRIMARY KEY,
    type         TEXT NOT NULL,
    priority     INTEGER NOT NULL,
    metadata     TEXT NOT NULL,
    created_seq  INTEGER NOT NULL,
    modified_seq INTEGER NOT NULL,
    changed_seq  INTEGER NOT NULL,
    created_at   INTEGER NOT NULL,
    modified_at  INTEGER NOT NULL
);
CREATE UNIQUE INDEX batches_by_change ON batches (changed_seq);

CREATE TABLE events (
    seq             INTEGER PRIMARY KEY,
    batch_id        TEXT NOT NULL REFERENCES batches (id),
    type            TEXT NOT NULL,
    outcome         TEXT NOT NULL CHECK (outcome IN ('success', 'failure')),
    agent           TEXT NOT NULL,
    at              INTEGER NOT NULL,
    details         TEXT NOT NULL,
    run_component   TEXT,
    run_generation  INTEGER,
    resets          TEXT,
    idempotency_key TEXT UNIQUE
);
CREATE INDEX events_by_batch ON events (batch_id, seq);

-- The current claim generation of each (batch, component); bumped by every claim.
CREATE TABLE claims (
    batch_id   TEXT NOT NULL REFERENCES batches (id),
    component  TEXT NOT NULL,
    generation INTEGER NOT NULL,
    PRIMARY KEY (batch_id, component)
) WITHOUT ROWID;

CREATE TABLE runs (
    batch_id   TEXT NOT NULL REFERENCES batches (id),
    component  TEXT NOT NULL,
    generation INTEGER NOT NULL,
    agent      TEXT NOT NULL,
    host       TEXT NOT NULL,
    pid        INTEGER NOT NULL,
    started_at INTEGER NOT NULL,
    claim_seq  INTEGER NOT NULL,
    state      TEXT NOT NULL CHECK (state IN ('open', 'recorded', 'released', 'abandoned')),
    ended_at   INTEGER,
    transient  INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (batch_id, component, generation)
) WITHOUT ROWID;
CREATE INDEX runs_open ON runs (component, batch_id) WHERE state = 'open';
"#;

const V2: &str = r#"
-- A run's progress, saved while it works and read by the next attempt after a crash;
-- written only by the current open run, removed when a run records its result.
CREATE TABLE checkpoints (
    batch_id   TEXT NOT NULL REFERENCES batches (id),
    component  TEXT NOT NULL,
    data       TEXT NOT NULL,
    generation INTEGER NOT NULL,
    saved_at   INTEGER NOT NULL,
    PRIMARY KEY (batch_id, component)
) WITHOUT ROWID;
"#;

const V3: &str = r#"
-- Runs may end 'cancelled' (an operator's `autocomp cancel`). SQLite cannot alter a CHECK
-- constraint, so the table is rebuilt with the wider one and its rows copied over.
CREATE TABLE runs_v3 (
    batch_id   TEXT NOT NULL REFERENCES batches (id),
    component  TEXT NOT NULL,
    generation INTEGER NOT NULL,
    agent      TEXT NOT NULL,
    host       TEXT NOT NULL,
    pid        INTEGER NOT NULL,
    started_at INTEGER NOT NULL,
    claim_seq  INTEGER NOT NULL,
    state      TEXT NOT NULL CHECK (state IN ('open', 'recorded', 'released', 'abandoned', 'cancelled')),
    ended_at   INTEGER,
    transient  INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (batch_id, component, generation)
) WITHOUT ROWID;
INSERT INTO runs_v3 (batch_id, component, generation, agent, host, pid, started_at, claim_seq, state, ended_at, transient)
    SELECT batch_id, component, generation, agent, host, pid, started_at, claim_seq, state, ended_at, transient FROM runs;
DROP TABLE runs;
ALTER TABLE runs_v3 RENAME TO runs;
CREATE INDEX runs_open ON runs (component, batch_id) WHERE state = 'open';
"#;

const V4: &str = r#"
-- A claim may carry a client-chosen key: the same key again returns the run it opened (a
-- retry after a lost answer) instead of abandoning that run.
ALTER TABLE runs ADD COLUMN claim_key TEXT;
CREATE UNIQUE INDEX runs_claim_key ON runs (batch_id, component, claim_key) WHERE claim_key IS NOT NULL;
"#;

const V5: &str = r#"
-- The component registry: each component as its binary last described itself (the
-- descriptor, JSON), and each host's last pass of it. Not batch changes: no seq, no feed.
CREATE TABLE components (
    name           TEXT PRIMARY KEY,
    event_type     TEXT NOT NULL,
    descriptor     TEXT NOT NULL,
    registered_at  INTEGER NOT NULL,
    changed_at     INTEGER NOT NULL,
    retired_at     INTEGER,
    retired_by     TEXT,
    retired_reason TEXT
) WITHOUT ROWID;
-- One producer per event type among the components still in the pipeline.
CREATE UNIQUE INDEX components_by_event_type ON components (event_type) WHERE retired_at IS NULL;

CREATE TABLE component_hosts (
    component        TEXT NOT NULL REFERENCES components (name),
    host             TEXT NOT NULL,
    version          TEXT NOT NULL,
    last_seen        INTEGER NOT NULL,
    pass_started_at  INTEGER,
    pass_ended_at    INTEGER,
    pass_outcome     TEXT,
    pass_summary     TEXT NOT NULL DEFAULT '',
    pass_duration_ms INTEGER,
    PRIMARY KEY (component, host)
) WITHOUT ROWID;
"#;

const V6: &str = r#"
-- What each component's recorded work came to, per result (success, failure, transient):
-- since it was registered, and per minute of store time for the last two hours (metrics
-- read the last hour). `buckets`: a JSON array of counts per duration bucket.
CREATE TABLE component_work_totals (
    component       TEXT NOT NULL,
    result          TEXT NOT NULL,
    results         INTEGER NOT NULL,
    duration_ms_sum INTEGER NOT NULL,
    buckets         TEXT NOT NULL,
    PRIMARY KEY (component, result)
) WITHOUT ROWID;
CREATE TABLE component_work_minutes (
    component       TEXT NOT NULL,
    minute          INTEGER NOT NULL,
    result          TEXT NOT NULL,
    results         INTEGER NOT NULL,
    duration_ms_sum INTEGER NOT NULL,
    buckets         TEXT NOT NULL,
    PRIMARY KEY (component, minute, result)
) WITHOUT ROWID;
"#;

const V7: &str = r#"
-- What the batch index reads of each batch, kept by every write that changes the batch's
-- events or runs (see summary.rs); filled in for existing batches by the migration itself.
ALTER TABLE batches ADD COLUMN summary TEXT NOT NULL DEFAULT '';
"#;

const V8: &str = r#"
-- What each batch stores, kept by triggers so that every writer keeps it (a process of an
-- older release too): the bytes of its metadata and of its events' details (the JSON text as
-- stored), which every event and content change is checked against (max_batch_bytes), and
-- the length of its log, which a page of the log reports. Counted for existing batches here.
ALTER TABLE batches ADD COLUMN stored_bytes INTEGER NOT NULL DEFAULT 0;
ALTER TABLE batches ADD COLUMN event_count INTEGER NOT NULL DEFAULT 0;
UPDATE batches SET
    stored_bytes = length(CAST(metadata AS BLOB))
        + COALESCE((SELECT SUM(length(CAST(details AS BLOB))) FROM events WHERE events.batch_id = batches.id), 0),
    event_count = (SELECT COUNT(*) FROM events WHERE events.batch_id = batches.id);
CREATE TRIGGER batches_stored_bytes_on_create AFTER INSERT ON batches BEGIN
    UPDATE batches SET stored_bytes = length(CAST(NEW.metadata AS BLOB)) WHERE id = NEW.id;
END;
CREATE TRIGGER batches_stored_bytes_on_content_change AFTER UPDATE OF metadata ON batches BEGIN
    UPDATE batches
    SET stored_bytes = stored_bytes - length(CAST(OLD.metadata AS BLOB)) + length(CAST(NEW.metadata AS BLOB))
    WHERE id = NEW.id;
END;
CREATE TRIGGER batches_stored_bytes_on_event AFTER INSERT ON events BEGIN
    UPDATE batches
    SET stored_bytes = stored_bytes + length(CAST(NEW.details AS BLOB)), event_count = event_count + 1
    WHERE id = NEW.batch_id;
END;
-- A batch's Reset markers alone, newest last: what `batch_head` reads for the newest Reset
-- of each type, without reading the rest of the log.
CREATE INDEX events_resets ON events (batch_id, seq) WHERE type = 'Reset';
"#;

const V9: &str = r#"
-- Steering the pipeline: one record of the holds, pools and breaker counts (the model's
-- `Steering`, as JSON), and the append-only log of the changes operators and breakers made.
CREATE TABLE steering (
    id    INTEGER PRIMARY KEY CHECK (id = 1),
    state TEXT NOT NULL
);
INSERT INTO steering (id, state) VALUES (1, '{"version":0}');
CREATE TABLE steering_log (
    version INTEGER PRIMARY KEY,
    at      INTEGER NOT NULL,
    entry   TEXT NOT NULL
);

-- The notification outbox: each item once per channel (its key), claimed by one notifier at
-- a time (a lease) and marked sent once; the notifiers' cursor in the change feed.
CREATE TABLE notices (
    key         TEXT PRIMARY KEY,
    channel     TEXT NOT NULL,
    subject     TEXT NOT NULL,
    body        TEXT NOT NULL,
    created_at  INTEGER NOT NULL,
    attempts    INTEGER NOT NULL DEFAULT 0,
    last_error  TEXT,
    due_at      INTEGER NOT NULL,
    holder      TEXT,
    lease_until INTEGER,
    sent_at     INTEGER
);
CREATE INDEX notices_pending ON notices (due_at) WHERE sent_at IS NULL;
CREATE INDEX notices_recent ON notices (created_at);
CREATE TABLE notice_cursor (
    id  INTEGER PRIMARY KEY CHECK (id = 1),
    seq INTEGER NOT NULL
);
-- -1: no notifier has run yet (the first one starts at the head, whatever it is).
INSERT INTO notice_cursor (id, seq) VALUES (1, -1);
"#;

const V10: &str = r#"
-- The registry's longer history, for the monitor's charts: result tallies per hour of store
-- time (kept 31 days, like the minutes' two hours), and each component's backlog (batches
-- ready for it) as the monitor samples it, the newest sample per minute and per hour.
CREATE TABLE component_work_hours (
    component       TEXT NOT NULL,
    hour            INTEGER NOT NULL,
    result          TEXT NOT NULL,
    results         INTEGER NOT NULL,
    duration_ms_sum INTEGER NOT NULL,
    buckets         TEXT NOT NULL,
    PRIMARY KEY (component, hour, result)
) WITHOUT ROWID;
CREATE TABLE component_backlog (
    component TEXT NOT NULL,
    step      TEXT NOT NULL,
    at        INTEGER NOT NULL,
    ready     INTEGER NOT NULL,
    PRIMARY KEY (component, step, at)
) WITHOUT ROWID;
"#;

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
        return Err(StoreError::Unavailable(format!(
            "the store file has schema version {current}, newer than this release knows ({LATEST_VERSION}); \
             upgrade autocomp before opening it"
        )));
    }
    for (version, sql) in MIGRATIONS.iter().filter(|(version, _)| *version > current && *version <= target) {
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
