//! The operator steering the pipeline through the `autocomp` CLI, against a real store that
//! the probe component works on: human steps (declared, waited at, approved, rejected with
//! and without a restart), pause / drain / resume with who and why shown by `status`,
//! `pipeline`, `alerts` and the metrics, `drain --wait` returning once running work ends,
//! pool sizes, and `resume --rerun-failed` after an open circuit. Input errors name the
//! field and change nothing.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use autocomp_e2e::{Finished, Pipeline, binary, finish, wait_until, without_pipeline_env};
use autocomp_model::{Agent, BatchId, ComponentName, HoldKind, Outcome, SteeringChange, SteeringRequest};
use serde_json::Value;

const PROBE: &str = env!("CARGO_BIN_EXE_probe-component");

fn autocomp(pipeline: &Pipeline, args: &[&str]) -> Finished {
    let mut command = Command::new(binary("autocomp"));
    command.arg("--config-dir").arg(pipeline.config_dir()).args(["--as", "ann"]).args(args);
    without_pipeline_env(&mut command).env_remove("USER");
    command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    finish(command.spawn().expect("autocomp starts"), Duration::from_secs(60))
}

fn ok(pipeline: &Pipeline, args: &[&str]) -> String {
    let done = autocomp(pipeline, args);
    assert_eq!(done.code, Some(0), "autocomp {args:?}\n{}", done.show());
    done.stdout
}

fn json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}):\n{text}"))
}

/// The pipeline with the probe registered by an idle pass and a human step `qa` after it.
fn pipeline_with_a_human_step() -> Pipeline {
    let pipeline = Pipeline::new(PROBE);
    pipeline.configure("");
    let idle = pipeline.run(&[]);
    assert_eq!(idle.code, Some(0), "{}", idle.show());
    ok(
        &pipeline,
        &["step", "add", "qa", "--event-type", "Roundtrip_Approved", "--requires", "Probed", "--reason", "manual QA"],
    );
    pipeline
}

fn state(pipeline: &Pipeline, id: &str, component: &str) -> String {
    let rows = json(&ok(pipeline, &["status", "--format", "json"]));
    let row = rows.as_array().unwrap().iter().find(|row| row["id"] == id).expect("the batch's row");
    row["components"][component].as_str().unwrap().to_owned()
}

#[test]
fn a_human_step_waits_for_a_person_who_approves_or_rejects_it() {
    let pipeline = pipeline_with_a_human_step();
    let ids = pipeline.register(3);
    assert_eq!(state(&pipeline, "B0001", "qa"), "waiting", "nothing probed yet");
    assert_eq!(pipeline.run(&[]).code, Some(0));
    for id in &ids {
        assert_eq!(state(&pipeline, id.as_str(), "qa"), "person");
    }
    let listed = ok(&pipeline, &["status", "--component", "qa", "--state", "person", "--format", "csv"]);
    assert_eq!(listed.lines().count(), 4, "a header and three batches waiting for a person:\n{listed}");

    // A person approves B0001: a success by the operator, with the reason.
    let said = ok(&pipeline, &["approve", "B0001", "--step", "qa", "--reason", "pages look right"]);
    assert!(said.contains("approved at qa") && said.contains("person -> success"), "{said}");
    let approval = pipeline.events(&ids[0], "Roundtrip_Approved");
    assert_eq!(approval.len(), 1);
    assert_eq!((approval[0].outcome, approval[0].agent.as_str()), (Outcome::Success, "operator:ann"));
    assert_eq!(approval[0].details["approved"], true);
    assert_eq!(approval[0].details["reason"], "pages look right");

    // Once decided, it is not waiting any more: a second approval is refused, nothing written.
    let again = autocomp(&pipeline, &["approve", "B0001", "--step", "qa", "--reason", "twice"]);
    assert_eq!(again.code, Some(1), "{}", again.show());
    assert!(again.stderr.contains("not waiting for a person"), "{}", again.show());
    assert_eq!(pipeline.events(&ids[0], "Roundtrip_Approved").len(), 1);

    // A plain rejection is a failure that stays.
    ok(&pipeline, &["reject", "B0002", "--step", "qa", "--reason", "pages missing"]);
    assert_eq!(state(&pipeline, "B0002", "qa"), "failed");
    assert_eq!(pipeline.events(&ids[1], "Roundtrip_Approved")[0].details["rejected"], true);

    // A rejection with a restart sends the batch back: the probe runs again, then qa waits again.
    let said = ok(&pipeline, &["reject", "B0003", "--step", "qa", "--reason", "rescan", "--restart-from", "Probed"]);
    assert!(said.contains("restart from Probed"), "{said}");
    assert_eq!(state(&pipeline, "B0003", "probe"), "ready");
    assert_eq!(state(&pipeline, "B0003", "qa"), "waiting");
    assert_eq!(pipeline.run(&[]).code, Some(0));
    assert_eq!(state(&pipeline, "B0003", "qa"), "person");

    // Input errors name the field; nothing is written.
    let head = pipeline.head();
    let not_human = autocomp(&pipeline, &["approve", "B0003", "--step", "probe", "--reason", "x"]);
    assert_eq!(not_human.code, Some(2), "{}", not_human.show());
    assert!(not_human.stderr.contains("invalid step \"probe\": not a human step"), "{}", not_human.show());
    let bad_type = autocomp(&pipeline, &["reject", "B0003", "--step", "qa", "--reason", "x", "--restart-from", "No"]);
    assert_eq!(bad_type.code, Some(2), "{}", bad_type.show());
    assert!(bad_type.stderr.contains("--restart-from"), "{}", bad_type.show());
    assert_eq!(pipeline.head(), head, "refusals wrote nothing");

    // A human step is in the pipeline, marked, and is never called silent.
    let view = ok(&pipeline, &["pipeline"]);
    assert!(view.lines().any(|l| l.starts_with("qa") && l.contains("human step")), "{view}");
    let alerts = autocomp(&pipeline, &["alerts", "--silent-after", "1s", "--ready-after", "1h"]);
    assert!(!alerts.stdout.contains("qa: no pass"), "{}", alerts.show());
}

