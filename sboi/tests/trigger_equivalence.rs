//! The index answers exactly what the model says: random batch histories written through
//! the real store, then random triggers compared with `Trigger::select` in order, and random
//! selections (the monitor's counts and pages, components' states among them) compared with
//! `Selection::matches_at`, after each catch-up and after a rebuild into a fresh index.
//! Event types first seen in later parts of a history grow the index's vocabulary in the
//! middle of a catch-up (and of the rebuild). Fresh queries (`IndexEngine::query_fresh`)
//! are held to `Trigger::select` at the store's head while the index is behind it by a part
//! of the history (new batches, new event types, resets, priority and content changes), or,
//! in one part, by what was written after a catch-up stopped at a random point of it. `PROPTEST_CASES` raises the
//! number of histories (default 96, each with 24 triggers and 24 selections at four points,
//! and the 24 triggers fresh at three more).

use std::time::Duration;

use autocomp_model::*;
use autocomp_sboi::{EngineOptions, IndexEngine, MAX_CORRECTIONS, PageKey, PageOrder, PageRequest, Tally};
use autocomp_store::*;
use proptest::prelude::*;
use serde_json::{Map, json};

const BATCHES: u8 = 10;
const EVENT_TYPES: [&str; 6] = ["Received", "Checked", "Verified", "Archived", "Published", "Late"];
/// Event types from this index on appear only after the first catch-up.
const FIRST_LATE_TYPE: usize = 4;
const BATCH_TYPES: [&str; 2] = ["RoundTrip", "Film"];
const COMPONENTS: [&str; 2] = ["checker", "verifier"];

#[derive(Debug, Clone)]
enum Op {
    Create {
        batch: u8,
        batch_type: usize,
        priority: i32,
    },
    Append {
        batch: u8,
        event_type: usize,
        success: bool,
        transient: bool,
        /// Recorded by `skip` (a success) or not.
        skipped: bool,
        /// Worked out from no content (0), the batch's content now (1), or seq 1's (2).
        content: u8,
    },
    Reset {
        batch: u8,
        types: Vec<usize>,
    },
    ContentChange {
        batch: u8,
    },
    Prioritize {
        batch: u8,
        priority: i32,
    },
    Claim {
        batch: u8,
        component: usize,
    },
    /// Ends an open run: records a result in it, or releases it.
    EndRun {
        batch: u8,
        component: usize,
        record: Option<(usize, bool)>,
    },
    /// Prunes the batch's history as read now (refused while a run is open): it is then
    /// ready for nothing.
    Prune {
        batch: u8,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let batch = 0..BATCHES;
    prop_oneof![
        3 => (batch.clone(), 0..BATCH_TYPES.len(), -2..3i32)
            .prop_map(|(batch, batch_type, priority)| Op::Create { batch, batch_type, priority }),
        6 => (batch.clone(), 0..EVENT_TYPES.len(), prop::bool::weighted(0.75), any::<bool>(), prop::bool::weighted(0.2), 0..3u8)
            .prop_map(|(batch, event_type, success, transient, skipped, content)| {
                Op::Append { batch, event_type, success, transient, skipped, content }
            }),
        1 => (batch.clone(), prop::collection::vec(0..EVENT_TYPES.len(), 1..3))
            .prop_map(|(batch, types)| Op::Reset { batch, types }),
        1 => batch.clone().prop_map(|batch| Op::ContentChange { batch }),
        1 => (batch.clone(), -3..4i32).prop_map(|(batch, priority)| Op::Prioritize { batch, priority }),
        1 => (batch.clone(), 0..COMPONENTS.len()).prop_map(|(batch, component)| Op::Claim { batch, component }),
        1 => (batch.clone(), 0..COMPONENTS.len(), prop::option::of((0..EVENT_TYPES.len(), any::<bool>())))
            .prop_map(|(batch, component, record)| Op::EndRun { batch, component, record }),
        1 => batch.prop_map(|batch| Op::Prune { batch }),
    ]
}

fn subset<T: Clone + std::fmt::Debug>(items: Vec<T>, weight: f64) -> impl Strategy<Value = Vec<T>> {
    prop::collection::vec(prop::bool::weighted(weight), items.len())
        .prop_map(move |picks| items.iter().zip(picks).filter(|(_, pick)| *pick).map(|(i, _)| i.clone()).collect())
}

fn trigger() -> impl Strategy<Value = Trigger> {
    let types = || EVENT_TYPES.iter().map(|t| EventType::new(*t).unwrap()).collect::<Vec<_>>();
    (
        subset(types(), 0.3),
        subset(types(), 0.3),
        subset(types(), 0.15),
        subset(types(), 0.1),
        prop::option::weighted(0.3, subset(BATCH_TYPES.iter().map(|t| BatchType::new(*t).unwrap()).collect(), 0.5)),
        prop::option::weighted(0.15, subset((0..BATCHES).map(batch_id).collect(), 0.4)),
        prop::option::weighted(0.3, 0..3_000u64),
        prop::option::weighted(0.5, 0..8usize),
    )
        .prop_map(
            |(requires, blocked_by, repeat_on_change, transiently_failed, types, batches, settled_ms, limit)| Trigger {
                requires,
                blocked_by,
                repeat_on_change,
                transiently_failed,
                types: types.unwrap_or_default(),
                batches: batches.unwrap_or_default(),
                settled_for: settled_ms.map(Duration::from_millis),
                limit,
            },
        )
}

fn selection() -> impl Strategy<Value = Selection> {
    let event_type = || (0..EVENT_TYPES.len()).prop_map(|t| EventType::new(EVENT_TYPES[t]).unwrap());
    let leaf = prop_oneof![
        Just(Selection::All),
        trigger().prop_map(|t| Selection::Trigger(Trigger { limit: None, ..t })),
        (0..COMPONENTS.len()).prop_map(|c| Selection::Running(ComponentName::new(COMPONENTS[c]).unwrap())),
        event_type().prop_map(Selection::Present),
        event_type().prop_map(Selection::Succeeded),
        event_type().prop_map(Selection::Failed),
        event_type().prop_map(Selection::TransientlyFailed),
        event_type().prop_map(Selection::Skipped),
        event_type().prop_map(Selection::Acknowledged),
        event_type().prop_map(Selection::Stale),
        (0..BATCH_TYPES.len()).prop_map(|t| Selection::BatchType(BatchType::new(BATCH_TYPES[t]).unwrap())),
        prop_oneof![Just(""), Just("B"), Just("B0"), Just("B1"), Just("B05"), Just("C")]
            .prop_map(|p| Selection::IdPrefix(p.to_owned())),
        (prop::option::of(-2..3i32), prop::option::of(-2..3i32))
            .prop_map(|(min, max)| Selection::Priority { min, max }),
        (0..3_000u64).prop_map(|ms| Selection::QuietFor(Duration::from_millis(ms))),
        state_selection(),
    ];
    leaf.prop_recursive(3, 12, 3, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..3).prop_map(Selection::And),
            prop::collection::vec(inner.clone(), 0..3).prop_map(Selection::Or),
            inner.prop_map(|s| Selection::Not(Box::new(s))),
        ]
    })
}

