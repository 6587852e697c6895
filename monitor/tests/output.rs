//! A run's output on the monitor's batch page (a real embedded pipeline, called through its
//! router): an `autocomp-exec`-like failure whose stderr holds markup, an escape sequence and
//! a NUL shows it escaped and visible, in its attempt's open `<details>`, and its last lines
//! beside the verdict.

use crate::support;

use autocomp_model::{
    Agent, BatchType, ComponentName, EventType, NewBatch, NewEvent, Outcome, OutputStream, RunHolder, RunOutput,
    Trigger,
};
use autocomp_monitor::data::{Monitor, Settings};
use autocomp_monitor::web::{self, WebOptions};
use autocomp_ops::operator::Operator;
use autocomp_store::ObjectStore;
use axum::http::StatusCode;
use serde_json::json;
use std::sync::Arc;
use support::{id, temp_pipeline};

const HOST: &str = "monitor.test:7072";

async fn get(router: &axum::Router, uri: &str) -> (StatusCode, String) {
    support::get_as(router, HOST, [127, 0, 0, 1], uri).await
}

/// A pipeline whose step `ocr` (recording Ocr_Done, after Data_Received) is registered, with
/// batch B1 ready for it; and the agent its runs are held by.
async fn ready_for_ocr() -> (Operator, Arc<dyn ObjectStore>, tempfile::TempDir, Agent) {
    let (operator, store, dir) = temp_pipeline(None).await;
    let trigger = Trigger::builder().requires("Data_Received").build();
    autocomp_framework::testing::register_component(store.as_ref(), "ocr", "Ocr_Done", trigger).await;
    let agent = Agent::new("ocr/0.1.0@h#1").unwrap();
    store.create_batch(NewBatch::new(id("B1"), BatchType::new("RoundTrip").unwrap())).await.unwrap();
    let received = NewEvent::new(EventType::new("Data_Received").unwrap(), Outcome::Success, agent.clone());
    store.append_event(&id("B1"), received).await.unwrap();
    (operator, store, dir, agent)
}

#[tokio::test]
async fn a_failed_commands_stderr_is_shown_escaped_on_the_batch_page() {
    let (operator, store, _dir, agent) = ready_for_ocr().await;

    // What autocomp-exec records for `sh -c '...; exit 1'`.
    let ocr = ComponentName::new("ocr").unwrap();
    let holder = RunHolder { agent: agent.clone(), host: "h".into(), pid: 1, claim_key: None, liveness: None };
    let generation = store.claim(&id("B1"), &ocr, &holder).await.unwrap().generation();
    let stream = |name: &str, head: &str| OutputStream { name: name.into(), head: head.into(), ..Default::default() };
    let output = RunOutput {
        streams: vec![
            stream("stdout", "reading pages\n"),
            stream("stderr", "nul\0byte \u{1b}[31mred <script>alert(1)</script>\nfatal: page 7 is unreadable\n"),
        ],
    };
    let details = json!({
        "duration_ms": 1200,
        "failures": [{"reference": "sh", "type": "exit_status", "description": "fatal: page 7 is unreadable"}],
        "failures_total": 1,
        "failures_cap": 100,
        "summary": "`sh` exited with status 1",
        "output": output,
    });
    let result = NewEvent::new(EventType::new("Ocr_Done").unwrap(), Outcome::Failure, agent.clone())
        .with_details(details)
        .in_run(ocr.clone(), generation);
    store.append_event(&id("B1"), result).await.unwrap();

    let monitor = Monitor::new(operator, Settings::default());
    let router = web::router(monitor, WebOptions { host_names: vec![HOST.into()], ..WebOptions::default() });
    let (status, page) = get(&router, "/batches/B1").await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(!page.contains('\u{1b}') && !page.contains('\0'), "no raw control character reaches the page");
    assert!(!page.contains("<script>alert(1)"), "markup from the output is escaped");
    let escaped = "nul\\u0000byte \\u001b[31mred &lt;script&gt;alert(1)&lt;/script&gt;\nfatal: page 7 is unreadable\n";
    assert!(page.contains(escaped), "{page}");
    assert!(page.contains("<h2 id=\"output\">Run output</h2>"), "{page}");
    assert!(page.contains("\" open><summary><code>ocr</code> run "), "the failed attempt is open: {page}");
    assert!(page.contains("<strong>stderr</strong>"), "stderr is marked: {page}");
    assert!(page.contains("reading pages\n</pre>"), "stdout too: {page}");
    assert!(!page.contains("&quot;head&quot;"), "the full report leaves the output to its section: {page}");
    // Beside the verdict, before the Actions: the end of its stderr.
    let verdict = page.find("id=\"failed-ocr\"").expect("the verdict");
    let tail = page.find("verdict-output").expect("the stderr's end beside the verdict");
    assert!(verdict < tail && tail < page.find("id=\"actions\"").unwrap(), "{page}");
}

