//! Contracts between steps with real component processes (`contract-component`, written
//! with the framework's prelude alone): a producer publishes its result's JSON Schema, a
//! reader declares what it expects of that result; while they agree the reader's pass runs
//! and reads the result typed; once a new producer version renames the field, the reader's
//! pass refuses to start (exit 2) naming the field and both versions, claims nothing (the
//! batch stays ready for it) and tells the registry; `autocomp pipeline` shows the schema and
//! the broken contract before any pass does.

use std::process::{Command, Stdio};
use std::time::Duration;

use autocomp_e2e::{Finished, Pipeline, binary, finish, without_pipeline_env};
use autocomp_model::{ComponentName, ComponentState, PassOutcome};
use serde_json::json;

const CONTRACT: &str = env!("CARGO_BIN_EXE_contract-component");

/// One pass of the contract component in `role`, as cron would start it.
fn pass(pipeline: &Pipeline, role: &str) -> Finished {
    let mut command = pipeline.command(&[]);
    command.env("CONTRACT_ROLE", role);
    finish(command.spawn().expect("the component starts"), Duration::from_secs(60))
}

/// `autocomp <args>` against the pipeline.
fn autocomp(pipeline: &Pipeline, args: &[&str]) -> Finished {
    let mut command = Command::new(binary("autocomp"));
    command.arg("--config-dir").arg(pipeline.config_dir()).args(args);
    without_pipeline_env(&mut command);
    command.env("AUTOCOMP_TOKEN", autocomp_e2e::services::TOKEN);
    command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    finish(command.spawn().expect("autocomp starts"), Duration::from_secs(60))
}

fn registered(pipeline: &Pipeline, name: &str) -> autocomp_model::RegisteredComponent {
    let name = ComponentName::new(name).unwrap();
    let all = pipeline.block_on(pipeline.any_store().components()).expect("the registry is readable");
    all.into_iter().find(|c| c.descriptor.name == name).expect("registered")
}

