//! The `autocomp` operator CLI against real processes: the `autocomp` binary
//! acting on a store that real component processes (the probe component, in three roles)
//! work on, and on the demo's pipeline. Each action's effect on readiness, cancellation of
//! a running worker, the history only growing, parseable JSON and CSV, and input errors
//! that name the field and change nothing. Honest actions: skip over a success and cancel
//! with no run refused unless forced; scripts guarded by --expect-version and --key.

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use autocomp_e2e::{Finished, PROBED, Pipeline, binary, finish, wait_until, without_pipeline_env};
use autocomp_model::{Agent, ComponentName, Event, Outcome, RunHolder};
use autocomp_store::prelude::*;
use serde_json::Value;

const PROBE: &str = env!("CARGO_BIN_EXE_probe-component");
const OPERATOR: &str = "tester";

/// The test pipeline: the probe binary as three components.
/// `probe` records Probed after Data_Received; `checker` (Checked) and `auditor` (Audited)
/// each run after Probed.
const COMPONENTS: [(&str, &str, &str); 3] =
    [("probe", "Probed", "Data_Received"), ("checker", "Checked", "Probed"), ("auditor", "Audited", "Probed")];

fn role(name: &str) -> (&'static str, &'static str, &'static str) {
    *COMPONENTS.iter().find(|(n, _, _)| *n == name).expect("a component of the test pipeline")
}

/// Writes `config/<name>.toml`: event type, trigger, probe settings.
fn configure(pipeline: &Pipeline, name: &str, settings: &str) {
    let (_, event_type, requires) = role(name);
    let text = format!(
        "event_type = \"{event_type}\"\n\n[trigger]\nrequires = [\"{requires}\"]\nblocked_by = [\"{event_type}\"]\n\n\
         [settings]\n{settings}\n"
    );
    std::fs::write(pipeline.config_dir().join(format!("{name}.toml")), text).unwrap();
}

/// The pipeline with each component registered by an idle first pass, as after deployment:
/// the CLI knows the pipeline from the registry, not from these files.
fn new_pipeline() -> Pipeline {
    let pipeline = Pipeline::new(PROBE);
    for (name, _, _) in COMPONENTS {
        configure(&pipeline, name, "");
        let idle = pass(&pipeline, name);
        assert_eq!((idle.code, idle.stdout.as_str()), (Some(0), ""), "{}", idle.show());
    }
    pipeline
}

/// One pass of a component of the test pipeline, as cron would start it.
fn pass(pipeline: &Pipeline, name: &str) -> Finished {
    finish(component(pipeline, name).spawn().unwrap(), Duration::from_secs(30))
}

fn component(pipeline: &Pipeline, name: &str) -> Command {
    let (name, event_type, requires) = role(name);
    let mut command = pipeline.command(&[]);
    command.env("PROBE_NAME", name).env("PROBE_EVENT_TYPE", event_type).env("PROBE_REQUIRES", requires);
    command
}

/// Runs `autocomp --config-dir <pipeline> --as tester ARGS`, none of the environment that
/// would change what it does.
fn autocomp_in(config_dir: &std::path::Path, args: &[&str]) -> Finished {
    let mut command = Command::new(binary("autocomp"));
    command.arg("--config-dir").arg(config_dir).args(["--as", OPERATOR]).args(args);
    without_pipeline_env(&mut command).env_remove("USER");
    command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    finish(command.spawn().expect("autocomp starts"), Duration::from_secs(60))
}

fn autocomp(pipeline: &Pipeline, args: &[&str]) -> Finished {
    autocomp_in(&pipeline.config_dir(), args)
}

/// An action that must succeed; returns its output.
fn act(pipeline: &Pipeline, args: &[&str]) -> Finished {
    let before = history(pipeline);
    let done = autocomp(pipeline, args);
    assert_eq!(done.code, Some(0), "autocomp {args:?}\n{}", done.show());
    assert_history_grew(&before, &history(pipeline));
    done
}

fn json(done: &Finished) -> Value {
    serde_json::from_str(&done.stdout).unwrap_or_else(|e| panic!("not JSON ({e}):\n{}", done.show()))
}

/// `status --format json` as {batch: {component: state}}.
fn states(pipeline: &Pipeline) -> BTreeMap<String, BTreeMap<String, String>> {
    let done = autocomp(pipeline, &["status", "--format", "json"]);
    assert_eq!(done.code, Some(0), "{}", done.show());
    json(&done)
        .as_array()
        .expect("an array")
        .iter()
        .map(|row| {
            let components = row["components"].as_object().expect("components").iter();
            let states = components.map(|(name, state)| (name.clone(), state.as_str().unwrap().to_owned())).collect();
            (row["id"].as_str().unwrap().to_owned(), states)
        })
        .collect()
}

/// One batch's states in pipeline order: probe, checker, auditor.
fn row(pipeline: &Pipeline, id: &str) -> [String; 3] {
    let states = states(pipeline);
    let row = &states[id];
    COMPONENTS.map(|(name, _, _)| row[name].clone())
}

/// Every batch's log.
fn history(pipeline: &Pipeline) -> BTreeMap<String, Vec<Event>> {
    pipeline.all_batches().into_iter().map(|b| (b.id.to_string(), b.events)).collect()
}

/// History only grows: every earlier event is still there, unchanged, in the same place.
fn assert_history_grew(before: &BTreeMap<String, Vec<Event>>, after: &BTreeMap<String, Vec<Event>>) {
    for (id, events) in before {
        let now = after.get(id).unwrap_or_else(|| panic!("batch {id} vanished"));
        assert!(now.len() >= events.len(), "{id} lost events: {} -> {}", events.len(), now.len());
        assert_eq!(&now[..events.len()], &events[..], "{id}: earlier events changed");
    }
}

fn ready_ids(pipeline: &Pipeline, name: &str) -> Vec<String> {
    let done = autocomp(pipeline, &["ready", "--component", name, "--format", "json"]);
    assert_eq!(done.code, Some(0), "{}", done.show());
    json(&done)
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["would_claim"] == true)
        .map(|c| c["id"].as_str().unwrap().to_owned())
        .collect()
}

fn strings(names: &[&str]) -> [String; 3] {
    [names[0].to_owned(), names[1].to_owned(), names[2].to_owned()]
}

