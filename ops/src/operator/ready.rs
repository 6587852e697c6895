//! `autocomp ready`: what a pass of a component would claim now, in claim order: the index's
//! candidates re-checked in the store (summaries, never logs) and against the batch locks,
//! as a pass would. The view (its rows serialize as they are), its text and the command.

use std::collections::BTreeMap;

use autocomp_framework::PoolRoom;
use autocomp_framework::locks::HeldLock;
use autocomp_model::{BatchId, BatchSummary, ComponentName, SummaryAt, Timestamp};
use autocomp_store::ObjectStore;
use serde::Serialize;

use super::columns::table;
use super::locks::describe_lock;
use super::views::{Format, PAGE, json_document};
use super::{Operator, OperatorError, Step};

/// One candidate of `autocomp ready`; as `ready --format json` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CandidateView {
    pub id: BatchId,
    pub priority: i32,
    pub would_claim: bool,
    /// Why (not): `would claim`, `locked by ...`, `not ready in the store: ...`.
    pub verdict: String,
}

/// `autocomp ready`: what a pass of the component would claim now, in claim order.
#[derive(Debug, Clone)]
pub struct ReadyView {
    pub component: ComponentName,
    pub queue_size: usize,
    pub candidates: Vec<CandidateView>,
    /// Why no pass of the component starts now (a broken contract): it claims nothing.
    pub refused: Option<String>,
}

impl ReadyView {
    pub fn render(&self, format: Format) -> String {
        match format {
            Format::Json => json_document(&self.candidates),
            Format::Text if self.candidates.is_empty() && self.refused.is_none() => {
                format!("nothing is ready for {}\n", self.component)
            }
            Format::Text => {
                let claimed = self.candidates.iter().filter(|c| c.would_claim).count();
                let mut out = match &self.refused {
                    Some(refused) => {
                        format!("{} would claim nothing: every pass stops before any work, {refused}\n", self.component)
                    }
                    None => format!(
                        "{} would claim {claimed} batch(es) now (queue_size {}), in this order:\n",
                        self.component, self.queue_size
                    ),
                };
                if self.candidates.is_empty() {
                    return out;
                }
                let rows: Vec<Vec<String>> = self
                    .candidates
                    .iter()
                    .map(|c| vec![format!("  {}", c.id), c.priority.to_string(), c.verdict.clone()])
                    .collect();
                out.push_str(&table(&["  batch", "priority", "verdict"], &rows));
                out
            }
        }
    }

    /// The index's candidates (the trigger's, then its transient-failure retries), each
    /// re-checked in the store (its summary) and against the batch locks, as a pass would;
    /// the first `queue_size` that pass are what it would claim. Touches nothing and reads
    /// no log.
    pub async fn read(operator: &Operator, component: &ComponentName) -> Result<ReadyView, OperatorError> {
        let store = operator.store().await?;
        let pipeline = operator.pipeline(store.as_ref()).await?;
        let step = operator.step_named(&pipeline, component)?;
        let index = operator.index(&store)?;
        let mut ids = index.query(step.trigger()).await?;
        if let Some(retry) = step.retry_trigger() {
            for id in index.query(&retry).await? {
                if !ids.contains(&id) {
                    ids.push(id);
                }
            }
        }
        let held = operator.held_locks().await?;
        // Summaries, never logs: every candidate the index lists may be re-checked.
        let mut batches: BTreeMap<BatchId, BatchSummary> = BTreeMap::new();
        for chunk in ids.chunks(PAGE) {
            batches.extend(store.get_summaries(chunk).await?.into_iter().map(|b| (b.id.clone(), b)));
        }
        let pools = &step.descriptor().pools;
        // The steering only for a component with pools: its sizes.
        let pool_room = match pools.is_empty() {
            true => None,
            false => PoolRoom::of(pools, &store.steering().await?, &held),
        };
        let refused = step.broken_contract(&pipeline);
        let pass = Pass { store: store.as_ref(), step, held: &held, now: Timestamp::now(), claimed: 0, pool_room };
        let mut candidates = pass.candidates(ids, &batches).await?;
        if refused.is_some() {
            for candidate in candidates.iter_mut().filter(|c| c.would_claim) {
                candidate.would_claim = false;
                candidate.verdict = "refused: the pass stops before any work (contract broken)".into();
            }
        }
        let queue_size = step.descriptor().queue_size;
        Ok(ReadyView { component: step.name().clone(), queue_size, candidates, refused })
    }
}

/// A pass as `ready` plays it: what it has claimed so far, and what it checks against.
struct Pass<'a> {
    store: &'a dyn ObjectStore,
    step: &'a Step,
    held: &'a [HeldLock],
    now: Timestamp,
    claimed: usize,
    /// For a component with pools, the one with the fewest free slots now.
    pool_room: Option<PoolRoom>,
}

impl Pass<'_> {
    /// Each candidate in claim order with its verdict.
    async fn candidates(
        mut self,
        ids: Vec<BatchId>,
        batches: &BTreeMap<BatchId, BatchSummary>,
    ) -> Result<Vec<CandidateView>, OperatorError> {
        let mut candidates = Vec::with_capacity(ids.len());
        for id in ids {
            let Some(summary) = batches.get(&id) else {
                let verdict = "skip: the index lists it, the store does not have it (`autocomp reindex`)".into();
                candidates.push(CandidateView { id, priority: 0, would_claim: false, verdict });
                continue;
            };
            let (would_claim, verdict) = self.verdict(&id, summary).await?;
            candidates.push(CandidateView { id, priority: summary.priority, would_claim, verdict });
        }
        Ok(candidates)
    }

    /// Whether the pass would claim the batch, and why (not).
    async fn verdict(&mut self, id: &BatchId, summary: &BatchSummary) -> Result<(bool, String), OperatorError> {
        let step = self.step;
        let path = format!("batch/{}/{}", step.name(), id);
        let facts = SummaryAt { summary, at: self.now };
        Ok(match (step.ready_in_store(&facts), self.held.iter().find(|l| l.path == path)) {
            (Err(refusal), _) => (false, format!("skip: {refusal} (the index lags)")),
            (Ok(()), Some(lock)) => (false, format!("skip: locked, {}", describe_lock(Some(lock), Timestamp::now()))),
            (Ok(()), None) if self.claimed >= step.descriptor().queue_size => {
                (false, "left for the next pass (queue full)".into())
            }
            (Ok(()), None) => {
                self.claimed += 1;
                // Attempts count from the newest Reset of its type: the head knows it.
                let since = self.store.batch_head(id).await?.last_reset_of(step.event_type());
                let attempts = self.store.failed_attempts(id, step.name(), since).await?;
                let max_attempts = step.descriptor().max_attempts;
                // A batch that waits for a pool is not one the pass claims now.
                match &self.pool_room {
                    _ if attempts >= max_attempts => (
                        true,
                        format!("would claim and give up: {attempts} failed attempts, max_attempts {max_attempts}"),
                    ),
                    Some(room) if self.claimed > room.free() as usize => (false, room.wait()),
                    _ => (true, "would claim".into()),
                }
            }
        })
    }
}

impl Operator {
    /// `autocomp ready`: see `ReadyView::read`.
    pub async fn ready(&self, component: &ComponentName) -> Result<ReadyView, OperatorError> {
        ReadyView::read(self, component).await
    }
}
