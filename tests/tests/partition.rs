//! Real network partitions between hosts, each host a Linux network namespace on a bridge of
//! the test's own (tests/src/netns.rs). The probe's ledger, written by every host, shows no
//! batch worked on by two hosts at once, and every batch finished once, in each setting:
//!
//! - ZooKeeper locks (plain, and over TLS with the pipeline's identity), a worker host cut
//!   from everything: it keeps running and hears nothing, yet stops its work before the
//!   server can expire its session and another host take its batches over;
//! - PostgreSQL locks and store (one database server, the only service): a worker host cut
//!   from it stops its work (its lease Lost at half the lease, on its own clock) before
//!   another host, which must see its beat unchanged for a full lease, takes over;
//! - ZooKeeper locks and a PostgreSQL store, a worker cut from the database only (ZooKeeper
//!   still reachable, so its locks hold): it finishes its work but cannot record it, gives
//!   its batches up, and another host finishes each once;
//! - the same, cut from both: the ZooKeeper session bounds it as with the embedded store.

use std::process::Child;
use std::time::{Duration, Instant};

use autocomp_e2e::netns::{Host, Network};
use autocomp_e2e::zk::ZooKeeper;
use autocomp_e2e::{PROBED, Pipeline, disjoint_by_batch, finish, wait_until};
use autocomp_model::Outcome;
use autocomp_test_servers::postgres::{Options, Postgres};

const PROBE: &str = env!("CARGO_BIN_EXE_probe-component");
/// The ZooKeeper session timeout and the PostgreSQL lease alike: how long a silent holder's
/// locks outlive it.
const EXPIRY: Duration = Duration::from_secs(4);
/// How long a batch's work takes: longer than the expiry, so that the cut strikes mid-work.
const WORK_TIME: &str = "6s";
/// The exit code of a pass whose lock service was lost (autocomp-framework's `LOCKS_LOST`),
/// and of one whose store could not be reached (`UNREACHABLE`).
const LOCKS_LOST: i32 = 4;
const UNREACHABLE: i32 = 5;
/// How long a PostgreSQL store call retries through an outage (`retry_for`; the default is
/// 30 s): the cut-off worker's results fail soon after its work ends.
const STORE_RETRY: Duration = Duration::from_secs(3);

/// A worker process on a test host, waited for by a thread of its own (so the test knows
/// when it exited while it runs other passes); killed if the test ends first, so that no
/// process outlives the namespaces.
struct Worker {
    pid: u32,
    exited: Option<std::thread::JoinHandle<(Instant, std::process::Output)>>,
}

impl Worker {
    fn start(child: Child) -> Worker {
        let pid = child.id();
        let exited = std::thread::spawn(move || {
            let output = child.wait_with_output().expect("the worker is waited for");
            (Instant::now(), output)
        });
        Worker { pid, exited: Some(exited) }
    }

    fn has_exited(&self) -> bool {
        self.exited.as_ref().is_none_or(|waiter| waiter.is_finished())
    }

    fn join(&mut self) -> (Instant, std::process::Output) {
        self.exited.take().expect("joined once").join().expect("the waiter")
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if !self.has_exited() {
            // SAFETY: kill(2) on our child's pid; its waiter thread has not reaped it yet.
            unsafe { libc::kill(self.pid as libc::pid_t, libc::SIGKILL) };
        }
    }
}

/// Which lock service the workers use.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Locks {
    ZooKeeper {
        secure: bool,
    },
    /// `postgres://` on the store's own server, lease [`EXPIRY`].
    Postgres,
}

/// What worker A is cut from.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Cut {
    /// Its host's link goes down: it reaches nothing.
    Everything,
    /// Only the database host; ZooKeeper and the other worker are still reachable.
    Database,
}

/// One partition test: the lock service, whether the store is PostgreSQL (on a host of its
/// own) or the embedded SQLite file, and the cut.
#[derive(Debug, Clone, Copy)]
struct Setting {
    locks: Locks,
    postgres_store: bool,
    cut: Cut,
}

