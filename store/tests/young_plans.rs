//! A PostgreSQL connection plans a stage's statements once and keeps the plans (PL/pgSQL's
//! cached plans, generic since schema 21; the judged claim's read and the reads of batches
//! by id, planned once): a plan made while the store was nearly empty must still look
//! batches up by key once it holds thousands. Until schema 22 the lock of `id = ANY (...)`
//! was planned as a sequential scan on an empty table, and every registration, claim and
//! result on that connection then read the whole table.

use autocomp_model::*;
use autocomp_store::*;
use autocomp_test_servers::postgres::{NamedDatabase, Options, Postgres, shared};
use std::time::{Duration, Instant};

/// Rows `batches` holds when the stages are measured.
const GROWN_TO: usize = 3_000;
/// Stages (a registration, a judged claim, a result) measured on the grown table.
const STAGES: usize = 20;

fn agent() -> Agent {
    Agent::new("probe/1.0@host#1").unwrap()
}

/// One stage on `store`: `batch` registered with its delivery, claimed by the probe as a
/// watcher claims it (judged on its summary), its result recorded in the run, and the batch
/// read whole, as an operator's `show` reads it.
async fn stage(store: &PgStore, batch: &str) {
    let id: BatchId = batch.parse().unwrap();
    let received = NewEvent::new("Data_Received".parse().unwrap(), Outcome::Success, agent());
    store.register_batch(NewBatch::new(id.clone(), "Item".parse().unwrap()), received).await.unwrap();
    let stamp = store.get_summaries(std::slice::from_ref(&id)).await.unwrap()[0].changed_seq;
    let component: ComponentName = "probe".parse().unwrap();
    let trigger = Trigger { requires: vec!["Data_Received".parse().unwrap()], ..Trigger::default() };
    let request = ReadyClaimRequest {
        batches: vec![id.clone()],
        descriptor: ComponentDescriptor::new(component.clone(), "1.0", "Probed".parse().unwrap(), trigger),
        holder: RunHolder { agent: agent(), host: "host".into(), pid: 1, claim_key: None, liveness: None },
        force: false,
        known_steering: Some(store.steering().await.unwrap().version),
        exclusive: false,
        takeovers: Vec::new(),
    };
    let claimed = store.claim_ready_judged(&request, &[stamp]).await.unwrap();
    let claim = claimed.answers.into_iter().next().unwrap().unwrap().claim.expect("claimed as judged");
    let result =
        NewEvent::new("Probed".parse().unwrap(), Outcome::Success, agent()).in_run(component, claim.generation());
    store.append_event(&id, result).await.unwrap();
    assert_eq!(store.get_batch(&id).await.unwrap().events.len(), 2, "{id}: its delivery and its result");
}

/// The shared server, and a fresh database's URL and name.
fn fresh_database() -> (&'static Postgres, String, String) {
    let server = shared();
    let NamedDatabase { name, url } = server.unique_named_database();
    (server, url, name)
}

/// `batches`' sequential scans, rows they read, and index scans, as the server's statistics
/// hold them (each server process reports its own when it goes idle or ends).
fn batches_scans(server: &Postgres, database: &str) -> (u64, u64, u64) {
    let row = server.psql(
        database,
        "SELECT seq_scan || ' ' || seq_tup_read || ' ' || coalesce(idx_scan, 0) FROM pg_stat_user_tables \
         WHERE relname = 'batches'",
    );
    let numbers: Vec<u64> = row.split_whitespace().map(|n| n.parse().unwrap()).collect();
    (numbers[0], numbers[1], numbers[2])
}

/// `GROWN_TO` batches more in `batches`, inserted by a statement that scans nothing, then
/// `after` (SQL, or nothing).
fn grow(server: &Postgres, database: &str, after: &str) {
    server.psql(
        database,
        &format!(
            "INSERT INTO batches (id, type, priority, metadata, created_seq, modified_seq, changed_seq, created_at, \
                 modified_at) \
             SELECT 'grown-' || i, 'Item', 0, '{{}}', s, s, s, 0, 0 \
             FROM (SELECT i, nextval('store_seq') AS s FROM generate_series(1, {GROWN_TO}) i) g; {after}"
        ),
    );
}

