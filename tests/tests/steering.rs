//! Steering as the runner honours it, with real probe-component processes: a paused,
//! draining or circuit-broken component (or the whole pipeline held) claims nothing and says
//! nothing from its next pass on; a `--watch` process sleeps while held and works within a
//! second or two of the resume; resource pools cap the work running at once across processes
//! (flock and ZooKeeper slot locks, proved by an outside ledger) and a killed holder's slot
//! frees; a circuit breaker opens after `break_after` consecutive failures.

use std::process::Child;
use std::time::{Duration, Instant};

use autocomp_e2e::zk::ZooKeeper;
use autocomp_e2e::{
    PROBED, Pipeline, disjoint_by_batch, finish, max_concurrency, started, wait_until, wait_while_running,
};
use autocomp_framework::locks::{HeldLock, LockPath, LockService, open_locks};
use autocomp_model::{BatchId, ComponentName, HoldKind, Outcome, PoolName, SteeringChange};
use autocomp_store::prelude::BatchStore as _;

const PROBE: &str = env!("CARGO_BIN_EXE_probe-component");
const PASS_LIMIT: Duration = Duration::from_secs(60);
/// Far longer than any test: whatever a watcher does must come from the change feed.
const SLOW_HEARTBEAT: &str = "watch_heartbeat = \"10m\"";

fn probe() -> ComponentName {
    ComponentName::new("probe").unwrap()
}

fn tape() -> PoolName {
    PoolName::new("tape").unwrap()
}

fn pause(component: Option<ComponentName>, drain: bool) -> SteeringChange {
    SteeringChange::Pause { component, drain }
}

fn resume(component: Option<ComponentName>) -> SteeringChange {
    SteeringChange::Resume { component }
}

fn probed(pipeline: &Pipeline, id: &BatchId) -> usize {
    pipeline.events(id, PROBED).len()
}

/// The last pass summary the registry holds for the probe (every process runs on this host).
fn last_summary(pipeline: &Pipeline) -> String {
    let registered = pipeline.probe_registered().expect("the probe is registered");
    registered.hosts.iter().map(|h| h.summary.clone()).next().unwrap_or_default()
}

/// What a pass said on stderr, but the warning every process on the test's ZooKeeper gives
/// (no identity configured): a cron pass with nothing to report is otherwise silent.
fn said(stderr: &str) -> Vec<&str> {
    stderr.lines().filter(|l| !l.contains("no ZooKeeper identity configured")).collect()
}

fn signal(child: &Child, signal: libc::c_int) {
    let pid = libc::pid_t::try_from(child.id()).expect("pid fits");
    // SAFETY: kill(2) on the pid of a child we spawned and have not reaped yet.
    let sent = unsafe { libc::kill(pid, signal) };
    assert_eq!(sent, 0, "kill({pid}, {signal}) failed: {}", std::io::Error::last_os_error());
}

/// CPU time (user + system, in clock ticks) a process has used so far.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("/proc/<pid>/stat readable");
    // The fields after the command name (in parentheses, which may hold spaces): state is the
    // first, utime the 12th, stime the 13th.
    let after = &stat[stat.rfind(')').expect("a stat line") + 2..];
    let fields: Vec<&str> = after.split(' ').collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

/// The lock service as the test sees it: its own session (ZooKeeper) on its own runtime.
struct Inspector {
    locks: std::sync::Arc<dyn LockService>,
    runtime: tokio::runtime::Runtime,
}

impl Inspector {
    fn open(url: &str) -> Self {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let locks = runtime.block_on(open_locks(url)).expect("the test opens the lock service");
        Self { locks, runtime }
    }

    fn held(&self) -> Vec<HeldLock> {
        self.runtime.block_on(self.locks.held()).expect("held locks listed")
    }

    /// The held slots of pool `tape`, each with its holder's pid.
    fn tape_slots(&self) -> Vec<(String, Option<u32>)> {
        let held = self.held();
        let slots = held.into_iter().filter(|lock| matches!(LockPath::parse(&lock.path), Some(LockPath::Slot(..))));
        slots.map(|lock| (lock.path, lock.holder.map(|h| h.pid))).collect()
    }
}

impl Drop for Inspector {
    fn drop(&mut self) {
        self.runtime.block_on(self.locks.close());
    }
}

