//! Previews against a real SQLite store: a preview writes nothing, refuses in the words
//! `perform` uses, and shows the state changes `perform` then reports; bulk actions act on
//! exactly the batches named. Honest actions: `skip` over a success and `cancel` with no
//! run are refused unless forced, every answer names what it wrote. Confirms: a confirm acts
//! only on the version and the write it previewed, and a key makes a repeated request write
//! nothing and say so.

use std::sync::Arc;
use std::time::Duration;

use autocomp_model::{
    Agent, BatchId, BatchType, ComponentName, ComponentState, EventType, IdempotencyKey, NewBatch, NewEvent, Outcome,
    RunHolder, Trigger,
};
use autocomp_store::ObjectStore;

use super::{Action, ActionPreview, ActionReport, MAX_BULK_BATCHES, RestartFrom, StateChange};
use crate::operator::{Operator, OperatorError};
use autocomp_framework::config::Backends;

use ComponentState::{Failed, Ready, Skipped, Success, Waiting, Working};

const REASON: &str = "the disk was full";

/// name, event type, required type: `expediter` works only on prioritized batches.
const PIPELINE: [(&str, &str, &str); 4] = [
    ("probe", "Probed", "Data_Received"),
    ("checker", "Checked", "Probed"),
    ("auditor", "Audited", "Probed"),
    ("expediter", "Expedited", "Prioritized"),
];

struct Fixture {
    operator: Operator,
    store: Arc<dyn ObjectStore>,
    _dir: tempfile::TempDir,
}

/// An operator on a fresh store whose registry holds `components`, each blocked by its own
/// type (as after each ran an idle pass).
async fn fixture_with(components: Vec<(&str, &str, Trigger)>) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let store_url = format!("sqlite://{}", dir.path().join("store.db").display());
    let backends = Backends { store: Some(store_url), ..Backends::default() };
    let operator = Operator::new(dir.path(), backends, Some("tester".into())).unwrap();
    let store = operator.store().await.unwrap();
    for (name, event_type, trigger) in components {
        autocomp_framework::testing::register_component(store.as_ref(), name, event_type, trigger).await;
    }
    Fixture { operator, store, _dir: dir }
}

async fn fixture() -> Fixture {
    let components = PIPELINE
        .iter()
        .map(|(name, event_type, requires)| (*name, *event_type, Trigger::builder().requires(*requires).build()));
    fixture_with(components.collect()).await
}

fn ty(name: &str) -> EventType {
    EventType::new(name).unwrap()
}

fn id(text: &str) -> BatchId {
    BatchId::new(text).unwrap()
}

fn change(component: &str, before: ComponentState, after: ComponentState) -> StateChange {
    StateChange { component: ComponentName::new(component).unwrap(), before, after }
}

fn skip(component: &str) -> Action {
    Action::Skip { component: component.into(), force: false }
}

fn cancel(component: &str) -> Action {
    Action::Cancel { component: component.into(), record_anyway: false }
}

fn key(text: &str) -> IdempotencyKey {
    IdempotencyKey::new(text).unwrap()
}

fn sorted(mut changes: Vec<StateChange>) -> Vec<StateChange> {
    changes.sort_by(|a, b| a.component.cmp(&b.component));
    changes
}

impl Fixture {
    /// Registers `batch` with these events, recorded as components would.
    async fn batch(&self, batch: &str, events: &[(&str, Outcome)]) {
        let batch = id(batch);
        self.store.create_batch(NewBatch::new(batch.clone(), BatchType::new("RoundTrip").unwrap())).await.unwrap();
        for (event_type, outcome) in events {
            let event = NewEvent::new(ty(event_type), *outcome, Agent::new("test").unwrap());
            self.store.append_event(&batch, event).await.unwrap();
        }
    }

    /// A worker of `component` holding a run on `batch`.
    async fn claim(&self, batch: &str, component: &str) {
        let holder = RunHolder {
            agent: Agent::new(component).unwrap(),
            host: "host1".into(),
            pid: 4242,
            claim_key: None,
            liveness: None,
        };
        self.store.claim(&id(batch), &ComponentName::new(component).unwrap(), &holder).await.unwrap();
    }

    async fn events(&self, batch: &str) -> Vec<autocomp_model::Event> {
        self.store.get_batch(&id(batch)).await.unwrap().events
    }

    /// Previews `action`, checks it wrote nothing, performs it and checks the preview showed
    /// what was done.
    async fn preview_then_perform(&self, batch: &str, action: &Action) -> (ActionPreview, ActionReport) {
        let head = self.store.head().await.unwrap();
        let preview = self.operator.preview(&id(batch), action, REASON).await.unwrap();
        assert_eq!(self.store.head().await.unwrap(), head, "a preview writes nothing");
        let report = self.operator.perform(&id(batch), action, REASON).await.unwrap();
        let event = report.event.as_ref().expect("an event recorded");
        assert_eq!(preview.changes, report.changes, "{action}");
        assert_eq!(preview.message, report.message, "{action}");
        assert_eq!((preview.records.as_str(), &preview.resets), (event.event_type.as_str(), &event.resets));
        assert_eq!((preview.batch.as_str(), preview.action.clone()), (batch, action.to_string()));
        (preview, report)
    }
}

