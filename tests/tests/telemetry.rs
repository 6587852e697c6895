//! OpenTelemetry end to end: an OTLP/HTTP receiver started here (axum on 127.0.0.1, decoding
//! the protobuf the exporter sends), the store service and the sboi service as real
//! processes, and cron passes of the probe component over them. With the OTLP variables set a
//! pass is one trace, from the component through both services; without them (or with the
//! SDK disabled) the receiver hears nothing, not even from services that have it set.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use autocomp_e2e::services::{TOKEN, http_get, metric};
use autocomp_e2e::{Finished, Pipeline, binary, finish, wait_until};
use autocomp_test_servers::receiver::HttpReceiver;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use prost::Message;

const PROBE: &str = env!("CARGO_BIN_EXE_probe-component");

/// OTLP's `SPAN_KIND_SERVER` and `STATUS_CODE_ERROR`.
const SERVER: i32 = 2;
const ERROR: i32 = 2;

/// One span as the receiver got it, with the `service.name` of the process that sent it.
#[derive(Debug, Clone)]
struct Received {
    service: String,
    trace: Vec<u8>,
    id: Vec<u8>,
    parent: Vec<u8>,
    name: String,
    kind: i32,
    attributes: BTreeMap<String, String>,
    /// The span's events, by name.
    events: Vec<String>,
    /// Its status: OTLP's `STATUS_CODE_ERROR` or not.
    error: bool,
}

impl Received {
    fn attribute(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).map(String::as_str)
    }
}

fn text(value: &Option<AnyValue>) -> String {
    match value.as_ref().and_then(|value| value.value.as_ref()) {
        Some(any_value::Value::StringValue(text)) => text.clone(),
        Some(any_value::Value::IntValue(number)) => number.to_string(),
        Some(any_value::Value::BoolValue(flag)) => flag.to_string(),
        Some(any_value::Value::DoubleValue(number)) => number.to_string(),
        other => format!("{other:?}"),
    }
}

fn attributes(pairs: &[KeyValue]) -> BTreeMap<String, String> {
    pairs.iter().map(|pair| (pair.key.clone(), text(&pair.value))).collect()
}

/// What the receiver has been sent: every export request (path and whether it decoded) and
/// the spans in them.
#[derive(Default)]
struct Inbox {
    requests: Vec<String>,
    spans: Vec<Received>,
}

/// An OTLP/HTTP collector on 127.0.0.1: `POST /v1/traces` in protobuf, recorded before it is
/// answered (so once a sender has exited, all it sent is here); its own thread and runtime,
/// stopped when dropped.
struct Collector {
    url: String,
    inbox: Arc<Mutex<Inbox>>,
    _server: HttpReceiver,
}

impl Collector {
    fn start() -> Collector {
        let inbox = Arc::new(Mutex::new(Inbox::default()));
        let server = HttpReceiver::start(axum::Router::new().fallback(receive).with_state(Arc::clone(&inbox)));
        Collector { url: server.url(), inbox, _server: server }
    }

    fn requests(&self) -> Vec<String> {
        self.inbox.lock().unwrap().requests.clone()
    }

    fn spans(&self) -> Vec<Received> {
        self.inbox.lock().unwrap().spans.clone()
    }
}

