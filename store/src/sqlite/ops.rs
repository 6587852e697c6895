//! The store operations as blocking functions over one connection. Writes run in one
//! IMMEDIATE transaction each (a group of appends, or a pass's claims: all of them, each in a
//! savepoint) and take their seq from `store_head` inside it, except the component
//! registry's, which change no batch and so take none; reads run in one read transaction
//! each, so a batch, its log and its runs are one consistent snapshot (a page of batches:
//! three statements, not three per batch).

use rusqlite::{Connection, OptionalExtension, Row, Transaction, TransactionBehavior, params};
use serde_json::{Map, Value};

use crate::port::{
    BatchHead, BatchListing, Cancellation, ChangePage, Claim, CreateOutcome, LogCursor, LogPage, StoreError,
    StoreResult, check_log_limit,
};
use crate::write_rules::{self, MAX_BATCH_PAGE, MAX_CHANGE_PAGE, page_too_large};
use autocomp_model::{
    Agent, Batch, BatchId, BatchSummary, ComponentName, Event, EventType, HostRecord, NewBatch, NewEvent, PassOutcome,
    PassPhase, PassRecord, RegisteredComponent, Retirement, Run, RunHolder, RunState, Seq, Timestamp, WorkTallies,
};

use super::history::{add_work, load_work};
use super::rows::{
    EVENT_COLUMNS, NameCache, event_from_row, event_from_row_of, load_batch, load_batches, query_runs, stored,
    stored_json,
};
use super::{summary, unavailable};

fn write_tx(conn: &mut Connection) -> StoreResult<Transaction<'_>> {
    conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(unavailable)
}

fn read_tx(conn: &mut Connection) -> StoreResult<Transaction<'_>> {
    conn.transaction_with_behavior(TransactionBehavior::Deferred).map_err(unavailable)
}

fn next_seq(tx: &Connection) -> StoreResult<Seq> {
    tx.query_row("UPDATE store_head SET seq = seq + 1 WHERE id = 1 RETURNING seq", [], |row| row.get(0))
        .map(Seq)
        .map_err(unavailable)
}

/// Stored text is validated on the way in; failing to parse it on the way out means the
/// file was edited behind the store's back.
fn batch_exists(tx: &Connection, id: &BatchId) -> StoreResult<bool> {
    tx.query_row("SELECT 1 FROM batches WHERE id = ?1", [id.as_str()], |_| Ok(()))
        .optional()
        .map(|found| found.is_some())
        .map_err(unavailable)
}

fn require_batch(tx: &Connection, id: &BatchId) -> StoreResult<()> {
    if batch_exists(tx, id)? { Ok(()) } else { Err(StoreError::NotFound(id.clone())) }
}

/// The bytes of details and metadata the batch stores (kept by the schema's triggers), or
/// `NotFound`.
fn stored_bytes(tx: &Connection, id: &BatchId) -> StoreResult<u64> {
    tx.prepare_cached("SELECT stored_bytes FROM batches WHERE id = ?1")
        .and_then(|mut statement| statement.query_row([id.as_str()], |row| row.get::<_, i64>(0)).optional())
        .map_err(unavailable)?
        .map(|bytes| bytes.max(0) as u64)
        .ok_or_else(|| StoreError::NotFound(id.clone()))
}

/// Refuses an event whose details (`details`, the text to be stored) would take the batch
/// over `cap`; `NotFound` for an unknown batch.
fn check_event_fits(tx: &Connection, batch: &BatchId, details: &str, cap: u64) -> StoreResult<()> {
    let holds = stored_bytes(tx, batch)?;
    write_rules::check_batch_bytes(batch, "this event", holds, 0, details.len() as u64, cap)
}

pub fn create_batch(conn: &mut Connection, new: &NewBatch) -> StoreResult<CreateOutcome> {
    let tx = write_tx(conn)?;
    let now = Timestamp::now();
    if let Some(existing) = load_batches(&tx, std::slice::from_ref(&new.id), now)?.pop() {
        return write_rules::existing_batch(new, existing).map(CreateOutcome::AlreadyExists);
    }
    let seq = next_seq(&tx)?;
    tx.execute(
        "INSERT INTO batches (id, type, priority, metadata, created_seq, modified_seq, changed_seq, created_at, modified_at, summary)
         VALUES (?1, ?2, ?3, ?4, ?5, ?5, ?5, ?6, ?6, ?7)",
        params![
            new.id.as_str(),
            new.batch_type.as_str(),
            new.priority,
            new.metadata.to_string(),
            seq.0,
            now.millis(),
            summary::empty(seq)
        ],
    )
    .map_err(unavailable)?;
    let batch = load_batches(&tx, std::slice::from_ref(&new.id), now)?.pop().expect("inserted in this transaction");
    tx.commit().map_err(unavailable)?;
    Ok(CreateOutcome::Created(batch))
}

pub fn get_batches(conn: &mut Connection, ids: &[BatchId]) -> StoreResult<Vec<Batch>> {
    if ids.len() > MAX_BATCH_PAGE {
        return Err(page_too_large("ids", ids.len(), MAX_BATCH_PAGE));
    }
    let tx = read_tx(conn)?;
    load_batches(&tx, ids, Timestamp::now())
}

/// `get_batches` as it was before it became set-based: three statements per batch. Kept
/// only so the benchmark can measure both in one run.
pub fn get_batches_one_by_one(conn: &mut Connection, ids: &[BatchId]) -> StoreResult<Vec<Batch>> {
    if ids.len() > MAX_BATCH_PAGE {
        return Err(page_too_large("ids", ids.len(), MAX_BATCH_PAGE));
    }
    let tx = read_tx(conn)?;
    let now = Timestamp::now();
    let mut batches = Vec::with_capacity(ids.len());
    for id in ids {
        batches.extend(load_batch(&tx, id, now)?);
    }
    Ok(batches)
}

