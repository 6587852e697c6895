//! A hand-on's announcement carries its taker's answer on PostgreSQL (schema 26,
//! `autocomp_announce_handed`): the taker's notice holds the run as its read of its handed
//! runs would answer it, so a stage handed on costs the taker no read; an answer too large
//! for a notification is announced without it, and read.

use std::time::{Duration, Instant};

use autocomp_model::*;
use autocomp_store::*;
use autocomp_test_servers::postgres::shared;
use serde_json::json;

fn id(text: &str) -> BatchId {
    BatchId::new(text).unwrap()
}

fn step(name: &str, requires: &str, produces: &str) -> ComponentDescriptor {
    let trigger = Trigger::builder().requires(requires).blocked_by(produces).build();
    ComponentDescriptor::new(ComponentName::new(name).unwrap(), "1.0", produces.parse().unwrap(), trigger)
}

fn taker(name: &str) -> RunHolder {
    RunHolder {
        agent: Agent::new(format!("{name}/1.0@host#1")).unwrap(),
        host: "host".into(),
        pid: 1,
        claim_key: None,
        liveness: Some(format!("pg:{name}")),
    }
}

/// The taker's notice from its last mark on, asked until its handle hears announcements.
async fn notice(store: &PgStore, descriptor: &ComponentDescriptor, since: Option<AnnouncementMark>) -> HandOnNotice {
    let liveness = format!("pg:{}", descriptor.name);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let notice = store.hand_on_notice(descriptor, &liveness, since).await;
        if notice.mark.is_some() {
            return notice;
        }
        assert!(Instant::now() < deadline, "the handle hears announcements within 10 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The notice after a hand-on, once its announcement reached the handle.
async fn told(store: &PgStore, descriptor: &ComponentDescriptor, since: AnnouncementMark) -> HandOnNotice {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let notice = notice(store, descriptor, Some(since)).await;
        if notice.handed != Some(false) {
            return notice;
        }
        assert!(Instant::now() < deadline, "the hand-on is announced within 10 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// What the taker reads of its handed runs, each batch's clock set aside (the announcement's
/// is its commit's, the read's its own).
async fn read(store: &PgStore, descriptor: &ComponentDescriptor) -> Vec<ReadyAnswer> {
    let liveness = format!("pg:{}", descriptor.name);
    store.handed_runs(descriptor, &liveness).await.unwrap()
}

fn clock_aside(mut answers: Vec<ReadyAnswer>) -> Vec<ReadyAnswer> {
    for answer in &mut answers {
        answer.batch.as_of = Timestamp(0);
    }
    answers
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hand_on_announces_what_its_taker_would_read_and_one_too_large_is_read() {
    let url = shared().unique_database();
    // The takers' handle, and the writers' (another process's, as a pipeline's appender is).
    let takers = PgStore::open(&url).await.unwrap();
    let writer = PgStore::open(&url).await.unwrap();
    let (checker, archiver) = (step("checker", "Data_Received", "Checked"), step("archiver", "Checked", "Archived"));
    for (descriptor, name) in [(&checker, "checker"), (&archiver, "archiver")] {
        let offer = TakerOffer { descriptor: descriptor.clone(), holder: taker(name) };
        assert!(takers.offer_to_take(offer).await.unwrap(), "the store keeps takers");
    }
    let (checking, archiving) = (notice(&takers, &checker, None).await, notice(&takers, &archiver, None).await);

    // A registration handed on: its announcement carries the new batch and the run.
    let delivered = NewEvent::new("Data_Received".parse().unwrap(), Outcome::Success, Agent::new("trigger").unwrap())
        .with_details(json!({"pages": 12, "note": "line one\nline \"two\""}));
    let new = NewBatch::new(id("C1"), "Delivery".parse().unwrap());
    let registered = writer.register_handing_on(new, delivered, std::slice::from_ref(&checker.name)).await.unwrap();
    assert_eq!(registered.runs.len(), 1, "{registered:?}");
    let told_checker = told(&takers, &checker, checking.mark.unwrap()).await;
    assert_eq!(told_checker.handed, Some(true));
    let carried = told_checker.runs.clone().expect("the registration's announcement carried the run");
    assert_eq!(clock_aside(carried.clone()), clock_aside(read(&takers, &checker).await));
    assert_eq!(carried[0].claim.as_ref().unwrap().run, registered.runs[0]);
    assert!(carried[0].batch.open_runs.is_empty(), "the batch as it was before its handed run: {carried:?}");

    // The checker's result hands the batch on to the archiver, its announcement carrying it.
    let claim = carried[0].claim.clone().unwrap();
    let checked = NewEvent::new("Checked".parse().unwrap(), Outcome::Success, Agent::new("checker").unwrap())
        .in_run(checker.name.clone(), claim.generation());
    let handed = writer.append_handing_on(&id("C1"), checked, std::slice::from_ref(&archiver.name)).await.unwrap();
    assert_eq!(handed.runs.len(), 1, "{handed:?}");
    let told_archiver = told(&takers, &archiver, archiving.mark.unwrap()).await;
    let carried = told_archiver.runs.clone().expect("the append's announcement carried the run");
    assert_eq!(clock_aside(carried.clone()), clock_aside(read(&takers, &archiver).await));
    let types: Vec<&str> = carried[0].batch.events.iter().map(|e| e.event_type.as_str()).collect();
    assert_eq!(types, ["Data_Received", "Checked"], "with the result that handed it on");
    assert_eq!(notice(&takers, &checker, told_checker.mark).await.handed, Some(false), "the checker told once");

    // A batch whose answer would not fit a notification (8,000 bytes): told, and read.
    let since = notice(&takers, &checker, told_checker.mark).await.mark.unwrap();
    let large = NewBatch {
        metadata: json!({"notes": "x".repeat(9_000)}),
        ..NewBatch::new(id("C2"), "Delivery".parse().unwrap())
    };
    let delivered = NewEvent::new("Data_Received".parse().unwrap(), Outcome::Success, Agent::new("trigger").unwrap());
    // The checker is idle again: its result closed its run.
    let registered = writer.register_handing_on(large, delivered, std::slice::from_ref(&checker.name)).await.unwrap();
    assert_eq!(registered.runs.len(), 1, "{registered:?}");
    let told_large = told(&takers, &checker, since).await;
    assert_eq!(told_large.handed, Some(true), "told of it");
    assert_eq!(told_large.runs, None, "without the answer, which did not fit");
    let read_large = read(&takers, &checker).await;
    assert_eq!(read_large.len(), 1);
    assert_eq!(read_large[0].batch.id, id("C2"), "read instead");
}
