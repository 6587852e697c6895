//! The store service (`autocomp-store serve`): the `ObjectStore` port as JSON over HTTP,
//! one `POST /v1/<operation>` per port method, in front of any adapter.
//! It adds the bearer token for writes, long polls on the change feed, and metrics.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use tokio::sync::Notify;

use super::operations::{Serving, StoreRequest};
use super::wire;
use crate::port::ObjectStore;
use autocomp_http::api::{Answered, ApiDoc};
use autocomp_http::error::ApiError;
use autocomp_http::service::{Access, Metrics, Rpc, router};
use autocomp_model::Seq;

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

    /// Runs one port operation as its declaration says (`StoreRequest::serve`); wakes the
    /// long polls after a write declared `write(wakes)`, which may move the head.
    async fn dispatch(&self, request: StoreRequest) -> Result<Answered, ApiError> {
        let wakes = request.wakes();
        let answered = request.serve(self).await?;
        if wakes {
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

    /// `wait_for_change_concerning`, parked like a long poll.
    async fn wait_for_change_concerning(&self, request: wire::WaitForChangeConcerning) -> Result<Seq, ApiError> {
        let timeout = super::bounded::wait(request.timeout_ms)?;
        let _parked = Parked::on(&self.waiting);
        Ok(self.store.wait_for_change_concerning(request.since, &request.interest, timeout).await?)
    }
}

impl Serving for StoreService {
    fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    fn long_poll(&self, since: Seq, timeout: Duration) -> impl Future<Output = Result<Seq, ApiError>> + Send {
        self.wait_for_change(since, timeout)
    }

    /// The store's own announcements include this service's writes (PostgreSQL notifies
    /// them, an embedded store's handle announces them in `<store>-wake`).
    fn long_poll_concerning(
        &self,
        request: wire::WaitForChangeConcerning,
    ) -> impl Future<Output = Result<Seq, ApiError>> + Send {
        self.wait_for_change_concerning(request)
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