#[test]
fn a_partitioned_worker_stops_before_another_host_takes_its_batches_over() {
    partitioned(Setting { locks: Locks::ZooKeeper { secure: false }, postgres_store: false, cut: Cut::Everything });
}

/// The same over `zks://` with the pipeline's identity: TLS reconnects and authenticated
/// sessions keep the same bound.
#[test]
fn a_partitioned_worker_stops_in_time_with_zookeeper_auth_and_tls() {
    partitioned(Setting { locks: Locks::ZooKeeper { secure: true }, postgres_store: false, cut: Cut::Everything });
}

/// PostgreSQL is the only service (locks and store): cut from it, a worker stops at its
/// lease's loss, before another host may take over.
#[test]
fn a_worker_cut_from_postgres_locks_stops_before_another_host_takes_its_batches_over() {
    partitioned(Setting { locks: Locks::Postgres, postgres_store: true, cut: Cut::Everything });
}

/// ZooKeeper locks, PostgreSQL store, the worker cut from the database only: its locks hold
/// and its work ends, but its results cannot be recorded; the batches are given up and
/// finished once by the other host.
#[test]
fn a_worker_cut_from_its_postgres_store_only_gives_its_batches_up_to_be_finished_once() {
    partitioned(Setting { locks: Locks::ZooKeeper { secure: false }, postgres_store: true, cut: Cut::Database });
}

/// ZooKeeper locks, PostgreSQL store, the worker cut from both.
#[test]
fn a_worker_cut_from_zookeeper_and_its_postgres_store_stops_before_the_session_expires() {
    partitioned(Setting { locks: Locks::ZooKeeper { secure: false }, postgres_store: true, cut: Cut::Everything });
}

/// A store call on a pooled connection the network then cut off (its server silent, no
/// reset) fails as unavailable within the store's bounds: the connection is given up once
/// what it sent stays unacknowledged for `SILENT_CONNECTION_LIMIT`, then a fresh one is tried
/// until `retry_for`. Unbounded, the call would wait out the kernel's retransmissions (about
/// 15 minutes), and a worker would hold its batches' locks that long.
#[test]
fn a_store_call_on_a_connection_the_network_cut_off_fails_within_seconds() {
    let network = Network::create(&["db", "control"]);
    let db = network.host("db");
    let server = Postgres::start_with(Options { network: Some((db.netns.clone(), db.addr)), ..Options::default() });
    let url = format!("{}?retry_for=2s&pool_size=1&listen=off", server.unique_database());
    let control = network.host("control").clone();
    let (failed, took) = control.within(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            let store = autocomp_store::open_store(&url).await.expect("the store opens");
            store.head().await.expect("the connection the call will use is made before the cut");
            network.cut_between("control", "db");
            let started = Instant::now();
            let answer = tokio::time::timeout(Duration::from_secs(90), store.head()).await;
            let took = started.elapsed();
            network.mend_between("control", "db");
            (answer.map(|call| call.map_err(|e| (e.is_unavailable(), e.to_string()))), took)
        })
    });
    // What was sent waits SILENT_CONNECTION_LIMIT; a fresh connection then `connect_timeout`
    // (5 s) past the 2 s of retries; the rest is slack for a loaded machine.
    let bound = autocomp_store::postgres::SILENT_CONNECTION_LIMIT + Duration::from_secs(15);
    match failed {
        Err(_) => panic!("the call was still waiting after {took:?}: a cut connection is not bounded"),
        Ok(Ok(head)) => panic!("the call answered across the cut: {head:?}"),
        Ok(Err((unavailable, message))) => {
            assert!(unavailable, "the cut is an outage: {message}");
            assert!(took < bound, "the call failed only after {took:?} (bound {bound:?}): {message}");
            eprintln!("a call on a cut connection failed after {took:?}: {message}");
        }
    }
}

