//! Benchmark of the batch index (issue #3): an index of 1,000,000 batches with ~10 events each.
//!
//! Run with `cargo bench -p autocomp-sboi --bench index`. `AUTOCOMP_BENCH_BATCHES` sets the
//! number of batches (default 1,000,000). Without the `--bench` argument that `cargo bench`
//! passes (e.g. under `cargo test --all-targets`) the binary does a tiny smoke run in a
//! temporary directory instead. Other arguments are ignored.
//!
//! 1. The store is written through the `ObjectStore` port (`SqliteStore`, `Synchronous::Normal`)
//!    with a pipeline mix: every batch has `Data_Received`, most run a 10-step pipeline with
//!    5% failures (most reset by an operator and re-run), some content changes, resets,
//!    priorities and open runs; the newest 5% are still in progress (the backlog). It is cached
//!    in `target/bench-data/sboi-store-<batches>.db`, complete once its `.done` marker exists.
//! 2. A child process (this binary, re-run with `AUTOCOMP_BENCH_CHILD=feed`) reads the whole
//!    change feed as the engine does, without indexing: the store's share of a catch-up. It also
//!    warms the page cache, so the catch-up does not measure a cold disk.
//! 3. Another child (`AUTOCOMP_BENCH_CHILD=catch-up`) catches a fresh index up from empty with
//!    `EngineOptions::default()` (or as tuned by the env, see `engine_options`); its peak RSS
//!    (VmHWM) is the catch-up's alone. Store time inside the catch-up is measured by wrapping
//!    the store in a timing `ObjectStore`.
//! 4. The parent queries the index with a typical and a selective trigger, then builds what a
//!    user would otherwise maintain, a materialized effective-state table in SQLite with the
//!    best indexes we could design, checks that both answer what `Trigger::select` answers,
//!    and times the same triggers as SQL.
//!
//! `AUTOCOMP_BENCH_CHILD=generate` only writes (or finds) the cached store and prints its path:
//! the monitor's benchmark measures its pages on the same data set.
//!
//! 5. Profiles: the store's per-batch SQL as it runs it and with SQLITE_DBCONFIG_ENABLE_QPSG,
//!    and the typical query taken apart (tantivy search, then the id lookups of its hits).

use std::cmp::Reverse;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use autocomp_model::{
    Agent, Batch, BatchId, BatchSummary, BatchType, ComponentName, Event, EventType, NewBatch, NewEvent, Outcome, Run,
    RunHolder, Seq, Timestamp, Trigger, order_key,
};
use autocomp_sboi::{BlockedBy, CatchUp, EngineOptions, IndexEngine};
use autocomp_store::{
    BatchStore, ChangePage, Claim, CreateOutcome, ObjectStore, OutboxStore, RegistryStore, SeriesStore, SqliteOptions,
    SqliteStore, SteeringStore, StoreResult, Synchronous,
};
use rusqlite::Connection;
use serde_json::{Map, Value, json};

const CATCH_UP_GOAL: f64 = 100_000.0;
const P99_GOAL_MS: f64 = 10.0;
/// Issue #16's goal for the typical trigger (`blocked_by` answered by `absent` terms).
const TYPICAL_P99_GOAL_MS: f64 = 1.0;
const RSS_GOAL_BYTES: u64 = 1 << 30;

const DEFAULT_BATCHES: usize = 1_000_000;
const SMOKE_BATCHES: usize = 1_000;
const QUERY_ITERATIONS: usize = 1_000;
const WARM_UP: usize = 50;
/// SQL variants are timed until this budget is spent (at least `MIN_SQL_RUNS` runs each).
const SQL_BUDGET: Duration = Duration::from_secs(60);
const MIN_SQL_RUNS: usize = 20;
/// Batches written per round-robin chunk during generation: their events interleave in the log.
const CHUNK: usize = 2_000;
/// Batches per `list_batches` page when materializing the SQL tables.
const LIST_PAGE: usize = 5_000;

const CHILD_MODE: &str = "AUTOCOMP_BENCH_CHILD";
const CHILD_STORE: &str = "AUTOCOMP_BENCH_STORE";
const CHILD_INDEX: &str = "AUTOCOMP_BENCH_INDEX";
const RESULT_PREFIX: &str = "BENCH-RESULT ";
/// Bumped whenever `script` changes, so a cached store of an older mix is regenerated.
const GENERATOR_VERSION: u32 = 1;

/// The pipeline steps in order, with the component that records each; then the rare manual step.
const STEPS: [(&str, &str); 11] = [
    ("Data_Received", "receiver"),
    ("Checksums_Verified", "checksum-verifier"),
    ("Structure_Checked", "structure-checker"),
    ("Metadata_Extracted", "metadata-extractor"),
    ("Data_Archived", "archiver"),
    ("Access_Copy_Created", "access-copier"),
    ("Thumbnails_Generated", "thumbnailer"),
    ("Quality_Checked", "quality-checker"),
    ("Catalog_Published", "catalog-publisher"),
    ("Notified", "notifier"),
    ("Manual_Review", "reviewer"),
];
const PIPELINE: usize = 10;
const METADATA: usize = 3;
/// Recorded by the runner: claim, then an append fenced by the claim's generation.
const ARCHIVE: usize = 4;
const PUBLISHED: usize = 8;
const MANUAL: usize = 10;
const MAIN_TYPE: &str = "RoundTrip";
const RARE_TYPE: &str = "Film";

fn main() {
    match std::env::var(CHILD_MODE).as_deref() {
        Ok("catch-up") => child(ChildMode::CatchUp),
        Ok("feed") => child(ChildMode::Feed),
        // Only the data set (cached in target/bench-data): the monitor's benchmark uses it too.
        Ok("generate") => {
            let config = Config::from_env();
            let (generated, reused) = runtime().block_on(ensure_store(&config));
            println!(
                "{RESULT_PREFIX}{}",
                serde_json::json!({"store": config.store_path(), "reused": reused, "head": generated.head})
            );
        }
        Ok(other) => panic!("unknown {CHILD_MODE}={other}"),
        Err(_) => parent(),
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime")
}

fn store_options() -> SqliteOptions {
    SqliteOptions { synchronous: Synchronous::Normal, ..SqliteOptions::default() }
}

// ---------------------------------------------------------------------------------------------
// Configuration

struct Config {
    batches: usize,
    smoke: bool,
    data_dir: PathBuf,
    iterations: usize,
    _temp: Option<tempfile::TempDir>,
}

impl Config {
    fn from_env() -> Self {
        let bench = std::env::args().skip(1).any(|arg| arg == "--bench");
        if !bench {
            let temp = tempfile::tempdir().expect("temporary directory");
            return Self {
                batches: SMOKE_BATCHES,
                smoke: true,
                data_dir: temp.path().to_path_buf(),
                iterations: 20,
                _temp: Some(temp),
            };
        }
        let batches = match std::env::var("AUTOCOMP_BENCH_BATCHES") {
            Ok(text) => match text.trim().replace('_', "").parse::<usize>() {
                Ok(n) if n >= 100 => n,
                _ => {
                    eprintln!("AUTOCOMP_BENCH_BATCHES={text:?} is not a number >= 100; using {DEFAULT_BATCHES}");
                    DEFAULT_BATCHES
                }
            },
            Err(_) => DEFAULT_BATCHES,
        };
        let target = std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| {
            let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
            manifest.parent().unwrap_or(manifest).join("target")
        });
        let data_dir = target.join("bench-data");
        std::fs::create_dir_all(&data_dir).expect("create target/bench-data");
        Self { batches, smoke: false, data_dir, iterations: QUERY_ITERATIONS, _temp: None }
    }

    fn store_path(&self) -> PathBuf {
        self.data_dir.join(format!("sboi-store-{}.db", self.batches))
    }

    fn marker_path(&self) -> PathBuf {
        self.data_dir.join(format!("sboi-store-{}.done", self.batches))
    }

    fn index_dir(&self) -> PathBuf {
        self.data_dir.join(format!("sboi-index-{}", self.batches))
    }

    fn sql_path(&self) -> PathBuf {
        self.data_dir.join(format!("sboi-sql-{}.db", self.batches))
    }
}

