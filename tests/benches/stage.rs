//! One stage's store calls over PostgreSQL (then on the embedded store), one at a time, as a
//! watcher makes them in a trickle: the look (`changed_summaries` from the batch's registration
//! on), the claim by the stamp it judged (`claim_ready_judged`, exclusive: the claim is the
//! batch's lock), the result (`append_event` in the run), and the batch's read (`get_batch`,
//! what a stage handed its batch by the step before would read instead of claiming), each
//! timed on the client; beside them
//! the transport's own floor (`SELECT 1`, and a transaction of four statements pipelined, as
//! the claim sends its five); then what the server spent on each statement, executing and
//! planning (pg_stat_statements with `track_planning`), and the write-ahead log each write
//! call makes. Nothing else runs: the floor a stage's
//! round trips have on this machine, to set beside the phases the peers bench prints. The
//! embedded store's stages are measured twice: alone, and as a watcher meets them (its claim
//! not synced, each batch registered through another connection).
//!
//!     cargo bench -p autocomp-e2e --bench stage
//!
//! The store is filled first with as many batches through the stage and its statistics read
//! (as autovacuum would), so the measured connections plan on tables like a store's.
//! `AUTOCOMP_BENCH_STAGES` (default 2,000) stages, each on a batch of its own registered just
//! before it (`register_batch`, timed too). `AUTOCOMP_BENCH_GAP_MS` (default 0): a pause
//! after each measured stage, so the client and the server sleep between stages as they do
//! between a trickle's items. `AUTOCOMP_BENCH_NESTED=1` also counts the
//! statements inside the store's functions (`pg_stat_statements.track = all`).
//! `AUTOCOMP_BENCH_SCHEMAS=20,21` measures the PostgreSQL store at each of those schema
//! versions (a database each, the store opened with `migrate=false`), in turns, side by side
//! (default: this release's schema alone). Without the
//! `--bench` argument (`cargo test --all-targets`) it only does a smoke run of 20.

use std::time::{Duration, Instant};

use autocomp_e2e::percentile;
use autocomp_model::{
    Agent, BatchId, BatchType, ComponentDescriptor, ComponentName, EventType, NewBatch, NewEvent, Outcome, RunHolder,
    Seq, Trigger,
};
use autocomp_store::postgres::LATEST_VERSION;
use autocomp_store::prelude::*;
use autocomp_store::{PgStore, ReadyClaimRequest, SqliteOptions, SqliteStore, Synchronous};
use autocomp_test_servers::bench::postgres_counting_statements;

const RECEIVED: &str = "Data_Received";
const STAGE: &str = "Stage1";

