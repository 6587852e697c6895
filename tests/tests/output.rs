//! Every run keeps its output, end to end: real `autocomp-exec` passes running `sh -c`
//! commands that print to stdout and stderr (a NUL byte, a terminal escape, more than the
//! 64 KiB budget), over SQLite and PostgreSQL, read back with the real `autocomp logs`; a
//! Rust component's info line kept while cron-mode stderr shows only warnings, and kept by a
//! run that times out; a batch at its size cap keeping the result without its output.

use std::process::{Command, Stdio};
use std::time::Duration;

use autocomp_e2e::services::TOKEN;
use autocomp_e2e::{Pipeline, binary, finish, without_pipeline_env};
use autocomp_test_servers::postgres;
use serde_json::Value;

const PROBE: &str = env!("CARGO_BIN_EXE_probe-component");

/// A head line, a NUL and an escape on stderr, ~110 KB of stdout, a tail line, a last
/// stderr line, exit 1.
const NOISY: &str = r#"echo 'first stdout line'; printf 'nul\000byte \033[31mred\n' >&2; i=0;
    while [ $i -lt 3000 ]; do echo "filler line $i of the stdout stream"; i=$((i+1)); done;
    echo 'last stdout line'; echo 'fatal: page 7 is unreadable' >&2; exit 1"#;

fn ok(pipeline: &Pipeline, args: &[&str]) -> String {
    let done = pipeline.autocomp(args);
    assert_eq!(done.code, Some(0), "autocomp {args:?}\n{}", done.show());
    done.stdout
}

/// One `autocomp-exec` pass as component `ocr` running `script`; the batch fails, the pass
/// exits 1.
fn exec_pass(pipeline: &Pipeline, script: &str) {
    let args = ["--name", "ocr", "--event-type", "Ocr_Done", "--requires", "Data_Received", "--", "sh", "-c", script];
    let run = finish(pipeline.command(&args).spawn().expect("autocomp-exec starts"), Duration::from_secs(60));
    assert_eq!(run.code, Some(1), "the batch failed, the pass did not: {}", run.show());
    assert!(run.stdout.contains("fatal: page 7 is unreadable"), "the failure quotes stderr: {}", run.show());
}

fn exec_pipeline(store_url: Option<&str>) -> Pipeline {
    let pipeline = match store_url {
        Some(url) => Pipeline::with_store(binary("autocomp-exec"), url),
        None => Pipeline::new(binary("autocomp-exec")),
    };
    std::fs::write(pipeline.config_dir().join("ocr.toml"), "").unwrap();
    pipeline
}

/// What `autocomp logs` must show of a NOISY run: the stderr lines (the escape and NUL
/// visible), the head and the tail of stdout with the cut between them, nothing that acts
/// on a terminal.
fn assert_noisy_output_shown(shown: &str) {
    assert!(!shown.chars().any(autocomp_toolkit::terminal::is_concealing), "{shown}");
    assert!(shown.contains("== ocr attempt 1 (seq "), "{shown}");
    assert!(shown.contains("--- stderr ---\nnul\\u0000byte \\u001b[31mred\nfatal: page 7 is unreadable\n"), "{shown}");
    assert!(shown.contains("--- stdout, ") && shown.contains("first stdout line\n"), "{shown}");
    assert!(shown.contains(" bytes not kept ...]\n") && shown.contains("last stdout line\n"), "{shown}");
    assert!(!shown.contains("filler line 1500 "), "the middle is not kept");
}

