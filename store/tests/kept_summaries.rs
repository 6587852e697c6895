//! The summary PostgreSQL keeps on each batch's row (schema 18, kept by triggers on
//! `batch_effective` and `runs`; from schema 21 written by the claim and the append
//! themselves, in the one version of the row each writes): writers of one batch through
//! separate connections at once leave it equal to the summary of the whole batch, a claim and
//! an append each write the row once (one that hands its batch on too), and columns a hand
//! edit left apart read as a store that holds something invalid, not as a crash.

use std::sync::Arc;

use autocomp_model::*;
use autocomp_store::*;
use autocomp_test_servers::postgres::{NamedDatabase, shared};

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

/// The row versions of `batches` that `calls` (SQL, inside one transaction) wrote: the
/// transaction's own count of updated rows, read before and after them.
fn batch_rows_updated_by(database: &str, calls: &str) -> i64 {
    let count = "SELECT 'updated ' || pg_stat_get_xact_tuples_updated('batches'::regclass);";
    let script = format!("BEGIN;\n{count}\n{calls}\n{count}\nCOMMIT;");
    let out = tokio::task::block_in_place(|| shared().psql(database, &script));
    let counts: Vec<i64> = out.lines().filter_map(|line| line.strip_prefix("updated ")?.parse().ok()).collect();
    assert_eq!(counts.len(), 2, "{out}");
    counts[1] - counts[0]
}

#[tokio::test(flavor = "multi_thread")]
async fn a_claim_and_an_append_write_their_batch_row_once_and_keep_its_summary() {
    let NamedDatabase { name: database, url } = shared().unique_named_database();
    let store = PgStore::open(&url).await.unwrap();
    let batch = id("K1");
    let agent = Agent::new("a").unwrap();
    store
        .register_batch(
            NewBatch::new(batch.clone(), "RoundTrip".parse().unwrap()),
            NewEvent::new("Data_Received".parse().unwrap(), Outcome::Success, agent),
        )
        .await
        .unwrap();
    // The functions every claim round and every append goes through, as the store calls them
    // (a claim: `autocomp_claim` under `autocomp_claim_ready`; an append: the group).
    let claim = "SELECT r_kind FROM autocomp_claim('K1', 'step', 'step/1@h#1', 'h', 1, NULL, 'pg:x', NULL, NULL);";
    assert_eq!(batch_rows_updated_by(&database, claim), 1, "a claim");
    let (kept, whole) = kept_and_whole(&store, &batch).await;
    assert_eq!(kept, whole);
    assert_eq!(kept.running.len(), 1, "the claim's open run is in the kept summary");
    let append = "SELECT r_seq FROM autocomp_append_group(ARRAY['K1'], ARRAY['Step_Done'], ARRAY['success'], \
                  ARRAY['step/1@h#1'], ARRAY['{}'::jsonb], ARRAY['step'], ARRAY[1::bigint], ARRAY[NULL::jsonb], \
                  ARRAY[NULL::text], 1000000);";
    assert_eq!(batch_rows_updated_by(&database, append), 1, "an append in the run");
    let (kept, whole) = kept_and_whole(&store, &batch).await;
    assert_eq!(kept, whole);
    assert!(kept.running.is_empty(), "the run the append closed is gone: {:?}", kept.running);
    assert_eq!(kept.effective.len(), 2, "Data_Received and Step_Done");
    // A writer that leaves the summary to the triggers still has it kept.
    let release = "UPDATE runs SET state = 'released' WHERE batch_id = 'K1' AND state = 'open';";
    assert_eq!(batch_rows_updated_by(&database, &format!("{claim}\n{release}")), 2, "a claim, then the trigger");
    let (kept, whole) = kept_and_whole(&store, &batch).await;
    assert_eq!(kept, whole);
    assert!(kept.running.is_empty(), "the run released by hand is gone: {:?}", kept.running);

    // Each return of a writer gives the setting back: a claim refused as held (a return
    // before its end) and an append (a set-returning function's end), each followed in the
    // same transaction by a run released by hand, leave that release to the trigger.
    let open = "SELECT r_kind FROM autocomp_claim('K1', 'other', 'other/1@h#1', 'h', 1, NULL, 'pg:y', NULL, NULL);";
    let held = "SELECT r_kind FROM autocomp_claim('K1', 'other', 'other/1@h#2', 'h', 2, NULL, 'pg:z', NULL, NULL);";
    let release_other = "UPDATE runs SET state = 'released' WHERE batch_id = 'K1' AND component = 'other' \
                         AND state = 'open';";
    assert_eq!(batch_rows_updated_by(&database, open), 1, "a claim of another step");
    let refused_then_released = format!("{held}\n{release_other}");
    assert_eq!(batch_rows_updated_by(&database, &refused_then_released), 1, "nothing, then the trigger");
    let (kept, whole) = kept_and_whole(&store, &batch).await;
    assert_eq!(kept, whole);
    assert!(kept.running.is_empty(), "released after a held claim: {:?}", kept.running);
    let current = "ARRAY[(SELECT generation FROM claims WHERE batch_id = 'K1' AND component = 'step')]";
    let appended_then_released =
        format!("{open}\n{claim}\n{}\n{release_other}", append.replace("ARRAY[1::bigint]", current));
    assert_eq!(batch_rows_updated_by(&database, &appended_then_released), 4, "two claims, an append, the trigger");
    let (kept, whole) = kept_and_whole(&store, &batch).await;
    assert_eq!(kept, whole);
    assert!(kept.running.is_empty(), "released after an append: {:?}", kept.running);
}