#[test]
fn rerun_makes_exactly_that_component_ready_again() {
    let pipeline = new_pipeline();
    pipeline.register(2);
    for name in ["probe", "checker", "auditor"] {
        assert_eq!(pass(&pipeline, name).code, Some(0));
    }
    for id in ["B0001", "B0002"] {
        assert_eq!(row(&pipeline, id), strings(&["success", "success", "success"]));
    }

    let done = act(&pipeline, &["rerun", "B0001", "--component", "checker", "--reason", "re-check after a fix"]);
    assert!(done.stdout.contains("checker: success -> ready"), "{}", done.show());
    assert_eq!(row(&pipeline, "B0001"), strings(&["success", "ready", "success"]));
    assert_eq!(row(&pipeline, "B0002"), strings(&["success", "success", "success"]));
    assert_eq!(ready_ids(&pipeline, "checker"), ["B0001"]);
    assert!(ready_ids(&pipeline, "probe").is_empty() && ready_ids(&pipeline, "auditor").is_empty());

    let reset = pipeline.batch(&"B0001".parse().unwrap()).events.pop().unwrap();
    assert!(reset.event_type.is_reset(), "{reset:?}");
    assert_eq!(reset.resets.iter().map(|t| t.as_str()).collect::<Vec<_>>(), ["Checked"]);
    assert_eq!(reset.agent.as_str(), "operator:tester");
    assert_eq!(reset.details["reason"], "re-check after a fix");

    // The next checker pass does exactly that batch; the others find nothing.
    let again = pass(&pipeline, "checker");
    assert_eq!(again.code, Some(0), "{}", again.show());
    assert_eq!(again.stdout.lines().collect::<Vec<_>>().len(), 1, "{}", again.show());
    assert!(again.stdout.starts_with("B0001 Checked success"), "{}", again.show());
    for name in ["probe", "auditor"] {
        assert_eq!(pass(&pipeline, name).stdout, "");
    }
    assert_eq!(row(&pipeline, "B0001"), strings(&["success", "success", "success"]));
    let checked = pipeline.events(&"B0001".parse().unwrap(), "Checked");
    assert_eq!(checked.len(), 2, "both results stay in the log: {checked:?}");

    // Nothing to rerun on a component with no result: refused, nothing written.
    pipeline.register_one("B0003", true);
    let head = pipeline.head();
    let refused = autocomp(&pipeline, &["rerun", "B0003", "--component", "checker", "--reason", "x"]);
    assert_eq!(refused.code, Some(1), "{}", refused.show());
    assert!(refused.stderr.contains("no Checked result"), "{}", refused.show());
    assert_eq!(pipeline.head(), head);
}

#[test]
fn restart_from_first_failure_retriggers_the_failed_step_and_all_later_ones() {
    let pipeline = new_pipeline();
    pipeline.register(1);
    configure(&pipeline, "checker", "behaviour = \"fail\"");
    assert_eq!(pass(&pipeline, "probe").code, Some(0));
    assert_eq!(pass(&pipeline, "checker").code, Some(1));
    assert_eq!(pass(&pipeline, "auditor").code, Some(0));
    assert_eq!(row(&pipeline, "B0001"), strings(&["success", "failed", "success"]));

    let done = act(&pipeline, &["restart", "B0001", "--from-first-failure", "--reason", "checker fixed"]);
    assert!(done.stdout.contains("Checked, Audited"), "{}", done.show());
    assert_eq!(row(&pipeline, "B0001"), strings(&["success", "ready", "ready"]));
    let shown = json(&autocomp(&pipeline, &["show", "B0001", "--format", "json"]));
    let last = shown["events"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["type"], "Reset");
    assert_eq!(last["resets"], serde_json::json!(["Checked", "Audited"]));
    assert_eq!(last["details"]["from"], "Checked");

    configure(&pipeline, "checker", "");
    assert_eq!(pass(&pipeline, "checker").code, Some(0));
    assert_eq!(pass(&pipeline, "auditor").code, Some(0));
    assert_eq!(row(&pipeline, "B0001"), strings(&["success", "success", "success"]));

    // From a type: it and everything recorded after it.
    act(&pipeline, &["restart", "B0001", "--from", "Probed", "--reason", "new probe version"]);
    assert_eq!(row(&pipeline, "B0001"), strings(&["ready", "waiting", "waiting"]));
    assert_eq!(pass(&pipeline, "probe").code, Some(0));
    assert_eq!(row(&pipeline, "B0001"), strings(&["success", "ready", "ready"]));

    // With no failure left there is nothing to restart from.
    let head = pipeline.head();
    let refused = autocomp(&pipeline, &["restart", "B0001", "--from-first-failure", "--reason", "x"]);
    assert_eq!(refused.code, Some(1), "{}", refused.show());
    assert!(refused.stderr.contains("no failed step"), "{}", refused.show());
    assert_eq!(pipeline.head(), head);
}

