//! Capacity benchmark: many simulated workers against the distributed backends at once, to
//! measure what one stage result costs on each backend and which runs out first. Each worker
//! runs the framework's own code: `run_watching` (the `--watch` loop) around a `Runner` of a
//! no-op stage component, as a tokio task of this process, so every change to the runner,
//! the store or the lock adapters is measured as shipped.
//!
//!     AUTOCOMP_BENCH_WORKERS=100,500,2000 AUTOCOMP_BENCH_LOCKS=zk,postgres \
//!         cargo bench -p autocomp-e2e --bench capacity
//!
//! Backends: one PostgreSQL server (fsync on, `track_functions=all`, `pg_stat_statements`)
//! and per run a fresh database with two `sboi serve` processes following it; the locks
//! (`AUTOCOMP_BENCH_LOCKS`, `zk` by default, `postgres`, or both comma-separated) are a 3-node ZooKeeper ensemble
//! (`autocomp_e2e::zk`, which lifts ZooKeeper's cap of 60 connections per client address;
//! not started for a PostgreSQL-only bench) or the store's own server (`locks =
//! "postgres://...?lease=..."`, `AUTOCOMP_BENCH_LEASE`, default 10s; `max_connections` is
//! raised to two connections per worker, the lock pool's one and the lease renewal's).
//!
//! Workers: each has its own lock service (a ZooKeeper session, or a PostgreSQL lease), uses
//! sboi service `worker % 2` as its index, and shares one of `STORES` `PgStore` handles: one
//! pool per worker would need N store connections. All run in one process, so they share
//! one agent name per stage (`<stage>/1.0@<host>#<pid>`); locks and claims tell them apart
//! by session and claim generation, as they tell processes apart. The config is
//! `ComponentConfig::default()`. What the runner does not count itself is counted on the way:
//! a decorator of the lock port (poll and batch locks, `release_many`) and of each index
//! client (queries, `covers`), and a tracing layer reading the runner's phase lines
//! (`autocomp::phases`: per-pass phase times, idle wake-ups).
//!
//! Workload: `AUTOCOMP_BENCH_COMPONENTS` (10) stages in a chain (stage 0 takes batches of the
//! run's type, stage k requires stage k-1's event; each is blocked by its own): a pipeline's
//! shape, every batch costs exactly one claim and result per stage. A feeder registers
//! `AUTOCOMP_BENCH_RATE` batches/s (20: 200 stage results/s) for a warm-up and
//! `AUTOCOMP_BENCH_SECS` (60) measured seconds.
//!
//! Without `--bench` (`cargo test --all-targets`) it is a smoke run: 20 workers, 4 s, ZooKeeper.

mod accounting;
mod phases;
mod report;
mod run;
mod workers;

use std::time::Instant;

use autocomp_e2e::zk::{self, ZooKeeper};
use autocomp_framework::Timestamp;
use autocomp_test_servers::Postgres;
use autocomp_test_servers::bench::load_average;
use autocomp_test_servers::postgres::Options as PgOptions;

use report::{Summary, table};
use run::{Backends, STORE_POOL, STORES};

/// Where the workers lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockBackend {
    ZooKeeper,
    Postgres,
}

impl LockBackend {
    fn name(self) -> &'static str {
        match self {
            LockBackend::ZooKeeper => "ZooKeeper",
            LockBackend::Postgres => "PostgreSQL",
        }
    }
    /// In database and chroot names.
    fn short(self) -> &'static str {
        match self {
            LockBackend::ZooKeeper => "zk",
            LockBackend::Postgres => "pg",
        }
    }
}

pub struct Settings {
    smoke: bool,
    workers: Vec<usize>,
    locks: Vec<LockBackend>,
    lease: String,
    secs: f64,
    /// `AUTOCOMP_BENCH_WARMUP`, seconds; else `warmup_for`'s default.
    warmup: Option<f64>,
    rate: f64,
    components: usize,
}

