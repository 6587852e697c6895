//! What the binaries write to their logs, read as an operator's log collector would: files
//! and pipes never hold terminal escape codes, and `--log-format json` lines parse and
//! carry the fields a processed batch is found by.

use std::time::Duration;

use autocomp_e2e::services::{Service, http_request};
use autocomp_e2e::{Pipeline, sigterm, wait_while_running};
use autocomp_framework::locks::open_locks;
use autocomp_model::{Agent, ComponentName, EventType, NewEvent, Outcome, RunHolder};
use autocomp_store::prelude::BatchStore as _;
use serde_json::Value;

const PROBE: &str = env!("CARGO_BIN_EXE_probe-component");

fn no_escape_codes(what: &str, text: &str) {
    assert!(!text.is_empty(), "{what} logged nothing");
    assert!(!text.contains('\u{1b}'), "{what} wrote an escape code into its log:\n{text}");
}

#[test]
fn service_logs_written_to_files_hold_no_escape_codes_and_name_refused_requests() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = Service::store(&dir.path().join("store.db"), dir.path());
    let store_url = store.url();
    let mut index = Service::index(&store_url, &dir.path().join("index"), dir.path());
    // A request the service refuses is one warning naming the operation and the status.
    let (status, _) = http_request("POST", &format!("{}/v1/no_such_operation", index.url()), "{}").unwrap();
    assert_eq!(status, 404);
    let (status, _) = http_request("POST", &format!("{}/v1/append_event", store.url()), "{}").unwrap();
    assert_eq!(status, 401, "a write without the token");
    index.kill();
    store.kill();
    for (what, service) in [("autocomp-store serve", &store), ("sboi serve", &index)] {
        let logs = service.logs();
        no_escape_codes(what, &logs);
        assert!(logs.contains("WARN"), "{what}: the refused request is a warning:\n{logs}");
    }
}

#[test]
fn a_component_logs_each_processed_batch_as_json_with_its_fields() {
    let pipeline = Pipeline::new(PROBE);
    let id = pipeline.register(1).remove(0);
    let run = pipeline.run(&["--log-format", "json"]);
    assert_eq!(run.code, Some(0), "{}", run.show());
    let lines: Vec<Value> = run
        .stderr
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}\n{}", run.show())))
        .collect();
    let recorded = lines
        .iter()
        .find(|line| line["fields"]["batch"] == id.as_str())
        .unwrap_or_else(|| panic!("no log line names batch {id}:\n{}", run.show()));
    let fields = &recorded["fields"];
    assert_eq!(recorded["level"], "INFO", "{recorded}");
    assert_eq!(fields["component"], "probe", "{recorded}");
    assert_eq!(fields["outcome"], "success", "{recorded}");
    assert!(fields["generation"].as_i64().is_some_and(|g| g >= 1), "{recorded}");
    assert!(fields["duration_ms"].is_u64(), "{recorded}");
    assert!(recorded["timestamp"].is_string(), "{recorded}");
    // stdout keeps its one summary line per batch, for cron.
    assert!(run.stdout.starts_with(&format!("{id} Probed success")), "{}", run.show());
}

#[test]
fn text_logs_into_a_pipe_hold_no_escape_codes() {
    let pipeline = Pipeline::new(PROBE);
    pipeline.register(2);
    pipeline.configure("[settings]\nbehaviour = \"fail\"\n");
    let run = pipeline.run(&["-vv"]);
    assert_eq!(run.code, Some(1), "{}", run.show());
    no_escape_codes("a component at -vv", &run.stderr);
    assert!(run.stderr.contains("recorded Probed"), "{}", run.show());
    // Quiet when idle: nothing left to do, nothing on stdout or stderr at the default level.
    let idle = pipeline.run(&[]);
    assert_eq!((idle.code, idle.stdout.as_str(), idle.stderr.as_str()), (Some(0), "", ""), "{}", idle.show());
}

/// The JSON lines a probe logged on the `autocomp::phases` target with `message`.
fn phase_lines(stderr: &str, message: &str) -> Vec<Value> {
    stderr
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|line| line["target"] == "autocomp::phases" && line["fields"]["message"] == message)
        .collect()
}

/// Every phase a pass line carries, in microseconds.
const PHASE_FIELDS: [&str; 11] = [
    "woken_us",
    "index_us",
    "poll_lock_us",
    "steering_us",
    "batch_locks_us",
    "recheck_us",
    "claim_us",
    "work_us",
    "append_us",
    "release_us",
    "other_us",
];

