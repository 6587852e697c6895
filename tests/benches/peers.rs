//! Side-by-side benchmark against the job queues users compare autocomp with: the same 4-stage
//! pipeline of no-op steps on graphile-worker, Procrastinate and Celery + Redis (installed by
//! `scripts/bench-peers --install`) and on autocomp embedded, over PostgreSQL and as
//! `autocomp-exec -- true`, each measured for backlog throughput, trickle latency and idle cost.
//!
//!     scripts/bench-peers                                  # installs the peers, then runs this
//!     cargo bench -p autocomp-e2e --bench peers            # the same, peers already installed
//!
//! The workload: item -> stage1 -> stage2 -> stage3 -> stage4, every step a no-op. 4 worker
//! processes with 2 concurrent handlers each: for the peers, 4 workers each running every
//! stage with concurrency 2 (graphile `concurrency: 2`, `procrastinate worker
//! --concurrency=2`, `celery worker --concurrency=2`, prefork); for autocomp, one `--watch`
//! process per stage with the default config (`max_threads = 2`, `queue_size = 10`,
//! `watch_heartbeat = 60s`: the config files are empty).
//!
//! Per system and repetition, in a fresh database / directory:
//! - backlog: `AUTOCOMP_BENCH_BACKLOG` (5,000) items registered while no worker runs, then the
//!   workers are started; items/s = items / (last stage-4 finish - workers' spawn), both on the
//!   machine's wall clock (so worker start-up counts); CPU ms per item = user+system CPU of the
//!   workers and servers (whole process trees, /proc/<pid>/stat incl. reaped children) over
//!   that window / items.
//! - trickle: 20 items/s for `AUTOCOMP_BENCH_TRICKLE_SECS` (30); latency = registration (wall
//!   clock just before the enqueue call: the bench's for autocomp, the peer's enqueuer for the
//!   peers) -> stage 4 finished (autocomp: the store timestamp of the `Stage4` event, read
//!   every 100 ms from the change feed, the changed batches' summaries, and the whole batches
//!   only of the items through stage 4; peers: the wall clock in stage 4's handler, appended
//!   to a file). p50 / p99.
//! - idle: after an 11 s settle (PostgreSQL flushes a backend's transaction counts up to 10 s
//!   late), `AUTOCOMP_BENCH_IDLE_SECS` (30) with nothing to do: CPU of workers + servers as %
//!   of one core, and PostgreSQL transactions/s of the system's database
//!   (pg_stat_database xact_commit + xact_rollback) next to statements/s from
//!   pg_stat_statements, which has no flush lag (pg_stat_database's counts of a busy backend
//!   can arrive tens of seconds late and land in the idle window).
//! - burst: `AUTOCOMP_BENCH_BURST` (5,000) items registered at once while the workers idle:
//!   from the first registration to the first item through stage 4 (the start-up stall's
//!   case: it must wait for nothing but work), and items/s until the last.
//!
//! Systems (`AUTOCOMP_BENCH_ONLY`, a comma list): graphile-worker, procrastinate, celery,
//! autocomp-embedded, autocomp-pg (ZooKeeper locks), autocomp-pg-only (PostgreSQL locks, no
//! ZooKeeper), autocomp-exec. All of them in order, then all again
//! (`AUTOCOMP_BENCH_REPS`, 2). One PostgreSQL server (fsync on) for every PG system, every
//! database on it vacuumed and analyzed before each system, and a checkpoint (what the ones
//! before left for autovacuum is nobody's window's). Without
//! the `--bench` argument (`cargo test --benches`) it is a smoke run of autocomp-embedded and
//! autocomp-exec at tiny sizes, which needs neither npm nor pip.
//!
//! `AUTOCOMP_BENCH_PHASES=1`: the autocomp watchers log their passes' phases, and after the
//! trickle the bench prints where each stage's time went (`peers/phases.rs`); after the
//! backlog and the trickle, what the PostgreSQL server spent on each statement and the
//! write-ahead log it wrote per item (bytes, full-page images), and after the
//! backlog the CPU per item of each process tree (the workers together, each server) and
//! what the server's sessions waited on (`peers/waits.rs`); after
//! the idle window its CPU per process tree, each worker apart. `AUTOCOMP_BENCH_NESTED=1` also
//! counts the statements inside the store's functions (`pg_stat_statements.track = all`), 40
//! of them instead of 20: where an append's or a registration's server time goes.
//!
//! `AUTOCOMP_BENCH_PG_SCHEMA=N`: autocomp's PostgreSQL stores are made at schema version `N`
//! and opened without migrating (every process runs on `N`): one build measures a migration
//! against the schema before it, a run with and a run without, one after the other.
//!
//! `AUTOCOMP_BENCH_SQLITE_QUERY=Q`: the embedded store's URL ends in `?Q` (for example
//! `synchronous=normal`), to compare the embedded store's settings in one build.
//!
//! Before each system the bench prints the machine's pace (`machine_pace`: a shared virtual
//! machine's speed drifts between systems and repetitions), and with the backlog's and the
//! trickle's figures the share of the CPUs' time the hypervisor stole meanwhile (`CpuTimes`).

