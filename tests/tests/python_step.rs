//! Python steps end to end (docs/python-steps.md): real `python3` processes on the
//! `autocomp_step` module (contrib/python, through PYTHONPATH: no pip install) run by real
//! `autocomp-exec` passes. A Rust step (the probe) records `{"pages": N}`; the Python step
//! reads it from the batch file and records its own structured result; a second Rust step
//! reads that one typed (`Batch::result`). Over SQLite, the store service and PostgreSQL;
//! a `TransientFailure` is retried and sees its checkpoint; an unexpected exception is a
//! failure described by the traceback's last line.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use autocomp_e2e::services::{Service, TOKEN};
use autocomp_e2e::{Finished, Pipeline, binary, finish, without_pipeline_env};
use autocomp_model::{BatchId, Outcome};
use autocomp_test_servers::postgres;
use serde::Deserialize;
use serde_json::json;

const PROBE: &str = env!("CARGO_BIN_EXE_probe-component");

/// The Python step: doubles the pages the Rust step counted (`factor` from its settings) and
/// says what it saw of the batch.
const DOUBLER: &str = r#"
from autocomp_step import Batch, PermanentFailure, Result, run

def work(batch: Batch, settings: dict) -> Result:
    counted = batch.result("Pages_Counted")
    if counted is None:
        raise PermanentFailure("no Pages_Counted result")
    print("doubling", counted["pages"], "pages of", batch.id)
    return Result(
        result={"pages": counted["pages"] * settings["factor"], "batch": batch.id,
                "location": str(batch.location), "counted_by": batch.events["Pages_Counted"].agent},
        summary="doubled",
    )

if __name__ == "__main__":
    run(work)
"#;

/// The Python step's result, read typed.
#[derive(Debug, Deserialize, PartialEq)]
struct Doubled {
    pages: u64,
    batch: String,
    location: String,
    counted_by: String,
}

/// `contrib/python`, the module's directory: PYTHONPATH instead of an install.
fn python_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace holds tests/").join("contrib/python")
}

/// `program --config-dir <pipeline's> args`, with none of the environment that would change
/// what it does (as `Pipeline::command` does for the probe).
fn command(pipeline: &Pipeline, program: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(program);
    command.arg("--config-dir").arg(pipeline.config_dir()).args(args);
    without_pipeline_env(&mut command);
    command.env("AUTOCOMP_TOKEN", TOKEN).env("PYTHONPATH", python_path()).env("PYTHONDONTWRITEBYTECODE", "1");
    command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    command
}

fn run(mut command: Command) -> Finished {
    finish(command.spawn().expect("the component starts"), Duration::from_secs(60))
}

/// One pass of the probe as component `name` recording `event_type` after `requires`.
fn probe_pass(pipeline: &Pipeline, name: &str, event_type: &str, requires: &str) -> Finished {
    let mut probe = command(pipeline, Path::new(PROBE), &[]);
    probe.env("PROBE_NAME", name).env("PROBE_EVENT_TYPE", event_type).env("PROBE_REQUIRES", requires);
    run(probe)
}

/// One `autocomp-exec` pass as component `name` running `python3 script`.
fn python_pass(pipeline: &Pipeline, name: &str, event_type: &str, requires: &str, script: &Path) -> Finished {
    let script = script.to_str().unwrap();
    let args = ["--name", name, "--event-type", event_type, "--requires", requires, "--", "python3", script];
    run(command(pipeline, &binary("autocomp-exec"), &args))
}

fn configure(pipeline: &Pipeline, name: &str, text: &str) {
    std::fs::write(pipeline.config_dir().join(format!("{name}.toml")), text).unwrap();
}

fn write_script(pipeline: &Pipeline, file: &str, text: &str) -> PathBuf {
    let path = pipeline.path(file);
    std::fs::write(&path, text).unwrap();
    path
}

