//! The chaos run: a whole multi-host pipeline on hosts made of network namespaces (a 3-node
//! ZooKeeper ensemble on three hosts, the store on one: PostgreSQL, or with
//! `AUTOCOMP_CHAOS_STORE=service` the store service over a SQLite file; two `sboi serve` on
//! two, two worker hosts whose "cron" starts a pass after pass) while faults strike at random
//! times: a worker host partitioned past the session timeout and healed, the ZooKeeper
//! leader killed, a follower partitioned, the store restarted, an index service killed,
//! passes SIGKILLed and SIGSTOPped. At the end every batch is finished, and the ledger the
//! workers wrote shows none lost, none recorded twice, and no two work intervals on one
//! batch overlapping. It prints its figures.
//!
//! A second run has PostgreSQL as the only service, store and locks (no ZooKeeper), with the
//! faults that mean something there: a worker host partitioned from the database past the
//! lease, a pass SIGSTOPped past the lease, PostgreSQL crashed or restarted, passes killed.
//!
//! `cargo test` runs the bounded version (240 batches); `AUTOCOMP_CHAOS_SOAK=1` the soak
//! (1,200 batches), whose figures RELIABILITY.md keeps. `AUTOCOMP_CHAOS_SEED` repeats a run.
//! ZooKeeper runs as production should: its TLS port and the pipeline's digest identity on
//! every lock node (`AUTOCOMP_CHAOS_ZK=plain`: the plain port, no identity).

use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use autocomp_e2e::netns::{Host, Network};
use autocomp_e2e::services::Service;
use autocomp_e2e::zk::ZooKeeper;
use autocomp_e2e::{LedgerEntry, PROBED, Pipeline, wait_until};
use autocomp_model::Outcome;
use autocomp_test_servers::postgres::{Options, Postgres};

const PROBE: &str = env!("CARGO_BIN_EXE_probe-component");
const SESSION_TIMEOUT: Duration = Duration::from_secs(6);
const WORKERS: [&str; 2] = ["worker-1", "worker-2"];

/// xorshift64*: enough randomness for fault timing, and repeatable from its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn millis(&mut self, from: u64, to: u64) -> Duration {
        Duration::from_millis(from + self.below(to - from))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Fault {
    PartitionWorker,
    KillZkLeader,
    PartitionZkFollower,
    RestartStore,
    KillIndexService,
    KillPass,
    StopPass,
}

const FAULTS: [Fault; 7] = [
    Fault::PartitionWorker,
    Fault::KillZkLeader,
    Fault::PartitionZkFollower,
    Fault::RestartStore,
    Fault::KillIndexService,
    Fault::KillPass,
    Fault::StopPass,
];

/// The pass a worker host's "cron" is running now, for the faults that strike passes.
#[derive(Default)]
struct Running(Mutex<Option<u32>>);

impl Running {
    fn signal(&self, signal: libc::c_int) -> bool {
        let Some(pid) = *self.0.lock().unwrap() else { return false };
        // SAFETY: kill(2) on the pid of a pass this test started and has not reaped yet (the
        // driver clears it under the same lock before reaping).
        unsafe { libc::kill(pid as libc::pid_t, signal) == 0 }
    }
}

/// A driver (`drive`) on each worker host, with the pass each runs now for the faults that
/// strike passes.
struct Drivers {
    stop: Arc<AtomicBool>,
    runnings: Vec<Arc<Running>>,
    threads: Vec<std::thread::JoinHandle<BTreeMap<i32, u32>>>,
}

impl Drivers {
    fn start(network: &Network, pipeline: &Arc<Pipeline>, watch: bool) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let runnings: Vec<Arc<Running>> = WORKERS.iter().map(|_| Arc::default()).collect();
        let threads = WORKERS
            .iter()
            .zip(&runnings)
            .map(|(name, running)| {
                let (host, pipeline) = (network.host(name).clone(), Arc::clone(pipeline));
                let (running, stop) = (Arc::clone(running), Arc::clone(&stop));
                std::thread::spawn(move || drive(host, pipeline, running, stop, watch))
            })
            .collect();
        Self { stop, runnings, threads }
    }

    /// The pass running on a worker host picked by `rng`.
    fn any(&self, rng: &mut Rng) -> &Running {
        &self.runnings[rng.below(WORKERS.len() as u64) as usize]
    }

    /// Stops the drivers and waits for them: how their passes ended, by exit code.
    fn stop(mut self) -> BTreeMap<i32, u32> {
        self.stop.store(true, Ordering::Relaxed);
        let mut exits: BTreeMap<i32, u32> = BTreeMap::new();
        for thread in std::mem::take(&mut self.threads) {
            for (code, n) in thread.join().expect("a driver") {
                *exits.entry(code).or_default() += n;
            }
        }
        exits
    }
}

