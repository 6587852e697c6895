//! The contract of steering and of the notification outbox, run by the shared suite
//! (`operations.rs`) against every backend: what an operator and the breaker set reads back
//! as it was set, is refused as the model refuses it, wakes every watcher without entering
//! the change feed, and loses no change under concurrent writers; and every notice is taken
//! by one notifier at a time and sent once.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use autocomp_model::*;
use autocomp_store::pipeline_state::{
    MAX_NOTICE_BYTES, MAX_NOTICE_KEY_CHARS, MAX_NOTICE_LEASE, MAX_NOTICE_RETRY, MAX_NOTICES_PER_CALL,
    MAX_OUTCOME_SUMMARY_CHARS, MAX_STEERING_LOG_PAGE,
};
use autocomp_store::*;
use autocomp_test_servers::wait_until_async;
use serde_json::json;

use super::{Fixture, agent, component, id, register, tick};

fn pool(text: &str) -> PoolName {
    PoolName::new(text).unwrap()
}

fn ask(change: SteeringChange, by: &str, reason: &str) -> SteeringRequest {
    SteeringRequest { change, by: agent(by), reason: reason.into(), expect_version: None }
}

fn pause(name: &str) -> SteeringChange {
    SteeringChange::Pause { component: Some(component(name)), drain: false }
}

fn failure(name: &str, batch: &str, break_after: u32) -> SteeringRequest {
    outcome(name, batch, true, break_after)
}

fn outcome(name: &str, batch: &str, failed: bool, break_after: u32) -> SteeringRequest {
    let change = SteeringChange::Outcome {
        component: component(name),
        batch: id(batch),
        failed,
        break_after,
        summary: format!("{batch}: disk full"),
    };
    ask(change, &format!("{name}/1.0@h1#7"), "breaker")
}

/// The field an `Invalid` names; panics on any other answer.
fn invalid_field<T: std::fmt::Debug>(answer: StoreResult<T>) -> String {
    match answer {
        Err(StoreError::Invalid(input)) => input.field,
        other => panic!("expected Invalid, got {other:?}"),
    }
}

/// The message of a `Conflict`; panics on any other answer.
fn conflict<T: std::fmt::Debug>(answer: StoreResult<T>) -> String {
    match answer {
        Err(StoreError::Conflict(message)) => message,
        other => panic!("expected a conflict, got {other:?}"),
    }
}

/// The message of an `AlreadyInState` (held that way already); panics on any other answer.
fn already<T: std::fmt::Debug>(answer: StoreResult<T>) -> String {
    match answer {
        Err(StoreError::AlreadyInState(message)) => message,
        other => panic!("expected AlreadyInState, got {other:?}"),
    }
}

fn notice(key: &str) -> NewNotice {
    NewNotice {
        key: key.into(),
        channel: "mail".into(),
        subject: format!("autocomp: {key}"),
        body: json!({"text": format!("about {key}"), "facts": {"batch": "B1"}}),
    }
}

fn keys(notices: &[Notice]) -> Vec<&str> {
    notices.iter().map(|n| n.key.as_str()).collect()
}

/// `at` was stamped by the store's clock during a call made between `before` and `after`.
/// PostgreSQL's clock rounds to the millisecond where `Timestamp::now` truncates: up to 1 ms
/// later.
fn assert_between(before: Timestamp, at: Timestamp, after: Timestamp) {
    assert!(before <= at && at <= Timestamp(after.0 + 1), "the store's clock: {before} <= {at} <= {after}");
}

const LONG: Duration = Duration::from_secs(60);

