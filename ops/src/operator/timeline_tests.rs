//! The timeline from events and open runs, by hand and from a real SQLite store: attempts,
//! waits, runs, abandoned runs and the total, in text and JSON.

use super::*;
use autocomp_model::{Agent, BatchId, RunHolder, RunRef};
use serde_json::json;

const T0: i64 = 1_800_000_000_000;

fn ty(name: &str) -> EventType {
    EventType::new(name).unwrap()
}

fn spec(component: &str, own: &str, requires: &[&str], retry_after: Option<u64>) -> StepSpec {
    StepSpec {
        component: ComponentName::new(component).unwrap(),
        event_type: ty(own),
        requires: requires.iter().map(|t| ty(t)).collect(),
        retry_after: retry_after.map(Duration::from_secs),
    }
}

/// verifier after Data_Received (retried 10 s after a transient failure), archiver after
/// Verified.
fn pipeline() -> Vec<StepSpec> {
    vec![spec("verifier", "Verified", &["Data_Received"], Some(10)), spec("archiver", "Archived", &["Verified"], None)]
}

/// An event at T0 + `secs` s, seq `seq`; `run` the generation of `component`, if any.
fn at(seq: i64, secs: i64, kind: &str, outcome: Outcome, details: Value, run: Option<(&str, i64)>) -> Event {
    Event {
        seq: Seq(seq),
        batch_id: BatchId::new("B1").unwrap(),
        event_type: ty(kind),
        outcome,
        agent: Agent::new("test").unwrap(),
        at: Timestamp(T0 + secs * 1000),
        details,
        run: run.map(|(c, generation)| RunRef { component: ComponentName::new(c).unwrap(), generation }),
        resets: Vec::new(),
    }
}

fn reset(seq: i64, secs: i64, types: &[&str]) -> Event {
    Event {
        event_type: EventType::reset(),
        resets: types.iter().map(|t| ty(t)).collect(),
        ..at(seq, secs, "Reset", Outcome::Success, json!({}), None)
    }
}

fn t(secs: i64) -> Timestamp {
    Timestamp(T0 + secs * 1000)
}

fn s(secs: u64) -> Duration {
    Duration::from_secs(secs)
}

fn build(events: &[Event], open: &[Run]) -> Timeline {
    Timeline::build(&pipeline(), events, None, events.len() as u64, open, t(-5), t(1000))
}

