//! The SQL alternative: a materialized effective-state table next to the batches, with the best indexes we could design, answering the same triggers.

use super::*;

const SQL_SCHEMA: &str = "
    -- created_seq is unique per batch, so it doubles as the integer key.
    CREATE TABLE batches (
        seq          INTEGER PRIMARY KEY,
        id           TEXT NOT NULL,
        type         TEXT NOT NULL,
        priority     INTEGER NOT NULL,
        modified_seq INTEGER NOT NULL
    );
    -- One row per (batch, event type) of the effective view.
    CREATE TABLE effective (
        batch   INTEGER NOT NULL,
        type    TEXT NOT NULL,
        outcome TEXT NOT NULL,
        seq     INTEGER NOT NULL,
        PRIMARY KEY (batch, type)
    ) WITHOUT ROWID;
";

/// Created after the bulk load. `batches_order` walks batches of one type in trigger order
/// (the rowid `seq` is the tie-breaker, so the index covers the scan); `effective`'s primary
/// key answers the per-batch EXISTS probes; `effective_by_type` lets a rare requirement drive.
const SQL_INDEXES: &str = "
    CREATE UNIQUE INDEX batches_id ON batches (id);
    CREATE INDEX batches_order ON batches (type, priority DESC, seq);
    CREATE INDEX effective_by_type ON effective (type, outcome, batch);
    ANALYZE;
";

/// Two ways to write `requires`: a correlated EXISTS probe per candidate batch, or an IN
/// subquery the planner may drive the query from. `blocked_by` is always NOT EXISTS.
#[derive(Clone, Copy, Debug)]
pub(super) enum SqlForm {
    Exists,
    In,
}

fn quote(text: &str) -> String {
    // Names are validated ([A-Za-z0-9_]); literals let the planner use the value statistics.
    format!("'{text}'")
}

pub(super) fn trigger_sql(trigger: &Trigger, form: SqlForm) -> String {
    let mut clauses = Vec::new();
    if !trigger.types.is_empty() {
        let types: Vec<String> = trigger.types.iter().map(|t| quote(t.as_str())).collect();
        clauses.push(format!("b.type IN ({})", types.join(", ")));
    }
    for required in &trigger.requires {
        let required = quote(required.as_str());
        clauses.push(match form {
            SqlForm::Exists => format!(
                "EXISTS (SELECT 1 FROM effective e WHERE e.batch = b.seq AND e.type = {required} \
                 AND e.outcome = 'success')"
            ),
            SqlForm::In => {
                format!("b.seq IN (SELECT batch FROM effective WHERE type = {required} AND outcome = 'success')")
            }
        });
    }
    for blocking in &trigger.blocked_by {
        clauses.push(format!(
            "NOT EXISTS (SELECT 1 FROM effective e WHERE e.batch = b.seq AND e.type = {})",
            quote(blocking.as_str())
        ));
    }
    let unsupported = !trigger.repeat_on_change.is_empty()
        || !trigger.transiently_failed.is_empty()
        || !trigger.batches.is_empty()
        || trigger.settled_for.is_some();
    assert!(!unsupported, "the SQL translation covers requires, blocked_by, types and limit only");
    let limit = trigger.limit.map(|l| format!(" LIMIT {l}")).unwrap_or_default();
    format!("SELECT b.id FROM batches b WHERE {} ORDER BY b.priority DESC, b.seq ASC{limit}", clauses.join(" AND "))
}

/// Reads every batch through the port, fills the SQL tables and the reference answers.
pub(super) async fn materialize(store: &SqliteStore, path: &Path, cases: &[Case]) -> (f64, Vec<Reference>, u64) {
    for suffix in ["", "-wal", "-shm", "-journal"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    let start = Instant::now();
    let mut conn = Connection::open(path).expect("open the SQL file");
    conn.execute_batch("PRAGMA journal_mode = WAL; PRAGMA synchronous = OFF;").expect("pragmas");
    conn.execute_batch(SQL_SCHEMA).expect("schema");
    let mut references: Vec<Reference> = cases.iter().map(|_| Reference { matches: Vec::new() }).collect();
    let mut after: Option<BatchId> = None;
    let mut count = 0usize;
    let now = Timestamp::now();
    loop {
        let page = store.list_batches(after.as_ref(), LIST_PAGE).await.expect("list_batches");
        let Some(last) = page.last() else { break };
        after = Some(last.id.clone());
        let tx = conn.transaction().expect("transaction");
        {
            let mut insert_batch = tx
                .prepare_cached(
                    "INSERT INTO batches (seq, id, type, priority, modified_seq) VALUES (?1, ?2, ?3, ?4, ?5)",
                )
                .expect("prepare");
            let mut insert_effective = tx
                .prepare_cached("INSERT INTO effective (batch, type, outcome, seq) VALUES (?1, ?2, ?3, ?4)")
                .expect("prepare");
            for batch in &page {
                insert_batch
                    .execute(rusqlite::params![
                        batch.created_seq.0,
                        batch.id.as_str(),
                        batch.batch_type.as_str(),
                        batch.priority,
                        batch.modified_seq.0
                    ])
                    .expect("insert batch");
                for event in batch.effective().iter() {
                    insert_effective
                        .execute(rusqlite::params![
                            batch.created_seq.0,
                            event.event_type.as_str(),
                            event.outcome.as_str(),
                            event.seq.0
                        ])
                        .expect("insert effective");
                }
                for (case, reference) in cases.iter().zip(&mut references) {
                    if case.trigger.matches_at(batch, now) {
                        let (priority, seq) = order_key(batch);
                        reference.matches.push(((priority, seq), batch.id.clone()));
                    }
                }
            }
        }
        tx.commit().expect("commit");
        count += page.len();
        if count % 100_000 < LIST_PAGE {
            eprintln!("  materialized {count} batches, {:.0} s", start.elapsed().as_secs_f64());
        }
    }
    conn.execute_batch(SQL_INDEXES).expect("indexes");
    drop(conn);
    (start.elapsed().as_secs_f64(), references, file_size(path))
}

pub(super) fn query_plan(conn: &Connection, sql: &str) -> Vec<String> {
    let mut statement = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).expect("explain");
    statement
        .query_map([], |row| row.get::<_, String>(3))
        .expect("explain")
        .collect::<rusqlite::Result<_>>()
        .expect("explain")
}

pub(super) fn run_sql(conn: &Connection, sql: &str) -> Vec<BatchId> {
    let mut statement = conn.prepare_cached(sql).expect("prepare");
    statement
        .query_map([], |row| row.get::<_, String>(0))
        .expect("query")
        .map(|id| BatchId::new(id.expect("row")).expect("batch id"))
        .collect()
}