use autocomp_test_servers::bench::{
    CpuTimes, load_average, machine_pace, nested_statements, postgres_counting_statements, quiet_server,
};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use autocomp_e2e::wait_until;
use autocomp_model::Timestamp;
use autocomp_test_servers::Postgres;

#[path = "peers/autocomp.rs"]
mod autocomp;
#[path = "peers/peer.rs"]
mod peer;
#[path = "peers/phases.rs"]
mod phases;
#[path = "peers/processes.rs"]
mod processes;
#[path = "peers/waits.rs"]
mod waits;

use autocomp::Autocomp;
use peer::Peer;
use processes::{command_name, now_ms, ticks_to_ms, tree_ticks};

const GRAPHILE: &str = "graphile-worker";
const PROCRASTINATE: &str = "procrastinate";
const CELERY: &str = "celery";
const EMBEDDED: &str = "autocomp-embedded";
const OVER_PG: &str = "autocomp-pg";
/// PostgreSQL store and PostgreSQL locks (no ZooKeeper), `sboi serve` following the store.
const PG_ONLY: &str = "autocomp-pg-only";
const EXEC: &str = "autocomp-exec";
const SYSTEMS: [&str; 7] = [GRAPHILE, PROCRASTINATE, CELERY, EMBEDDED, OVER_PG, PG_ONLY, EXEC];
/// What a smoke run (no `--bench`) runs: nothing that needs npm, pip or a server.
const SMOKE_SYSTEMS: [&str; 2] = [EMBEDDED, EXEC];
const INSTALL: &str = "scripts/bench-peers --install";

const STAGES: usize = 4;
const WORKERS: usize = 4;
/// Trickle rate: one item every 50 ms.
const TRICKLE_EVERY: Duration = Duration::from_millis(50);
/// A backend's transaction counts reach pg_stat_database at most 10 s late (PGSTAT_IDLE_INTERVAL).
const SETTLE: Duration = Duration::from_secs(11);
/// Longest the bench waits with no item finishing before it calls the system stuck.
const STALL: Duration = Duration::from_secs(120);
/// How often the autocomp store is asked what finished (its reads load the store a little;
/// the times themselves come from the events, not from when the bench saw them).
const STORE_POLL: Duration = Duration::from_millis(100);

struct Config {
    full: bool,
    backlog: u64,
    /// Items registered at once while the workers run, after the idle window.
    burst: u64,
    trickle: Duration,
    idle: Duration,
    settle: Duration,
    reps: usize,
    /// Longest one backlog may take.
    deadline: Duration,
    systems: Vec<&'static str>,
    peers: PathBuf,
}

impl Config {
    fn from_env() -> Config {
        let full = std::env::args().skip(1).any(|a| a == "--bench");
        let number = |name: &str, default: u64| -> u64 {
            std::env::var(name)
                .ok()
                .map(|s| s.trim().parse().unwrap_or_else(|_| panic!("{name}={s:?} is not a number")))
                .unwrap_or(default)
        };
        let only = std::env::var("AUTOCOMP_BENCH_ONLY").unwrap_or_default();
        let named: Vec<&str> = only.split(',').map(str::trim).filter(|s| !s.is_empty()).collect();
        let systems: Vec<&'static str> = if full {
            for name in &named {
                assert!(SYSTEMS.contains(name), "AUTOCOMP_BENCH_ONLY names {name:?}; the systems are {SYSTEMS:?}");
            }
            SYSTEMS.iter().copied().filter(|s| named.is_empty() || named.contains(s)).collect()
        } else if !named.is_empty() && named.iter().all(|n| SYSTEMS.contains(n)) {
            // A smoke run of what is named (e.g. a peer, to try its scripts at a tiny size);
            // a list meant for another bench (`embedded`, `services`) is not ours: ignored.
            SYSTEMS.iter().copied().filter(|s| named.contains(s)).collect()
        } else {
            SMOKE_SYSTEMS.to_vec()
        };
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace dir").to_path_buf();
        let peers =
            std::env::var_os("AUTOCOMP_PEERS_DIR").map(PathBuf::from).unwrap_or_else(|| workspace.join("target/peers"));
        if full {
            Config {
                full,
                backlog: number("AUTOCOMP_BENCH_BACKLOG", 5_000),
                burst: number("AUTOCOMP_BENCH_BURST", 5_000),
                trickle: Duration::from_secs(number("AUTOCOMP_BENCH_TRICKLE_SECS", 30)),
                idle: Duration::from_secs(number("AUTOCOMP_BENCH_IDLE_SECS", 30)),
                settle: SETTLE,
                reps: number("AUTOCOMP_BENCH_REPS", 2) as usize,
                deadline: Duration::from_secs(number("AUTOCOMP_BENCH_DEADLINE_SECS", 1_200)),
                systems,
                peers,
            }
        } else {
            Config {
                full,
                backlog: 20,
                burst: 20,
                trickle: Duration::from_secs(1),
                idle: Duration::from_secs(1),
                settle: Duration::ZERO,
                reps: 1,
                deadline: Duration::from_secs(120),
                systems,
                peers,
            }
        }
    }

    fn uses_postgres(&self) -> bool {
        self.systems.iter().any(|s| [GRAPHILE, PROCRASTINATE, OVER_PG, PG_ONLY].contains(s))
    }
}