/// A component's state, for a component of the random histories (`checker` records
/// `Checked`, `verifier` records `Verified`), with a random trigger.
fn state_selection() -> impl Strategy<Value = Selection> {
    (0..COMPONENTS.len(), trigger(), any::<bool>(), 0..6usize, 0..3_000u64).prop_map(
        |(c, trigger, blocked_by_own, state, backoff_ms)| {
            let event_type = EventType::new(EVENT_TYPES[c + 1]).unwrap();
            let mut trigger = Trigger { limit: None, ..trigger };
            if blocked_by_own && !trigger.blocked_by.contains(&event_type) {
                trigger.blocked_by.push(event_type.clone());
            }
            let descriptor =
                ComponentDescriptor::new(ComponentName::new(COMPONENTS[c]).unwrap(), "1", event_type, trigger)
                    .with_limits(3, Duration::from_millis(backoff_ms), 10, Duration::from_secs(60));
            Selection::component_state(&descriptor, ComponentState::ALL[state])
        },
    )
}

/// `op` with the late event types replaced by early ones, for the first part of a history.
fn without_late_types(op: &Op) -> Op {
    let early = |t: usize| t % FIRST_LATE_TYPE;
    match op.clone() {
        Op::Append { batch, event_type, success, transient, skipped, content } => {
            Op::Append { batch, event_type: early(event_type), success, transient, skipped, content }
        }
        Op::Reset { batch, types } => Op::Reset { batch, types: types.into_iter().map(early).collect() },
        Op::EndRun { batch, component, record } => {
            Op::EndRun { batch, component, record: record.map(|(t, success)| (early(t), success)) }
        }
        other => other,
    }
}

type Selections = [(Selection, i64, PageOrder, usize)];