/// Twenty batches waiting at a human step are decided in one command: `approve` takes
/// several ids (a dry run first says how many it would approve), and a batch that does not
/// wait there is refused by name while the others are approved (exit 1). Several ids with
/// `--expect-version` are refused as input, nothing written.
#[test]
fn twenty_batches_at_a_human_step_are_decided_in_one_command() {
    let pipeline = pipeline_with_a_human_step();
    pipeline.configure("queue_size = 50\n");
    let ids = pipeline.register(21);
    let rest = pipeline.run(&[]);
    assert_eq!(rest.code, Some(0), "{}", rest.show());
    let waiting = ok(&pipeline, &["status", "--component", "qa", "--state", "person", "--format", "csv"]);
    assert_eq!(waiting.lines().count(), 22, "a header and 21 batches waiting:\n{waiting}");
    ok(&pipeline, &["reject", "B0021", "--step", "qa", "--reason", "torn page"]);

    let mut args: Vec<&str> = vec!["approve", "--step", "qa", "--reason", "pages look right"];
    args.extend(ids.iter().map(|id| id.as_str()));
    let head = pipeline.head();
    let dry: Vec<&str> = args.iter().copied().chain(["--dry-run"]).collect();
    // A refusal in a dry run is exit 1, as for one id, what it would do printed.
    let preview = autocomp(&pipeline, &dry);
    assert_eq!(preview.code, Some(1), "{}", preview.show());
    let said = &preview.stdout;
    assert!(said.starts_with("dry run, nothing written: it would act on 20 of 21 batch(es)"), "{said}");
    assert!(said.contains("refused on B0021"), "{said}");
    assert!(preview.stderr.contains("approve would be refused on 1 of 21 batch(es)"), "{}", preview.show());
    let pinned: Vec<&str> = args.iter().copied().chain(["--expect-version", "7"]).collect();
    let refused = autocomp(&pipeline, &pinned);
    assert_eq!(refused.code, Some(2), "{}", refused.show());
    assert!(refused.stderr.contains("invalid --expect-version \"7\""), "{}", refused.show());
    // An unknown batch among several is bad input, as alone: exit 2, nothing written.
    let unknown = autocomp(&pipeline, &["approve", "B0001", "B9999", "--step", "qa", "--reason", "ok"]);
    assert_eq!(unknown.code, Some(2), "{}", unknown.show());
    assert!(unknown.stderr.contains("invalid batch id \"B9999\""), "{}", unknown.show());
    assert_eq!(pipeline.head(), head, "a dry run and refused input write nothing");

    let decided = autocomp(&pipeline, &args);
    assert_eq!(decided.code, Some(1), "one batch was refused: {}", decided.show());
    assert!(decided.stdout.contains("approve: done on 20, refused on 1"), "{}", decided.show());
    assert!(decided.stdout.contains("refused on B0021 (nothing written)"), "{}", decided.show());
    assert!(decided.stderr.contains("approve refused on 1 of 21 batch(es)"), "{}", decided.show());
    for id in &ids[..20] {
        assert_eq!(state(&pipeline, id.as_str(), "qa"), "success", "{id}");
    }
    assert_eq!(state(&pipeline, "B0021", "qa"), "failed");
}