#[test]
fn a_failed_commands_output_is_kept_per_attempt_and_shown_by_autocomp_logs() {
    let pipeline = exec_pipeline(None);
    let id = pipeline.register(1).remove(0);
    let empty = pipeline.register_one("B0002", false);
    exec_pass(&pipeline, NOISY);

    let shown = ok(&pipeline, &["logs", id.as_str()]);
    assert_noisy_output_shown(&shown);
    let stdout = ok(&pipeline, &["logs", id.as_str(), "--stream", "stdout"]);
    assert!(!stdout.contains("--- stderr") && stdout.contains("last stdout line"), "{stdout}");

    // Kept within the budget, every byte counted.
    let events = pipeline.events(&id, "Ocr_Done");
    let output = events[0].output().expect("the result keeps its output");
    let kept: usize = output.streams.iter().map(|s| s.kept_bytes()).sum();
    assert!(kept <= 64 * 1024, "{kept} bytes kept");
    let stdout = output.stream("stdout").unwrap();
    assert!(stdout.total_bytes() > 100_000 && stdout.omitted_bytes > 0, "{}", stdout.total_bytes());

    // A second attempt after a rerun: numbered per component, selected with --attempt.
    ok(&pipeline, &["rerun", id.as_str(), "--component", "ocr", "--reason", "try again"]);
    exec_pass(&pipeline, "echo 'second try' >&2; echo 'fatal: page 7 is unreadable' >&2; exit 1");
    let second = ok(&pipeline, &["logs", id.as_str(), "--component", "ocr", "--attempt", "2"]);
    assert!(second.starts_with("== ocr attempt 2 (seq ") && second.contains("second try\n"), "{second}");
    assert!(!second.contains("attempt 1") && !second.contains("first stdout line"), "{second}");
    let both = ok(&pipeline, &["logs", id.as_str(), "--format", "json"]);
    let both: Value = serde_json::from_str(&both).unwrap_or_else(|e| panic!("{e}: {both}"));
    let attempts: Vec<(&str, u64)> = both
        .as_array()
        .unwrap()
        .iter()
        .map(|a| (a["component"].as_str().unwrap(), a["attempt"].as_u64().unwrap()))
        .collect();
    assert_eq!(attempts, [("ocr", 1), ("ocr", 2)]);
    assert_eq!(both[0]["outcome"], "failure");
    let stderr = both[0]["output"]["streams"].as_array().unwrap().iter().find(|s| s["name"] == "stderr").unwrap();
    assert_eq!(stderr["head"], "nul\u{0}byte \u{1b}[31mred\nfatal: page 7 is unreadable\n");

    // Bad input names the field and the value; exit 2.
    let missing = pipeline.autocomp(&["logs", id.as_str(), "--component", "ocr", "--attempt", "9"]);
    assert_eq!(missing.code, Some(2), "{}", missing.show());
    assert!(missing.stderr.contains("--attempt") && missing.stderr.contains('9'), "{}", missing.show());
    assert!(missing.stderr.contains("ocr ran 2 time(s)"), "{}", missing.show());
    let unknown = pipeline.autocomp(&["logs", id.as_str(), "--component", "nosuch"]);
    assert_eq!(unknown.code, Some(2), "{}", unknown.show());
    assert!(unknown.stderr.contains("nosuch"), "{}", unknown.show());
    let no_batch = pipeline.autocomp(&["logs", "B9999"]);
    assert_eq!(no_batch.code, Some(2), "{}", no_batch.show());
    assert!(no_batch.stderr.contains("B9999"), "{}", no_batch.show());

    // A batch no run has printed for: said so, or an empty array; exit 0.
    assert_eq!(ok(&pipeline, &["logs", empty.as_str()]), "B0002: no run kept any output\n");
    assert_eq!(ok(&pipeline, &["logs", empty.as_str(), "--format", "json"]), "[]\n");
}

#[test]
fn output_round_trips_through_postgresql() {
    let url = postgres::shared().unique_database();
    let pipeline = exec_pipeline(Some(&url));
    let id = pipeline.register(1).remove(0);
    exec_pass(&pipeline, NOISY);
    assert_noisy_output_shown(&ok(&pipeline, &["logs", id.as_str()]));
    let recorded = pipeline.block_on(pipeline.any_store().get_batch(&id)).unwrap();
    let result = recorded.events.iter().find(|e| e.event_type.as_str() == "Ocr_Done").unwrap();
    let stderr = result.output().unwrap().stream("stderr").cloned().unwrap();
    assert_eq!(stderr.head, "nul\u{0}byte \u{1b}[31mred\nfatal: page 7 is unreadable\n", "byte for byte");
}

#[test]
fn a_rust_components_info_lines_are_kept_while_cron_stderr_shows_only_warnings() {
    let pipeline = Pipeline::new(PROBE);
    pipeline.configure("");
    let id = pipeline.register(1).remove(0);
    let run = pipeline.run(&[]);
    assert_eq!(run.code, Some(0), "{}", run.show());
    assert!(!run.stderr.contains("probe worked on"), "cron mode logs warnings only: {}", run.show());
    let shown = ok(&pipeline, &["logs", id.as_str(), "--component", "probe"]);
    assert!(shown.starts_with("== probe attempt 1 (seq "), "{shown}");
    assert!(shown.contains("--- log ---\nINFO probe worked on B0001 behaviour=succeed\n"), "{shown}");
}

