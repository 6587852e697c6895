//! The sboi service (`sboi serve`): the `BatchIndex` port as JSON over HTTP, one
//! `POST /v1/<operation>` per port method, answered from an index directory the `Follower`
//! keeps caught up. It adds fresh-or-stale answers (a fresh query corrects the committed
//! answer with the store's changes since), the token for rebuilds, and index lag on
//! `/metrics`. Built from the store service's shared parts (`autocomp_store::http::service`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use autocomp_http::api::{Answered, ApiDoc};
use autocomp_http::error::ApiError;
use autocomp_http::service::{Access, Metrics, Rpc, router};
use autocomp_model::{InvalidInput, Seq, Timestamp};
use autocomp_store::ObjectStore;
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};

use super::follower::Follower;
use super::wire::{
    self, DocumentAnswer, Empty, IndexRequest, MAX_SELECTIONS, QueryAnswer, QueryRequest, RebuildAnswer,
};
use crate::engine::{IndexEngine, IndexError, IndexResult};

/// The OpenAPI document of this service, generated from its declarations; the copy in the
/// repository (`sboi/openapi.json`) is checked against it by the service tests.
pub fn openapi() -> String {
    autocomp_http::service::openapi::<IndexService>()
}

/// How long a fresh query reads the store's changes to correct the index's answer with, or
/// (past `EngineOptions::max_corrections`) waits for the index to reach the store's head,
/// and how long a `catch_up` request waits for a rebuild in progress, before answering with
/// what is indexed.
pub const FRESH_BOUND: Duration = Duration::from_secs(2);

/// How long `/metrics` waits for the store's head before reporting the last one seen.
const METRICS_HEAD_BOUND: Duration = Duration::from_secs(1);

pub struct IndexService {
    follower: Arc<Follower>,
    access: Access,
    metrics: Metrics,
}

impl IndexService {
    pub fn new(follower: Arc<Follower>, access: Access) -> Arc<Self> {
        Arc::new(Self { follower, access, metrics: Metrics::new("sboi") })
    }

    /// The service over the index in `engine`, following `store` from now on in background
    /// tasks (on the current tokio runtime), reconciling every `reconcile_every` if given.
    pub fn start(
        engine: IndexEngine,
        store: Arc<dyn ObjectStore>,
        access: Access,
        reconcile_every: Option<Duration>,
    ) -> IndexResult<Arc<Self>> {
        let follower = Follower::new(engine, store)?;
        tokio::spawn(Arc::clone(&follower).follow());
        if let Some(every) = reconcile_every.filter(|every| !every.is_zero()) {
            tokio::spawn(Arc::clone(&follower).reconcile_every(every));
        }
        Ok(Self::new(follower, access))
    }

    pub fn follower(&self) -> &Arc<Follower> {
        &self.follower
    }

    pub fn router(self: &Arc<Self>) -> Router {
        router(Arc::clone(self))
    }