/// Should the test fail midway (unwinding), the drivers stop and their passes die before the
/// hosts go.
impl Drop for Drivers {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for running in &self.runnings {
            running.signal(libc::SIGCONT);
            running.signal(libc::SIGKILL);
        }
    }
}

/// The fault: a worker host picked by `rng` is partitioned past `bound` (the lock session or
/// lease: its locks go) and healed.
fn partition_a_worker(network: &Network, rng: &mut Rng, bound: Duration) {
    let worker = WORKERS[rng.below(WORKERS.len() as u64) as usize];
    network.partition(worker);
    hold(bound + rng.millis(500, 3_000));
    network.heal(worker);
}

/// How many of `ids` have their result recorded.
fn count_done(pipeline: &Pipeline, ids: &[autocomp_model::BatchId]) -> usize {
    ids.iter().filter(|id| !pipeline.events(id, PROBED).is_empty()).count()
}

/// How many faults of each kind struck.
fn by_kind(injected: &[(Fault, i64)]) -> BTreeMap<String, u32> {
    let mut by_kind: BTreeMap<String, u32> = BTreeMap::new();
    for (fault, _) in injected {
        *by_kind.entry(format!("{fault:?}")).or_default() += 1;
    }
    by_kind
}

/// Runs a pass after another on `host` (every 200 ms at most, as a busy cron), until
/// `stop`; returns how the passes ended, by exit code. With `watch`, each process is a
/// `--watch` loop making pass after pass, started again when it exits (a supervisor's
/// restart) and ended with SIGTERM at `stop`.
fn drive(
    host: Host,
    pipeline: Arc<Pipeline>,
    running: Arc<Running>,
    stop: Arc<AtomicBool>,
    watch: bool,
) -> BTreeMap<i32, u32> {
    let mut codes = BTreeMap::new();
    let log_path = pipeline.path(&format!("{}.log", host.name));
    let args: &[&str] = if watch { &["--watch"] } else { &[] };
    while !stop.load(Ordering::Relaxed) {
        let next = Instant::now() + Duration::from_millis(200);
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&log_path).expect("pass log");
        let child: Child =
            host.wrap(&pipeline.command(args)).stdout(Stdio::null()).stderr(log).spawn().expect("a pass starts");
        *running.0.lock().unwrap() = Some(child.id());
        let ended = finish_clearing(child, &running, watch.then_some(&*stop));
        *codes.entry(ended).or_default() += 1;
        wait_until(next, || stop.load(Ordering::Relaxed));
    }
    codes
}

/// Waits for a pass (at most 2 minutes; a `--watch` process until `stop`, then SIGTERM) and
/// forgets its pid before it is reaped.
fn finish_clearing(mut child: Child, running: &Running, stop: Option<&AtomicBool>) -> i32 {
    let limit = if stop.is_some() { Duration::from_secs(30 * 60) } else { Duration::from_secs(120) };
    let mut status = None;
    let mut terminated = false;
    wait_until(Instant::now() + limit, || {
        let mut guard = running.0.lock().unwrap();
        // Reap only under the lock, so a fault never signals a reaped (reusable) pid.
        if let Some(exited) = child.try_wait().unwrap() {
            *guard = None;
            status = Some(exited);
            return true;
        }
        if !terminated && stop.is_some_and(|stop| stop.load(Ordering::Relaxed)) {
            // SAFETY: kill(2) on our unreaped child (under the lock).
            unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
            terminated = true;
        }
        false
    });
    let status = match status {
        Some(status) => status,
        None => {
            let mut guard = running.0.lock().unwrap();
            child.kill().ok();
            *guard = None;
            child.wait().expect("reaped")
        }
    };
    // Killed by a signal: minus its number.
    status.code().unwrap_or_else(|| -status.signal().unwrap_or(0))
}

