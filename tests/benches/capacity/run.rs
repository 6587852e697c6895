//! One run of the capacity bench at N workers on one lock backend: a fresh database and two
//! sboi services following it, the workers' lock sessions opened (the ramp-up), the workers
//! and the feeder started, a warm-up, the measured window between two snapshots of every
//! backend's counters, and the stop.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use autocomp_e2e::services::{Service, TOKEN};
use autocomp_e2e::zk::{self, ZooKeeper};
use autocomp_framework::locks::{LockService, open_locks};
use autocomp_sboi::BatchIndex;
use autocomp_sboi::http::HttpIndex;
use autocomp_store::{ObjectStore, PgStore};
use autocomp_test_servers::Postgres;
use autocomp_test_servers::bench::load_average;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::accounting::{self as acc, Sampled};
use crate::workers::{Chain, CountingIndex, Ports, Shared, feed, run_worker};
use crate::{LockBackend, Settings, phases, progress};

/// `PgStore` handles the workers share, and the pool of each: one pool per worker would
/// need N store connections.
pub const STORES: usize = 8;
pub const STORE_POOL: usize = 4;
/// Lock sessions opened at once during the ramp-up.
pub const CONNECTS_IN_FLIGHT: usize = 32;
/// How stopping may take: every worker's wait is cut short by the stop signal, so this only
/// bounds a hung request.
const STOP_LIMIT: Duration = Duration::from_secs(30);
pub const SESSION_TIMEOUT: &str = "10s";
/// How often connections and ZooKeeper's outstanding requests are sampled.
const SAMPLE_EVERY: Duration = Duration::from_secs(2);

/// The servers every run uses: ZooKeeper only when a run locks with it.
pub struct Backends<'a> {
    pub zookeeper: Option<&'a ZooKeeper>,
    pub pg: &'a Postgres,
    pub logs: &'a Path,
}

/// Every backend counter the report compares, read at the start and the end of the window.
pub struct Snapshot {
    pub zxid: Option<i64>,
    /// `pg_stat_database`: commits, rollbacks, tuples written, tuples fetched.
    pub db: [f64; 4],
    pub functions: BTreeMap<String, f64>,
    pub statements: BTreeMap<String, acc::Statement>,
    pub tables: BTreeMap<String, [f64; 4]>,
    pub pg_cpu: f64,
    pub sboi_cpu: Vec<f64>,
    pub zk_cpu: f64,
    pub bench_cpu: f64,
}

/// What the processes are, for the CPU figures.
struct Pids {
    postmaster: String,
    sboi: Vec<String>,
    zookeeper: Vec<String>,
}

fn snapshot(backends: &Backends, database: &str, pids: &Pids) -> Snapshot {
    Snapshot {
        zxid: backends.zookeeper.map(acc::zxid),
        db: acc::pg_database_stats(backends.pg, database),
        functions: acc::pg_function_calls(backends.pg, database),
        statements: acc::pg_statements(backends.pg, database),
        tables: acc::pg_table_stats(backends.pg, database),
        pg_cpu: acc::tree_cpu(&pids.postmaster),
        sboi_cpu: pids.sboi.iter().map(|p| acc::tree_cpu(p)).collect(),
        zk_cpu: pids.zookeeper.iter().map(|p| acc::tree_cpu(p)).sum(),
        bench_cpu: acc::own_cpu(),
    }
}

/// What one run measured, for the report.
pub struct Measured {
    pub workers: usize,
    pub backend: LockBackend,
    pub locks_url: String,
    pub database: String,
    pub sboi_ports: Vec<u16>,
    pub load_before: String,
    pub ramp: Duration,
    pub established: usize,
    pub connect_errors: usize,
    pub connect_times: Vec<Duration>,
    pub elapsed: f64,
    pub fed: usize,
    pub backlog: usize,
    pub register_latencies: Vec<Duration>,
    pub shared: Arc<Shared>,
    pub before: Snapshot,
    pub after: Snapshot,
    pub sampled: Sampled,
    pub zk_mntr: Vec<BTreeMap<String, String>>,
}

/// The lock service's URL for a run: a ZooKeeper chroot of its own, or the run's database
/// (one lock connection and the lease renewal's per worker).
fn locks_url(backends: &Backends, backend: LockBackend, run: &str, db_url: &str, settings: &Settings) -> String {
    match backend {
        LockBackend::ZooKeeper => {
            backends.zookeeper.expect("ZooKeeper is started").url(&format!("capacity-{run}"), SESSION_TIMEOUT)
        }
        LockBackend::Postgres => format!("{db_url}?pool_size=1&lease={}", settings.lease),
    }
}

