//! The contract of `claim_ready`, a pass's claim round in one transaction, run by the shared
//! suite (`operations.rs`) on SQLite and PostgreSQL and by the service's tests through
//! `HttpStore`: a batch no longer ready is answered as read and nothing is written for it,
//! a claimed one carries what the separate reads (`failed_attempts`, `load_checkpoint`)
//! answer, an unknown one is its own `NotFound`, a hold claims nothing and answers the
//! steering that holds, and a retry with the claim key answers the runs the first one opened.
//! Exclusive (the claim is the lock): a batch another claim's open run holds is answered
//! `held` with that run and nothing is written, unless `takeovers` names that very run (its
//! generation and its holder's liveness), which is then abandoned and fenced as any claim
//! abandons one; the liveness a claim names is kept with its run. An open run naming a
//! liveness is its batch's lock: a claim that is not exclusive (`claim`, `claim_many`, a round
//! not exclusive) is refused the batch and writes nothing; one naming none is abandoned by
//! any claim, as always.

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

    // A hold that lands between the first call and its retry: the retry still answers the run
    // the first call opened (claimed before the hold, it goes on to its result), and claims
    // nothing more.
    register(store, "K2", Some(Outcome::Success)).await;
    register(store, "K3", None).await;
    let asked = request(&["K2", "K3"], holder("pass", Some("pass-key-2")));
    let first = store.claim_ready(&asked).await.unwrap().answers.remove(0).unwrap();
    register_checked(store, "K3").await;
    store.steer(steer(SteeringChange::Pause { component: Some(archiver()), drain: false })).await.unwrap();
    let again = store.claim_ready(&asked).await.unwrap();
    assert!(!again.held, "a retry of a claim made before the hold: {again:?}");
    let [k2, k3] = <[_; 2]>::try_from(again.answers).unwrap();
    assert_eq!(k2.unwrap().claim.map(|claim| claim.run), first.claim.map(|claim| claim.run), "K2's run, again");
    assert!(k3.unwrap().claim.is_none(), "K3, ready since, is not claimed while held");
    assert_eq!(store.run_state(&id("K3"), &archiver()).await.unwrap(), None);
    let fresh = store.claim_ready(&request(&["K3"], holder("pass", Some("pass-key-3")))).await.unwrap();
    assert!(fresh.held && fresh.answers.is_empty(), "another request is refused: {fresh:?}");
    store.steer(steer(SteeringChange::Resume { component: Some(archiver()) })).await.unwrap();
}

/// `Checked` succeeded on `batch`: ready for the archiver from now on.
async fn register_checked(store: &dyn ObjectStore, batch: &str) {
    let checked = NewEvent::new(EventType::new("Checked").unwrap(), Outcome::Success, agent("checker"));
    store.append_event(&id(batch), checked).await.unwrap();
}

fn live_holder(name: &str, key: Option<&str>, liveness: &str) -> RunHolder {
    RunHolder { liveness: Some(liveness.into()), ..holder(name, key) }
}

fn exclusive(batches: &[&str], holder: RunHolder, takeovers: Vec<Takeover>) -> ReadyClaimRequest {
    ReadyClaimRequest { exclusive: true, takeovers, ..request(batches, holder) }
}

fn takeover(batch: &str, generation: i64, liveness: Option<&str>) -> Takeover {
    Takeover { batch: id(batch), generation, liveness: liveness.map(str::to_owned) }
}

/// The archiver's open runs of the batches named `prefix`...: this case's, on a store other
/// cases use too.
async fn open_runs_of(store: &dyn ObjectStore, prefix: &str) -> Vec<Run> {
    let open = store.open_runs(Some(&archiver())).await.unwrap();
    open.into_iter().filter(|run| run.batch_id.as_str().starts_with(prefix)).collect()
}

/// The one answer of a claim round of one batch.
async fn claim_one(store: &dyn ObjectStore, request: &ReadyClaimRequest) -> ReadyAnswer {
    let claims = store.claim_ready(request).await.unwrap();
    assert!(!claims.held, "{claims:?}");
    let [answer] = <[_; 1]>::try_from(claims.answers).unwrap();
    answer.unwrap()
}

