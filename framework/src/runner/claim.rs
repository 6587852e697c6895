//! The claim rounds of a pass: steering (a hold claims nothing), then rounds of lock, pool
//! slots and one store transaction re-checking and claiming the ready batches, which answers
//! each claim's earlier attempts and checkpoint (past `max_attempts` its give-up is recorded
//! instead of work) and the steering when it moved. This phase drives `candidates` and `lock`
//! and ends a give-up in `record`.

use std::collections::HashSet;
use std::sync::Arc;

use autocomp_model::{Batch, BatchId, ComponentName, Outcome, Report, Seq, Steering};
use autocomp_store::{Claim, ReadyAnswer, ReadyClaimRequest, ReadyClaims, StoreError, Takeover};
use autocomp_toolkit::telemetry;
use futures_util::StreamExt;
use tracing::{Instrument, Span, debug, info, warn};

use super::held_reason;
use super::lock::{HeldLocks, skip_busy};
use super::pass::{Claimed, Pass, record_outcome};
use super::phases::{self, Phase};
use super::{BatchResult, Runner, Selection};
use crate::component::Component;
use crate::exit::RunError;

impl<C: Component> Runner<C> {
    /// Steps 2-4: steering, candidates, try-lock, pool slots, re-check and claim. The
    /// pipeline's steering comes first (kept from the pass before, read from the store when
    /// there is none or it holds the component): a held component (its own hold or the whole
    /// pipeline's) asks the index for nothing and claims nothing; a manual run is answered
    /// `NotReady` saying who holds it, unless forced. Then in rounds: lock as many candidates
    /// as the queue has room for, take their pool slots (a component with pools re-checks
    /// them first, so no slot goes to a batch that is not ready), and re-check and claim them
    /// in one store transaction (`claim_ready`: one commit, before any work), which claims
    /// nothing while the component or the pipeline is held (a hold that lands mid-pass stops
    /// further claims) and answers the steering when its version moved (the pool sizes of the
    /// next round are that one's); a round that loses some (locked elsewhere, no longer
    /// ready) is followed by another until the queue is full, the candidates run out or a
    /// pool is full (every batch of the component needs the same pools). Claimed batches go
    /// into `pass.claimed` as soon as their claims commit, so the caller can release them on
    /// an error.
    pub(super) async fn claim_batches(
        self: &Arc<Self>,
        selection: &Selection,
        pass: &mut Pass,
    ) -> Result<(), RunError> {
        pass.steering.now = self.steering_at_start(pass.force).await?;
        if !pass.force
            && let Some(held) = held_reason(&self.name, &pass.steering.now)
        {
            debug!(component = %self.name, "held, claiming nothing: {held}");
            if let Selection::Batch { id, .. } = selection {
                pass.summary.results.push(BatchResult::NotReady {
                    id: id.clone(),
                    reason: held.clone(),
                    forcible: true,
                });
            }
            pass.summary.held = Some(held);
            return Ok(());
        }
        // The takers this pass's results may hand batches on to, read beside the claims.
        self.refresh_takers();
        let candidates = match selection {
            // A handed pass claims nothing (`handed_pass`); here it would look as `Ready`.
            Selection::Ready | Selection::Handed => self.candidates().await?,
            Selection::Offered(ids, _) => ids.clone(),
            Selection::Batch { id, .. } => vec![id.clone()],
        };
        phases::mark(Phase::Index);
        let mut candidates = candidates.into_iter();
        loop {
            let room = self.claim_limit().saturating_sub(pass.claimed.len()).min(MAX_CLAIMS_PER_ROUND);
            if room == 0 || self.must_stop_claiming(&pass.session) {
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
            if pass.summary.held.is_some() {
                // The claim found the component or the pipeline held: nothing more this pass.
                break;
            }
            if pass.summary.waiting() > waiting {
                // A pool is full: the next round's batches would wait for it too.
                break;
            }
        }
        Ok(())
    }

    /// The steering a pass starts with: the one kept from the pass before, unless there is
    /// none or it holds the component (then the store's, which may have lifted the hold, is
    /// read and kept). A hold that landed since is not missed: the first claim refuses.
    async fn steering_at_start(&self, force: bool) -> Result<Steering, RunError> {
        if let Some(kept) = self.steering.get().filter(|kept| force || held_reason(&self.name, kept).is_none()) {
            return Ok(kept);
        }
        let steering = self.pipeline.store.steering().await?;
        phases::mark(Phase::Steering);
        self.steering.keep(&steering);
        Ok(steering)
    }

    /// The claim claimed nothing: the component or the pipeline is held (unless forced, a
    /// hold that landed since the steering this pass went by). No more claims this pass; a
    /// manual run is answered `NotReady` saying who holds it.
    async fn held_at_claim(&self, ids: &[BatchId], pass: &mut Pass) -> Result<(), RunError> {
        let held = match held_reason(&self.name, &pass.steering.now) {
            Some(held) => held,
            None => {
                // The claim's steering was the one this pass knew, yet it held: read it.
                pass.steering.now = self.pipeline.store.steering().await?;
                phases::mark(Phase::Steering);
                self.steering.keep(&pass.steering.now);
                held_reason(&self.name, &pass.steering.now)
                    .unwrap_or_else(|| format!("{} was held when it claimed (resumed since)", self.name))
            }
        };
        info!(component = %self.name, claimed = pass.claimed.len(), "held mid-pass, claiming nothing more: {held}");
        if pass.manual {
            let refused =
                ids.iter().map(|id| BatchResult::NotReady { id: id.clone(), reason: held.clone(), forcible: true });
            pass.summary.results.extend(refused);
        }
        pass.summary.held = Some(held);
        Ok(())
    }

    /// One round's claims of the batches it locked: the pool slots (a batch with none free
    /// waits, unclaimed), then one store transaction re-checking and claiming them, which
    /// answers each claimed batch's attempt count and checkpoint as they were before its
    /// claim. Batches past `max_attempts` get their give-up recorded
    /// (together, so they share commits) instead of work. Every lock (and slot) not handed to
    /// a claimed batch is released before this returns, whichever way it returns.
    /// Where claims are the locks, a batch whose run's holder the claim found dead is claimed
    /// again in the same round, naming that run in a takeover (its lock and slots kept).
    async fn claim_round(&self, mut locked: HeldLocks, pass: &mut Pass) -> Result<(), RunError> {
        let mut round = self.claim_locked(&mut locked, pass, &[]).await;
        if let Ok(takeovers) = &round
            && !takeovers.is_empty()
        {
            let takeovers = takeovers.clone();
            round = self.claim_locked(&mut locked, pass, &takeovers).await;
        }
        locked.release_all().await;
        phases::mark(Phase::Release);
        round.map(drop)
    }

    /// `claim_round` but for the locks: it releases whatever this leaves in `locked`. With
    /// `takeovers`, claims only their batches (whose slots the round holds already). Answers
    /// the takeovers it found to make (their locks and slots left in `locked`).
    async fn claim_locked(
        &self,
        locked: &mut HeldLocks,
        pass: &mut Pass,
        takeovers: &[Takeover],
    ) -> Result<Vec<Takeover>, RunError> {
        let ids = match takeovers.is_empty() {
            true => self.slotted(locked, pass).await?,
            false => takeovers.iter().map(|takeover| takeover.batch.clone()).collect(),
        };
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let claims = self.claim_in_store(&ids, takeovers, pass).await?;
        phases::mark(Phase::Claim);
        if let Some(steering) = claims.steering {
            self.steering.keep(&steering);
            pass.steering.now = steering;
        }
        if claims.held {
            return self.held_at_claim(&ids, pass).await.map(|()| Vec::new());
        }
        let breaker_counting = pass.steering.now.breakers.contains_key(&self.name);
        let mut failure = (claims.answers.len() != ids.len()).then(|| {
            let message = format!("the store answered {} of {} claims", claims.answers.len(), ids.len());
            RunError::Store(StoreError::Unavailable(message))
        });
        let mut fresh = Vec::new();
        let mut found_dead = Vec::new();
        for (id, answer) in ids.into_iter().zip(claims.answers) {
            let Some(ready) = self.accepted(id, answer, pass.manual, &mut failure) else { continue };
            let ReadyAnswer { batch, claim, failed_attempts, checkpoint, held } = ready;
            let Some(claim) = claim else {
                match held {
                    // Found dead on a first try: claimed again with the takeover.
                    Some(run) if takeovers.is_empty() && failure.is_none() => {
                        match self.takeover_of(&batch.id, &run).await {
                            Ok(Some(takeover)) => found_dead.push(takeover),
                            Ok(None) => skip_busy(batch.id, pass),
                            // One holder that cannot be judged keeps its batch, not the pass.
                            Err(e) => {
                                warn!(batch = %batch.id, holder = %run.holder.agent, "cannot judge its holder: {e}");
                                skip_busy(batch.id, pass);
                            }
                        }
                    }
                    Some(_) => skip_busy(batch.id, pass),
                    None => self.no_longer_ready(&batch, pass),
                }
                continue;
            };
            let span = self.batch_span(&batch.id);
            log_claim(&batch.id, &claim, &span);
            // A forced run ignores `max_attempts`.
            let failed_attempts = if pass.force { 0 } else { failed_attempts };
            let earlier = EarlierAttempts { since: batch.last_reset_of(&self.event_type), failed_attempts };
            let failed_attempts = earlier.after(&batch, &self.name, &claim);
            let (lock, slots) = locked.take(&batch.id).expect("a claimed batch is one the round locked");
            fresh.push((Claimed { batch, claim, lock, slots, checkpoint, breaker_counting, span }, failed_attempts));
        }
        // The batches the store refused to claim: free before any give-up is recorded.
        let again: HashSet<&BatchId> = found_dead.iter().map(|takeover| &takeover.batch).collect();
        locked.release_where(|id| !again.contains(id)).await;
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
        Ok(found_dead)
    }

    /// The locked batches to claim, in lock order: all of them, or, for a component with
    /// pools, those the store finds ready (one read first, so no slot goes to a batch that is
    /// not ready) that got a slot of each pool.
    async fn slotted(&self, locked: &mut HeldLocks, pass: &mut Pass) -> Result<Vec<BatchId>, RunError> {
        if self.descriptor.pools.is_empty() {
            return Ok(locked.ids());
        }
        let ready = self.recheck(locked, pass).await?;
        phases::mark(Phase::Recheck);
        let ready = self.without_live_holders(locked, ready, pass).await;
        let ready = self.take_slots(locked, ready, pass).await?;
        phases::mark(Phase::BatchLocks);
        Ok(ready.into_iter().map(|batch: Batch| batch.id).collect())
    }

    /// Where claims are the locks, `ready` without the batches whose open run is another live
    /// (or unjudged) process's: busy, they get no pool slot, which would keep a ready batch
    /// behind them waiting for the pool. A dead holder's batch stays, to be taken over.
    async fn without_live_holders(&self, locked: &mut HeldLocks, ready: Vec<Batch>, pass: &mut Pass) -> Vec<Batch> {
        if !self.claims_are_locks() {
            return ready;
        }
        let mut kept = Vec::with_capacity(ready.len());
        let mut busy = HashSet::new();
        for batch in ready {
            let free = match batch.open_run(&self.name) {
                None => true,
                Some(run) => match self.takeover_of(&batch.id, run).await {
                    Ok(dead) => dead.is_some(),
                    Err(e) => {
                        warn!(batch = %batch.id, holder = %run.holder.agent, "cannot judge its holder: {e}");
                        false
                    }
                },
            };
            if free {
                kept.push(batch);
            } else {
                busy.insert(batch.id.clone());
                skip_busy(batch.id, pass);
            }
        }
        locked.release_where(|id| busy.contains(id)).await;
        kept
    }

    /// The round's one store call re-checking and claiming `ids` (in its own span): it goes
    /// by the steering version this pass knows, and claims all of them when forced. A failed
    /// call ends a span of each batch as not claimed.
    async fn claim_in_store(
        &self,
        ids: &[BatchId],
        takeovers: &[Takeover],
        pass: &Pass,
    ) -> Result<ReadyClaims, RunError> {
        let claim_span = match telemetry::enabled() {
            true => tracing::info_span!(target: telemetry::TARGET, "claim", autocomp.batches = ids.len()),
            false => Span::none(),
        };
        let request = ReadyClaimRequest {
            batches: ids.to_vec(),
            // What readiness reads; the result schema and the reads it declares are not.
            descriptor: autocomp_model::ComponentDescriptor {
                result_schema: None,
                reads: Vec::new(),
                ..self.descriptor.clone()
            },
            holder: self.run_holder(),
            force: pass.force,
            known_steering: Some(pass.steering.now.version),
            exclusive: self.claims_are_locks(),
            takeovers: takeovers.to_vec(),
        };
        // Judged by the watcher's look, every one of them: claimed by those stamps.
        let judged: Option<Vec<Seq>> = match takeovers.is_empty() {
            true => ids.iter().map(|id| pass.judged.get(id).copied()).collect(),
            false => None,
        };
        let store = &self.pipeline.store;
        let claiming = async {
            match &judged {
                Some(judged) => store.claim_ready_judged(&request, judged).await,
                None => store.claim_ready(&request).await,
            }
        };
        Ok(claiming.instrument(claim_span).await.inspect_err(|_| {
            ids.iter().for_each(|id| record_outcome(&self.batch_span(id), "not_claimed", true));
        })?)
    }

    /// What the store answered for one batch; a refusal ends a span of it and is kept in
    /// `failure` (the first one wins), a batch the store does not have as `missing` says.
    fn accepted(
        &self,
        id: BatchId,
        answer: Result<ReadyAnswer, StoreError>,
        manual: bool,
        failure: &mut Option<RunError>,
    ) -> Option<ReadyAnswer> {
        match answer {
            Ok(ready) => Some(ready),
            Err(StoreError::NotFound(missing)) => {
                record_outcome(&self.batch_span(&id), "missing", true);
                self.missing(missing, manual, failure);
                None
            }
            Err(e) => {
                record_outcome(&self.batch_span(&id), "not_claimed", true);
                failure.get_or_insert(e.into());
                None
            }
        }
    }

    /// Records the give-up of each batch past `max_attempts` instead of working on it, all
    /// together (they share the store's commits).
    pub(super) async fn give_up(&self, gave_up: Vec<(Claimed, u32)>) -> Vec<BatchResult> {
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
}

/// What a claim needs to know of the attempts before it, as the claim's transaction counted
/// them before claiming: the failed attempts since the batch's last reset.
struct EarlierAttempts {
    since: Seq,
    failed_attempts: u32,
}

impl EarlierAttempts {
    /// The failed attempts as the store counts them once the claim has committed: those
    /// counted before it, plus the run of ours that was open in `batch` (the re-check's
    /// snapshot, read in the same transaction) since the last reset, which the claim marks
    /// abandoned. The snapshot, not `claim.abandoned`, says so: a claim retried after a lost
    /// answer reports no abandoned run although its first try marked one (the store answers
    /// that retry's snapshot without the run the first try opened).
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

/// Give-up results recorded at once: they queue together for the store's group commit.
const RECORDS_IN_FLIGHT: usize = 64;

/// What a claim says on the batch's span and in the log: its generation, and a takeover of
/// a run whose holder died or stalled.
pub(super) fn log_claim(id: &BatchId, claim: &Claim, span: &Span) {
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
