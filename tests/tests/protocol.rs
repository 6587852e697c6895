//! The command protocol (docs/command-protocol.md) end to end: real `autocomp-exec` passes
//! running `sh` and `python3` commands that read the batch file and the settings file and
//! write a result file, over SQLite and once over PostgreSQL, read back with the real
//! `autocomp show`: a structured result handed from one step to the next, failures with
//! their reference and type, exit 75 with a checkpoint resumed by the next attempt, a
//! malformed result file, a result not matching its schema, settings as JSON and a settings
//! schema that refuses a pass.

use std::time::Duration;

use autocomp_e2e::{Finished, Pipeline, binary, finish};
use autocomp_model::BatchId;
use autocomp_test_servers::postgres;
use serde_json::{Value, json};

/// `autocomp show ID --format json`: the batch's effective event of `event_type`.
fn shown_event(pipeline: &Pipeline, id: &BatchId, event_type: &str) -> Value {
    let done = pipeline.autocomp(&["show", id.as_str(), "--format", "json"]);
    assert_eq!(done.code, Some(0), "{}", done.show());
    let shown: Value = serde_json::from_str(&done.stdout).unwrap_or_else(|e| panic!("{e}: {}", done.show()));
    let events = shown["events"].as_array().unwrap_or_else(|| panic!("no events: {shown}"));
    events.iter().rev().find(|e| e["type"] == event_type).cloned().unwrap_or_else(|| panic!("no {event_type}: {shown}"))
}

fn exec_pipeline(store_url: Option<&str>) -> Pipeline {
    match store_url {
        Some(url) => Pipeline::with_store(binary("autocomp-exec"), url),
        None => Pipeline::new(binary("autocomp-exec")),
    }
}

/// Writes `<config-dir>/<name>.toml`.
fn configure(pipeline: &Pipeline, name: &str, text: &str) {
    std::fs::write(pipeline.config_dir().join(format!("{name}.toml")), text).unwrap();
}

/// One `autocomp-exec` pass: `flags` (name, event type, trigger, schemas), then the command.
fn exec(pipeline: &Pipeline, flags: &[&str], command: &[&str]) -> Finished {
    let mut args = flags.to_vec();
    args.push("--");
    args.extend_from_slice(command);
    finish(pipeline.command(&args).spawn().expect("autocomp-exec starts"), Duration::from_secs(60))
}

/// Counts pages: writes a structured result (checked against its own schema) and a summary.
const COUNT: &str = r#"
import json, os
assert os.environ["AUTOCOMP_PROTOCOL"] == "1"
batch = json.load(open(os.environ["AUTOCOMP_BATCH_FILE"]))
assert batch["protocol"] == 1 and batch["component"] == "count", batch
assert batch["batch"]["events"]["Data_Received"]["outcome"] == "success", batch
assert batch["checkpoint"] is None, batch
assert not os.path.exists(os.environ["AUTOCOMP_RESULT_FILE"])
print("counting the pages of", batch["batch"]["id"])
with open(os.environ["AUTOCOMP_RESULT_FILE"], "w") as out:
    json.dump({"protocol": 1, "result": {"pages": 412, "files": ["p1.tif", "p2.tif"]},
               "summary": "412 pages in 2 files"}, out)
"#;

/// Reads the count's result from the batch file and records its own.
const CHECK: &str = r#"
import json, os
batch = json.load(open(os.environ["AUTOCOMP_BATCH_FILE"]))
counted = batch["batch"]["events"]["Pages_Counted"]
assert counted["outcome"] == "success" and counted["agent"].startswith("count/"), counted
json.dump({"result": {"seen_pages": counted["result"]["pages"], "counted_seq": counted["seq"],
                      "counted_summary": counted["summary"], "batch": batch["batch"]["id"],
                      "type": batch["batch"]["type"], "location": batch["batch"]["location"]}},
          open(os.environ["AUTOCOMP_RESULT_FILE"], "w"))
"#;

const PAGES_SCHEMA: &str = r#"{"type": "object", "required": ["pages"],
    "properties": {"pages": {"type": "integer", "minimum": 0}, "files": {"type": "array"}}}"#;