pub async fn a_pause_reads_back_who_why_and_since_and_the_log_lists_it_newest_first(f: Fixture) {
    assert_eq!(f.store.steering().await.unwrap(), Steering::default(), "a fresh store steers nothing");
    assert_eq!(f.store.steering().await.unwrap().version, 0);
    assert!(f.store.steering_log(10).await.unwrap().is_empty());

    let before = Timestamp::now();
    let paused = f.store.steer(ask(pause("archiver"), "operator:ann", "tape maintenance")).await.unwrap();
    let after = Timestamp::now();
    assert!(!paused.circuit_opened);
    let entry = paused.entry.clone().expect("a pause is logged");
    assert_eq!((entry.version, entry.said.as_str()), (1, "paused archiver"));
    let steering = f.store.steering().await.unwrap();
    assert_eq!(steering, paused.steering, "read back as answered");
    assert_eq!(steering.version, 1);
    let hold = steering.hold_of(&component("archiver")).expect("held");
    assert_eq!(
        (hold.kind, &hold.by, hold.reason.as_str()),
        (HoldKind::Pause, &agent("operator:ann"), "tape maintenance")
    );
    assert_between(before, hold.since, after);
    assert_eq!(entry.at, hold.since);
    assert!(steering.hold_of(&component("checker")).is_none(), "other components are not held");

    f.store
        .steer(ask(SteeringChange::Pause { component: Some(component("checker")), drain: true }, "operator:bob", "r"))
        .await
        .unwrap();
    f.store
        .steer(ask(SteeringChange::SetPool { pool: pool("tape"), size: 2 }, "operator:bob", "two drives"))
        .await
        .unwrap();
    f.store
        .steer(ask(SteeringChange::SetPool { pool: pool("tape"), size: 1 }, "operator:bob", "one broke"))
        .await
        .unwrap();
    let steering = f.store.steering().await.unwrap();
    assert_eq!(steering.version, 4);
    assert_eq!(steering.hold_of(&component("checker")).unwrap().kind, HoldKind::Drain);
    let tape = steering.pool(&pool("tape")).unwrap();
    assert_eq!((tape.size, tape.reason.as_str()), (1, "one broke"));
    let log = f.store.steering_log(10).await.unwrap();
    let said: Vec<(u64, &str)> = log.iter().map(|e| (e.version, e.said.as_str())).collect();
    assert_eq!(
        said,
        [
            (4, "pool tape: size 1 (was 2)"),
            (3, "pool tape: size 2 (new)"),
            (2, "draining checker"),
            (1, "paused archiver")
        ],
        "newest first"
    );
    assert_eq!(log[3], entry, "the entry as the steer answered it");
    assert_eq!(f.store.steering_log(2).await.unwrap(), log[..2], "the newest two");

    // A second pause is refused naming the first pauser, and changes nothing.
    let head = f.store.head().await.unwrap();
    let message = already(f.store.steer(ask(pause("archiver"), "operator:carol", "again")).await);
    assert!(message.contains("archiver is paused already, by operator:ann"), "{message}");
    assert!(message.contains("tape maintenance"), "{message}");
    // Resuming what is not held, or confirming a stale preview, likewise.
    let message = conflict(
        f.store.steer(ask(SteeringChange::Resume { component: Some(component("loader")) }, "operator:ann", "r")).await,
    );
    assert!(message.contains("loader is not paused"), "{message}");
    let message = conflict(f.store.steer(ask(SteeringChange::Resume { component: None }, "operator:ann", "r")).await);
    assert!(message.contains("not paused"), "{message}");
    let stale = SteeringRequest { expect_version: Some(3), ..ask(pause("loader"), "operator:ann", "planned") };
    let message = match f.store.steer(stale).await {
        Err(StoreError::ChangedSincePreview(message)) => message,
        other => panic!("expected ChangedSincePreview, got {other:?}"),
    };
    assert!(message.contains("version 3, now 4"), "{message}");
    assert_eq!(f.store.steering().await.unwrap(), steering, "the refusals changed nothing");
    assert_eq!(f.store.steering_log(10).await.unwrap(), log, "and logged nothing");
    assert_eq!(f.store.head().await.unwrap(), head, "nor moved the head");

    // The preview's version still current: applied.
    let current = SteeringRequest { expect_version: Some(4), ..ask(pause("loader"), "operator:ann", "planned") };
    assert_eq!(f.store.steer(current).await.unwrap().steering.version, 5);
    let resumed = f
        .store
        .steer(ask(SteeringChange::Resume { component: Some(component("archiver")) }, "operator:ann", "done"))
        .await
        .unwrap();
    assert!(resumed.entry.unwrap().said.starts_with("resumed archiver (paused since"));
    assert!(f.store.steering().await.unwrap().hold_of(&component("archiver")).is_none());

    // The whole pipeline's hold covers every component, and resume --all lifts it alone.
    f.store
        .steer(ask(SteeringChange::Pause { component: None, drain: false }, "operator:ann", "upgrade"))
        .await
        .unwrap();
    let steering = f.store.steering().await.unwrap();
    assert_eq!(steering.hold_of(&component("anything")).unwrap().reason, "upgrade");
    let all = f.store.steer(ask(SteeringChange::Resume { component: None }, "operator:ann", "upgraded")).await.unwrap();
    assert!(all.entry.unwrap().said.ends_with("still held on their own: checker, loader"));
    assert_eq!(f.store.steering_log(1_000).await.unwrap().len(), 8);
    for limit in [0, MAX_STEERING_LOG_PAGE + 1] {
        assert_eq!(invalid_field(f.store.steering_log(limit).await), "limit");
    }
}

