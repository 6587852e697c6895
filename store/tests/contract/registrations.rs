//! The contract of `register_batch`, a batch registered with its first event in one commit,
//! run by the shared suite (`operations.rs`) on SQLite and PostgreSQL and by the service's
//! tests through `HttpStore`: the batch is never seen without its event, a repeat of an
//! identical registration writes nothing, and a registration whose event is refused (bad
//! input, over the batch's cap) registers nothing.

use autocomp_model::*;
use autocomp_store::*;
use serde_json::json;

fn id(text: &str) -> BatchId {
    BatchId::new(text).unwrap()
}

fn new_batch(name: &str) -> NewBatch {
    NewBatch::new(id(name), BatchType::new("Delivery").unwrap()).with_location(format!("/incoming/{name}"))
}

fn received() -> NewEvent {
    let agent = Agent::new("batch-trigger/1.0@host#1").unwrap();
    NewEvent::new(EventType::new("Data_Received").unwrap(), Outcome::Success, agent)
        .with_details(json!({"files": 3, "bytes": 1024}))
}

/// Asserts `store` holds nothing new since `head`: no seq taken, `batch` not registered.
async fn wrote_nothing(store: &dyn ObjectStore, head: Seq, batch: &str, what: &str) {
    assert_eq!(store.head().await.unwrap(), head, "{what}: nothing was written");
    let err = store.get_batch(&id(batch)).await.unwrap_err();
    assert!(matches!(err, StoreError::NotFound(_)), "{what}: the batch was not registered: {err}");
}

pub(crate) async fn a_registration_records_the_batch_with_its_first_event_in_one_commit(store: &dyn ObjectStore) {
    let before = store.head().await.unwrap();
    let registered = store.register_batch(new_batch("R1"), received()).await.unwrap();
    let CreateOutcome::Created(batch) = registered else { panic!("a new batch is created: {registered:?}") };
    assert_eq!(batch.events.len(), 1, "{batch:?}");
    let event = &batch.events[0];
    assert_eq!((event.event_type.as_str(), event.outcome), ("Data_Received", Outcome::Success));
    assert_eq!(event.details, json!({"files": 3, "bytes": 1024}));
    assert!(batch.created_seq > before && event.seq > batch.created_seq, "{batch:?}");
    assert_eq!(batch.changed_seq, event.seq, "the batch's last change is its event");
    assert_eq!(store.head().await.unwrap(), event.seq, "the batch and its event, nothing else");

    // What it answered is what a reader reads, the summary included.
    let read = store.get_batch(&id("R1")).await.unwrap();
    assert_eq!(
        (read.created_seq, read.modified_seq, read.changed_seq),
        (batch.created_seq, batch.modified_seq, batch.changed_seq)
    );
    assert_eq!((read.created_at, read.modified_at), (batch.created_at, batch.modified_at));
    assert_eq!(read.events, batch.events);
    assert_eq!((read.metadata.clone(), read.priority), (batch.metadata.clone(), batch.priority));
    let summary = store.get_summaries(&[id("R1")]).await.unwrap().pop().unwrap();
    assert_eq!(summary, BatchSummary::of(&read));
    assert!(summary.effective.iter().any(|e| e.event_type.as_str() == "Data_Received"), "{summary:?}");
    // The change feed lists it once, at its event.
    let page = store.changes(before, 100).await.unwrap();
    assert_eq!(page.changes, vec![(event.seq, id("R1"))]);

    // Registered again, identically: the batch as it stands, nothing written.
    let head = store.head().await.unwrap();
    let again = store.register_batch(new_batch("R1"), received()).await.unwrap();
    let CreateOutcome::AlreadyExists(existing) = again else { panic!("an identical batch exists: {again:?}") };
    assert_eq!(existing.events, batch.events, "no second event");
    assert_eq!(store.head().await.unwrap(), head, "a repeat writes nothing");
    // Differently: refused as `create_batch` refuses it, nothing written.
    let err = store.register_batch(new_batch("R1").with_priority(7), received()).await.unwrap_err();
    assert!(matches!(err, StoreError::Conflict(_)), "{err}");
    assert_eq!(store.head().await.unwrap(), head, "a conflicting registration writes nothing");

    // A batch registered without its event (`create_batch`, by hand) is answered as it
    // stands, without the event: the caller appends it.
    store.create_batch(new_batch("R2")).await.unwrap();
    let head = store.head().await.unwrap();
    let answered = store.register_batch(new_batch("R2"), received()).await.unwrap();
    assert!(matches!(&answered, CreateOutcome::AlreadyExists(b) if b.events.is_empty()), "{answered:?}");
    assert_eq!(store.head().await.unwrap(), head);

    // A first event naming a run or a key, or with details that are not an object, is
    // refused by name and registers nothing.
    let run = RunRef { component: ComponentName::new("archiver").unwrap(), generation: 1 };
    let key = IdempotencyKey::new("trigger.1").unwrap();
    let refused = [
        ("first.run", NewEvent { run: Some(run), ..received() }),
        ("first.idempotency_key", received().with_idempotency_key(key)),
        ("details", NewEvent { details: json!([1, 2]), ..received() }),
    ];
    for (field, first) in refused {
        let err = store.register_batch(new_batch("R3"), first).await.unwrap_err();
        assert!(matches!(&err, StoreError::Invalid(input) if input.field == field), "{field}: {err}");
        wrote_nothing(store, head, "R3", field).await;
    }
}

/// `capped` is a store whose `max_batch_bytes` is 1 MiB (the least it takes, and the most an
/// event's details may be): a batch whose metadata and first event together pass it.
pub(crate) async fn a_registration_whose_event_is_over_the_cap_registers_nothing(capped: &dyn ObjectStore) {
    let head = capped.head().await.unwrap();
    let mut large = new_batch("R-big");
    large.metadata["notes"] = json!("n".repeat(600_000));
    let event = |bytes: usize| received().with_details(json!({"blob": "x".repeat(bytes)}));
    let err = capped.register_batch(large.clone(), event(600_000)).await.unwrap_err();
    assert!(matches!(&err, StoreError::Invalid(input) if input.field == "batch" && input.value == "R-big"), "{err}");
    assert!(err.to_string().contains("max_batch_bytes"), "{err}");
    wrote_nothing(capped, head, "R-big", "over the cap").await;
    // What fits is registered.
    assert!(matches!(capped.register_batch(large, event(100_000)).await.unwrap(), CreateOutcome::Created(_)));
}
