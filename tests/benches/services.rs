//! Multi-host services benchmark (issue #7), release binaries as separate processes on
//! loopback:
//!
//! 1. Appends/s through `autocomp-store serve` with 16 concurrent clients (each its own
//!    `HttpStore` and connections), `synchronous=normal` and `full` side by side, with the
//!    per-append latency seen by the clients.
//! 2. Trigger query latency through `sboi serve` + `HttpIndex` over the 1,000,000-batch store
//!    and index that `cargo bench -p autocomp-sboi --bench index` caches in
//!    `target/bench-data/` (run that first; this bench says so and skips the row otherwise),
//!    next to the same query in-process (`IndexEngine::query_at`) on the same index.
//! 3. Index lag under a steady append load: a paced writer appends through the store
//!    service while `sboi serve` follows it over HTTP; a sampler reads the service's
//!    `indexed_seq` gauge every 2 ms. Lag of an append = when the index first covered its seq
//!    minus when the store acknowledged it. Also the `index_lag` gauge (in seqs). Then the
//!    same while the service reconciles (`POST /v1/reconcile`, back to back) a store of
//!    `AUTOCOMP_BENCH_RECONCILE_BATCHES` more batches (default 100,000, one event each;
//!    written straight into the SQLite file first). The appended event type is in the index
//!    before the run starts (its first appearance rewrites every document once).
//!
//!     cargo bench -p autocomp-e2e --bench services
//!
//! `AUTOCOMP_BENCH_SECS` (default 10) is the length of the lag run; `AUTOCOMP_BENCH_ONLY`
//! (`appends`, `queries`, `lag`, comma-separated) runs only those sections. Without the `--bench`
//! argument that `cargo bench` passes (e.g. under `cargo test --all-targets`) it only does a
//! smoke run with small numbers.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use autocomp_e2e::percentile;
use autocomp_e2e::services::{Service, TOKEN, metric};
use autocomp_model::{Agent, BatchId, BatchType, EventType, NewBatch, NewEvent, Outcome, Seq, Timestamp, Trigger};
use autocomp_sboi::{BatchIndex, HttpIndex, IndexEngine};
use autocomp_store::prelude::*;
use autocomp_store::{HttpStore, SqliteOptions, SqliteStore, Synchronous};
use autocomp_test_servers::wait_until_every;

const GOAL_APPENDS: f64 = 5_000.0;
const GOAL_QUERY_P99_MS: f64 = 20.0;
const GOAL_LAG_P99_MS: f64 = 50.0;
const CLIENTS: usize = 16;

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    println!("# autocomp services benchmark ({})", if full { "full" } else { "smoke run" });
    println!(
        "machine: {} cores, {}",
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        Timestamp::now()
    );
    let only = std::env::var("AUTOCOMP_BENCH_ONLY").unwrap_or_default();
    let wanted = |section: &str| only.is_empty() || only.split(',').any(|s| s == section);
    if wanted("appends") {
        runtime.block_on(appends(if full { 40_000 } else { 800 }));
    }
    if wanted("queries") {
        runtime.block_on(queries(full));
    }
    if wanted("lag") {
        let secs = std::env::var("AUTOCOMP_BENCH_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(10);
        let length = if full { Duration::from_secs(secs) } else { Duration::from_secs(1) };
        runtime.block_on(lag(length, 0));
        let reconciled = std::env::var("AUTOCOMP_BENCH_RECONCILE_BATCHES").ok().and_then(|s| s.parse().ok());
        runtime.block_on(lag(length, reconciled.unwrap_or(if full { 100_000 } else { 1_000 })));
    }
}

fn store_client(url: &str) -> Arc<HttpStore> {
    Arc::new(HttpStore::with_token(url, Some(TOKEN.into())).unwrap())
}

fn received(n: u64) -> NewEvent {
    NewEvent::new(EventType::new("Step_Done").unwrap(), Outcome::Success, Agent::new("bench/1.0").unwrap())
        .with_details(serde_json::json!({ "n": n }))
}

