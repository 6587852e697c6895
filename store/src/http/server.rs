//! The store service (`autocomp-store serve`): the `ObjectStore` port as JSON over HTTP,
//! one `POST /v1/<operation>` per port method, in front of any adapter.
//! It adds the bearer token for writes, long polls on the change feed, and metrics.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use tokio::sync::Notify;

use axum::http::StatusCode;
use serde::Serialize;

use super::stream;
use super::wire::{self, MAX_ANSWER_BYTES, MAX_ITEMS, MAX_WAIT_MS, StoreRequest};
use crate::port::{CreateOutcome, ObjectStore, StoreError, StoreResult};
use crate::write_rules::MAX_BATCH_PAGE;
use autocomp_http::api::{Answered, ApiDoc};
use autocomp_http::error::ApiError;
use autocomp_http::service::{Access, Metrics, Rpc, router};
use autocomp_model::{BatchId, InvalidInput};

/// The OpenAPI document of this service, generated from its declarations; the copy in the
/// repository (`store/openapi.json`) is checked against it by the service tests.
pub fn openapi() -> String {
    autocomp_http::service::openapi::<StoreService>()
}

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
    async fn dispatch(&self, request: StoreRequest) -> Result<Answered, ApiError> {
        use StoreRequest as R;
        let store = self.store.as_ref();
        let write = request.writes();
        let answered = match request {
            R::CreateBatch(batch, reply) => reply.send(match store.create_batch(batch).await? {
                CreateOutcome::Created(batch) => wire::Created { created: true, batch },
                CreateOutcome::AlreadyExists(batch) => wire::Created { created: false, batch },
            }),
            // Whole batches are written as they are read (`stream`), never held whole.
            R::GetBatch(request, reply) => {
                let found = stream::sized(store, std::slice::from_ref(&request.id), "get_batch", "ids").await?;
                let batch = found.into_iter().next().ok_or(StoreError::NotFound(request.id))?;
                stream::batch(Arc::clone(&self.store), batch, reply)
            }
            R::GetBatches(request, reply) => {
                at_most("ids", request.ids.len())?;
                one_page("ids", request.ids.len())?;
                let ids = wire::distinct(request.ids);
                let found = stream::sized(store, &ids, "get_batches", "ids").await?;
                stream::batches(Arc::clone(&self.store), found, reply)
            }
            R::ListBatches(request, reply) => {
                at_most("limit", request.limit)?;
                one_page("limit", request.limit)?;
                // The ids from the summaries (no logs read), then as `get_batches`.
                let listed = store.list_summaries(request.after.as_ref(), request.limit).await?;
                let ids: Vec<BatchId> = listed.into_iter().map(|summary| summary.id).collect();
                let found = stream::sized(store, &ids, "list_batches", "limit").await?;
                stream::batches(Arc::clone(&self.store), found, reply)
            }
            R::GetSummaries(request, reply) => {
                at_most("ids", request.ids.len())?;
                one_page("ids", request.ids.len())?;
                let ids = wire::distinct(request.ids);
                reply.send(
                    by_ids(store, &ids, "get_summaries", MAX_BATCH_PAGE, |store, ids| store.get_summaries(ids)).await?,
                )
            }
            R::ListSummaries(request, reply) => {
                at_most("limit", request.limit)?;
                one_page("limit", request.limit)?;
                let (after, limit) = (request.after, request.limit);
                reply.send(
                    listed(
                        store,
                        after,
                        limit,
                        "list_summaries",
                        MAX_BATCH_PAGE,
                        |store, after, n| store.list_summaries(after, n),
                        |s| &s.id,
                    )
                    .await?,
                )
            }
            R::GetListings(request, reply) => {
                at_most("ids", request.ids.len())?;
                one_page("ids", request.ids.len())?;
                let ids = wire::distinct(request.ids);
                reply.send(
                    by_ids(store, &ids, "get_listings", MAX_BATCH_PAGE, |store, ids| store.get_listings(ids)).await?,
                )
            }
            R::BatchHead(request, reply) => reply.send(store.batch_head(&request.id).await?),
            R::LogPage(request, reply) => {
                let cursor = request.cursor().map_err(ApiError::invalid)?;
                reply.send(match request.details_up_to {
                    None => store.log_page(&request.id, cursor, request.limit).await?,
                    Some(up_to) => store.log_page_within(&request.id, cursor, request.limit, up_to).await?,
                })
            }
            R::RunState(request, reply) => {
                reply.send(wire::RunStateAnswer { run: store.run_state(&request.batch, &request.component).await? })
            }
            R::SetPriority(request, reply) => {
                reply.send(wire::SeqAnswer { seq: store.set_priority(&request.id, request.priority).await? })
            }
            R::RecordContentChange(request, reply) => {
                let seq = store.record_content_change(&request.id, request.metadata_patch).await?;
                reply.send(wire::SeqAnswer { seq })
            }
            R::AppendEvent(request, reply) => reply.send(store.append_event(&request.batch, request.event).await?),
            R::Claim(request, reply) => {
                reply.send(store.claim(&request.batch, &request.component, &request.holder).await?)
            }
            R::ClaimMany(request, reply) => {
                at_most("batches", request.batches.len())?;
                let answers = store.claim_many(&request.batches, &request.component, &request.holder).await?;
                reply
                    .send(wire::ClaimManyAnswer { answers: answers.into_iter().map(wire::ClaimAnswer::from).collect() })
            }
            R::Release(request, reply) => {
                store.release(&request.batch, &request.component, request.generation).await?;
                reply.send(wire::Empty {})
            }
            R::SaveCheckpoint(request, reply) => {
                store.save_checkpoint(&request.batch, &request.component, request.generation, request.data).await?;
                reply.send(wire::Empty {})
            }
            R::LoadCheckpoint(request, reply) => {
                reply.send(wire::Checkpoint { data: store.load_checkpoint(&request.batch, &request.component).await? })
            }
            R::OpenRuns(request, reply) => reply.send(store.open_runs(request.component.as_ref()).await?),
            R::FailedAttempts(request, reply) => {
                let count = store.failed_attempts(&request.batch, &request.component, request.since).await?;
                reply.send(wire::Count { count: count.into() })
            }
            R::Changes(request, reply) => {
                at_most("limit", request.limit)?;
                reply.send(store.changes(request.since, request.limit).await?)
            }
            R::Head(wire::Empty {}, reply) => reply.send(wire::Head { head: store.head().await? }),
            R::About(wire::Empty {}, reply) => reply.send(store.about().await?),
            R::WaitForChange(request, reply) => {
                if request.timeout_ms > MAX_WAIT_MS {
                    let reason = format!("at most {MAX_WAIT_MS} ms");
                    let value = request.timeout_ms.to_string();
                    return Err(ApiError::invalid(InvalidInput::new("timeout_ms", value, reason)));
                }
                let head = self.wait_for_change(request.since, Duration::from_millis(request.timeout_ms)).await?;
                reply.send(wire::Head { head })
            }
            R::CancelRun(request, reply) => {
                reply.send(store.cancel_run(&request.batch, &request.component, request.event).await?)
            }
            R::Prioritize(request, reply) => {
                reply.send(store.prioritize(&request.id, request.priority, request.event).await?)
            }
            R::CountBatches(wire::Empty {}, reply) => reply.send(wire::Count { count: store.count_batches().await? }),
            R::RecordPass(pass, reply) => {
                store.record_pass(pass).await?;
                // The registry takes no seq: nothing a long poll waits for has moved.
                return Ok(reply.send(wire::Empty {}));
            }
            R::Components(wire::Empty {}, reply) => reply.send(store.components().await?),
            R::RetireComponent(request, reply) => {
                let retired = store.retire_component(&request.name, &request.by, &request.reason).await?;
                return Ok(reply.send(retired));
            }
            R::Steering(wire::Empty {}, reply) => reply.send(store.steering().await?),
            R::Steer(request, reply) => reply.send(store.steer(request).await?),
            R::SteeringLog(request, reply) => reply.send(store.steering_log(request.limit).await?),
            R::EnqueueNotices(request, reply) => {
                let enqueued = store.enqueue_notices(request.notices, request.cursor).await?;
                return Ok(reply.send(enqueued));
            }
            R::TakeNotices(request, reply) => {
                let lease = Duration::from_millis(request.lease_ms);
                let taken = store.take_notices(&request.holder, request.limit, lease).await?;
                return Ok(reply.send(taken));
            }
            R::SettleNotice(request, reply) => {
                store.settle_notice(&request.key, &request.holder, request.outcome).await?;
                return Ok(reply.send(wire::Empty {}));
            }
            R::RecentNotices(request, reply) => reply.send(store.recent_notices(request.limit).await?),
            R::WorkSeries(request, reply) => {
                let points = store.work_series(request.step, request.since, request.component.as_ref()).await?;
                return Ok(reply.send(points));
            }
            R::RecordBacklog(request, reply) => {
                store.record_backlog(request.samples).await?;
                // Like the registry's passes, samples take no seq: no long poll wakes.
                return Ok(reply.send(wire::Empty {}));
            }
        };
        if write {
            self.changed.notify_waiters();
        }
        Ok(answered)
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

/// One read of the backend, as the port's methods return it.
type Read<'a, T> = std::pin::Pin<Box<dyn Future<Output = StoreResult<Vec<T>>> + Send + 'a>>;

/// A read by ids, `ids` read a group at a time and counted as they come (`Budget`).
async fn by_ids<T: Serialize>(
    store: &dyn ObjectStore,
    ids: &[BatchId],
    operation: &str,
    most: usize,
    read: for<'a> fn(&'a dyn ObjectStore, &'a [BatchId]) -> Read<'a, T>,
) -> Result<Vec<T>, ApiError> {
    let mut budget = Budget::default();
    let mut answer = Vec::new();
    let mut rest = ids;
    while !rest.is_empty() {
        let (group, later) = rest.split_at(budget.group(most).min(rest.len()));
        for item in read(store, group).await? {
            budget.add(&item, operation, "ids")?;
            answer.push(item);
        }
        rest = later;
    }
    Ok(answer)
}

/// A listing in id order, read a page at a time and counted as it comes (`Budget`).
async fn listed<T: Serialize>(
    store: &dyn ObjectStore,
    mut after: Option<BatchId>,
    limit: usize,
    operation: &str,
    most: usize,
    read: for<'a> fn(&'a dyn ObjectStore, Option<&'a BatchId>, usize) -> Read<'a, T>,
    id: fn(&T) -> &BatchId,
) -> Result<Vec<T>, ApiError> {
    let mut budget = Budget::default();
    let mut answer: Vec<T> = Vec::new();
    while answer.len() < limit {
        let asked = budget.group(most).min(limit - answer.len());
        let page = read(store, after.as_ref(), asked).await?;
        let short = page.len() < asked;
        for item in page {
            budget.add(&item, operation, "limit")?;
            answer.push(item);
        }
        match answer.last() {
            Some(last) if !short => after = Some(id(last).clone()),
            _ => break,
        }
    }
    Ok(answer)
}

/// An answer's JSON bytes, counted item by item as the answer is read, so a read that
/// would pass `MAX_ANSWER_BYTES` stops there (413) instead of holding all it names. An
/// answer of one item is never refused: one batch is bounded by its store's
/// `max_batch_bytes`, and a caller can ask for nothing smaller.
#[derive(Default)]
struct Budget {
    bytes: u64,
    items: u64,
    /// The size of the last group read.
    last_group: usize,
}

impl Budget {
    fn add<T: Serialize>(&mut self, item: &T, operation: &str, field: &str) -> Result<(), ApiError> {
        let mut counted = Counted(0);
        // Writing to a counter cannot fail, nor can serializing what the store has read.
        serde_json::to_writer(&mut counted, item)
            .map_err(|e| ApiError::from(StoreError::Unavailable(e.to_string())))?;
        // The brackets and commas of the JSON array.
        self.bytes += counted.0 + 1;
        self.items += 1;
        if self.items > 1 && self.bytes + 1 > MAX_ANSWER_BYTES {
            let message = format!(
                "the answer to {operation} would pass {MAX_ANSWER_BYTES} bytes (64 MiB) at its {} item: ask for \
                 fewer {field} per request (one batch is always answered, whatever its size)",
                self.items
            );
            return Err(ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "too_large", message));
        }
        Ok(())
    }

    /// How many items to read next: about an eighth of the cap at the average size read so
    /// far, at most `most`; until something is found, one, then twice the last (so ids
    /// that name nothing are not read one by one).
    fn group(&mut self, most: usize) -> usize {
        let next = match self.bytes.checked_div(self.items) {
            None => self.last_group.saturating_mul(2),
            Some(average) => usize::try_from((MAX_ANSWER_BYTES / 8) / average.max(1)).unwrap_or(most),
        };
        self.last_group = next.clamp(1, most);
        self.last_group
    }
}