/// Two steps, the second reading the first's result; returns the batch.
fn two_steps(pipeline: &Pipeline) -> BatchId {
    configure(pipeline, "count", "");
    configure(pipeline, "check", "");
    std::fs::write(pipeline.path("pages.schema.json"), PAGES_SCHEMA).unwrap();
    let id = pipeline.register(1).remove(0);
    let schema = pipeline.path("pages.schema.json").display().to_string();
    let count = ["--name", "count", "--event-type", "Pages_Counted", "--requires", "Data_Received"];
    let count = [&count[..], &["--result-schema", &schema]].concat();
    let run = exec(pipeline, &count, &["python3", "-c", COUNT]);
    assert_eq!(run.code, Some(0), "{}", run.show());
    assert!(run.stdout.contains("B0001 Pages_Counted success"), "{}", run.show());

    let reads = format!("Pages_Counted={schema}");
    let check = ["--name", "check", "--event-type", "Pages_Checked", "--requires", "Pages_Counted", "--reads", &reads];
    let run = exec(pipeline, &check, &["python3", "-c", CHECK]);
    assert_eq!(run.code, Some(0), "{}", run.show());

    let counted = shown_event(pipeline, &id, "Pages_Counted");
    assert_eq!(counted["details"]["result"], json!({"pages": 412, "files": ["p1.tif", "p2.tif"]}));
    assert_eq!(counted["details"]["summary"], "412 pages in 2 files");
    let stdout = counted["details"]["output"]["streams"].as_array().unwrap().iter().find(|s| s["name"] == "stdout");
    assert_eq!(stdout.unwrap()["head"], "counting the pages of B0001\n", "stdout is the run's output");
    let checked = shown_event(pipeline, &id, "Pages_Checked");
    assert_eq!(checked["outcome"], "success", "{checked}");
    let location = pipeline.path("incoming/B0001").display().to_string();
    let expected = json!({"seen_pages": 412, "counted_seq": counted["seq"], "counted_summary": "412 pages in 2 files",
                          "batch": "B0001", "type": "RoundTrip", "location": location});
    assert_eq!(checked["details"]["result"], expected);
    id
}

#[test]
fn a_step_reads_an_earlier_steps_result_and_records_its_own() {
    let pipeline = exec_pipeline(None);
    two_steps(&pipeline);
}

#[test]
fn the_protocol_round_trips_through_postgresql() {
    let url = postgres::shared().unique_database();
    let pipeline = exec_pipeline(Some(&url));
    two_steps(&pipeline);
}

const SCAN: [&str; 6] = ["--name", "scan", "--event-type", "Virus_Scanned", "--requires", "Data_Received"];

#[test]
fn failures_in_the_result_file_are_recorded_with_their_reference_and_type() {
    let pipeline = exec_pipeline(None);
    configure(&pipeline, "scan", "");
    let ids = pipeline.register(2);
    // B0001 exits 0 with failures; B0002 exits 3, its failures replacing `exit_status`.
    let script = r#"printf '%s' '{"summary": "1 infected file", "failures": [{"reference": "data/x.tif",
        "type": "virus", "description": "Eicar found", "details": {"signature": "EICAR"}}]}' > "$AUTOCOMP_RESULT_FILE"
        echo 'scanned' >&2
        [ "$AUTOCOMP_BATCH_ID" = B0001 ] || exit 3"#;
    let run = exec(&pipeline, &SCAN, &["sh", "-c", script]);
    assert_eq!(run.code, Some(1), "{}", run.show());
    for (id, summary) in [(&ids[0], "1 infected file"), (&ids[1], "`sh` exited with status 3: 1 infected file")] {
        let event = shown_event(&pipeline, id, "Virus_Scanned");
        assert_eq!(event["outcome"], "failure", "{event}");
        let details = &event["details"];
        assert_eq!(details["summary"], summary);
        assert!(details.get("transient").is_none(), "permanent: {details}");
        assert_eq!(details["failures_total"], 1, "{details}");
        let expected = json!({"reference": "data/x.tif", "type": "virus", "description": "Eicar found",
                              "details": {"signature": "EICAR"}});
        assert_eq!(details["failures"][0], expected);
    }
}

/// Scans 5 of 10 files and exits 75 saving a checkpoint; an attempt that finds a checkpoint
/// records where it resumed from.
const RESUMING: &str = r#"
import json, os, sys
batch = json.load(open(os.environ["AUTOCOMP_BATCH_FILE"]))
out = open(os.environ["AUTOCOMP_RESULT_FILE"], "w")
if batch["checkpoint"] is None and batch["batch"]["events"].get("Virus_Scanned") is None:
    json.dump({"summary": "5 of 10 files scanned", "checkpoint": {"done": 5},
               "failures": [{"type": "share_offline", "description": "/mnt/share went away"}]}, out)
    sys.exit(75)
json.dump({"result": {"resumed_from": (batch["checkpoint"] or {}).get("done"),
                      "earlier": batch["batch"]["events"]["Virus_Scanned"]["outcome"]}}, out)
"#;