#[tokio::test]
async fn each_action_previews_the_state_changes_it_then_makes() {
    let f = fixture().await;
    let ok = Outcome::Success;
    let failed = Outcome::Failure;

    f.batch("RERUN", &[("Data_Received", ok), ("Probed", ok), ("Checked", failed)]).await;
    let rerun = Action::Rerun { component: "checker".into() };
    let (preview, _) = f.preview_then_perform("RERUN", &rerun).await;
    assert_eq!(preview.changes, [change("checker", Failed, Ready)]);
    assert_eq!(preview.resets, [ty("Checked")]);

    f.batch("FIRST", &[("Data_Received", ok), ("Probed", ok), ("Checked", failed), ("Audited", ok)]).await;
    let restart = Action::Restart { from: RestartFrom::FirstFailure };
    let (preview, _) = f.preview_then_perform("FIRST", &restart).await;
    assert_eq!(sorted(preview.changes), [change("auditor", Success, Ready), change("checker", Failed, Ready)]);
    assert_eq!(preview.resets, [ty("Checked"), ty("Audited")]);

    f.batch("FROM", &[("Data_Received", ok), ("Probed", ok), ("Checked", ok), ("Audited", ok)]).await;
    let restart = Action::Restart { from: RestartFrom::Type("Probed".into()) };
    let (preview, _) = f.preview_then_perform("FROM", &restart).await;
    assert_eq!(
        sorted(preview.changes),
        [change("auditor", Success, Waiting), change("checker", Success, Waiting), change("probe", Success, Ready)]
    );
    assert_eq!(preview.resets, [ty("Probed"), ty("Checked"), ty("Audited")]);

    f.batch("CANCEL", &[("Data_Received", ok)]).await;
    f.claim("CANCEL", "probe").await;
    let (preview, report) = f.preview_then_perform("CANCEL", &cancel("probe")).await;
    assert_eq!(preview.changes, [change("probe", Working, Failed)]);
    assert!(report.message.contains("cancelled run 1 of probe (held by probe on host1 pid 4242"), "{}", report.message);
    assert!(report.message.contains("recorded Probed (seq "), "{}", report.message);
    assert!(report.message.contains(", failure, flagged cancelled)"), "{}", report.message);
    assert!(f.store.get_batch(&id("CANCEL")).await.unwrap().open_runs.is_empty());

    f.batch("SKIP", &[("Data_Received", ok)]).await;
    let (preview, _) = f.preview_then_perform("SKIP", &skip("probe")).await;
    assert_eq!(
        sorted(preview.changes),
        [change("auditor", Waiting, Ready), change("checker", Waiting, Ready), change("probe", Ready, Skipped)]
    );
    assert!(preview.resets.is_empty());

    f.batch("PRIORITY", &[("Data_Received", ok)]).await;
    let (preview, _) = f.preview_then_perform("PRIORITY", &Action::Prioritize { priority: 5 }).await;
    assert_eq!(preview.changes, [change("expediter", Waiting, Ready)]);
    assert_eq!(preview.records, "Prioritized");
    assert_eq!(f.store.get_batch(&id("PRIORITY")).await.unwrap().priority, 5);
}

/// A `Prioritized` event is activity: a component waiting for the batch to settle has to
/// wait again, and the preview says so.
#[tokio::test]
async fn prioritize_previews_that_it_unsettles_the_batch() {
    let settled = Trigger::builder().requires("Data_Received").settled_for(Duration::from_secs(1)).build();
    let f = fixture_with(vec![("archiver", "Archived", settled)]).await;
    f.batch("B1", &[("Data_Received", Outcome::Success)]).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    autocomp_test_servers::wait_for_async(deadline, "B1 to settle for the archiver", async || {
        let show = f.operator.show(&id("B1")).await.unwrap();
        show.components.iter().any(|(name, state)| name.as_str() == "archiver" && *state == Ready)
    })
    .await;
    let (preview, _) = f.preview_then_perform("B1", &Action::Prioritize { priority: 1 }).await;
    assert_eq!(preview.changes, [change("archiver", Ready, Waiting)]);
}

