//! Text from commands' output is stored as given on every backend: U+0000 (which
//! PostgreSQL's `text` and `jsonb` refuse), bidi controls and the store's own escape mark, in
//! metadata, event details (reports), checkpoints, pass summaries and retirement reasons,
//! read back identical through the port and through the store service. What PostgreSQL still
//! refuses to store is bad input, never an outage.

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use autocomp_model::*;
use autocomp_store::*;
use autocomp_test_servers::http1::get;
use autocomp_test_servers::postgres::NamedDatabase;
use autocomp_test_servers::wait_for;
use serde_json::{Value, json};

/// Everything at once: NULs, a right-to-left override, the mark PostgreSQL's escaping uses,
/// a JSON-escaped NUL written out, non-ASCII.
const NASTY: &str = "\0out\0put \u{202E}txt.exe\u{202C} \u{FDD0}mark\u{FDD0}0 \\u0000 é\0";

fn id(text: &str) -> BatchId {
    BatchId::new(text).unwrap()
}

fn holder() -> RunHolder {
    RunHolder {
        agent: Agent::new("tester/1.0@host#1").unwrap(),
        host: "host".into(),
        pid: 1,
        claim_key: None,
        liveness: None,
    }
}

fn descriptor() -> ComponentDescriptor {
    serde_json::from_value(json!({
        "name": "reporter", "version": "1.0.0", "event_type": "Data_Reported", "trigger": {"requires": ["Data_Received"]},
        "max_attempts": 3, "retry_backoff": "90s", "queue_size": 5, "max_runtime": "2h",
    }))
    .unwrap()
}

/// A report as a component records it, its summary and a failure's message holding `text`.
fn report(text: &str) -> Value {
    json!({
        "outcome": "failure", "duration_ms": 5, "failures_total": 1, "failures_cap": 10,
        "failures": [{"item": text, "message": text}], "summary": text,
        text: [text, {"nested": text}],
    })
}

/// Each kind of text written through `writer`, read back through `reader` (the same store,
/// or a direct client of the database behind a service) and compared.
async fn every_kind_of_text_round_trips(writer: &dyn ObjectStore, reader: &dyn ObjectStore, text: &str) {
    let batch = id("B-nasty");
    let component = ComponentName::new("reporter").unwrap();
    let mut new = NewBatch::new(batch.clone(), BatchType::new("Delivery").unwrap()).with_location(text);
    new.metadata[text] = json!({ text: [text] });
    let created = writer.create_batch(new.clone()).await.unwrap();
    assert_eq!(created.batch().metadata[text], json!({ text: [text] }));
    // The same batch again is "already exists", so the stored metadata compares equal.
    assert!(matches!(writer.create_batch(new).await.unwrap(), CreateOutcome::AlreadyExists(_)));

    let mut patch = serde_json::Map::new();
    patch.insert(format!("{text}-patched"), json!(text));
    writer.record_content_change(&batch, patch).await.unwrap();

    let claim = writer.claim(&batch, &component, &holder()).await.unwrap();
    let checkpoint = json!({ "progress": text, text: [text] });
    writer.save_checkpoint(&batch, &component, claim.generation(), checkpoint.clone()).await.unwrap();
    assert_eq!(reader.load_checkpoint(&batch, &component).await.unwrap(), Some(checkpoint));

    let event = NewEvent::new(EventType::new("Data_Reported").unwrap(), Outcome::Failure, holder().agent)
        .with_details(report(text))
        .in_run(component.clone(), claim.generation());
    let recorded = writer.append_event(&batch, event).await.unwrap();
    assert_eq!(recorded.details, report(text));

    let read = reader.get_batch(&batch).await.unwrap();
    assert_eq!(read.location(), Some(text));
    assert_eq!(read.metadata[text], json!({ text: [text] }));
    assert_eq!(read.metadata[&format!("{text}-patched")], json!(text));
    assert_eq!(read.events.last().unwrap().details, report(text));
    let listed = reader.list_batches(None, 10).await.unwrap();
    assert_eq!(listed.iter().find(|b| b.id == batch).unwrap().events.last().unwrap().details, report(text));

    // An operator's reasons: a cancellation closing the open run, a prioritize.
    let operator = Agent::new("operator").unwrap();
    let rerun = writer.claim(&batch, &component, &holder()).await.unwrap();
    let cancel = NewEvent::new(EventType::new("Data_Reported").unwrap(), Outcome::Failure, operator.clone())
        .with_details(json!({ "cancelled": true, "reason": text }));
    let cancellation = writer.cancel_run(&batch, &component, cancel).await.unwrap();
    assert_eq!(cancellation.run.unwrap().generation, rerun.generation());
    assert_eq!(cancellation.event.details["reason"], json!(text));
    let prioritized = NewEvent::new(EventType::new("Priority_Changed").unwrap(), Outcome::Success, operator)
        .with_details(json!({ "reason": text }));
    writer.prioritize(&batch, 7, prioritized).await.unwrap();
    let events = reader.get_batch(&batch).await.unwrap().events;
    let reasons: Vec<&Value> = events.iter().rev().take(2).map(|e| &e.details["reason"]).collect();
    assert_eq!(reasons, [&json!(text), &json!(text)]);

    let pass = PassRecord {
        descriptor: descriptor(),
        host: "host-a".into(),
        phase: PassPhase::Ended {
            outcome: PassOutcome::Failed,
            summary: text.into(),
            duration_ms: 7,
            work: Vec::new(),
        },
    };
    writer.record_pass(pass).await.unwrap();
    let registered = reader.components().await.unwrap();
    assert_eq!(registered[0].hosts[0].summary, text);
    let retired = writer.retire_component(&component, &holder().agent, text).await.unwrap();
    assert_eq!(retired.retired.unwrap().reason, text.trim());
    assert_eq!(reader.components().await.unwrap()[0].retired.as_ref().unwrap().reason, text.trim());
}

