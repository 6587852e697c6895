//! The watcher's feed-side answers are the index's: random histories written through the
//! real store (SQLite) and answered through the real embedded index, the watcher looking
//! after every few writes; each answer it gives from what it holds (or from a full answer
//! it just asked) equals `Trigger::select` over the store's batches at the same store time,
//! the trigger's answer then the retry trigger's without repeats, limits and order included.
//! Small depths make its answers reach only part of the batches, so the refreshes are
//! exercised too. `PROPTEST_CASES` raises the number of histories (default 64).

use std::sync::Arc;
use std::time::Duration;

use autocomp_model::{
    Agent, BatchId, BatchType, ComponentDescriptor, ComponentName, EventType, NewBatch, NewEvent, Outcome, RunHolder,
    Seq, Timestamp, Trigger,
};
use autocomp_sboi::{BatchIndex, open_index};
use autocomp_store::prelude::*;
use autocomp_store::{ObjectStore, SqliteOptions, SqliteStore, Synchronous};
use proptest::prelude::*;
use serde_json::{Map, json};

use super::{FeedOffers, Offer, Ports};

const BATCHES: u8 = 12;
const EVENT_TYPES: [&str; 3] = ["Received", "Checked", "Verified"];
/// The component under watch records `Checked` (its retry trigger retries that).
const OWN: usize = 1;
const COMPONENT: &str = "checker";