#[tokio::test]
async fn a_preview_refuses_in_the_words_perform_uses_and_writes_nothing() {
    let f = fixture().await;
    let ok = Outcome::Success;
    f.batch("DONE", &[("Data_Received", ok), ("Probed", ok)]).await;
    f.batch("BUSY", &[("Data_Received", ok), ("Probed", ok)]).await;
    f.claim("BUSY", "probe").await;
    let rerun = |component: &str| Action::Rerun { component: component.into() };
    let cases: Vec<(&str, Action, &str, &str)> = vec![
        ("DONE", rerun("checker"), REASON, "checker has no Checked result on DONE to rerun (it is ready)"),
        ("BUSY", rerun("probe"), REASON, "probe is working on BUSY (run 1 held by probe on host1 pid 4242"),
        ("BUSY", skip("probe"), REASON, "its result would race this skip"),
        ("DONE", skip("probe"), REASON, "probe already succeeded on DONE"),
        ("DONE", cancel("probe"), REASON, "probe has no open run on DONE: nothing to cancel"),
        ("BUSY", Action::Restart { from: RestartFrom::Type("Probed".into()) }, REASON, "race this restart"),
        ("DONE", Action::Restart { from: RestartFrom::FirstFailure }, REASON, "DONE has no failed step"),
        ("DONE", Action::Restart { from: RestartFrom::Type("Checked".into()) }, REASON, "no effective Checked event"),
        ("DONE", Action::Restart { from: RestartFrom::Type("not a type".into()) }, REASON, "--from"),
        ("DONE", rerun("nobody"), REASON, "known: expediter, probe, auditor, checker"),
        ("NOPE", rerun("checker"), REASON, "no such batch is registered"),
        ("DONE", Action::Prioritize { priority: 3 }, "  ", "--reason"),
    ];
    let head = f.store.head().await.unwrap();
    for (batch, action, reason, words) in cases {
        let previewed = f.operator.preview(&id(batch), &action, reason).await.unwrap_err();
        let performed = f.operator.perform(&id(batch), &action, reason).await.unwrap_err();
        assert_eq!(previewed.to_string(), performed.to_string(), "{action}");
        assert_eq!(previewed.code(), performed.code(), "{action}");
        assert!(previewed.to_string().contains(words), "{action}: {previewed}");
    }
    let nameless = f.operator.acting_as("two words");
    let action = Action::Prioritize { priority: 3 };
    let previewed = nameless.preview(&id("DONE"), &action, REASON).await.unwrap_err();
    let performed = nameless.perform(&id("DONE"), &action, REASON).await.unwrap_err();
    assert!(matches!(previewed, OperatorError::Input(ref e) if e.field == "--as"), "{previewed}");
    assert_eq!(previewed.to_string(), performed.to_string());
    assert_eq!(f.store.head().await.unwrap(), head, "nothing was written");
}