pub fn list_batches(conn: &mut Connection, after: Option<&BatchId>, limit: usize) -> StoreResult<Vec<Batch>> {
    if limit > MAX_BATCH_PAGE {
        return Err(page_too_large("limit", limit, MAX_BATCH_PAGE));
    }
    let tx = read_tx(conn)?;
    let ids: Vec<BatchId> = {
        let mut statement =
            tx.prepare_cached("SELECT id FROM batches WHERE id > ?1 ORDER BY id LIMIT ?2").map_err(unavailable)?;
        let after = after.map_or("", BatchId::as_str);
        statement
            .query_map(params![after, limit as i64], |row| stored(row.get(0)?))
            .and_then(|rows| rows.collect::<rusqlite::Result<_>>())
            .map_err(unavailable)?
    };
    load_batches(&tx, &ids, Timestamp::now())
}

pub fn get_summaries(conn: &mut Connection, ids: &[BatchId]) -> StoreResult<Vec<BatchSummary>> {
    if ids.len() > MAX_BATCH_PAGE {
        return Err(page_too_large("ids", ids.len(), MAX_BATCH_PAGE));
    }
    let tx = read_tx(conn)?;
    summary::read(&tx, ids)
}

pub fn list_summaries(conn: &mut Connection, after: Option<&BatchId>, limit: usize) -> StoreResult<Vec<BatchSummary>> {
    if limit > MAX_BATCH_PAGE {
        return Err(page_too_large("limit", limit, MAX_BATCH_PAGE));
    }
    let tx = read_tx(conn)?;
    summary::list(&tx, after, limit)
}

/// `ObjectStore::get_listings`: the summaries, the batch rows' `created_at` and the open
/// runs of the page, three statements in one read transaction, the ids bound as one `rarray`.
pub fn get_listings(conn: &mut Connection, ids: &[BatchId]) -> StoreResult<Vec<BatchListing>> {
    if ids.len() > MAX_BATCH_PAGE {
        return Err(page_too_large("ids", ids.len(), MAX_BATCH_PAGE));
    }
    let tx = read_tx(conn)?;
    let summaries = summary::read(&tx, ids)?;
    let asked: rusqlite::vtab::array::Array =
        std::rc::Rc::new(ids.iter().map(|id| rusqlite::types::Value::Text(id.as_str().to_owned())).collect());
    let mut created: std::collections::HashMap<String, Timestamp> = std::collections::HashMap::new();
    {
        let mut statement =
            tx.prepare_cached("SELECT id, created_at FROM batches WHERE id IN rarray(?1)").map_err(unavailable)?;
        let mut rows = statement.query([&asked]).map_err(unavailable)?;
        while let Some(row) = rows.next().map_err(unavailable)? {
            created.insert(row.get(0).map_err(unavailable)?, Timestamp(row.get(1).map_err(unavailable)?));
        }
    }
    let mut open: std::collections::HashMap<BatchId, Vec<Run>> = std::collections::HashMap::new();
    for run in query_runs(&tx, "WHERE batch_id IN rarray(?1) AND state = 'open'", [&asked])? {
        open.entry(run.batch_id.clone()).or_default().push(run);
    }
    summaries
        .into_iter()
        .map(|summary| {
            let created_at = *created.get(summary.id.as_str()).ok_or_else(|| rows_corrupt(&summary.id))?;
            let open_runs = open.get(&summary.id).cloned().unwrap_or_default();
            Ok(BatchListing { summary, created_at, open_runs })
        })
        .collect()
}

fn rows_corrupt(id: &BatchId) -> StoreError {
    StoreError::Unavailable(format!("batch {id} has a summary but no row in the same read"))
}

/// `ObjectStore::batch_head`: one read transaction of a handful of indexed reads (the batch
/// row and its summary, its open runs, its effective events by seq, its Reset markers through
/// their own index), none of which reads the rest of the log.
pub fn batch_head(conn: &mut Connection, id: &BatchId) -> StoreResult<BatchHead> {
    let tx = read_tx(conn)?;
    let as_of = Timestamp::now();
    let summary =
        summary::read(&tx, std::slice::from_ref(id))?.pop().ok_or_else(|| StoreError::NotFound(id.clone()))?;
    let (metadata, created_at, modified_at, event_count, stored_bytes) = tx
        .prepare_cached(
            "SELECT metadata, created_at, modified_at, event_count, stored_bytes FROM batches WHERE id = ?1",
        )
        .and_then(|mut statement| {
            statement.query_row([id.as_str()], |row| {
                let metadata = match stored_json(row.get(0)?)? {
                    Value::Object(map) => map,
                    _ => Map::new(),
                };
                Ok((
                    metadata,
                    Timestamp(row.get(1)?),
                    Timestamp(row.get(2)?),
                    row.get::<_, i64>(3)?.max(0) as u64,
                    row.get::<_, i64>(4)?.max(0) as u64,
                ))
            })
        })
        .map_err(unavailable)?;
    let open_runs = query_runs(&tx, "WHERE batch_id = ?1 AND state = 'open'", [id.as_str()])?;
    let mut names = NameCache::default();
    let effective = {
        let seqs: rusqlite::vtab::array::Array = std::rc::Rc::new(
            summary.effective.iter().map(|event| rusqlite::types::Value::Integer(event.seq.0)).collect(),
        );
        let mut statement = tx
            .prepare_cached(&format!("SELECT {EVENT_COLUMNS} FROM events WHERE seq IN rarray(?1) AND batch_id = ?2"))
            .map_err(unavailable)?;
        let mut rows = statement.query(params![seqs, id.as_str()]).map_err(unavailable)?;
        let mut found = Vec::with_capacity(summary.effective.len());
        while let Some(row) = rows.next().map_err(unavailable)? {
            found.push(event_from_row_of(row, id, &mut names).map_err(unavailable)?);
        }
        // In the summary's order: by type name.
        found.sort_by(|a, b| a.event_type.cmp(&b.event_type));
        found
    };
    let mut last_resets = std::collections::BTreeMap::new();
    {
        let mut statement = tx
            .prepare_cached("SELECT seq, resets FROM events WHERE batch_id = ?1 AND type = 'Reset' ORDER BY seq DESC")
            .map_err(unavailable)?;
        let mut rows = statement.query([id.as_str()]).map_err(unavailable)?;
        while let Some(row) = rows.next().map_err(unavailable)? {
            let seq = Seq(row.get(0).map_err(unavailable)?);
            let covered: Vec<EventType> = match row.get::<_, Option<String>>(1).map_err(unavailable)? {
                Some(text) => serde_json::from_str(&text)
                    .map_err(|e| StoreError::Unavailable(format!("a Reset of batch {id} names no types: {e}")))?,
                None => Vec::new(),
            };
            for event_type in covered {
                last_resets.entry(event_type).or_insert(seq);
            }
        }
    }
    Ok(BatchHead {
        summary,
        metadata,
        created_at,
        modified_at,
        open_runs,
        effective,
        last_resets,
        event_count,
        stored_bytes,
        as_of,
    })
}