/// A failure and a person's rejection are closed out: `failures` and `alerts` say what
/// failed (cron mail), `acknowledge` closes both out in one command, after which `alerts`
/// prints nothing, `failures` lists none, `status` shows `acknowledged`, what requires the
/// step still waits, the notifier is told nothing new, and a rerun opens the step again.
#[test]
fn failures_are_closed_out_by_acknowledging_them_and_reopened_by_a_rerun() {
    let pipeline = pipeline_with_a_human_step();
    pipeline.configure("[settings]\nbehaviour = \"fail\"\n");
    let ids = pipeline.register(2);
    assert_eq!(pipeline.run(&["--batch", "B0001"]).code, Some(1));
    pipeline.configure("");
    assert_eq!(pipeline.run(&["--batch", "B0002"]).code, Some(0));
    ok(&pipeline, &["reject", "B0002", "--step", "qa", "--reason", "torn page"]);
    let alerts = autocomp(&pipeline, &["alerts"]);
    assert_eq!(alerts.code, Some(1), "{}", alerts.show());
    assert!(alerts.stdout.contains("probe: 1 batch failed: 1x"), "{}", alerts.show());
    assert!(alerts.stdout.contains("qa: 1 batch failed: 1x rejected by operator:ann: torn page"), "{}", alerts.show());
    let failures = ok(&pipeline, &["failures"]);
    assert!(failures.contains("close out:   autocomp acknowledge B0001 --component probe"), "{failures}");

    // Nothing to close out is refused by name, nothing written.
    let head = pipeline.head();
    let nothing = autocomp(&pipeline, &["acknowledge", "B0002", "--component", "probe", "--reason", "x"]);
    assert_eq!(nothing.code, Some(1), "{}", nothing.show());
    assert!(nothing.stderr.contains("probe has no failure on B0002 to acknowledge"), "{}", nothing.show());
    assert_eq!(pipeline.head(), head);

    let closed =
        ok(&pipeline, &["acknowledge", "B0001", "--component", "probe", "--reason", "scanner fault, rescanned"]);
    assert!(closed.contains("probe's failure (seq"), "{closed}");
    assert!(closed.contains("probe: failed -> acknowledged"), "{closed}");
    let answer = ok(
        &pipeline,
        &["acknowledge", "B0002", "--component", "qa", "--reason", "returned to the publisher", "--format", "json"],
    );
    assert_eq!(json(&answer)["event"]["flags"], serde_json::json!(["acknowledged"]), "{answer}");
    let quiet = autocomp(&pipeline, &["alerts"]);
    assert_eq!((quiet.code, quiet.stdout.as_str()), (Some(0), ""), "{}", quiet.show());
    assert!(!ok(&pipeline, &["failures"]).contains("B000"), "no failure left to list");
    assert_eq!(state(&pipeline, "B0001", "probe"), "acknowledged");
    assert_eq!(state(&pipeline, "B0001", "qa"), "waiting", "what requires the step still waits");
    assert_eq!(state(&pipeline, "B0002", "qa"), "acknowledged");
    let listed = ok(&pipeline, &["status", "--state", "acknowledged", "--format", "csv"]);
    assert_eq!(listed.lines().count(), 3, "{listed}");
    let event = pipeline.events(&ids[0], "Probed").pop().unwrap();
    assert!(event.flag("acknowledged") && event.agent.as_str() == "operator:ann", "{event:?}");
    assert_eq!(event.details["acknowledges"]["reason"], "probe: deliberate failure (data/page-1.tif)");
    let shown = ok(&pipeline, &["show", "B0001"]);
    assert!(shown.starts_with("B0001: closed: an operator acknowledged its failure at probe"), "{shown}");
    let again = autocomp(&pipeline, &["acknowledge", "B0001", "--component", "probe", "--reason", "twice"]);
    assert_eq!(again.code, Some(1), "{}", again.show());
    assert!(again.stderr.contains("acknowledged already"), "{}", again.show());

    // A rerun opens it again.
    ok(&pipeline, &["rerun", "B0001", "--component", "probe", "--reason", "rescanned"]);
    assert_eq!(state(&pipeline, "B0001", "probe"), "ready");
    assert_eq!(pipeline.run(&[]).code, Some(0));
    assert_eq!(state(&pipeline, "B0001", "probe"), "success");
}