#[test]
fn a_held_component_claims_nothing_says_nothing_and_works_again_once_resumed() {
    let pipeline = Pipeline::new(PROBE);
    let ids = pipeline.register(4);
    pipeline.steer(pause(Some(probe()), false));
    let head = pipeline.head();

    // A cron pass: exit 0, not a word, no claim (nothing moved the store's head).
    let held = pipeline.run(&[]);
    assert_eq!(held.code, Some(0), "{}", held.show());
    assert_eq!((held.stdout.as_str(), held.stderr.as_str()), ("", ""), "{}", held.show());
    assert_eq!(pipeline.head(), head, "a held pass wrote to the store");
    assert!(pipeline.open_runs().is_empty() && pipeline.lock_files().is_empty());
    let summary = last_summary(&pipeline);
    assert!(summary.starts_with("nothing claimed; held: probe is paused by operator:tester since"), "{summary}");
    assert!(summary.ends_with("steered by the test (autocomp resume probe)"), "{summary}");

    // A manual run is told who holds the component and how to lift it; --force runs anyway.
    let manual = pipeline.run(&["--batch", "B0001"]);
    assert_eq!(manual.code, Some(1), "{}", manual.show());
    assert!(
        manual.stderr.contains("batch B0001 is not ready: probe is paused by operator:tester since")
            && manual.stderr.contains("steered by the test (autocomp resume probe)"),
        "{}",
        manual.show()
    );
    assert_eq!(probed(&pipeline, &ids[0]), 0);
    let dry = pipeline.run(&["--dry-run"]);
    assert_eq!(dry.code, Some(0), "{}", dry.show());
    assert!(dry.stderr.contains("dry run: claiming nothing now: probe is paused by operator:tester"), "{}", dry.show());
    assert!(dry.stdout.starts_with("B0001 would claim once resumed (held)"), "{}", dry.show());
    let forced = pipeline.run(&["--batch", "B0001", "--force"]);
    assert_eq!(forced.code, Some(0), "{}", forced.show());
    assert!(forced.stdout.starts_with("B0001 Probed success"), "{}", forced.show());

    // Resumed: the next pass works the rest.
    pipeline.steer(resume(Some(probe())));
    let next = pipeline.run(&[]);
    assert_eq!(next.code, Some(0), "{}", next.show());
    assert_eq!(next.stdout.lines().count(), 3, "{}", next.show());
    assert!(ids.iter().all(|id| probed(&pipeline, id) == 1));

    // The whole pipeline drained (or paused) holds every component too.
    let late = pipeline.register_one("B0005", true);
    pipeline.steer(pause(None, true));
    let drained = pipeline.run(&[]);
    assert_eq!(drained.code, Some(0), "{}", drained.show());
    assert_eq!((drained.stdout.as_str(), drained.stderr.as_str()), ("", ""), "{}", drained.show());
    assert_eq!(probed(&pipeline, &late), 0, "worked while the pipeline was draining");
    let summary = last_summary(&pipeline);
    assert!(summary.contains("held: the pipeline is draining by operator:tester"), "{summary}");
    assert!(summary.ends_with("(autocomp resume --all)"), "{summary}");
    pipeline.steer(pause(None, false));
    let paused = pipeline.run(&[]);
    assert_eq!((paused.code, paused.stdout.as_str()), (Some(0), ""), "{}", paused.show());
    pipeline.steer(resume(None));
    let resumed = pipeline.run(&[]);
    assert_eq!(resumed.code, Some(0), "{}", resumed.show());
    assert!(resumed.stdout.starts_with("B0005 Probed success"), "{}", resumed.show());
}

#[test]
fn a_paused_watcher_finishes_its_work_sleeps_without_spinning_and_works_within_seconds_of_the_resume() {
    let pipeline = Pipeline::new(PROBE);
    let (started_dir, gate) = pipeline.hold_work_at_a_gate(SLOW_HEARTBEAT);
    let mut watcher = pipeline.spawn(&["--watch"]);
    wait_while_running(&mut watcher, "registering", || pipeline.probe_registered().is_some());

    // Paused mid-work: the work goes on to its result (a pause never kills work).
    let first = pipeline.register_one("B0001", true);
    wait_while_running(&mut watcher, "working on B0001", || !started(&started_dir).is_empty());
    pipeline.steer(pause(Some(probe()), false));
    let second = pipeline.register_one("B0002", true);
    std::fs::write(&gate, "").unwrap();
    wait_while_running(&mut watcher, "recording B0001", || probed(&pipeline, &first) == 1);
    assert_eq!(pipeline.events(&first, PROBED)[0].outcome, Outcome::Success);

    // Paused with a ready batch: not worked, and no loop of passes (CPU time, and no pass
    // reported to the registry).
    let last_seen = |p: &Pipeline| p.probe_registered().and_then(|c| c.last_seen());
    // The pass that recorded B0001 reports its end after the event (a watcher writes its
    // passes to the registry together, within a second): let it land.
    let settled = wait_until(Instant::now() + Duration::from_secs(10), || {
        pipeline
            .probe_registered()
            .is_some_and(|c| c.hosts.iter().all(|h| !h.running()) && c.work.total.success.results == 1)
    });
    assert!(settled, "the watcher's pass never reported its end");
    let (seen_before, ticks_before, window) = (last_seen(&pipeline), cpu_ticks(watcher.id()), Instant::now());
    let worked = wait_until(Instant::now() + Duration::from_secs(3), || probed(&pipeline, &second) > 0);
    assert!(!worked, "a paused watcher worked B0002");
    let ticks = cpu_ticks(watcher.id()) - ticks_before;
    println!("paused watcher: {ticks} CPU ticks in {:?}", window.elapsed());
    assert!(ticks < 50, "the paused watcher used {ticks} CPU ticks in {:?}: a busy loop", window.elapsed());
    assert_eq!(last_seen(&pipeline), seen_before, "the paused watcher ran passes");
    assert!(pipeline.open_runs().is_empty());

    // Resumed: the steering change moves the store's head, which wakes the watcher.
    pipeline.steer(resume(Some(probe())));
    let resumed = Instant::now();
    let worked = wait_until(resumed + Duration::from_secs(10), || probed(&pipeline, &second) == 1);
    let after = resumed.elapsed();
    assert!(worked, "B0002 not worked within 10 s of the resume");
    println!("the watcher worked B0002 {after:?} after the resume");
    assert!(after < Duration::from_secs(3), "B0002 took {after:?} after the resume");

    signal(&watcher, libc::SIGTERM);
    let finished = finish(watcher, Duration::from_secs(20));
    assert_eq!(finished.code, Some(0), "{}", finished.show());
    assert!(pipeline.open_runs().is_empty() && pipeline.lock_files().is_empty());
}

