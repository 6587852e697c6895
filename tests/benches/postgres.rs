//! PostgreSQL store benchmark (issue #11): the `postgres://` backend of the `ObjectStore` port
//! against a real server (Debian's PostgreSQL, started by `autocomp-test-servers` in a temp dir
//! under /var/tmp, `fsync=on`, `synchronous_commit=on`), with SQLite FULL side by side in the
//! same run. Everything shares the machine's cores: server, clients and this bench.
//!
//!     cargo bench -p autocomp-e2e --bench postgres
//!
//! `AUTOCOMP_BENCH_SCALE` (a float, default 1) multiplies every count and time budget. Without
//! the `--bench` argument that `cargo bench` passes (e.g. under `cargo test --all-targets`) it
//! only does a smoke run at tiny sizes.
//!
//! What it measures (one table at the end, each row with its goal):
//! - durable appends/s, 16 tasks on one `PgStore` (`pool_size=16`), each appending to its own
//!   16 of 256 batches; next to SQLite FULL through `autocomp-store serve` with 16 `HttpStore`
//!   clients, the same pattern;
//! - durable appends/s from one task: PostgreSQL, and the embedded `SqliteStore` (FULL);
//! - the runner's fenced path, claim + `in_run` append, 16 clients, each pair on a batch of its
//!   own (created by SQL beforehand), as a component claims each batch of its backlog once;
//! - the change feed (`changes()` pages of 10,000) and an sboi catch-up (`IndexEngine`) over
//!   a store of 100,000 batches with 4 events each, filled by `INSERT ... SELECT
//!   generate_series` through psql (rows as the store's own functions write them);
//! - idle cron starts of the release `probe-component` with a `postgres://` store, `local:`
//!   index and locks (and the same with a SQLite FULL store, for comparison);
//! - `wait_for_change` wake latency after a commit;
//! - the feed barrier's cost: the 16-client append rate while a follower (its own `PgStore`)
//!   loops `changes()` + `wait_for_change()`, against the rate without it, in alternating
//!   rounds (without, with, with, without, ...); the "without" rounds are also the first row.
//!
//! For the PostgreSQL throughput rows it also prints the CPU the server processes and this
//! bench process spent per operation (from /proc), and how many appends shared a commit
//! (distinct `xmin` of the events written).

use autocomp_test_servers::bench::{disk_temp_dir, load_average, proc_stat, server_cpu, thousands};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use autocomp_e2e::services::{Service, TOKEN};
use autocomp_e2e::{binary, percentile};
use autocomp_model::{
    Agent, BatchId, BatchType, ComponentName, EventType, NewBatch, NewEvent, Outcome, RunHolder, Seq,
};
use autocomp_sboi::{CatchUp, EngineOptions, IndexEngine};
use autocomp_store::prelude::*;
use autocomp_store::{HttpStore, PgStore, SqliteOptions, SqliteStore, Synchronous};
use autocomp_test_servers::Postgres;
use serde_json::{Value, json};

const CLIENTS: usize = 16;
const BATCHES_PER_CLIENT: usize = 16;
const GOAL_APPENDS_16: f64 = 10_000.0;
const GOAL_FENCED_16: f64 = 3_000.0;
const GOAL_FEED: f64 = 1_000_000.0;
const GOAL_CATCH_UP: f64 = 30_000.0;
const GOAL_IDLE_P50_MS: f64 = 20.0;
const GOAL_WAKE_MS: f64 = 100.0;
const FEED_PAGE: usize = 10_000;
/// Passes over the whole feed in the feed-read row (one pass at 100,000 batches is ~0.1 s).
const FEED_PASSES: usize = 5;
/// Rounds of each barrier row, alternating (without, with, with, without, ...).
const BARRIER_ROUNDS: usize = 3;
/// Events per batch in the feed / catch-up store.
const EVENTS_PER_BATCH: usize = 4;

/// Sizes at scale 1; every count and time budget is multiplied by the scale.
const APPENDS_16: f64 = 40_000.0;
const APPENDS_1: f64 = 10_000.0;
const FENCED_PAIRS: f64 = 20_000.0;
const FEED_BATCHES: f64 = 100_000.0;
const RUNNER_BATCHES: f64 = 200.0;
const IDLE_STARTS: f64 = 30.0;
const WAKES: f64 = 200.0;
/// A phase stops early once it has run this long, so a slow disk cannot stretch the run.
const PHASE_BUDGET_SECS: f64 = 20.0;

struct Config {
    scale: f64,
    smoke: bool,
}

impl Config {
    fn from_env() -> Self {
        let autocomp_test_servers::bench::BenchScale { scale, smoke } =
            autocomp_test_servers::bench::BenchScale::from_env(0.01);
        Self { scale, smoke }
    }

    fn count(&self, base: f64, min: usize) -> usize {
        ((base * self.scale).round() as usize).max(min)
    }

    fn budget(&self) -> Duration {
        Duration::from_secs_f64((PHASE_BUDGET_SECS * self.scale).max(2.0))
    }
}

// ---------------------------------------------------------------------------------------------
// Output

/// One row of the result table.
struct Row {
    figure: String,
    result: String,
    latency: String,
    goal: String,
    met: String,
}

fn row(figure: impl Into<String>, result: impl Into<String>, latency: impl Into<String>) -> Row {
    Row { figure: figure.into(), result: result.into(), latency: latency.into(), goal: "-".into(), met: "-".into() }
}

impl Row {
    fn goal(mut self, goal: impl Into<String>, met: bool) -> Self {
        self.goal = goal.into();
        self.met = if met { "yes" } else { "**no**" }.into();
        self
    }

    fn report(mut self, goal: impl Into<String>) -> Self {
        self.goal = goal.into();
        self
    }
}