/// Two attempts: the first exits 75 with a checkpoint, the second (the retry, backoff 0s)
/// succeeds; returns the second's result.
fn exit_75_then_retry() -> Value {
    let pipeline = exec_pipeline(None);
    configure(&pipeline, "scan", "retry_backoff = \"0s\"\n");
    let id = pipeline.register(1).remove(0);
    let run = exec(&pipeline, &SCAN, &["python3", "-c", RESUMING]);
    assert_eq!(run.code, Some(1), "{}", run.show());
    assert!(run.stdout.contains("transient, will retry"), "{}", run.show());
    let first = shown_event(&pipeline, &id, "Virus_Scanned");
    assert_eq!(first["outcome"], "failure");
    assert_eq!(first["details"]["transient"], true, "{first}");
    assert_eq!(first["details"]["summary"], "5 of 10 files scanned; `python3` exited 75 (temporary failure)");
    let failures = &first["details"]["failures"];
    assert_eq!(failures, &json!([{"type": "share_offline", "description": "/mnt/share went away"}]), "replaced");

    let run = exec(&pipeline, &SCAN, &["python3", "-c", RESUMING]);
    assert_eq!(run.code, Some(0), "{}", run.show());
    let second = shown_event(&pipeline, &id, "Virus_Scanned");
    assert_eq!(second["outcome"], "success", "{second}");
    second["details"]["result"].clone()
}

#[test]
fn exit_75_is_a_transient_failure_with_the_result_files_summary_and_failures_and_is_retried() {
    assert_eq!(exit_75_then_retry()["earlier"], "failure");
}

/// The protocol says the next attempt gets the checkpoint back; the store drops a
/// component's checkpoint with every result it records, transient failures included
/// (`checkpoints_survive_an_abandoned_run_and_vanish_with_a_result` in the store's tests), so
/// today the retry sees `null`.
#[test]
fn the_attempt_after_exit_75_resumes_from_the_checkpoint() {
    assert_eq!(exit_75_then_retry(), json!({"resumed_from": 5, "earlier": "failure"}));
}

#[test]
fn a_malformed_result_file_or_a_result_off_its_schema_is_a_failure_saying_what_is_wrong() {
    let pipeline = exec_pipeline(None);
    configure(&pipeline, "scan", "");
    std::fs::write(pipeline.path("pages.schema.json"), PAGES_SCHEMA).unwrap();
    let ids = pipeline.register(4);
    let script = r#"echo "scanning $AUTOCOMP_BATCH_ID"
        case "$AUTOCOMP_BATCH_ID" in
          B0001) printf '{"result": 1,\n' ;;
          B0002) printf '{"reslt": {"pages": 1}}' ;;
          B0003) printf '{"result": {"pages": "many"}}' ;;
          B0004) printf '{"result": {"pages": 3}, "transient": "yes"}' ;;
        esac > "$AUTOCOMP_RESULT_FILE""#;
    let schema = pipeline.path("pages.schema.json").display().to_string();
    let flags = [&SCAN[..], &["--result-schema", &schema]].concat();
    let run = exec(&pipeline, &flags, &["sh", "-c", script]);
    assert_eq!(run.code, Some(1), "{}", run.show());
    let cases = [
        ("result_file", "EOF while parsing a value at line 2 column 0"),
        ("result_file", "unknown field `reslt`, expected one of `protocol`, `result`"),
        ("result_schema", "at `/pages`: \"many\" is not of type \"integer\""),
        ("result_file", "invalid type: string \"yes\", expected a boolean"),
    ];
    for (id, (kind, wanted)) in ids.iter().zip(cases) {
        let event = shown_event(&pipeline, id, "Virus_Scanned");
        assert_eq!(event["outcome"], "failure", "{event}");
        let details = &event["details"];
        assert!(details.get("transient").is_none(), "permanent: {details}");
        assert!(details.get("result").is_none(), "no result recorded: {details}");
        let failure = &details["failures"][0];
        assert_eq!(failure["type"], kind, "{details}");
        let description = failure["description"].as_str().unwrap();
        assert!(description.contains(wanted), "{id}: {description}");
        let stdout = details["output"]["streams"].as_array().unwrap().iter().find(|s| s["name"] == "stdout");
        assert_eq!(stdout.unwrap()["head"], format!("scanning {id}\n"), "the output is kept: {details}");
    }
    let failure = &shown_event(&pipeline, &ids[2], "Virus_Scanned")["details"]["failures"][0];
    assert_eq!(failure["details"]["instance_path"], "/pages");

    // A schema flag whose file is not a schema: exit 2 naming the flag and the file.
    std::fs::write(pipeline.path("broken.json"), "{\"type\": ").unwrap();
    let broken = pipeline.path("broken.json").display().to_string();
    for flag in [vec!["--result-schema", broken.as_str()], vec!["--reads", &format!("Data_Received={broken}")]] {
        let run = exec(&pipeline, &[&SCAN[..], &flag].concat(), &["true"]);
        assert_eq!(run.code, Some(2), "{}", run.show());
        assert!(run.stderr.contains(flag[0]) && run.stderr.contains(&broken), "{}", run.show());
    }
}

