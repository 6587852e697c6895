//! `wait_for_change_concerning`: a waiter for some event types sleeps through the commits of
//! other processes that do not concern it, and wakes at once for those that do.

use std::sync::Arc;
use std::time::{Duration, Instant};

use autocomp_model::{
    Agent, BatchId, BatchSummary, BatchType, ChangeInterest, ComponentName, EventType, NewBatch, NewEvent, Outcome,
    RunHolder, Seq,
};
use autocomp_store::{ObjectStore, Woken, open_store};

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
    // an announcement that concerns it may wake it without a head read (`None`).
    let seen = f.store.head().await.unwrap();
    let waiter = {
        let (store, interest) = (Arc::clone(&f.store), interest.clone());
        tokio::spawn(async move {
            let woke = store.wait_for_concerning_change(seen, &interest, Duration::from_secs(20)).await.unwrap();
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
    assert!(matches!(woke, Woken::Announced { .. }), "the announcement woke it, and no head was read: {woke:?}");
    let delay = at.saturating_duration_since(committed);
    assert!(delay < Duration::from_millis(500), "woke {delay:?} after the commit");
}

/// Waits from a head this handle reads now until a commit through `writer` (`change`) concerns
/// `interest`, with the listen connection (the file watch) up: what woke it.
async fn woken_by<T>(
    store: &Arc<dyn ObjectStore>,
    interest: &ChangeInterest,
    change: impl Future<Output = T>,
) -> Woken {
    let seen = store.head().await.unwrap();
    let waiter = {
        let (store, interest) = (Arc::clone(store), interest.clone());
        tokio::spawn(async move { store.wait_for_concerning_change(seen, &interest, Duration::from_secs(20)).await })
    };
    change.await;
    waiter.await.unwrap().unwrap()
}

/// A wake by `what`, a commit on `batch`: the summary it handed over is the batch as the store
/// reads it now, to the field (on PostgreSQL the one the commit built in SQL, against the
/// store's summary read; on SQLite the one read after the commit, through its line).
async fn announced_as_read(store: &Arc<dyn ObjectStore>, what: &str, batch: &str, woke: Woken) {
    let Woken::Announced { summaries } = woke else { panic!("{what}: the head was read: {woke:?}") };
    let now: Vec<BatchSummary> = store.get_summaries(&[BatchId::new(batch).unwrap()]).await.unwrap();
    assert_eq!(summaries, now, "{what}: the announced summary is the store's");
}

pub(crate) async fn a_wake_hands_over_the_summaries_its_commits_announced(f: Fixture) {
    let writer = open_store(&f.url).await.unwrap();
    let interest = ChangeInterest::Types([EventType::new("Checksums_Verified").unwrap()].into());
    register_with(&writer, "S.1", "Data_Received").await;
    // Until the listen connection is up a waiter wakes at any head move, reading the head.
    let mut listening = false;
    for _ in 0..50 {
        let woke = woken_by(&f.store, &interest, record(&writer, "S.1", "Checksums_Verified", Outcome::Failure)).await;
        if matches!(woke, Woken::Announced { .. }) {
            listening = true;
            break;
        }
    }
    assert!(listening, "no announcement ever woke the waiter");

    // A failure, then a success while another component holds an open run, then a success
    // after a Reset: each announced summary is the batch as the store reads it after the commit,
    // to the field (the summary the commit built in SQL against the store's summary read).
    let claim = async {
        let holder = RunHolder {
            agent: Agent::new("checker/1.0@host#1").unwrap(),
            host: "host".into(),
            pid: 1,
            claim_key: None,
            liveness: None,
        };
        writer.claim(&BatchId::new("S.1").unwrap(), &ComponentName::new("checker").unwrap(), &holder).await.unwrap();
        record(&writer, "S.1", "Checksums_Verified", Outcome::Success).await;
    };
    let reset = async {
        let reset = NewEvent::reset(
            vec![EventType::new("Checksums_Verified").unwrap()],
            Agent::new("operator:ann").unwrap(),
            serde_json::json!({"reason": "re-run the check"}),
        );
        writer.append_event(&BatchId::new("S.1").unwrap(), reset).await.unwrap();
    };
    let failure = record(&writer, "S.1", "Checksums_Verified", Outcome::Failure);
    let woke = woken_by(&f.store, &interest, failure).await;
    announced_as_read(&f.store, "a failure", "S.1", woke).await;
    let woke = woken_by(&f.store, &interest, claim).await;
    announced_as_read(&f.store, "a success beside an open run", "S.1", woke).await;
    let woke = woken_by(&f.store, &interest, reset).await;
    announced_as_read(&f.store, "a reset", "S.1", woke).await;

    // A batch registered with its first event announces its summary too.
    let woke = woken_by(&f.store, &interest, register_with(&writer, "S2", "Checksums_Verified")).await;
    announced_as_read(&f.store, "a registration", "S2", woke).await;

    // A summary too long for a PostgreSQL notification (8,000 bytes) is not announced; the
    // commit still wakes the waiter, which reads the feed. A line of the embedded store's
    // wake file has no such bound.
    register(&writer, "S3").await;
    for i in 0..90 {
        let kind = format!("Step_Number_{i:03}_Of_A_Long_Pipeline_Whose_Names_Are_Long_Done");
        writer
            .append_event(
                &BatchId::new("S3").unwrap(),
                NewEvent::new(EventType::new(kind).unwrap(), Outcome::Success, Agent::new("test").unwrap()),
            )
            .await
            .unwrap();
    }
    let woke = woken_by(&f.store, &interest, record(&writer, "S3", "Checksums_Verified", Outcome::Success)).await;
    if f.store.about().await.unwrap().backend == "postgres" {
        let Woken::Announced { summaries } = woke else { panic!("a long summary: the head was read: {woke:?}") };
        assert!(
            summaries.iter().all(|summary| summary.id.as_str() != "S3"),
            "a summary past a notification's size was announced"
        );
    } else {
        announced_as_read(&f.store, "a long summary", "S3", woke).await;
    }
}
