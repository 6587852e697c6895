//! ZooKeeper locks (issue #5) against a real server and real OS processes: what the lock
//! port does on ZooKeeper alone (one ephemeral node per lock, two writes per cycle, a round of
//! batch locks one write and their release another, a busy lock no write, waiting on a
//! watch, close ending the session, a dropped lock kept until then; what every backend
//! promises is in lock_contract.rs), then the probe component with `locks = "zk://..."`: four
//! processes over 500 batches, a SIGKILLed and a SIGSTOPped holder, the session lost
//! mid-work, ZooKeeper restarted and an ensemble's leader killed mid-run, and an unreachable
//! ZooKeeper.

use std::collections::BTreeMap;
use std::process::Child;
use std::sync::Arc;
use std::time::{Duration, Instant};

use autocomp_e2e::zk::{Options, Znode, ZooKeeper, four_letter, free_ports};
use autocomp_e2e::{
    Finished, LedgerEntry, PROBED, Pipeline, disjoint_by_batch, finish, started, wait_until, wait_while_running,
};
use autocomp_framework::locks::{
    HeldLock, Liveness, LockError, LockHolder, LockPath, LockService, SessionState, ZkLocks, open_locks,
};
use autocomp_model::{BatchId, ComponentName, Outcome, Run, Timestamp};

const PROBE: &str = env!("CARGO_BIN_EXE_probe-component");
const PASS_LIMIT: Duration = Duration::from_secs(60);
const CHROOT: &str = "/autocomp";

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("a runtime")
}

fn holder(agent: &str) -> LockHolder {
    LockHolder { agent: agent.into(), host: "testhost".into(), pid: 4242, since: Timestamp::now() }
}

fn batch_path(batch: &str) -> LockPath {
    LockPath::Batch(ComponentName::new("probe").unwrap(), BatchId::new(batch).unwrap())
}

/// The lock service as the test sees it: its own session, on its own runtime.
struct Inspector {
    locks: Arc<dyn LockService>,
    runtime: tokio::runtime::Runtime,
}

impl Inspector {
    fn open(url: &str) -> Self {
        let runtime = runtime();
        let locks = runtime.block_on(open_locks(url)).expect("the test connects to ZooKeeper");
        Self { locks, runtime }
    }

    fn held(&self) -> Vec<HeldLock> {
        self.runtime.block_on(self.locks.held()).expect("held locks listed")
    }

    /// How the process whose liveness record `run` names stands, judged from outside.
    fn judge(&self, run: &Run) -> Liveness {
        let record = run.holder.liveness.as_deref().expect("a claim names its holder's liveness record");
        self.runtime.block_on(self.locks.judge_liveness(record)).expect("a liveness record judged")
    }
}

impl Drop for Inspector {
    fn drop(&mut self) {
        self.runtime.block_on(self.locks.close());
    }
}

/// Ephemeral nodes under the chroot: locks held by some session, and the liveness nodes of
/// the sessions open.
fn ephemerals(tree: &[Znode]) -> Vec<&Znode> {
    tree.iter().filter(|z| z.ephemeral_owner != 0).collect()
}

/// The lock nodes of `tree`: its ephemeral nodes but the liveness nodes (`live/<session>`).
fn lock_nodes(tree: &[Znode]) -> Vec<&Znode> {
    ephemerals(tree).into_iter().filter(|z| !z.path.starts_with(&format!("{CHROOT}/live/"))).collect()
}

/// The tree without `live` and the liveness nodes under it.
fn without_live(tree: &[Znode]) -> Vec<&str> {
    let live = format!("{CHROOT}/live");
    tree.iter().map(|z| z.path.as_str()).filter(|path| !path.starts_with(&live)).collect()
}

/// `Total watches:N` from `wchs`.
fn watches(zk: &ZooKeeper) -> usize {
    let answer = four_letter(zk.client_port(0), "wchs").unwrap_or_default();
    answer.lines().find_map(|l| l.strip_prefix("Total watches:")).and_then(|n| n.trim().parse().ok()).unwrap_or(0)
}