/// `ObjectStore::log_page`: the page through the log's (batch, seq) index, and the log's
/// first and last seq and length, in one read transaction. Details over `details_up_to`
/// bytes stay in the file (`octet_length` reads a column's size from its record header).
pub fn log_page(
    conn: &mut Connection,
    id: &BatchId,
    cursor: LogCursor,
    limit: usize,
    details_up_to: Option<u64>,
) -> StoreResult<LogPage> {
    check_log_limit(limit)?;
    let up_to = details_up_to.map_or(i64::MAX, |bytes| i64::try_from(bytes).unwrap_or(i64::MAX));
    let tx = read_tx(conn)?;
    let total: i64 = tx
        .prepare_cached("SELECT event_count FROM batches WHERE id = ?1")
        .and_then(|mut statement| statement.query_row([id.as_str()], |row| row.get(0)).optional())
        .map_err(unavailable)?
        .ok_or_else(|| StoreError::NotFound(id.clone()))?;
    let (sql, bound, newest_first) = match cursor {
        LogCursor::Newest => ("seq < ?2 ORDER BY seq DESC", i64::MAX, true),
        LogCursor::Before(seq) => ("seq < ?2 ORDER BY seq DESC", seq.0, true),
        LogCursor::After(seq) => ("seq > ?2 ORDER BY seq", seq.0, false),
    };
    let mut names = NameCache::default();
    let mut events = Vec::with_capacity(limit);
    let mut details_left_out = Vec::new();
    {
        // EVENT_COLUMNS, with details too large to show as JSON null, and their size.
        let columns = "seq, batch_id, type, outcome, agent, at,
            CASE WHEN octet_length(details) > ?4 THEN 'null' ELSE details END,
            run_component, run_generation, resets, octet_length(details)";
        let mut statement = tx
            .prepare_cached(&format!("SELECT {columns} FROM events WHERE batch_id = ?1 AND {sql} LIMIT ?3"))
            .map_err(unavailable)?;
        let mut rows = statement.query(params![id.as_str(), bound, limit as i64, up_to]).map_err(unavailable)?;
        while let Some(row) = rows.next().map_err(unavailable)? {
            let event = event_from_row_of(row, id, &mut names).map_err(unavailable)?;
            let bytes: i64 = row.get(10).map_err(unavailable)?;
            if bytes > up_to {
                details_left_out.push((event.seq, bytes as u64));
            }
            events.push(event);
        }
    }
    if newest_first {
        events.reverse();
        details_left_out.reverse();
    }
    let end = |order: &str| -> StoreResult<Option<i64>> {
        tx.prepare_cached(&format!("SELECT seq FROM events WHERE batch_id = ?1 ORDER BY seq {order} LIMIT 1"))
            .and_then(|mut statement| statement.query_row([id.as_str()], |row| row.get(0)).optional())
            .map_err(unavailable)
    };
    let (first, last) = (end("ASC")?, end("DESC")?);
    Ok(LogPage {
        older: events.first().map(|e| e.seq).filter(|seq| first.is_some_and(|first| first < seq.0)),
        newer: events.last().map(|e| e.seq).filter(|seq| last.is_some_and(|last| last > seq.0)),
        events,
        total: total.max(0) as u64,
        details_left_out,
    })
}

/// `ObjectStore::run_state`: the run with the highest generation, through the runs' key.
pub fn run_state(conn: &mut Connection, batch: &BatchId, component: &ComponentName) -> StoreResult<Option<Run>> {
    let tx = read_tx(conn)?;
    require_batch(&tx, batch)?;
    let mut newest = query_runs(
        &tx,
        "WHERE batch_id = ?1 AND component = ?2
           AND generation = (SELECT MAX(generation) FROM runs WHERE batch_id = ?1 AND component = ?2)",
        params![batch.as_str(), component.as_str()],
    )?;
    Ok(newest.pop())
}

pub fn set_priority(conn: &mut Connection, id: &BatchId, priority: i32) -> StoreResult<Seq> {
    let tx = write_tx(conn)?;
    require_batch(&tx, id)?;
    let seq = next_seq(&tx)?;
    tx.execute("UPDATE batches SET priority = ?2 WHERE id = ?1", params![id.as_str(), priority])
        .map_err(unavailable)?;
    summary::touch(&tx, id, seq, |_| {})?;
    tx.commit().map_err(unavailable)?;
    Ok(seq)
}

pub fn record_content_change(
    conn: &mut Connection,
    id: &BatchId,
    patch: Map<String, Value>,
    cap: u64,
) -> StoreResult<Seq> {
    let tx = write_tx(conn)?;
    let row: Option<(String, i64)> = tx
        .query_row("SELECT metadata, stored_bytes FROM batches WHERE id = ?1", [id.as_str()], |row| {
            Ok((row.get(0)?, row.get(1)?))
        })
        .optional()
        .map_err(unavailable)?;
    let (stored_metadata, holds) = row.ok_or_else(|| StoreError::NotFound(id.clone()))?;
    let old_bytes = stored_metadata.len() as u64;
    let metadata = write_rules::merge_metadata(stored_json(stored_metadata).map_err(unavailable)?, patch)?;
    let metadata = metadata.to_string();
    let holds = holds.max(0) as u64;
    write_rules::check_batch_bytes(id, "this content change", holds, old_bytes, metadata.len() as u64, cap)?;
    let seq = next_seq(&tx)?;
    tx.execute(
        "UPDATE batches SET metadata = ?2, modified_seq = ?3, modified_at = ?4 WHERE id = ?1",
        params![id.as_str(), metadata, seq.0, Timestamp::now().millis()],
    )
    .map_err(unavailable)?;
    summary::touch(&tx, id, seq, |_| {})?;
    tx.commit().map_err(unavailable)?;
    Ok(seq)
}