#[test]
fn a_batch_at_its_size_cap_keeps_the_result_without_its_output() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}?max_batch_bytes=1MiB", dir.path().join("store.db").display());
    let pipeline = exec_pipeline(Some(&url));
    let id = pipeline.register(1).remove(0);
    // About 1,000,000 of the 1,048,576 bytes stored: room for a small result, not for 64 KiB.
    let agent = autocomp_model::Agent::new("operator:ann").unwrap();
    for n in 0..10 {
        let note = autocomp_model::NewEvent::new(
            autocomp_model::EventType::new("Note_Made").unwrap(),
            autocomp_model::Outcome::Success,
            agent.clone(),
        )
        .with_details(serde_json::json!({"summary": format!("note {n} {}", "x".repeat(100_000))}));
        pipeline.block_on(pipeline.any_store().append_event(&id, note)).unwrap();
    }
    exec_pass(&pipeline, NOISY);
    let result = pipeline.events(&id, "Ocr_Done").remove(0);
    assert_eq!(result.outcome, autocomp_model::Outcome::Failure);
    assert_eq!(result.output(), None, "the output went, the result stayed");
    let summary = result.details["summary"].as_str().unwrap();
    assert!(summary.contains("output dropped: the batch is at its size cap"), "{summary}");
    assert_eq!(result.details["failures"][0]["description"], "fatal: page 7 is unreadable");
    assert_eq!(ok(&pipeline, &["logs", id.as_str()]), "B0001: no run kept any output\n");
}

#[test]
fn a_timed_out_run_keeps_what_it_logged_before_the_timeout() {
    let pipeline = Pipeline::new(PROBE);
    // The probe logs its info line, then hangs, ignoring cancellation.
    pipeline.configure("max_runtime = \"1s\"\ncancel_grace = \"1s\"\n\n[settings]\nbehaviour = \"hang\"\n");
    let id = pipeline.register(1).remove(0);
    let run = finish(pipeline.spawn(&[]), Duration::from_secs(30));
    assert_eq!(run.code, Some(1), "{}", run.show());
    let shown = ok(&pipeline, &["logs", id.as_str()]);
    assert!(shown.starts_with("== probe attempt 1 (seq ") && shown.contains("failure (timed out)"), "{shown}");
    assert!(shown.contains("INFO probe worked on B0001 behaviour=hang\n"), "{shown}");
}

/// A shell step that hangs past `max_runtime` leaves its trace: its process group is killed
/// and what it printed before (stdout and stderr) is kept with the timed-out failure, for
/// `autocomp logs` to show.
#[test]
fn a_hung_shell_step_keeps_what_it_printed_when_it_times_out() {
    let pipeline = exec_pipeline(None);
    let config = "max_runtime = \"2s\"\ncancel_grace = \"5s\"\n\n[settings]\nkill_grace = \"1s\"\n";
    std::fs::write(pipeline.config_dir().join("ocr.toml"), config).unwrap();
    let id = pipeline.register(1).remove(0);
    let script = "echo 'scanning page 1'; echo 'stuck on page 7' >&2; sleep 60";
    let args = ["--name", "ocr", "--event-type", "Ocr_Done", "--requires", "Data_Received", "--", "sh", "-c", script];
    let run = finish(pipeline.command(&args).spawn().expect("autocomp-exec starts"), Duration::from_secs(60));
    assert_eq!(run.code, Some(1), "{}", run.show());
    let shown = ok(&pipeline, &["logs", id.as_str()]);
    assert!(shown.contains("failure (timed out)"), "{shown}\n{}", run.show());
    assert!(shown.contains("scanning page 1") && shown.contains("stuck on page 7"), "{shown}");
}

