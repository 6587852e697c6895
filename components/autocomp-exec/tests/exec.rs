//! `autocomp-exec` as cron runs it: the real binary over a temp SQLite store, a local index
//! and local locks, running real shell commands. Results are read back from the store.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use autocomp_framework::Outcome;
use autocomp_framework::testing::TempPipeline;
use autocomp_test_servers::wait_until;

const EXEC: &str = env!("CARGO_BIN_EXE_autocomp-exec");

struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    elapsed: Duration,
}

/// A pipeline whose config dir holds `<component>.toml`.
fn pipeline(component: &str, component_toml: &str) -> TempPipeline {
    let pipeline = TempPipeline::new();
    pipeline.configure(component, component_toml);
    pipeline
}

/// A received batch whose folder holds one file; returns the folder.
fn add_batch(pipeline: &TempPipeline, id: &str) -> PathBuf {
    let folder = pipeline.root().join("incoming").join(id);
    std::fs::create_dir_all(&folder).unwrap();
    std::fs::write(folder.join("page-1.txt"), "a page\n").unwrap();
    pipeline.add_batch(id, &folder);
    folder
}

/// Runs autocomp-exec with the pipeline's config dir (a hang fails the test).
fn exec(pipeline: &TempPipeline, args: &[&str]) -> Run {
    let started = Instant::now();
    let output = pipeline.run(Path::new(EXEC), args);
    Run {
        code: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        elapsed: started.elapsed(),
    }
}

const OCR: [&str; 6] = ["--name", "ocr", "--event-type", "Ocr_Done", "--requires", "Data_Received"];

fn with_command<'a>(command: &[&'a str]) -> Vec<&'a str> {
    let mut args = OCR.to_vec();
    args.push("--");
    args.extend_from_slice(command);
    args
}

#[test]
fn exit_0_records_a_success_and_the_batch_is_then_blocked() {
    let pipeline = pipeline("ocr", "");
    add_batch(&pipeline, "B1-RT1");
    let run = exec(&pipeline, &with_command(&["sh", "-c", "echo working; echo \"read 1 page of $AUTOCOMP_BATCH_ID\""]));
    assert_eq!(run.code, Some(0), "{}{}", run.stdout, run.stderr);
    assert!(run.stdout.starts_with("B1-RT1 Ocr_Done success"), "{}", run.stdout);
    let events = pipeline.events("B1-RT1", "Ocr_Done");
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].outcome, Outcome::Success);
    assert!(events[0].agent.as_str().starts_with("ocr/"), "{}", events[0].agent);
    assert_eq!(events[0].details["summary"], "`sh` exited 0: read 1 page of B1-RT1");

    // Cron starts it again: the batch is blocked by its own event now, so nothing happens.
    let again = exec(&pipeline, &with_command(&["sh", "-c", "echo ran again >&2; exit 9"]));
    assert_eq!((again.code, again.stdout.as_str(), again.stderr.as_str()), (Some(0), "", ""));
    assert_eq!(pipeline.events("B1-RT1", "Ocr_Done").len(), 1);
}

#[test]
fn batch_dir_and_id_are_substituted_and_exported() {
    let pipeline = pipeline("ocr", "");
    let folder = add_batch(&pipeline, "B2-RT1");
    let script = "printf '%s\\n' \"$1\" \"$2\" \"$AUTOCOMP_BATCH_ID\" \"$AUTOCOMP_BATCH_DIR\" > \"$AUTOCOMP_BATCH_DIR/seen.txt\"";
    let run = exec(&pipeline, &with_command(&["sh", "-c", script, "sh", "{batch_dir}/page-1.txt", "id={batch_id}"]));
    assert_eq!(run.code, Some(0), "{}{}", run.stdout, run.stderr);
    let seen = std::fs::read_to_string(folder.join("seen.txt")).unwrap();
    let expected = format!("{0}/page-1.txt\nid=B2-RT1\nB2-RT1\n{0}\n", folder.display());
    assert_eq!(seen, expected);
}

#[test]
fn exit_75_is_recorded_as_a_transient_failure() {
    let pipeline = pipeline("ocr", "");
    add_batch(&pipeline, "B3-RT1");
    let run = exec(&pipeline, &with_command(&["sh", "-c", "echo 'share /mnt/ocr is offline' >&2; exit 75"]));
    assert_eq!(run.code, Some(1), "{}{}", run.stdout, run.stderr);
    assert!(run.stdout.contains("transient, will retry"), "{}", run.stdout);
    let event = pipeline.events("B3-RT1", "Ocr_Done").remove(0);
    assert_eq!(event.outcome, Outcome::Failure);
    assert!(event.is_transient_failure(), "{}", event.details);
    assert_eq!(event.details["failures"][0]["description"], "share /mnt/ocr is offline");
}

