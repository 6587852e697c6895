//! Hand-ons as users run them: real `--watch` processes of two steps on one embedded store.
//! The first step's results hand each batch to an idle watcher of the second (its run opened
//! in the first step's append), and the ledger the second step writes shows every batch
//! worked once, never two at a time; a watcher killed while it holds a handed run leaves that
//! run to be taken over once its death is proven, and worked once; a source's registration
//! hands a new delivery to the watcher waiting for it; two runners of one step in one
//! process (one liveness record), on SQLite and on PostgreSQL, work each handed batch once.

use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use autocomp_e2e::{
    PROBE_NAME, PROBED, Pipeline, binary, disjoint_by_batch, finish, sigterm, wait_until, without_pipeline_env,
};
use autocomp_framework::config::ComponentConfig;
use autocomp_framework::locks::open_locks;
use autocomp_framework::{Batch, Component, Runner, Setup, Watched, WorkContext, WorkError, run_watching};
use autocomp_model::{BatchId, BatchType, NewBatch, Trigger};
use autocomp_sboi::open_index;
use autocomp_store::prelude::*;
use autocomp_store::{SqliteStore, open_store};
use autocomp_test_servers::postgres;

const PROBE: &str = env!("CARGO_BIN_EXE_probe-component");
/// Far longer than any deadline below: a batch must move by the change feed and hand-ons,
/// not by heartbeat passes (but for a restarted watcher's first pass).
const SLOW_HEARTBEAT: &str = "watch_heartbeat = \"10m\"";
const EXIT_LIMIT: Duration = Duration::from_secs(20);
const SECOND_DONE: &str = "Second_Done";
/// How long a step has to read the takers once it passes (a read in a task beside its pass).
const TAKERS_READ_WITHIN: Duration = Duration::from_secs(10);

/// The first step's `--watch`, logging at debug into `log` (a file: a pipe nobody reads
/// until the end would fill and stop the watcher).
fn first_step(pipeline: &Pipeline, log: &std::path::Path) -> Child {
    let log = std::fs::File::create(log).expect("the first step's log");
    pipeline.command(&["--watch", "-vv"]).stderr(log).spawn().expect("the first step's watcher starts")
}

/// Whether `log` says `reader` read the takers and found the second step among them: its
/// results hand batches on to the second step from then on.
fn read_the_second_step_as_a_taker(log: &str, reader: &str) -> bool {
    log.lines().any(|line| {
        line.contains("read the takers of hand-ons")
            && line.contains(&format!("reader={reader}"))
            && line.split("takers=").nth(1).is_some_and(|takers| takers.split([',', ' ']).any(|name| name == "second"))
    })
}

/// Waits until the first step's log (`first_step`) says it read the second step as a taker.
fn wait_for_the_first_step_to_read_the_taker(log: &std::path::Path) {
    let first_read = wait_until(Instant::now() + TAKERS_READ_WITHIN, || {
        read_the_second_step_as_a_taker(&std::fs::read_to_string(log).unwrap_or_default(), PROBE_NAME)
    });
    assert!(first_read, "the first step never read the second as a taker:\n{}", std::fs::read_to_string(log).unwrap());
}

/// How many batches the first step's log says it handed on.
fn handed_on(log: &std::path::Path) -> usize {
    std::fs::read_to_string(log).expect("the first step's log").matches("handed on").count()
}

/// A `--watch` of the second step (requires the probe's result).
fn second_step(pipeline: &Pipeline) -> Child {
    pipeline
        .command(&["--watch"])
        .env("PROBE_NAME", "second")
        .env("PROBE_EVENT_TYPE", SECOND_DONE)
        .env("PROBE_REQUIRES", PROBED)
        .spawn()
        .expect("the second step's watcher starts")
}

/// Waits until `steps` steps are registered and a watcher of the second has offered to take
/// hand-ons (its first pass got the turn).
fn wait_for_a_taker_among(pipeline: &Pipeline, steps: usize) {
    let ready = wait_until(Instant::now() + Duration::from_secs(30), || {
        let store = pipeline.any_store();
        let takers = pipeline.block_on(store.takers()).expect("takers readable");
        pipeline.block_on(store.components()).expect("registry readable").len() == steps
            && takers.iter().any(|taker| taker.name.as_str() == "second")
    });
    assert!(ready, "the watchers never registered and offered");
}