// ---------------------------------------------------------------------------------------------
// Data generation

/// splitmix64: deterministic, so a batch's history depends only on its number.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0xA076_1D64_78BD_642F))
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn chance(&mut self, p: f64) -> bool {
        ((self.next() >> 11) as f64 / (1u64 << 53) as f64) < p
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// One write of a batch's history.
enum Op {
    Create {
        priority: i32,
        rare: bool,
    },
    Append {
        step: usize,
        success: bool,
        duration_ms: u64,
    },
    /// The runner's path: claim, then an append in that run.
    RunAppend {
        step: usize,
        success: bool,
        duration_ms: u64,
    },
    Reset {
        steps: Vec<usize>,
    },
    ContentChange,
    Prioritize(i32),
    /// A claim still open (a component is working on the batch right now).
    OpenClaim {
        step: usize,
    },
}

fn priority(rng: &mut Rng) -> i32 {
    [1, 2, 5, -1][rng.below(4) as usize]
}

/// The history of batch `n` of `total`: the newest 5% are the backlog, still in progress.
fn script(n: usize, total: usize) -> Vec<Op> {
    let mut rng = Rng::new(n as u64 + 1);
    let mut ops = Vec::with_capacity(16);
    let initial = if rng.chance(0.01) { priority(&mut rng) } else { 0 };
    ops.push(Op::Create { priority: initial, rare: rng.chance(0.02) });
    ops.push(Op::Append { step: 0, success: true, duration_ms: 200 + rng.below(2_000) });
    if rng.chance(0.0025) {
        ops.push(Op::Append { step: MANUAL, success: true, duration_ms: 60_000 + rng.below(600_000) });
    }
    let backlog = n >= total - total / 20;
    let depth = if backlog { 1 + rng.below(PIPELINE as u64 - 1) as usize } else { PIPELINE };
    let mut stopped = false;
    for step in 1..depth {
        let success = rng.chance(0.95);
        let duration_ms = 100 + rng.below(30_000);
        ops.push(if step == ARCHIVE {
            Op::RunAppend { step, success, duration_ms }
        } else {
            Op::Append { step, success, duration_ms }
        });
        if !success {
            if !rng.chance(0.7) {
                stopped = true;
                break;
            }
            // An operator resets the failed step and it runs again.
            ops.push(Op::Reset { steps: vec![step] });
            let success = rng.chance(0.9);
            ops.push(Op::Append { step, success, duration_ms });
            if !success {
                stopped = true;
                break;
            }
        }
    }
    if !backlog && !stopped {
        if rng.chance(0.03) {
            // Re-delivery: the content changed, metadata is extracted again.
            ops.push(Op::ContentChange);
            ops.push(Op::Append { step: METADATA, success: true, duration_ms: 100 + rng.below(5_000) });
        }
        if rng.chance(0.01) {
            ops.push(Op::Reset { steps: vec![PUBLISHED, PUBLISHED + 1] });
            ops.push(Op::Append { step: PUBLISHED, success: true, duration_ms: 100 + rng.below(5_000) });
            ops.push(Op::Append { step: PUBLISHED + 1, success: true, duration_ms: 100 + rng.below(5_000) });
        }
    }
    if backlog && !stopped && rng.chance(0.1) {
        ops.push(Op::OpenClaim { step: depth });
    }
    if rng.chance(0.005) {
        ops.push(Op::Prioritize(priority(&mut rng)));
    }
    ops
}

fn lanes() -> usize {
    std::env::var("AUTOCOMP_BENCH_LANES").ok().and_then(|l| l.parse().ok()).unwrap_or(4).max(1)
}

fn batch_id(n: usize, rare: bool) -> BatchId {
    BatchId::new(format!("B{n:09}-{}", if rare { "FILM" } else { "RT" })).expect("valid batch id")
}

struct Names {
    events: Vec<EventType>,
    components: Vec<ComponentName>,
    agents: Vec<Agent>,
    operator: Agent,
    holder: RunHolder,
    main_type: BatchType,
    rare_type: BatchType,
}

impl Names {
    fn new() -> Self {
        let agent = |component: &str| Agent::new(format!("{component}/1.4.2@worker-3#4242")).expect("agent");
        Self {
            events: STEPS.iter().map(|(event, _)| EventType::new(*event).expect("event type")).collect(),
            components: STEPS.iter().map(|(_, c)| ComponentName::new(*c).expect("component")).collect(),
            agents: STEPS.iter().map(|(_, c)| agent(c)).collect(),
            operator: Agent::new("operator:bench").expect("agent"),
            holder: RunHolder {
                agent: agent("archiver"),
                host: "worker-3".into(),
                pid: 4242,
                claim_key: None,
                liveness: None,
            },
            main_type: BatchType::new(MAIN_TYPE).expect("batch type"),
            rare_type: BatchType::new(RARE_TYPE).expect("batch type"),
        }
    }

    fn details(step: usize, success: bool, duration_ms: u64) -> Value {
        if success {
            json!({"outcome": "success", "duration_ms": duration_ms, "summary": format!("{} ok", STEPS[step].0)})
        } else {
            json!({
                "outcome": "failure",
                "duration_ms": duration_ms,
                "failures": [{
                    "reference": "pages/0042.tif",
                    "type": "mismatch",
                    "description": format!("{} failed on 1 file", STEPS[step].0),
                    "details": {}
                }],
                "failures_cap": 100,
                // About a third of the failures are transient (a timeout, a busy service).
                "transient": duration_ms.is_multiple_of(3)
            })
        }
    }
}

#[derive(Default, Clone, Copy)]
struct Written {
    events: u64,
    transactions: u64,
}

async fn apply(store: &SqliteStore, names: &Names, id: &BatchId, op: &Op) -> StoreResult<Written> {
    let outcome = |success: bool| if success { Outcome::Success } else { Outcome::Failure };
    Ok(match op {
        Op::Create { priority, rare } => {
            let batch_type = if *rare { &names.rare_type } else { &names.main_type };
            let new = NewBatch::new(id.clone(), batch_type.clone())
                .with_priority(*priority)
                .with_location(format!("/data/incoming/{id}"));
            store.create_batch(new).await?;
            Written { events: 0, transactions: 1 }
        }
        Op::Append { step, success, duration_ms } => {
            let event = NewEvent::new(names.events[*step].clone(), outcome(*success), names.agents[*step].clone())
                .with_details(Names::details(*step, *success, *duration_ms));
            store.append_event(id, event).await?;
            Written { events: 1, transactions: 1 }
        }
        Op::RunAppend { step, success, duration_ms } => {
            let claim = store.claim(id, &names.components[*step], &names.holder).await?;
            let event = NewEvent::new(names.events[*step].clone(), outcome(*success), names.agents[*step].clone())
                .with_details(Names::details(*step, *success, *duration_ms))
                .in_run(names.components[*step].clone(), claim.generation());
            store.append_event(id, event).await?;
            Written { events: 1, transactions: 2 }
        }
        Op::Reset { steps } => {
            let types = steps.iter().map(|s| names.events[*s].clone()).collect();
            let details = json!({"reason": "re-run after inspection", "operator": "bench"});
            store.append_event(id, NewEvent::reset(types, names.operator.clone(), details)).await?;
            Written { events: 1, transactions: 1 }
        }
        Op::ContentChange => {
            let mut patch = Map::new();
            patch.insert("redelivered".into(), json!(true));
            store.record_content_change(id, patch).await?;
            Written { events: 0, transactions: 1 }
        }
        Op::Prioritize(priority) => {
            store.set_priority(id, *priority).await?;
            Written { events: 0, transactions: 1 }
        }
        Op::OpenClaim { step } => {
            store.claim(id, &names.components[*step], &names.holder).await?;
            Written { events: 0, transactions: 1 }
        }
    })
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Generated {
    generator: u32,
    batches: usize,
    events: u64,
    transactions: u64,
    seconds: f64,
    head: i64,
    store_bytes: u64,
}

/// Writes the store through the port, or reuses the cached one.
async fn ensure_store(config: &Config) -> (Generated, bool) {
    let (path, marker) = (config.store_path(), config.marker_path());
    if path.exists()
        && let Ok(text) = std::fs::read_to_string(&marker)
        && let Ok(generated) = serde_json::from_str::<Generated>(&text)
        && generated.generator == GENERATOR_VERSION
        && generated.batches == config.batches
    {
        eprintln!("reusing the store {} (generated in {:.0} s)", path.display(), generated.seconds);
        return (generated, true);
    }
    for suffix in ["", "-wal", "-shm"] {
        let stale = PathBuf::from(format!("{}{suffix}", path.display()));
        if stale.exists() {
            std::fs::remove_file(&stale).expect("remove an incomplete store");
        }
    }
    eprintln!("generating {} batches into {} ...", config.batches, path.display());
    let store = SqliteStore::open_with(&path, store_options()).await.expect("open the store");
    let names = Arc::new(Names::new());
    let start = Instant::now();
    let mut total = Written::default();
    let mut last_report = Instant::now();
    for chunk_start in (0..config.batches).step_by(CHUNK) {
        let chunk_end = (chunk_start + CHUNK).min(config.batches);
        let work: Vec<(BatchId, Vec<Op>)> = (chunk_start..chunk_end)
            .map(|n| {
                let ops = script(n, config.batches);
                let rare = matches!(ops[0], Op::Create { rare: true, .. });
                (batch_id(n, rare), ops)
            })
            .collect();
        // Round-robin over the chunk: a batch's events are spread over the log, as in a pipeline.
        // Several lanes share the one connection: while one waits for SQLite, another is queued.
        let lanes = lanes();
        let mut work: Vec<Vec<(BatchId, Vec<Op>)>> = {
            let mut split: Vec<Vec<_>> = (0..lanes).map(|_| Vec::new()).collect();
            for (i, item) in work.into_iter().enumerate() {
                split[i % lanes].push(item);
            }
            split
        };
        let mut tasks = tokio::task::JoinSet::new();
        for lane in work.drain(..) {
            let (store, names) = (store.clone(), Arc::clone(&names));
            tasks.spawn(async move {
                let mut written = Written::default();
                let rounds = lane.iter().map(|(_, ops)| ops.len()).max().unwrap_or(0);
                for round in 0..rounds {
                    for (id, ops) in &lane {
                        if let Some(op) = ops.get(round) {
                            let w = apply(&store, &names, id, op).await.expect("write to the store");
                            written.events += w.events;
                            written.transactions += w.transactions;
                        }
                    }
                }
                written
            });
        }
        while let Some(written) = tasks.join_next().await {
            let written = written.expect("lane task");
            total.events += written.events;
            total.transactions += written.transactions;
        }
        if last_report.elapsed() >= Duration::from_secs(15) || chunk_end == config.batches {
            last_report = Instant::now();
            let secs = start.elapsed().as_secs_f64();
            let rate = chunk_end as f64 / secs;
            eprintln!(
                "  {chunk_end}/{} batches, {} events, {:.0} transactions/s, {:.0} s elapsed, ~{:.0} s left",
                config.batches,
                total.events,
                total.transactions as f64 / secs,
                secs,
                (config.batches - chunk_end) as f64 / rate
            );
        }
    }
    let head = store.head().await.expect("head").0;
    drop(store);
    let generated = Generated {
        generator: GENERATOR_VERSION,
        batches: config.batches,
        events: total.events,
        transactions: total.transactions,
        seconds: start.elapsed().as_secs_f64(),
        head,
        store_bytes: file_size(&path),
    };
    if !config.smoke {
        std::fs::write(&marker, serde_json::to_string_pretty(&generated).expect("json")).expect("write the marker");
    }
    (generated, false)
}

fn file_size(path: &Path) -> u64 {
    let with = |suffix: &str| std::fs::metadata(format!("{}{suffix}", path.display())).map(|m| m.len()).unwrap_or(0);
    with("") + with("-wal")
}

fn dir_size(dir: &Path) -> u64 {
    let mut total = 0;
    for entry in std::fs::read_dir(dir).expect("read the index directory").flatten() {
        let meta = entry.metadata().expect("metadata");
        total += if meta.is_dir() { dir_size(&entry.path()) } else { meta.len() };
    }
    total
}

// ---------------------------------------------------------------------------------------------
// Children: the store's share of a catch-up, and the catch-up itself

#[derive(Clone, Copy)]
enum ChildMode {
    Feed,
    CatchUp,
}

#[derive(serde::Serialize, serde::Deserialize, Default)]
struct ChildReport {
    batches: usize,
    events: u64,
    seconds: f64,
    /// Time spent inside store calls (changes + get_summaries).
    store_seconds: f64,
    cpu_seconds: f64,
    peak_rss_bytes: u64,
    index_bytes: u64,
    docs: u64,
    options: String,
}

/// An `ObjectStore` that times every call into the real one.
struct TimedStore<S> {
    inner: S,
    nanos: AtomicU64,
}

impl<S> TimedStore<S> {
    async fn timed<T>(&self, work: impl Future<Output = T>) -> T {
        let start = Instant::now();
        let result = work.await;
        self.nanos.fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
        result
    }

    fn seconds(&self) -> f64 {
        self.nanos.load(Ordering::Relaxed) as f64 / 1e9
    }
}

#[async_trait]
impl<S: ObjectStore> BatchStore for TimedStore<S> {
    async fn create_batch(&self, batch: NewBatch) -> StoreResult<CreateOutcome> {
        self.timed(self.inner.create_batch(batch)).await
    }

    async fn register_batch(&self, batch: NewBatch, first: NewEvent) -> StoreResult<CreateOutcome> {
        self.timed(self.inner.register_batch(batch, first)).await
    }

    async fn get_batch(&self, id: &BatchId) -> StoreResult<Batch> {
        self.timed(self.inner.get_batch(id)).await
    }

    async fn get_batches(&self, ids: &[BatchId]) -> StoreResult<Vec<Batch>> {
        self.timed(self.inner.get_batches(ids)).await
    }

    async fn list_batches(&self, after: Option<&BatchId>, limit: usize) -> StoreResult<Vec<Batch>> {
        self.timed(self.inner.list_batches(after, limit)).await
    }

    async fn get_summaries(&self, ids: &[BatchId]) -> StoreResult<Vec<BatchSummary>> {
        self.timed(self.inner.get_summaries(ids)).await
    }

    async fn list_summaries(&self, after: Option<&BatchId>, limit: usize) -> StoreResult<Vec<BatchSummary>> {
        self.timed(self.inner.list_summaries(after, limit)).await
    }

    async fn set_priority(&self, id: &BatchId, priority: i32) -> StoreResult<Seq> {
        self.timed(self.inner.set_priority(id, priority)).await
    }

    async fn record_content_change(&self, id: &BatchId, patch: Map<String, Value>) -> StoreResult<Seq> {
        self.timed(self.inner.record_content_change(id, patch)).await
    }

    async fn append_event(&self, batch: &BatchId, event: NewEvent) -> StoreResult<Event> {
        self.timed(self.inner.append_event(batch, event)).await
    }

    async fn claim(&self, batch: &BatchId, component: &ComponentName, holder: &RunHolder) -> StoreResult<Claim> {
        self.timed(self.inner.claim(batch, component, holder)).await
    }

    async fn release(&self, batch: &BatchId, component: &ComponentName, generation: i64) -> StoreResult<()> {
        self.timed(self.inner.release(batch, component, generation)).await
    }

    async fn save_checkpoint(
        &self,
        batch: &BatchId,
        component: &ComponentName,
        generation: i64,
        data: Value,
    ) -> StoreResult<()> {
        self.timed(self.inner.save_checkpoint(batch, component, generation, data)).await
    }

    async fn load_checkpoint(&self, batch: &BatchId, component: &ComponentName) -> StoreResult<Option<Value>> {
        self.timed(self.inner.load_checkpoint(batch, component)).await
    }

    async fn open_runs(&self, component: Option<&ComponentName>) -> StoreResult<Vec<Run>> {
        self.timed(self.inner.open_runs(component)).await
    }

    async fn failed_attempts(&self, batch: &BatchId, component: &ComponentName, since: Seq) -> StoreResult<u32> {
        self.timed(self.inner.failed_attempts(batch, component, since)).await
    }

    async fn changes(&self, since: Seq, limit: usize) -> StoreResult<ChangePage> {
        self.timed(self.inner.changes(since, limit)).await
    }

    async fn head(&self) -> StoreResult<Seq> {
        self.timed(self.inner.head()).await
    }

    async fn about(&self) -> StoreResult<autocomp_store::StoreAbout> {
        self.inner.about().await
    }
}

#[async_trait]
impl<S: ObjectStore> RegistryStore for TimedStore<S> {
    async fn record_pass(&self, pass: autocomp_model::PassRecord) -> StoreResult<()> {
        self.inner.record_pass(pass).await
    }

    async fn components(&self) -> StoreResult<Vec<autocomp_model::RegisteredComponent>> {
        self.inner.components().await
    }

    async fn retire_component(
        &self,
        name: &ComponentName,
        by: &Agent,
        reason: &str,
    ) -> StoreResult<autocomp_model::RegisteredComponent> {
        self.inner.retire_component(name, by, reason).await
    }
}

#[async_trait]
impl<S: ObjectStore> SteeringStore for TimedStore<S> {
    async fn steering(&self) -> StoreResult<autocomp_model::Steering> {
        self.inner.steering().await
    }

    async fn steer(&self, request: autocomp_model::SteeringRequest) -> StoreResult<autocomp_store::Steered> {
        self.inner.steer(request).await
    }

    async fn steering_log(&self, limit: usize) -> StoreResult<Vec<autocomp_model::SteeringEntry>> {
        self.inner.steering_log(limit).await
    }
}

#[async_trait]
impl<S: ObjectStore> OutboxStore for TimedStore<S> {
    async fn enqueue_notices(
        &self,
        notices: Vec<autocomp_store::NewNotice>,
        cursor: Option<autocomp_store::CursorMove>,
    ) -> StoreResult<autocomp_store::Enqueued> {
        self.inner.enqueue_notices(notices, cursor).await
    }

    async fn take_notices(
        &self,
        holder: &str,
        limit: usize,
        lease: Duration,
    ) -> StoreResult<Vec<autocomp_store::Notice>> {
        self.inner.take_notices(holder, limit, lease).await
    }

    async fn settle_notice(&self, key: &str, holder: &str, outcome: autocomp_store::NoticeOutcome) -> StoreResult<()> {
        self.inner.settle_notice(key, holder, outcome).await
    }

    async fn recent_notices(&self, limit: usize) -> StoreResult<Vec<autocomp_store::Notice>> {
        self.inner.recent_notices(limit).await
    }
}

#[async_trait]
impl<S: ObjectStore> SeriesStore for TimedStore<S> {
    async fn work_series(
        &self,
        step: autocomp_model::SeriesStep,
        since: Timestamp,
        component: Option<&ComponentName>,
    ) -> StoreResult<Vec<autocomp_model::WorkPoint>> {
        self.inner.work_series(step, since, component).await
    }

    async fn record_backlog(&self, samples: Vec<autocomp_model::BacklogSample>) -> StoreResult<()> {
        self.inner.record_backlog(samples).await
    }
}

#[async_trait::async_trait]
impl<S: ObjectStore> autocomp_store::RunOutputStore for TimedStore<S> {
    async fn set_run_output(
        &self,
        batch: &BatchId,
        component: &ComponentName,
        generation: i64,
        output: Option<autocomp_model::RunOutput>,
        whole: bool,
    ) -> StoreResult<()> {
        self.inner.set_run_output(batch, component, generation, output, whole).await
    }

    async fn run_outputs(&self, batch: &BatchId) -> StoreResult<Vec<autocomp_store::SavedRunOutput>> {
        self.inner.run_outputs(batch).await
    }
}

#[async_trait::async_trait]
impl<S: ObjectStore> autocomp_store::RetentionStore for TimedStore<S> {
    async fn histories(&self, ids: &[BatchId]) -> StoreResult<Vec<autocomp_store::BatchHistory>> {
        self.inner.histories(ids).await
    }

    async fn prune_histories(
        &self,
        tickets: Vec<autocomp_store::PruneTicket>,
    ) -> StoreResult<Vec<autocomp_store::PruneAnswer>> {
        self.inner.prune_histories(tickets).await
    }

    async fn restore_histories(
        &self,
        histories: Vec<autocomp_store::BatchHistory>,
    ) -> StoreResult<Vec<autocomp_store::RestoreAnswer>> {
        self.inner.restore_histories(histories).await
    }
}

fn proc_status_kib(key: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status.lines().find_map(|line| line.strip_prefix(key)?.trim().strip_suffix("kB")?.trim().parse().ok()).unwrap_or(0)
}

/// User + system CPU time of this process (all threads), from /proc (USER_HZ = 100).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the parenthesized command name; utime and stime are fields 14 and 15.
    let rest = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or("");
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok()).unwrap_or(0);
    (ticks(11) + ticks(12)) as f64 / 100.0
}