/// A line feed in a reason, a report or a file name cannot forge a line of `show`: each
/// single-line field shows it as `\u000a`, and an invisible character (a tag character, a
/// soft hyphen, a Hangul filler) shows as its escape, as the monitor marks it.
#[test]
fn a_line_feed_in_a_reason_stays_on_its_line_in_show() {
    let pipeline = exec_pipeline(None);
    let id = pipeline.register(1).remove(0);
    exec_pass(&pipeline, "echo 'fatal: page 7 is unreadable' >&2; exit 1");
    let forged = "try again\nFAKE line: ocr success\u{e0041}\u{ad}\u{3164}";
    ok(&pipeline, &["rerun", id.as_str(), "--component", "ocr", "--reason", forged]);
    let filed = pipeline.path("scans\nFAKE location");
    ok(&pipeline, &["add", "B0002", "--type", "RoundTrip", "--location", filed.to_str().unwrap()]);

    for batch in [id.as_str(), "B0002"] {
        let shown = ok(&pipeline, &["show", batch]);
        let forged_lines: Vec<&str> = shown.lines().filter(|line| line.trim_start().starts_with("FAKE")).collect();
        assert!(forged_lines.is_empty(), "show prints a forged line {forged_lines:?}:\n{shown}");
        for invisible in ['\u{e0041}', '\u{ad}', '\u{3164}'] {
            assert!(!shown.contains(invisible), "show prints {invisible:?} raw:\n{shown}");
        }
        let expected = if batch == "B0002" {
            "scans\\u000aFAKE location"
        } else {
            "try again\\u000aFAKE line: ocr success\\udb40\\udc41\\u00ad\\u3164"
        };
        assert!(shown.contains(expected), "{shown}");
    }
}

/// `autocomp logs ID --follow` as a child process, its stdout piped.
fn follow(pipeline: &Pipeline, id: &str) -> std::process::Child {
    let mut follow = Command::new(binary("autocomp"));
    follow.arg("--config-dir").arg(pipeline.config_dir()).args(["--as", "ann", "logs", id, "--follow"]);
    without_pipeline_env(&mut follow)
        .env("AUTOCOMP_TOKEN", TOKEN)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    follow.spawn().expect("autocomp logs --follow starts")
}

/// Waits (bounded) until `autocomp logs ID` shows `needle`; what it showed last.
fn logs_until(pipeline: &Pipeline, id: &str, needle: &str) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut shown = String::new();
    let seen = autocomp_test_servers::wait_until_every(Duration::from_millis(250), deadline, || {
        shown = ok(pipeline, &["logs", id]);
        shown.contains(needle)
    });
    assert!(seen, "`autocomp logs {id}` never showed {needle:?}:\n{shown}");
    shown
}

/// The child processes of `pid` (each the leader of its command's process group).
fn children(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return Vec::new() };
    tasks
        .flatten()
        .filter_map(|task| std::fs::read_to_string(task.path().join("children")).ok())
        .flat_map(|text| text.split_whitespace().filter_map(|pid| pid.parse().ok()).collect::<Vec<u32>>())
        .collect()
}

/// The `tick N` lines of `text`, in order.
fn ticks(text: &str) -> Vec<&str> {
    text.lines().filter(|line| line.starts_with("tick ")).collect()
}

