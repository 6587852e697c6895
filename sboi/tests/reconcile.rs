//! The service's reconcile (`Follower::reconcile`, what `--reconcile-every` and
//! `POST /v1/reconcile` run) on a real SQLite store file and a real index directory, at store
//! sizes on both sides of its page of 500 batches: an empty store, one page that is the whole
//! store, a store that ends exactly at a page's end, one batch past it, and three pages. At
//! each size the index is made wrong by hand, as a buggy release or a hand edit would leave
//! it, and the reconcile must put it back to what a rebuild from the store writes.

use std::path::Path;
use std::sync::Arc;

use autocomp_model::*;
use autocomp_sboi::http::{Follower, Reconciled};
use autocomp_sboi::{EngineOptions, IndexEngine};
use autocomp_store::*;

/// Store sizes around `RECONCILE_PAGE` (500 batches) in `sboi/src/http/follower.rs`.
const SIZES: [usize; 6] = [0, 1, 499, 500, 501, 1_001];

/// Documents of batches the store never had: one before every id, one between the 500th and
/// 501st batch (after a page's last id, before the next page's first), one after every id.
const STRAYS: [&str; 3] = ["A-stray", "B0499-stray", "Z-stray"];

fn id(text: &str) -> BatchId {
    BatchId::new(text).unwrap()
}

/// The service's engine options (one kept writer, the default page, so the reconcile reads
/// 500 batches a page), with a small writer.
fn service_options() -> EngineOptions {
    EngineOptions { keep_writer: true, writer_threads: 1, writer_memory_bytes: 15 << 20, ..EngineOptions::default() }
}

/// Adds batches `B{from:04}` up to `B{to - 1:04}`; every third has an event, so the
/// documents differ in more than their ids.
async fn grow(store: &SqliteStore, from: usize, to: usize) {
    let agent = Agent::new("reconcile-test").unwrap();
    for n in from..to {
        let batch = id(&format!("B{n:04}"));
        let new = NewBatch::new(batch.clone(), BatchType::new("RoundTrip").unwrap()).with_priority((n % 3) as i32);
        store.create_batch(new).await.unwrap();
        if n % 3 == 0 {
            let received = NewEvent::new(EventType::new("Data_Received").unwrap(), Outcome::Success, agent.clone());
            store.append_event(&batch, received).await.unwrap();
        }
    }
}

/// Makes a committed index wrong by hand while keeping its commit payload, so the change feed
/// has nothing to say about it: each of `wrong` gets a document that differs from its batch
/// (another priority, no events, an old `changed_seq`), each of `lost` loses its document,
/// and each of `strays` gets one.
fn make_wrong(index_dir: &Path, wrong: &[BatchId], lost: &[BatchId], strays: &[&str]) {
    use tantivy::{Index, TantivyDocument, Term};
    let index = Index::open_in_dir(index_dir).unwrap();
    // An index that never committed (an empty store's) has no payload: it stays without.
    let payload = index.load_metas().unwrap().payload;
    let schema = index.schema();
    let field = |name: &str| schema.get_field(name).unwrap();
    let (id_field, changed, priority) = (field("id"), field("changed_seq"), field("priority"));
    // The engine just dropped lets go of the index's lock once its writer's last holder ends
    // (a commit's task may still hold it): asked again until it does, for up to 10 s.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut writer: tantivy::IndexWriter = loop {
        match index.writer_with_num_threads(1, 15 << 20) {
            Ok(writer) => break writer,
            Err(tantivy::TantivyError::LockFailure(..)) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            Err(error) => panic!("the hand edit's writer: {error}"),
        }
    };
    for batch in wrong.iter().chain(lost) {
        writer.delete_term(Term::from_field_text(id_field, batch.as_str()));
    }
    for text in wrong.iter().map(BatchId::as_str).chain(strays.iter().copied()) {
        let mut document = TantivyDocument::default();
        document.add_text(id_field, text);
        document.add_i64(changed, 0);
        document.add_i64(priority, 99);
        writer.add_document(document).unwrap();
    }
    let mut prepared = writer.prepare_commit().unwrap();
    if let Some(payload) = &payload {
        prepared.set_payload(payload);
    }
    prepared.commit().unwrap();
    writer.wait_merging_threads().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconcile_repairs_a_wrong_index_at_every_store_size_around_its_page() {
    let dir = tempfile::tempdir().unwrap();
    let options = SqliteOptions { synchronous: Synchronous::Normal, ..SqliteOptions::default() };
    let store = Arc::new(SqliteStore::open_with(dir.path().join("store.db"), options).await.unwrap());
    let index_dir = dir.path().join("index");
    let mut grown = 0;
    for size in SIZES {
        grow(&store, grown, size).await;
        grown = size;
        let ids: Vec<BatchId> = (0..size).map(|n| id(&format!("B{n:04}"))).collect();

        // The service's index, caught up: right, until it is made wrong below.
        let engine = IndexEngine::open_with(&index_dir, service_options()).unwrap();
        engine.catch_up(store.as_ref()).await.unwrap();
        let rebuilt = IndexEngine::open_with(dir.path().join(format!("rebuilt-{size}")), service_options()).unwrap();
        assert_eq!(rebuilt.rebuild(store.as_ref()).await.unwrap(), size);
        let expected = rebuilt.dump().unwrap();
        assert_eq!(engine.dump().unwrap(), expected, "{size} batches: the caught-up index");
        drop(engine); // and its kept writer, which the hand edit needs

        // Wrong documents for the first batch, the last, and the second page's first (B0500);
        // the document of the first page's last batch (B0499) missing altogether, unless it
        // is the store's last.
        let mut wrong: Vec<BatchId> = [ids.first(), ids.get(500), ids.last()].into_iter().flatten().cloned().collect();
        wrong.sort();
        wrong.dedup();
        let lost: Vec<BatchId> = ids.get(499).into_iter().filter(|batch| !wrong.contains(batch)).cloned().collect();
        make_wrong(&index_dir, &wrong, &lost, &STRAYS);

        let follower =
            Follower::new(IndexEngine::open_with(&index_dir, service_options()).unwrap(), store.clone()).unwrap();
        let before = follower.engine().dump().unwrap();
        assert_ne!(before, expected, "{size} batches: the index was made wrong");
        assert_eq!(before.len(), size - lost.len() + STRAYS.len(), "{size} batches");

        let reconciled = follower.reconcile().await.unwrap();
        let repaired = Reconciled { checked: size, rewritten: wrong.len() + lost.len(), deleted: STRAYS.len() };
        assert_eq!(reconciled, repaired, "{size} batches");
        assert_eq!(follower.engine().dump().unwrap(), expected, "{size} batches: the reconciled index");
        for stray in STRAYS {
            assert_eq!(follower.engine().get(&id(stray)).unwrap(), None, "{size} batches: {stray}");
        }
        // What it repaired it committed with the cursor it had: nothing for the feed to redo.
        assert_eq!(follower.engine().committed_cursor().unwrap(), store.head().await.unwrap(), "{size} batches");

        let again = follower.reconcile().await.unwrap();
        assert_eq!(again, Reconciled { checked: size, rewritten: 0, deleted: 0 }, "{size} batches: reconciled again");
    }
}