/// Three processes of one component (`pools = ["tape"]`, the pool at size 2, two threads and
/// a queue of two each, so one process alone could take both slots) run passes back to back
/// as a very busy cron would, until every batch is done. The ledger, written from outside the
/// runner, shows never more than two works at once and two reached; passes that found the
/// pool full said so (at info) and exited 0; every batch was worked exactly once, by a later
/// pass when it had waited.
fn pools_cap_the_work_running_at_once(pipeline: &Pipeline, batches: usize) {
    let ids = pipeline.register(batches);
    pipeline.steer(SteeringChange::SetPool { pool: tape(), size: 2 });
    let ledger = pipeline.path("ledger.txt");
    pipeline.configure(&format!(
        "pools = [\"tape\"]\nmax_threads = 2\nqueue_size = 2\nbatch_lock_timeout = \"0s\"\n\
         poll_lock_timeout = \"30s\"\n\n\
         [settings]\nwork_time = \"600ms\"\nledger = \"{}\"\n",
        ledger.display()
    ));
    let done = || std::fs::read_to_string(&ledger).unwrap_or_default().lines().count() >= batches;
    let deadline = Instant::now() + Duration::from_secs(180);
    let worker = || {
        let mut passes = Vec::new();
        while !done() && Instant::now() < deadline {
            passes.push(finish(pipeline.spawn(&["-v"]), PASS_LIMIT));
        }
        passes
    };
    let passes: Vec<_> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..3).map(|_| scope.spawn(worker)).collect();
        workers.into_iter().flat_map(|w| w.join().expect("a worker thread")).collect()
    });
    assert!(done(), "not every batch was worked within the deadline");
    let mut waited = 0;
    for pass in &passes {
        assert!(matches!(pass.code, Some(0 | 3)), "{}", pass.show());
        let trouble = said(&pass.stderr).into_iter().filter(|l| l.contains("WARN") || l.contains("ERROR")).count();
        assert_eq!(trouble, 0, "{}", pass.show());
        assert!(!pass.stdout.contains("failure"), "{}", pass.show());
        waited += pass.stderr.lines().filter(|l| l.contains("for pool tape: every slot is in use")).count();
    }
    let entries = pipeline.ledger();
    let by_batch = disjoint_by_batch(&entries);
    assert_eq!(by_batch.len(), batches, "{by_batch:?}");
    assert!(by_batch.values().all(|worked| worked.len() == 1), "a batch was worked twice: {by_batch:?}");
    for id in &ids {
        let events = pipeline.events(id, PROBED);
        assert_eq!(events.iter().map(|e| e.outcome).collect::<Vec<_>>(), [Outcome::Success], "{id}");
        assert_eq!(pipeline.failed_attempts(id), 0, "{id}: a wait counted as an attempt");
    }
    let most = max_concurrency(&entries);
    let pids: std::collections::BTreeSet<u32> = entries.iter().map(|e| e.pid).collect();
    println!(
        "{batches} batches, {} passes by 3 workers ({} processes worked), {waited} passes found pool tape full, \
         at most {most} at once",
        passes.len(),
        pids.len()
    );
    assert!(most <= 2, "{most} works ran at once in a pool of 2: {entries:?}");
    assert_eq!(most, 2, "the pool's two slots were never both in use: {entries:?}");
    assert!(waited > 0, "no pass ever found the pool full");
    assert!(pipeline.open_runs().is_empty());
}

#[test]
fn a_pool_of_two_caps_three_flock_workers_at_two_works_at_once() {
    let pipeline = Pipeline::new(PROBE);
    pools_cap_the_work_running_at_once(&pipeline, 10);
    assert!(pipeline.lock_files().is_empty(), "{:?}", pipeline.lock_files());
}