/// How long a fault lasts: a partition or an outage is held this long by design (nothing is
/// being waited for).
fn hold(duration: Duration) {
    std::thread::sleep(duration);
}

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as i64
}

/// Where the store runs: a PostgreSQL server, or the store service over a SQLite file.
enum Store {
    Postgres(Postgres),
    Service(Service),
}

impl Store {
    /// The fault: PostgreSQL crashes (SIGKILL, crash recovery on restart) or stops cleanly,
    /// by turns; the store service is killed and restarted.
    fn restart(&mut self, crash: bool) {
        match self {
            Store::Postgres(server) if crash => {
                server.crash();
                server.restart();
            }
            Store::Postgres(server) => server.restart(),
            Store::Service(service) => service.restart(),
        }
    }

    fn logs(&self) -> String {
        match self {
            Store::Postgres(server) => server.log_tail(),
            Store::Service(service) => service.logs(),
        }
    }
}

#[test]
fn a_pipeline_under_random_faults_finishes_every_batch_once_with_no_overlapping_work() {
    // The test itself runs on a host of the network (its own vantage point), so it reaches
    // every server the way the workers do.
    let network =
        Network::create(&["zk-1", "zk-2", "zk-3", "store", "index-1", "index-2", WORKERS[0], WORKERS[1], "control"]);
    let control = network.host("control").clone();
    control.within(move || chaos(network));
}