fn main() {
    let config = Config::from_env();
    println!("# autocomp vs job queues: 4-stage no-op pipeline ({})", if config.full { "full" } else { "smoke run" });
    println!(
        "machine: {} cores, {}, load average {}",
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        Timestamp::now(),
        load_average()
    );
    println!(
        "backlog {} items, trickle {} s at 20 items/s, idle {} s (after a {} s settle), {} rep(s); systems: {}",
        config.backlog,
        config.trickle.as_secs(),
        config.idle.as_secs(),
        config.settle.as_secs(),
        config.reps,
        config.systems.join(", ")
    );
    for system in &config.systems {
        if let Err(missing) = peer_installed(system, &config.peers) {
            panic!(
                "{system} is not installed ({missing}): run `{INSTALL}` (AUTOCOMP_PEERS_DIR: {})",
                config.peers.display()
            );
        }
    }
    if config.systems.contains(&OVER_PG) {
        // Before any system runs: a missing server fails the bench at once, not after the
        // systems before autocomp-pg.
        autocomp_e2e::zk::require_installed();
    }
    let postgres = config.uses_postgres().then(|| {
        // pg_stat_statements: a count of statements with no flush lag, to check the idle
        // transaction rate against (pg_stat_database's counters reach it up to tens of
        // seconds late: see `measure`).
        let server = postgres_counting_statements();
        let version = server.psql("postgres", "show server_version");
        println!("PostgreSQL {} (fsync on), port {}", version.trim(), server.port());
        server
    });
    let mut results: Vec<Measured> = Vec::new();
    for rep in 1..=config.reps {
        for system in &config.systems {
            println!("\n## {system}, rep {rep}");
            if let Some(server) = &postgres {
                println!("before it: {}", quiet_server(server));
            }
            // The machine's speed drifts by the hour: each system's figures beside how fast it
            // was just before them.
            println!("machine pace: {}, load average {}", machine_pace(), load_average());
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                measure(system, rep, &config, postgres.as_ref())
            }));
            let result = outcome.map_err(|panic| {
                panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "panicked".into())
            });
            if let Err(why) = &result {
                println!("FAILED: {}", why.lines().next().unwrap_or_default());
            }
            results.push(Measured { system, rep, result });
        }
    }
    println!();
    print_table(&results);
    println!("\nload average after: {}", load_average());
    let failed: Vec<String> =
        results.iter().filter(|m| m.result.is_err()).map(|m| format!("{} rep {}", m.system, m.rep)).collect();
    assert!(failed.is_empty(), "failed: {}", failed.join(", "));
}

/// `Err(what is missing)` when a peer's install is not in the cache dir.
fn peer_installed(system: &str, peers: &Path) -> Result<(), String> {
    let need = |path: PathBuf| if path.exists() { Ok(()) } else { Err(format!("{} is missing", path.display())) };
    match system {
        GRAPHILE => {
            need(peers.join("node/node_modules/graphile-worker/package.json"))?;
            which("node")
        }
        PROCRASTINATE => need(peers.join("venv/bin/procrastinate")),
        CELERY => {
            need(peers.join("venv/bin/celery"))?;
            which("redis-server")
        }
        _ => Ok(()),
    }
}

fn which(program: &str) -> Result<(), String> {
    let found = std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).any(|dir| dir.join(program).is_file()))
        .unwrap_or(false);
    if found { Ok(()) } else { Err(format!("no {program} on PATH")) }
}

// ---------------------------------------------------------------------------------------------
// The systems

/// One item that went through stage 4: when it was registered and when stage 4 finished it,
/// in ms of the machine's wall clock.
#[derive(Debug, Clone)]
struct Done {
    id: u64,
    registered: i64,
    finished: i64,
    /// autocomp: when each stage's event was recorded (store timestamps, ms); empty for peers.
    stages: Vec<i64>,
}

/// A pipeline under test, in its own database or directory, its servers running.
trait System {
    /// Registers items `first..first + count` at once, with no worker running; returns when
    /// they are all registered.
    fn register_backlog(&mut self, first: u64, count: u64);
    /// Registers item `id` now (the trickle); may return before it is stored.
    fn register_one(&mut self, id: u64);
    /// Waits until everything `register_one` was given is registered.
    fn registered_all(&mut self);
    fn start_workers(&mut self);
    /// The items that finished stage 4 since the last call.
    fn poll_done(&mut self) -> Vec<Done>;
    fn worker_pids(&self) -> Vec<u32>;
    fn server_pids(&self) -> Vec<u32>;
    /// `Some(why)` when a worker or server died.
    fn dead(&mut self) -> Option<String>;
    fn logs(&self) -> String;
    /// Each worker's name and log file, for the phase breakdown (autocomp's watchers only).
    fn phase_logs(&self) -> Vec<(String, PathBuf)> {
        Vec::new()
    }
}