fn print_table(rows: &[Row]) {
    let cells: Vec<[&str; 5]> = rows
        .iter()
        .map(|r| [r.figure.as_str(), r.result.as_str(), r.latency.as_str(), r.goal.as_str(), r.met.as_str()])
        .collect();
    let header = ["figure", "result", "p50 / p99", "goal", "met"];
    let mut widths = header.map(|h| h.chars().count());
    for row in &cells {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: &[&str]| {
        let padded: Vec<String> = cells
            .iter()
            .zip(widths)
            .enumerate()
            .map(|(i, (cell, width))| {
                let pad = " ".repeat(width - cell.chars().count());
                if i == 0 || i == 3 { format!("{cell}{pad}") } else { format!("{pad}{cell}") }
            })
            .collect();
        println!("| {} |", padded.join(" | "));
    };
    line(&header);
    let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
    println!("|-{}-|", rule.join("-|-"));
    for row in &cells {
        line(row);
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn short(d: Duration) -> String {
    let us = d.as_secs_f64() * 1e6;
    if us >= 1_000.0 { format!("{:.2} ms", us / 1000.0) } else { format!("{us:.0} µs") }
}

fn p50_p99(sorted: &[Duration]) -> String {
    format!("{} / {}", short(percentile(sorted, 0.5)), short(percentile(sorted, 0.99)))
}

// ---------------------------------------------------------------------------------------------
// CPU accounting from /proc

fn own_cpu() -> f64 {
    proc_stat("self").map_or(0.0, |(_, own, _)| own)
}

/// CPU spent by the server and by this process between `start` and `finish`.
struct Cpu {
    postmaster: u32,
    server: f64,
    bench: f64,
}

impl Cpu {
    fn start(pg: &Postgres) -> Self {
        Self { postmaster: pg.pid(), server: server_cpu(pg.pid()), bench: own_cpu() }
    }

    /// The CPU spent since `start`, for `ops` operations over `wall`.
    fn stop(&self, ops: usize, wall: Duration) -> CpuUse {
        CpuUse {
            server: server_cpu(self.postmaster) - self.server,
            bench: own_cpu() - self.bench,
            ops,
            wall: wall.as_secs_f64(),
        }
    }
}

/// CPU seconds of the server and of this process over `ops` operations and `wall` seconds.
#[derive(Default, Clone, Copy)]
struct CpuUse {
    server: f64,
    bench: f64,
    ops: usize,
    wall: f64,
}

impl CpuUse {
    fn add(self, other: CpuUse) -> CpuUse {
        CpuUse {
            server: self.server + other.server,
            bench: self.bench + other.bench,
            ops: self.ops + other.ops,
            wall: self.wall + other.wall,
        }
    }

    /// "server X µs + bench Y µs per op".
    fn per_op(&self) -> String {
        let ops = self.ops.max(1) as f64;
        format!(
            "CPU per op: server {:.0} µs + bench {:.0} µs ({:.2} of 2 cores busy over {:.1} s)",
            self.server / ops * 1e6,
            self.bench / ops * 1e6,
            (self.server + self.bench) / self.wall.max(1e-9),
            self.wall
        )
    }
}

/// Events and the transactions that wrote them (distinct `xmin`): how many appends shared
/// each commit (the store's group commit).
#[derive(Default, Clone, Copy)]
struct Commits {
    events: usize,
    transactions: usize,
}

impl Commits {
    fn add(self, other: Commits) -> Commits {
        Commits { events: self.events + other.events, transactions: self.transactions + other.transactions }
    }

    fn describe(&self) -> String {
        format!(
            "{} appends in {} transactions ({:.1} per commit)",
            self.events,
            self.transactions,
            self.events as f64 / self.transactions.max(1) as f64
        )
    }
}

fn commits_of(pg: &Postgres, database: &str, after: Seq, upto: Seq) -> Commits {
    let out = pg.psql(
        database,
        &format!(
            "SELECT count(*) || ' ' || count(DISTINCT xmin::text) FROM events WHERE seq > {} AND seq <= {}",
            after.0, upto.0
        ),
    );
    let mut numbers = out.split_whitespace().map(|n| n.parse::<usize>().expect("a count"));
    Commits { events: numbers.next().unwrap_or(0), transactions: numbers.next().unwrap_or(0) }
}

// ---------------------------------------------------------------------------------------------
// Workloads

/// What a measured phase did.
struct Measured {
    ops: usize,
    elapsed: Duration,
    latencies: Vec<Duration>,
}

impl Measured {
    fn rate(&self) -> f64 {
        self.ops as f64 / self.elapsed.as_secs_f64()
    }

    /// Several measured rounds as one: operations and wall times add up.
    fn combine(rounds: Vec<Measured>) -> Measured {
        let mut all = Measured { ops: 0, elapsed: Duration::ZERO, latencies: Vec::new() };
        for round in rounds {
            all.ops += round.ops;
            all.elapsed += round.elapsed;
            all.latencies.extend(round.latencies);
        }
        all.latencies.sort_unstable();
        all
    }
}

/// Runs `op(client, n)` from `clients` tasks, `per_client` times each (fewer once `budget` is
/// spent), timing every call.
async fn concurrent<F, Fut>(clients: usize, per_client: usize, budget: Duration, op: F) -> Measured
where
    F: Fn(usize, usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send,
{
    let op = Arc::new(op);
    let started = Instant::now();
    let deadline = started + budget;
    let tasks: Vec<_> = (0..clients)
        .map(|client| {
            let op = Arc::clone(&op);
            tokio::spawn(async move {
                let mut latencies = Vec::with_capacity(per_client);
                for n in 0..per_client {
                    let sent = Instant::now();
                    op(client, n).await;
                    latencies.push(sent.elapsed());
                    if Instant::now() >= deadline {
                        break;
                    }
                }
                latencies
            })
        })
        .collect();
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await.expect("a client task"));
    }
    let elapsed = started.elapsed();
    latencies.sort_unstable();
    Measured { ops: latencies.len(), elapsed, latencies }
}

/// A small report, like the one a checksum verifier records.
fn report(n: usize) -> Value {
    json!({
        "outcome": "success",
        "duration_ms": 1_200 + (n % 800),
        "failures": [],
        "summary": format!("verified {} files", 10 + n % 90),
        "transient": false,
    })
}

fn agent() -> Agent {
    Agent::new(format!("checksum-verifier/0.1.0@bench#{}", std::process::id())).expect("valid agent")
}

fn verified(n: usize) -> NewEvent {
    NewEvent::new(EventType::new("Checksums_Verified").expect("event type"), Outcome::Success, agent())
        .with_details(report(n))
}

fn batch_id(prefix: &str, n: usize) -> BatchId {
    BatchId::new(format!("{prefix}{n:07}-RT1")).expect("valid batch id")
}

/// `CLIENTS * BATCHES_PER_CLIENT` batches, created through the port; client `c` uses the
/// `c`-th run of `BATCHES_PER_CLIENT` of them.
async fn register(store: &dyn ObjectStore, prefix: &str) -> Arc<Vec<BatchId>> {
    let batch_type = BatchType::new("RoundTrip").expect("batch type");
    let mut ids = Vec::new();
    for n in 0..CLIENTS * BATCHES_PER_CLIENT {
        let id = batch_id(prefix, n);
        let new = NewBatch::new(id.clone(), batch_type.clone()).with_location(format!("/data/incoming/{id}"));
        store.create_batch(new).await.expect("create a batch");
        ids.push(id);
    }
    Arc::new(ids)
}

fn own_batch(ids: &[BatchId], client: usize, n: usize) -> &BatchId {
    &ids[(client * BATCHES_PER_CLIENT + n % BATCHES_PER_CLIENT) % ids.len()]
}

/// Appends from `stores.len()` clients (client `c` through `stores[c]`), each to its own batches.
async fn appends(
    stores: Vec<Arc<dyn ObjectStore>>,
    ids: Arc<Vec<BatchId>>,
    total: usize,
    budget: Duration,
) -> Measured {
    let clients = stores.len();
    let stores = Arc::new(stores);
    concurrent(clients, total / clients, budget, move |client, n| {
        let (stores, ids) = (Arc::clone(&stores), Arc::clone(&ids));
        async move {
            let id = own_batch(&ids, client, n);
            stores[client].append_event(id, verified(n)).await.expect("append");
        }
    })
    .await
}

/// The runner's path: claim the batch, then append the result fenced by that run. Every pair
/// is on a batch of its own, claimed once (as a component claims each batch of its backlog):
/// client `c`'s `n`-th pair on `fenced_batch(c * per_client + n)`.
async fn fenced_pairs(store: Arc<dyn ObjectStore>, total: usize, budget: Duration) -> Measured {
    let component = ComponentName::new("checksum-verifier").expect("component");
    let per_client = total / CLIENTS;
    concurrent(CLIENTS, per_client, budget, move |client, n| {
        let (store, component) = (Arc::clone(&store), component.clone());
        async move {
            let id = &fenced_batch(client * per_client + n);
            let holder = RunHolder {
                agent: agent(),
                host: "bench".into(),
                pid: std::process::id(),
                claim_key: None,
                liveness: None,
            };
            let claim = store.claim(id, &component, &holder).await.expect("claim");
            let event = verified(n).in_run(component.clone(), claim.generation());
            store.append_event(id, event).await.expect("fenced append");
        }
    })
    .await
}

/// What the follower of the barrier row did.
#[derive(Default)]
struct Followed {
    loops: u64,
    waits: u64,
    changes: u64,
}

/// A change-feed follower, as the sboi service runs one: read a page, and when the feed is
/// exhausted, long-poll for the next change. Returns its counts and its final cursor.
async fn follow(store: PgStore, stop: Arc<AtomicBool>, looping: tokio::sync::oneshot::Sender<()>) -> (Followed, Seq) {
    let mut followed = Followed::default();
    let mut cursor = store.head().await.expect("head");
    let mut looping = Some(looping);
    while !stop.load(Ordering::Relaxed) {
        let page = store.changes(cursor, FEED_PAGE).await.expect("changes");
        if let Some(looping) = looping.take() {
            let _ = looping.send(());
        }
        followed.loops += 1;
        followed.changes += page.changes.len() as u64;
        cursor = page.next;
        if page.changes.len() < FEED_PAGE {
            // Only a signal: the cursor stays where the pages left it.
            store.wait_for_change(cursor, Duration::from_millis(500)).await.expect("wait_for_change");
            followed.waits += 1;
        }
    }
    // Drain what is left, so the final cursor can be checked against the head.
    loop {
        let page = store.changes(cursor, FEED_PAGE).await.expect("changes");
        followed.changes += page.changes.len() as u64;
        cursor = page.next;
        if page.changes.len() < FEED_PAGE {
            break;
        }
    }
    (followed, cursor)
}

/// A small xorshift generator: pauses at random phases of the waiter's poll.
struct Jitter(u64);

impl Jitter {
    fn new() -> Self {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        let seed = now.as_nanos() as u64 ^ u64::from(std::process::id()) ^ 0x9E37_79B9_7F4A_7C15;
        Self(seed | 1)
    }

    fn below(&mut self, bound: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % bound.max(1)
    }
}

/// `wait_for_change` wake latency: a waiter parks on the head, the writer commits one append
/// at a random moment; latency = when the waiter returned - when the append was acknowledged
/// (clamped at zero: the waiter may see the commit before its acknowledgement arrives).
async fn wake_latency(writer: Arc<dyn ObjectStore>, waiter: PgStore, id: BatchId, samples: usize) -> Vec<Duration> {
    let mut jitter = Jitter::new();
    let mut latencies = Vec::with_capacity(samples);
    for n in 0..samples {
        let since = waiter.head().await.expect("head");
        let parked = {
            let waiter = waiter.clone();
            tokio::spawn(async move {
                let seq = waiter.wait_for_change(since, Duration::from_secs(10)).await.expect("wait_for_change");
                (seq, Instant::now())
            })
        };
        // Let the waiter park, then commit at a random phase of its 25 ms poll.
        tokio::time::sleep(Duration::from_millis(10 + jitter.below(50))).await;
        let event = writer.append_event(&id, verified(n)).await.expect("append");
        let acknowledged = Instant::now();
        let (seq, woke) = parked.await.expect("the waiter");
        assert!(seq >= event.seq, "woke at {seq}, before the append's seq {}", event.seq);
        latencies.push(woke.saturating_duration_since(acknowledged));
    }
    latencies.sort_unstable();
    latencies
}

// ---------------------------------------------------------------------------------------------
// Stores filled by SQL

/// The id of the `n`-th (from 0) batch `fill_batches_sql` creates.
fn fenced_batch(n: usize) -> BatchId {
    BatchId::new(format!("F{:09}-RT1", n + 1)).expect("valid batch id")
}

/// Creates `batches` batches without events in an empty store, as `autocomp_create_batch`
/// would (batch `g` at seq `g`), and sets the sequence past them.
fn fill_batches_sql(batches: usize) -> String {
    let id = "'F' || lpad(g::text, 9, '0') || '-RT1'";
    format!(
        "BEGIN;
INSERT INTO batches (id, type, priority, metadata, created_seq, modified_seq, changed_seq, created_at, modified_at)
SELECT {id}, 'RoundTrip', 0, jsonb_build_object('location', '/data/incoming/' || {id}), g, g, g, now_ms, now_ms
FROM generate_series(1, {batches}) g, (SELECT autocomp_now() AS now_ms) t;
SELECT setval('store_seq', {batches});
COMMIT;
VACUUM ANALYZE batches;
"
    )
}

/// Fills `database` with `batches` batches of `EVENTS_PER_BATCH` events each, in one
/// transaction, as the store's functions would have written them: batch `g` created at seq
/// `g`, its `k`-th event at seq `k * batches + g` (so a batch's events are spread over the log
/// as in a live pipeline), `changed_seq` its last event's seq, the sequence set past them all.
/// One batch in 50 is `Film`; one in 20 has its last step failed.
fn fill_sql(batches: usize) -> String {
    let n = batches;
    let e = EVENTS_PER_BATCH;
    let id = "'B' || lpad(g::text, 9, '0') || '-RT1'";
    format!(
        "BEGIN;
INSERT INTO batches (id, type, priority, metadata, created_seq, modified_seq, changed_seq, created_at, modified_at)
SELECT {id}, CASE WHEN g % 50 = 0 THEN 'Film' ELSE 'RoundTrip' END, 0,
       jsonb_build_object('location', '/data/incoming/' || {id}),
       g, g, {e} * {n} + g, now_ms, now_ms
FROM generate_series(1, {n}) g, (SELECT autocomp_now() - 3600000 AS now_ms) t;
INSERT INTO events (seq, batch_id, type, outcome, agent, at, details)
SELECT k * {n} + g, {id},
       (ARRAY['Data_Received', 'Checksums_Verified', 'Structure_Checked', 'Data_Archived'])[k],
       CASE WHEN k = {e} AND g % 20 = 0 THEN 'failure' ELSE 'success' END,
       'bench-filler/0.1.0@bench#1', now_ms + k * 1000,
       jsonb_build_object('outcome', CASE WHEN k = {e} AND g % 20 = 0 THEN 'failure' ELSE 'success' END,
                          'duration_ms', 1200 + g % 800, 'failures', '[]'::jsonb,
                          'summary', 'verified ' || (10 + g % 90) || ' files', 'transient', false)
FROM generate_series(1, {e}) k, generate_series(1, {n}) g, (SELECT autocomp_now() - 3600000 AS now_ms) t
ORDER BY k, g;
SELECT setval('store_seq', {last});
COMMIT;
VACUUM ANALYZE batches;
VACUUM ANALYZE events;
",
        last = (e + 1) * n
    )
}

/// Reads the whole feed in pages of `FEED_PAGE` from seq 0, `passes` times; per-page latencies.
async fn read_feed(store: &PgStore, passes: usize) -> Measured {
    let mut latencies = Vec::new();
    let mut seen = 0;
    let started = Instant::now();
    for _ in 0..passes {
        let mut cursor = Seq::ZERO;
        loop {
            let sent = Instant::now();
            let page = store.changes(cursor, FEED_PAGE).await.expect("changes");
            latencies.push(sent.elapsed());
            seen += page.changes.len();
            cursor = page.next;
            if page.changes.len() < FEED_PAGE {
                break;
            }
        }
    }
    let elapsed = started.elapsed();
    latencies.sort_unstable();
    Measured { ops: seen, elapsed, latencies }
}

/// The store side of a catch-up alone: what `IndexEngine` reads (`changes` pages of the
/// engine's page size, then `get_batches` of each page), without indexing.
async fn read_feed_and_batches(store: &PgStore, page_size: usize) -> Measured {
    let mut latencies = Vec::new();
    let mut cursor = Seq::ZERO;
    let mut loaded = 0;
    let started = Instant::now();
    loop {
        let page = store.changes(cursor, page_size).await.expect("changes");
        let ids: Vec<BatchId> = page.changes.iter().map(|(_, id)| id.clone()).collect();
        let sent = Instant::now();
        let batches = store.get_batches(&ids).await.expect("get_batches");
        latencies.push(sent.elapsed());
        assert_eq!(batches.len(), ids.len(), "every changed batch loads");
        loaded += batches.len();
        cursor = page.next;
        if page.changes.len() < page_size {
            break;
        }
    }
    let elapsed = started.elapsed();
    latencies.sort_unstable();
    Measured { ops: loaded, elapsed, latencies }
}

// ---------------------------------------------------------------------------------------------
// Idle cron starts

/// A config dir for the probe component named `name` on `store`, with its own index and lock
/// dirs under `dir`.
fn probe_config(dir: &Path, name: &str, store: &str, queue: usize) -> PathBuf {
    let config = dir.join(format!("config-{name}"));
    std::fs::create_dir_all(&config).expect("config dir");
    std::fs::write(
        config.join("autocomp.toml"),
        format!(
            "store = \"{store}\"\nindex = \"local:{}\"\nlocks = \"local:{}\"\n",
            dir.join(format!("index-{name}")).display(),
            dir.join(format!("locks-{name}")).display()
        ),
    )
    .expect("autocomp.toml");
    std::fs::write(
        config.join(format!("{name}.toml")),
        format!("queue_size = {queue}\nmax_threads = 2\n\n[settings]\nbehaviour = \"succeed\"\n"),
    )
    .expect("component config");
    config
}

/// One cron start of the probe: wall time and the batches it processed.
fn run_probe(probe: &Path, config: &Path, name: &str) -> (Duration, usize) {
    let started = Instant::now();
    let output = Command::new(probe)
        .arg("--config-dir")
        .arg(config)
        .env("PROBE_NAME", name)
        .env("PROBE_EVENT_TYPE", "Probed")
        .env_remove("AUTOCOMP_STORE")
        .env_remove("AUTOCOMP_INDEX")
        .env_remove("AUTOCOMP_LOCKS")
        .env_remove("RUST_LOG")
        .output()
        .expect("the probe runs");
    let elapsed = started.elapsed();
    assert!(output.status.success(), "probe failed: {}", String::from_utf8_lossy(&output.stderr));
    (elapsed, String::from_utf8_lossy(&output.stdout).lines().count())
}

/// Registers `batches` received batches in `store`, runs one pass that processes them all,
/// then `starts` idle starts with nothing ready; returns the idle wall times, sorted.
async fn idle_starts(
    store: &dyn ObjectStore,
    probe: &Path,
    config: &Path,
    name: &str,
    batches: usize,
    starts: usize,
) -> Vec<Duration> {
    let batch_type = BatchType::new("RoundTrip").expect("batch type");
    for n in 0..batches {
        let id = batch_id("R", n);
        store.create_batch(NewBatch::new(id.clone(), batch_type.clone())).await.expect("create");
        let received = NewEvent::new(EventType::new("Data_Received").expect("type"), Outcome::Success, agent());
        store.append_event(&id, received).await.expect("Data_Received");
    }
    let (_, processed) = run_probe(probe, config, name);
    assert_eq!(processed, batches, "the first pass processes every batch");
    let mut idle: Vec<Duration> = (0..starts)
        .map(|_| {
            let (elapsed, processed) = run_probe(probe, config, name);
            assert_eq!(processed, 0, "an idle start processes nothing");
            elapsed
        })
        .collect();
    idle.sort_unstable();
    idle
}

// ---------------------------------------------------------------------------------------------

fn pg_store_url(pg: &Postgres, database: &str, pool: usize) -> String {
    format!("{}?pool_size={pool}", pg.create_database(database))
}

async fn open_pg(url: &str) -> PgStore {
    PgStore::open(url).await.unwrap_or_else(|e| panic!("open {url}: {e}"))
}

fn count_rows(pg: &Postgres, database: &str, sql: &str) -> usize {
    pg.psql(database, sql).trim().parse().unwrap_or_else(|e| panic!("{sql}: {e}"))
}

fn main() {
    let config = Config::from_env();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    runtime.block_on(bench(config));
}

/// A progress line on stderr with the seconds since the bench began.
macro_rules! progress {
    ($start:expr, $($arg:tt)*) => {
        eprintln!("[{:6.1} s] {}", $start.elapsed().as_secs_f64(), format!($($arg)*))
    };
}

async fn bench(config: Config) {
    let started_at = Instant::now();
    let budget = config.budget();
    let appends_16 = config.count(APPENDS_16, CLIENTS * 20);
    let appends_1 = config.count(APPENDS_1, 100);
    let fenced_total = config.count(FENCED_PAIRS, CLIENTS * 10);
    let feed_batches = config.count(FEED_BATCHES, 2_000);
    let runner_batches = config.count(RUNNER_BATCHES, 10);
    let idle_count = config.count(IDLE_STARTS, 3);
    let wakes = config.count(WAKES, 5);
    let probe = binary("probe-component");
    progress!(started_at, "workspace binaries built");

    let pg = Postgres::start();
    let settings = pg.psql(
        "postgres",
        "SELECT name || '=' || current_setting(name) FROM pg_settings
         WHERE name IN ('fsync', 'synchronous_commit', 'wal_sync_method', 'full_page_writes', 'shared_buffers',
                        'max_wal_size', 'commit_delay', 'wal_level') ORDER BY name",
    );
    assert!(
        settings.contains("fsync=on") && settings.contains("synchronous_commit=on"),
        "durable settings: {settings}"
    );
    let server_version = pg.psql("postgres", "SHOW server_version").trim().to_string();
    let client_version = Command::new("psql")
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|_| "(psql not on PATH)".into());
    println!("# PostgreSQL store benchmark ({})", if config.smoke { "smoke run" } else { "full" });
    println!(
        "machine: {} cores shared by server, clients and bench; scale {}; phase budget {:?}",
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        config.scale,
        budget
    );
    println!("server: PostgreSQL {server_version} ({client_version}), data dir {}", pg.data_dir().display());
    println!("settings: {}", settings.split_whitespace().collect::<Vec<_>>().join(", "));
    println!("load average at the start: {}", load_average());

    let mut rows = Vec::new();
    let mut notes = Vec::new();

    // --- 1 + 2. Durable appends, 16 clients, PostgreSQL, without and with a feed follower (the
    // barrier), in alternating rounds so that both see the same disk and neighbours.
    progress!(
        started_at,
        "appends: PostgreSQL, {CLIENTS} clients, {appends_16} without and {appends_16} with a feed follower"
    );
    let appends_url = pg_store_url(&pg, "appends", CLIENTS);
    let pg_store = open_pg(&appends_url).await;
    let ids = register(&pg_store, "A").await;
    let shared: Arc<dyn ObjectStore> = Arc::new(pg_store.clone());
    let (mut without, mut with) = (Vec::new(), Vec::new());
    let (mut cpu_without, mut cpu_with) = (CpuUse::default(), CpuUse::default());
    let (mut commits_without, mut commits_with) = (Commits::default(), Commits::default());
    let mut followed = Followed::default();
    let mut rounds_shown = Vec::new();
    for round in 0..2 * BARRIER_ROUNDS {
        // without, with, with, without, without, with, ...: neither always goes first.
        let with_follower = (round % 4 == 1) || (round % 4 == 2);
        let follower = with_follower.then(|| {
            let stop = Arc::new(AtomicBool::new(false));
            let url = format!("{}?pool_size=2", pg.url("appends"));
            let (looping, started) = tokio::sync::oneshot::channel();
            let task = tokio::spawn({
                let stop = Arc::clone(&stop);
                async move { follow(open_pg(&url).await, stop, looping).await }
            });
            (stop, task, started)
        });
        let follower = match follower {
            // The follower must be in its steady loop before the appends start.
            Some((stop, task, started)) => {
                tokio::time::timeout(Duration::from_secs(30), started)
                    .await
                    .expect("the follower reads the feed within 30 s")
                    .expect("the follower is running");
                Some((stop, task))
            }
            None => None,
        };
        let head = pg_store.head().await.expect("head");
        let cpu = Cpu::start(&pg);
        let measured =
            appends(vec![Arc::clone(&shared); CLIENTS], Arc::clone(&ids), appends_16 / BARRIER_ROUNDS, budget).await;
        let used = cpu.stop(measured.ops, measured.elapsed);
        let commits = commits_of(&pg, "appends", head, pg_store.head().await.expect("head"));
        rounds_shown.push(format!("{}{:.0}", if with_follower { "with " } else { "without " }, measured.rate()));
        match follower {
            Some((stop, task)) => {
                stop.store(true, Ordering::Relaxed);
                let (counts, cursor) = task.await.expect("the follower");
                assert_eq!(cursor, pg_store.head().await.expect("head"), "the follower reached the head");
                followed.loops += counts.loops;
                followed.waits += counts.waits;
                followed.changes += counts.changes;
                cpu_with = cpu_with.add(used);
                commits_with = commits_with.add(commits);
                with.push(measured);
            }
            None => {
                cpu_without = cpu_without.add(used);
                commits_without = commits_without.add(commits);
                without.push(measured);
            }
        }
    }
    let pg_16 = Measured::combine(without);
    let pg_16_followed = Measured::combine(with);
    assert_eq!(
        count_rows(&pg, "appends", "SELECT count(*) FROM events"),
        pg_16.ops + pg_16_followed.ops,
        "every append recorded once"
    );
    notes.push(format!(
        "PostgreSQL appends, {CLIENTS} clients, no follower: {}; {}",
        cpu_without.per_op(),
        commits_without.describe()
    ));
    let seconds = pg_16_followed.elapsed.as_secs_f64();
    notes.push(format!(
        "PostgreSQL appends, {CLIENTS} clients, with the follower: {}; {}; the follower did {:.0} loops/s ({:.0} \
         changes()/s + {:.0} wait_for_change()/s, each a feed barrier) and saw {:.0} changed batches/s; rounds \
         in order (appends/s): {}",
        cpu_with.per_op(),
        commits_with.describe(),
        followed.loops as f64 / seconds,
        followed.loops as f64 / seconds,
        followed.waits as f64 / seconds,
        followed.changes as f64 / seconds,
        rounds_shown.join(", ")
    ));

    // --- 3. SQLite FULL through the store service, 16 HTTP clients.
    progress!(started_at, "appends: SQLite FULL through autocomp-store serve, {CLIENTS} clients");
    let sqlite_dir = disk_temp_dir("autocomp-bench-sqlite-");
    let service = Service::store_of(
        &format!("sqlite://{}?synchronous=full", sqlite_dir.path().join("service.db").display()),
        sqlite_dir.path(),
    );
    let http = |url: &str| -> Arc<dyn ObjectStore> {
        Arc::new(HttpStore::with_token(url, Some(TOKEN.into())).expect("an HttpStore"))
    };
    let sqlite_ids = register(http(&service.url()).as_ref(), "A").await;
    let clients: Vec<Arc<dyn ObjectStore>> = (0..CLIENTS).map(|_| http(&service.url())).collect();
    let sqlite_16 = appends(clients, sqlite_ids, appends_16, budget).await;
    drop(service);
    let check = SqliteStore::open(sqlite_dir.path().join("service.db")).await.expect("the service's file");
    let recorded: usize = check.list_batches(None, 1_000).await.expect("list").iter().map(|b| b.events.len()).sum();
    assert_eq!(recorded, sqlite_16.ops, "every acknowledged append recorded once");
    drop(check);

    // --- 4. One client: PostgreSQL, and embedded SQLite FULL.
    progress!(started_at, "appends: 1 client, PostgreSQL and embedded SQLite FULL");
    let cpu = Cpu::start(&pg);
    let pg_1 = appends(vec![Arc::clone(&shared)], Arc::clone(&ids), appends_1, budget).await;
    notes.push(format!("PostgreSQL appends, 1 client: {}", cpu.stop(pg_1.ops, pg_1.elapsed).per_op()));
    let embedded = SqliteStore::open_with(
        sqlite_dir.path().join("embedded.db"),
        SqliteOptions { synchronous: Synchronous::Full, ..SqliteOptions::default() },
    )
    .await
    .expect("embedded SQLite");
    let embedded_ids = register(&embedded, "E").await;
    let embedded: Arc<dyn ObjectStore> = Arc::new(embedded);
    let sqlite_1 = appends(vec![embedded], embedded_ids, appends_1, budget).await;

    // --- 5. Claim + fenced append, 16 clients.
    progress!(started_at, "claim + fenced append: PostgreSQL, {CLIENTS} clients, {fenced_total} pairs");
    let fenced_url = pg_store_url(&pg, "fenced", CLIENTS);
    let fenced_store = open_pg(&fenced_url).await;
    pg.psql("fenced", &fill_batches_sql(fenced_total));
    let cpu = Cpu::start(&pg);
    let fenced = fenced_pairs(Arc::new(fenced_store), fenced_total, budget).await;
    notes.push(format!(
        "claim + fenced append, {CLIENTS} clients, each pair on a batch of its own ({} batches created by SQL \
         beforehand): {} (per pair)",
        thousands(fenced_total as f64),
        cpu.stop(fenced.ops, fenced.elapsed).per_op()
    ));
    let fenced_events = count_rows(&pg, "fenced", "SELECT count(*) FROM events WHERE run_component IS NOT NULL");
    assert_eq!(fenced_events, fenced.ops, "every fenced append recorded once");
    notes.push(format!(
        "claim + fenced append: the fenced appends' {}; every claim is a transaction of its own",
        commits_of(&pg, "fenced", Seq::ZERO, Seq(i64::MAX)).describe()
    ));

    // --- 6. wait_for_change wake latency.
    progress!(started_at, "wait_for_change wake latency: {wakes} samples");
    let waiter = open_pg(&format!("{}?pool_size=2", pg.url("appends"))).await;
    let wake = wake_latency(Arc::clone(&shared), waiter, ids[0].clone(), wakes).await;

    // --- 7. The feed store, filled by SQL; feed read; store reads alone; sboi catch-up.
    progress!(
        started_at,
        "feed store: {feed_batches} batches x {EVENTS_PER_BATCH} events by INSERT ... SELECT generate_series"
    );
    let feed_url = pg_store_url(&pg, "feed", 8);
    let feed_store = open_pg(&feed_url).await; // creates the schema
    let filled = Instant::now();
    pg.psql("feed", &fill_sql(feed_batches));
    let fill_time = filled.elapsed();
    assert_eq!(feed_store.count_batches().await.expect("count"), feed_batches as u64);
    let head = feed_store.head().await.expect("head");
    assert_eq!(head, Seq(((EVENTS_PER_BATCH + 1) * feed_batches) as i64), "the sequence is past every row");
    let sample = feed_store.get_batch(&BatchId::new("B000000020-RT1").expect("id")).await.expect("a filled batch");
    assert_eq!(sample.events.len(), EVENTS_PER_BATCH);
    assert_eq!(sample.events.last().map(|e| e.outcome), Some(Outcome::Failure));
    assert_eq!(sample.changed_seq, sample.events.last().map(|e| e.seq).unwrap_or_default());
    let database_size = pg.psql("feed", "SELECT pg_size_pretty(pg_database_size(current_database()))");
    notes.push(format!(
        "feed store: {feed_batches} batches, {} events, filled by one INSERT ... SELECT generate_series transaction \
         through psql in {:.1} s (+ VACUUM ANALYZE), database {}",
        feed_batches * EVENTS_PER_BATCH,
        fill_time.as_secs_f64(),
        database_size.trim()
    ));
    progress!(started_at, "change feed read");
    // Warm-up: the first page (plans, connection).
    feed_store.changes(Seq::ZERO, FEED_PAGE).await.expect("changes");
    let cpu = Cpu::start(&pg);
    let feed = read_feed(&feed_store, FEED_PASSES).await;
    assert_eq!(feed.ops, FEED_PASSES * feed_batches, "every batch in the feed once per pass");
    notes.push(format!(
        "change feed read, {FEED_PASSES} passes over the feed: {}",
        cpu.stop(feed.ops, feed.elapsed).per_op()
    ));
    let engine_options = EngineOptions::default();
    progress!(started_at, "store reads of a catch-up, without indexing");
    let cpu = Cpu::start(&pg);
    let store_reads = read_feed_and_batches(&feed_store, engine_options.page_size).await;
    assert_eq!(store_reads.ops, feed_batches);
    notes.push(format!(
        "store reads of a catch-up alone: {} (per batch)",
        cpu.stop(store_reads.ops, store_reads.elapsed).per_op()
    ));
    progress!(started_at, "sboi catch-up");
    let index_dir = disk_temp_dir("autocomp-bench-index-");
    let engine = IndexEngine::open_with(index_dir.path(), engine_options.clone()).expect("open the index");
    let cpu = Cpu::start(&pg);
    let started = Instant::now();
    let outcome = engine.catch_up(&feed_store).await.expect("catch up");
    let catch_up_time = started.elapsed();
    let CatchUp::Applied { batches: caught_up, cursor } = outcome else { panic!("a fresh index applies: {outcome:?}") };
    assert_eq!(caught_up, feed_batches, "every batch indexed once");
    assert_eq!(cursor, head);
    assert_eq!(engine.num_docs().expect("num_docs"), feed_batches as u64);
    notes.push(format!("sboi catch-up: {} (per batch)", cpu.stop(caught_up, catch_up_time).per_op()));
    drop(engine);

    // --- 8. Idle cron starts.
    progress!(started_at, "idle cron starts: {idle_count} with a postgres:// store, {idle_count} with SQLite FULL");
    let runner_dir = disk_temp_dir("autocomp-bench-runner-");
    let runner_url = pg.create_database("runner");
    let pg_config = probe_config(runner_dir.path(), "probe-pg", &runner_url, runner_batches);
    let runner_store = open_pg(&runner_url).await;
    let idle_pg = idle_starts(&runner_store, &probe, &pg_config, "probe-pg", runner_batches, idle_count).await;
    let sqlite_url = format!("sqlite://{}?synchronous=full", runner_dir.path().join("runner.db").display());
    let sqlite_config = probe_config(runner_dir.path(), "probe-sqlite", &sqlite_url, runner_batches);
    let sqlite_runner = SqliteStore::open_with(
        runner_dir.path().join("runner.db"),
        SqliteOptions { synchronous: Synchronous::Full, ..SqliteOptions::default() },
    )
    .await
    .expect("runner SQLite");
    let idle_sqlite =
        idle_starts(&sqlite_runner, &probe, &sqlite_config, "probe-sqlite", runner_batches, idle_count).await;
    drop(sqlite_runner);

    // --- The table.
    let per_s = |m: &Measured, unit: &str| format!("{} {unit}/s", thousands(m.rate()));
    let beats_sqlite = pg_16.rate() > sqlite_16.rate();
    rows.push(
        row(
            format!("durable appends, {CLIENTS} clients (PostgreSQL, 16 tasks on one PgStore, pool_size=16)"),
            per_s(&pg_16, "appends"),
            p50_p99(&pg_16.latencies),
        )
        .goal(
            format!(">= {}/s and > SQLite FULL service row", thousands(GOAL_APPENDS_16)),
            pg_16.rate() >= GOAL_APPENDS_16 && beats_sqlite,
        ),
    );
    rows.push(
        row(
            format!("durable appends, {CLIENTS} HTTP clients (SQLite FULL via autocomp-store serve)"),
            per_s(&sqlite_16, "appends"),
            p50_p99(&sqlite_16.latencies),
        )
        .report("comparison"),
    );
    rows.push(
        row("durable appends, 1 client (PostgreSQL)", per_s(&pg_1, "appends"), p50_p99(&pg_1.latencies))
            .report("report"),
    );
    rows.push(
        row(
            "durable appends, 1 client (embedded SqliteStore, FULL)",
            per_s(&sqlite_1, "appends"),
            p50_p99(&sqlite_1.latencies),
        )
        .report("comparison"),
    );
    rows.push(
        row(
            format!("claim + fenced append, {CLIENTS} clients (PostgreSQL)"),
            per_s(&fenced, "pairs"),
            p50_p99(&fenced.latencies),
        )
        .goal(format!(">= {}/s", thousands(GOAL_FENCED_16)), fenced.rate() >= GOAL_FENCED_16),
    );
    rows.push(
        row(
            format!(
                "change feed read, changes() pages of {}, {} batches",
                thousands(FEED_PAGE as f64),
                thousands(feed_batches as f64)
            ),
            per_s(&feed, "changes"),
            p50_p99(&feed.latencies) + " per page",
        )
        .goal(format!(">= {}/s", thousands(GOAL_FEED)), feed.rate() >= GOAL_FEED),
    );
    rows.push(
        row(
            format!("sboi catch-up from PostgreSQL, fresh index, {} batches", thousands(feed_batches as f64)),
            format!(
                "{} batches/s ({:.1} s)",
                thousands(caught_up as f64 / catch_up_time.as_secs_f64()),
                catch_up_time.as_secs_f64()
            ),
            "-",
        )
        .goal(
            format!(">= {}/s", thousands(GOAL_CATCH_UP)),
            caught_up as f64 / catch_up_time.as_secs_f64() >= GOAL_CATCH_UP,
        ),
    );
    rows.push(
        row(
            format!(
                "... its store reads alone (changes + get_batches, pages of {}), no indexing",
                engine_options.page_size
            ),
            per_s(&store_reads, "batches"),
            p50_p99(&store_reads.latencies) + " per get_batches",
        )
        .report("diagnostic"),
    );
    let idle_p50 = percentile(&idle_pg, 0.5);
    rows.push(
        row(
            format!("idle cron start, postgres:// store, local index + locks (p50 / p95, n={})", idle_pg.len()),
            format!("{:.1} ms", ms(idle_p50)),
            format!("{:.1} / {:.1} ms (p50 / p95)", ms(idle_p50), ms(percentile(&idle_pg, 0.95))),
        )
        .goal(format!("<= {GOAL_IDLE_P50_MS} ms p50"), ms(idle_p50) <= GOAL_IDLE_P50_MS),
    );
    let sqlite_idle_p50 = percentile(&idle_sqlite, 0.5);
    rows.push(
        row(
            format!("idle cron start, SQLite FULL store, local index + locks (n={})", idle_sqlite.len()),
            format!("{:.1} ms", ms(sqlite_idle_p50)),
            format!("{:.1} / {:.1} ms (p50 / p95)", ms(sqlite_idle_p50), ms(percentile(&idle_sqlite, 0.95))),
        )
        .report("comparison"),
    );
    let wake_p99 = percentile(&wake, 0.99);
    rows.push(
        row(
            format!(
                "wait_for_change wake after a commit (n={}, max {:.1} ms)",
                wake.len(),
                ms(*wake.last().unwrap_or(&Duration::ZERO))
            ),
            format!("{:.1} ms p50", ms(percentile(&wake, 0.5))),
            p50_p99(&wake),
        )
        .goal(format!("p50 and p99 <= {GOAL_WAKE_MS} ms"), ms(wake_p99) <= GOAL_WAKE_MS),
    );
    rows.push(
        row(
            format!("barrier: {CLIENTS}-client appends, no follower"),
            per_s(&pg_16, "appends"),
            p50_p99(&pg_16.latencies),
        )
        .report("report"),
    );
    let change = 100.0 * (pg_16_followed.rate() / pg_16.rate() - 1.0);
    rows.push(
        row(
            format!(
                "barrier: {CLIENTS}-client appends, follower looping changes() + wait_for_change() ({change:+.0}% rate)"
            ),
            per_s(&pg_16_followed, "appends"),
            p50_p99(&pg_16_followed.latencies),
        )
        .report("report"),
    );

    println!("load average at the end: {}", load_average());
    println!();
    print_table(&rows);
    println!();
    for note in &notes {
        println!("- {note}");
    }
    println!(
        "- appends: each client appends to its own {BATCHES_PER_CLIENT} of {} batches; every append carries an \
         idempotency key (the store adds one); counts checked in the database afterwards",
        CLIENTS * BATCHES_PER_CLIENT
    );
}