fn chaos(network: Network) {
    let soak = std::env::var("AUTOCOMP_CHAOS_SOAK").is_ok_and(|v| !v.is_empty() && v != "0");
    let batches = if soak { 1_200 } else { 240 };
    let limit = if soak { Duration::from_secs(30 * 60) } else { Duration::from_secs(4 * 60) };
    let seed = chaos_seed();
    let mut rng = Rng(seed);
    eprintln!("chaos: seed {seed} (AUTOCOMP_CHAOS_SEED={seed} repeats the fault plan), {batches} batches");

    // As production should run it: TLS and the pipeline's identity (AUTOCOMP_CHAOS_ZK=plain:
    // the plain port, no identity).
    let secure = match std::env::var("AUTOCOMP_CHAOS_ZK").as_deref() {
        Err(_) | Ok("" | "secure") => true,
        Ok("plain") => false,
        Ok(other) => panic!("AUTOCOMP_CHAOS_ZK={other:?}: expected secure (the default) or plain"),
    };
    let zk_options = ZooKeeper::on_hosts_options(&[network.host("zk-1"), network.host("zk-2"), network.host("zk-3")]);
    let mut zk = ZooKeeper::start(if secure { zk_options.secured() } else { zk_options });
    eprintln!(
        "chaos: ZooKeeper {}",
        if secure { "over TLS with the pipeline's identity" } else { "plain, no identity" }
    );
    let store_host = network.host("store");
    let on_postgres = match std::env::var("AUTOCOMP_CHAOS_STORE").as_deref() {
        Err(_) | Ok("" | "postgres") => true,
        Ok("service") => false,
        Ok(other) => panic!("AUTOCOMP_CHAOS_STORE={other:?}: expected postgres (the default) or service"),
    };
    let (mut store, store_url, pipeline) = if on_postgres {
        let options = Options { network: Some((store_host.netns.clone(), store_host.addr)), ..Options::default() };
        let server = Postgres::start_with(options);
        let url = server.unique_database();
        let pipeline = Pipeline::with_store(PROBE, &url);
        (Store::Postgres(server), url, pipeline)
    } else {
        let pipeline = Pipeline::new(PROBE);
        let db = format!("sqlite://{}?synchronous=normal", pipeline.path("store.db").display());
        let mut service = Service::store_unstarted(&db, &pipeline.path("")).on(store_host, 7070);
        service.restart();
        let url = service.url();
        (Store::Service(service), url, pipeline)
    };
    eprintln!("chaos: the store is {}", if on_postgres { "PostgreSQL" } else { "the store service over SQLite" });
    let pipeline = Arc::new(pipeline);
    let log_dir = pipeline.path("");
    let mut indexes: Vec<Service> = (1..=2)
        .map(|n| {
            let name = format!("index-{n}");
            let mut index = Service::index_unstarted(&store_url, &pipeline.path(&name), &log_dir, &name)
                .on(network.host(&name), 7071);
            index.restart();
            index
        })
        .collect();
    pipeline.use_backend("store", &store_url);
    pipeline.use_backend("index", &format!("{},{}", indexes[0].url(), indexes[1].url()));
    let session_timeout = format!("{}s", SESSION_TIMEOUT.as_secs());
    pipeline.use_locks(&if secure {
        zk.secure_url("autocomp", &session_timeout)
    } else {
        zk.url("autocomp", &session_timeout)
    });
    let (work_time, threads, queue) = if soak { ("400ms", 4, 8) } else { ("700ms", 2, 4) };
    pipeline.configure(&format!(
        "max_threads = {threads}\nqueue_size = {queue}\nmax_attempts = 1000\n\n[settings]\nwork_time = \
         \"{work_time}\"\nledger = \"{}\"\n",
        pipeline.path("ledger.txt").display()
    ));
    let ids = pipeline.register(batches);
    // Counting reads every batch: at most once a second.
    let mut counted = (Instant::now(), 0);
    let mut done = |pipeline: &Pipeline| {
        if counted.0 <= Instant::now() {
            counted = (Instant::now() + Duration::from_secs(1), count_done(pipeline, &ids));
        }
        counted.1
    };

    let drivers = Drivers::start(&network, &pipeline, false);

    // Faults until every batch is done (or the limit): one at a time, 1-4 s apart.
    let started = Instant::now();
    let deadline = started + limit;
    let mut injected: Vec<(Fault, i64)> = Vec::new();
    while done(&pipeline) < batches && Instant::now() < deadline {
        let quiet_until = Instant::now() + rng.millis(1_000, 4_000);
        wait_until(quiet_until.min(deadline), || done(&pipeline) == batches);
        if done(&pipeline) == batches {
            break;
        }
        let fault = FAULTS[rng.below(FAULTS.len() as u64) as usize];
        let at = now_ms();
        match fault {
            Fault::PartitionWorker => partition_a_worker(&network, &mut rng, SESSION_TIMEOUT),
            Fault::KillZkLeader => {
                let leader = zk.leader();
                zk.kill(leader);
                hold(rng.millis(1_000, 4_000));
                zk.restart(leader);
            }
            Fault::PartitionZkFollower => {
                let leader = zk.leader();
                let follower = (leader + 1 + rng.below(2) as usize) % 3;
                let host = format!("zk-{}", follower + 1);
                network.partition(&host);
                hold(SESSION_TIMEOUT + rng.millis(500, 3_000));
                network.heal(&host);
            }
            Fault::RestartStore => store.restart(rng.below(2) == 0),
            Fault::KillIndexService => {
                let index = &mut indexes[rng.below(2) as usize];
                index.kill();
                hold(rng.millis(1_000, 5_000));
                index.restart();
            }
            Fault::KillPass => {
                if !drivers.any(&mut rng).signal(libc::SIGKILL) {
                    continue; // no pass running on that host just then: no fault
                }
            }
            Fault::StopPass => {
                let running = drivers.any(&mut rng);
                if !running.signal(libc::SIGSTOP) {
                    continue;
                }
                // Shorter than the session: a GC pause or a swapped-out process. Longer
                // freezes are fenced (tests/zookeeper.rs, the frozen holder).
                hold(rng.millis(300, 1_500));
                running.signal(libc::SIGCONT);
            }
        }
        injected.push((fault, at));
    }
    let elapsed = started.elapsed();
    let exits = drivers.stop();
    assert_eq!(
        count_done(&pipeline, &ids),
        batches,
        "not every batch finished within {limit:?} (seed {seed}); faults: {injected:?}\n{}\n{}",
        store.logs(),
        zk.logs()
    );

    let (ledger, successes) = assert_each_batch_once(&pipeline, &ids, &[]);
    // How long the pipeline stood still after each fault: until the next result recorded.
    let stall = |at: i64| successes.iter().find(|t| **t > at).map(|t| Duration::from_millis((t - at) as u64));
    let longest = injected.iter().filter_map(|(fault, at)| Some((stall(*at)?, *fault))).max();
    let by_kind = by_kind(&injected);
    let interrupted = ledger - batches;
    eprintln!(
        "chaos figures (seed {seed}): {batches} batches in {:.0} s; {} faults {by_kind:?}; passes by exit code \
         {exits:?}; {interrupted} interrupted work intervals redone; 0 lost, 0 recorded twice, 0 overlapping \
         work intervals; longest from a fault to the next result: {:?}",
        elapsed.as_secs_f64(),
        injected.len(),
        longest.map(|(stall, fault)| format!("{:.1} s ({fault:?})", stall.as_secs_f64())),
    );
    assert!(!injected.is_empty(), "no fault struck: the run was too short to say anything");
}

