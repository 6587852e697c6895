//! The per-batch summary the SQLite store keeps for the batch index (column
//! `batches.summary`): every write that changes a batch updates it in the same transaction,
//! so a catch-up reads one row per batch instead of its whole log. Stored compactly as
//! `[stamp, last_event_at, [[type, "s"|"f", seq, flags, content_seq]], [running component]]`,
//! `flags` 1 for transient, 2 for skipped and 4 for acknowledged, `content_seq` 0 for none. A summary of an older
//! release (four fields per event) does not decode and is computed from the log again.
//!
//! The stamp is the `changed_seq` the summary was written at. A write that bypassed it (a
//! process of an older release still holding the file after the upgrade, a hand edit)
//! moves `changed_seq` without the stamp, or leaves the summary empty: such a summary is
//! not trusted but computed from the log again, on read and on the next write.

use rusqlite::{Connection, Row, params};

use crate::port::{StoreError, StoreResult};
use autocomp_model::{
    BatchId, BatchSummary, ComponentName, EventSummary, EventType, Outcome, Seq, SummaryHeader, SummaryState, Timestamp,
};

use super::rows::{NameCache, cached, in_asked_order, load_batches};
use super::statements::Prepared;
use super::unavailable;
use crate::write_rules::MAX_BATCH_PAGE;

/// What a batch without events or runs stores, created at `seq`.
pub fn empty(seq: Seq) -> String {
    encode(seq, &SummaryState::default())
}

fn encode(stamp: Seq, state: &SummaryState) -> String {
    let effective: Vec<(&str, &str, i64, u8, i64)> = state
        .effective
        .iter()
        .map(|event| {
            let outcome = match event.outcome {
                Outcome::Success => "s",
                Outcome::Failure => "f",
            };
            let flags =
                u8::from(event.transient) | (u8::from(event.skipped) << 1) | (u8::from(event.acknowledged) << 2);
            (event.event_type.as_str(), outcome, event.seq.0, flags, event.content_seq.map_or(0, |seq| seq.0))
        })
        .collect();
    let running: Vec<&str> = state.running.iter().map(ComponentName::as_str).collect();
    serde_json::to_string(&(stamp.0, state.last_event_at.millis(), effective, running)).expect("summaries serialize")
}

/// The stored form, borrowed from the row: names hold no JSON escapes (they are validated
/// identifiers), so nothing is copied until a name is needed.
type Stored<'a> = (i64, i64, Vec<(&'a str, &'a str, i64, u8, i64)>, Vec<&'a str>);

/// The stored state, if it is readable and was written at `changed_seq`.
fn decode(text: &str, changed_seq: Seq, names: &mut NameCache) -> Option<SummaryState> {
    let (stamp, last_event_at, effective, running): Stored = serde_json::from_str(text).ok()?;
    if stamp != changed_seq.0 {
        return None;
    }
    let effective = effective
        .into_iter()
        .map(|(event_type, outcome, seq, flags, content_seq)| {
            Some(EventSummary {
                event_type: cached::<EventType>(&mut names.event_types, event_type).ok()?,
                outcome: match outcome {
                    "s" => Outcome::Success,
                    "f" => Outcome::Failure,
                    _ => return None,
                },
                seq: Seq(seq),
                transient: flags & 1 != 0,
                skipped: flags & 2 != 0,
                acknowledged: flags & 4 != 0,
                content_seq: (content_seq != 0).then_some(Seq(content_seq)),
            })
        })
        .collect::<Option<Vec<_>>>()?;
    let running = running
        .into_iter()
        .map(|component| cached::<ComponentName>(&mut names.components, component).ok())
        .collect::<Option<Vec<_>>>()?;
    Some(SummaryState { last_event_at: Timestamp(last_event_at), effective, running })
}

/// The batch's state computed from its log and runs: for a summary that cannot be trusted.
fn from_log(tx: &Connection, id: &BatchId) -> StoreResult<SummaryState> {
    let batch = load_batches(tx, std::slice::from_ref(id), Timestamp::now())?.pop();
    batch.map(|batch| SummaryState::of(&batch)).ok_or_else(|| StoreError::NotFound(id.clone()))
}

/// Moves the batch's `changed_seq` to `seq` and applies `change` to its summary: what every
/// write that changes a batch ends with (a write changing neither events nor runs passes a
/// `change` that does nothing, to stamp the summary). A summary that cannot be trusted is
/// computed from the log first; the log then already holds this write's event or run, and
/// applying `change` again leaves it as it is.
pub fn touch(tx: &Connection, id: &BatchId, seq: Seq, change: impl FnOnce(&mut SummaryState)) -> StoreResult<()> {
    let (changed_seq, text): (i64, String) = tx
        .prepare_cached("SELECT changed_seq, summary FROM batches WHERE id = ?1")
        .and_then(|mut statement| statement.query_row([id.as_str()], |row| Ok((row.get(0)?, row.get(1)?))))
        .map_err(unavailable)?;
    let mut state = match decode(&text, Seq(changed_seq), &mut NameCache::default()) {
        Some(state) => state,
        None => from_log(tx, id)?,
    };
    change(&mut state);
    tx.prepare_cached("UPDATE batches SET changed_seq = ?2, summary = ?3 WHERE id = ?1")
        .and_then(|mut statement| statement.execute(params![id.as_str(), seq.0, encode(seq, &state)]))
        .map_err(unavailable)?;
    Ok(())
}

