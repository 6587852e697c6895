//! The bounded-reads benchmark's data set and its in-process timings (BENCHMARKS.md,
//! "Bounded reads"): a SQLite store of 200,000 batches (a few events each, three components
//! in the registry) and one batch of 100,000 events, built through the store API; then
//! `status` and a batch's newest page the way this release reads them, and (for the
//! figures before) the way the release before did, by reading whole batches.
//!
//! ```sh
//! cargo run --release -p autocomp-ops --example bounded_reads -- build /var/tmp/bounded
//! /usr/bin/time -v cargo run --release -p autocomp-ops --example bounded_reads -- status-whole /var/tmp/bounded
//! ```
//!
//! `build` reuses a data set already built in the directory. `AUTOCOMP_BENCH_SCALE=0.05`
//! builds a twentieth of it (a quick look).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use autocomp_framework::config::Backends;
use autocomp_model::{Agent, BatchId, BatchType, EventType, NewBatch, NewEvent, Outcome, Trigger};
use autocomp_ops::operator::{Format, Operator, TableFormat};
use autocomp_store::{LogCursor, ObjectStore, SqliteOptions, SqliteStore, Synchronous};
use serde_json::json;

/// The batch with the long log.
const BIG: &str = "BIG-0000001";

fn scale() -> f64 {
    std::env::var("AUTOCOMP_BENCH_SCALE").ok().and_then(|s| s.parse().ok()).unwrap_or(1.0)
}

fn batches() -> usize {
    (200_000.0 * scale()) as usize
}

fn big_events() -> usize {
    (100_000.0 * scale()) as usize
}

fn store_path(dir: &Path) -> PathBuf {
    dir.join("store.db")
}

async fn open(dir: &Path) -> Arc<dyn ObjectStore> {
    let options = SqliteOptions { synchronous: Synchronous::Normal, ..SqliteOptions::default() };
    Arc::new(SqliteStore::open_with(store_path(dir), options).await.expect("open the store"))
}

fn id(n: usize) -> BatchId {
    BatchId::new(format!("B{n:07}")).unwrap()
}

fn event(kind: &str, outcome: Outcome, details: serde_json::Value) -> NewEvent {
    NewEvent::new(EventType::new(kind).unwrap(), outcome, Agent::new("bench/1.0@host#1").unwrap()).with_details(details)
}

/// Appends `events` (batch, event) from `tasks` tasks at once, so they share commits.
async fn append_all(store: &Arc<dyn ObjectStore>, events: Vec<(BatchId, NewEvent)>, tasks: usize) {
    let queue = Arc::new(std::sync::Mutex::new(events));
    let workers: Vec<_> = (0..tasks)
        .map(|_| {
            let (store, queue) = (Arc::clone(store), Arc::clone(&queue));
            tokio::spawn(async move {
                loop {
                    let Some((batch, new)) = queue.lock().unwrap().pop() else { return };
                    store.append_event(&batch, new).await.expect("append");
                }
            })
        })
        .collect();
    for worker in workers {
        worker.await.unwrap();
    }
}

async fn build(dir: &Path) {
    std::fs::create_dir_all(dir.join("config")).unwrap();
    let config = format!(
        "store = \"sqlite://{}?synchronous=normal\"\nindex = \"local:{}\"\nlocks = \"local:{}\"\n",
        store_path(dir).display(),
        dir.join("index").display(),
        dir.join("locks").display()
    );
    std::fs::write(dir.join("config/autocomp.toml"), config).unwrap();
    let store = open(dir).await;
    if store.count_batches().await.unwrap() > batches() as u64 {
        println!("{}: already built ({} batches)", dir.display(), batches() + 1);
        return;
    }
    let started = Instant::now();
    for (name, event_type, requires) in [
        ("verifier", "Verified", "Data_Received"),
        ("checker", "Checked", "Verified"),
        ("archiver", "Archived", "Checked"),
    ] {
        let trigger = Trigger::builder().requires(requires).build();
        autocomp_framework::testing::register_component(store.as_ref(), name, event_type, trigger).await;
    }
    let round_trip = BatchType::new("RoundTrip").unwrap();
    let mut events = Vec::new();
    for n in 0..batches() {
        let new = NewBatch::new(id(n), round_trip.clone()).with_location(format!("/incoming/B{n:07}"));
        store.create_batch(new).await.expect("create");
        events.push((id(n), event("Data_Received", Outcome::Success, json!({}))));
        if n % 3 != 0 {
            events.push((id(n), event("Verified", Outcome::Success, json!({"summary": "all files match"}))));
        }
        if n % 5 == 1 {
            let failure = json!({"summary": "1 failure", "failures_total": 1, "failures": [{"reference": "data/page-0002.tif", "description": "not a TIFF"}]});
            events.push((id(n), event("Checked", Outcome::Failure, failure)));
        }
    }
    println!("created {} batches in {:.1}s", batches(), started.elapsed().as_secs_f64());
    // Appended in order per batch: the queue is popped from its end.
    events.reverse();
    append_all(&store, events, 32).await;
    println!("appended their events after {:.1}s", started.elapsed().as_secs_f64());
    let big = BatchId::new(BIG).unwrap();
    store.create_batch(NewBatch::new(big.clone(), round_trip).with_location("/incoming/BIG")).await.unwrap();
    store.append_event(&big, event("Data_Received", Outcome::Success, json!({}))).await.unwrap();
    let notes: Vec<(BatchId, NewEvent)> = (1..big_events())
        .rev()
        .map(|n| {
            let details = json!({"summary": format!("progress note {n}"), "files_done": n, "host": "worker-3"});
            (big.clone(), event("Progress_Noted", Outcome::Success, details))
        })
        .collect();
    append_all(&store, notes, 32).await;
    println!("built {} in {:.1}s", dir.display(), started.elapsed().as_secs_f64());
}

