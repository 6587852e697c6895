//! The index engine and its embedded adapter on real directories and a real store file.

use std::sync::Arc;

use autocomp_model::*;
use autocomp_sboi::{BatchIndex, CatchUp, EngineOptions, FreshAnswer, IndexEngine, LocalIndex, open_index};
use autocomp_store::*;
use serde_json::json;

fn id(text: &str) -> BatchId {
    BatchId::new(text).unwrap()
}
fn ty(text: &str) -> EventType {
    EventType::new(text).unwrap()
}

async fn store_in(dir: &std::path::Path) -> Arc<SqliteStore> {
    Arc::new(SqliteStore::open(dir.join("store.db")).await.unwrap())
}

async fn add(store: &SqliteStore, batch: &str, events: &[(&str, Outcome)]) {
    store.create_batch(NewBatch::new(id(batch), BatchType::new("RoundTrip").unwrap())).await.unwrap();
    for (event_type, outcome) in events {
        store
            .append_event(&id(batch), NewEvent::new(ty(event_type), *outcome, Agent::new("t").unwrap()))
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn local_index_sees_every_change_before_answering() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_in(dir.path()).await;
    let index = LocalIndex::new(IndexEngine::open(dir.path().join("index")).unwrap(), store.clone());
    let trigger =
        Trigger { requires: vec![ty("Data_Received")], blocked_by: vec![ty("Verified")], ..Trigger::default() };
    assert!(index.query(&trigger).await.unwrap().is_empty());

    add(&store, "A", &[("Data_Received", Outcome::Success)]).await;
    add(&store, "B", &[("Data_Received", Outcome::Success), ("Verified", Outcome::Failure)]).await;
    add(&store, "C", &[("Data_Received", Outcome::Failure)]).await;
    assert_eq!(index.query(&trigger).await.unwrap(), vec![id("A")]);

    // An operator rerun (a Reset marker) makes B ready again; a priority bump puts it first.
    store
        .append_event(&id("B"), NewEvent::reset(vec![ty("Verified")], Agent::new("operator:ann").unwrap(), json!({})))
        .await
        .unwrap();
    store.set_priority(&id("B"), 9).await.unwrap();
    assert_eq!(index.query(&trigger).await.unwrap(), vec![id("B"), id("A")]);

    // The queries corrected the last commit and left the catch-up to a background task:
    // an explicit catch-up waits for it, then finds nothing left.
    assert_eq!(index.catch_up().await.unwrap(), CatchUp::UpToDate { cursor: store.head().await.unwrap() });
    let indexed = index.engine().get(&id("B")).unwrap().expect("B is indexed");
    assert_eq!(indexed.priority, 9);
    assert_eq!(indexed.present, vec!["Data_Received".to_owned()]);
}

#[tokio::test]
async fn a_fresh_query_sees_a_write_after_the_last_commit_while_another_process_holds_the_writer() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_in(dir.path()).await;
    add(&store, "A", &[("Data_Received", Outcome::Success)]).await;
    let index_dir = dir.path().join("index");
    let index = LocalIndex::new(IndexEngine::open(&index_dir).unwrap(), store.clone());
    index.catch_up().await.unwrap();
    let committed = index.engine().committed_cursor().unwrap();

    // Another handle on the directory holds the writer (as another process would): nothing
    // this process does can commit until it lets go.
    let other = tantivy_writer_holder(&index_dir);
    add(&store, "B", &[("Data_Received", Outcome::Success)]).await;
    store.set_priority(&id("B"), 5).await.unwrap();
    store
        .append_event(&id("A"), NewEvent::new(ty("Archived"), Outcome::Success, Agent::new("t").unwrap()))
        .await
        .unwrap();
    let head = store.head().await.unwrap();
    let trigger =
        Trigger { requires: vec![ty("Data_Received")], blocked_by: vec![ty("Archived")], ..Trigger::default() };

    // At once: B (new, first by priority), not A (archived since the commit, with an event
    // type the committed vocabulary does not know).
    assert!(index.covers(head, std::time::Duration::ZERO).await.unwrap());
    assert_eq!(index.query(&trigger).await.unwrap(), vec![id("B")]);
    let fresh = index.engine().query_fresh(store.as_ref(), &trigger, Timestamp::now()).await.unwrap().unwrap();
    assert_eq!(fresh, FreshAnswer { batches: vec![id("B")], as_of: head, committed, corrections: 2 });
    // Nothing was committed: the background catch-up found the writer busy.
    assert_eq!(index.engine().committed_cursor().unwrap(), committed);
    assert_eq!(index.engine().query_at(&trigger, Timestamp::now()).unwrap(), vec![id("A")]);
    assert_eq!(index.catch_up().await.unwrap(), CatchUp::WriterBusy { cursor: committed });

    drop(other);
    assert!(matches!(index.catch_up().await.unwrap(), CatchUp::Applied { batches: 2, .. }));
    let caught_up = index.engine().query_fresh(store.as_ref(), &trigger, Timestamp::now()).await.unwrap().unwrap();
    assert_eq!(caught_up, FreshAnswer { batches: vec![id("B")], as_of: head, committed: head, corrections: 0 });
}