/// One append waiting in a group commit, and where its answer goes.
pub struct PendingAppend {
    pub batch: BatchId,
    pub event: NewEvent,
    pub reply: tokio::sync::oneshot::Sender<StoreResult<Event>>,
}

/// Group commit: every append in `group` in one IMMEDIATE transaction (one fsync), each in
/// a savepoint of its own, so a refused append (fenced, unknown batch) changes nothing and
/// the others still commit. Each gets the answer it would have got alone; if the commit
/// itself fails, none was written and all get that error.
pub fn append_group(conn: &mut Connection, mut group: Vec<PendingAppend>, cap: u64) {
    if group.len() == 1 {
        // Alone: no savepoint needed, a refusal rolls back the whole transaction.
        let pending = group.pop().expect("one");
        let answer = write_tx(conn).and_then(|tx| {
            let event = append_in(&tx, &pending.batch, pending.event, cap)?;
            tx.commit().map_err(unavailable)?;
            Ok(event)
        });
        let _ = pending.reply.send(answer);
        return;
    }
    let mut answers = Vec::with_capacity(group.len());
    let committed = (|| {
        let mut tx = write_tx(conn)?;
        for pending in group {
            let savepoint = tx.savepoint().map_err(unavailable)?;
            let answer = append_in(&savepoint, &pending.batch, pending.event, cap);
            if answer.is_ok() {
                savepoint.commit().map_err(unavailable)?;
            } // else dropped: rolled back to before this append
            answers.push((answer, pending.reply));
        }
        tx.commit().map_err(unavailable)
    })();
    for (answer, reply) in answers {
        let answer = match &committed {
            Ok(()) => answer,
            Err(error) => Err(StoreError::Unavailable(format!("group commit failed, nothing written: {error}"))),
        };
        let _ = reply.send(answer); // the caller may have gone; the event stands regardless
    }
}

fn append_in(tx: &Connection, batch: &BatchId, new: NewEvent, cap: u64) -> StoreResult<Event> {
    // A retry of an append that already committed must see its first result, not a fence:
    // the first attempt closed the run.
    if let Some(key) = &new.idempotency_key {
        let earlier = tx
            .query_row(
                &format!("SELECT {EVENT_COLUMNS} FROM events WHERE idempotency_key = ?1"),
                [key.as_str()],
                event_from_row,
            )
            .optional()
            .map_err(unavailable)?;
        if let Some(earlier) = earlier {
            return write_rules::earlier_append(batch, &new, earlier);
        }
    }
    require_batch(tx, batch)?;
    if let Some(run) = &new.run {
        check_run_is_current_and_open(tx, batch, &run.component, run.generation)?;
    }
    let details = new.details.to_string();
    check_event_fits(tx, batch, &details, cap)?;
    let seq = next_seq(tx)?;
    let at = Timestamp::now();
    insert_event(tx, batch, &new, &details, seq, at)?;
    let event = new.recorded(batch, seq, at);
    if let Some(run) = &event.run {
        let transient = event.details.get("transient").and_then(Value::as_bool).unwrap_or(false);
        tx.execute(
            "UPDATE runs SET state = 'recorded', ended_at = ?4, transient = ?5
             WHERE batch_id = ?1 AND component = ?2 AND generation = ?3",
            params![batch.as_str(), run.component.as_str(), run.generation, at.millis(), transient],
        )
        .map_err(unavailable)?;
        // A transient failure keeps the checkpoint: the retry resumes from it, as it would
        // after an abandoned run. Any other result ends what the checkpoint was for.
        if !transient {
            tx.execute(
                "DELETE FROM checkpoints WHERE batch_id = ?1 AND component = ?2",
                params![batch.as_str(), run.component.as_str()],
            )
            .map_err(unavailable)?;
        }
    }
    summary::touch(tx, batch, seq, |state| {
        state.record(&event);
        if let Some(run) = &event.run {
            state.run_closed(&run.component);
        }
    })?;
    Ok(event)
}

/// Inserts `new` with `details`, its details as the text to store (the schema's trigger
/// adds its bytes to the batch's).
fn insert_event(
    tx: &Connection,
    batch: &BatchId,
    new: &NewEvent,
    details: &str,
    seq: Seq,
    at: Timestamp,
) -> StoreResult<()> {
    let resets =
        (!new.resets.is_empty()).then(|| serde_json::to_string(&new.resets).expect("event types always serialize"));
    tx.execute(
        "INSERT INTO events (seq, batch_id, type, outcome, agent, at, details, run_component, run_generation, resets, idempotency_key)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
        params![
            seq.0,
            batch.as_str(),
            new.event_type.as_str(),
            new.outcome.as_str(),
            new.agent.as_str(),
            at.millis(),
            details,
            new.run.as_ref().map(|r| r.component.as_str()),
            new.run.as_ref().map(|r| r.generation),
            resets,
            new.idempotency_key.as_ref().map(|k| k.as_str()),
        ],
    )
    .map_err(unavailable)?;
    Ok(())
}