/// Rust step -> Python step -> Rust step on one batch of `pipeline`, whatever its store.
fn a_structured_result_goes_from_rust_to_python_and_back(pipeline: &Pipeline) {
    let id = pipeline.register(1).remove(0);
    std::fs::create_dir_all(pipeline.path("incoming").join(id.as_str())).unwrap();
    configure(pipeline, "pager", "[settings]\npages = 7\n");
    configure(pipeline, "doubler", "[settings]\nfactor = 2\n");
    configure(pipeline, "reader", "[settings]\nread_pages_of = \"Pages_Doubled\"\n");
    let doubler = write_script(pipeline, "doubler.py", DOUBLER);

    let counted = probe_pass(pipeline, "pager", "Pages_Counted", "Data_Received");
    assert_eq!(counted.code, Some(0), "{}", counted.show());
    let doubled = python_pass(pipeline, "doubler", "Pages_Doubled", "Pages_Counted", &doubler);
    assert_eq!(doubled.code, Some(0), "{}", doubled.show());
    assert!(doubled.stdout.contains(&format!("{id} Pages_Doubled success")), "{}", doubled.show());
    let read = probe_pass(pipeline, "reader", "Pages_Seen", "Pages_Doubled");
    assert_eq!(read.code, Some(0), "{}", read.show());

    let event = pipeline.events(&id, "Pages_Doubled").remove(0);
    assert_eq!(event.outcome, Outcome::Success, "{event:?}");
    assert_eq!(event.details["summary"], "doubled", "{event:?}");
    let result: Doubled = serde_json::from_value(event.details["result"].clone()).expect("the result, typed");
    let location = pipeline.path("incoming").join(id.as_str());
    assert_eq!(
        result,
        Doubled {
            pages: 14,
            batch: id.to_string(),
            location: location.display().to_string(),
            counted_by: result.counted_by.clone()
        }
    );
    assert!(result.counted_by.starts_with("pager/"), "the agent of the Rust step's event: {result:?}");
    // The Rust reader read the Python result typed, as `{"pages": u64}`.
    let seen = pipeline.events(&id, "Pages_Seen").remove(0);
    assert_eq!(seen.outcome, Outcome::Success, "{seen:?}");
    assert_eq!(seen.details["result"], json!({"pages_seen": 14}), "{seen:?}");
    // What the step printed is the run's output.
    let output = event.output().expect("the run's output is kept");
    let stdout = output.stream("stdout").expect("stdout kept");
    assert!(stdout.head.contains(&format!("doubling 7 pages of {id}")), "{stdout:?}");
}

#[test]
fn python_and_rust_steps_exchange_structured_results_over_sqlite() {
    let pipeline = Pipeline::new(PROBE);
    a_structured_result_goes_from_rust_to_python_and_back(&pipeline);
}

#[test]
fn python_and_rust_steps_exchange_structured_results_over_the_store_service() {
    let pipeline = Pipeline::new(PROBE);
    let mut store = Service::store(&pipeline.path("store.db"), &pipeline.path(""));
    pipeline.use_backend("store", &store.url());
    a_structured_result_goes_from_rust_to_python_and_back(&pipeline);
    store.kill();
}

#[test]
fn python_and_rust_steps_exchange_structured_results_over_postgresql() {
    let pipeline = Pipeline::with_store(PROBE, &postgres::shared().unique_database());
    a_structured_result_goes_from_rust_to_python_and_back(&pipeline);
}

/// Transient on its first attempt, saving a checkpoint; the retry sees it and succeeds.
const FLAKY: &str = r#"
from autocomp_step import TransientFailure, run

def work(batch, settings):
    if batch.checkpoint is None:
        raise TransientFailure("share offline", checkpoint={"done": ["page-1.tif"]})
    return {"resumed_from": batch.checkpoint}

if __name__ == "__main__":
    run(work)
"#;