/// A taker of `name`'s component that works what `requires` leaves ready, offered to `store`.
async fn offered(store: &PgStore, name: &str, requires: &str, produces: &str) -> ComponentName {
    let component = ComponentName::new(name).unwrap();
    let trigger = Trigger::builder().requires(requires).blocked_by(produces).build();
    let descriptor = ComponentDescriptor::new(component.clone(), "1.0", produces.parse().unwrap(), trigger);
    let holder = RunHolder { liveness: Some(format!("pg:{name}")), ..holder(name) };
    assert!(store.offer_to_take(TakerOffer { descriptor, holder }).await.unwrap(), "the store keeps takers");
    component
}

/// A hand-on opens its run inside the write that hands it on (schema 26): the registration
/// and the append each leave the kept summary equal to the whole batch, with the handed run
/// open in it and the row at the run's own seq (what the run's own append then checks the
/// batch against); the append writes the row once.
#[tokio::test(flavor = "multi_thread")]
async fn a_hand_on_leaves_the_row_once_written_at_its_runs_seq_and_the_summary_whole() {
    let NamedDatabase { name: database, url } = shared().unique_named_database();
    let store = PgStore::open(&url).await.unwrap();
    let checker = offered(&store, "checker", "Data_Received", "Checked").await;
    offered(&store, "archiver", "Checked", "Archived").await;
    let batch = id("K2");
    let received = NewEvent::new("Data_Received".parse().unwrap(), Outcome::Success, Agent::new("a").unwrap());
    let registered = store
        .register_handing_on(
            NewBatch::new(batch.clone(), "RoundTrip".parse().unwrap()),
            received,
            std::slice::from_ref(&checker),
        )
        .await
        .unwrap();
    let [run] = &registered.runs[..] else { panic!("one run handed: {registered:?}") };
    let (kept, whole) = kept_and_whole(&store, &batch).await;
    assert_eq!(kept, whole);
    assert_eq!(kept.running.len(), 1, "the handed run is in the kept summary: {:?}", kept.running);
    assert_eq!(store.get_batch(&batch).await.unwrap().changed_seq, run.claim_seq, "the row at the run's seq");

    // The checker's result, handing the batch on to the archiver, as the store calls it.
    let append = format!(
        "SELECT r_handed FROM autocomp_append_group(ARRAY['K2'], ARRAY['Checked'], ARRAY['success'], \
         ARRAY['checker/1.0@host#1'], ARRAY['{{}}'::jsonb], ARRAY['checker'], ARRAY[{}::bigint], \
         ARRAY[NULL::jsonb], ARRAY[NULL::text], 1000000, ARRAY['[\"archiver\"]'::jsonb]);",
        run.generation
    );
    assert_eq!(batch_rows_updated_by(&database, &append), 1, "an append that hands on writes the row once");
    let (kept, whole) = kept_and_whole(&store, &batch).await;
    assert_eq!(kept, whole);
    let archiving = store.get_batch(&batch).await.unwrap();
    let handed = archiving.open_run(&ComponentName::new("archiver").unwrap()).expect("handed to the archiver");
    assert_eq!(archiving.changed_seq, handed.claim_seq, "the row at the handed run's seq");
    assert!(handed.claim_seq > archiving.effective().get(&"Checked".parse().unwrap()).unwrap().seq);

    // A registration that hands on inserts the row and writes it once more (schema 28: it
    // was twice more, once for the event and once for the handed run), and one that hands
    // nothing on (its taker busy) the same.
    let register = |batch: &str| {
        format!(
            "SELECT r_handed FROM autocomp_register_batch('{batch}', 'RoundTrip', 0, '{{}}'::jsonb, 'Data_Received',              'success', 'a', '{{}}'::jsonb, NULL, 1000000, '[\"checker\"]'::jsonb);"
        )
    };
    assert_eq!(batch_rows_updated_by(&database, &register("K3")), 1, "a registration handing on");
    let checking = store.get_batch(&id("K3")).await.unwrap();
    let handed = checking.open_run(&checker).expect("handed to the idle checker");
    assert_eq!(checking.changed_seq, handed.claim_seq, "the row at the handed run's seq");
    let (kept, whole) = kept_and_whole(&store, &id("K3")).await;
    assert_eq!(kept, whole);
    assert_eq!(batch_rows_updated_by(&database, &register("K4")), 1, "a registration whose taker is busy");
    let (kept, whole) = kept_and_whole(&store, &id("K4")).await;
    assert_eq!(kept, whole);
    assert!(kept.running.is_empty(), "nothing handed: {:?}", kept.running);
    assert_eq!(batch_rows_updated_by(&database, &register("K4")), 0, "registered already: nothing written");
}

#[tokio::test(flavor = "multi_thread")]
async fn kept_columns_a_hand_edit_left_apart_read_as_an_invalid_store_not_a_crash() {
    let server = shared();
    let NamedDatabase { name: database, url } = server.unique_named_database();
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
