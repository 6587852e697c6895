//! PostgreSQL's conditional writes to batches: registration, a metadata merge, the operator's
//! cancel and prioritize; each reads first and writes only if the batch has not moved since.

use serde_json::{Map, Value};

use super::appends::busy;
use super::calls::{CONDITIONAL_ROUNDS, Scope, optional_json, prepare, prepare_if_defined};
use super::rows::{corrupt, run_from_value, runs_from_json};
use super::text::{self, unjsoned};
use super::{Failure, PgBackend, Retry};
use crate::port::{BatchStore, Cancellation, CreateOutcome, RegisteredHandingOn, StoreError, StoreResult};
use crate::write_rules::{self};
use autocomp_model::{BatchId, ComponentName, Event, NewBatch, NewEvent, RunState, Seq, Timestamp};

impl PgBackend {
    pub(super) async fn pg_create_batch(&self, batch: NewBatch) -> StoreResult<CreateOutcome> {
        let metadata = text::json(&batch.metadata);
        let created = self
            .run("create_batch", Retry::Safe, |client, _| {
                let (batch, metadata) = (&batch, &*metadata);
                Box::pin(async move {
                    let statement = prepare(client, "SELECT * FROM autocomp_create_batch($1, $2, $3, $4)").await?;
                    let row = client
                        .query_one(
                            &statement,
                            &[&batch.id.as_str(), &batch.batch_type.as_str(), &batch.priority, metadata],
                        )
                        .await
                        .map_err(|e| self.failure(e, &Scope { batch: &batch.id, run: None }))?;
                    let created: bool = row.get(0);
                    Ok(created.then(|| (Seq(row.get(1)), Timestamp(row.get(2)))))
                })
            })
            .await?;
        match created {
            Some((seq, at)) => Ok(CreateOutcome::Created(batch.registered(seq, at))),
            None => {
                let existing = self.get_batch(&batch.id).await?;
                write_rules::existing_batch(&batch, existing).map(CreateOutcome::AlreadyExists)
            }
        }
    }

    /// `register_batch`: one call of `autocomp_register_batch`, one commit. A retry after a
    /// lost answer finds the batch and compares it, as `create_batch` does.
    pub(super) async fn pg_register_batch(&self, batch: NewBatch, first: NewEvent) -> StoreResult<CreateOutcome> {
        self.pg_register(batch, first, &[]).await.map(|registered| registered.outcome)
    }