/// Asserts `answer` is a refusal naming `holding`, and that the store is as it was: the head
/// where it was, `holding` still the batch's open run, no attempt abandoned.
async fn assert_held_and_nothing_written(store: &dyn ObjectStore, answer: ReadyAnswer, holding: &Run, head: Seq) {
    let batch = holding.batch_id.clone();
    assert!(answer.claim.is_none(), "refused: not claimed ({answer:?})");
    assert_eq!(answer.held.as_ref(), Some(holding), "answered with the run that holds the batch");
    assert_eq!((answer.failed_attempts, answer.checkpoint), (0, None));
    assert_eq!(answer.batch.open_runs, vec![holding.clone()], "the batch as read");
    assert_eq!(store.head().await.unwrap(), head, "nothing written");
    assert_eq!(
        store.run_state(&batch, &archiver()).await.unwrap().as_ref(),
        Some(holding),
        "still open, same generation"
    );
    assert_eq!(store.failed_attempts(&batch, &archiver(), Seq::ZERO).await.unwrap(), 0, "no run abandoned");
}

/// Exclusive, a batch whose open run is another claim's is refused, answered with that run
/// (its generation, its holder and the holder's liveness), and nothing is written: not for a
/// plain exclusive claim, nor a takeover naming another generation or another liveness (or
/// none). A takeover naming the run's generation and liveness claims the batch: the old run
/// abandoned, its holder fenced. A takeover of a batch without an open run is a plain claim.
pub(crate) async fn an_exclusive_claim_is_refused_a_batch_held_by_another_unless_it_takes_that_run_over(
    store: &dyn ObjectStore,
) {
    register(store, "X1", Some(Outcome::Success)).await;
    register(store, "X2", Some(Outcome::Success)).await;
    let first = claim_one(store, &exclusive(&["X1"], live_holder("first", None, "zk:first-session"), vec![])).await;
    let holding = first.claim.expect("nobody held X1: claimed").run;
    assert_eq!(holding.holder.liveness.as_deref(), Some("zk:first-session"));

    let second = live_holder("second", None, "zk:second-session");
    let (generation, liveness) = (holding.generation, Some("zk:first-session"));
    let refused_takeovers = [
        vec![],
        vec![takeover("X1", generation + 1, liveness)],
        vec![takeover("X1", generation - 1, liveness)],
        vec![takeover("X1", generation, Some("zk:another-session"))],
        vec![takeover("X1", generation, None)],
        vec![takeover("X2", generation, liveness)],
    ];
    for takeovers in refused_takeovers {
        let head = store.head().await.unwrap();
        let answer = claim_one(store, &exclusive(&["X1"], second.clone(), takeovers.clone())).await;
        assert_held_and_nothing_written(store, answer, &holding, head).await;
    }

    // Named with the generation and liveness it has: taken over.
    let takeovers = vec![takeover("X1", generation, liveness), takeover("X2", 7, Some("zk:gone"))];
    let claims = store.claim_ready(&exclusive(&["X1", "X2"], second.clone(), takeovers)).await.unwrap();
    let [x1, x2] = <[_; 2]>::try_from(claims.answers).unwrap();
    let (x1, x2) = (x1.unwrap(), x2.unwrap());
    assert_eq!(x1.held, None);
    let claim = x1.claim.expect("taken over: claimed");
    assert_eq!(claim.generation(), generation + 1, "a new generation");
    assert_eq!((&claim.run.holder.agent, &claim.run.holder.liveness), (&second.agent, &second.liveness));
    let abandoned = claim.abandoned.expect("the old run is abandoned");
    assert_eq!((abandoned.generation, abandoned.state), (generation, RunState::Abandoned));
    assert_eq!(store.failed_attempts(&id("X1"), &archiver(), Seq::ZERO).await.unwrap(), 1, "one attempt abandoned");
    let late = NewEvent::new(EventType::new("Archived").unwrap(), Outcome::Success, agent("first"))
        .in_run(archiver(), generation);
    let late = store.append_event(&id("X1"), late).await.unwrap_err();
    assert!(matches!(late, StoreError::Fenced { generation: fenced, .. } if fenced == generation), "{late}");
    assert!((x2.held.is_none() && x2.claim.is_some()), "X2 had no open run: claimed as usual ({x2:?})");
}

