//! The `ObjectStore` contract: every operation round-tripped through the port, one suite run
//! against each backend (a real SQLite file; a fresh database on a real PostgreSQL server),
//! so a backend passes the same tests as the others, not a copy of them. Tests of one
//! backend's own files and URLs follow the suite.

use std::sync::Arc;
use std::time::Duration;

use autocomp_model::*;
use autocomp_store::*;
use autocomp_test_servers::XorShift;
use serde_json::{Map, Value, json};

#[path = "contract/bounded.rs"]
mod bounded;
use bounded::*;
#[path = "contract/steering.rs"]
mod steering;
use steering::*;
#[path = "contract/concerning_waits.rs"]
mod concerning_waits;
#[path = "contract/hand_ons.rs"]
mod hand_ons;
#[path = "contract/ready_claims.rs"]
pub(crate) mod ready_claims;
#[path = "contract/registrations.rs"]
pub(crate) mod registrations;
#[path = "contract/retention.rs"]
mod retention;
#[path = "contract/run_outputs.rs"]
mod run_outputs;
use concerning_waits::*;
use hand_ons::*;
use retention::*;
use run_outputs::*;

struct Fixture {
    store: Arc<dyn ObjectStore>,
    /// The store's URL, to open it again with other options.
    url: String,
    /// Keeps the backend's temp files alive for the test.
    _keep: Option<tempfile::TempDir>,
}

async fn sqlite() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.db");
    let store = SqliteStore::open(&path).await.unwrap();
    Fixture { store: Arc::new(store), url: format!("sqlite://{}", path.display()), _keep: Some(dir) }
}