#[test]
fn cancel_stops_the_running_worker_and_leaves_only_the_cancelled_failure() {
    let pipeline = new_pipeline();
    let id = pipeline.register(1).remove(0);
    let started = pipeline.path("started");
    std::fs::create_dir_all(&started).unwrap();
    configure(&pipeline, "probe", &format!("work_time = \"30s\"\nstarted = \"{}\"", started.display()));

    let mut worker = component(&pipeline, "probe").spawn().unwrap();
    let working = wait_until(Instant::now() + Duration::from_secs(15), || {
        std::fs::read_dir(&started).unwrap().next().is_some() && !pipeline.open_runs().is_empty()
    });
    if !working {
        worker.kill().ok();
        panic!("the probe never started working");
    }
    let run = pipeline.open_runs().remove(0);

    // What an operator sees while it works.
    assert_eq!(row(&pipeline, "B0001")[0], "working");
    let locks = autocomp(&pipeline, &["locks"]);
    assert_eq!(locks.code, Some(0), "{}", locks.show());
    let line =
        locks.stdout.lines().find(|l| l.starts_with("batch/probe/B0001")).unwrap_or_else(|| panic!("{}", locks.show()));
    assert!(line.contains(run.holder.agent.as_str()), "{}", locks.show());
    let listed = json(&autocomp(&pipeline, &["locks", "--format", "json"]));
    assert!(listed.as_array().unwrap().iter().any(|l| l["path"] == "poll/probe" || l["path"] == "batch/probe/B0001"));
    assert_eq!(autocomp(&pipeline, &["locks", "--stale", "1h"]).stdout, "", "nothing is an hour old");
    let stale = autocomp(&pipeline, &["locks", "--stale", "0s"]);
    assert!(stale.stdout.contains("batch/probe/B0001"), "{}", stale.show());
    let explained = json(&autocomp(&pipeline, &["explain", "B0001", "--component", "probe", "--format", "json"]));
    assert_eq!(explained["state"], "working");
    assert_eq!(explained["open_run"]["generation"], run.generation);
    assert_eq!(explained["batch_lock"]["agent"], run.holder.agent.as_str());
    let text = autocomp(&pipeline, &["explain", "B0001", "--component", "probe"]).stdout;
    assert!(text.contains("open run: generation") && text.contains("held by probe/"), "{text}");
    // Results that would race the worker are refused while it works.
    let head = pipeline.head();
    let refused = autocomp(&pipeline, &["skip", "B0001", "--component", "probe", "--reason", "x"]);
    assert_eq!(refused.code, Some(1), "{}", refused.show());
    assert!(refused.stderr.contains("probe is working on B0001"), "{}", refused.show());
    assert_eq!(pipeline.head(), head);

    let cancelled_at = Instant::now();
    let done = act(&pipeline, &["cancel", "B0001", "--component", "probe", "--reason", "wrong delivery"]);
    assert!(done.stdout.contains(&format!("cancelled run {}", run.generation)), "{}", done.show());
    let worker = finish(worker, Duration::from_secs(20));
    let took = cancelled_at.elapsed();
    assert!(took < Duration::from_secs(6), "the worker ran on for {took:?} after the cancel\n{}", worker.show());
    // Its result was refused (fenced): exit 1, no summary line; its log says an operator
    // cancelled it, not that another worker took it over.
    assert_eq!(worker.code, Some(1), "{}", worker.show());
    assert_eq!(worker.stdout, "", "{}", worker.show());
    assert!(worker.stderr.contains("an operator cancelled this run"), "{}", worker.show());
    assert!(!worker.stderr.contains("another worker"), "{}", worker.show());

    let probed = pipeline.events(&id, PROBED);
    assert_eq!(probed.len(), 1, "exactly one result: {probed:?}");
    assert_eq!(probed[0].outcome, Outcome::Failure);
    assert!(probed[0].flag("cancelled"), "{:?}", probed[0].details);
    assert_eq!(probed[0].agent.as_str(), "operator:tester");
    assert_eq!(probed[0].details["reason"], "wrong delivery");
    assert_eq!(probed[0].details["cancelled_run"]["generation"], run.generation);
    assert!(pipeline.open_runs().is_empty());
    assert!(pipeline.lock_files().is_empty(), "{:?}", pipeline.lock_files());
    assert_eq!(pipeline.failed_attempts(&id), 0, "a cancel is not a failed attempt");
    assert_eq!(row(&pipeline, "B0001")[0], "failed");
    assert_eq!(pass(&pipeline, "probe").stdout, "", "a cancelled batch stays cancelled until a rerun");

    // No worker now: nothing to cancel, refused, nothing written; asked to, it records the
    // cancelled failure anyway and says so.
    let head = pipeline.head();
    let refused = autocomp(&pipeline, &["cancel", "B0001", "--component", "probe", "--reason", "still wrong"]);
    assert_eq!(refused.code, Some(1), "{}", refused.show());
    assert!(
        refused.stderr.contains(
            "probe has no open run on B0001: nothing to cancel; --record-anyway records a cancelled failure anyway"
        ),
        "{}",
        refused.show()
    );
    assert_eq!(pipeline.head(), head);
    let again =
        act(&pipeline, &["cancel", "B0001", "--component", "probe", "--reason", "still wrong", "--record-anyway"]);
    assert!(again.stdout.contains("probe had no open run; recorded anyway as asked"), "{}", again.show());
    assert!(again.stdout.contains("recorded Probed (seq "), "{}", again.show());
    assert_eq!(pipeline.events(&id, PROBED).len(), 2);

    // A rerun makes it ready again, and the next pass does it.
    act(&pipeline, &["rerun", "B0001", "--component", "probe", "--reason", "redelivered"]);
    configure(&pipeline, "probe", "");
    let next = pass(&pipeline, "probe");
    assert!(next.stdout.starts_with("B0001 Probed success"), "{}", next.show());
}

#[test]
fn skip_lets_the_next_component_run() {
    let pipeline = new_pipeline();
    let id = pipeline.register(1).remove(0);
    assert_eq!(row(&pipeline, "B0001"), strings(&["ready", "waiting", "waiting"]));

    let done = act(&pipeline, &["skip", "B0001", "--component", "probe", "--reason", "probed by hand"]);
    assert!(done.stdout.contains("probe: ready -> skipped"), "{}", done.show());
    assert!(done.stdout.contains("checker: waiting -> ready"), "{}", done.show());
    let probed = pipeline.events(&id, PROBED);
    assert_eq!(probed.len(), 1);
    assert_eq!(probed[0].outcome, Outcome::Success);
    assert!(probed[0].flag("skipped"), "{:?}", probed[0].details);

    assert_eq!(pass(&pipeline, "probe").stdout, "", "the skipped component does not run");
    let checker = pass(&pipeline, "checker");
    assert!(checker.stdout.starts_with("B0001 Checked success"), "{}", checker.show());
    assert_eq!(row(&pipeline, "B0001"), strings(&["skipped", "success", "ready"]));

    // Over a success that counts, a skip is refused unless forced.
    let head = pipeline.head();
    let refused = autocomp(&pipeline, &["skip", "B0001", "--component", "checker", "--reason", "x"]);
    assert_eq!(refused.code, Some(1), "{}", refused.show());
    let checked = pipeline.events(&id, "Checked").remove(0).seq;
    for needle in ["checker already succeeded on B0001", &format!("(seq {checked}, by "), "--force skips anyway"] {
        assert!(refused.stderr.contains(needle), "{needle:?}: {}", refused.show());
    }
    assert_eq!(pipeline.head(), head);
    let forced = act(&pipeline, &["skip", "B0001", "--component", "checker", "--reason", "x", "--force"]);
    assert!(forced.stdout.contains(&format!("over checker's success (seq {checked}), as forced")), "{}", forced.show());
}

