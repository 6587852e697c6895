//! Real network partitions between hosts, each host a Linux network namespace on a bridge of
//! the test's own (tests/src/netns.rs): a worker host cut off from ZooKeeper keeps running
//! and hears nothing, yet stops its work before the server can expire its session and
//! another host take its batches over. The probe's ledger, written by every host, shows no
//! batch worked on by two hosts at once, and every batch finished once. Run plain and with
//! ZooKeeper's TLS port and the pipeline's digest identity.

use std::process::Child;
use std::time::{Duration, Instant};

use autocomp_e2e::netns::Network;
use autocomp_e2e::zk::ZooKeeper;
use autocomp_e2e::{PROBED, Pipeline, disjoint_by_batch, finish, wait_until};
use autocomp_model::Outcome;

const PROBE: &str = env!("CARGO_BIN_EXE_probe-component");

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

#[test]
fn a_partitioned_worker_stops_before_another_host_takes_its_batches_over() {
    partitioned(false);
}

/// The same over `zks://` with the pipeline's identity: TLS reconnects and authenticated
/// sessions keep the same bound.
#[test]
fn a_partitioned_worker_stops_in_time_with_zookeeper_auth_and_tls() {
    partitioned(true);
}

fn partitioned(secure: bool) {
    let network = Network::create(&["zk", "worker-a", "worker-b"]);
    let options = ZooKeeper::on_hosts_options(&[network.host("zk")]);
    let zk = ZooKeeper::start(if secure { options.secured() } else { options });
    let session_timeout = Duration::from_secs(4);
    let pipeline = Pipeline::new(PROBE);
    pipeline.use_locks(&if secure { zk.secure_url("autocomp", "4s") } else { zk.url("autocomp", "4s") });
    let ids = pipeline.register(4);
    let started_dir = pipeline.path("started");
    std::fs::create_dir_all(&started_dir).unwrap();
    pipeline.configure(&format!(
        "max_threads = 4\nqueue_size = 4\n\n[settings]\nwork_time = \"6s\"\nledger = \"{}\"\nstarted = \"{}\"\n",
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
    // done: it can take them only once ZooKeeper has expired A's session.
    network.partition("worker-a");
    let cut = Instant::now();
    let host_b = network.host("worker-b");
    let mut passes = 0;
    let mut b_said = String::new();
    let all_done = || ids.iter().all(|id| !pipeline.events(id, PROBED).is_empty());
    let finished = wait_until(cut + Duration::from_secs(90), || {
        passes += 1;
        let pass = finish(host_b.wrap(&pipeline.command(&[])).spawn().expect("worker B"), Duration::from_secs(60));
        assert!(matches!(pass.code, Some(0 | 1)), "worker B: {}", pass.show());
        b_said.push_str(&pass.show());
        all_done()
    });
    network.heal("worker-a");
    assert!(finished, "the batches were not finished within 90 s of the partition ({passes} passes of B)");
    assert!(wait_until(Instant::now() + Duration::from_secs(30), || a.has_exited()), "worker A never stopped");
    let (a_exited_at, a_output) = a.join();
    let a_stopped_after = a_exited_at - cut;
    let a_said = format!(
        "exit {:?}\n--- stdout\n{}--- stderr\n{}",
        a_output.status.code(),
        String::from_utf8_lossy(&a_output.stdout),
        String::from_utf8_lossy(&a_output.stderr)
    );
    assert_eq!(a_output.status.code(), Some(4), "the cut-off worker exits 4: {a_said}");
    assert!(a_output.stdout.is_empty(), "the cut-off worker recorded nothing: {a_said}");

    // The ledger every host wrote: A's work ends before B's begins on every batch.
    let ledger = pipeline.ledger();
    let by_batch = disjoint_by_batch(&ledger);
    for id in &ids {
        let results = pipeline.events(id, PROBED);
        assert_eq!(results.iter().map(|e| e.outcome).collect::<Vec<_>>(), [Outcome::Success], "{id}: {results:?}");
        let entries = &by_batch[id.as_str()];
        assert_eq!(entries.len(), 2, "{id}: A's cancelled work and B's: {entries:?}");
        assert_eq!(entries[0].pid, a_pid, "{id}: A worked first: {entries:?}");
    }
    assert_eq!(b_said.matches(" Probed success").count(), 4, "B recorded each batch once: {b_said}");
    let a_last_end = ledger.iter().filter(|e| e.pid == a_pid).map(|e| e.end).max().unwrap();
    let b_first_start = ledger.iter().filter(|e| e.pid != a_pid).map(|e| e.start).min().unwrap();
    let gap = Duration::from_nanos((b_first_start - a_last_end) as u64);
    eprintln!(
        "partition: A stopped working {:?} and exited {a_stopped_after:?} after the cut (session {session_timeout:?}); \
         B began {gap:?} after A's last work ended and finished all in {passes} passes",
        Duration::from_nanos((a_last_end - cut_ns(cut)) as u64),
    );
    assert!(a_stopped_after < session_timeout, "A exited {a_stopped_after:?} after the cut: {a_said}");
    let a_worked_after = Duration::from_nanos((a_last_end - cut_ns(cut)) as u64);
    assert!(a_worked_after < session_timeout, "A worked {a_worked_after:?} past the cut");
}

/// `at` as nanoseconds since the epoch, the ledger's clock.
fn cut_ns(at: Instant) -> u128 {
    let ago = at.elapsed();
    (std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap() - ago).as_nanos()
}