async fn postgres() -> Fixture {
    let url = autocomp_test_servers::postgres::shared().unique_database();
    Fixture { store: Arc::new(PgStore::open(&url).await.unwrap()), url, _keep: None }
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
fn holder(name: &str) -> RunHolder {
    RunHolder {
        agent: agent(&format!("{name}/1.0@host#1")),
        host: "host".into(),
        pid: 1,
        claim_key: None,
        liveness: None,
    }
}
fn round_trip() -> BatchType {
    BatchType::new("RoundTrip").unwrap()
}

async fn register(store: &Arc<dyn ObjectStore>, batch: &str) -> Batch {
    let new = NewBatch::new(id(batch), round_trip()).with_location(format!("/incoming/{batch}"));
    store.create_batch(new).await.unwrap().batch().clone()
}

async fn record(store: &Arc<dyn ObjectStore>, batch: &str, kind: &str, outcome: Outcome) -> Event {
    store.append_event(&id(batch), NewEvent::new(ty(kind), outcome, agent("test"))).await.unwrap()
}

async fn create_is_idempotent_when_identical_and_refuses_conflicts(f: Fixture) {
    let new = NewBatch::new(id("B1-RT1"), round_trip()).with_location("/x").with_priority(3);
    let created = f.store.create_batch(new.clone()).await.unwrap();
    assert!(matches!(created, CreateOutcome::Created(_)));
    let batch = created.batch();
    assert_eq!(batch.location(), Some("/x"));
    assert_eq!(batch.priority, 3);
    assert_eq!(batch.created_seq, batch.modified_seq);
    assert!(batch.events.is_empty());

    let again = f.store.create_batch(new.clone()).await.unwrap();
    assert!(matches!(again, CreateOutcome::AlreadyExists(_)));
    assert_eq!(again.batch().created_seq, batch.created_seq);
    let head = f.store.head().await.unwrap();

    let conflicting = NewBatch { priority: 4, ..new };
    let err = f.store.create_batch(conflicting).await.unwrap_err();
    assert!(matches!(err, StoreError::Conflict(_)), "{err}");
    assert!(err.to_string().contains("priority 3"), "{err}");
    assert_eq!(f.store.head().await.unwrap(), head, "a refused create writes nothing");
}

async fn events_get_increasing_seqs_and_store_time(f: Fixture) {
    let before = Timestamp::now();
    register(&f.store, "B1").await;
    let first = record(&f.store, "B1", "Data_Received", Outcome::Success).await;
    let second = f
        .store
        .append_event(
            &id("B1"),
            NewEvent::new(ty("Checksums_Verified"), Outcome::Failure, agent("checksum-verifier/1.0@h#2"))
                .with_details(json!({"failures": [{"reference": "data/a.tif"}]})),
        )
        .await
        .unwrap();
    assert!(first.seq < second.seq);
    assert!(first.at >= before && second.at >= first.at);

    let batch = f.store.get_batch(&id("B1")).await.unwrap();
    assert_eq!(batch.events, vec![first.clone(), second.clone()]);
    assert_eq!(batch.events[1].details["failures"][0]["reference"], "data/a.tif");
    assert_eq!(batch.changed_seq, second.seq);
    assert_eq!(batch.modified_seq, batch.created_seq, "event appends never move modified_seq");
}

async fn unknown_batches_are_not_found(f: Fixture) {
    let missing = id("nope");
    assert!(matches!(f.store.get_batch(&missing).await, Err(StoreError::NotFound(_))));
    let event = NewEvent::new(ty("X"), Outcome::Success, agent("a"));
    assert!(matches!(f.store.append_event(&missing, event).await, Err(StoreError::NotFound(_))));
    assert!(matches!(f.store.set_priority(&missing, 1).await, Err(StoreError::NotFound(_))));
    assert!(matches!(f.store.claim(&missing, &component("c"), &holder("c")).await, Err(StoreError::NotFound(_))));
    assert_eq!(f.store.head().await.unwrap(), Seq::ZERO);
}

async fn get_and_list_batches_page_through_everything(f: Fixture) {
    for n in 0..25 {
        register(&f.store, &format!("B{n:03}")).await;
    }
    let mut seen = Vec::new();
    let mut after = None;
    loop {
        let page = f.store.list_batches(after.as_ref(), 10).await.unwrap();
        if page.is_empty() {
            break;
        }
        after = page.last().map(|b| b.id.clone());
        seen.extend(page.into_iter().map(|b| b.id.to_string()));
    }
    let expected: Vec<String> = (0..25).map(|n| format!("B{n:03}")).collect();
    assert_eq!(seen, expected);

    let some = f.store.get_batches(&[id("B007"), id("missing"), id("B001")]).await.unwrap();
    let ids: Vec<_> = some.iter().map(|b| b.id.as_str()).collect();
    assert_eq!(ids, ["B007", "B001"]);

    let err = f.store.list_batches(None, 1_000_000).await.unwrap_err();
    assert!(err.to_string().contains("limit"), "{err}");
}

async fn a_page_of_batches_reads_as_each_batch_alone(f: Fixture) {
    for batch in ["B1", "B2", "B3"] {
        register(&f.store, batch).await;
    }
    // Logs interleaved across the batches, with a reset, runs open and closed.
    record(&f.store, "B2", "Data_Received", Outcome::Success).await;
    record(&f.store, "B1", "Data_Received", Outcome::Success).await;
    record(&f.store, "B1", "Checksums_Verified", Outcome::Failure).await;
    let reset = NewEvent::reset(vec![ty("Checksums_Verified")], agent("operator:bob"), json!({"reason": "rerun"}));
    f.store.append_event(&id("B1"), reset).await.unwrap();
    let archiver = component("archiver");
    let done = f.store.claim(&id("B2"), &archiver, &holder("a")).await.unwrap();
    let result = NewEvent::new(ty("Data_Archived"), Outcome::Success, agent("a"))
        .with_details(json!({"files": [1, 2], "nested": {"deep": true}}))
        .in_run(archiver.clone(), done.generation());
    f.store.append_event(&id("B2"), result).await.unwrap();
    f.store.claim(&id("B1"), &archiver, &holder("a")).await.unwrap();
    f.store.claim(&id("B1"), &component("checker"), &holder("c")).await.unwrap();
    f.store.claim(&id("B3"), &archiver, &holder("a")).await.unwrap();
    record(&f.store, "B3", "Data_Received", Outcome::Success).await;

    let page = f.store.get_batches(&[id("B3"), id("missing"), id("B1"), id("B2")]).await.unwrap();
    assert_eq!(page.iter().map(|b| b.id.as_str()).collect::<Vec<_>>(), ["B3", "B1", "B2"]);
    for mut batch in page {
        let mut alone = f.store.get_batch(&batch.id).await.unwrap();
        alone.as_of = batch.as_of;
        assert_eq!(batch, alone, "{} reads the same in a page as alone", batch.id);
        batch.events.sort_by_key(|event| event.seq);
        assert_eq!(batch.events, alone.events, "events in seq order");
    }
    let b1 = f.store.get_batch(&id("B1")).await.unwrap();
    assert_eq!(b1.events.len(), 3);
    assert_eq!(b1.events[2].resets, vec![ty("Checksums_Verified")]);
    assert_eq!(b1.open_runs.len(), 2, "both components' open runs");
    let listed = f.store.list_batches(None, 10).await.unwrap();
    assert_eq!(listed.iter().map(|b| b.events.len()).collect::<Vec<_>>(), [3, 2, 1]);
}

async fn priority_and_content_changes(f: Fixture) {
    let created = register(&f.store, "B1").await;
    let event = record(&f.store, "B1", "Data_Received", Outcome::Success).await;

    let priority_seq = f.store.set_priority(&id("B1"), 7).await.unwrap();
    let batch = f.store.get_batch(&id("B1")).await.unwrap();
    assert_eq!(batch.priority, 7);
    assert_eq!(batch.changed_seq, priority_seq);
    assert_eq!(batch.modified_seq, created.modified_seq, "priority is not content");

    let mut patch = Map::new();
    patch.insert("location".into(), json!("/incoming/B1-redelivered"));
    patch.insert("pages".into(), json!(12));
    let content_seq = f.store.record_content_change(&id("B1"), patch).await.unwrap();
    let batch = f.store.get_batch(&id("B1")).await.unwrap();
    assert_eq!(batch.location(), Some("/incoming/B1-redelivered"));
    assert_eq!(batch.metadata["pages"], 12);
    assert_eq!(batch.modified_seq, content_seq);
    assert!(event.seq < batch.modified_seq, "the earlier event is now older than the content");

    let mut removal = Map::new();
    removal.insert("pages".into(), Value::Null);
    f.store.record_content_change(&id("B1"), removal).await.unwrap();
    assert!(!f.store.get_batch(&id("B1")).await.unwrap().metadata.contains_key("pages"));
}

async fn the_effective_view_honours_reset_markers(f: Fixture) {
    register(&f.store, "B1").await;
    record(&f.store, "B1", "Data_Received", Outcome::Success).await;
    record(&f.store, "B1", "Checksums_Verified", Outcome::Failure).await;
    let structure = record(&f.store, "B1", "Structure_Checked", Outcome::Success).await;
    let reset = f
        .store
        .append_event(
            &id("B1"),
            NewEvent::reset(
                vec![ty("Checksums_Verified")],
                agent("operator:alice"),
                json!({"reason": "disk replaced"}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(reset.resets, vec![ty("Checksums_Verified")]);

    let batch = f.store.get_batch(&id("B1")).await.unwrap();
    assert_eq!(batch.events.len(), 4, "history is never deleted");
    let view = batch.effective();
    assert!(view.get(&ty("Checksums_Verified")).is_none());
    assert_eq!(view.get(&ty("Structure_Checked")), Some(&structure));
    assert_eq!(view.len(), 2);

    let trigger = Trigger {
        requires: vec![ty("Data_Received")],
        blocked_by: vec![ty("Checksums_Verified")],
        ..Trigger::default()
    };
    assert!(trigger.matches(&batch), "the reset makes the checksum step ready again");
    let again = record(&f.store, "B1", "Checksums_Verified", Outcome::Success).await;
    let batch = f.store.get_batch(&id("B1")).await.unwrap();
    assert_eq!(batch.effective().get(&ty("Checksums_Verified")), Some(&again));
    assert!(!trigger.matches(&batch));
}

async fn claims_fence_stale_and_closed_runs(f: Fixture) {
    register(&f.store, "B1").await;
    let verifier = component("checksum-verifier");
    let first = f.store.claim(&id("B1"), &verifier, &holder("first")).await.unwrap();
    assert_eq!(first.generation(), 1);
    assert!(first.abandoned.is_none());
    assert_eq!(f.store.get_batch(&id("B1")).await.unwrap().open_run(&verifier), Some(&first.run));

    // The first holder stalls; a second one claims over its open run.
    let second = f.store.claim(&id("B1"), &verifier, &holder("second")).await.unwrap();
    assert_eq!(second.generation(), 2);
    let abandoned = second.abandoned.clone().expect("the open run is marked abandoned");
    assert_eq!(abandoned.generation, 1);
    assert_eq!(abandoned.state, RunState::Abandoned);
    assert_eq!(f.store.open_runs(Some(&verifier)).await.unwrap(), vec![second.run.clone()]);

    let head = f.store.head().await.unwrap();
    let result = |generation| {
        NewEvent::new(ty("Checksums_Verified"), Outcome::Success, agent("v")).in_run(verifier.clone(), generation)
    };
    let stale = f.store.append_event(&id("B1"), result(1)).await.unwrap_err();
    assert!(stale.is_fenced(), "{stale}");
    assert!(stale.to_string().contains("generation 2"), "{stale}");
    assert_eq!(f.store.head().await.unwrap(), head, "a fenced append writes nothing");

    let recorded = f.store.append_event(&id("B1"), result(2)).await.unwrap();
    assert_eq!(recorded.run, Some(RunRef { component: verifier.clone(), generation: 2 }));
    let closed = f.store.append_event(&id("B1"), result(2)).await.unwrap_err();
    assert!(closed.to_string().contains("already closed (recorded)"), "{closed}");
    assert!(f.store.open_runs(None).await.unwrap().is_empty());

    let never = f.store.append_event(&id("B1"), result(1).in_run(component("archiver"), 1)).await.unwrap_err();
    assert!(never.to_string().contains("never claimed"), "{never}");

    let batch = f.store.get_batch(&id("B1")).await.unwrap();
    assert_eq!(batch.events, vec![recorded], "exactly one result");
}

async fn release_closes_a_run_without_an_event(f: Fixture) {
    register(&f.store, "B1").await;
    let c = component("archiver");
    let claim = f.store.claim(&id("B1"), &c, &holder("a")).await.unwrap();
    f.store.release(&id("B1"), &c, claim.generation()).await.unwrap();
    let batch = f.store.get_batch(&id("B1")).await.unwrap();
    assert!(batch.events.is_empty() && batch.open_runs.is_empty());
    let head = f.store.head().await.unwrap();
    f.store.release(&id("B1"), &c, claim.generation()).await.expect("releasing twice is a no-op (a retry)");
    assert_eq!(f.store.head().await.unwrap(), head, "the second release wrote nothing");
    let late = NewEvent::new(ty("Data_Archived"), Outcome::Success, agent("a")).in_run(c.clone(), claim.generation());
    assert!(f.store.append_event(&id("B1"), late).await.unwrap_err().is_fenced());
    let next = f.store.claim(&id("B1"), &c, &holder("b")).await.unwrap();
    assert!(next.abandoned.is_none(), "a released run is not abandoned");
}

async fn failed_attempts_count_abandoned_and_transient_runs_since_a_seq(f: Fixture) {
    register(&f.store, "B1").await;
    let c = component("exec");
    let b = id("B1");
    f.store.claim(&b, &c, &holder("a")).await.unwrap(); // dies
    let second = f.store.claim(&b, &c, &holder("b")).await.unwrap(); // abandons the first
    let transient = NewEvent::new(ty("Exec_Done"), Outcome::Failure, agent("b"))
        .with_details(json!({"transient": true}))
        .in_run(c.clone(), second.generation());
    f.store.append_event(&b, transient).await.unwrap();
    let third = f.store.claim(&b, &c, &holder("c")).await.unwrap();
    f.store.release(&b, &c, third.generation()).await.unwrap(); // graceful shutdown: no attempt
    assert_eq!(f.store.failed_attempts(&b, &c, Seq::ZERO).await.unwrap(), 2);
    assert_eq!(f.store.failed_attempts(&b, &c, second.run.claim_seq).await.unwrap(), 0);
    assert_eq!(f.store.failed_attempts(&b, &component("other"), Seq::ZERO).await.unwrap(), 0);
}

async fn checkpoints_survive_an_abandoned_run_and_a_transient_failure_and_vanish_with_a_result(f: Fixture) {
    register(&f.store, "B1").await;
    let (b, c) = (id("B1"), component("archiver"));
    assert_eq!(f.store.load_checkpoint(&b, &c).await.unwrap(), None);
    let first = f.store.claim(&b, &c, &holder("a")).await.unwrap();
    f.store.save_checkpoint(&b, &c, first.generation(), json!({"copied": 10})).await.unwrap();
    f.store.save_checkpoint(&b, &c, first.generation(), json!({"copied": 20})).await.unwrap();

    // The holder dies; the next attempt sees how far it got, and the dead one is fenced.
    let second = f.store.claim(&b, &c, &holder("b")).await.unwrap();
    assert_eq!(f.store.load_checkpoint(&b, &c).await.unwrap(), Some(json!({"copied": 20})));
    let stale = f.store.save_checkpoint(&b, &c, first.generation(), json!({"copied": 30})).await.unwrap_err();
    assert!(stale.is_fenced(), "{stale}");
    let err = f.store.save_checkpoint(&b, &c, second.generation(), json!([1])).await.unwrap_err();
    assert!(matches!(&err, StoreError::Invalid(e) if e.field == "checkpoint"), "{err}");

    // A transient failure is retried: the retry resumes from the checkpoint too.
    f.store.save_checkpoint(&b, &c, second.generation(), json!({"copied": 25})).await.unwrap();
    let transient = NewEvent::new(ty("Data_Archived"), Outcome::Failure, agent("b"))
        .with_details(json!({"transient": true, "summary": "share unmounted"}))
        .in_run(c.clone(), second.generation());
    f.store.append_event(&b, transient).await.unwrap();
    assert_eq!(f.store.load_checkpoint(&b, &c).await.unwrap(), Some(json!({"copied": 25})), "kept for the retry");

    let third = f.store.claim(&b, &c, &holder("c")).await.unwrap();
    let done = NewEvent::new(ty("Data_Archived"), Outcome::Success, agent("c")).in_run(c.clone(), third.generation());
    f.store.append_event(&b, done).await.unwrap();
    assert_eq!(f.store.load_checkpoint(&b, &c).await.unwrap(), None, "a recorded result ends the checkpoint");
}

async fn the_change_feed_lists_each_changed_batch_once_in_order(f: Fixture) {
    for name in ["A", "B", "C"] {
        register(&f.store, name).await;
    }
    let after_creation = f.store.head().await.unwrap();
    record(&f.store, "A", "Data_Received", Outcome::Success).await;
    f.store.set_priority(&id("C"), 5).await.unwrap();
    f.store.claim(&id("B"), &component("c"), &holder("c")).await.unwrap();
    record(&f.store, "A", "Other", Outcome::Success).await;

    let page = f.store.changes(after_creation, 100).await.unwrap();
    let ids: Vec<_> = page.changes.iter().map(|(_, id)| id.as_str()).collect();
    assert_eq!(ids, ["C", "B", "A"]);
    assert!(page.changes.windows(2).all(|w| w[0].0 < w[1].0));
    assert_eq!(page.next, page.head);
    assert_eq!(page.head, f.store.head().await.unwrap());

    // Paging: a full page continues from its last entry.
    let first = f.store.changes(Seq::ZERO, 2).await.unwrap();
    assert_eq!(first.changes.len(), 2);
    assert_eq!(first.next, first.changes[1].0);
    let rest = f.store.changes(first.next, 2).await.unwrap();
    assert_eq!(rest.changes.len(), 1);
    assert_eq!(rest.next, rest.head);
    let empty = f.store.changes(rest.next, 2).await.unwrap();
    assert!(empty.changes.is_empty());
    assert_eq!(empty.next, rest.next);

    // What a watcher's look reads: the same pages, each changed batch with its summary.
    for (since, limit) in [(after_creation, 100), (Seq::ZERO, 2), (first.next, 2), (rest.next, 2)] {
        let (page, summaries) = f.store.changed_summaries(since, limit).await.unwrap();
        let alone = f.store.changes(since, limit).await.unwrap();
        assert_eq!((&page.changes, page.next, page.head), (&alone.changes, alone.next, alone.head), "from {since:?}");
        let ids: Vec<_> = page.changes.iter().map(|(_, id)| id.clone()).collect();
        assert_eq!(summaries, f.store.get_summaries(&ids).await.unwrap(), "from {since:?}");
        assert!(summaries.iter().zip(&page.changes).all(|(s, (seq, _))| s.changed_seq == *seq));
    }
    let err = f.store.changed_summaries(Seq::ZERO, 10_001).await.unwrap_err();
    assert!(matches!(&err, StoreError::Invalid(e) if e.field == "limit"), "a page past the bound is refused: {err}");
}

async fn an_idempotent_retry_returns_the_first_event(f: Fixture) {
    register(&f.store, "B1").await;
    let c = component("verifier");
    let claim = f.store.claim(&id("B1"), &c, &holder("v")).await.unwrap();
    let key = IdempotencyKey::new("run-1-attempt").unwrap();
    let event = NewEvent::new(ty("Verified"), Outcome::Success, agent("v"))
        .in_run(c.clone(), claim.generation())
        .with_idempotency_key(key.clone());
    let first = f.store.append_event(&id("B1"), event.clone()).await.unwrap();
    let retry = f.store.append_event(&id("B1"), event.clone()).await.unwrap();
    assert_eq!(first, retry, "the retry is answered with the first event, though the run is closed");
    assert_eq!(f.store.get_batch(&id("B1")).await.unwrap().events.len(), 1);
    let different = NewEvent { outcome: Outcome::Failure, ..event };
    let err = f.store.append_event(&id("B1"), different).await.unwrap_err();
    assert!(matches!(err, StoreError::Conflict(_)), "{err}");
}

async fn bad_input_is_refused_by_name_and_writes_nothing(f: Fixture) {
    register(&f.store, "B1").await;
    let head = f.store.head().await.unwrap();

    let huge = json!({"blob": "x".repeat(MAX_DOCUMENT_BYTES)});
    let err = f
        .store
        .append_event(&id("B1"), NewEvent::new(ty("X"), Outcome::Success, agent("a")).with_details(huge.clone()))
        .await
        .unwrap_err();
    assert!(matches!(&err, StoreError::Invalid(e) if e.field == "details"), "{err}");
    assert!(err.to_string().contains("at most 1048576"), "{err}");

    let err = f
        .store
        .append_event(&id("B1"), NewEvent::new(ty("X"), Outcome::Success, agent("a")).with_details(json!([1, 2])))
        .await
        .unwrap_err();
    assert!(matches!(&err, StoreError::Invalid(e) if e.field == "details"), "{err}");

    let not_object = NewBatch { metadata: json!("just a string"), ..NewBatch::new(id("B2"), round_trip()) };
    let err = f.store.create_batch(not_object).await.unwrap_err();
    assert!(matches!(&err, StoreError::Invalid(e) if e.field == "metadata" && e.value.contains("just a string")));

    let too_big = NewBatch { metadata: huge, ..NewBatch::new(id("B3"), round_trip()) };
    let err = f.store.create_batch(too_big).await.unwrap_err();
    assert!(matches!(&err, StoreError::Invalid(e) if e.field == "metadata"), "{err}");

    let resets_without_marker =
        NewEvent { resets: vec![ty("Y")], ..NewEvent::new(ty("X"), Outcome::Success, agent("a")) };
    let err = f.store.append_event(&id("B1"), resets_without_marker).await.unwrap_err();
    assert!(matches!(&err, StoreError::Invalid(e) if e.field == "resets"), "{err}");
    let empty_reset = NewEvent::reset(vec![], agent("operator:bob"), json!({}));
    assert!(f.store.append_event(&id("B1"), empty_reset).await.is_err());

    let bad_host = RunHolder { host: "two words".into(), ..holder("a") };
    let err = f.store.claim(&id("B1"), &component("c"), &bad_host).await.unwrap_err();
    assert!(matches!(&err, StoreError::Invalid(e) if e.field == "host" && e.value == "two words"), "{err}");

    // Names arriving as JSON (the HTTP service, configs) are validated while parsing.
    let err = serde_json::from_value::<NewBatch>(json!({"id": "../../etc", "type": "RoundTrip"})).unwrap_err();
    assert!(err.to_string().contains("invalid batch id \"../../etc\""), "{err}");
    let err =
        serde_json::from_value::<NewEvent>(json!({"type": "no spaces allowed", "outcome": "success", "agent": "a"}))
            .unwrap_err();
    assert!(err.to_string().contains("invalid event type"), "{err}");
    let err = serde_json::from_value::<NewEvent>(json!({"type": "X", "outcome": "maybe", "agent": "a"})).unwrap_err();
    assert!(err.to_string().contains("maybe"), "{err}");

    assert_eq!(f.store.head().await.unwrap(), head, "nothing was written");
    assert_eq!(f.store.get_batch(&id("B1")).await.unwrap().events.len(), 0);
    assert!(matches!(f.store.get_batch(&id("B2")).await, Err(StoreError::NotFound(_))));
}

#[tokio::test]
async fn the_schema_is_versioned_and_a_newer_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.db");
    let store = SqliteStore::open(&path).await.unwrap();
    assert_eq!(store.schema_version().await.unwrap(), LATEST_SCHEMA_VERSION);
    store.create_batch(NewBatch::new(id("B1"), round_trip())).await.unwrap();
    drop(store);

    // Reopening migrates nothing and keeps the data.
    let store = SqliteStore::open(&path).await.unwrap();
    assert_eq!(store.get_batch(&id("B1")).await.unwrap().id, id("B1"));
    drop(store);

    // A file written by a newer release is refused with a clear message, untouched.
    mark_as_future_schema(&path, LATEST_SCHEMA_VERSION + 1);
    let err = SqliteStore::open(&path).await.err().expect("refused");
    assert!(err.to_string().contains("newer than this release"), "{err}");
}

#[tokio::test]
async fn an_old_store_file_is_upgraded_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.db");
    SqliteStore::create_at_schema_version(&path, 1).unwrap();
    let store = SqliteStore::open(&path).await.unwrap();
    assert_eq!(store.schema_version().await.unwrap(), LATEST_SCHEMA_VERSION);
    // What version 2 added works on the upgraded file.
    store.create_batch(NewBatch::new(id("B1"), round_trip())).await.unwrap();
    let claim = store.claim(&id("B1"), &component("c"), &holder("c")).await.unwrap();
    store.save_checkpoint(&id("B1"), &component("c"), claim.generation(), json!({"step": 1})).await.unwrap();
    assert_eq!(store.load_checkpoint(&id("B1"), &component("c")).await.unwrap(), Some(json!({"step": 1})));
}

/// `migrate=false` (how `autocomp doctor` opens a store) looks without writing: an older file
/// is refused with what to do and left at its version, a missing one is not created.
#[tokio::test]
async fn without_migrate_an_old_file_is_refused_untouched_and_a_missing_one_is_not_made() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.db");
    SqliteStore::create_at_schema_version(&path, 6).unwrap();
    let looking = |path: &std::path::Path| format!("sqlite://{}?migrate=false", path.display());
    let err = open_store(&looking(&path)).await.err().expect("an old file is refused");
    let text = err.to_string();
    assert!(text.contains("schema version 6") && text.contains(&format!("needs {LATEST_SCHEMA_VERSION}")), "{text}");
    let conn = rusqlite::Connection::open(&path).unwrap();
    let version: i64 = conn.query_row("SELECT MAX(version) FROM schema_version", [], |row| row.get(0)).unwrap();
    assert_eq!(version, 6, "nothing was migrated");

    let missing = dir.path().join("typo.db");
    let err = open_store(&looking(&missing)).await.err().expect("a missing file is refused");
    assert!(err.to_string().contains("no store file"), "{err}");
    assert!(!missing.exists(), "no file was made for a mistyped path");

    let err = open_store(&format!("sqlite://{}?migrate=maybe", path.display())).await.err().expect("refused");
    assert!(err.to_string().contains("migrate=\"maybe\""), "{err}");

    // Current, it opens and reads as usual.
    SqliteStore::open(&path).await.unwrap();
    let store = open_store(&looking(&path)).await.unwrap();
    assert_eq!(store.about().await.unwrap().schema_version, LATEST_SCHEMA_VERSION);
}

/// A process of the previous release may still hold the file after the upgrade: its writes
/// move `changed_seq` without the summary (or leave it empty). Such summaries are computed
/// from the log instead of trusted, on read and on the next write.
#[tokio::test]
async fn writes_that_bypass_the_summary_are_read_from_the_log_and_healed_by_the_next_write() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.db");
    let store = SqliteStore::open(&path).await.unwrap();
    let dyn_store: Arc<dyn ObjectStore> = Arc::new(SqliteStore::open(&path).await.unwrap());
    register(&dyn_store, "B1").await;
    record(&dyn_store, "B1", "Data_Received", Outcome::Success).await;
    {
        // As the previous release wrote: an event without a summary update, a batch
        // created with the column's default.
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(
            r#"UPDATE store_head SET seq = seq + 1;
             INSERT INTO events (seq, batch_id, type, outcome, agent, at, details)
                 SELECT seq, 'B1', 'Checksums_Verified', 'failure', 'old', 99999, '{"transient": true}' FROM store_head;
             UPDATE batches SET changed_seq = (SELECT seq FROM store_head) WHERE id = 'B1';
             UPDATE store_head SET seq = seq + 1;
             INSERT INTO batches (id, type, priority, metadata, created_seq, modified_seq, changed_seq, created_at, modified_at)
                 SELECT 'B2', 'RoundTrip', 0, '{}', seq, seq, seq, 5000, 5000 FROM store_head;"#,
        )
        .unwrap();
    }
    let ids = [id("B2"), id("B1")];
    let whole = |batches: Vec<Batch>| batches.iter().map(BatchSummary::of).collect::<Vec<_>>();
    let summaries = store.get_summaries(&ids).await.unwrap();
    assert_eq!(summaries, whole(store.get_batches(&ids).await.unwrap()));
    assert_eq!(summaries[1].effective.len(), 2, "the bypassing event is in the summary");
    assert!(summaries[1].effective[0].transient);
    let listed = store.list_summaries(None, 10).await.unwrap();
    assert_eq!(listed, whole(store.list_batches(None, 10).await.unwrap()));

    // The next write starts from the log, and its own change lands once.
    let claim = dyn_store.claim(&id("B2"), &component("archiver"), &holder("archiver")).await.unwrap();
    record(&dyn_store, "B1", "Structure_Checked", Outcome::Success).await;
    let summaries = store.get_summaries(&ids).await.unwrap();
    assert_eq!(summaries, whole(store.get_batches(&ids).await.unwrap()));
    assert_eq!(summaries[0].running, [component("archiver")]);
    assert_eq!(summaries[1].effective.len(), 3);
    dyn_store.release(&id("B2"), &component("archiver"), claim.generation()).await.unwrap();
    assert!(store.get_summaries(&[id("B2")]).await.unwrap()[0].running.is_empty());
}