#[test]
fn settings_arrive_as_json_and_a_settings_schema_mismatch_refuses_the_pass() {
    let pipeline = exec_pipeline(None);
    let schema = r#"{"type": "object", "required": ["language"],
        "properties": {"language": {"enum": ["nl", "en"]}, "threshold": {"type": "number"},
                       "endpoint": {"pattern": "^https://[a-z.]+/"}, "token": {"type": "string"}}}"#;
    std::fs::write(pipeline.config_dir().join("scan.schema.json"), schema).unwrap();
    let settings = "[settings]\nkill_grace = \"2s\"\nsettings_schema = \"scan.schema.json\"\nlanguage = \"nl\"\n\
                    threshold = 0.5\nwhen = 1979-05-27T07:32:00Z\nlimits = { pages = 10, names = [\"a\", \"b\"] }\n";
    configure(&pipeline, "scan", settings);
    let ids = pipeline.register(1);
    let script = r#"
import json, os
settings = json.load(open(os.environ["AUTOCOMP_SETTINGS_FILE"]))
json.dump({"result": {"settings": settings}}, open(os.environ["AUTOCOMP_RESULT_FILE"], "w"))
"#;
    let run = exec(&pipeline, &SCAN, &["python3", "-c", script]);
    assert_eq!(run.code, Some(0), "{}", run.show());
    let event = shown_event(&pipeline, &ids[0], "Virus_Scanned");
    let expected = json!({"language": "nl", "threshold": 0.5, "when": "1979-05-27T07:32:00Z",
                          "limits": {"pages": 10, "names": ["a", "b"]}});
    assert_eq!(event["details"]["result"]["settings"], expected, "exec's own keys are not passed");

    // A mismatch: exit 2 naming the key and the value; the new batch is not touched.
    configure(&pipeline, "scan", &settings.replace("threshold = 0.5", "threshold = \"high\""));
    let waiting = pipeline.register_one("B0002", true);
    let run = exec(&pipeline, &SCAN, &["python3", "-c", script]);
    assert_eq!(run.code, Some(2), "{}", run.show());
    assert!(run.stderr.contains("[settings] threshold: \"high\" is not of type \"number\""), "{}", run.show());
    assert!(pipeline.events(&waiting, "Virus_Scanned").is_empty());
    assert!(pipeline.open_runs().is_empty());

    // The check quotes the value: a URL's password is hidden, a secret's value not shown, on
    // stderr and in the registry everyone who reads the pipeline sees.
    for (setting, shown) in [
        ("endpoint = \"https://svc:hunter2@h/x\"", "[settings] endpoint: \"https://svc:***@h/x\" does not match"),
        ("token = 12345678", "[settings] token: its value is refused (not shown: a secret)"),
    ] {
        configure(&pipeline, "scan", &format!("{settings}{setting}\n"));
        let run = exec(&pipeline, &SCAN, &["python3", "-c", script]);
        assert_eq!(run.code, Some(2), "{}", run.show());
        assert!(run.stderr.contains(shown), "{}", run.show());
        let said = format!("{}{}", run.stderr, pipeline.autocomp(&["pipeline"]).stdout);
        assert!(!said.contains("hunter2") && !said.contains("12345678"), "{said}");
    }
}

/// autocomp-exec's own flags belong before `--`: one after it (where it would silently be the
/// command's argument, and the step run without it) is refused before anything is claimed,
/// saying where it belongs; after a second `--` it is the command's, as written.
#[test]
fn an_exec_flag_after_the_double_dash_is_refused_unless_after_a_second_one() {
    let pipeline = exec_pipeline(None);
    configure(&pipeline, "echo", "");
    let id = pipeline.register(1).remove(0);
    let flags = ["--name", "echo", "--event-type", "Echoed"];
    let misplaced = exec(&pipeline, &flags, &["sh", "-c", "echo ran", "--requires", "Data_Received"]);
    assert_eq!(misplaced.code, Some(2), "{}", misplaced.show());
    assert!(
        misplaced.stderr.contains("`--requires` comes after `--`, so it would be passed to the command `sh`")
            && misplaced.stderr.contains("put autocomp-exec's flags before `--`"),
        "{}",
        misplaced.show()
    );
    assert!(pipeline.autocomp(&["logs", id.as_str()]).stdout.contains("no run kept any output"), "nothing ran");

    let literal = exec(
        &pipeline,
        &[&flags[..], &["--requires", "Data_Received"]].concat(),
        &["--", "sh", "-c", "echo \"$1\"", "sh", "--name"],
    );
    assert_eq!(literal.code, Some(0), "{}", literal.show());
    let shown = pipeline.autocomp(&["logs", id.as_str()]).stdout;
    assert!(shown.contains("--- stdout ---\n--name\n"), "the command got `--name` as its argument:\n{shown}");
}