async fn register(store: &dyn ObjectStore, count: usize) -> Vec<BatchId> {
    let mut ids = Vec::with_capacity(count);
    for n in 0..count {
        let id = BatchId::new(format!("B{n:06}")).unwrap();
        let new = NewBatch::new(id.clone(), BatchType::new("RoundTrip").unwrap()).with_location(format!("/in/{n}"));
        store.create_batch(new).await.unwrap();
        ids.push(id);
    }
    ids
}

async fn appends(total: usize) {
    println!("\n## Appends through the store service, {CLIENTS} concurrent clients, {total} appends per row");
    println!("| synchronous | appends/s | p50 | p99 | goal |");
    println!("|---|---|---|---|---|");
    for synchronous in ["normal", "full"] {
        let dir = tempfile::tempdir().unwrap();
        let db = format!("sqlite://{}?synchronous={synchronous}", dir.path().join("store.db").display());
        let service = Service::store_of(&db, dir.path());
        let setup = store_client(&service.url());
        let ids = Arc::new(register(setup.as_ref(), 256).await);
        let per_client = total / CLIENTS;
        let started = Instant::now();
        let tasks: Vec<_> = (0..CLIENTS)
            .map(|client| {
                let store = store_client(&service.url());
                let ids = Arc::clone(&ids);
                tokio::spawn(async move {
                    let mut latencies = Vec::with_capacity(per_client);
                    for n in 0..per_client {
                        let id = &ids[(client * per_client + n) % ids.len()];
                        let sent = Instant::now();
                        store.append_event(id, received(n as u64)).await.unwrap();
                        latencies.push(sent.elapsed());
                    }
                    latencies
                })
            })
            .collect();
        let mut latencies = Vec::new();
        for task in tasks {
            latencies.extend(task.await.unwrap());
        }
        let elapsed = started.elapsed();
        latencies.sort();
        let rate = latencies.len() as f64 / elapsed.as_secs_f64();
        let met = if rate >= GOAL_APPENDS { "met" } else { "NOT met" };
        println!(
            "| {synchronous} | {rate:.0} | {:.2} ms | {:.2} ms | >= {GOAL_APPENDS:.0}/s: {met} |",
            ms(percentile(&latencies, 0.5)),
            ms(percentile(&latencies, 0.99))
        );
        let truth = SqliteStore::open(dir.path().join("store.db")).await.unwrap();
        let events: usize = truth.list_batches(None, 1_000).await.unwrap().iter().map(|b| b.events.len()).sum();
        assert_eq!(events, per_client * CLIENTS, "every acknowledged append recorded exactly once");
    }
}

fn cases() -> Vec<(&'static str, Trigger)> {
    let events = |names: &[&str]| names.iter().map(|n| EventType::new(*n).unwrap()).collect();
    vec![
        (
            "typical",
            Trigger {
                requires: events(&["Data_Received", "Checksums_Verified"]),
                blocked_by: events(&["Structure_Checked"]),
                types: vec![BatchType::new("RoundTrip").unwrap()],
                limit: Some(100),
                ..Trigger::default()
            },
        ),
        (
            "selective",
            Trigger {
                requires: events(&["Manual_Review"]),
                types: vec![BatchType::new("Film").unwrap()],
                limit: Some(100),
                ..Trigger::default()
            },
        ),
    ]
}

