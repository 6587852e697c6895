//! The embedded file's reads of batches and of the change feed, each in one read transaction (a
//! page of batches: three statements, not three per batch).

use rusqlite::{Connection, OptionalExtension, params};
use serde_json::{Map, Value};

use crate::port::{BatchHead, BatchListing, ChangePage, LogCursor, LogPage, StoreError, StoreResult};
use autocomp_model::{Batch, BatchId, BatchSummary, ComponentName, EventType, Run, Seq, Timestamp};

use super::rows::{
    EVENT_COLUMNS, NameCache, event_from_row_of, load_batch, load_batches, query_runs, stored, stored_json,
};
use super::statements::Prepared;
use super::tx::{head_in, read_tx, require_batch};
use super::{summary, unavailable};

pub fn get_batches(conn: &mut Connection, ids: &[BatchId]) -> StoreResult<Vec<Batch>> {
    let tx = read_tx(conn)?;
    load_batches(&tx, ids, Timestamp::now())
}

/// `get_batches` as it was before it became set-based: three statements per batch. Kept
/// only so the benchmark can measure both in one run.
pub fn get_batches_one_by_one(conn: &mut Connection, ids: &[BatchId]) -> StoreResult<Vec<Batch>> {
    let tx = read_tx(conn)?;
    let now = Timestamp::now();
    let mut batches = Vec::with_capacity(ids.len());
    for id in ids {
        batches.extend(load_batch(&tx, id, now)?);
    }
    Ok(batches)
}

pub fn list_batches(conn: &mut Connection, after: Option<&BatchId>, limit: usize) -> StoreResult<Vec<Batch>> {
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
    let tx = read_tx(conn)?;
    summary::read(&tx, ids)
}

pub fn list_summaries(conn: &mut Connection, after: Option<&BatchId>, limit: usize) -> StoreResult<Vec<BatchSummary>> {
    let tx = read_tx(conn)?;
    summary::list(&tx, after, limit)
}

/// `ObjectStore::get_listings`: the summaries, the batch rows' `created_at` and the open
/// runs of the page, three statements in one read transaction, the ids bound as one `rarray`.
pub fn get_listings(conn: &mut Connection, ids: &[BatchId]) -> StoreResult<Vec<BatchListing>> {
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

pub fn count_batches(conn: &mut Connection) -> StoreResult<u64> {
    conn.query_row_prepared("SELECT COUNT(*) FROM batches", [], |row| row.get::<_, i64>(0))
        .map(|count| count.max(0) as u64)
        .map_err(unavailable)
}

pub fn changes(conn: &mut Connection, since: Seq, limit: usize) -> StoreResult<ChangePage> {
    let tx = read_tx(conn)?;
    changes_in(&tx, since, limit)
}

/// `ObjectStore::changed_summaries`: the page and its batches' summaries in one read
/// transaction (one snapshot, one trip to the store's thread).
pub fn changed_summaries(
    conn: &mut Connection,
    since: Seq,
    limit: usize,
) -> StoreResult<(ChangePage, Vec<BatchSummary>)> {
    let tx = read_tx(conn)?;
    let page = changes_in(&tx, since, limit)?;
    let ids: Vec<BatchId> = page.changes.iter().map(|(_, id)| id.clone()).collect();
    let summaries = summary::read(&tx, &ids)?;
    Ok((page, summaries))
}

fn changes_in(tx: &rusqlite::Transaction<'_>, since: Seq, limit: usize) -> StoreResult<ChangePage> {
    let head = head_in(tx)?;
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