#[tokio::test]
async fn bulk_actions_preview_and_act_on_exactly_the_batches_named() {
    let f = fixture().await;
    let (ok, failed) = (Outcome::Success, Outcome::Failure);
    let rerunnable: Vec<String> = (0..12).map(|i| format!("R{i:02}")).collect();
    for batch in &rerunnable {
        f.batch(batch, &[("Data_Received", ok), ("Probed", ok), ("Checked", failed)]).await;
    }
    for batch in ["N1", "N2", "N3"] {
        f.batch(batch, &[("Data_Received", ok), ("Probed", ok)]).await;
    }
    // Rerunnable too, but not named.
    f.batch("OTHER", &[("Data_Received", ok), ("Probed", ok), ("Checked", failed)]).await;
    let mut named: Vec<BatchId> = Vec::new();
    named.extend(rerunnable[..6].iter().map(|b| id(b)));
    named.extend([id("N1"), id("NOPE"), id("R00")]);
    named.extend(rerunnable[6..].iter().map(|b| id(b)));
    named.extend([id("N2"), id("N3")]);
    let rerun = Action::Rerun { component: "checker".into() };

    let head = f.store.head().await.unwrap();
    let preview = f.operator.preview_many(&named, &rerun, REASON).await.unwrap();
    assert_eq!(f.store.head().await.unwrap(), head, "a preview writes nothing");
    assert_eq!((preview.total, preview.applicable), (16, 12));
    let sampled: Vec<&str> = preview.sample.iter().map(|p| p.batch.as_str()).collect();
    assert_eq!(sampled, rerunnable[..10].iter().map(String::as_str).collect::<Vec<_>>());
    let refused: Vec<&str> = preview.refused.iter().map(|(b, _)| b.as_str()).collect();
    assert_eq!(refused, ["N1", "NOPE", "N2", "N3"]);
    for (batch, words) in &preview.refused {
        let alone = f.operator.preview(&id(batch.as_str()), &rerun, REASON).await.unwrap_err();
        assert_eq!(words, &alone.to_string());
    }

    let outcome = f.operator.perform_many(&named, &rerun, REASON).await.unwrap();
    assert!(outcome.stopped.is_none(), "{:?}", outcome.stopped);
    let performed: Vec<&str> = outcome.performed.iter().map(|r| r.batch.as_str()).collect();
    assert_eq!(performed, rerunnable.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(outcome.refused, preview.refused);
    for (previewed, report) in preview.sample.iter().zip(&outcome.performed) {
        assert_eq!((&previewed.message, &previewed.changes), (&report.message, &report.changes));
    }
    assert_eq!(f.store.head().await.unwrap().0, head.0 + 12, "one event per batch performed");
    for untouched in ["OTHER", "N1", "N2", "N3"] {
        assert!(!f.events(untouched).await.iter().any(|e| e.event_type.is_reset()), "{untouched} was reset");
    }
    assert_eq!(f.events("R00").await.iter().filter(|e| e.event_type.is_reset()).count(), 1, "R00 named twice");
}

#[tokio::test]
async fn bulk_input_errors_fail_the_whole_call_before_anything_is_written() {
    let f = fixture().await;
    f.batch("B1", &[("Data_Received", Outcome::Success)]).await;
    let named = [id("B1")];
    let head = f.store.head().await.unwrap();
    let skip_nobody = skip("nobody");
    let skip_probe = skip("probe");
    for (action, reason) in [(&skip_nobody, REASON), (&skip_probe, "")] {
        let previewed = f.operator.preview_many(&named, action, reason).await.unwrap_err();
        let performed = f.operator.perform_many(&named, action, reason).await.unwrap_err();
        assert!(matches!(previewed, OperatorError::Input(_)), "{previewed}");
        assert_eq!(previewed.to_string(), performed.to_string());
    }
    let too_many: Vec<BatchId> = (0..=MAX_BULK_BATCHES).map(|i| id(&format!("B{i}"))).collect();
    let refused = f.operator.perform_many(&too_many, &skip_probe, REASON).await.unwrap_err();
    assert!(refused.to_string().contains("10001 ids"), "{refused}");
    let refused = f.operator.preview_many(&too_many, &skip_probe, REASON).await.unwrap_err();
    assert!(matches!(refused, OperatorError::Input(_)), "{refused}");
    assert_eq!(f.store.head().await.unwrap(), head, "nothing was written");
}

/// A web server runs these on a multi-threaded runtime.
#[tokio::test]
async fn the_actions_can_run_on_any_thread() {
    fn assert_send<T: Send>(_: &T) {}
    let f = fixture().await;
    let action = Action::Prioritize { priority: 1 };
    assert_send(&f.operator.preview(&id("B1"), &action, REASON));
    assert_send(&f.operator.perform(&id("B1"), &action, REASON));
    assert_send(&f.operator.preview_many(&[], &action, REASON));
    assert_send(&f.operator.perform_many(&[], &action, REASON));
}

/// `skip` over a success that counts is refused, naming the batch, the component, the
/// success and its seq and how to force it; forced, it records the skipped success over it.
/// A skipped success may be skipped again.
#[tokio::test]
async fn skip_over_a_success_is_refused_unless_forced() {
    let f = fixture().await;
    let ok = Outcome::Success;
    f.batch("B1", &[("Data_Received", ok), ("Probed", ok)]).await;
    let success = f.events("B1").await.last().unwrap().seq;
    let head = f.store.head().await.unwrap();
    let refused = f.operator.perform(&id("B1"), &skip("probe"), REASON).await.unwrap_err();
    assert!(matches!(refused, OperatorError::Refused(_)), "{refused}");
    assert_eq!(refused.code(), 1);
    let words = refused.to_string();
    for needle in ["probe already succeeded on B1", &format!("success (seq {success}, by test)"), "--force"] {
        assert!(words.contains(needle), "{needle:?} in {words}");
    }
    assert_eq!(f.store.head().await.unwrap(), head, "a refusal writes nothing");

    let forced = Action::Skip { component: "probe".into(), force: true };
    let (preview, report) = f.preview_then_perform("B1", &forced).await;
    assert_eq!(preview.changes, [change("probe", Success, Skipped)]);
    let event = report.event.as_ref().unwrap();
    assert!(event.is_skipped());
    assert_eq!(event.details["forced_over"]["seq"], success.0);
    assert_eq!(
        report.message,
        format!(
            "B1: recorded Probed (seq {}, success, flagged skipped) over probe's success (seq {success}), as forced: \
             the steps after probe may run",
            event.seq
        )
    );
    // What stands now is a skip, not a success: skipping it again needs no force.
    f.operator.perform(&id("B1"), &skip("probe"), REASON).await.unwrap();
}

/// `cancel` with no open run is refused in the words the brief gives, unless asked to record
/// anyway, which says it recorded anyway.
#[tokio::test]
async fn cancel_with_no_open_run_is_refused_unless_recorded_anyway() {
    let f = fixture().await;
    f.batch("B1", &[("Data_Received", Outcome::Success)]).await;
    let head = f.store.head().await.unwrap();
    let refused = f.operator.perform(&id("B1"), &cancel("probe"), REASON).await.unwrap_err();
    assert_eq!(
        refused.to_string(),
        "probe has no open run on B1: nothing to cancel; --record-anyway records a cancelled failure anyway"
    );
    assert_eq!(refused.code(), 1);
    assert_eq!(f.store.head().await.unwrap(), head, "a refusal writes nothing");

    let anyway = Action::Cancel { component: "probe".into(), record_anyway: true };
    let (preview, report) = f.preview_then_perform("B1", &anyway).await;
    assert_eq!(preview.changes, [change("probe", Ready, Failed)]);
    let event = report.event.as_ref().unwrap();
    assert!(event.flag("cancelled") && event.outcome == Outcome::Failure);
    assert_eq!(
        report.message,
        format!(
            "B1: recorded Probed (seq {}, failure, flagged cancelled): probe had no open run; recorded anyway as asked",
            event.seq
        )
    );
}

/// Each answer names the event type, its seq and outcome, and for a Reset the types it
/// supersedes; the JSON says the same.
#[tokio::test]
async fn every_answer_says_exactly_what_it_wrote() {
    let f = fixture().await;
    let (ok, failed) = (Outcome::Success, Outcome::Failure);
    f.batch("B1", &[("Data_Received", ok), ("Probed", ok), ("Checked", failed), ("Audited", ok)]).await;
    let checked = f.events("B1").await[2].seq;
    let rerun = Action::Rerun { component: "checker".into() };
    let report = f.operator.perform(&id("B1"), &rerun, REASON).await.unwrap();
    let seq = report.event.as_ref().unwrap().seq;
    assert_eq!(
        report.message,
        format!("B1: recorded Reset (seq {seq}, success) superseding Checked: checker may run again")
    );
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["already_done"], false);
    assert_eq!(json["event"]["seq"], seq.0);
    assert_eq!((json["event"]["type"].as_str(), json["event"]["outcome"].as_str()), (Some("Reset"), Some("success")));
    assert_eq!(json["event"]["resets"], serde_json::json!(["Checked"]));
    assert_eq!(json["event"]["supersedes"][0]["seq"], checked.0);
    assert_eq!(json["changes"][0], serde_json::json!({"component": "checker", "before": "failed", "after": "ready"}));

    let restart = Action::Restart { from: RestartFrom::Type("Probed".into()) };
    let report = f.operator.perform(&id("B1"), &restart, REASON).await.unwrap();
    let seq = report.event.as_ref().unwrap().seq;
    assert!(
        report.message.starts_with(&format!(
            "B1: recorded Reset (seq {seq}, success) superseding Probed, Audited: restart from Probed (seq "
        )),
        "{}",
        report.message
    );

    let report = f.operator.perform(&id("B1"), &Action::Prioritize { priority: 4 }, REASON).await.unwrap();
    let seq = report.event.as_ref().unwrap().seq;
    assert_eq!(report.message, format!("B1: recorded Prioritized (seq {seq}, success): priority 0 -> 4"));
    let json: serde_json::Value = serde_json::from_str(&report.render_as(crate::operator::Format::Json)).unwrap();
    assert_eq!(json["event"]["flags"], serde_json::json!([]));
    assert!(json["event"].get("resets").is_none(), "{json}");
}