pub async fn bad_steering_requests_are_refused_by_name_and_change_nothing(f: Fixture) {
    f.store.steer(ask(SteeringChange::SetPool { pool: pool("tape"), size: 2 }, "operator:ann", "two")).await.unwrap();
    let (steering, log, head) =
        (f.store.steering().await.unwrap(), f.store.steering_log(10).await.unwrap(), f.store.head().await.unwrap());
    let long = "r".repeat(2_001);
    for reason in ["", "   ", "two\nlines", "bell\u{7}", "\u{1b}[31mred", "right\u{202e}to left", &long] {
        let answer = f.store.steer(ask(pause("archiver"), "operator:ann", reason)).await;
        assert_eq!(invalid_field(answer), "reason", "{reason:?}");
    }
    let too_big = SteeringChange::SetPool { pool: pool("tape"), size: MAX_POOL_SIZE + 1 };
    assert_eq!(invalid_field(f.store.steer(ask(too_big, "operator:ann", "more")).await), "size");
    let breaker = SteeringRequest { reason: "\u{0}".into(), ..failure("archiver", "B1", 3) };
    assert_eq!(invalid_field(f.store.steer(breaker).await), "reason");
    assert_eq!(f.store.steering().await.unwrap(), steering, "nothing changed");
    assert_eq!(f.store.steering_log(10).await.unwrap(), log, "nothing logged");
    assert_eq!(f.store.head().await.unwrap(), head, "the head did not move");
    // The largest pool, and a closed one, are fine.
    for size in [MAX_POOL_SIZE, 0] {
        let change = SteeringChange::SetPool { pool: pool("tape"), size };
        let steered = f.store.steer(ask(change, "operator:ann", "resize")).await.unwrap();
        assert_eq!(steered.steering.pool(&pool("tape")).unwrap().size, size);
    }
}

pub async fn a_steer_wakes_every_watcher_but_adds_nothing_to_the_change_feed(f: Fixture) {
    register(&f.store, "B1").await;
    let head = f.store.head().await.unwrap();
    let feed = f.store.changes(Seq::ZERO, 100).await.unwrap();

    let (waiting, started) = tokio::sync::oneshot::channel();
    let waiter = {
        let store = Arc::clone(&f.store);
        tokio::spawn(async move {
            let _ = waiting.send(());
            let answer = store.wait_for_change(head, Duration::from_secs(5)).await.unwrap();
            (answer, Instant::now())
        })
    };
    started.await.unwrap();
    f.store.steer(ask(pause("archiver"), "operator:ann", "look")).await.unwrap();
    let steered = Instant::now();
    let (answer, woke) = waiter.await.unwrap();
    let delay = woke.saturating_duration_since(steered);
    assert!(answer > head, "the watcher woke to a new head");
    assert!(delay < Duration::from_secs(2), "woke {delay:?} after the steer");
    let moved = f.store.head().await.unwrap();
    assert!(moved > head, "the head grew");
    assert_eq!(moved, answer);

    let page = f.store.changes(head, 100).await.unwrap();
    assert!(page.changes.is_empty(), "no batch changed: {page:?}");
    assert_eq!((page.next, page.head), (moved, moved), "a follower moves past it");
    assert_eq!(f.store.changes(Seq::ZERO, 100).await.unwrap().changes, feed.changes, "the feed is as it was");
    // A breaker count with no log entry moves the head too; the next batch write comes after.
    f.store.steer(failure("archiver", "B1", 3)).await.unwrap();
    let counted = f.store.head().await.unwrap();
    assert!(counted > moved);
    let seq = f.store.set_priority(&id("B1"), 5).await.unwrap();
    assert!(seq > counted, "batch seqs keep growing past steering's");
    assert_eq!(f.store.changes(head, 100).await.unwrap().changes, [(seq, id("B1"))]);
}