fn child(mode: ChildMode) {
    let store_path = PathBuf::from(std::env::var(CHILD_STORE).expect("store path"));
    let report = runtime().block_on(async {
        let store = SqliteStore::open_with(&store_path, store_options()).await.expect("open the store");
        let store = TimedStore { inner: store, nanos: AtomicU64::new(0) };
        match mode {
            ChildMode::Feed => read_feed(&store).await,
            ChildMode::CatchUp => catch_up_fresh(&store).await,
        }
    });
    let report = ChildReport { cpu_seconds: cpu_seconds(), peak_rss_bytes: proc_status_kib("VmHWM:") * 1024, ..report };
    println!("{RESULT_PREFIX}{}", serde_json::to_string(&report).expect("json"));
}

/// What the engine reads from the store during a catch-up, without the indexing.
async fn read_feed(store: &TimedStore<SqliteStore>) -> ChildReport {
    let page_size = engine_options().page_size;
    let start = Instant::now();
    let (mut cursor, mut batches, mut events) = (Seq::ZERO, 0, 0);
    loop {
        let page = store.changes(cursor, page_size).await.expect("changes");
        if page.changes.is_empty() {
            break;
        }
        let ids: Vec<BatchId> = page.changes.into_iter().map(|(_, id)| id).collect();
        for batch in store.get_summaries(&ids).await.expect("get_summaries") {
            batches += 1;
            events += batch.effective.len() as u64;
        }
        cursor = page.next;
    }
    ChildReport {
        batches,
        events,
        seconds: start.elapsed().as_secs_f64(),
        store_seconds: store.seconds(),
        options: format!("page_size {page_size}"),
        ..ChildReport::default()
    }
}