async fn queries(full: bool) {
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/bench-data");
    let batches = 1_000_000;
    let (store_db, index_dir) =
        (data.join(format!("sboi-store-{batches}.db")), data.join(format!("sboi-index-{batches}")));
    println!("\n## Trigger queries through the sboi service at {batches} batches");
    if !full {
        println!("skipped in a smoke run");
        return;
    }
    if !data.join(format!("sboi-store-{batches}.done")).exists() || !index_dir.is_dir() {
        println!(
            "skipped: no cached {batches}-batch store and index; run `cargo bench -p autocomp-sboi --bench index` first"
        );
        return;
    }
    // The service gets a copy of the index: it writes its own commits while following.
    let work = tempfile::tempdir().unwrap();
    let copy = work.path().join("index");
    std::fs::create_dir_all(&copy).unwrap();
    for entry in std::fs::read_dir(&index_dir).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), copy.join(entry.file_name())).unwrap();
    }
    let store_url = format!("sqlite://{}", store_db.display());
    let service = Service::index(&store_url, &copy, work.path());
    let index = HttpIndex::with_token(&service.url(), Some(TOKEN.into())).unwrap();
    let engine = IndexEngine::open(&index_dir).unwrap();
    println!("| trigger | HTTP p50 | HTTP p99 | in-process p50 | in-process p99 | goal (HTTP p99) |");
    println!("|---|---|---|---|---|---|");
    for (name, trigger) in cases() {
        let expected = engine.query_at(&trigger, Timestamp::now()).unwrap();
        let (mut http, mut local) = (Vec::new(), Vec::new());
        for round in 0..230 {
            let sent = Instant::now();
            let answer = index.query(&trigger).await.unwrap();
            let over_http = sent.elapsed();
            let sent = Instant::now();
            let in_process = engine.query_at(&trigger, Timestamp::now()).unwrap();
            let here = sent.elapsed();
            assert_eq!(answer, expected, "{name}: the service answers what the engine answers");
            assert_eq!(in_process, expected);
            if round >= 30 {
                http.push(over_http);
                local.push(here);
            }
        }
        http.sort();
        local.sort();
        let p99 = percentile(&http, 0.99);
        let met = if ms(p99) <= GOAL_QUERY_P99_MS { "met" } else { "NOT met" };
        println!(
            "| {name} | {:.2} ms | {:.2} ms | {:.2} ms | {:.2} ms | <= {GOAL_QUERY_P99_MS} ms: {met} |",
            ms(percentile(&http, 0.5)),
            ms(p99),
            ms(percentile(&local, 0.5)),
            ms(percentile(&local, 0.99)),
        );
    }
}

/// A gauge of the sboi service at `url`, as a whole number.
fn gauge(url: &str, name: &str) -> Option<i64> {
    metric(url, &format!("sboi_{name}")).map(|value| value as i64)
}

