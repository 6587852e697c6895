//! The runner as cron drives it: real probe-component processes on a real
//! SQLite store, tantivy index dir and flock lock dir. Concurrency and exactly-once, panics,
//! timeouts, transient retries, SIGTERM and SIGKILL mid-work, and the command line's contract.

use std::collections::BTreeSet;
use std::process::Child;
use std::time::{Duration, Instant};

use autocomp_e2e::{
    Finished, LedgerEntry, PROBED, Pipeline, disjoint_by_batch, finish, wait_until, wait_while_running,
};
use autocomp_model::{Agent, ComponentName, EventType, NewEvent, Outcome, RunHolder};
use autocomp_store::prelude::BatchStore as _;

const PROBE: &str = env!("CARGO_BIN_EXE_probe-component");
const PASS_LIMIT: Duration = Duration::from_secs(30);

fn assert_no_lock_files(pipeline: &Pipeline) {
    let left = pipeline.lock_files();
    assert!(left.is_empty(), "lock files left behind: {left:?}");
}

fn assert_no_open_runs(pipeline: &Pipeline) {
    let open = pipeline.open_runs();
    assert!(open.is_empty(), "runs left open: {open:?}");
}

fn summary(event: &autocomp_model::Event) -> &str {
    event.details["summary"].as_str().unwrap_or_default()
}

/// Sends `signal` to a child process.
fn signal(child: &Child, signal: libc::c_int) {
    let pid = libc::pid_t::try_from(child.id()).expect("pid fits");
    // SAFETY: kill(2) on the pid of a child we spawned and have not reaped yet.
    let sent = unsafe { libc::kill(pid, signal) };
    assert_eq!(sent, 0, "kill({pid}, {signal}) failed: {}", std::io::Error::last_os_error());
}

/// Waits until the probe has claimed a batch (its run is open in the store).
fn wait_for_open_run(pipeline: &Pipeline, child: &mut Child) {
    wait_while_running(child, "claiming a batch", || !pipeline.open_runs().is_empty());
}

/// Whether the probe (configured with `started = "<dir>"`) has begun work on some batch.
fn work_began(started: &std::path::Path) -> bool {
    std::fs::read_dir(started).unwrap().next().is_some()
}

/// One ledger line: the probe appends `pid batch start_ns end_ns` after each batch's work.
fn two_at_once_over_200_batches(extra_config: &str, side_by_side: bool) -> (Vec<LedgerEntry>, Vec<[u32; 2]>) {
    let pipeline = Pipeline::new(PROBE);
    let ids = pipeline.register(200);
    let (started, gate) = (pipeline.path("started"), pipeline.path("go"));
    std::fs::create_dir_all(&started).unwrap();
    let hold = if side_by_side {
        format!("started = \"{}\"\nwait_for = \"{}\"\n", started.display(), gate.display())
    } else {
        String::new()
    };
    pipeline.configure(&format!(
        "max_threads = 4\nqueue_size = 25\n{extra_config}\n[settings]\nwork_time = \"20ms\"\nledger = \"{}\"\n{hold}",
        pipeline.path("ledger.txt").display()
    ));
    let done = || pipeline.all_batches().iter().filter(|b| b.events.iter().any(|e| e.event_type == *PROBED)).count();

    let deadline = Instant::now() + Duration::from_secs(40);
    let mut rounds: Vec<[u32; 2]> = Vec::new();
    while done() < ids.len() && Instant::now() < deadline {
        let mut pair = [pipeline.spawn(&[]), pipeline.spawn(&[])];
        let pids = [pair[0].id(), pair[1].id()];
        rounds.push(pids);
        if side_by_side && !gate.exists() {
            let working = |pid: u32| {
                std::fs::read_dir(&started)
                    .unwrap()
                    .any(|e| std::fs::read_to_string(e.unwrap().path()).unwrap_or_default() == pid.to_string())
            };
            for child in &mut pair {
                wait_while_running(child, "working alongside the other", || pids.iter().all(|pid| working(*pid)));
            }
            std::fs::write(&gate, "").unwrap();
        }
        for child in pair {
            let finished = finish(child, PASS_LIMIT);
            assert_eq!(finished.code, Some(0), "a pass failed\n{}", finished.show());
        }
    }
    assert_eq!(done(), ids.len(), "not every batch was done after {} rounds", rounds.len());

    let ledger = pipeline.ledger();
    let by_batch = disjoint_by_batch(&ledger);
    for id in &ids {
        let worked = by_batch.get(id.as_str()).map_or(0, Vec::len);
        assert_eq!(worked, 1, "{id} was worked on {worked} times");
        let probed = pipeline.events(id, PROBED);
        assert_eq!(probed.len(), 1, "{id} has {} Probed events: {probed:?}", probed.len());
        assert_eq!(probed[0].outcome, Outcome::Success);
    }
    assert_eq!(ledger.len(), ids.len(), "the ledger names batches that do not exist");
    let pids: BTreeSet<u32> = ledger.iter().map(|e| e.pid).collect();
    assert!(
        rounds.iter().any(|pair| pair.iter().all(|pid| pids.contains(pid))),
        "in no round did both processes work: rounds {rounds:?}, ledger pids {pids:?}"
    );
    assert_no_lock_files(&pipeline);
    assert_no_open_runs(&pipeline);
    (ledger, rounds)
}