    async fn dispatch(&self, request: IndexRequest) -> Result<Answered, ApiError> {
        use IndexRequest as R;
        // Index writes run as tasks of their own: a client that hangs up mid-rebuild must
        // not cancel it halfway (the writer would be dropped between two spawned steps).
        let follower = Arc::clone(&self.follower);
        Ok(match request {
            R::Query(request, reply) => reply.send(self.query(request).await?),
            R::Tally(request, reply) => {
                if request.selections.len() > MAX_SELECTIONS {
                    return Err(ApiError::invalid(InvalidInput::new(
                        "selections",
                        request.selections.len().to_string(),
                        format!("at most {MAX_SELECTIONS} per request"),
                    )));
                }
                let (indexed_seq, stale) = self.fresh_read().await;
                let tallies = blocking(move || {
                    follower.engine().tally_at(&request.selections, Timestamp::now(), request.quietest)
                })
                .await?;
                reply.send(wire::TallyAnswer { tallies, indexed_seq, stale })
            }
            R::Page(request, reply) => {
                let (indexed_seq, stale) = self.fresh_read().await;
                let page = blocking(move || follower.engine().page_at(&request, Timestamp::now())).await?;
                reply.send(wire::PageAnswer { page, indexed_seq, stale })
            }
            R::Document(request, reply) => {
                let indexed_seq = follower.progress().indexed_seq;
                let document = blocking(move || follower.engine().get(&request.id)).await?;
                reply.send(DocumentAnswer { document, indexed_seq })
            }
            R::CatchUp(Empty {}, reply) => {
                reply.send(detached(async move { follower.catch_up_within(FRESH_BOUND).await }).await?)
            }
            R::Rebuild(Empty {}, reply) => {
                let started = Instant::now();
                let batches = detached(async move { follower.rebuild().await }).await?;
                tracing::info!(batches, elapsed = ?started.elapsed(), "rebuilt the index on request");
                reply.send(RebuildAnswer { batches })
            }
            R::Reconcile(Empty {}, reply) => {
                let started = Instant::now();
                let reconciled = detached(async move { follower.reconcile().await }).await?;
                tracing::info!(?reconciled, elapsed = ?started.elapsed(), "reconciled the index on request");
                reply.send(reconciled)
            }
        })
    }

    async fn query(&self, request: QueryRequest) -> Result<QueryAnswer, ApiError> {
        let follower = Arc::clone(&self.follower);
        let trigger = request.trigger;
        let stale = if request.fresh {
            // The committed index corrected by the store's changes since: fresh without
            // waiting for the follower to commit them.
            let corrections = follower.engine().corrections(follower.store());
            match tokio::time::timeout(FRESH_BOUND, corrections).await {
                Ok(Ok(Some(corrections))) => {
                    self.follower.saw_head(corrections.as_of());
                    // Like the embedded adapter, this host's clock stands for the store's.
                    let answer =
                        blocking(move || follower.engine().query_corrected(&corrections, &trigger, Timestamp::now()))
                            .await?;
                    return Ok(QueryAnswer {
                        batches: answer.batches,
                        indexed_seq: answer.as_of,
                        stale: false,
                        corrected: answer.corrections,
                    });
                }
                // Too many changes to correct: wait (bounded) for the follower to index them.
                Ok(Ok(None)) => !self.freshen().await,
                Ok(Err(error)) => {
                    tracing::debug!("fresh query: cannot correct the index's answer: {error}");
                    !self.freshen().await
                }
                Err(_) => true,
            }
        } else {
            let progress = self.follower.progress();
            progress.indexed_seq < progress.store_head
        };
        // Read before the query: the searcher it opens holds at least this much.
        let indexed_seq = self.follower.progress().indexed_seq;
        let batches = blocking(move || follower.engine().query_at(&trigger, Timestamp::now())).await?;
        Ok(QueryAnswer { batches, indexed_seq, stale, corrected: 0 })
    }

    /// Catches up (bounded) before a monitor's read; the cursor the read sees at least, and
    /// whether it may miss recent changes.
    async fn fresh_read(&self) -> (Seq, bool) {
        let stale = !self.freshen().await;
        (self.follower.progress().indexed_seq, stale)
    }

    /// Brings the index up to the store's head as it is now, within `FRESH_BOUND`. False
    /// when the bound passed or the store could not say its head: the answer is then stale,
    /// but still an answer (the runner re-checks every candidate in the store anyway).
    async fn freshen(&self) -> bool {
        let deadline = Instant::now() + FRESH_BOUND;
        let head = match tokio::time::timeout(FRESH_BOUND, self.follower.store().head()).await {
            Ok(Ok(head)) => head,
            Ok(Err(error)) => {
                tracing::debug!("fresh query: cannot read the store's head: {error}");
                return false;
            }
            Err(_) => return false,
        };
        self.follower.saw_head(head);
        self.follower.wait_until_indexed(head, deadline.saturating_duration_since(Instant::now())).await
    }
}