/// What a script needs to act safely: --dry-run (the plan and the batch's version),
/// --expect-version (refused, exit 2, when the batch moved), --key (a retry writes nothing
/// and says already done), --format json (what was written).
#[test]
fn scripts_act_on_the_version_they_saw_and_retry_with_a_key() {
    let pipeline = new_pipeline();
    let id = pipeline.register(1).remove(0);
    let head = pipeline.head();
    let dry = autocomp(
        &pipeline,
        &["skip", "B0001", "--component", "probe", "--reason", "x", "--dry-run", "--format", "json"],
    );
    assert_eq!(dry.code, Some(0), "{}", dry.show());
    assert_eq!(pipeline.head(), head, "a dry run writes nothing");
    let plan = json(&dry);
    assert_eq!((plan["records"].as_str(), plan["outcome"].as_str()), (Some("Probed"), Some("success")));
    let version = plan["version"].as_i64().expect("a version");
    assert_eq!(version, pipeline.batch(&id).changed_seq.0);
    let text = autocomp(&pipeline, &["skip", "B0001", "--component", "probe", "--reason", "x", "--dry-run"]);
    assert!(text.stdout.contains(&format!("--expect-version {version}")), "{}", text.show());

    // The batch moves (a claim counts): the script's version is refused.
    let skip = |extra: &[&str]| {
        let mut args = vec!["skip", "B0001", "--component", "probe", "--reason", "by hand", "--format", "json"];
        args.extend(extra);
        autocomp(&pipeline, &args)
    };
    let holder = RunHolder {
        agent: Agent::new("checker").unwrap(),
        host: "host1".into(),
        pid: 1,
        claim_key: None,
        liveness: None,
    };
    pipeline.block_on(pipeline.store().claim(&id, &ComponentName::new("checker").unwrap(), &holder)).unwrap();
    let moved = pipeline.batch(&id).changed_seq.0;
    assert!(moved > version);
    let head = pipeline.head();
    let stale = skip(&["--expect-version", &version.to_string()]);
    assert_eq!(stale.code, Some(2), "{}", stale.show());
    assert!(
        stale.stderr.contains("--expect-version") && stale.stderr.contains(&format!("at version {moved} now")),
        "{}",
        stale.show()
    );
    assert_eq!(pipeline.head(), head);

    // With the version it has and a key: done once; the same command again is already done.
    let first = skip(&["--expect-version", &moved.to_string(), "--key", "nightly-2026-01-01-B0001"]);
    assert_eq!(first.code, Some(0), "{}", first.show());
    let answer = json(&first);
    assert_eq!(answer["already_done"], false);
    assert_eq!(
        (answer["event"]["type"].as_str(), answer["event"]["outcome"].as_str()),
        (Some("Probed"), Some("success"))
    );
    assert_eq!(answer["event"]["flags"], serde_json::json!(["skipped"]));
    let seq = answer["event"]["seq"].as_i64().expect("a seq");
    assert_eq!(pipeline.head().0, seq);
    let retry = skip(&["--key", "nightly-2026-01-01-B0001"]);
    assert_eq!(retry.code, Some(0), "{}", retry.show());
    let answer = json(&retry);
    assert_eq!((answer["already_done"].as_bool(), answer["event"]["seq"].as_i64()), (Some(true), Some(seq)));
    assert!(answer["message"].as_str().unwrap().contains(&format!("already done: seq {seq}")), "{answer}");
    assert_eq!(pipeline.head().0, seq, "the retry wrote nothing");
    assert_eq!(pipeline.events(&id, PROBED).len(), 1);
    let text = autocomp(
        &pipeline,
        &["skip", "B0001", "--component", "probe", "--reason", "by hand", "--key", "nightly-2026-01-01-B0001"],
    );
    assert!(text.stdout.starts_with(&format!("B0001: already done: seq {seq} ")), "{}", text.show());
    assert_refused_input(
        &pipeline,
        &["skip", "B0001", "--component", "probe", "--reason", "x", "--key=-no"],
        &["--key", "-no"],
    );
}

#[test]
fn prioritize_changes_the_claim_order_and_is_recorded() {
    let pipeline = new_pipeline();
    pipeline.register(3);
    assert_eq!(ready_ids(&pipeline, "probe"), ["B0001", "B0002", "B0003"]);

    let done = act(&pipeline, &["prioritize", "B0003", "5", "--reason", "the customer is waiting"]);
    assert!(done.stdout.contains("priority 0 -> 5"), "{}", done.show());
    act(&pipeline, &["prioritize", "B0001", "-2", "--reason", "can wait"]);
    assert_eq!(ready_ids(&pipeline, "probe"), ["B0003", "B0002", "B0001"]);

    let shown = json(&autocomp(&pipeline, &["show", "B0003", "--format", "json"]));
    assert_eq!(shown["priority"], 5);
    let last = shown["events"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["type"], "Prioritized");
    assert_eq!(last["agent"], "operator:tester");
    assert_eq!(
        (last["details"]["priority"].clone(), last["details"]["previous_priority"].clone()),
        (5.into(), 0.into())
    );
    assert_eq!(last["details"]["reason"], "the customer is waiting");

    std::fs::write(
        pipeline.config_dir().join("probe.toml"),
        "event_type = \"Probed\"\nqueue_size = 1\n\n\
         [trigger]\nrequires = [\"Data_Received\"]\nblocked_by = [\"Probed\"]\n",
    )
    .unwrap();
    // The CLI knows queue_size from the registry: what the component's last pass reported.
    assert_eq!(ready_ids(&pipeline, "probe"), ["B0003", "B0002", "B0001"], "not passed with queue_size 1 yet");
    let first = pass(&pipeline, "probe");
    assert!(first.stdout.starts_with("B0003 Probed success"), "{}", first.show());
    assert_eq!(first.stdout.lines().count(), 1, "queue_size 1: {}", first.show());
    assert_eq!(ready_ids(&pipeline, "probe"), ["B0002"], "queue_size 1 from the pass's registration");
}

#[test]
fn add_and_event_register_a_batch_by_hand() {
    let pipeline = new_pipeline();
    let location = pipeline.path("incoming/B0042");
    let done = act(
        &pipeline,
        &["add", "B0042", "--type", "RoundTrip", "--priority", "3", "--location", location.to_str().unwrap()],
    );
    assert!(done.stdout.contains("no event recorded"), "{}", done.show());
    let shown = json(&autocomp(&pipeline, &["show", "B0042", "--format", "json"]));
    assert_eq!(
        (shown["id"].clone(), shown["type"].clone(), shown["priority"].clone()),
        ("B0042".into(), "RoundTrip".into(), 3.into())
    );
    assert_eq!(shown["events"], serde_json::json!([]), "add records no event");
    assert_eq!(shown["metadata"]["registered_by"], "operator:tester");
    assert_eq!(shown["location"], location.to_str().unwrap());
    assert_eq!(row(&pipeline, "B0042"), strings(&["waiting", "waiting", "waiting"]));
    let again = act(
        &pipeline,
        &["add", "B0042", "--type", "RoundTrip", "--priority", "3", "--location", location.to_str().unwrap()],
    );
    assert!(again.stdout.contains("nothing changed"), "{}", again.show());

    let head = pipeline.head();
    let event =
        ["event", "B0042", "--type", "Data_Received", "--outcome", "success", "--reason", "delivered by courier"];
    act(&pipeline, &event);
    assert_eq!(pipeline.head().0, head.0 + 1, "one event");
    assert_eq!(row(&pipeline, "B0042"), strings(&["ready", "waiting", "waiting"]));
    let first = pass(&pipeline, "probe");
    assert!(first.stdout.starts_with("B0042 Probed success"), "{}", first.show());
}