/// The PostgreSQL workers' lease: a partition or a freeze is held past it.
const LEASE: Duration = Duration::from_secs(4);
/// The faults that mean something when PostgreSQL is the only service.
const POSTGRES_FAULTS: [Fault; 4] = [Fault::PartitionWorker, Fault::RestartStore, Fault::KillPass, Fault::StopPass];

/// The bounded chaos run with PostgreSQL as the only service, store and locks (`lease=4s`):
/// worker hosts partitioned from the database past the lease, passes SIGSTOPped past the
/// lease (the other host takes their locks over; woken, they find their lease lost),
/// passes SIGKILLed, PostgreSQL crashed or restarted. The workers run `--watch`: only a
/// process that has watched a dead holder's beat for a whole lease takes its locks over.
#[test]
fn a_pipeline_on_postgres_locks_under_random_faults_finishes_every_batch_once() {
    let network = Network::create(&["store", WORKERS[0], WORKERS[1], "control"]);
    let control = network.host("control").clone();
    control.within(move || chaos_on_postgres_locks(network));
}

fn chaos_on_postgres_locks(network: Network) {
    let batches = 120;
    let limit = Duration::from_secs(4 * 60);
    let seed = chaos_seed();
    let mut rng = Rng(seed);
    eprintln!("chaos on PostgreSQL locks: seed {seed} (AUTOCOMP_CHAOS_SEED={seed} repeats it), {batches} batches");
    let store_host = network.host("store");
    let server = Postgres::start_with(Options {
        network: Some((store_host.netns.clone(), store_host.addr)),
        ..Options::default()
    });
    let url = server.unique_database();
    let pipeline = Pipeline::with_store(PROBE, &url);
    pipeline.use_locks(&format!("{url}?lease={}s", LEASE.as_secs()));
    pipeline.configure(&format!(
        "max_threads = 2\nqueue_size = 4\nmax_attempts = 1000\nwatch_heartbeat = \"1s\"\n\n[settings]\nwork_time = \
         \"500ms\"\nledger = \"{}\"\n",
        pipeline.path("ledger.txt").display()
    ));
    let ids = pipeline.register(batches);
    let pipeline = Arc::new(pipeline);
    let drivers = Drivers::start(&network, &pipeline, true);

    let started = Instant::now();
    let deadline = started + limit;
    let mut injected: Vec<(Fault, i64)> = Vec::new();
    let mut server = Store::Postgres(server);
    let mut freezes: Vec<Freeze> = Vec::new();
    while count_done(&pipeline, &ids) < batches && Instant::now() < deadline {
        hold(rng.millis(1_000, 4_000)); // quiet between faults
        // Every kind once first (a bounded run is short), then at random.
        let kind = if injected.len() < POSTGRES_FAULTS.len() { injected.len() as u64 } else { rng.below(4) };
        let fault = POSTGRES_FAULTS[kind as usize];
        let at = now_ms();
        let running = drivers.any(&mut rng);
        match fault {
            Fault::PartitionWorker => partition_a_worker(&network, &mut rng, LEASE),
            Fault::RestartStore => server.restart(rng.below(2) == 0),
            Fault::KillPass if !running.signal(libc::SIGKILL) => continue,
            Fault::StopPass => {
                let pid = *running.0.lock().unwrap();
                let (Some(pid), true) = (pid, running.signal(libc::SIGSTOP)) else { continue };
                // Past the lease: the other host takes the frozen holder's locks over.
                let stopped = now_ns();
                hold(LEASE + rng.millis(500, 2_000));
                running.signal(libc::SIGCONT);
                freezes.push(Freeze { pid, stopped, woken: now_ns() });
            }
            _ => {}
        }
        injected.push((fault, at));
    }
    let elapsed = started.elapsed();
    let exits = drivers.stop();
    let done = count_done(&pipeline, &ids);
    assert_eq!(
        done,
        batches,
        "not every batch finished within {limit:?} (seed {seed}); faults: {injected:?}\n{}",
        server.logs()
    );
    let (ledger, _) = assert_each_batch_once(&pipeline, &ids, &freezes);
    let by_kind = by_kind(&injected);
    eprintln!(
        "chaos figures on PostgreSQL locks (seed {seed}): {batches} batches in {:.0} s; {} faults {by_kind:?}; \
         worker processes by exit code {exits:?}; {} interrupted work intervals redone; 0 lost, 0 recorded twice, \
         0 overlapping work intervals but for {} passes frozen past the lease (their frozen time)",
        elapsed.as_secs_f64(),
        injected.len(),
        ledger - batches,
        freezes.len(),
    );
    assert!(!injected.is_empty(), "no fault struck: the run was too short to say anything");
}