/// A `Write` that keeps only the count of the bytes written.
struct Counted(u64);

impl std::io::Write for Counted {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0 += bytes.len() as u64;
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// What the backends of this crate read at most at once (ids asked, repeats included, or a
/// listing's limit), refused here as they refuse it: the service answers as its store does.
fn one_page(field: &str, count: usize) -> Result<(), ApiError> {
    if count > MAX_BATCH_PAGE {
        return Err(crate::write_rules::page_too_large(field, count, MAX_BATCH_PAGE).into());
    }
    Ok(())
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
    const API: ApiDoc = ApiDoc {
        title: "autocomp store service",
        description: "The ObjectStore port of autocomp as JSON over HTTP: one POST /v1/<operation> per port method. \
            Writes need `Authorization: Bearer <token>`; reads are open from loopback. \
            Errors are always JSON: {\"error\": {\"kind\", \"message\", ...}}.",
        server: "http://127.0.0.1:7070",
        errors: &[
            (400, "bad input: unparseable JSON, unknown field, wrong type, invalid name; nothing changed"),
            (404, "no such batch (kind not_found)"),
            (409, "conflict, or fenced: the run is not the current open one; nothing changed"),
            (
                413,
                "body over 4 MiB (64 KiB for a read without a token), or an answer of several batches over 64 MiB (kind too_large): ask for fewer",
            ),
            (503, "the database is unavailable; nothing committed"),
        ],
        health: "Liveness and the store head.",
        health_answer: |generator| generator.subschema_for::<wire::Health>(),
        health_unavailable: "the database is unavailable (`Error`), or the service is still waiting for it after starting (`Starting`)",
        metrics: "Prometheus text: autocomp_store_head_seq, autocomp_store_long_polls_waiting, \
            autocomp_store_requests_total{operation,status}, autocomp_store_request_seconds histogram.",
    };
    type Request = StoreRequest;

    fn access(&self) -> &Access {
        &self.access
    }

    fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    async fn answer(&self, request: StoreRequest) -> Result<Answered, ApiError> {
        self.dispatch(request).await
    }

    async fn health(&self) -> Response {
        match self.store.head().await {
            Ok(head) => Json(wire::Health { status: "ok".into(), head }).into_response(),
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
