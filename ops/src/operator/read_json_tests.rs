//! The JSON of the read commands (`show`, `show --event`, `show --all`, `status`, `explain`,
//! `ready`, `pipeline`, `locks`, `logs`), pinned whole on one realistic batch of a real SQLite
//! store: these documents are what scripts parse, so moving the code that writes them must
//! not change a byte. Times, ages and the host's process id vary from run to run and are
//! replaced by placeholders before comparing; everything else is compared as printed.
//! One change from the first pin: a run (`open_runs`, `open_run`) names its `batch`, as the
//! steering actions' runs did, now that every view prints a run as `RunView`.

use std::sync::Arc;

use crate::operator::three_steps_tests::{ThreeSteps, three_steps};
use autocomp_framework::locks::{HeldLock, LockHolder};
use autocomp_model::{
    Agent, BatchId, BatchType, ComponentName, EventType, NewBatch, NewEvent, Outcome, RunHolder, Timestamp,
};
use autocomp_store::ObjectStore;
use serde_json::{Value, json};

use crate::operator::{Format, LockView, LocksView, LogsQuery, Operator, TableFormat};

struct Fixture {
    operator: Operator,
    store: Arc<dyn ObjectStore>,
    _dir: tempfile::TempDir,
}

fn id(text: &str) -> BatchId {
    BatchId::new(text).unwrap()
}

fn ty(text: &str) -> EventType {
    EventType::new(text).unwrap()
}

/// A three-step pipeline; B1 received, verified (with a result), checked with a transient
/// failure that kept output, and checked again by a run still open; B2 only received.
async fn fixture() -> Fixture {
    let ThreeSteps { operator, store, dir } = three_steps().await;
    let agent = Agent::new("test").unwrap();
    let new = NewBatch::new(id("B1"), BatchType::new("RoundTrip").unwrap()).with_location("/data/b1").with_priority(3);
    store.create_batch(new).await.unwrap();
    store.create_batch(NewBatch::new(id("B2"), BatchType::new("RoundTrip").unwrap())).await.unwrap();
    for b in ["B1", "B2"] {
        let received = NewEvent::new(ty("Data_Received"), Outcome::Success, agent.clone());
        store.append_event(&id(b), received).await.unwrap();
    }
    let verified = NewEvent::new(ty("Verified"), Outcome::Success, agent.clone())
        .with_details(json!({"summary": "3 files match", "result": {"files": 3}}));
    store.append_event(&id("B1"), verified).await.unwrap();
    let checker = ComponentName::new("checker").unwrap();
    let holder = |pid| RunHolder {
        agent: Agent::new("checker/1@host1#7").unwrap(),
        host: "host1".into(),
        pid,
        claim_key: None,
        liveness: None,
    };
    let claim = store.claim(&id("B1"), &checker, &holder(7)).await.unwrap();
    let output = json!({"streams": [{"name": "stderr", "head": "timed out\n"}]});
    let failed = NewEvent::new(ty("Checked"), Outcome::Failure, Agent::new("checker/1@host1#7").unwrap())
        .with_details(json!({"transient": true, "summary": "no answer", "duration_ms": 1500, "output": output}))
        .in_run(checker.clone(), claim.generation());
    store.append_event(&id("B1"), failed).await.unwrap();
    store.claim(&id("B1"), &checker, &holder(8)).await.unwrap();
    Fixture { operator, store, _dir: dir }
}

/// Times, ages and process ids as placeholders; the rest as is.
fn steady(value: Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.into_iter()
                .map(|(key, value)| {
                    let varies = matches!(key.as_str(), "age_seconds" | "seconds_since_last_seen" | "pid")
                        || (key.ends_with("_ms") && key != "duration_ms");
                    (key, if varies && value.is_number() { json!(0) } else { steady(value) })
                })
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.into_iter().map(steady).collect()),
        Value::String(text) if humantime::parse_rfc3339(&text).is_ok() => json!("<time>"),
        other => other,
    }
}

/// A printed document, parsed and made steady; the text must be exactly the document
/// re-printed (pretty, a newline at the end).
fn document(text: &str) -> Value {
    let value: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert_eq!(text, format!("{value:#}\n"), "printed as a pretty document");
    steady(value)
}