/// An exclusive claim sent again with its claim key (its answer lost) answers the run its
/// first attempt opened, taken over or not, instead of finding itself holding the batch.
pub(crate) async fn a_retried_exclusive_claim_answers_the_run_it_opened_not_held(store: &dyn ObjectStore) {
    register(store, "E1", Some(Outcome::Success)).await;
    register(store, "E2", Some(Outcome::Success)).await;
    let dead = store.claim(&id("E2"), &archiver(), &live_holder("dead", None, "pg:7")).await.unwrap();
    let ours = live_holder("pass", Some("pass-key-x"), "pg:8");
    let asked = exclusive(&["E1", "E2"], ours, vec![takeover("E2", dead.generation(), Some("pg:7"))]);
    let first = store.claim_ready(&asked).await.unwrap().answers;
    let again = store.claim_ready(&asked).await.unwrap().answers;
    for (first, again) in first.into_iter().zip(again) {
        let (first, again) = (first.unwrap(), again.unwrap());
        assert_eq!((first.held.as_ref(), again.held.as_ref()), (None, None), "{again:?}");
        let (first, again) = (first.claim.unwrap(), again.claim.unwrap());
        assert_eq!(again.run, first.run, "the run the first attempt opened");
        assert_eq!(again.abandoned, None);
    }
    let open = open_runs_of(store, "E").await;
    assert_eq!(open.iter().map(|run| run.generation).collect::<Vec<_>>(), [1, dead.generation() + 1], "{open:?}");
}

/// The liveness a holder names comes back with its run wherever runs are read, whichever
/// claim opened it; a holder naming none has none.
pub(crate) async fn the_liveness_a_claim_names_comes_back_with_its_run(store: &dyn ObjectStore) {
    for batch in ["L1", "L2", "L3", "L4"] {
        register(store, batch, Some(Outcome::Success)).await;
    }
    store.claim(&id("L1"), &archiver(), &live_holder("one", None, "local:host:1:a")).await.unwrap();
    let many = store.claim_many(&[id("L2")], &archiver(), &live_holder("many", None, "zk:0x1f")).await.unwrap();
    assert_eq!(many[0].as_ref().unwrap().run.holder.liveness.as_deref(), Some("zk:0x1f"));
    let round = claim_one(store, &request(&["L3"], live_holder("round", None, "pg:worker-3"))).await;
    assert_eq!(round.claim.unwrap().run.holder.liveness.as_deref(), Some("pg:worker-3"));
    store.claim(&id("L4"), &archiver(), &holder("none", None)).await.unwrap();

    let expected = [("L1", Some("local:host:1:a")), ("L2", Some("zk:0x1f")), ("L3", Some("pg:worker-3")), ("L4", None)];
    let open = open_runs_of(store, "L").await;
    let listed: Vec<(&str, Option<&str>)> =
        open.iter().map(|run| (run.batch_id.as_str(), run.holder.liveness.as_deref())).collect();
    assert_eq!(listed, expected, "open_runs");
    for (batch, liveness) in expected {
        let read = store.get_batch(&id(batch)).await.unwrap();
        assert_eq!(read.open_run(&archiver()).unwrap().holder.liveness.as_deref(), liveness, "{batch}: get_batch");
        let state = store.run_state(&id(batch), &archiver()).await.unwrap().unwrap();
        assert_eq!(state.holder.liveness.as_deref(), liveness, "{batch}: run_state");
        let head = store.batch_head(&id(batch)).await.unwrap();
        assert_eq!(head.open_runs[0].holder.liveness.as_deref(), liveness, "{batch}: batch_head");
    }
    let bad = live_holder("bad", None, "zk:with space");
    let refused = store.claim(&id("L4"), &archiver(), &bad).await.unwrap_err();
    assert!(matches!(refused, StoreError::Invalid(input) if input.field == "liveness"), "a liveness with a space");
    let takeovers = vec![takeover("L4", 1, Some(""))];
    let refused = store.claim_ready(&exclusive(&["L4"], holder("pass", None), takeovers)).await.unwrap_err();
    assert!(matches!(refused, StoreError::Invalid(input) if input.field == "takeovers.liveness"), "an empty one");
}