#[test]
fn a_pool_of_two_caps_three_zookeeper_workers_at_two_works_at_once() {
    let zk = ZooKeeper::standalone();
    let pipeline = Pipeline::new(PROBE);
    pipeline.use_locks(&zk.url("autocomp", "4s"));
    pools_cap_the_work_running_at_once(&pipeline, 10);
    let inspector = Inspector::open(&zk.url("autocomp", "10s"));
    assert!(inspector.held().is_empty(), "locks left behind: {:?}", inspector.held());
}

/// A batch another live process holds takes no slot of a pool: the ready batch behind it
/// gets the free slot, where a held one taking it would leave that batch waiting for a full
/// pool on every pass while the holder works.
#[test]
fn a_batch_another_process_holds_takes_no_pool_slot_from_a_ready_one() {
    let pipeline = Pipeline::new(PROBE);
    pipeline.steer(SteeringChange::SetPool { pool: tape(), size: 2 });
    pipeline.configure("pools = [\"tape\"]\nmax_threads = 2\nqueue_size = 2\n");
    let ids = pipeline.register(2);
    // Another live process (this test, by its lock service's liveness record) works B0001
    // and holds slot 0 of the pool.
    let inspector = Inspector::open(&format!("local:{}", pipeline.path("locks").display()));
    let liveness = inspector.locks.liveness().expect("a local lock service keeps a liveness record");
    let holder = autocomp_framework::locks::LockHolder {
        agent: "probe/0@testhost#1".into(),
        host: "testhost".into(),
        pid: 1,
        since: autocomp_model::Timestamp::now(),
    };
    let slot =
        inspector.runtime.block_on(inspector.locks.try_lock(&LockPath::Slot(tape(), 0), &holder, Duration::ZERO));
    let slot = slot.unwrap().expect("slot 0 is free");
    let run_holder = autocomp_model::RunHolder {
        agent: autocomp_model::Agent::new("probe/0@testhost#1").unwrap(),
        host: "testhost".into(),
        pid: 1,
        claim_key: None,
        liveness: Some(liveness),
    };
    let probe = ComponentName::new("probe").unwrap();
    let held = pipeline.block_on(pipeline.store().claim(&ids[0], &probe, &run_holder)).unwrap();

    let pass = pipeline.run(&[]);
    assert_eq!(pass.code, Some(0), "{}", pass.show());
    assert!(pass.stdout.starts_with("B0002 Probed success"), "the ready batch got the free slot: {}", pass.show());
    assert!(probed(&pipeline, &ids[0]) == 0, "a batch another process holds was worked");
    assert_eq!(pipeline.open_runs().iter().map(|r| r.generation).collect::<Vec<_>>(), [held.generation()]);
    inspector.runtime.block_on(slot.release()).unwrap();
}

/// A pool of one queues rather than throttles: one cron pass (queue 3, two threads) works
/// all three ready batches, one at a time, each claimed as the one before frees the slot.
/// Beforehand `--dry-run`, `ready` and `explain` say which batches wait for the pool; with
/// the slot held elsewhere, `explain` says the batch waits for it.
#[test]
fn a_pool_of_one_drains_its_queue_in_one_pass_one_batch_at_a_time() {
    let pipeline = Pipeline::new(PROBE);
    pipeline.steer(SteeringChange::SetPool { pool: tape(), size: 1 });
    pipeline.configure(&format!(
        "pools = [\"tape\"]\nmax_threads = 2\nqueue_size = 3\n\n[settings]\nwork_time = \"200ms\"\nledger = \"{}\"\n",
        pipeline.path("ledger.txt").display()
    ));
    // An idle pass registers the component, which `ready` and `explain` read.
    assert_eq!(pipeline.run(&[]).code, Some(0));
    let ids = pipeline.register(3);
    let dry = pipeline.run(&["--dry-run"]);
    assert_eq!(dry.code, Some(0), "{}", dry.show());
    let said: Vec<&str> = dry.stdout.lines().collect();
    assert!(said.iter().any(|l| l.starts_with("B0001 would claim")), "{}", dry.show());
    for id in ["B0002", "B0003"] {
        let line = said.iter().find(|l| l.starts_with(id)).unwrap_or_else(|| panic!("{id}: {}", dry.show()));
        assert!(line.contains("waits for pool tape: 0 of its 1 slot(s) in use"), "{}", dry.show());
    }
    let ready = pipeline.autocomp(&["ready", "--component", "probe"]);
    assert_eq!(ready.code, Some(0), "{}", ready.show());
    assert_eq!(ready.stdout.matches("waits for pool tape").count(), 2, "{}", ready.show());
    assert!(ready.stdout.starts_with("probe would claim 1 batch(es) now"), "{}", ready.show());

    let (inspector, slot_lock) = hold_the_first_tape_slot(&pipeline);
    let explained = pipeline.autocomp(&["explain", "B0001", "--component", "probe"]);
    assert!(
        explained.stdout.contains("ready, and waits for pool tape: 1 of its 1 slot(s) in use"),
        "{}",
        explained.show()
    );
    inspector.runtime.block_on(slot_lock.release()).unwrap();

    let pass = pipeline.run(&["-v"]);
    assert_eq!(pass.code, Some(0), "{}", pass.show());
    for id in &ids {
        assert_eq!(probed(&pipeline, id), 1, "{id} was not worked by the one pass: {}", pass.show());
        assert_eq!(pipeline.failed_attempts(id), 0, "{id}: a wait counted as an attempt");
    }
    let entries = pipeline.ledger();
    assert_eq!(max_concurrency(&entries), 1, "two works at once in a pool of 1: {entries:?}");
    assert_eq!(entries.iter().map(|e| e.pid).collect::<std::collections::BTreeSet<_>>().len(), 1);
    assert!(pipeline.open_runs().is_empty() && pipeline.lock_files().is_empty());
}