pub async fn the_breaker_opens_the_circuit_at_break_after_distinct_failures(f: Fixture) {
    let archiver = component("archiver");
    for (batch, consecutive) in [("B1", 1), ("B1", 1), ("B2", 2)] {
        let steered = f.store.steer(failure("archiver", batch, 3)).await.unwrap();
        assert!(!steered.circuit_opened && steered.entry.is_none(), "{steered:?}");
        assert_eq!(steered.steering.breakers[&archiver].consecutive, consecutive, "after {batch}");
    }
    let steering = f.store.steering().await.unwrap();
    assert_eq!(steering.version, 3, "every count is a change of state");
    assert!(steering.hold_of(&archiver).is_none(), "not open yet");
    assert!(f.store.steering_log(10).await.unwrap().is_empty(), "counts are state, not news");

    let before = Timestamp::now();
    let opened = f.store.steer(failure("archiver", "B3", 3)).await.unwrap();
    assert!(opened.circuit_opened);
    let entry = opened.entry.clone().expect("the opening is logged");
    assert_eq!(entry.said, "archiver: circuit open: 3 consecutive failures, last: B3: B3: disk full");
    let steering = f.store.steering().await.unwrap();
    assert_eq!(steering, opened.steering);
    let hold = steering.hold_of(&archiver).expect("held");
    assert_eq!((hold.kind, hold.by.as_str()), (HoldKind::Circuit, "archiver/1.0@h1#7"));
    assert!(hold.since >= before);
    assert!(steering.hold_of(&component("checker")).is_none(), "its own circuit only");

    // Work that was running fails too: counted, not opened again, not logged again.
    let late = f.store.steer(failure("archiver", "B4", 3)).await.unwrap();
    assert!(!late.circuit_opened && late.entry.is_none());
    let breaker = &late.steering.breakers[&archiver];
    assert_eq!(breaker.consecutive, 4);
    assert_eq!(breaker.failed, [id("B1"), id("B2"), id("B3"), id("B4")]);
    assert_eq!(breaker.last.as_deref(), Some("B4: disk full"));
    assert_eq!(f.store.steering_log(10).await.unwrap(), [entry], "only the opening");
    let message = already(f.store.steer(ask(pause("archiver"), "operator:ann", "r")).await);
    assert!(message.contains("circuit open already"), "{message}");

    let resumed =
        f.store.steer(ask(SteeringChange::Resume { component: Some(archiver.clone()) }, "operator:ann", "fixed")).await;
    assert!(resumed.unwrap().entry.unwrap().said.contains("after 4 consecutive failures"));
    let steering = f.store.steering().await.unwrap();
    assert!(steering.hold_of(&archiver).is_none() && steering.breakers.is_empty(), "{steering:?}");

    // A success starts the count again; break_after 0 never opens.
    f.store.steer(failure("archiver", "B5", 3)).await.unwrap();
    f.store.steer(failure("archiver", "B6", 3)).await.unwrap();
    f.store.steer(outcome("archiver", "B7", false, 3)).await.unwrap();
    assert!(f.store.steering().await.unwrap().breakers.is_empty());
    for batch in ["B8", "B9", "B10", "B11"] {
        assert!(!f.store.steer(failure("checker", batch, 0)).await.unwrap().circuit_opened);
    }
    let steering = f.store.steering().await.unwrap();
    assert_eq!(steering.breakers[&component("checker")].consecutive, 4);
    assert!(steering.hold_of(&component("checker")).is_none());
    assert_eq!(f.store.steering_log(10).await.unwrap().len(), 2, "the opening and the resume");

    // A failure's summary is a command's output: any characters, any length. The log keeps
    // the opening's change with its summary cut, each character as it came.
    let mut long = outcome("loader", "B1", true, 1);
    let head = "exit 1: \u{0}\u{FDD0}0 ünïcödé \u{1b}[31m";
    if let SteeringChange::Outcome { summary, .. } = &mut long.change {
        *summary = format!("{head}{}", "é".repeat(1_000_000));
    }
    let opened = f.store.steer(long).await.unwrap();
    let entry = opened.entry.expect("opened");
    let SteeringChange::Outcome { summary, .. } = &entry.change else { panic!("{entry:?}") };
    assert_eq!(summary.chars().count(), MAX_OUTCOME_SUMMARY_CHARS + 1);
    assert!(summary.starts_with(head) && summary.ends_with("é…"), "cut, marked");
    assert_eq!(f.store.steering_log(1).await.unwrap(), std::slice::from_ref(&entry), "read back as answered");
    let hold = f.store.steering().await.unwrap().components[&component("loader")].clone();
    assert!(hold.reason.starts_with("circuit open: 1 consecutive failures, last: B1: exit 1:"), "{}", hold.reason);
    assert!(!hold.reason.chars().any(char::is_control), "the hold's reason is one line: {:?}", hold.reason);
}

pub async fn concurrent_steers_lose_no_change(f: Fixture) {
    // Past any fixed number of attempts a writer might make after losing the race.
    const TASKS: usize = 64;
    let head = f.store.head().await.unwrap();
    let stores = [Arc::clone(&f.store), open_store(&f.url).await.unwrap()];
    let start = Arc::new(tokio::sync::Barrier::new(TASKS));
    let tasks: Vec<_> = (0..TASKS)
        .map(|n| {
            let (store, start) = (Arc::clone(&stores[n / 2 % 2]), Arc::clone(&start));
            tokio::spawn(async move {
                let request = if n % 2 == 0 {
                    let change = SteeringChange::SetPool { pool: pool(&format!("pool-{n}")), size: n as u32 };
                    ask(change, "operator:ann", "sizing")
                } else {
                    failure("archiver", &format!("B{n}"), 1_000)
                };
                start.wait().await;
                store.steer(request).await
            })
        })
        .collect();
    let mut versions = BTreeSet::new();
    for task in tasks {
        let steered = task.await.unwrap().expect("every steer succeeds");
        versions.insert(steered.steering.version);
    }
    assert_eq!(versions, (1..=TASKS as u64).collect(), "each change got its own version");
    let steering = f.store.steering().await.unwrap();
    assert_eq!(steering.version, TASKS as u64, "every change applied once");
    let sizes: BTreeMap<String, u32> = steering.pools.iter().map(|(name, p)| (name.to_string(), p.size)).collect();
    let expected: BTreeMap<String, u32> = (0..TASKS).step_by(2).map(|n| (format!("pool-{n}"), n as u32)).collect();
    assert_eq!(sizes, expected, "no pool change lost");
    let breaker = &steering.breakers[&component("archiver")];
    assert_eq!(breaker.consecutive, (TASKS / 2) as u32, "no failure lost");
    let failed: BTreeSet<String> = breaker.failed.iter().map(ToString::to_string).collect();
    assert_eq!(failed, (1..TASKS).step_by(2).map(|n| format!("B{n}")).collect());
    let log = f.store.steering_log(100).await.unwrap();
    assert_eq!(log.len(), TASKS / 2, "each pool change logged once");
    assert!(log.windows(2).all(|pair| pair[0].version > pair[1].version), "newest first, distinct");
    assert_eq!(f.store.head().await.unwrap().0, head.0 + TASKS as i64, "one seq each");
}

