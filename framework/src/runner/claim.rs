//! The claim rounds of a pass: steering (a hold claims nothing), then rounds of lock,
//! re-check, pool slots and one store transaction claiming the ready batches, each claim's
//! earlier attempts read first (past `max_attempts` its give-up is recorded instead of work).
//! This phase drives `candidates` and `lock` and ends a give-up in `record`.

use std::sync::Arc;

use autocomp_model::{Batch, BatchId, ComponentName, Outcome, Report, Seq};
use autocomp_store::{Claim, StoreError};
use autocomp_toolkit::telemetry;
use futures_util::{StreamExt, TryStreamExt};
use tracing::{Instrument, Span, debug, info, warn};

use super::held_reason;
use super::lock::HeldLocks;
use super::pass::{Claimed, Pass, record_outcome};
use super::phases::{self, Phase};
use super::{BatchResult, Runner, Selection};
use crate::component::Component;
use crate::exit::RunError;

impl<C: Component> Runner<C> {
    /// Steps 2-4: steering, candidates, try-lock, re-check against the store, pool slots,
    /// claim. The pipeline's steering is read first (one store read): a held component (its
    /// own hold or the whole pipeline's) asks the index for nothing and claims nothing; a
    /// manual run is answered `NotReady` saying who holds it, unless forced. Then in rounds:
    /// read the steering again (a hold that lands mid-pass stops further claims; the pool
    /// sizes are this read's), lock as many candidates as the queue has room for, re-check
    /// them with one store read, take their pool slots, and claim the ready ones in one store
    /// transaction (one commit, durable before any work); a round that loses some (locked
    /// elsewhere, no longer ready) is followed by another until the queue is full, the
    /// candidates run out or a pool is full (every batch of the component needs the same
    /// pools). Claimed batches go into `pass.claimed` as soon as their claims commit, so the caller
    /// can release them on an error.
    pub(super) async fn claim_batches(
        self: &Arc<Self>,
        selection: &Selection,
        pass: &mut Pass,
    ) -> Result<(), RunError> {
        pass.steering.now = self.pipeline.store.steering().await?;
        phases::mark(Phase::Steering);
        if !pass.force
            && let Some(held) = held_reason(&self.name, &pass.steering.now)
        {
            debug!(component = %self.name, "held, claiming nothing: {held}");
            if let Selection::Batch { id, .. } = selection {
                pass.summary.results.push(BatchResult::NotReady { id: id.clone(), reason: held.clone() });
            }
            pass.summary.held = Some(held);
            return Ok(());
        }
        let candidates = match selection {
            Selection::Ready => self.candidates().await?,
            Selection::Offered(ids) => ids.clone(),
            Selection::Batch { id, .. } => vec![id.clone()],
        };
        phases::mark(Phase::Index);
        let mut candidates = candidates.into_iter();
        let mut first_round = true;
        loop {
            let room = self.claim_limit().saturating_sub(pass.claimed.len()).min(MAX_CLAIMS_PER_ROUND);
            if room == 0 || self.must_stop_claiming(&pass.session) {
                break;
            }
            if !std::mem::take(&mut first_round) && self.held_mid_pass(pass).await? {
                break;
            }
            let mut locked = self.lock_round(&mut candidates, room, pass).await?;
            phases::mark(Phase::BatchLocks);
            if self.must_stop_claiming(&pass.session) {
                locked.release_all().await;
                break;
            }
            if locked.is_empty() {
                break;
            }
            let waiting = pass.summary.waiting();
            self.claim_round(locked, pass).await?;
            if pass.summary.waiting() > waiting {
                // A pool is full: the next round's batches would wait for it too.
                break;
            }
        }
        Ok(())
    }

    /// Reads the steering again before a round: a hold that lands mid-pass stops further
    /// claims (unless forced); the pool sizes are this read's.
    async fn held_mid_pass(&self, pass: &mut Pass) -> Result<bool, RunError> {
        pass.steering.now = self.pipeline.store.steering().await?;
        phases::mark(Phase::Steering);
        if !pass.force
            && let Some(held) = held_reason(&self.name, &pass.steering.now)
        {
            let claimed = pass.claimed.len();
            info!(component = %self.name, claimed, "held mid-pass, claiming nothing more: {held}");
            pass.summary.held = Some(held);
            return Ok(true);
        }
        Ok(false)
    }

