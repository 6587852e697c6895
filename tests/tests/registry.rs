//! The pipeline as data: components register themselves in the store at every pass, and the
//! `autocomp` CLI reads the pipeline from there, not from config files. Checked with the real
//! binaries: the demo's components (whose tomls carry no `[trigger]`), the probe component in
//! several roles, the CLI with its backends from the environment and no config directory, a
//! structured result read typed by the next step (embedded store and store service), the
//! `retrying` state, an event type clash, and the operator's name with `$USER` unset.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use autocomp_e2e::services::Service;
use autocomp_e2e::{Finished, Pipeline, binary, finish};
use autocomp_model::EventType;
use serde_json::Value;

const PROBE: &str = env!("CARGO_BIN_EXE_probe-component");

/// The demo's pipeline after its rounds, in a temp dir.
struct Demo {
    dir: tempfile::TempDir,
}

impl Demo {
    fn run() -> Demo {
        let dir = tempfile::tempdir().unwrap();
        let output = Command::new(binary("autocomp"))
            .args(["demo", "--batches", "12", "--dir"])
            .arg(dir.path())
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "demo failed: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        Demo { dir }
    }

    fn config_dir(&self) -> PathBuf {
        self.dir.path().join("config")
    }

    /// `autocomp --config-dir <demo>/config --as tester ARGS`.
    fn autocomp(&self, args: &[&str]) -> Finished {
        let mut command = Command::new(binary("autocomp"));
        command.arg("--config-dir").arg(self.config_dir()).args(["--as", "tester"]).args(args);
        run(clean(command))
    }

    /// The backends the demo wrote into autocomp.toml, as `AUTOCOMP_*` variables.
    fn backend_env(&self) -> Vec<(String, String)> {
        let text = std::fs::read_to_string(self.config_dir().join("autocomp.toml")).unwrap();
        let backends: autocomp_framework::config::Backends = toml::from_str(&text).unwrap();
        [("AUTOCOMP_STORE", backends.store), ("AUTOCOMP_INDEX", backends.index), ("AUTOCOMP_LOCKS", backends.locks)]
            .into_iter()
            .map(|(key, value)| (key.to_owned(), value.expect("the demo names every backend")))
            .collect()
    }
}

/// A command without the environment that would change what it does.
fn clean(mut command: Command) -> Command {
    for var in ["AUTOCOMP_STORE", "AUTOCOMP_INDEX", "AUTOCOMP_LOCKS", "AUTOCOMP_CONFIG_DIR", "RUST_LOG"] {
        command.env_remove(var);
    }
    command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    command
}

fn run(mut command: Command) -> Finished {
    finish(command.spawn().expect("the binary starts"), Duration::from_secs(60))
}

fn text(output: &Finished) -> String {
    output.show()
}

fn stdout(output: &Finished) -> String {
    output.stdout.clone()
}

