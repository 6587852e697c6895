//! Contracts between steps with real component processes (`contract-component`, written
//! with the framework's prelude alone): a producer publishes its result's JSON Schema, a
//! reader declares what it expects of that result; while they agree the reader's pass runs
//! and reads the result typed; once a new producer version renames the field, the reader's
//! pass refuses to start (exit 2) naming the field and both versions, claims nothing (the
//! batch stays ready for it) and tells the registry; `autocomp pipeline` shows the schema and
//! the broken contract before any pass does.

use std::process::{Command, Stdio};
use std::time::Duration;

use autocomp_e2e::{Finished, Pipeline, binary, finish};
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
    for var in ["AUTOCOMP_STORE", "AUTOCOMP_INDEX", "AUTOCOMP_LOCKS", "AUTOCOMP_CONFIG_DIR", "RUST_LOG"] {
        command.env_remove(var);
    }
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
    assert!(host.summary.starts_with(&format!("not started: {broken}")), "{}", host.summary);
    // Only the registry's record of the pass moved the store: no claim, no event.
    let batch = pipeline.batch(&second);
    assert!(batch.events.iter().all(|e| e.seq <= head), "{:?}", batch.events);

    // The batch is still ready for the reader: its next pass takes it up once the contract
    // holds again.
    assert_eq!(reader.descriptor.state_of(&batch), ComponentState::Ready);
}