/// Waits until both steps are registered and a watcher of the second has offered.
fn wait_for_a_taker(pipeline: &Pipeline) {
    wait_for_a_taker_among(pipeline, 2);
}

#[test]
fn a_chain_of_watchers_hands_each_batch_on_and_works_it_once() {
    let pipeline = Pipeline::new(PROBE);
    let ledger = pipeline.path("ledger.txt");
    pipeline.configure(SLOW_HEARTBEAT);
    let second = format!("{SLOW_HEARTBEAT}\n[settings]\nwork_time = \"5ms\"\nledger = \"{}\"\n", ledger.display());
    std::fs::write(pipeline.config_dir().join("second.toml"), second).unwrap();
    let log = pipeline.path("first.log");
    // The takers offer before the first step starts, so the takers its first pass reads (in
    // a task beside it) name them; an idle step reads them again only at its next pass.
    let takers = [second_step(&pipeline), second_step(&pipeline)];
    wait_for_a_taker_among(&pipeline, 1);
    let first = first_step(&pipeline, &log);
    wait_for_a_taker(&pipeline);
    wait_for_the_first_step_to_read_the_taker(&log);
    let ids: Vec<_> = (1..=20).map(|n| format!("B{n:04}")).collect();
    for id in &ids {
        let id = pipeline.register_one(id, true);
        let through =
            wait_until(Instant::now() + Duration::from_secs(10), || pipeline.events(&id, SECOND_DONE).len() == 1);
        if !through {
            let shown: Vec<String> = std::iter::once(first)
                .chain(takers)
                .map(|mut watcher| {
                    watcher.kill().ok();
                    finish(watcher, EXIT_LIMIT).show()
                })
                .collect();
            panic!(
                "batch {id} did not get through both steps within 10 s; open runs {:?}:\n{}",
                pipeline.open_runs(),
                shown.join("\n")
            );
        }
    }
    sigterm(&first);
    let first = finish(first, EXIT_LIMIT);
    assert_eq!(first.code, Some(0), "{}", first.show());
    for taker in takers {
        sigterm(&taker);
        let finished = finish(taker, EXIT_LIMIT);
        assert_eq!(finished.code, Some(0), "{}", finished.show());
    }
    let handed = handed_on(&log);
    assert!(handed >= ids.len() / 2, "only {handed} of {} batches were handed on", ids.len());
    let by_batch = disjoint_by_batch(&pipeline.ledger());
    assert_eq!(by_batch.len(), ids.len());
    for (batch, entries) in &by_batch {
        assert_eq!(entries.len(), 1, "batch {batch} worked more than once: {entries:?}");
    }
    assert!(pipeline.open_runs().is_empty(), "runs left open: {:?}", pipeline.open_runs());
    let offers = pipeline.block_on(pipeline.any_store().takers()).unwrap();
    assert!(offers.is_empty(), "the watchers withdrew their offers at their end: {offers:?}");
}