/// `--expect-version`: an input error naming the field, the version given and the version
/// now, nothing written; with the version the batch has, it acts.
#[tokio::test]
async fn an_expected_version_that_moved_refuses_naming_the_field() {
    let f = fixture().await;
    f.batch("B1", &[("Data_Received", Outcome::Success)]).await;
    let prioritize = Action::Prioritize { priority: 2 };
    let preview = f.operator.preview(&id("B1"), &prioritize, REASON).await.unwrap();
    let version = preview.version;
    assert_eq!(version, f.store.get_batch(&id("B1")).await.unwrap().changed_seq);
    f.claim("B1", "probe").await;
    let moved = f.store.get_batch(&id("B1")).await.unwrap().changed_seq;
    assert!(moved > version, "a claim moves the batch's version");
    let head = f.store.head().await.unwrap();
    let refused = f.operator.perform_expecting(&id("B1"), &prioritize, REASON, Some(version), None).await.unwrap_err();
    match &refused {
        OperatorError::Input(e) => {
            assert_eq!((e.field.as_str(), e.value.as_str()), ("--expect-version", version.to_string().as_str()));
            assert!(e.reason.contains(&format!("batch B1 is at version {moved} now")), "{e}");
        }
        other => panic!("not an input error: {other}"),
    }
    assert_eq!(refused.code(), 2);
    assert_eq!(f.store.head().await.unwrap(), head, "nothing written");
    let done = f.operator.perform_expecting(&id("B1"), &prioritize, REASON, Some(moved), None).await.unwrap();
    assert!(!done.already_done);
    assert_eq!(f.store.get_batch(&id("B1")).await.unwrap().priority, 2);
}

