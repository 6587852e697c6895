//! The claim as the lock, beyond the shared contract (`contract/ready_claims.rs`): a store of
//! the release before (schema 10, runs without a liveness) upgraded in place keeps its open
//! runs, which an exclusive claim then finds held (with no liveness) until taken over, and
//! whose older clients' claim functions are refused a batch whose open run is its lock; and on
//! PostgreSQL an exclusive claim that answered survives a crash of the server (every process
//! SIGKILLed, then crash recovery) even where the server commits without waiting for flushes.

use autocomp_model::*;
use autocomp_store::*;
use autocomp_test_servers::postgres::{Options, Postgres};
use serde_json::json;

fn id(text: &str) -> BatchId {
    BatchId::new(text).unwrap()
}

fn archiver() -> ComponentName {
    ComponentName::new("archiver").unwrap()
}

fn live_holder(name: &str, liveness: Option<&str>) -> RunHolder {
    RunHolder {
        agent: Agent::new(format!("{name}/1.0@host#1")).unwrap(),
        host: "host".into(),
        pid: 1,
        claim_key: None,
        liveness: liveness.map(str::to_owned),
    }
}

/// The archiver's exclusive claim round of `batches` (ready once `Checked` succeeded).
fn exclusive(batches: &[&str], holder: RunHolder, takeovers: Vec<Takeover>) -> ReadyClaimRequest {
    let descriptor = serde_json::from_value(json!({
        "name": "archiver", "version": "1.0", "event_type": "Archived",
        "trigger": {"requires": ["Checked"], "blocked_by": ["Archived"]},
        "max_attempts": 3, "retry_backoff": "90s", "queue_size": 5, "max_runtime": "2h",
    }))
    .unwrap();
    ReadyClaimRequest {
        batches: batches.iter().map(|text| id(text)).collect(),
        descriptor,
        holder,
        force: false,
        known_steering: None,
        exclusive: true,
        takeovers,
    }
}

async fn claim_one(store: &dyn ObjectStore, request: &ReadyClaimRequest) -> ReadyAnswer {
    let mut claims = store.claim_ready(request).await.unwrap();
    assert!(!claims.held && claims.answers.len() == 1, "{claims:?}");
    claims.answers.remove(0).unwrap()
}

/// What the release after schema 10 sees of a run claimed before it: open, with no liveness;
/// an exclusive claim is refused it, a takeover naming it with no liveness claims it.
async fn an_old_open_run_is_held_until_taken_over(store: &dyn ObjectStore, old_agent: &str) {
    let old = store.run_state(&id("U1"), &archiver()).await.unwrap().expect("the old run");
    assert_eq!((old.state, old.generation, old.holder.agent.as_str()), (RunState::Open, 1, old_agent));
    assert_eq!(old.holder.liveness, None, "claimed before liveness was kept");
    assert_eq!(store.open_runs(Some(&archiver())).await.unwrap(), std::slice::from_ref(&old));

    let head = store.head().await.unwrap();
    let new = live_holder("new", Some("zk:new"));
    let refused = claim_one(store, &exclusive(&["U1"], new.clone(), vec![])).await;
    assert_eq!((refused.claim, refused.held.as_ref()), (None, Some(&old)), "held by the old run");
    assert_eq!(store.head().await.unwrap(), head, "nothing written");

    let takeover = Takeover { batch: id("U1"), generation: 1, liveness: None };
    let taken = claim_one(store, &exclusive(&["U1"], new, vec![takeover])).await;
    let claim = taken.claim.expect("taken over");
    assert_eq!((claim.generation(), claim.run.holder.liveness.as_deref()), (2, Some("zk:new")));
    assert_eq!(claim.abandoned.map(|run| run.state), Some(RunState::Abandoned));
}