#[test]
fn two_processes_at_once_do_every_batch_exactly_once() {
    two_at_once_over_200_batches("", false);
}

/// Above, the second process of a round waits on each batch the first holds (default
/// `batch_lock_timeout`) after catching the index up, so in debug builds the first has
/// usually finished before the second starts. Here busy batches are skipped and the first
/// round's work is held until both processes are working, so they work side by side on the
/// same candidates: where a broken lock, re-check or fence would show.
#[test]
fn two_processes_working_side_by_side_never_share_a_batch() {
    let (ledger, rounds) = two_at_once_over_200_batches("batch_lock_timeout = \"0s\"\n", true);
    let span = |pid: u32| {
        let mine = ledger.iter().filter(|e| e.pid == pid);
        let start = mine.clone().map(|e| e.start).min();
        start.zip(mine.map(|e| e.end).max())
    };
    let side_by_side = rounds.iter().any(|pair| match (span(pair[0]), span(pair[1])) {
        (Some(a), Some(b)) => a.0 < b.1 && b.0 < a.1,
        _ => false,
    });
    assert!(side_by_side, "the two processes of a round never worked at the same time: {rounds:?}");
}

#[test]
fn a_panic_is_recorded_as_a_failure_and_the_batch_is_not_retried() {
    let pipeline = Pipeline::new(PROBE);
    let id = pipeline.register(1).remove(0);
    pipeline.configure("[settings]\nbehaviour = \"panic\"\n");

    let first = pipeline.run(&[]);
    assert_eq!(first.code, Some(1), "{}", first.show());
    assert!(first.stdout.starts_with("B0001 Probed failure"), "{}", first.show());
    let probed = pipeline.events(&id, PROBED);
    assert_eq!(probed.len(), 1, "{probed:?}");
    assert_eq!(probed[0].outcome, Outcome::Failure);
    assert!(summary(&probed[0]).contains("probe panicked on B0001"), "{:?}", probed[0].details);
    assert!(!probed[0].flag("transient"), "a panic is permanent: {:?}", probed[0].details);
    // The panic's own line names only the thread, which serves many batches; the runner's
    // line beside it names the batch and the component.
    let named = first.stderr.lines().find(|line| line.contains("the work panicked"));
    assert!(named.is_some_and(|line| line.contains("batch=B0001") && line.contains("component=")), "{}", first.show());
    assert_no_open_runs(&pipeline);
    assert_no_lock_files(&pipeline);

    // Blocked by its own failure: the next cron start does nothing, and says nothing.
    let second = pipeline.run(&[]);
    assert_eq!((second.code, second.stdout.as_str(), second.stderr.as_str()), (Some(0), "", ""), "{}", second.show());
    assert_eq!(pipeline.events(&id, PROBED).len(), 1);
}

/// A batch at its size cap refuses a big result: the runner records a short failure saying
/// so instead, and the batch waits for a person rather than being worked on at every pass.
#[test]
fn a_result_over_the_batchs_size_cap_is_recorded_as_a_short_failure_saying_so() {
    let pipeline = Pipeline::new(PROBE);
    let id = pipeline.register(1).remove(0);
    // 800 KB of earlier reports, written through the test's own (uncapped) handle.
    for n in 0..4 {
        let details = serde_json::json!({ "note": "y".repeat(200_000), "n": n });
        let note = NewEvent::new(EventType::new("Noted").unwrap(), Outcome::Success, Agent::new("test").unwrap())
            .with_details(details);
        pipeline.block_on(pipeline.any_store().append_event(&id, note)).unwrap();
    }
    let capped = format!("sqlite://{}?max_batch_bytes=1MiB", pipeline.path("store.db").display());
    pipeline.use_backend("store", &capped);
    pipeline.configure(
        "[settings]
result_bytes = 400000
",
    );

    let first = pipeline.run(&[]);
    assert_eq!(first.code, Some(1), "{}", first.show());
    let probed = pipeline.events(&id, PROBED);
    assert_eq!(probed.len(), 1, "{probed:?}");
    assert_eq!(probed[0].outcome, Outcome::Failure);
    let said = summary(&probed[0]);
    assert!(said.contains("the store refused the result") && said.contains("max_batch_bytes"), "{said}");
    assert_no_open_runs(&pipeline);

    let second = pipeline.run(&[]);
    assert_eq!((second.code, second.stdout.as_str()), (Some(0), ""), "{}", second.show());
    assert_eq!(pipeline.events(&id, PROBED).len(), 1);
}