/// Asserts `refused` is the `Conflict` a claim of a batch whose open run `lock` is its lock
/// answers, naming the holder's agent, the run's generation and that it is the batch's lock.
fn assert_lock_conflict(refused: &StoreError, lock: &Run) {
    assert!(matches!(refused, StoreError::Conflict(_)), "a conflict: {refused:?}");
    assert!(refused.is_conflict());
    let said = refused.to_string();
    let names = [lock.holder.agent.as_str(), &format!("run {} ", lock.generation), "the batch's lock"];
    assert!(names.iter().all(|name| said.contains(name)), "names the holder, the run and the lock: {said}");
}

/// Asserts the store is as it was before a refused claim: the head where it was, `lock` still
/// the batch's open run with its generation, no attempt abandoned.
async fn assert_nothing_written(store: &dyn ObjectStore, lock: &Run, head: Seq) {
    assert_eq!(store.head().await.unwrap(), head, "nothing written");
    let now = store.run_state(&lock.batch_id, &archiver()).await.unwrap();
    assert_eq!(now.as_ref(), Some(lock), "still open, same generation");
    assert_eq!(store.failed_attempts(&lock.batch_id, &archiver(), Seq::ZERO).await.unwrap(), 0, "none abandoned");
}

/// An open run whose holder names a liveness is its batch's lock: no claim that is not an
/// exclusive takeover naming it abandons it. `claim` and `claim_many` are refused the batch
/// with a `Conflict` naming the holder (the other batches of a `claim_many` still claimed),
/// a claim round that is not exclusive answers it `held` (whatever its `takeovers` say),
/// each writing nothing for it, whether the claimer names a liveness or not. The holder's own
/// retry with its claim key still answers its run; a takeover naming it still takes it over.
pub(crate) async fn a_claim_that_is_not_exclusive_is_refused_a_batch_whose_open_run_is_its_lock(
    store: &dyn ObjectStore,
) {
    register(store, "N1", Some(Outcome::Success)).await;
    register(store, "N2", Some(Outcome::Success)).await;
    let locker = live_holder("locker", Some("locker-key"), "zk:locker");
    let lock = claim_one(store, &exclusive(&["N1"], locker.clone(), vec![])).await.claim.expect("claimed").run;
    let named = vec![takeover("N1", lock.generation, Some("zk:locker"))];

    for claimer in [holder("plain", None), live_holder("live", None, "zk:live")] {
        let head = store.head().await.unwrap();
        let refused = store.claim(&id("N1"), &archiver(), &claimer).await.unwrap_err();
        assert_lock_conflict(&refused, &lock);
        assert_nothing_written(store, &lock, head).await;

        let many = store.claim_many(&[id("N1")], &archiver(), &claimer).await.unwrap();
        assert_lock_conflict(many[0].as_ref().unwrap_err(), &lock);
        assert_nothing_written(store, &lock, head).await;

        for takeovers in [vec![], named.clone()] {
            let round = ReadyClaimRequest { takeovers, ..request(&["N1"], claimer.clone()) };
            let answer = claim_one(store, &round).await;
            assert_held_and_nothing_written(store, answer, &lock, head).await;
        }
    }

    // One batch's refusal keeps no other from its claim.
    let many = store.claim_many(&[id("N1"), id("N2")], &archiver(), &holder("pass", None)).await.unwrap();
    assert_lock_conflict(many[0].as_ref().unwrap_err(), &lock);
    assert_eq!(many[1].as_ref().map(|claim| claim.generation()).ok(), Some(1), "N2 claimed");
    assert_eq!(store.run_state(&id("N1"), &archiver()).await.unwrap().as_ref(), Some(&lock));

    // The holder's own retry (its claim key, its answer lost) answers its run, as always.
    let again = store.claim(&id("N1"), &archiver(), &locker).await.unwrap();
    assert_eq!((again.run.clone(), again.abandoned), (lock.clone(), None), "the run it opened");
    let again = store.claim_many(&[id("N1")], &archiver(), &locker).await.unwrap();
    assert_eq!(again[0].as_ref().unwrap().run, lock);

    // Its holder proven dead, an exclusive takeover naming it takes it over.
    let taker = live_holder("taker", None, "zk:taker");
    let claim = claim_one(store, &exclusive(&["N1"], taker, named)).await.claim.expect("taken over");
    assert_eq!(claim.abandoned.map(|run| (run.generation, run.state)), Some((lock.generation, RunState::Abandoned)));
    assert_eq!(claim.run.generation, lock.generation + 1);
}