#[test]
fn a_transient_failure_then_a_success_is_two_attempts_with_their_waits_and_runs() {
    let events = vec![
        at(2, 0, "Data_Received", Outcome::Success, json!({}), None),
        // Claimed at 30 s, ran 4 s.
        at(
            3,
            34,
            "Verified",
            Outcome::Failure,
            json!({"duration_ms": 4_000, "transient": true}),
            Some(("verifier", 1)),
        ),
        // Ready again at 44 s (backoff 10 s), started at 50 s, ran 2.5 s.
        at(4, 52, "Verified", Outcome::Success, json!({"duration_ms": 2_500}), Some(("verifier", 2))),
        // Ready at 52 s; started 60 s, ran 20 s.
        at(5, 80, "Archived", Outcome::Success, json!({"duration_ms": 20_000}), Some(("archiver", 1))),
    ];
    let timeline = build(&events, &[]);
    let verifier = &timeline.steps[0];
    assert_eq!(verifier.attempts.len(), 2);
    let (first, second) = (&verifier.attempts[0], &verifier.attempts[1]);
    assert_eq!((first.ready_at, first.start, first.end), (Some(t(0)), t(30), Some(t(34))));
    assert_eq!((first.waited, first.ran, first.state()), (Some(s(30)), s(4), ComponentState::Retrying));
    assert_eq!((first.generation, first.flags.clone()), (Some(1), vec!["transient"]));
    assert_eq!((second.ready_at, second.start), (Some(t(44)), Timestamp(T0 + 49_500)));
    assert_eq!((second.waited, second.ran), (Some(Duration::from_millis(5_500)), Duration::from_millis(2_500)));
    assert_eq!(second.state(), ComponentState::Success);
    assert_eq!(verifier.ready_at, Some(t(0)), "first became ready with Data_Received");
    assert_eq!(verifier.waited(), Some(Duration::from_millis(35_500)));
    assert_eq!(verifier.ran(), Duration::from_millis(6_500));

    let archiver = &timeline.steps[1];
    assert_eq!(archiver.attempts.len(), 1);
    let only = &archiver.attempts[0];
    assert_eq!((only.ready_at, only.start, only.waited, only.ran), (Some(t(52)), t(60), Some(s(8)), s(20)));
    assert_eq!(timeline.total(), Some(s(80)), "first event to the last step's result");
    assert!(!timeline.partial());

    let json = to_json(&timeline);
    assert_eq!(json["total_ms"], 80_000);
    assert_eq!(json["steps"][0]["attempts"][1]["waited_ms"], 5_500);
    assert_eq!(json["steps"][0]["attempts"][0]["outcome"], "failure");
    assert_eq!(json["steps"][0]["attempts"][0]["state"], "retrying");
    assert_eq!(json["steps"][1]["ran_ms"], 20_000);

    let text = timeline.to_text();
    assert!(text.contains(": 1m 20s):"), "{text}");
    let row = text.lines().find(|l| l.trim_start().starts_with("verifier")).unwrap();
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cells[2..], ["35.5s", "6.5s", "2", "success"], "{text}");
    assert!(text.contains("    #1") && text.contains("failure (transient)"), "{text}");
    let archiver_row = text.lines().find(|l| l.trim_start().starts_with("archiver")).unwrap();
    assert_eq!(archiver_row.split_whitespace().skip(2).collect::<Vec<_>>(), ["8.0s", "20.0s", "1", "success"]);
}

#[test]
fn an_open_run_is_working_since_its_claim_and_a_waiting_step_shows_since_when_it_is_ready() {
    let events = vec![
        at(2, 0, "Data_Received", Outcome::Success, json!({}), None),
        at(3, 5, "Verified", Outcome::Success, json!({"duration_ms": 1_000}), Some(("verifier", 1))),
    ];
    let run = Run {
        batch_id: BatchId::new("B1").unwrap(),
        component: ComponentName::new("archiver").unwrap(),
        generation: 3,
        holder: RunHolder {
            agent: Agent::new("a").unwrap(),
            host: "h".into(),
            pid: 1,
            claim_key: None,
            liveness: None,
        },
        started_at: t(900),
        claim_seq: Seq(9),
        state: autocomp_model::RunState::Open,
        ended_at: None,
        transient: false,
    };
    let working = build(&events, std::slice::from_ref(&run));
    let attempt = &working.steps[1].attempts[0];
    assert_eq!((attempt.start_from, attempt.start, attempt.end), (StartFrom::Claim, t(900), None));
    assert_eq!((attempt.waited, attempt.ran, attempt.state()), (Some(s(895)), s(100), ComponentState::Working));
    assert_eq!(working.last_result_at, Some(t(5)), "an open run is no result");

    let waiting = build(&events, &[]);
    assert_eq!((waiting.steps[1].ready_at, waiting.steps[1].attempts.len()), (Some(t(5)), 0));
    assert!(waiting.to_text().contains("archiver"), "every step has its row");
}

#[test]
fn a_rerun_is_ready_at_its_reset_and_an_operator_skip_starts_when_recorded() {
    let events = vec![
        at(2, 0, "Data_Received", Outcome::Success, json!({}), None),
        at(3, 10, "Verified", Outcome::Failure, json!({"duration_ms": 2_000}), Some(("verifier", 1))),
        reset(4, 100, &["Verified"]),
        at(5, 130, "Verified", Outcome::Failure, json!({"duration_ms": 10_000}), Some(("verifier", 2))),
        at(6, 200, "Verified", Outcome::Success, json!({"skipped": true}), None),
    ];
    let timeline = build(&events, &[]);
    let attempts = &timeline.steps[0].attempts;
    assert_eq!(attempts.len(), 3);
    assert_eq!((attempts[1].ready_at, attempts[1].waited), (Some(t(100)), Some(s(20))), "ready at the rerun");
    assert_eq!((attempts[2].start_from, attempts[2].ran, attempts[2].ready_at), (StartFrom::Result, s(0), None));
    assert_eq!(attempts[2].state(), ComponentState::Skipped);
    assert_eq!(attempts[2].generation, None);
}