/// `ObjectStore::cancel_run`: close the open run as cancelled, bump the generation, record
/// the failure, all in one transaction.
pub fn cancel_run(
    conn: &mut Connection,
    batch: &BatchId,
    component: &ComponentName,
    mut new: NewEvent,
    cap: u64,
) -> StoreResult<Cancellation> {
    write_rules::check_cancellation(&new)?;
    let tx = write_tx(conn)?;
    require_batch(&tx, batch)?;
    let seq = next_seq(&tx)?;
    let at = Timestamp::now();
    let open = query_runs(
        &tx,
        "WHERE batch_id = ?1 AND component = ?2 AND state = 'open'",
        params![batch.as_str(), component.as_str()],
    )?;
    // Every claim closes the previous open run, so at most one is open.
    let cancelled = match open.into_iter().last() {
        None => None,
        Some(mut run) => {
            tx.execute(
                "UPDATE runs SET state = 'cancelled', ended_at = ?4
                 WHERE batch_id = ?1 AND component = ?2 AND generation = ?3",
                params![batch.as_str(), component.as_str(), run.generation, at.millis()],
            )
            .map_err(unavailable)?;
            // The fence: the holder's generation is no longer current, whatever it tries.
            tx.execute(
                "UPDATE claims SET generation = generation + 1 WHERE batch_id = ?1 AND component = ?2",
                params![batch.as_str(), component.as_str()],
            )
            .map_err(unavailable)?;
            run.state = RunState::Cancelled;
            run.ended_at = Some(at);
            write_rules::describe_cancelled_run(&mut new.details, &run);
            Some(run)
        }
    };
    autocomp_model::check_object("details", &new.details)?;
    let details = new.details.to_string();
    check_event_fits(&tx, batch, &details, cap)?;
    insert_event(&tx, batch, &new, &details, seq, at)?;
    let event = new.recorded(batch, seq, at);
    summary::touch(&tx, batch, seq, |state| {
        state.record(&event);
        if cancelled.is_some() {
            state.run_closed(component);
        }
    })?;
    tx.commit().map_err(unavailable)?;
    Ok(Cancellation { event, run: cancelled })
}

/// `ObjectStore::prioritize`: the new priority and the operator's event, one transaction.
pub fn prioritize(
    conn: &mut Connection,
    id: &BatchId,
    priority: i32,
    mut new: NewEvent,
    cap: u64,
) -> StoreResult<Event> {
    write_rules::check_operator_event(&new, "prioritize")?;
    let tx = write_tx(conn)?;
    let previous: Option<i32> = tx
        .query_row("SELECT priority FROM batches WHERE id = ?1", [id.as_str()], |row| row.get(0))
        .optional()
        .map_err(unavailable)?;
    let previous = previous.ok_or_else(|| StoreError::NotFound(id.clone()))?;
    write_rules::describe_priority_change(&mut new.details, priority, previous);
    autocomp_model::check_object("details", &new.details)?;
    let details = new.details.to_string();
    check_event_fits(&tx, id, &details, cap)?;
    let seq = next_seq(&tx)?;
    let at = Timestamp::now();
    tx.execute("UPDATE batches SET priority = ?2 WHERE id = ?1", params![id.as_str(), priority])
        .map_err(unavailable)?;
    insert_event(&tx, id, &new, &details, seq, at)?;
    let event = new.recorded(id, seq, at);
    summary::touch(&tx, id, seq, |state| state.record(&event))?;
    tx.commit().map_err(unavailable)?;
    Ok(event)
}

/// `ObjectStore::record_pass`: one short write per cron start. The descriptor row is
/// rewritten only when the descriptor differs (or the component was retired), so a steady
/// pipeline only moves its hosts' `last_seen`.
pub fn record_pass(conn: &mut Connection, pass: &PassRecord) -> StoreResult<()> {
    let descriptor = &pass.descriptor;
    let text = serde_json::to_string(descriptor).expect("descriptors always serialize");
    let (name, event_type) = (descriptor.name.as_str(), descriptor.event_type.as_str());
    let tx = write_tx(conn)?;
    let now = Timestamp::now();
    let other: Option<String> = tx
        .prepare_cached("SELECT name FROM components WHERE event_type = ?1 AND retired_at IS NULL AND name <> ?2")
        .and_then(|mut statement| statement.query_row(params![event_type, name], |row| row.get(0)).optional())
        .map_err(unavailable)?;
    if let Some(other) = other {
        return Err(write_rules::event_type_taken(&descriptor.event_type, &other));
    }
    tx.prepare_cached(
        "INSERT INTO components (name, event_type, descriptor, registered_at, changed_at) VALUES (?1, ?2, ?3, ?4, ?4)
         ON CONFLICT (name) DO UPDATE SET
             event_type = excluded.event_type,
             descriptor = excluded.descriptor,
             changed_at = CASE WHEN descriptor = excluded.descriptor THEN changed_at ELSE excluded.changed_at END,
             retired_at = NULL, retired_by = NULL, retired_reason = NULL
         WHERE descriptor <> excluded.descriptor OR retired_at IS NOT NULL",
    )
    .and_then(|mut statement| statement.execute(params![name, event_type, text, now.millis()]))
    .map_err(|error| match error.sqlite_error_code() {
        // The pre-check above makes this unreachable; kept so the index's refusal still reads as one.
        Some(rusqlite::ErrorCode::ConstraintViolation) => StoreError::Conflict(format!(
            "event type {event_type} is already recorded by another component in the pipeline ({error})"
        )),
        _ => unavailable(error),
    })?;
    // A start keeps the previous end (and its outcome) so a running pass still shows how the
    // last one went; an end dates its start back by the duration the component measured.
    let (started_at, ended_at, outcome, summary, duration_ms) = match &pass.phase {
        PassPhase::Started => (now.millis(), None, None, None, None),
        PassPhase::Ended { outcome, summary, duration_ms, .. } => {
            let duration = i64::try_from(*duration_ms).unwrap_or(i64::MAX);
            (
                now.millis().saturating_sub(duration),
                Some(now.millis()),
                Some(outcome.as_str()),
                Some(summary),
                Some(duration),
            )
        }
    };
    tx.prepare_cached(
        "INSERT INTO component_hosts (component, host, version, last_seen, pass_started_at, pass_ended_at,
             pass_outcome, pass_summary, pass_duration_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, COALESCE(?8, ''), ?9)
         ON CONFLICT (component, host) DO UPDATE SET
             version = excluded.version,
             last_seen = excluded.last_seen,
             pass_started_at = excluded.pass_started_at,
             pass_ended_at = COALESCE(?6, pass_ended_at),
             pass_outcome = COALESCE(?7, pass_outcome),
             pass_summary = COALESCE(?8, pass_summary),
             pass_duration_ms = COALESCE(?9, pass_duration_ms)",
    )
    .and_then(|mut statement| {
        statement.execute(params![
            name,
            pass.host,
            descriptor.version,
            now.millis(),
            started_at,
            ended_at,
            outcome,
            summary,
            duration_ms
        ])
    })
    .map_err(unavailable)?;
    if let PassPhase::Ended { work, .. } = &pass.phase
        && !work.is_empty()
    {
        add_work(&tx, name, now, &WorkTallies::of(work))?;
    }
    tx.commit().map_err(unavailable)
}