#[tokio::test]
async fn a_version_6_file_gets_the_summary_of_every_batch_when_upgraded() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.db");
    SqliteStore::create_at_schema_version(&path, 6).unwrap();
    {
        // Rows as a version-6 release wrote them (no summary column): B1 with a log that a
        // Reset partly undoes, B2 with a transient failure recorded in a run and two runs
        // still open, B3 with nothing yet.
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(
            r#"UPDATE store_head SET seq = 12;
             INSERT INTO batches (id, type, priority, metadata, created_seq, modified_seq, changed_seq, created_at, modified_at)
                 VALUES ('B1', 'RoundTrip', 2, '{"location": "/incoming/B1"}', 1, 1, 7, 1000, 1000),
                        ('B2', 'RoundTrip', 0, '{}', 2, 12, 12, 1100, 9000),
                        ('B3', 'Other', -1, '{}', 3, 3, 3, 1200, 1200);
             INSERT INTO events (seq, batch_id, type, outcome, agent, at, details, run_component, run_generation, resets, idempotency_key)
                 VALUES (4, 'B1', 'Data_Received', 'success', 'test', 2000, '{}', NULL, NULL, NULL, NULL),
                        (5, 'B1', 'Checksums_Verified', 'failure', 'v', 2100, '{"transient": true}', NULL, NULL, NULL, 'k-5'),
                        (6, 'B1', 'Structure_Checked', 'failure', 's', 2200, '{"transient": false}', NULL, NULL, NULL, NULL),
                        (7, 'B1', 'Reset', 'success', 'operator:alice', 2300, '{"reason": "rerun"}', NULL, NULL, '["Checksums_Verified"]', NULL),
                        (9, 'B2', 'Data_Archived', 'failure', 'a', 3000, '{"transient": true}', 'archiver', 1, NULL, NULL);
             INSERT INTO claims (batch_id, component, generation)
                 VALUES ('B2', 'archiver', 2), ('B2', 'checker', 1), ('B1', 'verifier', 1);
             INSERT INTO runs (batch_id, component, generation, agent, host, pid, started_at, claim_seq, state, ended_at, transient, claim_key)
                 VALUES ('B2', 'archiver', 1, 'a/1@h#1', 'h', 1, 2900, 8, 'recorded', 3000, 1, NULL),
                        ('B2', 'archiver', 2, 'a/1@h#2', 'h', 2, 3100, 10, 'open', NULL, 0, 'pass-1'),
                        ('B2', 'checker', 1, 'c/1@h#1', 'h', 3, 3200, 11, 'open', NULL, 0, NULL),
                        ('B1', 'verifier', 1, 'v/1@h#1', 'h', 4, 2050, 4, 'released', 2060, 0, NULL);"#,
        )
        .unwrap();
        // And more batches than the migration fills in per page, each with an event.
        conn.execute_batch(
            "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < 2499)
             INSERT INTO batches (id, type, priority, metadata, created_seq, modified_seq, changed_seq, created_at, modified_at)
                 SELECT printf('P%04d', i), 'RoundTrip', 0, '{}', 100 + 2 * i, 100 + 2 * i, 101 + 2 * i, 5000, 5000 FROM n;
             INSERT INTO events (seq, batch_id, type, outcome, agent, at, details)
                 SELECT changed_seq, id, 'Data_Received', 'success', 'test', 6000 + changed_seq, '{}'
                 FROM batches WHERE id LIKE 'P%';
             UPDATE store_head SET seq = (SELECT MAX(changed_seq) FROM batches);",
        )
        .unwrap();
    }
    let store = SqliteStore::open(&path).await.unwrap();
    assert_eq!(store.schema_version().await.unwrap(), LATEST_SCHEMA_VERSION);
    let ids = [id("B3"), id("B-unknown"), id("B1"), id("B2")];
    let summaries = store.get_summaries(&ids).await.unwrap();
    let whole: Vec<BatchSummary> = store.get_batches(&ids).await.unwrap().iter().map(BatchSummary::of).collect();
    assert_eq!(summaries, whole, "the migration filled in each batch's summary");
    let listed = store.list_summaries(None, 3).await.unwrap();
    assert_eq!(listed.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(), ["B1", "B2", "B3"]);
    let all = store.list_summaries(None, 10_000).await.unwrap();
    let all_whole: Vec<BatchSummary> =
        store.list_batches(None, 10_000).await.unwrap().iter().map(BatchSummary::of).collect();
    assert_eq!(all.len(), 2_503);
    if let Some((got, expected)) = all.iter().zip(&all_whole).find(|(got, expected)| got != expected) {
        panic!("every page of the migration is filled in; {}:\n  got:      {got:?}\n  expected: {expected:?}", got.id);
    }
    let last = all.last().unwrap();
    assert_eq!((last.id.as_str(), last.effective.len(), last.last_activity), ("P2499", 1, Timestamp(6000 + 5099)));

    // What the rows say, spelled out (not only that the two reads agree).
    let [b3, b1, b2] = &summaries[..] else { panic!("three summaries: {summaries:?}") };
    let effective = |s: &BatchSummary| -> Vec<(String, Outcome, i64, bool)> {
        s.effective.iter().map(|e| (e.event_type.to_string(), e.outcome, e.seq.0, e.transient)).collect()
    };
    assert_eq!(
        effective(b1),
        [
            ("Data_Received".into(), Outcome::Success, 4, false),
            ("Structure_Checked".into(), Outcome::Failure, 6, false)
        ],
        "the Reset took Checksums_Verified out"
    );
    assert_eq!((b1.priority, b1.changed_seq, b1.last_activity), (2, Seq(7), Timestamp(2300)));
    assert!(b1.running.is_empty(), "a released run is not running");
    assert_eq!(effective(b2), [("Data_Archived".into(), Outcome::Failure, 9, true)]);
    assert_eq!(b2.running, [component("archiver"), component("checker")]);
    assert_eq!((b2.modified_seq, b2.last_activity), (Seq(12), Timestamp(9000)), "the content change is later");
    assert_eq!((b3.batch_type.as_str(), b3.priority, b3.last_activity), ("Other", -1, Timestamp(1200)));
    assert!(b3.effective.is_empty() && b3.running.is_empty());

    // Writes after the upgrade carry on from the filled-in summaries.
    let archived = NewEvent::new(ty("Data_Archived"), Outcome::Success, agent("a")).in_run(component("archiver"), 2);
    store.append_event(&id("B2"), archived).await.unwrap();
    store.claim(&id("B1"), &component("verifier"), &holder("v")).await.unwrap();
    let reset = NewEvent::reset(vec![ty("Structure_Checked")], agent("operator:bob"), json!({}));
    store.append_event(&id("B1"), reset).await.unwrap();
    let summaries = store.get_summaries(&ids).await.unwrap();
    let whole: Vec<BatchSummary> = store.get_batches(&ids).await.unwrap().iter().map(BatchSummary::of).collect();
    assert_eq!(summaries, whole);
    assert_eq!(summaries[1].running, [component("verifier")]);
    assert_eq!(summaries[2].running, [component("checker")]);
    assert_eq!(effective(&summaries[1]), [("Data_Received".into(), Outcome::Success, 4, false)]);
}

/// Marks the file as written by a future release, as that release's migration would.
fn mark_as_future_schema(path: &std::path::Path, version: i64) {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.execute("INSERT INTO schema_version (version, applied_at) VALUES (?1, 0)", [version]).unwrap();
}

#[tokio::test]
async fn open_store_understands_urls() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}?synchronous=normal&busy_timeout=5s", dir.path().join("s.db").display());
    let store = open_store(&url).await.unwrap();
    assert_eq!(store.head().await.unwrap(), Seq::ZERO);
    for (bad, says) in [
        ("mysql://x", "unknown scheme"),
        ("sqlite://", "names no file"),
        ("sqlite:///tmp/x.db?synchronous=sometimes", "sometimes"),
        ("sqlite:///tmp/x.db?colour=blue", "colour"),
    ] {
        let err = open_store(bad).await.err().expect("refused");
        assert!(err.to_string().contains("store url") && err.to_string().contains(says), "{bad}: {err}");
    }
}

fn cancelled_failure(kind: &str) -> NewEvent {
    NewEvent::new(ty(kind), Outcome::Failure, agent("operator:alice"))
        .with_details(json!({"cancelled": true, "reason": "wrong delivery"}))
}

async fn cancel_run_fences_the_open_run_and_records_one_cancelled_failure(f: Fixture) {
    register(&f.store, "B1").await;
    let (b, c) = (id("B1"), component("archiver"));
    let claim = f.store.claim(&b, &c, &holder("worker")).await.unwrap();
    f.store.save_checkpoint(&b, &c, claim.generation(), json!({"copied": 1})).await.unwrap();
    let head = f.store.head().await.unwrap();

    let cancellation = f.store.cancel_run(&b, &c, cancelled_failure("Data_Archived")).await.unwrap();
    assert_eq!(f.store.head().await.unwrap(), Seq(head.0 + 1), "one change, one seq");
    let run = cancellation.run.clone().expect("the open run was cancelled");
    assert_eq!((run.generation, run.state), (claim.generation(), RunState::Cancelled));
    assert!(run.ended_at.is_some());
    let event = &cancellation.event;
    assert_eq!((event.outcome, event.run.clone()), (Outcome::Failure, None));
    assert!(event.flag("cancelled"));
    assert_eq!(event.details["reason"], "wrong delivery");
    assert_eq!(event.details["cancelled_run"]["generation"], claim.generation());
    assert_eq!(event.details["cancelled_run"]["agent"], "worker/1.0@host#1");

    // The worker is fenced from every write it might still try.
    let late = NewEvent::new(ty("Data_Archived"), Outcome::Success, agent("worker")).in_run(c.clone(), 1);
    let err = f.store.append_event(&b, late).await.unwrap_err();
    assert!(err.is_fenced(), "{err}");
    assert!(f.store.release(&b, &c, 1).await.unwrap_err().is_fenced());
    assert!(f.store.save_checkpoint(&b, &c, 1, json!({"copied": 2})).await.unwrap_err().is_fenced());
    // Nobody holds the generation the cancel moved to.
    let ghost = NewEvent::new(ty("Data_Archived"), Outcome::Success, agent("x")).in_run(c.clone(), 2);
    let err = f.store.append_event(&b, ghost).await.unwrap_err();
    assert!(err.is_fenced() && err.to_string().contains("never claimed"), "{err}");

    let batch = f.store.get_batch(&b).await.unwrap();
    assert!(batch.open_runs.is_empty());
    assert_eq!(batch.events, vec![cancellation.event.clone()], "exactly one result: the cancelled failure");
    assert_eq!(batch.changed_seq, event.seq, "the change feed sees the cancel");
    // A cancel is an operator's decision, not a crash: no failed attempt, and the next claim
    // (after a rerun) is not told it took an abandoned run over.
    assert_eq!(f.store.failed_attempts(&b, &c, Seq::ZERO).await.unwrap(), 0);
    let next = f.store.claim(&b, &c, &holder("next")).await.unwrap();
    assert_eq!(next.generation(), claim.generation() + 2);
    assert!(next.abandoned.is_none());
}