async fn catch_up_fresh(store: &TimedStore<SqliteStore>) -> ChildReport {
    let dir = PathBuf::from(std::env::var(CHILD_INDEX).expect("index dir"));
    let options = engine_options();
    let described = format!("{options:?}");
    let engine = IndexEngine::open_with(&dir, options).expect("open the index");
    let start = Instant::now();
    let outcome = engine.catch_up(store).await.expect("catch up");
    let seconds = start.elapsed().as_secs_f64();
    let CatchUp::Applied { batches, .. } = outcome else { panic!("a fresh index should apply the feed: {outcome:?}") };
    ChildReport {
        batches,
        seconds,
        store_seconds: store.seconds(),
        index_bytes: dir_size(&dir),
        docs: engine.num_docs().expect("num_docs"),
        options: described,
        ..ChildReport::default()
    }
}

/// `EngineOptions::default()`, or tuned through `AUTOCOMP_BENCH_PAGE_SIZE`,
/// `AUTOCOMP_BENCH_COMMIT_EVERY`, `AUTOCOMP_BENCH_WRITER_THREADS`, `AUTOCOMP_BENCH_WRITER_MIB`.
fn engine_options() -> EngineOptions {
    let var = |name: &str| std::env::var(name).ok().and_then(|v| v.trim().parse::<usize>().ok());
    let defaults = EngineOptions::default();
    EngineOptions {
        page_size: var("AUTOCOMP_BENCH_PAGE_SIZE").unwrap_or(defaults.page_size),
        commit_every: var("AUTOCOMP_BENCH_COMMIT_EVERY").unwrap_or(defaults.commit_every),
        writer_threads: var("AUTOCOMP_BENCH_WRITER_THREADS").unwrap_or(defaults.writer_threads),
        writer_memory_bytes: var("AUTOCOMP_BENCH_WRITER_MIB").map_or(defaults.writer_memory_bytes, |mib| mib << 20),
        ..defaults
    }
}