/// An open run whose holder names no liveness (guarded by a batch lock, or claimed before
/// runs kept one) is abandoned by any claim as it always was: `claim`, `claim_many` and a
/// claim round that is not exclusive (whatever its `takeovers` say), each opening the next
/// generation, whether the claimer names a liveness or not.
pub(crate) async fn a_claim_that_is_not_exclusive_still_abandons_an_open_run_without_a_liveness(
    store: &dyn ObjectStore,
) {
    let calls = [
        ("W1", "claim", holder("one", None)),
        ("W2", "claim", live_holder("one", None, "zk:one")),
        ("W3", "claim_many", holder("many", None)),
        ("W4", "claim_many", live_holder("many", None, "zk:many")),
        ("W5", "claim_ready", holder("round", None)),
        ("W6", "claim_ready", live_holder("round", None, "zk:round")),
    ];
    for (batch, call, claimer) in calls {
        register(store, batch, Some(Outcome::Success)).await;
        let open = store.claim(&id(batch), &archiver(), &holder("old", None)).await.unwrap().run;
        let claim = match call {
            "claim" => store.claim(&id(batch), &archiver(), &claimer).await.unwrap(),
            "claim_many" => store.claim_many(&[id(batch)], &archiver(), &claimer).await.unwrap().remove(0).unwrap(),
            _ => {
                let takeovers = vec![takeover(batch, open.generation + 5, Some("zk:other"))];
                let round = ReadyClaimRequest { takeovers, ..request(&[batch], claimer.clone()) };
                let answer = claim_one(store, &round).await;
                assert_eq!(answer.held, None, "{call}");
                answer.claim.expect("not held: claimed over the open run")
            }
        };
        let abandoned = claim.abandoned.map(|run| (run.generation, run.state));
        assert_eq!(abandoned, Some((open.generation, RunState::Abandoned)), "{call} of {batch} abandons its run");
        assert_eq!((claim.run.generation, &claim.run.holder.liveness), (open.generation + 1, &claimer.liveness));
    }
}