/// What one system run measured.
struct Results {
    backlog_per_s: f64,
    backlog_secs: f64,
    cpu_ms_per_item: f64,
    trickle_p50: f64,
    trickle_p99: f64,
    trickle_items: usize,
    idle_cpu_percent: f64,
    idle_pg_tx_per_s: Option<f64>,
    /// Statements/s from pg_stat_statements (no flush lag; COMMITs count as statements).
    idle_pg_statements_per_s: Option<f64>,
    /// A burst registered while the workers idle: from its first registration to the first
    /// item through stage 4, and items/s until the last.
    burst_first_ms: f64,
    burst_per_s: f64,
    /// Of the machine's CPU time in the backlog and in the trickle, the percentage the
    /// hypervisor gave other guests (`CpuTimes`): how starved this run was beside the others.
    stolen_percent: (f64, f64),
}

struct Measured {
    system: &'static str,
    rep: usize,
    result: Result<Results, String>,
}

fn measure(system: &'static str, rep: usize, config: &Config, postgres: Option<&Postgres>) -> Results {
    let postgres = postgres.filter(|_| [GRAPHILE, PROCRASTINATE, OVER_PG, PG_ONLY].contains(&system));
    let database = postgres.map(|pg| {
        let name = format!("{}_r{rep}", system.replace('-', "_"));
        pg.create_database(&name);
        name
    });
    let url = |pg: Option<&Postgres>| pg.expect("PostgreSQL runs").url(database.as_deref().unwrap());
    let mut sys: Box<dyn System> = match system {
        GRAPHILE | PROCRASTINATE | CELERY => {
            let database_url = (system != CELERY).then(|| url(postgres));
            Box::new(Peer::start(system, database_url, &config.peers))
        }
        EMBEDDED | EXEC => Box::new(Autocomp::embedded(system == EXEC)),
        OVER_PG => Box::new(Autocomp::over_postgres(&at_schema(url(postgres)), true)),
        PG_ONLY => Box::new(Autocomp::over_postgres(&at_schema(url(postgres)), false)),
        other => unreachable!("no system {other}"),
    };
    // (transactions from pg_stat_database, statements from pg_stat_statements) of the system's
    // database. The first is what was asked for, but a backend reports its counts only when
    // it flushes its pending stats, which under load can be tens of seconds late (seen: a
    // Procrastinate run's backlog counted in the idle window); the second has no lag.
    let pg_tx = |pg: Option<&Postgres>| -> Option<(u64, u64)> {
        let pg = pg?;
        let name = database.as_deref().unwrap();
        let sql = format!(
            "select (select xact_commit + xact_rollback from pg_stat_database where datname = '{name}'), \
             (select coalesce(sum(calls), 0) from pg_stat_statements where dbid = \
              (select oid from pg_database where datname = '{name}'))"
        );
        let out = pg.psql("postgres", &sql);
        let (xacts, statements) = out.trim().split_once('|')?;
        Some((xacts.parse().ok()?, statements.parse().ok()?))
    };
    let server_pids = || {
        let mut pids = sys_server_pids(system, postgres);
        pids.sort();
        pids
    };

    // Backlog: everything registered first, then the workers start.
    let backlog = config.backlog;
    let registering = Instant::now();
    sys.register_backlog(0, backlog);
    println!("registered {backlog} items in {:.1} s (not measured)", registering.elapsed().as_secs_f64());
    let servers = [server_pids(), sys.server_pids()].concat();
    // Each server's process tree apart, for the breakdown; their sum is the servers' share.
    let servers_before: Vec<u64> = servers.iter().map(|pid| tree_ticks(&[*pid])).collect();
    let breakdown = std::env::var_os("AUTOCOMP_BENCH_PHASES").is_some();
    if let (true, Some(pg), Some(name)) = (breakdown, postgres, database.as_deref()) {
        reset_statements(pg, name);
    }
    let wal_before = postgres.filter(|_| breakdown).map(wal_written);
    let waits = postgres.filter(|_| breakdown).map(|pg| waits::start(pg.url("postgres")));
    let spawned_ms = now_ms();
    let backlog_cpu = CpuTimes::now();
    sys.start_workers();
    let mut done: BTreeMap<u64, Done> = BTreeMap::new();
    wait_for_items(sys.as_mut(), &mut done, 0..backlog, config.deadline, "the backlog");
    if let Some(waits) = waits {
        waits.finish("backlog");
    }
    let workers = sys.worker_pids();
    let servers_spent: Vec<u64> =
        servers.iter().zip(&servers_before).map(|(pid, before)| tree_ticks(&[*pid]).saturating_sub(*before)).collect();
    let cpu = ticks_to_ms(tree_ticks(&workers) + servers_spent.iter().sum::<u64>());
    let last = done.values().map(|d| d.finished).max().unwrap_or(spawned_ms);
    let backlog_secs = (last - spawned_ms).max(1) as f64 / 1000.0;
    let backlog_per_s = backlog as f64 / backlog_secs;
    let cpu_ms_per_item = cpu / backlog as f64;
    let backlog_stolen = CpuTimes::now().stolen_percent_since(backlog_cpu);
    println!(
        "backlog: {backlog} items in {backlog_secs:.1} s from the workers' spawn = {backlog_per_s:.1} items/s; \
         CPU {cpu:.0} ms = {cpu_ms_per_item:.2} ms/item (workers + servers); stolen by the hypervisor \
         {backlog_stolen:.1}% of the CPUs' time"
    );
    if breakdown {
        let per_item = |ticks: u64| ticks_to_ms(ticks) / backlog as f64;
        let mut parts = vec![format!("workers {:.2}", per_item(tree_ticks(&workers)))];
        for (pid, spent) in servers.iter().zip(&servers_spent) {
            parts.push(format!("{} {:.2}", command_name(*pid), per_item(*spent)));
        }
        println!("backlog CPU ms per item by process tree: {}", parts.join(", "));
        if let (Some(pg), Some(before)) = (postgres, wal_before) {
            print_wal(pg, before, "backlog", backlog);
        }
        if let (Some(pg), Some(name)) = (postgres, database.as_deref()) {
            print_statements(pg, name, "backlog", backlog);
        }
    }

    // Trickle: one item every 50 ms. With phases asked for, the server's own time per
    // statement in the trickle is printed after it (pg_stat_statements of this database).
    let statements = postgres.filter(|_| breakdown).map(|pg| {
        let name = database.as_deref().unwrap();
        reset_statements(pg, name);
        (pg, name)
    });
    let wal_before = statements.map(|(pg, _)| wal_written(pg));
    let first = backlog;
    let count = (config.trickle.as_millis() / TRICKLE_EVERY.as_millis()) as u64;
    let phases = phases::Window::open(sys.phase_logs());
    let trickle_cpu = CpuTimes::now();
    let start = Instant::now();
    for n in 0..count {
        let at = start + TRICKLE_EVERY * n as u32;
        if let Some(wait) = at.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        sys.register_one(first + n);
        for item in sys.poll_done() {
            done.insert(item.id, item);
        }
    }
    sys.registered_all();
    let behind = start.elapsed().as_secs_f64() - config.trickle.as_secs_f64();
    if behind > 0.5 {
        println!("(registering fell {behind:.1} s behind the 50 ms pacing)");
    }
    wait_for_items(sys.as_mut(), &mut done, first..first + count, Duration::from_secs(300), "the trickle");
    let mut latencies: Vec<i64> = (first..first + count).map(|id| done[&id].finished - done[&id].registered).collect();
    latencies.sort();
    let pick = |p: f64| latencies[((latencies.len() - 1) as f64 * p).round() as usize] as f64;
    let (trickle_p50, trickle_p99) = (pick(0.5), pick(0.99));
    let trickle_stolen = CpuTimes::now().stolen_percent_since(trickle_cpu);
    println!(
        "trickle: {count} items, registration -> stage 4: p50 {trickle_p50:.0} ms, p99 {trickle_p99:.0} ms, \
         max {} ms; stolen by the hypervisor {trickle_stolen:.1}% of the CPUs' time",
        latencies.last().unwrap()
    );
    print_stage_intervals((first..first + count).map(|id| &done[&id]));
    if let (Some((pg, name)), Some(before)) = (statements, wal_before) {
        print_wal(pg, before, "trickle", count);
        print_statements(pg, name, "trickle", count);
    }
    if let Some(window) = phases {
        window.close(system);
    }

    // Idle.
    if !config.settle.is_zero() {
        std::thread::sleep(config.settle);
    }
    let tree = || tree_ticks(&workers) + tree_ticks(&servers);
    // Each worker's and each server's process tree apart, for the breakdown.
    let trees: Vec<u32> = workers.iter().chain(&servers).copied().collect();
    let each_tree = || trees.iter().map(|pid| tree_ticks(&[*pid])).collect::<Vec<u64>>();
    let trees_before = if breakdown { each_tree() } else { Vec::new() };
    let (cpu_before, tx_before) = (tree(), pg_tx(postgres));
    let idle_start = Instant::now();
    let mut died = None;
    wait_until(idle_start + config.idle, || {
        died = sys.dead();
        died.is_some()
    });
    if let Some(why) = died {
        panic!("{why} while idle\n{}", sys.logs());
    }
    let seconds = idle_start.elapsed().as_secs_f64();
    let (cpu_after, tx_after) = (tree(), pg_tx(postgres));
    let idle_cpu_percent = ticks_to_ms(cpu_after - cpu_before) / seconds / 10.0;
    if breakdown {
        let spent: Vec<f64> = each_tree()
            .iter()
            .zip(&trees_before)
            .map(|(after, before)| ticks_to_ms(after.saturating_sub(*before)) / seconds / 10.0)
            .collect();
        print_idle_trees(&spent[..workers.len()], &servers, &spent[workers.len()..]);
    }
    let idle_pg_tx_per_s = tx_before.zip(tx_after).map(|(before, after)| (after.0 - before.0) as f64 / seconds);
    let idle_pg_statements_per_s = tx_before.zip(tx_after).map(|(before, after)| (after.1 - before.1) as f64 / seconds);
    println!(
        "idle {seconds:.0} s: CPU {idle_cpu_percent:.2}% of a core (workers + servers){}",
        idle_pg_tx_per_s
            .zip(idle_pg_statements_per_s)
            .map(|(tx, st)| format!(", PostgreSQL {tx:.1} tx/s (pg_stat_database), {st:.1} statements/s"))
            .unwrap_or_default()
    );
    // Burst: `burst` items registered at once while the workers idle (a delivery of many
    // batches, the start-up stall's case): how soon the first is through every stage, and
    // how fast the rest follow. Times are the items' own (registration, stage 4).
    let first = first + count;
    let burst = config.burst;
    let burst_start = now_ms();
    sys.register_backlog(first, burst);
    wait_for_items(sys.as_mut(), &mut done, first..first + burst, config.deadline, "the burst");
    let burst_items: Vec<&Done> = (first..first + burst).map(|id| &done[&id]).collect();
    let first_finish = burst_items.iter().map(|d| d.finished).min().unwrap_or(burst_start);
    let last_finish = burst_items.iter().map(|d| d.finished).max().unwrap_or(burst_start);
    let burst_first_ms = (first_finish - burst_start) as f64;
    let burst_per_s = burst as f64 / ((last_finish - burst_start).max(1) as f64 / 1000.0);
    println!(
        "burst: {burst} items registered while idle; the first through stage 4 after {burst_first_ms:.0} ms, \
         all at {burst_per_s:.1} items/s"
    );
    drop(sys);
    if let (Some(pg), Some(name)) = (postgres, &database) {
        // Frees the disk; the next run has a database of its own anyway.
        pg.psql("postgres", &format!("drop database \"{name}\" with (force)"));
    }
    Results {
        backlog_per_s,
        backlog_secs,
        cpu_ms_per_item,
        trickle_p50,
        trickle_p99,
        trickle_items: count as usize,
        idle_cpu_percent,
        idle_pg_tx_per_s,
        idle_pg_statements_per_s,
        burst_first_ms,
        burst_per_s,
        stolen_percent: (backlog_stolen, trickle_stolen),
    }
}

