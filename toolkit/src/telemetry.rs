//! Optional OpenTelemetry export of traces over OTLP/HTTP: on only when the standard
//! `OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT` variable is set, else nothing is built and every hook
//! here is one atomic load. Owns the exporter, the W3C `traceparent` hooks the HTTP client and
//! the service routes call, and the flush every binary's exit path runs (docs/telemetry.md).

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_http::{Bytes, HeaderExtractor, HeaderInjector, HttpError, Request, Response};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The `tracing` target of the spans that become OpenTelemetry spans (a pass, a batch, a
/// request): the OTel layer takes spans of this target only, and the stderr log leaves them out,
/// so turning telemetry on changes no log line.
pub const TARGET: &str = "autocomp::telemetry";

/// How long one export may take when `OTEL_EXPORTER_OTLP_[TRACES_]TIMEOUT` does not say (the
/// specification's 10 s would hold a cron pass's exit that long behind a silent collector). It
/// also bounds the wait for the last spans at exit.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);

/// Whether spans are exported: set once, when the logging set-up built the exporter.
static ENABLED: AtomicBool = AtomicBool::new(false);
/// Set by the first failed export of an outage (or an exit that could not flush), cleared
/// when the collector answers again: one warning per outage, not one per batch of spans.
static WARNED: AtomicBool = AtomicBool::new(false);
/// The exporter, its timeout and the endpoint it exports to (as logs show it).
static PROVIDER: OnceLock<(SdkTracerProvider, Duration, String)> = OnceLock::new();

/// Whether this process exports traces. Every hook checks this first: off, nothing else runs.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// What the environment asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Settings {
    /// The endpoint named (the exporter reads it again itself, with `/v1/traces` appended to
    /// the general one); here it only decides whether TLS is needed.
    pub endpoint: String,
    pub timeout: Duration,
    /// `OTEL_SERVICE_NAME` unset: the binary's name is the service's.
    pub default_service_name: bool,
}

/// Reads the OpenTelemetry variables through `var`: `Ok(None)` when export is off (no
/// endpoint, `OTEL_SDK_DISABLED=true`, `OTEL_TRACES_EXPORTER=none`), an error naming the
/// variable when it asks for something this build cannot do.
pub(crate) fn settings_from(var: impl Fn(&str) -> Option<String>) -> Result<Option<Settings>, String> {
    let var = |name: &str| var(name).map(|value| value.trim().to_owned()).filter(|value| !value.is_empty());
    if var("OTEL_SDK_DISABLED").is_some_and(|value| value.eq_ignore_ascii_case("true")) {
        return Ok(None);
    }
    let Some(endpoint) = var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").or_else(|| var("OTEL_EXPORTER_OTLP_ENDPOINT"))
    else {
        return Ok(None);
    };
    if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
        // Not echoed: a mistyped URL may still hold a user and password.
        return Err("the OTLP endpoint is not an http:// or https:// URL".to_owned());
    }
    match var("OTEL_TRACES_EXPORTER").as_deref() {
        None | Some("otlp") => {}
        Some("none") => return Ok(None),
        Some(other) => return Err(format!("OTEL_TRACES_EXPORTER={other}: only otlp (or none) is supported")),
    }
    for name in ["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"] {
        if let Some(protocol) = var(name) {
            if protocol != "http/protobuf" {
                return Err(format!(
                    "{name}={protocol}: only http/protobuf is supported (OTLP over HTTP, a collector's port 4318)"
                ));
            }
            break;
        }
    }
    let mut timeout = DEFAULT_TIMEOUT;
    for name in ["OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT"] {
        if let Some(text) = var(name) {
            let millis: u64 = text.parse().map_err(|_| format!("{name}={text}: a number of milliseconds"))?;
            timeout = Duration::from_millis(millis.max(1));
            break;
        }
    }
    let default_service_name = var("OTEL_SERVICE_NAME").is_none();
    Ok(Some(Settings { endpoint, timeout, default_service_name }))
}

