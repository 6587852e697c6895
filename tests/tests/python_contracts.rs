//! The contract between two Python steps made by `autocomp new --lang python`, through the
//! real binaries as an author and an operator meet it: a producer publishes its result's
//! schema, a reader declares what it reads of it; a deliberate break (the producer renames
//! the field, a new version) is seen before any work in `explain`, `ready`, the reader's
//! `--dry-run`, `alerts`, the metrics, `status` and the registry; a watching reader stays up
//! through it and resumes by itself once the producer is mended; the results recorded under
//! the broken schema are refused by the reader (naming the rerun) and marked by `show`, and a
//! restart refreshes them. A pass its configuration refuses is in the registry too.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use autocomp_e2e::{Finished, binary, finish, wait_until};
use autocomp_framework::testing::TempPipeline;
use autocomp_model::Outcome;

/// A step as `autocomp new --lang python` wrote it.
struct Step {
    name: &'static str,
    event_type: &'static str,
    requires: &'static str,
    script: PathBuf,
    schema: PathBuf,
    /// `TYPE=FILE`: what it declares it reads.
    reads: String,
}

fn scaffold(dir: &Path, name: &'static str, event_type: &'static str, requires: &'static str) -> Step {
    let into = dir.join(name);
    let made = Command::new(binary("autocomp"))
        .args(["new", name, "--lang", "python", "--event-type", event_type, "--requires", requires, "--dir"])
        .arg(&into)
        .env_remove("AUTOCOMP_CONFIG_DIR")
        .output()
        .expect("autocomp new runs");
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    let stem = name.replace('-', "_");
    Step {
        name,
        event_type,
        requires,
        script: into.join(format!("{stem}.py")),
        schema: into.join(format!("{stem}.result.json")),
        reads: format!("{requires}={}", into.join(format!("{stem}.reads.{requires}.json")).display()),
    }
}

impl Step {
    /// Its pass as the README's crontab line runs it, with `flags` before `--` and `after`
    /// after the step file.
    fn command(&self, pipeline: &TempPipeline, flags: &[&str], after: &[&str]) -> Command {
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace holds tests/");
        let mut exec = pipeline.command(&binary("autocomp-exec"));
        exec.args(["--name", self.name, "--event-type", self.event_type, "--requires", self.requires])
            .arg("--result-schema")
            .arg(&self.schema)
            .args(["--reads", &self.reads])
            .args(flags)
            .arg("--")
            .arg("python3")
            .arg(&self.script)
            .args(after)
            .env("PYTHONPATH", workspace.join("contrib/python"))
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        exec
    }

    fn pass(&self, pipeline: &TempPipeline, flags: &[&str]) -> Finished {
        finish(self.command(pipeline, flags, &[]).spawn().expect("autocomp-exec starts"), Duration::from_secs(60))
    }

    /// Edits the step file and its schema as an author would, `from` to `to` in both.
    fn rename_field(&self, from: &str, to: &str, version: &str) {
        let script = std::fs::read_to_string(&self.script).unwrap();
        let renamed = script.replace(&format!("\"{from}\": files"), &format!("\"{to}\": files"));
        assert_ne!(script, renamed, "the step records {from}");
        let versioned = with_version(&renamed, version);
        std::fs::write(&self.script, versioned).unwrap();
        let schema = std::fs::read_to_string(&self.schema).unwrap();
        std::fs::write(&self.schema, schema.replace(&format!("\"{from}\""), &format!("\"{to}\""))).unwrap();
    }
}

/// The step file with its `__version__` line set to `version`.
fn with_version(script: &str, version: &str) -> String {
    script
        .lines()
        .map(
            |line| {
                if line.starts_with("__version__ = ") { format!("__version__ = \"{version}\"") } else { line.into() }
            },
        )
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

fn autocomp(pipeline: &TempPipeline, args: &[&str]) -> String {
    let output = pipeline.autocomp(&binary("autocomp"), args);
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.code().is_some_and(|code| code <= 1), "autocomp {args:?}: {text}");
    text
}

