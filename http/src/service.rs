//! The routes every autocomp HTTP service shares: the `Rpc` trait a service implements, its
//! `router` (bearer-token access and the declared length checked before a byte of the body
//! is read, per-operation metrics in Prometheus text, `/health`, `/openapi.json`, JSON
//! 404/405), a span per operation joining the caller's trace (`telemetry`), and the service's
//! tokens. What a refusal looks like is `error`'s; what the operations are is `api`'s; how
//! connections are served and shut down is `serve`'s.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, Path, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::api::{Answered, ApiDoc, Described, Requests};
use crate::error::ApiError;

/// Largest request body a service accepts: a 1 MiB details document plus its envelope.
pub const MAX_BODY_BYTES: usize = 4 << 20;

/// Largest body of a request that presents no token (a read open from loopback): a read's
/// body is a few names and numbers, or a page of ids (about 500 of the longest ids, 128
/// characters; more short ones). Anyone on the host may send these, so none can make the
/// service hold 4 MiB per connection; a valid token lifts it to `MAX_BODY_BYTES`.
pub const OPEN_READ_BODY_BYTES: usize = 64 << 10;

/// The shortest bearer token a service accepts (generate one with
/// `head -c 24 /dev/urandom | base64`: 32 characters).
pub const MIN_TOKEN_CHARS: usize = 12;

/// A service's bearer tokens: each one is accepted, so a token file can list the new token
/// beside the old one while clients move over; the first is what the service itself shows
/// another service (the index service, to its store).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tokens(Vec<Box<str>>);

impl Tokens {
    /// The tokens of a token file's `text`: one a line, blank lines and `#` comments skipped;
    /// `source` names the file or variable in errors (never a token).
    pub fn parse(text: &str, source: &str) -> Result<Self, String> {
        let mut tokens = Vec::new();
        for (number, line) in text.lines().enumerate() {
            let token = line.trim();
            if token.is_empty() || token.starts_with('#') {
                continue;
            }
            if !token.chars().all(|c| c.is_ascii_graphic()) {
                return Err(format!("{source}, line {}: a token is printable ASCII without spaces", number + 1));
            }
            if token.chars().count() < MIN_TOKEN_CHARS {
                return Err(format!(
                    "{source}, line {}: a token has at least {MIN_TOKEN_CHARS} characters \
                     (make one with: head -c 24 /dev/urandom | base64)",
                    number + 1
                ));
            }
            tokens.push(token.into());
        }
        if tokens.is_empty() {
            return Err(format!("{source} holds no token"));
        }
        Ok(Self(tokens))
    }

    /// The token this service shows when it calls another.
    pub fn shown(&self) -> &str {
        &self.0[0]
    }

    /// Whether `presented` is one of the tokens; every token is compared in full, so the
    /// time taken says nothing about which one, or how much of one, matched.
    fn accept(&self, presented: &str) -> bool {
        self.0.iter().fold(false, |found, token| constant_time_eq(presented.as_bytes(), token.as_bytes()) | found)
    }
}

/// Where a service's tokens come from: fixed at start, or a file read again when it changes.
#[derive(Clone)]
enum TokenSource {
    Fixed(Arc<Tokens>),
    File(Arc<autocomp_toolkit::reload::Reloaded<Tokens>>),
}

impl TokenSource {
    fn current(&self) -> Arc<Tokens> {
        match self {
            Self::Fixed(tokens) => Arc::clone(tokens),
            Self::File(file) => file.current(),
        }
    }
}

/// A service's tokens as its flags say: `--token-file` (read again when it changes or on
/// SIGHUP, so tokens rotate without a restart), else `$AUTOCOMP_TOKEN` (one token, fixed).
#[derive(Clone)]
pub struct ServiceToken(TokenSource);

impl ServiceToken {
    /// Reads the tokens; an error (exit 2 at start) names the file or the variable.
    pub fn load(token_file: Option<&std::path::Path>) -> Result<Self, String> {
        match token_file {
            Some(path) => {
                let shown = format!("--token-file {}", path.display());
                let file = path.to_path_buf();
                let read = move || {
                    autocomp_toolkit::file_modes::warn_if_exposed(&file, "the token file --token-file");
                    let text = std::fs::read_to_string(&file).map_err(|e| format!("cannot read {shown}: {e}"))?;
                    Tokens::parse(&text, &shown)
                };
                let reloaded =
                    autocomp_toolkit::reload::Reloaded::new("the token file", vec![path.to_path_buf()], read)?;
                Ok(Self(TokenSource::File(reloaded)))
            }
            None => {
                let text = std::env::var("AUTOCOMP_TOKEN").map_err(|_| {
                    "no write token: pass --token-file FILE or set AUTOCOMP_TOKEN (writes always need one)".to_string()
                })?;
                Ok(Self(TokenSource::Fixed(Arc::new(Tokens::parse(&text, "$AUTOCOMP_TOKEN")?))))
            }
        }
    }