#[test]
fn a_hang_past_max_runtime_is_recorded_as_timed_out_and_the_process_exits() {
    let pipeline = Pipeline::new(PROBE);
    let id = pipeline.register(1).remove(0);
    // The probe ignores cancellation: after cancel_grace the process exits without it.
    pipeline.configure("max_runtime = \"1s\"\ncancel_grace = \"1s\"\n\n[settings]\nbehaviour = \"hang\"\n");

    let finished = finish(pipeline.spawn(&[]), Duration::from_secs(15));
    assert_eq!(finished.code, Some(1), "{}", finished.show());
    assert!(finished.elapsed < Duration::from_secs(6), "took {:?} to give up on a 1s max_runtime", finished.elapsed);
    assert!(finished.stdout.contains("did not finish within max_runtime 1s"), "{}", finished.show());
    let probed = pipeline.events(&id, PROBED);
    assert_eq!(probed.len(), 1, "{probed:?}");
    assert_eq!(probed[0].outcome, Outcome::Failure);
    assert!(probed[0].flag("timed_out"), "{:?}", probed[0].details);
    assert_no_open_runs(&pipeline);
    assert_no_lock_files(&pipeline);
}

#[test]
fn transient_failures_are_retried_after_the_backoff_until_success() {
    let pipeline = Pipeline::new(PROBE);
    let id = pipeline.register(1).remove(0);
    pipeline.configure(
        "max_attempts = 5\nretry_backoff = \"1s\"\n\n[settings]\nbehaviour = \"transient\"\ntransient_failures = 2\n",
    );

    let mut passes: Vec<Finished> = Vec::new();
    let succeeded = wait_until(Instant::now() + Duration::from_secs(20), || {
        passes.push(pipeline.run(&[]));
        pipeline.events(&id, PROBED).iter().any(|e| e.outcome == Outcome::Success)
    });
    let shown: Vec<String> = passes.iter().map(Finished::show).collect();
    assert!(succeeded, "never succeeded; passes:\n{}", shown.join("\n"));

    let probed = pipeline.events(&id, PROBED);
    let outcomes: Vec<(Outcome, bool)> = probed.iter().map(|e| (e.outcome, e.flag("transient"))).collect();
    assert_eq!(outcomes, [(Outcome::Failure, true), (Outcome::Failure, true), (Outcome::Success, false)]);
    for pair in probed.windows(2) {
        let gap = pair[1].at.since(pair[0].at);
        assert!(gap >= Duration::from_secs(1), "retried {gap:?} after a transient failure, before the 1s backoff");
    }
    assert_eq!(pipeline.failed_attempts(&id), 2);
    for pass in &passes {
        assert!(pass.code == Some(0) || pass.code == Some(1), "{}", pass.show());
        if pass.code == Some(1) {
            assert!(pass.stdout.contains("transient, will retry"), "{}", pass.show());
        }
    }
    assert_eq!(passes.iter().filter(|p| !p.stdout.is_empty()).count(), 3, "{}", shown.join("\n"));
    assert_no_open_runs(&pipeline);
    assert_no_lock_files(&pipeline);
}

#[test]
fn transient_failures_end_in_a_plain_failure_after_max_attempts() {
    let pipeline = Pipeline::new(PROBE);
    let id = pipeline.register(1).remove(0);
    // No backoff, so every pass retries at once and the test needs no waiting.
    pipeline.configure(
        "max_attempts = 2\nretry_backoff = \"0s\"\n\n[settings]\nbehaviour = \"transient\"\ntransient_failures = 5\n",
    );

    for attempt in 1..=2 {
        let pass = pipeline.run(&[]);
        assert_eq!(pass.code, Some(1), "attempt {attempt}: {}", pass.show());
        assert!(pass.stdout.contains("transient, will retry"), "attempt {attempt}: {}", pass.show());
    }
    let gave_up = pipeline.run(&[]);
    assert_eq!(gave_up.code, Some(1), "{}", gave_up.show());
    assert!(gave_up.stdout.contains("gave up after 2 failed attempts"), "{}", gave_up.show());

    let probed = pipeline.events(&id, PROBED);
    let outcomes: Vec<(Outcome, bool)> = probed.iter().map(|e| (e.outcome, e.flag("transient"))).collect();
    assert_eq!(outcomes, [(Outcome::Failure, true), (Outcome::Failure, true), (Outcome::Failure, false)]);
    assert!(summary(&probed[2]).contains("gave up"), "{:?}", probed[2].details);
    assert_eq!(pipeline.failed_attempts(&id), 2);

    let head = pipeline.head();
    for _ in 0..2 {
        let idle = pipeline.run(&[]);
        assert_eq!((idle.code, idle.stdout.as_str(), idle.stderr.as_str()), (Some(0), "", ""), "{}", idle.show());
    }
    assert_eq!(pipeline.head(), head, "a pass after giving up changed the store");
    assert_no_open_runs(&pipeline);
    assert_no_lock_files(&pipeline);
}

