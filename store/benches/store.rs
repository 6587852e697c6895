//! Throughput of the embedded SQLite object store (issue #2), measured through the
//! `ObjectStore` port on a real file in a temporary directory on disk (never tmpfs, so
//! every fsync is real).
//!
//! Run with `cargo bench -p autocomp-store --bench store`. `AUTOCOMP_BENCH_SCALE` (a float,
//! default 1) multiplies every size and time budget. Without the `--bench` argument that
//! `cargo bench` passes (e.g. under `cargo test --all-targets`) the binary only does a tiny
//! smoke run so that tests stay fast. Other arguments are ignored.
//!
//! What it prints, one table row per figure:
//! - the disk's raw sync rate (4 KiB overwrite + `sync_data`, and + `sync_all`), which bounds
//!   every `synchronous = FULL` figure: each FULL commit costs one fsync of the WAL;
//! - single-event append transactions per second, sequential from one task, for
//!   `Synchronous::Full` and `Synchronous::Normal` side by side;
//! - the cost of a trivial call through the port (`head()`), the floor under every operation;
//! - the runner's fenced path, claim + `in_run` append (two transactions per event);
//! - two writers, each with its own `SqliteStore` handle (connection) on the same file;
//! - the batch creation rate while filling the change-feed store, then the change-feed
//!   read rate in pages of 10,000.

use std::fs::OpenOptions;
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use autocomp_store::{
    Agent, BatchId, BatchType, ComponentName, EventType, NewBatch, NewEvent, ObjectStore, Outcome, RunHolder, Seq,
    SqliteOptions, SqliteStore, Synchronous,
};
use serde_json::{Value, json};

const APPEND_GOAL: f64 = 10_000.0;
const FEED_GOAL: f64 = 200_000.0;
const FEED_PAGE: usize = 10_000;

/// Sizes at scale 1; every count and time budget is multiplied by the scale.
const BATCHES: f64 = 1_000.0;
const APPENDS: f64 = 20_000.0;
const FENCED: f64 = 10_000.0;
const ROUND_TRIPS: f64 = 20_000.0;
const MULTI_WRITER_APPENDS: f64 = 20_000.0;
const FEED_BATCHES: f64 = 200_000.0;
/// A phase stops early once it has run this long, so a slow disk cannot stretch the run.
const PHASE_BUDGET_SECS: f64 = 10.0;
const FSYNC_SECS: f64 = 2.0;

struct Config {
    scale: f64,
    smoke: bool,
}

impl Config {
    fn from_env() -> Self {
        let autocomp_test_servers::bench::BenchScale { scale, smoke } =
            autocomp_test_servers::bench::BenchScale::from_env(0.005);
        Self { scale, smoke }
    }

    fn count(&self, base: f64, min: usize) -> usize {
        ((base * self.scale).round() as usize).max(min)
    }

    fn budget(&self, base_secs: f64) -> Duration {
        Duration::from_secs_f64((base_secs * self.scale).max(0.2))
    }
}

/// One row of the result table.
struct Row {
    metric: String,
    n: usize,
    rate: f64,
    unit: &'static str,
    latency: Option<(Duration, Duration)>,
    goal: Option<f64>,
}

impl Row {
    fn new(metric: impl Into<String>, n: usize, elapsed: Duration, unit: &'static str) -> Self {
        Self { metric: metric.into(), n, rate: n as f64 / elapsed.as_secs_f64(), unit, latency: None, goal: None }
    }

    fn goal(mut self, goal: f64) -> Self {
        self.goal = Some(goal);
        self
    }

    fn latencies(mut self, samples: &mut [Duration]) -> Self {
        if !samples.is_empty() {
            samples.sort_unstable();
            let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
            self.latency = Some((at(0.5), at(0.99)));
        }
        self
    }
}