#[test]
fn a_reader_runs_while_the_producer_publishes_what_it_expects_and_refuses_to_start_once_it_does_not() {
    let pipeline = Pipeline::new(CONTRACT);
    let first = pipeline.register_one("B0001", true);

    // archiver 1.0.0 publishes archive_path; access-copy reads it typed.
    let archived = pass(&pipeline, "archiver-v1");
    assert_eq!(archived.code, Some(0), "{}", archived.show());
    let archiver = registered(&pipeline, "archiver");
    assert_eq!(archiver.descriptor.result_schema.as_ref().unwrap()["required"], json!(["archive_path", "size"]));
    let copied = pass(&pipeline, "access-copy");
    assert_eq!(copied.code, Some(0), "{}", copied.show());
    let events = pipeline.events(&first, "Access_Copied");
    assert_eq!(events.len(), 1, "{}", copied.show());
    assert_eq!(events[0].details["result"], json!({"copied_from": "/archive/B0001", "size": 412}));
    let reader = registered(&pipeline, "access-copy");
    assert_eq!(reader.descriptor.reads.len(), 1);
    assert_eq!(reader.descriptor.reads[0].schema["required"], json!(["archive_path"]));
    let shown = autocomp(&pipeline, &["pipeline"]);
    assert_eq!(shown.code, Some(0), "{}", shown.show());
    assert!(
        shown.stdout.contains("archiver Data_Archived result: archive_path: string, size: integer"),
        "{}",
        shown.show()
    );
    assert!(
        shown.stdout.contains("access-copy reads Data_Archived: archive_path: string (compatible with archiver 1.0.0)"),
        "{}",
        shown.show()
    );

    // archiver 2.0.0 renames archive_path to path and archives the next batch.
    let second = pipeline.register_one("B0002", true);
    let archived = pass(&pipeline, "archiver-v2");
    assert_eq!(archived.code, Some(0), "{}", archived.show());
    assert_eq!(
        pipeline.events(&second, "Data_Archived")[0].details["result"],
        json!({"path": "/archive/B0002", "size": 412})
    );

    // The operator sees the broken contract before any pass of the reader.
    let broken = "access-copy 0.1.0 reads Data_Archived's result expecting archive_path (string, required), but \
                  archiver 2.0.0 publishes no archive_path (renamed or removed?)";
    let shown = autocomp(&pipeline, &["pipeline"]);
    assert!(shown.stdout.contains("archiver Data_Archived result: path: string, size: integer"), "{}", shown.show());
    assert!(shown.stdout.contains("broken contracts (the reader's passes do not start, exit 2):"), "{}", shown.show());
    assert!(shown.stdout.contains(broken), "{}", shown.show());
    let json_view = autocomp(&pipeline, &["pipeline", "--format", "json"]);
    assert_eq!(json_view.code, Some(0), "{}", json_view.show());
    let view: serde_json::Value = serde_json::from_str(&json_view.stdout).expect("JSON");
    assert_eq!(view["contracts"][0]["broken"], json!(broken), "{}", json_view.stdout);
    let published = view["components"].as_array().unwrap().iter().find(|c| c["descriptor"]["name"] == "archiver");
    assert_eq!(published.unwrap()["descriptor"]["result_schema"]["required"], json!(["path", "size"]));

    // The reader's pass refuses to start: exit 2 naming the field and both versions, nothing
    // claimed, the refusal in the registry.
    let head = pipeline.head();
    let refused = pass(&pipeline, "access-copy");
    assert_eq!(refused.code, Some(2), "{}", refused.show());
    assert!(refused.stderr.contains(broken), "{}", refused.show());
    assert!(pipeline.events(&second, "Access_Copied").is_empty(), "{}", refused.show());
    assert!(pipeline.open_runs().is_empty());
    assert_eq!(pipeline.failed_attempts(&second), 0);
    let reader = registered(&pipeline, "access-copy");
    let host = &reader.hosts[0];
    assert_eq!(host.outcome, Some(PassOutcome::Error));
    assert!(host.summary.starts_with(&format!("not started: contract broken: {broken}")), "{}", host.summary);
    // Only the registry's record of the pass moved the store: no claim, no event.
    let batch = pipeline.batch(&second);
    assert!(batch.events.iter().all(|e| e.seq <= head), "{:?}", batch.events);

    // The batch is still ready for the reader: its next pass takes it up once the contract
    // holds again.
    assert_eq!(reader.descriptor.state_of(&batch), ComponentState::Ready);
}

