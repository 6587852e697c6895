//! The store service (`autocomp-store serve`): the `ObjectStore` port as JSON over HTTP,
//! one `POST /v1/<operation>` per port method, in front of any adapter.
//! It adds the bearer token for writes, long polls on the change feed, and metrics.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use serde::Serialize;
use tokio::sync::Notify;

use super::wire::{self, MAX_ITEMS, MAX_WAIT_MS, OPERATIONS};
use crate::port::{CreateOutcome, ObjectStore};
use autocomp_http::service::{Access, ApiError, Metrics, Rpc, parse_body, router};
use autocomp_model::{InvalidInput, NewBatch, PassRecord};

/// The OpenAPI document of this service, kept in the repository beside the code.
pub const OPENAPI: &str = include_str!("../../openapi.json");

pub struct StoreService {
    store: Arc<dyn ObjectStore>,
    access: Access,
    metrics: Metrics,
    /// Woken after every write this service makes, so long polls answer at once.
    changed: Notify,
    /// Long polls parked right now (a follower each, normally).
    waiting: AtomicI64,
}

impl StoreService {
    pub fn new(store: Arc<dyn ObjectStore>, access: Access) -> Arc<Self> {
        Arc::new(Self {
            store,
            access,
            metrics: Metrics::new("autocomp_store"),
            changed: Notify::new(),
            waiting: AtomicI64::new(0),
        })
    }

    pub fn router(self: &Arc<Self>) -> Router {
        router(Arc::clone(self))
    }

    /// Runs one port operation; wakes the long polls after a write that may move the head.
    async fn dispatch(
        &self,
        name: &'static str,
        write: bool,
        body: Result<Bytes, BytesRejection>,
    ) -> Result<Response, ApiError> {
        let store = self.store.as_ref();
        let response = match name {
            "create_batch" => {
                let batch: NewBatch = parse_body(body)?;
                match store.create_batch(batch).await? {
                    CreateOutcome::Created(batch) => ok(wire::Created { created: true, batch }),
                    CreateOutcome::AlreadyExists(batch) => ok(wire::Created { created: false, batch }),
                }
            }
            "get_batch" => {
                let request: wire::ById = parse_body(body)?;
                ok(store.get_batch(&request.id).await?)
            }
            "get_batches" => {
                let request: wire::ByIds = parse_body(body)?;
                at_most("ids", request.ids.len())?;
                ok(store.get_batches(&request.ids).await?)
            }
            "list_batches" => {
                let request: wire::ListBatches = parse_body(body)?;
                at_most("limit", request.limit)?;
                ok(store.list_batches(request.after.as_ref(), request.limit).await?)
            }
            "get_summaries" => {
                let request: wire::ByIds = parse_body(body)?;
                at_most("ids", request.ids.len())?;
                ok(store.get_summaries(&request.ids).await?)
            }
            "list_summaries" => {
                let request: wire::ListBatches = parse_body(body)?;
                at_most("limit", request.limit)?;
                ok(store.list_summaries(request.after.as_ref(), request.limit).await?)
            }
            "set_priority" => {
                let request: wire::SetPriority = parse_body(body)?;
                ok(wire::SeqAnswer { seq: store.set_priority(&request.id, request.priority).await? })
            }
            "record_content_change" => {
                let request: wire::ContentChange = parse_body(body)?;
                ok(wire::SeqAnswer { seq: store.record_content_change(&request.id, request.metadata_patch).await? })
            }
            "append_event" => {
                let request: wire::AppendEvent = parse_body(body)?;
                ok(store.append_event(&request.batch, request.event).await?)
            }
            "claim" => {
                let request: wire::ClaimRequest = parse_body(body)?;
                ok(store.claim(&request.batch, &request.component, &request.holder).await?)
            }
            "claim_many" => {
                let request: wire::ClaimManyRequest = parse_body(body)?;
                at_most("batches", request.batches.len())?;
                let answers = store.claim_many(&request.batches, &request.component, &request.holder).await?;
                ok(wire::ClaimManyAnswer { answers: answers.into_iter().map(wire::ClaimAnswer::from).collect() })
            }
            "release" => {
                let request: wire::RunId = parse_body(body)?;
                store.release(&request.batch, &request.component, request.generation).await?;
                ok(wire::Empty {})
            }
            "save_checkpoint" => {
                let request: wire::SaveCheckpoint = parse_body(body)?;
                store.save_checkpoint(&request.batch, &request.component, request.generation, request.data).await?;
                ok(wire::Empty {})
            }
            "load_checkpoint" => {
                let request: wire::OfComponent = parse_body(body)?;
                ok(wire::Checkpoint { data: store.load_checkpoint(&request.batch, &request.component).await? })
            }
            "open_runs" => {
                let request: wire::OpenRuns = parse_body(body)?;
                ok(store.open_runs(request.component.as_ref()).await?)
            }
            "failed_attempts" => {
                let request: wire::FailedAttempts = parse_body(body)?;
                let count = store.failed_attempts(&request.batch, &request.component, request.since).await?;
                ok(wire::Count { count: count.into() })
            }
            "changes" => {
                let request: wire::Changes = parse_body(body)?;
                at_most("limit", request.limit)?;
                ok(store.changes(request.since, request.limit).await?)
            }
            "head" => {
                let _: wire::Empty = parse_body(body)?;
                ok(wire::Head { head: store.head().await? })
            }
            "wait_for_change" => {
                let request: wire::WaitForChange = parse_body(body)?;
                if request.timeout_ms > MAX_WAIT_MS {
                    let reason = format!("at most {MAX_WAIT_MS} ms");
                    return Err(ApiError::invalid(InvalidInput::new(
                        "timeout_ms",
                        request.timeout_ms.to_string(),
                        reason,
                    )));
                }
                let head = self.wait_for_change(request.since, Duration::from_millis(request.timeout_ms)).await?;
                ok(wire::Head { head })
            }
            "cancel_run" => {
                let request: wire::CancelRun = parse_body(body)?;
                ok(store.cancel_run(&request.batch, &request.component, request.event).await?)
            }
            "prioritize" => {
                let request: wire::Prioritize = parse_body(body)?;
                ok(store.prioritize(&request.id, request.priority, request.event).await?)
            }
            "count_batches" => {
                let _: wire::Empty = parse_body(body)?;
                ok(wire::Count { count: store.count_batches().await? })
            }
            "record_pass" => {
                let pass: PassRecord = parse_body(body)?;
                store.record_pass(pass).await?;
                // The registry takes no seq: nothing a long poll waits for has moved.
                return Ok(ok(wire::Empty {}));
            }
            "components" => {
                let _: wire::Empty = parse_body(body)?;
                ok(store.components().await?)
            }
            "retire_component" => {
                let request: wire::RetireComponent = parse_body(body)?;
                let retired = store.retire_component(&request.name, &request.by, &request.reason).await?;
                return Ok(ok(retired));
            }
            other => unreachable!("operation {other} is listed in OPERATIONS but not dispatched"),
        };
        if write {
            self.changed.notify_waiters();
        }
        Ok(response)
    }