/// A command that must stop before writing: exit 2, the message naming each of `expected`,
/// nothing on stdout, the store head unchanged.
fn assert_refused_input(pipeline: &Pipeline, args: &[&str], expected: &[&str]) {
    let head = pipeline.head();
    let done = autocomp(pipeline, args);
    assert_eq!(done.code, Some(2), "autocomp {args:?}\n{}", done.show());
    for text in expected {
        assert!(done.stderr.contains(text), "autocomp {args:?}: the message does not name {text:?}\n{}", done.show());
    }
    assert_eq!(done.stdout, "", "{}", done.show());
    assert_eq!(pipeline.head(), head, "autocomp {args:?} changed the store");
}

#[test]
fn bad_input_exits_2_naming_the_field_and_value_and_writes_nothing() {
    let pipeline = new_pipeline();
    pipeline.register(1);
    let r = ["--reason", "because"];
    let with_reason = |args: &[&'static str]| -> Vec<&'static str> { args.iter().chain(&r).copied().collect() };

    for action in ["rerun", "cancel", "skip"] {
        assert_refused_input(
            &pipeline,
            &with_reason(&[action, "B7777", "--component", "probe"]),
            &["batch id", "B7777"],
        );
        assert_refused_input(&pipeline, &with_reason(&[action, "../x", "--component", "probe"]), &["batch id", "../x"]);
        assert_refused_input(
            &pipeline,
            &with_reason(&[action, "B0001", "--component", "nope"]),
            &["component", "nope"],
        );
        assert_refused_input(&pipeline, &[action, "B0001", "--component", "probe"], &["--reason"]);
        assert_refused_input(&pipeline, &[action, "B0001", "--component", "probe", "--reason", " "], &["--reason"]);
    }
    let event = |t: &'static str| with_reason(&["event", "B0001", "--type", t, "--outcome", "success"]);
    assert_refused_input(&pipeline, &event("Bad-Type"), &["event type", "Bad-Type"]);
    assert_refused_input(&pipeline, &event("Probd"), &["event type", "Probd", "Probed"]);
    assert_refused_input(&pipeline, &event("Reset"), &["event type", "Reset"]);
    assert_refused_input(&pipeline, &event("Probed")[..6], &["--reason"]);
    assert_refused_input(
        &pipeline,
        &with_reason(&["event", "B0001", "--type", "Probed", "--outcome", "maybe"]),
        &["--outcome", "maybe"],
    );
    assert_refused_input(
        &pipeline,
        &with_reason(&["event", "B7777", "--type", "Probed", "--outcome", "success"]),
        &["B7777"],
    );
    assert_refused_input(&pipeline, &with_reason(&["restart", "B0001", "--from", "Nope"]), &["--from", "Nope"]);
    assert_refused_input(&pipeline, &with_reason(&["restart", "B0001", "--from", "no-pe"]), &["--from", "no-pe"]);
    assert_refused_input(
        &pipeline,
        &with_reason(&["restart", "B7777", "--from-first-failure"]),
        &["batch id", "B7777"],
    );
    assert_refused_input(&pipeline, &["restart", "B0001", "--from-first-failure"], &["--reason"]);
    assert_refused_input(&pipeline, &with_reason(&["prioritize", "B7777", "3"]), &["batch id", "B7777"]);
    assert_refused_input(&pipeline, &with_reason(&["prioritize", "B0001", "high"]), &["high"]);
    assert_refused_input(&pipeline, &["prioritize", "B0001", "3"], &["--reason"]);
    assert_refused_input(&pipeline, &["add", "a/b", "--type", "RoundTrip"], &["batch id", "a/b"]);
    assert_refused_input(&pipeline, &["add", "B0002", "--type", "Round Trip"], &["batch type", "Round Trip"]);
    assert_refused_input(&pipeline, &["show", "B7777"], &["batch id", "B7777"]);
    assert_refused_input(&pipeline, &["explain", "B0001", "--component", "nope"], &["component", "nope"]);
    assert_refused_input(&pipeline, &["ready", "--component", "nope"], &["component", "nope"]);
    assert_refused_input(&pipeline, &["status", "--component", "nope"], &["component", "nope"]);
    assert_refused_input(&pipeline, &["status", "--state", "sleepy"], &["--state", "sleepy"]);
    assert_refused_input(&pipeline, &["locks", "--stale", "soon"], &["--stale", "soon"]);

    // An operator name that cannot be recorded.
    let mut unnamed = Command::new(binary("autocomp"));
    unnamed.arg("--config-dir").arg(pipeline.config_dir()).args(["--as", "two words"]);
    unnamed.args(with_reason(&["rerun", "B0001", "--component", "probe"]));
    let head = pipeline.head();
    let output = unnamed.output().unwrap();
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--as") && stderr.contains("two words"), "{stderr}");
    assert_eq!(pipeline.head(), head);
    assert_eq!(pipeline.all_batches()[0].events.len(), 1, "only the registration's Data_Received");
}

#[test]
fn status_show_explain_and_reindex_on_the_demo_pipeline() {
    let dir = tempfile::tempdir().unwrap();
    let demo =
        Command::new(binary("autocomp")).args(["demo", "--batches", "4", "--dir"]).arg(dir.path()).output().unwrap();
    assert!(demo.status.success(), "{}", String::from_utf8_lossy(&demo.stderr));
    let config = dir.path().join("config");
    let run = |args: &[&str]| {
        let done = autocomp_in(&config, args);
        assert_eq!(done.code, Some(0), "autocomp {args:?}\n{}", done.show());
        done
    };
    let broken = "B400022028244-RT1"; // the fourth sample has a flipped byte
    // The demo's Python step (catalogue) comes after the archiver.
    let pipeline_order = ["batch-trigger", "checksum-verifier", "structure-checker", "archiver", "catalogue"];

    // JSON: an array of {id, components}.
    let status = json(&run(&["status", "--format", "json"]));
    let rows = status.as_array().unwrap();
    assert_eq!(rows.len(), 4);
    let row = rows.iter().find(|r| r["id"] == broken).unwrap();
    assert_eq!(row["components"]["checksum-verifier"], "failed");
    assert_eq!(row["components"]["structure-checker"], "success");
    assert_eq!(row["components"]["archiver"], "waiting");
    // CSV: a header naming the components in pipeline order, one line per batch.
    let csv = run(&["status", "--format", "csv"]).stdout;
    let lines: Vec<Vec<&str>> = csv.lines().map(|l| l.split(',').collect()).collect();
    assert_eq!(lines[0], [&["id"][..], &pipeline_order[..]].concat());
    assert_eq!(lines.len(), 5, "{csv}");
    assert!(lines[1..].iter().all(|l| l.len() == 6), "{csv}");
    assert!(lines.contains(&vec![broken, "success", "failed", "success", "waiting", "waiting"]), "{csv}");
    // Filters and the table.
    let failed = json(&run(&["status", "--state", "failed", "--format", "json"]));
    assert_eq!(failed.as_array().unwrap().iter().map(|r| r["id"].as_str().unwrap()).collect::<Vec<_>>(), [broken]);
    let archiver = json(&run(&["status", "--component", "archiver", "--state", "waiting", "--format", "json"]));
    assert_eq!(archiver, serde_json::json!([{"id": broken, "components": {"archiver": "waiting"}}]));
    let table = run(&["status"]).stdout;
    assert!(
        table.lines().next().unwrap().split_whitespace().eq(["batch"].into_iter().chain(pipeline_order)),
        "{table}"
    );

    // show: the log with every report, as JSON and as text.
    let shown = json(&run(&["show", broken, "--format", "json"]));
    assert_eq!(
        (shown["id"].clone(), shown["type"].clone(), shown["priority"].clone()),
        (broken.into(), "RoundTrip".into(), 0.into())
    );
    let events = shown["events"].as_array().unwrap();
    assert_eq!(events.len(), 3, "{shown:#}");
    for event in events {
        for field in ["seq", "type", "outcome", "agent", "at", "details"] {
            assert!(event.get(field).is_some(), "no {field} in {event}");
        }
    }
    let verified = events.iter().find(|e| e["type"] == "Checksums_Verified").unwrap();
    assert_eq!(verified["outcome"], "failure");
    assert_eq!(verified["details"]["failures"][0]["reference"], "data/page-0002.txt");
    let text = run(&["show", broken]).stdout;
    assert!(text.contains("checksum-verifier  failed") && text.contains("data/page-0002.txt"), "{text}");
    // It opens with the verdict, the whole reason (the file too) and the command that acts.
    let mut lines = text.lines();
    let verdict = lines.next().unwrap();
    assert!(verdict.starts_with(&format!("{broken}: failed at checksum-verifier: ")), "{text}");
    assert!(verdict.contains("(data/page-0002.txt"), "the file the failure names: {text}");
    let rerun = format!("next: autocomp rerun {broken} --component checksum-verifier --reason ...");
    assert_eq!(lines.next(), Some(rerun.as_str()), "{text}");
    assert_eq!(shown["verdict"].as_str(), verdict.strip_prefix(&format!("{broken}: ")), "{shown:#}");
    assert_eq!(shown["next"].as_str(), rerun.strip_prefix("next: "));
    let healthy = json(&run(&["show", "B400022028241-RT1", "--format", "json"]));
    assert_eq!((healthy["verdict"].as_str(), &healthy["next"]), (Some("done: every step succeeded"), &Value::Null));

    // failures: the reason grouped, the batch under it, and what to run; alerts (what cron
    // mails) says the same in a line, and exits 1.
    let failures = run(&["failures"]).stdout;
    let mut lines = failures.lines();
    assert_eq!(lines.next(), Some("checksum-verifier: 1 failed batch"), "{failures}");
    let reason = lines.next().unwrap();
    assert!(reason.trim_start().starts_with("1x  "), "{failures}");
    let reason = reason.trim_start().trim_start_matches("1x").trim();
    assert_eq!(lines.next().map(str::trim), Some(broken), "{failures}");
    assert!(failures.contains(&format!("autocomp explain {broken}")), "{failures}");
    let listed = json(&run(&["failures", "--component", "checksum-verifier", "--format", "json"]));
    assert_eq!(listed["components"][0]["total"], 1, "{listed:#}");
    assert_eq!(listed["components"][0]["reasons"][0]["reason"], reason, "{listed:#}");
    assert_eq!(listed["components"][0]["reasons"][0]["batches"], serde_json::json!([broken]), "{listed:#}");
    assert_eq!(
        json(&run(&["failures", "--component", "archiver", "--format", "json"]))["components"],
        serde_json::json!([])
    );
    let alerts = autocomp_in(&config, &["alerts"]);
    assert_eq!(alerts.code, Some(1), "{}", alerts.show());
    let expected =
        format!("checksum-verifier: 1 batch failed: 1x {reason} (`autocomp failures --component checksum-verifier`)");
    assert!(alerts.stdout.lines().any(|line| line == expected), "{expected}\n{}", alerts.show());

    // explain without --component: each step that is not a success, the waiting ones by
    // what holds them; the failed one with its whole reason and the command that acts.
    let text = run(&["explain", broken]).stdout;
    assert!(
        text.starts_with(&format!("{broken} for checksum-verifier (records Checksums_Verified): failed\n")),
        "{text}"
    );
    assert!(text.contains("data/page-0002.txt"), "{text}");
    assert!(text.contains(&rerun), "{text}");
    let waiting = text.split("waiting for other steps:\n").nth(1).unwrap_or_else(|| panic!("{text}"));
    assert!(
        waiting.lines().any(|l| l.starts_with("  archiver: because archiver waits for Checksums_Verified")),
        "{text}"
    );
    assert!(!text.contains("for structure-checker"), "a success is not explained: {text}");
    let explained = json(&run(&["explain", broken, "--format", "json"]));
    let steps: Vec<&str> =
        explained["steps"].as_array().unwrap().iter().map(|s| s["component"].as_str().unwrap()).collect();
    assert_eq!(steps, ["checksum-verifier", "archiver", "catalogue"], "{explained:#}");
    assert_eq!(explained["steps"][0]["next"].as_str(), rerun.strip_prefix("next: "));
    let done = run(&["explain", "B400022028241-RT1"]).stdout;
    assert_eq!(done, "B400022028241-RT1: every one of its 5 steps succeeded\n");

    // explain: clause by clause, store and index side by side.
    let text = run(&["explain", broken, "--component", "archiver"]).stdout;
    let clause = text
        .lines()
        .find(|l| l.trim_start().starts_with("requires Checksums_Verified"))
        .unwrap_or_else(|| panic!("{text}"));
    assert_eq!(clause.split_whitespace().collect::<Vec<_>>(), ["requires", "Checksums_Verified", "FAIL", "FAIL"]);
    assert!(text.contains("not ready: requires Checksums_Verified: its effective event is a failure, seq "), "{text}");
    let explained = json(&run(&["explain", broken, "--component", "archiver", "--format", "json"]));
    let clauses: Vec<(String, bool, bool)> = explained["clauses"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["clause"].as_str().unwrap().to_owned(), c["store"] == true, c["index"] == true))
        .collect();
    assert_eq!(
        clauses,
        [
            ("requires Checksums_Verified".to_owned(), false, false),
            ("requires Structure_Checked".to_owned(), true, true),
            ("blocked_by Data_Archived".to_owned(), true, true),
        ]
    );
    assert_eq!(json(&run(&["ready", "--component", "archiver", "--format", "json"])), serde_json::json!([]));
    assert_eq!(run(&["locks"]).stdout, "no locks held\n");

    // A lost index is rebuilt; explain and ready read the rebuilt one.
    std::fs::remove_dir_all(dir.path().join("index")).unwrap();
    let reindexed = run(&["reindex"]);
    assert!(reindexed.stdout.starts_with("reindexed 4 batches"), "{}", reindexed.show());
    let explained = json(&run(&["explain", broken, "--component", "checksum-verifier", "--format", "json"]));
    assert_eq!(explained["ready_in_index"], false);
    assert_eq!(explained["index_cursor"], explained["store_head"]);

    // An index another release built cannot even be opened; reindex sets it aside.
    let meta = dir.path().join("index/meta.json");
    let text = std::fs::read_to_string(&meta).unwrap();
    std::fs::write(&meta, text.replace("\\\"schema\\\":", "\\\"schema\\\":9")).unwrap();
    let refused = autocomp_in(&config, &["explain", broken, "--component", "archiver"]);
    assert_eq!(refused.code, Some(5), "{}", refused.show());
    assert!(refused.stderr.contains("autocomp reindex"), "{}", refused.show());
    let reindexed = run(&["reindex"]);
    assert!(reindexed.stdout.contains("moved it aside"), "{}", reindexed.show());
    assert!(reindexed.stdout.contains("reindexed 4 batches"), "{}", reindexed.show());
    run(&["explain", broken, "--component", "archiver"]);

    // Restart the failed step: it and the later structure check trigger again, archiving
    // still waits; the demo's next round runs them, and the history only grew.
    let before = autocomp_in(&config, &["show", broken, "--format", "json"]);
    let done = run(&["restart", broken, "--from-first-failure", "--reason", "re-verify"]);
    assert!(done.stdout.contains("checksum-verifier: failed -> ready"), "{}", done.show());
    assert!(done.stdout.contains("structure-checker: success -> ready"), "{}", done.show());
    assert_eq!(json(&run(&["ready", "--component", "checksum-verifier", "--format", "json"]))[0]["id"], broken);
    let again = Command::new(binary("autocomp")).args(["demo", "--dir"]).arg(dir.path()).output().unwrap();
    assert!(again.status.success());
    let after = json(&run(&["show", broken, "--format", "json"]));
    let before = json(&before)["events"].as_array().unwrap().clone();
    let after_events = after["events"].as_array().unwrap();
    assert_eq!(after_events[..before.len()], before[..], "earlier events changed");
    assert_eq!(after_events.len(), before.len() + 3, "the Reset and two new results: {after:#}");
    assert_eq!(after["components"]["checksum-verifier"], "failed", "the bag is still broken");
}

