//! ZooKeeper lock benchmark (issue #5): try-lock + unlock cycles per second and acquire
//! latency through the `LockService` port (`ZkLocks`, one session per client) on a local
//! standalone ZooKeeper, with 1 and 8 concurrent clients, on a fresh path per cycle (as every
//! batch lock is) and on a reused path per client; ZooKeeper writes per cycle from the
//! server's zxid (`srvr`) before and after. For reference, the floor: raw create + delete of
//! an ephemeral node with the same client crate, no lock logic.
//!
//!     cargo bench -p autocomp-e2e --bench locks
//!
//! `AUTOCOMP_BENCH_SECS` (default 5) is the measured time per row, after a 1 s warm-up.
//! Without the `--bench` argument that `cargo bench` passes (e.g. under
//! `cargo test --all-targets`) it only does a smoke run of a fraction of a second per row.

use std::sync::Arc;
use std::time::{Duration, Instant};

use autocomp_e2e::percentile;
use autocomp_e2e::zk::{Options, ZooKeeper};
use autocomp_framework::locks::{LockHolder, LockPath, LockService, ZkLocks};
use autocomp_model::{BatchId, ComponentName, Timestamp};
use zookeeper_client as zk;

const GOAL_CYCLES: f64 = 3_000.0;
const GOAL_WRITES: f64 = 2.0;

#[derive(Clone, Copy, PartialEq)]
enum Paths {
    /// A new batch id every cycle (the parent container exists).
    Fresh,
    /// The same path every cycle, one per client.
    Reused,
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    /// `ZkLocks::try_lock` + `Lock::release`.
    Locks,
    /// Raw `create(EPHEMERAL)` + `delete(-1)`: the floor.
    Raw,
}

struct Row {
    what: String,
    clients: usize,
    cycles: u64,
    seconds: f64,
    writes: i64,
    acquire: Vec<Duration>,
    cycle: Vec<Duration>,
}

impl Row {
    fn rate(&self) -> f64 {
        self.cycles as f64 / self.seconds
    }