async fn cancel_run_without_an_open_run_only_records_the_failure(f: Fixture) {
    register(&f.store, "B1").await;
    let (b, c) = (id("B1"), component("archiver"));
    let done = f.store.claim(&b, &c, &holder("w")).await.unwrap();
    let result = NewEvent::new(ty("Data_Archived"), Outcome::Success, agent("w")).in_run(c.clone(), done.generation());
    f.store.append_event(&b, result).await.unwrap();

    let cancellation = f.store.cancel_run(&b, &c, cancelled_failure("Data_Archived")).await.unwrap();
    assert_eq!(cancellation.run, None);
    assert!(cancellation.event.details.get("cancelled_run").is_none());
    let batch = f.store.get_batch(&b).await.unwrap();
    let effective = batch.effective().get(&ty("Data_Archived")).cloned().unwrap();
    assert_eq!(effective, cancellation.event, "the failure supersedes the earlier success");
    assert_eq!(batch.events.len(), 2, "the earlier result is still in the log");
    assert_eq!(f.store.claim(&b, &c, &holder("w")).await.unwrap().generation(), done.generation() + 1);

    // A never-claimed (batch, component) gets no claim row from a cancel.
    let other = component("never-ran");
    f.store.cancel_run(&b, &other, cancelled_failure("Never_Ran")).await.unwrap();
    assert_eq!(f.store.claim(&b, &other, &holder("w")).await.unwrap().generation(), 1);
}

async fn cancel_run_refuses_bad_input_and_writes_nothing(f: Fixture) {
    register(&f.store, "B1").await;
    let (b, c) = (id("B1"), component("archiver"));
    let claim = f.store.claim(&b, &c, &holder("w")).await.unwrap();
    let head = f.store.head().await.unwrap();

    let refused = |event: NewEvent, field: &'static str| {
        let store = f.store.clone();
        let (b, c) = (b.clone(), c.clone());
        async move {
            let err = store.cancel_run(&b, &c, event).await.unwrap_err();
            assert!(matches!(&err, StoreError::Invalid(e) if e.field == field), "{field}: {err}");
        }
    };
    let success = NewEvent { outcome: Outcome::Success, ..cancelled_failure("Data_Archived") };
    refused(success, "outcome").await;
    let unflagged = cancelled_failure("Data_Archived").with_details(json!({"reason": "x"}));
    refused(unflagged, "details").await;
    refused(cancelled_failure("Data_Archived").in_run(c.clone(), claim.generation()), "run").await;
    refused(NewEvent::reset(vec![ty("Data_Archived")], agent("operator:a"), json!({"cancelled": true})), "event type")
        .await;
    let keyed = cancelled_failure("Data_Archived").with_idempotency_key(IdempotencyKey::new("k1").unwrap());
    refused(keyed, "idempotency key").await;
    let missing = f.store.cancel_run(&id("B404"), &c, cancelled_failure("Data_Archived")).await.unwrap_err();
    assert!(matches!(missing, StoreError::NotFound(_)), "{missing}");

    assert_eq!(f.store.head().await.unwrap(), head, "a refused cancel writes nothing");
    assert_eq!(f.store.open_runs(None).await.unwrap(), vec![claim.run], "the run is still open");
}

async fn prioritize_sets_the_priority_and_records_why_in_one_change(f: Fixture) {
    register(&f.store, "B1").await;
    let head = f.store.head().await.unwrap();
    let note = NewEvent::new(ty("Prioritized"), Outcome::Success, agent("operator:alice"))
        .with_details(json!({"reason": "the customer is waiting"}));

    let event = f.store.prioritize(&id("B1"), 9, note.clone()).await.unwrap();
    assert_eq!(event.seq, Seq(head.0 + 1));
    assert_eq!((event.details["priority"].clone(), event.details["previous_priority"].clone()), (json!(9), json!(0)));
    assert_eq!(event.details["reason"], "the customer is waiting");
    let batch = f.store.get_batch(&id("B1")).await.unwrap();
    assert_eq!((batch.priority, batch.changed_seq), (9, event.seq));
    assert_eq!(batch.events, vec![event]);

    let head = f.store.head().await.unwrap();
    let missing = f.store.prioritize(&id("B404"), 1, note.clone()).await.unwrap_err();
    assert!(matches!(missing, StoreError::NotFound(_)), "{missing}");
    let in_run = note.in_run(component("c"), 1);
    assert!(matches!(f.store.prioritize(&id("B1"), 1, in_run).await, Err(StoreError::Invalid(_))));
    assert_eq!(f.store.head().await.unwrap(), head, "a refused prioritize writes nothing");
    assert_eq!(f.store.get_batch(&id("B1")).await.unwrap().priority, 9);
}

async fn count_batches_counts_every_registered_batch(f: Fixture) {
    assert_eq!(f.store.count_batches().await.unwrap(), 0);
    for n in 0..7 {
        register(&f.store, &format!("B{n}")).await;
    }
    assert_eq!(f.store.count_batches().await.unwrap(), 7);
}

/// The event type each component of the summary test records.
const SUMMARY_COMPONENTS: [(&str, &str); 3] =
    [("archiver", "Data_Archived"), ("checker", "Structure_Checked"), ("verifier", "Checksums_Verified")];
const SUMMARY_TYPES: [&str; 4] = ["Data_Received", "Data_Archived", "Structure_Checked", "Checksums_Verified"];

/// What the summary test did, per operation, to name the steps behind a wrong summary.
#[derive(Default)]
struct OpLog(Vec<(usize, Vec<BatchId>, String)>);

impl OpLog {
    fn push(&mut self, op: usize, batches: &[BatchId], what: String) {
        self.0.push((op, batches.to_vec(), what));
    }

    /// Every logged step that touched `batch`, one a line.
    fn on(&self, batch: &BatchId) -> String {
        let lines: Vec<String> = self
            .0
            .iter()
            .filter(|(_, batches, _)| batches.contains(batch))
            .map(|(op, _, what)| format!("  op {op}: {what}"))
            .collect();
        lines.join("\n")
    }
}

/// Refusals the random sequence provokes on purpose (a stale generation, an unknown batch, a
/// reused key); anything else, an outage above all, fails the test at once.
fn expected_refusal<T: std::fmt::Debug>(answer: StoreResult<T>, op: usize, what: &str) -> String {
    match answer {
        Ok(value) => format!("ok {value:?}").chars().take(160).collect(),
        Err(err @ (StoreError::Fenced { .. } | StoreError::NotFound(_) | StoreError::Conflict(_))) => {
            format!("refused: {err}")
        }
        Err(err) => panic!("op {op} ({what}) failed unexpectedly: {err}"),
    }
}

/// `get_summaries` and paged `list_summaries` must read exactly `BatchSummary::of` the
/// batches `get_batches` / `list_batches` read at the same moment.
async fn assert_summaries_of_whole_batches(
    store: &Arc<dyn ObjectStore>,
    ids: &[BatchId],
    op: usize,
    log: &OpLog,
) -> Vec<BatchSummary> {
    let summaries = store.get_summaries(ids).await.unwrap_or_else(|e| panic!("get_summaries after op {op}: {e}"));
    let batches = store.get_batches(ids).await.unwrap();
    let expected: Vec<BatchSummary> = batches.iter().map(BatchSummary::of).collect();
    compare_summaries(&summaries, &expected, &format!("get_summaries({ids:?}) after op {op}"), log);

    let mut after: Option<BatchId> = None;
    let mut listed = 0;
    loop {
        let page = store.list_summaries(after.as_ref(), 3).await.unwrap();
        let expected: Vec<BatchSummary> =
            store.list_batches(after.as_ref(), 3).await.unwrap().iter().map(BatchSummary::of).collect();
        compare_summaries(&page, &expected, &format!("list_summaries(after {after:?}, 3) after op {op}"), log);
        let Some(last) = page.last() else { break };
        assert!(page.len() <= 3, "list_summaries after op {op}: a page of {} beyond its limit", page.len());
        listed += page.len();
        after = Some(last.id.clone());
    }
    assert_eq!(listed as u64, store.count_batches().await.unwrap(), "list_summaries after op {op} listed every batch");
    summaries
}

/// Fails naming the first batch whose summary differs, field by field, with what the test
/// did to it.
fn compare_summaries(got: &[BatchSummary], expected: &[BatchSummary], read: &str, log: &OpLog) {
    let ids = |all: &[BatchSummary]| all.iter().map(|s| s.id.to_string()).collect::<Vec<_>>();
    assert_eq!(ids(got), ids(expected), "{read}: the batches answered, in order");
    for (got, expected) in got.iter().zip(expected) {
        if got != expected {
            panic!(
                "{read}: the summary of {} differs from BatchSummary::of the batch\n  got:      {got:?}\n  expected: {expected:?}\nwhat the test did to {}:\n{}",
                got.id,
                got.id,
                log.on(&got.id)
            );
        }
    }
}