/// The ETag of `uri`'s answer, if it has one.
async fn etag_of(router: &axum::Router, uri: &str) -> Option<String> {
    use tower::ServiceExt;
    let mut request =
        axum::http::Request::get(uri).header(axum::http::header::HOST, HOST).body(axum::body::Body::empty()).unwrap();
    request.extensions_mut().insert(axum::extract::ConnectInfo(std::net::SocketAddr::from(([127, 0, 0, 1], 40_000))));
    let response = router.clone().oneshot(request).await.unwrap();
    response.headers().get(axum::http::header::ETAG).map(|tag| tag.to_str().unwrap().to_owned())
}

/// A going run's output so far is on the batch page, refreshed whole (no ETag to answer 304
/// while the store's head stands still), and once an operator cancels the run its output stays
/// in "Run output" beside the cancel.
#[tokio::test]
async fn a_going_runs_output_is_shown_so_far_and_a_cancelled_run_keeps_it() {
    let (operator, store, _dir, agent) = ready_for_ocr().await;
    let monitor = Monitor::new(operator, Settings::default());
    let router = web::router(monitor, WebOptions { host_names: vec![HOST.into()], ..WebOptions::default() });
    assert!(etag_of(&router, "/batches/B1").await.is_some(), "a batch nothing works on is tagged");

    let ocr = ComponentName::new("ocr").unwrap();
    let holder = RunHolder { agent: agent.clone(), host: "h".into(), pid: 1, claim_key: None, liveness: None };
    let generation = store.claim(&id("B1"), &ocr, &holder).await.unwrap().generation();
    let (_, page) = get(&router, "/batches/B1").await;
    assert!(page.contains("<h2 id=\"output-so-far\">Output so far</h2>"), "{page}");
    assert!(page.contains("<code>ocr</code> run 1: nothing saved yet"), "{page}");
    let printed = |text: &str| RunOutput {
        streams: vec![OutputStream { name: "stdout".into(), head: text.into(), ..Default::default() }],
    };
    store.set_run_output(&id("B1"), &ocr, generation, Some(printed("scanning page 1 <b>\n")), false).await.unwrap();
    let (_, page) = get(&router, "/batches/B1").await;
    assert!(page.contains("<code>ocr</code> run 1: running; saved at "), "{page}");
    assert!(page.contains("scanning page 1 &lt;b&gt;\n</pre>"), "{page}");
    assert_eq!(etag_of(&router, "/batches/B1").await, None, "refreshed whole while the run goes");

    let cancel =
        NewEvent::new(EventType::new("Ocr_Done").unwrap(), Outcome::Failure, Agent::new("operator:ann").unwrap())
            .with_details(json!({"cancelled": true, "summary": "cancelled by operator:ann: hung"}));
    store.cancel_run(&id("B1"), &ocr, cancel).await.unwrap();
    store
        .set_run_output(&id("B1"), &ocr, generation, Some(printed("scanning page 1\nscanning page 2\n")), true)
        .await
        .unwrap();
    let (_, page) = get(&router, "/batches/B1").await;
    assert!(!page.contains("id=\"output-so-far\""), "nothing goes any more: {page}");
    assert!(page.contains("(cancelled by an operator; its output until it stopped)"), "{page}");
    assert!(page.contains("scanning page 1\nscanning page 2\n</pre>"), "{page}");
    assert!(etag_of(&router, "/batches/B1").await.is_some(), "tagged again once nothing goes");
}