/// `ObjectStore::components`: the registry, one consistent snapshot.
pub fn components(conn: &mut Connection) -> StoreResult<Vec<RegisteredComponent>> {
    let tx = read_tx(conn)?;
    load_components(&tx, None)
}

/// `ObjectStore::retire_component`, with `reason` already checked and trimmed.
pub fn retire_component(
    conn: &mut Connection,
    name: &ComponentName,
    by: &Agent,
    reason: &str,
) -> StoreResult<RegisteredComponent> {
    let tx = write_tx(conn)?;
    let Some(component) = load_components(&tx, Some(name))?.pop() else {
        let known: Vec<String> = tx
            .prepare_cached("SELECT name FROM components ORDER BY name")
            .and_then(|mut statement| statement.query_map([], |row| row.get(0))?.collect())
            .map_err(unavailable)?;
        return Err(write_rules::unknown_component(name, &known));
    };
    if let Some(retirement) = &component.retired {
        return Err(write_rules::retired_already(name, retirement));
    }
    let at = Timestamp::now();
    tx.execute(
        "UPDATE components SET retired_at = ?2, retired_by = ?3, retired_reason = ?4 WHERE name = ?1",
        params![name.as_str(), at.millis(), by.as_str(), reason],
    )
    .map_err(unavailable)?;
    tx.commit().map_err(unavailable)?;
    Ok(RegisteredComponent {
        retired: Some(Retirement { at, by: by.clone(), reason: reason.to_string() }),
        ..component
    })
}

/// The registry's components (or the one named), by name, each with its hosts by name.
fn load_components(tx: &Connection, only: Option<&ComponentName>) -> StoreResult<Vec<RegisteredComponent>> {
    let only = only.map(ComponentName::as_str);
    let mut hosts: std::collections::HashMap<String, Vec<HostRecord>> = std::collections::HashMap::new();
    {
        let mut statement = tx
            .prepare_cached(
                "SELECT component, host, version, last_seen, pass_started_at, pass_ended_at, pass_outcome,
                        pass_summary, pass_duration_ms
                 FROM component_hosts WHERE ?1 IS NULL OR component = ?1 ORDER BY component, host",
            )
            .map_err(unavailable)?;
        let rows = statement
            .query_map([only], |row| Ok((row.get::<_, String>(0)?, host_from_row(row)?)))
            .map_err(unavailable)?;
        for row in rows {
            let (component, host) = row.map_err(unavailable)?;
            hosts.entry(component).or_default().push(host);
        }
    }
    let mut work = load_work(tx, only)?;
    let mut statement = tx
        .prepare_cached(
            "SELECT name, descriptor, registered_at, changed_at, retired_at, retired_by, retired_reason
             FROM components WHERE ?1 IS NULL OR name = ?1 ORDER BY name",
        )
        .map_err(unavailable)?;
    statement
        .query_map([only], |row| {
            let name: String = row.get(0)?;
            let descriptor = serde_json::from_str(&row.get::<_, String>(1)?)
                .map_err(|e| rusqlite::Error::FromSqlConversionFailure(1, rusqlite::types::Type::Text, Box::new(e)))?;
            let retired = match (row.get::<_, Option<i64>>(4)?, row.get::<_, Option<String>>(5)?) {
                (Some(at), Some(by)) => Some(Retirement {
                    at: Timestamp(at),
                    by: stored(by)?,
                    reason: row.get::<_, Option<String>>(6)?.unwrap_or_default(),
                }),
                _ => None,
            };
            Ok(RegisteredComponent {
                descriptor,
                registered_at: Timestamp(row.get(2)?),
                changed_at: Timestamp(row.get(3)?),
                hosts: hosts.remove(&name).unwrap_or_default(),
                retired,
                work: work.remove(&name).unwrap_or_default(),
            })
        })
        .and_then(|rows| rows.collect::<rusqlite::Result<_>>())
        .map_err(unavailable)
}

fn host_from_row(row: &Row) -> rusqlite::Result<HostRecord> {
    let outcome = row
        .get::<_, Option<String>>(6)?
        .map(|text| PassOutcome::parse(&text))
        .transpose()
        .map_err(|e| rusqlite::Error::FromSqlConversionFailure(6, rusqlite::types::Type::Text, Box::new(e)))?;
    Ok(HostRecord {
        host: row.get(1)?,
        version: row.get(2)?,
        last_seen: Timestamp(row.get(3)?),
        pass_started_at: row.get::<_, Option<i64>>(4)?.map(Timestamp),
        pass_ended_at: row.get::<_, Option<i64>>(5)?.map(Timestamp),
        outcome,
        summary: row.get(7)?,
        duration_ms: row.get::<_, Option<i64>>(8)?.map(|ms| ms.max(0) as u64),
    })
}

pub fn count_batches(conn: &mut Connection) -> StoreResult<u64> {
    conn.query_row("SELECT COUNT(*) FROM batches", [], |row| row.get::<_, i64>(0))
        .map(|count| count.max(0) as u64)
        .map_err(unavailable)
}