/// A bench or an operator asks `RUST_LOG=autocomp::phases=debug` for where a pass's time
/// went: one line per pass that took up work, every phase a field; none for an idle pass,
/// and none at the default level.
#[test]
fn a_pass_that_works_logs_where_its_time_went_when_the_phases_target_is_asked_for() {
    let pipeline = Pipeline::new(PROBE);
    pipeline.register(1);
    let mut command = pipeline.command(&["--log-format", "json"]);
    let run = autocomp_e2e::finish(command.env("RUST_LOG", "autocomp::phases=debug").spawn().unwrap(), LIMIT);
    assert_eq!(run.code, Some(0), "{}", run.show());
    let lines = phase_lines(&run.stderr, "pass phases");
    assert_eq!(lines.len(), 1, "one pass, one line:\n{}", run.show());
    let fields = &lines[0]["fields"];
    assert_eq!((fields["component"].as_str(), fields["batches"].as_u64()), (Some("probe"), Some(1)), "{fields}");
    let us = |field: &str| fields[field].as_u64().unwrap_or_else(|| panic!("no {field}: {fields}"));
    let phases: u64 = PHASE_FIELDS.iter().map(|field| us(field)).sum();
    // One batch: its work task's phases lie within the pass, beside the pass's own.
    assert!(phases <= us("pass_us"), "the phases add up to more than the pass: {fields}");
    for asked in ["index_us", "claim_us", "work_us", "append_us"] {
        assert!(us(asked) > 0, "a cron pass asks the index, claims, works and appends: {fields}");
    }
    assert_eq!(us("woken_us"), 0, "a cron pass was not woken: {fields}");
    let other: Vec<&str> = run.stderr.lines().filter(|line| !line.contains("\"autocomp::phases\"")).collect();
    assert!(other.is_empty(), "the filter shows the phase lines alone: {other:?}");

    pipeline.register_one("B0002", true);
    let quiet = pipeline.run(&["--log-format", "json"]);
    assert_eq!(quiet.code, Some(0), "{}", quiet.show());
    assert!(!quiet.stderr.contains("autocomp::phases"), "the default level shows no phases:\n{}", quiet.show());
    let mut command = pipeline.command(&["--log-format", "json"]);
    let idle = autocomp_e2e::finish(command.env("RUST_LOG", "autocomp::phases=debug").spawn().unwrap(), LIMIT);
    assert_eq!(idle.code, Some(0), "{}", idle.show());
    assert!(phase_lines(&idle.stderr, "pass phases").is_empty(), "an idle pass has no phases:\n{}", idle.show());
}

/// A watcher's wake that finds nothing it can take up (here the only ready batch is locked
/// by another worker) is an idle wake: a line each with the running count, and the count
/// again when the watch ends; a wake that works logs its pass's phases, the wake and the
/// look included.
#[test]
fn a_watcher_counts_its_idle_wake_ups_on_the_phases_target() {
    let pipeline = Pipeline::new(PROBE);
    pipeline.configure("watch_heartbeat = \"10m\"");
    let log_path = pipeline.path("watcher.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let mut command = pipeline.command(&["--watch", "--log-format", "json"]);
    let mut watcher = command.env("RUST_LOG", "autocomp::phases=debug").stderr(log).spawn().unwrap();
    let logged = |message: &str| phase_lines(&std::fs::read_to_string(&log_path).unwrap_or_default(), message);
    // The first pass registers the probe; then it sleeps in the change feed.
    wait_while_running(&mut watcher, "registering", || {
        !pipeline.block_on(pipeline.any_store().components()).unwrap().is_empty()
    });
    pipeline.register(1);
    wait_while_running(&mut watcher, "working B0001", || !logged("pass phases").is_empty());
    let worked = logged("pass phases").remove(0);
    assert_eq!(worked["fields"]["batches"], 1, "{worked}");
    assert!(worked["fields"]["index_us"].as_u64().is_some_and(|us| us > 0), "the look is the pass's: {worked}");

    // B0002 is claimed by another live process (this test, by its own lock service's
    // liveness record) before it is ready.
    let locks = pipeline.block_on(open_locks(&format!("local:{}", pipeline.path("locks").display()))).unwrap();
    let elsewhere = RunHolder {
        agent: Agent::new("elsewhere/1@testhost#1").unwrap(),
        host: "testhost".into(),
        pid: 1,
        claim_key: None,
        liveness: Some(locks.liveness().expect("a local lock service keeps a liveness record")),
    };
    let id = pipeline.register_one("B0002", false);
    let probe = ComponentName::new("probe").unwrap();
    let claim = pipeline.block_on(pipeline.store().claim(&id, &probe, &elsewhere)).unwrap();
    let received = NewEvent::new(EventType::new("Data_Received").unwrap(), Outcome::Success, elsewhere.agent.clone());
    pipeline.block_on(pipeline.store().append_event(&id, received)).unwrap();
    // Its event made it ready: the wake on it finds a pass that could claim nothing.
    let lost_the_lock = |line: &Value| line["fields"]["passes"] == 1;
    wait_while_running(&mut watcher, "an idle wake", || logged("idle wake").iter().any(lost_the_lock));
    sigterm(&watcher);
    let finished = autocomp_e2e::finish(watcher, LIMIT);
    assert_eq!(finished.code, Some(0), "{}", finished.show());
    let idle: Vec<u64> =
        logged("idle wake").iter().map(|line| line["fields"]["idle_wakes"].as_u64().unwrap()).collect();
    assert_eq!(idle, (1..=idle.len() as u64).collect::<Vec<_>>(), "a running count");
    let ended = logged("watch ended");
    assert_eq!(ended.len(), 1, "{ended:?}");
    assert_eq!(ended[0]["fields"]["idle_wakes"].as_u64(), Some(idle.len() as u64), "the count at the end: {ended:?}");
    assert_eq!(logged("pass phases").len(), 1, "only the pass that worked B0001 took up work");
    pipeline.block_on(pipeline.store().release(&id, &probe, claim.generation())).unwrap();
    pipeline.block_on(locks.close());
}

const LIMIT: Duration = Duration::from_secs(30);