#[tokio::test]
async fn past_the_bound_a_query_catches_up_first() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_in(dir.path()).await;
    let options = EngineOptions { max_corrections: 2, ..EngineOptions::default() };
    let index = LocalIndex::new(IndexEngine::open_with(dir.path().join("index"), options).unwrap(), store.clone());
    let trigger = Trigger { requires: vec![ty("Data_Received")], limit: Some(2), ..Trigger::default() };
    for name in ["A", "B"] {
        add(&store, name, &[("Data_Received", Outcome::Success)]).await;
    }
    // Two changed batches: corrected, nothing committed on the way.
    assert_eq!(index.engine().fresh_through(store.as_ref()).await.unwrap(), Some(store.head().await.unwrap()));
    let fresh = index.engine().query_fresh(store.as_ref(), &trigger, Timestamp::now()).await.unwrap().unwrap();
    assert_eq!((fresh.batches, fresh.corrections), (vec![id("A"), id("B")], 2));
    assert_eq!(index.engine().committed_cursor().unwrap(), Seq::ZERO);

    add(&store, "C", &[("Data_Received", Outcome::Success)]).await;
    assert_eq!(index.engine().fresh_through(store.as_ref()).await.unwrap(), None);
    assert_eq!(index.engine().query_fresh(store.as_ref(), &trigger, Timestamp::now()).await.unwrap(), None);
    // The port catches up, then answers from the commit.
    assert_eq!(index.query(&trigger).await.unwrap(), vec![id("A"), id("B")]);
    assert_eq!(index.engine().committed_cursor().unwrap(), store.head().await.unwrap());
    // A limit of zero answers nothing, corrected or not.
    let none = Trigger { limit: Some(0), ..trigger };
    add(&store, "D", &[("Data_Received", Outcome::Success)]).await;
    let fresh = index.engine().query_fresh(store.as_ref(), &none, Timestamp::now()).await.unwrap().unwrap();
    assert_eq!((fresh.batches, fresh.corrections), (vec![], 1));
}

#[tokio::test]
async fn a_busy_writer_elsewhere_leaves_queries_on_the_committed_state() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_in(dir.path()).await;
    add(&store, "A", &[("Data_Received", Outcome::Success)]).await;
    let engine = IndexEngine::open(dir.path().join("index")).unwrap();
    engine.catch_up(store.as_ref()).await.unwrap();
    let committed = engine.committed_cursor().unwrap();

    // Another handle on the directory holds the writer (as another process would).
    let other = tantivy_writer_holder(&dir.path().join("index"));
    add(&store, "B", &[("Data_Received", Outcome::Success)]).await;
    assert_eq!(engine.catch_up(store.as_ref()).await.unwrap(), CatchUp::WriterBusy { cursor: committed });
    let trigger = Trigger { requires: vec![ty("Data_Received")], ..Trigger::default() };
    assert_eq!(engine.query_at(&trigger, Timestamp::now()).unwrap(), vec![id("A")]);
    drop(other);
    assert!(matches!(engine.catch_up(store.as_ref()).await.unwrap(), CatchUp::Applied { batches: 1, .. }));
    assert_eq!(engine.query_at(&trigger, Timestamp::now()).unwrap(), vec![id("A"), id("B")]);
}

/// Takes the index writer lock through a second, independent open of the directory.
fn tantivy_writer_holder(dir: &std::path::Path) -> tantivy::IndexWriter {
    let index = tantivy::Index::open_in_dir(dir).unwrap();
    index.writer_with_num_threads(1, 15 << 20).unwrap()
}