    fn writes_per_cycle(&self) -> f64 {
        self.writes as f64 / self.cycles as f64
    }
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

fn holder() -> LockHolder {
    LockHolder { agent: "bench/0.1.0@localhost#1".into(), host: "localhost".into(), pid: 1, since: Timestamp::now() }
}

fn lock_path(paths: Paths, client: usize, n: u64) -> LockPath {
    let id = match paths {
        Paths::Fresh => format!("C{client}-{n:08}"),
        Paths::Reused => format!("C{client}"),
    };
    LockPath::Batch(ComponentName::new("bench").unwrap(), BatchId::new(id).unwrap())
}

/// One client's loop until `stop`: (acquire latencies, cycle latencies) of the measured part.
async fn lock_client(
    locks: Arc<ZkLocks>,
    client: usize,
    paths: Paths,
    measure_from: Instant,
    stop: Instant,
) -> (Vec<Duration>, Vec<Duration>) {
    let holder = holder();
    let (mut acquire, mut cycle) = (Vec::new(), Vec::new());
    for n in 0.. {
        let started = Instant::now();
        if started >= stop {
            break;
        }
        let path = lock_path(paths, client, n);
        let lock = locks.try_lock(&path, &holder, Duration::ZERO).await.expect("try_lock").expect("a free path");
        let acquired = started.elapsed();
        lock.release().await.expect("release");
        if started >= measure_from {
            acquire.push(acquired);
            cycle.push(started.elapsed());
        }
    }
    (acquire, cycle)
}

async fn raw_client(
    client: zk::Client,
    root: String,
    index: usize,
    paths: Paths,
    measure_from: Instant,
    stop: Instant,
) -> (Vec<Duration>, Vec<Duration>) {
    let options = zk::CreateMode::Ephemeral.with_acls(zk::Acls::anyone_all());
    let data = serde_json::to_vec(&holder()).unwrap();
    let (mut acquire, mut cycle) = (Vec::new(), Vec::new());
    for n in 0.. {
        let started = Instant::now();
        if started >= stop {
            break;
        }
        let path = match paths {
            Paths::Fresh => format!("{root}/R{index}-{n:08}"),
            Paths::Reused => format!("{root}/R{index}"),
        };
        client.create(&path, &data, &options).await.expect("raw create");
        let acquired = started.elapsed();
        client.delete(&path, None).await.expect("raw delete");
        if started >= measure_from {
            acquire.push(acquired);
            cycle.push(started.elapsed());
        }
    }
    (acquire, cycle)
}

fn measure(
    zk: &ZooKeeper,
    runtime: &tokio::runtime::Runtime,
    kind: Kind,
    clients: usize,
    paths: Paths,
    secs: f64,
) -> Row {
    let url = zk.url("bench", "10s");
    let warmup = Duration::from_secs_f64((secs / 5.0).min(1.0));
    let budget = Duration::from_secs_f64(secs);
    let (acquire, cycle, writes, seconds) = runtime.block_on(async {
        let mut tasks = tokio::task::JoinSet::new();
        let mut raw_root = String::new();
        let mut sessions = Vec::new();
        let mut raws = Vec::new();
        for _ in 0..clients {
            match kind {
                Kind::Locks => sessions.push(Arc::new(ZkLocks::connect(&url).await.expect("connect"))),
                Kind::Raw => raws.push(zk::Client::connect(&zk.hosts()).await.expect("connect")),
            }
        }
        if kind == Kind::Raw {
            // The raw floor's parent exists beforehand (a persistent node).
            let client = &raws[0];
            let persistent = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
            raw_root = format!("/raw-{}", Timestamp::now().0);
            client.create(&raw_root, &[], &persistent).await.expect("raw parent");
        } else {
            // Make the parent containers exist, as they do in a running pipeline.
            let warm = sessions[0].try_lock(&lock_path(paths, 99, 0), &holder(), Duration::ZERO).await;
            warm.expect("try_lock").expect("free").release().await.expect("release");
        }
        let start = Instant::now();
        let measure_from = start + warmup;
        let stop = measure_from + budget;
        for (index, locks) in sessions.iter().enumerate() {
            tasks.spawn(lock_client(Arc::clone(locks), index, paths, measure_from, stop));
        }
        for (index, client) in raws.iter().enumerate() {
            tasks.spawn(raw_client(client.clone(), raw_root.clone(), index, paths, measure_from, stop));
        }
        // The zxid at the start of the measured part (the clients are warming up meanwhile;
        // their in-flight cycle at each edge is the only inexactness).
        tokio::time::sleep_until(measure_from.into()).await;
        let zxid_before = zk.zxid(0);
        let (mut acquire, mut cycle) = (Vec::new(), Vec::new());
        while let Some(joined) = tasks.join_next().await {
            let (a, c) = joined.expect("a client task");
            acquire.extend(a);
            cycle.extend(c);
        }
        let seconds = measure_from.elapsed().as_secs_f64();
        let writes = zk.zxid(0) - zxid_before;
        for locks in &sessions {
            locks.close().await;
        }
        drop(raws);
        (acquire, cycle, writes, seconds)
    });
    let what = match (kind, paths) {
        (Kind::Locks, Paths::Fresh) => "ZkLocks try_lock + release, fresh path",
        (Kind::Locks, Paths::Reused) => "ZkLocks try_lock + release, reused path",
        (Kind::Raw, Paths::Fresh) => "raw create + delete, fresh path (floor)",
        (Kind::Raw, Paths::Reused) => "raw create + delete, reused path (floor)",
    };
    let (mut acquire, mut cycle) = (acquire, cycle);
    acquire.sort();
    cycle.sort();
    Row { what: what.into(), clients, cycles: cycle.len() as u64, seconds, writes, acquire, cycle }
}

fn main() {
    let bench = std::env::args().skip(1).any(|arg| arg == "--bench");
    let secs = if bench {
        std::env::var("AUTOCOMP_BENCH_SECS")
            .ok()
            .and_then(|s| s.parse::<f64>().ok())
            .filter(|s| *s > 0.0)
            .unwrap_or(5.0)
    } else {
        0.2
    };
    let zk = ZooKeeper::start(Options::default());
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("a runtime");
    println!(
        "ZooKeeper lock benchmark: standalone server on 127.0.0.1:{}, {secs} s per row{}",
        zk.client_port(0),
        if bench { "" } else { " (smoke run: pass --bench for real figures)" }
    );
    println!();
    println!("| what | clients | cycles/s | p50 / p99 acquire | p99 cycle | writes/cycle |");
    println!("|---|---:|---:|---:|---:|---:|");
    let mut rows = Vec::new();
    for kind in [Kind::Raw, Kind::Locks] {
        for paths in [Paths::Fresh, Paths::Reused] {
            for clients in [1, 8] {
                let row = measure(&zk, &runtime, kind, clients, paths, secs);
                println!(
                    "| {} | {} | {:.0} | {} / {} | {} | {:.2} |",
                    row.what,
                    row.clients,
                    row.rate(),
                    ms(percentile(&row.acquire, 0.5)),
                    ms(percentile(&row.acquire, 0.99)),
                    ms(percentile(&row.cycle, 0.99)),
                    row.writes_per_cycle()
                );
                rows.push((kind, paths, row));
            }
        }
    }
    println!();
    for (kind, paths, row) in &rows {
        if *kind == Kind::Locks && row.clients == 8 {
            let paths = if *paths == Paths::Fresh { "fresh" } else { "reused" };
            let (rate, writes) = (row.rate(), row.writes_per_cycle());
            println!(
                "goal, 8 clients, {paths} path: {rate:.0} cycles/s (goal >= {GOAL_CYCLES:.0}: {}), \
                 {writes:.2} writes/cycle (goal {GOAL_WRITES}: {})",
                if rate >= GOAL_CYCLES { "met" } else { "NOT met" },
                if (writes - GOAL_WRITES).abs() < 0.05 { "met" } else { "NOT met" },
            );
        }
    }
}