#[tokio::test]
async fn show_prints_this_json() {
    let f = fixture().await;
    let shown = document(&f.operator.show(&id("B1")).await.unwrap().render(Format::Json));
    assert_eq!(shown, pinned(SHOW), "{shown:#}");
    let event = document(&f.operator.show_event(&id("B1"), 5).await.unwrap());
    assert_eq!(event, pinned(SHOW_EVENT), "{event:#}");
    assert_eq!(event, pinned(SHOW)["events"][1], "--event prints the event as the page lists it");
    let mut all = Vec::new();
    f.operator.show_all(&id("B1"), Format::Json, &mut all).await.unwrap();
    let all: Value = steady(serde_json::from_slice(&all).unwrap());
    assert_eq!(all, pinned(SHOW), "{all:#}");
    let _ = &f.store;
}

#[tokio::test]
async fn explain_and_ready_print_this_json() {
    let f = fixture().await;
    let checker = ComponentName::new("checker").unwrap();
    let explained = f.operator.explain(&id("B1"), &checker).await.unwrap();
    let explained = document(&explained.render(Format::Json));
    assert_eq!(explained, pinned(EXPLAIN), "{explained:#}");
    let verifier = ComponentName::new("verifier").unwrap();
    let ready = document(&f.operator.ready(&verifier).await.unwrap().render(Format::Json));
    assert_eq!(ready, pinned(READY), "{ready:#}");
}

#[tokio::test]
async fn status_and_pipeline_print_this_json() {
    let f = fixture().await;
    let status = document(&f.operator.status(None, None).await.unwrap().render(TableFormat::Json));
    assert_eq!(status, pinned(STATUS), "{status:#}");
    let pipeline = document(&f.operator.pipeline_view().await.unwrap().render(Format::Json));
    assert_eq!(pipeline, pinned(PIPELINE), "{pipeline:#}");
}

#[test]
fn locks_print_this_json() {
    let holder = LockHolder { agent: "checker/1@host1#7".into(), host: "host1".into(), pid: 7, since: Timestamp(0) };
    let locks = vec![
        HeldLock { path: "batch/checker/B1".into(), holder: Some(holder), foreign: None },
        HeldLock { path: "poll/checker".into(), holder: None, foreign: None },
        HeldLock { path: "batch/checker/B9".into(), holder: None, foreign: Some("a persistent node".into()) },
    ];
    let view = LocksView { locks: locks.into_iter().map(|lock| LockView { lock, age: None }).collect(), stale: None };
    let printed = document(&view.render(Format::Json));
    assert_eq!(printed, pinned(LOCKS), "{printed:#}");
}

#[tokio::test]
async fn logs_print_this_json() {
    let f = fixture().await;
    let mut out = Vec::new();
    f.operator.logs(&id("B1"), &LogsQuery::default(), Format::Json, &mut out).await.unwrap();
    let text = String::from_utf8(out).unwrap();
    let printed: Value = steady(serde_json::from_str(&text).unwrap());
    assert_eq!(printed, pinned(LOGS), "{printed:#}");
    // One attempt a line, as the array is written while the log is read.
    assert!(text.starts_with("[\n  {\"at\":") && text.ends_with("}\n]\n"), "{text}");
}

fn pinned(text: &str) -> Value {
    serde_json::from_str(text).unwrap()
}

/// `explain` as printed before its code moved (steady); since: `contract_broken`.
const EXPLAIN: &str = r#"{"as_of":"<time>","batch_lock":null,"clauses":[{"clause":"requires Verified","index":true,"store":true},{"clause":"blocked_by Checked","index":false,"store":false}],"component":"checker","contract_broken":null,"event_type":"Checked","failed_attempts":1,"held":null,"held_up_by":[],"id":"B1","index_cursor":8,"manual":false,"max_attempts":3,"next":null,"open_run":{"agent":"checker/1@host1#7","batch":"B1","claim_seq":8,"component":"checker","generation":2,"host":"host1","pid":0,"started_at":"<time>"},"poll_lock":null,"pool_wait":null,"ready_in_index":false,"ready_in_store":false,"refusal":{"clause":"retry_backoff","reason":"its transient failure (seq 7) is retried once the batch has been quiet for 5m (retry_backoff)","retrying":true},"result":{"agent":"checker/1@host1#7","at":"<time>","outcome":"failure","seq":7},"retry":{"backoff_seconds":300,"clauses":[{"clause":"requires Verified","index":true,"store":true},{"clause":"transiently_failed Checked","index":true,"store":true},{"clause":"settled_for 5m","index":false,"store":false}],"failure_seq":7,"opens_at":"<time>","ready_in_index":false,"ready_in_store":false},"state":"working","store_head":8,"verdict":"working: run 2 held by checker/1@host1#7"}"#;