#[test]
fn a_paused_component_is_shown_with_who_and_why_and_alerts_report_it_once_too_long() {
    let pipeline = pipeline_with_a_human_step();
    pipeline.register(1);
    let said = ok(&pipeline, &["pause", "probe", "--reason", "scanner maintenance"]);
    assert!(said.contains("paused probe"), "{said}");

    // A paused cron pass is quiet, exits 0 and claims nothing.
    let paused = pipeline.run(&[]);
    assert_eq!((paused.code, paused.stdout.as_str(), paused.stderr.as_str()), (Some(0), "", ""), "{}", paused.show());
    assert!(pipeline.events(&BatchId::new("B0001").unwrap(), "Probed").is_empty());

    let status = ok(&pipeline, &["status"]);
    assert!(status.contains("probe: paused by operator:ann since"), "{status}");
    assert!(status.contains("scanner maintenance"), "{status}");
    let view = ok(&pipeline, &["pipeline"]);
    assert!(view.lines().any(|l| l.starts_with("probe") && l.contains("paused")), "{view}");
    assert!(view.contains("steering log (newest first):"), "{view}");
    let view = json(&ok(&pipeline, &["pipeline", "--format", "json"]));
    assert_eq!(view["steering"]["components"]["probe"]["reason"], "scanner maintenance");
    assert_eq!(view["steering_log"][0]["by"], "operator:ann");

    let quiet = autocomp(&pipeline, &["alerts", "--paused-after", "1h"]);
    assert!(!quiet.stdout.contains("probe: paused"), "{}", quiet.show());
    let alerts = autocomp(&pipeline, &["alerts", "--paused-after", "0s"]);
    assert_eq!(alerts.code, Some(1), "{}", alerts.show());
    assert!(alerts.stdout.contains("probe: paused for"), "{}", alerts.show());
    assert!(alerts.stdout.contains("autocomp resume probe"), "{}", alerts.show());

    let metrics = ok(&pipeline, &["metrics"]);
    assert!(metrics.contains("autocomp_component_held{component=\"probe\"} 1"), "{metrics}");
    assert!(metrics.contains("autocomp_component_held{component=\"qa\"} 0"), "{metrics}");

    // Pausing twice is refused naming the first; resume lets the next pass work.
    let twice = autocomp(&pipeline, &["pause", "probe", "--reason", "again"]);
    assert_eq!(twice.code, Some(1), "{}", twice.show());
    assert!(twice.stderr.contains("paused already, by operator:ann"), "{}", twice.show());
    ok(&pipeline, &["resume", "probe", "--reason", "scanner back"]);
    let worked = pipeline.run(&[]);
    assert_eq!(worked.code, Some(0), "{}", worked.show());
    assert_eq!(pipeline.events(&BatchId::new("B0001").unwrap(), "Probed").len(), 1);
    let status = ok(&pipeline, &["status"]);
    assert!(!status.contains("held"), "{status}");
}