pub async fn enqueue_adds_each_key_once_and_moves_the_cursor_only_from_where_it_was(f: Fixture) {
    register(&f.store, "B1").await;
    let head = f.store.head().await.unwrap();
    assert_eq!(f.store.enqueue_notices(vec![], None).await.unwrap(), Enqueued { added: 0, cursor: CURSOR_UNSET });
    let first = f.store.enqueue_notices(
        vec![notice("mail:a"), notice("mail:b")],
        Some(CursorMove { from: CURSOR_UNSET, to: Seq(10) }),
    );
    assert_eq!(first.await.unwrap(), Enqueued { added: 2, cursor: Seq(10) });

    // Another notifier found the same item (and one more), reading the cursor before it moved.
    tick().await;
    let changed = NewNotice { subject: "another subject".into(), ..notice("mail:a") };
    let second =
        f.store.enqueue_notices(vec![changed, notice("mail:c")], Some(CursorMove { from: CURSOR_UNSET, to: Seq(20) }));
    assert_eq!(
        second.await.unwrap(),
        Enqueued { added: 1, cursor: Seq(10) },
        "the cursor stays where the first moved it"
    );
    tick().await;
    let repeated = f.store.enqueue_notices(vec![notice("mail:d"), notice("mail:d")], None).await.unwrap();
    assert_eq!(repeated, Enqueued { added: 1, cursor: Seq(10) }, "a key twice in one call is added once");
    let moved = f.store.enqueue_notices(vec![notice("mail:a")], Some(CursorMove { from: Seq(10), to: Seq(15) }));
    assert_eq!(moved.await.unwrap(), Enqueued { added: 0, cursor: Seq(15) });

    let recent = f.store.recent_notices(10).await.unwrap();
    assert_eq!(keys(&recent), ["mail:d", "mail:c", "mail:b", "mail:a"], "newest first");
    let a = &recent[3];
    assert_eq!(a.subject, "autocomp: mail:a", "the first enqueue's notice stands");
    assert_eq!(a.body, notice("mail:a").body);
    assert_eq!((a.attempts, &a.last_error, a.sent_at), (0, &None, None));
    assert_eq!(keys(&f.store.recent_notices(2).await.unwrap()), ["mail:d", "mail:c"]);
    assert_eq!(f.store.head().await.unwrap(), head, "the outbox takes no seq");
}

pub async fn a_taken_notice_is_leased_to_its_holder_and_sent_once(f: Fixture) {
    f.store.enqueue_notices(vec![notice("n1"), notice("n2")], None).await.unwrap();
    tick().await;
    f.store.enqueue_notices(vec![notice("n3")], None).await.unwrap();

    let taken = f.store.take_notices("notifier-a", 2, LONG).await.unwrap();
    assert_eq!(keys(&taken), ["n1", "n2"], "oldest first");
    assert_eq!(taken[0].subject, "autocomp: n1");
    let other = f.store.take_notices("notifier-b", 10, LONG).await.unwrap();
    assert_eq!(keys(&other), ["n3"], "none of a's leased notices");
    assert!(f.store.take_notices("notifier-b", 10, LONG).await.unwrap().is_empty());
    assert!(f.store.take_notices("notifier-a", 10, LONG).await.unwrap().is_empty(), "a's own are leased too");

    let message = conflict(f.store.settle_notice("n1", "notifier-b", NoticeOutcome::Sent).await);
    assert!(message.contains("not leased to notifier-b"), "{message}");
    let before = Timestamp::now();
    f.store.settle_notice("n1", "notifier-a", NoticeOutcome::Sent).await.unwrap();
    let after = Timestamp::now();
    let message = conflict(f.store.settle_notice("n1", "notifier-a", NoticeOutcome::Sent).await);
    assert!(message.contains("sent already"), "{message}");
    let failed = NoticeOutcome::Failed { error: "late".into(), retry_in: Duration::ZERO };
    assert!(conflict(f.store.settle_notice("n1", "notifier-a", failed).await).contains("sent already"));
    let message = conflict(f.store.settle_notice("n9", "notifier-a", NoticeOutcome::Sent).await);
    assert!(message.contains("not in the outbox"), "{message}");

    let recent = f.store.recent_notices(10).await.unwrap();
    assert_eq!(keys(&recent), ["n3", "n2", "n1"]);
    let sent_at = recent[2].sent_at.expect("n1 was sent");
    assert_between(before, sent_at, after);
    assert!(recent[..2].iter().all(|n| n.sent_at.is_none()), "the others are pending");
    f.store.settle_notice("n2", "notifier-a", NoticeOutcome::Sent).await.unwrap();
    f.store.settle_notice("n3", "notifier-b", NoticeOutcome::Sent).await.unwrap();
    assert!(f.store.recent_notices(10).await.unwrap().iter().all(|n| n.sent_at.is_some()));
    assert!(f.store.take_notices("notifier-c", 10, LONG).await.unwrap().is_empty(), "a sent notice is never taken");
}

