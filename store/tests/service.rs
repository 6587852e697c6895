//! The store service as a real OS process on loopback, reached through `HttpStore` and raw
//! HTTP: the port behaves as the embedded adapter does, writes need the token, bad bodies
//! get a JSON 4xx and never a 500, and a restart mid-stream loses or doubles no append.

use std::collections::HashSet;
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use autocomp_test_servers::http1::{get, post};
use autocomp_test_servers::{XorShift, wait_for, wait_for_async};

use autocomp_http::api::Requests;
use autocomp_model::*;
use autocomp_store::http::operations::StoreRequest;
use autocomp_store::*;
use serde_json::{Value, json};

pub(crate) const TOKEN: &str = "s3cret-token";

/// A running `autocomp-store serve`, killed when dropped.
pub(crate) struct Service {
    child: Child,
    port: u16,
}

impl Service {
    pub(crate) fn start(db: &Path) -> Service {
        Self::start_on(db, free_port())
    }

    fn start_on(db: &Path, port: u16) -> Service {
        Self::start_with(db, port, &[])
    }

    pub(crate) fn start_with(db: &Path, port: u16, extra: &[&str]) -> Service {
        Self::serve(&format!("sqlite://{}?synchronous=normal", db.display()), port, extra)
    }

    /// The service of another release's binary (`autocomp-store` at `binary`) over `db_url`.
    pub(crate) fn serve_binary(binary: &str, db_url: &str) -> Service {
        Self::serve_with(binary, db_url, free_port(), &[])
    }

    /// The service over any database URL (a PostgreSQL one too).
    fn serve(db_url: &str, port: u16, extra: &[&str]) -> Service {
        Self::serve_with(env!("CARGO_BIN_EXE_autocomp-store"), db_url, port, extra)
    }

    fn serve_with(binary: &str, db_url: &str, port: u16, extra: &[&str]) -> Service {
        let child = Command::new(binary)
            .args(["serve", "--db", db_url])
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(extra)
            .env("AUTOCOMP_TOKEN", TOKEN)
            .stderr(Stdio::null())
            .spawn()
            .expect("start autocomp-store");
        let service = Service { child, port };
        service.wait_healthy();
        service
    }

    pub(crate) fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn wait_healthy(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        wait_for(deadline, &format!("the store service on {}", self.url()), || {
            get(&format!("{}/health", self.url())).map(|(status, _)| status) == Some(200)
        });
    }

    fn kill(&mut self) {
        self.child.kill().ok();
        self.child.wait().ok();
    }

    pub(crate) fn client(&self) -> HttpStore {
        HttpStore::with_token(&self.url(), Some(TOKEN.into())).unwrap()
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        self.kill();
    }
}

pub(crate) fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn id(text: &str) -> BatchId {
    BatchId::new(text).unwrap()
}
fn ty(text: &str) -> EventType {
    EventType::new(text).unwrap()
}
fn component(text: &str) -> ComponentName {
    ComponentName::new(text).unwrap()
}
fn agent(text: &str) -> Agent {
    Agent::new(text).unwrap()
}
fn holder() -> RunHolder {
    RunHolder { agent: agent("tester/1.0@host#1"), host: "host".into(), pid: 1, claim_key: None, liveness: None }
}
fn new_batch(name: &str) -> NewBatch {
    NewBatch::new(id(name), BatchType::new("Delivery").unwrap()).with_location(format!("/incoming/{name}"))
}

/// The answers of the embedded store on the same file, minus the read time.
fn same_batch(over_http: &Batch, embedded: &Batch) {
    let mut over_http = over_http.clone();
    over_http.as_of = embedded.as_of;
    assert_eq!(&over_http, embedded);
}

#[tokio::test]
async fn every_operation_answers_as_the_embedded_store_does() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("store.db");
    let service = Service::start(&db);
    let local = SqliteStore::open(&db).await.unwrap();
    every_operation_answers_as_the_store_behind_the_service(&service, &local).await;
}

#[tokio::test]
async fn every_operation_answers_as_postgresql_behind_the_service_does() {
    let url = autocomp_test_servers::postgres::shared().unique_database();
    let service = Service::serve(&url, free_port(), &[]);
    let local = PgStore::open(&url).await.unwrap();
    every_operation_answers_as_the_store_behind_the_service(&service, &local).await;
}

/// `claim_ready`'s contract through the service (one request per round), over each backend.
#[tokio::test]
async fn claim_ready_keeps_its_contract_through_the_service() {
    use crate::operations::ready_claims::*;
    let dir = tempfile::tempdir().unwrap();
    let service = Service::start(&dir.path().join("store.db"));
    let http = service.client();
    claim_ready_claims_the_ready_and_writes_nothing_for_the_rest(&http).await;
    a_hold_refuses_claim_ready_and_answers_the_steering(&http).await;
    a_retried_claim_ready_with_its_key_answers_the_runs_it_opened(&http).await;
    an_exclusive_claim_is_refused_a_batch_held_by_another_unless_it_takes_that_run_over(&http).await;
    a_retried_exclusive_claim_answers_the_run_it_opened_not_held(&http).await;
    the_liveness_a_claim_names_comes_back_with_its_run(&http).await;
    a_claim_that_is_not_exclusive_is_refused_a_batch_whose_open_run_is_its_lock(&http).await;
    a_claim_that_is_not_exclusive_still_abandons_an_open_run_without_a_liveness(&http).await;
    let url = autocomp_test_servers::postgres::shared().unique_database();
    let over_postgres = Service::serve(&url, free_port(), &[]);
    let http = over_postgres.client();
    claim_ready_claims_the_ready_and_writes_nothing_for_the_rest(&http).await;
    a_hold_refuses_claim_ready_and_answers_the_steering(&http).await;
    an_exclusive_claim_is_refused_a_batch_held_by_another_unless_it_takes_that_run_over(&http).await;
    the_liveness_a_claim_names_comes_back_with_its_run(&http).await;
    a_claim_that_is_not_exclusive_is_refused_a_batch_whose_open_run_is_its_lock(&http).await;
    a_claim_that_is_not_exclusive_still_abandons_an_open_run_without_a_liveness(&http).await;
    a_judged_claim_claims_only_what_is_as_judged(&http).await;
}

/// `register_batch`'s contract through the service, over each backend.
#[tokio::test]
async fn a_registration_keeps_its_contract_through_the_service() {
    use crate::operations::registrations::*;
    let dir = tempfile::tempdir().unwrap();
    let service = Service::start(&dir.path().join("store.db"));
    a_registration_records_the_batch_with_its_first_event_in_one_commit(&service.client()).await;
    let url = autocomp_test_servers::postgres::shared().unique_database();
    let over_postgres = Service::serve(&url, free_port(), &[]);
    a_registration_records_the_batch_with_its_first_event_in_one_commit(&over_postgres.client()).await;
}

