//! The index engine and its embedded adapter on real directories and a real store file.

use std::sync::Arc;

use autocomp_sboi::{BatchIndex, CatchUp, IndexEngine, LocalIndex, open_index};
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

    let indexed = index.engine().get(&id("B")).unwrap().expect("B is indexed");
    assert_eq!(indexed.priority, 9);
    assert_eq!(indexed.present, vec!["Data_Received".to_owned()]);
    assert_eq!(index.catch_up().await.unwrap(), CatchUp::UpToDate { cursor: store.head().await.unwrap() });
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
