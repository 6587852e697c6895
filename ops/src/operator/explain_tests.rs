//! `explain` against a real SQLite store and local index: a batch held up several steps back
//! names the step and the failure at the root, not only the clause next to it; the index's
//! answer to each clause is the store's.

use std::time::Duration;

use autocomp_model::{
    Agent, Batch, BatchId, BatchType, ComponentName, EventType, NewBatch, NewEvent, Outcome, Trigger,
};
use autocomp_sboi::IndexEngine;
use autocomp_store::prelude::*;
use autocomp_store::{ObjectStore, SqliteStore};
use serde_json::json;

use super::{all_hold, checks};
use crate::operator::Operator;
use crate::operator::three_steps_tests::{ThreeSteps, three_steps};
use autocomp_framework::config::Backends;

fn ty(name: &str) -> EventType {
    EventType::new(name).unwrap()
}

fn batch_id(text: &str) -> BatchId {
    BatchId::new(text).unwrap()
}

fn component(name: &str) -> ComponentName {
    ComponentName::new(name).unwrap()
}

#[tokio::test]
async fn explain_follows_the_requires_chain_to_the_failure_that_holds_the_batch_up() {
    let ThreeSteps { operator, store, dir: _dir } = three_steps().await;
    let id = autocomp_model::BatchId::new("B1").unwrap();
    store.create_batch(NewBatch::new(id.clone(), BatchType::new("RoundTrip").unwrap())).await.unwrap();
    let agent = Agent::new("test").unwrap();
    let received = NewEvent::new(EventType::new("Data_Received").unwrap(), Outcome::Success, agent.clone());
    store.append_event(&id, received).await.unwrap();
    let failed = NewEvent::new(EventType::new("Verified").unwrap(), Outcome::Failure, agent)
        .with_details(json!({"summary": "2 files differ from the manifest"}));
    let failure = store.append_event(&id, failed).await.unwrap();

    let archiver = operator.explain(&batch_id("B1"), &component("archiver")).await.unwrap();
    assert_eq!(
        archiver.held_up_by,
        [
            "archiver waits for Checked: checker is waiting".to_string(),
            format!(
                "checker waits for Verified: verifier failed at seq {}: 2 files differ from the manifest",
                failure.seq
            ),
        ]
    );
    let text = archiver.render(crate::operator::Format::Text);
    assert!(text.contains("because checker waits for Verified: verifier failed at seq"), "{text}");
    assert_eq!(archiver.to_json()["held_up_by"].as_array().map(Vec::len), Some(2));

    // The step next to the failure names it directly; the failed step itself is held up by nothing.
    assert_eq!(operator.explain(&batch_id("B1"), &component("checker")).await.unwrap().held_up_by.len(), 1);
    let verifier = operator.explain(&batch_id("B1"), &component("verifier")).await.unwrap();
    assert!(verifier.held_up_by.is_empty());
    // Its verdict is its result and why, not "not ready: blocked_by Verified".
    let verdict = format!("failed at seq {}: 2 files differ from the manifest (a rerun tries again)", failure.seq);
    assert_eq!(verifier.verdict(), verdict);
}

#[tokio::test]
async fn explain_says_a_held_component_is_held_and_a_human_step_waits_for_a_person() {
    let dir = tempfile::tempdir().unwrap();
    let backends = Backends {
        store: Some(format!("sqlite://{}", dir.path().join("store.db").display())),
        index: Some(format!("local:{}", dir.path().join("index").display())),
        locks: Some(format!("local:{}", dir.path().join("locks").display())),
    };
    let operator = Operator::new(dir.path(), backends, Some("ann".into())).unwrap();
    let store = operator.store().await.unwrap();
    let trigger = Trigger::builder().requires("Data_Received").blocked_by("Verified").build();
    autocomp_framework::testing::register_component(store.as_ref(), "verifier", "Verified", trigger).await;
    let step = crate::operator::HumanStep {
        name: "qa".into(),
        event_type: "Approved".into(),
        requires: vec!["Data_Received".into()],
        ..Default::default()
    };
    operator.declare_step(&step, "manual QA").await.unwrap();
    let id = autocomp_model::BatchId::new("B1").unwrap();
    store.create_batch(NewBatch::new(id.clone(), BatchType::new("RoundTrip").unwrap())).await.unwrap();
    let received = NewEvent::new(EventType::new("Data_Received").unwrap(), Outcome::Success, Agent::new("t").unwrap());
    store.append_event(&id, received).await.unwrap();

    let qa = operator.explain(&batch_id("B1"), &component("qa")).await.unwrap();
    assert!(qa.verdict().starts_with("waiting for a person: every clause holds"), "{}", qa.verdict());
    assert_eq!(qa.state, autocomp_model::ComponentState::Person);

    let pause = crate::operator::SteerAction::Pause { scope: crate::operator::Scope::Component("verifier".into()) };
    operator.steer(&pause, "disk swap", None).await.unwrap();
    let verifier = operator.explain(&batch_id("B1"), &component("verifier")).await.unwrap();
    let verdict = verifier.verdict();
    assert!(verdict.starts_with("held: paused by operator:ann since "), "{verdict}");
    assert!(verdict.ends_with(": disk swap (ready otherwise)"), "{verdict}");
    assert_eq!(verifier.to_json()["held"].as_str().map(|h| h.contains("disk swap")), Some(true));
}

