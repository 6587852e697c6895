//! The per-batch summary the SQLite store keeps for the batch index (column
//! `batches.summary`): every write that changes a batch's effective events or open runs
//! updates it in the same transaction, so a catch-up reads one row per batch instead of
//! its whole log. Stored compactly as `[last_event_at, [[type, "s"|"f", seq, transient]],
//! [running component]]`.

use std::collections::HashMap;

use rusqlite::{Connection, Row, params};

use crate::model::{
    BatchId, BatchSummary, ComponentName, EventSummary, EventType, Outcome, Seq, SummaryHeader, SummaryState, Timestamp,
};
use crate::port::{StoreError, StoreResult};

use super::ops::{NameCache, cached, corrupt_row};
use super::unavailable;

/// What a batch without events or runs stores.
pub fn empty() -> String {
    encode(&SummaryState::default())
}

fn encode(state: &SummaryState) -> String {
    let effective: Vec<(&str, &str, i64, u8)> = state
        .effective
        .iter()
        .map(|event| {
            let outcome = match event.outcome {
                Outcome::Success => "s",
                Outcome::Failure => "f",
            };
            (event.event_type.as_str(), outcome, event.seq.0, u8::from(event.transient))
        })
        .collect();
    let running: Vec<&str> = state.running.iter().map(ComponentName::as_str).collect();
    serde_json::to_string(&(state.last_event_at.millis(), effective, running)).expect("summaries serialize")
}

/// The stored form, borrowed from the row: names hold no JSON escapes (they are validated
/// identifiers), so nothing is copied until a name is needed.
type Stored<'a> = (i64, Vec<(&'a str, &'a str, i64, u8)>, Vec<&'a str>);

fn decode(text: &str, batch: &str, names: &mut NameCache) -> StoreResult<SummaryState> {
    let corrupt = || StoreError::Unavailable(format!("the stored summary of batch {batch:?} is unreadable"));
    let (last_event_at, effective, running): Stored = serde_json::from_str(text).map_err(|_| corrupt())?;
    let effective = effective
        .into_iter()
        .map(|(event_type, outcome, seq, transient)| {
            Ok(EventSummary {
                event_type: cached::<EventType>(&mut names.event_types, event_type).map_err(|_| corrupt())?,
                outcome: match outcome {
                    "s" => Outcome::Success,
                    "f" => Outcome::Failure,
                    _ => return Err(corrupt()),
                },
                seq: Seq(seq),
                transient: transient != 0,
            })
        })
        .collect::<StoreResult<Vec<_>>>()?;
    let running = running
        .into_iter()
        .map(|component| cached::<ComponentName>(&mut names.components, component).map_err(|_| corrupt()))
        .collect::<StoreResult<Vec<_>>>()?;
    Ok(SummaryState { last_event_at: Timestamp(last_event_at), effective, running })
}

/// Moves the batch's `changed_seq` to `seq` and applies `change` to its summary: what every
/// write that changes a batch's events or runs ends with.
pub fn touch(tx: &Connection, id: &BatchId, seq: Seq, change: impl FnOnce(&mut SummaryState)) -> StoreResult<()> {
    let text: String = tx
        .prepare_cached("SELECT summary FROM batches WHERE id = ?1")
        .and_then(|mut statement| statement.query_row([id.as_str()], |row| row.get(0)))
        .map_err(unavailable)?;
    let mut state = decode(&text, id.as_str(), &mut NameCache::default())?;
    change(&mut state);
    tx.prepare_cached("UPDATE batches SET changed_seq = ?2, summary = ?3 WHERE id = ?1")
        .and_then(|mut statement| statement.execute(params![id.as_str(), seq.0, encode(&state)]))
        .map_err(unavailable)?;
    Ok(())
}

const SUMMARY_COLUMNS: &str = "id, type, priority, created_seq, modified_seq, changed_seq, modified_at, summary";

fn summary_from_row(row: &Row, names: &mut NameCache) -> StoreResult<BatchSummary> {
    let text = |i: usize| -> StoreResult<&str> { row.get_ref(i).and_then(|v| Ok(v.as_str()?)).map_err(unavailable) };
    let number = |i: usize| -> StoreResult<i64> { row.get(i).map_err(unavailable) };
    let id = BatchId::new(text(0)?).map_err(|e| StoreError::Unavailable(e.to_string()))?;
    let header = SummaryHeader {
        batch_type: cached(&mut names.batch_types, text(1)?).map_err(unavailable)?,
        priority: row.get(2).map_err(unavailable)?,
        created_seq: Seq(number(3)?),
        modified_seq: Seq(number(4)?),
        changed_seq: Seq(number(5)?),
        modified_at: Timestamp(number(6)?),
        id,
    };
    let state = decode(text(7)?, header.id.as_str(), names)?;
    Ok(state.summary(header))
}