#[test]
fn sigterm_mid_work_releases_the_batch_without_an_event() {
    let pipeline = Pipeline::new(PROBE);
    let id = pipeline.register(1).remove(0);
    let started = pipeline.path("started");
    std::fs::create_dir_all(&started).unwrap();
    pipeline.configure(&format!(
        "shutdown_grace = \"1s\"\n\n[settings]\nwork_time = \"30s\"\nstarted = \"{}\"\n",
        started.display()
    ));

    let mut child = pipeline.spawn(&[]);
    wait_for_open_run(&pipeline, &mut child);
    // Mid-work: a batch claimed but not yet started is released at once, without the grace.
    wait_while_running(&mut child, "working", || work_began(&started));
    let signalled = Instant::now();
    signal(&child, libc::SIGTERM);
    let finished = finish(child, Duration::from_secs(15));
    let took = signalled.elapsed();
    // README, exit codes: "A batch released on SIGTERM is not a failure": exit 0.
    assert_eq!(finished.code, Some(0), "{}", finished.show());
    assert!(took >= Duration::from_secs(1), "running work was cancelled {took:?} after SIGTERM, before the 1s grace");
    assert!(took < Duration::from_secs(6), "took {took:?} to stop after SIGTERM with a 1s grace");
    assert!(!finished.stdout.contains("success"), "{}", finished.show());

    assert!(pipeline.events(&id, PROBED).is_empty(), "an event was recorded: {:?}", pipeline.events(&id, PROBED));
    assert_no_open_runs(&pipeline);
    assert_no_lock_files(&pipeline);
    assert_eq!(pipeline.failed_attempts(&id), 0, "a released run counts as a failed attempt");
    let dry = pipeline.run(&["--dry-run"]);
    assert_eq!(dry.code, Some(0), "{}", dry.show());
    assert!(dry.stdout.starts_with("B0001 would claim"), "not ready again: {}", dry.show());

    // And the next pass does it.
    pipeline.configure("[settings]\nwork_time = \"0s\"\n");
    let next = pipeline.run(&[]);
    assert_eq!(next.code, Some(0), "{}", next.show());
    let probed = pipeline.events(&id, PROBED);
    assert_eq!(probed.iter().map(|e| e.outcome).collect::<Vec<_>>(), [Outcome::Success]);
}

#[test]
fn sigterm_lets_running_work_finish_within_the_grace_and_releases_the_queued_batches() {
    let pipeline = Pipeline::new(PROBE);
    let ids = pipeline.register(3);
    let started = pipeline.path("started");
    std::fs::create_dir_all(&started).unwrap();
    pipeline.configure(&format!(
        "max_threads = 1\nshutdown_grace = \"20s\"\n\n[settings]\nwork_time = \"1500ms\"\nstarted = \"{}\"\n",
        started.display()
    ));

    let mut child = pipeline.spawn(&[]);
    wait_while_running(&mut child, "working", || work_began(&started));
    signal(&child, libc::SIGTERM);
    let finished = finish(child, Duration::from_secs(15));
    assert_eq!(finished.code, Some(0), "{}", finished.show());
    assert!(finished.elapsed < Duration::from_secs(10), "waited for more than the running batch: {}", finished.show());

    let worked: Vec<String> =
        std::fs::read_dir(&started).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    assert_eq!(worked.len(), 1, "work began on {worked:?} after SIGTERM");
    assert_eq!(finished.stdout.lines().count(), 1, "{}", finished.show());
    assert!(finished.stdout.starts_with(&format!("{} Probed success", worked[0])), "{}", finished.show());
    for id in &ids {
        let outcomes: Vec<Outcome> = pipeline.events(id, PROBED).iter().map(|e| e.outcome).collect();
        let expected: &[Outcome] = if worked[0] == id.as_str() { &[Outcome::Success] } else { &[] };
        assert_eq!(outcomes, expected, "{id}");
    }
    assert_no_open_runs(&pipeline);
    assert_no_lock_files(&pipeline);
    let dry = pipeline.run(&["--dry-run"]);
    assert_eq!(dry.stdout.matches("would claim").count(), 2, "the queued batches are not ready again: {}", dry.show());
}