/// The store the CLI reads is the one the components write: a sanity check of the fixture.
#[test]
fn show_reads_what_components_recorded() {
    let pipeline = new_pipeline();
    let id = pipeline.register(1).remove(0);
    assert_eq!(pass(&pipeline, "probe").code, Some(0));
    let shown = json(&autocomp(&pipeline, &["show", "B0001", "--format", "json"]));
    let stored = pipeline.block_on(pipeline.store().get_batch(&id)).unwrap();
    let seqs: Vec<i64> = shown["events"].as_array().unwrap().iter().map(|e| e["seq"].as_i64().unwrap()).collect();
    assert_eq!(seqs, stored.events.iter().map(|e| e.seq.0).collect::<Vec<_>>());
    assert_eq!(shown["components"]["probe"], "success");
}

#[test]
fn explain_shows_the_retry_window_of_a_transient_failure() {
    let pipeline = new_pipeline();
    pipeline.register(1);
    std::fs::write(
        pipeline.config_dir().join("probe.toml"),
        "event_type = \"Probed\"\nretry_backoff = \"1h\"\nmax_attempts = 4\n\n\
         [trigger]\nrequires = [\"Data_Received\"]\nblocked_by = [\"Probed\"]\n\n\
         [settings]\nbehaviour = \"transient\"\ntransient_failures = 9\n",
    )
    .unwrap();
    let failed = pass(&pipeline, "probe");
    assert!(failed.stdout.contains("transient, will retry"), "{}", failed.show());

    let explained = json(&autocomp(&pipeline, &["explain", "B0001", "--component", "probe", "--format", "json"]));
    assert_eq!(explained["state"], "retrying");
    assert_eq!((explained["failed_attempts"].clone(), explained["max_attempts"].clone()), (1.into(), 4.into()));
    let retry = &explained["retry"];
    assert_eq!(retry["backoff_seconds"], 3600);
    assert_eq!((retry["ready_in_store"].clone(), retry["ready_in_index"].clone()), (false.into(), false.into()));
    let settled = retry["clauses"].as_array().unwrap().iter().find(|c| c["clause"] == "settled_for 1h").unwrap();
    assert_eq!((settled["store"].clone(), settled["index"].clone()), (false.into(), false.into()));
    let text = autocomp(&pipeline, &["explain", "B0001", "--component", "probe"]).stdout;
    assert!(text.contains("retry of the transient failure") && text.contains("window opens at"), "{text}");
    assert!(text.contains("(in 59m"), "{text}");
    assert!(ready_ids(&pipeline, "probe").is_empty(), "still inside the backoff");
}

