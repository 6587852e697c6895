//! Previews against a real SQLite store: a preview writes nothing, refuses in the words
//! `perform` uses, and shows the state changes `perform` then reports; bulk actions act on
//! exactly the batches named.

use std::sync::Arc;
use std::time::Duration;

use autocomp_model::{
    Agent, BatchId, BatchType, ComponentName, ComponentState, EventType, NewBatch, NewEvent, Outcome, RunHolder,
    Trigger,
};
use autocomp_store::ObjectStore;

use super::{Action, ActionPreview, ActionReport, MAX_BULK_BATCHES, RestartFrom, StateChange};
use crate::operator::{Operator, OperatorError};
use autocomp_framework::config::Backends;

use ComponentState::{Failed, Ready, Success, Waiting, Working};

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
        let holder =
            RunHolder { agent: Agent::new(component).unwrap(), host: "host1".into(), pid: 4242, claim_key: None };
        self.store.claim(&id(batch), &ComponentName::new(component).unwrap(), &holder).await.unwrap();
    }

    async fn events(&self, batch: &str) -> Vec<autocomp_model::Event> {
        self.store.get_batch(&id(batch)).await.unwrap().events
    }

    /// Previews `action`, checks it wrote nothing, performs it and checks the preview showed
    /// what was done.
    async fn preview_then_perform(&self, batch: &str, action: &Action) -> (ActionPreview, ActionReport) {
        let head = self.store.head().await.unwrap();
        let preview = self.operator.preview(batch, action, REASON).await.unwrap();
        assert_eq!(self.store.head().await.unwrap(), head, "a preview writes nothing");
        let report = self.operator.perform(batch, action, REASON).await.unwrap();
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
    let (preview, report) = f.preview_then_perform("CANCEL", &Action::Cancel { component: "probe".into() }).await;
    assert_eq!(preview.changes, [change("probe", Working, Failed)]);
    assert!(report.message.contains("cancelled run 1 of probe (held by probe on host1 pid 4242"), "{}", report.message);
    assert!(f.store.get_batch(&id("CANCEL")).await.unwrap().open_runs.is_empty());

    f.batch("SKIP", &[("Data_Received", ok)]).await;
    let (preview, _) = f.preview_then_perform("SKIP", &Action::Skip { component: "probe".into() }).await;
    assert_eq!(
        sorted(preview.changes),
        [change("auditor", Waiting, Ready), change("checker", Waiting, Ready), change("probe", Ready, Success)]
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
        let show = f.operator.show("B1").await.unwrap();
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
        ("BUSY", Action::Skip { component: "probe".into() }, REASON, "its result would race this skip"),
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
        let previewed = f.operator.preview(batch, &action, reason).await.unwrap_err();
        let performed = f.operator.perform(batch, &action, reason).await.unwrap_err();
        assert_eq!(previewed.to_string(), performed.to_string(), "{action}");
        assert_eq!(previewed.code(), performed.code(), "{action}");
        assert!(previewed.to_string().contains(words), "{action}: {previewed}");
    }
    let nameless = f.operator.acting_as("two words");
    let action = Action::Prioritize { priority: 3 };
    let previewed = nameless.preview("DONE", &action, REASON).await.unwrap_err();
    let performed = nameless.perform("DONE", &action, REASON).await.unwrap_err();
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
        let alone = f.operator.preview(batch.as_str(), &rerun, REASON).await.unwrap_err();
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
    let skip_nobody = Action::Skip { component: "nobody".into() };
    let skip_probe = Action::Skip { component: "probe".into() };
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
    assert_send(&f.operator.preview("B1", &action, REASON));
    assert_send(&f.operator.perform("B1", &action, REASON));
    assert_send(&f.operator.preview_many(&[], &action, REASON));
    assert_send(&f.operator.perform_many(&[], &action, REASON));
}