fn run_child(mode: &str, config: &Config) -> ChildReport {
    let output = Command::new(std::env::current_exe().expect("current exe"))
        .env(CHILD_MODE, mode)
        .env(CHILD_STORE, config.store_path())
        .env(CHILD_INDEX, config.index_dir())
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .expect("run the child process");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "child {mode} failed: {}\n{stdout}", output.status);
    let line = stdout.lines().find_map(|line| line.strip_prefix(RESULT_PREFIX)).expect("the child's result line");
    serde_json::from_str(line).expect("the child's result")
}

// ---------------------------------------------------------------------------------------------
// Profiles: where a catch-up and a query spend their time

/// The statements the store's `load_batch` runs per batch (store/src/sqlite/ops.rs).
const LOAD_BATCH_SQL: [&str; 3] = [
    "SELECT type, priority, metadata, created_seq, modified_seq, changed_seq, created_at, modified_at
     FROM batches WHERE id = ?1",
    "SELECT seq, batch_id, type, outcome, agent, at, details, run_component, run_generation, resets
     FROM events WHERE batch_id = ?1 ORDER BY seq",
    "SELECT batch_id, component, generation, agent, host, pid, started_at, claim_seq, state, ended_at, transient
     FROM runs WHERE batch_id = ?1 AND state = 'open' ORDER BY batch_id, component, generation",
];
const PROFILE_SAMPLE: usize = 20_000;

struct LoadProfile {
    micros_per_batch: f64,
    reprepared: f64,
}

/// Runs `load_batch`'s statements for the first batches of the feed on a raw connection,
/// as the store does (cached statements), with or without SQLITE_DBCONFIG_ENABLE_QPSG.
fn profile_batch_load(store_path: &Path, qpsg: bool) -> LoadProfile {
    use rusqlite::{OpenFlags, StatementStatus, config::DbConfig};
    let conn = Connection::open_with_flags(store_path, OpenFlags::SQLITE_OPEN_READ_ONLY).expect("open the store");
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, qpsg).expect("qpsg");
    let ids: Vec<String> = conn
        .prepare("SELECT id FROM batches ORDER BY changed_seq LIMIT ?1")
        .and_then(|mut s| s.query_map([PROFILE_SAMPLE as i64], |row| row.get(0))?.collect())
        .expect("ids");
    let run = || {
        let start = Instant::now();
        for id in &ids {
            for sql in LOAD_BATCH_SQL {
                let mut statement = conn.prepare_cached(sql).expect("prepare");
                let mut rows = statement.query([id]).expect("query");
                while let Some(row) = rows.next().expect("step") {
                    std::hint::black_box(row.get_ref(0).expect("column"));
                }
            }
        }
        start.elapsed()
    };
    run();
    let elapsed = run();
    let executions = 2 * ids.len() * LOAD_BATCH_SQL.len();
    let reprepared: i32 = LOAD_BATCH_SQL
        .iter()
        .map(|sql| conn.prepare_cached(sql).expect("prepare").get_status(StatementStatus::RePrepare))
        .sum();
    LoadProfile {
        micros_per_batch: elapsed.as_secs_f64() * 1e6 / ids.len().max(1) as f64,
        reprepared: reprepared as f64 / executions.max(1) as f64,
    }
}

struct Profiles {
    load_as_store: LoadProfile,
    load_qpsg: LoadProfile,
    query: QueryProfile,
}

struct QueryProfile {
    search: Latencies,
    ids_fast_column: Latencies,
    ids_stored: Latencies,
}