#[test]
fn after_a_sigkill_mid_work_the_next_pass_takes_the_batch_over() {
    let pipeline = Pipeline::new(PROBE);
    let id = pipeline.register(1).remove(0);
    pipeline.configure("[settings]\nwork_time = \"30s\"\n");

    let mut child = pipeline.spawn(&[]);
    wait_for_open_run(&pipeline, &mut child);
    let crashed_run = pipeline.open_runs().remove(0);
    signal(&child, libc::SIGKILL);
    let crashed = finish(child, Duration::from_secs(10));
    assert_eq!(crashed.code, None, "{}", crashed.show());

    pipeline.configure("[settings]\nwork_time = \"0s\"\n");
    let next = pipeline.run(&[]);
    assert_eq!(next.code, Some(0), "{}", next.show());
    assert!(next.stdout.starts_with("B0001 Probed success"), "{}", next.show());
    assert!(next.stderr.contains("abandoned"), "the takeover is not logged: {}", next.show());

    let probed = pipeline.events(&id, PROBED);
    assert_eq!(probed.iter().map(|e| e.outcome).collect::<Vec<_>>(), [Outcome::Success]);
    let run = probed[0].run.as_ref().expect("recorded in a run");
    assert!(run.generation > crashed_run.generation, "{run:?} vs crashed {crashed_run:?}");
    assert_eq!(pipeline.failed_attempts(&id), 1, "the crashed run is not counted as abandoned");
    assert_no_open_runs(&pipeline);
    assert_no_lock_files(&pipeline);

    let idle = pipeline.run(&[]);
    assert_eq!((idle.code, idle.stdout.as_str()), (Some(0), ""), "{}", idle.show());
    assert_eq!(pipeline.events(&id, PROBED).len(), 1);
}

/// A pass claims its whole queue in one store transaction before any work starts: once the
/// first batch is being worked on, every queued claim is already durable. Killed there, the
/// process leaves each claim open (one run per batch); the next pass takes each over exactly
/// once, marking it abandoned, and records each batch once.
#[test]
fn a_sigkill_after_a_pass_claimed_its_queue_leaves_one_open_run_per_batch_taken_over_once() {
    let pipeline = Pipeline::new(PROBE);
    let ids = pipeline.register(6);
    let (started, _gate) = pipeline.hold_work_at_a_gate("queue_size = 5\nmax_threads = 2");

    let mut child = pipeline.spawn(&[]);
    wait_while_running(&mut child, "working", || work_began(&started));
    let crashed_runs = pipeline.open_runs();
    signal(&child, libc::SIGKILL);
    let crashed = finish(child, Duration::from_secs(10));
    assert_eq!(crashed.code, None, "{}", crashed.show());
    let claimed: BTreeSet<&str> = crashed_runs.iter().map(|run| run.batch_id.as_str()).collect();
    assert_eq!(claimed.len(), 5, "the queue's claims were not all in the store when work began: {crashed_runs:?}");
    assert_eq!(crashed_runs.len(), 5, "a batch was claimed twice: {crashed_runs:?}");
    assert_eq!(pipeline.open_runs(), crashed_runs, "the killed process's claims did not stay open");

    pipeline.configure("queue_size = 10\n\n[settings]\nwork_time = \"0s\"\n");
    let next = pipeline.run(&[]);
    assert_eq!(next.code, Some(0), "{}", next.show());
    assert_eq!(next.stdout.lines().count(), 6, "{}", next.show());
    assert_eq!(next.stderr.matches("marked abandoned").count(), 5, "each takeover is logged once: {}", next.show());
    for id in &ids {
        let probed = pipeline.events(id, PROBED);
        assert_eq!(probed.iter().map(|e| e.outcome).collect::<Vec<_>>(), [Outcome::Success], "{id}");
        let recorded = probed[0].run.as_ref().expect("recorded in a run").generation;
        match crashed_runs.iter().find(|run| run.batch_id == *id) {
            Some(crashed_run) => {
                assert_eq!(recorded, crashed_run.generation + 1, "{id} was claimed more than once after the crash");
                assert_eq!(pipeline.failed_attempts(id), 1, "{id}: the crashed run is not counted once as abandoned");
            }
            None => assert_eq!(pipeline.failed_attempts(id), 0, "{id} was never claimed before, yet has attempts"),
        }
    }
    assert_no_open_runs(&pipeline);
    assert_no_lock_files(&pipeline);
}