#[tokio::test]
async fn rebuild_equals_catch_up() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_in(dir.path()).await;
    for n in 0..30 {
        let outcome = if n % 4 == 0 { Outcome::Failure } else { Outcome::Success };
        add(&store, &format!("B{n:02}"), &[("Data_Received", Outcome::Success), ("Verified", outcome)]).await;
    }
    let caught_up = IndexEngine::open(dir.path().join("a")).unwrap();
    caught_up.catch_up(store.as_ref()).await.unwrap();
    let rebuilt = IndexEngine::open(dir.path().join("b")).unwrap();
    assert_eq!(rebuilt.rebuild(store.as_ref()).await.unwrap(), 30);
    assert_eq!(caught_up.dump().unwrap(), rebuilt.dump().unwrap());
    assert_eq!(rebuilt.committed_cursor().unwrap(), store.head().await.unwrap());
    // Rebuilding again over a full index replaces, never duplicates.
    rebuilt.rebuild(store.as_ref()).await.unwrap();
    assert_eq!(rebuilt.num_docs().unwrap(), 30);
}

#[tokio::test]
async fn index_urls_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn ObjectStore> = store_in(dir.path()).await;
    let url = format!("local:{}", dir.path().join("idx").display());
    let index = open_index(&url, store.clone()).unwrap();
    assert!(index.query(&Trigger::default()).await.unwrap().is_empty());
    for (bad, says) in [("local:", "names no directory"), ("s3://bucket", "unknown scheme")] {
        let err = open_index(bad, store.clone()).err().expect("refused");
        assert!(err.to_string().contains("index url") && err.to_string().contains(says), "{bad}: {err}");
    }
}

/// A store of `count` batches `B0000`..., every one received and a third also verified.
async fn many_batches(store: &SqliteStore, count: usize) -> Vec<BatchId> {
    let mut ids = Vec::with_capacity(count);
    for n in 0..count {
        let name = format!("B{n:04}");
        let events: &[(&str, Outcome)] = if n % 3 == 0 {
            &[("Data_Received", Outcome::Success), ("Verified", Outcome::Success)]
        } else {
            &[("Data_Received", Outcome::Success)]
        };
        add(store, &name, events).await;
        ids.push(id(&name));
    }
    ids
}