#[test]
fn a_transient_failure_is_retried_and_the_retry_sees_its_checkpoint() {
    let pipeline = Pipeline::new(PROBE);
    let id = pipeline.register(1).remove(0);
    configure(&pipeline, "flaky", "retry_backoff = \"0s\"\n");
    let flaky = write_script(&pipeline, "flaky.py", FLAKY);

    let first = python_pass(&pipeline, "flaky", "Flaky_Done", "Data_Received", &flaky);
    assert_eq!(first.code, Some(1), "a transient failure fails the pass: {}", first.show());
    let failed = pipeline.events(&id, "Flaky_Done").remove(0);
    assert_eq!(failed.outcome, Outcome::Failure, "{failed:?}");
    assert_eq!(failed.details["transient"], true, "{failed:?}");
    assert!(failed.details["summary"].as_str().unwrap().contains("share offline"), "{failed:?}");

    let second = python_pass(&pipeline, "flaky", "Flaky_Done", "Data_Received", &flaky);
    assert_eq!(second.code, Some(0), "{}", second.show());
    let events = pipeline.events(&id, "Flaky_Done");
    assert_eq!(events.len(), 2, "{events:?}");
    assert_eq!(events[1].outcome, Outcome::Success, "{:?}", events[1]);
    assert_eq!(events[1].details["result"], json!({"resumed_from": {"done": ["page-1.tif"]}}), "{:?}", events[1]);
}

/// Fails permanently naming a file, or raises an unexpected exception, by batch.
const FAILING: &str = r#"
from autocomp_step import Failure, PermanentFailure, run

def work(batch, settings):
    if batch.id == "B0001":
        raise PermanentFailure("virus found", failures=[Failure("data/x.tif", "virus", "Eicar found")])
    return {"pages": settings["no_such_setting"]}

if __name__ == "__main__":
    run(work)
"#;

#[test]
fn permanent_failures_and_unexpected_exceptions_are_failures_saying_what_failed() {
    let pipeline = Pipeline::new(PROBE);
    let ids: Vec<BatchId> = pipeline.register(2);
    configure(&pipeline, "failing", "");
    let failing = write_script(&pipeline, "failing.py", FAILING);

    let pass = python_pass(&pipeline, "failing", "Failing_Done", "Data_Received", &failing);
    assert_eq!(pass.code, Some(1), "{}", pass.show());

    let virus = pipeline.events(&ids[0], "Failing_Done").remove(0);
    assert_eq!((virus.outcome, &virus.details["transient"]), (Outcome::Failure, &serde_json::Value::Null));
    assert_eq!(virus.details["failures"][0]["reference"], "data/x.tif", "{virus:?}");
    assert_eq!(virus.details["failures"][0]["type"], "virus", "{virus:?}");
    assert!(virus.details["summary"].as_str().unwrap().contains("virus found"), "{virus:?}");

    let crashed = pipeline.events(&ids[1], "Failing_Done").remove(0);
    assert_eq!(crashed.outcome, Outcome::Failure, "{crashed:?}");
    assert_eq!(crashed.details["failures"][0]["type"], "exception", "{crashed:?}");
    assert_eq!(crashed.details["failures"][0]["description"], "KeyError: 'no_such_setting'", "{crashed:?}");
    let stderr = crashed.output().and_then(|o| o.stream("stderr").cloned()).expect("stderr kept");
    let text = format!("{}{}", stderr.head, stderr.tail);
    assert!(text.contains("Traceback (most recent call last)"), "the traceback is on stderr: {text}");
}

#[test]
fn outside_autocomp_a_python_step_says_so_and_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("step.py");
    std::fs::write(&script, DOUBLER).unwrap();
    let mut python = Command::new("python3");
    python.arg(&script).env("PYTHONPATH", python_path()).env("PYTHONDONTWRITEBYTECODE", "1");
    for var in ["AUTOCOMP_BATCH_FILE", "AUTOCOMP_RESULT_FILE", "AUTOCOMP_SETTINGS_FILE", "AUTOCOMP_PROTOCOL"] {
        python.env_remove(var);
    }
    let done = python.output().expect("python3 runs");
    assert_eq!(done.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&done.stderr).contains("runs under autocomp-exec"));
}

/// The module's own unit tests (contrib/python/tests), so that `cargo test` runs them too.
#[test]
fn the_modules_own_unit_tests_pass() {
    let done = Command::new("python3")
        .args(["-m", "unittest", "discover", "-s", "tests"])
        .current_dir(python_path())
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .expect("python3 runs");
    let said = String::from_utf8_lossy(&done.stderr);
    assert!(done.status.success() && said.contains("\nOK"), "{said}");
}
