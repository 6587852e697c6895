//! The contract of `claim_ready`, a pass's claim round in one transaction, run by the shared
//! suite (`operations.rs`) on SQLite and PostgreSQL and by the service's tests through
//! `HttpStore`: a batch no longer ready is answered as read and nothing is written for it,
//! a claimed one carries what the separate reads (`failed_attempts`, `load_checkpoint`)
//! answer, an unknown one is its own `NotFound`, a hold claims nothing and answers the
//! steering that holds, and a retry with the claim key answers the runs the first one opened.

use autocomp_model::*;
use autocomp_store::*;
use serde_json::json;

fn id(text: &str) -> BatchId {
    BatchId::new(text).unwrap()
}

fn agent(text: &str) -> Agent {
    Agent::new(text).unwrap()
}

fn archiver() -> ComponentName {
    ComponentName::new("archiver").unwrap()
}

fn holder(name: &str, key: Option<&str>) -> RunHolder {
    RunHolder {
        agent: agent(&format!("{name}/1.0@host#1")),
        host: "host".into(),
        pid: 1,
        claim_key: key.map(|key| IdempotencyKey::new(key).unwrap()),
        liveness: None,
    }
}

/// The archiver: ready once `Checked` succeeded, until it `Archived`.
fn request(batches: &[&str], holder: RunHolder) -> ReadyClaimRequest {
    let descriptor = serde_json::from_value(json!({
        "name": "archiver", "version": "1.0", "event_type": "Archived",
        "trigger": {"requires": ["Checked"], "blocked_by": ["Archived"]},
        "max_attempts": 3, "retry_backoff": "90s", "queue_size": 5, "max_runtime": "2h",
    }))
    .unwrap();
    ReadyClaimRequest {
        batches: batches.iter().map(|text| id(text)).collect(),
        descriptor,
        holder,
        force: false,
        known_steering: None,
        exclusive: false,
        takeovers: Vec::new(),
    }
}

async fn register(store: &dyn ObjectStore, batch: &str, checked: Option<Outcome>) {
    let new = NewBatch::new(id(batch), BatchType::new("RoundTrip").unwrap()).with_location(format!("/in/{batch}"));
    store.create_batch(new).await.unwrap();
    if let Some(outcome) = checked {
        let checked = NewEvent::new(EventType::new("Checked").unwrap(), outcome, agent("checker"));
        store.append_event(&id(batch), checked).await.unwrap();
    }
}

fn steer(change: SteeringChange) -> SteeringRequest {
    SteeringRequest { change, by: agent("operator:ann"), reason: "maintenance".into(), expect_version: None }
}

/// A ready batch is claimed with the attempts and checkpoint the separate reads answer and
/// its snapshot as read before the claim; a batch no longer ready by the time of the claim,
/// one never ready, and an unknown one are answered each on its own, nothing written for them.
pub(crate) async fn claim_ready_claims_the_ready_and_writes_nothing_for_the_rest(store: &dyn ObjectStore) {
    register(store, "R1", Some(Outcome::Success)).await;
    register(store, "R2", Some(Outcome::Success)).await;
    register(store, "R3", None).await;
    // R1's history: a run that left a checkpoint, taken over (one abandoned attempt) by a run
    // still open, which the claim abandons.
    let first = store.claim(&id("R1"), &archiver(), &holder("old", None)).await.unwrap();
    store.save_checkpoint(&id("R1"), &archiver(), first.generation(), json!({"copied": 3})).await.unwrap();
    let second = store.claim(&id("R1"), &archiver(), &holder("old", None)).await.unwrap();
    // R2 was ready when the index listed it; a failed check replaced its success since.
    let failed_check = NewEvent::new(EventType::new("Checked").unwrap(), Outcome::Failure, agent("checker"));
    store.append_event(&id("R2"), failed_check).await.unwrap();
    let r2_before = store.get_batch(&id("R2")).await.unwrap();
    let r1_before = store.get_batch(&id("R1")).await.unwrap();
    let failed_attempts = store.failed_attempts(&id("R1"), &archiver(), Seq::ZERO).await.unwrap();
    let checkpoint = store.load_checkpoint(&id("R1"), &archiver()).await.unwrap();
    assert_eq!((failed_attempts, checkpoint.clone()), (1, Some(json!({"copied": 3}))));

    let claims = store.claim_ready(&request(&["R1", "R2", "R3", "R-gone"], holder("pass", None))).await.unwrap();
    assert!(!claims.held);
    let steering = claims.steering.expect("no version known: the steering is answered");
    assert_eq!(steering, store.steering().await.unwrap());
    let [r1, r2, r3, gone] = <[_; 4]>::try_from(claims.answers).unwrap();

    let r1 = r1.unwrap();
    let claim = r1.claim.expect("R1 is ready: claimed");
    assert_eq!(claim.abandoned.as_ref().map(|run| run.generation), Some(second.generation()));
    assert_eq!((r1.failed_attempts, r1.checkpoint), (failed_attempts, checkpoint), "as the separate reads");
    assert_eq!(r1.batch.changed_seq, r1_before.changed_seq, "the batch as read before its claim");
    assert_eq!(r1.batch.open_runs, r1_before.open_runs);
    let now = store.run_state(&id("R1"), &archiver()).await.unwrap().unwrap();
    assert_eq!((now.generation, now.state), (claim.generation(), RunState::Open));

    let r2 = r2.unwrap();
    assert!(r2.claim.is_none(), "R2 is no longer ready: not claimed");
    assert_eq!(r2.batch.changed_seq, r2_before.changed_seq);
    let r2_after = store.get_batch(&id("R2")).await.unwrap();
    assert_eq!((r2_after.changed_seq, r2_after.open_runs), (r2_before.changed_seq, Vec::new()), "nothing written");
    assert_eq!(store.run_state(&id("R2"), &archiver()).await.unwrap(), None);
    assert!(r3.unwrap().claim.is_none(), "R3 was never ready");
    assert!(matches!(gone, Err(StoreError::NotFound(missing)) if missing == id("R-gone")));

    // Forced, a batch that is not ready is claimed all the same; a batch named twice is refused.
    let forced = ReadyClaimRequest { force: true, ..request(&["R2"], holder("operator", None)) };
    let forced = store.claim_ready(&forced).await.unwrap();
    assert!(forced.answers[0].as_ref().unwrap().claim.is_some(), "forced: claimed whatever the trigger says");
    let head = store.head().await.unwrap();
    let twice = store.claim_ready(&request(&["R3", "R3"], holder("pass", None))).await;
    assert!(matches!(twice, Err(StoreError::Invalid(input)) if input.field == "batches"), "a batch named twice");
    assert_eq!(store.head().await.unwrap(), head, "a refused request writes nothing");
}