async fn summaries_equal_the_summary_of_each_whole_batch(f: Fixture) {
    let store = &f.store;
    let names: Vec<BatchId> = (0..8).map(|n| id(&format!("B{n}"))).collect();
    let mut rng = XorShift(0x2545_f491_4f6c_dd1d);
    let mut log = OpLog::default();
    // The last generation claimed of each (batch, component), and the keyed appends sent.
    let mut generations: std::collections::BTreeMap<(BatchId, ComponentName), i64> = Default::default();
    let mut keyed: Vec<(BatchId, NewEvent)> = Vec::new();
    // Six batches exist from the start; B6 and B7 only once the sequence creates them.
    for batch in &names[..6] {
        register(store, batch.as_str()).await;
    }
    let details = |rng: &mut XorShift| match rng.below(6) {
        0 => json!({"transient": true}),
        1 => json!({"transient": false, "note": "checked"}),
        2 => json!({"transient": "yes"}),
        // An operator's flags: a skipped success, an acknowledged failure.
        3 => json!({"skipped": true}),
        4 => json!({"acknowledged": true}),
        _ => json!({}),
    };
    let outcome = |rng: &mut XorShift| if rng.one_in(2) { Outcome::Success } else { Outcome::Failure };

    let mut most_running = 0;
    const OPS: usize = 300;
    for op in 0..OPS {
        let kind = rng.below(22);
        // Run writes (10..=14) mostly go to a (batch, component) claimed before.
        let claimed: Vec<(BatchId, ComponentName)> = generations.keys().cloned().collect();
        let (batch, c) = if (10..=14).contains(&kind) && !claimed.is_empty() && !rng.one_in(5) {
            rng.pick(&claimed).clone()
        } else {
            (rng.pick(&names).clone(), component(rng.pick(&SUMMARY_COMPONENTS).0))
        };
        let (name, produces) = *SUMMARY_COMPONENTS.iter().find(|(name, _)| *name == c.as_str()).unwrap();
        // The current generation mostly, a stale or never-claimed one sometimes.
        let generation = match (generations.get(&(batch.clone(), c.clone())).copied(), rng.below(6)) {
            (Some(g), 0) => g - 1,
            (Some(g), _) => g,
            (None, _) => 1,
        };
        let (touched, what): (Vec<BatchId>, String) = match kind {
            0 => {
                let priority = if rng.one_in(4) { 5 } else { 0 };
                let new = NewBatch::new(batch.clone(), round_trip())
                    .with_location(format!("/incoming/{batch}"))
                    .with_priority(priority);
                let answer = store.create_batch(new).await.map(|created| matches!(created, CreateOutcome::Created(_)));
                (vec![batch], format!("create_batch priority {priority}: {}", expected_refusal(answer, op, "create")))
            }
            1..=4 => {
                let kind = *rng.pick(&SUMMARY_TYPES);
                let (outcome, details) = (outcome(&mut rng), details(&mut rng));
                let mut event = NewEvent::new(ty(kind), outcome, agent("test")).with_details(details.clone());
                if rng.one_in(6) {
                    event = event.with_idempotency_key(IdempotencyKey::new(format!("key-{op}")).unwrap());
                    keyed.push((batch.clone(), event.clone()));
                }
                let answer = store.append_event(&batch, event).await.map(|e| e.seq);
                (
                    vec![batch],
                    format!("append {kind} {outcome:?} {details}: {}", expected_refusal(answer, op, "append")),
                )
            }
            5 | 6 => {
                let mut resets: Vec<EventType> =
                    SUMMARY_TYPES.iter().filter(|_| rng.one_in(2)).map(|kind| ty(kind)).collect();
                if resets.is_empty() || rng.one_in(5) {
                    resets.push(ty("Never_Recorded"));
                }
                let shown = format!("{resets:?}");
                let event = NewEvent::reset(resets, agent("operator:alice"), json!({"reason": "rerun"}));
                let answer = store.append_event(&batch, event).await.map(|e| e.seq);
                (vec![batch], format!("reset {shown}: {}", expected_refusal(answer, op, "reset")))
            }
            7 | 8 => {
                let keys = ["claim-a", "claim-b"];
                let holder = match rng.below(3) {
                    0 => RunHolder { claim_key: Some(rng.pick(&keys).parse().unwrap()), ..holder(name) },
                    _ => holder(name),
                };
                let answer = store.claim(&batch, &c, &holder).await;
                if let Ok(claim) = &answer {
                    generations.insert((batch.clone(), c.clone()), claim.generation());
                }
                let shown = answer.map(|claim| (claim.generation(), claim.abandoned.is_some()));
                let refusal = expected_refusal(shown, op, "claim");
                let key = holder.claim_key.as_ref().map(|k| k.to_string()).unwrap_or_default();
                (vec![batch], format!("claim {name} key {key:?} (generation, abandoned): {refusal}"))
            }
            9 => {
                // Distinct batches: a batch named twice in one pass is claimed twice by SQLite
                // but answered once (the pass's claim key) by PostgreSQL.
                let mut asked: Vec<BatchId> = Vec::new();
                for _ in 0..2 + rng.below(3) {
                    let batch = rng.pick(&names).clone();
                    if !asked.contains(&batch) {
                        asked.push(batch);
                    }
                }
                if rng.one_in(3) {
                    asked.push(id("B-missing"));
                }
                let answers = store.claim_many(&asked, &c, &holder(name)).await;
                let answers = answers.unwrap_or_else(|e| panic!("op {op} (claim_many {asked:?}) failed: {e}"));
                let mut shown = Vec::new();
                for (batch, answer) in asked.iter().zip(answers) {
                    if let Ok(claim) = &answer {
                        generations.insert((batch.clone(), c.clone()), claim.generation());
                    }
                    let answer = answer.map(|claim| claim.generation());
                    shown.push(format!("{batch}: {}", expected_refusal(answer, op, "claim_many")));
                }
                (asked, format!("claim_many {name}: {}", shown.join(", ")))
            }
            10..=12 => {
                let (outcome, details) = (outcome(&mut rng), details(&mut rng));
                let event = NewEvent::new(ty(produces), outcome, agent(name))
                    .with_details(details.clone())
                    .in_run(c.clone(), generation);
                let answer = store.append_event(&batch, event).await.map(|e| e.seq);
                let refusal = expected_refusal(answer, op, "append in run");
                (vec![batch], format!("append {produces} {outcome:?} {details} in run {name}#{generation}: {refusal}"))
            }
            13 => {
                let answer = store.release(&batch, &c, generation).await;
                (vec![batch], format!("release {name}#{generation}: {}", expected_refusal(answer, op, "release")))
            }
            14 => {
                let mut event = cancelled_failure(produces);
                if rng.one_in(2) {
                    event = event.with_details(json!({"cancelled": true, "transient": true}));
                }
                let answer = store.cancel_run(&batch, &c, event).await.map(|cancel| cancel.run.map(|r| r.generation));
                (vec![batch], format!("cancel_run {name} (closed run): {}", expected_refusal(answer, op, "cancel")))
            }
            15 => {
                let priority = rng.below(10) as i32;
                let note = NewEvent::new(ty("Prioritized"), Outcome::Success, agent("operator:alice"))
                    .with_details(json!({"reason": "waiting"}));
                let answer = store.prioritize(&batch, priority, note).await.map(|e| e.seq);
                (vec![batch], format!("prioritize {priority}: {}", expected_refusal(answer, op, "prioritize")))
            }
            16 => {
                let priority = rng.below(10) as i32 - 3;
                let answer = store.set_priority(&batch, priority).await;
                (vec![batch], format!("set_priority {priority}: {}", expected_refusal(answer, op, "set_priority")))
            }
            17 => {
                let mut patch = Map::new();
                patch.insert("pages".into(), if rng.one_in(3) { Value::Null } else { json!(op) });
                let answer = store.record_content_change(&batch, patch).await;
                (vec![batch], format!("record_content_change: {}", expected_refusal(answer, op, "content change")))
            }
            18 | 19 => {
                // Appends at once (the SQLite store commits them as one group, each in a
                // savepoint): two results per claimed run, so one is fenced, plain events,
                // a Reset, and one on an unknown batch.
                let mut sent: Vec<(BatchId, NewEvent)> = Vec::new();
                for _ in 0..claimed.len().min(3) {
                    let (batch, c) = rng.pick(&claimed).clone();
                    let produces = SUMMARY_COMPONENTS.iter().find(|(name, _)| *name == c.as_str()).unwrap().1;
                    let event = NewEvent::new(ty(produces), outcome(&mut rng), agent(c.as_str()))
                        .with_details(details(&mut rng))
                        .in_run(c.clone(), generations[&(batch.clone(), c)]);
                    sent.push((batch.clone(), event.clone()));
                    sent.push((batch, event));
                }
                for _ in 0..3 {
                    let event = NewEvent::new(ty(rng.pick::<&str>(&SUMMARY_TYPES)), outcome(&mut rng), agent("test"))
                        .with_details(details(&mut rng));
                    sent.push((rng.pick(&names).clone(), event));
                }
                let reset =
                    NewEvent::reset(vec![ty(rng.pick::<&str>(&SUMMARY_TYPES))], agent("operator:bob"), json!({}));
                sent.push((rng.pick(&names).clone(), reset));
                sent.push((id("B-missing"), NewEvent::new(ty("Data_Received"), Outcome::Success, agent("test"))));
                let tasks: Vec<_> = sent
                    .iter()
                    .cloned()
                    .map(|(batch, event)| {
                        let store = Arc::clone(store);
                        tokio::spawn(async move { store.append_event(&batch, event).await.map(|e| e.seq) })
                    })
                    .collect();
                let mut shown = Vec::new();
                for ((batch, event), task) in sent.iter().zip(tasks) {
                    let answer = expected_refusal(task.await.unwrap(), op, "appends at once");
                    let run = event.run.as_ref().map(|r| format!(" in run {}#{}", r.component, r.generation));
                    let what = format!("{} {:?} {}", event.event_type, event.outcome, event.details);
                    shown.push(format!("{batch}: {what}{}: {answer}", run.unwrap_or_default()));
                }
                let touched = sent.into_iter().map(|(batch, _)| batch).collect();
                (touched, format!("appends at once [{}]", shown.join("; ")))
            }
            _ => match keyed.is_empty() {
                // A retried keyed append: answered with the first event (or refused on
                // another batch), writing nothing either way.
                false => {
                    let (first, event) = keyed[rng.below(keyed.len())].clone();
                    let to = if rng.one_in(3) { batch } else { first };
                    let answer = store.append_event(&to, event).await.map(|e| e.seq);
                    (vec![to], format!("retried keyed append: {}", expected_refusal(answer, op, "retried append")))
                }
                true => (vec![], "nothing to retry".into()),
            },
        };
        log.push(op, &touched, what);

        if op % 25 == 24 || op == OPS - 1 {
            // Every batch, shuffled, with an unknown id and one asked twice.
            let mut ids = names.clone();
            ids.push(id("B-unknown"));
            ids.push(rng.pick(&names).clone());
            for i in (1..ids.len()).rev() {
                ids.swap(i, rng.below(i + 1));
            }
            let summaries = assert_summaries_of_whole_batches(store, &ids, op, &log).await;
            most_running = most_running.max(summaries.iter().map(|s| s.running.len()).max().unwrap_or(0));
        }
    }
    // The sequence did reach the states the summary has to follow.
    let batches = store.list_batches(None, 100).await.unwrap();
    assert_eq!(batches.len(), 8, "the sequence created B6 and B7 too");
    let events: Vec<&Event> = batches.iter().flat_map(|b| &b.events).collect();
    assert!(events.iter().any(|e| e.event_type.is_reset()), "a Reset was recorded");
    assert!(events.iter().any(|e| e.is_transient_failure()), "a transient failure was recorded");
    assert!(events.iter().any(|e| e.run.is_some()), "a result was recorded in a run");
    assert!(events.iter().any(|e| e.flag("cancelled")), "a cancel was recorded");
    assert!(events.iter().any(|e| e.is_acknowledged()), "an acknowledged failure was recorded");
    assert!(most_running >= 2, "at some check a batch had two components running");
}

/// A batch's `running` is the components with an open run on it: in after a claim, out after
/// the run records, is released or cancelled, and there once however often it is claimed over.
async fn running_names_each_component_with_an_open_run_once(f: Fixture) {
    for batch in ["B1", "B2"] {
        register(&f.store, batch).await;
    }
    let (b1, b2) = (id("B1"), id("B2"));
    let (archiver, checker) = (component("archiver"), component("checker"));
    let running = async |batch: &BatchId| -> Vec<String> {
        let summaries = f.store.get_summaries(std::slice::from_ref(batch)).await.unwrap();
        let [summary] = &summaries[..] else { panic!("one summary for {batch}: {summaries:?}") };
        let whole = f.store.get_batch(batch).await.unwrap();
        assert_eq!(summary, &BatchSummary::of(&whole), "{batch}'s summary");
        summary.running.iter().map(|c| c.to_string()).collect()
    };
    assert_eq!(running(&b1).await, Vec::<String>::new());

    let first = f.store.claim(&b1, &checker, &holder("c")).await.unwrap();
    assert_eq!(running(&b1).await, ["checker"]);
    let archiving = f.store.claim(&b1, &archiver, &holder("a")).await.unwrap();
    assert_eq!(running(&b1).await, ["archiver", "checker"], "by name");
    let over = f.store.claim(&b1, &checker, &holder("c2")).await.unwrap();
    assert_eq!(over.abandoned.map(|run| run.generation), Some(first.generation()));
    assert_eq!(running(&b1).await, ["archiver", "checker"], "a claim over an open run keeps it once");
    let keyed = RunHolder { claim_key: Some("k1".parse().unwrap()), ..holder("c3") };
    let third = f.store.claim(&b1, &checker, &keyed).await.unwrap();
    f.store.claim(&b1, &checker, &keyed).await.unwrap();
    assert_eq!(running(&b1).await, ["archiver", "checker"], "a retried claim keeps it once");

    // A fenced write changes nothing; the current run's release takes it out.
    let stale = f.store.release(&b1, &checker, first.generation()).await.unwrap_err();
    assert!(stale.is_fenced(), "{stale}");
    assert_eq!(running(&b1).await, ["archiver", "checker"]);
    f.store.release(&b1, &checker, third.generation()).await.unwrap();
    assert_eq!(running(&b1).await, ["archiver"]);

    // Recording the result takes it out.
    let result = NewEvent::new(ty("Data_Archived"), Outcome::Failure, agent("a"))
        .with_details(json!({"transient": true}))
        .in_run(archiver.clone(), archiving.generation());
    f.store.append_event(&b1, result).await.unwrap();
    assert_eq!(running(&b1).await, Vec::<String>::new());
    let summary = &f.store.get_summaries(std::slice::from_ref(&b1)).await.unwrap()[0];
    assert_eq!(summary.effective.len(), 1);
    assert!(summary.effective[0].transient, "{summary:?}");

    // A cancel takes it out; a cancel of another component's run leaves it in.
    f.store.claim(&b1, &archiver, &holder("a")).await.unwrap();
    f.store.claim(&b1, &checker, &holder("c")).await.unwrap();
    f.store.cancel_run(&b1, &checker, cancelled_failure("Structure_Checked")).await.unwrap();
    assert_eq!(running(&b1).await, ["archiver"]);
    f.store.cancel_run(&b1, &archiver, cancelled_failure("Data_Archived")).await.unwrap();
    assert_eq!(running(&b1).await, Vec::<String>::new());

    // claim_many puts it in on each batch it claimed, and a plain append moves nothing.
    let answers = f.store.claim_many(&[b2.clone(), id("B-missing"), b1.clone()], &archiver, &holder("a")).await;
    assert_eq!(answers.unwrap().iter().filter(|answer| answer.is_ok()).count(), 2);
    record(&f.store, "B2", "Data_Received", Outcome::Success).await;
    assert_eq!(running(&b1).await, ["archiver"]);
    assert_eq!(running(&b2).await, ["archiver"]);

    let listed = f.store.list_summaries(None, 10).await.unwrap();
    let whole: Vec<BatchSummary> = f.store.list_batches(None, 10).await.unwrap().iter().map(BatchSummary::of).collect();
    assert_eq!(listed, whole);
    assert!(f.store.get_summaries(&[]).await.unwrap().is_empty());
    let err = f.store.list_summaries(None, 1_000_000).await.unwrap_err();
    assert!(matches!(&err, StoreError::Invalid(e) if e.field == "limit"), "{err}");
    let err = f.store.get_summaries(&vec![b1.clone(); 10_001]).await.unwrap_err();
    assert!(matches!(&err, StoreError::Invalid(e) if e.field == "ids"), "{err}");
}

#[tokio::test]
async fn a_version_2_file_with_runs_is_upgraded_keeping_them_and_can_cancel() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.db");
    SqliteStore::create_at_schema_version(&path, 2).unwrap();
    {
        // Rows as a version-2 release wrote them: a batch with a closed and an open run.
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(
            "UPDATE store_head SET seq = 3;
             INSERT INTO batches (id, type, priority, metadata, created_seq, modified_seq, changed_seq, created_at, modified_at)
                 VALUES ('B1', 'RoundTrip', 0, '{}', 1, 1, 3, 0, 0);
             INSERT INTO claims (batch_id, component, generation) VALUES ('B1', 'c', 2);
             INSERT INTO runs (batch_id, component, generation, agent, host, pid, started_at, claim_seq, state, ended_at)
                 VALUES ('B1', 'c', 1, 'c/1@h#1', 'h', 1, 10, 2, 'abandoned', 20),
                        ('B1', 'c', 2, 'c/1@h#2', 'h', 2, 20, 3, 'open', NULL);",
        )
        .unwrap();
    }
    let store = SqliteStore::open(&path).await.unwrap();
    assert_eq!(store.schema_version().await.unwrap(), LATEST_SCHEMA_VERSION);
    let open = store.open_runs(None).await.unwrap();
    assert_eq!(open.iter().map(|r| (r.generation, r.state)).collect::<Vec<_>>(), [(2, RunState::Open)]);
    assert_eq!(store.failed_attempts(&id("B1"), &component("c"), Seq::ZERO).await.unwrap(), 1);
    let cancellation = store.cancel_run(&id("B1"), &component("c"), cancelled_failure("C_Done")).await.unwrap();
    assert_eq!(cancellation.run.map(|r| r.state), Some(RunState::Cancelled));
    assert!(store.open_runs(None).await.unwrap().is_empty());
}

