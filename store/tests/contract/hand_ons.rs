//! The contract of hand-ons (`HandOnStore`), run by the shared suite (`operations.rs`)
//! against every backend. A store that keeps takers opens a taker's run in the append that
//! makes its batch ready, only while the batch is as the appending run's claim read it, the
//! taker holds no other run of its component and nobody works the batch for it; the run is
//! the batch's lock, found by its taker and fenced as any claim's; a taker proven dead is
//! taken over and handed nothing more. A store that keeps none says so at the offer and
//! hands nothing on.

use std::sync::Arc;
use std::time::Duration;

use autocomp_model::*;
use autocomp_store::*;

use super::{Fixture, agent, component, id, register, ty};

/// The taker's component: works what was received and not yet checked.
fn checker() -> ComponentDescriptor {
    let trigger = Trigger::builder().requires("Data_Received").blocked_by("Checked").build();
    ComponentDescriptor::new(component("checker"), "1.0", ty("Checked"), trigger)
}

fn taker(name: &str) -> RunHolder {
    RunHolder {
        agent: agent(&format!("checker/1.0@host#{name}")),
        host: "host".into(),
        pid: 1,
        claim_key: None,
        liveness: Some(format!("local:host:1:{name}")),
    }
}

fn received(run: &Claim) -> NewEvent {
    NewEvent::new(ty("Data_Received"), Outcome::Success, agent("receiver"))
        .in_run(component("receiver"), run.generation())
}

/// An operator pauses the taker's step.
async fn pause_checker(f: &Fixture) {
    let request = SteeringRequest {
        change: SteeringChange::Pause { component: Some(component("checker")), drain: false },
        by: agent("operator:ann"),
        reason: "tape maintenance".into(),
        expect_version: None,
    };
    f.store.steer(request).await.unwrap();
}

/// A receiver's claim of `batch`, as its pass would hold it before appending.
async fn claimed_by_receiver(f: &Fixture, batch: &str) -> Claim {
    register(&f.store, batch).await;
    let holder = RunHolder { liveness: Some("local:host:2:receiver".into()), ..taker("receiver") };
    f.store.claim(&id(batch), &component("receiver"), &holder).await.unwrap()
}