/// `batches_scans` once at least `scans` more than `before` have reached the statistics
/// (a server process reports them when it goes idle or ends), within 30 s.
async fn scans_reported(server: &Postgres, database: &str, before: (u64, u64, u64), scans: u64) -> (u64, u64, u64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now = batches_scans(server, database);
        if (now.0 + now.2) - (before.0 + before.2) >= scans {
            return now;
        }
        assert!(Instant::now() < deadline, "the scans never reached the statistics: {before:?} -> {now:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_connection_that_began_on_an_empty_store_still_looks_batches_up_by_key_thousands_of_batches_later() {
    let (server, url, database) = fresh_database();
    // One connection: the plans its first stage makes are the ones the later stages use.
    let store = PgStore::open(&format!("{url}?pool_size=1")).await.unwrap();
    // No autovacuum round analyzes the table while it grows: its ANALYZE would replan the
    // connection's statements, and the test would pass whatever they were. Set before the
    // first stage plans anything (the change itself has every connection replan).
    server.psql(&database, "ALTER TABLE batches SET (autovacuum_enabled = off)");
    stage(&store, "first").await;
    // The table grows behind the connection's back, by a writer that scans nothing.
    grow(server, &database, "");
    let before = batches_scans(server, &database);
    for n in 0..STAGES {
        stage(&store, &format!("later-{n}")).await;
    }
    // Its connection closed, the server process reports what it read as it ends.
    drop(store);
    // Each stage locks its batch at least twice (the registration's result, the claim).
    let after = scans_reported(server, &database, before, 2 * STAGES as u64).await;
    let rows_read = after.1 - before.1;
    assert!(
        rows_read < GROWN_TO as u64,
        "{STAGES} stages on a table of {GROWN_TO} batches read {rows_read} rows by sequential scans \
         ({} scans): a plan made on the empty table",
        after.0 - before.0
    );
}

/// The functions schema 22 plans by index and never compiles (a disabled scan's cost would
/// have PostgreSQL compile the plan at every call), each PL/pgSQL overload (the SQL ones are older
/// signatures calling them): a migration that replaces one with
/// `CREATE OR REPLACE` drops its `SET` clauses unless it repeats them.
const STAGE_FUNCTIONS: [&str; 25] = [
    "autocomp_register_batch",
    "autocomp_create_batch",
    "autocomp_append_group",
    "autocomp_hand_on",
    "autocomp_hand_on_to_taker",
    "autocomp_open_handed_run",
    "autocomp_announce_handed",
    "autocomp_insert_event",
    "autocomp_record_event",
    "autocomp_claim",
    "autocomp_claim_ready",
    "autocomp_claim_judged",
    "autocomp_claim_many",
    "autocomp_fence_refusal",
    "autocomp_check_fence",
    "autocomp_lock_batch",
    "autocomp_release",
    "autocomp_save_checkpoint",
    "autocomp_cancel_run",
    "autocomp_keep_summary_part",
    "autocomp_summary_part_written",
    "autocomp_check_batch_bytes",
    "autocomp_replace_metadata",
    "autocomp_set_priority",
    "autocomp_prioritize",
];

#[tokio::test]
async fn every_function_of_a_stage_plans_by_index() {
    let (server, url, database) = fresh_database();
    PgStore::open(&url).await.unwrap();
    let names = STAGE_FUNCTIONS.map(|name| format!("'{name}'")).join(", ");
    let unplanned = server.psql(
        &database,
        &format!(
            "SELECT string_agg(p.oid::regprocedure::text, ', ' ORDER BY p.oid::regprocedure::text) FROM pg_proc p \
             WHERE p.proname IN ({names}) \
               AND p.pronamespace = (SELECT pronamespace FROM pg_proc WHERE oid = 'autocomp_horizon'::regproc) \
               AND p.prolang = (SELECT oid FROM pg_language WHERE lanname = 'plpgsql') \
               AND NOT coalesce(p.proconfig @> ARRAY['enable_seqscan=off', 'jit=off'], false)"
        ),
    );
    assert_eq!(unplanned.trim(), "", "functions of a stage planned with sequential scans or JIT allowed");
    let found = server.psql(
        &database,
        &format!(
            "SELECT count(DISTINCT proname) FROM pg_proc WHERE proname IN ({names}) \
             AND prolang = (SELECT oid FROM pg_language WHERE lanname = 'plpgsql')"
        ),
    );
    assert_eq!(found.trim(), STAGE_FUNCTIONS.len().to_string(), "each named function exists in PL/pgSQL");
}

/// The read of whole batches (`get_batch`, `get_batches`: what `autocomp show`, the monitor's
/// batch page and the index's documents read) is planned once per connection. Left to
/// choose, PostgreSQL planned it again at every call (its plan for the ids given looked
/// cheaper than the generic one), 0.30 ms of planning for 0.06 of execution.
#[tokio::test]
async fn a_connection_plans_the_read_of_whole_batches_once() {
    let server = Postgres::start_with(
        Options::default()
            .setting("shared_preload_libraries", "pg_stat_statements")
            .setting("pg_stat_statements.track_planning", "on"),
    );
    let url = server.create_database("planned");
    server.psql("planned", "CREATE EXTENSION pg_stat_statements");
    // One connection, so that every read is planned (or not) by the same server process.
    let store = PgStore::open(&format!("{url}?pool_size=1")).await.unwrap();
    let ids: Vec<BatchId> = (0..3).map(|n| format!("read-{n}").parse().unwrap()).collect();
    for id in &ids {
        let received = NewEvent::new("Data_Received".parse().unwrap(), Outcome::Success, agent());
        store.register_batch(NewBatch::new(id.clone(), "Item".parse().unwrap()), received).await.unwrap();
    }
    const READS: usize = 20;
    for n in 0..READS {
        let read = store.get_batch(&ids[n % ids.len()]).await.unwrap();
        assert_eq!(read.id, ids[n % ids.len()]);
    }
    let whole = store.get_batches(&ids).await.unwrap();
    assert_eq!(whole.len(), ids.len(), "every batch named, read whole");
    // The read alone: the judged claim's read selects the same columns beside the steering.
    let counted = server.psql(
        "planned",
        "SELECT coalesce(sum(calls), 0) || ' ' || coalesce(sum(plans), 0) FROM pg_stat_statements \
         WHERE query LIKE '%b.metadata::text%' AND query LIKE '%b.id = ANY($1)%' AND query NOT LIKE '%steering%'",
    );
    let numbers: Vec<u64> = counted.split_whitespace().map(|n| n.parse().unwrap()).collect();
    let (calls, plans) = (numbers[0], numbers[1]);
    assert_eq!(calls, READS as u64 + 1, "the reads counted: {counted}");
    assert!(plans <= 1, "{calls} reads of whole batches on one connection were planned {plans} times");
}

/// A read of some hundreds of batches by id (`get_summaries`: `sboi serve` reading a feed
/// page; `get_listings`) looks them up by key, however many it names and whatever the
/// table's statistics say. Left to plan each call for the ids given, PostgreSQL read the
/// whole table for a few hundred of a few thousand: 24-42 ms a call in the peers bench's
/// backlog against 1.6-1.9 by key.
#[tokio::test]
async fn a_read_of_hundreds_of_batches_by_id_looks_them_up_by_key() {
    let (server, url, database) = fresh_database();
    let store = PgStore::open(&format!("{url}?pool_size=1")).await.unwrap();
    server.psql(&database, "ALTER TABLE batches SET (autovacuum_enabled = off)");
    let registered: Vec<BatchId> = (0..3).map(|n| format!("asked-{n}").parse().unwrap()).collect();
    for id in &registered {
        let received = NewEvent::new("Data_Received".parse().unwrap(), Outcome::Success, agent());
        store.register_batch(NewBatch::new(id.clone(), "Item".parse().unwrap()), received).await.unwrap();
    }
    grow(server, &database, "ANALYZE batches");
    // A fifth of the table asked for: the registered batches and ids no batch has.
    let mut asked = registered.clone();
    asked.extend((0..GROWN_TO / 5).map(|n| format!("absent-{n}").parse::<BatchId>().unwrap()));
    let before = batches_scans(server, &database);
    for _ in 0..STAGES {
        let summaries = store.get_summaries(&asked).await.unwrap();
        assert_eq!(summaries.iter().map(|s| &s.id).collect::<Vec<_>>(), registered.iter().collect::<Vec<_>>());
        let listings = store.get_listings(&asked).await.unwrap();
        assert_eq!(listings.len(), registered.len(), "a listing of each registered batch");
    }
    drop(store);
    let after = scans_reported(server, &database, before, 2 * STAGES as u64).await;
    let rows_read = after.1 - before.1;
    assert!(
        rows_read < GROWN_TO as u64,
        "{} reads of {} ids on a table of {GROWN_TO} batches read {rows_read} rows by sequential scans ({} scans)",
        2 * STAGES,
        asked.len(),
        after.0 - before.0
    );
}