/// Takes slot 0 of pool `tape` in the pipeline's flock locks, as a worker of another
/// component would: the inspector to release it with, and the lock.
fn hold_the_first_tape_slot(pipeline: &Pipeline) -> (Inspector, Box<dyn autocomp_framework::locks::Lock>) {
    let inspector = Inspector::open(&format!("local:{}", pipeline.path("locks").display()));
    let holder = autocomp_framework::locks::LockHolder {
        agent: "other/1.0@testhost#1".into(),
        host: "testhost".into(),
        pid: 1,
        since: autocomp_model::Timestamp::now(),
    };
    let slot = LockPath::Slot(tape(), 0);
    let taken = inspector.runtime.block_on(inspector.locks.try_lock(&slot, &holder, Duration::ZERO)).unwrap();
    (inspector, taken.expect("the slot is free"))
}

#[test]
fn watchers_waiting_for_a_full_pool_take_its_slot_soon_after_it_frees_without_a_store_change() {
    // A slot frees without the store moving (a holder records its result before releasing
    // it, or dies): a watcher whose batches waited must look again soon, not at its heartbeat
    // (10 minutes away here), and without spinning meanwhile.
    let pipeline = Pipeline::new(PROBE);
    pipeline.steer(SteeringChange::SetPool { pool: tape(), size: 1 });
    pipeline.configure(&format!(
        "{SLOW_HEARTBEAT}\npools = [\"tape\"]\nmax_threads = 1\nqueue_size = 1\nbatch_lock_timeout = \"0s\"\n\n\
         [settings]\nwork_time = \"300ms\"\nledger = \"{}\"\n",
        pipeline.path("ledger.txt").display()
    ));
    // The test holds the pool's only slot, as a worker of another component would.
    let (inspector, slot_lock) = hold_the_first_tape_slot(&pipeline);

    let mut watchers = [pipeline.spawn(&["--watch"]), pipeline.spawn(&["--watch"])];
    for watcher in &mut watchers {
        wait_while_running(watcher, "registering", || pipeline.probe_registered().is_some());
    }
    let ids: Vec<BatchId> = (1..=4).map(|n| pipeline.register_one(&format!("B{n:04}"), true)).collect();
    let ticks_before: u64 = watchers.iter().map(|w| cpu_ticks(w.id())).sum();
    let worked = wait_until(Instant::now() + Duration::from_secs(2), || probed(&pipeline, &ids[0]) > 0);
    assert!(!worked, "worked while the test held the pool's only slot");
    assert!(pipeline.open_runs().is_empty(), "a batch waiting for the pool was claimed");
    let ticks: u64 = watchers.iter().map(|w| cpu_ticks(w.id())).sum::<u64>() - ticks_before;
    println!("2 watchers waiting for a pool for 2 s: {ticks} CPU ticks");
    assert!(ticks < 100, "the waiting watchers used {ticks} CPU ticks in 2 s: a busy loop");

    inspector.runtime.block_on(slot_lock.release()).unwrap();
    let released = Instant::now();
    let first = wait_until(released + Duration::from_secs(30), || ids.iter().any(|id| probed(&pipeline, id) == 1));
    let after = released.elapsed();
    assert!(first, "no batch worked within 30 s of the slot freeing");
    println!("the first batch was worked {after:?} after the slot freed");
    assert!(after < Duration::from_secs(5), "the slot freed {after:?} before a waiting watcher took it");
    let all = wait_until(Instant::now() + Duration::from_secs(30), || ids.iter().all(|id| probed(&pipeline, id) == 1));
    assert!(all, "not every batch was worked: {:?}", pipeline.ledger());
    let entries = pipeline.ledger();
    assert_eq!(max_concurrency(&entries), 1, "two works at once in a pool of 1: {entries:?}");
    for watcher in watchers {
        signal(&watcher, libc::SIGTERM);
        let finished = finish(watcher, Duration::from_secs(20));
        assert_eq!(finished.code, Some(0), "{}", finished.show());
    }
    assert!(pipeline.open_runs().is_empty() && pipeline.lock_files().is_empty());
}