#[test]
fn a_lock_is_one_ephemeral_node_and_a_cycle_costs_two_writes() {
    // ZooKeeper's default container check (a minute): an emptied parent deleted between two
    // cycles would add writes (its deletion and re-creation) to the count below.
    let zk = ZooKeeper::start(Options::default());
    let url = zk.url("autocomp", "4s");
    let rt = runtime();
    let a = rt.block_on(ZkLocks::connect(&url)).unwrap();
    let b = rt.block_on(open_locks(&url)).unwrap();
    let first = batch_path("B0001");

    // The first lock creates the container parents (the chroot came with the liveness nodes).
    let before = zk.zxid(0);
    let lock = rt.block_on(a.try_lock(&first, &holder("a"), Duration::ZERO)).unwrap().expect("free");
    let first_writes = zk.zxid(0) - before;
    let tree = zk.tree(CHROOT);
    assert_eq!(
        without_live(&tree),
        [CHROOT, "/autocomp/batch", "/autocomp/batch/probe", "/autocomp/batch/probe/B0001"]
    );
    assert_eq!(lock_nodes(&tree).iter().map(|z| z.ephemeral_owner).collect::<Vec<_>>(), [a.session_id()]);
    println!("first lock on a fresh tree: {first_writes} zxids (two containers created)");
    assert!(first_writes <= 7, "the first lock took {first_writes} writes");

    // Busy for the other session: found by a read, no write (a refused create would be a
    // transaction of its own). Busy for another task of the same session: no request at all.
    let before = zk.zxid(0);
    assert!(rt.block_on(b.try_lock(&first, &holder("b"), Duration::ZERO)).unwrap().is_none());
    assert_eq!(zk.zxid(0) - before, 0, "writes of a busy try-lock");
    let before = zk.zxid(0);
    assert!(rt.block_on(a.try_lock(&first, &holder("a2"), Duration::ZERO)).unwrap().is_none());
    assert_eq!(zk.zxid(0) - before, 0, "writes of a try-lock busy in its own session");

    // A waiter is woken by the deletion: it watches the node, then gets it on release.
    let watching = watches(&zk);
    let waiter = {
        let (b, first) = (Arc::clone(&b), first.clone());
        rt.spawn(async move { b.try_lock(&first, &holder("b"), Duration::from_secs(30)).await })
    };
    assert!(wait_until(Instant::now() + Duration::from_secs(10), || watches(&zk) > watching), "no watch set");
    rt.block_on(lock.release()).unwrap();
    let taken = rt.block_on(waiter).unwrap().unwrap().expect("the waiter gets the lock");
    rt.block_on(taken.release()).unwrap();

    // Two writes per cycle (create + delete): on fresh paths and on a reused one.
    let before = zk.zxid(0);
    for n in 0..20 {
        let path = batch_path(&format!("F{n:04}"));
        let lock = rt.block_on(a.try_lock(&path, &holder("a"), Duration::ZERO)).unwrap().expect("free");
        rt.block_on(lock.release()).unwrap();
    }
    let fresh = zk.zxid(0) - before;
    let before = zk.zxid(0);
    for _ in 0..20 {
        let lock = rt.block_on(a.try_lock(&first, &holder("a"), Duration::ZERO)).unwrap().expect("free");
        rt.block_on(lock.release()).unwrap();
    }
    let reused = zk.zxid(0) - before;
    assert_eq!((fresh, reused), (40, 40), "writes for 20 cycles on fresh paths and on one path");

    // Close deletes what is still held and ends the session: nothing lingers.
    let poll = LockPath::Poll(ComponentName::new("probe").unwrap());
    let kept = rt.block_on(a.try_lock(&poll, &holder("a"), Duration::ZERO)).unwrap().expect("free");
    let _kept_too = rt.block_on(a.try_lock(&first, &holder("a"), Duration::ZERO)).unwrap().expect("free");
    assert_eq!(lock_nodes(&zk.tree(CHROOT)).len(), 2);
    rt.block_on(a.close());
    let left = zk.tree(CHROOT);
    let owners: Vec<i64> = ephemerals(&left).iter().map(|z| z.ephemeral_owner).collect();
    assert!(owners.len() == 1 && owners[0] != a.session_id(), "only b's liveness node is left: {left:?}");
    assert_eq!(*a.session().borrow(), SessionState::Lost);
    let session = format!("{:#x}", a.session_id());
    let dump = four_letter(zk.client_port(0), "dump").unwrap_or_default();
    assert!(!dump.contains(&session), "session {session} still open after close:\n{dump}");
    assert!(!rt.block_on(kept.still_held()).unwrap_or(false));
    rt.block_on(b.close());
}

#[test]
fn a_process_start_costs_one_write_for_its_liveness_node_and_a_claim_none() {
    let zk = ZooKeeper::start(Options::default());
    let url = zk.url("autocomp", "10s");
    let rt = runtime();
    // The first service makes the chroot and `live` (persistent, made once).
    let first = rt.block_on(ZkLocks::connect(&url)).unwrap();
    let (b, connected) = writes_of(&zk, || rt.block_on(ZkLocks::connect(&url)).unwrap());
    assert_eq!(connected, 2, "writes of a process start: its session and its liveness node");

    // One ephemeral node per session, named by its id, holding who it is.
    let record = b.liveness().expect("a liveness record");
    let node = format!("{CHROOT}/live/{}", record.strip_prefix("zk:").unwrap());
    let tree = zk.tree(CHROOT);
    let live: Vec<(&str, i64)> = tree
        .iter()
        .filter(|z| z.path.starts_with("/autocomp/live/"))
        .map(|z| (z.path.as_str(), z.ephemeral_owner))
        .collect();
    assert!(live.contains(&(node.as_str(), b.session_id())), "{tree:?}");
    assert_eq!(live.len(), 2, "{tree:?}");
    let data = zk.with_client(|client| {
        let node = node.clone();
        async move { client.get_data(&node).await.unwrap().0 }
    });
    let shown: LockHolder = serde_json::from_slice(&data).expect("a holder record");
    assert_eq!((shown.pid, shown.host.as_str()), (std::process::id(), autocomp_framework::hostname().as_str()));

    // Judging, saying one's record and claiming cost nothing; locks cost what they did.
    let (judged, judging) =
        writes_of(&zk, || (0..20).map(|_| rt.block_on(first.judge_liveness(&record)).unwrap()).collect::<Vec<_>>());
    assert!(judged.iter().all(|j| *j == Liveness::Alive), "{judged:?}");
    assert_eq!(judging, 0, "writes of 20 judgements");
    let (_, said) = writes_of(&zk, || (0..20).for_each(|_| assert_eq!(b.liveness().as_ref(), Some(&record))));
    assert_eq!(said, 0, "writes of saying the record");
    assert!(rt.block_on(first.held()).unwrap().is_empty(), "a liveness node listed as a lock");

    // Its close deletes the node with the session, in the same write.
    let (_, closed) = writes_of(&zk, || rt.block_on(b.close()));
    assert_eq!(closed, 1, "writes of a close");
    assert_eq!(rt.block_on(first.judge_liveness(&record)).unwrap(), Liveness::Dead);
    assert_eq!(b.liveness(), None, "a closed service has no record");
    rt.block_on(first.close());
}

#[test]
fn a_process_whose_liveness_node_is_deleted_behind_its_back_loses_its_session() {
    let zk = ZooKeeper::standalone();
    let url = zk.url("autocomp", "10s");
    let rt = runtime();
    let locks = rt.block_on(ZkLocks::connect(&url)).unwrap();
    let mut state = locks.session();
    let record = locks.liveness().unwrap();
    let node = format!("{CHROOT}/live/{}", record.strip_prefix("zk:").unwrap());
    zk.with_client(|client| async move { client.delete(&node, None).await.unwrap() });
    // Others judge it dead now, so it must stop as on an expiry.
    let lost = rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(10), state.wait_for(|s| *s == SessionState::Lost)).await
    });
    assert!(lost.is_ok(), "a process whose liveness node is gone is still {:?}", *locks.session().borrow());
    assert_eq!(locks.liveness(), None);
    rt.block_on(locks.close());
}

/// The writes (zxids) `work` costs on `zk`.
fn writes_of<T>(zk: &ZooKeeper, work: impl FnOnce() -> T) -> (T, i64) {
    let before = zk.zxid(0);
    let done = work();
    (done, zk.zxid(0) - before)
}