#[test]
fn show_prints_hostile_text_as_visible_escapes_in_text_and_json() {
    let pipeline = new_pipeline();
    pipeline.register(1);
    // Recolours the terminal, retitles the window, rings, overwrites the line, and reverses
    // what follows: each must show as an escape, none may reach the terminal as itself.
    let reason = "by hand\u{1b}[31m\u{1b}]0;owned\u{7}\rgone \u{202e}exe.txt\u{9b}2J";
    act(&pipeline, &["skip", "B0001", "--component", "probe", "--reason", reason]);
    let concealing = |text: &str| text.chars().filter(|c| autocomp_toolkit::terminal::is_concealing(*c)).count();

    let text = autocomp(&pipeline, &["show", "B0001"]);
    assert_eq!(text.code, Some(0), "{}", text.show());
    assert_eq!(concealing(&text.stdout), 0, "{:?}", text.stdout);
    assert!(
        text.stdout.contains("by hand\\u001b[31m\\u001b]0;owned\\u0007\\u000dgone \\u202eexe.txt\\u009b2J"),
        "the reason shows with its escapes: {}",
        text.show()
    );

    // JSON stays exact: the escapes are JSON's own, so the document parses to the reason.
    let printed = autocomp(&pipeline, &["show", "B0001", "--format", "json"]);
    assert_eq!(concealing(&printed.stdout), 0, "{:?}", printed.stdout);
    let last = json(&printed)["events"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["details"]["reason"], reason);
}