fn partitioned(setting: Setting) {
    let network = Network::create(&["zk", "db", "worker-a", "worker-b", "control"]);
    // The test runs on a host of the network too, so it reaches the database as workers do.
    let control = network.host("control").clone();
    control.within(move || partitioned_on(&network, setting));
}

/// The servers a setting needs, kept alive for the test.
struct Servers {
    _zk: Option<ZooKeeper>,
    _db: Option<Postgres>,
}

/// Starts the servers, points the pipeline at them; returns them and the pipeline.
fn serve(network: &Network, setting: Setting) -> (Servers, Pipeline) {
    let db = setting.postgres_store.then(|| {
        let host = network.host("db");
        Postgres::start_with(Options { network: Some((host.netns.clone(), host.addr)), ..Options::default() })
    });
    let pipeline = match &db {
        Some(server) => {
            Pipeline::with_store(PROBE, &format!("{}?retry_for={}s", server.unique_database(), STORE_RETRY.as_secs()))
        }
        None => Pipeline::new(PROBE),
    };
    let zk = match setting.locks {
        Locks::ZooKeeper { secure } => {
            let options = ZooKeeper::on_hosts_options(&[network.host("zk")]);
            let zk = ZooKeeper::start(if secure { options.secured() } else { options });
            let expiry = format!("{}s", EXPIRY.as_secs());
            pipeline.use_locks(&if secure { zk.secure_url("autocomp", &expiry) } else { zk.url("autocomp", &expiry) });
            Some(zk)
        }
        Locks::Postgres => {
            let store = db.as_ref().expect("PostgreSQL locks live in the store's database");
            let url = store.url(&database_of(&pipeline));
            pipeline.use_locks(&format!("{url}?lease={}s", EXPIRY.as_secs()));
            None
        }
    };
    (Servers { _zk: zk, _db: db }, pipeline)
}

/// The database name of the pipeline's `postgres://` store.
fn database_of(pipeline: &Pipeline) -> String {
    let config = std::fs::read_to_string(pipeline.config_dir().join("autocomp.toml")).unwrap();
    let store = config.lines().find_map(|l| l.strip_prefix("store = \"")).expect("a store line");
    let path = store.trim_end_matches('"').rsplit('/').next().unwrap();
    path.split('?').next().unwrap().to_owned()
}