/// The summaries of the named batches, in the order asked (unknown ids left out, an id
/// asked twice answered twice), in one statement.
pub fn read(tx: &Connection, ids: &[BatchId]) -> StoreResult<Vec<BatchSummary>> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let asked: rusqlite::vtab::array::Array =
        std::rc::Rc::new(ids.iter().map(|id| rusqlite::types::Value::Text(id.as_str().to_owned())).collect());
    let mut statement = tx
        .prepare_cached(&format!("SELECT {SUMMARY_COLUMNS} FROM batches WHERE id IN rarray(?1)"))
        .map_err(unavailable)?;
    let mut rows = statement.query([&asked]).map_err(unavailable)?;
    // SQLite walks the ids in its own order (sorted): each row goes to the slot of the
    // position its id was asked at first; an id asked again gets a copy.
    let mut first_asked: HashMap<&str, usize> = HashMap::with_capacity(ids.len());
    for (position, id) in ids.iter().enumerate() {
        first_asked.entry(id.as_str()).or_insert(position);
    }
    let mut slots: Vec<Option<BatchSummary>> = vec![None; ids.len()];
    let mut names = NameCache::default();
    while let Some(row) = rows.next().map_err(unavailable)? {
        let summary = summary_from_row(row, &mut names)?;
        let position =
            *first_asked.get(summary.id.as_str()).ok_or_else(|| corrupt_row("batches", summary.id.as_str()))?;
        slots[position] = Some(summary);
    }
    if first_asked.len() < ids.len() {
        for (position, id) in ids.iter().enumerate() {
            let first = first_asked[id.as_str()];
            if first != position {
                slots[position] = slots[first].clone();
            }
        }
    }
    Ok(slots.into_iter().flatten().collect())
}

/// Summaries in id order after `after`, at most `limit`.
pub fn list(tx: &Connection, after: Option<&BatchId>, limit: usize) -> StoreResult<Vec<BatchSummary>> {
    let mut statement = tx
        .prepare_cached(&format!("SELECT {SUMMARY_COLUMNS} FROM batches WHERE id > ?1 ORDER BY id LIMIT ?2"))
        .map_err(unavailable)?;
    let mut rows = statement.query(params![after.map_or("", BatchId::as_str), limit as i64]).map_err(unavailable)?;
    let mut names = NameCache::default();
    let mut summaries = Vec::with_capacity(limit.min(10_000));
    while let Some(row) = rows.next().map_err(unavailable)? {
        summaries.push(summary_from_row(row, &mut names)?);
    }
    Ok(summaries)
}

/// Fills in the summary of every batch from its log and runs: the upgrade of a store file
/// written before summaries were kept (schema 7), inside the migration's transaction.
pub fn backfill(tx: &Connection) -> StoreResult<u64> {
    const PAGE: usize = 1_000;
    let (mut after, mut filled) = (String::new(), 0u64);
    loop {
        let ids: Vec<BatchId> = tx
            .prepare_cached("SELECT id FROM batches WHERE id > ?1 ORDER BY id LIMIT ?2")
            .and_then(|mut statement| {
                statement
                    .query_map(params![after, PAGE as i64], |row| row.get::<_, String>(0))?
                    .collect::<rusqlite::Result<Vec<_>>>()
            })
            .map_err(unavailable)?
            .into_iter()
            .map(|id| BatchId::new(id).map_err(|e| StoreError::Unavailable(e.to_string())))
            .collect::<StoreResult<_>>()?;
        let Some(last) = ids.last() else { return Ok(filled) };
        after = last.as_str().to_owned();
        for batch in super::ops::load_batches(tx, &ids, Timestamp::now())? {
            tx.execute(
                "UPDATE batches SET summary = ?2 WHERE id = ?1",
                params![batch.id.as_str(), encode(&SummaryState::of(&batch))],
            )
            .map_err(unavailable)?;
            filled += 1;
        }
        if ids.len() < PAGE {
            return Ok(filled);
        }
    }
}