pub async fn a_failed_notice_is_due_again_after_retry_in_with_its_attempts_counted(f: Fixture) {
    const RETRY_IN: Duration = Duration::from_millis(300);
    f.store.enqueue_notices(vec![notice("n1")], None).await.unwrap();
    for attempt in 1..=2 {
        let taken = f.store.take_notices("notifier-a", 10, LONG).await.unwrap();
        assert_eq!(keys(&taken), ["n1"]);
        let failed =
            NoticeOutcome::Failed { error: format!("smtp: 451 try later\r\n(attempt {attempt})"), retry_in: RETRY_IN };
        let settled = Instant::now();
        f.store.settle_notice("n1", "notifier-a", failed).await.unwrap();
        let early = f.store.take_notices("notifier-b", 10, LONG).await.unwrap();
        if settled.elapsed() < RETRY_IN - Duration::from_millis(50) {
            assert!(early.is_empty(), "taken again before its retry time: {early:?}");
        }
        let mut again = early;
        let due = wait_until_async(Instant::now() + Duration::from_secs(10), async || {
            if again.is_empty() {
                again = f.store.take_notices("notifier-b", 10, LONG).await.unwrap();
            }
            !again.is_empty()
        })
        .await;
        assert!(due, "n1 never came due again");
        let waited = settled.elapsed();
        assert!(waited >= RETRY_IN - Duration::from_millis(5), "due again after {waited:?}");
        assert_eq!(keys(&again), ["n1"]);
        assert_eq!(again[0].attempts, 2 * attempt - 1, "each failure counted");
        let kept = format!("smtp: 451 try later  (attempt {attempt})");
        assert_eq!(again[0].last_error.as_deref(), Some(kept.as_str()), "kept on one line");
        f.store
            .settle_notice("n1", "notifier-b", NoticeOutcome::Failed { error: "x".into(), retry_in: Duration::ZERO })
            .await
            .unwrap();
        // Due again at once: the next round takes it as notifier-a.
    }
    let taken = f.store.take_notices("notifier-a", 10, LONG).await.unwrap();
    assert_eq!((keys(&taken), taken[0].attempts, taken[0].last_error.as_deref()), (vec!["n1"], 4, Some("x")));
    f.store.settle_notice("n1", "notifier-a", NoticeOutcome::Sent).await.unwrap();
    let sent = &f.store.recent_notices(1).await.unwrap()[0];
    assert_eq!((sent.attempts, sent.sent_at.is_some()), (4, true), "attempts kept once sent");
}

pub async fn an_expired_lease_lets_another_holder_take_it_and_refuses_the_first(f: Fixture) {
    const LEASE: Duration = Duration::from_millis(200);
    f.store.enqueue_notices(vec![notice("n1")], None).await.unwrap();
    let taken_at = Instant::now();
    assert_eq!(keys(&f.store.take_notices("notifier-a", 10, LEASE).await.unwrap()), ["n1"]);
    let mut taken = Vec::new();
    let took = wait_until_async(Instant::now() + Duration::from_secs(10), async || {
        taken = f.store.take_notices("notifier-b", 10, LONG).await.unwrap();
        !taken.is_empty()
    })
    .await;
    assert!(took, "the lease never ran out");
    let waited = taken_at.elapsed();
    assert!(waited >= LEASE - Duration::from_millis(5), "taken over after {waited:?}, within the lease");
    assert_eq!((keys(&taken), taken[0].attempts), (vec!["n1"], 0));
    let message = conflict(f.store.settle_notice("n1", "notifier-a", NoticeOutcome::Sent).await);
    assert!(message.contains("not leased to notifier-a"), "{message}");
    assert!(f.store.recent_notices(1).await.unwrap()[0].sent_at.is_none(), "the refused settle changed nothing");
    f.store.settle_notice("n1", "notifier-b", NoticeOutcome::Sent).await.unwrap();
}