async fn concurrent_appends_share_commits_yet_each_gets_its_own_answer(f: Fixture) {
    let store = f.store.clone();
    let c = component("archiver");
    for n in 0..4 {
        register(&store, &format!("B{n}")).await;
    }
    let generation = store.claim(&id("B0"), &c, &holder("a")).await.unwrap().generation();
    let head = store.head().await.unwrap();
    // 64 appends at once: plain ones, a stale-generation one (fenced), one on an unknown
    // batch, two retries of one idempotency key, and the run's real result.
    let tasks: Vec<_> = (0..64)
        .map(|n| {
            let store = Arc::clone(&store);
            let c = c.clone();
            tokio::spawn(async move {
                let event = NewEvent::new(ty("Step_Done"), Outcome::Success, agent("t")).with_details(json!({"n": n}));
                let (batch, event) = match n {
                    10 => ("B0", event.in_run(c, generation + 1)),
                    11 => ("nope", event),
                    20 | 21 => ("B1", event.with_details(json!({})).with_idempotency_key("k-1".parse().unwrap())),
                    30 => ("B0", event.in_run(c, generation)),
                    _ => (["B1", "B2", "B3"][n % 3], event),
                };
                (n, store.append_event(&id(batch), event).await)
            })
        })
        .collect();
    let mut seqs = std::collections::BTreeSet::new();
    let mut keyed = Vec::new();
    for task in tasks {
        let (n, answer) = task.await.unwrap();
        match n {
            10 => assert!(answer.unwrap_err().is_fenced()),
            11 => assert!(matches!(answer.unwrap_err(), StoreError::NotFound(_))),
            20 | 21 => keyed.push(answer.unwrap()),
            _ => {
                seqs.insert(answer.unwrap().seq);
            }
        }
    }
    assert_eq!(keyed[0], keyed[1], "a retried key answers the first event, even in one group");
    assert_eq!(seqs.len(), 60, "every other append got a seq of its own");
    let events: usize = store.list_batches(None, 10).await.unwrap().iter().map(|b| b.events.len()).sum();
    assert_eq!(events, 61, "60 plain + 1 keyed; the refused ones wrote nothing");
    assert_eq!(store.head().await.unwrap(), Seq(head.0 + 61), "refused appends took no seq");
    assert!(store.open_runs(None).await.unwrap().is_empty(), "the run's result closed it");
}

async fn a_retried_claim_with_its_key_returns_the_run_it_opened(f: Fixture) {
    register(&f.store, "B1").await;
    let c = component("archiver");
    let keyed = |key: &str| RunHolder { claim_key: Some(key.parse().unwrap()), ..holder("a") };
    let first = f.store.claim(&id("B1"), &c, &keyed("claim-1")).await.unwrap();
    let head = f.store.head().await.unwrap();
    let retried = f.store.claim(&id("B1"), &c, &keyed("claim-1")).await.unwrap();
    assert_eq!(retried, Claim { run: first.run.clone(), abandoned: None }, "the same run, nothing abandoned");
    assert_eq!(f.store.head().await.unwrap(), head, "the retry wrote nothing");
    assert_eq!(f.store.open_runs(None).await.unwrap(), std::slice::from_ref(&first.run));

    // A claim with another key is a new claim: it abandons the open run, as ever.
    let second = f.store.claim(&id("B1"), &c, &keyed("claim-2")).await.unwrap();
    assert_eq!(second.abandoned.as_ref().map(|run| run.generation), Some(first.generation()));
    // The first key again, its run no longer open: refused, nothing written.
    let head = f.store.head().await.unwrap();
    let stale = f.store.claim(&id("B1"), &c, &keyed("claim-1")).await.unwrap_err();
    assert!(matches!(&stale, StoreError::Conflict(m) if m.contains("claim-1")), "{stale}");
    assert_eq!(f.store.head().await.unwrap(), head);
    assert_eq!(f.store.open_runs(None).await.unwrap()[0].generation, second.generation());
}

async fn claim_many_claims_each_batch_as_a_single_claim_would(f: Fixture) {
    for batch in ["B1", "B2", "B3"] {
        register(&f.store, batch).await;
    }
    let c = component("archiver");
    let stalled = f.store.claim(&id("B2"), &c, &holder("stalled")).await.unwrap();
    let head = f.store.head().await.unwrap();

    let asked = [id("B3"), id("B-missing"), id("B2"), id("B1")];
    let answers = f.store.claim_many(&asked, &c, &holder("pass")).await.unwrap();
    assert_eq!(answers.len(), 4, "one answer per batch asked");
    assert!(matches!(&answers[1], Err(StoreError::NotFound(missing)) if missing.as_str() == "B-missing"));
    let claims: Vec<&Claim> = answers.iter().filter_map(|a| a.as_ref().ok()).collect();
    let [b3, b2, b1] = claims[..] else { panic!("the other three are claimed: {answers:?}") };
    assert_eq!([&b3.run.batch_id, &b2.run.batch_id, &b1.run.batch_id], [&id("B3"), &id("B2"), &id("B1")]);
    assert_eq!((b3.generation(), b2.generation(), b1.generation()), (1, 2, 1));
    assert!(b3.abandoned.is_none() && b1.abandoned.is_none());
    let abandoned = b2.abandoned.as_ref().expect("the stalled run is abandoned, as a claim would");
    assert_eq!((abandoned.generation, abandoned.state), (stalled.generation(), RunState::Abandoned));
    let by_the_pass = |run: &Run| run.holder.agent == holder("pass").agent && run.state == RunState::Open;
    assert!(claims.iter().all(|claim| by_the_pass(&claim.run)));
    assert_eq!(f.store.head().await.unwrap(), Seq(head.0 + 3), "a seq per claim, none for the missing batch");
    let mut claim_seqs: Vec<Seq> = claims.iter().map(|claim| claim.run.claim_seq).collect();
    claim_seqs.sort();
    assert_eq!(claim_seqs, vec![Seq(head.0 + 1), Seq(head.0 + 2), Seq(head.0 + 3)]);

    let mut open = f.store.open_runs(Some(&c)).await.unwrap();
    open.sort_by(|a, b| a.batch_id.cmp(&b.batch_id));
    assert_eq!(open, vec![b1.run.clone(), b2.run.clone(), b3.run.clone()]);
    for claim in [b1, b2, b3] {
        let batch = f.store.get_batch(&claim.run.batch_id).await.unwrap();
        assert_eq!(batch.open_run(&c), Some(&claim.run));
        assert_eq!(batch.changed_seq, claim.run.claim_seq, "a claim is a change of its batch");
    }
    // The stalled holder is fenced; the pass's generation records.
    let result =
        |generation| NewEvent::new(ty("Data_Archived"), Outcome::Success, agent("a")).in_run(c.clone(), generation);
    assert!(f.store.append_event(&id("B2"), result(stalled.generation())).await.unwrap_err().is_fenced());
    f.store.append_event(&id("B2"), result(b2.generation())).await.unwrap();

    // Nothing to claim is no error, and an empty pass writes nothing.
    let head = f.store.head().await.unwrap();
    assert!(f.store.claim_many(&[], &c, &holder("pass")).await.unwrap().is_empty());
    let all_missing = f.store.claim_many(&[id("B-gone")], &c, &holder("pass")).await.unwrap();
    assert!(matches!(&all_missing[..], [Err(StoreError::NotFound(_))]), "{all_missing:?}");
    assert_eq!(f.store.head().await.unwrap(), head);
}

async fn claim_many_with_a_claim_key_retries_like_claim_and_refuses_a_bad_holder(f: Fixture) {
    for batch in ["B1", "B2"] {
        register(&f.store, batch).await;
    }
    let c = component("archiver");
    let keyed = |key: &str| RunHolder { claim_key: Some(key.parse().unwrap()), ..holder("a") };
    let batches = [id("B1"), id("B2")];
    let first: Vec<Claim> =
        f.store.claim_many(&batches, &c, &keyed("pass-1")).await.unwrap().into_iter().map(Result::unwrap).collect();
    let head = f.store.head().await.unwrap();
    // A retry after a lost answer: the same runs, nothing abandoned, nothing written.
    let retried: Vec<Claim> =
        f.store.claim_many(&batches, &c, &keyed("pass-1")).await.unwrap().into_iter().map(Result::unwrap).collect();
    let same: Vec<Claim> = first.iter().map(|claim| Claim { run: claim.run.clone(), abandoned: None }).collect();
    assert_eq!(retried, same);
    assert_eq!(f.store.head().await.unwrap(), head, "the retry wrote nothing");

    // B1's run moves on under another key; the old key is refused for B1 alone.
    f.store.claim(&id("B1"), &c, &keyed("other")).await.unwrap();
    let head = f.store.head().await.unwrap();
    let answers = f.store.claim_many(&batches, &c, &keyed("pass-1")).await.unwrap();
    assert!(matches!(&answers[0], Err(StoreError::Conflict(m)) if m.contains("pass-1")), "{answers:?}");
    assert_eq!(answers[1].as_ref().unwrap().run, first[1].run);
    assert_eq!(f.store.head().await.unwrap(), head);

    let bad = RunHolder { host: "two words".into(), ..holder("a") };
    let refused = f.store.claim_many(&batches, &c, &bad).await;
    assert!(matches!(&refused, Err(StoreError::Invalid(e)) if e.field == "host"), "{refused:?}");
    assert_eq!(f.store.head().await.unwrap(), head, "a refused holder claims nothing");
}

async fn wait_for_change_wakes_when_the_store_moves_and_times_out_when_not(f: Fixture) {
    register(&f.store, "B1").await;
    let head = f.store.head().await.unwrap();
    let started = std::time::Instant::now();
    let quiet = f.store.wait_for_change(head, std::time::Duration::from_millis(300)).await.unwrap();
    assert_eq!(quiet, head, "nothing changed: the head as it was");
    assert!(started.elapsed() >= std::time::Duration::from_millis(250), "it waited out its timeout");

    let (waiting, started) = tokio::sync::oneshot::channel();
    let waiter = {
        let store = Arc::clone(&f.store);
        tokio::spawn(async move {
            let _ = waiting.send(());
            let answer = store.wait_for_change(head, std::time::Duration::from_secs(20)).await.unwrap();
            (answer, std::time::Instant::now())
        })
    };
    started.await.unwrap(); // the waiter is under way: it can only answer once the head moves
    let event = record(&f.store, "B1", "Data_Received", Outcome::Success).await;
    let appended = std::time::Instant::now();
    let (answer, woke) = waiter.await.unwrap();
    assert_eq!(answer, event.seq, "it answers the new head");
    let delay = woke.saturating_duration_since(appended);
    assert!(delay < std::time::Duration::from_secs(2), "woke {delay:?} after the commit");
    let changed = f.store.changes(head, 10).await.unwrap();
    assert_eq!(changed.changes, vec![(event.seq, id("B1"))]);
}

/// Wake-ups are pushed (PostgreSQL's notifications, the store file's watch): a commit made
/// through another handle, as another process makes it, wakes a waiter well before its
/// fallback look (every 2 s). The first round may still be polling while the listen
/// connection or the watch starts; the later rounds must be woken by the push.
async fn a_commit_by_another_handle_wakes_a_waiter_before_its_fallback_look(f: Fixture) {
    register(&f.store, "B1").await;
    let writer = open_store(&f.url).await.unwrap();
    for round in 0..4 {
        let head = f.store.head().await.unwrap();
        let (waiting, started) = tokio::sync::oneshot::channel();
        let waiter = {
            let store = Arc::clone(&f.store);
            tokio::spawn(async move {
                let _ = waiting.send(());
                let answer = store.wait_for_change(head, Duration::from_secs(20)).await.unwrap();
                (answer, std::time::Instant::now())
            })
        };
        started.await.unwrap();
        // The waiter must be asleep when the commit lands (else its first read sees it and
        // nothing is woken): give it time to get there; that it is still waiting is checked.
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!waiter.is_finished(), "round {round}: nothing changed yet, so it still waits");
        let event = record(&writer, "B1", "Data_Received", Outcome::Success).await;
        let committed = std::time::Instant::now();
        let (answer, woke) = waiter.await.unwrap();
        assert_eq!(answer, event.seq, "round {round}: it answers the new head");
        let delay = woke.saturating_duration_since(committed);
        if round > 0 {
            assert!(delay < Duration::from_millis(500), "round {round}: woke {delay:?} after the commit");
        }
    }
}

/// `listen=off` (a PgBouncer in transaction mode) polls: a commit through another handle
/// still wakes a waiter within its 25 ms poll, and the store works as ever.
#[tokio::test]
async fn postgres_with_listen_off_still_wakes_waiters_by_polling() {
    let url = autocomp_test_servers::postgres::shared().unique_database();
    let polling: Arc<dyn ObjectStore> = Arc::new(
        PgStore::open(&format!("{url}{}listen=off", if url.contains('?') { "&" } else { "?" })).await.unwrap(),
    );
    let writer = open_store(&url).await.unwrap();
    register(&writer, "B1").await;
    let head = polling.head().await.unwrap();
    let waiter = {
        let store = Arc::clone(&polling);
        tokio::spawn(async move {
            (store.wait_for_change(head, Duration::from_secs(20)).await.unwrap(), std::time::Instant::now())
        })
    };
    let event = record(&writer, "B1", "Data_Received", Outcome::Success).await;
    let committed = std::time::Instant::now();
    let (answer, woke) = waiter.await.unwrap();
    assert_eq!(answer, event.seq);
    assert!(woke.saturating_duration_since(committed) < Duration::from_millis(500));
}

/// From JSON, as a component's report arrives: fields added later keep their defaults.
fn descriptor(name: &str, event_type: &str) -> ComponentDescriptor {
    serde_json::from_value(json!({
        "name": name, "version": "1.0.0", "event_type": event_type,
        "trigger": {"requires": ["Checksums_Verified"], "blocked_by": [event_type]},
        "max_attempts": 3, "retry_backoff": "5m", "queue_size": 10, "max_runtime": "1h",
    }))
    .unwrap()
}

fn pass(descriptor: &ComponentDescriptor, host: &str, phase: PassPhase) -> PassRecord {
    PassRecord { descriptor: descriptor.clone(), host: host.into(), phase }
}

fn ended(outcome: PassOutcome, summary: &str, duration_ms: u64) -> PassPhase {
    PassPhase::Ended { outcome, summary: summary.into(), duration_ms, work: vec![] }
}

fn idle() -> PassPhase {
    ended(PassOutcome::Idle, "", 3)
}

async fn registered(store: &Arc<dyn ObjectStore>, name: &str) -> RegisteredComponent {
    let all = store.components().await.unwrap();
    all.into_iter().find(|c| c.name().as_str() == name).unwrap_or_else(|| panic!("{name} is not registered"))
}