/// `AUTOCOMP_CHAOS_SEED`, or one from the clock; never 0 (xorshift never leaves it).
fn chaos_seed() -> u64 {
    let seed = match std::env::var("AUTOCOMP_CHAOS_SEED") {
        Ok(text) => text.trim().parse::<u64>().unwrap_or_else(|e| panic!("AUTOCOMP_CHAOS_SEED={text:?}: {e}")),
        Err(_) => SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64,
    };
    seed.max(1)
}

/// A pass SIGSTOPped past its lease, from `stopped` to `woken` (ns since the epoch, the
/// ledger's clock).
struct Freeze {
    pid: u32,
    stopped: u128,
    woken: u128,
}

/// How long a pass woken after its lease was taken over may still run its work before it
/// notices the loss: its lease's watch runs at once on waking, and cancelled work has a
/// fifth of the lease to end.
const WOKEN_GRACE: Duration = Duration::from_millis(LEASE.as_millis() as u64 / 5 + 500);

fn now_ns() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos()
}

/// Whether two work intervals on one batch may share `[from, to)`: only while one of them
/// was frozen (it did nothing then), or just after it woke ([`WOKEN_GRACE`]; its result is
/// then refused: each batch is still recorded once).
fn frozen_through(freezes: &[Freeze], pids: [u32; 2], from: u128, to: u128) -> bool {
    freezes.iter().any(|f| pids.contains(&f.pid) && f.stopped <= from && to <= f.woken + WOKEN_GRACE.as_nanos())
}

/// The ledger and the store: each batch recorded once, successfully, worked on at least
/// once and never by two at once (but for a frozen pass's frozen time: `freezes`), no run
/// left open. Returns the number of work intervals and the times of the results, sorted.
fn assert_each_batch_once(
    pipeline: &Pipeline,
    ids: &[autocomp_model::BatchId],
    freezes: &[Freeze],
) -> (usize, Vec<i64>) {
    let mut recorded_twice = 0;
    let mut successes: Vec<i64> = Vec::new();
    for id in ids {
        let results = pipeline.events(id, PROBED);
        if results.len() != 1 {
            recorded_twice += 1;
        }
        assert!(results.iter().all(|e| e.outcome == Outcome::Success), "{id}: {results:?}");
        successes.extend(results.iter().map(|e| e.at.millis()));
    }
    let ledger = pipeline.ledger();
    let mut by_batch: BTreeMap<&str, Vec<&LedgerEntry>> = BTreeMap::new();
    for entry in &ledger {
        by_batch.entry(entry.batch.as_str()).or_default().push(entry);
    }
    for (batch, entries) in &by_batch {
        for (i, a) in entries.iter().enumerate() {
            for b in &entries[i + 1..] {
                let (from, to) = (a.start.max(b.start), a.end.min(b.end));
                assert!(
                    from >= to || frozen_through(freezes, [a.pid, b.pid], from, to),
                    "work on {batch} overlapped: {a:?} and {b:?}"
                );
            }
        }
    }
    let lost = ids.iter().filter(|id| !by_batch.contains_key(id.as_str())).count();
    assert_eq!((recorded_twice, lost), (0, 0), "recorded twice, lost");
    assert!(pipeline.open_runs().is_empty(), "runs left open: {:?}", pipeline.open_runs());
    successes.sort_unstable();
    (ledger.len(), successes)
}
