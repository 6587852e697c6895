//! What every autocomp HTTP service shares: the JSON error body, bearer-token access rules,
//! strict JSON bodies that never panic or 500 on bad input, and Prometheus-text metrics.
//! The store service and the sboi service are both built from these parts.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{ConnectInfo, Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::api::{Answered, ApiDoc, Requests};
use autocomp_model::InvalidInput;

/// Largest request body a service accepts: a 1 MiB details document plus its envelope.
pub const MAX_BODY_BYTES: usize = 4 << 20;

/// The body of every error response: `{"error": {...}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[schemars(rename = "Error")]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ErrorDetail {
    /// `invalid`, `not_found`, `conflict`, `fenced`, `unavailable`, `unauthorized`,
    /// `too_large`, `unknown_operation`.
    #[schemars(extend("enum" = [
        "invalid", "not_found", "conflict", "fenced", "unavailable", "unauthorized", "too_large", "unknown_operation"
    ]))]
    pub kind: String,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// For `fenced`: which run was refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub component: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
}

impl ErrorDetail {
    fn new(kind: &str, message: impl Into<String>) -> Self {
        Self {
            kind: kind.into(),
            message: message.into(),
            field: None,
            value: None,
            reason: None,
            batch: None,
            component: None,
            generation: None,
        }
    }
}

/// An error a handler returns: a status and a JSON body.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    /// Boxed: handlers return `Result<_, ApiError>` everywhere and the Ok side is small.
    pub detail: Box<ErrorDetail>,
}

impl ApiError {
    pub fn new(status: StatusCode, kind: &str, message: impl Into<String>) -> Self {
        Self { status, detail: Box::new(ErrorDetail::new(kind, message)) }
    }

    pub fn invalid(input: InvalidInput) -> Self {
        let mut error = Self::new(StatusCode::BAD_REQUEST, "invalid", input.to_string());
        error.detail.field = Some(input.field);
        error.detail.value = Some(input.value);
        error.detail.reason = Some(input.reason);
        error
    }

    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "unauthorized", message)
    }

    pub fn unknown_operation(operation: &str) -> Self {
        Self::new(StatusCode::NOT_FOUND, "unknown_operation", format!("no operation named {operation:?}"))
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, axum::Json(ErrorBody { error: *self.detail })).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(header::WWW_AUTHENTICATE, header::HeaderValue::from_static("Bearer"));
        }
        response
    }
}

/// Parses a request body strictly: unknown fields, wrong types and invalid names become a
/// 400 naming what was wrong; an over-long body a 413. Never a panic, never a 500.
pub fn parse_body<T: DeserializeOwned>(body: Result<Bytes, BytesRejection>) -> Result<T, ApiError> {
    let bytes = body.map_err(|rejection| {
        let status = rejection.status();
        let kind = if status == StatusCode::PAYLOAD_TOO_LARGE { "too_large" } else { "invalid" };
        ApiError::new(status, kind, format!("request body: {}", rejection.body_text()))
    })?;
    let bytes: &[u8] = if bytes.is_empty() { b"{}" } else { &bytes };
    let preview = || String::from_utf8_lossy(&bytes[..bytes.len().min(120)]).into_owned();
    // Every body is an object; serde would also read a struct from an array of its fields
    // in order (`["B1"]` as `{"id": "B1"}`), hiding a client's mistake.
    if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(ApiError::invalid(InvalidInput::new("request body", preview(), "must be a JSON object")));
    }
    let mut reader = serde_json::Deserializer::from_slice(bytes);
    let parsed: T = serde_path_to_error::deserialize(&mut reader).map_err(|e| {
        // Name the field that was wrong (`limit`, `selections[0].priority.min`), not just
        // the body; the root itself (a missing or unknown field) is the body.
        let field = match e.path().to_string() {
            path if path == "." => "request body".to_owned(),
            path => path,
        };
        ApiError::invalid(InvalidInput::new(field, preview(), e.into_inner().to_string()))
    })?;
    reader.end().map_err(|e| ApiError::invalid(InvalidInput::new("request body", preview(), e.to_string())))?;
    Ok(parsed)
}

/// Who may call what: writes always need the bearer token; reads need it only from
/// addresses other than loopback, unless `reads_need_token` (a host other users share).
#[derive(Clone)]
pub struct Access {
    token: Arc<str>,
    loopback_reads_open: bool,
}

impl Access {
    pub fn new(token: impl Into<Arc<str>>) -> Self {
        Self { token: token.into(), loopback_reads_open: true }
    }

    /// Reads need the token from loopback too.
    pub fn reads_need_token(self) -> Self {
        Self { loopback_reads_open: false, ..self }
    }

