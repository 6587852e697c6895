//! The `LockService` contract: what every lock backend promises, one suite run against each
//! (flock files in a temp dir; a real standalone ZooKeeper, plain and with TLS and the
//! pipeline's identity; a real PostgreSQL, a database of its own per test), opened by URL as components open
//! them, so a backend passes the same tests as the other, not a copy of them. Holders in other
//! processes are this test binary re-run with `HOLDER_URL` set. What one backend does alone
//! is tested with it: framework/src/locks/local.rs and tests/tests/zookeeper.rs.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use autocomp_e2e::zk::ZooKeeper;
use autocomp_framework::locks::{
    HeldLock, Liveness, Lock, LockHolder, LockPath, LockService, SessionState, open_locks,
};
use autocomp_model::{BatchId, ComponentName, Timestamp};
use autocomp_test_servers::wait_until_async;

/// Set in a holder process's environment: the locks URL it opens.
const HOLDER_URL: &str = "AUTOCOMP_LOCK_CONTRACT_HOLDER_URL";
/// What a holder process prints once it holds its locks.
const HOLDING: &str = "HOLDING";
/// What a holder process prints before `HOLDING`: its liveness record (`-` for none).
const LIVENESS: &str = "LIVENESS ";

struct Backend {
    /// What the test's own services open.
    url: String,
    /// What holder processes open: for ZooKeeper a short session, so a killed holder's
    /// session (and its locks) expires soon.
    holder_url: String,
    /// How long a SIGKILLed holder's locks may outlive it.
    dead_holder_freed_within: Duration,
    /// Keeps the lock dir alive for the test.
    _dir: Option<tempfile::TempDir>,
    /// Keeps the server running for the test (killed when dropped).
    _zookeeper: Option<ZooKeeper>,
}

/// `local:<temp dir>`: the OS frees a dead process's flocks as it goes.
fn local() -> Backend {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("local:{}", dir.path().join("locks").display());
    Backend {
        holder_url: url.clone(),
        url,
        dead_holder_freed_within: Duration::from_secs(1),
        _dir: Some(dir),
        _zookeeper: None,
    }
}

/// `zk://` on a standalone server of the test's own; holders get the server's shortest
/// session (2 s), which it expires within a few ticks of a holder's death.
fn zookeeper() -> Backend {
    let zookeeper = ZooKeeper::standalone();
    Backend {
        url: zookeeper.url("contract", "10s"),
        holder_url: zookeeper.url("contract", "2s"),
        dead_holder_freed_within: Duration::from_secs(20),
        _dir: None,
        _zookeeper: Some(zookeeper),
    }
}

/// `postgres://` on a database of its own in this test process's shared server; holders get
/// a 2 s lease, which the test's own services see unrenewed and take over soon after a
/// holder's death (held() looks).
fn postgres() -> Backend {
    let url = autocomp_test_servers::postgres::shared().unique_database();
    Backend {
        holder_url: format!("{url}?lease=2s"),
        url,
        dead_holder_freed_within: Duration::from_secs(20),
        _dir: None,
        _zookeeper: None,
    }
}