/// Every trigger as a fresh query against `Trigger::select` over the store's batches now,
/// whatever the index has committed of them: corrected by the batches changed since.
async fn check_fresh(
    engine: &IndexEngine,
    store: &SqliteStore,
    triggers: &[(Trigger, i64)],
) -> Result<(), TestCaseError> {
    let batches = store.list_batches(None, 100).await.unwrap();
    let head = store.head().await.unwrap();
    let corrections = engine.corrections(store).await.unwrap().expect("fewer changes than the bound");
    prop_assert_eq!(corrections.as_of(), head);
    prop_assert_eq!(corrections.committed(), engine.committed_cursor().unwrap());
    let changed = batches.iter().filter(|b| b.changed_seq > corrections.committed()).count();
    prop_assert_eq!(corrections.len(), changed, "one correction per batch changed since the commit");
    for (n, (trigger, offset_ms)) in triggers.iter().enumerate() {
        let now = Timestamp(Timestamp::now().millis() + offset_ms);
        let expected = trigger.select(&batches, now);
        // The whole path once per point; the rest from the same corrections.
        let answered = if n == 0 {
            engine.query_fresh(store, trigger, now).await.unwrap().expect("fewer changes than the bound")
        } else {
            engine.query_corrected(&corrections, trigger, now).unwrap()
        };
        prop_assert_eq!(
            &answered.batches,
            &expected,
            "fresh: trigger {:?} at {}, {} corrections",
            trigger,
            now,
            changed
        );
        prop_assert_eq!(answered.as_of, head);
    }
    Ok(())
}

/// Every trigger against `Trigger::select`, every selection's tally and pages against
/// `Selection::matches_at`, over the store's batches now.
async fn check(
    engine: &IndexEngine,
    store: &SqliteStore,
    triggers: &[(Trigger, i64)],
    selections: &Selections,
) -> Result<(), TestCaseError> {
    let batches = store.list_batches(None, 100).await.unwrap();
    for (trigger, offset_ms) in triggers {
        let now = Timestamp(Timestamp::now().millis() + offset_ms);
        let expected = trigger.select(&batches, now);
        let answered = engine.query_at(trigger, now).unwrap();
        prop_assert_eq!(&answered, &expected, "trigger {:?} at {}", trigger, now);
    }
    for (selection, offset_ms, order, page_size) in selections {
        let now = Timestamp(Timestamp::now().millis() + offset_ms);
        let mut expected: Vec<&Batch> = batches.iter().filter(|b| selection.matches_at(b, now)).collect();
        let tally = engine.tally_at(std::slice::from_ref(selection), now, true).unwrap();
        let quietest = expected.iter().map(|b| b.last_activity_at()).min();
        prop_assert_eq!(tally, vec![Tally { count: expected.len() as u64, quietest }], "{:?}", selection);

        match order {
            PageOrder::Oldest => expected.sort_by_key(|b| b.created_seq),
            PageOrder::Priority => expected.sort_by_key(|b| (-b.priority, b.created_seq)),
        }
        let expected: Vec<BatchId> = expected.iter().map(|b| b.id.clone()).collect();
        let mut paged = Vec::new();
        let mut after: Option<PageKey> = None;
        for _ in 0..=BATCHES {
            let request = PageRequest { selection: selection.clone(), order: *order, after, limit: *page_size };
            let page = engine.page_at(&request, now).unwrap();
            paged.extend(page.batches);
            after = page.next;
            if after.is_none() {
                break;
            }
        }
        prop_assert_eq!(&paged, &expected, "{:?} in {:?} pages of {}", selection, order, page_size);
    }
    Ok(())
}

fn batch_id(n: u8) -> BatchId {
    BatchId::new(format!("B{n:02}")).unwrap()
}