/// A running shell step's output is seen while it runs and kept when an operator cancels it:
/// `autocomp logs` shows what it printed so far (saved every 2 s), `logs --follow` prints
/// what it prints next, each line once, and returns once the run is cancelled, with every line
/// the run printed until its process group was killed; the cancelled attempt keeps them.
#[test]
fn a_running_steps_output_is_followed_and_a_cancelled_one_keeps_it() {
    let pipeline = exec_pipeline(None);
    let config = "max_runtime = \"5m\"\n\n[settings]\nkill_grace = \"1s\"\n";
    std::fs::write(pipeline.config_dir().join("ocr.toml"), config).unwrap();
    let id = pipeline.register(1).remove(0);
    let marker = pipeline.path("go-on");
    let script = format!(
        "echo 'scanning page 1'; echo 'slow disk' >&2; while [ ! -e '{}' ]; do sleep 0.1; done; \
         i=0; while true; do echo \"tick $i\"; i=$((i+1)); sleep 0.05; done",
        marker.display()
    );
    let args = ["--name", "ocr", "--event-type", "Ocr_Done", "--requires", "Data_Received", "--", "sh", "-c", &script];
    let pass = pipeline.command(&args).spawn().expect("autocomp-exec starts");

    // Saved within about 2 s of being printed, while the run goes on.
    let so_far = logs_until(&pipeline, id.as_str(), "slow disk");
    assert!(so_far.contains("scanning page 1"), "{so_far}");
    assert!(so_far.contains("== ocr run 1: running, output so far (saved at "), "{so_far}");

    // Follow it: what it prints next comes, then the cancel ends the follow, with all of it.
    let follower = follow(&pipeline, id.as_str());
    std::fs::write(&marker, "").unwrap();
    logs_until(&pipeline, id.as_str(), "tick 5\n");
    ok(&pipeline, &["cancel", id.as_str(), "--component", "ocr", "--reason", "hung on page 2"]);
    let followed = finish(follower, Duration::from_secs(60));
    assert_eq!(followed.code, Some(0), "{}", followed.show());
    let out = &followed.stdout;
    assert!(out.matches("scanning page 1").count() == 1, "nothing printed twice:\n{out}");
    assert!(out.contains("== ocr attempt 1 (seq ") && out.contains("failure (cancelled)"), "{out}");

    let run = finish(pass, Duration::from_secs(60));
    assert!(run.stderr.contains("an operator cancelled this run"), "{}", run.show());
    let kept = ok(&pipeline, &["logs", id.as_str()]);
    assert!(kept.contains("== ocr attempt 1 (seq ") && kept.contains("failure (cancelled)"), "{kept}");
    for line in ["scanning page 1", "slow disk", "tick 0", "tick 5"] {
        assert!(kept.contains(line), "the cancelled run keeps {line:?}:\n{kept}");
    }
    assert!(!kept.contains("running, output so far"), "nothing is running any more:\n{kept}");
    let all_ticks = ticks(&kept);
    assert_eq!(ticks(out), all_ticks, "the follow printed every line the run printed until the kill, once");
    let idle = ok(&pipeline, &["logs", id.as_str(), "--follow"]);
    assert!(
        idle.contains(all_ticks.last().unwrap()),
        "a follow with nothing going prints the log and returns:\n{idle}"
    );
}

/// A worker killed while its run goes leaves the run open until the next pass takes it over:
/// `logs --follow` says its worker is gone and returns, and what it saved before it died is
/// kept as the abandoned run's output once a pass takes the run over.
#[test]
fn a_follow_ends_when_the_worker_is_killed_and_the_abandoned_run_keeps_its_output() {
    let pipeline = exec_pipeline(None);
    let id = pipeline.register(1).remove(0);
    let args = ["--name", "ocr", "--event-type", "Ocr_Done", "--requires", "Data_Received", "--", "sh", "-c"];
    let mut pass = pipeline.command(&[&args[..], &["echo 'page 1 of 40'; sleep 600"]].concat()).spawn().unwrap();
    logs_until(&pipeline, id.as_str(), "page 1 of 40");
    let follower = follow(&pipeline, id.as_str());
    // The command's process group outlives a SIGKILLed worker: found now, killed after.
    let groups = children(pass.id());
    pass.kill().unwrap();
    pass.wait().unwrap();
    let followed = finish(follower, Duration::from_secs(60));
    assert_eq!(followed.code, Some(0), "{}", followed.show());
    assert!(followed.stdout.contains("== ocr run 1: its worker is gone ("), "{}", followed.show());
    for group in groups {
        Command::new("kill").args(["-KILL", "--", &format!("-{group}")]).status().ok();
    }

    // The next pass takes the run over and works the batch; the dead run's output stays.
    let retry = finish(
        pipeline.command(&[&args[..], &["echo 'page 1 to 40 done'"]].concat()).spawn().unwrap(),
        Duration::from_secs(60),
    );
    assert_eq!(retry.code, Some(0), "{}", retry.show());
    let kept = ok(&pipeline, &["logs", id.as_str()]);
    let abandoned = kept.find("== ocr run 1: abandoned").unwrap_or_else(|| panic!("{kept}"));
    let done = kept.find("== ocr attempt 1 (seq ").unwrap_or_else(|| panic!("{kept}"));
    assert!(abandoned < done, "in the order they ran:\n{kept}");
    assert!(kept.contains("page 1 of 40") && kept.contains("page 1 to 40 done"), "{kept}");
}