pub(crate) async fn an_append_hands_its_batch_to_an_idle_taker_only_while_the_batch_is_as_claimed(f: Fixture) {
    let offer = TakerOffer { descriptor: checker(), holder: taker("a") };
    let keeps = f.store.offer_to_take(offer).await.unwrap();
    let claim = claimed_by_receiver(&f, "B1").await;
    if !keeps {
        // Keeps no takers: nothing listed, nothing handed, the append recorded as ever.
        assert!(f.store.takers().await.unwrap().is_empty());
        let handed = f.store.append_handing_on(&id("B1"), received(&claim), &[component("checker")]).await.unwrap();
        assert!(handed.runs.is_empty());
        assert_eq!(handed.event.event_type, ty("Data_Received"));
        assert!(f.store.handed_runs(&checker(), "local:host:1:a").await.unwrap().is_empty());
        return;
    }
    assert_eq!(f.store.takers().await.unwrap(), [checker()]);

    let handed = f.store.append_handing_on(&id("B1"), received(&claim), &[component("checker")]).await.unwrap();
    assert_eq!(handed.runs.len(), 1, "{handed:?}");
    let run = &handed.runs[0];
    assert_eq!((run.component.as_str(), run.generation, run.state), ("checker", 1, RunState::Open));
    assert_eq!(run.holder, taker("a"), "the run names the taker: it is the batch's lock");
    assert!(run.claim_seq > handed.event.seq, "opened after the event, in its transaction");
    let batch = f.store.get_batch(&id("B1")).await.unwrap();
    assert_eq!(batch.open_run(&component("checker")), Some(run));
    assert_eq!(batch.open_run(&component("receiver")), None, "the appending run is closed");

    // The taker finds it as a claim round answers a claimed batch, without its own run.
    let found = f.store.handed_runs(&checker(), "local:host:1:a").await.unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].claim.as_ref().map(|claim| &claim.run), Some(run));
    assert_eq!((found[0].failed_attempts, found[0].checkpoint.clone()), (0, None));
    assert!(found[0].batch.open_runs.is_empty(), "{:?}", found[0].batch.open_runs);
    assert_eq!(found[0].batch.effective().get(&ty("Data_Received")).map(|e| e.seq), Some(handed.event.seq));
    assert!(f.store.handed_runs(&checker(), "local:host:1:other").await.unwrap().is_empty());

    // Busy with it, the taker is handed nothing more; the batch waits for a claim.
    let busy = claimed_by_receiver(&f, "B2").await;
    let handed = f.store.append_handing_on(&id("B2"), received(&busy), &[component("checker")]).await.unwrap();
    assert!(handed.runs.is_empty(), "{handed:?}");
    assert_eq!(f.store.get_batch(&id("B2")).await.unwrap().open_runs, []);

    // Its result is fenced by the handed run as by any claim; then it is idle again.
    let checked = NewEvent::new(ty("Checked"), Outcome::Success, agent("checker")).in_run(component("checker"), 1);
    f.store.append_event(&id("B1"), checked).await.unwrap();
    assert!(f.store.handed_runs(&checker(), "local:host:1:a").await.unwrap().is_empty());

    // A batch changed since the appending run's claim is not handed on: the appender's
    // judgement was of the batch its claim read.
    let moved = claimed_by_receiver(&f, "B3").await;
    f.store.set_priority(&id("B3"), 5).await.unwrap();
    let handed = f.store.append_handing_on(&id("B3"), received(&moved), &[component("checker")]).await.unwrap();
    assert!(handed.runs.is_empty(), "{handed:?}");

    // Idle and the batch unchanged: handed. A withdrawn taker is handed nothing.
    let idle = claimed_by_receiver(&f, "B4").await;
    let handed = f.store.append_handing_on(&id("B4"), received(&idle), &[component("checker")]).await.unwrap();
    assert_eq!(handed.runs.len(), 1, "{handed:?}");
    f.store
        .append_event(
            &id("B4"),
            NewEvent::new(ty("Checked"), Outcome::Success, agent("checker")).in_run(component("checker"), 1),
        )
        .await
        .unwrap();
    f.store.withdraw_offer(&component("checker"), "local:host:1:a").await.unwrap();
    f.store.withdraw_offer(&component("checker"), "local:host:1:a").await.expect("withdrawing twice is a no-op");
    assert!(f.store.takers().await.unwrap().is_empty());
    let gone = claimed_by_receiver(&f, "B5").await;
    let handed = f.store.append_handing_on(&id("B5"), received(&gone), &[component("checker")]).await.unwrap();
    assert!(handed.runs.is_empty(), "{handed:?}");
}

pub(crate) async fn a_held_step_is_handed_nothing(f: Fixture) {
    if !f.store.offer_to_take(TakerOffer { descriptor: checker(), holder: taker("a") }).await.unwrap() {
        return;
    }
    pause_checker(&f).await;
    let claim = claimed_by_receiver(&f, "B1").await;
    let handed = f.store.append_handing_on(&id("B1"), received(&claim), &[component("checker")]).await.unwrap();
    assert!(handed.runs.is_empty(), "a paused step is handed nothing: {handed:?}");
}

pub(crate) async fn a_taker_proven_dead_is_taken_over_and_handed_nothing_more(f: Fixture) {
    if !f.store.offer_to_take(TakerOffer { descriptor: checker(), holder: taker("dead") }).await.unwrap() {
        return;
    }
    let claim = claimed_by_receiver(&f, "B1").await;
    let handed = f.store.append_handing_on(&id("B1"), received(&claim), &[component("checker")]).await.unwrap();
    let run = handed.runs[0].clone();
    // Another process of the component proves the holder dead and takes the run over.
    let request = ReadyClaimRequest {
        batches: vec![id("B1")],
        descriptor: checker(),
        holder: taker("alive"),
        force: false,
        known_steering: None,
        exclusive: true,
        takeovers: vec![Takeover {
            batch: id("B1"),
            generation: run.generation,
            liveness: run.holder.liveness.clone(),
        }],
    };
    let claims = f.store.claim_ready(&request).await.unwrap();
    let answer = claims.answers[0].as_ref().unwrap();
    assert_eq!(answer.claim.as_ref().and_then(|claim| claim.abandoned.clone()).map(|run| run.generation), Some(1));
    assert!(f.store.takers().await.unwrap().is_empty(), "the dead taker's offer went with it");
    let next = claimed_by_receiver(&f, "B2").await;
    let handed = f.store.append_handing_on(&id("B2"), received(&next), &[component("checker")]).await.unwrap();
    assert!(handed.runs.is_empty(), "{handed:?}");
}

