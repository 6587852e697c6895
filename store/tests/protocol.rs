//! Releases talking across an upgrade, against what an earlier release really said: the
//! requests a client of that release sent and the answers its store service gave, recorded
//! when the release was cut (`store/tests/data/protocol/<release>.json`, written by
//! `scripts/record-protocol`), every operation of the store's port once or more.
//!
//! - An older client against this service: each recorded request, sent as recorded, gets an
//!   answer of the same status and shape (the same keys, recursively, and the same JSON types).
//! - This client against an older service: the scenario the recording was made with, run by
//!   this release's `HttpStore` against a server answering what the older service answered,
//!   reads every answer; an operation the older service lacks is one refusal naming the
//!   upgrade order.
//! - A service that says what it offers (`GET /protocol`): an operation it lacks is refused
//!   before it is sent, and a watcher's concerning wait falls back to waiting for every change.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use autocomp_model::*;
use autocomp_store::*;
use autocomp_test_servers::recording::{self, Call, Recording, Replay, recording_proxy, replay_server};
use serde_json::{Value, json};

use super::service::{Service, TOKEN};

/// The recordings kept, one per release cut (the newest last).
const RECORDINGS: &[&str] = &["0.1.0-protocol-1"];

fn recording_path(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/protocol").join(format!("{name}.json"))
}

fn agent(text: &str) -> Agent {
    Agent::new(text).unwrap()
}

fn holder(name: &str) -> RunHolder {
    RunHolder { agent: agent(&format!("{name}/1.0@h#1")), host: "h".into(), pid: 1, claim_key: None, liveness: None }
}

fn checker() -> ComponentDescriptor {
    serde_json::from_value(json!({
        "name": "checker", "version": "1.0.0", "event_type": "Checked",
        "trigger": {"requires": ["Received"], "blocked_by": ["Checked"]},
        "max_attempts": 3, "retry_backoff": "5m", "queue_size": 10, "max_runtime": "1h",
    }))
    .unwrap()
}