/// A request repeated with its key (a retry from a script, a second click) writes nothing
/// and answers "already done" with the earlier seq, for every action; the key used for
/// another request is refused.
#[tokio::test]
async fn a_repeated_key_writes_once_and_says_already_done() {
    let f = fixture().await;
    let (ok, failed) = (Outcome::Success, Outcome::Failure);
    f.batch("B1", &[("Data_Received", ok), ("Probed", ok), ("Checked", failed)]).await;
    f.claim("B1", "auditor").await;
    let actions = [
        (Action::Rerun { component: "checker".into() }, "k-rerun"),
        (Action::Restart { from: RestartFrom::Type("Probed".into()) }, "k-restart"),
        (Action::Skip { component: "checker".into(), force: true }, "k-skip"),
        (cancel("auditor"), "k-cancel"),
        (Action::Prioritize { priority: 9 }, "k-prioritize"),
    ];
    for (action, text) in &actions {
        let k = key(text);
        let first = f.operator.perform_expecting(&id("B1"), action, REASON, None, Some(&k)).await.unwrap();
        assert!(!first.already_done, "{action}");
        let seq = first.event.as_ref().unwrap().seq;
        assert_eq!(first.event.as_ref().unwrap().details["idempotency_key"], *text);
        let head = f.store.head().await.unwrap();
        let again = f.operator.perform_expecting(&id("B1"), action, REASON, None, Some(&k)).await.unwrap();
        assert!(again.already_done, "{action}: {}", again.message);
        assert_eq!(again.event.as_ref().unwrap().seq, seq);
        assert!(again.message.starts_with(&format!("B1: already done: seq {seq} ")), "{}", again.message);
        assert!(again.message.contains("nothing was written now"), "{}", again.message);
        assert!(again.changes.is_empty());
        assert_eq!(f.store.head().await.unwrap(), head, "{action}: the repeat wrote nothing");
        assert_eq!(serde_json::to_value(&again).unwrap()["already_done"], true);
    }
    // The rerun's key, reused for a prioritize: refused, nothing written.
    let head = f.store.head().await.unwrap();
    let reused = f
        .operator
        .perform_expecting(&id("B1"), &Action::Prioritize { priority: 1 }, REASON, None, Some(&key("k-rerun")))
        .await
        .unwrap_err();
    assert!(matches!(reused, OperatorError::Refused(_)), "{reused}");
    assert!(reused.to_string().contains("the key k-rerun was already used on B1 for another request"), "{reused}");
    // The skip's key on another batch: the store knows it (it took it as the append's key).
    f.batch("B2", &[("Data_Received", ok)]).await;
    let head2 = f.store.head().await.unwrap();
    let elsewhere = f
        .operator
        .perform_expecting(
            &id("B2"),
            &Action::Skip { component: "probe".into(), force: false },
            REASON,
            None,
            Some(&key("k-skip")),
        )
        .await
        .unwrap_err();
    assert!(matches!(elsewhere, OperatorError::Refused(_)), "{elsewhere}");
    assert!(elsewhere.to_string().contains("k-skip"), "{elsewhere}");
    assert_eq!(f.store.head().await.unwrap(), head2);
    assert!(head2 > head);
}

/// A confirm acts only on what was previewed: the batch's version and the planned write.
#[tokio::test]
async fn a_confirm_acts_only_if_the_batch_is_as_previewed() {
    let f = fixture().await;
    let ok = Outcome::Success;
    f.batch("B1", &[("Data_Received", ok), ("Probed", ok), ("Checked", Outcome::Failure)]).await;
    let rerun = Action::Rerun { component: "checker".into() };
    let preview = f.operator.preview(&id("B1"), &rerun, REASON).await.unwrap();
    assert_eq!(preview.plan, format!("{}:Reset/success/Checked", preview.version));
    assert_eq!(preview.outcome, Outcome::Success);

    // The batch moves (the auditor records a result): the confirm is refused, nothing written.
    let agent = Agent::new("auditor").unwrap();
    f.store.append_event(&id("B1"), NewEvent::new(ty("Audited"), ok, agent)).await.unwrap();
    let now = f.store.get_batch(&id("B1")).await.unwrap().changed_seq;
    let head = f.store.head().await.unwrap();
    let stale =
        f.operator.perform_confirmed(&id("B1"), &rerun, REASON, &preview.plan, &key("tab-a")).await.unwrap_err();
    assert!(matches!(stale, OperatorError::Refused(_)), "{stale}");
    assert_eq!(
        stale.to_string(),
        format!(
            "the batch changed since your preview (seq {} -> {now}): nothing was done; review and confirm again",
            preview.version
        )
    );
    assert_eq!(f.store.head().await.unwrap(), head);

    // The same version but another write (a token from another action's preview).
    let forged = format!("{now}:Reset/success/Audited");
    let other = f.operator.perform_confirmed(&id("B1"), &rerun, REASON, &forged, &key("tab-b")).await.unwrap_err();
    assert!(other.to_string().contains("what this action would write changed since your preview"), "{other}");
    assert!(other.to_string().contains("(Reset/success/Audited -> Reset/success/Checked)"), "{other}");
    let malformed = f.operator.perform_confirmed(&id("B1"), &rerun, REASON, "soon", &key("tab-c")).await.unwrap_err();
    assert!(matches!(malformed, OperatorError::Input(ref e) if e.field == "plan"), "{malformed}");
    assert_eq!(f.store.head().await.unwrap(), head, "nothing written by any of them");

    // A fresh preview confirmed: one Reset, and its repeat is already done.
    let fresh = f.operator.preview(&id("B1"), &rerun, REASON).await.unwrap();
    let done = f.operator.perform_confirmed(&id("B1"), &rerun, REASON, &fresh.plan, &key("tab-d")).await.unwrap();
    assert_eq!(done.message, fresh.message);
    let again = f.operator.perform_confirmed(&id("B1"), &rerun, REASON, &fresh.plan, &key("tab-d")).await.unwrap();
    assert!(again.already_done && again.event.as_ref().unwrap().seq == done.event.as_ref().unwrap().seq);
    assert_eq!(f.store.head().await.unwrap().0, head.0 + 1, "one event");
}