#[test]
fn a_partial_log_counts_from_the_first_event_and_leaves_unknown_ready_times_unknown() {
    let first = at(2, 0, "Data_Received", Outcome::Success, json!({}), None);
    // The newest events only: Data_Received is not among them.
    let newest = vec![at(900, 50, "Verified", Outcome::Success, json!({"duration_ms": 3_000}), Some(("verifier", 1)))];
    let timeline = Timeline::build(&pipeline(), &newest, Some(&first), 1_500, &[], t(-5), t(60));
    assert!(timeline.partial());
    assert_eq!(timeline.total(), Some(s(50)));
    assert_eq!(timeline.steps[0].attempts[0].waited, None);
    assert_eq!(to_json(&timeline)["steps"][0]["waited_ms"], Value::Null);
    assert!(timeline.basis().contains("from the newest 1 of 1500 events"));
    assert!(timeline.to_text().lines().any(|l| l.starts_with("  verifier") && l.contains(" - ")));
}

#[test]
fn an_empty_log_has_no_total() {
    let timeline = build(&[], &[]);
    assert_eq!((timeline.total(), timeline.first_at), (None, None));
    assert_eq!(timeline.steps.len(), 2);
    assert!(timeline.to_text().contains("timeline (no events yet):"));
}

/// An operator on a SQLite store in `dir` whose pipeline is a verifier (retried at once) and
/// an archiver after it.
async fn verifier_and_archiver(dir: &std::path::Path) -> Operator {
    use autocomp_framework::config::{Backends, ComponentConfig};
    use autocomp_model::{PassOutcome, PassPhase, PassRecord, Trigger};

    let backends = Backends {
        store: Some(format!("sqlite://{}", dir.join("store.db").display())),
        index: Some(format!("local:{}", dir.join("index").display())),
        locks: Some(format!("local:{}", dir.join("locks").display())),
    };
    let operator = Operator::new(dir, backends, Some("tester".into())).unwrap();
    let store = operator.store().await.unwrap();
    let config = ComponentConfig { retry_backoff: Duration::ZERO, ..ComponentConfig::default() };
    for (name, own, requires) in [("verifier", "Verified", "Data_Received"), ("archiver", "Archived", "Verified")] {
        let trigger = Trigger::builder().requires(requires).blocked_by(own).build();
        let descriptor = config.descriptor(ComponentName::new(name).unwrap(), "1.0.0", ty(own), trigger, false);
        let phase =
            PassPhase::Ended { outcome: PassOutcome::Idle, summary: String::new(), duration_ms: 1, work: vec![] };
        store.record_pass(PassRecord { descriptor, host: "host1".into(), phase }).await.unwrap();
    }
    operator
}