/// Drifts a committed index by hand, as a buggy release or a hand edit would: deletes the
/// document of `lost` and adds one for `stray`, a batch the store never had. Keeps the
/// commit payload, so the change feed has nothing to say about either.
fn drift_by_hand(index_dir: &std::path::Path, lost: &BatchId, stray: &str) {
    use tantivy::{Index, TantivyDocument, Term};
    let index = Index::open_in_dir(index_dir).unwrap();
    let payload = index.load_metas().unwrap().payload.expect("a committed index has a payload");
    let schema = index.schema();
    let (id_field, changed) = (schema.get_field("id").unwrap(), schema.get_field("changed_seq").unwrap());
    let mut writer: tantivy::IndexWriter = index.writer_with_num_threads(1, 15 << 20).unwrap();
    writer.delete_term(Term::from_field_text(id_field, lost.as_str()));
    let mut document = TantivyDocument::default();
    document.add_text(id_field, stray);
    document.add_i64(changed, 1);
    writer.add_document(document).unwrap();
    let mut prepared = writer.prepare_commit().unwrap();
    prepared.set_payload(&payload);
    prepared.commit().unwrap();
    writer.wait_merging_threads().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconcile_of_a_store_that_fits_in_one_page_repairs_its_drift() {
    use autocomp_sboi::http::{Follower, Reconciled};

    let dir = tempfile::tempdir().unwrap();
    let store = store_in(dir.path()).await;
    let ids = many_batches(&store, 30).await;
    let index_dir = dir.path().join("index");
    IndexEngine::open_with(&index_dir, EngineOptions::default()).unwrap().catch_up(store.as_ref()).await.unwrap();
    let (lost, stray) = (&ids[3], "B1500-stray");
    drift_by_hand(&index_dir, lost, stray);

    let engine = IndexEngine::open_with(&index_dir, EngineOptions { keep_writer: true, ..Default::default() }).unwrap();
    let follower = Follower::new(engine, store.clone()).unwrap();
    // One page from the first id to the end: a range open at both ends.
    let reconciled = follower.reconcile().await.unwrap();
    assert_eq!(reconciled, Reconciled { checked: 30, rewritten: 1, deleted: 1 });
    assert!(follower.engine().get(lost).unwrap().is_some());
    assert_eq!(follower.engine().get(&id(stray)).unwrap(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconcile_repairs_drift_while_catch_ups_go_on() {
    use autocomp_sboi::IndexedBatch;
    use autocomp_sboi::http::{Follower, Reconciled};

    let dir = tempfile::tempdir().unwrap();
    let store = store_in(dir.path()).await;
    let ids = many_batches(&store, 2_000).await;
    // Small pages: the reconcile walks 100 of them, so it is still running when the
    // catch-up below is done, unless the catch-up waits for it.
    let options =
        EngineOptions { page_size: 20, writer_threads: 1, writer_memory_bytes: 15 << 20, ..Default::default() };
    let index_dir = dir.path().join("index");
    IndexEngine::open_with(&index_dir, options.clone()).unwrap().catch_up(store.as_ref()).await.unwrap();
    let (lost, stray) = (&ids[7], "B1500-stray");
    drift_by_hand(&index_dir, lost, stray);

    let engine = IndexEngine::open_with(&index_dir, EngineOptions { keep_writer: true, ..options.clone() }).unwrap();
    let follower = Follower::new(engine, store.clone()).unwrap();
    assert_eq!(follower.engine().get(lost).unwrap(), None);
    assert!(follower.engine().get(&id(stray)).unwrap().is_some());
    assert_eq!(follower.catch_up().await.unwrap(), CatchUp::UpToDate { cursor: store.head().await.unwrap() });

    let reconcile = tokio::spawn({
        let follower = Arc::clone(&follower);
        async move { follower.reconcile().await }
    });
    let late = &ids[1_999];
    store.append_event(late, NewEvent::new(ty("Verified"), Outcome::Success, Agent::new("t").unwrap())).await.unwrap();
    let applied = follower.catch_up().await.unwrap();
    assert!(!reconcile.is_finished(), "the catch-up waited for the whole reconcile");
    assert!(matches!(applied, CatchUp::Applied { batches: 1, .. }), "{applied:?}");
    let indexed: IndexedBatch = follower.engine().get(late).unwrap().expect("indexed");
    assert_eq!(indexed.present, ["Data_Received", "Verified"]);

    let reconciled = reconcile.await.unwrap().unwrap();
    assert_eq!(reconciled, Reconciled { checked: 2_000, rewritten: 1, deleted: 1 });
    assert_eq!(follower.engine().get(&id(stray)).unwrap(), None);
    // Every document as a rebuild from the store writes it, the lost one included.
    let rebuilt = IndexEngine::open_with(dir.path().join("rebuilt"), options).unwrap();
    rebuilt.rebuild(store.as_ref()).await.unwrap();
    assert_eq!(follower.engine().dump().unwrap(), rebuilt.dump().unwrap());
    let verified =
        Trigger { requires: vec![ty("Data_Received")], blocked_by: vec![ty("Verified")], ..Default::default() };
    assert_eq!(
        follower.engine().query_at(&verified, Timestamp::now()).unwrap(),
        rebuilt.query_at(&verified, Timestamp::now()).unwrap()
    );
    // Nothing left to repair.
    let again = follower.reconcile().await.unwrap();
    assert_eq!(again, Reconciled { checked: 2_000, rewritten: 0, deleted: 0 });
}

#[tokio::test]
async fn a_new_event_type_mid_catch_up_rewrites_the_documents_before_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_in(dir.path()).await;
    let options = autocomp_sboi::EngineOptions { page_size: 2, commit_every: 3, ..Default::default() };
    let engine = IndexEngine::open_with(dir.path().join("index"), options).unwrap();
    add(&store, "A", &[("Data_Received", Outcome::Success)]).await;
    engine.catch_up(store.as_ref()).await.unwrap();
    for name in ["B", "C", "D", "E"] {
        add(&store, name, &[("Data_Received", Outcome::Success)]).await;
    }
    add(&store, "F", &[("Data_Received", Outcome::Success), ("Archived", Outcome::Success)]).await;
    add(&store, "G", &[("Data_Received", Outcome::Success)]).await;
    engine.catch_up(store.as_ref()).await.unwrap();
    let not_archived = Trigger { blocked_by: vec![ty("Archived")], ..Trigger::default() };
    let expected: Vec<BatchId> = ["A", "B", "C", "D", "E", "G"].into_iter().map(id).collect();
    assert_eq!(engine.query_at(&not_archived, Timestamp::now()).unwrap(), expected);
    // A type nothing has recorded blocks nothing.
    let not_unknown = Trigger { blocked_by: vec![ty("Never_Recorded")], ..Trigger::default() };
    assert_eq!(engine.query_at(&not_unknown, Timestamp::now()).unwrap().len(), 7);
}