/// `zks://` with the pipeline's digest identity on a server with a TLS port and the digest
/// provider: every lock node and directory under the pipeline's ACL, holders included.
fn zookeeper_secured() -> Backend {
    let zookeeper = ZooKeeper::start(ZooKeeper::standalone_options().secured());
    Backend {
        url: zookeeper.secure_url("contract", "10s"),
        holder_url: zookeeper.secure_url("contract", "2s"),
        dead_holder_freed_within: Duration::from_secs(20),
        _dir: None,
        _zookeeper: Some(zookeeper),
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("a runtime")
}

async fn open(backend: &Backend) -> Arc<dyn LockService> {
    open_locks(&backend.url).await.unwrap_or_else(|e| panic!("cannot open {}: {e}", backend.url))
}

fn holder(agent: &str) -> LockHolder {
    LockHolder { agent: agent.into(), host: "testhost".into(), pid: 4242, since: Timestamp::now() }
}

fn component(name: &str) -> ComponentName {
    ComponentName::new(name).unwrap()
}

fn poll_path(name: &str) -> LockPath {
    LockPath::Poll(component(name))
}

fn batch_path(batch: &str) -> LockPath {
    LockPath::Batch(component("probe"), BatchId::new(batch).unwrap())
}

fn paths_of(held: &[HeldLock]) -> Vec<&str> {
    held.iter().map(|h| h.path.as_str()).collect()
}

async fn take(locks: &Arc<dyn LockService>, path: &LockPath, agent: &str) -> Box<dyn Lock> {
    let taken = locks.try_lock(path, &holder(agent), Duration::ZERO).await.unwrap();
    taken.unwrap_or_else(|| panic!("{} is busy", path.relative()))
}

async fn is_busy(locks: &Arc<dyn LockService>, path: &LockPath) -> bool {
    locks.try_lock(path, &holder("probing"), Duration::ZERO).await.unwrap().is_none()
}

// ---------------------------------------------------------------------------------------
// The contract.

async fn a_path_is_held_by_one_lock_at_a_time_until_released(backend: Backend) {
    let a = open(&backend).await;
    let b = open(&backend).await;
    for first in [poll_path("probe"), batch_path("B0001")] {
        let lock = take(&a, &first, "a").await;
        assert_eq!(lock.path(), &first);
        // Busy for another service, and for another task of the same one.
        assert!(b.try_lock(&first, &holder("b"), Duration::ZERO).await.unwrap().is_none());
        assert!(a.try_lock(&first, &holder("a2"), Duration::ZERO).await.unwrap().is_none());
        assert!(lock.still_held().await.unwrap());

        lock.release().await.unwrap();
        let taken = b.try_lock(&first, &holder("b"), Duration::ZERO).await.unwrap();
        let taken = taken.unwrap_or_else(|| panic!("{} is still busy after its release", first.relative()));
        assert!(taken.still_held().await.unwrap());
        assert!(is_busy(&a, &first).await, "{} taken twice", first.relative());
        taken.release().await.unwrap();
        assert!(!is_busy(&a, &first).await, "{} is still busy after its second release", first.relative());
    }
    a.close().await;
    b.close().await;
}

async fn locks_of_different_components_and_batches_are_independent(backend: Backend) {
    let a = open(&backend).await;
    let b = open(&backend).await;
    let other_batch = LockPath::Batch(component("other"), BatchId::new("B0001").unwrap());
    let paths = [poll_path("probe"), poll_path("other"), batch_path("B0001"), batch_path("B0002"), other_batch];
    let mut locks = Vec::new();
    for (n, path) in paths.iter().enumerate() {
        let (service, agent) = if n % 2 == 0 { (&a, "a") } else { (&b, "b") };
        locks.push(take(service, path, agent).await);
    }
    let held = a.held().await.unwrap();
    let expected = ["batch/other/B0001", "batch/probe/B0001", "batch/probe/B0002", "poll/other", "poll/probe"];
    assert_eq!(paths_of(&held), expected, "listed by path");

    // Releasing one leaves the others held.
    let released = locks.remove(2);
    assert_eq!(released.path(), &batch_path("B0001"));
    released.release().await.unwrap();
    for lock in &locks {
        assert!(lock.still_held().await.unwrap(), "{} went with another lock", lock.path().relative());
    }
    let held = b.held().await.unwrap();
    assert_eq!(paths_of(&held), ["batch/other/B0001", "batch/probe/B0002", "poll/other", "poll/probe"]);
    for lock in locks {
        lock.release().await.unwrap();
    }
    a.close().await;
    b.close().await;
}

async fn another_service_reads_who_holds_what(backend: Backend) {
    let a = open(&backend).await;
    let b = open(&backend).await;
    assert_eq!(*a.session().borrow(), SessionState::Connected);
    assert!(b.held().await.unwrap().is_empty(), "a fresh backend holds nothing");
    let first = batch_path("B0001");
    let stored = holder("a");
    let lock = a.try_lock(&first, &stored, Duration::ZERO).await.unwrap().expect("free");

    // Who holds what, from another session.
    let held = b.held().await.unwrap();
    assert_eq!(held.len(), 1, "{held:?}");
    assert_eq!(held[0].path, "batch/probe/B0001");
    let shown = held[0].holder.as_ref().expect("the holder is readable");
    assert_eq!((shown.agent.as_str(), shown.host.as_str(), shown.pid), ("a", "testhost", 4242));
    assert_eq!(shown, &stored, "the holder reads back as stored");
    assert_eq!(a.held().await.unwrap(), held, "the holder's own service lists the same");

    lock.release().await.unwrap();
    assert!(a.held().await.unwrap().is_empty());
    assert!(b.held().await.unwrap().is_empty());
    a.close().await;
    b.close().await;
}

async fn a_read_of_whether_a_path_is_held_tells_the_truth_or_nothing(backend: Backend) {
    // A deferring watcher reads whether its component's turn is held before it looks for
    // work: an answer must be true (or `None`: the backend cannot tell by a read, and the
    // watcher looks as it would without asking).
    let a = open(&backend).await;
    let b = open(&backend).await;
    let poll = poll_path("probe");
    let free = b.is_held(&poll).await.unwrap();
    let lock = take(&a, &poll, "a").await;
    let held = b.is_held(&poll).await.unwrap();
    assert_eq!(a.is_held(&poll).await.unwrap(), held, "the holder's own service reads the same");
    lock.release().await.unwrap();
    let released = b.is_held(&poll).await.unwrap();
    // ZooKeeper reads its node, PostgreSQL the lease row; a flock cannot be read without a try.
    if !backend.url.starts_with("local") {
        assert_eq!((free, held, released), (Some(false), Some(true), Some(false)));
    } else {
        assert_eq!((free, held, released), (None, None, None));
    }
    a.close().await;
    b.close().await;
}

async fn a_busy_try_lock_gives_up_when_its_wait_is_over(backend: Backend) {
    let a = open(&backend).await;
    let b = open(&backend).await;
    let first = batch_path("B0001");
    let lock = take(&a, &first, "a").await;

    let asked = Instant::now();
    assert!(b.try_lock(&first, &holder("b"), Duration::ZERO).await.unwrap().is_none());
    assert!(asked.elapsed() < Duration::from_secs(2), "a try-lock without a wait took {:?}", asked.elapsed());

    let wait = Duration::from_millis(500);
    for (service, agent) in [(&b, "b"), (&a, "a2")] {
        let asked = Instant::now();
        assert!(service.try_lock(&first, &holder(agent), wait).await.unwrap().is_none(), "{agent} took a busy lock");
        let waited = asked.elapsed();
        assert!(waited >= wait, "{agent} gave up after {waited:?}, before its {wait:?}");
        assert!(waited < wait + Duration::from_secs(3), "{agent} gave up only after {waited:?} (wait {wait:?})");
    }
    assert!(lock.still_held().await.unwrap());
    lock.release().await.unwrap();
    a.close().await;
    b.close().await;
}

async fn a_waiter_gets_the_lock_as_soon_as_it_is_released(backend: Backend) {
    let a = open(&backend).await;
    let b = open(&backend).await;
    let first = batch_path("B0001");
    // Waiting in another service, then in another task of the holder's own.
    for (waiting, agent) in [(&b, "b"), (&a, "a2")] {
        let lock = take(&a, &first, "a").await;
        let waiter = {
            let (waiting, first) = (Arc::clone(waiting), first.clone());
            tokio::spawn(async move { waiting.try_lock(&first, &holder(agent), Duration::from_secs(30)).await })
        };
        assert!(lock.still_held().await.unwrap());
        assert!(!waiter.is_finished(), "{agent} took a held lock");
        let released = Instant::now();
        lock.release().await.unwrap();
        let taken = waiter.await.unwrap().unwrap().expect("the waiter gets the lock");
        assert!(released.elapsed() < Duration::from_secs(5), "the waiter took {:?}", released.elapsed());
        assert_eq!(a.held().await.unwrap()[0].holder.as_ref().unwrap().agent, agent);
        taken.release().await.unwrap();
    }
    a.close().await;
    b.close().await;
}

async fn contending_takers_never_hold_a_path_at_once(backend: Backend) {
    const SERVICES: usize = 2;
    const TASKS: usize = 3;
    const CYCLES: usize = 15;
    let services = [open(&backend).await, open(&backend).await];
    let taken = Arc::new(AtomicBool::new(false));
    let cycles = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for (s, service) in services.iter().enumerate() {
        for t in 0..TASKS {
            let (service, taken, cycles) = (Arc::clone(service), Arc::clone(&taken), Arc::clone(&cycles));
            tasks.push(tokio::spawn(async move {
                let agent = format!("s{s}t{t}");
                for _ in 0..CYCLES {
                    let lock = service.try_lock(&batch_path("B0001"), &holder(&agent), Duration::from_secs(30)).await;
                    let lock = lock.unwrap().unwrap_or_else(|| panic!("{agent} waited 30 s in vain"));
                    assert!(!taken.swap(true, Ordering::SeqCst), "{agent} holds a lock someone else holds");
                    // Let the others try while it is held.
                    tokio::task::yield_now().await;
                    assert!(lock.still_held().await.unwrap());
                    taken.store(false, Ordering::SeqCst);
                    cycles.fetch_add(1, Ordering::SeqCst);
                    lock.release().await.unwrap();
                }
            }));
        }
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(cycles.load(Ordering::SeqCst), SERVICES * TASKS * CYCLES);
    assert!(services[0].held().await.unwrap().is_empty());
    for service in services {
        service.close().await;
    }
}

async fn a_holder_that_closes_and_exits_leaves_nothing_held(backend: Backend) {
    let locks = open(&backend).await;
    let mut holding = tokio::task::block_in_place(|| HolderProcess::start(&backend.holder_url));

    // What operators see: the other process's locks, each naming it.
    let held = locks.held().await.unwrap();
    assert_eq!(paths_of(&held), ["batch/probe/B0001", "poll/probe"]);
    for lock in &held {
        let shown = lock.holder.as_ref().expect("the holder is readable");
        assert_eq!((shown.agent.as_str(), shown.pid), ("holder-process", holding.child.id()), "{shown:?}");
    }
    for path in HolderProcess::paths() {
        assert!(is_busy(&locks, &path).await, "{} is free while another process holds it", path.relative());
    }

    tokio::task::block_in_place(|| holding.close_and_exit());
    // At once: a closed holder leaves nothing for a timeout to clean up.
    assert!(locks.held().await.unwrap().is_empty(), "{:?}", locks.held().await);
    for path in HolderProcess::paths() {
        take(&locks, &path, "next").await.release().await.unwrap();
    }
    locks.close().await;
}

async fn a_killed_holders_locks_are_freed_within_the_backends_bound(backend: Backend) {
    let locks = open(&backend).await;
    let holding = tokio::task::block_in_place(|| HolderProcess::start(&backend.holder_url));
    assert_eq!(locks.held().await.unwrap().len(), 2);

    let killed = tokio::task::block_in_place(|| holding.kill());
    let freed =
        wait_until_async(killed + backend.dead_holder_freed_within, async || locks.held().await.unwrap().is_empty())
            .await;
    let after = killed.elapsed();
    assert!(freed, "a killed holder's locks are still held {after:?} after: {:?}", locks.held().await);
    println!("a killed holder's locks were freed {after:?} after its death");
    for path in HolderProcess::paths() {
        take(&locks, &path, "next").await.release().await.unwrap();
    }
    locks.close().await;
}

async fn a_killed_holders_turn_reads_free_within_the_backends_bound_and_never_before(backend: Backend) {
    // A deferring watcher reads whether its component's turn is held before it looks for
    // work: while the holder lives the read says held (here for longer than a PostgreSQL
    // holder's 2 s lease), and once it is dead the read says free within the bound its
    // locks are freed in, so the watcher tries, and its try takes the turn over.
    let locks = open(&backend).await;
    let holding = tokio::task::block_in_place(|| HolderProcess::start(&backend.holder_url));
    let [turn, _] = HolderProcess::paths();
    if locks.is_held(&turn).await.unwrap().is_none() {
        // A backend that cannot tell by a read: the watcher tries instead.
        tokio::task::block_in_place(|| holding.kill());
        locks.close().await;
        return;
    }
    let alive_until = Instant::now() + Duration::from_millis(2_500);
    while Instant::now() < alive_until {
        assert_eq!(locks.is_held(&turn).await.unwrap(), Some(true), "a live holder's turn read free");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let killed = tokio::task::block_in_place(|| holding.kill());
    let freed = wait_until_async(killed + backend.dead_holder_freed_within, async || {
        locks.is_held(&turn).await.unwrap() == Some(false)
    })
    .await;
    let after = killed.elapsed();
    assert!(freed, "a killed holder's turn still reads held {after:?} after its death");
    println!("a killed holder's turn read free {after:?} after its death");
    take(&locks, &turn, "next").await.release().await.unwrap();
    locks.close().await;
}

async fn try_lock_many_takes_each_free_path_and_answers_none_for_each_busy_one(backend: Backend) {
    let a = open(&backend).await;
    let b = open(&backend).await;
    assert!(a.try_lock_many(&[], &holder("a")).await.unwrap().is_empty());
    let held_by_b = take(&b, &batch_path("B0002"), "b").await;
    let held_by_a = take(&a, &batch_path("B0004"), "a").await;
    let paths =
        [batch_path("B0001"), batch_path("B0002"), batch_path("B0003"), batch_path("B0004"), poll_path("probe")];
    let answers = a.try_lock_many(&paths, &holder("a-many")).await.unwrap();
    let taken: Vec<bool> = answers.iter().map(Option::is_some).collect();
    // Busy for another service and for another task of this very one alike.
    assert_eq!(taken, [true, false, true, false, true], "taken, by path");
    let locks: Vec<Box<dyn Lock>> = answers.into_iter().flatten().collect();
    for lock in &locks {
        assert!(lock.still_held().await.unwrap());
        assert!(is_busy(&b, lock.path()).await, "{} is free while taken", lock.path().relative());
    }
    let shown = b.held().await.unwrap();
    let a_many: Vec<&str> = shown
        .iter()
        .filter(|h| h.holder.as_ref().is_some_and(|h| h.agent == "a-many"))
        .map(|h| h.path.as_str())
        .collect();
    assert_eq!(a_many, ["batch/probe/B0001", "batch/probe/B0003", "poll/probe"]);

    // Another try of the same paths finds every one busy, and takes nothing.
    let again = b.try_lock_many(&paths, &holder("b")).await.unwrap();
    assert!(again.iter().all(Option::is_none), "a held path was taken twice");
    a.release_many(locks).await.unwrap();
    held_by_a.release().await.unwrap();
    held_by_b.release().await.unwrap();
    assert!(b.held().await.unwrap().is_empty(), "{:?}", b.held().await);
    a.close().await;
    b.close().await;
}

async fn release_many_frees_every_path_at_once_whoever_took_it(backend: Backend) {
    let a = open(&backend).await;
    let b = open(&backend).await;
    a.release_many(Vec::new()).await.unwrap();
    let paths =
        [batch_path("B0001"), batch_path("B0002"), LockPath::Slot(autocomp_model::PoolName::new("tape").unwrap(), 0)];
    let mut locks: Vec<Box<dyn Lock>> =
        a.try_lock_many(&paths, &holder("a")).await.unwrap().into_iter().flatten().collect();
    assert_eq!(locks.len(), 3);
    // A lock of another service in the same call is released too (by its own service).
    locks.push(take(&b, &poll_path("probe"), "b").await);
    // A waiter is handed its path by the release, as by a single lock's.
    let waiter = {
        let b = Arc::clone(&b);
        tokio::spawn(async move { b.try_lock(&batch_path("B0002"), &holder("waiter"), Duration::from_secs(30)).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    let released = Instant::now();
    a.release_many(locks).await.unwrap();
    for path in
        [batch_path("B0001"), LockPath::Slot(autocomp_model::PoolName::new("tape").unwrap(), 0), poll_path("probe")]
    {
        take(&b, &path, "next").await.release().await.unwrap();
    }
    let handed = waiter.await.unwrap().unwrap().expect("the waiter gets the released path");
    assert!(released.elapsed() < Duration::from_secs(10), "the waiter got it {:?} after", released.elapsed());
    handed.release().await.unwrap();
    assert!(a.held().await.unwrap().is_empty(), "{:?}", a.held().await);
    a.close().await;
    b.close().await;
}

async fn a_services_own_liveness_record_is_alive_to_another_and_never_listed_as_a_lock(backend: Backend) {
    let a = open(&backend).await;
    let b = open(&backend).await;
    let record = a.liveness().expect("every backend keeps a liveness record");
    assert_ne!(Some(&record), b.liveness().as_ref(), "two services, one record");
    assert_eq!(a.liveness().as_ref(), Some(&record), "a service's record does not change");
    assert_eq!(a.judge_liveness(&record).await.unwrap(), Liveness::Alive, "its own service");
    // PostgreSQL needs to see the beat change: unproven until then, never dead.
    let alive = judged_until(&b, &record, Liveness::Alive, Instant::now() + Duration::from_secs(20)).await;
    assert!(alive, "a live service's record {record} is not alive to another");

    // What `autocomp locks` lists: locks only, and no alarm for the liveness records.
    assert!(b.held().await.unwrap().is_empty(), "{:?}", b.held().await);
    let lock = take(&a, &batch_path("B0001"), "a").await;
    let held = b.held().await.unwrap();
    assert_eq!(paths_of(&held), ["batch/probe/B0001"], "{held:?}");
    assert!(held.iter().all(|h| h.foreign.is_none()), "{held:?}");
    lock.release().await.unwrap();
    a.close().await;
    b.close().await;
}

async fn a_closed_holders_liveness_record_is_dead(backend: Backend) {
    let locks = open(&backend).await;
    let mut holding = tokio::task::block_in_place(|| HolderProcess::start(&backend.holder_url));
    let record = holding.liveness.clone().expect("the holder keeps a liveness record");
    let alive = judged_until(&locks, &record, Liveness::Alive, Instant::now() + Duration::from_secs(20)).await;
    assert!(alive, "a live holder's record {record} is not alive");
    assert_eq!(paths_of(&locks.held().await.unwrap()), ["batch/probe/B0001", "poll/probe"], "locks only");

    tokio::task::block_in_place(|| holding.close_and_exit());
    // At once: a holder that closed leaves no record for a bound to run out.
    assert_eq!(locks.judge_liveness(&record).await.unwrap(), Liveness::Dead, "{record} after a clean exit");
    assert_eq!(locks.judge_liveness(&record).await.unwrap(), Liveness::Dead, "asked again");
    locks.close().await;
}

async fn a_killed_holders_liveness_record_is_dead_within_the_backends_bound_and_never_before(backend: Backend) {
    let locks = open(&backend).await;
    let holding = tokio::task::block_in_place(|| HolderProcess::start(&backend.holder_url));
    let record = holding.liveness.clone().expect("the holder keeps a liveness record");
    // Longer than the holder's session timeout or lease: a live holder is never judged dead.
    let watched_until = Instant::now() + Duration::from_secs(3);
    let mut seen_alive = false;
    while Instant::now() < watched_until {
        match locks.judge_liveness(&record).await.unwrap() {
            Liveness::Dead => panic!("a live holder's record {record} was judged dead"),
            Liveness::Alive => seen_alive = true,
            Liveness::Unproven => {}
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(seen_alive, "a live holder's record {record} was never alive");

    let killed = tokio::task::block_in_place(|| holding.kill());
    let deadline = killed + backend.dead_holder_freed_within;
    let dead =
        wait_until_async(deadline, async || locks.judge_liveness(&record).await.unwrap() == Liveness::Dead).await;
    let after = killed.elapsed();
    assert!(
        dead,
        "a killed holder's record {record} is not dead {after:?} after: {:?}",
        locks.judge_liveness(&record).await
    );
    println!("a killed holder's liveness record was dead {after:?} after its death");
    assert_eq!(locks.judge_liveness(&record).await.unwrap(), Liveness::Dead, "dead is final");
    locks.close().await;
}

async fn a_malformed_or_foreign_liveness_record_is_unproven_not_an_error(backend: Backend) {
    let locks = open(&backend).await;
    let own = locks.liveness().expect("a record");
    let (scheme, rest) = own.split_once(':').unwrap();
    let malformed = [
        "",
        "nonsense",
        "other:thing",
        "zk:",
        "zk:0xdeadbeef",
        "zk:DEADBEEF",
        "zk:00deadbeef",
        "pg:",
        "pg:1-2",
        "pg:4242-61f0a2b3c4d5e-0123456789abcdeg",
        "local:",
        "local:testhost:4242",
        "local:testhost:4242:not-a-nonce",
        "local:testhost:04242:0123456789abcdef",
    ];
    // Well-formed records naming no process, one per backend.
    let this_host = rest.rsplitn(3, ':').nth(2).unwrap_or("testhost");
    let nobody = [
        ("zk", "zk:deadbeef".to_owned()),
        ("pg", "pg:4242-61f0a2b3c4d5e-0123456789abcdef".to_owned()),
        ("local", format!("local:{this_host}:4242:0123456789abcdef")),
    ];
    for record in malformed.iter().copied().chain(nobody.iter().filter(|(s, _)| *s != scheme).map(|(_, r)| r.as_str()))
    {
        let judged = locks.judge_liveness(record).await;
        assert!(matches!(judged, Ok(Liveness::Unproven)), "{record:?} judged by {scheme}: {judged:?}");
    }
    // A flock record naming another host: judged by the file in this lock directory (none
    // here: dead), so a renamed host's runs are not kept forever; not a record at all for
    // the other backends.
    let elsewhere = "local:some-other-host:1:0123456789abcdef";
    let expected = if scheme == "local" { Liveness::Dead } else { Liveness::Unproven };
    assert_eq!(locks.judge_liveness(elsewhere).await.unwrap(), expected);
    // This backend's own form naming no process: proven dead, not unproven.
    let (_, ours) = nobody.iter().find(|(s, _)| *s == scheme).expect("a known scheme");
    assert_eq!(locks.judge_liveness(ours).await.unwrap(), Liveness::Dead, "{ours}");
    locks.close().await;
}

/// Asks until the record is judged `wanted` (true) or the deadline passes (false); never
/// `Dead` on the way unless that is what is wanted.
async fn judged_until(locks: &Arc<dyn LockService>, record: &str, wanted: Liveness, deadline: Instant) -> bool {
    wait_until_async(deadline, async || {
        let judged = locks.judge_liveness(record).await.unwrap();
        assert!(judged != Liveness::Dead || wanted == Liveness::Dead, "{record} judged dead");
        judged == wanted
    })
    .await
}

/// Instantiates every contract test once per backend: `local::NAME`, `zookeeper::NAME`,
/// `zookeeper_secured::NAME` (TLS and the pipeline's identity on) and `postgres::NAME`.
macro_rules! contract {
    ($($name:ident),* $(,)?) => {
        mod local {
            $(#[test]
            fn $name() {
                super::runtime().block_on(super::$name(super::local()))
            })*
        }
        mod zookeeper {
            $(#[test]
            fn $name() {
                super::runtime().block_on(super::$name(super::zookeeper()))
            })*
        }
        mod zookeeper_secured {
            $(#[test]
            fn $name() {
                super::runtime().block_on(super::$name(super::zookeeper_secured()))
            })*
        }
        mod postgres {
            $(#[test]
            fn $name() {
                super::runtime().block_on(super::$name(super::postgres()))
            })*
        }
    };
}

contract!(
    a_path_is_held_by_one_lock_at_a_time_until_released,
    locks_of_different_components_and_batches_are_independent,
    another_service_reads_who_holds_what,
    a_read_of_whether_a_path_is_held_tells_the_truth_or_nothing,
    a_busy_try_lock_gives_up_when_its_wait_is_over,
    a_waiter_gets_the_lock_as_soon_as_it_is_released,
    contending_takers_never_hold_a_path_at_once,
    a_holder_that_closes_and_exits_leaves_nothing_held,
    a_killed_holders_locks_are_freed_within_the_backends_bound,
    a_killed_holders_turn_reads_free_within_the_backends_bound_and_never_before,
    try_lock_many_takes_each_free_path_and_answers_none_for_each_busy_one,
    release_many_frees_every_path_at_once_whoever_took_it,
    a_services_own_liveness_record_is_alive_to_another_and_never_listed_as_a_lock,
    a_closed_holders_liveness_record_is_dead,
    a_killed_holders_liveness_record_is_dead_within_the_backends_bound_and_never_before,
    a_malformed_or_foreign_liveness_record_is_unproven_not_an_error,
);

// ---------------------------------------------------------------------------------------
// Holders in other processes.

/// Runs as a holder process when `HOLDER_URL` is set; an ordinary no-op test otherwise.
/// It makes its liveness record and says it, takes `HolderProcess::paths()`, says `HOLDING`,
/// and on a line on stdin closes its lock service and exits (unless killed first).
#[test]
fn holder_process_entry() {
    let Ok(url) = std::env::var(HOLDER_URL) else { return };
    runtime().block_on(async {
        let locks = open_locks(&url).await.unwrap();
        let holder = LockHolder {
            agent: "holder-process".into(),
            host: "testhost".into(),
            pid: std::process::id(),
            since: Timestamp::now(),
        };
        let liveness = locks.liveness().unwrap_or_else(|| "-".into());
        let mut held = Vec::new();
        for path in HolderProcess::paths() {
            held.push(locks.try_lock(&path, &holder, Duration::ZERO).await.unwrap().expect("free"));
        }
        let mut out = std::io::stdout().lock();
        writeln!(out, "{LIVENESS}{liveness}").unwrap();
        writeln!(out, "{HOLDING}").unwrap();
        out.flush().unwrap();
        let mut line = String::new();
        tokio::task::block_in_place(|| std::io::stdin().read_line(&mut line)).unwrap();
        // Closed as a component closes it at exit; the locks are not released one by one.
        locks.close().await;
        drop(held);
    });
}

/// A holder process, holding its locks; killed if dropped. Also used by tests/tests/pg_locks.rs.
pub(crate) struct HolderProcess {
    pub(crate) child: Child,
    /// Its liveness record, as its lock service said it (`None`: it keeps none).
    pub(crate) liveness: Option<String>,
    stdin: Option<ChildStdin>,
    _stdout: BufReader<ChildStdout>,
}

impl HolderProcess {
    /// What a holder process holds.
    pub(crate) fn paths() -> [LockPath; 2] {
        [poll_path("probe"), batch_path("B0001")]
    }

    /// Starts one and waits (blocking) until it holds its locks.
    pub(crate) fn start(url: &str) -> Self {
        let mut child = autocomp_test_servers::this_binary_running!("holder_process_entry")
            .env(HOLDER_URL, url)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        // A holder that fails exits, closing its stdout: the read ends either way.
        let mut liveness = None;
        loop {
            let mut line = String::new();
            let read = stdout.read_line(&mut line).unwrap();
            assert!(read > 0, "the holder process exited before holding its locks: {:?}", child.wait());
            if let Some(record) = line.trim().strip_prefix(LIVENESS) {
                liveness = (record != "-").then(|| record.to_owned());
            }
            if line.trim() == HOLDING {
                break;
            }
        }
        // Its stdout stays open: the test harness in it still writes its summary at exit.
        Self { child, liveness, stdin, _stdout: stdout }
    }

    /// Tells it to close its lock service and exit; returns once it has.
    pub(crate) fn close_and_exit(&mut self) {
        let mut stdin = self.stdin.take().unwrap();
        writeln!(stdin, "close").unwrap();
        drop(stdin);
        let status = self.child.wait().unwrap();
        assert!(status.success(), "the holder process failed: {status}");
    }

    /// SIGKILLs it and reaps it; when it was gone.
    pub(crate) fn kill(mut self) -> Instant {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
        Instant::now()
    }
}

impl Drop for HolderProcess {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            self.child.kill().ok();
            self.child.wait().ok();
        }
    }
}