/// `locks` as printed before its code moved (steady).
const LOCKS: &str = r#"[{"age_seconds":0,"agent":"checker/1@host1#7","foreign":null,"host":"host1","path":"batch/checker/B1","pid":0,"since":"<time>"},{"agent":null,"foreign":null,"path":"poll/checker"},{"agent":null,"foreign":"a persistent node","path":"batch/checker/B9"}]"#;

/// `logs` as printed before its code moved (steady).
/// Since: `run` (the attempt's claim generation) and its flags (`transient`) added.
const LOGS: &str = r#"[{"at":"<time>","attempt":1,"component":"checker","duration_ms":1500,"outcome":"failure","output":{"streams":[{"head":"timed out\n","name":"stderr"}]},"run":1,"seq":7,"transient":true}]"#;

/// `pipeline` as printed before its code moved (steady).
const PIPELINE: &str = r#"{"components":[{"changed_at":"<time>","descriptor":{"event_type":"Verified","max_attempts":3,"max_runtime":"1h","name":"verifier","queue_size":10,"retry_backoff":"5m","trigger":{"batches":[],"blocked_by":["Verified"],"repeat_on_change":[],"requires":["Data_Received"],"transiently_failed":[],"types":[]},"version":"1.0.0"},"hosts":[{"duration_ms":1,"host":"host1","last_seen":"<time>","outcome":"idle","pass_ended_at":"<time>","pass_started_at":"<time>","summary":"","version":"1.0.0"}],"last_seen":"<time>","registered_at":"<time>","retired":null,"seconds_since_last_seen":0,"work":{"last_hour":{"failure":{"buckets":[0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0],"duration_ms_sum":0,"results":0},"success":{"buckets":[0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0],"duration_ms_sum":0,"results":0},"transient":{"buckets":[0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0],"duration_ms_sum":0,"results":0}},"total":{"failure":{"buckets":[0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0],"duration_ms_sum":0,"results":0},"success":{"buckets":[0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0],"duration_ms_sum":0,"results":0},"transient":{"buckets":[0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0],"duration_ms_sum":0,"results":0}}}},{"changed_at":"<time>","descriptor":{"event_type":"Checked","max_attempts":3,"max_runtime":"1h","name":"checker","queue_size":10,"retry_backoff":"5m","trigger":{"batches":[],"blocked_by":["Checked"],"repeat_on_change":[],"requires":["Verified"],"transiently_failed":[],"types":[]},"version":"1.0.0"},"hosts":[{"duration_ms":1,"host":"host1","last_seen":"<time>","outcome":"idle","pass_ended_at":"<time>","pass_started_at":"<time>","summary":"","version":"1.0.0"}],"last_seen":"<time>","registered_at":"<time>","retired":null,"seconds_since_last_seen":0,"work":{"last_hour":{"failure":{"buckets":[0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0],"duration_ms_sum":0,"results":0},"success":{"buckets":[0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0],"duration_ms_sum":0,"results":0},"transient":{"buckets":[0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0],"duration_ms_sum":0,"results":0}},"total":{"failure":{"buckets":[0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0],"duration_ms_sum":0,"results":0},"success":{"buckets":[0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0],"duration_ms_sum":0,"results":0},"transient":{"buckets":[0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0],"duration_ms_sum":0,"results":0}}}},{"changed_at":"<time>","descriptor":{"event_type":"Archived","max_attempts":3,"max_runtime":"1h","name":"archiver","queue_size":10,"retry_backoff":"5m","trigger":{"batches":[],"blocked_by":["Archived"],"repeat_on_change":[],"requires":["Checked"],"transiently_failed":[],"types":[]},"version":"1.0.0"},"hosts":[{"duration_ms":1,"host":"host1","last_seen":"<time>","outcome":"idle","pass_ended_at":"<time>","pass_started_at":"<time>","summary":"","version":"1.0.0"}],"last_seen":"<time>","registered_at":"<time>","retired":null,"seconds_since_last_seen":0,"work":{"last_hour":{"failure":{"buckets":[0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0],"duration_ms_sum":0,"results":0},"success":{"buckets":[0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0],"duration_ms_sum":0,"results":0},"transient":{"buckets":[0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0],"duration_ms_sum":0,"results":0}},"total":{"failure":{"buckets":[0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0],"duration_ms_sum":0,"results":0},"success":{"buckets":[0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0],"duration_ms_sum":0,"results":0},"transient":{"buckets":[0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0],"duration_ms_sum":0,"results":0}}}}],"contracts":[],"now":"<time>","steering":{"version":0},"steering_log":[]}"#;