/// Two tabs preview the cancel of one run; the second confirm finds the batch changed (and
/// now nothing to cancel) and writes nothing.
#[tokio::test]
async fn two_previews_of_one_cancel_write_once() {
    let f = fixture().await;
    f.batch("B1", &[("Data_Received", Outcome::Success)]).await;
    f.claim("B1", "probe").await;
    let action = cancel("probe");
    let (a, b) = (
        f.operator.preview(&id("B1"), &action, REASON).await.unwrap(),
        f.operator.preview(&id("B1"), &action, REASON).await.unwrap(),
    );
    assert_eq!(a.plan, b.plan);
    let done = f.operator.perform_confirmed(&id("B1"), &action, REASON, &b.plan, &key("tab-b")).await.unwrap();
    assert!(done.message.contains("cancelled run 1 of probe"), "{}", done.message);
    let head = f.store.head().await.unwrap();
    let refused = f.operator.perform_confirmed(&id("B1"), &action, REASON, &a.plan, &key("tab-a")).await.unwrap_err();
    assert!(refused.to_string().starts_with("the batch changed since your preview (seq "), "{refused}");
    assert_eq!(f.store.head().await.unwrap(), head);
    // Previewed afresh, it says why there is nothing to do.
    let now = f.operator.preview(&id("B1"), &action, REASON).await.unwrap_err();
    assert!(now.to_string().contains("nothing to cancel"), "{now}");
    let cancelled = f.events("B1").await.iter().filter(|e| e.flag("cancelled")).count();
    assert_eq!(cancelled, 1);
}

/// A double submit: the same confirm twice at once. One writes, the other answers already
/// done, for an append (rerun) and for the store calls that take no key (cancel, prioritize).
#[tokio::test]
async fn the_same_confirm_twice_at_once_writes_once() {
    let f = fixture().await;
    let ok = Outcome::Success;
    f.batch("B1", &[("Data_Received", ok), ("Probed", ok), ("Checked", Outcome::Failure)]).await;
    f.batch("B2", &[("Data_Received", ok)]).await;
    f.claim("B2", "probe").await;
    let cases = [
        ("B1", Action::Rerun { component: "checker".into() }),
        ("B2", cancel("probe")),
        ("B1", Action::Prioritize { priority: 3 }),
    ];
    for (batch, action) in cases {
        let preview = f.operator.preview(&id(batch), &action, REASON).await.unwrap();
        let k = key(&format!("double-{}", action.name()));
        let head = f.store.head().await.unwrap();
        let batch = id(batch);
        let confirm = || f.operator.perform_confirmed(&batch, &action, REASON, &preview.plan, &k);
        let (one, two) = tokio::join!(confirm(), confirm());
        let (one, two) = (one.unwrap(), two.unwrap());
        assert_eq!(f.store.head().await.unwrap().0, head.0 + 1, "{action}: one event");
        assert_ne!(one.already_done, two.already_done, "{action}: {} / {}", one.message, two.message);
        assert_eq!(one.event.as_ref().unwrap().seq, two.event.as_ref().unwrap().seq);
    }
}