/// The OpenTelemetry layer, when the environment turns export on (`Ok(None)` when it does
/// not: nothing was built). A configuration it cannot use is an error for the caller to log
/// as a warning, and no export: telemetry never stops a binary. Called once, by
/// `logging::init_with`.
pub(crate) fn layer()
-> Result<Option<Box<dyn tracing_subscriber::Layer<tracing_subscriber::Registry> + Send + Sync>>, String> {
    use tracing_subscriber::Layer;
    // The exporter's own errors may quote the endpoint, which may carry a user and password.
    let off = |refused: String| format!("OpenTelemetry export off: {}", crate::redact::redact_urls_in(&refused));
    let Some(settings) = settings_from(|name| std::env::var(name).ok()).map_err(off)? else {
        return Ok(None);
    };
    let provider = start(&settings).map_err(off)?;
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    let tracer = provider.tracer("autocomp");
    let shown = crate::display_url(&settings.endpoint);
    if PROVIDER.set((provider, settings.timeout, shown)).is_err() {
        return Ok(None);
    }
    ENABLED.store(true, Ordering::Relaxed);
    // Lean spans: no source locations, thread names or targets (what the span is says
    // enough), no busy/idle time. Spans of our target only; events (log lines) at INFO and
    // above that happen inside them become their events, `error!` an error status.
    let filter = tracing_subscriber::filter::filter_fn(|metadata| {
        if metadata.is_span() { metadata.target() == TARGET } else { *metadata.level() <= tracing::Level::INFO }
    });
    let layer = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_location(false)
        .with_threads(false)
        .with_tracked_inactivity(false)
        .with_target(false)
        .with_filter(filter);
    Ok(Some(Box::new(layer)))
}

fn start(settings: &Settings) -> Result<SdkTracerProvider, String> {
    use opentelemetry_otlp::{Protocol, RetryPolicy, WithExportConfig, WithHttpConfig};
    let client = Collector::new(settings)?;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(client)
        .with_protocol(Protocol::HttpBinary)
        .with_timeout(settings.timeout)
        // One attempt: a pass's spans lost to a collector's blip cost less than a process
        // that retries at exit.
        .with_retry_policy(RetryPolicy::disabled())
        .build()
        .map_err(|e| e.to_string())?;
    let mut resource = opentelemetry_sdk::Resource::builder();
    if settings.default_service_name {
        resource = resource.with_service_name(binary_name());
    }
    // The batch processor exports from a thread of its own, every OTEL_BSP_SCHEDULE_DELAY
    // (5 s) or when OTEL_BSP_MAX_EXPORT_BATCH_SIZE spans wait; past OTEL_BSP_MAX_QUEUE_SIZE
    // (2048) spans are dropped, so a silent collector costs bounded memory and no pass time.
    Ok(SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(resource.build()).build())
}

/// The process's file name (`checksum-verifier`, `autocomp-store`, `sboi`).
fn binary_name() -> String {
    std::env::args_os()
        .next()
        .as_deref()
        .map(std::path::Path::new)
        .and_then(std::path::Path::file_name)
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_else(|| "autocomp".to_owned())
}

/// Exports what is left and stops exporting, waiting at most the export timeout: run on
/// every binary's way out (spans still queued would be lost with the process). Blocks the
/// calling thread (in async code, call it from `spawn_blocking`). Nothing when export is off;
/// once only.
pub fn shutdown() {
    let Some((provider, timeout, endpoint)) = PROVIDER.get() else { return };
    if !ENABLED.swap(false, Ordering::Relaxed) {
        return;
    }
    if provider.shutdown_with_timeout(*timeout).is_err() && !WARNED.swap(true, Ordering::Relaxed) {
        tracing::warn!(
            "OpenTelemetry: the last spans were not exported to {endpoint} within {timeout:?}; they are dropped"
        );
    }
}

/// A span for a call to another service (`what` names it: "store service"), when the caller
/// is inside a trace (else a disabled span: a call outside a pass, e.g. a watcher's long poll
/// or sboi's follower, starts no trace).
pub fn client_span(what: &str, operation: &str) -> tracing::Span {
    if !enabled() || !in_trace() {
        return tracing::Span::none();
    }
    tracing::info_span!(target: TARGET, "call", otel.name = operation, otel.kind = "client",
        autocomp.service = what, autocomp.operation = operation)
}

fn in_trace() -> bool {
    tracing::Span::current().context().span().span_context().is_valid()
}