/// Each port operation through the service, compared with what a direct client of the same
/// database reads.
async fn every_operation_answers_as_the_store_behind_the_service(service: &Service, local: &dyn ObjectStore) {
    let http = service.client();
    let archiver = component("archiver");

    assert!(matches!(http.create_batch(new_batch("B1")).await.unwrap(), CreateOutcome::Created(_)));
    assert!(matches!(http.create_batch(new_batch("B1")).await.unwrap(), CreateOutcome::AlreadyExists(_)));
    let conflict = http.create_batch(new_batch("B1").with_priority(9)).await.unwrap_err();
    assert!(matches!(conflict, StoreError::Conflict(_)), "{conflict}");
    http.create_batch(new_batch("B2")).await.unwrap();

    let claim = http.claim(&id("B1"), &archiver, &holder()).await.unwrap();
    assert_eq!(http.open_runs(Some(&archiver)).await.unwrap(), local.open_runs(Some(&archiver)).await.unwrap());
    http.save_checkpoint(&id("B1"), &archiver, claim.generation(), json!({"files": 3})).await.unwrap();
    assert_eq!(http.load_checkpoint(&id("B1"), &archiver).await.unwrap(), Some(json!({"files": 3})));
    let printed = RunOutput {
        streams: vec![OutputStream { name: "stdout".into(), head: "copied 3 files\n".into(), ..Default::default() }],
    };
    http.set_run_output(&id("B1"), &archiver, claim.generation(), Some(printed.clone()), false).await.unwrap();
    assert_eq!(http.run_outputs(&id("B1")).await.unwrap(), local.run_outputs(&id("B1")).await.unwrap());
    assert_eq!(http.run_outputs(&id("B1")).await.unwrap()[0].output, printed);
    let result = NewEvent::new(ty("Data_Archived"), Outcome::Success, agent("archiver/1.0"))
        .with_details(json!({"summary": "ok"}))
        .in_run(archiver.clone(), claim.generation());
    let event = http.append_event(&id("B1"), result.clone()).await.unwrap();
    let fenced = http.append_event(&id("B1"), result).await.unwrap_err();
    assert!(matches!(&fenced, StoreError::Fenced { generation, .. } if *generation == claim.generation()), "{fenced}");

    let second = http.claim(&id("B2"), &archiver, &holder()).await.unwrap();
    http.release(&id("B2"), &archiver, second.generation()).await.unwrap();
    http.release(&id("B2"), &archiver, second.generation()).await.expect("a repeated release is a no-op");
    http.set_priority(&id("B2"), 4).await.unwrap();
    let mut patch = serde_json::Map::new();
    patch.insert("pages".into(), json!(12));
    http.record_content_change(&id("B2"), patch).await.unwrap();
    let operator = NewEvent::new(ty("Prioritized"), Outcome::Success, agent("operator:test"));
    http.prioritize(&id("B2"), 7, operator).await.unwrap();
    let cancel = NewEvent::new(ty("Data_Archived"), Outcome::Failure, agent("operator:test"))
        .with_details(json!({"cancelled": true}));
    let cancelled = http.cancel_run(&id("B2"), &archiver, cancel).await.unwrap();
    assert!(cancelled.run.is_none());

    // A pass's claims in one request: each batch answered as a single claim would be.
    let checker = component("structure-checker");
    let stalled = http.claim(&id("B2"), &checker, &holder()).await.unwrap();
    let asked = [id("B1"), id("missing"), id("B2")];
    let answers = http.claim_many(&asked, &checker, &holder()).await.unwrap();
    assert!(matches!(&answers[1], Err(StoreError::NotFound(b)) if b.as_str() == "missing"), "{answers:?}");
    let (b1, b2) = (answers[0].as_ref().unwrap(), answers[2].as_ref().unwrap());
    assert_eq!((b1.generation(), b1.abandoned.as_ref()), (1, None));
    assert_eq!(b2.abandoned.as_ref().map(|run| run.generation), Some(stalled.generation()));
    let mut open = local.open_runs(Some(&checker)).await.unwrap();
    open.sort_by(|a, b| a.batch_id.cmp(&b.batch_id));
    assert_eq!(open, [b1.run.clone(), b2.run.clone()], "what the service answered is what the store holds");
    let keyed = RunHolder { claim_key: b1.run.holder.claim_key.clone(), ..holder() };
    let retried = http.claim_many(&[id("B1"), id("B2")], &checker, &keyed).await.unwrap();
    assert_eq!(retried[0].as_ref().unwrap(), &Claim { run: b1.run.clone(), abandoned: None }, "a retry: the same run");
    let bad = RunHolder { host: String::new(), ..holder() };
    match http.claim_many(&asked, &checker, &bad).await.unwrap_err() {
        StoreError::Invalid(input) => assert_eq!(input.field, "host"),
        other => panic!("expected Invalid naming the host, got {other}"),
    }
    for claim in answers.iter().flatten() {
        http.release(&claim.run.batch_id, &checker, claim.generation()).await.unwrap();
    }

    for name in ["B1", "B2"] {
        same_batch(&http.get_batch(&id(name)).await.unwrap(), &local.get_batch(&id(name)).await.unwrap());
    }
    let listed = http.list_batches(None, 10).await.unwrap();
    assert_eq!(listed.iter().map(|b| b.id.as_str()).collect::<Vec<_>>(), ["B1", "B2"]);
    let picked = http.get_batches(&[id("B2"), id("nope"), id("B1")]).await.unwrap();
    assert_eq!(picked.iter().map(|b| b.id.as_str()).collect::<Vec<_>>(), ["B2", "B1"]);
    // The batch index's reads: each batch summarized, as the store behind reads them.
    http.claim(&id("B1"), &archiver, &holder()).await.unwrap();
    let asked = [id("B2"), id("nope"), id("B1")];
    let summaries = http.get_summaries(&asked).await.unwrap();
    assert_eq!(summaries, local.get_summaries(&asked).await.unwrap());
    let whole = local.get_batches(&asked).await.unwrap();
    assert_eq!(summaries, whole.iter().map(BatchSummary::of).collect::<Vec<_>>());
    assert_eq!((summaries[0].running.as_slice(), summaries[1].running.as_slice()), (&[][..], &[archiver.clone()][..]));
    let types = |summary: &BatchSummary| summary.effective.iter().map(|e| e.event_type.to_string()).collect::<Vec<_>>();
    assert_eq!(
        (types(&summaries[0]), types(&summaries[1])),
        (vec!["Data_Archived".into(), "Prioritized".into()], vec!["Data_Archived".into()])
    );
    assert_eq!(
        (summaries[0].priority, summaries[0].effective[0].outcome),
        (7, Outcome::Failure),
        "B2 prioritized, cancelled"
    );
    let listed = http.list_summaries(None, 10).await.unwrap();
    assert_eq!(listed, local.list_summaries(None, 10).await.unwrap());
    assert_eq!(listed, summaries.iter().rev().cloned().collect::<Vec<_>>(), "B1, B2 in id order");
    assert_eq!(http.list_summaries(Some(&id("B1")), 10).await.unwrap(), &summaries[..1]);
    let refused = http.list_summaries(None, 1_000_000).await.unwrap_err();
    assert!(matches!(&refused, StoreError::Invalid(e) if e.field == "limit"), "{refused}");
    let listings = http.get_listings(&asked).await.unwrap();
    assert_eq!(listings, local.get_listings(&asked).await.unwrap());
    assert_eq!(listings.iter().map(|l| l.summary.clone()).collect::<Vec<_>>(), summaries);
    // The bounded reads: a batch's head, a page of its log and a run's state, as read directly.
    let mut head = http.batch_head(&id("B2")).await.unwrap();
    let direct = local.batch_head(&id("B2")).await.unwrap();
    head.as_of = direct.as_of;
    assert_eq!(head, direct);
    assert_eq!((head.event_count, head.effective.len(), head.summary.priority), (2, 2, 7));
    let page = http.log_page(&id("B2"), LogCursor::Newest, 1).await.unwrap();
    assert_eq!(page, local.log_page(&id("B2"), LogCursor::Newest, 1).await.unwrap());
    assert_eq!((page.events.len(), page.total, page.newer), (1, 2, None));
    let older = http.log_page(&id("B2"), LogCursor::Before(page.older.unwrap()), 1).await.unwrap();
    assert_eq!(older, local.log_page(&id("B2"), LogCursor::Before(page.older.unwrap()), 1).await.unwrap());
    assert_eq!((older.older, older.newer), (None, Some(older.events[0].seq)));
    let state = http.run_state(&id("B1"), &archiver).await.unwrap();
    assert_eq!(state, local.run_state(&id("B1"), &archiver).await.unwrap());
    assert_eq!(state.map(|run| run.state), Some(RunState::Open));
    assert_eq!(http.run_state(&id("B2"), &component("nobody")).await.unwrap(), None);
    assert!(matches!(http.run_state(&id("nope"), &archiver).await.unwrap_err(), StoreError::NotFound(_)));
    assert_eq!(http.changes(Seq::ZERO, 100).await.unwrap(), local.changes(Seq::ZERO, 100).await.unwrap());
    assert_eq!(http.head().await.unwrap(), local.head().await.unwrap());
    let (remote, here) = (http.about().await.unwrap(), local.about().await.unwrap());
    assert_eq!(
        (&remote.backend, remote.schema_version, remote.schema_wanted),
        (&here.backend, here.schema_version, here.schema_wanted)
    );
    assert!((remote.clock.0 - here.clock.0).abs() < 5_000, "one host, one clock: {remote:?} {here:?}");
    assert_eq!(http.count_batches().await.unwrap(), 2);
    assert_eq!(http.failed_attempts(&id("B1"), &archiver, Seq::ZERO).await.unwrap(), 0);
    assert_eq!(event, local.get_batch(&id("B1")).await.unwrap().events[0]);

    assert!(
        matches!(http.get_batch(&id("missing")).await.unwrap_err(), StoreError::NotFound(b) if b.as_str() == "missing")
    );
    let bad = NewEvent::new(ty("Reset"), Outcome::Success, agent("x"));
    match http.append_event(&id("B1"), bad).await.unwrap_err() {
        StoreError::Invalid(input) => assert_eq!(input.field, "resets"),
        other => panic!("expected Invalid naming the field, got {other}"),
    }

    // The component registry: the same answers, the same refusals, and no move of the head.
    let head = local.head().await.unwrap();
    let checker = descriptor("structure-checker", "Structure_Checked");
    http.record_pass(pass(&checker, "host-a", PassPhase::Started)).await.unwrap();
    let work = vec![WorkDone { result: WorkResult::Success, duration_ms: 12 }];
    let ended = PassPhase::Ended { outcome: PassOutcome::Ok, summary: "1 ok".into(), duration_ms: 40, work };
    http.record_pass(pass(&checker, "host-b", ended)).await.unwrap();
    let components = http.components().await.unwrap();
    assert_eq!(components, local.components().await.unwrap());
    assert_eq!(components[0].work.last_hour.success.results, 1, "the pass's work went over the wire");
    assert_eq!(components[0].hosts.iter().map(|h| h.running()).collect::<Vec<_>>(), [true, false]);
    let clash = http.record_pass(pass(&descriptor("checker-two", "Structure_Checked"), "host-a", PassPhase::Started));
    assert!(matches!(clash.await.unwrap_err(), StoreError::Conflict(m) if m.contains("structure-checker")));
    match http.record_pass(pass(&checker, "", PassPhase::Started)).await.unwrap_err() {
        StoreError::Invalid(input) => assert_eq!(input.field, "host"),
        other => panic!("expected Invalid naming the host, got {other}"),
    }
    let operator = agent("operator:test");
    let retired = http.retire_component(&component("structure-checker"), &operator, "replaced").await.unwrap();
    assert_eq!(local.components().await.unwrap(), std::slice::from_ref(&retired));
    assert_eq!(http.components().await.unwrap(), [retired]);
    let again = http.retire_component(&component("structure-checker"), &operator, "again").await.unwrap_err();
    assert!(matches!(&again, StoreError::Conflict(m) if m.contains("already retired")), "{again}");
    for (name, reason, field) in [("nope", "typo", "component"), ("structure-checker", " ", "reason")] {
        match http.retire_component(&component(name), &operator, reason).await.unwrap_err() {
            StoreError::Invalid(input) => assert_eq!(input.field, field),
            other => panic!("expected Invalid naming the {field}, got {other}"),
        }
    }
    assert_eq!(http.head().await.unwrap(), head);
}