pub(crate) async fn offers_and_hand_ons_that_could_never_hold_are_refused_by_name(f: Fixture) {
    let no_liveness = TakerOffer { descriptor: checker(), holder: RunHolder { liveness: None, ..taker("a") } };
    let refused = f.store.offer_to_take(no_liveness).await.unwrap_err();
    assert!(matches!(&refused, StoreError::Invalid(i) if i.field == "holder.liveness"), "{refused}");
    let source = TakerOffer { descriptor: ComponentDescriptor { source: true, ..checker() }, holder: taker("a") };
    let refused = f.store.offer_to_take(source).await.unwrap_err();
    assert!(matches!(&refused, StoreError::Invalid(i) if i.field == "descriptor"), "{refused}");

    register(&f.store, "B1").await;
    let head = f.store.head().await.unwrap();
    let no_run = NewEvent::new(ty("Data_Received"), Outcome::Success, agent("receiver"));
    let refused = f.store.append_handing_on(&id("B1"), no_run, &[component("checker")]).await.unwrap_err();
    assert!(matches!(&refused, StoreError::Invalid(i) if i.field == "hand_on"), "{refused}");
    let twice =
        NewEvent::new(ty("Data_Received"), Outcome::Success, agent("receiver")).in_run(component("receiver"), 1);
    let refused =
        f.store.append_handing_on(&id("B1"), twice, &[component("checker"), component("checker")]).await.unwrap_err();
    assert!(matches!(&refused, StoreError::Invalid(i) if i.field == "hand_on" && i.value == "checker"), "{refused}");
    let new = NewBatch::new(id("B2"), BatchType::new("Delivery").unwrap());
    let delivered = NewEvent::new(ty("Data_Received"), Outcome::Success, agent("trigger"));
    let refused =
        f.store.register_handing_on(new, delivered, &[component("checker"), component("checker")]).await.unwrap_err();
    assert!(matches!(&refused, StoreError::Invalid(i) if i.field == "hand_on" && i.value == "checker"), "{refused}");
    assert_eq!(f.store.head().await.unwrap(), head, "a refusal writes nothing");
}

/// A hand-on is announced to its taker alone: the taker's wait as taker wakes for it even
/// when the append concerns nothing it reads, its notice tells it once, and a waiter as
/// another taker sleeps through it. (A store that announces no hand-on cannot tell, and the
/// taker reads at each wake instead.)
pub(crate) async fn a_hand_on_is_announced_to_its_taker_alone(f: Fixture) {
    if !f.store.offer_to_take(TakerOffer { descriptor: checker(), holder: taker("a") }).await.unwrap() {
        return;
    }
    let (name, liveness) = (component("checker"), "local:host:1:a");
    // The announcements reach this handle once its listen connection (or file watch) is up.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut notice = f.store.hand_on_notice(&checker(), liveness, None).await;
    while notice.mark.is_none() {
        assert!(std::time::Instant::now() < deadline, "the handle hears announcements within 10 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
        notice = f.store.hand_on_notice(&checker(), liveness, None).await;
    }
    notice = f.store.hand_on_notice(&checker(), liveness, notice.mark).await;
    assert_eq!(notice.handed, Some(false), "nothing handed yet");

    let claim = claimed_by_receiver(&f, "B1").await;
    // Both wait from a mark and a head read before the append, so one that is not yet asleep
    // when the append commits judges it as one that was.
    let mark = f.store.announcement_mark().await;
    let head = f.store.head().await.unwrap();
    let unrelated = ChangeInterest::Types([ty("Nothing_Reads_This")].into());
    let wait_as = |who: &'static str, timeout: Duration| {
        let (store, unrelated) = (Arc::clone(&f.store), unrelated.clone());
        tokio::spawn(async move {
            let answer = store.wait_as_taker(head, mark, &unrelated, &component("checker"), who, timeout).await;
            (answer.unwrap(), std::time::Instant::now())
        })
    };
    let (ours, others) = (wait_as("local:host:1:a", Duration::from_secs(20)), wait_as("local:host:1:b", QUIET));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!ours.is_finished() && !others.is_finished(), "nothing handed yet, so both wait");
    // Appended through another handle, as another process appends.
    let appender = open_store(&f.url).await.unwrap();
    let handed = appender.append_handing_on(&id("B1"), received(&claim), std::slice::from_ref(&name)).await.unwrap();
    assert_eq!(handed.runs.len(), 1, "{handed:?}");
    let appended = std::time::Instant::now();
    let (answer, woke) = ours.await.unwrap();
    assert_eq!(answer, None, "woken by the announcement");
    assert!(woke.saturating_duration_since(appended) < Duration::from_secs(1), "woken at once, not by a poll");
    let (answer, woke) = others.await.unwrap();
    assert!(answer.is_some() && woke.saturating_duration_since(appended) >= QUIET / 2, "another taker slept on");

    let told = f.store.hand_on_notice(&checker(), liveness, notice.mark).await;
    assert_eq!(told.handed, Some(true));
    // Where the announcement carried the run, it is what the taker would have read (but for
    // the batch's clock: the announcement's is its commit's).
    let clock_aside = |mut answers: Vec<ReadyAnswer>| {
        answers.iter_mut().for_each(|answer| answer.batch.as_of = Timestamp(0));
        answers
    };
    let read = f.store.handed_runs(&checker(), liveness).await.unwrap();
    if let Some(carried) = told.runs.clone() {
        assert_eq!(clock_aside(carried), clock_aside(read), "an announcement carries what the taker reads");
    }
    assert_eq!(f.store.hand_on_notice(&checker(), liveness, told.mark).await.handed, Some(false), "told once");
    assert_eq!(f.store.hand_on_notice(&checker(), "local:host:1:b", told.mark).await.handed, None, "not offered here");
}