pub fn run_at(
    runtime: &tokio::runtime::Runtime,
    backends: &Backends,
    settings: &Settings,
    workers: usize,
    backend: LockBackend,
) -> Measured {
    let run = format!("{}{workers}", backend.short());
    let database = format!("capacity_{run}");
    let db_url = backends.pg.create_database(&database);
    // The schema first (`PgStore::open` migrates), so both followers start on a ready store.
    runtime.block_on(async { PgStore::open(&format!("{db_url}?pool_size=1")).await.expect("the store opens") });
    let index_dirs = tempfile::tempdir().expect("a temp dir");
    let mut services: Vec<Service> = (0..2)
        .map(|i| {
            let dir = index_dirs.path().join(format!("index{i}"));
            Service::index_unstarted(&db_url, &dir, backends.logs, &format!("sboi-{run}-{i}"))
        })
        .collect();
    progress("starting two sboi services (builds the workspace binaries the first time)");
    for service in &mut services {
        service.restart();
    }
    let pids = Pids {
        postmaster: backends.pg.pid().to_string(),
        sboi: services
            .iter()
            .map(|s| acc::pid_with_args(&format!("127.0.0.1:{}", s.port), "sboi").expect("the sboi process"))
            .collect(),
        zookeeper: backends.zookeeper.map_or_else(Vec::new, |zookeeper| {
            (0..3).filter_map(|n| acc::zk_node(zookeeper.client_port(n)).map(|(pid, _)| pid)).collect()
        }),
    };
    let locks_url = locks_url(backends, backend, &run, &db_url, settings);
    let load_before = load_average();
    let shared = Arc::new(Shared::default());
    phases::follow(Some(Arc::clone(&shared)));
    let silenced = StdoutSilenced::start();
    let measured = runtime.block_on(async {
        let mut stores: Vec<Arc<dyn ObjectStore>> = Vec::new();
        for _ in 0..STORES {
            let store = PgStore::open(&format!("{db_url}?pool_size={STORE_POOL}")).await.expect("a PgStore");
            stores.push(Arc::new(store));
        }
        let feeder_store: Arc<dyn ObjectStore> =
            Arc::new(PgStore::open(&format!("{db_url}?pool_size=2")).await.expect("the feeder's PgStore"));
        const KEYS: [(&str, &str); 2] = [("sboi 0 query", "sboi 0 covers"), ("sboi 1 query", "sboi 1 covers")];
        let indexes: Vec<Arc<dyn BatchIndex>> = services
            .iter()
            .zip(KEYS)
            .map(|(s, (queries, covers))| {
                let inner = Arc::new(HttpIndex::with_token(&s.url(), Some(TOKEN.into())).expect("an index client"));
                Arc::new(CountingIndex { inner, shared: Arc::clone(&shared), queries, covers }) as Arc<dyn BatchIndex>
            })
            .collect();

        progress("ramp-up: opening the lock sessions");
        let ramp_started = Instant::now();
        let (sessions, connect_times, connect_errors) = open_sessions(&locks_url, workers, &shared).await;
        let ramp = ramp_started.elapsed();
        let established = sessions.iter().filter(|s| s.is_some()).count();

        let (stop_sender, stop) = watch::channel(false);
        let chain = Arc::new(Chain::new(&run, settings.components));
        let mut tasks = JoinSet::new();
        for (number, locks) in sessions.iter().enumerate() {
            let Some(locks) = locks else { continue };
            let ports = Ports {
                store: Arc::clone(&stores[number % STORES]),
                index: Arc::clone(&indexes[number % 2]),
                locks: Arc::clone(locks),
            };
            let worker = run_worker(Arc::clone(&chain), number % chain.len(), ports, Arc::clone(&shared), stop.clone());
            tasks.spawn(worker);
        }
        let feeder = tokio::spawn(feed(
            Arc::clone(&feeder_store),
            chain.batch_type.clone(),
            settings.rate,
            Arc::clone(&shared),
            format!("C{run}"),
            stop.clone(),
        ));
        progress("workers and feeder started; warming up");
        tokio::time::sleep(Duration::from_secs_f64(settings.warmup_for(workers))).await;
        progress("measuring");
        let zk_ports: Vec<u16> =
            backends.zookeeper.map_or_else(Vec::new, |z| (0..3).map(|n| z.client_port(n)).collect());
        for port in &zk_ports {
            zk::four_letter(*port, "srst");
        }
        let before = tokio::task::block_in_place(|| snapshot(backends, &database, &pids));
        shared.measuring.store(true, Ordering::Relaxed);
        let measured_started = Instant::now();
        let sampled = sample(backends.pg, &database, &zk_ports, Duration::from_secs_f64(settings.secs)).await;
        shared.measuring.store(false, Ordering::Relaxed);
        let elapsed = measured_started.elapsed().as_secs_f64();
        let zk_mntr: Vec<BTreeMap<String, String>> = zk_ports.iter().map(|p| acc::mntr(*p)).collect();
        let after = tokio::task::block_in_place(|| snapshot(backends, &database, &pids));

        progress("stopping");
        stop_sender.send_replace(true);
        let (fed, register_latencies) = feeder.await.expect("the feeder");
        stop_all(&mut tasks).await;
        close_all(&sessions).await;
        let backlog = shared.registered_at.lock().unwrap().len();
        Measured {
            workers,
            backend,
            locks_url: autocomp_toolkit::display_url(&locks_url),
            database: database.clone(),
            sboi_ports: services.iter().map(|s| s.port).collect(),
            load_before,
            ramp,
            established,
            connect_errors,
            connect_times,
            elapsed,
            fed,
            backlog,
            register_latencies,
            shared: Arc::clone(&shared),
            before,
            after,
            sampled,
            zk_mntr,
        }
    });
    drop(silenced);
    phases::follow(None);
    drop(services);
    measured
}

