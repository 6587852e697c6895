//! The embedded file's writes to batches: registration, priority and content changes, appends
//! (a group commit: many appends, one transaction), and the operator's cancel and prioritize.
//! Each is one IMMEDIATE transaction taking its seq from `store_head` inside it.

use rusqlite::{Connection, OptionalExtension, params};
use serde_json::{Map, Value};

use crate::port::{Cancellation, CreateOutcome, HandedOn, RegisteredHandingOn, StoreError, StoreResult};
use crate::write_rules::{self};
use autocomp_model::{BatchId, ComponentName, Event, NewBatch, NewEvent, RunState, Seq, Timestamp};

use super::rows::{EVENT_COLUMNS, event_from_row, load_batches, query_runs, stored_json};
use super::statements::Prepared;
use super::tx::{check_event_fits, check_run_is_current_and_open, next_seq, require_batch, write_tx};
use super::{hand_on, summary, unavailable};

pub fn create_batch(conn: &mut Connection, new: &NewBatch) -> StoreResult<CreateOutcome> {
    register(conn, new, None, &[]).map(|registered| registered.outcome)
}

/// `register_batch`: the batch and its first event in one transaction, one commit (synced
/// after it is announced where the file announces first: `announced_first`).
pub fn register_batch(conn: &mut Connection, new: &NewBatch, first: NewEvent, cap: u64) -> StoreResult<CreateOutcome> {
    register(conn, new, Some((first, cap)), &[]).map(|registered| registered.outcome)
}

/// `register_handing_on`: `register_batch`, and the new batch's runs for the takers of
/// `hand_on` in the same transaction (`hand_on::hand_on_registered_in`).
pub(super) fn register_handing_on(
    conn: &mut Connection,
    new: &NewBatch,
    first: NewEvent,
    cap: u64,
    hand_on: &[ComponentName],
) -> StoreResult<RegisteredHandingOn> {
    register(conn, new, Some((first, cap)), hand_on)
}

/// A batch registered, with its first event (and the cap it is checked against) if given,
/// and handed on to the takers of `hand_on`; an existing batch is answered as it stands (or
/// refused if different), nothing written.
fn register(
    conn: &mut Connection,
    new: &NewBatch,
    first: Option<(NewEvent, u64)>,
    hand_on: &[ComponentName],
) -> StoreResult<RegisteredHandingOn> {
    let tx = write_tx(conn)?;
    let now = Timestamp::now();
    if let Some(existing) = load_batches(&tx, std::slice::from_ref(&new.id), now)?.pop() {
        let outcome = write_rules::existing_batch(new, existing).map(CreateOutcome::AlreadyExists)?;
        return Ok(RegisteredHandingOn { outcome, runs: Vec::new() });
    }
    insert_batch(&tx, new, now)?;
    if let Some((first, cap)) = first {
        append_in(&tx, &new.id, first, cap)?;
    }
    // As registered: the runs handed on are opened after what the registrar judged.
    let batch = load_batches(&tx, std::slice::from_ref(&new.id), now)?.pop().expect("inserted in this transaction");
    let runs = hand_on::hand_on_registered_in(&tx, &new.id, hand_on)?;
    tx.commit().map_err(unavailable)?;
    Ok(RegisteredHandingOn { outcome: CreateOutcome::Created(batch), runs })
}