fn index_error(error: IndexError) -> ApiError {
    match error {
        IndexError::Store(error) => error.into(),
        // The directory cannot be read or written: the index cannot answer now.
        other @ (IndexError::Index { .. } | IndexError::Unavailable(_)) => ApiError::unavailable(other.to_string()),
    }
}

/// Runs blocking index work (a search, a document read) off the async threads.
async fn blocking<T: Send + 'static>(work: impl FnOnce() -> IndexResult<T> + Send + 'static) -> Result<T, ApiError> {
    match tokio::task::spawn_blocking(work).await {
        Ok(result) => result.map_err(index_error),
        Err(error) => Err(ApiError::unavailable(format!("the index could not answer: {error}"))),
    }
}

/// Runs index writes as their own task, so they finish even if the request is dropped.
async fn detached<T: Send + 'static>(
    work: impl Future<Output = IndexResult<T>> + Send + 'static,
) -> Result<T, ApiError> {
    match tokio::spawn(work).await {
        Ok(result) => result.map_err(index_error),
        Err(error) => Err(ApiError::unavailable(format!("the index write failed: {error}"))),
    }
}

#[async_trait::async_trait]
impl Rpc for IndexService {
    const WHAT: &'static str = "index";
    const API: ApiDoc = ApiDoc {
        title: "sboi: the autocomp batch index service",
        description: "Answers trigger queries (which batches are ready for a component), and a monitor's counts \
            and pages of selections, from a tantivy index that follows the store's change feed. Every operation \
            is POST /v1/<operation> with a JSON body. Reads are open from loopback and need the bearer token from \
            anywhere else; rebuild and reconcile always need it. Errors are JSON bodies {\"error\": {...}} with a \
            4xx status for bad requests and 503 when the index or the store cannot answer now.",
        server: "http://127.0.0.1:7071",
        errors: &[
            (400, "Malformed JSON, a wrong type, an unknown field or an invalid name; the error names the field."),
            (413, "The body is over 4 MiB (64 KiB for a query without a token)."),
            (503, "The index directory or the store cannot answer now; retry."),
        ],
        health: "Up, and how far the index has come.",
        health_answer: |generator| generator.subschema_for::<wire::Health>(),
        health_unavailable: "The service is still waiting for its store after starting; operations answer 503 \
            unavailable meanwhile.",
        metrics: "Prometheus text: sboi_indexed_seq, sboi_store_head_seq, sboi_index_lag, sboi_store_reachable, \
            sboi_requests_total, sboi_request_seconds.",
    };
    type Request = IndexRequest;

    fn access(&self) -> &Access {
        &self.access
    }

    fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    async fn answer(&self, request: IndexRequest) -> Result<Answered, ApiError> {
        self.dispatch(request).await
    }

    async fn health(&self) -> Response {
        let progress = self.follower.progress();
        Json(wire::Health {
            status: "ok".into(),
            indexed_seq: progress.indexed_seq,
            store_head_seq: progress.store_head,
            index_lag: progress.lag(),
            follower_error: self.follower.last_error(),
        })
        .into_response()
    }

    async fn gauges(&self) -> Vec<(&'static str, &'static str, f64)> {
        let follower = &self.follower;
        // The head as it is now, so the lag includes a catch-up still running.
        let reachable = match tokio::time::timeout(METRICS_HEAD_BOUND, follower.store().head()).await {
            Ok(Ok(head)) => {
                follower.saw_head(head);
                true
            }
            _ => false,
        };
        let progress = follower.progress();
        vec![
            ("indexed_seq", "Every store change up to this seq is in the index.", progress.indexed_seq.0 as f64),
            ("store_head_seq", "The newest store seq this service has seen.", progress.store_head.0 as f64),
            ("index_lag", "Store head seq minus indexed seq.", progress.lag() as f64),
            (
                "store_reachable",
                "1 if this scrape could read the store's head, else 0.",
                f64::from(u8::from(reachable)),
            ),
        ]
    }
}
