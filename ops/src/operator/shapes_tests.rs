//! The JSON (and text) every action, preview and steering answer prints, pinned byte for
//! byte on a real SQLite store: the views are types now, and these say the output did not
//! change when they became so. Times the store assigns are put as `<at>` and `<started>`.

use std::sync::Arc;

use autocomp_model::{
    Agent, BatchId, BatchType, ComponentName, IdempotencyKey, NewBatch, NewEvent, Outcome, RunHolder, Seq, Timestamp,
    Trigger,
};
use autocomp_store::ObjectStore;

use super::{
    Action, ActionReport, Alert, AlertsView, Format, NewBatchRequest, Operator, RestartFrom, Scope, SteerAction,
    SteerReport,
};
use autocomp_framework::config::Backends;

const REASON: &str = "the disk was full";

struct Fixture {
    operator: Operator,
    store: Arc<dyn ObjectStore>,
    _dir: tempfile::TempDir,
}

/// An operator (`tester`) on a fresh store whose registry holds `probe` (records `Probed`
/// on `Data_Received`) and `checker` (records `Checked` on `Probed`).
async fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let store_url = format!("sqlite://{}", dir.path().join("store.db").display());
    let backends = Backends { store: Some(store_url), ..Backends::default() };
    let operator = Operator::new(dir.path(), backends, Some("tester".into())).unwrap();
    let store = operator.store().await.unwrap();
    for (name, event_type, requires) in [("probe", "Probed", "Data_Received"), ("checker", "Checked", "Probed")] {
        let trigger = Trigger::builder().requires(requires).build();
        autocomp_framework::testing::register_component(store.as_ref(), name, event_type, trigger).await;
    }
    Fixture { operator, store, _dir: dir }
}

fn id(text: &str) -> BatchId {
    BatchId::new(text).unwrap()
}

fn component(name: &str) -> ComponentName {
    ComponentName::new(name).unwrap()
}

impl Fixture {
    async fn batch(&self, batch: &str, events: &[(&str, Outcome)]) {
        let batch = id(batch);
        self.store.create_batch(NewBatch::new(batch.clone(), BatchType::new("RoundTrip").unwrap())).await.unwrap();
        for (event_type, outcome) in events {
            let event = NewEvent::new(
                autocomp_model::EventType::new(*event_type).unwrap(),
                *outcome,
                Agent::new("test").unwrap(),
            );
            self.store.append_event(&batch, event).await.unwrap();
        }
    }

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
}

/// `text` with each time (`2026-...`, in words and in JSON alike) put as `<name>`.
fn timeless(text: &str, times: &[(&str, Timestamp)]) -> String {
    times.iter().fold(text.to_owned(), |text, (name, at)| text.replace(&at.to_string(), &format!("<{name}>")))
}

fn report_json(report: &ActionReport) -> String {
    let times: Vec<_> = report.event.iter().map(|e| ("at", e.at)).collect();
    timeless(&report.render_as(Format::Json), &times)
}

#[tokio::test]
async fn a_rerun_report_names_the_reset_and_what_it_supersedes() {
    let f = fixture().await;
    f.batch("B1", &[("Data_Received", Outcome::Success), ("Probed", Outcome::Success), ("Checked", Outcome::Failure)])
        .await;
    let report = f.operator.rerun(&id("B1"), &component("checker"), REASON).await.unwrap();
    assert_eq!(report_json(&report), RERUN_JSON);
    assert_eq!(report.render_as(Format::Text), RERUN_TEXT);
}

const RERUN_JSON: &str = r#"{
  "already_done": false,
  "batch": "B1",
  "changes": [
    {
      "after": "ready",
      "before": "failed",
      "component": "checker"
    }
  ],
  "event": {
    "agent": "operator:tester",
    "at": "<at>",
    "flags": [],
    "outcome": "success",
    "resets": [
      "Checked"
    ],
    "seq": 5,
    "supersedes": [
      {
        "agent": "test",
        "outcome": "failure",
        "seq": 4,
        "type": "Checked"
      }
    ],
    "type": "Reset"
  },
  "message": "B1: recorded Reset (seq 5, success) superseding Checked: checker may run again"
}
"#;
const RERUN_TEXT: &str = r#"B1: recorded Reset (seq 5, success) superseding Checked: checker may run again
  checker: failed -> ready
"#;