/// The idle window's CPU by process tree, % of a core: each worker (the goal is per watcher:
/// at most 0.1% of a core) and each server. A clock tick is 10 ms, so over a 30 s window a
/// tree's share is counted in steps of 0.03%.
fn print_idle_trees(workers: &[f64], servers: &[u32], spent: &[f64]) {
    let shown: Vec<String> = workers.iter().map(|percent| format!("{percent:.2}")).collect();
    let mut parts = vec![format!("workers {} (each)", shown.join(" / "))];
    for (pid, percent) in servers.iter().zip(spent) {
        parts.push(format!("{} {percent:.2}", command_name(*pid)));
    }
    println!("idle CPU % of a core by process tree: {}", parts.join(", "));
}

/// Where the server's write-ahead log ends now, the full-page images written so far and the
/// checkpoints begun so far, timed and requested (the server's alone: one system runs at a
/// time).
fn wal_written(pg: &Postgres) -> WalMark {
    let answer = pg.psql(
        "postgres",
        "select pg_current_wal_lsn(), wal_fpi, checkpoints_timed + checkpoints_req, \
         (select dealloc from pg_stat_statements_info), (select count(*) from pg_stat_statements) \
         from pg_stat_wal, pg_stat_bgwriter",
    );
    let mut fields = answer.trim().split('|');
    let mut next = || fields.next().expect("an LSN and four counts").to_string();
    let lsn = next();
    let mut count = || next().parse().unwrap_or(0.0);
    WalMark { lsn, fpi: count(), checkpoints: count(), deallocations: count(), statements: count() }
}

