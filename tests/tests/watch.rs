//! `--watch` as users run it: real probe-component processes that stay up on a real SQLite
//! store, tantivy index dir and flock lock dir. A batch registered later is picked up at
//! once, SIGTERM ends a watcher cleanly, two watchers never share a batch, and cron passes
//! of the same component coexist with a watcher through the poll lock.

use std::process::Child;
use std::time::{Duration, Instant};

use autocomp_e2e::{PROBE_NAME, PROBED, Pipeline, disjoint_by_batch, finish, sigterm, wait_until};
use autocomp_framework::locks::{LocalLocks, LockHolder, LockPath, LockService};
use autocomp_model::{ComponentName, Timestamp};

const PROBE: &str = env!("CARGO_BIN_EXE_probe-component");
/// Far longer than any deadline below: a batch a watcher takes must come from the change
/// feed, not from a heartbeat pass.
const SLOW_HEARTBEAT: &str = "watch_heartbeat = \"10m\"";
const EXIT_LIMIT: Duration = Duration::from_secs(20);

/// Starts `--watch` and waits until its first pass has registered the probe (it is then
/// idle in the change feed, nothing being ready).
fn start_watcher(pipeline: &Pipeline) -> Child {
    let mut watcher = pipeline.spawn(&["--watch"]);
    let registered = wait_until(Instant::now() + Duration::from_secs(30), || {
        assert!(watcher.try_wait().unwrap().is_none(), "the watcher exited at start");
        !pipeline.block_on(pipeline.any_store().components()).expect("registry readable").is_empty()
    });
    if !registered {
        watcher.kill().ok();
        panic!("the watcher's first pass never registered the probe");
    }
    watcher
}

fn probed(pipeline: &Pipeline, id: &autocomp_model::BatchId) -> usize {
    pipeline.events(id, PROBED).len()
}

fn assert_nothing_claimed(pipeline: &Pipeline) {
    let open = pipeline.open_runs();
    assert!(open.is_empty(), "runs left open: {open:?}");
    let locks = pipeline.lock_files();
    assert!(locks.is_empty(), "lock files left behind: {locks:?}");
}

#[test]
fn a_watcher_works_a_batch_registered_after_it_started_within_a_second_or_two() {
    let pipeline = Pipeline::new(PROBE);
    pipeline.configure(SLOW_HEARTBEAT);
    let watcher = start_watcher(&pipeline);
    for n in 1..=3 {
        let id = pipeline.register_one(&format!("B{n:04}"), true);
        let registered = Instant::now();
        let worked = wait_until(registered + Duration::from_secs(10), || probed(&pipeline, &id) == 1);
        assert!(worked, "batch {id} registered while watching was not worked within 10 s");
        assert!(registered.elapsed() < Duration::from_secs(3), "batch {id} took {:?}", registered.elapsed());
    }
    sigterm(&watcher);
    let finished = finish(watcher, EXIT_LIMIT);
    assert_eq!(finished.code, Some(0), "{}", finished.show());
    assert!(finished.stdout.contains("B0003"), "each batch prints its line: {}", finished.show());
    assert_nothing_claimed(&pipeline);
}

/// Another process holding the embedded index's writer (a catch-up that stalls, a rebuild)
/// must not hide fresh work: the watcher answers from the index's last commit corrected by
/// the store's changes since, so a batch registered while the writer is held is worked as
/// quickly as one registered without, with no unrelated store change to wake anything.
#[test]
fn a_watcher_works_a_new_batch_while_another_process_holds_the_index_writer() {
    let pipeline = Pipeline::new(PROBE);
    pipeline.configure(SLOW_HEARTBEAT);
    let watcher = start_watcher(&pipeline);
    // The writer lock is tantivy's, on the index directory: held here as another process's
    // catch-up would hold it, for the whole test.
    let index = tantivy::Index::open_in_dir(pipeline.path("index")).expect("the watcher made the index");
    let writer: tantivy::IndexWriter = index.writer(15_000_000).expect("nobody holds the writer between passes");
    for n in 1..=3 {
        let id = pipeline.register_one(&format!("B{n:04}"), true);
        let registered = Instant::now();
        let worked = wait_until(registered + Duration::from_secs(10), || probed(&pipeline, &id) == 1);
        assert!(worked, "batch {id} was not worked within 10 s while the index writer was held elsewhere");
        assert!(registered.elapsed() < Duration::from_secs(3), "batch {id} took {:?}", registered.elapsed());
    }
    drop(writer);
    sigterm(&watcher);
    let finished = finish(watcher, EXIT_LIMIT);
    assert_eq!(finished.code, Some(0), "{}", finished.show());
    assert_nothing_claimed(&pipeline);
}