#[test]
fn a_round_of_batch_locks_is_one_write_and_their_release_one_more() {
    // Containers checked once a minute: an emptied parent reaped meanwhile would add writes.
    let zk = ZooKeeper::start(Options::default());
    let url = zk.url("autocomp", "10s");
    let rt = runtime();
    let a = rt.block_on(open_locks(&url)).unwrap();
    let b = rt.block_on(open_locks(&url)).unwrap();
    let warm = rt.block_on(a.try_lock(&batch_path("W0001"), &holder("a"), Duration::ZERO)).unwrap().unwrap();
    let paths: Vec<LockPath> = (1..=10).map(|n| batch_path(&format!("B{n:04}"))).collect();

    for count in [1, 10] {
        let (taken, created) = writes_of(&zk, || rt.block_on(a.try_lock_many(&paths[..count], &holder("a"))).unwrap());
        let locks: Vec<_> = taken.into_iter().flatten().collect();
        assert_eq!(locks.len(), count);
        let (released, deleted) = writes_of(&zk, || rt.block_on(a.release_many(locks)));
        released.unwrap();
        println!("{count} batch locks: {created} write(s) to take, {deleted} to release");
        assert_eq!((created, deleted), (1, 1), "writes to take and to release {count} batch locks");
    }

    // Three of them busy: found by reads, left out of the one multi.
    let busy: Vec<_> = [1, 4, 7]
        .iter()
        .map(|&i| rt.block_on(b.try_lock(&paths[i], &holder("b"), Duration::ZERO)).unwrap().expect("free"))
        .collect();
    let (taken, created) = writes_of(&zk, || rt.block_on(a.try_lock_many(&paths, &holder("a"))).unwrap());
    let taken: Vec<bool> = taken.iter().map(Option::is_some).collect();
    assert_eq!(taken, [true, false, true, true, false, true, true, false, true, true]);
    assert_eq!(created, 1, "writes to take 7 of 10 batch locks, 3 busy");
    let all_busy = writes_of(&zk, || rt.block_on(b.try_lock_many(&paths[1..2], &holder("b")))).1;
    assert_eq!(all_busy, 0, "writes of a round whose every batch is busy");
    rt.block_on(b.release_many(busy)).unwrap();
    rt.block_on(warm.release()).unwrap();
    rt.block_on(a.close());
    rt.block_on(b.close());
}

#[test]
fn a_busy_poll_lock_costs_no_write_however_many_passes_find_it_busy() {
    let zk = ZooKeeper::start(Options::default());
    let url = zk.url("autocomp", "10s");
    let rt = runtime();
    let poll = LockPath::Poll(ComponentName::new("probe").unwrap());
    let holding = rt.block_on(open_locks(&url)).unwrap();
    let lock = rt.block_on(holding.try_lock(&poll, &holder("holding"), Duration::ZERO)).unwrap().expect("free");
    let passes: Vec<_> = (0..8).map(|_| rt.block_on(open_locks(&url)).unwrap()).collect();

    // Passes that give up at once, and passes that wait (a watch each) until their timeout.
    let (_, at_once) = writes_of(&zk, || {
        for pass in passes.iter().cycle().take(40) {
            assert!(rt.block_on(pass.try_lock(&poll, &holder("pass"), Duration::ZERO)).unwrap().is_none());
        }
    });
    let (_, waiting) = writes_of(&zk, || {
        let waits: Vec<_> = passes
            .iter()
            .map(|pass| {
                let (pass, poll) = (Arc::clone(pass), poll.clone());
                rt.spawn(async move { pass.try_lock(&poll, &holder("pass"), Duration::from_millis(300)).await })
            })
            .collect();
        for wait in waits {
            assert!(rt.block_on(wait).unwrap().unwrap().is_none(), "a pass got a held poll lock");
        }
    });
    println!("40 passes finding the poll lock busy: {at_once} writes; 8 waiting 300 ms for it: {waiting}");
    assert_eq!((at_once, waiting), (0, 0), "writes of passes that found the poll lock busy");

    // The herd at a release: 8 waiting passes each get it in turn (and release it at once).
    // Ideal: the holder's delete, then a create and a delete per pass; every refused create
    // on top is one waiter that lost a race.
    let (_, handed) = writes_of(&zk, || {
        let waiters: Vec<_> = passes
            .iter()
            .map(|pass| {
                let (pass, poll) = (Arc::clone(pass), poll.clone());
                rt.spawn(async move {
                    let taken = pass.try_lock(&poll, &holder("pass"), Duration::from_secs(30)).await.unwrap();
                    taken.expect("every waiter gets the poll lock in turn").release().await.unwrap();
                })
            })
            .collect();
        let watching = wait_until(Instant::now() + Duration::from_secs(10), || watches(&zk) >= passes.len());
        assert!(watching, "not every pass watches the poll lock");
        rt.block_on(lock.release()).unwrap();
        for waiter in waiters {
            rt.block_on(waiter).unwrap();
        }
    });
    let refused = handed - 1 - 2 * passes.len() as i64;
    println!("the poll lock handed through 8 waiting passes: {handed} writes, {refused} of them refused creates");
    // Without the waiters' backoff every release is raced by all that still wait: 7+6+...+0.
    let herd = (passes.len() * (passes.len() - 1) / 2) as i64;
    assert!(refused <= herd, "{refused} refused creates handing the poll lock through 8 waiters");
    for pass in passes {
        rt.block_on(pass.close());
    }
    rt.block_on(holding.close());
}

#[test]
fn a_pass_costs_its_poll_lock_and_no_write_per_batch() {
    let zk = ZooKeeper::start(Options::default());
    let pipeline = zk_pipeline(&zk, "10s");
    pipeline.configure("max_threads = 10\nqueue_size = 10\n");
    // A first pass creates the chroot and the containers.
    pipeline.register_one("W0001", true);
    let warm = pipeline.run(&[]);
    assert_eq!(warm.code, Some(0), "{}", warm.show());
    let mut costs = Vec::new();
    for count in [1, 10] {
        let ids: Vec<BatchId> =
            (0..count).map(|n| pipeline.register_one(&format!("C{count:02}N{n:02}"), true)).collect();
        let (finished, writes) = writes_of(&zk, || pipeline.run(&[]));
        assert_eq!(finished.code, Some(0), "{}", finished.show());
        assert!(ids.iter().all(|id| pipeline.events(id, PROBED).len() == 1), "{}", finished.show());
        // The session's own: created at connect (and its liveness node), closed at exit.
        costs.push(writes - 3);
    }
    println!("writes of a pass (session aside): 1 batch {}, 10 batches {}", costs[0], costs[1]);
    // The poll lock's create and delete: a batch's claim is its lock, which costs
    // ZooKeeper nothing (the process's liveness node is the session's own).
    assert_eq!(costs, [2, 2], "writes of a one-batch and a ten-batch pass");
    assert_no_lock_nodes(&zk);
}