#[tokio::test]
async fn a_version_10_sqlite_file_keeps_its_open_runs_which_exclusive_claims_find_held() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.db");
    SqliteStore::create_at_schema_version(&path, 10).unwrap();
    // As the release before leaves a ready batch claimed by a pass that is still working.
    rusqlite::Connection::open(&path)
        .unwrap()
        .execute_batch(
            r#"UPDATE store_head SET seq = 3;
               INSERT INTO batches (id, type, priority, metadata, created_seq, modified_seq, changed_seq, created_at, modified_at)
                   VALUES ('U1', 'RoundTrip', 0, '{}', 1, 1, 3, 1000, 1000);
               INSERT INTO events (seq, batch_id, type, outcome, agent, at, details)
                   VALUES (2, 'U1', 'Checked', 'success', 'checker', 1100, '{}');
               INSERT INTO claims (batch_id, component, generation) VALUES ('U1', 'archiver', 1);
               INSERT INTO runs (batch_id, component, generation, agent, host, pid, started_at, claim_seq, state)
                   VALUES ('U1', 'archiver', 1, 'old/0.9@host#7', 'host', 7, 1200, 3, 'open');"#,
        )
        .unwrap();
    let store = SqliteStore::open(&path).await.unwrap();
    assert_eq!(store.schema_version().await.unwrap(), LATEST_SCHEMA_VERSION);
    const { assert!(LATEST_SCHEMA_VERSION >= 11) };
    an_old_open_run_is_held_until_taken_over(&store, "old/0.9@host#7").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_version_10_postgresql_store_keeps_its_open_runs_and_older_clients_claim_all_but_locks() {
    let server = autocomp_test_servers::postgres::shared();
    let database = format!("liveness_upgrade_{}", std::process::id());
    let url = server.create_database(&database);
    PgStore::create_at_schema_version(&url, 10).await.unwrap();
    let psql = |sql: &str| tokio::task::block_in_place(|| server.psql(&database, sql));
    // Through the functions the release before calls.
    psql(
        r#"SELECT autocomp_create_batch('U1', 'RoundTrip', 0, '{}'::jsonb);
           SELECT * FROM autocomp_append_group(ARRAY['U1'], ARRAY['Checked'], ARRAY['success'], ARRAY['checker'],
               ARRAY['{}'::jsonb], ARRAY[NULL]::text[], ARRAY[NULL]::bigint[], ARRAY[NULL]::jsonb[],
               ARRAY[NULL]::text[], 1000000);
           SELECT * FROM autocomp_claim('U1', 'archiver', 'old/0.9@host#7', 'host', 7, 'old-key');"#,
    );
    let store = PgStore::open(&url).await.unwrap();
    assert_eq!(store.schema_version().await.unwrap(), postgres::LATEST_VERSION);
    const { assert!(postgres::LATEST_VERSION >= 11) };
    an_old_open_run_is_held_until_taken_over(&store, "old/0.9@host#7").await;

    // A process of the release before, still running, claims through the functions it knows
    // a batch whose open run names no liveness: its runs carry none, and abandon such a run.
    psql("SELECT autocomp_create_batch('U2', 'RoundTrip', 0, '{}'::jsonb)");
    let old_claim =
        psql("SELECT r_kind, r_current FROM autocomp_claim('U2', 'archiver', 'old/0.9@host#7', 'host', 7, 'k2')");
    assert_eq!(old_claim.trim(), "new|1", "claimed: generation 1");
    let run = store.run_state(&id("U2"), &archiver()).await.unwrap().unwrap();
    assert_eq!((run.generation, run.holder.liveness), (1, None));
    let many = psql("SELECT r_kind FROM autocomp_claim_many(ARRAY['U2'], 'archiver', 'old', 'host', 7, 'k3')");
    assert_eq!(many.trim(), "new");
    assert_eq!(store.run_state(&id("U2"), &archiver()).await.unwrap().unwrap().generation, 2);

    old_clients_are_refused_a_batch_whose_open_run_is_its_lock(&store, &url).await;
}

