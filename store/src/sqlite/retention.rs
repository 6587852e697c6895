//! Batch histories on SQLite (`RetentionStore`): read whole for an export, pruned down to the
//! effective events and a `History_Pruned` event, and put back from an export. Each call is
//! one immediate transaction of at most `MAX_RETENTION_PAGE` batches.

use std::collections::HashSet;

use rusqlite::{Connection, OptionalExtension, params};

use super::rows::{in_asked_order, load_batches, query_runs};
use super::tx::{read_tx, write_tx};
use super::writes::{append_in, insert_event};
use super::{SqliteBackend, summary, unavailable};
use crate::port::{BatchHistory, PruneAnswer, PruneTicket, RestoreAnswer, RetentionStore, StoreResult};
use async_trait::async_trait;
use autocomp_model::{BatchId, EventType, NewEvent, Seq, Timestamp};

fn histories(conn: &mut Connection, ids: &[BatchId]) -> StoreResult<Vec<BatchHistory>> {
    let tx = read_tx(conn)?;
    let batches = load_batches(&tx, ids, Timestamp::now())?;
    let mut found = Vec::with_capacity(batches.len());
    for batch in batches {
        let runs = query_runs(&tx, "WHERE batch_id = ?1", [batch.id.as_str()])?;
        found.push(BatchHistory { batch, runs });
    }
    Ok(in_asked_order(ids, found, |history| &history.batch.id))
}

/// The seq of the batch's `History_Pruned` event, if its history is pruned.
fn marker_seq(tx: &Connection, id: &BatchId) -> StoreResult<Option<Seq>> {
    tx.prepare_cached("SELECT seq FROM events WHERE batch_id = ?1 AND type = ?2")
        .and_then(|mut statement| {
            statement.query_row(params![id.as_str(), EventType::HISTORY_PRUNED], |row| row.get(0)).optional()
        })
        .map(|seq| seq.map(Seq))
        .map_err(unavailable)
}

fn prune_one(tx: &Connection, ticket: PruneTicket, cap: u64) -> StoreResult<PruneAnswer> {
    let id = &ticket.id;
    let changed: Option<i64> = tx
        .prepare_cached("SELECT changed_seq FROM batches WHERE id = ?1")
        .and_then(|mut statement| statement.query_row([id.as_str()], |row| row.get(0)).optional())
        .map_err(unavailable)?;
    let Some(changed) = changed else { return Ok(PruneAnswer::NotFound) };
    if marker_seq(tx, id)?.is_some() {
        return Ok(PruneAnswer::AlreadyPruned);
    }
    let open: bool = tx
        .prepare_cached("SELECT EXISTS (SELECT 1 FROM runs WHERE batch_id = ?1 AND state = 'open')")
        .and_then(|mut statement| statement.query_row([id.as_str()], |row| row.get(0)))
        .map_err(unavailable)?;
    if changed != ticket.changed_seq.0 || open {
        return Ok(PruneAnswer::Moved { changed_seq: Seq(changed) });
    }
    let kept: Vec<i64> = summary::read(tx, std::slice::from_ref(id))?
        .pop()
        .map(|summary| summary.effective.iter().map(|event| event.seq.0).collect())
        .unwrap_or_default();
    let kept: rusqlite::vtab::array::Array =
        std::rc::Rc::new(kept.into_iter().map(rusqlite::types::Value::Integer).collect());
    // Prepared once per connection, not per batch: a prune takes hundreds to a transaction.
    let removed = |sql: &str, params: &[&dyn rusqlite::ToSql]| -> StoreResult<u64> {
        tx.prepare_cached(sql)
            .and_then(|mut statement| statement.execute(params))
            .map(|n| n as u64)
            .map_err(unavailable)
    };
    let events = removed("DELETE FROM events WHERE batch_id = ?1 AND seq NOT IN rarray(?2)", &[&id.as_str(), &kept])?;
    let runs = removed("DELETE FROM runs WHERE batch_id = ?1", &[&id.as_str()])?;
    removed("DELETE FROM checkpoints WHERE batch_id = ?1", &[&id.as_str()])?;
    removed("DELETE FROM run_outputs WHERE batch_id = ?1", &[&id.as_str()])?;
    let marker = append_in(tx, id, ticket.marker, cap)?;
    Ok(PruneAnswer::Pruned { events, runs, marker_seq: marker.seq })
}

