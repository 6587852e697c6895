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
//! - the runner's fenced path, claim + `in_run` append (two transactions per event), and a
//!   pass's: `claim_many` of N batches, then their N fenced appends sent concurrently (they
//!   share commits through the handle's group commit);
//! - two writers, each with its own `SqliteStore` handle (connection) on the same file;
//! - the batch creation rate while filling the change-feed store, then the change-feed
//!   read rate in pages of 10,000;
//! - the index catch-up's store read, as the engine reads (`changes` pages of 5,000, then
//!   `get_summaries`), over the sboi benchmark's cached 1,000,000-batch store
//!   (`target/bench-data/sboi-store-1000000.db`; another file with
//!   `AUTOCOMP_BENCH_CATCH_UP_STORE`), beside the whole-batch reads it replaced (`get_batches`
//!   set-based, and one batch at a time); "skipped" when the file is missing. The file is
//!   opened read-write once (which upgrades a file of an older schema), then immutable.
//!
//! `AUTOCOMP_BENCH_ONLY=fsync,appends,fenced,claim_many,writers,feed,catch_up` runs only the
//! named sections.

use autocomp_test_servers::bench::thousands;
use std::fs::OpenOptions;
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use autocomp_model::{
    Agent, Batch, BatchId, BatchSummary, BatchType, ComponentName, EventType, NewBatch, NewEvent, Outcome, RunHolder,
    Seq, Timestamp,
};
use autocomp_store::prelude::*;
use autocomp_store::{SqliteOptions, SqliteStore, Synchronous};
use serde_json::{Value, json};

const APPEND_GOAL: f64 = 10_000.0;
const FEED_GOAL: f64 = 200_000.0;
const FEED_PAGE: usize = 10_000;
/// The index engine's page size (`EngineOptions::page_size`).
const CATCH_UP_PAGE: usize = 5_000;
/// The whole catch-up must reach 100,000 batches/s with tantivy sharing the two cores, so
/// the store's read alone should do at least twice that.
const CATCH_UP_READ_GOAL: f64 = 200_000.0;
/// Batches per pass in the claim_many rows: the largest, and the default `queue_size`.
const PASS_SIZES: [usize; 2] = [100, 10];

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
    /// `AUTOCOMP_BENCH_ONLY`: the sections to run (all when unset).
    only: Option<Vec<String>>,
}

impl Config {
    fn from_env() -> Self {
        let autocomp_test_servers::bench::BenchScale { scale, smoke } =
            autocomp_test_servers::bench::BenchScale::from_env(0.005);
        let only = std::env::var("AUTOCOMP_BENCH_ONLY")
            .ok()
            .map(|names| names.split(',').map(|name| name.trim().to_string()).collect());
        Self { scale, smoke, only }
    }

    fn runs(&self, section: &str) -> bool {
        self.only.as_ref().is_none_or(|only| only.iter().any(|name| name == section))
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
    /// Why the row has no figure (its data set is missing).
    skipped: Option<String>,
    n: usize,
    rate: f64,
    unit: &'static str,
    latency: Option<(Duration, Duration)>,
    goal: Option<f64>,
}

impl Row {
    fn new(metric: impl Into<String>, n: usize, elapsed: Duration, unit: &'static str) -> Self {
        Self {
            metric: metric.into(),
            skipped: None,
            n,
            rate: n as f64 / elapsed.as_secs_f64(),
            unit,
            latency: None,
            goal: None,
        }
    }