    /// The token this service shows another service now.
    pub fn shown(&self) -> String {
        self.0.current().shown().to_string()
    }

    /// Reads a token file again when it changes or on SIGHUP, for as long as the service
    /// runs (nothing to do for `$AUTOCOMP_TOKEN`). Call within a tokio runtime.
    pub fn watch(&self) {
        if let TokenSource::File(file) = &self.0 {
            file.watch();
        }
    }
}

/// Who may call what: writes always need a bearer token; reads need it only from
/// addresses other than loopback, unless `reads_need_token` (a host other users share).
#[derive(Clone)]
pub struct Access {
    tokens: TokenSource,
    loopback_reads_open: bool,
}

impl Access {
    /// Access with one fixed token.
    pub fn new(token: impl Into<Arc<str>>) -> Self {
        let tokens = Tokens(vec![Box::from(&*token.into())]);
        Self { tokens: TokenSource::Fixed(Arc::new(tokens)), loopback_reads_open: true }
    }

    /// Access with a service's tokens, as they are when a request arrives.
    pub fn with_tokens(token: &ServiceToken) -> Self {
        Self { tokens: token.0.clone(), loopback_reads_open: true }
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
            Some(token) if self.tokens.current().accept(token) => Ok(()),
            Some(_) => Err(ApiError::unauthorized("the bearer token is wrong")),
        }
    }
}

impl Access {
    /// Whether `headers` present one of the tokens (whether or not the request needs one).
    pub fn token_presented(&self, headers: &HeaderMap) -> bool {
        let presented = headers
            .get(header::AUTHORIZATION)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.strip_prefix("Bearer "))
            .map(str::trim);
        presented.is_some_and(|token| self.tokens.current().accept(token))
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
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
            get(
                move |State(service): State<Arc<S>>, ConnectInfo(peer): ConnectInfo<SocketAddr>, headers: HeaderMap| {
                    // Like every read: open from loopback unless told, else only with the token.
                    let refused = service.access().check(&headers, peer, false).err();
                    std::future::ready(match refused {
                        Some(refused) => refused.into_response(),
                        None => ([(header::CONTENT_TYPE, "application/json")], document).into_response(),
                    })
                },
            ),
        )
        .route("/protocol", get(protocol::<S>))
        .route("/v1/{operation}", post(operation::<S>))
        .fallback(no_such_path)
        .method_not_allowed_fallback(wrong_method)
        .with_state(service)
}

/// `GET /protocol`: what the service offers (`protocol::Offered`), open as every read is.
async fn protocol<S: Rpc>(
    State(service): State<Arc<S>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
) -> Response {
    if let Err(refused) = service.access().check(&headers, peer, false) {
        return refused.into_response();
    }
    let operations = <S::Request as Requests>::OPERATIONS.iter().map(|described| described.name);
    with_protocol(axum::Json(crate::protocol::Offered::of(S::WHAT, operations)).into_response())
}

/// `response` with this release's protocol version in its `autocomp-protocol` header.
fn with_protocol(mut response: Response) -> Response {
    response
        .headers_mut()
        .insert(crate::protocol::PROTOCOL_HEADER, header::HeaderValue::from(crate::protocol::PROTOCOL));
    response
}

async fn operation<S: Rpc>(
    State(service): State<Arc<S>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path(operation): Path<String>,
    request: Request,
) -> Response {
    use tracing::Instrument;
    let started = std::time::Instant::now();
    let known = <S::Request as Requests>::OPERATIONS.iter().find(|described| described.name == operation);
    let label = known.map_or("unknown", |described| described.name);
    // A child of the caller's span when it sent a `traceparent` and telemetry is on; else
    // disabled, and instrumenting with it costs nothing.
    let span = autocomp_toolkit::telemetry::server_span(label, request.headers());
    if service.access().token_presented(request.headers()) {
        // Its connection keeps its slot when a crowd of slow clients comes.
        crate::serve::mark_authenticated(request.extensions());
    }
    let answer = match known {
        None => Err(ApiError::unknown_operation(&operation)),
        Some(described) => answer(&*service, described, peer, request).instrument(span.clone()).await,
    };
    let response = with_protocol(answer.unwrap_or_else(IntoResponse::into_response));
    let (status, elapsed) = (response.status(), started.elapsed());
    span.record("http.response.status_code", status.as_u16());
    if status.is_server_error() {
        span.record("otel.status_code", "ERROR");
    }
    service.metrics().observe(label, status, elapsed);
    let ms = elapsed.as_secs_f64() * 1000.0;
    // Any client can cause these at will: one line per client every 10 s, with the count.
    static UNAVAILABLE: crate::quiet::Quiet = crate::quiet::Quiet::new("request answered unavailable");
    static REFUSED: crate::quiet::Quiet = crate::quiet::Quiet::new("request refused");
    if status.is_server_error() && UNAVAILABLE.allow(Some(peer.ip())) {
        tracing::warn!(operation, status = status.as_u16(), ms, %peer, "{} unavailable", S::WHAT);
    } else if status.is_client_error() && REFUSED.allow(Some(peer.ip())) {
        tracing::warn!(operation, status = status.as_u16(), ms, %peer, "request refused");
    } else {
        tracing::debug!(operation, status = status.as_u16(), ms, %peer, "request");
    }
    response
}