#[test]
fn a_watcher_keeps_its_components_turn_through_a_trickle_and_gives_it_back_when_idle() {
    let zk = ZooKeeper::start(Options::default());
    let pipeline = zk_pipeline(&zk, "10s");
    pipeline.configure("watch_heartbeat = \"10m\"\n");
    let (mut watcher, kill) = registered_watcher(pipeline.command(&["--watch"]), &pipeline);
    // A trickle: each batch registered once the one before is worked.
    let started = Instant::now();
    let (worked, writes) = writes_of(&zk, || {
        (0..10).all(|n| {
            let id = pipeline.register_one(&format!("T{n:04}"), true);
            wait_until(Instant::now() + Duration::from_secs(10), || pipeline.events(&id, PROBED).len() == 1)
        })
    });
    let took = started.elapsed();
    assert!(worked, "a batch of the trickle was not worked within 10 s");
    // Taking the turn and giving it back for each pass would be 20 writes. Kept, it costs two
    // writes for each 2 s it is held (given back however busy its holder), and the liveness
    // node none.
    // Half of that leaves room for a slow machine's batch taking longer than the idle bound.
    println!("10 batches one at a time in {took:?}: {writes} ZooKeeper writes");
    assert!(writes <= 10, "{writes} writes for 10 batches in {took:?}");
    // Idle, the watcher gives its turn back within about half a second.
    let given_back = wait_until(Instant::now() + Duration::from_secs(5), || lock_nodes(&zk.tree(CHROOT)).is_empty());
    assert!(given_back, "an idle watcher kept its component's turn: {:?}", zk.tree(CHROOT));
    assert!(watcher.try_wait().unwrap().is_none(), "the watcher exited");
    stopped_cleanly(watcher, kill);
}