fn prune_histories(conn: &mut Connection, tickets: Vec<PruneTicket>, cap: u64) -> StoreResult<Vec<PruneAnswer>> {
    let tx = write_tx(conn)?;
    let answers = tickets.into_iter().map(|ticket| prune_one(&tx, ticket, cap)).collect::<StoreResult<Vec<_>>>()?;
    tx.commit().map_err(unavailable)?;
    Ok(answers)
}

fn restore_one(tx: &Connection, history: BatchHistory) -> StoreResult<RestoreAnswer> {
    let id = history.batch.id.clone();
    if !super::tx::batch_exists(tx, &id)? {
        return Ok(RestoreAnswer::NotFound);
    }
    let Some(marker) = marker_seq(tx, &id)? else { return Ok(RestoreAnswer::NotPruned) };
    tx.execute("DELETE FROM events WHERE seq = ?1", [marker.0]).map_err(unavailable)?;
    let held: HashSet<i64> = tx
        .prepare_cached("SELECT seq FROM events WHERE batch_id = ?1")
        .and_then(|mut statement| {
            statement.query_map([id.as_str()], |row| row.get(0))?.collect::<rusqlite::Result<HashSet<i64>>>()
        })
        .map_err(unavailable)?;
    let mut events = 0u64;
    for event in history.batch.events.into_iter().filter(|event| !held.contains(&event.seq.0)) {
        let (seq, at, details) = (event.seq, event.at, event.details.to_string());
        let new = NewEvent {
            event_type: event.event_type,
            outcome: event.outcome,
            agent: event.agent,
            details: event.details,
            run: event.run,
            resets: event.resets,
            idempotency_key: None,
        };
        insert_event(tx, &id, &new, &details, seq, at)?;
        events += 1;
    }
    let mut runs = 0u64;
    for run in &history.runs {
        runs += tx
            .execute(
                "INSERT OR IGNORE INTO runs (batch_id, component, generation, agent, host, pid, started_at, claim_seq,
                     state, ended_at, transient, claim_key, liveness)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
                params![
                    id.as_str(),
                    run.component.as_str(),
                    run.generation,
                    run.holder.agent.as_str(),
                    run.holder.host,
                    run.holder.pid,
                    run.started_at.millis(),
                    run.claim_seq.0,
                    run.state.as_str(),
                    run.ended_at.map(Timestamp::millis),
                    run.transient,
                    run.holder.claim_key.as_ref().map(|key| key.as_str()),
                    run.holder.liveness,
                ],
            )
            .map_err(unavailable)? as u64;
    }
    // Whatever a watcher waits for, the batch is back: wake them all.
    tx.execute("INSERT INTO temp.wake_concerns VALUES ('*')", []).map_err(unavailable)?;
    // Worked out from the whole log again: the summary kept the effective events only.
    tx.execute("UPDATE batches SET summary = '' WHERE id = ?1", [id.as_str()]).map_err(unavailable)?;
    let seq = super::tx::next_seq(tx)?;
    summary::touch(tx, &id, seq, |_| {})?;
    Ok(RestoreAnswer::Restored { events, runs })
}

fn restore_histories(conn: &mut Connection, histories: Vec<BatchHistory>) -> StoreResult<Vec<RestoreAnswer>> {
    let tx = write_tx(conn)?;
    let answers = histories.into_iter().map(|history| restore_one(&tx, history)).collect::<StoreResult<Vec<_>>>()?;
    tx.commit().map_err(unavailable)?;
    Ok(answers)
}

#[async_trait]
impl RetentionStore for SqliteBackend {
    async fn histories(&self, ids: &[BatchId]) -> StoreResult<Vec<BatchHistory>> {
        let ids = ids.to_vec();
        self.with_connection(move |conn| histories(conn, &ids)).await
    }

    async fn prune_histories(&self, tickets: Vec<PruneTicket>) -> StoreResult<Vec<PruneAnswer>> {
        let cap = self.max_batch_bytes;
        self.with_connection(move |conn| prune_histories(conn, tickets, cap)).await
    }

    async fn restore_histories(&self, histories: Vec<BatchHistory>) -> StoreResult<Vec<RestoreAnswer>> {
        self.with_connection(move |conn| restore_histories(conn, histories)).await
    }
}