/// The typical trigger's tantivy work taken apart: the search itself (the query
/// `sboi/src/query.rs` builds, ordered top 100), then reading the 100 ids as `ids_of` does
/// (the `id` fast column, one `ord_to_str` per hit) or from the stored documents.
fn profile_query(index_dir: &Path, trigger: &Trigger, iterations: usize) -> QueryProfile {
    use tantivy::collector::TopDocs;
    use tantivy::collector::sort_key::SortByStaticFastValue;
    use tantivy::query::{AllQuery, BooleanQuery, Occur, Query, TermQuery};
    use tantivy::schema::{IndexRecordOption, Value as _};
    use tantivy::{Index, Order, TantivyDocument, Term};

    let index = Index::open_in_dir(index_dir).expect("open the index");
    let schema = index.schema();
    let field = |name: &str| schema.get_field(name).expect("field");
    let reader = index.reader().expect("reader");
    let searcher = reader.searcher();
    let term = |name: &str, text: &str| -> Box<dyn Query> {
        Box::new(TermQuery::new(Term::from_field_text(field(name), text), IndexRecordOption::Basic))
    };
    let query = || {
        let mut clauses: Vec<(Occur, Box<dyn Query>)> = vec![(Occur::Must, Box::new(AllQuery))];
        let types = trigger.types.iter().map(|t| (Occur::Should, term("type", t.as_str()))).collect();
        clauses.push((Occur::Must, Box::new(BooleanQuery::new(types))));
        clauses.extend(trigger.requires.iter().map(|t| (Occur::Must, term("succeeded", t.as_str()))));
        clauses.extend(trigger.blocked_by.iter().map(|t| (Occur::MustNot, term("present", t.as_str()))));
        BooleanQuery::new(clauses)
    };
    let limit = trigger.limit.unwrap_or(100);
    let search = || {
        let order = (
            (SortByStaticFastValue::<i64>::for_field("priority"), Order::Desc),
            (SortByStaticFastValue::<i64>::for_field("created_seq"), Order::Asc),
        );
        searcher.search(&query(), &TopDocs::with_limit(limit).order_by(order)).expect("search")
    };
    let hits: Vec<tantivy::DocAddress> = search().into_iter().map(|(_, address)| address).collect();
    let warm_up = WARM_UP.min(iterations);
    QueryProfile {
        search: Latencies::measure(iterations, warm_up, None, || search().len()),
        ids_fast_column: Latencies::measure(iterations, warm_up, None, || {
            let mut text = String::new();
            let mut total = 0;
            let mut columns = vec![None; searcher.segment_readers().len()];
            for address in &hits {
                let segment = address.segment_ord as usize;
                if columns[segment].is_none() {
                    columns[segment] =
                        searcher.segment_reader(address.segment_ord).fast_fields().str("id").expect("id");
                }
                let column: &tantivy::columnar::StrColumn = columns[segment].as_ref().expect("id column");
                let ord = column.term_ords(address.doc_id).next().expect("ord");
                text.clear();
                column.ord_to_str(ord, &mut text).expect("ord_to_str");
                total += text.len();
            }
            total
        }),
        ids_stored: Latencies::measure(iterations, warm_up, None, || {
            let mut total = 0;
            for address in &hits {
                let document: TantivyDocument = searcher.doc(*address).expect("doc");
                total += document.get_first(field("id")).and_then(|v| v.as_str()).map_or(0, str::len);
            }
            total
        }),
    }
}

// ---------------------------------------------------------------------------------------------
// Queries

struct Latencies {
    sorted: Vec<Duration>,
}

impl Latencies {
    fn measure<T>(iterations: usize, warm_up: usize, budget: Option<Duration>, mut run: impl FnMut() -> T) -> Self {
        for _ in 0..warm_up {
            std::hint::black_box(run());
        }
        let start = Instant::now();
        let mut sorted = Vec::with_capacity(iterations);
        for i in 0..iterations {
            if let Some(budget) = budget
                && i >= MIN_SQL_RUNS
                && start.elapsed() >= budget
            {
                break;
            }
            let t = Instant::now();
            std::hint::black_box(run());
            sorted.push(t.elapsed());
        }
        sorted.sort();
        Self { sorted }
    }

    fn quantile(&self, q: f64) -> Duration {
        let rank = ((self.sorted.len() as f64 * q).ceil() as usize).clamp(1, self.sorted.len());
        self.sorted[rank - 1]
    }

    fn p50(&self) -> f64 {
        ms(self.quantile(0.50))
    }

    fn p99(&self) -> f64 {
        ms(self.quantile(0.99))
    }

    fn max(&self) -> f64 {
        ms(*self.sorted.last().expect("samples"))
    }