    /// One round's claims of the batches it locked: the store re-check (one read), the pool
    /// slots of the ready ones (a batch with none free waits, unclaimed), each remaining
    /// batch's attempt count and checkpoint (read a few at a time, before the claim), then
    /// the claims (one transaction). Batches past `max_attempts` get their give-up recorded
    /// (together, so they share commits) instead of work. Every lock (and slot) not handed to
    /// a claimed batch is released before this returns, whichever way it returns.
    async fn claim_round(&self, mut locked: HeldLocks, pass: &mut Pass) -> Result<(), RunError> {
        let round = self.claim_locked(&mut locked, pass).await;
        locked.release_all().await;
        phases::mark(Phase::Release);
        round
    }

    /// `claim_round` but for the locks: it releases whatever this leaves in `locked`.
    async fn claim_locked(&self, locked: &mut HeldLocks, pass: &mut Pass) -> Result<(), RunError> {
        let ready = self.recheck(locked, pass).await?;
        phases::mark(Phase::Recheck);
        let ready = self.take_slots(locked, ready, pass).await?;
        phases::mark(Phase::BatchLocks);
        if ready.is_empty() {
            return Ok(());
        }
        let breaker_counting = pass.steering.now.breakers.contains_key(&self.name);
        let earlier = self.read_earlier_attempts(&ready, pass.force).await?;
        phases::mark(Phase::Recheck);
        let (answers, spans) = self.claim_in_store(&ready).await?;
        phases::mark(Phase::Claim);
        let mut failure = (answers.len() != ready.len()).then(|| {
            let message = format!("the store answered {} of {} claims", answers.len(), ready.len());
            RunError::Store(StoreError::Unavailable(message))
        });
        let mut fresh = Vec::new();
        for (((batch, earlier), answer), span) in ready.into_iter().zip(earlier).zip(answers).zip(spans) {
            let Some(claim) = self.accepted(answer, &span, pass.manual, &mut failure) else { continue };
            log_claim(&batch.id, &claim, &span);
            let failed_attempts = earlier.after(&batch, &self.name, &claim);
            let (lock, slots) = locked.take(&batch.id).expect("a ready batch is one the round locked");
            let checkpoint = earlier.checkpoint;
            fresh.push((Claimed { batch, claim, lock, slots, checkpoint, breaker_counting, span }, failed_attempts));
        }
        // The batches the store refused to claim: free before any give-up is recorded.
        locked.release_all().await;
        phases::mark(Phase::Release);
        if let Some(error) = failure {
            pass.claimed.extend(fresh.into_iter().map(|(batch, _)| batch));
            return Err(error);
        }
        let force = pass.force;
        let (gave_up, work): (Vec<_>, Vec<_>) =
            fresh.into_iter().partition(|(_, failed_attempts)| *failed_attempts >= self.config.max_attempts && !force);
        pass.claimed.extend(work.into_iter().map(|(batch, _)| batch));
        let recorded = self.give_up(gave_up).await;
        pass.summary.results.extend(recorded);
        Ok(())
    }

    /// The round's one store call claiming `ready` (in its own span), with each batch's
    /// span, which starts at its claim; a failed call ends them as not claimed.
    async fn claim_in_store(&self, ready: &[Batch]) -> Result<(Vec<Result<Claim, StoreError>>, Vec<Span>), RunError> {
        let ids: Vec<BatchId> = ready.iter().map(|batch| batch.id.clone()).collect();
        let spans: Vec<Span> = ids.iter().map(|id| self.batch_span(id)).collect();
        let claim_span = match telemetry::enabled() {
            true => tracing::info_span!(target: telemetry::TARGET, "claim", autocomp.batches = ids.len()),
            false => Span::none(),
        };
        let holder = self.run_holder();
        let claiming = self.pipeline.store.claim_many(&ids, &self.name, &holder);
        let answers = claiming.instrument(claim_span).await.inspect_err(|_| {
            spans.iter().for_each(|span| record_outcome(span, "not_claimed", true));
        })?;
        Ok((answers, spans))
    }

    /// The claim the store answered for one batch; a refusal ends its span and is kept in
    /// `failure` (the first one wins), a batch the store does not have as `missing` says.
    fn accepted(
        &self,
        answer: Result<Claim, StoreError>,
        span: &Span,
        manual: bool,
        failure: &mut Option<RunError>,
    ) -> Option<Claim> {
        match answer {
            Ok(claim) => Some(claim),
            Err(StoreError::NotFound(id)) => {
                record_outcome(span, "missing", true);
                self.missing(id, manual, failure);
                None
            }
            Err(e) => {
                record_outcome(span, "not_claimed", true);
                failure.get_or_insert(e.into());
                None
            }
        }
    }