#[test]
fn batch_runs_exactly_that_batch() {
    let pipeline = Pipeline::new(PROBE);
    let ids = pipeline.register(3);

    let run = pipeline.run(&["--batch", "B0002"]);
    assert_eq!(run.code, Some(0), "{}", run.show());
    assert_eq!(run.stdout.lines().count(), 1, "{}", run.show());
    assert!(run.stdout.starts_with("B0002 Probed success"), "{}", run.show());
    let probed: Vec<usize> = ids.iter().map(|id| pipeline.events(id, PROBED).len()).collect();
    assert_eq!(probed, [0, 1, 0]);
    assert_no_open_runs(&pipeline);
    assert_no_lock_files(&pipeline);
}

#[test]
fn batch_that_is_not_ready_names_the_clause_and_force_runs_it() {
    let pipeline = Pipeline::new(PROBE);
    let waiting = pipeline.register_one("B0009", false);
    let head = pipeline.head();

    let refused = pipeline.run(&["--batch", "B0009"]);
    // README, exit codes: 1 covers "a requested batch was not ready".
    assert_eq!(refused.code, Some(1), "{}", refused.show());
    assert!(
        refused.stderr.contains("B0009")
            && refused.stderr.contains("requires Data_Received: the batch has no effective Data_Received event"),
        "{}",
        refused.show()
    );
    assert!(refused.stderr.contains("--force"), "no hint at --force: {}", refused.show());
    assert_eq!(refused.stdout, "", "{}", refused.show());
    assert_eq!(pipeline.head(), head, "a refused manual run changed the store");
    assert_no_lock_files(&pipeline);

    let forced = pipeline.run(&["--batch", "B0009", "--force"]);
    assert_eq!(forced.code, Some(0), "{}", forced.show());
    assert!(forced.stdout.starts_with("B0009 Probed success"), "{}", forced.show());
    let probed = pipeline.events(&waiting, PROBED);
    assert_eq!(probed.iter().map(|e| e.outcome).collect::<Vec<_>>(), [Outcome::Success]);
    assert_no_open_runs(&pipeline);
    assert_no_lock_files(&pipeline);
}

#[test]
fn dry_run_lists_what_would_be_claimed_and_changes_nothing() {
    let pipeline = Pipeline::new(PROBE);
    let ids = pipeline.register(2);
    pipeline.register_one("B0009", false);
    let head = pipeline.head();

    let dry = pipeline.run(&["--dry-run"]);
    assert_eq!(dry.code, Some(0), "{}", dry.show());
    let lines: Vec<&str> = dry.stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{}", dry.show());
    assert!(lines[0].starts_with("B0001 would claim") && lines[1].starts_with("B0002 would claim"), "{}", dry.show());

    let one = pipeline.run(&["--dry-run", "--batch", "B0009"]);
    assert_eq!(one.code, Some(0), "{}", one.show());
    assert!(
        one.stdout.starts_with("B0009 would skip: requires Data_Received: the batch has no effective"),
        "{}",
        one.show()
    );

    assert_eq!(pipeline.head(), head, "a dry run changed the store");
    assert!(ids.iter().all(|id| pipeline.events(id, PROBED).is_empty()));
    assert_no_open_runs(&pipeline);
    assert_no_lock_files(&pipeline);
}

/// A run that must stop before touching anything: exit 2, nothing on stdout, the store unchanged.
fn assert_usage_error(pipeline: &Pipeline, args: &[&str], expected: &[&str]) {
    let head = pipeline.head();
    let run = pipeline.run(args);
    assert_eq!(run.code, Some(2), "{}", run.show());
    for text in expected {
        assert!(run.stderr.contains(text), "the message does not name {text:?}: {}", run.show());
    }
    assert_eq!(run.stdout, "", "{}", run.show());
    assert_eq!(pipeline.head(), head, "a refused run changed the store");
    assert_no_lock_files(pipeline);
}

#[test]
fn config_and_usage_errors_exit_2_naming_what_is_wrong() {
    let pipeline = Pipeline::new(PROBE);
    pipeline.register(1);
    let file = pipeline.config_dir().join("probe.toml");
    let file = file.to_str().unwrap();

    pipeline.configure("max_threadz = 3\n");
    assert_usage_error(&pipeline, &[], &["max_threadz", file]);
    pipeline.configure("max_runtime = \"soon\"\n");
    assert_usage_error(&pipeline, &[], &["max_runtime", "soon", file]);

    pipeline.configure("");
    assert_usage_error(&pipeline, &["--batch", "../x"], &["batch id", "../x"]);

    std::fs::remove_file(pipeline.config_dir().join("autocomp.toml")).unwrap();
    assert_usage_error(&pipeline, &[], &["store", "autocomp.toml"]);
    let store = format!("store = \"sqlite://{}\"\n", pipeline.path("store.db").display());
    std::fs::write(pipeline.config_dir().join("autocomp.toml"), store).unwrap();
    assert_usage_error(&pipeline, &[], &["no index backend configured", "autocomp.toml"]);
}