/// A page of `show` holds event heads, not megabytes of details: an event whose details
/// pass 16 KiB is listed with their size and the command that prints it whole.
#[test]
fn show_summarizes_an_event_with_large_details_and_event_prints_it_whole() {
    let pipeline = new_pipeline();
    let id = pipeline.register(1).remove(0);
    let dump = "x".repeat(500_000);
    let big = autocomp_model::NewEvent::new(
        autocomp_model::EventType::new("Dump_Made").unwrap(),
        Outcome::Success,
        Agent::new("test").unwrap(),
    )
    .with_details(serde_json::json!({"dump": dump}));
    let seq = pipeline.block_on(pipeline.store().append_event(&id, big)).unwrap().seq.0;

    let text = autocomp(&pipeline, &["show", "B0001"]);
    assert_eq!(text.code, Some(0), "{}", text.show());
    assert!(text.stdout.len() < 100_000, "no dump printed: {} bytes", text.stdout.len());
    let command = format!("autocomp show B0001 --event {seq}");
    assert!(text.stdout.contains(&format!("details of 488.3 KiB left out; print them: {command}")), "{}", text.show());
    let shown = json(&autocomp(&pipeline, &["show", "B0001", "--format", "json"]));
    let listed = shown["events"].as_array().unwrap().iter().find(|e| e["seq"] == seq).unwrap().clone();
    assert_eq!(listed["details"], Value::Null);
    assert_eq!(
        (listed["details_left_out"]["bytes"].as_u64(), listed["details_left_out"]["command"].as_str()),
        (Some(500_011), Some(command.as_str()))
    );
    let all = autocomp(&pipeline, &["show", "B0001", "--all"]);
    assert!(all.stdout.contains(&command) && all.stdout.len() < 100_000, "{}", all.show());

    let whole = json(&autocomp(&pipeline, &["show", "B0001", "--event", &seq.to_string()]));
    assert_eq!((whole["seq"].as_i64(), whole["details"]["dump"].as_str().map(str::len)), (Some(seq), Some(500_000)));
    assert_refused_input(&pipeline, &["show", "B0001", "--event", &(seq + 100).to_string()], &["--event"]);
}

/// Before any component's first pass the registry is empty: `autocomp event` must say how
/// to get going rather than list no types, and accepts the event types the component files
/// in the config dir name, so a fresh pipeline's first events can be recorded by hand.
#[test]
fn event_before_any_first_pass_says_how_to_register_and_accepts_configured_types() {
    let pipeline = Pipeline::new(PROBE);
    let id = pipeline.register_one("B0001", false);
    let event = |t: &'static str| -> Vec<&'static str> {
        vec!["event", "B0001", "--type", t, "--outcome", "success", "--reason", "delivered by courier"]
    };

    assert_refused_input(&pipeline, &event("Data_Received"), &["Data_Received", "first pass", "event_type"]);
    let refused = autocomp(&pipeline, &event("Data_Received"));
    assert!(!refused.stderr.contains("known: ;"), "an empty list of known types: {}", refused.show());
    assert_refused_input(&pipeline, &["ready", "--component", "probe"], &["probe", "first pass"]);

    // The source's file names its event type; a file that is not a component's names none.
    let config = pipeline.config_dir();
    std::fs::write(config.join("batch-trigger.toml"), "event_type = \"Data_Received\"\n").unwrap();
    std::fs::write(config.join("notes.toml"), "not = [a component file\n").unwrap();
    assert_refused_input(&pipeline, &event("Probd"), &["Probd", "known: Data_Received;"]);
    let done = autocomp(&pipeline, &event("Data_Received"));
    assert_eq!(done.code, Some(0), "{}", done.show());
    let received: Vec<Outcome> = pipeline.events(&id, "Data_Received").iter().map(|e| e.outcome).collect();
    assert_eq!(received, [Outcome::Success], "{}", done.show());
}

/// `autocomp show ... | head -0`: stdout is a pipe whose reader is gone. The output is best
/// effort, so `autocomp` ends with its usual exit code, without a panic.
#[test]
fn autocomp_with_a_closed_stdout_exits_as_usual_without_a_panic() {
    let pipeline = Pipeline::new(PROBE);
    pipeline.register(1);
    let (reader, writer) = std::io::pipe().expect("a pipe");
    drop(reader);
    let mut command = Command::new(binary("autocomp"));
    command.arg("--config-dir").arg(pipeline.config_dir()).args(["show", "B0001"]);
    without_pipeline_env(&mut command);
    command.stdin(Stdio::null()).stdout(writer).stderr(Stdio::piped());
    let done = finish(command.spawn().expect("autocomp starts"), Duration::from_secs(60));
    assert_eq!(done.code, Some(0), "{}", done.show());
    assert!(!done.stderr.contains("panicked"), "{}", done.show());
}