    fn skipped(metric: impl Into<String>, why: impl Into<String>) -> Self {
        Self { skipped: Some(why.into()), ..Self::new(metric, 0, Duration::from_secs(1), "") }
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

fn micros(d: Duration) -> String {
    let us = d.as_secs_f64() * 1e6;
    if us >= 1_000.0 { format!("{:.1} ms", us / 1000.0) } else { format!("{us:.0} µs") }
}

fn print_table(rows: &[Row]) {
    let cells: Vec<[String; 6]> = rows
        .iter()
        .map(|row| {
            if let Some(why) = &row.skipped {
                return [row.metric.clone(), "-".into(), format!("skipped: {why}"), "-".into(), "-".into(), "-".into()];
            }
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
        Synchronous::Acknowledged => "ACKNOWLEDGED",
        Synchronous::Normal => "NORMAL",
    }
}

async fn open(path: &Path, synchronous: Synchronous) -> SqliteStore {
    let options = SqliteOptions { synchronous, busy_timeout: Duration::from_secs(30), ..SqliteOptions::default() };
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
            holder: RunHolder {
                agent: agent.clone(),
                host: "bench".into(),
                pid: std::process::id(),
                claim_key: None,
                liveness: None,
            },
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

/// A pass as the runner makes it: `claim_many` of `pass` batches (one transaction), then
/// their fenced appends all at once from concurrent tasks, as results that finish together
/// arrive; the handle's group commit lets them share transactions. Returns (events, elapsed,
/// per-pass latencies).
async fn claim_many_passes(
    store: &SqliteStore,
    ids: &[BatchId],
    words: &Vocabulary,
    pass: usize,
    count: usize,
    budget: Duration,
) -> (usize, Duration, Vec<Duration>) {
    let mut samples = Vec::new();
    let mut recorded = 0;
    let start = Instant::now();
    let mut next = 0;
    while recorded < count && start.elapsed() < budget {
        let t = Instant::now();
        let batches: Vec<BatchId> = (0..pass).map(|i| ids[(next + i) % ids.len()].clone()).collect();
        next += pass;
        let claims = store.claim_many(&batches, &words.component, &words.holder).await.expect("claim_many");
        let mut tasks = Vec::with_capacity(pass);
        for (i, (batch, claim)) in batches.into_iter().zip(claims).enumerate() {
            let claim = claim.expect("every batch exists");
            let event = words.event(next + i).in_run(words.component.clone(), claim.generation());
            let store = store.clone();
            tasks.push(tokio::spawn(async move { store.append_event(&batch, event).await.expect("fenced append") }));
        }
        for task in tasks {
            task.await.expect("append task");
        }
        recorded += pass;
        samples.push(t.elapsed());
    }
    (recorded, start.elapsed(), samples)
}

/// Where the sboi benchmark caches its million-batch store.
fn catch_up_store() -> PathBuf {
    if let Ok(path) = std::env::var("AUTOCOMP_BENCH_CATCH_UP_STORE") {
        return PathBuf::from(path);
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"));
    target.join("bench-data/sboi-store-1000000.db")
}

/// How a catch-up reads a feed page's batches.
#[derive(Clone, Copy, PartialEq)]
enum CatchUpRead {
    /// `get_summaries`: one row per batch, its summary kept by the store (what the engine reads).
    Summaries,
    /// `get_batches`, set-based: whole logs, three statements per page.
    SetBased,
    /// `get_batches` one by one: three statements per batch.
    OneByOne,
}

/// Reads the whole change feed as the index engine's catch-up does: a page of `changes`,
/// then its batches. Returns (batches, events, elapsed); `events` counts the effective
/// events (all a summary has), whichever way the batches were read.
async fn catch_up_read(store: &SqliteStore, how: CatchUpRead) -> (usize, usize, Duration) {
    let (mut batches, mut events, mut since) = (0, 0, Seq::ZERO);
    let (start, cpu_start) = (Instant::now(), cpu_time());
    loop {
        let page = store.changes(since, CATCH_UP_PAGE).await.expect("changes");
        if page.changes.is_empty() {
            break;
        }
        let ids: Vec<BatchId> = page.changes.into_iter().map(|(_, id)| id).collect();
        let effective = match how {
            CatchUpRead::Summaries => {
                let read = store.get_summaries(&ids).await.expect("get_summaries");
                batches += read.len();
                read.iter().map(|batch| batch.effective.len()).sum::<usize>()
            }
            CatchUpRead::SetBased | CatchUpRead::OneByOne => {
                let read = if how == CatchUpRead::OneByOne {
                    store.get_batches_one_by_one(&ids).await
                } else {
                    store.get_batches(&ids).await
                };
                let read = read.expect("get_batches");
                batches += read.len();
                read.iter().map(|batch| batch.effective().len()).sum::<usize>()
            }
        };
        events += effective;
        since = page.next;
    }
    let elapsed = start.elapsed();
    if let (Some(before), Some(after)) = (cpu_start, cpu_time()) {
        let cpu = after.saturating_sub(before);
        let how = match how {
            CatchUpRead::Summaries => "summaries",
            CatchUpRead::SetBased => "set-based",
            CatchUpRead::OneByOne => "one by one",
        };
        eprintln!(
            "catch-up read, {how}: {:.1} s wall, {:.1} s CPU, {:.1} µs CPU per batch",
            elapsed.as_secs_f64(),
            cpu.as_secs_f64(),
            cpu.as_secs_f64() * 1e6 / batches.max(1) as f64
        );
    }
    (batches, events, elapsed)
}

/// CPU time this process has used (user + system), from `/proc/self/stat`: on a machine
/// shared with other work, CPU per batch compares the two reads better than wall time.
fn cpu_time() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which may hold spaces) start at field 3 (state).
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(Duration::from_secs_f64(ticks as f64 / 100.0)) // USER_HZ is 100 on Linux
}

/// The three reads answer the same batches, in the same order, for a sample of feed pages.
async fn same_answers(store: &SqliteStore, pages: usize) {
    let same_time = |mut batches: Vec<Batch>| {
        for batch in &mut batches {
            batch.as_of = Timestamp(0);
        }
        batches
    };
    let mut since = Seq::ZERO;
    for page_number in 0..pages {
        let page = store.changes(since, CATCH_UP_PAGE).await.expect("changes");
        if page.changes.is_empty() {
            return;
        }
        let mut ids: Vec<BatchId> = page.changes.into_iter().map(|(_, id)| id).collect();
        ids.reverse(); // not the feed's order: the order asked must hold
        ids.push(BatchId::new("B-not-there").expect("valid"));
        let set = same_time(store.get_batches(&ids).await.expect("get_batches"));
        let one_by_one = same_time(store.get_batches_one_by_one(&ids).await.expect("get_batches"));
        assert_eq!(set.len(), ids.len() - 1, "page {page_number}: the unknown id is left out");
        assert!(set == one_by_one, "page {page_number}: the set-based read answers as the per-batch one");
        let summaries = store.get_summaries(&ids).await.expect("get_summaries");
        let expected: Vec<BatchSummary> = set.iter().map(BatchSummary::of).collect();
        assert!(summaries == expected, "page {page_number}: the kept summaries are those of the whole batches");
        since = page.next;
        for _ in 0..20 {
            since = store.changes(since, CATCH_UP_PAGE).await.expect("changes").next; // spread the sample
        }
    }
}

/// Pulls the data set into the page cache, so neither read pays for the disk.
fn warm(path: &Path) -> std::io::Result<u64> {
    let mut file = std::fs::File::open(path)?;
    std::io::copy(&mut file, &mut std::io::sink())
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

    if config.runs("fsync") {
        eprintln!("fsync probe ...");
        for all in [false, true] {
            rows.push(fsync_rate(dir.path(), config.budget(FSYNC_SECS), all).expect("fsync probe"));
        }
    }

    // 1. Single-event appends, FULL and NORMAL side by side, each on its own file.
    for synchronous in [Synchronous::Full, Synchronous::Normal].into_iter().filter(|_| config.runs("appends")) {
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
    for synchronous in [Synchronous::Full, Synchronous::Normal].into_iter().filter(|_| config.runs("fenced")) {
        eprintln!("fenced claim + append, synchronous={} ...", label(synchronous));
        let path = dir.path().join(format!("fenced-{}.db", label(synchronous).to_lowercase()));
        let (store, ids) = prepared_store(&path, synchronous, batches).await;
        let (n, elapsed, mut samples) = fenced_appends(&store, &ids, &words, config.count(FENCED, 10), budget).await;
        let metric = format!("claim + fenced append (2 tx), {}", label(synchronous));
        rows.push(Row::new(metric, n, elapsed, "events/s").latencies(&mut samples));
    }

    // A pass's path: one claim_many, then the results concurrently (p50 / p99: per pass).
    for pass in PASS_SIZES.into_iter().filter(|_| config.runs("claim_many")) {
        eprintln!("claim_many of {pass} + {pass} concurrent fenced appends, synchronous=FULL ...");
        let path = dir.path().join(format!("claim-many-{pass}.db"));
        let (store, ids) = prepared_store(&path, Synchronous::Full, batches.max(pass)).await;
        claim_many_passes(&store, &ids, &words, pass, pass, budget).await; // warm-up
        let (n, elapsed, mut samples) =
            claim_many_passes(&store, &ids, &words, pass, config.count(FENCED, pass), budget).await;
        let metric = format!("claim_many of {pass} + {pass} concurrent fenced appends, FULL");
        rows.push(Row::new(metric, n, elapsed, "events/s").latencies(&mut samples));
    }

    // Two connections on one file.
    for synchronous in [Synchronous::Full, Synchronous::Normal].into_iter().filter(|_| config.runs("writers")) {
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
    if config.runs("feed") {
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
    }

    // 3. The index catch-up's store read over a million batches (a smoke run skips it).
    if config.runs("catch_up") {
        let page = thousands(CATCH_UP_PAGE as f64);
        let summary_metric = format!("catch-up read, changes({page}) + get_summaries");
        let set_metric = format!("catch-up read, changes({page}) + get_batches set-based (before)");
        let old_metric = format!("catch-up read, changes({page}) + get_batches one by one (before that)");
        let path = catch_up_store();
        if config.smoke || !path.exists() {
            let why = if config.smoke {
                "smoke run".to_string()
            } else {
                format!("{} missing; `cargo bench -p autocomp-sboi --bench index` writes it", path.display())
            };
            rows.push(Row::skipped(summary_metric, why.clone()));
            rows.push(Row::skipped(set_metric, why.clone()));
            rows.push(Row::skipped(old_metric, why));
        } else {
            eprintln!("catch-up read over {} ...", path.display());
            // A data set written by an older release is upgraded once (opening it migrates).
            let upgrade = Instant::now();
            drop(SqliteStore::open(&path).await.expect("opening the data set to upgrade it"));
            eprintln!("data set opened read-write (upgraded if older) in {:.1} s", upgrade.elapsed().as_secs_f64());
            warm(&path).expect("reading the data set");
            let store = SqliteStore::open_immutable(&path).await.expect("opening the data set");
            same_answers(&store, 10).await;
            // Summaries, set-based, per batch, summaries again: the figure is the better
            // summaries pass.
            let (batches, events, first) = catch_up_read(&store, CatchUpRead::Summaries).await;
            let (set_batches, set_events, set) = catch_up_read(&store, CatchUpRead::SetBased).await;
            let (old_batches, old_events, old) = catch_up_read(&store, CatchUpRead::OneByOne).await;
            for seen in [(set_batches, set_events), (old_batches, old_events)] {
                assert_eq!(seen, (batches, events), "every read sees the same batches and effective events");
            }
            let (_, _, second) = catch_up_read(&store, CatchUpRead::Summaries).await;
            eprintln!("{} batches, {} effective events", thousands(batches as f64), thousands(events as f64));
            rows.push(Row::new(summary_metric, batches, first.min(second), "batches/s").goal(CATCH_UP_READ_GOAL));
            rows.push(Row::new(set_metric, batches, set, "batches/s"));
            rows.push(Row::new(old_metric, batches, old, "batches/s"));
        }
    }

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