/// Refuses what can be refused from the head alone (the token, a declared length over the
/// limit) before a byte of the body is read; only then reads the body, bounded in size
/// (chunked bodies too) and in time, and parses it.
async fn answer<S: Rpc>(
    service: &S,
    described: &Described,
    peer: SocketAddr,
    request: Request,
) -> Result<Response, ApiError> {
    let (head, body) = request.into_parts();
    service.access().check(&head.headers, peer, described.write)?;
    let bytes = if service.access().token_presented(&head.headers) {
        read_body(&head.headers, body, MAX_BODY_BYTES).await?
    } else {
        read_body(&head.headers, body, OPEN_READ_BODY_BYTES).await.map_err(|mut refused| {
            if refused.status == StatusCode::PAYLOAD_TOO_LARGE {
                let lifted = " without a token (a bearer token lifts it to 4 MiB; or ask for fewer ids)";
                refused.detail.message += lifted;
                if let Some(reason) = refused.detail.reason.as_mut() {
                    reason.push_str(lifted);
                }
            }
            refused
        })?
    };
    match S::Request::parse(described.name, Ok(bytes)) {
        Some(Ok(request)) => service.answer(request).await.map(|answered| answered.0),
        Some(Err(refused)) => Err(refused),
        None => Err(ApiError::unknown_operation(described.name)),
    }
}

/// A request's body, at most `limit` bytes: a declared Content-Length over it is refused
/// (413) without reading; a chunked body is read until it passes the limit. A body that
/// does not arrive in the connection's body time is refused with 408.
pub async fn read_body(headers: &HeaderMap, body: Body, limit: usize) -> Result<Bytes, ApiError> {
    let too_large = |size: String| {
        let reason = format!("at most {limit} bytes are accepted");
        let mut refused =
            ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "too_large", format!("request body: {size}; {reason}"));
        // Field, value and reason, as bad input is named: a client can say what to change.
        refused.detail.field = Some("request body".to_owned());
        refused.detail.value = Some(size);
        refused.detail.reason = Some(reason);
        refused
    };
    // hyper has already refused a Content-Length that is not a number.
    let declared =
        headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if let Some(declared) = declared
        && declared > limit as u64
    {
        return Err(too_large(format!("{declared} bytes declared")));
    }
    axum::body::to_bytes(body, limit).await.map_err(|error| {
        if let Some(timed_out) = find::<crate::serve::BodyTimedOut>(&error) {
            ApiError::new(StatusCode::REQUEST_TIMEOUT, "invalid", timed_out.to_string())
        } else if find::<http_body_util::LengthLimitError>(&error).is_some() {
            too_large("a chunked body went past the limit".to_string())
        } else {
            ApiError::new(StatusCode::BAD_REQUEST, "invalid", format!("reading the request body: {error}"))
        }
    })
}

/// The first error of type `E` in `error`'s chain of sources.
fn find<'a, E: std::error::Error + 'static>(error: &'a (dyn std::error::Error + 'static)) -> Option<&'a E> {
    let mut current = Some(error);
    while let Some(error) = current {
        if let Some(found) = error.downcast_ref::<E>() {
            return Some(found);
        }
        current = error.source();
    }
    None
}

async fn metrics<S: Rpc>(
    State(service): State<Arc<S>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
) -> Response {
    // Like every read: open from loopback unless told, else only with the token (Prometheus
    // sends one with `authorization: {credentials_file: ...}`).
    if let Err(refused) = service.access().check(&headers, peer, false) {
        return refused.into_response();
    }
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

/// Logging for the service binaries: stderr, `RUST_LOG` or `-v` to raise the level (`-v`
/// logs a line per request).
pub fn init_logging(verbose: u8, format: autocomp_toolkit::logging::LogFormat) {
    let level = match verbose {
        0 => "info",
        1 => "debug",
        _ => "trace",
    };
    autocomp_toolkit::logging::init(level, format);
}