#[tokio::test]
async fn nul_and_bidi_text_round_trips_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("store.db")).await.unwrap();
    every_kind_of_text_round_trips(&store, &store, NASTY).await;
}

#[tokio::test]
async fn nul_and_bidi_text_round_trips_on_postgresql() {
    let url = autocomp_test_servers::postgres::shared().unique_database();
    let store = PgStore::open(&url).await.unwrap();
    every_kind_of_text_round_trips(&store, &store, NASTY).await;
}

/// Rows written before the escaping existed (plain text, a string that merely contains the
/// mark) read back as they were.
#[tokio::test]
async fn rows_written_without_the_escaping_read_back_unchanged() {
    let server = autocomp_test_servers::postgres::shared();
    let NamedDatabase { name: database, url } = server.unique_named_database();
    let store = PgStore::open(&url).await.unwrap();
    store.create_batch(NewBatch::new(id("B1"), BatchType::new("Delivery").unwrap())).await.unwrap();
    server.psql(
        &database,
        "UPDATE batches SET metadata = '{\"location\": \"/in/a\u{FDD0}b\", \"plain\": \"é\\u0001\"}' WHERE id = 'B1'",
    );
    let batch = store.get_batch(&id("B1")).await.unwrap();
    assert_eq!(batch.location(), Some("/in/a\u{FDD0}b"));
    assert_eq!(batch.metadata["plain"], json!("é\u{1}"));
}