    pub fn check(&self, headers: &HeaderMap, peer: SocketAddr, write: bool) -> Result<(), ApiError> {
        if !write && self.loopback_reads_open && peer.ip().is_loopback() {
            return Ok(());
        }
        let presented = headers
            .get(header::AUTHORIZATION)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.strip_prefix("Bearer "))
            .map(str::trim);
        match presented {
            None => Err(ApiError::unauthorized(if write {
                "writes need a bearer token (Authorization: Bearer <token>)"
            } else {
                "reads need a bearer token here (Authorization: Bearer <token>)"
            })),
            Some(token) if constant_time_eq(token.as_bytes(), self.token.as_bytes()) => Ok(()),
            Some(_) => Err(ApiError::unauthorized("the bearer token is wrong")),
        }
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Reads a service's token: the file named by `--token-file`, else `$AUTOCOMP_TOKEN`.
/// Leading and trailing whitespace is not part of the token.
pub fn load_token(token_file: Option<&std::path::Path>) -> Result<String, String> {
    let token = match token_file {
        Some(path) => {
            std::fs::read_to_string(path).map_err(|e| format!("cannot read --token-file {}: {e}", path.display()))?
        }
        None => std::env::var("AUTOCOMP_TOKEN").map_err(|_| {
            "no write token: pass --token-file FILE or set AUTOCOMP_TOKEN (writes always need one)".to_string()
        })?,
    };
    let token = token.trim().to_string();
    if token.is_empty() || !token.chars().all(|c| c.is_ascii_graphic()) {
        return Err("the token must be non-empty printable ASCII without spaces".into());
    }
    Ok(token)
}

/// Request counts and latencies per operation, rendered in the Prometheus text format.
pub struct Metrics {
    prefix: &'static str,
    inner: Mutex<MetricsInner>,
}

#[derive(Default)]
struct MetricsInner {
    requests: BTreeMap<(String, u16), u64>,
    latency: BTreeMap<String, Histogram>,
}

const LATENCY_BUCKETS: [f64; 10] = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 2.5];

#[derive(Default)]
struct Histogram {
    buckets: [u64; LATENCY_BUCKETS.len()],
    count: u64,
    sum: f64,
}

impl Metrics {
    pub fn new(prefix: &'static str) -> Self {
        Self { prefix, inner: Mutex::default() }
    }

    pub fn observe(&self, operation: &str, status: StatusCode, elapsed: Duration) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        *inner.requests.entry((operation.to_string(), status.as_u16())).or_default() += 1;
        let histogram = inner.latency.entry(operation.to_string()).or_default();
        let seconds = elapsed.as_secs_f64();
        for (bucket, bound) in histogram.buckets.iter_mut().zip(LATENCY_BUCKETS) {
            if seconds <= bound {
                *bucket += 1;
            }
        }
        histogram.count += 1;
        histogram.sum += seconds;
    }

    /// The exposition text, with the service's own gauges (name, help, value) first.
    pub fn render(&self, gauges: &[(&str, &str, f64)]) -> String {
        use std::fmt::Write;
        let prefix = self.prefix;
        let mut out = String::new();
        for (name, help, value) in gauges {
            writeln!(out, "# HELP {prefix}_{name} {help}\n# TYPE {prefix}_{name} gauge\n{prefix}_{name} {value}").ok();
        }
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        writeln!(out, "# HELP {prefix}_requests_total Requests answered, by operation and HTTP status.").ok();
        writeln!(out, "# TYPE {prefix}_requests_total counter").ok();
        for ((operation, status), count) in &inner.requests {
            writeln!(out, "{prefix}_requests_total{{operation=\"{operation}\",status=\"{status}\"}} {count}").ok();
        }
        writeln!(out, "# HELP {prefix}_request_seconds Time to answer a request, by operation.").ok();
        writeln!(out, "# TYPE {prefix}_request_seconds histogram").ok();
        for (operation, histogram) in &inner.latency {
            for (bound, count) in LATENCY_BUCKETS.iter().zip(histogram.buckets) {
                writeln!(out, "{prefix}_request_seconds_bucket{{operation=\"{operation}\",le=\"{bound}\"}} {count}")
                    .ok();
            }
            let (count, sum) = (histogram.count, histogram.sum);
            writeln!(out, "{prefix}_request_seconds_bucket{{operation=\"{operation}\",le=\"+Inf\"}} {count}").ok();
            writeln!(out, "{prefix}_request_seconds_sum{{operation=\"{operation}\"}} {sum}").ok();
            writeln!(out, "{prefix}_request_seconds_count{{operation=\"{operation}\"}} {count}").ok();
        }
        out
    }
}

/// One autocomp service as the shared routes see it: its operations (`POST /v1/<name>`,
/// declared with `operations!`), how it answers one, its health and its own gauges.
/// `router` does the rest: access, unknown operations, metrics per operation,
/// `/openapi.json`, JSON 404/405, body limit.
#[async_trait::async_trait]
pub trait Rpc: Send + Sync + 'static {
    /// What an outage is called in the log ("store", "index").
    const WHAT: &'static str;
    /// What the OpenAPI document says besides the operations.
    const API: ApiDoc;
    /// The typed request, one variant per operation.
    type Request: Requests;

    fn access(&self) -> &Access;
    fn metrics(&self) -> &Metrics;
    /// Answers a request the caller may make.
    async fn answer(&self, request: Self::Request) -> Result<Answered, ApiError>;
    /// `GET /health`.
    async fn health(&self) -> Response;
    /// The service's gauges for `/metrics`: (name, help, value).
    async fn gauges(&self) -> Vec<(&'static str, &'static str, f64)>;
}