/// A watcher whose batches wait for a full pool reads the steering at each look, so the
/// pool grown by an operator lets it work at once (no claim reaches the store while no slot
/// is free, to answer the new size in its stead).
#[test]
fn a_watcher_waiting_for_a_full_pool_works_soon_after_the_pool_grows() {
    let pipeline = Pipeline::new(PROBE);
    pipeline.steer(SteeringChange::SetPool { pool: tape(), size: 1 });
    pipeline.configure(&format!(
        "{SLOW_HEARTBEAT}\npools = [\"tape\"]\nmax_threads = 1\nqueue_size = 1\nbatch_lock_timeout = \"0s\"\n"
    ));
    // The test holds the pool's only slot, as a worker of another component would.
    let (inspector, slot_lock) = hold_the_first_tape_slot(&pipeline);
    let mut watcher = pipeline.spawn(&["--watch"]);
    wait_while_running(&mut watcher, "registering", || pipeline.probe_registered().is_some());
    let id = pipeline.register_one("B0001", true);
    let worked = wait_until(Instant::now() + Duration::from_secs(2), || probed(&pipeline, &id) > 0);
    assert!(!worked, "worked while the test held the pool's only slot");

    pipeline.steer(SteeringChange::SetPool { pool: tape(), size: 2 });
    let grown = Instant::now();
    let worked = wait_until(grown + Duration::from_secs(30), || probed(&pipeline, &id) == 1);
    let after = grown.elapsed();
    assert!(worked, "not worked within 30 s of the pool growing");
    println!("worked {after:?} after the pool grew");
    assert!(after < Duration::from_secs(5), "the pool grew {after:?} before the waiting watcher used it");
    signal(&watcher, libc::SIGTERM);
    let finished = finish(watcher, Duration::from_secs(20));
    assert_eq!(finished.code, Some(0), "{}", finished.show());
    inspector.runtime.block_on(slot_lock.release()).unwrap();
}

/// Pool `tape` of size 1: a worker holds its slot (its work held at a gate); a manual run
/// and a cron pass of the other batch wait for the pool (exit 0, nothing claimed); the holder
/// is SIGKILLed, its slot frees (`slot_freed_within` of the kill: at once for flock, the
/// session timeout for ZooKeeper), and the next passes work both batches.
fn a_killed_slot_holders_slot_frees(pipeline: &Pipeline, locks_url: &str, still_held_after_kill: bool) {
    let ids = pipeline.register(2);
    pipeline.steer(SteeringChange::SetPool { pool: tape(), size: 1 });
    let (started_dir, gate) = pipeline
        .hold_work_at_a_gate("pools = [\"tape\"]\nmax_threads = 1\nqueue_size = 1\nbatch_lock_timeout = \"0s\"");
    let inspector = Inspector::open(locks_url);

    let mut holder = pipeline.spawn(&[]);
    wait_while_running(&mut holder, "working", || !started(&started_dir).is_empty());
    let (taken, _) = started(&started_dir).remove(0);
    let other = ids.iter().find(|id| id.as_str() != taken).unwrap().clone();
    assert_eq!(inspector.tape_slots(), [("slot/tape/0".to_owned(), Some(holder.id()))]);

    // The pool is full: a manual run of the other batch says so and claims nothing; so does
    // a cron pass, silently.
    let manual = pipeline.run(&["--batch", other.as_str()]);
    assert_eq!(manual.code, Some(0), "{}", manual.show());
    assert!(manual.stderr.contains(&format!("batch {other} waits for pool tape")), "{}", manual.show());
    assert_eq!(manual.stdout, "", "{}", manual.show());
    assert_eq!(last_summary(pipeline), "nothing claimed; 1 batch waits for pool tape");
    let cron = pipeline.run(&[]);
    assert_eq!((cron.code, cron.stdout.as_str(), said(&cron.stderr)), (Some(0), "", vec![]), "{}", cron.show());
    assert_eq!(pipeline.open_runs().len(), 1, "a batch that waits was claimed: {:?}", pipeline.open_runs());
    assert_eq!(pipeline.failed_attempts(&other), 0);

    signal(&holder, libc::SIGKILL);
    let killed = Instant::now();
    let crashed = finish(holder, Duration::from_secs(10));
    assert_eq!(crashed.code, None, "{}", crashed.show());
    if still_held_after_kill {
        assert_eq!(inspector.tape_slots().len(), 1, "the slot went before its session timed out");
    }
    let freed = wait_until(killed + Duration::from_secs(20), || inspector.tape_slots().is_empty());
    let after = killed.elapsed();
    assert!(freed, "the dead holder's slot is still held {after:?} after the kill: {:?}", inspector.held());
    println!("the killed holder's slot freed {after:?} after the kill");

    // Another worker takes the slot: both batches get done (the killed one's run taken over).
    std::fs::write(&gate, "").unwrap();
    let next = pipeline.run(&[]);
    assert_eq!(next.code, Some(0), "{}", next.show());
    assert_eq!(next.stdout.lines().count(), 1, "{}", next.show());
    let last = pipeline.run(&[]);
    assert_eq!(last.code, Some(0), "{}", last.show());
    assert_eq!(last.stdout.lines().count(), 1, "{}", last.show());
    for id in &ids {
        assert_eq!(pipeline.events(id, PROBED).iter().map(|e| e.outcome).collect::<Vec<_>>(), [Outcome::Success]);
    }
    assert_eq!(pipeline.failed_attempts(&ids[0]) + pipeline.failed_attempts(&ids[1]), 1, "the killed run");
    assert!(inspector.held().is_empty(), "{:?}", inspector.held());
}