pub async fn concurrent_takers_never_get_the_same_notice(f: Fixture) {
    const NOTICES: usize = 120;
    const TAKERS: usize = 6;
    let all: Vec<NewNotice> = (0..NOTICES).map(|n| notice(&format!("mail:failure:B{n:03}"))).collect();
    assert_eq!(f.store.enqueue_notices(all, None).await.unwrap().added, NOTICES as u64);
    // Through two clients of the store (two connections to the file, two pools).
    let stores = [Arc::clone(&f.store), open_store(&f.url).await.unwrap()];
    let start = Arc::new(tokio::sync::Barrier::new(TAKERS));
    let tasks: Vec<_> = (0..TAKERS)
        .map(|n| {
            let (store, start) = (Arc::clone(&stores[n % 2]), Arc::clone(&start));
            tokio::spawn(async move {
                let holder = format!("notifier-{n}");
                let mut mine = Vec::new();
                start.wait().await;
                loop {
                    let taken = store.take_notices(&holder, 7, LONG).await.unwrap();
                    if taken.is_empty() {
                        return mine;
                    }
                    for notice in taken {
                        store.settle_notice(&notice.key, &holder, NoticeOutcome::Sent).await.unwrap();
                        mine.push(notice.key);
                    }
                }
            })
        })
        .collect();
    let mut seen = BTreeMap::<String, usize>::new();
    for task in tasks {
        for key in task.await.unwrap() {
            *seen.entry(key).or_default() += 1;
        }
    }
    let twice: Vec<&String> = seen.iter().filter(|(_, n)| **n > 1).map(|(k, _)| k).collect();
    assert!(twice.is_empty(), "taken by two: {twice:?}");
    assert_eq!(seen.len(), NOTICES, "every notice taken once");
    let recent = f.store.recent_notices(1_000).await.unwrap();
    assert!(recent.iter().all(|n| n.sent_at.is_some() && n.attempts == 0));
}

pub async fn bad_notice_input_is_refused_by_name_and_writes_nothing(f: Fixture) {
    let cases = [
        (NewNotice { key: "has space".into(), ..notice("k") }, "notice key"),
        (NewNotice { key: String::new(), ..notice("k") }, "notice key"),
        (NewNotice { key: "k".repeat(MAX_NOTICE_KEY_CHARS + 1), ..notice("k") }, "notice key"),
        (NewNotice { key: "ключ".into(), ..notice("k") }, "notice key"),
        (NewNotice { channel: "sms".into(), ..notice("k") }, "channel"),
        (NewNotice { subject: String::new(), ..notice("k") }, "subject"),
        (NewNotice { subject: "two\nlines".into(), ..notice("k") }, "subject"),
        (NewNotice { body: json!(["not", "an", "object"]), ..notice("k") }, "body"),
        (NewNotice { body: json!("text"), ..notice("k") }, "body"),
        (NewNotice { body: json!({"text": "x".repeat(MAX_NOTICE_BYTES)}), ..notice("k") }, "body"),
    ];
    for (bad, field) in cases {
        // With a good notice beside it: the whole call is refused.
        let answer =
            f.store.enqueue_notices(vec![notice("good"), bad], Some(CursorMove { from: CURSOR_UNSET, to: Seq(5) }));
        assert_eq!(invalid_field(answer.await), field);
    }
    let many = (0..=MAX_NOTICES_PER_CALL).map(|n| notice(&format!("k{n}"))).collect();
    assert_eq!(invalid_field(f.store.enqueue_notices(many, None).await), "notices");
    let backwards = Some(CursorMove { from: Seq(5), to: Seq(4) });
    assert_eq!(invalid_field(f.store.enqueue_notices(vec![notice("good")], backwards).await), "cursor");
    assert!(f.store.recent_notices(10).await.unwrap().is_empty(), "nothing was written");
    assert_eq!(f.store.enqueue_notices(vec![], None).await.unwrap().cursor, CURSOR_UNSET, "the cursor did not move");

    f.store.enqueue_notices(vec![notice("good")], None).await.unwrap();
    let takes = [
        ("notifier", 0, LONG, "limit"),
        ("notifier", MAX_NOTICES_PER_CALL + 1, LONG, "limit"),
        ("notifier", 1, Duration::ZERO, "lease"),
        ("notifier", 1, MAX_NOTICE_LEASE + Duration::from_secs(1), "lease"),
        ("", 1, LONG, "holder"),
        ("two\nlines", 1, LONG, "holder"),
    ];
    for (holder, limit, lease, field) in takes {
        assert_eq!(
            invalid_field(f.store.take_notices(holder, limit, lease).await),
            field,
            "{holder:?} {limit} {lease:?}"
        );
    }
    let taken = f.store.take_notices("notifier", 10, LONG).await.unwrap();
    assert_eq!(keys(&taken), ["good"], "the refused takes leased nothing");
    assert_eq!(invalid_field(f.store.settle_notice("bad key", "notifier", NoticeOutcome::Sent).await), "notice key");
    assert_eq!(invalid_field(f.store.settle_notice("good", "", NoticeOutcome::Sent).await), "holder");
    for retry_in in [MAX_NOTICE_RETRY + Duration::from_millis(1), Duration::MAX] {
        let later = NoticeOutcome::Failed { error: "down".into(), retry_in };
        assert_eq!(invalid_field(f.store.settle_notice("good", "notifier", later).await), "retry_in");
    }
    let pending = &f.store.recent_notices(1).await.unwrap()[0];
    assert_eq!((pending.attempts, pending.sent_at), (0, None), "the refused settles changed nothing");
    let week = NoticeOutcome::Failed { error: "down".into(), retry_in: MAX_NOTICE_RETRY };
    f.store.settle_notice("good", "notifier", week).await.unwrap();
    assert!(f.store.take_notices("notifier", 10, LONG).await.unwrap().is_empty(), "due in a week, not at once");
    for limit in [0, MAX_NOTICES_PER_CALL + 1] {
        assert_eq!(invalid_field(f.store.recent_notices(limit).await), "limit");
    }
}