const SUMMARY_COLUMNS: &str = "id, type, priority, created_seq, modified_seq, changed_seq, modified_at, summary";

/// A row's summary, or its id when the stored one cannot be trusted.
fn summary_from_row(row: &Row, names: &mut NameCache) -> StoreResult<Result<BatchSummary, BatchId>> {
    let text = |i: usize| -> StoreResult<&str> { row.get_ref(i).and_then(|v| Ok(v.as_str()?)).map_err(unavailable) };
    let number = |i: usize| -> StoreResult<i64> { row.get(i).map_err(unavailable) };
    let id = BatchId::new(text(0)?).map_err(|e| StoreError::Unavailable(e.to_string()))?;
    let changed_seq = Seq(number(5)?);
    let Some(state) = decode(text(7)?, changed_seq, names) else { return Ok(Err(id)) };
    let header = SummaryHeader {
        id,
        batch_type: cached(&mut names.batch_types, text(1)?).map_err(unavailable)?,
        priority: row.get(2).map_err(unavailable)?,
        created_seq: Seq(number(3)?),
        modified_seq: Seq(number(4)?),
        changed_seq,
        modified_at: Timestamp(number(6)?),
    };
    Ok(Ok(state.summary(header)))
}

/// The summaries of `rows`, those that cannot be trusted computed from their logs (in the
/// same read transaction), in row order.
fn summaries_of(tx: &Connection, mut rows: rusqlite::Rows<'_>) -> StoreResult<Vec<BatchSummary>> {
    let mut names = NameCache::default();
    let mut found = Vec::new();
    while let Some(row) = rows.next().map_err(unavailable)? {
        found.push(summary_from_row(row, &mut names)?);
    }
    let untrusted: Vec<BatchId> = found.iter().filter_map(|row| row.as_ref().err().cloned()).collect();
    if untrusted.is_empty() {
        return Ok(found.into_iter().flatten().collect());
    }
    let computed = load_batches(tx, &untrusted, Timestamp::now())?.iter().map(BatchSummary::of).collect();
    let mut computed = in_asked_order(&untrusted, computed, |summary| &summary.id).into_iter();
    found
        .into_iter()
        .map(|row| match row {
            Ok(summary) => Ok(summary),
            // The same read transaction found the row: its batch is there.
            Err(id) => computed.next().ok_or(StoreError::NotFound(id)),
        })
        .collect()
}

/// The summaries of the named batches, in the order asked (unknown ids left out, an id
/// asked twice answered once), in one statement.
pub fn read(tx: &Connection, ids: &[BatchId]) -> StoreResult<Vec<BatchSummary>> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let asked: rusqlite::vtab::array::Array =
        std::rc::Rc::new(ids.iter().map(|id| rusqlite::types::Value::Text(id.as_str().to_owned())).collect());
    let mut statement = tx
        .prepare_cached(&format!("SELECT {SUMMARY_COLUMNS} FROM batches WHERE id IN rarray(?1)"))
        .map_err(unavailable)?;
    // SQLite walks the ids in its own order (sorted), not the order asked.
    let found = summaries_of(tx, statement.query([&asked]).map_err(unavailable)?)?;
    Ok(in_asked_order(ids, found, |summary| &summary.id))
}

/// Summaries in id order after `after`, at most `limit`.
pub fn list(tx: &Connection, after: Option<&BatchId>, limit: usize) -> StoreResult<Vec<BatchSummary>> {
    let mut statement = tx
        .prepare_cached(&format!("SELECT {SUMMARY_COLUMNS} FROM batches WHERE id > ?1 ORDER BY id LIMIT ?2"))
        .map_err(unavailable)?;
    let rows = statement.query(params![after.map_or("", BatchId::as_str), limit.min(MAX_BATCH_PAGE) as i64]);
    summaries_of(tx, rows.map_err(unavailable)?)
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
        for batch in load_batches(tx, &ids, Timestamp::now())? {
            tx.execute_prepared(
                "UPDATE batches SET summary = ?2 WHERE id = ?1",
                params![batch.id.as_str(), encode(batch.changed_seq, &SummaryState::of(&batch))],
            )
            .map_err(unavailable)?;
            filled += 1;
        }
        if ids.len() < PAGE {
            return Ok(filled);
        }
    }
}