/// Adds `traceparent` (and `tracestate`) of the current span to an outgoing request's
/// headers; nothing when export is off or the caller is not inside a trace.
pub fn inject(headers: &mut http::HeaderMap) {
    if !enabled() {
        return;
    }
    let context = tracing::Span::current().context();
    if context.span().span_context().is_valid() {
        opentelemetry::global::get_text_map_propagator(|propagator| {
            propagator.inject_context(&context, &mut HeaderInjector(headers))
        });
    }
}

/// The span a service answers `operation` in: a child of the caller's span when the request
/// carries a valid `traceparent`, else a disabled span (requests from outside a trace start
/// none, so a long poll is not a trace of its own every 30 s).
pub fn server_span(operation: &str, headers: &http::HeaderMap) -> tracing::Span {
    if !enabled() {
        return tracing::Span::none();
    }
    let parent =
        opentelemetry::global::get_text_map_propagator(|propagator| propagator.extract(&HeaderExtractor(headers)));
    if !parent.span().span_context().is_valid() {
        return tracing::Span::none();
    }
    let span = tracing::info_span!(target: TARGET, parent: None, "request", otel.name = operation,
        otel.kind = "server", autocomp.operation = operation,
        http.response.status_code = tracing::field::Empty, otel.status_code = tracing::field::Empty);
    // Only fails when the span is disabled or already started: it is neither.
    let _ = span.set_parent(parent);
    span
}

/// The OTLP exporter's HTTP client: the workspace's reqwest (blocking, as the SDK's export
/// thread has no async runtime) with the TLS every autocomp client uses (webpki's roots, the
/// system store, `$AUTOCOMP_CA_FILE`), each request bounded by the export timeout. A failure
/// is one warning per outage.
#[derive(Debug)]
struct Collector {
    client: reqwest::blocking::Client,
    /// The collector failed last time: the next failure is not worth another warning.
    failing: AtomicBool,
}

/// What a collector may answer: an OTLP response is a few bytes.
const MAX_ANSWER_BYTES: u64 = 64 << 10;

impl Collector {
    fn new(settings: &Settings) -> Result<Self, String> {
        let tls = if settings.endpoint.starts_with("https://") {
            Some(crate::tls::ClientTls::from_env().config().map_err(|e| e.to_string())?)
        } else {
            None
        };
        let timeout = settings.timeout;
        // reqwest's blocking client keeps a runtime of its own, which must not be made (or
        // dropped) on an async runtime's thread: the services set logging up inside theirs.
        let built = std::thread::spawn(move || {
            let mut builder = reqwest::blocking::Client::builder()
                .timeout(timeout)
                .connect_timeout(timeout)
                .redirect(reqwest::redirect::Policy::none());
            if let Some(tls) = tls {
                builder = builder.use_preconfigured_tls(tls);
            }
            builder.build()
        })
        .join()
        .map_err(|_| "the OTLP client could not be built".to_string())?;
        let client = built.map_err(|e| format!("the OTLP client: {}", crate::error_chain::error_chain(&e)))?;
        Ok(Self { client, failing: AtomicBool::new(false) })
    }

    fn send(&self, request: Request<Bytes>) -> Result<Response<Bytes>, String> {
        use std::io::Read;
        let (head, body) = request.into_parts();
        let answer = self
            .client
            .request(head.method, head.uri.to_string())
            .headers(head.headers)
            .body(body.to_vec())
            .send()
            // The URL is in the warning already, shown without its credentials.
            .map_err(|e| crate::error_chain::error_chain(&e.without_url()))?;
        let (status, headers) = (answer.status(), answer.headers().clone());
        let mut bytes = Vec::new();
        answer.take(MAX_ANSWER_BYTES).read_to_end(&mut bytes).map_err(|e| e.to_string())?;
        let mut response = Response::new(Bytes::from(bytes));
        *response.status_mut() = status;
        *response.headers_mut() = headers;
        Ok(response)
    }
}

