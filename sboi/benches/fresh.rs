//! Benchmark of fresh queries (`IndexEngine::query_fresh`): what it costs to answer as of the
//! store's head while the index's last commit is 0, 10, 100 or 1,000 changed batches behind,
//! beside the committed-only query and the catch-up that a query used to wait for.
//!
//! Run with `cargo bench -p autocomp-sboi --bench fresh`. `AUTOCOMP_BENCH_BATCHES` sets the
//! store's size (default 100,000 batches, each created with `Data_Received` and a third also
//! `Verified`: small histories, so generating takes seconds, cached in
//! `target/bench-data/sboi-fresh-<batches>.db`). Without `--bench` (under `cargo test
//! --all-targets`) it does a tiny smoke run in a temporary directory.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use autocomp_model::{Agent, BatchId, BatchType, EventType, NewBatch, NewEvent, Outcome, Timestamp, Trigger};
use autocomp_sboi::{EngineOptions, IndexEngine};
use autocomp_store::prelude::*;
use autocomp_store::{SqliteOptions, SqliteStore, Synchronous};

const DEFAULT_BATCHES: usize = 100_000;
const SMOKE_BATCHES: usize = 1_000;
const PENDING: [usize; 4] = [0, 10, 100, 1_000];
const ITERATIONS: usize = 300;
const WARM_UP: usize = 20;

fn main() {
    let bench = std::env::args().skip(1).any(|arg| arg == "--bench");
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
    let temp = tempfile::tempdir().expect("temporary directory");
    let (batches, data_dir, iterations) = if bench {
        let batches = std::env::var("AUTOCOMP_BENCH_BATCHES")
            .ok()
            .and_then(|text| text.trim().replace('_', "").parse().ok())
            .filter(|n| *n >= 2_000)
            .unwrap_or(DEFAULT_BATCHES);
        (batches, bench_data_dir(), ITERATIONS)
    } else {
        (SMOKE_BATCHES, temp.path().to_path_buf(), 5)
    };
    runtime.block_on(run(batches, &data_dir, temp.path(), iterations));
}

fn bench_data_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| {
        let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
        manifest.parent().unwrap_or(manifest).join("target")
    });
    let dir = target.join("bench-data");
    std::fs::create_dir_all(&dir).expect("create target/bench-data");
    dir
}

fn ty(name: &str) -> EventType {
    EventType::new(name).unwrap()
}

fn batch_id(n: usize) -> BatchId {
    BatchId::new(format!("B{n:07}")).unwrap()
}

async fn record(store: &SqliteStore, id: &BatchId, event_type: &str) {
    let event = NewEvent::new(ty(event_type), Outcome::Success, Agent::new("bench").unwrap());
    store.append_event(id, event).await.unwrap();
}

/// The store of `batches` batches, generated once (a `.done` marker says it is complete).
async fn ensure_store(batches: usize, data_dir: &Path) -> (PathBuf, bool) {
    let path = data_dir.join(format!("sboi-fresh-{batches}.db"));
    let marker = data_dir.join(format!("sboi-fresh-{batches}.done"));
    if marker.exists() {
        return (path, true);
    }
    for stale in [path.clone(), path.with_extension("db-wal"), path.with_extension("db-shm")] {
        let _ = std::fs::remove_file(stale);
    }
    let store = open(&path).await;
    let started = Instant::now();
    for n in 0..batches {
        let id = batch_id(n);
        let new = NewBatch::new(id.clone(), BatchType::new("RoundTrip").unwrap()).with_priority((n % 3) as i32);
        store.create_batch(new).await.unwrap();
        record(&store, &id, "Data_Received").await;
        if n.is_multiple_of(3) {
            record(&store, &id, "Verified").await;
        }
    }
    eprintln!("generated {batches} batches in {:.1?}", started.elapsed());
    std::fs::write(&marker, b"").unwrap();
    (path, false)
}

async fn open(path: &Path) -> SqliteStore {
    let options = SqliteOptions { synchronous: Synchronous::Normal, ..SqliteOptions::default() };
    SqliteStore::open_with(path, options).await.unwrap()
}

/// `pending` changed batches after the index's last commit: half of them existing batches
/// verified now (they leave the typical trigger's answer), half new ones (they join it).
async fn write_pending(store: &SqliteStore, pending: usize, next_new: &mut usize, next_verified: &mut usize) {
    for n in 0..pending {
        if n.is_multiple_of(2) {
            // Existing batches not verified yet: n % 3 != 0.
            while next_verified.is_multiple_of(3) {
                *next_verified += 1;
            }
            record(store, &batch_id(*next_verified), "Verified").await;
            *next_verified += 1;
        } else {
            let id = batch_id(*next_new);
            *next_new += 1;
            let new = NewBatch::new(id.clone(), BatchType::new("RoundTrip").unwrap()).with_priority(2);
            store.create_batch(new).await.unwrap();
            record(store, &id, "Data_Received").await;
        }
    }
}