    /// `register_handing_on`: `register_batch`, calling the registration with hand-ons
    /// (schema 25) when it names any. On a schema without it (a migration not applied yet)
    /// the batch is registered and handed nothing: its steps claim it.
    pub(super) async fn pg_register(
        &self,
        batch: NewBatch,
        first: NewEvent,
        hand_on: &[ComponentName],
    ) -> StoreResult<RegisteredHandingOn> {
        let metadata = text::json(&batch.metadata);
        let details = text::json(&first.details);
        let resets = optional_json(&first.resets);
        let hand_ons = (!hand_on.is_empty())
            .then(|| Value::Array(hand_on.iter().map(|name| Value::String(name.to_string())).collect()));
        let cap = self.cap();
        let created = self
            .run("register_batch", Retry::Safe, |client, _| {
                let (batch, first, metadata, details, resets) = (&batch, &first, &*metadata, &*details, &resets);
                let hand_ons = &hand_ons;
                Box::pin(async move {
                    let with_hand_ons = match hand_ons {
                        Some(_) => {
                            prepare_if_defined(
                                client,
                                "SELECT r_created, r_seq, r_at, r_event_seq, r_event_at, r_handed::text
                             FROM autocomp_register_batch($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
                            )
                            .await?
                        }
                        None => None,
                    };
                    let statement = match &with_hand_ons {
                        Some(statement) => statement.clone(),
                        None => {
                            prepare(
                                client,
                                "SELECT r_created, r_seq, r_at, r_event_seq, r_event_at, NULL::text
                                 FROM autocomp_register_batch($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
                            )
                            .await?
                        }
                    };
                    let (id, batch_type, event_type) =
                        (batch.id.as_str(), batch.batch_type.as_str(), first.event_type.as_str());
                    let (outcome, agent) = (first.outcome.as_str(), first.agent.as_str());
                    let mut params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = vec![
                        &id,
                        &batch_type,
                        &batch.priority,
                        metadata,
                        &event_type,
                        &outcome,
                        &agent,
                        details,
                        resets,
                        &cap,
                    ];
                    if with_hand_ons.is_some() {
                        params.push(hand_ons);
                    }
                    let row = client
                        .query_one(&statement, &params)
                        .await
                        .map_err(|e| self.failure(e, &Scope { batch: &batch.id, run: None }))?;
                    if !row.get::<_, bool>(0) {
                        return Ok(None);
                    }
                    let stamps = |seq: usize, at: usize| (Seq(row.get(seq)), Timestamp(row.get(at)));
                    Ok(Some((stamps(1, 2), stamps(3, 4), runs_from_json(row.get::<_, Option<&str>>(5))?)))
                })
            })
            .await?;
        match created {
            Some(((seq, at), (event_seq, event_at), runs)) => {
                let event = first.recorded(&batch.id, event_seq, event_at);
                let mut registered = batch.registered(seq, at);
                registered.changed_seq = event_seq;
                registered.as_of = event_at;
                registered.events.push(event);
                Ok(RegisteredHandingOn { outcome: CreateOutcome::Created(registered), runs })
            }
            None => {
                let existing = self.get_batch(&batch.id).await?;
                let outcome = write_rules::existing_batch(&batch, existing).map(CreateOutcome::AlreadyExists)?;
                Ok(RegisteredHandingOn { outcome, runs: Vec::new() })
            }
        }
    }

    pub(super) async fn pg_record_content_change(
        &self,
        id: &BatchId,
        metadata_patch: Map<String, Value>,
    ) -> StoreResult<Seq> {
        // Merging the same patch twice leaves the same metadata, so a retry is harmless.
        self.run("record_content_change", Retry::Safe, |client, _| {
            let patch = &metadata_patch;
            Box::pin(async move {
                let read = prepare(client, "SELECT metadata::text, modified_seq FROM batches WHERE id = $1").await?;
                let write = prepare(client, "SELECT autocomp_replace_metadata($1, $2, $3, $4)").await?;
                let scope = Scope { batch: id, run: None };
                for _ in 0..CONDITIONAL_ROUNDS {
                    let row = client.query_opt(&read, &[&id.as_str()]).await.map_err(|e| self.read_failure(e))?;
                    let row = row.ok_or_else(|| Failure::Final(StoreError::NotFound(id.clone())))?;
                    let metadata: Value =
                        serde_json::from_str(row.get::<_, &str>(0)).map(unjsoned).map_err(|e| corrupt("batch", e))?;
                    let expected: i64 = row.get(1);
                    let merged = write_rules::merge_metadata(metadata, patch.clone()).map_err(Failure::Final)?;
                    let row = client
                        .query_one(&write, &[&id.as_str(), &expected, &*text::json(&merged), &self.cap()])
                        .await
                        .map_err(|e| self.failure(e, &scope))?;
                    if let Some(seq) = row.get::<_, Option<i64>>(0) {
                        return Ok(Seq(seq));
                    }
                }
                Err(Failure::Final(busy(id)))
            })
        })
        .await
    }

    pub(super) async fn pg_cancel_run(
        &self,
        batch: &BatchId,
        component: &ComponentName,
        event: NewEvent,
    ) -> StoreResult<Cancellation> {
        let event = &event;
        self.run("cancel_run", Retry::OnlyUnsent, |client, _| {
            Box::pin(async move {
                let read = prepare(
                    client,
                    "SELECT EXISTS (SELECT 1 FROM batches WHERE id = $1),
                            (SELECT to_jsonb(r) FROM runs r WHERE batch_id = $1 AND component = $2 AND state = 'open')",
                )
                .await?;
                let write =
                    prepare(client, "SELECT * FROM autocomp_cancel_run($1, $2, $3, $4, $5, $6, $7, $8)").await?;
                for _ in 0..CONDITIONAL_ROUNDS {
                    let row = client
                        .query_one(&read, &[&batch.as_str(), &component.as_str()])
                        .await
                        .map_err(|e| self.read_failure(e))?;
                    if !row.get::<_, bool>(0) {
                        return Err(Failure::Final(StoreError::NotFound(batch.clone())));
                    }
                    let open = row.get::<_, Option<Value>>(1).map(run_from_value).transpose()?;
                    let mut new = event.clone();
                    if let Some(run) = &open {
                        write_rules::describe_cancelled_run(&mut new.details, run);
                    }
                    autocomp_model::check_object("details", &new.details).map_err(|e| Failure::Final(e.into()))?;
                    let row = client
                        .query_one(
                            &write,
                            &[
                                &batch.as_str(),
                                &component.as_str(),
                                &open.as_ref().map(|run| run.generation),
                                &new.event_type.as_str(),
                                &new.outcome.as_str(),
                                &new.agent.as_str(),
                                &*text::json(&new.details),
                                &self.cap(),
                            ],
                        )
                        .await
                        .map_err(|e| self.failure(e, &Scope { batch, run: None }))?;
                    let Some(seq) = row.get::<_, Option<i64>>(0) else { continue };
                    let at = Timestamp(row.get(1));
                    let run = open.map(|mut run| {
                        run.state = RunState::Cancelled;
                        run.ended_at = Some(at);
                        run
                    });
                    return Ok(Cancellation { event: new.recorded(batch, Seq(seq), at), run });
                }
                Err(Failure::Final(busy(batch)))
            })
        })
        .await
    }

    pub(super) async fn pg_prioritize(&self, id: &BatchId, priority: i32, event: NewEvent) -> StoreResult<Event> {
        let event = &event;
        self.run("prioritize", Retry::OnlyUnsent, |client, _| {
            Box::pin(async move {
                let read = prepare(client, "SELECT priority FROM batches WHERE id = $1").await?;
                let write =
                    prepare(client, "SELECT * FROM autocomp_prioritize($1, $2, $3, $4, $5, $6, $7, $8)").await?;
                for _ in 0..CONDITIONAL_ROUNDS {
                    let row = client.query_opt(&read, &[&id.as_str()]).await.map_err(|e| self.read_failure(e))?;
                    let previous: i32 = row.ok_or_else(|| Failure::Final(StoreError::NotFound(id.clone())))?.get(0);
                    let mut new = event.clone();
                    write_rules::describe_priority_change(&mut new.details, priority, previous);
                    autocomp_model::check_object("details", &new.details).map_err(|e| Failure::Final(e.into()))?;
                    let row = client
                        .query_one(
                            &write,
                            &[
                                &id.as_str(),
                                &priority,
                                &previous,
                                &new.event_type.as_str(),
                                &new.outcome.as_str(),
                                &new.agent.as_str(),
                                &*text::json(&new.details),
                                &self.cap(),
                            ],
                        )
                        .await
                        .map_err(|e| self.failure(e, &Scope { batch: id, run: None }))?;
                    let Some(seq) = row.get::<_, Option<i64>>(0) else { continue };
                    return Ok(new.recorded(id, Seq(seq), Timestamp(row.get(1))));
                }
                Err(Failure::Final(busy(id)))
            })
        })
        .await
    }
}