/// A broken contract is a state every view shows before any work (explain, ready, the
/// reader's own --dry-run, alerts, the metrics), and a watching reader stays up through it,
/// says so once, and resumes by itself once the producer publishes what it reads again.
#[test]
fn a_broken_contract_shows_in_every_view_and_a_watching_reader_waits_it_out() {
    let pipeline = Pipeline::new(CONTRACT);
    pipeline.register_one("B0001", true);
    assert_eq!(pass(&pipeline, "archiver-v1").code, Some(0));
    assert_eq!(pass(&pipeline, "access-copy").code, Some(0));
    let second = pipeline.register_one("B0002", true);
    assert_eq!(pass(&pipeline, "archiver-v2").code, Some(0));

    let broken = "contract broken: access-copy 0.1.0 reads Data_Archived's result expecting archive_path";
    let explained = autocomp(&pipeline, &["explain", second.as_str(), "--component", "access-copy"]);
    assert_eq!(explained.code, Some(0), "{}", explained.show());
    let refused = format!("refused: every pass of access-copy stops before any work, {broken}");
    assert!(explained.stdout.contains(&refused), "{}", explained.show());
    assert!(explained.stdout.contains("next: autocomp pipeline"), "{}", explained.show());
    let ready = autocomp(&pipeline, &["ready", "--component", "access-copy"]);
    let nothing = format!("access-copy would claim nothing: every pass stops before any work, {broken}");
    assert!(ready.stdout.contains(&nothing), "{}", ready.show());
    assert!(ready.stdout.contains("refused: the pass stops before any work (contract broken)"), "{}", ready.show());
    let mut dry = pipeline.command(&["--dry-run"]);
    dry.env("CONTRACT_ROLE", "access-copy");
    let dry = finish(dry.spawn().unwrap(), Duration::from_secs(60));
    assert_eq!(dry.code, Some(2), "a pass would exit 2: {}", dry.show());
    assert!(
        dry.stderr.contains(&format!("dry run: claiming nothing: a pass would not start: {broken}")),
        "{}",
        dry.show()
    );
    assert!(
        dry.stdout
            .contains("B0002 would not claim: no pass starts (why: on stderr), though every trigger clause holds"),
        "{}",
        dry.show()
    );
    let alerts = autocomp(&pipeline, &["alerts"]);
    let alert = format!("access-copy: every pass stops before any work (exit 2), {broken}");
    assert!(alerts.stdout.contains(&alert), "{}", alerts.show());
    let metrics = autocomp(&pipeline, &["metrics"]);
    assert!(metrics.stdout.contains("autocomp_contract_broken{component=\"access-copy\"} 1\n"), "{}", metrics.show());
    assert!(metrics.stdout.contains("autocomp_contract_broken{component=\"archiver\"} 0\n"), "{}", metrics.show());

    // A watching reader stays up through it, and says so once.
    let mut watch = pipeline.command(&["--watch"]);
    watch.env("CONTRACT_ROLE", "access-copy");
    let mut watcher = watch.spawn().expect("the watcher starts");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let reported = autocomp_test_servers::wait_until(deadline, || {
        registered(&pipeline, "access-copy").hosts[0].summary.starts_with(&format!("not started: {broken}"))
    });
    assert!(reported, "the refused pass is in the registry");
    let more = pipeline.register_one("B0003", true);
    assert_eq!(pass(&pipeline, "archiver-v2").code, Some(0), "another batch archived under the broken contract");
    assert!(watcher.try_wait().unwrap().is_none(), "the watcher stays up through a broken contract");

    // The producer publishes archive_path again: the watcher's next pass works, by itself.
    let mended = pipeline.register_one("B0004", true);
    assert_eq!(pass(&pipeline, "archiver-v1").code, Some(0));
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let copied = autocomp_test_servers::wait_until(deadline, || !pipeline.events(&mended, "Access_Copied").is_empty());
    assert!(copied, "the watcher resumed once the contract was mended");
    assert!(watcher.try_wait().unwrap().is_none(), "still up");
    Command::new("kill").args(["-TERM", &watcher.id().to_string()]).status().unwrap();
    let watched = finish(watcher, Duration::from_secs(60));
    assert_eq!(watched.stderr.matches("pass not started; staying up").count(), 1, "said once: {}", watched.show());
    assert!(watched.stderr.contains("passes start again"), "{}", watched.show());

    // B0003 was archived under the broken contract: its result does not give what the reader
    // declares, so the reader did not work on it but failed it, naming the field and the
    // rerun that refreshes it.
    let stale = pipeline.events(&more, "Access_Copied");
    assert_eq!(stale.len(), 1, "{}", watched.show());
    let failure = &stale[0].details["failures"][0];
    assert_eq!(failure["type"], "read_schema", "{:?}", stale[0].details);
    let description = failure["description"].as_str().unwrap();
    assert!(
        description.contains("Data_Archived's result does not give what access-copy reads at the result itself"),
        "{description}"
    );
    assert!(description.contains("\"archive_path\" is a required property"), "{description}");
    let restart = "`autocomp restart ID --from Data_Archived --reason ...` records it afresh";
    assert!(description.contains(restart), "{description}");
    assert_eq!(failure["details"]["producer"], "archiver");
    assert_eq!(failure["details"]["next"], format!("autocomp restart {more} --from Data_Archived --reason ..."));

    // That restart records the archive afresh, and the reader then copies the batch.
    let args = ["--as", "ann", "restart", more.as_str(), "--from", "Data_Archived", "--reason", "refresh"];
    let restarted = autocomp(&pipeline, &args);
    assert_eq!(restarted.code, Some(0), "{}", restarted.show());
    assert_eq!(pass(&pipeline, "archiver-v1").code, Some(0));
    assert_eq!(pass(&pipeline, "access-copy").code, Some(0));
    let copied = pipeline.events(&more, "Access_Copied");
    assert_eq!(copied.last().map(|e| e.outcome), Some(autocomp_model::Outcome::Success), "{copied:?}");
}