#[test]
fn a_sigkilled_flock_slot_holder_frees_its_slot_at_death() {
    let pipeline = Pipeline::new(PROBE);
    let url = format!("local:{}", pipeline.path("locks").display());
    a_killed_slot_holders_slot_frees(&pipeline, &url, false);
}

#[test]
fn a_sigkilled_zookeeper_slot_holder_frees_its_slot_when_its_session_expires() {
    let zk = ZooKeeper::standalone();
    let pipeline = Pipeline::new(PROBE);
    pipeline.use_locks(&zk.url("autocomp", "2s"));
    a_killed_slot_holders_slot_frees(&pipeline, &zk.url("autocomp", "10s"), true);
}

/// `break_after = 2` with two threads and eight batches claimed in one pass: the second
/// failure opens the circuit while at most one other batch runs, and the pass starts nothing
/// more: the rest go back unworked, no attempt counted, and are worked once resumed.
#[test]
fn an_open_circuit_hands_back_what_its_pass_claimed_and_has_not_started() {
    let pipeline = Pipeline::new(PROBE);
    let ids = pipeline.register(8);
    let started = tempfile::tempdir().unwrap();
    pipeline.configure(&format!(
        "break_after = 2\nqueue_size = 8\nmax_threads = 2\n\n[settings]\nbehaviour = \"fail\"\n\
         work_time = \"300ms\"\nstarted = {:?}\n",
        started.path()
    ));
    let pass = pipeline.run(&[]);
    assert_eq!(pass.code, Some(1), "{}", pass.show());
    let failed: Vec<&BatchId> = ids.iter().filter(|id| probed(&pipeline, id) == 1).collect();
    let begun = std::fs::read_dir(started.path()).unwrap().count();
    assert_eq!(begun, failed.len(), "a batch whose work began has its result, and no other began");
    // The line that opened the circuit says how many others were in flight then (working,
    // or recording their results): those, and no more, were recorded after it.
    let opened =
        pass.stderr.lines().find(|l| l.contains("circuit breaker opened")).unwrap_or_else(|| panic!("{}", pass.show()));
    let in_flight: usize = opened
        .split("; ")
        .find_map(|part| part.strip_suffix(" other batch(es) of this pass in flight (their results are recorded), the claimed ones not started are handed back unworked component=probe"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count of the batches in flight: {opened}"));
    assert!(in_flight <= 3, "two threads: at most one other working and two recording: {opened}");
    assert!(failed.len() <= 2 + in_flight, "break_after 2 and {in_flight} in flight: {failed:?}\n{}", pass.show());
    assert!(failed.len() < ids.len(), "nothing was handed back");
    let handed_back = format!("{} claimed batch(es) handed back unworked", ids.len() - failed.len());
    assert!(pass.stderr.contains(&handed_back), "{handed_back}\n{}", pass.show());
    let hold = pipeline.steering().hold_of(&probe()).cloned().expect("the circuit is open");
    assert!(hold.reason.starts_with("circuit open: 2 consecutive failures"), "{hold:?}");
    // Handed back, not abandoned: no open run and no failed attempt on any of them.
    let store = pipeline.store();
    for id in ids.iter().filter(|id| !failed.contains(id)) {
        let run = pipeline.block_on(store.run_state(id, &probe())).unwrap();
        assert!(run.as_ref().is_none_or(|run| run.state != autocomp_model::RunState::Open), "{id}: {run:?}");
        let attempts = pipeline.block_on(store.failed_attempts(id, &probe(), autocomp_model::Seq(0))).unwrap();
        assert_eq!(attempts, 0, "{id}: its release is no attempt");
    }

    // Resumed, the pass works them.
    pipeline.steer(resume(Some(probe())));
    pipeline.configure("queue_size = 8\nmax_threads = 2\n");
    let again = pipeline.run(&[]);
    assert_eq!(again.code, Some(0), "{}", again.show());
    assert!(ids.iter().all(|id| probed(&pipeline, id) == 1), "each batch has exactly one result");
}

#[test]
fn the_circuit_opens_after_three_consecutive_failures_and_the_next_pass_claims_nothing() {
    let pipeline = Pipeline::new(PROBE);
    let ids = pipeline.register(8);
    let configure = |behaviour: &str| {
        pipeline.configure(&format!("break_after = 3\nqueue_size = 1\n\n[settings]\nbehaviour = \"{behaviour}\"\n"))
    };
    let pass = |code: i32| {
        let pass = pipeline.run(&[]);
        assert_eq!(pass.code, Some(code), "{}", pass.show());
        assert_eq!(pass.stdout.lines().count(), 1, "{}", pass.show());
        pass
    };
    let count = |p: &Pipeline| p.steering().breakers.get(&probe()).map_or(0, |b| b.consecutive);

    // Two failures, then a success: the count starts over.
    configure("fail");
    pass(1);
    pass(1);
    assert_eq!(count(&pipeline), 2);
    configure("succeed");
    pass(0);
    assert_eq!(count(&pipeline), 0, "a success did not reset the breaker: {:?}", pipeline.steering());

    // Three failures on distinct batches open the circuit.
    configure("fail");
    pass(1);
    pass(1);
    assert!(pipeline.steering().hold_of(&probe()).is_none(), "opened after two failures");
    let third = pass(1);
    assert!(third.stderr.contains("circuit breaker opened"), "{}", third.show());
    let steering = pipeline.steering();
    let hold = steering.hold_of(&probe()).expect("the circuit is open");
    assert_eq!(hold.kind, HoldKind::Circuit);
    assert!(hold.reason.starts_with("circuit open: 3 consecutive failures, last: B0006: "), "{hold:?}");
    assert!(hold.reason.contains("deliberate failure"), "{hold:?}");
    assert!(hold.by.as_str().starts_with("probe/"), "{hold:?}");

    // The next pass claims nothing, says nothing.
    let head = pipeline.head();
    let held = pipeline.run(&[]);
    assert_eq!((held.code, held.stdout.as_str(), held.stderr.as_str()), (Some(0), "", ""), "{}", held.show());
    assert_eq!(pipeline.head(), head);
    assert!(ids[6..].iter().all(|id| probed(&pipeline, id) == 0));
    assert!(last_summary(&pipeline).contains("held: probe is held since"), "{}", last_summary(&pipeline));

    // Resumed (the count cleared with it), it works again.
    pipeline.steer(resume(Some(probe())));
    configure("succeed");
    pass(0);
    assert_eq!(count(&pipeline), 0);
    assert!(pipeline.steering().hold_of(&probe()).is_none());
}

#[test]
fn a_hold_that_lands_mid_pass_stops_the_claims_after_it() {
    // A pass claims in rounds, reading the steering before each. A batch past max_attempts is
    // claimed only to record its give-up, which leaves room for another round; with
    // break_after = 1 that give-up opens the circuit, so the next round claims nothing.
    let pipeline = Pipeline::new(PROBE);
    pipeline.configure(
        "max_attempts = 2\nretry_backoff = \"0s\"\nqueue_size = 1\nbreak_after = 1\n\n\
         [settings]\nbehaviour = \"transient\"\ntransient_failures = 10\n",
    );
    let first = pipeline.register_one("B0001", true);
    for _ in 0..2 {
        let pass = pipeline.run(&[]);
        assert!(
            pass.stdout.starts_with("B0001 Probed failure") && pass.stdout.contains("transient"),
            "{}",
            pass.show()
        );
    }
    let second = pipeline.register_one("B0002", true);
    let pass = pipeline.run(&[]);
    assert!(pass.stdout.starts_with("B0002 Probed failure"), "{}", pass.show());
    assert!(pipeline.steering().breakers.is_empty(), "a transient failure counted: {:?}", pipeline.steering());

    // Both are retries now: B0001 (two failed attempts) is given up on in the first round,
    // opening the circuit; B0002 would be the second round's.
    let pass = pipeline.run(&[]);
    assert_eq!(pass.code, Some(1), "{}", pass.show());
    assert!(pass.stdout.starts_with("B0001 Probed failure") && pass.stdout.contains("gave up"), "{}", pass.show());
    assert_eq!(pass.stdout.lines().count(), 1, "{}", pass.show());
    assert!(pass.stderr.contains("circuit breaker opened"), "{}", pass.show());
    assert_eq!(pipeline.events(&second, PROBED).len(), 1, "B0002 was claimed after the circuit opened");
    assert_eq!(pipeline.events(&first, PROBED).len(), 3);
    assert!(pipeline.open_runs().is_empty());
    let summary = last_summary(&pipeline);
    assert!(summary.starts_with("1 batch: 1 failure; held: probe is held since"), "{summary}");
    assert!(summary.contains("circuit open: 1 consecutive failures, last: B0001"), "{summary}");
}