fn partitioned_on(network: &Network, setting: Setting) {
    let (_servers, pipeline) = serve(network, setting);
    let ids = pipeline.register(4);
    let started_dir = pipeline.path("started");
    std::fs::create_dir_all(&started_dir).unwrap();
    pipeline.configure(&format!(
        "max_threads = 4\nqueue_size = 4\nwatch_heartbeat = \"1s\"\n\n[settings]\nwork_time = \"{WORK_TIME}\"\nledger = \"{}\"\nstarted = \"{}\"\n",
        pipeline.path("ledger.txt").display(),
        started_dir.display()
    ));
    let started = || std::fs::read_dir(&started_dir).map(|d| d.count()).unwrap_or(0);

    // Host A claims all four batches and works on them.
    let mut a = Worker::start(network.host("worker-a").wrap(&pipeline.command(&[])).spawn().expect("worker A"));
    // `ip netns exec` becomes the program: this is the probe's pid, as its ledger has it.
    let a_pid = a.pid;
    let deadline = Instant::now() + Duration::from_secs(30);
    assert!(wait_until(deadline, || started() == 4), "worker A did not start on all four batches");

    // A is cut off. Host B runs a pass after pass, as its cron would, until the batches are
    // done: it can take them only once A's locks are free. With PostgreSQL locks only a
    // process that has watched A's beat stand still for a whole lease frees them, and a cron
    // pass lives shorter than that: there B runs `--watch`, one process making pass after
    // pass.
    match setting.cut {
        Cut::Everything => network.partition("worker-a"),
        Cut::Database => network.cut_between("worker-a", "db"),
    }
    let cut = Instant::now();
    let host_b = network.host("worker-b");
    let (passes, b_said, finished) = match setting.locks {
        Locks::ZooKeeper { .. } => run_b_until_done(&pipeline, host_b, &ids, cut),
        Locks::Postgres => watch_b_until_done(&pipeline, host_b, &ids, cut),
    };
    match setting.cut {
        Cut::Everything => network.heal("worker-a"),
        Cut::Database => network.mend_between("worker-a", "db"),
    }
    if !finished {
        // SAFETY: kill(2) on our child's pid; its waiter thread has not reaped it yet.
        unsafe { libc::kill(a.pid as libc::pid_t, libc::SIGKILL) };
        let a_said = show(&a.join().1);
        panic!(
            "the batches were not finished within 90 s of the cut ({passes} passes of B): {b_said}\nA said: {a_said}"
        );
    }
    assert!(wait_until(Instant::now() + Duration::from_secs(30), || a.has_exited()), "worker A never stopped");
    let (a_exited_at, a_output) = a.join();
    let a_exited_after = a_exited_at - cut;
    let a_said = show(&a_output);
    let expected_exit = match setting.cut {
        Cut::Everything => LOCKS_LOST,
        Cut::Database => UNREACHABLE,
    };
    assert_eq!(a_output.status.code(), Some(expected_exit), "how the cut-off worker exits: {a_said}");
    assert!(a_output.stdout.is_empty(), "the cut-off worker recorded nothing: {a_said}");

    // The ledger every host wrote: A's work ends before B's begins on every batch.
    let ledger = pipeline.ledger();
    let by_batch = disjoint_by_batch(&ledger);
    for id in &ids {
        let results = pipeline.events(id, PROBED);
        assert_eq!(results.iter().map(|e| e.outcome).collect::<Vec<_>>(), [Outcome::Success], "{id}: {results:?}");
        let entries = &by_batch[id.as_str()];
        assert_eq!(entries.len(), 2, "{id}: A's cut-off work and B's: {entries:?}");
        assert_eq!(entries[0].pid, a_pid, "{id}: A worked first: {entries:?}");
    }
    assert_eq!(b_said.matches(" Probed success").count(), 4, "B recorded each batch once: {b_said}");
    assert!(pipeline.open_runs().is_empty(), "runs left open: {:?}", pipeline.open_runs());
    let a_last_end = ledger.iter().filter(|e| e.pid == a_pid).map(|e| e.end).max().unwrap();
    let b_first_start = ledger.iter().filter(|e| e.pid != a_pid).map(|e| e.start).min().unwrap();
    let since_cut = |ns: u128| Duration::from_nanos(ns.saturating_sub(cut_ns(cut)) as u64);
    let (a_worked_after, b_began_after) = (since_cut(a_last_end), since_cut(b_first_start));
    eprintln!(
        "partition ({setting:?}): A stopped working {a_worked_after:?} and exited {a_exited_after:?} after the cut \
         (expiry {EXPIRY:?}); B began {b_began_after:?} after the cut, {:?} after A's last work ended, and finished \
         all in {passes} passes",
        Duration::from_nanos((b_first_start - a_last_end) as u64),
    );
    assert_bounds(setting, a_worked_after, a_exited_after, b_began_after, &a_said);
}

/// Runs passes of B on `host` until every batch has its result (at most 90 s after `cut`):
/// how many passes, what they said, whether all were done.
fn run_b_until_done(
    pipeline: &Pipeline,
    host: &Host,
    ids: &[autocomp_model::BatchId],
    cut: Instant,
) -> (u32, String, bool) {
    let mut passes = 0;
    let mut b_said = String::new();
    let all_done = || ids.iter().all(|id| !pipeline.events(id, PROBED).is_empty());
    let finished = wait_until(cut + Duration::from_secs(90), || {
        passes += 1;
        let pass = finish(host.wrap(&pipeline.command(&[])).spawn().expect("worker B"), Duration::from_secs(60));
        assert!(matches!(pass.code, Some(0 | 1)), "worker B: {}", pass.show());
        b_said.push_str(&pass.show());
        all_done()
    });
    (passes, b_said, finished)
}