/// A delivery of two files.
fn deliver(pipeline: &TempPipeline, id: &str) {
    let dir = pipeline.root().join("deliveries").join(id);
    std::fs::create_dir_all(&dir).unwrap();
    for name in ["page-1.tif", "page-2.tif"] {
        std::fs::write(dir.join(name), name).unwrap();
    }
    pipeline.add_batch(id, &dir);
}

#[test]
fn a_renamed_field_is_seen_everywhere_before_any_work_and_mended_without_a_restart_loop() {
    let steps = tempfile::tempdir().unwrap();
    let producer = scaffold(steps.path(), "files-listed", "Files_Listed", "Data_Received");
    let reader = scaffold(steps.path(), "files-copied", "Files_Copied", "Files_Listed");
    // The reader's author declares the field it reads.
    let declared = r#"{"type": "object", "properties": {"files": {"type": "integer"}}, "required": ["files"]}"#;
    std::fs::write(reader.reads.split_once('=').unwrap().1, declared).unwrap();
    let pipeline = TempPipeline::new();
    deliver(&pipeline, "B1");

    assert_eq!(producer.pass(&pipeline, &[]).code, Some(0));
    let listed = pipeline.event("B1", "Files_Listed").expect("B1 listed");
    let schema: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&producer.schema).unwrap()).unwrap();
    assert_eq!(listed.details["result_schema"], autocomp_model::schema_digest(&schema), "made under its schema");
    assert!(listed.agent.as_str().starts_with("files-listed/1.0.0@"), "{listed:?}");
    assert_eq!(reader.pass(&pipeline, &[]).code, Some(0));
    let copied = pipeline.event("B1", "Files_Copied").expect("B1 copied");
    assert_eq!(copied.details["result"]["earlier"]["Files_Listed"]["files"], 2, "{copied:?}");

    // The deliberate break: the producer's 1.1.0 records file_count instead of files.
    producer.rename_field("files", "file_count", "1.1.0");
    deliver(&pipeline, "B2");
    assert_eq!(producer.pass(&pipeline, &[]).code, Some(0));
    assert!(pipeline.event("B2", "Files_Listed").unwrap().details["result"]["file_count"].is_number());

    // Seen in every view before any work of the reader.
    let broken = "contract broken: files-copied 1.0.0 reads Files_Listed's result expecting files (integer, required), \
                  but files-listed 1.1.0 publishes no files (renamed or removed?)";
    let explained = autocomp(&pipeline, &["explain", "B2", "--component", "files-copied"]);
    assert!(
        explained.contains("B2 for files-copied (records Files_Copied): ready, but refused (contract broken)"),
        "{explained}"
    );
    assert!(
        explained.contains(&format!("refused: every pass of files-copied stops before any work, {broken}")),
        "{explained}"
    );
    let ready = autocomp(&pipeline, &["ready", "--component", "files-copied"]);
    assert!(
        ready.contains(&format!("files-copied would claim nothing: every pass stops before any work, {broken}")),
        "{ready}"
    );
    let dry = reader.pass(&pipeline, &["--dry-run"]);
    assert_eq!(dry.code, Some(2), "{}", dry.show());
    assert!(
        dry.stderr.contains(&format!("dry run: claiming nothing: a pass would not start: {broken}")),
        "{}",
        dry.show()
    );
    // A dry run meant, written after `--`, runs nothing.
    let misplaced = finish(reader.command(&pipeline, &[], &["--dry-run"]).spawn().unwrap(), Duration::from_secs(60));
    assert_eq!(misplaced.code, Some(2), "{}", misplaced.show());
    assert!(misplaced.stderr.contains("`--dry-run` comes after `--`"), "{}", misplaced.show());
    let alerts = autocomp(&pipeline, &["alerts"]);
    assert!(alerts.contains(&format!("files-copied: every pass stops before any work (exit 2), {broken}")), "{alerts}");
    let metrics = autocomp(&pipeline, &["metrics"]);
    assert!(metrics.contains("autocomp_contract_broken{component=\"files-copied\"} 1\n"), "{metrics}");
    let status = autocomp(&pipeline, &["status"]);
    assert!(
        status.contains("refused (no pass starts; the batches ready for it stay ready):\n  files-copied: "),
        "{status}"
    );
    let refused = reader.pass(&pipeline, &[]);
    assert_eq!(refused.code, Some(2), "{}", refused.show());
    assert!(pipeline.events("B2", "Files_Copied").is_empty(), "no work under a broken contract");
    let registry = autocomp(&pipeline, &["pipeline", "--format", "json"]);
    assert!(registry.contains(&format!("not started: {broken}")), "the refused pass is in the registry: {registry}");

    // A watching reader stays up through it: it reports a refused pass after the producer's
    // next one, and is still running.
    let reader_seen = || {
        let json: serde_json::Value =
            serde_json::from_str(&autocomp(&pipeline, &["pipeline", "--format", "json"])).unwrap();
        let components = json["components"].as_array().cloned().unwrap_or_default();
        let reader = components.into_iter().find(|c| c["descriptor"]["name"] == "files-copied").unwrap_or_default();
        reader["last_seen"].as_str().map(str::to_owned)
    };
    let before_watching = reader_seen();
    let mut watch = reader.command(&pipeline, &["--watch"], &[]);
    let watcher = watch.spawn().expect("the watcher starts");
    let watcher_pid = watcher.id();
    let watched = std::thread::spawn(move || finish(watcher, Duration::from_secs(120)));
    // Its first pass is refused and reported before the producer's: a retry woken by the
    // producer's pass could otherwise be over before `listed_at` is read, and none would follow.
    let first_refused = wait_until(Instant::now() + Duration::from_secs(30), || reader_seen() > before_watching);
    assert!(first_refused, "the watcher's first pass is reported");
    let listed_at = reader_seen();
    deliver(&pipeline, "B3");
    assert_eq!(producer.pass(&pipeline, &[]).code, Some(0), "another batch listed under the broken contract");
    let refused_again = wait_until(Instant::now() + Duration::from_secs(30), || reader_seen() > listed_at);
    assert!(refused_again, "the watcher tried again after the producer's pass");
    assert!(!watched.is_finished(), "the watcher stays up through a broken contract");

    // Mended by 1.2.0: the watcher's next pass works by itself, on the new batch, and refuses
    // the two results recorded under 1.1.0, naming the rerun.
    producer.rename_field("file_count", "files", "1.2.0");
    deliver(&pipeline, "B4");
    assert_eq!(producer.pass(&pipeline, &[]).code, Some(0));
    let resumed = wait_until(Instant::now() + Duration::from_secs(30), || {
        ["B2", "B3", "B4"].iter().all(|id| !pipeline.events(id, "Files_Copied").is_empty())
    });
    assert!(resumed, "the watcher resumed once the contract was mended");
    assert_eq!(pipeline.event("B4", "Files_Copied").unwrap().outcome, Outcome::Success);
    let stale = pipeline.event("B2", "Files_Copied").unwrap();
    assert_eq!(stale.details["failures"][0]["type"], "read_schema", "{stale:?}");
    assert_eq!(stale.details["failures"][0]["details"]["next"], "autocomp restart B2 --from Files_Listed --reason ...");
    Command::new("kill").args(["-TERM", &watcher_pid.to_string()]).status().unwrap();
    let watched = watched.join().unwrap();
    assert_eq!(watched.stderr.matches("pass not started; staying up").count(), 1, "said once: {}", watched.show());
    assert!(watched.stderr.contains("passes start again"), "{}", watched.show());

    // Every view names the restart as what fixes it: a rerun of the reader alone would fail
    // on the same result again.
    let restart = "autocomp restart B2 --from Files_Listed --reason ...";
    let shown = autocomp(&pipeline, &["show", "B2"]);
    assert!(shown.contains(&format!("\nnext: {restart}\n")), "{shown}");
    let explained = autocomp(&pipeline, &["explain", "B2", "--component", "files-copied"]);
    assert!(explained.contains(&format!("\nnext: {restart}\n")), "{explained}");
    let failures = autocomp(&pipeline, &["failures", "--component", "files-copied"]);
    assert!(failures.contains("try again:   autocomp restart B"), "{failures}");
    assert!(shown.contains("it was recorded under another schema (sha256:"), "{shown}");

    // show marks the old result with the restart that refreshes it; the restart does.
    let marked = "was made under schema sha256:";
    assert!(shown.contains("\nresults made under an older schema:\n  Files_Listed seq "), "{shown}");
    assert!(shown.contains(marked) && shown.contains("of files-listed (now sha256:"), "{shown}");
    assert!(shown.contains(", files-listed 1.2.0); it does not fit it at the result itself: \"files\" is a required property; files-copied refuses it; records it afresh: autocomp restart B2 --from Files_Listed --reason ..."), "{shown}");
    autocomp(&pipeline, &["--as", "ann", "restart", "B2", "--from", "Files_Listed", "--reason", "refresh"]);
    assert_eq!(producer.pass(&pipeline, &[]).code, Some(0));
    assert_eq!(reader.pass(&pipeline, &[]).code, Some(0));
    assert_eq!(pipeline.event("B2", "Files_Copied").unwrap().outcome, Outcome::Success);
    let refreshed = autocomp(&pipeline, &["show", "B2"]);
    assert!(!refreshed.contains("older schema"), "{refreshed}");
}