pub async fn notice_text_round_trips_every_character(f: Fixture) {
    let subject = "disk \u{0} full \u{FDD0}0 marked \u{1F4BE} ünïcödé";
    let body = json!({
        "text": "a\u{0}b",
        "\u{0}key": "\u{FDD0}",
        "nested": [{"t": "\u{FDD0}0\u{0}"}, 1, null, true],
    });
    let odd = NewNotice {
        key: "webhook:failure:B1:812".into(),
        channel: "webhook".into(),
        subject: subject.into(),
        body: body.clone(),
    };
    f.store.enqueue_notices(vec![odd], None).await.unwrap();
    let recent = f.store.recent_notices(1).await.unwrap();
    assert_eq!((recent[0].subject.as_str(), &recent[0].body, recent[0].channel.as_str()), (subject, &body, "webhook"));
    let taken = f.store.take_notices("notifier \u{FDD0}", 1, LONG).await.unwrap();
    assert_eq!((taken[0].subject.as_str(), &taken[0].body), (subject, &body));
    let failed = NoticeOutcome::Failed { error: "refused \u{0} \u{FDD0}0".into(), retry_in: Duration::ZERO };
    f.store.settle_notice("webhook:failure:B1:812", "notifier \u{FDD0}", failed).await.unwrap();
    let again = f.store.recent_notices(1).await.unwrap();
    assert_eq!(again[0].last_error.as_deref(), Some("refused   \u{FDD0}0"), "control characters kept as spaces");
    assert_eq!((again[0].subject.as_str(), &again[0].body), (subject, &body));
}

pub async fn notices_found_together_sort_by_the_bytes_of_their_keys_whatever_the_locale(f: Fixture) {
    // PostgreSQL sorts text by the database's locale unless told otherwise: a store in a
    // database made with a natural-language collation must still list and take as SQLite does.
    let store = match f.url.strip_prefix("postgres://") {
        Some(_) => {
            let server = autocomp_test_servers::postgres::shared();
            let name = format!("{}_icu", f.url.rsplit('/').next().unwrap());
            server.psql(
                "postgres",
                &format!("CREATE DATABASE \"{name}\" TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE 'en-US'"),
            );
            Arc::new(PgStore::open(&server.url(&name)).await.unwrap()) as Arc<dyn ObjectStore>
        }
        None => Arc::clone(&f.store),
    };
    let found = ["mail:a-c", "mail:ab", "mail:aa", "mail:A-b", "mail:B", "webhook:1", "mail:_z"];
    let many: Vec<NewNotice> = (0..200).map(|n| notice(&format!("mail:zz{:03}", 199 - n))).collect();
    store.enqueue_notices(found.iter().map(|k| notice(k)).chain(many).collect(), None).await.unwrap();
    let mut by_bytes: Vec<String> = found.iter().map(ToString::to_string).collect();
    by_bytes.extend((0..200).map(|n| format!("mail:zz{n:03}")));
    by_bytes.sort();
    let recent = store.recent_notices(1_000).await.unwrap();
    assert!(recent.iter().all(|n| n.created_at == recent[0].created_at), "found together, enqueued at one time");
    let newest_first: Vec<&str> = by_bytes.iter().rev().map(String::as_str).collect();
    assert_eq!(keys(&recent), newest_first, "newest first, then by key");
    let taken = store.take_notices("notifier", 3, LONG).await.unwrap();
    assert_eq!(keys(&taken), by_bytes[..3], "oldest first, then by key");
}