fn json(output: &Finished) -> Value {
    assert_eq!(output.code, Some(0), "{}", output.show());
    serde_json::from_str(&output.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", output.show()))
}

/// `status --format json` as batch -> component -> state.
fn states(output: &Finished) -> BTreeMap<String, BTreeMap<String, String>> {
    json(output)
        .as_array()
        .unwrap()
        .iter()
        .map(|row| {
            let components = row["components"].as_object().unwrap();
            let states = components.iter().map(|(c, s)| (c.clone(), s.as_str().unwrap().to_owned())).collect();
            (row["id"].as_str().unwrap().to_owned(), states)
        })
        .collect()
}

#[test]
fn status_agrees_with_each_components_own_dry_run_when_the_tomls_carry_no_trigger() {
    let demo = Demo::run();
    for file in ["checksum-verifier.toml", "structure-checker.toml", "archiver.toml"] {
        let toml = std::fs::read_to_string(demo.config_dir().join(file)).unwrap();
        assert!(!toml.contains("[trigger]") && !toml.contains("event_type"), "{file}: {toml}");
    }
    // Make some batches ready again, so "ready" is among the states compared.
    let before = states(&demo.autocomp(&["status", "--format", "json"]));
    let failed: Vec<String> =
        before.iter().filter(|(_, s)| s["checksum-verifier"] == "failed").map(|(id, _)| id.clone()).collect();
    let (broken, still_broken) = (failed[0].clone(), failed[failed.len() - 1].clone());
    assert_ne!(broken, still_broken, "the demo breaks several batches' checksums: {before:?}");
    let good = before.iter().find(|(_, s)| s["archiver"] == "success").map(|(id, _)| id.clone()).unwrap();
    for (id, component) in [(&broken, "checksum-verifier"), (&good, "archiver")] {
        let rerun = demo.autocomp(&["rerun", id, "--component", component, "--reason", "compare with dry runs"]);
        assert!(rerun.code == Some(0), "{}", text(&rerun));
    }

    let status = states(&demo.autocomp(&["status", "--format", "json"]));
    let mut compared = 0;
    let mut ready = 0;
    for component in ["checksum-verifier", "structure-checker", "archiver"] {
        for (id, row) in &status {
            let mut command = Command::new(binary(component));
            command.arg("--config-dir").arg(demo.config_dir()).args(["--dry-run", "--batch", id]);
            let output = run(clean(command));
            assert!(output.code == Some(0), "{}", text(&output));
            let verdict = stdout(&output);
            let would_claim = verdict.contains("would claim");
            assert_eq!(
                row[component] == "ready",
                would_claim,
                "{id} {component}: status {}, {verdict}",
                row[component]
            );
            ready += usize::from(would_claim);
            compared += 1;
        }
    }
    assert_eq!(compared, 3 * 12);
    assert_eq!(ready, 2, "the two reruns made two (batch, component) pairs ready: {status:?}");

    // The archiver waits for a batch whose checksums failed, and says exactly why.
    assert_eq!(status[&still_broken]["archiver"], "waiting", "{status:?}");
    let mut command = Command::new(binary("archiver"));
    command.arg("--config-dir").arg(demo.config_dir()).args(["--dry-run", "--batch", &still_broken]);
    let verdict = stdout(&run(clean(command)));
    assert!(
        verdict.contains("requires Checksums_Verified: its effective event is a failure, seq "),
        "the refusal names the clause, the type and its state: {verdict}"
    );
}

#[test]
fn the_cli_runs_on_backends_from_the_environment_without_a_config_dir() {
    let demo = Demo::run();
    let no_config_dir = demo.dir.path().join("no-such-config-dir");
    let autocomp = |args: &[&str]| {
        let mut command = Command::new(binary("autocomp"));
        command.args(["--as", "tester"]).args(args);
        let mut command = clean(command);
        command.env("AUTOCOMP_CONFIG_DIR", &no_config_dir);
        for (key, value) in demo.backend_env() {
            command.env(key, value);
        }
        run(command)
    };
    let status = states(&autocomp(&["status", "--format", "json"]));
    let id = status.keys().next().unwrap().clone();
    let components: Vec<&String> = status[&id].keys().collect();
    // The demo's four Rust steps and its Python step (catalogue, run through autocomp-exec).
    assert_eq!(components, ["archiver", "batch-trigger", "catalogue", "checksum-verifier", "structure-checker"]);
    let shown = json(&autocomp(&["show", &id, "--format", "json"]));
    assert_eq!(shown["id"], id.as_str());
    let recorded =
        autocomp(&["event", &id, "--type", "Data_Received", "--outcome", "success", "--reason", "redelivered"]);
    assert!(recorded.code == Some(0), "{}", text(&recorded));

    // The pipeline lists every component with where and when it last ran.
    let listed = json(&autocomp(&["pipeline", "--format", "json"]));
    let by_name = |listed: &Value, name: &str| -> Value {
        listed["components"].as_array().unwrap().iter().find(|c| c["descriptor"]["name"] == name).unwrap().clone()
    };
    for name in ["batch-trigger", "checksum-verifier", "structure-checker", "archiver"] {
        let entry = by_name(&listed, name);
        assert!(entry["last_seen"].is_string() && entry["seconds_since_last_seen"].is_u64(), "{name}: {entry:#}");
        assert_eq!(entry["hosts"].as_array().unwrap().len(), 1, "{entry:#}");
        assert!(entry["retired"].is_null());
    }
    let archiver = by_name(&listed, "archiver");
    assert_eq!(archiver["descriptor"]["event_type"], "Data_Archived");
    assert_eq!(
        archiver["descriptor"]["trigger"]["requires"],
        serde_json::json!(["Checksums_Verified", "Structure_Checked"])
    );
    let table = stdout(&autocomp(&["pipeline"]));
    assert!(
        table.contains("requires Checksums_Verified, requires Structure_Checked, blocked_by Data_Archived"),
        "{table}"
    );
    assert!(table.contains(" ago"), "{table}");

    // A component that stops running keeps its last-seen time while the others move on.
    let mut command = Command::new(binary("checksum-verifier"));
    command.arg("--config-dir").arg(demo.config_dir());
    assert!(run(clean(command)).code == Some(0));
    let later = json(&autocomp(&["pipeline", "--format", "json"]));
    // Timestamps are RFC 3339 in UTC with milliseconds: they order as text.
    let seen = |listed: &Value, name: &str| by_name(listed, name)["last_seen"].as_str().unwrap().to_owned();
    assert!(seen(&later, "checksum-verifier") > seen(&listed, "checksum-verifier"), "{later:#}");
    assert_eq!(by_name(&later, "archiver")["last_seen"], archiver["last_seen"], "not seen since its last pass");

    // Retired: gone from status, listed as retired with the reason; it comes back if it runs.
    let forgotten = autocomp(&["pipeline", "forget", "archiver", "--reason", "replaced by archiver2"]);
    assert!(forgotten.code == Some(0), "{}", text(&forgotten));
    let status = states(&autocomp(&["status", "--format", "json"]));
    assert!(!status[&id].contains_key("archiver"), "{status:?}");
    let retired = by_name(&json(&autocomp(&["pipeline", "--format", "json"])), "archiver");
    assert_eq!(retired["retired"]["reason"], "replaced by archiver2");
    assert_eq!(retired["retired"]["by"], "operator:tester");
    let again = autocomp(&["pipeline", "forget", "archiver", "--reason", "twice"]);
    assert_eq!(again.code, Some(1), "{}", text(&again));
    let unknown = autocomp(&["pipeline", "forget", "no-such-component", "--reason", "typo"]);
    assert_eq!(unknown.code, Some(2), "{}", text(&unknown));
    assert!(text(&unknown).contains("no-such-component"), "{}", text(&unknown));
    let mut command = Command::new(binary("archiver"));
    command.arg("--config-dir").arg(demo.config_dir());
    assert!(run(clean(command)).code == Some(0));
    assert!(by_name(&json(&autocomp(&["pipeline", "--format", "json"])), "archiver")["retired"].is_null());
}

/// The probe in two roles: `page-counter` records Pages_Counted with a `{"pages": 412}`
/// result; `page-reader` runs after it and reads that result typed.
fn counter_and_reader(pipeline: &Pipeline) -> (Command, Command) {
    let config = pipeline.config_dir();
    std::fs::write(config.join("page-counter.toml"), "[settings]\npages = 412\n").unwrap();
    std::fs::write(config.join("page-reader.toml"), "[settings]\nread_pages_of = \"Pages_Counted\"\n").unwrap();
    let role = |name: &str, event_type: &str, requires: &str| {
        let mut command = pipeline.command(&[]);
        command.env("PROBE_NAME", name).env("PROBE_EVENT_TYPE", event_type).env("PROBE_REQUIRES", requires);
        command
    };
    (role("page-counter", "Pages_Counted", "Data_Received"), role("page-reader", "Pages_Read", "Pages_Counted"))
}

fn a_result_is_read_typed_by_the_next_step(pipeline: &Pipeline) {
    let ids = pipeline.register(2);
    let (mut counter, mut reader) = counter_and_reader(pipeline);
    let counted = finish(counter.spawn().unwrap(), Duration::from_secs(30));
    assert_eq!(counted.code, Some(0), "{}", counted.show());
    let read = finish(reader.spawn().unwrap(), Duration::from_secs(30));
    assert_eq!(read.code, Some(0), "{}", read.show());
    for id in &ids {
        let batch = pipeline.batch(id);
        let counted = batch.effective().get(&EventType::new("Pages_Counted").unwrap()).cloned().expect("counted");
        assert_eq!(counted.details["result"], serde_json::json!({"pages": 412}));
        let read = batch.effective().get(&EventType::new("Pages_Read").unwrap()).cloned().expect("read");
        assert_eq!(read.details["result"], serde_json::json!({"pages_seen": 412}), "{:#}", read.details);
    }
    // `show` displays it, as text and as JSON.
    let mut show = Command::new(binary("autocomp"));
    show.arg("--config-dir").arg(pipeline.config_dir()).args(["show", ids[0].as_str()]);
    let shown = run(pipeline_env(show));
    assert!(stdout(&shown).contains(r#"result {"pages":412}"#), "{}", text(&shown));
}

/// The token the test services want, and no stray backend variables.
fn pipeline_env(command: Command) -> Command {
    let mut command = clean(command);
    command.env("AUTOCOMP_TOKEN", autocomp_e2e::services::TOKEN);
    command
}

#[test]
fn a_structured_result_is_read_typed_by_the_next_component_in_the_embedded_store() {
    a_result_is_read_typed_by_the_next_step(&Pipeline::new(PROBE));
}

#[test]
fn a_structured_result_is_read_typed_by_the_next_component_over_the_store_service() {
    let pipeline = Pipeline::new(PROBE);
    let service = Service::store(&pipeline.path("store.db"), &pipeline.path(""));
    pipeline.use_backend("store", &service.url());
    a_result_is_read_typed_by_the_next_step(&pipeline);
}

#[test]
fn a_transient_failure_in_its_backoff_shows_as_retrying() {
    let pipeline = Pipeline::new(PROBE);
    pipeline.configure("retry_backoff = \"1h\"\n\n[settings]\nbehaviour = \"transient\"\ntransient_failures = 5\n");
    let id = pipeline.register(1).remove(0);
    let failed = pipeline.run(&[]);
    assert_eq!(failed.code, Some(1), "{}", failed.show());
    let autocomp = |args: &[&str]| {
        let mut command = Command::new(binary("autocomp"));
        command.arg("--config-dir").arg(pipeline.config_dir()).args(args);
        run(pipeline_env(command))
    };
    assert_eq!(states(&autocomp(&["status", "--format", "json"]))[id.as_str()]["probe"], "retrying");
    let csv = stdout(&autocomp(&["status", "--format", "csv"]));
    assert!(csv.lines().any(|l| l == format!("{id},retrying")), "{csv}");
    let table = stdout(&autocomp(&["status", "--state", "retrying"]));
    assert!(table.contains(id.as_str()), "{table}");
    let explained = stdout(&autocomp(&["explain", id.as_str(), "--component", "probe"]));
    assert!(explained.contains("retrying: its transient failure (seq "), "{explained}");
    assert!(explained.contains("retries used since the last reset: 1 of max_attempts 3"), "{explained}");
}

#[test]
fn a_second_component_recording_the_same_event_type_is_refused_before_it_works() {
    let pipeline = Pipeline::new(PROBE);
    pipeline.register(1);
    assert_eq!(pipeline.run(&[]).code, Some(0));
    let id = pipeline.register_one("B9999", true);
    let mut copy = pipeline.command(&[]);
    copy.env("PROBE_NAME", "probe-copy");
    let refused = finish(copy.spawn().unwrap(), Duration::from_secs(30));
    assert_eq!(refused.code, Some(2), "{}", refused.show());
    assert!(refused.stderr.contains("Probed") && refused.stderr.contains("probe"), "{}", refused.show());
    assert!(pipeline.batch(&id).events.iter().all(|e| e.event_type.as_str() != "Probed"), "it recorded nothing");
    assert!(pipeline.open_runs().is_empty(), "its claims were released");
}

#[test]
fn the_operator_name_falls_back_to_the_login_name_when_user_is_unset() {
    let pipeline = Pipeline::new(PROBE);
    let id = pipeline.register(1).remove(0);
    assert_eq!(pipeline.run(&[]).code, Some(0));
    let mut command = Command::new(binary("autocomp"));
    command.arg("--config-dir").arg(pipeline.config_dir());
    command.args(["event", id.as_str(), "--type", "Data_Received", "--outcome", "success", "--reason", "cron job"]);
    let mut command = pipeline_env(command);
    command.env_remove("USER").env_remove("LOGNAME");
    let recorded = run(command);
    assert!(recorded.code == Some(0), "exit 0 without $USER: {}", text(&recorded));
    let login = Command::new("id").arg("-un").output().unwrap();
    let login = String::from_utf8_lossy(&login.stdout).trim().to_owned();
    let last = pipeline.batch(&id).events.last().cloned().unwrap();
    assert_eq!(last.agent.as_str(), format!("operator:{login}"));
}

#[test]
fn a_scheduled_component_is_silent_by_missed_passes_not_by_age() {
    let pipeline = Pipeline::new(PROBE);
    // A schedule that is not a crontab line is refused, naming the field and the value.
    pipeline.configure("schedule = \"every five minutes\"\n");
    let refused = pipeline.run(&[]);
    assert_eq!(refused.code, Some(2), "{}", refused.show());
    assert!(refused.stderr.contains("schedule") && refused.stderr.contains("every five minutes"), "{}", refused.show());

    // Declared, it is recorded with the component: readers count its missed passes instead
    // of timing it, so a --silent-after of one second says nothing about it.
    pipeline.configure("schedule = \"0 0 1 1 *\"\n");
    let pass = pipeline.run(&[]);
    assert_eq!(pass.code, Some(0), "{}", pass.show());
    let listed = autocomp_on(&pipeline, &["pipeline", "--format", "json"]);
    assert!(listed.stdout.contains("\"schedule\": \"0 0 1 1 *\""), "{}", text(&listed));
    let last_pass_age = |metrics: &Finished| -> f64 {
        let prefix = "autocomp_last_pass_age_seconds{component=\"probe\"} ";
        let line = metrics.stdout.lines().find(|l| l.starts_with(prefix)).expect("the probe's last pass age");
        line[prefix.len()..].parse().unwrap()
    };
    let mut metrics = autocomp_on(&pipeline, &["metrics"]);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    autocomp_e2e::wait_until(deadline, || {
        metrics = autocomp_on(&pipeline, &["metrics"]);
        last_pass_age(&metrics) > 1.0
    });
    assert!(last_pass_age(&metrics) > 1.0, "{}", text(&metrics));
    let quiet = autocomp_on(&pipeline, &["alerts", "--silent-after", "1s"]);
    assert_eq!((quiet.code, quiet.stdout.as_str()), (Some(0), ""), "{}", text(&quiet));
    assert!(metrics.stdout.contains("autocomp_missed_passes{component=\"probe\"} 0\n"), "{}", text(&metrics));
    assert!(!metrics.stdout.contains("autocomp_silent_after_seconds{component=\"probe\"}"), "{}", text(&metrics));
}

/// `autocomp --config-dir <pipeline>/config ARGS`, as cron would run it.
fn autocomp_on(pipeline: &Pipeline, args: &[&str]) -> Finished {
    let mut command = Command::new(binary("autocomp"));
    command.arg("--config-dir").arg(pipeline.config_dir()).args(args);
    run(clean(command))
}

/// Runs `autocomp alerts ARGS` until it exits 1 (it printed something), with a deadline;
/// every answer before that must be the quiet one (exit 0, nothing printed).
fn first_alert(pipeline: &Pipeline, args: &[&str]) -> Finished {
    let mut last = None;
    autocomp_e2e::wait_until(std::time::Instant::now() + Duration::from_secs(30), || {
        let alerts = autocomp_on(pipeline, &[&["alerts"], args].concat());
        if alerts.code != Some(1) {
            assert_eq!((alerts.code, alerts.stdout.as_str()), (Some(0), ""), "{}", text(&alerts));
        }
        last = Some(alerts);
        last.as_ref().is_some_and(|alerts| alerts.code == Some(1))
    });
    let last = last.expect("alerts ran at least once");
    assert_eq!(last.code, Some(1), "no alert within 30 s: {}", text(&last));
    last
}

#[test]
fn alerts_print_only_what_needs_a_person_and_exit_1_when_they_do() {
    let pipeline = Pipeline::new(PROBE);
    pipeline.register(2);
    let pass = pipeline.run(&[]);
    assert_eq!(pass.code, Some(0), "{}", pass.show());

    // Nothing overdue, nothing silent: not a byte, exit 0 (cron mails nothing).
    let quiet = autocomp_on(&pipeline, &["alerts"]);
    assert_eq!((quiet.code, quiet.stdout.as_str(), quiet.stderr.as_str()), (Some(0), "", ""), "{}", text(&quiet));

    // The component stops: once no host has run it for longer than the threshold, it is news.
    let silent = first_alert(&pipeline, &["--silent-after", "1s"]);
    assert!(silent.stdout.starts_with("probe: no pass on any host for "), "{}", text(&silent));
    assert_eq!(silent.stdout.lines().count(), 1, "one line per alert: {}", text(&silent));
    let as_json = autocomp_on(&pipeline, &["alerts", "--silent-after", "1s", "--format", "json"]);
    assert_eq!(as_json.code, Some(1), "{}", text(&as_json));
    let alerts: Value = serde_json::from_str(&as_json.stdout).unwrap();
    assert_eq!((alerts[0]["kind"].as_str(), alerts[0]["component"].as_str()), (Some("silent"), Some("probe")));
    assert!(alerts[0]["message"].as_str().unwrap().starts_with("probe: no pass"), "{alerts}");

    // The component's own thresholds win over the flags: silent after an hour, but batches
    // ready for more than a second are overdue.
    pipeline.configure("silent_after = \"1h\"\noverdue_after = \"1s\"\n");
    let idle = pipeline.run(&[]);
    assert_eq!(idle.code, Some(0), "{}", idle.show());
    pipeline.register_one("LATE1", true);
    let overdue = first_alert(&pipeline, &["--silent-after", "1s"]);
    assert!(
        overdue.stdout.starts_with("probe: 1 batch ready for longer than 1s, the oldest for "),
        "{}",
        text(&overdue)
    );
    assert!(!overdue.stdout.contains("no pass"), "its own silent_after (1h) wins: {}", text(&overdue));
}