/// A bulk confirm acts only on the batches, versions and writes previewed; repeated with its
/// key, it writes nothing; a skip over a success is one of its refusals.
#[tokio::test]
async fn a_bulk_confirm_acts_only_on_what_was_previewed_once() {
    let f = fixture().await;
    let ok = Outcome::Success;
    for batch in ["A1", "A2", "A3"] {
        f.batch(batch, &[("Data_Received", ok)]).await;
    }
    f.batch("DONE", &[("Data_Received", ok), ("Probed", ok)]).await;
    let named = [id("A1"), id("A2"), id("DONE"), id("A3"), id("A1")];
    let action = skip("probe");
    let preview = f.operator.preview_many(&named, &action, REASON).await.unwrap();
    assert_eq!((preview.total, preview.applicable), (4, 3));
    assert_eq!(preview.refused.len(), 1);
    assert!(preview.refused[0].1.contains("probe already succeeded on DONE"), "{:?}", preview.refused);
    let (count, digest) = preview.plan.split_once(':').unwrap();
    assert_eq!((count, digest.len()), ("4", 64));
    // The order named does not matter, the set does.
    let reordered = [id("A3"), id("DONE"), id("A2"), id("A1")];
    assert_eq!(f.operator.preview_many(&reordered, &action, REASON).await.unwrap().plan, preview.plan);
    let fewer = f.operator.preview_many(&named[..2], &action, REASON).await.unwrap();
    assert_ne!(fewer.plan, preview.plan);

    // One batch moves: refused, nothing written.
    f.claim("A2", "checker").await;
    let head = f.store.head().await.unwrap();
    let bulk = key("bulk-1");
    let stale = f.operator.perform_many_confirmed(&named, &action, REASON, &preview.plan, &bulk).await.unwrap_err();
    assert!(matches!(stale, OperatorError::Refused(_)), "{stale}");
    assert!(stale.to_string().starts_with("the batches changed since your preview (4 batches then, 4 now"), "{stale}");
    assert_eq!(f.store.head().await.unwrap(), head);

    let fresh = f.operator.preview_many(&named, &action, REASON).await.unwrap();
    let outcome = f.operator.perform_many_confirmed(&named, &action, REASON, &fresh.plan, &bulk).await.unwrap();
    assert!(outcome.stopped.is_none());
    assert_eq!(outcome.performed.iter().map(|r| r.batch.as_str()).collect::<Vec<_>>(), ["A1", "A2", "A3"]);
    assert_eq!(outcome.refused.iter().map(|(b, _)| b.as_str()).collect::<Vec<_>>(), ["DONE"]);
    assert_eq!(f.store.head().await.unwrap().0, head.0 + 3);
    let keys: std::collections::BTreeSet<String> = outcome
        .performed
        .iter()
        .map(|r| r.event.as_ref().unwrap().details["idempotency_key"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(keys.len(), 3, "one key per batch: {keys:?}");

    // Submitted again (the batches moved by its own writes): already done, nothing written.
    let head = f.store.head().await.unwrap();
    let again = f.operator.perform_many_confirmed(&named, &action, REASON, &fresh.plan, &bulk).await.unwrap();
    assert!(again.performed.iter().all(|r| r.already_done), "{:?}", again.performed);
    assert_eq!(again.performed.len(), 3);
    assert_eq!(f.store.head().await.unwrap(), head);
    // Submitted again with the filter's batches as they are now (the monitor names them
    // again): a batch nobody previewed is not written.
    f.batch("A4", &[("Data_Received", ok)]).await;
    let head = f.store.head().await.unwrap();
    let widened = [&named[..], &[id("A4")]].concat();
    let again = f.operator.perform_many_confirmed(&widened, &action, REASON, &fresh.plan, &bulk).await.unwrap();
    assert_eq!(again.performed.len(), 3, "{:?}", again.performed);
    assert!(again.performed.iter().all(|r| r.already_done), "{:?}", again.performed);
    let refused: Vec<&str> = again.refused.iter().map(|(b, _)| b.as_str()).collect();
    assert_eq!(refused, ["DONE", "A4"]);
    assert!(again.refused[1].1.contains("a second submit writes nothing new"), "{:?}", again.refused);
    assert_eq!(f.store.head().await.unwrap(), head, "nothing written");
    let malformed = f.operator.perform_many_confirmed(&named, &action, REASON, "4:abc", &bulk).await.unwrap_err();
    assert!(matches!(malformed, OperatorError::Input(ref e) if e.field == "plan"), "{malformed}");
}

/// `acknowledge` closes out a failure, carrying the content it was worked out from (new
/// content still makes the step stale), and refuses what is not one to close: a success, a
/// transient failure being retried, a stale failure, one acknowledged already.
#[tokio::test]
async fn acknowledge_closes_a_failure_and_refuses_what_retries_or_is_redone_by_itself() {
    let f = fixture().await;
    let acknowledge = |component: &str| Action::Acknowledge { component: component.into() };
    f.batch("B1", &[("Data_Received", Outcome::Success)]).await;
    let failed = NewEvent::new(ty("Probed"), Outcome::Failure, Agent::new("probe").unwrap())
        .with_details(serde_json::json!({"summary": "unreadable page", "content_seq": 1}));
    f.store.append_event(&id("B1"), failed).await.unwrap();
    let (preview, report) = f.preview_then_perform("B1", &acknowledge("probe")).await;
    assert_eq!(preview.changes, [change("probe", Failed, ComponentState::Acknowledged)]);
    let event = report.event.unwrap();
    assert!(event.is_acknowledged() && event.content_seq() == Some(autocomp_model::Seq(1)), "{event:?}");
    assert!(event.details["summary"].as_str().unwrap().contains("unreadable page"), "{event:?}");

    let head = f.store.head().await.unwrap();
    let refused = |words: &'static str| {
        move |answer: Result<ActionPreview, OperatorError>| match answer {
            Err(OperatorError::Refused(said)) => assert!(said.contains(words), "{said}"),
            other => panic!("expected a refusal saying {words:?}: {other:?}"),
        }
    };
    refused("acknowledged already")(f.operator.preview(&id("B1"), &acknowledge("probe"), REASON).await);
    f.batch("B2", &[("Data_Received", Outcome::Success), ("Probed", Outcome::Success)]).await;
    refused("has no failure on B2")(f.operator.preview(&id("B2"), &acknowledge("probe"), REASON).await);
    f.batch("B3", &[("Data_Received", Outcome::Success)]).await;
    let transient = NewEvent::new(ty("Probed"), Outcome::Failure, Agent::new("probe").unwrap())
        .with_details(serde_json::json!({"transient": true}));
    f.store.append_event(&id("B3"), transient).await.unwrap();
    refused("transient and retried by itself")(f.operator.preview(&id("B3"), &acknowledge("probe"), REASON).await);
    assert_eq!(f.store.head().await.unwrap().0, head.0 + 6, "only the batches written, no acknowledgement");
}