#[tokio::test]
async fn steering_and_the_outbox_answer_through_the_service() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("store.db");
    let service = Service::start(&db);
    let local = SqliteStore::open(&db).await.unwrap();
    steering_and_the_outbox_through(&service, &local).await;
}

#[tokio::test]
async fn steering_and_the_outbox_answer_through_the_service_over_postgresql() {
    let url = autocomp_test_servers::postgres::shared().unique_database();
    let service = Service::serve(&url, free_port(), &[]);
    let local = PgStore::open(&url).await.unwrap();
    steering_and_the_outbox_through(&service, &local).await;
}

/// Steering and the outbox through the service: the answers a direct client of the same
/// database reads, refusals as their HTTP status naming the field, writes behind the token,
/// and a long poll woken by a steer.
async fn steering_and_the_outbox_through(service: &Service, local: &dyn ObjectStore) {
    let http = Arc::new(service.client());
    let url = |op: &str| format!("{}/v1/{op}", service.url());
    let pause = |by: &str| SteeringRequest {
        change: SteeringChange::Pause { component: Some(component("archiver")), drain: false },
        by: agent(by),
        reason: "tape maintenance".into(),
        expect_version: None,
    };

    // A steer moves the head: a long poll parked at the service answers it at once.
    let head = http.head().await.unwrap();
    let waiter = {
        let http = Arc::clone(&http);
        tokio::spawn(async move { http.wait_for_change(head, Duration::from_secs(20)).await.unwrap() })
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    wait_for_async(deadline, "the long poll to park", async || {
        metrics(service).contains("autocomp_store_long_polls_waiting 1")
    })
    .await;
    let steered_at = Instant::now();
    let steered = http.steer(pause("operator:ann")).await.unwrap();
    let moved = waiter.await.unwrap();
    let delay = steered_at.elapsed();
    assert!(moved > head && delay < Duration::from_secs(1), "answered {moved:?} {delay:?} after the steer");
    assert_eq!(steered.entry.as_ref().map(|e| e.said.as_str()), Some("paused archiver"));
    let hold = steered.steering.hold_of(&component("archiver")).unwrap();
    assert_eq!((hold.kind, hold.by.as_str()), (HoldKind::Pause, "operator:ann"));
    assert_eq!(http.steering().await.unwrap(), steered.steering, "read back as answered");
    assert_eq!(local.steering().await.unwrap(), steered.steering, "what the store holds");
    let log = http.steering_log(10).await.unwrap();
    assert_eq!(log, local.steering_log(10).await.unwrap());
    assert_eq!(log, [steered.entry.clone().unwrap()]);
    assert!(local.changes(head, 10).await.unwrap().changes.is_empty(), "no batch changed");

    // Refusals: a conflict is a 409 naming the first pauser, bad input a 400 naming the field.
    let conflict = http.steer(pause("operator:bob")).await.unwrap_err();
    assert!(matches!(&conflict, StoreError::AlreadyInState(m) if m.contains("by operator:ann")), "{conflict}");
    let body = |value: Value| value.to_string().into_bytes();
    let again = json!({"change": {"pause": {"component": "archiver"}}, "by": "operator:bob", "reason": "again"});
    let (status, answer) = post(&url("steer"), Some(TOKEN), &body(again.clone()));
    assert_eq!((status, answer["error"]["kind"].as_str()), (409, Some("conflict")), "{answer}");
    assert!(answer["error"]["message"].as_str().unwrap().contains("operator:ann"), "{answer}");
    let stale = json!({"change": {"resume": {}}, "by": "operator:bob", "reason": "r", "expect_version": 0});
    assert_eq!(post(&url("steer"), Some(TOKEN), &body(stale)).0, 409);
    let invalid = [
        ("steer", json!({"change": {"pause": {}}, "by": "operator:bob", "reason": ""}), "reason"),
        ("steer", json!({"change": {"pause": {}}, "by": "operator:bob", "reason": "a\u{1b}b"}), "reason"),
        (
            "steer",
            json!({"change": {"set_pool": {"pool": "tape", "size": 1001}}, "by": "operator:bob", "reason": "r"}),
            "size",
        ),
        ("steering_log", json!({"limit": 0}), "limit"),
        ("recent_notices", json!({"limit": 1001}), "limit"),
        (
            "enqueue_notices",
            json!({"notices": [{"key": "k", "channel": "sms", "subject": "s", "body": {}}]}),
            "channel",
        ),
        (
            "enqueue_notices",
            json!({"notices": [{"key": "a b", "channel": "mail", "subject": "s", "body": {}}]}),
            "notice key",
        ),
        ("take_notices", json!({"holder": "h", "limit": 1, "lease_ms": 0}), "lease"),
        ("take_notices", json!({"holder": "h", "limit": 0, "lease_ms": 1000}), "limit"),
        (
            "settle_notice",
            json!({"key": "k", "holder": "h", "outcome": {"failed": {"error": "e", "retry_in": "1y"}}}),
            "retry_in",
        ),
    ];
    for (op, request, field) in invalid {
        let (status, answer) = post(&url(op), Some(TOKEN), &body(request));
        assert_eq!((status, answer["error"]["kind"].as_str()), (400, Some("invalid")), "{op}: {answer}");
        assert_eq!(answer["error"]["field"], field, "{op}: {answer}");
    }
    // Writes need the token; reads do not (on loopback).
    for (op, request) in [
        ("steer", again),
        ("enqueue_notices", json!({"notices": []})),
        ("take_notices", json!({"holder": "h", "limit": 1, "lease_ms": 1000})),
        ("settle_notice", json!({"key": "k", "holder": "h", "outcome": "sent"})),
    ] {
        assert_eq!(post(&url(op), None, &body(request)).0, 401, "{op}");
    }
    assert_eq!(post(&url("steering"), None, b"{}").0, 200);
    assert_eq!(local.steering().await.unwrap(), steered.steering, "the refusals changed nothing");
    assert_eq!(local.steering_log(10).await.unwrap(), log);

    // The outbox: enqueued once, taken by one holder, settled once.
    let notice = |key: &str| NewNotice {
        key: key.into(),
        channel: "webhook".into(),
        subject: format!("about {key}"),
        body: json!({"batch": "B1", "text": "nul \u{0} kept"}),
    };
    let cursor = Some(CursorMove { from: CURSOR_UNSET, to: Seq(7) });
    let head = local.head().await.unwrap();
    let enqueued = http.enqueue_notices(vec![notice("n1"), notice("n2")], cursor).await.unwrap();
    assert_eq!(enqueued, Enqueued { added: 2, cursor: Seq(7) });
    assert_eq!(http.enqueue_notices(vec![notice("n1")], cursor).await.unwrap(), Enqueued { added: 0, cursor: Seq(7) });
    let take = json!({"holder": "notifier-a", "limit": 1, "lease_ms": 60_000});
    let (status, taken) = post(&url("take_notices"), Some(TOKEN), &body(take));
    assert_eq!(status, 200, "{taken}");
    assert_eq!(taken[0]["key"], "n1", "{taken}");
    assert_eq!(taken[0]["body"]["text"], "nul \u{0} kept");
    let other = http.take_notices("notifier-b", 10, Duration::from_secs(60)).await.unwrap();
    assert_eq!(other.iter().map(|n| n.key.as_str()).collect::<Vec<_>>(), ["n2"], "not a's");
    let sent = json!({"key": "n1", "holder": "notifier-a", "outcome": "sent"});
    assert_eq!(post(&url("settle_notice"), Some(TOKEN), &body(sent.clone())), (200, json!({})));
    let (status, answer) = post(&url("settle_notice"), Some(TOKEN), &body(sent));
    assert_eq!((status, answer["error"]["kind"].as_str()), (409, Some("conflict")), "{answer}");
    let refused = http.settle_notice("n2", "notifier-a", NoticeOutcome::Sent).await.unwrap_err();
    assert!(matches!(&refused, StoreError::Conflict(m) if m.contains("not leased to notifier-a")), "{refused}");
    let failed = NoticeOutcome::Failed { error: "502 from the receiver".into(), retry_in: Duration::ZERO };
    http.settle_notice("n2", "notifier-b", failed).await.unwrap();
    let retried = http.take_notices("notifier-a", 10, Duration::from_secs(60)).await.unwrap();
    assert_eq!((retried.len(), retried[0].attempts), (1, 1));
    assert_eq!(retried[0].last_error.as_deref(), Some("502 from the receiver"));
    let recent = http.recent_notices(10).await.unwrap();
    assert_eq!(recent, local.recent_notices(10).await.unwrap());
    assert_eq!(
        recent.iter().map(|n| (n.key.as_str(), n.sent_at.is_some())).collect::<Vec<_>>(),
        [("n2", false), ("n1", true)]
    );
    assert_eq!(local.head().await.unwrap(), head, "the outbox takes no seq");
}

/// From JSON, as a component's report arrives: fields added later keep their defaults.
fn descriptor(name: &str, event_type: &str) -> ComponentDescriptor {
    serde_json::from_value(json!({
        "name": name, "version": "2.0.0", "event_type": event_type, "trigger": {"requires": ["Data_Archived"]},
        "max_attempts": 3, "retry_backoff": "90s", "queue_size": 5, "max_runtime": "2h",
    }))
    .unwrap()
}

fn pass(descriptor: &ComponentDescriptor, host: &str, phase: PassPhase) -> PassRecord {
    PassRecord { descriptor: descriptor.clone(), host: host.into(), phase }
}

#[tokio::test]
async fn long_poll_answers_as_soon_as_the_store_moves() {
    let dir = tempfile::tempdir().unwrap();
    let service = Service::start(&dir.path().join("store.db"));
    long_poll_answers_as_soon_as_a_write_lands(&service, None).await;
}

#[tokio::test]
async fn long_poll_over_postgresql_answers_writes_made_around_the_service() {
    let url = autocomp_test_servers::postgres::shared().unique_database();
    let service = Service::serve(&url, free_port(), &[]);
    let direct: Arc<dyn ObjectStore> = Arc::new(PgStore::open(&url).await.unwrap());
    long_poll_answers_as_soon_as_a_write_lands(&service, Some(direct)).await;
}

/// A long poll parked at the service answers within a second of a write, made through the
/// service or (`direct`) straight to the database by another client.
async fn long_poll_answers_as_soon_as_a_write_lands(service: &Service, direct: Option<Arc<dyn ObjectStore>>) {
    let http = Arc::new(service.client());
    let head = http.head().await.unwrap();
    let waiter = {
        let http = Arc::clone(&http);
        tokio::spawn(async move {
            let started = Instant::now();
            let moved = http.wait_for_change(head, Duration::from_secs(20)).await.unwrap();
            (moved, started.elapsed())
        })
    };
    // Poll until the waiter is parked at the service, then write.
    let deadline = Instant::now() + Duration::from_secs(10);
    wait_for_async(deadline, "the long poll to park", async || {
        metrics(service).contains("autocomp_store_long_polls_waiting 1")
    })
    .await;
    let written_at = Instant::now();
    match &direct {
        Some(direct) => direct.create_batch(new_batch("B1")).await.unwrap(),
        None => http.create_batch(new_batch("B1")).await.unwrap(),
    };
    let (moved, _) = waiter.await.unwrap();
    let after_write = written_at.elapsed();
    assert!(moved > head);
    assert!(after_write < Duration::from_secs(1), "the long poll answered {after_write:?} after the write");
    eprintln!("long poll answered {after_write:?} after the write");
    assert_eq!(http.wait_for_change(moved, Duration::from_millis(200)).await.unwrap(), moved, "times out quietly");
}

fn metrics(service: &Service) -> String {
    let (status, body) = get(&format!("{}/metrics", service.url())).unwrap();
    assert_eq!(status, 200);
    String::from_utf8(body).unwrap()
}

#[tokio::test]
async fn writes_need_the_token_and_change_nothing_without_it() {
    let dir = tempfile::tempdir().unwrap();
    let service = Service::start(&dir.path().join("store.db"));
    service.client().create_batch(new_batch("B1")).await.unwrap();
    let head = service.client().head().await.unwrap();
    let url = |op: &str| format!("{}/v1/{op}", service.url());
    let body = br#"{"id": "B9", "type": "Delivery"}"#;

    for token in [None, Some("wrong-token")] {
        let (status, answer) = post(&url("create_batch"), token, body);
        assert_eq!(status, 401, "{answer}");
        assert_eq!(answer["error"]["kind"], "unauthorized");
    }
    let anonymous = HttpStore::with_token(&service.url(), None).unwrap();
    let refused = anonymous.set_priority(&id("B1"), 5).await.unwrap_err();
    assert!(refused.to_string().contains("bearer token"), "{refused}");
    assert_eq!(service.client().head().await.unwrap(), head, "nothing was written");
    assert_eq!(anonymous.get_batch(&id("B1")).await.unwrap().priority, 0, "reads are open on loopback");

    let (status, answer) = post(&url("create_batch"), Some(TOKEN), body);
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["created"], true);

    // On a host other users share, reads can ask for the token too.
    drop(service);
    let guarded = Service::start_with(&dir.path().join("store.db"), free_port(), &["--reads-need-token"]);
    let anonymous = HttpStore::with_token(&guarded.url(), None).unwrap();
    match anonymous.get_batch(&id("B1")).await.unwrap_err() {
        StoreError::Invalid(input) => assert!(input.reason.contains("reads need a bearer token"), "{input}"),
        other => panic!("expected a refusal naming the token, got {other}"),
    }
    assert_eq!(guarded.client().get_batch(&id("B1")).await.unwrap().id, id("B1"));
    assert_eq!(get(&format!("{}/health", guarded.url())).unwrap().0, 200, "health stays open");
}

