//! A pass that queues for its pools: when a round of claims left ready batches waiting for
//! a full pool and its own work then freed slots, the pass claims again (under the poll
//! lock again) rather than leaving them for the next cron run. A pool of one drains the
//! queue the pass found, one batch at a time, in one pass.

use std::sync::Arc;

use tracing::warn;

use super::{BatchResult, PassSummary, Runner, Selection};
use crate::component::Component;
use crate::exit::RunError;

impl<C: Component> Runner<C> {
    /// `locked_pass`, then, while its last round left batches waiting for a pool and worked
    /// some (which freed their slots), another round over what the index finds ready now,
    /// at most `MAX_QUEUED_ROUNDS` of them: a pass of a busy pool ends in the end, and the
    /// next one (cron's, a watcher's) goes on. These end the pass with what it did: a round
    /// that takes nothing up (another process holds the slots), a hold, a shutdown, an open
    /// circuit, a timeout (its hung work may still use the resource whose slot it gave back;
    /// the process exits after this pass), a result not recorded (the lock session lost), a
    /// busy poll lock (a watcher's later round does not wait for it), and an error in a later round, logged (the rounds before recorded their
    /// results and the registry hears of them; the next pass meets the error again). A manual
    /// run is one round: it names one batch.
    pub(super) async fn pass_queueing_for_pools(
        self: &Arc<Self>,
        selection: &Selection,
    ) -> Result<PassSummary, RunError> {
        let mut summary = self.locked_pass(selection).await?;
        summary.rounds = 1;
        if self.descriptor.pools.is_empty() || matches!(selection, Selection::Batch { .. }) {
            return Ok(summary);
        }
        let mut last = RoundSeen::of(&summary);
        while summary.rounds <= MAX_QUEUED_ROUNDS && last.worked_and_left_waiting() && !self.must_stop(&summary) {
            let next = match self.locked_pass(&Selection::Ready).await {
                Ok(next) => next,
                Err(RunError::PollLockBusy(_)) => break,
                Err(e) => {
                    let rounds = summary.rounds;
                    warn!(component = %self.name, "a pass queueing for its pool stops after {rounds} round(s): {e}");
                    break;
                }
            };
            last = RoundSeen::of(&next);
            // Only the newest round's waits are still waits.
            summary.results.retain(BatchResult::taken_up);
            summary.results.extend(next.results);
            summary.foreign_locks.extend(next.foreign_locks);
            // A foreign node met in several rounds is one alarm.
            summary.foreign_locks.sort();
            summary.foreign_locks.dedup();
            summary.held = next.held;
            summary.rounds += 1;
        }
        Ok(summary)
    }

    /// Whatever the last round left waiting, the pass stops claiming: a hold, a shutdown,
    /// the circuit open, results the store could not take, a timeout, a result not recorded.
    fn must_stop(&self, summary: &PassSummary) -> bool {
        let not_recorded = summary.results.iter().any(|r| matches!(r, BatchResult::NotRecorded { .. }));
        summary.held.is_some()
            || self.shutting_down()
            || self.breaker.is_open()
            || summary.store_unreachable()
            || summary.timed_out()
            || not_recorded
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