/// A registration hands its new batch on as a result does: to an idle taker of each step the
/// registrar named, in the registration's commit, announced to it; nothing for a batch that
/// existed, a held step or a busy taker.
pub(crate) async fn a_registration_hands_its_new_batch_to_an_idle_taker(f: Fixture) {
    let keeps = f.store.offer_to_take(TakerOffer { descriptor: checker(), holder: taker("a") }).await.unwrap();
    let delivered = || NewEvent::new(ty("Data_Received"), Outcome::Success, agent("trigger"));
    let new = |batch: &str| NewBatch::new(id(batch), BatchType::new("Delivery").unwrap());
    let registered = f.store.register_handing_on(new("B1"), delivered(), &[component("checker")]).await.unwrap();
    let CreateOutcome::Created(batch) = &registered.outcome else { panic!("{registered:?}") };
    assert_eq!(batch.effective().get(&ty("Data_Received")).map(|e| e.outcome), Some(Outcome::Success));
    if !keeps {
        assert!(registered.runs.is_empty(), "a store that keeps no takers hands nothing on");
        return;
    }
    assert_eq!(registered.runs.len(), 1, "{registered:?}");
    let run = &registered.runs[0];
    assert_eq!((run.component.as_str(), run.generation, &run.holder), ("checker", 1, &taker("a")));
    assert_eq!(f.store.get_batch(&id("B1")).await.unwrap().open_run(&component("checker")), Some(run));
    let found = f.store.handed_runs(&checker(), "local:host:1:a").await.unwrap();
    assert_eq!(found.iter().map(|answer| answer.batch.id.as_str()).collect::<Vec<_>>(), ["B1"]);

    // Registered again (a retry, a second scan): the batch as it stands, nothing handed.
    let again = f.store.register_handing_on(new("B1"), delivered(), &[component("checker")]).await.unwrap();
    assert!(matches!(again.outcome, CreateOutcome::AlreadyExists(_)) && again.runs.is_empty(), "{again:?}");
    // Busy with B1, the taker is handed nothing more.
    let busy = f.store.register_handing_on(new("B2"), delivered(), &[component("checker")]).await.unwrap();
    assert!(busy.runs.is_empty(), "{busy:?}");
    f.store.release(&id("B1"), &component("checker"), run.generation).await.unwrap();
    // A paused step is handed nothing.
    pause_checker(&f).await;
    let held = f.store.register_handing_on(new("B3"), delivered(), &[component("checker")]).await.unwrap();
    assert!(held.runs.is_empty(), "{held:?}");
    assert_eq!(f.store.get_batch(&id("B3")).await.unwrap().open_runs, []);
}

/// How long a waiter that nothing concerns is watched sleeping.
const QUIET: Duration = Duration::from_millis(1500);