/// The service's OpenAPI document, as served and as checked in beside its code.
pub fn openapi<S: Rpc>() -> String {
    let document = crate::api::openapi(&S::API, <S::Request as Requests>::OPERATIONS);
    let mut text = serde_json::to_string_pretty(&document).expect("a JSON value always serializes");
    text.push('\n');
    text
}

/// The routes every service has, over `service`.
pub fn router<S: Rpc>(service: Arc<S>) -> axum::Router {
    use axum::routing::{get, post};
    let document = Bytes::from(openapi::<S>());
    axum::Router::new()
        .route("/health", get(|State(service): State<Arc<S>>| async move { service.health().await }))
        .route("/metrics", get(metrics::<S>))
        .route(
            "/openapi.json",
            get(move || std::future::ready(([(header::CONTENT_TYPE, "application/json")], document))),
        )
        .route("/v1/{operation}", post(operation::<S>))
        .fallback(no_such_path)
        .method_not_allowed_fallback(wrong_method)
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(service)
}

async fn operation<S: Rpc>(
    State(service): State<Arc<S>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path(operation): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let started = std::time::Instant::now();
    let known = <S::Request as Requests>::OPERATIONS.iter().find(|described| described.name == operation);
    // The token is checked before the body is read: a refused write reads nothing.
    let answer = match known {
        None => Err(ApiError::unknown_operation(&operation)),
        Some(described) => match service.access().check(&headers, peer, described.write) {
            Ok(()) => match S::Request::parse(described.name, body) {
                Some(Ok(request)) => service.answer(request).await.map(|answered| answered.0),
                Some(Err(refused)) => Err(refused),
                None => Err(ApiError::unknown_operation(&operation)),
            },
            Err(refused) => Err(refused),
        },
    };
    let response = answer.unwrap_or_else(IntoResponse::into_response);
    let label = known.map_or("unknown", |described| described.name);
    let (status, elapsed) = (response.status(), started.elapsed());
    service.metrics().observe(label, status, elapsed);
    let ms = elapsed.as_secs_f64() * 1000.0;
    if status.is_server_error() {
        tracing::warn!(operation, status = status.as_u16(), ms, %peer, "{} unavailable", S::WHAT);
    } else if status.is_client_error() {
        tracing::warn!(operation, status = status.as_u16(), ms, %peer, "request refused");
    } else {
        tracing::debug!(operation, status = status.as_u16(), ms, %peer, "request");
    }
    response
}

async fn metrics<S: Rpc>(State(service): State<Arc<S>>) -> Response {
    let text = service.metrics().render(&service.gauges().await);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

/// A 405 in the JSON error shape, for a known path asked with the wrong method.
pub async fn wrong_method(method: axum::http::Method, uri: axum::http::Uri) -> ApiError {
    ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "invalid", format!("{method} is not allowed on {}", uri.path()))
}

/// A 404 in the JSON error shape, for paths no route matches.
pub async fn no_such_path(uri: axum::http::Uri) -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "unknown_operation", format!("no route for {}", uri.path()))
}

/// Serves `router` on `listener` until SIGTERM or SIGINT, then finishes requests in flight.
pub async fn serve(listener: tokio::net::TcpListener, router: axum::Router) -> std::io::Result<()> {
    let service = router.into_make_service_with_connect_info::<SocketAddr>();
    axum::serve(listener, service).with_graceful_shutdown(shutdown_signal()).await
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    tracing::info!("shutting down: finishing requests in flight");
}

/// Logging for the service binaries: stderr, `RUST_LOG` or `-v` to raise the level (`-v`
/// logs a line per request).
pub fn init_logging(verbose: u8, format: crate::logging::LogFormat) {
    let level = match verbose {
        0 => "info",
        1 => "debug",
        _ => "trace",
    };
    crate::logging::init(level, format);
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    use super::*;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)] // read only to be refused
    struct Body {
        limit: usize,
        inner: Vec<Inner>,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Inner {
        min: Option<i32>,
    }

    fn refused(body: &str) -> (String, String) {
        let error = parse_body::<Body>(Ok(Bytes::from(body.to_owned()))).unwrap_err();
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let bytes = runtime.block_on(axum::body::to_bytes(error.into_response().into_body(), 1 << 20)).unwrap();
        let value: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        let field = value["error"]["field"].as_str().unwrap_or_default().to_owned();
        (field, value["error"]["message"].as_str().unwrap_or_default().to_owned())
    }

    #[test]
    fn a_refused_body_names_the_field_that_was_wrong() {
        assert_eq!(refused(r#"{"limit": "ten", "inner": []}"#).0, "limit");
        assert_eq!(refused(r#"{"limit": 1, "inner": [{"min": "high"}]}"#).0, "inner[0].min");
        assert_eq!(refused(r#"{"limit": 1, "inner": [], "extra": 1}"#).0, "extra");
        assert_eq!(refused(r#"[1, []]"#).0, "request body");
        assert_eq!(refused(r#"{"limit": 1, "inner": []} trailing"#).0, "request body");
    }
}