#[test]
fn another_exit_status_is_a_failure_with_the_stderr_tail() {
    let pipeline = pipeline("ocr", "");
    add_batch(&pipeline, "B4-RT1");
    // Far more than the ~2 KiB tail, so the report must keep the end and drop the start.
    let script = "i=0; while [ $i -lt 500 ]; do echo \"progress line $i\" >&2; i=$((i+1)); done; \
                  echo 'fatal: page 7 is unreadable' >&2; exit 3";
    let run = exec(&pipeline, &with_command(&["sh", "-c", script]));
    assert_eq!(run.code, Some(1), "{}{}", run.stdout, run.stderr);
    assert!(run.stdout.contains("fatal: page 7 is unreadable"), "{}", run.stdout);
    let event = pipeline.events("B4-RT1", "Ocr_Done").remove(0);
    assert_eq!(event.outcome, Outcome::Failure);
    assert!(!event.flag("transient"));
    assert_eq!(event.details["summary"], "`sh` exited with status 3");
    let failure = &event.details["failures"][0];
    assert_eq!(failure["description"], "fatal: page 7 is unreadable");
    assert_eq!(failure["details"]["exit_code"], 3);
    let tail = failure["details"]["stderr_tail"].as_str().unwrap();
    assert!(tail.ends_with("progress line 499\nfatal: page 7 is unreadable\n"), "{tail}");
    assert!(!tail.contains("progress line 0\n") && tail.len() <= 2048 + 3, "{} bytes", tail.len());
}

#[test]
fn a_hung_command_is_timed_out_and_its_whole_process_group_killed() {
    let pipeline = pipeline("ocr", "max_runtime = \"2s\"\n\n[settings]\nkill_grace = \"1s\"\n");
    let folder = add_batch(&pipeline, "B5-RT1");
    // The shell writes its pid (= the group id: it leads its group) and leaves a background
    // sleep behind besides the foreground one: both must die.
    // It also notes where its result file goes: the run's private directory must be gone.
    let script = "echo $$ > \"$AUTOCOMP_BATCH_DIR/pgid\"; echo \"$AUTOCOMP_RESULT_FILE\" > \"$AUTOCOMP_BATCH_DIR/result\"; \
                  sleep 300 & sleep 300";
    let run = exec(&pipeline, &with_command(&["sh", "-c", script]));
    assert_eq!(run.code, Some(1), "{}{}", run.stdout, run.stderr);
    assert!(run.elapsed >= Duration::from_secs(2), "{:?}", run.elapsed);
    assert!(run.stdout.contains("did not finish within max_runtime 2s"), "{}", run.stdout);
    let event = pipeline.events("B5-RT1", "Ocr_Done").remove(0);
    assert_eq!(event.outcome, Outcome::Failure);
    assert!(event.flag("timed_out"), "{}", event.details);

    let pgid: i32 = std::fs::read_to_string(folder.join("pgid")).unwrap().trim().parse().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut survivors = Vec::new();
    wait_until(deadline, || {
        survivors = live_members(pgid);
        survivors.is_empty()
    });
    if !survivors.is_empty() {
        Command::new("kill").args(["-KILL", "--", &format!("-{pgid}")]).status().ok();
    }
    assert!(survivors.is_empty(), "processes of group {pgid} survived: {survivors:?}");
    let result = PathBuf::from(std::fs::read_to_string(folder.join("result")).unwrap().trim());
    assert!(!result.parent().unwrap().exists(), "the run's directory {} is removed", result.display());
}