#[test]
fn a_taker_killed_holding_a_handed_run_has_it_taken_over_and_worked_once() {
    let pipeline = Pipeline::new(PROBE);
    let (ledger, started, gate) = (pipeline.path("ledger.txt"), pipeline.path("started"), pipeline.path("go"));
    std::fs::create_dir_all(&started).unwrap();
    pipeline.configure(SLOW_HEARTBEAT);
    let second = format!(
        "{SLOW_HEARTBEAT}\n[settings]\nledger = \"{}\"\nstarted = \"{}\"\nwait_for = \"{}\"\n",
        ledger.display(),
        started.display(),
        gate.display()
    );
    std::fs::write(pipeline.config_dir().join("second.toml"), second).unwrap();
    let log = pipeline.path("first.log");
    // The taker offers before the first step starts, so the takers the first step's own first
    // pass reads (in a task beside it) name it: an appender judges by the list it last read
    // and reads it again beside a pass, so one that read it before the offer could append
    // before its next read answered, and hand the batch to nobody.
    let mut doomed = second_step(&pipeline);
    wait_for_a_taker_among(&pipeline, 1);
    let first = first_step(&pipeline, &log);
    wait_for_a_taker(&pipeline);
    // The first step's first pass reads the takers beside it.
    wait_for_the_first_step_to_read_the_taker(&log);
    let id = pipeline.register_one("B0001", true);
    let working = wait_until(Instant::now() + Duration::from_secs(10), || started.join("B0001").exists());
    assert!(working, "the taker never started on the batch");
    doomed.kill().expect("SIGKILL");
    doomed.wait().unwrap();
    let held = pipeline.open_runs();
    assert_eq!(held.len(), 1, "the killed taker's run stays open: {held:?}");

    // Another watcher of the step proves the holder dead at its first pass and takes over.
    std::fs::write(&gate, "").unwrap();
    let heir = second_step(&pipeline);
    let through = wait_until(Instant::now() + Duration::from_secs(20), || pipeline.events(&id, SECOND_DONE).len() == 1);
    assert!(through, "the handed batch was not taken over and worked within 20 s");
    let finished = [first, heir].map(|watcher| {
        sigterm(&watcher);
        finish(watcher, EXIT_LIMIT)
    });
    for watcher in &finished {
        assert_eq!(watcher.code, Some(0), "{}", watcher.show());
    }
    assert_eq!(handed_on(&log), 1, "the batch went to the taker by a hand-on");
    let entries = pipeline.ledger();
    assert_eq!(entries.len(), 1, "worked once, by the heir: {entries:?}");
    let runs = pipeline.batch(&id).open_runs;
    assert!(runs.is_empty(), "{runs:?}");
    let offers = pipeline.block_on(pipeline.any_store().takers()).unwrap();
    assert!(offers.is_empty(), "the dead taker's offer went with its run: {offers:?}");
}

/// A source's registration hands a new delivery to the watcher waiting for it: on the demo's
/// embedded pipeline, a `--watch` of the structure checker offers, the batch trigger (a cron
/// pass) registers a second delivery and says it handed it on, and the checker records its
/// result on it once.
#[test]
fn a_source_hands_a_new_delivery_to_the_watcher_waiting_for_it() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let demo = Command::new(binary("autocomp")).args(["demo", "--batches", "1", "--dir"]).arg(root).output().unwrap();
    assert!(demo.status.success(), "demo: {}", String::from_utf8_lossy(&demo.stderr));
    let step = |name: &str| {
        let mut command = Command::new(binary(name));
        command.arg("--config-dir").arg(root.join("config"));
        without_pipeline_env(&mut command).stdin(Stdio::null()).stdout(Stdio::piped());
        command
    };
    let log = std::fs::File::create(root.join("checker.log")).unwrap();
    let checker = step("structure-checker").args(["--watch", "-vv"]).stderr(log).spawn().unwrap();
    let store = || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        (runtime.block_on(SqliteStore::open(root.join("store.db"))).unwrap(), runtime)
    };
    let offered = wait_until(Instant::now() + Duration::from_secs(30), || {
        let (store, runtime) = store();
        runtime.block_on(store.takers()).unwrap().iter().any(|taker| taker.name.as_str() == "structure-checker")
    });
    assert!(offered, "the checker's watcher never offered to take hand-ons");

    let first = std::fs::read_dir(root.join("incoming")).unwrap().next().unwrap().unwrap().path();
    let second = root.join("incoming").join("B400000000001-RT1");
    let copied = Command::new("cp").arg("-r").arg(&first).arg(&second).status().unwrap();
    assert!(copied.success());
    let trigger = finish(step("batch-trigger").arg("-vv").stderr(Stdio::piped()).spawn().unwrap(), EXIT_LIMIT);
    assert_eq!(trigger.code, Some(0), "{}", trigger.show());
    assert!(trigger.stderr.contains("handed on"), "the registration handed nothing on: {}", trigger.show());
    let id = BatchId::new("B400000000001-RT1").unwrap();
    let checked = |store: &SqliteStore, runtime: &tokio::runtime::Runtime| {
        let batch = runtime.block_on(store.get_batch(&id)).unwrap();
        batch.events.iter().filter(|event| event.event_type.as_str() == "Structure_Checked").count()
    };
    let through = wait_until(Instant::now() + Duration::from_secs(20), || {
        let (store, runtime) = store();
        checked(&store, &runtime) > 0
    });
    assert!(through, "the handed delivery was not checked within 20 s");
    sigterm(&checker);
    let finished = finish(checker, EXIT_LIMIT);
    assert_eq!(finished.code, Some(0), "{}", finished.show());
    let (store, runtime) = store();
    assert_eq!(checked(&store, &runtime), 1, "checked once");
    assert!(runtime.block_on(store.get_batch(&id)).unwrap().open_runs.is_empty());
}

