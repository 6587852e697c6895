//! `wait_for_change_concerning`: a waiter for some event types sleeps through the commits of
//! other processes that do not concern it, and wakes at once for those that do.

use std::sync::Arc;
use std::time::{Duration, Instant};

use autocomp_model::{Agent, BatchId, BatchType, ChangeInterest, EventType, NewBatch, NewEvent, Outcome, Seq};
use autocomp_store::{ObjectStore, open_store};

use super::{Fixture, record, register};

/// Registers `batch` with a first event of type `kind` in one commit (`register_batch`).
async fn register_with(store: &Arc<dyn ObjectStore>, batch: &str, kind: &str) {
    let new = NewBatch::new(BatchId::new(batch).unwrap(), BatchType::new("RoundTrip").unwrap());
    let first = NewEvent::new(EventType::new(kind).unwrap(), Outcome::Success, Agent::new("trigger/1.0@h#1").unwrap());
    store.register_batch(new, first).await.unwrap();
}

const QUIET: Duration = Duration::from_millis(600);

/// Waits from the head this handle reads now, with `change` made through `writer` (another
/// process's handle) in between; how long the wait took.
async fn wait_after(
    store: &Arc<dyn ObjectStore>,
    interest: &ChangeInterest,
    change: impl Future<Output = ()>,
    timeout: Duration,
) -> (Seq, Duration) {
    let seen = store.head().await.unwrap();
    change.await;
    let started = Instant::now();
    let head = store.wait_for_change_concerning(seen, interest, timeout).await.unwrap();
    (head, started.elapsed())
}

pub(crate) async fn a_waiter_wakes_only_for_changes_that_concern_it(f: Fixture) {
    register(&f.store, "B1").await;
    let writer = open_store(&f.url).await.unwrap();
    let interest = ChangeInterest::Types([EventType::new("Checksums_Verified").unwrap()].into());
    // The first waits start the listen connection (the file watch): until then a waiter
    // cannot tell what the commits since its head concerned, and wakes for any.
    let mut slept_through = false;
    for _ in 0..20 {
        let unrelated = async {
            record(&writer, "B1", "Data_Received", Outcome::Success).await;
        };
        let (_, waited) = wait_after(&f.store, &interest, unrelated, QUIET).await;
        if waited >= QUIET - Duration::from_millis(50) {
            slept_through = true;
            break;
        }
    }
    assert!(slept_through, "an append of a type it does not read never let the waiter sleep");
    // A claim concerns nobody either.
    let claim = async {
        let holder = autocomp_model::RunHolder {
            agent: autocomp_model::Agent::new("checker/1.0@host#1").unwrap(),
            host: "host".into(),
            pid: 1,
            claim_key: None,
            liveness: None,
        };
        let component = autocomp_model::ComponentName::new("checker").unwrap();
        writer.claim(&autocomp_model::BatchId::new("B1").unwrap(), &component, &holder).await.unwrap();
    };
    let (_, waited) = wait_after(&f.store, &interest, claim, QUIET).await;
    assert!(waited >= QUIET - Duration::from_millis(50), "a claim woke it after {waited:?}");
    // The head a change-feed read answered serves as a head read does: a watcher sleeps from
    // the feed's head its look reached, without reading the head again.
    // (A change first, so that the feed's head is one no `head` read answered.)
    record(&writer, "B1", "Data_Received", Outcome::Success).await;
    let seen = f.store.changes(Seq(0), 1_000).await.unwrap().head;
    record(&writer, "B1", "Data_Received", Outcome::Success).await;
    let started = Instant::now();
    f.store.wait_for_change_concerning(seen, &interest, QUIET).await.unwrap();
    let waited = started.elapsed();
    assert!(
        waited >= QUIET - Duration::from_millis(50),
        "from the feed's head, an unrelated append woke it after {waited:?}"
    );

    // A batch registered (without events) can be ready only for a step that requires
    // nothing: a waiter for some types sleeps through it.
    let registered = async {
        register(&writer, "B0").await;
    };
    let (_, waited) = wait_after(&f.store, &interest, registered, QUIET).await;
    assert!(waited >= QUIET - Duration::from_millis(50), "a registration woke it after {waited:?}");
    // Nor does one registered with its first event of another type.
    let registered = async {
        register_with(&writer, "B0-R", "Data_Received").await;
    };
    let (_, waited) = wait_after(&f.store, &interest, registered, QUIET).await;
    assert!(waited >= QUIET - Duration::from_millis(50), "a registration with another type woke it after {waited:?}");

    // Asleep, then an append of its type (and, next, a new batch, for a waiter that requires
    // nothing and so wakes for everything) through the other handle.
    for what in ["an append of its type", "a new batch", "a batch registered with an event of its type"] {
        let interest = if what == "a new batch" { ChangeInterest::Everything } else { interest.clone() };
        let seen = f.store.head().await.unwrap();
        let waiter = {
            let (store, interest) = (Arc::clone(&f.store), interest.clone());
            tokio::spawn(async move {
                let head = store.wait_for_change_concerning(seen, &interest, Duration::from_secs(20)).await.unwrap();
                (head, Instant::now())
            })
        };
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!waiter.is_finished(), "{what}: nothing concerning yet, so it still waits");
        if what == "a new batch" {
            register(&writer, "B2").await;
        } else if what.starts_with("a batch registered") {
            register_with(&writer, "B3", "Checksums_Verified").await;
        } else {
            record(&writer, "B1", "Checksums_Verified", Outcome::Failure).await;
        }
        let committed = Instant::now();
        let (head, woke) = waiter.await.unwrap();
        assert!(head > seen, "{what}: answers the new head");
        let delay = woke.saturating_duration_since(committed);
        assert!(delay < Duration::from_millis(500), "{what}: woke {delay:?} after the commit");
    }

    // A waiter that reads the feed next (a watcher) sleeps the same way and wakes as soon;
    // an announcement that concerns it may wake it without a head read (`None`). It sleeps
    // from its look: the mark taken before the feed's page, and the page's cursor.
    let read_after = f.store.announcement_mark().await;
    let (page, _) = f.store.changed_summaries(Seq(0), 100).await.unwrap();
    let seen = page.next.min(page.head);
    let waiter = {
        let (store, interest) = (Arc::clone(&f.store), interest.clone());
        tokio::spawn(async move {
            let woke =
                store.wait_for_concerning_change(seen, read_after, &interest, Duration::from_secs(20)).await.unwrap();
            (woke, Instant::now())
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiter.is_finished(), "nothing concerning yet, so it still waits");
    record(&writer, "B1", "Data_Received", Outcome::Success).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished(), "an append of a type it does not read let it sleep on");
    record(&writer, "B1", "Checksums_Verified", Outcome::Success).await;
    let committed = Instant::now();
    let (woke, at) = waiter.await.unwrap();
    assert_eq!(woke, None, "the announcement woke it, and no head was read");
    let delay = at.saturating_duration_since(committed);
    assert!(delay < Duration::from_millis(500), "woke {delay:?} after the commit");
}