    /// Records the give-up of each batch past `max_attempts` instead of working on it, all
    /// together (they share the store's commits).
    async fn give_up(&self, gave_up: Vec<(Claimed, u32)>) -> Vec<BatchResult> {
        futures_util::stream::iter(gave_up)
            .map(|(batch, failed_attempts)| {
                let mut report = Report::new(self.config.max_reported_failures);
                report.outcome = Outcome::Failure;
                report.summary = format!(
                    "gave up after {failed_attempts} failed attempts (abandoned or transient); max_attempts is {}",
                    self.config.max_attempts
                );
                let span = batch.span.clone();
                self.record(batch, report, false).instrument(span)
            })
            .buffer_unordered(RECORDS_IN_FLIGHT)
            .collect()
            .await
    }

    /// Each ready batch's failed attempts since its last reset (not read when forced: a
    /// forced run ignores `max_attempts`) and its checkpoint, `STORE_READS_IN_FLIGHT` at a
    /// time, in the order of `ready`. Read before the claim, so nothing is claimed when a
    /// read fails, and nothing is read per batch after it.
    async fn read_earlier_attempts(&self, ready: &[Batch], force: bool) -> Result<Vec<EarlierAttempts>, StoreError> {
        let (store, name) = (&self.pipeline.store, &self.name);
        futures_util::stream::iter(ready)
            .map(|batch| async move {
                let since = batch.last_reset_of(&self.event_type);
                let failed_attempts =
                    async { if force { Ok(0) } else { store.failed_attempts(&batch.id, name, since).await } };
                let (failed_attempts, checkpoint) =
                    tokio::try_join!(failed_attempts, store.load_checkpoint(&batch.id, name))?;
                Ok(EarlierAttempts { since, failed_attempts, checkpoint })
            })
            .buffered(STORE_READS_IN_FLIGHT)
            .try_collect()
            .await
    }
}

/// What a claim needs to know of the attempts before it, read before the claim: the failed
/// attempts the store counted since the batch's last reset, and the checkpoint left.
struct EarlierAttempts {
    since: Seq,
    failed_attempts: u32,
    checkpoint: Option<serde_json::Value>,
}

impl EarlierAttempts {
    /// The failed attempts as the store counts them once the claim has committed: those read
    /// before it, plus the run of ours that was open in `batch` (the re-check's snapshot,
    /// read before the count) since the last reset, which the claim marks abandoned. The
    /// snapshot, not `claim.abandoned`, says so: a claim retried after a lost answer reports
    /// no abandoned run although its first try marked one. Holding the batch lock, no other
    /// worker opens or ends a run of ours meanwhile; one that lost its lock and ends its run
    /// transiently between the snapshot and the count is counted twice (one attempt fewer
    /// before giving up; its result is fenced all the same), and the next pass counts right.
    fn after(&self, batch: &Batch, component: &ComponentName, claim: &Claim) -> u32 {
        let open_since_reset = |run: &autocomp_model::Run| run.claim_seq > self.since;
        let abandoned = batch.open_runs.iter().any(|run| &run.component == component && open_since_reset(run))
            || claim.abandoned.as_ref().is_some_and(open_since_reset);
        self.failed_attempts + u32::from(abandoned)
    }
}

/// At most this many batches are re-checked and claimed in one store call: a huge
/// `queue_size` is claimed in several commits, each well within the stores' page limits.
const MAX_CLAIMS_PER_ROUND: usize = 1_000;

/// A claim round's attempt counts and checkpoint reads in flight at once: enough to keep the
/// store busy without queueing a thread per claimed batch on its connection.
const STORE_READS_IN_FLIGHT: usize = 8;

/// Give-up results recorded at once: they queue together for the store's group commit.
const RECORDS_IN_FLIGHT: usize = 64;

/// What a claim says on the batch's span and in the log: its generation, and a takeover of
/// a run whose holder died or stalled.
fn log_claim(id: &BatchId, claim: &Claim, span: &Span) {
    span.record("autocomp.generation", claim.generation());
    if telemetry::enabled() {
        let took_over = claim.abandoned.is_some();
        info!(target: telemetry::TARGET, parent: span, generation = claim.generation(), took_over, "claimed");
    }
    if let Some(abandoned) = &claim.abandoned {
        warn!(batch = %id, generation = abandoned.generation, holder = %abandoned.holder.agent,
            "took over a run whose holder died or stalled; it is marked abandoned");
    }
}