#[tokio::test]
async fn a_forced_skip_a_cancel_a_prioritize_and_an_add_print_their_events() {
    let f = fixture().await;
    f.batch("B1", &[("Data_Received", Outcome::Success), ("Probed", Outcome::Success), ("Checked", Outcome::Success)])
        .await;
    let skip = Action::Skip { component: "checker".into(), force: true };
    let report = f.operator.perform(&id("B1"), &skip, REASON).await.unwrap();
    assert_eq!(report_json(&report), SKIP_JSON);

    f.batch("B2", &[("Data_Received", Outcome::Success), ("Probed", Outcome::Success)]).await;
    f.claim("B2", "checker").await;
    let started = f.store.open_runs(None).await.unwrap()[0].started_at;
    // The cancel's time is told from the claim's below: past the claim's millisecond first.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while autocomp_model::Timestamp::now() <= started && std::time::Instant::now() < deadline {
        tokio::task::yield_now().await;
    }
    let report = f.operator.cancel(&id("B2"), &component("checker"), REASON).await.unwrap();
    let times = [("started", started), ("at", report.event.as_ref().unwrap().at)];
    assert_eq!(timeless(&report.render_as(Format::Json), &times), CANCEL_JSON);
    assert_eq!(timeless(&report.render_as(Format::Text), &times), CANCEL_TEXT);

    let report = f.operator.prioritize(&id("B2"), 7, REASON).await.unwrap();
    assert_eq!(report_json(&report), PRIORITIZE_JSON);

    let report = f
        .operator
        .add(&id("B3"), "RoundTrip", NewBatchRequest { priority: 2, location: None, reason: Some(REASON) })
        .await
        .unwrap();
    assert_eq!(report.render_as(Format::Json), ADD_JSON);
    assert_eq!(report.render_as(Format::Text), ADD_TEXT);
}

const SKIP_JSON: &str = r#"{
  "already_done": false,
  "batch": "B1",
  "changes": [
    {
      "after": "skipped",
      "before": "success",
      "component": "checker"
    }
  ],
  "event": {
    "agent": "operator:tester",
    "at": "<at>",
    "flags": [
      "skipped"
    ],
    "outcome": "success",
    "seq": 5,
    "type": "Checked"
  },
  "message": "B1: recorded Checked (seq 5, success, flagged skipped) over checker's success (seq 4), as forced: the steps after checker may run"
}
"#;
const CANCEL_JSON: &str = r#"{
  "already_done": false,
  "batch": "B2",
  "changes": [
    {
      "after": "failed",
      "before": "working",
      "component": "checker"
    }
  ],
  "event": {
    "agent": "operator:tester",
    "at": "<at>",
    "flags": [
      "cancelled"
    ],
    "outcome": "failure",
    "seq": 10,
    "type": "Checked"
  },
  "message": "B2: recorded Checked (seq 10, failure, flagged cancelled): cancelled run 1 of checker (held by checker on host1 pid 4242 since <started>); the worker is fenced and stops within seconds"
}
"#;
const CANCEL_TEXT: &str = r#"B2: recorded Checked (seq 10, failure, flagged cancelled): cancelled run 1 of checker (held by checker on host1 pid 4242 since <started>); the worker is fenced and stops within seconds
  checker: working -> failed
"#;
const PRIORITIZE_JSON: &str = r#"{
  "already_done": false,
  "batch": "B2",
  "changes": [],
  "event": {
    "agent": "operator:tester",
    "at": "<at>",
    "flags": [],
    "outcome": "success",
    "seq": 11,
    "type": "Prioritized"
  },
  "message": "B2: recorded Prioritized (seq 11, success): priority 0 -> 7"
}
"#;
const ADD_JSON: &str = r#"{
  "already_done": false,
  "batch": "B3",
  "changes": [],
  "event": null,
  "message": "B3: registered (type RoundTrip, priority 2, seq 12); no event recorded: it waits for its first one"
}
"#;
const ADD_TEXT: &str = r#"B3: registered (type RoundTrip, priority 2, seq 12); no event recorded: it waits for its first one
"#;

#[tokio::test]
async fn a_repeated_key_prints_already_done() {
    let f = fixture().await;
    f.batch("B1", &[("Data_Received", Outcome::Success), ("Probed", Outcome::Failure)]).await;
    let key = IdempotencyKey::new("k-1").unwrap();
    let rerun = Action::Rerun { component: "probe".into() };
    f.operator.perform_expecting(&id("B1"), &rerun, REASON, None, Some(&key)).await.unwrap();
    let again = f.operator.perform_expecting(&id("B1"), &rerun, REASON, Some(Seq(3)), Some(&key)).await.unwrap();
    assert_eq!(report_json(&again), ALREADY_JSON);
}