/// Every batch in the store, whole.
async fn all_batches(store: &dyn ObjectStore) -> Vec<Batch> {
    store.list_batches(None, 1_000).await.unwrap()
}

/// A trigger per kind of clause (two for `settled_for`: a long quiet and none).
fn triggers_of_every_clause() -> [Trigger; 7] {
    [
        Trigger { requires: vec![ty("Data_Received")], blocked_by: vec![ty("Checked")], ..Trigger::default() },
        Trigger { repeat_on_change: vec![ty("Indexed")], ..Trigger::default() },
        Trigger { transiently_failed: vec![ty("Checked")], ..Trigger::default() },
        Trigger { types: vec![BatchType::new("Other").unwrap()], ..Trigger::default() },
        Trigger { batches: vec![BatchId::new("B1").unwrap(), BatchId::new("B3").unwrap()], ..Trigger::default() },
        Trigger { settled_for: Some(Duration::from_secs(3600)), ..Trigger::default() },
        Trigger { settled_for: Some(Duration::ZERO), ..Trigger::default() },
    ]
}

/// The index side of `explain` answers each clause as the store does, on batches that
/// exercise every clause (the index is caught up, so freshness plays no part).
#[tokio::test]
async fn index_clauses_agree_with_the_store_clause_by_clause() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("store.db")).await.unwrap();
    let agent = Agent::new("test").unwrap();
    let event = |t: &str, outcome| NewEvent::new(ty(t), outcome, agent.clone());
    let histories: Vec<(&str, Vec<NewEvent>)> = vec![
        ("B1", vec![event("Data_Received", Outcome::Success)]),
        ("B2", vec![event("Data_Received", Outcome::Success), event("Checked", Outcome::Failure)]),
        (
            "B3",
            vec![
                event("Data_Received", Outcome::Success),
                event("Checked", Outcome::Failure).with_details(json!({"transient": true})),
            ],
        ),
        ("B4", vec![event("Data_Received", Outcome::Success), event("Indexed", Outcome::Success)]),
        ("B5", vec![event("Data_Received", Outcome::Failure)]),
        (
            "B6",
            vec![
                event("Data_Received", Outcome::Success),
                event("Checked", Outcome::Success),
                NewEvent::reset(vec![ty("Checked")], agent.clone(), json!({})),
            ],
        ),
        ("B7", vec![]),
    ];
    for (id, events) in histories {
        let id = BatchId::new(id).unwrap();
        store.create_batch(NewBatch::new(id.clone(), BatchType::new("RoundTrip").unwrap())).await.unwrap();
        for event in events {
            store.append_event(&id, event).await.unwrap();
        }
    }
    // B4's content changed after it was indexed: `Indexed` is now old.
    store.record_content_change(&BatchId::new("B4").unwrap(), serde_json::Map::new()).await.unwrap();
    let engine = IndexEngine::open(dir.path().join("index")).unwrap();
    engine.catch_up(&store).await.unwrap();

    let triggers = triggers_of_every_clause();
    let mut compared = 0;
    for batch in all_batches(&store).await {
        let indexed = engine.get(&batch.id).unwrap().expect("indexed");
        for trigger in &triggers {
            for check in checks(trigger, &batch, Some(&indexed)) {
                assert_eq!(Some(check.store), check.index, "{} {}", batch.id, check.clause);
                compared += 1;
            }
            let ready_in_index = engine.query_at(trigger, batch.as_of).unwrap().contains(&batch.id);
            assert_eq!(all_hold(&checks(trigger, &batch, Some(&indexed))).1, Some(ready_in_index), "{}", batch.id);
        }
    }
    assert!(compared >= 7 * 8, "compared {compared} clauses");
}