/// The fence: only the newest generation of (batch, component), and only while open.
fn check_run_is_current_and_open(
    tx: &Connection,
    batch: &BatchId,
    component: &ComponentName,
    generation: i64,
) -> StoreResult<()> {
    let fenced =
        |reason: String| StoreError::Fenced { batch: batch.clone(), component: component.clone(), generation, reason };
    let current: Option<i64> = tx
        .query_row(
            "SELECT generation FROM claims WHERE batch_id = ?1 AND component = ?2",
            params![batch.as_str(), component.as_str()],
            |row| row.get(0),
        )
        .optional()
        .map_err(unavailable)?;
    match current {
        None => return Err(fenced("was never claimed".into())),
        Some(current) if current != generation => {
            return Err(fenced(format!("is not current: generation {current} has claimed the batch since")));
        }
        Some(_) => {}
    }
    let state: Option<String> = tx
        .query_row(
            "SELECT state FROM runs WHERE batch_id = ?1 AND component = ?2 AND generation = ?3",
            params![batch.as_str(), component.as_str(), generation],
            |row| row.get(0),
        )
        .optional()
        .map_err(unavailable)?;
    // A generation with no run: the one an operator's cancel moved to, claimed by nobody.
    let Some(state) = state else { return Err(fenced("was never claimed".into())) };
    match RunState::parse(&state)? {
        RunState::Open => Ok(()),
        closed => Err(fenced(format!("is already closed ({})", closed.as_str()))),
    }
}

pub fn claim(
    conn: &mut Connection,
    batch: &BatchId,
    component: &ComponentName,
    holder: &RunHolder,
) -> StoreResult<Claim> {
    let tx = write_tx(conn)?;
    let claim = claim_in(&tx, batch, component, holder)?;
    tx.commit().map_err(unavailable)?;
    Ok(claim)
}

/// `ObjectStore::claim_many`: every claim in one IMMEDIATE transaction (one commit, one
/// fsync), each in a savepoint of its own so a refused claim (unknown batch, a claim key
/// already used) changes nothing and the others still commit. If the commit fails nothing
/// was claimed and that is the outer error.
pub fn claim_many(
    conn: &mut Connection,
    batches: &[BatchId],
    component: &ComponentName,
    holder: &RunHolder,
) -> StoreResult<Vec<StoreResult<Claim>>> {
    if batches.len() > MAX_BATCH_PAGE {
        return Err(page_too_large("batches", batches.len(), MAX_BATCH_PAGE));
    }
    // A pass's claims survive its process at once (the commit is in the WAL file) and a
    // power loss with the next synced commit: the result of their work, which syncs the
    // whole WAL, claims included. Lost with the machine before then, they leave batches
    // that are simply ready again, as if never claimed. Sparing the claim its fsync halves
    // the syncs per batch and stage.
    let synchronous: i64 = conn.query_row("PRAGMA synchronous", [], |row| row.get(0)).map_err(unavailable)?;
    let relaxed = synchronous > SYNCHRONOUS_NORMAL;
    if relaxed {
        conn.pragma_update(None, "synchronous", SYNCHRONOUS_NORMAL).map_err(unavailable)?;
    }
    let claimed = claim_each(conn, batches, component, holder);
    if relaxed {
        conn.pragma_update(None, "synchronous", synchronous).map_err(unavailable)?;
    }
    claimed
}

/// SQLite's `synchronous = NORMAL`, as `PRAGMA synchronous` reads it.
const SYNCHRONOUS_NORMAL: i64 = 1;

fn claim_each(
    conn: &mut Connection,
    batches: &[BatchId],
    component: &ComponentName,
    holder: &RunHolder,
) -> StoreResult<Vec<StoreResult<Claim>>> {
    let mut tx = write_tx(conn)?;
    let mut answers = Vec::with_capacity(batches.len());
    for batch in batches {
        let savepoint = tx.savepoint().map_err(unavailable)?;
        let answer = claim_in(&savepoint, batch, component, holder);
        match answer {
            Ok(_) => savepoint.commit().map_err(unavailable)?,
            // An outage is no answer about this batch: give up on all of them.
            Err(StoreError::Unavailable(message)) => return Err(StoreError::Unavailable(message)),
            Err(_) => {} // dropped: rolled back to before this claim
        }
        answers.push(answer);
    }
    tx.commit().map_err(unavailable)?;
    Ok(answers)
}

/// One claim inside the caller's transaction (or savepoint), which commits it.
fn claim_in(tx: &Connection, batch: &BatchId, component: &ComponentName, holder: &RunHolder) -> StoreResult<Claim> {
    require_batch(tx, batch)?;
    if let Some(key) = &holder.claim_key {
        let earlier = query_runs(
            tx,
            "WHERE batch_id = ?1 AND component = ?2 AND claim_key = ?3",
            params![batch.as_str(), component.as_str(), key.as_str()],
        )?;
        if let Some(run) = earlier.into_iter().next() {
            // A retry of a claim that committed: the same run, if it is still the open one.
            let current: i64 = tx
                .query_row(
                    "SELECT generation FROM claims WHERE batch_id = ?1 AND component = ?2",
                    params![batch.as_str(), component.as_str()],
                    |row| row.get(0),
                )
                .map_err(unavailable)?;
            return write_rules::retried_claim(run, current, batch, component, holder);
        }
    }
    let seq = next_seq(tx)?;
    let now = Timestamp::now();
    let generation: i64 = tx
        .query_row(
            "INSERT INTO claims (batch_id, component, generation) VALUES (?1, ?2, 1)
             ON CONFLICT (batch_id, component) DO UPDATE SET generation = generation + 1
             RETURNING generation",
            params![batch.as_str(), component.as_str()],
            |row| row.get(0),
        )
        .map_err(unavailable)?;
    let mut abandoned = query_runs(
        tx,
        "WHERE batch_id = ?1 AND component = ?2 AND state = 'open'",
        params![batch.as_str(), component.as_str()],
    )?;
    tx.execute(
        "UPDATE runs SET state = 'abandoned', ended_at = ?3 WHERE batch_id = ?1 AND component = ?2 AND state = 'open'",
        params![batch.as_str(), component.as_str(), now.millis()],
    )
    .map_err(unavailable)?;
    for run in &mut abandoned {
        run.state = RunState::Abandoned;
        run.ended_at = Some(now);
    }
    tx.execute(
        "INSERT INTO runs (batch_id, component, generation, agent, host, pid, started_at, claim_seq, state, claim_key)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, 'open', ?9)",
        params![
            batch.as_str(),
            component.as_str(),
            generation,
            holder.agent.as_str(),
            holder.host,
            holder.pid,
            now.millis(),
            seq.0,
            holder.claim_key.as_ref().map(|k| k.as_str()),
        ],
    )
    .map_err(unavailable)?;
    summary::touch(tx, batch, seq, |state| state.run_opened(component))?;
    let run = Run {
        batch_id: batch.clone(),
        component: component.clone(),
        generation,
        holder: holder.clone(),
        started_at: now,
        claim_seq: seq,
        state: RunState::Open,
        ended_at: None,
        transient: false,
    };
    // Generations are strictly increasing and every claim closes the previous open run, so
    // at most one can have been open.
    Ok(Claim { run, abandoned: abandoned.pop() })
}