async fn receive(
    axum::extract::State(inbox): axum::extract::State<Arc<Mutex<Inbox>>>,
    uri: axum::http::Uri,
    body: axum::body::Bytes,
) -> impl axum::response::IntoResponse {
    let decoded = ExportTraceServiceRequest::decode(body);
    let mut inbox = inbox.lock().unwrap();
    inbox.requests.push(format!("{} ({})", uri.path(), if decoded.is_ok() { "protobuf" } else { "undecodable" }));
    for resource in decoded.map(|request| request.resource_spans).unwrap_or_default() {
        let service = resource
            .resource
            .as_ref()
            .and_then(|resource| resource.attributes.iter().find(|pair| pair.key == "service.name"))
            .map(|pair| text(&pair.value))
            .unwrap_or_default();
        for span in resource.scope_spans.into_iter().flat_map(|scope| scope.spans) {
            inbox.spans.push(Received {
                service: service.clone(),
                trace: span.trace_id,
                id: span.span_id,
                parent: span.parent_span_id,
                name: span.name,
                kind: span.kind,
                attributes: attributes(&span.attributes),
                events: span.events.into_iter().map(|event| event.name).collect(),
                error: span.status.is_some_and(|status| status.code == ERROR),
            });
        }
    }
    // An empty ExportTraceServiceResponse: everything accepted.
    ([(axum::http::header::CONTENT_TYPE, "application/x-protobuf")], Vec::<u8>::new())
}

/// `command` without any OpenTelemetry variable of the test's own environment, then with `otel`.
fn with_otel(command: &mut Command, otel: &[(&str, &str)]) {
    for (name, _) in std::env::vars() {
        if name.starts_with("OTEL_") {
            command.env_remove(name);
        }
    }
    command.envs(otel.iter().copied());
}

/// A service process (`autocomp-store serve`, `sboi serve`) with the environment a test
/// gives it; SIGTERM on `stop` (a service exports its last spans as it stops), SIGKILL when
/// dropped.
struct Process {
    child: Child,
    url: String,
    log: PathBuf,
}

impl Process {
    fn start(program: &str, args: &[String], otel: &[(&str, &str)], dir: &Path) -> Process {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let token_file = dir.join(format!("{program}.token"));
        std::fs::write(&token_file, TOKEN).unwrap();
        let log = dir.join(format!("{program}.log"));
        let mut command = Command::new(binary(program));
        command.args(args).arg("--listen").arg(format!("127.0.0.1:{port}")).arg("--token-file").arg(&token_file);
        command.env_remove("AUTOCOMP_TOKEN").env_remove("AUTOCOMP_TOKEN_FILE").env_remove("RUST_LOG");
        with_otel(&mut command, otel);
        let stderr = std::fs::File::create(&log).unwrap();
        let child = command.stdin(Stdio::null()).stdout(Stdio::null()).stderr(stderr).spawn().unwrap();
        let mut process = Process { child, url: format!("http://127.0.0.1:{port}"), log };
        let health = format!("{}/health", process.url);
        let healthy = wait_until(Instant::now() + Duration::from_secs(30), || {
            process.child.try_wait().ok().flatten().is_some()
                || http_get(&health).is_some_and(|(status, _)| status == 200)
        });
        assert!(healthy && process.child.try_wait().unwrap().is_none(), "{program} not healthy:\n{}", process.logs());
        process
    }

    fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM, and the exit it must come to within 15 s.
    fn stop(&mut self) {
        // SAFETY: signalling our own child, which has not been waited for (its pid is ours).
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let mut status = None;
        let exited = wait_until(Instant::now() + Duration::from_secs(15), || {
            status = self.child.try_wait().unwrap();
            status.is_some()
        });
        assert!(exited, "did not stop on SIGTERM:\n{}", self.logs());
        assert!(status.unwrap().success(), "stopped with {status:?}:\n{}", self.logs());
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.child.kill().ok();
        self.child.wait().ok();
    }
}

/// A pipeline whose components reach the store service (over its SQLite file) and the sboi
/// service over HTTP, both started with `otel`, and `batches` ready for the probe.
struct OverServices {
    pipeline: Pipeline,
    store: Process,
    index: Process,
}