type Sessions = Vec<Option<Arc<dyn LockService>>>;

/// One lock session per worker, `CONNECTS_IN_FLIGHT` at a time: the sessions (`None` where
/// opening failed), the connect times and the failures.
async fn open_sessions(url: &str, workers: usize, shared: &Shared) -> (Sessions, Vec<Duration>, usize) {
    let mut connects = JoinSet::new();
    let mut sessions: Sessions = vec![None; workers];
    let mut connect_times = Vec::new();
    let mut connect_errors = 0usize;
    let mut next = 0usize;
    while next < workers || !connects.is_empty() {
        while next < workers && connects.len() < CONNECTS_IN_FLIGHT {
            let (url, number) = (url.to_owned(), next);
            connects.spawn(async move {
                let started = Instant::now();
                (number, open_locks(&url).await, started.elapsed())
            });
            next += 1;
        }
        let Some(joined) = connects.join_next().await else { break };
        let (number, opened, took) = joined.expect("a connect task");
        match opened {
            Ok(locks) => {
                sessions[number] = Some(locks);
                connect_times.push(took);
            }
            Err(e) => {
                connect_errors += 1;
                shared.error(&shared.counters.lock_errors, "open_locks", e);
            }
        }
    }
    (sessions, connect_times, connect_errors)
}

/// Samples connections and ZooKeeper's load every `SAMPLE_EVERY` for `window`.
async fn sample(pg: &Postgres, database: &str, zk_ports: &[u16], window: Duration) -> Sampled {
    let started = Instant::now();
    let mut sampled = Sampled::default();
    while started.elapsed() < window {
        tokio::time::sleep(window.saturating_sub(started.elapsed()).min(SAMPLE_EVERY)).await;
        let (all, active) = tokio::task::block_in_place(|| acc::pg_connections(pg, database));
        sampled.samples += 1;
        sampled.pg_connections_max = sampled.pg_connections_max.max(all);
        sampled.pg_active_max = sampled.pg_active_max.max(active);
        sampled.pg_active_sum += active;
        let zk: Vec<BTreeMap<String, String>> = zk_ports.iter().map(|p| acc::mntr(*p)).collect();
        let outstanding = zk.iter().map(|m| acc::mntr_number(m, "zk_outstanding_requests")).fold(0.0, f64::max);
        let connections: f64 = zk.iter().map(|m| acc::mntr_number(m, "zk_num_alive_connections")).sum();
        sampled.zk_outstanding_max = sampled.zk_outstanding_max.max(outstanding);
        sampled.zk_connections_max = sampled.zk_connections_max.max(connections);
    }
    sampled
}

/// Every worker stops on the signal (the runner's shutdown); a hung one is aborted.
async fn stop_all(tasks: &mut JoinSet<()>) {
    let deadline = Instant::now() + STOP_LIMIT;
    while !tasks.is_empty() {
        let left = deadline.saturating_duration_since(Instant::now());
        if tokio::time::timeout(left, tasks.join_next()).await.is_err() {
            eprintln!("{} workers did not stop within {STOP_LIMIT:?}; aborting them", tasks.len());
            tasks.abort_all();
            while tasks.join_next().await.is_some() {}
        }
    }
}

/// Closes every lock session (its locks deleted, the session or lease ended).
async fn close_all(sessions: &Sessions) {
    let mut closes = JoinSet::new();
    for locks in sessions.iter().flatten() {
        let locks = Arc::clone(locks);
        closes.spawn(async move { tokio::time::timeout(Duration::from_secs(5), locks.close()).await.ok() });
    }
    while closes.join_next().await.is_some() {}
}

/// The runner prints a line per result on stdout, as a cron pass's output; hundreds a second
/// would bury the report, so while the workers run stdout is /dev/null (the writes are still
/// made, as the runner makes them).
struct StdoutSilenced {
    saved: libc::c_int,
}

impl StdoutSilenced {
    fn start() -> Self {
        use std::io::Write;
        std::io::stdout().flush().ok();
        // SAFETY: plain descriptor calls on fd 1 and one we open; no Rust object owns them.
        unsafe {
            let saved = libc::dup(1);
            let null = libc::open(c"/dev/null".as_ptr(), libc::O_WRONLY);
            if saved >= 0 && null >= 0 {
                libc::dup2(null, 1);
            }
            if null >= 0 {
                libc::close(null);
            }
            Self { saved }
        }
    }
}

impl Drop for StdoutSilenced {
    fn drop(&mut self) {
        use std::io::Write;
        std::io::stdout().flush().ok();
        if self.saved >= 0 {
            // SAFETY: `saved` is the duplicate of the real stdout made in `start`.
            unsafe {
                libc::dup2(self.saved, 1);
                libc::close(self.saved);
            }
        }
    }
}