/// A step of the in-process test below: works a batch in 5 ms, noting in `ledger` when.
struct InProcessStep {
    name: &'static str,
    event_type: &'static str,
    trigger: Trigger,
    ledger: Arc<Mutex<Vec<(BatchId, Instant, Instant)>>>,
}

impl Component for InProcessStep {
    type Settings = ();
    fn name(&self) -> &str {
        self.name
    }
    fn version(&self) -> &str {
        "1"
    }
    fn event_type(&self) -> &str {
        self.event_type
    }
    fn trigger(&self) -> Trigger {
        self.trigger.clone()
    }
    fn work(&self, batch: &Batch, _: &(), _: &mut WorkContext) -> Result<(), WorkError> {
        let started = Instant::now();
        std::thread::sleep(Duration::from_millis(5));
        self.ledger.lock().unwrap().push((batch.id.clone(), started, Instant::now()));
        Ok(())
    }
}

/// What the in-process test's tracing wrote (the runners' debug lines), to count hand-ons.
#[derive(Clone, Default)]
struct CapturedLog(Arc<Mutex<Vec<u8>>>);

impl CapturedLog {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

/// What a runner logs when another runner of its component in its process is the taker.
const NOT_THE_TAKER: &str = "another runner of this component in this process takes its hand-ons";

impl std::io::Write for CapturedLog {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Two runners of one step in one process, sharing its lock service (one liveness record: a
/// run handed to the step is handed to the process, not to a runner), both watching: each
/// handed batch is worked once. Only one of them is the step's taker (the place is tried in
/// `runner::hand_on`'s tests); the other claims as a runner without hand-ons does. On
/// SQLite a taker reads the runs handed to it; on PostgreSQL the announcements carry them.
#[test]
fn two_runners_of_one_step_sharing_a_process_work_each_handed_batch_once_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    two_runners_of_one_step_sharing_a_process(&format!("sqlite://{}", dir.path().join("store.db").display()));
}

#[test]
fn two_runners_of_one_step_sharing_a_process_work_each_handed_batch_once_on_postgresql() {
    two_runners_of_one_step_sharing_a_process(&postgres::shared().unique_database());
}

fn two_runners_of_one_step_sharing_a_process(store_url: &str) {
    let dir = tempfile::tempdir().unwrap();
    let log = CapturedLog::default();
    let writer = log.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter("autocomp_framework=debug")
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    // The runtime is on this thread only, so the runners' lines reach this subscriber alone.
    let _logging = tracing::subscriber::set_default(subscriber);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let ledger: Arc<Mutex<Vec<(BatchId, Instant, Instant)>>> = Default::default();
    let batch_type = BatchType::new("InProcess").unwrap();
    runtime.block_on(async {
        let store = open_store(store_url).await.unwrap();
        let index = open_index(&format!("local:{}", dir.path().join("index").display()), Arc::clone(&store)).unwrap();
        let locks_url = format!("local:{}", dir.path().join("locks").display());
        let (stop, shutdown) = tokio::sync::watch::channel(false);
        let config = || ComponentConfig { watch_heartbeat: Duration::from_secs(600), ..ComponentConfig::default() };
        let first = InProcessStep {
            name: "first",
            event_type: "First_Done",
            trigger: first_trigger(),
            ledger: Default::default(),
        };
        let second = || InProcessStep {
            name: "second",
            event_type: SECOND_DONE,
            trigger: Trigger::builder().requires("First_Done").blocked_by(SECOND_DONE).build(),
            ledger: Arc::clone(&ledger),
        };
        let shared_locks = open_locks(&locks_url).await.unwrap();
        let pipelines = [open_locks(&locks_url).await.unwrap(), Arc::clone(&shared_locks), shared_locks]
            .map(|locks| autocomp_framework::Pipeline { store: Arc::clone(&store), index: Arc::clone(&index), locks });
        let [first_pipeline, one, other] = pipelines;
        let setup = |pipeline| Setup { config: config(), pipeline, shutdown: shutdown.clone() };
        let watch = |runner| {
            let watched = Watched { store: Arc::clone(&store), index: Arc::clone(&index) };
            let shutdown = shutdown.clone();
            tokio::spawn(async move { run_watching(&runner, watched, Duration::from_secs(600), shutdown).await })
        };
        let taker = watch(Runner::new(second(), (), second().trigger, setup(one)).unwrap());
        let offered = |step: &'static str| {
            let store = Arc::clone(&store);
            async move {
                let deadline = Instant::now() + Duration::from_secs(30);
                while !store.takers().await.unwrap().iter().any(|taker| taker.name.as_str() == step) {
                    assert!(Instant::now() < deadline, "the {step} step never offered to take hand-ons");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        };
        offered("second").await;
        // The other runner's first pass gets the step's turn (the taker is idle), and offers
        // in vain.
        let other_runner = watch(Runner::new(second(), (), second().trigger, setup(other)).unwrap());
        let deadline = Instant::now() + Duration::from_secs(30);
        while !log.text().contains(NOT_THE_TAKER) {
            assert!(Instant::now() < deadline, "the other runner never offered:\n{}", log.text());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let first_watcher = watch(Runner::new(first, (), first_trigger(), setup(first_pipeline)).unwrap());
        // The first step's first pass reads the takers beside it.
        let deadline = Instant::now() + TAKERS_READ_WITHIN;
        while !read_the_second_step_as_a_taker(&log.text(), "first") {
            assert!(Instant::now() < deadline, "the first step never read the second as a taker:\n{}", log.text());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        for n in 1..=20 {
            let id = BatchId::new(format!("B{n:04}")).unwrap();
            store.create_batch(NewBatch::new(id.clone(), batch_type.clone())).await.unwrap();
            let deadline = Instant::now() + Duration::from_secs(10);
            while !ledger.lock().unwrap().iter().any(|(worked, ..)| *worked == id) {
                assert!(Instant::now() < deadline, "batch {id} did not get through both steps within 10 s");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        // A second worker on a batch would have been started by now: the last batch's work
        // ended, and a pass over a found run starts it at once.
        tokio::time::sleep(Duration::from_millis(200)).await;
        stop.send_replace(true);
        for watcher in [taker, other_runner, first_watcher] {
            watcher.await.unwrap().unwrap();
        }
    });
    let log = log.text();
    // Fewer than in the chain of processes above, and as many as the turns allow: the
    // step's taker withdraws while the other runner's pass holds the step's turn, and that
    // runner never offers in its place.
    let handed = log.matches("handed on").count();
    assert!(handed >= 1, "no batch was handed on:\n{log}");
    let entries = ledger.lock().unwrap().clone();
    let mut by_batch: std::collections::BTreeMap<BatchId, usize> = Default::default();
    for (batch, ..) in &entries {
        *by_batch.entry(batch.clone()).or_default() += 1;
    }
    assert_eq!(by_batch.len(), 20);
    let twice: Vec<_> = by_batch.iter().filter(|(_, worked)| **worked > 1).collect();
    assert!(twice.is_empty(), "batches worked more than once: {twice:?}");
}

fn first_trigger() -> Trigger {
    Trigger::builder().batch_types(&["InProcess"]).blocked_by("First_Done").build()
}