#[test]
fn drain_wait_returns_once_the_running_work_has_finished() {
    let pipeline = Pipeline::new(PROBE);
    let (started, gate) = pipeline.hold_work_at_a_gate("");
    pipeline.register(1);
    let worker = pipeline.spawn(&[]);
    let deadline = Instant::now() + Duration::from_secs(30);
    let began = wait_until(deadline, || std::fs::read_dir(&started).map(|d| d.count() > 0).unwrap_or(false));
    assert!(began, "the probe did not start its work");
    let mut drain = Command::new(binary("autocomp"));
    drain.arg("--config-dir").arg(pipeline.config_dir()).args(["--as", "ann"]);
    drain.args(["drain", "probe", "--reason", "maintenance", "--wait", "--timeout", "60s"]);
    without_pipeline_env(&mut drain);
    drain.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut drain = drain.spawn().unwrap();
    // The drain is recorded while the work still runs, and it waits.
    let recorded = wait_until(Instant::now() + Duration::from_secs(30), || {
        let steering = pipeline.block_on(pipeline.any_store().steering()).unwrap();
        steering.components.get(&ComponentName::new("probe").unwrap()).is_some_and(|h| h.kind == HoldKind::Drain)
    });
    assert!(recorded, "the drain was not recorded");
    assert!(drain.try_wait().unwrap().is_none(), "drain --wait returned while the probe still worked");
    std::fs::write(&gate, "").unwrap();
    let drained = finish(drain, Duration::from_secs(60));
    assert_eq!(drained.code, Some(0), "{}", drained.show());
    assert!(drained.stdout.contains("drained: nothing of probe runs"), "{}", drained.show());
    assert!(pipeline.open_runs().is_empty());
    let worker = finish(worker, Duration::from_secs(30));
    assert_eq!(worker.code, Some(0), "{}", worker.show());

    // With nothing running it returns at once; a timeout with work running is exit 1.
    let again = ok(&pipeline, &["drain", "probe", "--reason", "again", "--wait", "--timeout", "5s"]);
    assert!(again.contains("drained"), "{again}");
}

#[test]
fn pools_resume_with_reruns_and_bad_input_change_nothing() {
    let pipeline = pipeline_with_a_human_step();
    let store = pipeline.any_store();
    let said = ok(&pipeline, &["pool", "set", "tape", "2", "--reason", "two drives"]);
    assert!(said.contains("pool tape: size 2 (new)"), "{said}");
    let said = ok(&pipeline, &["pool", "set", "tape", "3", "--reason", "a third drive", "--format", "json"]);
    assert_eq!(json(&said)["entry"]["said"], "pool tape: size 3 (was 2)");
    let view = ok(&pipeline, &["pipeline"]);
    assert!(view.contains("tape: size 3 (set by operator:ann"), "{view}");

    // A breaker that opened after failures on two batches: resume --rerun-failed reruns them.
    let ids = pipeline.register(2);
    assert_eq!(pipeline.run(&[]).code, Some(0));
    for id in &ids {
        let request = SteeringRequest {
            change: SteeringChange::Outcome {
                component: ComponentName::new("probe").unwrap(),
                batch: id.clone(),
                failed: true,
                break_after: 2,
                summary: "disk full".into(),
            },
            by: Agent::new("probe/1.0@host#1").unwrap(),
            reason: "circuit breaker".into(),
            expect_version: None,
        };
        pipeline.block_on(store.steer(request)).unwrap();
    }
    let alerts = autocomp(&pipeline, &["alerts"]);
    assert!(alerts.stdout.contains("probe: circuit open for"), "{}", alerts.show());
    assert!(alerts.stdout.contains("--rerun-failed"), "{}", alerts.show());
    let preview = ok(&pipeline, &["resume", "probe", "--rerun-failed", "--reason", "disk replaced", "--dry-run"]);
    assert!(preview.contains("would rerun: B0001, B0002"), "{preview}");
    let done = ok(&pipeline, &["resume", "probe", "--rerun-failed", "--reason", "disk replaced"]);
    assert!(done.contains("resumed probe (its circuit was open after 2 consecutive failures)"), "{done}");
    for id in &ids {
        let resets = pipeline.events(id, "Reset");
        assert_eq!(resets.len(), 1, "{id} rerun once: {done}");
    }
    assert_eq!(state(&pipeline, "B0001", "probe"), "ready");

    // Bad input: named, nothing written.
    let version = pipeline.block_on(store.steering()).unwrap().version;
    for (args, field) in [
        (&["pool", "set", "tape drive", "2", "--reason", "x"][..], "pool"),
        (&["pause", "nosuch", "--reason", "x"][..], "component"),
        (&["pause", "probe", "--reason", ""][..], "reason"),
        (&["resume", "probe", "--reason", "x", "--expect-version", "0"][..], "version"),
        // Only a component's circuit keeps the list a rerun takes.
        (&["resume", "--all", "--rerun-failed", "--reason", "x"][..], "rerun_failed"),
    ] {
        let refused = autocomp(&pipeline, args);
        assert_ne!(refused.code, Some(0), "{args:?}: {}", refused.show());
        assert!(refused.stderr.contains(field), "{args:?} names {field}: {}", refused.show());
    }
    assert_eq!(pipeline.block_on(store.steering()).unwrap().version, version, "nothing changed");
}