impl OverServices {
    fn start(batches: usize, otel: &[(&str, &str)]) -> OverServices {
        let pipeline = Pipeline::new(PROBE);
        pipeline.register(batches);
        let root = pipeline.path("");
        let db = format!("sqlite://{}?synchronous=normal", pipeline.path("store.db").display());
        let store = Process::start("autocomp-store", &["serve".into(), "--db".into(), db], otel, &root);
        let index_dir = pipeline.path("sboi-index").display().to_string();
        let args = ["serve".into(), "--store".into(), store.url.clone(), "--index-dir".into(), index_dir];
        let index = Process::start("sboi", &args, otel, &root);
        pipeline.use_backend("store", &store.url);
        pipeline.use_backend("index", &index.url);
        let services = OverServices { pipeline, store, index };
        services.indexed();
        services
    }

    /// Waits until the sboi service has indexed everything the store holds, so a pass asks it
    /// about every batch registered.
    fn indexed(&self) {
        let head = self.pipeline.head().0 as f64;
        let caught_up = wait_until(Instant::now() + Duration::from_secs(30), || {
            metric(&self.index.url, "sboi_indexed_seq").is_some_and(|indexed| indexed >= head)
        });
        assert!(caught_up, "sboi did not index up to {head}:\n{}", self.index.logs());
    }

    /// One cron pass of the probe, with `otel` in its environment.
    fn pass(&self, otel: &[(&str, &str)]) -> Finished {
        let mut command = self.pipeline.command(&[]);
        with_otel(&mut command, otel);
        finish(command.spawn().expect("the probe starts"), Duration::from_secs(60))
    }

    /// Stops both services, the index first (it follows the store), so each exports what it has.
    fn stop(&mut self) {
        self.index.stop();
        self.store.stop();
    }
}

/// The spans of `trace`, by span id.
fn of_trace<'a>(spans: &'a [Received], trace: &[u8]) -> BTreeMap<Vec<u8>, &'a Received> {
    spans.iter().filter(|span| span.trace == trace).map(|span| (span.id.clone(), span)).collect()
}

/// Whether following parent ids from `span` within `trace` reaches `ancestor`.
fn descends_from(trace: &BTreeMap<Vec<u8>, &Received>, span: &Received, ancestor: &[u8]) -> bool {
    let mut parent = span.parent.clone();
    for _ in 0..trace.len() {
        if parent == ancestor {
            return true;
        }
        match trace.get(&parent) {
            Some(next) => parent = next.parent.clone(),
            None => return false,
        }
    }
    false
}