#[derive(Debug, Clone)]
enum Op {
    Create {
        batch: u8,
        priority: i32,
    },
    Append {
        batch: u8,
        event_type: usize,
        success: bool,
        transient: bool,
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
    },
    /// Ends the open run: records the component's result in it, or releases it.
    EndRun {
        batch: u8,
        record: Option<(bool, bool)>,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let batch = 0..BATCHES;
    prop_oneof![
        4 => (batch.clone(), -2..3i32).prop_map(|(batch, priority)| Op::Create { batch, priority }),
        6 => (batch.clone(), 0..EVENT_TYPES.len(), prop::bool::weighted(0.7), any::<bool>())
            .prop_map(|(batch, event_type, success, transient)| Op::Append { batch, event_type, success, transient }),
        // The component's own result (its pass's, without the claim): what takes a batch
        // out of its trigger's answer, or into its retry trigger's.
        4 => (batch.clone(), any::<bool>(), any::<bool>())
            .prop_map(|(batch, success, transient)| Op::Append { batch, event_type: OWN, success, transient }),
        1 => batch.clone().prop_map(|batch| Op::ContentChange { batch }),
        2 => (batch.clone(), -3..4i32).prop_map(|(batch, priority)| Op::Prioritize { batch, priority }),
        2 => batch.clone().prop_map(|batch| Op::Claim { batch }),
        2 => (batch, prop::option::of((any::<bool>(), any::<bool>())))
            .prop_map(|(batch, record)| Op::EndRun { batch, record }),
    ]
}

/// A component's effective trigger (blocked by its own type, usually, so it has a retry
/// trigger) and retry backoff, as `Runner::candidate_triggers` limits them by `cap`.
fn triggers() -> impl Strategy<Value = Vec<Trigger>> {
    let types = || EVENT_TYPES.iter().map(|t| EventType::new(*t).unwrap()).collect::<Vec<_>>();
    let subset = |weight: f64| {
        prop::collection::vec(prop::bool::weighted(weight), EVENT_TYPES.len()).prop_map(move |picks| {
            types().into_iter().zip(picks).filter(|(_, pick)| *pick).map(|(t, _)| t).collect::<Vec<_>>()
        })
    };
    (
        subset(0.3),
        prop::bool::weighted(0.8),
        prop::option::weighted(0.3, 0..2_000u64),
        prop::option::weighted(0.5, 0..6usize),
        0..2_000u64,
        1..8usize,
    )
        .prop_map(|(requires, blocked_by_own, settled_ms, limit, backoff_ms, cap)| {
            let own = EventType::new(EVENT_TYPES[OWN]).unwrap();
            let trigger = Trigger {
                requires: requires.into_iter().filter(|t| *t != own).collect(),
                blocked_by: if blocked_by_own { vec![own.clone()] } else { Vec::new() },
                settled_for: settled_ms.map(Duration::from_millis),
                limit,
                ..Trigger::default()
            };
            let descriptor = ComponentDescriptor::new(ComponentName::new(COMPONENT).unwrap(), "1", own, trigger)
                .with_limits(3, Duration::from_millis(backoff_ms), 10, Duration::from_secs(60));
            let limited = |t: &Trigger| Trigger { limit: Some(t.limit.map_or(cap, |l| l.min(cap))), ..t.clone() };
            std::iter::once(&descriptor.trigger).chain(&descriptor.retry_trigger()).map(limited).collect()
        })
}

fn batch_id(n: u8) -> BatchId {
    BatchId::new(format!("B{n:02}")).unwrap()
}

async fn apply(store: &SqliteStore, op: &Op) {
    let agent = Agent::new("prop").unwrap();
    let component = ComponentName::new(COMPONENT).unwrap();
    let event = |t: usize, success: bool, transient: bool| {
        let outcome = if success { Outcome::Success } else { Outcome::Failure };
        NewEvent::new(EventType::new(EVENT_TYPES[t]).unwrap(), outcome, agent.clone())
            .with_details(json!({"transient": transient}))
    };
    // Operations on batches not created yet fail with NotFound, which is part of the game.
    let _ = match op {
        Op::Create { batch, priority } => {
            let new = NewBatch::new(batch_id(*batch), BatchType::new("Item").unwrap()).with_priority(*priority);
            store.create_batch(new).await.map(drop)
        }
        Op::Append { batch, event_type, success, transient } => {
            store.append_event(&batch_id(*batch), event(*event_type, *success, *transient)).await.map(drop)
        }
        Op::ContentChange { batch } => {
            let mut patch = Map::new();
            patch.insert("delivery".into(), json!(store.head().await.unwrap().0));
            store.record_content_change(&batch_id(*batch), patch).await.map(drop)
        }
        Op::Prioritize { batch, priority } => store.set_priority(&batch_id(*batch), *priority).await.map(drop),
        Op::Claim { batch } => {
            let holder = RunHolder { agent: agent.clone(), host: "h".into(), pid: 1, claim_key: None, liveness: None };
            store.claim(&batch_id(*batch), &component, &holder).await.map(drop)
        }
        Op::EndRun { batch, record } => {
            let Ok(current) = store.get_batch(&batch_id(*batch)).await else { return };
            let Some(run) = current.open_run(&component) else { return };
            match record {
                Some((success, transient)) => {
                    let result = event(OWN, *success, *transient).in_run(component.clone(), run.generation);
                    store.append_event(&batch_id(*batch), result).await.map(drop)
                }
                None => store.release(&batch_id(*batch), &component, run.generation).await,
            }
        }
    };
}

/// What `Runner::candidates` answers with an exact index at `now`: each trigger's
/// `select` over the store's batches in turn, without repeats.
async fn expected(store: &SqliteStore, triggers: &[Trigger], now: Timestamp) -> Vec<BatchId> {
    let batches = store.list_batches(None, 100).await.unwrap();
    let mut ids = Vec::new();
    for trigger in triggers {
        for id in trigger.select(&batches, now) {
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
    }
    ids
}

struct Pipeline {
    _dir: tempfile::TempDir,
    store: Arc<SqliteStore>,
    index: Arc<dyn BatchIndex>,
}

async fn pipeline() -> Pipeline {
    let dir = tempfile::tempdir().unwrap();
    let options = SqliteOptions { synchronous: Synchronous::Normal, ..SqliteOptions::default() };
    let store = Arc::new(SqliteStore::open_with(dir.path().join("store.db"), options).await.unwrap());
    let index = open_index(&format!("local:{}", dir.path().join("index").display()), store.clone()).unwrap();
    Pipeline { _dir: dir, store, index }
}

impl Pipeline {
    async fn look(&self, offers: &mut FeedOffers, triggers: &[Trigger], now: Timestamp) -> Offer {
        let ports = Ports { store: self.store.as_ref() as &dyn ObjectStore, index: self.index.as_ref() };
        let seen: Seq = self.store.head().await.unwrap();
        offers.offer(&ports, triggers, Some(seen), now).await.unwrap()
    }
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(64)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), max_shrink_iters: 200, ..ProptestConfig::default() })]

    #[test]
    fn a_watchers_feed_side_answer_is_what_select_answers_at_the_feeds_head(
        steps in prop::collection::vec((prop::collection::vec(op(), 1..6), 0..3_000i64, prop::bool::weighted(0.1)), 1..25),
        triggers in triggers(),
        (depth_factor, min_depth) in (1..3usize, 1..5usize),
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            let pipeline = pipeline().await;
            let mut offers = FeedOffers::new(depth_factor, min_depth);
            for (ops, offset_ms, heartbeat) in &steps {
                for op in ops {
                    apply(&pipeline.store, op).await;
                }
                if *heartbeat {
                    offers.forget();
                }
                // Later store times bring readiness that only time brings (`settled_for`).
                let now = Timestamp(Timestamp::now().millis() + offset_ms);
                let offer = pipeline.look(&mut offers, &triggers, now).await;
                prop_assert!(offer.covered);
                prop_assert_eq!(offer.from_feed + offer.refreshed + offer.direct, triggers.len());
                // An answer the index gave directly was judged at the index's own clock.
                if offer.direct == 0 {
                    let expected = expected(&pipeline.store, &triggers, now).await;
                    prop_assert_eq!(&offer.ids, &expected, "{:?} after {:?}", offer, ops);
                }
            }
            Ok::<(), TestCaseError>(())
        })?;
    }
}