pub fn release(conn: &mut Connection, batch: &BatchId, component: &ComponentName, generation: i64) -> StoreResult<()> {
    let tx = write_tx(conn)?;
    require_batch(&tx, batch)?;
    // Releasing twice is a no-op, so a client may retry a release whose answer it lost.
    let released_already: bool = tx
        .query_row(
            "SELECT 1 FROM runs JOIN claims USING (batch_id, component)
             WHERE batch_id = ?1 AND component = ?2 AND runs.generation = ?3
               AND claims.generation = ?3 AND runs.state = 'released'",
            params![batch.as_str(), component.as_str(), generation],
            |_| Ok(true),
        )
        .optional()
        .map_err(unavailable)?
        .unwrap_or(false);
    if released_already {
        return Ok(());
    }
    check_run_is_current_and_open(&tx, batch, component, generation)?;
    let seq = next_seq(&tx)?;
    tx.execute(
        "UPDATE runs SET state = 'released', ended_at = ?4 WHERE batch_id = ?1 AND component = ?2 AND generation = ?3",
        params![batch.as_str(), component.as_str(), generation, Timestamp::now().millis()],
    )
    .map_err(unavailable)?;
    summary::touch(&tx, batch, seq, |state| state.run_closed(component))?;
    tx.commit().map_err(unavailable)
}

pub fn save_checkpoint(
    conn: &mut Connection,
    batch: &BatchId,
    component: &ComponentName,
    generation: i64,
    data: &Value,
) -> StoreResult<()> {
    let tx = write_tx(conn)?;
    require_batch(&tx, batch)?;
    check_run_is_current_and_open(&tx, batch, component, generation)?;
    tx.execute(
        "INSERT INTO checkpoints (batch_id, component, data, generation, saved_at) VALUES (?1, ?2, ?3, ?4, ?5)
         ON CONFLICT (batch_id, component) DO UPDATE
         SET data = excluded.data, generation = excluded.generation, saved_at = excluded.saved_at",
        params![batch.as_str(), component.as_str(), data.to_string(), generation, Timestamp::now().millis()],
    )
    .map_err(unavailable)?;
    tx.commit().map_err(unavailable)
}

pub fn load_checkpoint(
    conn: &mut Connection,
    batch: &BatchId,
    component: &ComponentName,
) -> StoreResult<Option<Value>> {
    let tx = read_tx(conn)?;
    require_batch(&tx, batch)?;
    let data: Option<String> = tx
        .query_row(
            "SELECT data FROM checkpoints WHERE batch_id = ?1 AND component = ?2",
            params![batch.as_str(), component.as_str()],
            |row| row.get(0),
        )
        .optional()
        .map_err(unavailable)?;
    data.map(stored_json).transpose().map_err(unavailable)
}

pub fn open_runs(conn: &mut Connection, component: Option<&ComponentName>) -> StoreResult<Vec<Run>> {
    let tx = read_tx(conn)?;
    match component {
        Some(component) => query_runs(&tx, "WHERE state = 'open' AND component = ?1", [component.as_str()]),
        None => query_runs(&tx, "WHERE state = 'open'", []),
    }
}

pub fn failed_attempts(
    conn: &mut Connection,
    batch: &BatchId,
    component: &ComponentName,
    since: Seq,
) -> StoreResult<u32> {
    conn.query_row(
        "SELECT COUNT(*) FROM runs WHERE batch_id = ?1 AND component = ?2 AND claim_seq > ?3
           AND (state = 'abandoned' OR transient = 1)",
        params![batch.as_str(), component.as_str(), since.0],
        |row| row.get(0),
    )
    .map_err(unavailable)
}

pub fn changes(conn: &mut Connection, since: Seq, limit: usize) -> StoreResult<ChangePage> {
    if limit > MAX_CHANGE_PAGE {
        return Err(page_too_large("limit", limit, MAX_CHANGE_PAGE));
    }
    let tx = read_tx(conn)?;
    let head = head_in(&tx)?;
    let changes: Vec<(Seq, BatchId)> = {
        let mut statement = tx
            .prepare_cached("SELECT changed_seq, id FROM batches WHERE changed_seq > ?1 ORDER BY changed_seq LIMIT ?2")
            .map_err(unavailable)?;
        statement
            .query_map(params![since.0, limit as i64], |row| Ok((Seq(row.get(0)?), stored(row.get(1)?)?)))
            .and_then(|rows| rows.collect::<rusqlite::Result<_>>())
            .map_err(unavailable)?
    };
    let next = match changes.last() {
        Some((seq, _)) if changes.len() == limit => *seq,
        _ => head.max(since),
    };
    Ok(ChangePage { changes, next, head })
}

pub fn head(conn: &mut Connection) -> StoreResult<Seq> {
    let tx = read_tx(conn)?;
    head_in(&tx)
}

fn head_in(tx: &Connection) -> StoreResult<Seq> {
    tx.query_row("SELECT seq FROM store_head WHERE id = 1", [], |row| row.get(0)).map(Seq).map_err(unavailable)
}