    /// Answers as soon as the head passes `since`: at once after a write through this
    /// service, and after one made around it (another process on the file, a component
    /// writing to PostgreSQL directly) as soon as the store's own `wait_for_change` sees it.
    async fn wait_for_change(
        &self,
        since: autocomp_model::Seq,
        timeout: Duration,
    ) -> Result<autocomp_model::Seq, ApiError> {
        let deadline = tokio::time::Instant::now() + timeout;
        let _parked = Parked::on(&self.waiting);
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let slice = deadline.saturating_duration_since(tokio::time::Instant::now()).min(Duration::from_secs(1));
            tokio::select! {
                head = self.store.wait_for_change(since, slice) => {
                    let head = head?;
                    if head > since || tokio::time::Instant::now() >= deadline {
                        return Ok(head);
                    }
                }
                _ = notified => {}
            }
        }
    }
}

/// Counts a long poll as parked until it returns or its client goes (the future dropped).
struct Parked<'a>(&'a AtomicI64);

impl<'a> Parked<'a> {
    fn on(count: &'a AtomicI64) -> Self {
        count.fetch_add(1, Ordering::Relaxed);
        Self(count)
    }
}

impl Drop for Parked<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

fn ok<T: Serialize>(answer: T) -> Response {
    Json(answer).into_response()
}

fn at_most(field: &str, count: usize) -> Result<(), ApiError> {
    if count > MAX_ITEMS {
        let reason = format!("at most {MAX_ITEMS} per request");
        return Err(ApiError::invalid(InvalidInput::new(field, count.to_string(), reason)));
    }
    Ok(())
}

#[async_trait::async_trait]
impl Rpc for StoreService {
    const WHAT: &'static str = "store";
    const OPERATIONS: &'static [(&'static str, bool)] = OPERATIONS;
    const OPENAPI: &'static str = OPENAPI;

    fn access(&self) -> &Access {
        &self.access
    }

    fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    async fn answer(
        &self,
        operation: &'static str,
        write: bool,
        body: Result<Bytes, BytesRejection>,
    ) -> Result<Response, ApiError> {
        self.dispatch(operation, write, body).await
    }

    async fn health(&self) -> Response {
        match self.store.head().await {
            Ok(head) => ok(serde_json::json!({ "status": "ok", "head": head })),
            Err(error) => ApiError::from(error).into_response(),
        }
    }

    async fn gauges(&self) -> Vec<(&'static str, &'static str, f64)> {
        let head = self.store.head().await.map(|seq| seq.0 as f64).unwrap_or(f64::NAN);
        let waiting = self.waiting.load(Ordering::Relaxed) as f64;
        vec![
            ("head_seq", "The newest sequence number in the store.", head),
            ("long_polls_waiting", "wait_for_change requests parked until the store moves.", waiting),
        ]
    }
}