/// U1's open run is its lock (taken over by this release, naming a liveness): the claim
/// functions the release before calls (`autocomp_claim`, `_many`, `_ready` without a
/// liveness) refuse it with SQLSTATE AC409 naming the holder, the run and the lock, and roll
/// their statement back (a `claim_many` of U2 and U1 claims neither), U1's run still open with
/// its generation.
async fn old_clients_are_refused_a_batch_whose_open_run_is_its_lock(store: &PgStore, url: &str) {
    let lock = store.run_state(&id("U1"), &archiver()).await.unwrap().unwrap();
    assert_eq!((lock.generation, lock.holder.liveness.as_deref()), (2, Some("zk:new")));
    let u2 = store.run_state(&id("U2"), &archiver()).await.unwrap();
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    let changed = store.get_batch(&id("U1")).await.unwrap().changed_seq.0;
    let steering = store.steering().await.unwrap().version as i64;
    let calls = [
        "SELECT * FROM autocomp_claim('U1', 'archiver', 'old/0.9@host#7', 'host', 7, 'k4')".to_owned(),
        "SELECT * FROM autocomp_claim_many(ARRAY['U2', 'U1'], 'archiver', 'old', 'host', 7, 'k5')".to_owned(),
        format!(
            "SELECT * FROM autocomp_claim_ready(ARRAY['U1'], ARRAY[{changed}::bigint], ARRAY[0::bigint], {steering}, \
             'archiver', 'old', 'host', 7, 'k6')"
        ),
    ];
    let changed_seqs = || async {
        let batches = store.get_batches(&[id("U1"), id("U2")]).await.unwrap();
        batches.into_iter().map(|batch| (batch.id, batch.changed_seq)).collect::<Vec<_>>()
    };
    for call in calls {
        let (head, before) = (store.head().await.unwrap(), changed_seqs().await);
        let refused = client.simple_query(&call).await.expect_err(&call);
        let refused = refused.as_db_error().unwrap_or_else(|| panic!("{call}: {refused}"));
        assert_eq!(refused.code().code(), "AC409", "{call}");
        for named in ["new/1.0@host#1", "run 2 ", "the batch's lock"] {
            assert!(refused.message().contains(named), "{call}: {}", refused.message());
        }
        assert_eq!(changed_seqs().await, before, "{call}: nothing written");
        if !call.contains("'U2'") {
            // A claim of U2 before U1's refusal took a seq, which its rollback leaves unused.
            assert_eq!(store.head().await.unwrap(), head, "{call}: nothing written");
        }
        assert_eq!(store.run_state(&id("U1"), &archiver()).await.unwrap().as_ref(), Some(&lock), "{call}");
        assert_eq!(store.run_state(&id("U2"), &archiver()).await.unwrap(), u2, "{call}: U2's claim rolled back");
    }
}

/// A server that never waits for a flush of its own (`synchronous_commit = off`) and whose
/// WAL writer flushes only every 10 s: a commit that did not wait is lost to a crash soon
/// after it. An exclusive claim waits all the same; once it answered, the run is there after
/// the crash, open with its generation and liveness, and another holder's exclusive claim is
/// answered held by it.
#[tokio::test(flavor = "multi_thread")]
async fn an_exclusive_claim_that_answered_survives_a_postgresql_crash() {
    let options = Options::default().setting("synchronous_commit", "off").setting("wal_writer_delay", "10s");
    let server = Postgres::start_with(options);
    let url = server.create_database("claim_lock");
    let store = PgStore::open(&url).await.unwrap();
    let new = NewBatch::new(id("C1"), BatchType::new("RoundTrip").unwrap()).with_location("/in/C1");
    store.create_batch(new).await.unwrap();
    let checked = NewEvent::new(EventType::new("Checked").unwrap(), Outcome::Success, Agent::new("checker").unwrap());
    store.append_event(&id("C1"), checked).await.unwrap();

    let first = live_holder("first", Some("zk:first"));
    let claimed = claim_one(&store, &exclusive(&["C1"], first, vec![])).await.claim.expect("claimed").run;
    tokio::task::block_in_place(|| {
        server.crash();
        server.restart();
    });
    drop(store);

    let store = PgStore::open(&url).await.unwrap();
    let after = store.run_state(&id("C1"), &archiver()).await.unwrap().expect("the claim survived the crash");
    assert_eq!(after, claimed, "open, with its generation and liveness");
    let head = store.head().await.unwrap();
    let second = claim_one(&store, &exclusive(&["C1"], live_holder("second", Some("zk:second")), vec![])).await;
    assert_eq!((second.claim, second.held), (None, Some(claimed)), "held by the run that survived");
    assert_eq!(store.head().await.unwrap(), head);
}