async fn apply(store: &SqliteStore, op: &Op) {
    let agent = Agent::new("prop").unwrap();
    let holder = RunHolder { agent: agent.clone(), host: "h".into(), pid: 1, claim_key: None, liveness: None };
    let event = |t: usize, success| {
        let outcome = if success { Outcome::Success } else { Outcome::Failure };
        NewEvent::new(EventType::new(EVENT_TYPES[t]).unwrap(), outcome, agent.clone())
    };
    // Operations on batches not created yet fail with NotFound, which is part of the game.
    let _ = match op {
        Op::Create { batch, batch_type, priority } => {
            let new = NewBatch::new(batch_id(*batch), BatchType::new(BATCH_TYPES[*batch_type]).unwrap())
                .with_priority(*priority);
            store.create_batch(new).await.map(drop)
        }
        Op::Append { batch, event_type, success, transient, skipped, content } => {
            // The flag an operator sets: `skipped` on a success, `acknowledged` on a failure.
            let mut details = json!({"transient": transient, "skipped": skipped, "acknowledged": skipped});
            match content {
                1 => match store.get_batch(&batch_id(*batch)).await {
                    Ok(current) => details[CONTENT_SEQ_KEY] = json!(current.modified_seq.0),
                    Err(_) => return,
                },
                2 => details[CONTENT_SEQ_KEY] = json!(1),
                _ => {}
            }
            let event = event(*event_type, *success).with_details(details);
            store.append_event(&batch_id(*batch), event).await.map(drop)
        }
        Op::Reset { batch, types } => {
            let types = types.iter().map(|t| EventType::new(EVENT_TYPES[*t]).unwrap()).collect();
            store.append_event(&batch_id(*batch), NewEvent::reset(types, agent.clone(), json!({}))).await.map(drop)
        }
        Op::ContentChange { batch } => {
            let mut patch = Map::new();
            patch.insert("delivery".into(), json!(rand_free_counter()));
            store.record_content_change(&batch_id(*batch), patch).await.map(drop)
        }
        Op::Prioritize { batch, priority } => store.set_priority(&batch_id(*batch), *priority).await.map(drop),
        Op::Claim { batch, component } => store
            .claim(&batch_id(*batch), &ComponentName::new(COMPONENTS[*component]).unwrap(), &holder)
            .await
            .map(drop),
        Op::EndRun { batch, component, record } => {
            let component = ComponentName::new(COMPONENTS[*component]).unwrap();
            let Ok(current) = store.get_batch(&batch_id(*batch)).await else { return };
            let Some(run) = current.open_run(&component) else { return };
            match record {
                Some((t, success)) => store
                    .append_event(&batch_id(*batch), event(*t, *success).in_run(component, run.generation))
                    .await
                    .map(drop),
                None => store.release(&batch_id(*batch), &component, run.generation).await,
            }
        }
        Op::Prune { batch } => {
            let Some(read) = store.histories(&[batch_id(*batch)]).await.ok().and_then(|mut read| read.pop()) else {
                return;
            };
            let marker = NewEvent::new(EventType::history_pruned(), Outcome::Success, agent.clone());
            let ticket = PruneTicket { id: batch_id(*batch), changed_seq: read.batch.changed_seq, marker };
            store.prune_histories(vec![ticket]).await.map(drop)
        }
    };
}

fn rand_free_counter() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(96)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), max_shrink_iters: 200, ..ProptestConfig::default() })]

    #[test]
    fn the_index_answers_exactly_what_matches_holds(
        ops in prop::collection::vec(op(), 1..80),
        // One part is caught up to a point in its middle (percent of its ops) before the
        // rest is written; the others are written whole after the previous part's catch-up.
        (cut_part, cut) in (0..3usize, 0..=100usize),
        triggers in prop::collection::vec((trigger(), 0..3_000i64), 24),
        selections in prop::collection::vec(
            (selection(), 0..3_000i64, prop_oneof![Just(PageOrder::Oldest), Just(PageOrder::Priority)], 1..5usize),
            24,
        ),
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            let dir = tempfile::tempdir().unwrap();
            let options = SqliteOptions { synchronous: Synchronous::Normal, ..SqliteOptions::default() };
            let store = SqliteStore::open_with(dir.path().join("store.db"), options).await.unwrap();
            // Tiny pages and commits, so paging and intermediate commits are exercised too.
            let engine_options = EngineOptions {
                page_size: 3,
                commit_every: 4,
                writer_threads: 1,
                writer_memory_bytes: 15 << 20,
                keep_writer: false,
                max_corrections: MAX_CORRECTIONS,
            };
            let engine = IndexEngine::open_with(dir.path().join("index"), engine_options.clone()).unwrap();
            let third = ops.len().div_ceil(3);
            for (part, ops) in ops.chunks(third).enumerate() {
                let cut = if part == cut_part { ops.len() * cut / 100 } else { 0 };
                for (n, op) in ops.iter().enumerate() {
                    // Each commit costs fsyncs: a catch-up at the start of a part is the
                    // previous part's, done already.
                    if n == cut && n > 0 {
                        engine.catch_up(&store).await.unwrap();
                    }
                    let op = if part == 0 { without_late_types(op) } else { op.clone() };
                    apply(&store, &op).await;
                }
                // Behind the store by the ops after the cut (by every op so far in the first
                // part without a cut: the index is empty then).
                check_fresh(&engine, &store, &triggers).await?;
                engine.catch_up(&store).await.unwrap();
                check(&engine, &store, &triggers, &selections).await?;
            }
            // A fresh index learns every type while listing the store, page by page.
            let rebuilt = IndexEngine::open_with(dir.path().join("rebuilt"), engine_options).unwrap();
            rebuilt.rebuild(&store).await.unwrap();
            check(&rebuilt, &store, &triggers, &selections).await?;
            Ok::<(), TestCaseError>(())
        })?;
    }
}
