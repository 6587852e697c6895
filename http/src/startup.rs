//! A service that starts before what it depends on, as a boot starts everything at once: it
//! listens at once, answers `/health` with what it waits for (503) and every other request
//! with `unavailable` (clients retry, or fail over to another instance), retries its
//! upstream with backoff and a log line, and hands over to its real routes once it answers.

use std::future::Future;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use tower::ServiceExt as _;

use super::error::ApiError;

/// The longest pause between two tries of the upstream.
const MAX_PAUSE: Duration = Duration::from_secs(10);

pub struct Startup {
    routes: OnceLock<Router>,
    waiting: Mutex<Waiting>,
}

struct Waiting {
    upstream: String,
    since: Instant,
    attempts: u32,
    last_error: String,
}

impl Startup {
    /// `upstream` names what the service waits for, for `/health` and the log
    /// ("the store http://db-host:7070").
    pub fn new(upstream: impl Into<String>) -> Arc<Self> {
        let waiting =
            Waiting { upstream: upstream.into(), since: Instant::now(), attempts: 0, last_error: String::new() };
        Arc::new(Self { routes: OnceLock::new(), waiting: Mutex::new(waiting) })
    }

    /// The routes to serve from the start: the waiting answers, then the service's own.
    pub fn router(self: &Arc<Self>) -> Router {
        Router::new().fallback(dispatch).with_state(Arc::clone(self))
    }

    /// The upstream answered: from now on every request goes to `routes`.
    pub fn ready(&self, routes: Router) {
        let waited = self.waiting.lock().expect("startup state").since.elapsed();
        if self.routes.set(routes).is_ok() {
            tracing::info!(waited_ms = waited.as_millis() as u64, "upstream reached; serving");
        }
    }

    /// Runs `connect` until it succeeds, waiting out its errors with backoff and a log line
    /// each, except those `permanent` says no wait can fix (returned at once).
    pub async fn wait_for<T, E, F, Fut>(&self, mut connect: F, permanent: impl Fn(&E) -> bool) -> Result<T, E>
    where
        E: std::fmt::Display,
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let mut pause = Duration::from_millis(250);
        loop {
            match connect().await {
                Ok(connected) => return Ok(connected),
                Err(error) if permanent(&error) => return Err(error),
                Err(error) => {
                    let mut waiting = self.waiting.lock().expect("startup state");
                    waiting.attempts += 1;
                    waiting.last_error = error.to_string();
                    tracing::warn!(
                        attempt = waiting.attempts,
                        retry_in_ms = pause.as_millis() as u64,
                        "waiting for {}: {error}",
                        waiting.upstream
                    );
                }
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(MAX_PAUSE);
        }
    }

    fn health(&self) -> Response {
        let waiting = self.waiting.lock().expect("startup state");
        let body = crate::api::Starting {
            status: "starting",
            waiting_for: waiting.upstream.clone(),
            waiting_seconds: waiting.since.elapsed().as_secs(),
            attempts: u64::from(waiting.attempts),
            last_error: waiting.last_error.clone(),
        };
        (StatusCode::SERVICE_UNAVAILABLE, axum::Json(body)).into_response()
    }
}

/// The exit code of a service stopped (SIGTERM) or failed before its upstream answered:
/// what the task serving its waiting routes returned.
pub fn stopped_before_ready(served: Result<std::io::Result<()>, tokio::task::JoinError>) -> std::process::ExitCode {
    match served {
        Ok(Ok(())) => std::process::ExitCode::SUCCESS,
        Ok(Err(error)) => {
            tracing::error!("serving: {error}");
            std::process::ExitCode::from(5)
        }
        Err(panic) => {
            tracing::error!("serving: {panic}");
            std::process::ExitCode::from(5)
        }
    }
}

async fn dispatch(State(startup): State<Arc<Startup>>, request: Request) -> Response {
    if let Some(routes) = startup.routes.get() {
        return routes.clone().oneshot(request).await.into_response();
    }
    if request.uri().path() == "/health" {
        return startup.health();
    }
    let upstream = startup.waiting.lock().expect("startup state").upstream.clone();
    ApiError::unavailable(format!("starting: waiting for {upstream}")).into_response()
}