/// Each call's name and times.
type Calls = Vec<(&'static str, Vec<Duration>)>;

fn main() {
    let full = std::env::args().any(|arg| arg == "--bench");
    let stages: usize = match full {
        true => std::env::var("AUTOCOMP_BENCH_STAGES").ok().and_then(|n| n.parse().ok()).unwrap_or(2_000),
        false => 20,
    };
    let server = postgres_counting_statements();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    // One database a schema, each filled, its statistics read (as autovacuum would have), so
    // the measured connections plan on tables that look like a store's, not empty ones.
    let mut stores = Vec::new();
    for schema in schemas() {
        let database = format!("stage{schema}");
        let url = server.create_database(&database);
        runtime.block_on(PgStore::create_at_schema_version(&url, schema)).expect("the schema");
        let url = format!("{url}?pool_size=4&migrate=false");
        runtime.block_on(fill(&url, stages));
        server.psql(&database, "analyze");
        stores.push((schema, database, url));
    }
    // Schemas measured in turns (two rounds of half the stages each), so that what else the
    // machine does falls on each alike.
    let mut measured: Vec<Calls> = vec![Vec::new(); stores.len()];
    for round in 0..2 {
        for ((_, _, url), times) in stores.iter().zip(&mut measured) {
            let more = runtime.block_on(measure(url, &format!("B{round}"), stages.div_ceil(2)));
            merge(times, more);
        }
    }
    for ((schema, _, _), times) in stores.iter().zip(measured) {
        print_calls(
            &format!("{stages} stages over PostgreSQL (schema {schema}), one call at a time, client-side"),
            times,
        );
    }
    print_calls("the transport alone", runtime.block_on(transport(&stores[0].2, stages)));
    for (schema, _, url) in &stores {
        let logged = runtime.block_on(wal_per_call(url, stages.min(200)));
        println!(
            "write-ahead log per call over PostgreSQL (schema {schema}), bytes, p50 / min / max (read apart from the \
             timed runs):"
        );
        for (name, mut bytes) in logged {
            bytes.sort();
            let (min, max) = (bytes[0], bytes[bytes.len() - 1]);
            println!("  {name:<34} {} / {min} / {max}", bytes[bytes.len() / 2]);
        }
    }
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (alone, as_met) = runtime.block_on(embedded(dir.path(), stages));
    print_calls(
        &format!("{stages} stages on the embedded store (SQLite, synchronous=full), one call at a time"),
        alone,
    );
    print_calls(
        &format!(
            "{stages} stages on the embedded store as a watcher meets it (its claim not synced; each batch registered \
             through another connection, whose commit empties this one's page cache)"
        ),
        as_met,
    );
    for (schema, database, _) in &stores {
        let sql = format!(
            "select calls, plans, round(mean_exec_time::numeric, 3), round(total_plan_time::numeric / greatest(calls, 1), 3), \
             regexp_replace(left(query, 150), '\\s+', ' ', 'g') from pg_stat_statements \
             where dbid = (select oid from pg_database where datname = '{database}') \
             order by total_exec_time + total_plan_time desc limit 40"
        );
        println!(
            "server time per statement, schema {schema} (calls, plans, mean ms executing, ms planning per call, statement):"
        );
        for line in server.psql("postgres", &sql).lines() {
            println!("  {line}");
        }
    }
}

/// The schemas to measure side by side: `AUTOCOMP_BENCH_SCHEMAS` (say `20,21`), else this
/// release's.
fn schemas() -> Vec<i32> {
    match std::env::var("AUTOCOMP_BENCH_SCHEMAS") {
        Ok(list) => list.split(',').map(|n| n.trim().parse().expect("AUTOCOMP_BENCH_SCHEMAS: numbers")).collect(),
        Err(_) => vec![LATEST_VERSION],
    }
}

/// Each call's times of `more` added to the same call's in `times`.
fn merge(times: &mut Calls, more: Calls) {
    for (name, took) in more {
        match times.iter_mut().find(|(known, _)| *known == name) {
            Some((_, all)) => all.extend(took),
            None => times.push((name, took)),
        }
    }
}

/// Each call's p50 / p90 / p99 under `title`.
fn print_calls(title: &str, times: Calls) {
    println!("{title}, p50 / p90 / p99 ms:");
    for (name, mut took) in times {
        took.sort();
        let at = |q| percentile(&took, q).as_secs_f64() * 1000.0;
        println!("  {name:<34} {:.3} / {:.3} / {:.3}", at(0.5), at(0.9), at(0.99));
    }
}

/// `count` batches through the stage already (registered, claimed, recorded), on connections
/// of their own: the tables a trickle finds after a backlog.
async fn fill(url: &str, count: usize) {
    let store = PgStore::open(url).await.expect("the store opens");
    stages_on(&store, "F", count).await;
}

/// The same stages on the embedded store (SQLite, `synchronous=full`): filled first as the
/// PostgreSQL store is, then measured on a store opened again, alone (the library's default
/// options: an exclusive claim synced, as for claims from other hosts); then as a watcher
/// meets it: opened as from a store URL on its host (the claim not synced) and each batch
/// registered through another connection, as the step before commits from another process.
/// SQLite empties a connection's page cache when another connection has committed since its
/// last transaction, so the look, the claim and the append read their pages again.
async fn embedded(dir: &std::path::Path, stages: usize) -> (Calls, Calls) {
    let file = dir.join("store.db");
    let options = || SqliteOptions { synchronous: Synchronous::Full, ..SqliteOptions::default() };
    let store = SqliteStore::open_with(&file, options()).await.expect("the embedded store opens");
    stages_on(&store, "F", stages).await;
    drop(store);
    let store = SqliteStore::open_with(&file, options()).await.expect("the embedded store opens");
    let alone = stages_on(&store, "B", stages).await;
    drop(store);
    let on_its_host = || SqliteOptions { claims_from_other_hosts: false, ..options() };
    let store = SqliteStore::open_with(&file, on_its_host()).await.expect("the embedded store opens");
    let registrar = SqliteStore::open_with(&file, on_its_host()).await.expect("the embedded store opens");
    let as_met = stages_logged(&store, "M", stages, None, Some(&registrar)).await.0;
    (alone, as_met)
}

/// Registers, looks, claims and records `stages` batches one after the other; each call's time.
async fn measure(url: &str, prefix: &str, stages: usize) -> Calls {
    let store = PgStore::open(url).await.expect("the store opens");
    // Four connections open, as a watcher's pool has after a pass that worked in parallel.
    let (a, b, c, d) = tokio::join!(store.head(), store.head(), store.head(), store.head());
    for opened in [a, b, c, d] {
        opened.expect("the store reads");
    }
    stages_on(&store, prefix, stages).await
}

/// What each call of `stages` more stages writes to the server's log (its bytes), with a
/// connection of its own reading the log's end between the calls.
async fn wal_per_call(url: &str, stages: usize) -> Vec<(&'static str, Vec<i64>)> {
    let config: tokio_postgres::Config = url.split('?').next().unwrap().parse().unwrap();
    let (client, connection) = config.connect(tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    let store = PgStore::open(url).await.expect("the store opens");
    stages_logged(&store, "W", stages, Some(&client), None).await.1
}

/// `stages` batches named `prefix-N` through one stage on `store`; each call's time.
async fn stages_on(store: &dyn ObjectStore, prefix: &str, stages: usize) -> Calls {
    stages_logged(store, prefix, stages, None, None).await.0
}

/// `stages_on`, and with `wal` (a connection to the server) the write-ahead log each call
/// wrote, read from the log's end between the calls (outside their times); with `registrar`
/// each batch registered through that handle instead of `store`.
async fn stages_logged(
    store: &dyn ObjectStore,
    prefix: &str,
    stages: usize,
    wal: Option<&tokio_postgres::Client>,
    registrar: Option<&dyn ObjectStore>,
) -> (Calls, Vec<(&'static str, Vec<i64>)>) {
    let wal_end = || async {
        match wal {
            Some(client) => {
                client.query_one("select (pg_current_wal_insert_lsn() - '0/0')::bigint", &[]).await.unwrap().get(0)
            }
            None => 0i64,
        }
    };
    let mut written: [Vec<i64>; 3] = Default::default();
    let component = ComponentName::new("stage1").unwrap();
    let descriptor = ComponentDescriptor::new(
        component.clone(),
        "1.0",
        EventType::new(STAGE).unwrap(),
        Trigger { requires: vec![EventType::new(RECEIVED).unwrap()], ..Trigger::default() },
    );
    let holder = RunHolder {
        agent: Agent::new("stage1/bench@localhost#1").unwrap(),
        host: "localhost".into(),
        pid: std::process::id(),
        claim_key: None,
        liveness: Some("pg:bench".into()),
    };
    let version = store.steering().await.unwrap().version;
    let (mut register, mut look, mut claim, mut append, mut head) = (vec![], vec![], vec![], vec![], vec![]);
    let mut batch_reads = Vec::new();
    // Between stages, as a trickle leaves the processes idle between items.
    let gap =
        Duration::from_millis(std::env::var("AUTOCOMP_BENCH_GAP_MS").ok().and_then(|ms| ms.parse().ok()).unwrap_or(0));
    // Warm: the statements prepared, the pool's connection open.
    for n in 0..stages + 20 {
        let id = BatchId::new(format!("{prefix}-{n:06}")).unwrap();
        let from = store.head().await.unwrap();
        let new = NewBatch::new(id.clone(), BatchType::new("Item").unwrap());
        let agent = Agent::new("bench-trigger/stage@localhost#1").unwrap();
        let event = NewEvent::new(EventType::new(RECEIVED).unwrap(), Outcome::Success, agent.clone());
        let wal_at = wal_end().await;
        let started = Instant::now();
        registrar.unwrap_or(store).register_batch(new, event).await.unwrap();
        let registered = started.elapsed();
        let wal_registered = wal_end().await;

        let started = Instant::now();
        let (_, read) = store.changed_summaries(from, 1_000).await.unwrap();
        let looked = started.elapsed();
        let stamp: Seq = read.iter().find(|s| s.id == id).expect("the look finds the batch").changed_seq;

        let request = ReadyClaimRequest {
            batches: vec![id.clone()],
            descriptor: descriptor.clone(),
            holder: holder.clone(),
            force: false,
            known_steering: Some(version),
            exclusive: true,
            takeovers: Vec::new(),
        };
        let wal_before_claim = wal_end().await;
        let started = Instant::now();
        let mut claims = store.claim_ready_judged(&request, &[stamp]).await.unwrap();
        let claimed = started.elapsed();
        let wal_claimed = wal_end().await;
        let answer = claims.answers.remove(0).unwrap();
        let generation = answer.claim.expect("claimed").generation();

        let started = Instant::now();
        let result = NewEvent::new(EventType::new(STAGE).unwrap(), Outcome::Success, agent)
            .in_run(component.clone(), generation);
        store.append_event(&id, result).await.unwrap();
        let appended = started.elapsed();
        let wal_appended = wal_end().await;

        let started = Instant::now();
        store.head().await.unwrap();
        let headed = started.elapsed();

        // What a stage handed its batch by the step before would read instead of claiming:
        // the batch with the run opened for it.
        let started = Instant::now();
        store.get_batch(&id).await.unwrap();
        let batch_read = started.elapsed();
        if n >= 20 && prefix != "F" {
            tokio::time::sleep(gap).await;
        }
        if n >= 20 {
            register.push(registered);
            look.push(looked);
            claim.push(claimed);
            append.push(appended);
            head.push(headed);
            batch_reads.push(batch_read);
            written[0].push(wal_registered - wal_at);
            written[1].push(wal_claimed - wal_before_claim);
            written[2].push(wal_appended - wal_claimed);
        }
    }
    let times = vec![
        ("register_batch", register),
        ("look (changed_summaries)", look),
        ("claim_ready_judged", claim),
        ("append_event (in run)", append),
        ("head (one small read)", head),
        ("get_batch (a handed-on read)", batch_reads),
    ];
    let [registered, claimed, appended] = written;
    (times, vec![("register_batch", registered), ("claim_ready_judged", claimed), ("append_event (in run)", appended)])
}

/// The transport alone, raw: one statement, and four pipelined as the judged claim sends them.
async fn transport(url: &str, samples: usize) -> Calls {
    let config: tokio_postgres::Config = url.split('?').next().unwrap().parse().unwrap();
    let (client, connection) = config.connect(tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    let one = client.prepare("SELECT 1").await.unwrap();
    let (mut single, mut piped, mut tx) = (vec![], vec![], vec![]);
    for _ in 0..samples {
        let started = Instant::now();
        client.query(&one, &[]).await.unwrap();
        single.push(started.elapsed());
        let started = Instant::now();
        let (a, b, c, d) = tokio::join!(
            biased;
            client.batch_execute("BEGIN"),
            client.query(&one, &[]),
            client.query(&one, &[]),
            client.batch_execute("COMMIT"),
        );
        a.unwrap();
        b.unwrap();
        c.unwrap();
        d.unwrap();
        piped.push(started.elapsed());
        let started = Instant::now();
        client.batch_execute("BEGIN; SELECT 1; SELECT 1; COMMIT").await.unwrap();
        tx.push(started.elapsed());
    }
    vec![("SELECT 1", single), ("BEGIN, 2 x SELECT 1, COMMIT piped", piped), ("the same as one simple query", tx)]
}
