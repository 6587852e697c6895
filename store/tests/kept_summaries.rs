//! The summary PostgreSQL keeps on each batch's row (schema 18, kept by triggers on
//! `batch_effective` and `runs`): writers of one batch through separate connections at once
//! leave it equal to the summary of the whole batch, and columns a hand edit left apart read
//! as a store that holds something invalid, not as a crash.

use std::sync::Arc;

use autocomp_model::*;
use autocomp_store::*;
use autocomp_test_servers::postgres::shared;

fn id(text: &str) -> BatchId {
    BatchId::new(text).unwrap()
}

fn holder(name: &str) -> RunHolder {
    RunHolder {
        agent: Agent::new(format!("{name}/1.0@host#1")).unwrap(),
        host: "host".into(),
        pid: 1,
        claim_key: None,
        liveness: None,
    }
}

/// What the store says of `batch`, read as a page of summaries and as the whole batch.
async fn kept_and_whole(store: &dyn ObjectStore, batch: &BatchId) -> (BatchSummary, BatchSummary) {
    let kept = store.get_summaries(std::slice::from_ref(batch)).await.unwrap().remove(0);
    let whole = BatchSummary::of(&store.get_batch(batch).await.unwrap());
    (kept, whole)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn writers_of_one_batch_at_once_leave_its_kept_summary_equal_to_the_whole_batch() {
    let url = shared().unique_database();
    // Four handles, so the writers hold four connections and their transactions overlap.
    let mut stores: Vec<Arc<dyn ObjectStore>> = Vec::new();
    for _ in 0..4 {
        stores.push(Arc::new(PgStore::open(&format!("{url}?pool_size=2")).await.unwrap()));
    }
    let batches: Vec<BatchId> = (0..3).map(|n| id(&format!("K{n}"))).collect();
    for batch in &batches {
        stores[0].create_batch(NewBatch::new(batch.clone(), "RoundTrip".parse().unwrap())).await.unwrap();
    }
    // Each of eight components claims each batch, records a result or lets the run go, again
    // and again; every write of one batch races the others' claims, results and releases.
    let mut writers = tokio::task::JoinSet::new();
    for n in 0..8usize {
        let store = Arc::clone(&stores[n % stores.len()]);
        let batches = batches.clone();
        writers.spawn(async move {
            let component = ComponentName::new(format!("step{n}")).unwrap();
            let produces = EventType::new(format!("Step{n}_Done")).unwrap();
            for round in 0..6usize {
                for batch in &batches {
                    let claim = store.claim(batch, &component, &holder(&format!("step{n}"))).await.unwrap();
                    let generation = claim.generation();
                    if (round + n) % 3 == 2 {
                        store.release(batch, &component, generation).await.unwrap();
                    } else {
                        let outcome = if round % 2 == 0 { Outcome::Success } else { Outcome::Failure };
                        let event = NewEvent::new(produces.clone(), outcome, Agent::new("w").unwrap())
                            .in_run(component.clone(), generation);
                        store.append_event(batch, event).await.unwrap();
                    }
                }
            }
            // One run left open, so the kept open components are not all empty at the end.
            if n % 2 == 0 {
                store.claim(&batches[0], &component, &holder(&format!("step{n}"))).await.unwrap();
            }
        });
    }
    while let Some(done) = writers.join_next().await {
        done.unwrap();
    }
    for batch in &batches {
        let (kept, whole) = kept_and_whole(stores[1].as_ref(), batch).await;
        assert_eq!(kept, whole, "{batch}");
        assert_eq!(kept.effective.len(), 8, "{batch}: every component's last result");
    }
    let (kept, _) = kept_and_whole(stores[0].as_ref(), &batches[0]).await;
    assert_eq!(kept.running.len(), 4, "the four runs left open: {:?}", kept.running);
}

#[tokio::test(flavor = "multi_thread")]
async fn kept_columns_a_hand_edit_left_apart_read_as_an_invalid_store_not_a_crash() {
    let server = shared();
    let url = server.unique_database();
    let database = url.rsplit('/').next().unwrap().to_owned();
    let store = PgStore::open(&url).await.unwrap();
    let batch = id("K1");
    store.create_batch(NewBatch::new(batch.clone(), "RoundTrip".parse().unwrap())).await.unwrap();
    store
        .append_event(
            &batch,
            NewEvent::new("Data_Received".parse().unwrap(), Outcome::Success, Agent::new("a").unwrap()),
        )
        .await
        .unwrap();
    for edit in ["effective_outcomes = NULL", "effective_seqs = '{}'"] {
        let sql = format!("UPDATE batches SET {edit} WHERE id = 'K1'");
        tokio::task::block_in_place(|| server.psql(&database, &sql));
        let error = store.get_summaries(std::slice::from_ref(&batch)).await.unwrap_err();
        assert!(matches!(error, StoreError::Unavailable(_)), "{edit}: {error}");
        assert!(error.to_string().contains("kept summary"), "{edit}: {error}");
        // The next write of the batch keeps its summary again.
        tokio::task::block_in_place(|| {
            server.psql(&database, "UPDATE batch_effective SET acknowledged = false WHERE batch_id = 'K1'")
        });
        let (kept, whole) = kept_and_whole(&store, &batch).await;
        assert_eq!(kept, whole, "{edit}");
    }
}