#[tokio::test]
async fn bad_bodies_get_a_json_4xx_never_a_500_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let service = Service::start(&dir.path().join("store.db"));
    service.client().create_batch(new_batch("B1")).await.unwrap();
    let head = service.client().head().await.unwrap();

    // Named cases first: each names the field that is wrong.
    let cases: &[(&str, &str, &str)] = &[
        ("create_batch", r#"{"id": "../etc", "type": "Delivery"}"#, "batch id"),
        ("create_batch", r#"{"id": "B2", "type": "Delivery", "colour": 1}"#, "colour"),
        ("set_priority", r#"{"id": "B1", "priority": "high"}"#, "invalid type"),
        ("append_event", r#"{"batch": "B1", "event": {"type": "X", "outcome": "maybe", "agent": "a"}}"#, "maybe"),
        (
            "append_event",
            r#"{"batch": "B1", "event": {"type": "X", "outcome": "success", "agent": "a", "details": []}}"#,
            "details",
        ),
        ("list_batches", r#"{"limit": 100000000}"#, "limit"),
        ("list_summaries", r#"{"limit": 100000000}"#, "limit"),
        ("list_summaries", r#"{"after": "B1"}"#, "limit"),
        ("get_summaries", r#"{"ids": ["../etc"]}"#, "batch id"),
        ("get_summaries", r#"{"ids": ["B1"], "details": true}"#, "details"),
        ("get_batch", r#"["B1"]"#, "must be a JSON object"),
        ("wait_for_change", r#"{"since": 0, "timeout_ms": 99999999}"#, "timeout_ms"),
        (
            "claim",
            r#"{"batch": "B1", "component": "Bad Name!", "holder": {"agent": "a", "host": "h", "pid": 1}}"#,
            "component",
        ),
        ("retire_component", r#"{"name": "nope", "by": "operator:x", "reason": "r"}"#, "component registry"),
        ("retire_component", r#"{"name": "nope", "by": "operator:x", "reason": "r", "force": true}"#, "force"),
        ("record_pass", r#"{"descriptor": {}, "host": "h", "phase": "started"}"#, "missing field"),
        ("components", r#"{"all": true}"#, "all"),
        ("log_page", r#"{"id": "B1", "limit": 1001}"#, "limit"),
        ("log_page", r#"{"id": "B1", "limit": 0}"#, "limit"),
        ("log_page", r#"{"id": "B1", "before": 9, "after": 2, "limit": 5}"#, "before"),
        ("run_state", r#"{"batch": "B1"}"#, "component"),
    ];
    for (op, body, named) in cases {
        let (status, answer) = post(&format!("{}/v1/{op}", service.url()), Some(TOKEN), body.as_bytes());
        assert_eq!(status, 400, "{op} {body}: {answer}");
        assert!(answer["error"]["message"].as_str().unwrap().contains(named), "{op}: {answer} should name {named}");
    }
    let (status, answer) = post(&format!("{}/v1/no_such_thing", service.url()), Some(TOKEN), b"{}");
    assert_eq!((status, answer["error"]["kind"].as_str()), (404, Some("unknown_operation")));
    let huge = format!(r#"{{"id": "B1", "metadata_patch": {{"x": "{}"}}}}"#, "a".repeat(5 << 20));
    let (status, answer) = post(&format!("{}/v1/record_content_change", service.url()), Some(TOKEN), huge.as_bytes());
    assert_eq!((status, answer["error"]["kind"].as_str()), (413, Some("too_large")));

    // Then a bounded fuzz loop: random mutations of valid bodies and random bytes.
    let valid = json!({
        "id": "B1", "ids": ["B1"], "batch": "B1", "component": "archiver", "generation": 1, "priority": 1,
        "since": 0, "limit": 5, "timeout_ms": 1, "metadata_patch": {"a": 1}, "data": {},
        "holder": {"agent": "a", "host": "h", "pid": 1},
        "event": {"type": "X", "outcome": "success", "agent": "a"}, "type": "Delivery",
    });
    let mut rng = XorShift(0x5eed_1234_abcd_ef01);
    let mut answered = 0;
    for round in 0..600 {
        let op = StoreRequest::OPERATIONS[rng.below(StoreRequest::OPERATIONS.len())].name;
        let body = match round % 3 {
            0 => (0..rng.below(64)).map(|_| rng.next_u64() as u8).collect::<Vec<u8>>(),
            1 => mutate(&valid, &mut rng).to_string().into_bytes(),
            _ => {
                let mut text = mutate(&valid, &mut rng).to_string().into_bytes();
                let cut = rng.below(text.len().max(1));
                text.truncate(cut);
                text
            }
        };
        let (status, answer) = post(&format!("{}/v1/{op}", service.url()), Some(TOKEN), &body);
        assert!(status < 500, "{op} answered {status} to {}: {answer}", String::from_utf8_lossy(&body));
        if status >= 400 {
            assert!(answer["error"]["message"].is_string(), "{op}: {answer}");
        }
        answered += 1;
    }
    assert_eq!(answered, 600);
    assert_eq!(get(&format!("{}/health", service.url())).unwrap().0, 200, "still up");
    // Fuzzed writes that happened to be valid may have moved the head; B1's log must still
    // only hold well-formed events (the store validated each).
    let after = service.client().head().await.unwrap();
    assert!(after >= head);
}

#[tokio::test]
async fn a_write_over_the_services_batch_cap_is_a_400_naming_the_batch_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("store.db");
    let service = Service::start_with(&db, free_port(), &["--max-batch-bytes", "1MiB"]);
    let http = service.client();
    http.create_batch(new_batch("B1")).await.unwrap();
    let event = |bytes: usize| {
        NewEvent::new(ty("Step_Done"), Outcome::Success, agent("t")).with_details(json!({"blob": "x".repeat(bytes)}))
    };
    http.append_event(&id("B1"), event(700_000)).await.unwrap();
    let head = http.head().await.unwrap();
    let body = json!({"batch": "B1", "event": event(400_000)}).to_string();
    let (status, answer) = post(&format!("{}/v1/append_event", service.url()), Some(TOKEN), body.as_bytes());
    assert_eq!(status, 400, "{answer}");
    let error = &answer["error"];
    assert_eq!(
        (error["kind"].as_str(), error["field"].as_str(), error["value"].as_str()),
        (Some("invalid"), Some("batch"), Some("B1"))
    );
    assert!(error["message"].as_str().unwrap().contains("1048576 bytes"), "names the cap: {answer}");
    // Through the client: the same refusal as the embedded store's, not an outage.
    match http.append_event(&id("B1"), event(400_000)).await.unwrap_err() {
        StoreError::Invalid(input) => {
            assert_eq!((input.field.as_str(), input.value.as_str()), ("batch", "B1"));
            assert!(input.reason.contains("max_batch_bytes"), "{input}");
        }
        other => panic!("expected a refusal naming the batch, got {other}"),
    }
    assert_eq!(http.head().await.unwrap(), head, "nothing was written");
    http.append_event(&id("B1"), event(100_000)).await.expect("what fits is recorded");

    // The flag and the URL's option are one setting: given twice it is a usage error.
    let both = Command::new(env!("CARGO_BIN_EXE_autocomp-store"))
        .args(["serve", "--db", &format!("sqlite://{}?max_batch_bytes=2MiB", db.display())])
        .args(["--max-batch-bytes", "1MiB", "--listen", &format!("127.0.0.1:{}", free_port())])
        .env("AUTOCOMP_TOKEN", TOKEN)
        .output()
        .unwrap();
    assert_eq!(both.status.code(), Some(2), "{both:?}");
    let said = String::from_utf8_lossy(&both.stderr);
    assert!(said.contains("--max-batch-bytes") && said.contains("max_batch_bytes="), "{said}");
    let typo = Command::new(env!("CARGO_BIN_EXE_autocomp-store"))
        .args(["serve", "--db", &format!("sqlite://{}", db.display()), "--max-batch-bytes", "64"])
        .env("AUTOCOMP_TOKEN", TOKEN)
        .output()
        .unwrap();
    assert_eq!(typo.status.code(), Some(2), "{typo:?}");
    assert!(String::from_utf8_lossy(&typo.stderr).contains("at least"), "{typo:?}");
}

/// Replaces, removes or retypes a few fields of a valid body.
fn mutate(valid: &Value, rng: &mut XorShift) -> Value {
    let mut body = valid.as_object().unwrap().clone();
    let keys: Vec<String> = body.keys().cloned().collect();
    for _ in 0..=rng.below(3) {
        let key = &keys[rng.below(keys.len())];
        let replacement = match rng.below(7) {
            0 => Value::Null,
            1 => json!(-1),
            2 => json!("x".repeat(rng.below(300))),
            3 => json!([1, "two", null]),
            4 => json!({"nested": {"deep": [1]}}),
            5 => json!(i64::MAX),
            _ => {
                body.remove(key);
                continue;
            }
        };
        body.insert(key.clone(), replacement);
    }
    if rng.below(4) == 0 {
        body.insert("unexpected".into(), json!(true));
    }
    Value::Object(body)
}

#[tokio::test]
async fn a_restart_mid_stream_neither_loses_nor_doubles_an_append_or_a_claim() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("store.db");
    let mut service = Service::start(&db);
    let port = service.port;
    let http = Arc::new(service.client());
    http.create_batch(new_batch("B1")).await.unwrap();

    let writer = {
        let http = Arc::clone(&http);
        tokio::spawn(async move {
            let mut acknowledged = Vec::new();
            for n in 0..2_000 {
                let event =
                    NewEvent::new(ty("Step_Done"), Outcome::Success, agent("writer")).with_details(json!({ "n": n }));
                acknowledged.push(http.append_event(&id("B1"), event).await.expect("retried through the restart"));
            }
            acknowledged
        })
    };
    // Beside it, a worker's cycle per batch: claim, then the result fenced by that claim.
    let worker = {
        let http = Arc::clone(&http);
        tokio::spawn(async move {
            let archiver = component("archiver");
            for n in 0..300 {
                let batch = id(&format!("C{n:03}"));
                http.create_batch(new_batch(batch.as_str())).await.expect("registered through the restart");
                let claim = http.claim(&batch, &archiver, &holder()).await.expect("claimed through the restart");
                let result = NewEvent::new(ty("Data_Archived"), Outcome::Success, agent("archiver/1.0"))
                    .in_run(archiver.clone(), claim.generation());
                http.append_event(&batch, result).await.expect("recorded through the restart");
            }
        })
    };
    let local = SqliteStore::open(&db).await.unwrap();
    for _ in 0..5 {
        // Kill the service while appends are in flight, then bring it back on the same port.
        let before = local.head().await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        wait_for_async(deadline, "the writer to make progress", async || {
            local.head().await.unwrap() >= Seq(before.0 + 100) || writer.is_finished()
        })
        .await;
        service.kill();
        service = Service::start_on(&db, port);
    }
    let acknowledged = writer.await.unwrap();
    worker.await.unwrap();
    let archiver = component("archiver");
    for n in 0..300 {
        let batch = local.get_batch(&id(&format!("C{n:03}"))).await.unwrap();
        assert_eq!(batch.events.len(), 1, "{}: one result", batch.id);
        let abandoned = local.failed_attempts(&batch.id, &archiver, Seq::ZERO).await.unwrap();
        assert_eq!(abandoned, 0, "{}: a retried claim returned its run instead of abandoning it", batch.id);
    }
    assert!(local.open_runs(None).await.unwrap().is_empty());
    let log = local.get_batch(&id("B1")).await.unwrap().events;
    assert_eq!(log.len(), 2_000, "one event per append: none lost, none doubled");
    let ns: HashSet<i64> = log.iter().map(|e| e.details["n"].as_i64().unwrap()).collect();
    assert_eq!(ns.len(), 2_000);
    assert_eq!(acknowledged.iter().map(|e| e.seq).collect::<Vec<_>>(), log.iter().map(|e| e.seq).collect::<Vec<_>>());
}

#[tokio::test]
async fn an_unreachable_service_is_unavailable_at_once_naming_it() {
    let url = format!("http://127.0.0.1:{}", free_port());
    let store = HttpStore::with_token(&url, Some(TOKEN.into())).unwrap();
    let started = Instant::now();
    let error = store.head().await.unwrap_err();
    assert!(matches!(error, StoreError::Unavailable(_)), "{error}");
    assert!(error.to_string().contains(&url), "{error}");
    assert!(started.elapsed() < Duration::from_secs(2), "a first contact does not wait for retries");
    let bad = open_store("http://127.0.0.1:1/path").await.err().expect("a path is refused");
    assert!(bad.to_string().contains("store url"), "{bad}");
}

#[tokio::test]
async fn health_metrics_and_the_openapi_document() {
    let dir = tempfile::tempdir().unwrap();
    let service = Service::start(&dir.path().join("store.db"));
    service.client().create_batch(new_batch("B1")).await.unwrap();
    let (status, body) = get(&format!("{}/health", service.url())).unwrap();
    let health: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!((status, health["status"].as_str()), (200, Some("ok")));

    let text = metrics(&service);
    assert!(text.contains(&format!("autocomp_store_head_seq {}", health["head"])), "{text}");
    assert!(text.contains(r#"autocomp_store_requests_total{operation="create_batch",status="200"} 1"#), "{text}");

    let (status, body) = get(&format!("{}/openapi.json", service.url())).unwrap();
    assert_eq!(status, 200);
    let served: Value = serde_json::from_slice(&body).unwrap();
    let in_repo: Value =
        serde_json::from_str(&std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/openapi.json")).unwrap())
            .unwrap();
    assert_eq!(served, in_repo);
    let documented: HashSet<&str> =
        served["paths"].as_object().unwrap().keys().filter_map(|p| p.strip_prefix("/v1/")).collect();
    let served_ops: HashSet<&str> = StoreRequest::OPERATIONS.iter().map(|op| op.name).collect();
    assert_eq!(documented, served_ops, "the OpenAPI document lists exactly the operations served");
    for (name, write) in StoreRequest::OPERATIONS.iter().map(|op| (op.name, op.write)) {
        let security = &served["paths"][format!("/v1/{name}")]["post"]["security"];
        assert_eq!(security.as_array().unwrap().iter().any(|s| s.as_object().unwrap().is_empty()), !write, "{name}");
    }

    // A summary on the wire has the fields the document names, each of them.
    let client = service.client();
    client.append_event(&id("B1"), NewEvent::new(ty("Data_Received"), Outcome::Success, agent("t"))).await.unwrap();
    client.claim(&id("B1"), &component("archiver"), &holder()).await.unwrap();
    let (status, answer) = post(&format!("{}/v1/get_summaries", service.url()), None, br#"{"ids": ["B1"]}"#);
    assert_eq!(status, 200, "{answer}");
    let (_, listed) = post(&format!("{}/v1/list_summaries", service.url()), None, br#"{"after": null, "limit": 5}"#);
    assert_eq!(listed, answer);
    let fields = |value: &Value| -> HashSet<String> { value.as_object().unwrap().keys().cloned().collect() };
    // Every field on the wire is documented, and every required one is on the wire (a flag
    // left out when false, as `skipped` is, is documented but not required).
    let matches_document = |value: &Value, schema: &str| {
        let schema = &served["components"]["schemas"][schema];
        let required: HashSet<String> =
            schema["required"].as_array().unwrap().iter().map(|f| f.as_str().unwrap().to_owned()).collect();
        let on_the_wire = fields(value);
        assert!(on_the_wire.is_subset(&fields(&schema["properties"])), "{value} is documented by {schema}");
        assert!(required.is_subset(&on_the_wire), "{value} carries what {schema} requires");
    };
    let summary = &answer[0];
    matches_document(summary, "BatchSummary");
    matches_document(&summary["effective"][0], "EventSummary");
    assert_eq!(summary["running"], json!(["archiver"]));
    assert!(summary["last_activity"].as_str().is_some_and(|t| t.ends_with('Z')), "a timestamp: {summary}");
}

/// The document in the repository is the one the declarations generate (and the service
/// serves). After changing an operation, regenerate it with the command the failure names.
#[test]
fn the_checked_in_openapi_document_is_the_generated_one() {
    autocomp_test_servers::assert_generated(
        concat!(env!("CARGO_MANIFEST_DIR"), "/openapi.json"),
        &autocomp_store::http::server::openapi(),
        "cargo test -p autocomp-store --test integration service::the_checked_in_openapi_document_is_the_generated_one",
    );
}

/// Bodies exactly as clients of earlier releases send them, field for field, get the
/// answers they expect: an older client and a newer service still talk.
#[tokio::test]
async fn bodies_as_earlier_clients_send_them_get_the_same_answers() {
    let dir = tempfile::tempdir().unwrap();
    let service = Service::start(&dir.path().join("store.db"));
    let url = |op: &str| format!("{}/v1/{op}", service.url());
    let post = |op: &str, body: &str| post(&url(op), Some(TOKEN), body.as_bytes());

    let (status, created) = post("create_batch", r#"{"id":"B1","type":"Delivery","priority":0,"metadata":{}}"#);
    assert_eq!((status, created["created"].as_bool()), (200, Some(true)), "{created}");
    assert_eq!(created["batch"]["id"], "B1");
    let (status, again) = post("create_batch", r#"{"id":"B1","type":"Delivery","priority":0,"metadata":{}}"#);
    assert_eq!((status, again["created"].as_bool()), (200, Some(false)), "{again}");
    let (status, head) = post("head", "{}");
    assert_eq!(status, 200);
    assert!(head["head"].as_i64().unwrap() > 0, "{head}");
    let (status, seq) = post("set_priority", r#"{"id":"B1","priority":3}"#);
    assert!(status == 200 && seq["seq"].as_i64().unwrap() > head["head"].as_i64().unwrap(), "{seq}");

    let holder = r#"{"agent":"archiver/1.0@h#1","host":"h","pid":1,"claim_key":"k-1"}"#;
    let (status, claim) = post("claim", &format!(r#"{{"batch":"B1","component":"archiver","holder":{holder}}}"#));
    assert_eq!(status, 200, "{claim}");
    assert_eq!((claim["run"]["generation"].as_i64(), &claim["abandoned"]), (Some(1), &Value::Null), "{claim}");
    let (status, many) =
        post("claim_many", &format!(r#"{{"batches":["B1","B9"],"component":"checker","holder":{holder}}}"#));
    assert_eq!(status, 200, "{many}");
    assert_eq!(many["answers"][0]["claim"]["run"]["component"], "checker", "{many}");
    assert_eq!(many["answers"][1]["error"]["kind"], "not_found", "{many}");

    let event = r#"{"type":"Data_Archived","outcome":"success","agent":"archiver/1.0","details":{"n":1},"run":{"component":"archiver","generation":1},"idempotency_key":"e-1"}"#;
    let (status, appended) = post("append_event", &format!(r#"{{"batch":"B1","event":{event}}}"#));
    assert_eq!(status, 200, "{appended}");
    assert_eq!((appended["type"].as_str(), appended["details"]["n"].as_i64()), (Some("Data_Archived"), Some(1)));
    let (status, fenced) =
        post("append_event", &format!(r#"{{"batch":"B1","event":{}}}"#, event.replace("e-1", "e-2")));
    assert_eq!((status, fenced["error"]["kind"].as_str()), (409, Some("fenced")), "{fenced}");
    assert_eq!(
        (fenced["error"]["component"].as_str(), fenced["error"]["generation"].as_i64()),
        (Some("archiver"), Some(1))
    );

    let (status, batch) = post("get_batch", r#"{"id":"B1"}"#);
    assert_eq!((status, batch["priority"].as_i64(), batch["events"].as_array().map(Vec::len)), (200, Some(3), Some(1)));
    let (status, missing) = post("get_batch", r#"{"id":"B9"}"#);
    assert_eq!(
        (status, missing["error"]["kind"].as_str(), missing["error"]["batch"].as_str()),
        (404, Some("not_found"), Some("B9"))
    );
    let (status, listed) = post("list_batches", r#"{"after":null,"limit":10}"#);
    assert_eq!((status, listed.as_array().map(Vec::len)), (200, Some(1)), "{listed}");
    let (status, changes) = post("changes", r#"{"since":0,"limit":10}"#);
    assert_eq!(status, 200, "{changes}");
    assert!(changes.is_object(), "{changes}");
    let (status, waited) = post("wait_for_change", r#"{"since":0,"timeout_ms":1}"#);
    assert_eq!((status, waited["head"].is_i64()), (200, true), "{waited}");
    let (status, runs) = post("open_runs", r#"{"component":"checker"}"#);
    assert_eq!((status, runs.as_array().map(Vec::len)), (200, Some(1)), "{runs}");
    let (status, count) = post("failed_attempts", r#"{"batch":"B1","component":"archiver","since":0}"#);
    assert_eq!((status, count["count"].as_u64()), (200, Some(0)), "{count}");
    let (status, saved) =
        post("save_checkpoint", r#"{"batch":"B1","component":"checker","generation":1,"data":{"at":7}}"#);
    assert_eq!((status, saved), (200, json!({})));
    let (status, loaded) = post("load_checkpoint", r#"{"batch":"B1","component":"checker"}"#);
    assert_eq!((status, loaded), (200, json!({"data": {"at": 7}})));
    let (status, released) = post("release", r#"{"batch":"B1","component":"checker","generation":1}"#);
    assert_eq!((status, released), (200, json!({})));
    let (status, count) = post("count_batches", "");
    assert_eq!((status, count), (200, json!({"count": 1})));
    let (status, refused) = post("release", r#"{"batch":"B1","component":"checker","generation":1,"force":true}"#);
    assert_eq!(
        (status, refused["error"]["kind"].as_str(), refused["error"]["field"].as_str()),
        (400, Some("invalid"), Some("force"))
    );
}

/// The status a write with `token` gets: 401 when the token is refused, else whatever the
/// (deliberately empty) body earns.
fn write_status(service: &Service, token: &str) -> u16 {
    post(&format!("{}/v1/append_event", service.url()), Some(token), b"{}").0
}

#[test]
fn a_token_file_rotates_without_a_restart_and_short_tokens_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (old, new) = ("old-token-0123456789", "new-token-9876543210");
    let token_file = dir.path().join("token");
    let replace = |text: &str| {
        // As an operator would: write beside, rename over.
        std::fs::write(dir.path().join("token.next"), text).unwrap();
        std::fs::rename(dir.path().join("token.next"), &token_file).unwrap();
    };
    replace(&format!("{old}\n"));
    let service =
        Service::start_with(&dir.path().join("store.db"), free_port(), &["--token-file", token_file.to_str().unwrap()]);
    assert_ne!(write_status(&service, old), 401);
    assert_eq!(write_status(&service, new), 401);

    // Step 1: the new token beside the old; both work, so clients can move one by one.
    replace(&format!("# rotating\n{old}\n{new}\n"));
    let deadline = Instant::now() + Duration::from_secs(20);
    wait_for(deadline, "the new token to be accepted", || write_status(&service, new) != 401);
    assert_ne!(write_status(&service, old), 401, "the old token still works meanwhile");

    // Step 2: the old one removed; it stops working, the new one goes on.
    replace(&format!("{new}\n"));
    wait_for(deadline, "the old token to be refused", || write_status(&service, old) == 401);
    assert_ne!(write_status(&service, new), 401);

    // A file that no longer makes tokens keeps the ones in use.
    replace("short\n");
    let later = Instant::now() + Duration::from_secs(3);
    assert!(!autocomp_test_servers::wait_until(later, || write_status(&service, new) == 401), "kept");

    // At start, a short token is configuration: exit 2, naming the file, never the token.
    let started = Command::new(env!("CARGO_BIN_EXE_autocomp-store"))
        .args(["serve", "--db", &format!("sqlite://{}", dir.path().join("other.db").display())])
        .args(["--listen", "127.0.0.1:0", "--token-file", token_file.to_str().unwrap()])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&started.stderr);
    assert_eq!(started.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("at least 12 characters") && stderr.contains(token_file.to_str().unwrap()), "{stderr}");
    assert!(!stderr.contains("short"), "{stderr}");
}

#[test]
fn metrics_and_the_api_document_are_reads_and_need_the_token_where_reads_do() {
    let dir = tempfile::tempdir().unwrap();
    let service = Service::start_with(&dir.path().join("store.db"), free_port(), &["--reads-need-token"]);
    for path in ["/metrics", "/openapi.json"] {
        let url = format!("{}{path}", service.url());
        assert_eq!(get(&url).map(|(status, _)| status), Some(401), "{path} without the token");
        let with_token = autocomp_test_servers::http1::request("GET", &url, Some(TOKEN), Vec::new());
        assert_eq!(with_token.map(|(status, _)| status), Some(200), "{path} with the token");
    }
    assert_eq!(get(&format!("{}/health", service.url())).map(|(status, _)| status), Some(200), "health is open");
}