/// `ready` as printed before its code moved (steady).
const READY: &str = r#"[{"id":"B2","priority":0,"verdict":"would claim","would_claim":true}]"#;

/// `show` as printed before its code moved (steady).
const SHOW: &str = r#"{"as_of":"<time>","components":{"archiver":"waiting","checker":"working","verifier":"success"},"created_at":"<time>","created_seq":1,"effective":{"Checked":{"outcome":"failure","seq":7},"Data_Received":{"outcome":"success","seq":3},"Verified":{"outcome":"success","seq":5}},"events":[{"agent":"test","at":"<time>","details":{},"outcome":"success","seq":3,"type":"Data_Received"},{"agent":"test","at":"<time>","details":{"result":{"files":3},"summary":"3 files match"},"outcome":"success","seq":5,"type":"Verified"},{"agent":"checker/1@host1#7","at":"<time>","details":{"duration_ms":1500,"output":{"streams":[{"head":"timed out\n","name":"stderr"}]},"summary":"no answer","transient":true},"outcome":"failure","run":{"component":"checker","generation":1},"seq":7,"type":"Checked"}],"id":"B1","location":"/data/b1","log":{"newer_after":null,"older_before":null,"older_command":null,"shown":3,"total":3},"metadata":{"location":"/data/b1"},"modified_at":"<time>","modified_seq":1,"next":null,"older_results":[],"open_runs":[{"agent":"checker/1@host1#7","batch":"B1","claim_seq":8,"component":"checker","generation":2,"host":"host1","pid":0,"started_at":"<time>"}],"priority":3,"stored_bytes":194,"timeline":{"basis":"an attempt's start is its result's time minus the report's duration_ms (an open run's: its claim)","events_read":3,"events_total":3,"first_event_at":"<time>","last_result_at":"<time>","steps":[{"abandoned_runs":0,"attempts":[{"end":"<time>","flags":[],"generation":null,"outcome":"success","ran_ms":0,"ready_at":"<time>","seq":5,"start":"<time>","start_from":"result","state":"success","waited_ms":0}],"component":"verifier","event_type":"Verified","ran_ms":0,"ready_at":"<time>","state":"success","waited_ms":0},{"abandoned_runs":0,"attempts":[{"end":"<time>","flags":["transient"],"generation":1,"outcome":"failure","ran_ms":0,"ready_at":"<time>","seq":7,"start":"<time>","start_from":"report","state":"retrying","waited_ms":0},{"end":null,"flags":[],"generation":2,"outcome":"working","ran_ms":0,"ready_at":"<time>","seq":null,"start":"<time>","start_from":"claim","state":"working","waited_ms":0}],"component":"checker","event_type":"Checked","ran_ms":0,"ready_at":"<time>","state":"working","waited_ms":0},{"abandoned_runs":0,"attempts":[],"component":"archiver","event_type":"Archived","ran_ms":0,"ready_at":null,"state":null,"waited_ms":null}],"total_ms":0},"type":"RoundTrip","verdict":"working: checker"}"#;

/// `show_event` as printed before its code moved (steady).
const SHOW_EVENT: &str = r#"{"agent":"test","at":"<time>","details":{"result":{"files":3},"summary":"3 files match"},"outcome":"success","seq":5,"type":"Verified"}"#;

/// `status` as printed before its code moved (steady).
const STATUS: &str = r#"[{"components":{"archiver":"waiting","checker":"working","verifier":"success"},"id":"B1"},{"components":{"archiver":"waiting","checker":"waiting","verifier":"ready"},"id":"B2"}]"#;