/// The round `claim_ready_judged` claims for a caller that judged the batches ready on their
/// summaries: each batch is claimed only while still exactly as judged (its `changed_seq`),
/// answered as `claim_ready` answers it (the batch as read before its claim, its failed
/// attempts counted from its newest `Reset`, its checkpoint); one that moved since, a hold
/// that landed since and a batch gone are judged again as `claim_ready` judges them, nothing
/// written for what is not claimed; stamps that are not one per batch are refused.
pub(crate) async fn a_judged_claim_claims_only_what_is_as_judged(store: &dyn ObjectStore) {
    let judged_at = |summaries: &[BatchSummary], batch: &str| {
        summaries.iter().find(|summary| summary.id == id(batch)).map(|summary| summary.changed_seq).unwrap()
    };
    register(store, "J1", Some(Outcome::Success)).await;
    register(store, "J2", Some(Outcome::Success)).await;
    // J1's history: an attempt abandoned before a `Reset` of the archiver's event type and
    // one after it, a checkpoint, and no run open (the second attempt's successor released).
    async fn attempt(store: &dyn ObjectStore) {
        let first = store.claim(&id("J1"), &archiver(), &holder("old", None)).await.unwrap();
        store.save_checkpoint(&id("J1"), &archiver(), first.generation(), json!({"copied": 1})).await.unwrap();
        let second = store.claim(&id("J1"), &archiver(), &holder("old", None)).await.unwrap();
        store.release(&id("J1"), &archiver(), second.generation()).await.unwrap();
    }
    attempt(store).await;
    let reset = NewEvent::reset(vec![EventType::new("Archived").unwrap()], agent("operator:ann"), json!({}));
    let reset = store.append_event(&id("J1"), reset).await.unwrap();
    attempt(store).await;
    let summaries = store.get_summaries(&[id("J1"), id("J2"), id("J3")]).await.unwrap();
    let version = store.steering().await.unwrap().version;
    let judged = [judged_at(&summaries, "J1"), judged_at(&summaries, "J2")];
    // J2 is no longer ready: a failed check since it was judged.
    let failed_check = NewEvent::new(EventType::new("Checked").unwrap(), Outcome::Failure, agent("checker"));
    store.append_event(&id("J2"), failed_check).await.unwrap();
    let j1_before = store.get_batch(&id("J1")).await.unwrap();
    let failed_attempts = store.failed_attempts(&id("J1"), &archiver(), reset.seq).await.unwrap();
    assert_eq!(failed_attempts, 1, "one attempt abandoned since the reset");

    let asked = ReadyClaimRequest { known_steering: Some(version), ..request(&["J1"], holder("pass", None)) };
    let claims = store.claim_ready_judged(&asked, &judged[..1]).await.unwrap();
    assert!(!claims.held && claims.steering.is_none(), "the version known is current: {claims:?}");
    let j1 = claims.answers.into_iter().next().unwrap().unwrap();
    let claim = j1.claim.expect("J1 is as judged: claimed");
    assert_eq!(j1.batch.changed_seq, judged[0], "the batch as read before its claim");
    assert_eq!(j1.batch.events, j1_before.events);
    assert_eq!((j1.failed_attempts, j1.checkpoint), (failed_attempts, Some(json!({"copied": 1}))), "as claim_ready");
    let now = store.run_state(&id("J1"), &archiver()).await.unwrap().unwrap();
    assert_eq!((now.generation, now.state), (claim.generation(), RunState::Open));

    // Moved since it was judged: judged again, not claimed, nothing written.
    let head = store.head().await.unwrap();
    let asked = ReadyClaimRequest { known_steering: Some(version), ..request(&["J2"], holder("pass", None)) };
    let j2 = store.claim_ready_judged(&asked, &judged[1..]).await.unwrap().answers.remove(0).unwrap();
    assert!(j2.claim.is_none(), "J2 failed its check since: not claimed");
    assert!(j2.batch.changed_seq > judged[1], "answered as it is now");
    assert_eq!(store.head().await.unwrap(), head, "nothing written");

    // A hold that landed since the version the caller knows: nothing claimed, the hold answered.
    register(store, "J3", Some(Outcome::Success)).await;
    let j3 = store.get_summaries(&[id("J3")]).await.unwrap();
    let j3 = [judged_at(&j3, "J3")];
    store.steer(steer(SteeringChange::Pause { component: Some(archiver()), drain: false })).await.unwrap();
    let head = store.head().await.unwrap();
    let asked = ReadyClaimRequest { known_steering: Some(version), ..request(&["J3"], holder("pass", None)) };
    let refused = store.claim_ready_judged(&asked, &j3).await.unwrap();
    assert!(refused.held && refused.answers.is_empty(), "{refused:?}");
    assert!(refused.steering.is_some_and(|steering| steering.components.contains_key(&archiver())));
    assert_eq!(store.head().await.unwrap(), head, "nothing written");
    store.steer(steer(SteeringChange::Resume { component: Some(archiver()) })).await.unwrap();

    // A hold at the very version the caller knows (a caller that did not look at what it
    // knows): nothing claimed, the hold answered.
    register(store, "J4", Some(Outcome::Success)).await;
    let j4 = [judged_at(&store.get_summaries(&[id("J4")]).await.unwrap(), "J4")];
    let holds = [("the pipeline's", None), ("the component's", Some(archiver()))];
    for (whose, component) in holds {
        store.steer(steer(SteeringChange::Pause { component: component.clone(), drain: false })).await.unwrap();
        let holding = store.steering().await.unwrap().version;
        let head = store.head().await.unwrap();
        let asked = ReadyClaimRequest { known_steering: Some(holding), ..request(&["J4"], holder("pass", None)) };
        let refused = store.claim_ready_judged(&asked, &j4).await.unwrap();
        assert!(refused.held && refused.answers.is_empty(), "{whose} hold, at the known version: {refused:?}");
        assert_eq!(store.head().await.unwrap(), head, "nothing written");
        store.steer(steer(SteeringChange::Resume { component })).await.unwrap();
    }
    let version = store.steering().await.unwrap().version;

    // An open run of the component at the stamp (another claim's, not a lock), in a round
    // with a batch as judged: judged as `claim_ready` judges them, so an exclusive round is
    // refused the one and claims the other, and the open run stays its holder's.
    register(store, "J5", Some(Outcome::Success)).await;
    let other = store.claim(&id("J4"), &archiver(), &holder("other", None)).await.unwrap();
    let stamps = store.get_summaries(&[id("J4"), id("J5")]).await.unwrap();
    let stamps = [judged_at(&stamps, "J4"), judged_at(&stamps, "J5")];
    let asked = ReadyClaimRequest {
        known_steering: Some(version),
        ..exclusive(&["J4", "J5"], holder("pass", None), Vec::new())
    };
    let [j4, j5] = <[_; 2]>::try_from(store.claim_ready_judged(&asked, &stamps).await.unwrap().answers).unwrap();
    let j4 = j4.unwrap();
    assert!(j4.claim.is_none() && j4.held.as_ref().is_some_and(|run| run.generation == other.generation()), "{j4:?}");
    assert!(j5.unwrap().claim.is_some(), "J5 is as judged: claimed");
    let still = store.run_state(&id("J4"), &archiver()).await.unwrap().unwrap();
    assert_eq!((still.generation, still.state), (other.generation(), RunState::Open), "the other's run stands");

    // Sent again with its claim key (an answer lost): the runs the first call opened.
    register(store, "J6", Some(Outcome::Success)).await;
    let j6 = [judged_at(&store.get_summaries(&[id("J6")]).await.unwrap(), "J6")];
    let asked =
        ReadyClaimRequest { known_steering: Some(version), ..request(&["J6"], holder("pass", Some("judged-1"))) };
    let first = store.claim_ready_judged(&asked, &j6).await.unwrap().answers.remove(0).unwrap();
    let again = store.claim_ready_judged(&asked, &j6).await.unwrap().answers.remove(0).unwrap();
    assert_eq!(again.claim.map(|claim| claim.run), first.claim.map(|claim| claim.run), "the run the first call opened");

    // A batch gone is its own `NotFound`; stamps that are not one per batch are refused.
    let version = store.steering().await.unwrap().version;
    let asked = ReadyClaimRequest { known_steering: Some(version), ..request(&["J-gone"], holder("pass", None)) };
    let gone = store.claim_ready_judged(&asked, &[Seq(1)]).await.unwrap().answers.remove(0);
    assert!(matches!(gone, Err(StoreError::NotFound(ref missing)) if *missing == id("J-gone")), "{gone:?}");
    let head = store.head().await.unwrap();
    let uneven = store.claim_ready_judged(&asked, &[]).await;
    assert!(matches!(uneven, Err(StoreError::Invalid(ref input)) if input.field == "judged"), "{uneven:?}");
    assert_eq!(store.head().await.unwrap(), head, "a refused request writes nothing");
}
