//! Batch histories on PostgreSQL (`RetentionStore`): read whole for an export (the batches as
//! `get_batches` reads them, and every run), pruned and put back by one call each of the
//! server-side functions of `0014_pruned_histories.sql`, so each call is one transaction.

use std::collections::HashMap;

use serde_json::{Value, json};

use super::calls::{Scope, prepare};
use super::rows::runs_from_json;
use super::text::{json, text};
use super::{Failure, PgBackend, Retry};
use crate::port::{BatchHistory, PruneAnswer, PruneTicket, RestoreAnswer, RetentionStore, StoreError, StoreResult};
use autocomp_model::{BatchId, Event, EventType, Run, Seq};

impl PgBackend {
    /// Every run of the named batches, by batch.
    async fn all_runs(&self, ids: &[String]) -> StoreResult<HashMap<String, Vec<Run>>> {
        self.run("histories", Retry::Safe, |client, _| {
            Box::pin(async move {
                let statement = prepare(
                    client,
                    "SELECT r.batch_id, jsonb_agg(to_jsonb(r) ORDER BY r.component, r.generation)::text
                     FROM runs r WHERE r.batch_id = ANY($1) GROUP BY r.batch_id",
                )
                .await?;
                let rows = client.query(&statement, &[&ids]).await.map_err(|e| self.read_failure(e))?;
                rows.iter()
                    .map(|row| Ok((row.get::<_, String>(0), runs_from_json(row.get::<_, Option<&str>>(1))?)))
                    .collect()
            })
        })
        .await
    }
}

/// An event as `autocomp_restore_history` reads it: times in milliseconds, every string a
/// column or `jsonb` could not hold made storable.
fn storable_event(event: &Event) -> Value {
    json!({
        "seq": event.seq.0,
        "type": event.event_type.as_str(),
        "outcome": event.outcome.as_str(),
        "agent": text(event.agent.as_str()),
        "at": event.at.millis(),
        "details": json(&event.details),
        "run": event.run.as_ref().map(|run| json!({"component": run.component.as_str(), "generation": run.generation})),
        "resets": event.resets.iter().map(EventType::as_str).collect::<Vec<_>>(),
    })
}

/// A run as `autocomp_restore_history` reads it (see `storable_event`).
fn storable_run(run: &Run) -> Value {
    json!({
        "component": run.component.as_str(),
        "generation": run.generation,
        "holder": {
            "agent": text(run.holder.agent.as_str()),
            "host": text(&run.holder.host),
            "pid": run.holder.pid,
            "claim_key": run.holder.claim_key.as_ref().map(|key| key.as_str()),
            "liveness": run.holder.liveness.as_deref().map(text),
        },
        "started_at": run.started_at.millis(),
        "claim_seq": run.claim_seq.0,
        "state": run.state.as_str(),
        "ended_at": run.ended_at.map(|at| at.millis()),
        "transient": run.transient,
    })
}

#[async_trait::async_trait]
impl RetentionStore for PgBackend {
    async fn histories(&self, ids: &[BatchId]) -> StoreResult<Vec<BatchHistory>> {
        let asked: Vec<String> = ids.iter().map(|id| id.as_str().to_owned()).collect();
        // Two reads: a batch pruned or restored between them is read again by the next export.
        let mut batches = self.load_batches(asked.clone()).await?;
        let mut runs = self.all_runs(&asked).await?;
        let mut found = Vec::with_capacity(batches.len());
        for id in &asked {
            if let Some(batch) = batches.remove(id) {
                found.push(BatchHistory { batch, runs: runs.remove(id).unwrap_or_default() });
            }
        }
        Ok(found)
    }

    async fn prune_histories(&self, tickets: Vec<PruneTicket>) -> StoreResult<Vec<PruneAnswer>> {
        let ids: Vec<&str> = tickets.iter().map(|ticket| ticket.id.as_str()).collect();
        let changed: Vec<i64> = tickets.iter().map(|ticket| ticket.changed_seq.0).collect();
        let agents: Vec<String> =
            tickets.iter().map(|ticket| text(ticket.marker.agent.as_str()).into_owned()).collect();
        let details: Vec<Value> = tickets.iter().map(|ticket| json(&ticket.marker.details).into_owned()).collect();
        let (ids, changed, agents, details) = (&ids, &changed, &agents, &details);
        let first = tickets.first().map(|ticket| &ticket.id);
        // A repeat after a lost answer finds the pruned batches `already_pruned`: nothing twice.
        self.run("prune_histories", Retry::Safe, |client, _| {
            Box::pin(async move {
                let statement = prepare(client, "SELECT * FROM autocomp_prune_histories($1, $2, $3, $4)").await?;
                let rows =
                    client.query(&statement, &[ids, changed, agents, details]).await.map_err(|e| match first {
                        Some(batch) => self.failure(e, &Scope { batch, run: None }),
                        None => self.read_failure(e),
                    })?;
                rows.iter()
                    .map(|row| {
                        let (outcome, changed): (String, Option<i64>) = (row.get(1), row.get(2));
                        let (events, runs): (i64, i64) = (row.get(3), row.get(4));
                        Ok(match (outcome.as_str(), changed) {
                            ("pruned", Some(seq)) => {
                                PruneAnswer::Pruned { events: events as u64, runs: runs as u64, marker_seq: Seq(seq) }
                            }
                            ("moved", Some(seq)) => PruneAnswer::Moved { changed_seq: Seq(seq) },
                            ("already_pruned", _) => PruneAnswer::AlreadyPruned,
                            ("not_found", _) => PruneAnswer::NotFound,
                            (other, _) => {
                                return Err(Failure::Final(StoreError::Unavailable(format!(
                                    "autocomp_prune_histories answered {other:?}: is the store's schema this release's?"
                                ))));
                            }
                        })
                    })
                    .collect()
            })
        })
        .await
    }

    async fn restore_histories(&self, histories: Vec<BatchHistory>) -> StoreResult<Vec<RestoreAnswer>> {
        let mut answers = Vec::with_capacity(histories.len());
        for history in &histories {
            let batch = &history.batch.id;
            let events = Value::Array(history.batch.events.iter().map(storable_event).collect());
            let runs = Value::Array(history.runs.iter().map(storable_run).collect());
            let (events, runs) = (&events, &runs);
            // A repeat after a lost answer finds the batch `not_pruned`: nothing twice.
            let answer = self
                .run("restore_histories", Retry::Safe, |client, _| {
                    Box::pin(async move {
                        let statement = prepare(client, "SELECT * FROM autocomp_restore_history($1, $2, $3)").await?;
                        let row = client
                            .query_one(&statement, &[&batch.as_str(), events, runs])
                            .await
                            .map_err(|e| self.failure(e, &Scope { batch, run: None }))?;
                        let (outcome, events, runs): (String, i64, i64) = (row.get(0), row.get(1), row.get(2));
                        Ok(match outcome.as_str() {
                            "restored" => RestoreAnswer::Restored { events: events as u64, runs: runs as u64 },
                            "not_pruned" => RestoreAnswer::NotPruned,
                            "not_found" => RestoreAnswer::NotFound,
                            other => {
                                return Err(Failure::Final(StoreError::Unavailable(format!(
                                    "autocomp_restore_history answered {other:?}: is the store's schema this release's?"
                                ))));
                            }
                        })
                    })
                })
                .await?;
            answers.push(answer);
        }
        Ok(answers)
    }
}