#[test]
fn the_command_gets_the_protocol_files_in_a_private_directory_removed_afterwards() {
    let pipeline = pipeline("ocr", "[settings]\nkill_grace = \"1s\"\nlanguage = \"nl\"\n");
    let folder = add_batch(&pipeline, "B7-RT1");
    let script = "cd \"$AUTOCOMP_BATCH_DIR\" && echo \"$AUTOCOMP_PROTOCOL\" > protocol && \
                  cp \"$AUTOCOMP_BATCH_FILE\" batch.json && cp \"$AUTOCOMP_SETTINGS_FILE\" settings.json && \
                  stat -c %a \"$(dirname \"$AUTOCOMP_BATCH_FILE\")\" > mode && echo \"$AUTOCOMP_RESULT_FILE\" > result && \
                  [ ! -e \"$AUTOCOMP_RESULT_FILE\" ] && [ \"$(dirname \"$AUTOCOMP_RESULT_FILE\")\" = \"$(dirname \"$AUTOCOMP_SETTINGS_FILE\")\" ] && \
                  printf '{\"result\": {\"pages\": 1}, \"summary\": \"1 page\"}' > \"$AUTOCOMP_RESULT_FILE\"";
    let run = exec(&pipeline, &with_command(&["sh", "-c", script]));
    assert_eq!(run.code, Some(0), "{}{}", run.stdout, run.stderr);
    let read = |name: &str| std::fs::read_to_string(folder.join(name)).unwrap();
    assert_eq!(read("protocol"), "1\n");
    assert_eq!(read("mode"), "700\n");
    assert_eq!(read("settings.json"), r#"{"language":"nl"}"#);
    let batch: serde_json::Value = serde_json::from_str(&read("batch.json")).unwrap();
    assert_eq!((&batch["protocol"], &batch["component"], &batch["checkpoint"]), (&1.into(), &"ocr".into(), &().into()));
    assert_eq!(batch["batch"]["id"], "B7-RT1");
    assert_eq!(batch["batch"]["location"], folder.display().to_string());
    assert_eq!(batch["batch"]["events"]["Data_Received"]["outcome"], "success", "{batch}");
    assert_eq!(batch["batch"]["events"]["Data_Received"]["result"], serde_json::Value::Null, "{batch}");
    let result = std::path::PathBuf::from(read("result").trim());
    assert!(!result.parent().unwrap().exists(), "the run's directory {} is removed", result.display());
    let event = pipeline.events("B7-RT1", "Ocr_Done").remove(0);
    assert_eq!(event.outcome, Outcome::Success);
    assert_eq!(event.details["summary"], "1 page");
    assert_eq!(event.details["result"], serde_json::json!({"pages": 1}));
}

#[test]
fn a_schema_flag_with_a_bad_file_is_a_usage_error_naming_the_flag_and_the_file() {
    let pipeline = pipeline("ocr", "");
    let missing = pipeline.root().join("missing.json");
    let missing = missing.display().to_string();
    let reads = format!("Data_Received={missing}");
    for flag in [["--result-schema", missing.as_str()], ["--reads", reads.as_str()]] {
        let args = [&OCR[..], &flag[..], &["--", "true"]].concat();
        let run = exec(&pipeline, &args);
        assert_eq!(run.code, Some(2), "{}{}", run.stdout, run.stderr);
        assert!(run.stderr.contains(flag[0]) && run.stderr.contains(&missing), "{}", run.stderr);
    }
}

/// Processes of a group that are still alive (zombies waiting for init do not count).
fn live_members(pgid: i32) -> Vec<String> {
    let mut alive = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
        // `pid (comm) state ppid pgrp ...`; comm may hold spaces, so split after the last ')'.
        let Some((head, rest)) = stat.rsplit_once(')') else { continue };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields.len() > 2 && fields[2] == pgid.to_string() && fields[0] != "Z" {
            alive.push(format!("{head}) {}", fields[0]));
        }
    }
    alive
}

#[test]
fn invalid_names_are_usage_errors() {
    let pipeline = pipeline("ocr", "");
    let run = exec(&pipeline, &["--name", "bad name", "--event-type", "Ocr_Done", "--", "true"]);
    assert_eq!(run.code, Some(2));
    assert!(run.stderr.contains("--name") && run.stderr.contains("\"bad name\""), "{}", run.stderr);
    let run = exec(
        &pipeline,
        &["--name", "ocr", "--event-type", "Ocr_Done", "--requires", "Data_Received,1st", "--", "true"],
    );
    assert_eq!(run.code, Some(2));
    assert!(run.stderr.contains("--requires") && run.stderr.contains("event type \"1st\""), "{}", run.stderr);
    let run = exec(&pipeline, &["--name", "ocr", "--event-type", "Ocr_Done"]);
    assert_eq!(run.code, Some(2), "a command is required: {}", run.stderr);
}

#[test]
fn a_missing_program_is_a_permanent_failure_naming_it() {
    let pipeline = pipeline("ocr", "");
    add_batch(&pipeline, "B6-RT1");
    let run = exec(&pipeline, &with_command(&["/nonexistent/ocr-tool", "{batch_dir}"]));
    assert_eq!(run.code, Some(1), "{}{}", run.stdout, run.stderr);
    let event = pipeline.events("B6-RT1", "Ocr_Done").remove(0);
    assert!(!event.flag("transient"));
    let summary = event.details["summary"].as_str().unwrap();
    assert!(summary.starts_with("/nonexistent/ocr-tool: "), "{summary}");
}