/// Where the server stood at a window's start (`wal_written`).
struct WalMark {
    lsn: String,
    fpi: f64,
    checkpoints: f64,
    /// pg_stat_statements' evictions of its least-used entries (each one under an exclusive
    /// lock every statement's end waits on), and the entries it holds: whether a later
    /// repetition pays for the databases of the earlier ones.
    deallocations: f64,
    statements: f64,
}

/// The write-ahead log written in a window (`what`: the backlog, the trickle) per item: bytes
/// (exact, from the log's end) and full-page images (counted as the backends report them, up
/// to a second late), the volume every commit's flush and every standby carry; and the
/// checkpoints begun in the window (each one's first change of a page logs the whole page).
fn print_wal(pg: &Postgres, before: WalMark, what: &str, items: u64) {
    let now = wal_written(pg);
    let sql = format!("select pg_wal_lsn_diff('{}', '{}')", now.lsn, before.lsn);
    let bytes: f64 = pg.psql("postgres", &sql).trim().parse().unwrap_or(0.0);
    let per_item = |n: f64| n / items.max(1) as f64;
    println!(
        "{what} write-ahead log per item: {:.0} bytes, {:.2} full-page images; {:.0} checkpoints begun in the window; \
         pg_stat_statements: {:.0} evictions in the window, {:.0} entries at its end",
        per_item(bytes),
        per_item(now.fpi - before.fpi),
        now.checkpoints - before.checkpoints,
        now.deallocations - before.deallocations,
        now.statements
    );
}