    fn describe(&self) -> String {
        format!("{} / {} / {} ms (n={})", fmt_ms(self.p50()), fmt_ms(self.p99()), fmt_ms(self.max()), self.sorted.len())
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn fmt_ms(ms: f64) -> String {
    if ms >= 100.0 {
        format!("{ms:.0}")
    } else if ms >= 1.0 {
        format!("{ms:.2}")
    } else {
        format!("{ms:.3}")
    }
}

struct Case {
    name: &'static str,
    description: &'static str,
    trigger: Trigger,
}

fn cases() -> Vec<Case> {
    let events = |names: &[&str]| names.iter().map(|n| EventType::new(*n).expect("event type")).collect();
    vec![
        Case {
            name: "typical",
            description: "requires Data_Received + Checksums_Verified, blocked_by Structure_Checked, type RoundTrip",
            trigger: Trigger {
                requires: events(&["Data_Received", "Checksums_Verified"]),
                blocked_by: events(&["Structure_Checked"]),
                types: vec![BatchType::new(MAIN_TYPE).expect("batch type")],
                limit: Some(100),
                ..Trigger::default()
            },
        },
        Case {
            name: "selective",
            description: "requires Manual_Review (0.25% of batches), type Film (2%)",
            trigger: Trigger {
                requires: events(&["Manual_Review"]),
                types: vec![BatchType::new(RARE_TYPE).expect("batch type")],
                limit: Some(100),
                ..Trigger::default()
            },
        },
    ]
}

/// `Trigger::select` over every batch, kept incrementally: all matches and their order keys.
struct Reference {
    matches: Vec<((Reverse<i32>, i64), BatchId)>,
}

impl Reference {
    fn answer(&mut self, limit: usize) -> Vec<BatchId> {
        self.matches.sort_by_key(|(key, _)| *key);
        self.matches.iter().take(limit).map(|(_, id)| id.clone()).collect()
    }
}

// ---------------------------------------------------------------------------------------------
// The SQL alternative: a materialized effective-state table next to the batches

const SQL_SCHEMA: &str = "
    -- created_seq is unique per batch, so it doubles as the integer key.
    CREATE TABLE batches (
        seq          INTEGER PRIMARY KEY,
        id           TEXT NOT NULL,
        type         TEXT NOT NULL,
        priority     INTEGER NOT NULL,
        modified_seq INTEGER NOT NULL
    );
    -- One row per (batch, event type) of the effective view.
    CREATE TABLE effective (
        batch   INTEGER NOT NULL,
        type    TEXT NOT NULL,
        outcome TEXT NOT NULL,
        seq     INTEGER NOT NULL,
        PRIMARY KEY (batch, type)
    ) WITHOUT ROWID;
";

/// Created after the bulk load. `batches_order` walks batches of one type in trigger order
/// (the rowid `seq` is the tie-breaker, so the index covers the scan); `effective`'s primary
/// key answers the per-batch EXISTS probes; `effective_by_type` lets a rare requirement drive.
const SQL_INDEXES: &str = "
    CREATE UNIQUE INDEX batches_id ON batches (id);
    CREATE INDEX batches_order ON batches (type, priority DESC, seq);
    CREATE INDEX effective_by_type ON effective (type, outcome, batch);
    ANALYZE;
";

/// Two ways to write `requires`: a correlated EXISTS probe per candidate batch, or an IN
/// subquery the planner may drive the query from. `blocked_by` is always NOT EXISTS.
#[derive(Clone, Copy, Debug)]
enum SqlForm {
    Exists,
    In,
}

fn quote(text: &str) -> String {
    // Names are validated ([A-Za-z0-9_]); literals let the planner use the value statistics.
    format!("'{text}'")
}

fn trigger_sql(trigger: &Trigger, form: SqlForm) -> String {
    let mut clauses = Vec::new();
    if !trigger.types.is_empty() {
        let types: Vec<String> = trigger.types.iter().map(|t| quote(t.as_str())).collect();
        clauses.push(format!("b.type IN ({})", types.join(", ")));
    }
    for required in &trigger.requires {
        let required = quote(required.as_str());
        clauses.push(match form {
            SqlForm::Exists => format!(
                "EXISTS (SELECT 1 FROM effective e WHERE e.batch = b.seq AND e.type = {required} \
                 AND e.outcome = 'success')"
            ),
            SqlForm::In => {
                format!("b.seq IN (SELECT batch FROM effective WHERE type = {required} AND outcome = 'success')")
            }
        });
    }
    for blocking in &trigger.blocked_by {
        clauses.push(format!(
            "NOT EXISTS (SELECT 1 FROM effective e WHERE e.batch = b.seq AND e.type = {})",
            quote(blocking.as_str())
        ));
    }
    let unsupported = !trigger.repeat_on_change.is_empty()
        || !trigger.transiently_failed.is_empty()
        || !trigger.batches.is_empty()
        || trigger.settled_for.is_some();
    assert!(!unsupported, "the SQL translation covers requires, blocked_by, types and limit only");
    let limit = trigger.limit.map(|l| format!(" LIMIT {l}")).unwrap_or_default();
    format!("SELECT b.id FROM batches b WHERE {} ORDER BY b.priority DESC, b.seq ASC{limit}", clauses.join(" AND "))
}

/// Reads every batch through the port, fills the SQL tables and the reference answers.
async fn materialize(store: &SqliteStore, path: &Path, cases: &[Case]) -> (f64, Vec<Reference>, u64) {
    for suffix in ["", "-wal", "-shm", "-journal"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    let start = Instant::now();
    let mut conn = Connection::open(path).expect("open the SQL file");
    conn.execute_batch("PRAGMA journal_mode = WAL; PRAGMA synchronous = OFF;").expect("pragmas");
    conn.execute_batch(SQL_SCHEMA).expect("schema");
    let mut references: Vec<Reference> = cases.iter().map(|_| Reference { matches: Vec::new() }).collect();
    let mut after: Option<BatchId> = None;
    let mut count = 0usize;
    let now = Timestamp::now();
    loop {
        let page = store.list_batches(after.as_ref(), LIST_PAGE).await.expect("list_batches");
        let Some(last) = page.last() else { break };
        after = Some(last.id.clone());
        let tx = conn.transaction().expect("transaction");
        {
            let mut insert_batch = tx
                .prepare_cached(
                    "INSERT INTO batches (seq, id, type, priority, modified_seq) VALUES (?1, ?2, ?3, ?4, ?5)",
                )
                .expect("prepare");
            let mut insert_effective = tx
                .prepare_cached("INSERT INTO effective (batch, type, outcome, seq) VALUES (?1, ?2, ?3, ?4)")
                .expect("prepare");
            for batch in &page {
                insert_batch
                    .execute(rusqlite::params![
                        batch.created_seq.0,
                        batch.id.as_str(),
                        batch.batch_type.as_str(),
                        batch.priority,
                        batch.modified_seq.0
                    ])
                    .expect("insert batch");
                for event in batch.effective().iter() {
                    insert_effective
                        .execute(rusqlite::params![
                            batch.created_seq.0,
                            event.event_type.as_str(),
                            event.outcome.as_str(),
                            event.seq.0
                        ])
                        .expect("insert effective");
                }
                for (case, reference) in cases.iter().zip(&mut references) {
                    if case.trigger.matches_at(batch, now) {
                        let (priority, seq) = order_key(batch);
                        reference.matches.push(((priority, seq), batch.id.clone()));
                    }
                }
            }
        }
        tx.commit().expect("commit");
        count += page.len();
        if count % 100_000 < LIST_PAGE {
            eprintln!("  materialized {count} batches, {:.0} s", start.elapsed().as_secs_f64());
        }
    }
    conn.execute_batch(SQL_INDEXES).expect("indexes");
    drop(conn);
    (start.elapsed().as_secs_f64(), references, file_size(path))
}

fn query_plan(conn: &Connection, sql: &str) -> Vec<String> {
    let mut statement = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).expect("explain");
    statement
        .query_map([], |row| row.get::<_, String>(3))
        .expect("explain")
        .collect::<rusqlite::Result<_>>()
        .expect("explain")
}

fn run_sql(conn: &Connection, sql: &str) -> Vec<BatchId> {
    let mut statement = conn.prepare_cached(sql).expect("prepare");
    statement
        .query_map([], |row| row.get::<_, String>(0))
        .expect("query")
        .map(|id| BatchId::new(id.expect("row")).expect("batch id"))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// The run

struct CaseResult {
    name: &'static str,
    description: &'static str,
    ready: usize,
    returned: usize,
    index: Latencies,
    /// The same trigger with `blocked_by` as schema version 1 asked it (`MustNot present`
    /// under `AllQuery`), on the same index: the before of issue #16's before/after.
    index_must_not: Latencies,
    sql: Latencies,
    sql_form: SqlForm,
    other_form: (SqlForm, f64),
    plan: Vec<String>,
}

fn parent() {
    let config = Config::from_env();
    if config.smoke {
        eprintln!(
            "smoke run ({} batches); `cargo bench -p autocomp-sboi --bench index` runs the benchmark",
            config.batches
        );
    }
    let rt = runtime();
    let (generated, reused) = rt.block_on(ensure_store(&config));
    let index_dir = config.index_dir();
    if index_dir.exists() {
        std::fs::remove_dir_all(&index_dir).expect("remove the previous index");
    }

    eprintln!("reading the whole change feed (store share of a catch-up, warms the page cache) ...");
    let feed = run_child("feed", &config);
    eprintln!("  {} batches in {:.1} s", feed.batches, feed.seconds);
    eprintln!("catching up a fresh index in a child process ...");
    let catch_up = run_child("catch-up", &config);
    eprintln!("  {} batches in {:.1} s", catch_up.batches, catch_up.seconds);
    assert_eq!(catch_up.batches, config.batches, "every batch is in the feed once");
    assert_eq!(catch_up.docs as usize, config.batches, "one document per batch");

    let engine = IndexEngine::open_with(&index_dir, EngineOptions::default()).expect("open the index");
    let cases = cases();
    eprintln!("materializing the SQL alternative ...");
    let store = rt.block_on(SqliteStore::open_with(config.store_path(), store_options())).expect("open the store");
    let (materialize_secs, mut references, sql_bytes) = rt.block_on(materialize(&store, &config.sql_path(), &cases));
    let conn = Connection::open(config.sql_path()).expect("open the SQL file");

    let mut results = Vec::new();
    for (case, reference) in cases.iter().zip(&mut references) {
        let limit = case.trigger.limit.unwrap_or(usize::MAX);
        let expected = reference.answer(limit);
        let from_index = engine.query_at(&case.trigger, Timestamp::now()).expect("query");
        assert_eq!(from_index, expected, "{}: the index differs from Trigger::select", case.name);
        eprintln!("timing {} on the index ...", case.name);
        let index = Latencies::measure(config.iterations, WARM_UP.min(config.iterations), None, || {
            engine.query_at(&case.trigger, Timestamp::now()).expect("query")
        });
        let must_not = |now| engine.query_with(&case.trigger, now, BlockedBy::MustNotPresent).expect("query");
        assert_eq!(
            must_not(Timestamp::now()),
            expected,
            "{}: the MustNot form differs from Trigger::select",
            case.name
        );
        eprintln!("timing {} on the index, MustNot present form ...", case.name);
        let index_must_not =
            Latencies::measure(config.iterations, WARM_UP.min(config.iterations), None, || must_not(Timestamp::now()));
        let mut timed_forms = Vec::new();
        for form in [SqlForm::Exists, SqlForm::In] {
            let sql = trigger_sql(&case.trigger, form);
            assert_eq!(run_sql(&conn, &sql), expected, "{}: SQL ({form:?}) differs from Trigger::select", case.name);
            eprintln!("timing {} as SQL ({form:?}) ...", case.name);
            let latencies = Latencies::measure(config.iterations, 3, Some(SQL_BUDGET / 2), || run_sql(&conn, &sql));
            timed_forms.push((form, latencies, query_plan(&conn, &sql)));
        }
        timed_forms.sort_by(|a, b| a.1.p50().total_cmp(&b.1.p50()));
        let (other_form, other, _) = timed_forms.pop().expect("two forms");
        let (sql_form, sql, plan) = timed_forms.pop().expect("two forms");
        results.push(CaseResult {
            name: case.name,
            description: case.description,
            ready: reference.matches.len(),
            returned: expected.len(),
            index,
            index_must_not,
            sql,
            sql_form,
            other_form: (other_form, other.p50()),
            plan,
        });
    }

    eprintln!("profiling the store's batch loads and the typical query ...");
    let profiles = Profiles {
        load_as_store: profile_batch_load(&config.store_path(), false),
        load_qpsg: profile_batch_load(&config.store_path(), true),
        query: profile_query(&index_dir, &cases[0].trigger, config.iterations),
    };

    report(&config, &generated, reused, &feed, &catch_up, materialize_secs, sql_bytes, &results, &profiles);
}

fn mib(bytes: u64) -> String {
    format!("{:.0} MiB", bytes as f64 / (1 << 20) as f64)
}

fn met(ok: bool) -> &'static str {
    if ok { "yes" } else { "**no**" }
}

fn thousands(n: u64) -> String {
    let text = n.to_string();
    let mut out = String::new();
    for (i, c) in text.chars().enumerate() {
        if i > 0 && (text.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[allow(clippy::too_many_arguments)]
fn report(
    config: &Config,
    generated: &Generated,
    reused: bool,
    feed: &ChildReport,
    catch_up: &ChildReport,
    materialize_secs: f64,
    sql_bytes: u64,
    results: &[CaseResult],
    profiles: &Profiles,
) {
    let n = config.batches as u64;
    let rate = catch_up.batches as f64 / catch_up.seconds;
    let feed_rate = feed.batches as f64 / feed.seconds;
    let mut rows: Vec<[String; 4]> = Vec::new();
    let mut row = |metric: String, figure: String, goal: &str, ok: Option<bool>| {
        rows.push([metric, figure, goal.to_owned(), ok.map(met).unwrap_or("").to_owned()]);
    };
    row(
        format!("catch-up rate, fresh index, {} batches", thousands(n)),
        format!("{} batches/s ({:.1} s)", thousands(rate as u64), catch_up.seconds),
        ">= 100,000 batches/s",
        Some(rate >= CATCH_UP_GOAL),
    );
    row(
        "... of which inside store reads (changes + get_summaries)".into(),
        format!("{:.1} s ({:.0}%)", catch_up.store_seconds, 100.0 * catch_up.store_seconds / catch_up.seconds),
        "",
        None,
    );
    row(
        "... CPU time of the catch-up process (user + sys)".into(),
        format!("{:.1} s ({:.2} cores busy)", catch_up.cpu_seconds, catch_up.cpu_seconds / catch_up.seconds),
        "",
        None,
    );
    row(
        "store feed read alone (same pages, no indexing)".into(),
        format!("{} batches/s ({:.1} s, {:.1} s CPU)", thousands(feed_rate as u64), feed.seconds, feed.cpu_seconds),
        "",
        None,
    );
    row("index size on disk".into(), mib(catch_up.index_bytes), "", None);
    row(
        "peak RSS of the catch-up process (VmHWM)".into(),
        mib(catch_up.peak_rss_bytes),
        "<= 1 GiB",
        Some(catch_up.peak_rss_bytes <= RSS_GOAL_BYTES),
    );
    for result in results {
        let ready = format!("{} of {} ready", result.returned, thousands(result.ready as u64));
        let goal_ms = if result.name == "typical" { TYPICAL_P99_GOAL_MS } else { P99_GOAL_MS };
        row(
            format!("{} trigger, index: p50 / p99 / max", result.name),
            format!("{} ({ready})", result.index.describe()),
            &format!("p99 <= {goal_ms} ms"),
            Some(result.index.p99() <= goal_ms),
        );
        row(
            format!("{} trigger, index, blocked_by as MustNot present (before #16): p50 / p99 / max", result.name),
            format!("{} (same ids)", result.index_must_not.describe()),
            "",
            None,
        );
        row(
            format!("{} trigger, SQLite ({:?} form): p50 / p99 / max", result.name, result.sql_form),
            format!("{} (same ids)", result.sql.describe()),
            "",
            None,
        );
        row(
            format!("{} trigger, ratio SQLite / index", result.name),
            format!(
                "p50 {:.1}x, p99 {:.1}x",
                result.sql.p50() / result.index.p50(),
                result.sql.p99() / result.index.p99()
            ),
            "",
            None,
        );
    }
    for (what, load) in [("as the store runs them", &profiles.load_as_store), ("with QPSG", &profiles.load_qpsg)] {
        row(
            format!("profile: SQL of one batch load (load_batch's 3 statements), {what}"),
            format!("{:.1} µs/batch, {:.0}% of executions re-prepared", load.micros_per_batch, 100.0 * load.reprepared),
            "",
            None,
        );
    }
    let query = &profiles.query;
    for (what, latencies) in [
        ("tantivy search alone (MustNot present form, ordered top 100)", &query.search),
        ("its 100 ids via the id fast column (as ids_of)", &query.ids_fast_column),
        ("its 100 ids via the stored documents", &query.ids_stored),
    ] {
        row(format!("profile: typical, {what}"), latencies.describe(), "", None);
    }

    println!();
    println!("## Batch index benchmark ({} batches)", thousands(n));
    println!();
    println!(
        "data set: {} batches, {} events ({:.1} per batch), {} store transactions, store file {}, head seq {}",
        thousands(n),
        thousands(generated.events),
        generated.events as f64 / n as f64,
        thousands(generated.transactions),
        mib(generated.store_bytes),
        thousands(generated.head as u64),
    );
    println!(
        "generation through the ObjectStore port: {:.0} s ({:.0} transactions/s){}",
        generated.seconds,
        generated.transactions as f64 / generated.seconds,
        if reused { ", cached from an earlier run" } else { "" }
    );
    println!("engine options: {}", catch_up.options);
    println!(
        "SQL alternative: materialized from the store in {materialize_secs:.0} s ({} batches/s incl. indexes and ANALYZE), file {}",
        thousands((n as f64 / materialize_secs) as u64),
        mib(sql_bytes)
    );
    println!();
    println!("| metric | figure | goal | met |");
    println!("|---|---|---|---|");
    for [metric, figure, goal, ok] in &rows {
        println!("| {metric} | {figure} | {goal} | {ok} |");
    }
    println!();
    for result in results {
        println!("{} trigger: {}, limit 100", result.name, result.description);
        println!(
            "  SQL form used: {:?}; the {:?} form had p50 {} ms",
            result.sql_form,
            result.other_form.0,
            fmt_ms(result.other_form.1)
        );
        println!("  SQLite plan:");
        for line in &result.plan {
            println!("    {line}");
        }
        println!(
            "  SQL: {}",
            trigger_sql(&cases().iter().find(|c| c.name == result.name).unwrap().trigger, result.sql_form)
        );
    }
}