#[test]
fn a_turn_kept_through_a_suspended_session_is_given_back_and_the_trickle_goes_on() {
    // A trickle keeps the watcher's turn while its ZooKeeper server restarts (the connection
    // drops at once: the session is suspended, and survives, 30 s): the watcher must let the
    // kept lock go once connected again (a turn merely dropped stayed reserved in the
    // process: every later pass found its own component's turn busy, the trickle stuck).
    let mut zk = ZooKeeper::start(Options::default());
    let pipeline = zk_pipeline(&zk, "30s");
    pipeline.configure("watch_heartbeat = \"10m\"\n");
    // Its log is kept for the failure message: once in CI (under load) it worked none of the
    // batches registered after the kill within 30 s of the restart, and passed alone.
    let log = pipeline.path("watcher.log");
    let mut logged = pipeline.command(&["--watch", "-v"]);
    logged.stderr(std::fs::File::create(&log).unwrap());
    let (mut watcher, kill) = registered_watcher(logged, &pipeline);
    let mut ids: Vec<BatchId> = Vec::new();
    let mut trickle = |count: usize| {
        for _ in 0..count {
            ids.push(pipeline.register_one(&format!("S{:04}", ids.len()), true));
            std::thread::sleep(Duration::from_millis(100)); // the trickle's pace
        }
    };
    trickle(10);
    zk.kill(0);
    trickle(5);
    zk.restart(0);
    trickle(10);
    let all = wait_until(Instant::now() + Duration::from_secs(30), || {
        ids.iter().all(|id| pipeline.events(id, PROBED).len() == 1)
    });
    let unworked: Vec<&BatchId> = ids.iter().filter(|id| pipeline.events(id, PROBED).is_empty()).collect();
    assert!(
        all,
        "{} of {} batches not worked after ZooKeeper came back: {unworked:?}; the watcher's log:\n{}",
        unworked.len(),
        ids.len(),
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    assert!(watcher.try_wait().unwrap().is_none(), "the watcher exited");
    let given_back = wait_until(Instant::now() + Duration::from_secs(10), || lock_nodes(&zk.tree(CHROOT)).is_empty());
    assert!(given_back, "the idle watcher kept its turn: {:?}", zk.tree(CHROOT));
    stopped_cleanly(watcher, kill);
}

#[test]
fn a_deferring_watcher_reads_the_poll_lock_not_the_store_until_it_frees() {
    let zk = ZooKeeper::start(Options::default());
    let pipeline = zk_pipeline(&zk, "10s");
    pipeline.configure("watch_heartbeat = \"10m\"\n");
    let log = pipeline.path("watcher.log");
    let mut logged = pipeline.command(&["--watch", "-vv"]);
    logged.stderr(std::fs::File::create(&log).unwrap());
    let (watcher, kill) = registered_watcher(logged, &pipeline);
    let log_text = || std::fs::read_to_string(&log).unwrap_or_default();
    // Another process holds the component's turn.
    let rt = runtime();
    let other = rt.block_on(ZkLocks::connect(&zk.url("autocomp", "10s"))).unwrap();
    let poll = LockPath::Poll(ComponentName::new("probe").unwrap());
    let held = rt.block_on(other.try_lock(&poll, &holder("other"), Duration::from_secs(10))).unwrap().expect("free");
    let count = |what: &str| log_text().lines().filter(|line| line.contains(what)).count();
    let id = pipeline.register_one("D0001", true);
    // Woken by the registration it looks, finds the turn held and defers; its retries (0.5 s,
    // then a quarter of the time deferred) read the poll lock and look no further.
    let deferred = wait_until(Instant::now() + Duration::from_secs(15), || count("deferring to it") >= 4);
    assert!(deferred, "the watcher did not defer four times: {}", log_text());
    let text = log_text();
    let since_deferring = &text[text.find("deferring to it").expect("deferred")..];
    let looks = since_deferring.lines().filter(|line| line.contains("looked for work")).count();
    println!("looks for work while deferring {} times: {looks}", count("deferring to it"));
    assert_eq!(looks, 0, "a deferring watcher read the store at its retries: {text}");
    assert!(pipeline.open_runs().is_empty(), "a batch was claimed while another held the turn");
    rt.block_on(held.release()).unwrap();
    let worked = wait_until(Instant::now() + Duration::from_secs(15), || pipeline.events(&id, PROBED).len() == 1);
    assert!(worked, "the batch was not worked within 15 s of the turn freeing: {}", log_text());
    rt.block_on(other.close());
    stopped_cleanly(watcher, kill);
}

#[test]
fn a_dropped_lock_is_held_until_close_and_nothing_works_after_it() {
    let zk = ZooKeeper::standalone();
    let url = zk.url("autocomp", "10s");
    let rt = runtime();
    let a = rt.block_on(ZkLocks::connect(&url)).unwrap();
    let b = rt.block_on(open_locks(&url)).unwrap();
    assert_eq!(a.lost_session_grace(), Some(Duration::from_secs(1)), "a tenth of the session timeout");

    // Dropped without release: the node stays, for every session, ours included.
    let first = batch_path("B0001");
    drop(rt.block_on(a.try_lock(&first, &holder("a"), Duration::ZERO)).unwrap().expect("free"));
    assert_eq!(rt.block_on(b.held()).unwrap().len(), 1, "a dropped lock was given up");
    assert!(rt.block_on(b.try_lock(&first, &holder("b"), Duration::ZERO)).unwrap().is_none());
    assert!(rt.block_on(a.try_lock(&first, &holder("a2"), Duration::ZERO)).unwrap().is_none());

    // Close deletes it too; after close a kept lock is not held, releasing it is harmless,
    // and the service answers nothing.
    let poll = LockPath::Poll(ComponentName::new("probe").unwrap());
    let kept = rt.block_on(a.try_lock(&poll, &holder("a"), Duration::ZERO)).unwrap().expect("free");
    rt.block_on(a.close());
    assert!(rt.block_on(b.held()).unwrap().is_empty(), "close left locks behind");
    assert!(!rt.block_on(kept.still_held()).unwrap());
    rt.block_on(kept.release()).unwrap();
    let refused = rt.block_on(a.try_lock(&poll, &holder("a"), Duration::ZERO));
    assert!(matches!(refused, Err(LockError::Unavailable(_))), "a closed service took a lock");
    assert!(matches!(rt.block_on(a.held()), Err(LockError::Unavailable(_))), "a closed service listed locks");
    let taken = rt.block_on(b.try_lock(&first, &holder("b"), Duration::ZERO)).unwrap();
    rt.block_on(taken.expect("free after the holder closed").release()).unwrap();
    rt.block_on(b.close());
}

// ---------------------------------------------------------------------------------------
// The probe component with ZooKeeper locks, as cron runs it.

/// A pipeline whose probe takes its locks from `zk`, under `/autocomp`.
fn zk_pipeline(zk: &ZooKeeper, session_timeout: &str) -> Pipeline {
    let pipeline = Pipeline::new(PROBE);
    pipeline.use_locks(&zk.url("autocomp", session_timeout));
    pipeline
}

/// Starts a watcher (`command`: the probe with `--watch`), killed when the guard drops
/// unless disarmed; returns once its first pass has registered the probe.
fn registered_watcher(mut command: std::process::Command, pipeline: &Pipeline) -> (Child, KillOnDrop) {
    let mut watcher = command.spawn().expect("the probe starts");
    let kill = KillOnDrop(Some(watcher.id()));
    let registered = wait_until(Instant::now() + Duration::from_secs(30), || {
        assert!(watcher.try_wait().unwrap().is_none(), "the watcher exited at start");
        !pipeline.block_on(pipeline.any_store().components()).expect("registry readable").is_empty()
    });
    assert!(registered, "the watcher's first pass never registered the probe");
    (watcher, kill)
}

/// SIGTERMs a watcher started by `registered_watcher` and checks it exits 0 within 30 s.
fn stopped_cleanly(watcher: Child, mut kill: KillOnDrop) {
    signal(&watcher, libc::SIGTERM);
    kill.0 = None;
    let finished = finish(watcher, Duration::from_secs(30));
    assert_eq!(finished.code, Some(0), "{}", finished.show());
}

/// Sends `signal` to a child process.
fn signal(child: &Child, signal: libc::c_int) {
    let pid = libc::pid_t::try_from(child.id()).expect("pid fits");
    // SAFETY: kill(2) on the pid of a child we spawned and have not reaped yet.
    let sent = unsafe { libc::kill(pid, signal) };
    assert_eq!(sent, 0, "kill({pid}, {signal}) failed: {}", std::io::Error::last_os_error());
}

/// SIGKILLs a process when dropped, unless disarmed (`.0 = None`).
struct KillOnDrop(Option<u32>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(pid) = self.0.and_then(|pid| libc::pid_t::try_from(pid).ok()) {
            // SAFETY: kill(2) on a child we spawned and have not reaped (disarmed before that).
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

/// One ledger line: the probe appends `pid batch start_ns end_ns` after each batch's work.
fn probed_count(pipeline: &Pipeline) -> usize {
    pipeline.all_batches().iter().filter(|b| b.events.iter().any(|e| e.event_type == *PROBED)).count()
}

/// Every batch has exactly one `Probed` event, a success; no batch was worked on by two
/// processes at once (ledger intervals per batch are disjoint); no run is left open.
/// Returns the ledger grouped by batch.
fn assert_exactly_once(pipeline: &Pipeline, ids: &[BatchId]) -> BTreeMap<String, Vec<LedgerEntry>> {
    let by_batch = disjoint_by_batch(&pipeline.ledger());
    for id in ids {
        let probed = pipeline.events(id, PROBED);
        let outcomes: Vec<Outcome> = probed.iter().map(|e| e.outcome).collect();
        assert_eq!(outcomes, [Outcome::Success], "{id}: {probed:?}");
    }
    let open = pipeline.open_runs();
    assert!(open.is_empty(), "runs left open: {open:?}");
    by_batch
}

fn assert_no_lock_nodes(zk: &ZooKeeper) {
    let tree = zk.tree(CHROOT);
    assert!(lock_nodes(&tree).is_empty(), "lock nodes left behind: {tree:?}");
}

#[test]
fn four_processes_do_500_batches_exactly_once_and_leave_no_lock_nodes() {
    let zk = ZooKeeper::standalone();
    let pipeline = zk_pipeline(&zk, "10s");
    let ids = pipeline.register(500);
    // Busy batches are skipped at once; the poll lock is waited for (a deletion watch).
    pipeline.configure(&format!(
        "max_threads = 4\nqueue_size = 50\nbatch_lock_timeout = \"0s\"\npoll_lock_timeout = \"30s\"\n\n\
         [settings]\nwork_time = \"5ms\"\nledger = \"{}\"\n",
        pipeline.path("ledger.txt").display()
    ));

    let deadline = Instant::now() + Duration::from_secs(100);
    let mut rounds = Vec::new();
    while probed_count(&pipeline) < ids.len() && Instant::now() < deadline {
        let children: Vec<Child> = (0..4).map(|_| pipeline.spawn(&[])).collect();
        rounds.push(children.iter().map(Child::id).collect::<Vec<_>>());
        for child in children {
            let finished = finish(child, PASS_LIMIT);
            assert_eq!(finished.code, Some(0), "a pass failed\n{}", finished.show());
        }
    }
    assert_eq!(probed_count(&pipeline), ids.len(), "not every batch was done after {} rounds", rounds.len());
    let by_batch = assert_exactly_once(&pipeline, &ids);
    for id in &ids {
        let worked = by_batch.get(id.as_str()).map_or(0, Vec::len);
        assert_eq!(worked, 1, "{id} was worked on {worked} times");
    }
    // All four processes of a round worked, at the same time.
    let span = |pid: u32| {
        let mine: Vec<&LedgerEntry> = by_batch.values().flatten().filter(|e| e.pid == pid).collect();
        mine.iter().map(|e| e.start).min().zip(mine.iter().map(|e| e.end).max())
    };
    let all_worked = rounds.iter().any(|round| round.iter().all(|pid| span(*pid).is_some()));
    assert!(all_worked, "in no round did all four processes work: {rounds:?}");

    // Every process deleted its lock nodes before exiting; only the chroot and empty
    // containers remain...
    let tree = zk.tree(CHROOT);
    assert_no_lock_nodes(&zk);
    let containers = [CHROOT, "/autocomp/live", "/autocomp/poll", "/autocomp/batch", "/autocomp/batch/probe"];
    assert!(tree.iter().all(|z| containers.contains(&z.path.as_str())), "{tree:?}");
    // ... and the server deletes them once empty. The chroot stays: it is persistent, so
    // nobody else can re-create it (with an ACL of their own) once it is gone; and so does
    // `live`, made once so that a process start costs one write.
    let only_chroot =
        || zk.tree(CHROOT).iter().map(|z| z.path.clone()).collect::<Vec<_>>() == [CHROOT, "/autocomp/live"];
    let reaped = wait_until(Instant::now() + Duration::from_secs(30), only_chroot);
    assert!(reaped, "containers not deleted by the server: {:?}", zk.tree(CHROOT));
}

#[test]
fn a_sigkilled_holder_loses_its_lock_after_the_session_timeout_and_the_batch_is_taken_over() {
    let zk = ZooKeeper::standalone();
    let pipeline = zk_pipeline(&zk, "3s");
    let id = pipeline.register(1).remove(0);
    let started_dir = pipeline.path("started");
    std::fs::create_dir_all(&started_dir).unwrap();
    pipeline.configure(&format!("[settings]\nwork_time = \"60s\"\nstarted = \"{}\"\n", started_dir.display()));
    let inspector = Inspector::open(&zk.url("autocomp", "10s"));

    let mut child = pipeline.spawn(&[]);
    wait_while_running(&mut child, "working", || !started(&started_dir).is_empty());
    // The claim is the batch's lock: no batch node, the run names its holder and its
    // holder's liveness record, which is alive.
    assert_eq!(inspector.held().len(), 0, "{:?}", inspector.held());
    let crashed_run = pipeline.open_runs().remove(0);
    assert_eq!(crashed_run.holder.pid, child.id(), "{crashed_run:?}");
    assert!(crashed_run.holder.agent.as_str().starts_with("probe/"), "{crashed_run:?}");
    assert_eq!(inspector.judge(&crashed_run), Liveness::Alive);

    signal(&child, libc::SIGKILL);
    let killed = Instant::now();
    let crashed = finish(child, Duration::from_secs(10));
    assert_eq!(crashed.code, None, "{}", crashed.show());
    // The dead process's liveness record lives on with its session until the server
    // expires it: until then its run is its own.
    assert_eq!(inspector.judge(&crashed_run), Liveness::Alive, "dead before the session timeout");
    let held_off = pipeline.run(&[]);
    assert_eq!((held_off.code, held_off.stdout.as_str()), (Some(0), ""), "{}", held_off.show());
    assert_eq!(pipeline.open_runs(), std::slice::from_ref(&crashed_run), "a live holder's run was taken over");
    let gone = wait_until(killed + Duration::from_secs(20), || inspector.judge(&crashed_run) == Liveness::Dead);
    let after = killed.elapsed();
    assert!(gone, "its holder is still alive {after:?} after it died");
    assert!(after >= Duration::from_secs(1), "dead {after:?} after the kill, before the 3s session timeout");
    assert!(after < Duration::from_secs(12), "dead only {after:?} after the kill (3s session timeout)");

    pipeline.configure("[settings]\nwork_time = \"0s\"\n");
    let next = pipeline.run(&[]);
    assert_eq!(next.code, Some(0), "{}", next.show());
    assert!(next.stdout.starts_with("B0001 Probed success"), "{}", next.show());
    assert!(next.stderr.contains("abandoned"), "the takeover is not logged: {}", next.show());
    let probed = pipeline.events(&id, PROBED);
    assert_eq!(probed.iter().map(|e| e.outcome).collect::<Vec<_>>(), [Outcome::Success]);
    assert!(probed[0].run.as_ref().expect("in a run").generation > crashed_run.generation);
    assert_eq!(pipeline.failed_attempts(&id), 1, "the killed run is not counted as abandoned");
    assert!(pipeline.open_runs().is_empty());
    assert_no_lock_nodes(&zk);
}

#[test]
fn a_holder_frozen_past_its_session_is_refused_its_commit_after_a_takeover() {
    let zk = ZooKeeper::standalone();
    let pipeline = zk_pipeline(&zk, "2s");
    let id = pipeline.register(1).remove(0);
    let (started_dir, gate) = pipeline.hold_work_at_a_gate("");
    let inspector = Inspector::open(&zk.url("autocomp", "10s"));

    let mut frozen = pipeline.spawn(&[]);
    wait_while_running(&mut frozen, "working", || !started(&started_dir).is_empty());
    let frozen_run = pipeline.open_runs().remove(0);
    signal(&frozen, libc::SIGSTOP);
    // A stopped process never ends by itself: should the test fail before SIGCONT, kill it.
    let mut stopped = KillOnDrop(Some(frozen.id()));
    let gone = wait_until(Instant::now() + Duration::from_secs(20), || inspector.judge(&frozen_run) == Liveness::Dead);
    assert!(gone, "the frozen holder outlived its 2s session");

    // Another process takes the batch over and records it.
    pipeline.configure("[settings]\n");
    let other = pipeline.run(&[]);
    assert_eq!(other.code, Some(0), "{}", other.show());
    assert!(other.stdout.starts_with("B0001 Probed success"), "{}", other.show());
    assert!(other.stderr.contains("abandoned"), "{}", other.show());

    // The frozen one wakes up and finishes its work: its commit is refused. Whichever it
    // hears of first ends it: its session's expiry (exit 4, nothing recorded) or the
    // store's refusal of its generation (exit 1, fenced).
    std::fs::write(&gate, "").unwrap();
    signal(&frozen, libc::SIGCONT);
    stopped.0 = None;
    let woke = finish(frozen, PASS_LIMIT);
    let refused = match woke.code {
        Some(4) => woke.stderr.contains("nothing recorded"),
        Some(1) => woke.stderr.contains("result refused, another worker took the batch over"),
        _ => false,
    };
    assert!(refused, "{}", woke.show());
    assert_eq!(woke.stdout, "", "{}", woke.show());

    let probed = pipeline.events(&id, PROBED);
    assert_eq!(probed.len(), 1, "{probed:?}");
    assert_eq!(probed[0].outcome, Outcome::Success);
    assert!(probed[0].run.as_ref().unwrap().generation > frozen_run.generation);
    assert_eq!(pipeline.failed_attempts(&id), 1, "the frozen run is not marked abandoned");
    // Had its lock check passed, the store would still refuse its generation.
    let late = autocomp_model::NewEvent::new(
        autocomp_model::EventType::new(PROBED).unwrap(),
        Outcome::Success,
        frozen_run.holder.agent.clone(),
    )
    .in_run(ComponentName::new("probe").unwrap(), frozen_run.generation);
    let refused = pipeline.block_on(autocomp_store::BatchStore::append_event(pipeline.store(), &id, late));
    assert!(refused.as_ref().is_err_and(|e| e.is_fenced()), "{refused:?}");
    assert!(pipeline.open_runs().is_empty());
    assert_no_lock_nodes(&zk);
}

#[test]
fn a_lost_session_cancels_all_work_records_nothing_and_exits_4() {
    let mut zk = ZooKeeper::standalone();
    let pipeline = zk_pipeline(&zk, "2s");
    let ids = pipeline.register(4);
    let (started_dir, gate) = pipeline.hold_work_at_a_gate("max_threads = 2\nqueue_size = 4");

    let mut child = pipeline.spawn(&[]);
    wait_while_running(&mut child, "working on two batches", || started(&started_dir).len() == 2);
    assert_eq!(pipeline.open_runs().len(), 4);
    zk.kill(0);
    let killed = Instant::now();
    let lost = finish(child, PASS_LIMIT);
    assert_eq!(lost.code, Some(4), "{}", lost.show());
    assert!(killed.elapsed() < Duration::from_secs(15), "took {:?} to give up a 2s session", killed.elapsed());
    assert_eq!(lost.stderr.matches("work cancelled, nothing recorded").count(), 2, "{}", lost.show());
    assert_eq!(lost.stdout, "", "{}", lost.show());
    for id in &ids {
        assert!(pipeline.events(id, PROBED).is_empty(), "{id} has an event");
        assert_eq!(pipeline.failed_attempts(id), 0, "{id}: a released claim counted as a failed attempt");
    }
    assert!(pipeline.open_runs().is_empty(), "claims left open: {:?}", pipeline.open_runs());

    // ZooKeeper back (it keeps the dead session's nodes until that session expires there).
    zk.restart(0);
    std::fs::write(&gate, "").unwrap();
    let inspector = Inspector::open(&zk.url("autocomp", "10s"));
    assert!(wait_until(Instant::now() + Duration::from_secs(20), || inspector.held().is_empty()));
    let next = pipeline.run(&[]);
    assert_eq!(next.code, Some(0), "{}", next.show());
    assert_eq!(next.stdout.lines().count(), 4, "{}", next.show());
    assert_exactly_once(&pipeline, &ids);
    assert_no_lock_nodes(&zk);
}

/// Silences the (standalone) server as a partition would (SIGSTOP: connections stay open,
/// nothing answers) until `child` exits, at most `PASS_LIMIT`; how long that took, and how
/// the child ended. The server answers again afterwards.
fn silenced_until_exit(zk: &mut ZooKeeper, mut child: Child) -> (Duration, Finished) {
    zk.pause(0);
    let silenced = Instant::now();
    wait_until(silenced + PASS_LIMIT, || child.try_wait().unwrap().is_some());
    let after = silenced.elapsed();
    let ended = finish(child, Duration::ZERO);
    zk.resume(0);
    (after, ended)
}

#[test]
fn work_that_ignores_cancellation_is_left_behind_before_the_server_could_expire_the_session() {
    let mut zk = ZooKeeper::standalone();
    let session_timeout = Duration::from_secs(4);
    let pipeline = zk_pipeline(&zk, "4s");
    let ids = pipeline.register(1);
    let started_dir = pipeline.path("started");
    std::fs::create_dir_all(&started_dir).unwrap();
    // The probe's `hang` never looks at its cancellation.
    pipeline.configure(&format!("[settings]\nbehaviour = \"hang\"\nstarted = \"{}\"\n", started_dir.display()));
    let mut child = pipeline.spawn(&[]);
    wait_while_running(&mut child, "working", || started(&started_dir).len() == 1);
    let (gone_after, lost) = silenced_until_exit(&mut zk, child);
    assert_eq!(lost.code, Some(4), "{}", lost.show());
    assert!(gone_after < session_timeout, "the process was gone {gone_after:?} after the silence: {}", lost.show());
    assert!(lost.stderr.contains("leaving it behind"), "{}", lost.show());
    assert!(pipeline.events(&ids[0], PROBED).is_empty(), "nothing recorded");
    eprintln!("work ignoring cancellation: the process was gone {gone_after:?} after ZooKeeper went silent");
}

#[test]
fn a_silent_zookeeper_cancels_work_before_the_server_could_expire_the_session() {
    let mut zk = ZooKeeper::standalone();
    let session_timeout = Duration::from_secs(4);
    let pipeline = zk_pipeline(&zk, "4s");
    let ids = pipeline.register(2);
    let (started_dir, gate) = pipeline.hold_work_at_a_gate("max_threads = 2\nqueue_size = 2");
    let mut child = pipeline.spawn(&[]);
    wait_while_running(&mut child, "working on both batches", || started(&started_dir).len() == 2);

    // The server goes silent, as across a partition: the connection stays up, nothing
    // answers, and the worker can never hear that its session expired. It must stop on its
    // own before the server could expire the session and another host take the batches.
    let (gave_up_after, lost) = silenced_until_exit(&mut zk, child);
    assert_eq!(lost.code, Some(4), "{}", lost.show());
    assert!(
        gave_up_after < session_timeout,
        "gave up {gave_up_after:?} after the silence, session {session_timeout:?}: {}",
        lost.show()
    );
    assert!(lost.stderr.contains("no word from ZooKeeper"), "{}", lost.show());
    assert_eq!(lost.stderr.matches("work cancelled, nothing recorded").count(), 2, "{}", lost.show());
    for id in &ids {
        assert!(pipeline.events(id, PROBED).is_empty(), "{id} has an event");
    }
    eprintln!("gave up {gave_up_after:?} after ZooKeeper went silent (session timeout {session_timeout:?})");

    // ZooKeeper answers again; once it has expired the old session, the next pass does both.
    std::fs::write(&gate, "").unwrap();
    let inspector = Inspector::open(&zk.url("autocomp", "10s"));
    assert!(wait_until(Instant::now() + Duration::from_secs(20), || inspector.held().is_empty()));
    let next = pipeline.run(&[]);
    assert_eq!(next.code, Some(0), "{}", next.show());
    assert_exactly_once(&pipeline, &ids);
    assert_no_lock_nodes(&zk);
}

/// Two processes work (held at a gate) when `outage` strikes ZooKeeper; then the gate
/// opens. Each process finishes or exits 4; later passes complete the work; no batch is
/// recorded twice or lost, and no two processes ever worked on one batch at once.
fn an_outage_mid_run_loses_and_duplicates_nothing(mut zk: ZooKeeper, outage: impl FnOnce(&mut ZooKeeper)) {
    let pipeline = zk_pipeline(&zk, "10s");
    let ids = pipeline.register(40);
    let (started_dir, gate) = (pipeline.path("started"), pipeline.path("go"));
    std::fs::create_dir_all(&started_dir).unwrap();
    pipeline.configure(&format!(
        "max_threads = 2\nqueue_size = 10\npoll_lock_timeout = \"30s\"\n\n[settings]\nwork_time = \"20ms\"\n\
         ledger = \"{}\"\nstarted = \"{}\"\nwait_for = \"{}\"\n",
        pipeline.path("ledger.txt").display(),
        started_dir.display(),
        gate.display()
    ));

    let mut pair = [pipeline.spawn(&[]), pipeline.spawn(&[])];
    let pids = [pair[0].id(), pair[1].id()];
    let both_working = || pids.iter().all(|pid| started(&started_dir).iter().any(|(_, p)| p == pid));
    for child in &mut pair {
        wait_while_running(child, "working alongside the other", both_working);
    }
    outage(&mut zk);
    std::fs::write(&gate, "").unwrap();
    let mut codes = Vec::new();
    for child in pair {
        let finished = finish(child, PASS_LIMIT);
        assert!(matches!(finished.code, Some(0 | 4)), "{}", finished.show());
        codes.push(finished.code);
    }

    let deadline = Instant::now() + Duration::from_secs(60);
    let mut passes = 0;
    while probed_count(&pipeline) < ids.len() && Instant::now() < deadline {
        let next = pipeline.run(&[]);
        assert_eq!(next.code, Some(0), "{}", next.show());
        passes += 1;
    }
    assert_eq!(probed_count(&pipeline), ids.len(), "not every batch done after {passes} more passes");
    assert_exactly_once(&pipeline, &ids);
    assert_no_lock_nodes(&zk);
    println!("exit codes during the outage: {codes:?}; {passes} passes after it");
}

#[test]
fn zookeeper_restarted_mid_run_loses_and_duplicates_nothing() {
    an_outage_mid_run_loses_and_duplicates_nothing(ZooKeeper::standalone(), |zk| {
        zk.kill(0);
        zk.restart(0);
    });
}

#[test]
fn the_leader_of_an_ensemble_killed_mid_run_loses_and_duplicates_nothing() {
    an_outage_mid_run_loses_and_duplicates_nothing(ZooKeeper::ensemble(), |zk| {
        let leader = zk.leader();
        zk.kill(leader);
        let elected = zk.leader();
        assert_ne!(elected, leader);
    });
}

#[test]
fn an_unreachable_zookeeper_exits_4_naming_it_and_claims_nothing() {
    let pipeline = Pipeline::new(PROBE);
    let port = free_ports(1)[0];
    pipeline.use_locks(&format!("zk://127.0.0.1:{port}/autocomp?session_timeout=2s"));
    let id = pipeline.register(1).remove(0);
    let head = pipeline.head();

    let run = pipeline.run(&[]);
    assert_eq!(run.code, Some(4), "{}", run.show());
    assert!(run.stderr.contains("cannot reach ZooKeeper"), "{}", run.show());
    assert!(run.stderr.contains(&format!("127.0.0.1:{port}")), "the message does not name the server: {}", run.show());
    assert!(run.elapsed < Duration::from_secs(10), "took {:?} to give up", run.elapsed);
    assert_eq!(run.stdout, "", "{}", run.show());
    assert_eq!(pipeline.head(), head, "a run without its lock service changed the store");
    assert!(pipeline.open_runs().is_empty());
    assert!(pipeline.events(&id, PROBED).is_empty());
}