/// Waits (bounded) until the clock has moved past the current millisecond, so a timestamp
/// that must not change is told from one that must.
async fn tick() {
    let start = Timestamp::now();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
    while Timestamp::now() <= start {
        assert!(std::time::Instant::now() < deadline, "the clock did not move for a second");
        tokio::task::yield_now().await;
    }
}

async fn a_first_pass_registers_the_component_and_its_host(f: Fixture) {
    assert!(f.store.components().await.unwrap().is_empty());
    let before = Timestamp::now();
    let counter = descriptor("page-counter", "Pages_Counted");
    f.store.record_pass(pass(&counter, "host-a", idle())).await.unwrap();
    let after = Timestamp::now();

    let all = f.store.components().await.unwrap();
    assert_eq!(all.len(), 1);
    let c = &all[0];
    assert_eq!(c.descriptor, counter);
    assert!(c.registered_at >= before && c.registered_at <= after, "{} in store time", c.registered_at);
    assert_eq!(c.changed_at, c.registered_at);
    assert!(c.retired.is_none());
    assert_eq!(c.hosts.len(), 1);
    let host = &c.hosts[0];
    assert_eq!((host.host.as_str(), host.version.as_str()), ("host-a", "1.0.0"));
    assert_eq!(host.last_seen, c.registered_at);
    assert_eq!(host.outcome, Some(PassOutcome::Idle));
    assert_eq!(host.pass_ended_at, Some(host.last_seen));
    assert!(!host.running());
}

async fn an_identical_pass_moves_last_seen_but_not_changed_at(f: Fixture) {
    let counter = descriptor("page-counter", "Pages_Counted");
    f.store.record_pass(pass(&counter, "host-a", idle())).await.unwrap();
    let first = registered(&f.store, "page-counter").await;
    tick().await;
    f.store.record_pass(pass(&counter, "host-a", idle())).await.unwrap();
    let second = registered(&f.store, "page-counter").await;
    assert_eq!((second.registered_at, second.changed_at), (first.registered_at, first.changed_at));
    assert!(second.hosts[0].last_seen > first.hosts[0].last_seen, "{:?} then {:?}", first.hosts, second.hosts);
    assert_eq!(second.last_seen(), Some(second.hosts[0].last_seen));
}

async fn a_changed_trigger_or_version_updates_the_descriptor_and_changed_at(f: Fixture) {
    let counter = descriptor("page-counter", "Pages_Counted");
    f.store.record_pass(pass(&counter, "host-a", idle())).await.unwrap();
    let first = registered(&f.store, "page-counter").await;
    tick().await;
    let retriggered = ComponentDescriptor {
        trigger: Trigger::builder().requires("Structure_Checked").blocked_by("Pages_Counted").build(),
        ..counter.clone()
    };
    f.store.record_pass(pass(&retriggered, "host-a", idle())).await.unwrap();
    let second = registered(&f.store, "page-counter").await;
    assert_eq!(second.descriptor, retriggered);
    assert_eq!(second.registered_at, first.registered_at);
    assert!(second.changed_at > first.changed_at);
    tick().await;
    let upgraded = ComponentDescriptor { version: "1.1.0".into(), ..retriggered };
    f.store.record_pass(pass(&upgraded, "host-a", idle())).await.unwrap();
    let third = registered(&f.store, "page-counter").await;
    assert_eq!(third.descriptor.version, "1.1.0");
    assert_eq!(third.hosts[0].version, "1.1.0");
    assert!(third.changed_at > second.changed_at);
}

async fn a_started_pass_is_running_until_it_ends_and_each_host_is_listed(f: Fixture) {
    let counter = descriptor("page-counter", "Pages_Counted");
    f.store.record_pass(pass(&counter, "host-b", PassPhase::Started)).await.unwrap();
    let running = registered(&f.store, "page-counter").await;
    let host = &running.hosts[0];
    assert!(host.running());
    assert_eq!(host.pass_started_at, Some(host.last_seen));
    assert_eq!((host.pass_ended_at, host.outcome, host.duration_ms), (None, None, None));
    tick().await;
    f.store.record_pass(pass(&counter, "host-b", ended(PassOutcome::Failed, "2 ok, 1 failed", 1_500))).await.unwrap();
    f.store.record_pass(pass(&counter, "host-a", PassPhase::Started)).await.unwrap();

    let c = registered(&f.store, "page-counter").await;
    let hosts: Vec<&str> = c.hosts.iter().map(|h| h.host.as_str()).collect();
    assert_eq!(hosts, ["host-a", "host-b"], "hosts by name");
    let (a, b) = (&c.hosts[0], &c.hosts[1]);
    assert!(a.running() && !b.running());
    assert_eq!(b.outcome, Some(PassOutcome::Failed));
    assert_eq!(b.summary, "2 ok, 1 failed");
    assert_eq!(b.duration_ms, Some(1_500));
    let ended_at = b.pass_ended_at.expect("ended");
    assert_eq!(b.pass_started_at, Some(Timestamp(ended_at.0 - 1_500)), "the start is dated back by the duration");
    assert_eq!(b.last_seen, ended_at);

    // A new start keeps showing how the last pass went.
    tick().await;
    f.store.record_pass(pass(&counter, "host-b", PassPhase::Started)).await.unwrap();
    let b = registered(&f.store, "page-counter").await.hosts[1].clone();
    assert!(b.running());
    assert_eq!(
        (b.outcome, b.pass_ended_at, b.summary.as_str()),
        (Some(PassOutcome::Failed), Some(ended_at), "2 ok, 1 failed")
    );
}

async fn an_event_type_clash_is_refused_naming_the_other_component(f: Fixture) {
    let old = descriptor("page-counter-old", "Pages_Counted");
    f.store.record_pass(pass(&old, "host-a", idle())).await.unwrap();
    let before = f.store.components().await.unwrap();
    let renamed = descriptor("page-counter", "Pages_Counted");
    let err = f.store.record_pass(pass(&renamed, "host-a", idle())).await.unwrap_err();
    match &err {
        StoreError::Conflict(message) => {
            assert!(message.contains("Pages_Counted") && message.contains("page-counter-old"), "{message}");
            assert!(message.contains("pipeline forget page-counter-old"), "{message}");
        }
        other => panic!("expected a conflict, got {other}"),
    }
    assert_eq!(f.store.components().await.unwrap(), before, "nothing was written");

    // Once the old name is retired, the new one may record the type.
    f.store.retire_component(&component("page-counter-old"), &agent("operator:alice"), "renamed").await.unwrap();
    f.store.record_pass(pass(&renamed, "host-a", idle())).await.unwrap();
    // And the old one coming back would record it twice: refused.
    let err = f.store.record_pass(pass(&old, "host-a", idle())).await.unwrap_err();
    assert!(matches!(&err, StoreError::Conflict(m) if m.contains("component page-counter;")), "{err}");
    assert!(registered(&f.store, "page-counter-old").await.is_retired(), "still retired");
}

async fn retiring_records_who_and_why_and_a_new_pass_brings_it_back(f: Fixture) {
    let counter = descriptor("page-counter", "Pages_Counted");
    f.store.record_pass(pass(&counter, "host-a", idle())).await.unwrap();
    f.store.record_pass(pass(&descriptor("archiver", "Data_Archived"), "host-a", idle())).await.unwrap();
    let before = Timestamp::now();
    let alice = agent("operator:alice");
    let retired =
        f.store.retire_component(&component("page-counter"), &alice, "  replaced by page-tally  ").await.unwrap();
    let retirement = retired.retired.clone().expect("retired");
    assert_eq!((retirement.by.clone(), retirement.reason.as_str()), (alice.clone(), "replaced by page-tally"));
    assert!(retirement.at >= before);
    assert_eq!(registered(&f.store, "page-counter").await, retired, "listed as retired, as answered");
    let names: Vec<String> = f.store.components().await.unwrap().iter().map(|c| c.name().to_string()).collect();
    assert_eq!(names, ["archiver", "page-counter"], "retired ones included, by name");

    let err = f.store.retire_component(&component("page-counter"), &agent("operator:bob"), "again").await.unwrap_err();
    match &err {
        StoreError::Conflict(message) => {
            assert!(message.contains("already retired") && message.contains("operator:alice"), "{message}");
        }
        other => panic!("expected a conflict, got {other}"),
    }
    let err = f.store.retire_component(&component("page-tally"), &alice, "typo").await.unwrap_err();
    match &err {
        StoreError::Invalid(input) => {
            assert_eq!((input.field.as_str(), input.value.as_str()), ("component", "page-tally"));
            assert!(input.reason.contains("archiver, page-counter"), "{input}");
        }
        other => panic!("expected Invalid naming the component, got {other}"),
    }
    assert_eq!(registered(&f.store, "page-counter").await, retired, "refusals changed nothing");

    tick().await;
    f.store.record_pass(pass(&counter, "host-a", idle())).await.unwrap();
    let back = registered(&f.store, "page-counter").await;
    assert!(!back.is_retired(), "it runs again: back in the pipeline");
    assert_eq!(back.changed_at, retired.changed_at, "the same descriptor");
}

async fn bad_registry_input_is_refused_by_name_and_changes_nothing(f: Fixture) {
    let counter = descriptor("page-counter", "Pages_Counted");
    f.store.record_pass(pass(&counter, "host-a", idle())).await.unwrap();
    let before = f.store.components().await.unwrap();
    let cases = [
        (pass(&counter, "", idle()), "host"),
        (pass(&counter, "bad\nhost", idle()), "host"),
        (pass(&ComponentDescriptor { version: "1.0\n".into(), ..counter.clone() }, "host-a", idle()), "version"),
        (pass(&ComponentDescriptor { max_attempts: 0, ..counter.clone() }, "host-a", idle()), "max_attempts"),
        (pass(&ComponentDescriptor { queue_size: 0, ..counter.clone() }, "host-a", idle()), "queue_size"),
        (pass(&counter, "host-a", ended(PassOutcome::Ok, &"x".repeat(2_001), 1)), "pass summary"),
        (pass(&descriptor("other", "Other_Done"), &"h".repeat(256), idle()), "host"),
        (pass(&counter, "host-a", worked(&vec![(WorkResult::Success, 1); MAX_WORK_PER_PASS + 1])), "pass work"),
    ];
    for (bad, field) in cases {
        match f.store.record_pass(bad).await.unwrap_err() {
            StoreError::Invalid(input) => assert_eq!(input.field, field, "{input}"),
            other => panic!("expected Invalid naming {field}, got {other}"),
        }
    }
    let alice = agent("operator:alice");
    for reason in ["", "   ", &"r".repeat(2_001)] {
        match f.store.retire_component(&component("page-counter"), &alice, reason).await.unwrap_err() {
            StoreError::Invalid(input) => assert_eq!(input.field, "reason", "{input}"),
            other => panic!("expected Invalid naming the reason, got {other}"),
        }
    }
    assert_eq!(f.store.components().await.unwrap(), before, "nothing changed");
}

async fn registry_writes_take_no_seq_and_stay_out_of_the_change_feed(f: Fixture) {
    register(&f.store, "B1").await;
    let head = f.store.head().await.unwrap();
    let feed = f.store.changes(Seq::ZERO, 100).await.unwrap();
    let counter = descriptor("page-counter", "Pages_Counted");
    f.store.record_pass(pass(&counter, "host-a", PassPhase::Started)).await.unwrap();
    f.store.record_pass(pass(&counter, "host-a", ended(PassOutcome::Ok, "1 ok", 10))).await.unwrap();
    f.store.retire_component(&component("page-counter"), &agent("operator:alice"), "gone").await.unwrap();
    f.store.record_pass(pass(&counter, "host-a", idle())).await.unwrap();
    assert_eq!(f.store.head().await.unwrap(), head, "no seq taken");
    assert_eq!(f.store.changes(Seq::ZERO, 100).await.unwrap(), feed, "the feed is as it was");
    assert_eq!(f.store.wait_for_change(head, std::time::Duration::from_millis(50)).await.unwrap(), head);
}

async fn concurrent_first_passes_of_one_event_type_let_exactly_one_in(f: Fixture) {
    let tasks: Vec<_> = (0..8)
        .map(|n| {
            let store = Arc::clone(&f.store);
            tokio::spawn(async move {
                let counter = descriptor(&format!("page-counter-{n}"), "Pages_Counted");
                store.record_pass(pass(&counter, "host-a", PassPhase::Started)).await
            })
        })
        .collect();
    let mut refusals = Vec::new();
    for task in tasks {
        if let Err(err) = task.await.unwrap() {
            refusals.push(err);
        }
    }
    let all = f.store.components().await.unwrap();
    assert_eq!(all.len(), 1, "one producer of Pages_Counted: {all:?}");
    assert_eq!(refusals.len(), 7);
    let winner = all[0].name().to_string();
    for err in refusals {
        assert!(matches!(&err, StoreError::Conflict(m) if m.contains(&format!("component {winner};"))), "{err}");
    }
}

fn worked(results: &[(WorkResult, u64)]) -> PassPhase {
    let work =
        results.iter().map(|(result, duration_ms)| WorkDone { result: *result, duration_ms: *duration_ms }).collect();
    PassPhase::Ended { outcome: PassOutcome::Ok, summary: "worked".into(), duration_ms: 50, work }
}