/// Index lag at a steady append rate; with `reconciled` > 0, over a store holding that many
/// more batches, which the service reconciles back to back meanwhile.
async fn lag(length: Duration, reconciled: usize) {
    const RATE: u64 = 1_000;
    let during =
        if reconciled > 0 { format!(", during reconciles of {reconciled} more batches") } else { String::new() };
    println!(
        "\n## Index lag under a steady load of {RATE} appends/s for {length:?}{during} (sboi follows the store service)"
    );
    let dir = tempfile::tempdir().unwrap();
    if reconciled > 0 {
        let options = SqliteOptions { synchronous: Synchronous::Normal, ..SqliteOptions::default() };
        let direct = SqliteStore::open_with(dir.path().join("store.db"), options).await.unwrap();
        let direct = Arc::new(direct);
        let mut ids = Vec::with_capacity(reconciled);
        for n in 0..reconciled {
            let id = BatchId::new(format!("R{n:07}")).unwrap();
            direct.create_batch(NewBatch::new(id.clone(), BatchType::new("RoundTrip").unwrap())).await.unwrap();
            ids.push(id);
        }
        // Each with an event, as in a pipeline: what the reconcile compares has terms to compare.
        for chunk in ids.chunks(64) {
            let appends = chunk.iter().map(|id| {
                let (direct, id) = (Arc::clone(&direct), id.clone());
                tokio::spawn(async move { direct.append_event(&id, received(0)).await.unwrap() })
            });
            for append in appends.collect::<Vec<_>>() {
                append.await.unwrap();
            }
        }
    }
    let db = format!("sqlite://{}?synchronous=normal", dir.path().join("store.db").display());
    let store_service = Service::store_of(&db, dir.path());
    let store = store_client(&store_service.url());
    let ids = register(store.as_ref(), 1_000).await;
    // The index learns the appended event type before the run: a type's first appearance
    // rewrites every document once (a new component's first result), which is not the
    // steady state measured here.
    store.append_event(&ids[0], received(0)).await.unwrap();
    let index_service = Service::index(&store_service.url(), &dir.path().join("index"), dir.path());
    let head = store.head().await.unwrap();
    let indexed = || gauge(&index_service.url(), "indexed_seq").unwrap_or(0);
    let caught_up =
        wait_until_every(Duration::from_millis(10), Instant::now() + Duration::from_secs(60), || indexed() >= head.0);
    assert!(caught_up, "the index did not catch up with the setup");

    let sampler_service_url = index_service.url();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // The newest indexed seq the sampler has recorded, so the run ends only once it has seen
    // the index cover the last append.
    let sampled = Arc::new(std::sync::atomic::AtomicI64::new(0));
    let sampler = {
        let (stop, sampled) = (Arc::clone(&stop), Arc::clone(&sampled));
        std::thread::spawn(move || {
            let mut samples = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let url = &sampler_service_url;
                if let (Some(indexed), Some(lag)) = (gauge(url, "indexed_seq"), gauge(url, "index_lag")) {
                    samples.push((Instant::now(), indexed, lag));
                    sampled.store(indexed, std::sync::atomic::Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            samples
        })
    };
    let reconciler = (reconciled > 0).then(|| {
        let index = HttpIndex::with_token(&index_service.url(), Some(TOKEN.into())).unwrap();
        let stop = Arc::clone(&stop);
        tokio::spawn(async move {
            let mut took = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let started = Instant::now();
                index.reconcile().await.unwrap();
                took.push(started.elapsed());
            }
            took
        })
    });
    let mut acknowledged: Vec<(Seq, Instant)> = Vec::new();
    let mut ticker = tokio::time::interval(Duration::from_micros(1_000_000 / RATE));
    let started = Instant::now();
    let mut n = 0u64;
    while started.elapsed() < length {
        ticker.tick().await;
        let event = store.append_event(&ids[(n as usize) % ids.len()], received(n)).await.unwrap();
        acknowledged.push((event.seq, Instant::now()));
        n += 1;
    }
    let achieved = n as f64 / started.elapsed().as_secs_f64();
    let last = acknowledged.last().map(|(seq, _)| *seq).unwrap_or(head);
    let seen = wait_until_every(Duration::from_millis(5), Instant::now() + Duration::from_secs(30), || {
        sampled.load(std::sync::atomic::Ordering::Relaxed) >= last.0
    });
    assert!(seen, "the index never caught up with the load");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let samples = sampler.join().unwrap();
    if let Some(reconciler) = reconciler {
        let took = reconciler.await.unwrap();
        let mean = took.iter().sum::<Duration>() / took.len().max(1) as u32;
        println!("{} reconciles ran back to back, {:.2} s each on average", took.len(), mean.as_secs_f64());
    }

    let mut lags = Vec::with_capacity(acknowledged.len());
    for (seq, acked_at) in &acknowledged {
        let covered = samples.iter().find(|(_, indexed, _)| *indexed >= seq.0).map(|(at, _, _)| *at);
        if let Some(covered) = covered {
            lags.push(covered.saturating_duration_since(*acked_at));
        }
    }
    assert_eq!(lags.len(), acknowledged.len(), "every append was seen indexed");
    lags.sort();
    let mut seq_lags: Vec<i64> = samples.iter().map(|(_, _, lag)| *lag).collect();
    seq_lags.sort();
    let p99 = percentile(&lags, 0.99);
    let met = if ms(p99) <= GOAL_LAG_P99_MS { "met" } else { "NOT met" };
    println!("| appends | achieved rate | lag p50 | lag p99 | lag max | index_lag gauge p50 / p99 (seqs) | goal |");
    println!("|---|---|---|---|---|---|---|");
    let q = |p: f64| seq_lags.get(((seq_lags.len().max(1) - 1) as f64 * p).round() as usize).copied().unwrap_or(0);
    println!(
        "| {n} | {achieved:.0}/s | {:.1} ms | {:.1} ms | {:.1} ms | {} / {} | p99 <= {GOAL_LAG_P99_MS} ms: {met} |",
        ms(percentile(&lags, 0.5)),
        ms(p99),
        ms(*lags.last().unwrap_or(&Duration::ZERO)),
        q(0.5),
        q(0.99),
    );
}