/// The scenario every recording is made with: every operation of the port, as a client of
/// this release calls it. Each call must succeed, but the new ones a recording's release
/// lacked (`newer`), which must be refused naming the upgrade order.
pub(crate) async fn scenario(store: &HttpStore, newer: &[&str]) {
    let id = |text: &str| BatchId::new(text).unwrap();
    let ty = |text: &str| EventType::new(text).unwrap();
    let c = ComponentName::new("checker").unwrap();
    let new =
        |name: &str| NewBatch::new(id(name), BatchType::new("Delivery").unwrap()).with_location(format!("/in/{name}"));
    store.create_batch(new("B1")).await.unwrap();
    store.create_batch(new("B2")).await.unwrap();
    store.create_batch(new("B3")).await.unwrap();
    for batch in ["B1", "B2", "B3"] {
        let received = NewEvent::new(ty("Received"), Outcome::Success, agent("trigger/1.0"));
        store.append_event(&id(batch), received).await.unwrap();
    }
    store.get_batch(&id("B1")).await.unwrap();
    store.get_batches(&[id("B2"), id("B1")]).await.unwrap();
    store.list_batches(None, 10).await.unwrap();
    store.get_summaries(&[id("B1")]).await.unwrap();
    store.list_summaries(None, 10).await.unwrap();
    store.get_listings(&[id("B1")]).await.unwrap();
    store.batch_head(&id("B1")).await.unwrap();
    store.log_page(&id("B1"), LogCursor::Newest, 10).await.unwrap();
    store.set_priority(&id("B2"), 3).await.unwrap();
    let mut patch = serde_json::Map::new();
    patch.insert("pages".into(), json!(12));
    store.record_content_change(&id("B2"), patch).await.unwrap();

    let claim = store.claim(&id("B1"), &c, &holder("checker")).await.unwrap();
    store.run_state(&id("B1"), &c).await.unwrap();
    store.save_checkpoint(&id("B1"), &c, claim.generation(), json!({"at": 1})).await.unwrap();
    store.load_checkpoint(&id("B1"), &c).await.unwrap();
    let printed = RunOutput {
        streams: vec![OutputStream { name: "stdout".into(), head: "checking\n".into(), ..Default::default() }],
    };
    store.set_run_output(&id("B1"), &c, claim.generation(), Some(printed), false).await.unwrap();
    store.run_outputs(&id("B1")).await.unwrap();
    store.open_runs(Some(&c)).await.unwrap();
    let done = NewEvent::new(ty("Checked"), Outcome::Success, agent("checker/1.0@h#1"))
        .with_details(json!({"summary": "ok"}))
        .in_run(c.clone(), claim.generation());
    store.append_event(&id("B1"), done).await.unwrap();
    let many = store.claim_many(&[id("B2")], &c, &holder("checker")).await.unwrap();
    let generation = many[0].as_ref().unwrap().generation();
    store.release(&id("B2"), &c, generation).await.unwrap();
    store.failed_attempts(&id("B2"), &c, Seq::ZERO).await.unwrap();
    let request = ReadyClaimRequest {
        batches: vec![id("B3")],
        descriptor: checker(),
        holder: holder("checker"),
        force: false,
        known_steering: None,
        exclusive: false,
        takeovers: Vec::new(),
    };
    store.claim_ready(&request).await.unwrap();
    let cancel = NewEvent::new(ty("Checked"), Outcome::Failure, agent("operator:ann"))
        .with_details(json!({"cancelled": true, "reason": "hung"}));
    store.cancel_run(&id("B3"), &c, cancel).await.unwrap();
    let prioritized = NewEvent::new(ty("Prioritized"), Outcome::Success, agent("operator:ann"));
    store.prioritize(&id("B3"), 5, prioritized).await.unwrap();
    let head = store.head().await.unwrap();
    store.changes(Seq::ZERO, 100).await.unwrap();
    store.about().await.unwrap();
    store.count_batches().await.unwrap();
    store.wait_for_change(head, Duration::from_millis(1)).await.unwrap();
    let interest = ChangeInterest::Types([ty("Checked")].into_iter().collect());
    store.wait_for_change_concerning(head, &interest, Duration::from_millis(1)).await.unwrap();

    let work = vec![WorkDone { result: WorkResult::Success, duration_ms: 12 }];
    let ended = PassPhase::Ended { outcome: PassOutcome::Ok, summary: "1 ok".into(), duration_ms: 40, work };
    store.record_pass(PassRecord { descriptor: checker(), host: "h".into(), phase: ended }).await.unwrap();
    store.components().await.unwrap();
    store.record_backlog(vec![BacklogSample { component: c.clone(), ready: 2 }]).await.unwrap();
    store.work_series(SeriesStep::Minute, Timestamp(0), None).await.unwrap();
    store.retire_component(&c, &agent("operator:ann"), "replaced").await.unwrap();
    let pause = SteeringRequest {
        change: SteeringChange::Pause { component: Some(c.clone()), drain: false },
        by: agent("operator:ann"),
        reason: "maintenance".into(),
        expect_version: None,
    };
    store.steer(pause).await.unwrap();
    store.steering().await.unwrap();
    store.steering_log(10).await.unwrap();
    let notice = serde_json::from_value::<NewNotice>(json!({
        "key": "n-1", "channel": "mail", "subject": "checker failed", "body": {"text": "B3"}
    }))
    .unwrap();
    store.enqueue_notices(vec![notice], None).await.unwrap();
    store.take_notices("notifier", 10, Duration::from_secs(60)).await.unwrap();
    store.settle_notice("n-1", "notifier", NoticeOutcome::Sent).await.unwrap();
    store.recent_notices(10).await.unwrap();

    // Operations a recording's release may lack: refused in one line naming the order.
    let histories = store.histories(&[id("B1")]).await;
    if newer.contains(&"histories") {
        let refused = histories.unwrap_err();
        assert!(
            matches!(&refused, StoreError::ServiceOlder(m) if m.contains("upgrade the services first")),
            "{refused}"
        );
    } else {
        assert_eq!(histories.unwrap().len(), 1);
    }
}

fn recorded(name: &str) -> Recording {
    recording::read(&recording_path(name))
}

/// Each recorded request, sent as recorded to this release's service over a fresh store, is
/// answered with the status and shape the older service answered (an operation the older
/// service did not know is answered now).
#[tokio::test]
async fn an_older_clients_requests_get_answers_of_the_shape_it_was_given() {
    for name in RECORDINGS {
        let recording = recorded(name);
        let dir = tempfile::tempdir().unwrap();
        let service = Service::start(&dir.path().join("store.db"));
        recording::replay_requests(name, &recording, &service.url(), TOKEN).await;
    }
}

/// This release's client reads every answer an older service gave, and is refused, once and
/// naming the upgrade order, the operation that service did not have.
#[tokio::test]
async fn this_client_reads_an_older_services_answers_and_names_the_upgrade_order_for_what_it_lacks() {
    for name in RECORDINGS {
        let recording = recorded(name);
        let newer: Vec<&str> = recording
            .calls
            .iter()
            .filter(|call| call.answer["error"]["kind"] == "unknown_operation")
            .map(|call| call.operation.as_str())
            .collect();
        let replay = Replay::new(recording.protocol.clone(), recording.calls.iter().cloned());
        let address = replay_server(Arc::clone(&replay)).await;
        let store = HttpStore::with_token(&format!("http://{address}"), Some(TOKEN.into())).unwrap();
        scenario(&store, &newer).await;
        assert!(replay.calls.lock().unwrap().is_empty(), "{name}: every recorded call was asked");
    }
}