fn insert_batch(tx: &Connection, new: &NewBatch, now: Timestamp) -> StoreResult<()> {
    let seq = next_seq(tx)?;
    tx.execute_prepared(
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
    Ok(())
}

pub fn set_priority(conn: &mut Connection, id: &BatchId, priority: i32) -> StoreResult<Seq> {
    let tx = write_tx(conn)?;
    require_batch(&tx, id)?;
    let seq = next_seq(&tx)?;
    tx.execute_prepared("UPDATE batches SET priority = ?2 WHERE id = ?1", params![id.as_str(), priority])
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
        .query_row_prepared("SELECT metadata, stored_bytes FROM batches WHERE id = ?1", [id.as_str()], |row| {
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
    tx.execute_prepared(
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
    /// The components to hand the batch on to (`HandOnStore::append_handing_on`).
    pub hand_on: Vec<ComponentName>,
    pub reply: tokio::sync::oneshot::Sender<StoreResult<HandedOn>>,
}

/// A reply owed to a queued append, and its answer.
pub(super) type Answered = (tokio::sync::oneshot::Sender<StoreResult<HandedOn>>, StoreResult<HandedOn>);

/// Group commit: every append in `group` in one IMMEDIATE transaction (one fsync), each in
/// a savepoint of its own, so a refused append (fenced, unknown batch) changes nothing and
/// the others still commit. Each gets the answer it would have got alone; if the commit
/// itself fails, none was written and all get that error. The answers are returned with
/// their replies, for the caller to send once the commit is on disk.
pub(super) fn append_group(conn: &mut Connection, mut group: Vec<PendingAppend>, cap: u64) -> Vec<Answered> {
    if group.len() == 1 {
        // Alone: no savepoint needed, a refusal rolls back the whole transaction.
        let pending = group.pop().expect("one");
        let answer = write_tx(conn).and_then(|tx| {
            let handed = append_handing_on_in(&tx, &pending.batch, pending.event, &pending.hand_on, cap)?;
            tx.commit().map_err(unavailable)?;
            Ok(handed)
        });
        return vec![(pending.reply, answer)];
    }
    let mut answers = Vec::with_capacity(group.len());
    let committed = (|| {
        let mut tx = write_tx(conn)?;
        for pending in group {
            let savepoint = tx.savepoint().map_err(unavailable)?;
            let answer = append_handing_on_in(&savepoint, &pending.batch, pending.event, &pending.hand_on, cap);
            if answer.is_ok() {
                savepoint.commit().map_err(unavailable)?;
            } // else dropped: rolled back to before this append
            answers.push((pending.reply, answer));
        }
        tx.commit().map_err(unavailable)
    })();
    answers
        .into_iter()
        .map(|(reply, answer)| match &committed {
            Ok(()) => (reply, answer),
            Err(error) => {
                (reply, Err(StoreError::Unavailable(format!("group commit failed, nothing written: {error}"))))
            }
        })
        .collect()
}

/// `append_in`, then the runs it hands the batch on to (`hand_on::hand_on_in`), judged
/// against the batch's `changed_seq` before the append.
fn append_handing_on_in(
    tx: &Connection,
    batch: &BatchId,
    new: NewEvent,
    hand_on: &[ComponentName],
    cap: u64,
) -> StoreResult<HandedOn> {
    let changed_before = match hand_on.is_empty() {
        true => None,
        false => hand_on::changed_seq(tx, batch)?,
    };
    let event = append_in(tx, batch, new, cap)?;
    let runs = match changed_before {
        Some(before) => hand_on::hand_on_in(tx, batch, &event, before, hand_on)?,
        None => Vec::new(),
    };
    Ok(HandedOn { event, runs })
}

pub(super) fn append_in(tx: &Connection, batch: &BatchId, new: NewEvent, cap: u64) -> StoreResult<Event> {
    // A retry of an append that already committed must see its first result, not a fence:
    // the first attempt closed the run.
    if let Some(key) = &new.idempotency_key {
        let earlier = tx
            .query_row_prepared(
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
        tx.execute_prepared(
            "UPDATE runs SET state = 'recorded', ended_at = ?4, transient = ?5
             WHERE batch_id = ?1 AND component = ?2 AND generation = ?3",
            params![batch.as_str(), run.component.as_str(), run.generation, at.millis(), transient],
        )
        .map_err(unavailable)?;
        // A transient failure keeps the checkpoint: the retry resumes from it, as it would
        // after an abandoned run. Any other result ends what the checkpoint was for.
        if !transient {
            tx.execute_prepared(
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
pub(super) fn insert_event(
    tx: &Connection,
    batch: &BatchId,
    new: &NewEvent,
    details: &str,
    seq: Seq,
    at: Timestamp,
) -> StoreResult<()> {
    let resets =
        (!new.resets.is_empty()).then(|| serde_json::to_string(&new.resets).expect("event types always serialize"));
    tx.execute_prepared(
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
            tx.execute_prepared(
                "UPDATE runs SET state = 'cancelled', ended_at = ?4
                 WHERE batch_id = ?1 AND component = ?2 AND generation = ?3",
                params![batch.as_str(), component.as_str(), run.generation, at.millis()],
            )
            .map_err(unavailable)?;
            // The fence: the holder's generation is no longer current, whatever it tries.
            tx.execute_prepared(
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
    let tx = write_tx(conn)?;
    let previous: Option<i32> = tx
        .query_row_prepared("SELECT priority FROM batches WHERE id = ?1", [id.as_str()], |row| row.get(0))
        .optional()
        .map_err(unavailable)?;
    let previous = previous.ok_or_else(|| StoreError::NotFound(id.clone()))?;
    write_rules::describe_priority_change(&mut new.details, priority, previous);
    autocomp_model::check_object("details", &new.details)?;
    let details = new.details.to_string();
    check_event_fits(&tx, id, &details, cap)?;
    let seq = next_seq(&tx)?;
    let at = Timestamp::now();
    tx.execute_prepared("UPDATE batches SET priority = ?2 WHERE id = ?1", params![id.as_str(), priority])
        .map_err(unavailable)?;
    insert_event(&tx, id, &new, &details, seq, at)?;
    let event = new.recorded(id, seq, at);
    summary::touch(&tx, id, seq, |state| state.record(&event))?;
    tx.commit().map_err(unavailable)?;
    Ok(event)
}
