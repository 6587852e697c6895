//! A pass that queues for its pools: when a round of claims left ready batches waiting for
//! a full pool and its own work then freed slots, the pass claims again (under the poll
//! lock again) rather than leaving them for the next cron run. A pool of one drains the
//! queue the pass found, one batch at a time, in one pass.

use std::sync::Arc;

use super::{BatchResult, PassSummary, Runner, Selection};
use crate::component::Component;
use crate::exit::RunError;

impl<C: Component> Runner<C> {
    /// `locked_pass`, then, while its last round left batches waiting for a pool and worked
    /// some (which freed their slots), another round over what the index finds ready now,
    /// at most `MAX_QUEUED_ROUNDS` of them: a pass of a busy pool ends in the end, and the
    /// next one (cron's, a watcher's) goes on. A round that takes nothing up (another process holds the
    /// slots), a hold, a shutdown, an open circuit or a busy poll lock ends the pass with
    /// what it did; an error in a later round is the pass's error (what the rounds before
    /// recorded stays recorded). A manual run is one round: it names one batch.
    pub(super) async fn pass_queueing_for_pools(
        self: &Arc<Self>,
        selection: &Selection,
    ) -> Result<PassSummary, RunError> {
        let mut summary = self.locked_pass(selection).await?;
        if self.descriptor.pools.is_empty() || matches!(selection, Selection::Batch { .. }) {
            return Ok(summary);
        }
        let mut rounds_left = MAX_QUEUED_ROUNDS;
        let mut last = RoundSeen::of(&summary);
        while rounds_left > 0 && last.worked_and_left_waiting() && !self.round_must_not_follow(&summary) {
            rounds_left -= 1;
            let next = match self.locked_pass(&Selection::Ready).await {
                Ok(next) => next,
                Err(RunError::PollLockBusy(_)) => break,
                Err(e) => return Err(e),
            };
            last = RoundSeen::of(&next);
            // Only the newest round's waits are still waits.
            summary.results.retain(BatchResult::taken_up);
            summary.results.extend(next.results);
            summary.foreign_locks.extend(next.foreign_locks);
            summary.held = next.held;
        }
        Ok(summary)
    }

    /// Whatever the last round left waiting, the pass stops claiming: a hold, a shutdown,
    /// the circuit open, or results the store could not take.
    fn round_must_not_follow(&self, summary: &PassSummary) -> bool {
        summary.held.is_some() || self.shutting_down() || self.breaker.is_open() || summary.store_unreachable()
    }
}

/// The most rounds a pass claims in after its first because a pool was full: each takes
/// one batch up at least, so a pool of one works up to this many more batches in a pass.
const MAX_QUEUED_ROUNDS: usize = 256;

/// What decides whether another round follows one: how many batches it took up and how
/// many it left waiting for a pool.
struct RoundSeen {
    taken_up: usize,
    waiting: usize,
}

impl RoundSeen {
    fn of(round: &PassSummary) -> Self {
        Self { taken_up: round.taken_up(), waiting: round.waiting() }
    }

    fn worked_and_left_waiting(&self) -> bool {
        self.taken_up > 0 && self.waiting > 0
    }
}