#[async_trait::async_trait]
impl opentelemetry_http::HttpClient for Collector {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let endpoint = crate::display_url(&request.uri().to_string());
        let sent = self.send(request);
        let failure = match &sent {
            Ok(response) if response.status().is_success() => None,
            Ok(response) => Some(format!("it answered HTTP {}", response.status())),
            Err(error) => Some(error.clone()),
        };
        match failure {
            None => {
                if self.failing.swap(false, Ordering::Relaxed) {
                    // The outage is over: the next one is worth a warning of its own.
                    WARNED.store(false, Ordering::Relaxed);
                    tracing::info!("OpenTelemetry: the collector at {endpoint} takes spans again");
                }
            }
            Some(failure) => {
                if !self.failing.swap(true, Ordering::Relaxed) && !WARNED.swap(true, Ordering::Relaxed) {
                    tracing::warn!("OpenTelemetry: cannot export spans to {endpoint}: {failure}; they are dropped");
                }
            }
        }
        sent.map_err(HttpError::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(vars: &[(&str, &str)]) -> Result<Option<Settings>, String> {
        settings_from(|name| vars.iter().find(|(key, _)| *key == name).map(|(_, value)| value.to_string()))
    }

    #[test]
    fn an_endpoint_that_is_not_a_url_is_refused_without_echoing_it() {
        let refused = settings(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "alice:S3cr3t@collector:4318")]).unwrap_err();
        assert!(refused.contains("not an http:// or https:// URL") && !refused.contains("S3cr3t"), "{refused}");
    }

    #[test]
    fn off_unless_an_endpoint_is_named_and_the_sdk_is_not_disabled() {
        assert_eq!(settings(&[]), Ok(None));
        assert_eq!(settings(&[("OTEL_EXPORTER_OTLP_ENDPOINT", " ")]), Ok(None));
        assert_eq!(settings(&[("OTEL_SERVICE_NAME", "x"), ("OTEL_EXPORTER_OTLP_HEADERS", "a=b")]), Ok(None));
        let endpoint = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318");
        assert_eq!(settings(&[endpoint, ("OTEL_SDK_DISABLED", "TRUE")]), Ok(None));
        assert_eq!(settings(&[endpoint, ("OTEL_TRACES_EXPORTER", "none")]), Ok(None));
        let on = settings(&[endpoint, ("OTEL_SDK_DISABLED", "false")]).unwrap().unwrap();
        assert_eq!(on, Settings { endpoint: endpoint.1.into(), timeout: DEFAULT_TIMEOUT, default_service_name: true });
        let traces_only = settings(&[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "https://c/v1/traces")]).unwrap().unwrap();
        assert_eq!(traces_only.endpoint, "https://c/v1/traces");
    }

    #[test]
    fn the_signal_s_own_variables_win_and_what_cannot_be_done_is_refused_by_name() {
        let endpoint = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318");
        let on = settings(&[
            endpoint,
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "9000"),
            ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "500"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf"),
            ("OTEL_SERVICE_NAME", "ingest-a"),
        ]);
        let on = on.unwrap().unwrap();
        assert_eq!((on.timeout, on.default_service_name), (Duration::from_millis(500), false));
        let grpc = settings(&[endpoint, ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")]).unwrap_err();
        assert!(grpc.contains("OTEL_EXPORTER_OTLP_PROTOCOL=grpc") && grpc.contains("http/protobuf"), "{grpc}");
        let json = settings(&[endpoint, ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/json")]).unwrap_err();
        assert!(json.contains("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/json"), "{json}");
        let timeout = settings(&[endpoint, ("OTEL_EXPORTER_OTLP_TIMEOUT", "2s")]).unwrap_err();
        assert!(timeout.contains("OTEL_EXPORTER_OTLP_TIMEOUT=2s"), "{timeout}");
        let exporter = settings(&[endpoint, ("OTEL_TRACES_EXPORTER", "zipkin")]).unwrap_err();
        assert!(exporter.contains("OTEL_TRACES_EXPORTER=zipkin"), "{exporter}");
    }

    #[test]
    fn hooks_do_nothing_while_export_is_off() {
        // No layer was built in this test process: no span, no header.
        assert!(!enabled());
        let mut headers = http::HeaderMap::new();
        inject(&mut headers);
        assert!(headers.is_empty());
        let mut incoming = http::HeaderMap::new();
        incoming.insert("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".parse().unwrap());
        assert!(server_span("head", &incoming).is_none());
        assert!(client_span("store service", "head").is_none());
        shutdown();
    }
}