/// A hold (the component's or the pipeline's) claims nothing and answers the steering that
/// holds; forced, the claim goes through; a known, unmoved version is not answered again.
pub(crate) async fn a_hold_refuses_claim_ready_and_answers_the_steering(store: &dyn ObjectStore) {
    register(store, "H1", Some(Outcome::Success)).await;
    register(store, "H2", Some(Outcome::Success)).await;
    let known = store.steering().await.unwrap().version;
    let unmoved = ReadyClaimRequest { known_steering: Some(known), ..request(&[], holder("pass", None)) };
    let unmoved = store.claim_ready(&unmoved).await.unwrap();
    assert!(unmoved.steering.is_none() && !unmoved.held && unmoved.answers.is_empty(), "{unmoved:?}");

    store.steer(steer(SteeringChange::Pause { component: Some(archiver()), drain: false })).await.unwrap();
    let head = store.head().await.unwrap();
    let asked = ReadyClaimRequest { known_steering: Some(known), ..request(&["H1"], holder("pass", None)) };
    let refused = store.claim_ready(&asked).await.unwrap();
    assert!(refused.held && refused.answers.is_empty(), "{refused:?}");
    let steering = refused.steering.expect("the version moved: the steering that holds is answered");
    assert!(steering.version > known && steering.components.contains_key(&archiver()), "{steering:?}");
    assert_eq!(store.head().await.unwrap(), head, "nothing written");
    assert_eq!(store.run_state(&id("H1"), &archiver()).await.unwrap(), None);

    let forced = ReadyClaimRequest { force: true, known_steering: Some(steering.version), ..asked.clone() };
    let forced = store.claim_ready(&forced).await.unwrap();
    assert!(!forced.held && forced.steering.is_none(), "{forced:?}");
    assert!(forced.answers[0].as_ref().unwrap().claim.is_some(), "forced: claimed while paused");

    store.steer(steer(SteeringChange::Resume { component: Some(archiver()) })).await.unwrap();
    store.steer(steer(SteeringChange::Pause { component: None, drain: true })).await.unwrap();
    let drained = store.claim_ready(&request(&["H2"], holder("pass", None))).await.unwrap();
    assert!(drained.held && drained.steering.unwrap().pipeline.is_some(), "the pipeline's drain holds it too");
    assert_eq!(store.run_state(&id("H2"), &archiver()).await.unwrap(), None);
    // As found: the next case on this store claims.
    store.steer(steer(SteeringChange::Resume { component: None })).await.unwrap();
}

/// Sent again with its claim key (an answer lost), `claim_ready` answers the runs the first
/// call opened, with the batch as that call read it and the attempt it abandoned counted.
pub(crate) async fn a_retried_claim_ready_with_its_key_answers_the_runs_it_opened(store: &dyn ObjectStore) {
    register(store, "K1", Some(Outcome::Success)).await;
    let stalled = store.claim(&id("K1"), &archiver(), &holder("old", None)).await.unwrap();
    let asked = request(&["K1"], holder("pass", Some("pass-key-1")));
    let first = store.claim_ready(&asked).await.unwrap().answers.remove(0).unwrap();
    let again = store.claim_ready(&asked).await.unwrap().answers.remove(0).unwrap();
    let (first_claim, again_claim) = (first.claim.unwrap(), again.claim.unwrap());
    assert_eq!(first_claim.abandoned.map(|run| run.generation), Some(stalled.generation()));
    assert_eq!(again_claim.run, first_claim.run, "the run the first call opened");
    assert_eq!(again_claim.abandoned, None);
    assert!(again.batch.open_runs.is_empty(), "answered without the run the first call opened");
    assert_eq!((first.failed_attempts, again.failed_attempts), (0, 1), "the abandoned run counted once it ended");
}