struct Latencies(Vec<Duration>);

impl Latencies {
    async fn measure<F: Future<Output = ()>>(iterations: usize, mut run: impl FnMut() -> F) -> Self {
        for _ in 0..WARM_UP.min(iterations) {
            run().await;
        }
        let mut sorted = Vec::with_capacity(iterations);
        for _ in 0..iterations {
            let started = Instant::now();
            run().await;
            sorted.push(started.elapsed());
        }
        sorted.sort();
        Self(sorted)
    }

    fn at(&self, quantile: f64) -> String {
        let index = ((self.0.len() as f64 * quantile).ceil() as usize).clamp(1, self.0.len()) - 1;
        format!("{:.3}", self.0[index].as_secs_f64() * 1e3)
    }

    fn p50_p99(&self) -> String {
        format!("{} / {}", self.at(0.50), self.at(0.99))
    }
}

async fn run(batches: usize, data_dir: &Path, scratch: &Path, iterations: usize) {
    let (store_path, reused) = ensure_store(batches, data_dir).await;
    // The pending changes below are written into a copy: the cached store stays as generated.
    let copy = scratch.join("store.db");
    std::fs::copy(&store_path, &copy).expect("copy the store");
    for suffix in ["db-wal", "db-shm"] {
        let _ = std::fs::copy(store_path.with_extension(suffix), copy.with_extension(suffix));
    }
    let store = open(&copy).await;
    let engine = IndexEngine::open_with(scratch.join("index"), EngineOptions::default()).unwrap();
    let started = Instant::now();
    engine.catch_up(&store).await.unwrap();
    println!(
        "store: {batches} batches ({}), index caught up from empty in {:.2?}",
        if reused { "cached" } else { "generated now" },
        started.elapsed()
    );
    let trigger = Trigger {
        requires: vec![ty("Data_Received")],
        blocked_by: vec![ty("Verified")],
        limit: Some(10),
        ..Trigger::default()
    };
    println!("typical trigger (requires Data_Received, blocked_by Verified, limit 10), {iterations} runs each, ms:");
    println!(
        "| pending changed batches | fresh query p50 / p99 | of which corrections (store reads) p50 / p99 | \
         corrected answer (index) p50 / p99 | committed-only query p50 / p99 | catch-up of them (once) |"
    );
    println!("|---:|---:|---:|---:|---:|---:|");
    let (mut next_new, mut next_verified) = (batches, 1);
    for pending in PENDING {
        write_pending(&store, pending, &mut next_new, &mut next_verified).await;
        let head = store.head().await.unwrap();
        let check = engine.query_fresh(&store, &trigger, Timestamp::now()).await.unwrap().expect("within the bound");
        assert_eq!((check.as_of, check.corrections), (head, pending), "{check:?}");
        let fresh = Latencies::measure(iterations, || async {
            std::hint::black_box(engine.query_fresh(&store, &trigger, Timestamp::now()).await.unwrap());
        })
        .await;
        let reads = Latencies::measure(iterations, || async {
            std::hint::black_box(engine.corrections(&store).await.unwrap());
        })
        .await;
        let corrections = engine.corrections(&store).await.unwrap().expect("within the bound");
        let corrected = Latencies::measure(iterations, || async {
            std::hint::black_box(engine.query_corrected(&corrections, &trigger, Timestamp::now()).unwrap());
        })
        .await;
        let committed = Latencies::measure(iterations, || async {
            std::hint::black_box(engine.query_at(&trigger, Timestamp::now()).unwrap());
        })
        .await;
        drop(corrections);
        // What a query used to wait for before answering (one measurement: it empties the pending changes).
        let started = Instant::now();
        engine.catch_up(&store).await.unwrap();
        let catch_up = started.elapsed();
        let caught_up = engine.query_at(&trigger, Timestamp::now()).unwrap();
        assert_eq!(caught_up, check.batches, "the fresh answer is the caught-up index's");
        println!(
            "| {pending} | {} | {} | {} | {} | {:.3} |",
            fresh.p50_p99(),
            reads.p50_p99(),
            corrected.p50_p99(),
            committed.p50_p99(),
            catch_up.as_secs_f64() * 1e3
        );
    }
}