/// Through `show` on a real SQLite store: an abandoned run, a transient failure, then a
/// success of `verifier`; then `archiver`'s success.
#[tokio::test]
async fn show_has_the_timeline_of_a_retried_step_from_a_real_store() {
    use autocomp_model::{BatchType, NewBatch, NewEvent};

    let dir = tempfile::tempdir().unwrap();
    let operator = verifier_and_archiver(dir.path()).await;
    let store = operator.store().await.unwrap();
    let b1 = BatchId::new("B1").unwrap();
    store.create_batch(NewBatch::new(b1.clone(), BatchType::new("RoundTrip").unwrap())).await.unwrap();
    let agent = Agent::new("test").unwrap();
    let received = NewEvent::new(ty("Data_Received"), Outcome::Success, agent.clone());
    store.append_event(&b1, received).await.unwrap();
    let holder = RunHolder { agent: agent.clone(), host: "h".into(), pid: 1, claim_key: None, liveness: None };
    let (verifier, archiver) = (ComponentName::new("verifier").unwrap(), ComponentName::new("archiver").unwrap());
    let result = |own: &str, outcome, details: Value, component: &ComponentName, generation| {
        NewEvent::new(ty(own), outcome, agent.clone()).with_details(details).in_run(component.clone(), generation)
    };
    // The first claim's holder dies: the next claim abandons it.
    store.claim(&b1, &verifier, &holder).await.unwrap();
    let second = store.claim(&b1, &verifier, &holder).await.unwrap().generation();
    let failure = json!({"duration_ms": 0, "transient": true, "summary": "mount not ready"});
    store.append_event(&b1, result("Verified", Outcome::Failure, failure, &verifier, second)).await.unwrap();
    let third = store.claim(&b1, &verifier, &holder).await.unwrap().generation();
    let success = json!({"duration_ms": 0});
    store.append_event(&b1, result("Verified", Outcome::Success, success.clone(), &verifier, third)).await.unwrap();
    let run = store.claim(&b1, &archiver, &holder).await.unwrap().generation();
    store.append_event(&b1, result("Archived", Outcome::Success, success, &archiver, run)).await.unwrap();
    let events = store.get_batch(&b1).await.unwrap().events;
    let when = |kind: &str, n: usize| events.iter().filter(|e| e.event_type.as_str() == kind).nth(n).unwrap().at;

    let view = operator.show_page(&BatchId::new("B1").unwrap(), crate::operator::LogSpan::default()).await.unwrap();
    let steps = &view.timeline.steps;
    let attempts = &steps[0].attempts;
    assert_eq!(attempts.len(), 2, "the failure and the success; the abandoned run is only counted");
    assert_eq!(steps[0].abandoned, Some(1));
    assert_eq!((attempts[0].generation, attempts[1].generation), (Some(second), Some(third)));
    assert_eq!(attempts[0].state(), ComponentState::Retrying);
    assert_eq!(attempts[1].state(), ComponentState::Success);
    // Ready with Data_Received, then again at the transient failure (no backoff).
    assert_eq!(
        (attempts[0].ready_at, attempts[1].ready_at),
        (Some(when("Data_Received", 0)), Some(when("Verified", 0)))
    );
    assert_eq!(attempts[0].waited, Some(when("Verified", 0).since(when("Data_Received", 0))));
    assert_eq!(attempts[1].waited, Some(when("Verified", 1).since(when("Verified", 0))));
    assert_eq!((attempts[0].ran, attempts[1].ran), (Duration::ZERO, Duration::ZERO));
    assert_eq!(steps[1].attempts[0].waited, Some(when("Archived", 0).since(when("Verified", 1))));
    assert_eq!(steps[1].abandoned, Some(0));
    let total = when("Archived", 0).since(when("Data_Received", 0));
    assert_eq!(view.timeline.total(), Some(total));

    let json = view.to_json();
    assert_eq!(json["timeline"]["total_ms"], total.as_millis() as u64);
    assert_eq!(json["timeline"]["steps"][0]["attempts"].as_array().unwrap().len(), 2);
    assert_eq!(json["timeline"]["steps"][0]["abandoned_runs"], 1);
    let text = view.render(crate::operator::Format::Text);
    let row = text.lines().find(|l| l.starts_with("  verifier") && l.contains("(+1 abandoned)"));
    assert!(row.is_some_and(|row| row.ends_with("success")), "{text}");
    assert!(text.contains("    #1") && text.contains("failure (transient)"), "{text}");
}

#[test]
fn durations_read_in_the_unit_that_fits() {
    assert_eq!(duration_text(Duration::from_millis(350)), "350ms");
    assert_eq!(duration_text(Duration::from_millis(2_549)), "2.5s");
    assert_eq!(duration_text(Duration::from_millis(65_900)), "1m 5s");
    assert_eq!(duration_text(s(7_390)), "2h 3m 10s");
}

/// The timeline's JSON as a value, to index into.
fn to_json(timeline: &Timeline) -> Value {
    serde_json::to_value(timeline.json()).unwrap()
}