async fn reported_work_adds_up_per_result_in_total_and_over_the_last_hour(f: Fixture) {
    use WorkResult::{Failure, Success, Transient};
    let counter = descriptor("page-counter", "Pages_Counted");
    f.store.record_pass(pass(&counter, "host-a", idle())).await.unwrap();
    assert_eq!(registered(&f.store, "page-counter").await.work, WorkHistory::default(), "idle passes add nothing");

    f.store
        .record_pass(pass(&counter, "host-a", worked(&[(Success, 8), (Success, 9), (Failure, 2_000)])))
        .await
        .unwrap();
    f.store.record_pass(pass(&counter, "host-b", worked(&[(Success, 7), (Transient, 40)]))).await.unwrap();
    let work = registered(&f.store, "page-counter").await.work;
    assert_eq!(work.total, work.last_hour, "everything happened in the last hour");
    let counts: Vec<u64> = WorkResult::ALL.iter().map(|r| work.total.get(*r).results).collect();
    assert_eq!(counts, [3, 1, 1], "success, failure, transient over both hosts");
    assert_eq!(work.total.success.duration_ms_sum, 24);
    let all = work.total.combined();
    assert_eq!((all.results, all.duration_ms_sum), (5, 2_064));
    let p50 = all.quantile(0.5).unwrap();
    assert!(p50 > Duration::from_millis(5) && p50 <= Duration::from_millis(10), "p50 {p50:?}");
    let p95 = all.quantile(0.95).unwrap();
    assert!(p95 > Duration::from_millis(1_000) && p95 <= Duration::from_millis(2_500), "p95 {p95:?}");

    // Each component keeps its own; a refused pass (its event type is taken) adds nothing.
    let archiver = descriptor("archiver", "Data_Archived");
    f.store.record_pass(pass(&archiver, "host-a", worked(&[(Success, 30)]))).await.unwrap();
    let clash = descriptor("page-counter-2", "Pages_Counted");
    f.store.record_pass(pass(&clash, "host-a", worked(&[(Failure, 1)]))).await.unwrap_err();
    assert_eq!(registered(&f.store, "page-counter").await.work, work, "the clash added nothing");
    assert_eq!(registered(&f.store, "archiver").await.work.total.success.results, 1);
    assert!(f.store.components().await.unwrap().iter().all(|c| c.name().as_str() != "page-counter-2"));
}

async fn work_series_hold_each_minute_and_hour_with_the_backlog_sampled_in_it(f: Fixture) {
    use WorkResult::{Failure, Success};
    let counter = descriptor("page-counter", "Pages_Counted");
    let archiver = descriptor("archiver", "Data_Archived");
    let before = Timestamp(Timestamp::now().millis() - 1_000);
    assert_eq!(f.store.work_series(SeriesStep::Hour, before, None).await.unwrap(), [], "nothing yet");
    f.store.record_pass(pass(&counter, "host-a", worked(&[(Success, 8), (Failure, 2_000)]))).await.unwrap();
    f.store.record_pass(pass(&archiver, "host-a", worked(&[(Success, 30)]))).await.unwrap();
    let samples = |ready: u64| {
        vec![
            BacklogSample { component: component("page-counter"), ready },
            BacklogSample { component: component("archiver"), ready: 1 },
        ]
    };
    f.store.record_backlog(samples(7)).await.unwrap();
    f.store.record_backlog(samples(5)).await.unwrap();
    let since = Timestamp(Timestamp::now().millis() - 2 * 3_600_000);
    for step in [SeriesStep::Minute, SeriesStep::Hour] {
        let points = f.store.work_series(step, since, None).await.unwrap();
        let names: Vec<&str> = points.iter().map(|p| p.component.as_str()).collect();
        // Everything happened within a step or two; the same on both backends and steps.
        assert!(names.first() == Some(&"archiver") && names.last() == Some(&"page-counter"), "{step:?}: {names:?}");
        let counter_points: Vec<&WorkPoint> =
            points.iter().filter(|p| p.component.as_str() == "page-counter").collect();
        let results: u64 = counter_points.iter().map(|p| p.tallies.combined().results).sum();
        let failures: u64 = counter_points.iter().map(|p| p.tallies.failure.results).sum();
        assert_eq!((results, failures), (2, 1), "{step:?}");
        let newest = counter_points.last().unwrap();
        assert_eq!(newest.backlog, Some(5), "{step:?}: the newest sample of the step replaces the one before");
        assert_eq!(newest.at.millis() % step.millis(), 0, "a point starts at its step");
        assert!(newest.at <= Timestamp::now() && newest.at.millis() > Timestamp::now().millis() - 2 * step.millis());
    }
    let only = f.store.work_series(SeriesStep::Minute, since, Some(&component("archiver"))).await.unwrap();
    assert!(!only.is_empty() && only.iter().all(|p| p.component.as_str() == "archiver"), "{only:?}");
    let later = Timestamp(Timestamp::now().millis() + 3 * 3_600_000);
    assert_eq!(f.store.work_series(SeriesStep::Hour, later, None).await.unwrap(), [], "since is honoured");

    let twice = vec![
        BacklogSample { component: component("archiver"), ready: 1 },
        BacklogSample { component: component("archiver"), ready: 2 },
    ];
    match f.store.record_backlog(twice).await {
        Err(StoreError::Invalid(input)) => {
            assert_eq!((input.field.as_str(), input.value.as_str()), ("component", "archiver"))
        }
        other => panic!("a component sampled twice must be refused by name: {other:?}"),
    }
    let newest = f.store.work_series(SeriesStep::Minute, since, Some(&component("archiver"))).await.unwrap();
    assert_eq!(newest.last().unwrap().backlog, Some(1), "the refused call changed nothing");
}

async fn about_names_the_backend_its_current_schema_and_a_clock_near_the_hosts(f: Fixture) {
    let before = Timestamp::now();
    let about = f.store.about().await.unwrap();
    let after = Timestamp::now();
    let backend = if f.url.starts_with("sqlite:") { "sqlite" } else { "postgres" };
    assert_eq!(about.backend, backend);
    assert_eq!(about.schema_version, about.schema_wanted, "a store this release opened is current: {about:?}");
    // The servers run on this host: one clock, read within the call.
    assert!(about.clock.0 >= before.0 - 5 && about.clock.0 <= after.0 + 5, "{about:?} not in {before:?}..{after:?}");
    assert_eq!(f.store.head().await.unwrap(), Seq(0), "asking wrote nothing");
}

/// Instantiates every contract test once per backend: `sqlite::NAME` and `postgres::NAME`.
async fn claim_ready_claims_the_ready_and_writes_nothing_for_the_rest(f: Fixture) {
    ready_claims::claim_ready_claims_the_ready_and_writes_nothing_for_the_rest(f.store.as_ref()).await
}

async fn a_hold_refuses_claim_ready_and_answers_the_steering(f: Fixture) {
    ready_claims::a_hold_refuses_claim_ready_and_answers_the_steering(f.store.as_ref()).await
}

async fn a_retried_claim_ready_with_its_key_answers_the_runs_it_opened(f: Fixture) {
    ready_claims::a_retried_claim_ready_with_its_key_answers_the_runs_it_opened(f.store.as_ref()).await
}

async fn an_exclusive_claim_is_refused_a_batch_held_by_another_unless_it_takes_that_run_over(f: Fixture) {
    ready_claims::an_exclusive_claim_is_refused_a_batch_held_by_another_unless_it_takes_that_run_over(f.store.as_ref())
        .await
}

async fn a_retried_exclusive_claim_answers_the_run_it_opened_not_held(f: Fixture) {
    ready_claims::a_retried_exclusive_claim_answers_the_run_it_opened_not_held(f.store.as_ref()).await
}

async fn the_liveness_a_claim_names_comes_back_with_its_run(f: Fixture) {
    ready_claims::the_liveness_a_claim_names_comes_back_with_its_run(f.store.as_ref()).await
}

async fn a_claim_that_is_not_exclusive_is_refused_a_batch_whose_open_run_is_its_lock(f: Fixture) {
    ready_claims::a_claim_that_is_not_exclusive_is_refused_a_batch_whose_open_run_is_its_lock(f.store.as_ref()).await
}

async fn a_claim_that_is_not_exclusive_still_abandons_an_open_run_without_a_liveness(f: Fixture) {
    ready_claims::a_claim_that_is_not_exclusive_still_abandons_an_open_run_without_a_liveness(f.store.as_ref()).await
}

async fn a_registration_records_the_batch_with_its_first_event_in_one_commit(f: Fixture) {
    registrations::a_registration_records_the_batch_with_its_first_event_in_one_commit(f.store.as_ref()).await
}

async fn a_registration_whose_event_is_over_the_cap_registers_nothing(f: Fixture) {
    let separator = if f.url.contains('?') { '&' } else { '?' };
    let capped = open_store(&format!("{}{separator}max_batch_bytes=1MiB", f.url)).await.unwrap();
    registrations::a_registration_whose_event_is_over_the_cap_registers_nothing(capped.as_ref()).await
}

async fn a_judged_claim_claims_only_what_is_as_judged(f: Fixture) {
    ready_claims::a_judged_claim_claims_only_what_is_as_judged(f.store.as_ref()).await
}

macro_rules! contract {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(#[tokio::test]
            async fn $name() {
                super::$name(super::sqlite().await).await
            })*
        }
        mod postgres {
            $(#[tokio::test]
            async fn $name() {
                super::$name(super::postgres().await).await
            })*
        }
    };
}

contract!(
    about_names_the_backend_its_current_schema_and_a_clock_near_the_hosts,
    create_is_idempotent_when_identical_and_refuses_conflicts,
    a_registration_records_the_batch_with_its_first_event_in_one_commit,
    a_registration_whose_event_is_over_the_cap_registers_nothing,
    events_get_increasing_seqs_and_store_time,
    unknown_batches_are_not_found,
    get_and_list_batches_page_through_everything,
    a_page_of_batches_reads_as_each_batch_alone,
    priority_and_content_changes,
    the_effective_view_honours_reset_markers,
    claims_fence_stale_and_closed_runs,
    release_closes_a_run_without_an_event,
    failed_attempts_count_abandoned_and_transient_runs_since_a_seq,
    checkpoints_survive_an_abandoned_run_and_a_transient_failure_and_vanish_with_a_result,
    a_runs_output_is_saved_while_it_runs_and_after_a_cancel_and_goes_with_its_result,
    an_append_hands_its_batch_to_an_idle_taker_only_while_the_batch_is_as_claimed,
    a_held_step_is_handed_nothing,
    a_taker_proven_dead_is_taken_over_and_handed_nothing_more,
    offers_and_hand_ons_that_could_never_hold_are_refused_by_name,
    a_hand_on_is_announced_to_its_taker_alone,
    a_registration_hands_its_new_batch_to_an_idle_taker,
    a_pruned_history_keeps_the_final_state_and_comes_back_whole_from_its_export,
    a_batch_with_an_open_run_or_bad_tickets_is_not_pruned,
    the_change_feed_lists_each_changed_batch_once_in_order,
    an_idempotent_retry_returns_the_first_event,
    bad_input_is_refused_by_name_and_writes_nothing,
    cancel_run_fences_the_open_run_and_records_one_cancelled_failure,
    cancel_run_without_an_open_run_only_records_the_failure,
    cancel_run_refuses_bad_input_and_writes_nothing,
    prioritize_sets_the_priority_and_records_why_in_one_change,
    count_batches_counts_every_registered_batch,
    concurrent_appends_share_commits_yet_each_gets_its_own_answer,
    a_retried_claim_with_its_key_returns_the_run_it_opened,
    claim_many_claims_each_batch_as_a_single_claim_would,
    claim_many_with_a_claim_key_retries_like_claim_and_refuses_a_bad_holder,
    claim_ready_claims_the_ready_and_writes_nothing_for_the_rest,
    a_hold_refuses_claim_ready_and_answers_the_steering,
    a_retried_claim_ready_with_its_key_answers_the_runs_it_opened,
    an_exclusive_claim_is_refused_a_batch_held_by_another_unless_it_takes_that_run_over,
    a_retried_exclusive_claim_answers_the_run_it_opened_not_held,
    the_liveness_a_claim_names_comes_back_with_its_run,
    a_claim_that_is_not_exclusive_is_refused_a_batch_whose_open_run_is_its_lock,
    a_claim_that_is_not_exclusive_still_abandons_an_open_run_without_a_liveness,
    a_judged_claim_claims_only_what_is_as_judged,
    wait_for_change_wakes_when_the_store_moves_and_times_out_when_not,
    a_commit_by_another_handle_wakes_a_waiter_before_its_fallback_look,
    a_waiter_wakes_only_for_changes_that_concern_it,
    a_first_pass_registers_the_component_and_its_host,
    an_identical_pass_moves_last_seen_but_not_changed_at,
    a_changed_trigger_or_version_updates_the_descriptor_and_changed_at,
    a_started_pass_is_running_until_it_ends_and_each_host_is_listed,
    an_event_type_clash_is_refused_naming_the_other_component,
    retiring_records_who_and_why_and_a_new_pass_brings_it_back,
    bad_registry_input_is_refused_by_name_and_changes_nothing,
    registry_writes_take_no_seq_and_stay_out_of_the_change_feed,
    concurrent_first_passes_of_one_event_type_let_exactly_one_in,
    reported_work_adds_up_per_result_in_total_and_over_the_last_hour,
    work_series_hold_each_minute_and_hour_with_the_backlog_sampled_in_it,
    summaries_equal_the_summary_of_each_whole_batch,
    running_names_each_component_with_an_open_run_once,
    run_state_tells_a_holder_whether_its_generation_is_still_the_open_one,
    batch_head_says_what_the_whole_batch_says,
    log_pages_walk_the_log_both_ways_without_skipping_or_repeating,
    a_batch_at_its_byte_cap_refuses_more_and_writes_nothing,
    summaries_read_every_flag_as_the_whole_batch_does,
    listings_say_what_each_whole_batch_says,
    an_id_asked_twice_is_read_and_answered_once,
    a_log_page_read_by_size_leaves_large_details_out_and_says_their_size,
    a_pause_reads_back_who_why_and_since_and_the_log_lists_it_newest_first,
    bad_steering_requests_are_refused_by_name_and_change_nothing,
    a_steer_wakes_every_watcher_but_adds_nothing_to_the_change_feed,
    the_breaker_opens_the_circuit_at_break_after_distinct_failures,
    concurrent_steers_lose_no_change,
    enqueue_adds_each_key_once_and_moves_the_cursor_only_from_where_it_was,
    a_taken_notice_is_leased_to_its_holder_and_sent_once,
    a_failed_notice_is_due_again_after_retry_in_with_its_attempts_counted,
    an_expired_lease_lets_another_holder_take_it_and_refuses_the_first,
    concurrent_takers_never_get_the_same_notice,
    bad_notice_input_is_refused_by_name_and_writes_nothing,
    notice_text_round_trips_every_character,
    notices_found_together_sort_by_the_bytes_of_their_keys_whatever_the_locale,
);