const ALREADY_JSON: &str = r#"{
  "already_done": true,
  "batch": "B1",
  "changes": [],
  "event": {
    "agent": "operator:tester",
    "at": "<at>",
    "flags": [],
    "outcome": "success",
    "resets": [
      "Probed"
    ],
    "seq": 4,
    "supersedes": [
      {
        "agent": "test",
        "outcome": "failure",
        "seq": 3,
        "type": "Probed"
      }
    ],
    "type": "Reset"
  },
  "message": "B1: already done: seq 4 — this request recorded Reset (seq 4, success) superseding Probed (by operator:tester at <at>); nothing was written now"
}
"#;

#[tokio::test]
async fn a_dry_run_prints_the_plan_and_its_token() {
    let f = fixture().await;
    f.batch("B1", &[("Data_Received", Outcome::Success), ("Probed", Outcome::Success), ("Checked", Outcome::Failure)])
        .await;
    let restart = Action::Restart { from: RestartFrom::Type("Probed".into()) };
    let preview = f.operator.preview(&id("B1"), &restart, REASON).await.unwrap();
    assert_eq!(preview.render_as(Format::Json), RESTART_PREVIEW_JSON);
    assert_eq!(preview.render_as(Format::Text), RESTART_PREVIEW_TEXT);
}

const RESTART_PREVIEW_JSON: &str = r#"{
  "action": "restart from Probed: supersede it and every result recorded after it",
  "batch": "B1",
  "changes": [
    {
      "after": "ready",
      "before": "success",
      "component": "probe"
    },
    {
      "after": "waiting",
      "before": "failed",
      "component": "checker"
    }
  ],
  "message": "B1: recorded Reset (seq 5, success) superseding Probed, Checked: restart from Probed (seq 3) and everything recorded after it",
  "outcome": "success",
  "plan": "4:Reset/success/Probed,Checked",
  "records": "Reset",
  "resets": [
    "Probed",
    "Checked"
  ],
  "version": 4
}
"#;
const RESTART_PREVIEW_TEXT: &str = r#"dry run, nothing written: restart from Probed: supersede it and every result recorded after it
it would say: B1: recorded Reset (seq 5, success) superseding Probed, Checked: restart from Probed (seq 3) and everything recorded after it
  probe: success -> ready
  checker: failed -> waiting
batch version 4: add `--expect-version 4` to act only if B1 has not changed since
"#;

#[tokio::test]
async fn steering_previews_and_reports_print_the_runs_and_the_entry() {
    let f = fixture().await;
    f.batch("B1", &[("Data_Received", Outcome::Success), ("Probed", Outcome::Success)]).await;
    f.claim("B1", "checker").await;
    let started = f.store.open_runs(None).await.unwrap()[0].started_at;
    let pause = SteerAction::Pause { scope: Scope::Component("checker".into()) };
    let preview = f.operator.preview_steer(&pause, REASON).await.unwrap();
    let times = [("started", started)];
    assert_eq!(timeless(&preview.render(Format::Json), &times), PAUSE_PREVIEW_JSON);
    assert_eq!(preview.render(Format::Text), PAUSE_PREVIEW_TEXT);
    let report = f.operator.steer(&pause, REASON, Some(preview.version)).await.unwrap();
    let times = [("started", started), ("at", report.entry.as_ref().unwrap().at)];
    assert_eq!(timeless(&report.render(Format::Json), &times), PAUSE_REPORT_JSON);
    let again = f.operator.steer(&pause, REASON, Some(preview.version)).await.unwrap();
    assert_eq!(timeless(&again.render(Format::Json), &times), PAUSE_AGAIN_JSON);

    let pool = SteerAction::SetPool { pool: "tape".into(), size: 2 };
    let preview = f.operator.preview_steer(&pool, REASON).await.unwrap();
    assert_eq!(preview.render(Format::Json), POOL_PREVIEW_JSON);
}