fn operator(dir: &Path) -> Operator {
    Operator::new(&dir.join("config"), Backends::default(), Some("bench".into())).unwrap()
}

fn rss_mb() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0);
    kb / 1024.0
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (Some(mode), Some(dir)) = (args.get(1), args.get(2)) else {
        eprintln!("usage: bounded_reads build|status|status-whole|page|show-whole DIR");
        std::process::exit(2);
    };
    let dir = Path::new(dir);
    let started = Instant::now();
    match mode.as_str() {
        "build" => build(dir).await,
        // This release's `status`, in process: summaries a page at a time.
        "status" => {
            let view = operator(dir).status(None, None).await.unwrap();
            let text = view.render(TableFormat::Table);
            println!("status: {} rows, {} bytes of table", view.rows.len(), text.len());
        }
        // The release before's `status`: every whole batch in memory, then each state.
        "status-whole" => {
            let operator = operator(dir);
            let store = operator.store().await.unwrap();
            let pipeline = operator.pipeline(store.as_ref()).await.unwrap();
            let (mut all, mut after) = (Vec::new(), None::<BatchId>);
            loop {
                let page = store.list_batches(after.as_ref(), 1_000).await.unwrap();
                let Some(last) = page.last() else { break };
                after = Some(last.id.clone());
                all.extend(page);
            }
            let rows: Vec<_> = all.iter().map(|b| pipeline.iter().map(|s| s.state_of(b)).collect::<Vec<_>>()).collect();
            println!("status the old way: {} rows", rows.len());
        }
        // A 100,000-event batch's newest page: head, page, states, rendered, 20 times.
        "page" => {
            let operator = operator(dir);
            let store = operator.store().await.unwrap();
            let mut times = Vec::new();
            for _ in 0..20 {
                let one = Instant::now();
                let view = operator.show(&BatchId::new(BIG).unwrap()).await.unwrap();
                let json = view.render(Format::Json);
                assert!(json.len() > 1_000);
                times.push(one.elapsed().as_secs_f64() * 1e3);
            }
            times.sort_by(f64::total_cmp);
            println!("show {BIG} newest page: median {:.1} ms, max {:.1} ms", times[10], times[19]);
            let one = Instant::now();
            let big = BatchId::new(BIG).unwrap();
            let page = store.log_page(&big, LogCursor::Before(autocomp_model::Seq(500)), 50).await.unwrap();
            println!(
                "log_page before seq 500: {} events in {:.2} ms",
                page.events.len(),
                one.elapsed().as_secs_f64() * 1e3
            );
            let one = Instant::now();
            let head = store.batch_head(&big).await.unwrap();
            println!("batch_head: {} events counted, in {:.2} ms", head.event_count, one.elapsed().as_secs_f64() * 1e3);
        }
        // The release before's `show`: the whole batch, rendered whole.
        "show-whole" => {
            let store = operator(dir).store().await.unwrap();
            let batch = store.get_batch(&BatchId::new(BIG).unwrap()).await.unwrap();
            let events: Vec<_> = batch.events.iter().map(|e| json!({"seq": e.seq, "details": e.details})).collect();
            let text = format!("{:#}", json!({"events": events}));
            println!("the whole batch: {} events, {} bytes of JSON", batch.events.len(), text.len());
        }
        other => {
            eprintln!("unknown mode {other}");
            std::process::exit(2);
        }
    }
    println!("{mode}: {:.3} s, peak RSS {:.0} MB", started.elapsed().as_secs_f64(), rss_mb());
}