fn show(spans: &[Received]) -> String {
    spans
        .iter()
        .map(|s| format!("{} {} {:?} parent={:?} {:?}", s.service, s.name, s.id, s.parent, s.attributes))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn a_pass_over_the_services_is_one_trace_from_the_component_through_the_store_and_the_index() {
    let collector = Collector::start();
    let otel = [("OTEL_EXPORTER_OTLP_ENDPOINT", collector.url.as_str())];
    let mut services = OverServices::start(2, &otel);
    services.pipeline.configure("[settings]\nbehaviour = \"succeed\"\n");
    let first = services.pass(&otel);
    assert_eq!(first.code, Some(0), "{}", first.show());
    assert_eq!(first.stderr, "", "a cron pass exporting its trace has nothing to mail");
    // A second pass is a trace of its own, and a failed batch says so.
    services.pipeline.register_one("B0003", true);
    services.indexed();
    services.pipeline.configure("[settings]\nbehaviour = \"fail\"\n");
    let second = services.pass(&otel);
    assert_eq!(second.code, Some(1), "{}", second.show());
    services.stop();
    // Their logs are what they are without telemetry: the spans are the collector's.
    for (process, up) in [(&services.store, "store service up"), (&services.index, "sboi service up")] {
        let logs = process.logs();
        assert!(logs.contains(up) && !logs.contains("pass{") && !logs.contains("request{"), "{logs}");
    }

    // Every sender has exited, having exported on its way out: all is here (the deadline only
    // guards against a receiver that is still decoding).
    let complete = |spans: &[Received]| {
        let services: BTreeSet<&str> = spans.iter().map(|span| span.service.as_str()).collect();
        ["probe-component", "autocomp-store", "sboi"].iter().all(|name| services.contains(name))
    };
    assert!(wait_until(Instant::now() + Duration::from_secs(10), || complete(&collector.spans())));
    let spans = collector.spans();
    assert!(
        collector.requests().iter().all(|request| request == "/v1/traces (protobuf)"),
        "{:?}",
        collector.requests()
    );

    let passes: Vec<&Received> = spans.iter().filter(|span| span.name == "pass").collect();
    assert_eq!(passes.len(), 2, "one pass span per pass:\n{}", show(&spans));
    assert_ne!(passes[0].trace, passes[1].trace, "each pass is a trace of its own");
    for pass in &passes {
        assert_eq!(pass.service, "probe-component");
        assert!(pass.parent.is_empty(), "a pass is a trace's root: {pass:?}");
        assert_eq!(pass.attribute("autocomp.component"), Some("probe"));
        assert!(pass.attribute("host.name").is_some_and(|host| !host.is_empty()), "{pass:?}");
    }
    let by_outcome =
        |outcome: &str| passes.iter().copied().find(|pass| pass.attribute("autocomp.pass.outcome") == Some(outcome));
    let (ok, failed) = (by_outcome("ok").expect("the first pass"), by_outcome("failed").expect("the second pass"));
    assert_eq!(ok.attribute("autocomp.pass.batches"), Some("2"));

    for (pass, expected) in
        [(ok, vec![("B0001", "success"), ("B0002", "success")]), (failed, vec![("B0003", "failure")])]
    {
        let trace = of_trace(&spans, &pass.trace);
        let mut batches: Vec<(&str, &str)> = trace
            .values()
            .filter(|span| span.name == "batch")
            .map(|batch| {
                assert_eq!(batch.parent, pass.id, "a batch is a child of its pass: {batch:?}");
                assert_eq!(batch.attribute("autocomp.component"), Some("probe"));
                let steps: BTreeSet<&str> =
                    trace.values().filter(|span| span.parent == batch.id).map(|span| span.name.as_str()).collect();
                assert!(steps.contains("work") && steps.contains("append"), "{steps:?} under {batch:?}");
                assert!(batch.events.iter().any(|event| event == "claimed"), "{batch:?}");
                let failed = batch.attribute("autocomp.outcome") == Some("failure");
                assert_eq!(batch.error, failed, "a failed batch's span, and only one, has an error status: {batch:?}");
                (batch.attribute("autocomp.batch_id").unwrap(), batch.attribute("autocomp.outcome").unwrap())
            })
            .collect();
        batches.sort();
        assert_eq!(batches, expected, "{}", show(&spans));
        assert!(trace.values().any(|span| span.name == "claim" && span.parent == pass.id), "{}", show(&spans));

        // The services' spans of this pass: in its trace, under it, named by the operation.
        let served = |service: &str| -> BTreeSet<&str> {
            let served: Vec<&&Received> =
                trace.values().filter(|span| span.service == service && span.kind == SERVER).collect();
            for span in &served {
                assert!(descends_from(&trace, span, &pass.id), "{service} span outside its pass: {span:?}");
                assert_eq!(span.attribute("http.response.status_code"), Some("200"), "{span:?}");
            }
            served.iter().map(|span| span.name.as_str()).collect()
        };
        let store = served("autocomp-store");
        for operation in ["steering", "claim_ready", "append_event", "record_pass"] {
            assert!(store.contains(operation), "no store {operation} in the pass's trace: {store:?}");
        }
        assert!(served("sboi").contains("query"), "no sboi query in the pass's trace:\n{}", show(&spans));
        // A store write's span sits under the component's call that made it.
        let append = trace
            .values()
            .find(|span| span.service == "autocomp-store" && span.name == "append_event")
            .expect("an append_event");
        let call = trace.get(&append.parent).expect("the client's call span");
        assert_eq!((call.service.as_str(), call.name.as_str()), ("probe-component", "append_event"));
        assert_eq!(trace.get(&call.parent).map(|span| span.name.as_str()), Some("append"));
    }
    // What no pass asked for is not traced: the index following the store's change feed
    // sends no traceparent, so every store span belongs to a pass.
    let pass_traces: BTreeSet<&Vec<u8>> = passes.iter().map(|pass| &pass.trace).collect();
    let stray: Vec<&Received> = spans.iter().filter(|span| !pass_traces.contains(&span.trace)).collect();
    assert!(stray.is_empty(), "spans outside the passes' traces:\n{}", show(&spans));
}

#[test]
fn without_the_variables_or_with_the_sdk_disabled_nothing_is_sent() {
    let collector = Collector::start();
    // The services have it on: they would trace any request that came with a traceparent.
    let otel = [("OTEL_EXPORTER_OTLP_ENDPOINT", collector.url.as_str())];
    let mut services = OverServices::start(1, &otel);
    services.pipeline.configure("[settings]\nbehaviour = \"succeed\"\n");
    let off = services.pass(&[]);
    assert_eq!(off.code, Some(0), "{}", off.show());
    assert!(off.stdout.contains("B0001"), "the pass worked: {}", off.show());
    services.pipeline.register_one("B0002", true);
    services.indexed();
    let disabled =
        services.pass(&[("OTEL_EXPORTER_OTLP_ENDPOINT", collector.url.as_str()), ("OTEL_SDK_DISABLED", "true")]);
    assert_eq!(disabled.code, Some(0), "{}", disabled.show());
    assert!(disabled.stdout.contains("B0002"), "the pass worked: {}", disabled.show());
    // Nothing a process leaves to its exit: once all three are gone, all they sent is here.
    services.stop();
    assert_eq!(collector.requests(), Vec::<String>::new(), "{}", show(&collector.spans()));
    for finished in [&off, &disabled] {
        assert!(!finished.stderr.contains("OpenTelemetry"), "nothing said of it: {}", finished.show());
    }
}

#[test]
fn a_collector_that_refuses_or_never_answers_costs_a_pass_one_warning_and_at_most_its_timeout() {
    // Nothing listens on `refused`'s port; `silent` completes connections (the kernel's backlog)
    // and never answers.
    let refused = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_url = format!("http://{}", silent.local_addr().unwrap());
    let refused_url = format!("http://{refused}");
    for (endpoint, timeout) in [(refused_url.as_str(), "2000"), (silent_url.as_str(), "500")] {
        let pipeline = Pipeline::new(PROBE);
        let ids = pipeline.register(2);
        pipeline.configure("[settings]\nbehaviour = \"succeed\"\n");
        let mut command = pipeline.command(&[]);
        with_otel(&mut command, &[("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint), ("OTEL_EXPORTER_OTLP_TIMEOUT", timeout)]);
        let pass = finish(command.spawn().expect("the probe starts"), Duration::from_secs(60));
        assert_eq!(pass.code, Some(0), "{endpoint}: {}", pass.show());
        for id in &ids {
            assert_eq!(pipeline.events(id, autocomp_e2e::PROBED).len(), 1, "{endpoint}: {id} recorded");
        }
        let warnings: Vec<&str> = pass.stderr.lines().filter(|line| line.contains("OpenTelemetry")).collect();
        assert_eq!(warnings.len(), 1, "{endpoint}: one warning, and only about this: {}", pass.show());
        assert!(warnings[0].contains("WARN"), "{}", pass.show());
        assert_eq!(pass.stderr.lines().count(), 1, "{endpoint}: nothing else on stderr: {}", pass.show());
        // The export runs beside the pass; only the exit waits for it, at most the timeout.
        let bound = Duration::from_millis(timeout.parse::<u64>().unwrap()) + Duration::from_secs(5);
        assert!(pass.elapsed < bound, "{endpoint}: {:?} for a pass of two quick batches", pass.elapsed);
    }
    drop(silent);
}