impl Settings {
    fn from_env() -> Self {
        let smoke = !std::env::args().skip(1).any(|arg| arg == "--bench");
        let number = |name: &str, default: f64| -> f64 {
            match std::env::var(name) {
                Ok(text) => text.trim().parse().ok().filter(|v: &f64| v.is_finite() && *v > 0.0).unwrap_or_else(|| {
                    eprintln!("{name}={text:?} is not a positive number; using {default}");
                    default
                }),
                Err(_) => default,
            }
        };
        let listed = |name: &str| -> Vec<String> {
            std::env::var(name)
                .unwrap_or_default()
                .split(',')
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty())
                .collect()
        };
        let mut workers: Vec<usize> = listed("AUTOCOMP_BENCH_WORKERS").iter().filter_map(|n| n.parse().ok()).collect();
        workers.retain(|n| *n > 0);
        if workers.is_empty() {
            workers = vec![if smoke { 20 } else { 500 }];
        }
        let mut locks: Vec<LockBackend> = listed("AUTOCOMP_BENCH_LOCKS")
            .iter()
            .map(|name| match name.as_str() {
                "zk" | "zookeeper" => LockBackend::ZooKeeper,
                "postgres" | "pg" => LockBackend::Postgres,
                other => panic!("AUTOCOMP_BENCH_LOCKS: {other:?} is neither zk nor postgres"),
            })
            .collect();
        if locks.is_empty() {
            locks = vec![LockBackend::ZooKeeper];
        }
        let secs = number("AUTOCOMP_BENCH_SECS", if smoke { 4.0 } else { 60.0 });
        Self {
            smoke,
            workers,
            locks,
            lease: std::env::var("AUTOCOMP_BENCH_LEASE").unwrap_or_else(|_| "10s".into()),
            secs,
            warmup: std::env::var("AUTOCOMP_BENCH_WARMUP").ok().and_then(|w| w.trim().parse().ok()),
            rate: number("AUTOCOMP_BENCH_RATE", if smoke { 5.0 } else { 20.0 }),
            components: number("AUTOCOMP_BENCH_COMPONENTS", 10.0) as usize,
        }
    }

    /// The warm-up before measuring: a sixth of the window (2 to 10 s), and at least a
    /// second per 100 workers, whose first passes (heartbeat passes, each asking the index
    /// and contending for its stage's poll lock) all come at the start.
    fn warmup_for(&self, workers: usize) -> f64 {
        self.warmup.unwrap_or_else(|| (self.secs / 6.0).clamp(2.0, 10.0).max((workers as f64 / 100.0).min(30.0)))
    }

    /// PostgreSQL's `max_connections`: the stores, feeders, listeners and sboi services of a
    /// run, plus two per worker when it locks there.
    fn max_connections(&self) -> usize {
        let most = self.workers.iter().copied().max().unwrap_or(0);
        let locks = if self.locks.contains(&LockBackend::Postgres) { 2 * most } else { 0 };
        200 + STORES * (STORE_POOL + 1) + locks
    }
}

/// A progress line on stderr, with the seconds since the bench started.
pub fn progress(what: &str) {
    static STARTED: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    let started = STARTED.get_or_init(Instant::now);
    eprintln!("[{:7.1} s] {what}", started.elapsed().as_secs_f64());
}

fn main() {
    progress("starting");
    let settings = Settings::from_env();
    phases::install();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("a runtime");
    println!("# Capacity benchmark ({})\n", if settings.smoke { "smoke run" } else { "full" });
    println!(
        "machine: {} cores shared by PostgreSQL, ZooKeeper (3 JVMs, when locking there), 2 sboi services per run \
         and this process; {}; load average at the start: {}\n",
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        Timestamp::now(),
        load_average()
    );
    println!(
        "workers {:?}, locks {:?}, {} stages, feeder {} batches/s, warm-up {:?} s, measured {:.0} s per run; \
         PostgreSQL max_connections={}\n",
        settings.workers,
        settings.locks,
        settings.components,
        settings.rate,
        settings.workers.iter().map(|n| settings.warmup_for(*n)).collect::<Vec<_>>(),
        settings.secs,
        settings.max_connections()
    );
    let logs = tempfile::tempdir().expect("a temp dir for logs");
    let zookeeper = settings.locks.contains(&LockBackend::ZooKeeper).then(|| {
        progress("starting the ZooKeeper ensemble");
        ZooKeeper::start(zk::Options { nodes: 3, ..zk::Options::default() })
    });
    progress("starting PostgreSQL");
    let pg = Postgres::start_with(
        PgOptions::default()
            .setting("track_functions", "all")
            .setting("shared_preload_libraries", "pg_stat_statements")
            .setting("max_connections", &settings.max_connections().to_string()),
    );
    // Time per statement (`accounting::pg_statements`), read through the `postgres` database.
    pg.psql("postgres", "CREATE EXTENSION IF NOT EXISTS pg_stat_statements");
    let backends = Backends { zookeeper: zookeeper.as_ref(), pg: &pg, logs: logs.path() };
    let mut summaries: Vec<Summary> = Vec::new();
    for &backend in &settings.locks {
        for &workers in &settings.workers {
            let mut measured = run::run_at(&runtime, &backends, &settings, workers, backend);
            summaries.push(report::print(&mut measured));
        }
    }
    print_slope(&summaries);
    if settings.smoke {
        assert!(summaries.iter().all(|s| s.results_per_sec > 0.0), "a smoke run recorded no stage result");
    }
    // Dropped in order: the services went with each run; PostgreSQL and ZooKeeper here.
    drop(pg);
    drop(zookeeper);
}

fn print_slope(summaries: &[Summary]) {
    println!("## Slope\n");
    let rows: Vec<Vec<String>> = summaries
        .iter()
        .map(|s| {
            vec![
                s.backend.name().into(),
                s.workers.to_string(),
                format!("{:.1}", s.ramp_secs),
                format!("{:.1}", s.results_per_sec),
                format!("{:.1}", s.passes_per_sec),
                format!("{:.0} ({:.2}/result)", s.lock_writes_per_sec, s.lock_writes_per_result),
                format!("{:.0} ({:.2}/result)", s.pg_xact_per_sec, s.pg_xact_per_result),
                format!("{:.0}", s.queries_per_sec),
                format!("{:.1}", s.idle_wakes_per_sec),
                format!("{:.2}", s.pg_cores),
                format!("{:.2}", s.bench_cores),
                s.e2e.clone(),
            ]
        })
        .collect();
    table(
        &[
            "locks",
            "workers",
            "ramp-up s",
            "results/s",
            "passes with work/s",
            "lock writes/s",
            "PG xact/s",
            "index queries/s",
            "idle wakes/s",
            "PG cores",
            "bench cores",
            "end-to-end p50 / p99",
        ],
        &rows,
    );
}