/// Runs B with `--watch` (its heartbeat 1 s) until every batch has its result (at most 90 s
/// after `cut`), then ends it with SIGTERM: 1 (process), what it said, whether all were done.
fn watch_b_until_done(
    pipeline: &Pipeline,
    host: &Host,
    ids: &[autocomp_model::BatchId],
    cut: Instant,
) -> (u32, String, bool) {
    let mut b = Worker::start(host.wrap(&pipeline.command(&["--watch"])).spawn().expect("worker B"));
    let all_done = || ids.iter().all(|id| !pipeline.events(id, PROBED).is_empty());
    let finished = wait_until(cut + Duration::from_secs(90), || {
        assert!(!b.has_exited(), "worker B --watch exited: {}", show(&b.join().1));
        all_done()
    });
    // SAFETY: kill(2) on our child's pid; its waiter thread has not reaped it (it runs).
    unsafe { libc::kill(b.pid as libc::pid_t, libc::SIGTERM) };
    assert!(wait_until(Instant::now() + Duration::from_secs(30), || b.has_exited()), "B --watch ignored SIGTERM");
    let output = b.join().1;
    assert_eq!(output.status.code(), Some(0), "B --watch after SIGTERM: {}", show(&output));
    (1, show(&output), finished)
}

fn show(output: &std::process::Output) -> String {
    format!(
        "exit {:?}\n--- stdout\n{}--- stderr\n{}",
        output.status.code(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// The bounds each setting promises, measured from the cut.
fn assert_bounds(
    setting: Setting,
    a_worked_after: Duration,
    a_exited_after: Duration,
    b_began: Duration,
    a_said: &str,
) {
    match (setting.locks, setting.cut) {
        (_, Cut::Database) => {
            // A's locks held (ZooKeeper reachable): its work ran to its end, and B began
            // only once A gave the batches up.
            assert!(a_worked_after + Duration::from_secs(1) >= EXPIRY, "A's work ended early: {a_worked_after:?}");
            assert!(b_began > a_worked_after, "B began {b_began:?}, before A's work ended");
            assert!(
                b_began < a_exited_after + Duration::from_secs(15),
                "B began {b_began:?}: too long after A gave up"
            );
        }
        (Locks::ZooKeeper { .. }, Cut::Everything) => {
            // Its work stops before the session can expire. Exiting comes later with a
            // PostgreSQL store (it first tries to give its claims back; measured 16-18 s),
            // so only the embedded store's exit is bounded here.
            if !setting.postgres_store {
                assert!(a_exited_after < EXPIRY, "A exited {a_exited_after:?} after the cut: {a_said}");
            }
            assert!(a_worked_after < EXPIRY, "A worked {a_worked_after:?} past the cut");
            assert!(b_began < EXPIRY + Duration::from_secs(15), "B took over only {b_began:?} after the cut");
        }
        (Locks::Postgres, Cut::Everything) => {
            // A's last renewal came at most a tenth of the lease before the cut; B may take
            // over only after seeing that beat unchanged for a full lease, and A's work must
            // be over by then (Lost at half the lease, plus the grace for cancelled work).
            let earliest_takeover = EXPIRY * 9 / 10;
            assert!(a_worked_after < earliest_takeover, "A worked {a_worked_after:?} past the cut");
            assert!(b_began >= earliest_takeover, "B took over {b_began:?} after the cut: before a lease");
            assert!(b_began < EXPIRY + Duration::from_secs(15), "B took over only {b_began:?} after the cut");
            // Its exit is not bounded here, its work is: exiting, it first tries to give its
            // claims back to the unreachable store (measured 16 s after the cut).
        }
    }
}

/// `at` as nanoseconds since the epoch, the ledger's clock.
fn cut_ns(at: Instant) -> u128 {
    let ago = at.elapsed();
    (std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap() - ago).as_nanos()
}