#[test]
fn quiet_when_idle() {
    let pipeline = Pipeline::new(PROBE);
    let idle = pipeline.run(&[]);
    assert_eq!((idle.code, idle.stdout.as_str(), idle.stderr.as_str()), (Some(0), "", ""), "{}", idle.show());

    let ids = pipeline.register(2);
    let busy = pipeline.run(&[]);
    assert_eq!(busy.code, Some(0), "{}", busy.show());
    assert_eq!(busy.stdout.lines().count(), 2, "one line per processed batch: {}", busy.show());
    assert_eq!(busy.stderr, "", "{}", busy.show());
    assert!(ids.iter().all(|id| pipeline.events(id, PROBED).len() == 1));

    let head = pipeline.head();
    let again = pipeline.run(&[]);
    assert_eq!((again.code, again.stdout.as_str(), again.stderr.as_str()), (Some(0), "", ""), "{}", again.show());
    assert_eq!(pipeline.head(), head);
}

#[test]
fn a_busy_poll_lock_exits_3_and_touches_nothing() {
    let pipeline = Pipeline::new(PROBE);
    let id = pipeline.register(1).remove(0);
    pipeline.configure("poll_lock_timeout = \"0s\"\n");
    let lock_path = pipeline.path("locks/poll/probe.lock");
    std::fs::create_dir_all(lock_path.parent().unwrap()).unwrap();
    let held = std::fs::File::create(&lock_path).unwrap();
    held.try_lock().expect("the test takes the poll lock");
    let head = pipeline.head();

    let busy = pipeline.run(&[]);
    assert_eq!(busy.code, Some(3), "{}", busy.show());
    // Normal under cron (the previous pass still runs), so nothing for cron to mail.
    assert_eq!((busy.stdout.as_str(), busy.stderr.as_str()), ("", ""), "{}", busy.show());
    assert_eq!(pipeline.head(), head, "a pass without the poll lock changed the store");
    assert!(lock_path.exists(), "the busy pass removed a lock file it did not hold");

    drop(held);
    let after = pipeline.run(&[]);
    assert_eq!(after.code, Some(0), "{}", after.show());
    assert_eq!(pipeline.events(&id, PROBED).len(), 1);
}

#[test]
fn batch_on_an_unknown_batch_exits_2_naming_it() {
    let pipeline = Pipeline::new(PROBE);
    let missing = pipeline.run(&["--batch", "B7777"]);
    assert_eq!(missing.code, Some(2), "{}", missing.show());
    assert!(missing.stderr.contains("B7777") && missing.stderr.contains("does not exist"), "{}", missing.show());
    assert_no_lock_files(&pipeline);
}

#[test]
fn a_report_with_failures_is_recorded_as_a_failure_naming_the_first() {
    let pipeline = Pipeline::new(PROBE);
    let id = pipeline.register(1).remove(0);
    pipeline.configure("[settings]\nbehaviour = \"fail\"\n");

    let run = pipeline.run(&[]);
    assert_eq!(run.code, Some(1), "{}", run.show());
    assert_eq!(run.stdout.lines().count(), 1, "{}", run.show());
    assert!(run.stdout.starts_with("B0001 Probed failure "), "{}", run.show());
    assert!(
        run.stdout.ends_with(": 1 failures, first: data/page-1.tif: deliberate failure\n"),
        "the summary line does not name the first failure: {}",
        run.show()
    );
    let probed = pipeline.events(&id, PROBED);
    assert_eq!(probed.len(), 1, "{probed:?}");
    assert_eq!(probed[0].outcome, Outcome::Failure);
    assert_eq!(probed[0].details["failures_total"], 1);
    assert_eq!(probed[0].details["failures"][0]["reference"], "data/page-1.tif");
}