/// A service that lists what it offers: an operation it lacks is refused without being sent;
/// a watcher's concerning wait, which it lacks too, becomes a wait for every change, and a
/// registration with its first event a create and an append.
#[tokio::test]
async fn an_operation_a_service_does_not_offer_is_refused_before_it_is_sent_or_falls_back() {
    let offered = autocomp_http::protocol::Offered {
        service: "store".into(),
        release: "0.0.9".into(),
        protocol: 2,
        operations: ["head", "wait_for_change", "create_batch", "append_event"].map(str::to_owned).to_vec(),
    };
    let (b1, at) = (BatchId::new("B1").unwrap(), Timestamp(1_700_000_000_000));
    let received = NewEvent::new(EventType::new("Data_Received").unwrap(), Outcome::Success, Agent::new("t").unwrap());
    let created = Batch {
        id: b1.clone(),
        batch_type: BatchType::new("Delivery").unwrap(),
        priority: 0,
        metadata: Default::default(),
        created_seq: Seq(9),
        modified_seq: Seq(9),
        changed_seq: Seq(9),
        created_at: at,
        modified_at: at,
        events: Vec::new(),
        open_runs: Vec::new(),
        as_of: at,
    };
    let appended = received.clone().recorded(&b1, Seq(10), at);
    let calls = [
        Call { operation: "head".into(), request: json!({}), status: 200, answer: json!({"head": 7}) },
        Call { operation: "wait_for_change".into(), request: json!({}), status: 200, answer: json!({"head": 8}) },
        Call {
            operation: "create_batch".into(),
            request: json!({}),
            status: 200,
            answer: json!({"created": true, "batch": created}),
        },
        Call { operation: "append_event".into(), request: json!({}), status: 200, answer: json!(appended) },
    ];
    let protocol = Call { operation: "protocol".into(), request: Value::Null, status: 200, answer: json!(offered) };
    let replay = Replay::new(protocol, calls);
    let address = replay_server(Arc::clone(&replay)).await;
    let store = HttpStore::with_token(&format!("http://{address}"), Some(TOKEN.into())).unwrap();
    assert_eq!(store.head().await.unwrap(), Seq(7));
    let refused = store.histories(&[BatchId::new("B1").unwrap()]).await.unwrap_err();
    let StoreError::ServiceOlder(message) = &refused else { panic!("{refused:?}") };
    assert!(message.contains("runs release 0.0.9 (protocol 2), which does not offer histories"), "{message}");
    assert!(message.contains("upgrade the services first"), "{message}");
    let interest = ChangeInterest::Types([EventType::new("Checked").unwrap()].into_iter().collect());
    let woke = store.wait_for_change_concerning(Seq(7), &interest, Duration::from_millis(10)).await.unwrap();
    assert_eq!(woke, Seq(8), "answered by a wait for every change");
    let registered = store.register_batch(NewBatch::new(b1, created.batch_type.clone()), received).await.unwrap();
    let CreateOutcome::Created(registered) = registered else { panic!("{registered:?}") };
    assert_eq!(
        (registered.changed_seq, registered.events.clone()),
        (Seq(10), vec![appended]),
        "created, then appended"
    );
    let asked = ["head", "wait_for_change", "create_batch", "append_event"];
    assert_eq!(*replay.asked.lock().unwrap(), asked, "nothing it lacks was sent");
}

/// Records the scenario against the store service binary `$AUTOCOMP_RECORD_BINARY` into
/// `store/tests/data/protocol/$AUTOCOMP_RECORD_NAME.json`: run by `scripts/record-protocol`
/// when a release is cut, never by the suite.
#[tokio::test]
#[ignore = "writes a recording: scripts/record-protocol runs it when a release is cut"]
async fn record_a_release() {
    let binary = std::env::var("AUTOCOMP_RECORD_BINARY").expect("AUTOCOMP_RECORD_BINARY");
    let name = std::env::var("AUTOCOMP_RECORD_NAME").expect("AUTOCOMP_RECORD_NAME");
    let dir = tempfile::tempdir().unwrap();
    let service = Service::serve_binary(&binary, &format!("sqlite://{}", dir.path().join("store.db").display()));
    let upstream = service.url();
    let recorded = Arc::new(Mutex::new(Vec::<Call>::new()));
    let protocol = {
        let upstream = upstream.clone();
        tokio::task::spawn_blocking(move || recording::protocol_of(&upstream)).await.unwrap()
    };
    let address = recording_proxy(upstream, TOKEN, Arc::clone(&recorded)).await;
    let store = HttpStore::with_token(&format!("http://{address}"), Some(TOKEN.into())).unwrap();
    let newer: Vec<&str> = if protocol.status == 404 { vec!["histories"] } else { vec![] };
    scenario(&store, &newer).await;
    let calls = recorded.lock().unwrap().clone();
    let release = std::env::var("AUTOCOMP_RECORD_RELEASE").unwrap_or_else(|_| name.clone());
    recording::write(&recording_path(&name), &Recording { release, protocol, calls });
}