const PAUSE_PREVIEW_JSON: &str = r#"{
  "action": "pause",
  "reruns": [],
  "running": [
    {
      "agent": "checker",
      "batch": "B1",
      "claim_seq": 4,
      "component": "checker",
      "generation": 1,
      "host": "host1",
      "pid": 4242,
      "started_at": "<started>"
    }
  ],
  "summary": "pause checker: claim no new work; running work goes on",
  "version": 0,
  "would": "paused checker"
}
"#;
const PAUSE_PREVIEW_TEXT: &str = r#"pause checker: claim no new work; running work goes on
would record: paused checker
running now (goes on to its result): checker on B1
steering version: 0 (--expect-version)
"#;
const PAUSE_REPORT_JSON: &str = r#"{
  "already_done": false,
  "entry": {
    "at": "<at>",
    "by": "operator:tester",
    "change": {
      "pause": {
        "component": "checker",
        "drain": false
      }
    },
    "reason": "the disk was full",
    "said": "paused checker",
    "version": 1
  },
  "message": "recorded at steering version 1: paused checker",
  "refused": [],
  "reruns": [],
  "running": [
    {
      "agent": "checker",
      "batch": "B1",
      "claim_seq": 4,
      "component": "checker",
      "generation": 1,
      "host": "host1",
      "pid": 4242,
      "started_at": "<started>"
    }
  ]
}
"#;
const PAUSE_AGAIN_JSON: &str = r#"{
  "already_done": true,
  "entry": {
    "at": "<at>",
    "by": "operator:tester",
    "change": {
      "pause": {
        "component": "checker",
        "drain": false
      }
    },
    "reason": "the disk was full",
    "said": "paused checker",
    "version": 1
  },
  "message": "already done at steering version 1: paused checker",
  "refused": [],
  "reruns": [],
  "running": []
}
"#;
const POOL_PREVIEW_JSON: &str = r#"{
  "action": "pool set",
  "reruns": [],
  "running": [],
  "summary": "pool tape: at most 2 batches' work at once",
  "version": 1,
  "would": "pool tape: size 2 (new)"
}
"#;

#[tokio::test]
async fn a_resume_with_reruns_prints_each_rerun_and_refusal() {
    let f = fixture().await;
    f.batch("B1", &[("Data_Received", Outcome::Success), ("Probed", Outcome::Success), ("Checked", Outcome::Failure)])
        .await;
    let rerun = f.operator.rerun(&id("B1"), &component("checker"), REASON).await.unwrap();
    let report = SteerReport {
        message: "recorded at steering version 3: resumed checker".into(),
        entry: None,
        already_done: false,
        running: Vec::new(),
        reruns: vec![rerun],
        refused: vec![(
            id("B2"),
            "checker has no Checked result on B2 to rerun (it is waiting); nothing recorded".into(),
        )],
    };
    assert_eq!(report.render(Format::Json), RESUME_JSON);
    assert_eq!(report.render(Format::Text), RESUME_TEXT);
}

const RESUME_JSON: &str = r#"{
  "already_done": false,
  "entry": null,
  "message": "recorded at steering version 3: resumed checker",
  "refused": [
    {
      "batch": "B2",
      "reason": "checker has no Checked result on B2 to rerun (it is waiting); nothing recorded"
    }
  ],
  "reruns": [
    {
      "batch": "B1",
      "message": "B1: recorded Reset (seq 5, success) superseding Checked: checker may run again"
    }
  ],
  "running": []
}
"#;
const RESUME_TEXT: &str = r#"recorded at steering version 3: resumed checker
B1: recorded Reset (seq 5, success) superseding Checked: checker may run again
B2: not rerun: checker has no Checked result on B2 to rerun (it is waiting); nothing recorded
"#;

#[test]
fn alerts_print_each_alert_with_its_line() {
    // 2026-11-27T12:00:00Z and two hours before.
    let now = Timestamp(1_795_780_800_000);
    let since = Timestamp(now.0 - 7_200_000);
    let view = AlertsView {
        alerts: vec![
            Alert::ReadyTooLong {
                component: ComponentName::new("checker").unwrap(),
                count: 3,
                oldest_since: Some(since),
                threshold: "1h".into(),
            },
            Alert::IndexLag { behind: 12_000, index_seq: 10, store_head: 12_010 },
        ],
        now,
    };
    assert_eq!(view.render(Format::Json), ALERTS_JSON);
    assert_eq!(AlertsView { alerts: Vec::new(), now }.render(Format::Json), "");
}

const ALERTS_JSON: &str = r#"[
  {
    "component": "checker",
    "count": 3,
    "kind": "ready_too_long",
    "message": "checker: 3 batches ready for longer than 1h, the oldest for 2h (`autocomp ready --component checker`)",
    "oldest_since": "2026-11-27T10:00:00.000Z",
    "threshold": "1h"
  },
  {
    "behind": 12000,
    "index_seq": 10,
    "kind": "index_lag",
    "message": "index: 12000 changes behind the store (index at seq 10, store at 12010; is the index service following?)",
    "store_head": 12010
  }
]
"#;