fn thousands(value: f64) -> String {
    let digits = format!("{:.0}", value.max(0.0));
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn micros(d: Duration) -> String {
    let us = d.as_secs_f64() * 1e6;
    if us >= 1_000.0 { format!("{:.1} ms", us / 1000.0) } else { format!("{us:.0} µs") }
}

fn print_table(rows: &[Row]) {
    let cells: Vec<[String; 6]> = rows
        .iter()
        .map(|row| {
            [
                row.metric.clone(),
                thousands(row.n as f64),
                format!("{} {}", thousands(row.rate), row.unit),
                row.latency.map_or_else(|| "-".into(), |(p50, p99)| format!("{} / {}", micros(p50), micros(p99))),
                row.goal.map_or_else(|| "-".into(), |goal| format!(">= {} {}", thousands(goal), row.unit)),
                row.goal.map_or_else(|| "-".into(), |goal| if row.rate >= goal { "yes" } else { "no" }.into()),
            ]
        })
        .collect();
    let header = ["metric", "n", "figure", "p50 / p99", "goal", "met"];
    let mut widths = header.map(|h| h.chars().count());
    for row in &cells {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: &[String]| {
        let padded: Vec<String> = cells
            .iter()
            .zip(widths)
            .enumerate()
            .map(|(i, (cell, width))| {
                let pad = " ".repeat(width - cell.chars().count());
                // Left-align the metric, right-align the numbers.
                if i == 0 { format!("{cell}{pad}") } else { format!("{pad}{cell}") }
            })
            .collect();
        println!("| {} |", padded.join(" | "));
    };
    line(&header.map(String::from));
    let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
    println!("|-{}-|", rule.join("-|-"));
    for row in &cells {
        line(row);
    }
}

/// Raw fsync rate of the disk: overwrite 4 KiB in a preallocated 1 MiB file and sync it, in a
/// loop (the pattern of a WAL commit, which overwrites a reused WAL file). `sync_data`
/// (fdatasync) is the disk's floor; `sync_all` (fsync) is what the bundled SQLite calls,
/// built without `HAVE_FDATASYNC`, and also flushes the inode's changed mtime.
fn fsync_rate(dir: &Path, budget: Duration, all: bool) -> std::io::Result<Row> {
    let path = dir.join("fsync-probe");
    let mut file = OpenOptions::new().create(true).truncate(true).read(true).write(true).open(&path)?;
    const SLOTS: u64 = 256;
    file.write_all(&vec![0u8; (SLOTS * 4096) as usize])?;
    file.sync_all()?;
    let block = [0xA5u8; 4096];
    let mut samples = Vec::new();
    let start = Instant::now();
    let mut i = 0u64;
    while start.elapsed() < budget {
        let t = Instant::now();
        file.seek(SeekFrom::Start((i % SLOTS) * 4096))?;
        file.write_all(&block)?;
        if all {
            file.sync_all()?
        } else {
            file.sync_data()?
        }
        samples.push(t.elapsed());
        i += 1;
    }
    let elapsed = start.elapsed();
    drop(file);
    std::fs::remove_file(&path)?;
    let metric = if all { "disk: 4 KiB write + fsync (sync_all)" } else { "disk: 4 KiB write + fdatasync (sync_data)" };
    Ok(Row::new(metric, samples.len(), elapsed, "syncs/s").latencies(&mut samples))
}

fn label(synchronous: Synchronous) -> &'static str {
    match synchronous {
        Synchronous::Full => "FULL",
        Synchronous::Normal => "NORMAL",
    }
}

async fn open(path: &Path, synchronous: Synchronous) -> SqliteStore {
    let options = SqliteOptions { synchronous, busy_timeout: Duration::from_secs(30) };
    SqliteStore::open_with(path, options).await.unwrap_or_else(|e| panic!("opening {}: {e}", path.display()))
}

fn batch_id(prefix: &str, i: usize) -> BatchId {
    BatchId::new(format!("{prefix}{i:07}-RT1")).expect("valid batch id")
}

/// A small report, like the one a checksum verifier records.
fn report(i: usize) -> Value {
    json!({
        "outcome": "success",
        "duration_ms": 1_200 + (i % 800),
        "failures": [],
        "summary": format!("verified {} files", 10 + i % 90),
        "transient": false,
    })
}

struct Vocabulary {
    event_type: EventType,
    agent: Agent,
    component: ComponentName,
    holder: RunHolder,
}

impl Vocabulary {
    fn new() -> Self {
        let agent = Agent::new(format!("checksum-verifier/0.1.0@bench#{}", std::process::id())).expect("valid agent");
        Self {
            event_type: EventType::new("Checksums_Verified").expect("valid event type"),
            component: ComponentName::new("checksum-verifier").expect("valid component"),
            holder: RunHolder { agent: agent.clone(), host: "bench".into(), pid: std::process::id(), claim_key: None },
            agent,
        }
    }

    fn event(&self, i: usize) -> NewEvent {
        NewEvent::new(self.event_type.clone(), Outcome::Success, self.agent.clone()).with_details(report(i))
    }
}

/// Creates `count` batches through the port, one transaction each.
async fn create_batches(store: &SqliteStore, prefix: &str, count: usize) -> (Vec<BatchId>, Duration) {
    let batch_type = BatchType::new("RoundTrip").expect("valid batch type");
    let ids: Vec<BatchId> = (0..count).map(|i| batch_id(prefix, i)).collect();
    let start = Instant::now();
    for id in &ids {
        let batch = NewBatch::new(id.clone(), batch_type.clone()).with_location(format!("/data/incoming/{id}"));
        store.create_batch(batch).await.expect("create batch");
    }
    (ids, start.elapsed())
}

/// A store file holding `batches` batches, created with NORMAL (creation is not measured
/// here), then reopened with the setting to measure.
async fn prepared_store(path: &Path, synchronous: Synchronous, batches: usize) -> (SqliteStore, Vec<BatchId>) {
    let ids = {
        let filler = open(path, Synchronous::Normal).await;
        create_batches(&filler, "B", batches).await.0
    };
    (open(path, synchronous).await, ids)
}

/// Sequential single-event appends from one task: one event, one transaction.
async fn appends(
    store: &SqliteStore,
    ids: &[BatchId],
    words: &Vocabulary,
    count: usize,
    budget: Duration,
) -> (usize, Duration, Vec<Duration>) {
    let mut samples = Vec::with_capacity(count);
    let start = Instant::now();
    for i in 0..count {
        let t = Instant::now();
        store.append_event(&ids[i % ids.len()], words.event(i)).await.expect("append");
        samples.push(t.elapsed());
        if start.elapsed() >= budget {
            break;
        }
    }
    (samples.len(), start.elapsed(), samples)
}

/// The floor under every operation: a trivial read through the port (a hop to tokio's
/// blocking pool, the connection mutex, one read transaction).
async fn round_trips(store: &SqliteStore, count: usize, budget: Duration) -> (usize, Duration, Vec<Duration>) {
    let mut samples = Vec::with_capacity(count);
    let start = Instant::now();
    for _ in 0..count {
        let t = Instant::now();
        store.head().await.expect("head");
        samples.push(t.elapsed());
        if start.elapsed() >= budget {
            break;
        }
    }
    (samples.len(), start.elapsed(), samples)
}

/// The runner's real path: claim the batch, then append the event fenced by that run.
async fn fenced_appends(
    store: &SqliteStore,
    ids: &[BatchId],
    words: &Vocabulary,
    count: usize,
    budget: Duration,
) -> (usize, Duration, Vec<Duration>) {
    let mut samples = Vec::with_capacity(count);
    let start = Instant::now();
    for i in 0..count {
        let t = Instant::now();
        let batch = &ids[i % ids.len()];
        let claim = store.claim(batch, &words.component, &words.holder).await.expect("claim");
        let event = words.event(i).in_run(words.component.clone(), claim.generation());
        store.append_event(batch, event).await.expect("fenced append");
        samples.push(t.elapsed());
        if start.elapsed() >= budget {
            break;
        }
    }
    (samples.len(), start.elapsed(), samples)
}

/// Two tasks, each with its own handle (its own SQLite connection) on the same file,
/// appending to disjoint halves of the batches. SQLite serializes the write transactions;
/// a writer that finds the lock taken waits in the busy handler.
async fn two_writers(
    path: &Path,
    synchronous: Synchronous,
    ids: &[BatchId],
    count: usize,
    budget: Duration,
) -> (usize, Duration, Vec<Duration>) {
    let half = ids.len() / 2;
    let mut tasks = Vec::new();
    let stores = [open(path, synchronous).await, open(path, synchronous).await];
    let start = Instant::now();
    for (w, store) in stores.into_iter().enumerate() {
        let mine: Vec<BatchId> = ids[w * half..(w + 1) * half].to_vec();
        let per_writer = count / 2;
        tasks.push(tokio::spawn(async move {
            let words = Vocabulary::new();
            appends(&store, &mine, &words, per_writer, budget).await
        }));
    }
    let mut total = 0;
    let mut samples = Vec::new();
    for task in tasks {
        let (n, _, mut s) = task.await.expect("writer task");
        total += n;
        samples.append(&mut s);
    }
    (total, start.elapsed(), samples)
}

/// Reads the whole change feed in pages; returns (changes read, elapsed).
async fn read_feed(store: &SqliteStore) -> (usize, Duration) {
    let start = Instant::now();
    let mut since = Seq::ZERO;
    let mut read = 0;
    loop {
        let page = store.changes(since, FEED_PAGE).await.expect("changes");
        read += page.changes.len();
        let done = page.changes.is_empty() || page.next >= page.head;
        since = page.next;
        if done {
            break;
        }
    }
    (read, start.elapsed())
}

fn bench_dir() -> PathBuf {
    // /var/tmp and the working directory are on disk here; /tmp may be tmpfs elsewhere.
    let var_tmp = Path::new("/var/tmp");
    if var_tmp.is_dir() { var_tmp.to_path_buf() } else { PathBuf::from(".") }
}

async fn run(config: &Config) -> Vec<Row> {
    let root = bench_dir();
    let dir = tempfile::Builder::new().prefix("autocomp-bench-").tempdir_in(&root).expect("temporary directory");
    eprintln!("store files in {} (scale {})", dir.path().display(), config.scale);
    let words = Vocabulary::new();
    let budget = config.budget(PHASE_BUDGET_SECS);
    let batches = config.count(BATCHES, 4);
    let mut rows = Vec::new();

    eprintln!("fsync probe ...");
    for all in [false, true] {
        rows.push(fsync_rate(dir.path(), config.budget(FSYNC_SECS), all).expect("fsync probe"));
    }

    // 1. Single-event appends, FULL and NORMAL side by side, each on its own file.
    for synchronous in [Synchronous::Full, Synchronous::Normal] {
        eprintln!("appends, synchronous={} ...", label(synchronous));
        let path = dir.path().join(format!("appends-{}.db", label(synchronous).to_lowercase()));
        let (store, ids) = prepared_store(&path, synchronous, batches).await;
        appends(&store, &ids, &words, 200.min(config.count(APPENDS, 10)), budget).await; // warm-up
        let (n, elapsed, mut samples) = appends(&store, &ids, &words, config.count(APPENDS, 20), budget).await;
        let metric = format!("append, 1 event/tx, synchronous={}", label(synchronous));
        rows.push(Row::new(metric, n, elapsed, "events/s").latencies(&mut samples).goal(APPEND_GOAL));
        if synchronous == Synchronous::Normal {
            eprintln!("port round trips (head) ...");
            let (n, elapsed, mut samples) = round_trips(&store, config.count(ROUND_TRIPS, 20), budget).await;
            rows.push(Row::new("port round trip: head() (read tx)", n, elapsed, "calls/s").latencies(&mut samples));
        }
    }

    // The runner's fenced path: claim + append in its run, two transactions per event.
    for synchronous in [Synchronous::Full, Synchronous::Normal] {
        eprintln!("fenced claim + append, synchronous={} ...", label(synchronous));
        let path = dir.path().join(format!("fenced-{}.db", label(synchronous).to_lowercase()));
        let (store, ids) = prepared_store(&path, synchronous, batches).await;
        let (n, elapsed, mut samples) = fenced_appends(&store, &ids, &words, config.count(FENCED, 10), budget).await;
        let metric = format!("claim + fenced append (2 tx), {}", label(synchronous));
        rows.push(Row::new(metric, n, elapsed, "events/s").latencies(&mut samples));
    }

    // Two connections on one file.
    for synchronous in [Synchronous::Full, Synchronous::Normal] {
        eprintln!("two writers, synchronous={} ...", label(synchronous));
        let path = dir.path().join(format!("writers-{}.db", label(synchronous).to_lowercase()));
        let (store, ids) = prepared_store(&path, synchronous, batches).await;
        drop(store);
        let (n, elapsed, mut samples) =
            two_writers(&path, synchronous, &ids, config.count(MULTI_WRITER_APPENDS, 20), budget).await;
        let metric = format!("2 writers, 2 connections, {} (total)", label(synchronous));
        rows.push(Row::new(metric, n, elapsed, "events/s").latencies(&mut samples));
    }

    // 2. The change feed over many batches.
    let feed_batches = config.count(FEED_BATCHES, 100);
    eprintln!("creating {} batches for the change feed (synchronous=NORMAL) ...", thousands(feed_batches as f64));
    let path = dir.path().join("feed.db");
    let store = open(&path, Synchronous::Normal).await;
    let (_, elapsed) = create_batches(&store, "F", feed_batches).await;
    rows.push(Row::new("create batch, 1 per tx, NORMAL (feed fill)", feed_batches, elapsed, "batches/s"));
    eprintln!("reading the change feed ...");
    // Three full passes; report the median one.
    let mut passes = Vec::new();
    for _ in 0..3 {
        let (read, elapsed) = read_feed(&store).await;
        assert_eq!(read, feed_batches, "the feed lists every batch once");
        passes.push(elapsed);
    }
    passes.sort_unstable();
    let metric = format!("change feed read, pages of {}", thousands(FEED_PAGE as f64));
    rows.push(Row::new(metric, feed_batches, passes[1], "changes/s").goal(FEED_GOAL));

    drop(store);
    dir.close().expect("removing the temporary directory");
    rows
}

fn main() {
    let config = Config::from_env();
    if config.smoke {
        eprintln!("smoke run (no --bench argument): tiny sizes; use `cargo bench -p autocomp-store --bench store`");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
    let started = Instant::now();
    let rows = runtime.block_on(run(&config));
    println!();
    println!(
        "autocomp-store benchmark (scale {}{}, {}; {:.0} s)",
        config.scale,
        if config.smoke { ", smoke run" } else { "" },
        if cfg!(debug_assertions) { "DEBUG build: figures are not representative" } else { "release build" },
        started.elapsed().as_secs_f64()
    );
    print_table(&rows);
}