/// A trickle through a watcher: after its first look, each look reads the feed and asks
/// the index nothing, while its answers stay `select`'s.
#[tokio::test]
async fn a_trickle_asks_the_index_only_on_the_first_look() {
    let pipeline = pipeline().await;
    let own = EventType::new(EVENT_TYPES[OWN]).unwrap();
    let trigger = Trigger::builder().requires("Received").blocked_by("Checked").build();
    let descriptor = ComponentDescriptor::new(ComponentName::new(COMPONENT).unwrap(), "1", own, trigger);
    let limited = |t: &Trigger| Trigger { limit: Some(16), ..t.clone() };
    let triggers: Vec<Trigger> =
        std::iter::once(&descriptor.trigger).chain(&descriptor.retry_trigger()).map(limited).collect();
    let mut offers = FeedOffers::new(super::DEPTH_FACTOR, super::MIN_DEPTH);
    let first = pipeline.look(&mut offers, &triggers, Timestamp::now()).await;
    assert_eq!((first.asked, first.ids.len()), (2, 0), "{first:?}");
    for n in 0..BATCHES {
        apply(&pipeline.store, &Op::Create { batch: n, priority: 0 }).await;
        let received = Op::Append { batch: n, event_type: 0, success: true, transient: false };
        apply(&pipeline.store, &received).await;
        let offer = pipeline.look(&mut offers, &triggers, Timestamp::now()).await;
        assert_eq!(offer.asked, 0, "{offer:?}");
        assert_eq!(offer.ids, expected(&pipeline.store, &triggers, Timestamp::now()).await);
        assert_eq!(offer.ids, [batch_id(n)], "each new batch offered, then worked");
        apply(&pipeline.store, &Op::Claim { batch: n }).await;
        apply(&pipeline.store, &Op::EndRun { batch: n, record: Some((true, false)) }).await;
        let after = pipeline.look(&mut offers, &triggers, Timestamp::now()).await;
        assert_eq!((after.asked, after.ids.len()), (0, 0), "{after:?}");
    }
}

/// An index service past the changes it corrects: it answers as it is, saying so.
struct Lagging(Arc<dyn BatchIndex>);

#[async_trait::async_trait]
impl BatchIndex for Lagging {
    async fn query(&self, trigger: &Trigger) -> autocomp_sboi::IndexResult<Vec<BatchId>> {
        self.0.query(trigger).await
    }

    async fn query_checked(&self, trigger: &Trigger) -> autocomp_sboi::IndexResult<(Vec<BatchId>, bool)> {
        Ok((self.0.query(trigger).await?, false))
    }

    async fn catch_up(&self) -> autocomp_sboi::IndexResult<autocomp_sboi::CatchUp> {
        self.0.catch_up().await
    }

    async fn covers(&self, seq: Seq, bound: Duration) -> autocomp_sboi::IndexResult<bool> {
        self.0.covers(seq, bound).await
    }

    async fn rebuild(&self) -> autocomp_sboi::IndexResult<usize> {
        self.0.rebuild().await
    }

    async fn document(&self, id: &BatchId) -> autocomp_sboi::IndexResult<Option<autocomp_sboi::IndexedBatch>> {
        self.0.document(id).await
    }

    async fn tally(
        &self,
        selections: &[autocomp_model::Selection],
        quietest: bool,
    ) -> autocomp_sboi::IndexResult<Vec<autocomp_sboi::Tally>> {
        self.0.tally(selections, quietest).await
    }

    async fn page(&self, request: &autocomp_sboi::PageRequest) -> autocomp_sboi::IndexResult<autocomp_sboi::Page> {
        self.0.page(request).await
    }
}

/// A full answer from behind the store's head is not held: every look asks again, and
/// what it offers is the index's own answer.
#[tokio::test]
async fn an_answer_from_a_lagging_index_is_never_held() {
    let mut pipeline = pipeline().await;
    pipeline.index = Arc::new(Lagging(Arc::clone(&pipeline.index)));
    let trigger = Trigger { requires: vec![EventType::new("Received").unwrap()], limit: Some(4), ..Trigger::default() };
    let mut offers = FeedOffers::new(super::DEPTH_FACTOR, super::MIN_DEPTH);
    for n in 0..3 {
        apply(&pipeline.store, &Op::Create { batch: n, priority: 0 }).await;
        let received = Op::Append { batch: n, event_type: 0, success: true, transient: false };
        apply(&pipeline.store, &received).await;
        let offer = pipeline.look(&mut offers, std::slice::from_ref(&trigger), Timestamp::now()).await;
        assert_eq!((offer.asked, offer.from_feed, offer.direct), (2, 0, 1), "{offer:?}");
        assert_eq!(offer.ids, expected(&pipeline.store, std::slice::from_ref(&trigger), Timestamp::now()).await);
    }
}