#[tokio::test]
async fn the_details_each_action_records_are_pinned() {
    let f = fixture().await;
    let step = super::HumanStep {
        name: "review".into(),
        event_type: "Reviewed".into(),
        requires: vec!["Checked".into()],
        ..super::HumanStep::default()
    };
    f.operator.declare_step(&step, REASON).await.unwrap();
    let (ok, failed) = (Outcome::Success, Outcome::Failure);
    f.batch("B1", &[("Data_Received", ok), ("Probed", ok), ("Checked", failed)]).await;
    f.batch("B2", &[("Data_Received", ok), ("Probed", ok), ("Checked", ok)]).await;
    f.batch("B3", &[("Data_Received", ok), ("Probed", ok), ("Checked", ok)]).await;
    f.batch("B5", &[("Data_Received", ok), ("Probed", ok), ("Checked", failed)]).await;
    let actions = [
        ("B1", Action::Rerun { component: "checker".into() }),
        ("B5", Action::Restart { from: RestartFrom::FirstFailure }),
        ("B2", Action::Skip { component: "checker".into(), force: true }),
        ("B1", Action::Cancel { component: "probe".into(), record_anyway: true }),
        ("B1", Action::Prioritize { priority: 3 }),
        ("B2", Action::Approve { step: "review".into() }),
        ("B3", Action::Reject { step: "review".into(), restart_from: None }),
    ];
    let mut details = Vec::new();
    for (batch, action) in actions {
        let report = f.operator.perform(&id(batch), &action, REASON).await.unwrap();
        details.push(report.event.unwrap().details);
    }
    f.batch("B4", &[("Data_Received", ok), ("Probed", ok), ("Checked", ok)]).await;
    let reject = Action::Reject { step: "review".into(), restart_from: Some("Probed".into()) };
    details.push(f.operator.perform(&id("B4"), &reject, REASON).await.unwrap().event.unwrap().details);
    let report = f.operator.record_event(&id("B4"), "Data_Received", Outcome::Success, REASON).await.unwrap();
    details.push(report.event.unwrap().details);
    assert_eq!(format!("{:#}", serde_json::Value::Array(details)), DETAILS_JSON);
}

const DETAILS_JSON: &str = r#"[
  {
    "action": "rerun",
    "component": "checker",
    "reason": "the disk was full",
    "summary": "rerun of checker requested by operator:tester: the disk was full",
    "superseded": [
      {
        "agent": "test",
        "outcome": "failure",
        "seq": 4,
        "type": "Checked"
      }
    ]
  },
  {
    "action": "restart",
    "from": "Checked",
    "from_seq": 16,
    "reason": "the disk was full",
    "summary": "restart from Checked (seq 16) requested by operator:tester: the disk was full",
    "superseded": [
      {
        "agent": "test",
        "outcome": "failure",
        "seq": 16,
        "type": "Checked"
      }
    ]
  },
  {
    "action": "skip",
    "component": "checker",
    "forced_over": {
      "agent": "test",
      "seq": 8
    },
    "reason": "the disk was full",
    "skipped": true,
    "summary": "skipped by operator:tester: the disk was full"
  },
  {
    "action": "cancel",
    "cancelled": true,
    "component": "probe",
    "reason": "the disk was full",
    "summary": "cancelled by operator:tester: the disk was full"
  },
  {
    "action": "prioritize",
    "previous_priority": 0,
    "priority": 3,
    "reason": "the disk was full",
    "summary": "priority 0 -> 3 by operator:tester: the disk was full"
  },
  {
    "action": "approve",
    "approved": true,
    "component": "review",
    "reason": "the disk was full",
    "summary": "approved by operator:tester: the disk was full"
  },
  {
    "action": "reject",
    "component": "review",
    "reason": "the disk was full",
    "rejected": true,
    "summary": "rejected by operator:tester: the disk was full"
  },
  {
    "action": "reject",
    "component": "review",
    "from": "Probed",
    "from_seq": 26,
    "reason": "the disk was full",
    "rejected": true,
    "summary": "rejected at review by operator:tester, restart from Probed (seq 26): the disk was full",
    "superseded": [
      {
        "agent": "test",
        "outcome": "success",
        "seq": 26,
        "type": "Probed"
      },
      {
        "agent": "test",
        "outcome": "success",
        "seq": 27,
        "type": "Checked"
      }
    ]
  },
  {
    "action": "event",
    "reason": "the disk was full",
    "summary": "recorded by hand by operator:tester: the disk was full"
  }
]"#;