/// Forgets what pg_stat_statements counted for `database`, so a window's statements start at 0.
fn reset_statements(pg: &Postgres, database: &str) {
    pg.psql(
        "postgres",
        &format!("select pg_stat_statements_reset(0, (select oid from pg_database where datname = '{database}'), 0)"),
    );
}

/// The statements of `database` since the last reset, by the server's total time (executing
/// and planning): calls per item of the window (`what`: the backlog, the trickle), the mean
/// execution time on the server (ms), and the plans a call and planning time a call, so a
/// stage's client-side phases can be set beside what the server spent on them.
fn print_statements(pg: &Postgres, database: &str, what: &str, items: u64) {
    let sql = format!(
        "select calls, round(mean_exec_time::numeric, 3), round(total_exec_time::numeric, 1), \
         plans, round(total_plan_time::numeric / greatest(calls, 1), 3), rows, \
         regexp_replace(query, '\\s+', ' ', 'g') \
         from pg_stat_statements where dbid = (select oid from pg_database where datname = '{database}') \
         order by total_exec_time + total_plan_time desc limit {}",
        if nested_statements() { 40 } else { 20 }
    );
    println!(
        "{what} statements, by server time (calls per item, mean ms on the server, total ms, \
         plans per call, ms planning per call, rows per call, statement):"
    );
    for line in pg.psql("postgres", &sql).lines() {
        let fields: Vec<&str> = line.splitn(7, '|').collect();
        if let [calls, mean, total, plans, planning, rows, query] = fields[..] {
            let calls = calls.trim().parse::<f64>().unwrap_or(0.0);
            let per_item = calls / items.max(1) as f64;
            let plans_per_call = plans.trim().parse::<f64>().unwrap_or(0.0) / calls.max(1.0);
            let rows_per_call = rows.trim().parse::<f64>().unwrap_or(0.0) / calls.max(1.0);
            println!(
                "  {per_item:>6.2}  {:>7}  {:>8}  {plans_per_call:>5.2}  {:>6}  {rows_per_call:>7.1}  {}",
                mean.trim(),
                total.trim(),
                planning.trim(),
                statement_shown(query)
            );
        }
    }
}

/// A statement as the table shows it: its first 110 characters, and where it is longer, its
/// last 90 too, which tell apart the reads that select the same columns (`... WHERE ...`).
fn statement_shown(query: &str) -> String {
    let chars: Vec<char> = query.chars().collect();
    match chars.len() > 220 {
        true => format!(
            "{} ... {}",
            chars[..110].iter().collect::<String>(),
            chars[chars.len() - 90..].iter().collect::<String>()
        ),
        false => query.to_owned(),
    }
}

/// autocomp's trickle, where its latency goes: p50 and p99 of registration -> stage 1's event and of
/// each stage's event -> the next's (store timestamps, ms: each interval is the next
/// stage's wake-up, look, claim, work and append).
fn print_stage_intervals<'a>(items: impl Iterator<Item = &'a Done>) {
    let mut intervals: Vec<Vec<i64>> = Vec::new();
    for item in items.filter(|item| !item.stages.is_empty()) {
        let starts = std::iter::once(item.registered).chain(item.stages.iter().copied());
        for (k, (from, to)) in starts.clone().zip(item.stages.iter()).enumerate() {
            if intervals.len() <= k {
                intervals.push(Vec::new());
            }
            intervals[k].push(to - from);
        }
    }
    if intervals.is_empty() {
        return;
    }
    let medians: Vec<String> = intervals
        .iter_mut()
        .enumerate()
        .map(|(k, times)| {
            times.sort();
            let from = if k == 0 { "registered".to_string() } else { format!("stage {k}") };
            let p99 = times[(times.len() * 99 / 100).min(times.len() - 1)];
            format!("{from} -> stage {}: {} / {p99}", k + 1, times[times.len() / 2])
        })
        .collect();
    println!("trickle, p50 / p99 ms between events: {}", medians.join(", "));
}