/// A backlog of quick work drains in growing passes (10, 20, 40, 80: `queue_grows_to`), back
/// to `queue_size` once it is gone; the registry, written together rather than per pass,
/// still counts every result exactly once.
#[test]
fn a_backlog_of_quick_work_drains_in_growing_passes_and_the_registry_counts_every_result() {
    const BACKLOG: usize = 400;
    let pipeline = Pipeline::new(PROBE);
    pipeline.configure(&format!("{SLOW_HEARTBEAT}\nqueue_size = 10\nqueue_grows_to = 80\nmax_threads = 2\n"));
    let ids = pipeline.register(BACKLOG);
    // Debug logging is plentiful (the index's too): into a file, which never fills up as an
    // undrained pipe would and block the watcher's writes.
    let log_path = pipeline.path("watcher.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let watcher = pipeline.command(&["--watch", "-vv"]).stderr(log).spawn().expect("the probe starts");
    let done = wait_until(Instant::now() + Duration::from_secs(120), || probed(&pipeline, &ids[BACKLOG - 1]) == 1);
    // Then one more, alone: the pass after the backlog is small again.
    let last = pipeline.register_one("Z0001", true);
    let worked = done && wait_until(Instant::now() + Duration::from_secs(20), || probed(&pipeline, &last) == 1);
    sigterm(&watcher);
    let finished = finish(watcher, EXIT_LIMIT);
    assert!(worked, "the backlog was not worked within the deadline: {}", finished.show());
    assert_eq!(finished.code, Some(0), "{}", finished.show());
    for id in &ids {
        assert_eq!(probed(&pipeline, id), 1, "{id}");
    }
    let logged = std::fs::read_to_string(&log_path).unwrap();
    let grown: Vec<&str> = logged.lines().filter(|l| l.contains("claims per pass")).collect();
    for step in ["from=10 to=20", "from=20 to=40", "from=40 to=80", "to=10"] {
        assert!(grown.iter().any(|l| l.contains(step)), "no pass size change {step}: {grown:#?}");
    }
    let registry = pipeline.block_on(pipeline.any_store().components()).unwrap();
    let successes = registry[0].work.total.success.results;
    assert_eq!(successes, BACKLOG as u64 + 1, "every result counted once");
    assert_nothing_claimed(&pipeline);
}

#[test]
fn a_chain_of_watchers_sharing_an_embedded_index_moves_every_batch_through_both_stages() {
    // Every watcher wakes on the same store change and catches the one index dir up; the
    // ones that find another process writing it must wait for its commit, not sleep
    // through the batch (until the heartbeat, 10 minutes away here).
    let pipeline = Pipeline::new(PROBE);
    pipeline.configure(SLOW_HEARTBEAT);
    std::fs::write(pipeline.config_dir().join("second.toml"), SLOW_HEARTBEAT).unwrap();
    let first = start_watcher(&pipeline);
    let second = pipeline
        .command(&["--watch"])
        .env("PROBE_NAME", "second")
        .env("PROBE_EVENT_TYPE", "Second_Done")
        .env("PROBE_REQUIRES", PROBED)
        .spawn()
        .expect("the second watcher starts");
    let both_registered = wait_until(Instant::now() + Duration::from_secs(30), || {
        pipeline.block_on(pipeline.any_store().components()).expect("registry readable").len() == 2
    });
    assert!(both_registered, "the second watcher never registered");
    for n in 1..=10 {
        let id = pipeline.register_one(&format!("B{n:04}"), true);
        let through =
            wait_until(Instant::now() + Duration::from_secs(10), || pipeline.events(&id, "Second_Done").len() == 1);
        assert!(through, "batch {id} did not get through both watchers within 10 s");
    }
    for watcher in [first, second] {
        sigterm(&watcher);
        let finished = finish(watcher, EXIT_LIMIT);
        assert_eq!(finished.code, Some(0), "{}", finished.show());
    }
    assert_nothing_claimed(&pipeline);
}

#[test]
fn sigterm_mid_work_lets_the_batch_finish_and_exits_0_with_nothing_claimed() {
    let pipeline = Pipeline::new(PROBE);
    let (started, gate) = pipeline.hold_work_at_a_gate(&format!("{SLOW_HEARTBEAT}\nshutdown_grace = \"20s\""));
    let mut watcher = start_watcher(&pipeline);
    let id = pipeline.register_one("B0001", true);
    wait_for_work_to_begin(&mut watcher, &started, "B0001");
    sigterm(&watcher);
    // Still working after the signal (the grace), and no new claim: a batch registered now
    // stays unclaimed.
    let late = pipeline.register_one("B0002", true);
    std::fs::write(&gate, "").unwrap();
    let finished = finish(watcher, EXIT_LIMIT);
    assert_eq!(finished.code, Some(0), "{}", finished.show());
    assert_eq!(probed(&pipeline, &id), 1, "the batch in work finished within the grace");
    assert_eq!(probed(&pipeline, &late), 0, "no claim after SIGTERM");
    assert_nothing_claimed(&pipeline);
}

#[test]
fn an_idle_watcher_stops_at_once_on_sigterm() {
    let pipeline = Pipeline::new(PROBE);
    pipeline.configure(SLOW_HEARTBEAT);
    let watcher = start_watcher(&pipeline);
    sigterm(&watcher);
    let finished = finish(watcher, EXIT_LIMIT);
    assert_eq!(finished.code, Some(0), "{}", finished.show());
    assert!(finished.elapsed < Duration::from_secs(2), "an idle watcher took {:?} to stop", finished.elapsed);
    assert_nothing_claimed(&pipeline);
}

#[test]
fn two_watchers_of_one_component_work_every_batch_once_and_never_together() {
    let pipeline = Pipeline::new(PROBE);
    let ledger = pipeline.path("ledger.txt");
    pipeline.configure(&format!(
        "{SLOW_HEARTBEAT}\nqueue_size = 2\n[settings]\nwork_time = \"30ms\"\nledger = \"{}\"\n",
        ledger.display()
    ));
    let watchers = [start_watcher(&pipeline), start_watcher(&pipeline)];
    let ids: Vec<_> = (1..=24).map(|n| pipeline.register_one(&format!("B{n:04}"), true)).collect();
    let all_done =
        wait_until(Instant::now() + Duration::from_secs(60), || ids.iter().all(|id| probed(&pipeline, id) == 1));
    assert!(all_done, "not every batch was worked within 60 s");
    for watcher in watchers {
        sigterm(&watcher);
        let finished = finish(watcher, EXIT_LIMIT);
        assert_eq!(finished.code, Some(0), "{}", finished.show());
    }
    let by_batch = disjoint_by_batch(&pipeline.ledger());
    assert_eq!(by_batch.len(), ids.len());
    for (batch, entries) in &by_batch {
        assert_eq!(entries.len(), 1, "batch {batch} worked more than once: {entries:?}");
    }
    for id in &ids {
        assert_eq!(probed(&pipeline, id), 1, "{id} has one result");
    }
    assert_nothing_claimed(&pipeline);
}

#[test]
fn a_cron_pass_beside_a_busy_watcher_exits_3_and_one_beside_an_idle_watcher_works() {
    let pipeline = Pipeline::new(PROBE);
    let (started, gate) =
        pipeline.hold_work_at_a_gate(&format!("{SLOW_HEARTBEAT}\nhold_poll_lock = true\npoll_lock_timeout = \"1s\""));
    let mut watcher = start_watcher(&pipeline);
    let held = pipeline.register_one("B0001", true);
    wait_for_work_to_begin(&mut watcher, &started, "B0001");
    // The watcher holds the poll lock while it works: cron's pass says so, as beside any pass.
    let cron = pipeline.run(&[]);
    assert_eq!(cron.code, Some(3), "{}", cron.show());
    std::fs::write(&gate, "").unwrap();
    assert!(wait_until(Instant::now() + Duration::from_secs(15), || probed(&pipeline, &held) == 1));
    // Idle again: a cron pass takes the poll lock and works what it finds, as a fallback.
    // Whichever of the two claims the new batch, it is worked once.
    let next = pipeline.register_one("B0002", true);
    let cron = pipeline.run(&[]);
    assert!(matches!(cron.code, Some(0) | Some(3)), "{}", cron.show());
    assert!(wait_until(Instant::now() + Duration::from_secs(15), || probed(&pipeline, &next) == 1));
    sigterm(&watcher);
    let finished = finish(watcher, EXIT_LIMIT);
    assert_eq!(finished.code, Some(0), "{}", finished.show());
    assert_eq!(probed(&pipeline, &next), 1, "B0002 worked once");
    assert_nothing_claimed(&pipeline);
}

#[test]
fn a_watcher_that_finds_the_poll_lock_held_looks_again_when_it_frees_without_a_commit() {
    let pipeline = Pipeline::new(PROBE);
    // A watcher's pass does not wait for the poll lock (this long wait is for cron and
    // manual passes): it looks again soon instead.
    pipeline.configure(&format!("{SLOW_HEARTBEAT}\npoll_lock_timeout = \"10m\""));
    let watcher = start_watcher(&pipeline);
    // Another pass holds the poll lock (this test, through the same lock files) and will
    // claim nothing: no commit of its will wake the watcher.
    let locks = LocalLocks::new(pipeline.path("locks"));
    let holder =
        LockHolder { agent: "test".into(), host: "test".into(), pid: std::process::id(), since: Timestamp::now() };
    let poll = LockPath::Poll(ComponentName::new(PROBE_NAME).unwrap());
    let held =
        pipeline.block_on(locks.try_lock(&poll, &holder, Duration::ZERO)).unwrap().expect("the poll lock is free");
    let id = pipeline.register_one("B0001", true);
    // Woken by the batch's Data_Received, the watcher finds the poll lock held and claims nothing.
    let claimed_while_held = wait_until(Instant::now() + Duration::from_secs(2), || !pipeline.open_runs().is_empty());
    assert!(!claimed_while_held, "a pass claimed while another held the poll lock");
    pipeline.block_on(held.release()).unwrap();
    let released = Instant::now();
    let worked = wait_until(released + Duration::from_secs(10), || probed(&pipeline, &id) == 1);
    assert!(worked, "the batch was not worked within 10 s of the poll lock freeing");
    sigterm(&watcher);
    let finished = finish(watcher, EXIT_LIMIT);
    assert_eq!(finished.code, Some(0), "{}", finished.show());
    assert_nothing_claimed(&pipeline);
}

#[test]
fn a_cron_pass_gets_the_turn_a_busy_watcher_keeps_within_seconds() {
    // With flock locks, whose waiters poll: the watcher keeps no turn for a while after
    // giving it back.
    a_manual_pass_gets_the_turn_a_busy_watcher_keeps(Pipeline::new(PROBE));
}

#[test]
fn a_cron_pass_gets_the_turn_a_busy_watcher_keeps_on_zookeeper_without_a_rest() {
    // With ZooKeeper locks, whose waiters are told at the release: the watcher keeps the
    // turn again at its next pass, and the waiting manual pass still gets it first.
    use autocomp_e2e::zk::{Options, ZooKeeper};
    let zk = ZooKeeper::start(Options::default());
    let pipeline = Pipeline::new(PROBE);
    pipeline.use_locks(&zk.url("autocomp", "10s"));
    a_manual_pass_gets_the_turn_a_busy_watcher_keeps(pipeline);
}

/// A watcher that keeps finding work keeps its component's turn between passes; a manual
/// pass of the same component waits for it (poll_lock_timeout, 10 s here) and gets it when
/// the watcher gives it back, however busy: within about 2 s.
fn a_manual_pass_gets_the_turn_a_busy_watcher_keeps(pipeline: Pipeline) {
    pipeline.configure(&format!("{SLOW_HEARTBEAT}\npoll_lock_timeout = \"10s\""));
    let watcher = start_watcher(&pipeline);
    let manual = pipeline.register_one("M0001", false);
    let stop = std::sync::atomic::AtomicBool::new(false);
    let (run, took, trickled) = std::thread::scope(|scope| {
        // A batch every 50 ms keeps the watcher busy for as long as the manual pass takes.
        let trickle = scope.spawn(|| {
            let mut ids = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && ids.len() < 400 {
                ids.push(pipeline.register_one(&format!("T{:04}", ids.len()), true));
                std::thread::sleep(Duration::from_millis(50)); // the trickle's pace
            }
            ids
        });
        // The trickle under way: the watcher has worked its first batch (and keeps its turn).
        let first = autocomp_model::BatchId::new("T0000").unwrap();
        let worked = |batch: autocomp_model::Batch| batch.events.iter().any(|e| e.event_type.as_str() == PROBED);
        let first_worked = || pipeline.block_on(pipeline.any_store().get_batch(&first)).is_ok_and(worked);
        assert!(wait_until(Instant::now() + Duration::from_secs(15), first_worked), "the trickle's first batch");
        let asked = Instant::now();
        let run = pipeline.run(&["--batch", "M0001", "--force"]);
        let took = asked.elapsed();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        (run, took, trickle.join().expect("the trickle thread"))
    });
    println!("the manual pass took {took:?} beside a trickle of {} batches", trickled.len());
    assert_eq!(run.code, Some(0), "{}", run.show());
    assert_eq!(probed(&pipeline, &manual), 1, "the manual pass worked its batch");
    assert!(took < Duration::from_secs(8), "the manual pass waited {took:?} for the watcher's turn");
    let all_worked =
        wait_until(Instant::now() + Duration::from_secs(15), || trickled.iter().all(|id| probed(&pipeline, id) == 1));
    assert!(all_worked, "the trickle's batches were not all worked once");
    sigterm(&watcher);
    let finished = finish(watcher, EXIT_LIMIT);
    assert_eq!(finished.code, Some(0), "{}", finished.show());
    assert_nothing_claimed(&pipeline);
}

#[test]
fn slow_work_does_not_hold_the_turn_from_a_manual_pass() {
    // The watcher's pass claims one batch of 5 s work and keeps the turn; the turn goes back
    // beside the work once idle for half a second, so a manual pass of the same component
    // that waits only 3 s for it gets it while the watcher still works.
    let pipeline = Pipeline::new(PROBE);
    pipeline.configure(&format!("{SLOW_HEARTBEAT}\npoll_lock_timeout = \"3s\"\n\n[settings]\nwork_time = \"5s\"\n"));
    let watcher = start_watcher(&pipeline);
    let slow = pipeline.register_one("S0001", true);
    let manual = pipeline.register_one("M0001", false);
    let working = wait_until(Instant::now() + Duration::from_secs(15), || !pipeline.open_runs().is_empty());
    assert!(working, "the watcher never claimed the slow batch");
    let asked = Instant::now();
    let run = pipeline.run(&["--batch", "M0001", "--force"]);
    let took = asked.elapsed();
    println!("the manual pass took {took:?} (5 s of it its own work) beside the watcher's slow batch");
    assert_eq!(run.code, Some(0), "{}", run.show());
    assert_eq!(probed(&pipeline, &manual), 1, "the manual pass worked its batch");
    let done = wait_until(Instant::now() + Duration::from_secs(15), || probed(&pipeline, &slow) == 1);
    assert!(done, "the slow batch was not worked once");
    sigterm(&watcher);
    let finished = finish(watcher, EXIT_LIMIT);
    assert_eq!(finished.code, Some(0), "{}", finished.show());
    assert_nothing_claimed(&pipeline);
}

#[test]
fn watchers_that_find_the_poll_lock_held_stay_asleep_through_new_batches_until_their_retry() {
    // Every new batch received concerns every watcher of the component; while another pass holds its
    // poll lock (a watcher would be woken by the same changes), those that found it held
    // look again only at their retry, not once per change: no herd of looks behind one lock.
    let pipeline = Pipeline::new(PROBE);
    pipeline.configure(SLOW_HEARTBEAT);
    let log_of = |n: usize| std::fs::read_to_string(pipeline.path(&format!("watcher{n}.log"))).unwrap_or_default();
    let locks = LocalLocks::new(pipeline.path("locks"));
    let holder =
        LockHolder { agent: "test".into(), host: "test".into(), pid: std::process::id(), since: Timestamp::now() };
    let poll = LockPath::Poll(ComponentName::new(PROBE_NAME).unwrap());
    let mut watchers = Vec::new();
    for n in 0..3 {
        let log = std::fs::File::create(pipeline.path(&format!("watcher{n}.log"))).unwrap();
        let mut watcher = pipeline.command(&["--watch", "-vv"]).stderr(log).spawn().expect("the probe starts");
        let started = wait_until(Instant::now() + Duration::from_secs(30), || {
            assert!(watcher.try_wait().unwrap().is_none(), "watcher {n} exited at start");
            log_of(n).contains("starting a pass")
        });
        assert!(started, "watcher {n} never started its first pass");
        // Its first pass has claimed (nothing) once the poll lock frees: then it sleeps.
        let lock = pipeline.block_on(locks.try_lock(&poll, &holder, Duration::from_secs(10))).unwrap();
        pipeline.block_on(lock.expect("the poll lock frees within 10 s").release()).unwrap();
        watchers.push(watcher);
    }
    let looks = |n: usize| log_of(n).lines().filter(|line| line.contains("looked for work")).count();
    let held =
        pipeline.block_on(locks.try_lock(&poll, &holder, Duration::ZERO)).unwrap().expect("the poll lock is free");
    let before: Vec<usize> = (0..3).map(looks).collect();
    let ids: Vec<_> = (1..=30)
        .map(|n| {
            std::thread::sleep(Duration::from_millis(50));
            pipeline.register_one(&format!("B{n:04}"), true)
        })
        .collect();
    let during: Vec<usize> = (0..3).map(|n| looks(n) - before[n]).collect();
    println!("looks of each watcher during 30 registrations in 1.5 s while the poll lock was held: {during:?}");
    assert!(pipeline.open_runs().is_empty(), "a batch was claimed while another held the poll lock");
    // Woken by the first registration each finds the lock held; then a look at 0.5 s, 1 s
    // and 1.5 s at most, where each change had woken each watcher before.
    for (n, count) in during.iter().enumerate() {
        assert!(*count <= 8, "watcher {n} looked {count} times for 30 new batches behind a held poll lock");
    }
    pipeline.block_on(held.release()).unwrap();
    let all = wait_until(Instant::now() + Duration::from_secs(15), || ids.iter().all(|id| probed(&pipeline, id) == 1));
    assert!(all, "not every batch was worked within 15 s of the poll lock freeing");
    for watcher in watchers {
        sigterm(&watcher);
        let finished = finish(watcher, EXIT_LIMIT);
        assert_eq!(finished.code, Some(0), "{}", finished.show());
    }
    for id in &ids {
        assert_eq!(probed(&pipeline, id), 1, "{id} worked once");
    }
    assert_nothing_claimed(&pipeline);
}

#[test]
fn watch_refuses_flags_that_make_no_sense_with_it_naming_both() {
    let pipeline = Pipeline::new(PROBE);
    for (other, shown) in [
        (vec!["--schedule", "*/5 * * * *"], "--schedule"),
        (vec!["--batch", "B0001"], "--batch"),
        (vec!["--dry-run"], "--dry-run"),
    ] {
        let mut args = vec!["--watch"];
        args.extend(other);
        let finished = pipeline.run(&args);
        assert_eq!(finished.code, Some(2), "{args:?}: {}", finished.show());
        assert!(finished.stderr.contains("--watch") && finished.stderr.contains(shown), "{}", finished.show());
    }
    pipeline.configure("watch_heartbeat = \"100ms\"");
    let finished = pipeline.run(&["--watch"]);
    assert_eq!(finished.code, Some(2), "{}", finished.show());
    assert!(
        finished.stderr.contains("watch_heartbeat") && finished.stderr.contains("100ms"),
        "the error names the key and the value: {}",
        finished.show()
    );
}

/// Waits (15 s at most) until the watcher has begun work on `id` (the probe's `started`
/// mark), failing at once if it exits first.
fn wait_for_work_to_begin(watcher: &mut std::process::Child, started: &std::path::Path, id: &str) {
    let began = wait_until(Instant::now() + Duration::from_secs(15), || {
        assert!(watcher.try_wait().unwrap().is_none(), "the watcher exited before working");
        started.join(id).exists()
    });
    assert!(began, "the watcher never began work on {id}");
}