/// A batch whose holder cannot be judged (its liveness file cannot be opened: a symlink loop,
/// as a broken lock directory would be) is busy: it keeps its holder's run, and the pass goes
/// on with the others instead of stopping. Once the file is gone the holder is judged dead
/// and its run taken over, counted as one abandoned attempt of that batch only.
#[test]
fn a_holder_that_cannot_be_judged_keeps_its_batch_and_the_pass_goes_on() {
    let pipeline = Pipeline::new(PROBE);
    let ids = pipeline.register(2);
    let live = pipeline.path("locks/live/4242.00000000deadbeef");
    std::fs::create_dir_all(live.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(&live, &live).unwrap();
    let holder = RunHolder {
        agent: Agent::new("probe/0@elsewhere#4242").unwrap(),
        host: autocomp_framework::hostname(),
        pid: 4242,
        claim_key: None,
        liveness: Some(format!("local:{}:4242:00000000deadbeef", autocomp_framework::hostname())),
    };
    let probe = ComponentName::new("probe").unwrap();
    let stale = pipeline.block_on(pipeline.store().claim(&ids[1], &probe, &holder)).unwrap();

    let first = pipeline.run(&[]);
    assert_eq!(first.code, Some(0), "{}", first.show());
    assert!(first.stdout.starts_with("B0001 Probed success"), "{}", first.show());
    assert!(first.stderr.contains("cannot judge its holder"), "{}", first.show());
    let runs = pipeline.open_runs();
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert_eq!((&runs[0].batch_id, runs[0].generation), (&ids[1], stale.generation()), "B0002 stays its holder's");

    std::fs::remove_file(&live).unwrap();
    let after = pipeline.run(&[]);
    assert_eq!(after.code, Some(0), "{}", after.show());
    assert!(after.stdout.starts_with("B0002 Probed success"), "{}", after.show());
    for id in &ids {
        let probed = pipeline.events(id, PROBED);
        assert_eq!(probed.iter().map(|e| e.outcome).collect::<Vec<_>>(), [Outcome::Success], "{id}");
    }
    assert_eq!(pipeline.failed_attempts(&ids[0]), 0);
    assert_eq!(pipeline.failed_attempts(&ids[1]), 1, "the taken-over run counts as one abandoned attempt");
    assert!(pipeline.open_runs().is_empty());
}

/// `probe | head -0`: stdout is a pipe whose reader is gone before the first line. Printing
/// is best effort (the store has the result), so the pass ends as usual, without a panic.
#[test]
fn a_closed_stdout_ends_the_pass_quietly_with_the_result_recorded() {
    let pipeline = Pipeline::new(PROBE);
    let id = pipeline.register(1).remove(0);
    let closed_stdout = |args: &[&str]| {
        let (reader, writer) = std::io::pipe().expect("a pipe");
        drop(reader);
        let mut command = pipeline.command(args);
        command.stdout(writer);
        finish(command.spawn().expect("the probe starts"), PASS_LIMIT)
    };

    let dry = closed_stdout(&["--dry-run"]);
    assert_eq!(dry.code, Some(0), "{}", dry.show());
    assert!(!dry.stderr.contains("panicked"), "{}", dry.show());

    let run = closed_stdout(&[]);
    assert_eq!(run.code, Some(0), "{}", run.show());
    assert!(!run.stderr.contains("panicked"), "{}", run.show());
    let probed = pipeline.events(&id, PROBED);
    assert_eq!(probed.iter().map(|e| e.outcome).collect::<Vec<_>>(), [Outcome::Success], "{}", run.show());
    assert_no_open_runs(&pipeline);
    assert_no_lock_files(&pipeline);
}

/// A dry run lists as many candidates as a pass looks at (4 x queue_size, at least 16) and
/// says on stderr how many it left out and how to see them; `--dry-run-limit` changes that.
#[test]
fn dry_run_says_how_many_candidates_it_did_not_list() {
    let pipeline = Pipeline::new(PROBE);
    pipeline.configure("queue_size = 2\n");
    pipeline.register(20);
    let head = pipeline.head();
    let listed = |run: &Finished| -> Vec<String> {
        assert_eq!(run.code, Some(0), "{}", run.show());
        run.stdout.lines().map(|line| line.split(' ').next().unwrap().to_owned()).collect()
    };
    let ids = |range: std::ops::RangeInclusive<usize>| -> Vec<String> { range.map(|n| format!("B{n:04}")).collect() };

    let default = pipeline.run(&["--dry-run"]);
    assert_eq!(listed(&default), ids(1..=16), "{}", default.show());
    for text in ["4 more candidate", "--dry-run-limit 0", "autocomp ready --component probe"] {
        assert!(default.stderr.contains(text), "the notice does not say {text:?}: {}", default.show());
    }

    let all = pipeline.run(&["--dry-run", "--dry-run-limit", "0"]);
    assert_eq!(listed(&all), ids(1..=20), "{}", all.show());
    assert_eq!(all.stderr, "", "nothing left out, nothing to say: {}", all.show());

    let five = pipeline.run(&["--dry-run", "--dry-run-limit", "5"]);
    assert_eq!(listed(&five), ids(1..=5), "{}", five.show());
    assert!(five.stderr.contains("15 more candidate"), "{}", five.show());

    assert_usage_error(&pipeline, &["--dry-run-limit", "5"], &["--dry-run"]);
    assert_eq!(pipeline.head(), head, "a dry run changed the store");
    assert_no_open_runs(&pipeline);
}