/// A misspelt key in a step's file refuses its pass (exit 2), and the registry says why:
/// `autocomp pipeline` names it, not only cron's mail.
#[test]
fn a_pass_its_configuration_refuses_is_in_the_registry_with_the_reason() {
    let steps = tempfile::tempdir().unwrap();
    let producer = scaffold(steps.path(), "files-listed", "Files_Listed", "Data_Received");
    let pipeline = TempPipeline::new();
    deliver(&pipeline, "B1");
    assert_eq!(producer.pass(&pipeline, &[]).code, Some(0));
    pipeline.configure("files-listed", "max_thread = 2\n");
    let refused = producer.pass(&pipeline, &[]);
    assert_eq!(refused.code, Some(2), "{}", refused.show());
    assert!(refused.stderr.contains("max_thread"), "{}", refused.show());
    let registry = autocomp(&pipeline, &["pipeline", "--format", "json"]);
    assert!(registry.contains("not started: ") && registry.contains("max_thread"), "{registry}");
    let listed = autocomp(&pipeline, &["pipeline"]);
    assert!(listed.contains("\nlast passes not started (exit 2):\n  files-listed on "), "{listed}");
    let alerts = autocomp(&pipeline, &["alerts"]);
    assert!(
        alerts.contains("files-listed: its last pass on ") && alerts.contains("did not start (exit 2): "),
        "{alerts}"
    );
    assert!(alerts.contains("max_thread"), "{alerts}");
    let doctor = autocomp(&pipeline, &["doctor"]);
    assert!(doctor.contains("its last pass on ") && doctor.contains(" not started: "), "{doctor}");
    // A dry run tells nothing.
    pipeline.configure("files-listed", "max_threads = 2\n");
    assert_eq!(producer.pass(&pipeline, &[]).code, Some(0), "mended");
    pipeline.configure("files-listed", "max_thread = 2\n");
    assert_eq!(producer.pass(&pipeline, &["--dry-run"]).code, Some(2));
    let after_dry = autocomp(&pipeline, &["pipeline", "--format", "json"]);
    assert!(!after_dry.contains("not started: "), "{after_dry}");
}