/// `url`, or with `AUTOCOMP_BENCH_PG_SCHEMA=N` its store made at schema version `N` and the
/// URL saying not to migrate it: a migration's effect beside the tree's in one hour.
fn at_schema(url: String) -> String {
    let Some(version) = std::env::var("AUTOCOMP_BENCH_PG_SCHEMA").ok() else { return url };
    let version: i32 = version.parse().expect("AUTOCOMP_BENCH_PG_SCHEMA: a schema version");
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    runtime
        .block_on(autocomp_store::PgStore::create_at_schema_version(&url, version))
        .expect("the store at that schema");
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}migrate=false")
}

/// The servers a system shares with others or that the harnesses own: the PostgreSQL
/// postmaster (its backends are its children) for the PG systems.
fn sys_server_pids(system: &str, postgres: Option<&Postgres>) -> Vec<u32> {
    match (system, postgres) {
        (GRAPHILE | PROCRASTINATE | OVER_PG | PG_ONLY, Some(pg)) => vec![pg.pid()],
        _ => Vec::new(),
    }
}

/// Polls until every item of `ids` finished stage 4, at most `limit`, failing when nothing
/// finishes for [`STALL`] or a process dies.
fn wait_for_items(
    sys: &mut dyn System,
    done: &mut BTreeMap<u64, Done>,
    ids: std::ops::Range<u64>,
    limit: Duration,
    what: &str,
) {
    let deadline = Instant::now() + limit;
    let mut progress = Instant::now();
    let mut died = None;
    let mut stalled = false;
    let all = wait_until(deadline, || {
        let new = sys.poll_done();
        if !new.is_empty() {
            progress = Instant::now();
        }
        for item in new {
            done.insert(item.id, item);
        }
        died = sys.dead();
        stalled = progress.elapsed() > STALL;
        died.is_some() || stalled || ids.clone().all(|id| done.contains_key(&id))
    });
    let finished = ids.clone().filter(|id| done.contains_key(id)).count();
    if let Some(why) = died {
        panic!("{why} during {what} ({finished} of {} finished)\n{}", ids.end - ids.start, sys.logs());
    }
    if stalled || !all {
        panic!(
            "{what}: only {finished} of {} items finished ({})\n{}",
            ids.end - ids.start,
            if stalled { format!("none for {STALL:?}") } else { format!("within {limit:?}") },
            sys.logs()
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Output

fn print_table(results: &[Measured]) {
    let graphile: HashMap<usize, &Results> = results
        .iter()
        .filter(|m| m.system == GRAPHILE)
        .filter_map(|m| m.result.as_ref().ok().map(|r| (m.rep, r)))
        .collect();
    let header = [
        "system",
        "rep",
        "backlog items/s",
        "items/s vs graphile",
        "trickle p50 / p99 ms",
        "idle CPU %",
        "idle PG tx/s (statements/s)",
        "CPU ms per item",
        "CPU/item vs graphile",
        "burst: first through ms, items/s",
        "stolen % backlog / trickle",
    ];
    let mut rows: Vec<Vec<String>> = Vec::new();
    let mut ordered: Vec<&Measured> = results.iter().collect();
    ordered.sort_by_key(|m| (SYSTEMS.iter().position(|s| *s == m.system), m.rep));
    for m in ordered {
        let mut row = vec![m.system.to_owned(), m.rep.to_string()];
        match &m.result {
            Ok(r) => {
                let base = graphile.get(&m.rep);
                row.push(format!("{:.1} ({:.1} s)", r.backlog_per_s, r.backlog_secs));
                row.push(base.map_or("-".into(), |b| format!("{:.2}x", r.backlog_per_s / b.backlog_per_s)));
                row.push(format!("{:.0} / {:.0} (n={})", r.trickle_p50, r.trickle_p99, r.trickle_items));
                row.push(format!("{:.2}", r.idle_cpu_percent));
                row.push(
                    r.idle_pg_tx_per_s
                        .zip(r.idle_pg_statements_per_s)
                        .map_or("-".into(), |(tx, st)| format!("{tx:.1} ({st:.1})")),
                );
                row.push(format!("{:.2}", r.cpu_ms_per_item));
                row.push(base.map_or("-".into(), |b| format!("{:.2}x", r.cpu_ms_per_item / b.cpu_ms_per_item)));
                row.push(format!("{:.0}, {:.1}", r.burst_first_ms, r.burst_per_s));
                row.push(format!("{:.1} / {:.1}", r.stolen_percent.0, r.stolen_percent.1));
            }
            Err(why) => {
                row.push(format!("FAILED: {}", why.lines().next().unwrap_or_default().replace('|', "/")));
                row.extend(std::iter::repeat_n("-".to_owned(), header.len() - 3));
            }
        }
        rows.push(row);
    }
    println!("| {} |", header.join(" | "));
    println!(
        "|{}|",
        header.iter().enumerate().map(|(i, _)| if i < 2 { "---" } else { "---:" }).collect::<Vec<_>>().join("|")
    );
    for row in rows {
        println!("| {} |", row.join(" | "));
    }
}