/// A value PostgreSQL cannot take (here a `transient` flag that is not a boolean, which the
/// append's function casts) is bad input naming why: not "unavailable", not retried, and the
/// appends sent in the same group are recorded all the same.
#[tokio::test]
async fn a_value_postgresql_refuses_is_bad_input_and_spares_its_group() {
    let url = autocomp_test_servers::postgres::shared().unique_database();
    let store = Arc::new(PgStore::open(&url).await.unwrap());
    let component = ComponentName::new("reporter").unwrap();
    let mut tasks = Vec::new();
    for n in 0..8 {
        let batch = id(&format!("B{n}"));
        store.create_batch(NewBatch::new(batch.clone(), BatchType::new("Delivery").unwrap())).await.unwrap();
        let generation = store.claim(&batch, &component, &holder()).await.unwrap().generation();
        let transient = if n == 3 { json!("maybe") } else { json!(false) };
        let event = NewEvent::new(EventType::new("Data_Reported").unwrap(), Outcome::Failure, holder().agent)
            .with_details(json!({ "transient": transient }))
            .in_run(component.clone(), generation);
        let store = Arc::clone(&store);
        tasks.push(tokio::spawn(async move { store.append_event(&batch, event).await }));
    }
    let started = Instant::now();
    for (n, task) in tasks.into_iter().enumerate() {
        let answer = task.await.unwrap();
        if n == 3 {
            let error = answer.unwrap_err();
            assert!(matches!(&error, StoreError::Invalid(e) if e.field == "data"), "{error:?}");
            assert!(error.to_string().contains("22P02"), "names the SQLSTATE: {error}");
        } else {
            answer.unwrap();
        }
    }
    assert!(started.elapsed() < Duration::from_secs(10), "refused at once, not retried");
}

/// `autocomp-store serve` over `db_url`, killed when dropped.
struct Service {
    child: Child,
    url: String,
}

const TOKEN: &str = "untrusted-text-token";

impl Service {
    fn serve(db_url: &str) -> Service {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let child = Command::new(env!("CARGO_BIN_EXE_autocomp-store"))
            .args(["serve", "--db", db_url, "--listen", &format!("127.0.0.1:{port}")])
            .env("AUTOCOMP_TOKEN", TOKEN)
            .stderr(Stdio::null())
            .spawn()
            .expect("start autocomp-store");
        let service = Service { child, url: format!("http://127.0.0.1:{port}") };
        wait_for(Instant::now() + Duration::from_secs(20), "the store service", || {
            get(&format!("{}/health", service.url)).map(|(status, _)| status) == Some(200)
        });
        service
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        self.child.kill().ok();
        self.child.wait().ok();
    }
}

#[tokio::test]
async fn nul_and_bidi_text_round_trips_through_the_store_service_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("store.db");
    let service = Service::serve(&format!("sqlite://{}", db.display()));
    let http = HttpStore::with_token(&service.url, Some(TOKEN.into())).unwrap();
    let direct = SqliteStore::open(&db).await.unwrap();
    every_kind_of_text_round_trips(&http, &direct, NASTY).await;
    every_kind_of_text_round_trips_again(&http).await;
}

#[tokio::test]
async fn nul_and_bidi_text_round_trips_through_the_store_service_on_postgresql() {
    let url = autocomp_test_servers::postgres::shared().unique_database();
    let service = Service::serve(&url);
    let http = HttpStore::with_token(&service.url, Some(TOKEN.into())).unwrap();
    let direct = PgStore::open(&url).await.unwrap();
    every_kind_of_text_round_trips(&http, &direct, NASTY).await;
    every_kind_of_text_round_trips_again(&http).await;

    // What PostgreSQL refuses to store is a 400 naming why, not a 503 the client retries.
    let batch = id("B-refused");
    let component = ComponentName::new("reporter").unwrap();
    http.create_batch(NewBatch::new(batch.clone(), BatchType::new("Delivery").unwrap())).await.unwrap();
    let generation = http.claim(&batch, &component, &holder()).await.unwrap().generation();
    let event = NewEvent::new(EventType::new("Data_Reported").unwrap(), Outcome::Failure, holder().agent)
        .with_details(json!({ "transient": "maybe" }))
        .in_run(component, generation);
    let body = json!({ "batch": batch, "event": event }).to_string();
    let (status, answer) =
        autocomp_test_servers::http1::post(&format!("{}/v1/append_event", service.url), Some(TOKEN), body.as_bytes());
    assert_eq!(status, 400, "{answer}");
    assert!(answer.to_string().contains("22P02"), "{answer}");
}

/// The service's own reads give back what was written too.
async fn every_kind_of_text_round_trips_again(http: &HttpStore) {
    let batch = http.get_batch(&id("B-nasty")).await.unwrap();
    assert_eq!(batch.location(), Some(NASTY));
    let reported = batch.events.iter().find(|e| e.details.get("summary").is_some()).unwrap();
    assert_eq!(reported.details, report(NASTY));
}
