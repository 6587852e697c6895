//! Claim-as-lock: where the lock service keeps a liveness record for this process, a batch
//! takes no lock of its own. The store's exclusive claim refuses a batch whose open run is
//! another claim's (answered `held`), and this module judges that run's holder: proven dead
//! (its liveness record gone), the run is named in a takeover and claimed over; alive or
//! unproven, the batch is busy, as a batch locked elsewhere was.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use autocomp_model::{BatchId, Run};
use autocomp_store::Takeover;
use tracing::{debug, info};

use super::Runner;
use crate::component::Component;
use crate::exit::RunError;
use crate::locks::{Liveness, LivenessHold, Lock, LockError, LockPath, LockService};

impl<C: Component> Runner<C> {
    /// Whether a claim is the batch's lock: the lock service keeps this process's liveness
    /// record, which the runs it claims name.
    pub(super) fn claims_are_locks(&self) -> bool {
        self.pipeline.locks.keeps_liveness()
    }

    /// This process's liveness record, which its claims name; its absence from a service
    /// that keeps them (gone, or never made) stops the claims: another process may already
    /// judge this one dead.
    pub(super) fn own_liveness(&self) -> Result<String, RunError> {
        self.pipeline.locks.liveness().ok_or_else(|| {
            RunError::LocksLost("this process's liveness record is gone (or cannot be made): claiming nothing".into())
        })
    }

    /// The takeover of `run` (the open run an exclusive claim of `batch` was refused for)
    /// when its holder is proven dead; `None` while it may be alive. A run whose holder names
    /// no liveness record was claimed under a batch lock (by a release before claim-as-lock):
    /// it is proven dead once that lock is free.
    pub(super) async fn takeover_of(&self, batch: &BatchId, run: &Run) -> Result<Option<Takeover>, RunError> {
        if self.may_have_handed_runs()
            && run.holder.liveness.is_some()
            && run.holder.liveness == self.pipeline.locks.liveness()
        {
            // Ours, yet not claimed by this pass: handed to this process by an append
            // (`hand_on`), whose announcement has the watcher take it up after this pass.
            debug!(%batch, generation = run.generation, "handed to this process; taken up after this pass");
            return Ok(None);
        }
        let dead = match &run.holder.liveness {
            Some(record) => self.pipeline.locks.judge_liveness(record).await? == Liveness::Dead,
            None => self.batch_lock_is_free(batch).await?,
        };
        let holder = &run.holder.agent;
        if !dead {
            debug!(%batch, generation = run.generation, %holder, "claimed by a live process; skipped");
            return Ok(None);
        }
        info!(%batch, generation = run.generation, %holder, "its holder is gone: taking its run over");
        Ok(Some(Takeover { batch: batch.clone(), generation: run.generation, liveness: run.holder.liveness.clone() }))
    }

    /// Whether nobody holds the batch lock of `batch` (taken and let go of at once to tell).
    async fn batch_lock_is_free(&self, batch: &BatchId) -> Result<bool, LockError> {
        let path = LockPath::Batch(self.name.clone(), batch.clone());
        match self.pipeline.locks.try_lock(&path, &self.lock_holder(), Duration::ZERO).await? {
            Some(lock) => {
                lock.release().await?;
                Ok(true)
            }
            None => Ok(false),
        }
    }
}

/// The lock of a batch whose claim is its lock: nothing held in the lock service, so nothing
/// to release; held for as long as this process's liveness record (`record`, which the claim
/// names) is still its own, which the record phase asks before each commit (and the store's
/// generation fences an append that comes too late anyway).
pub(super) struct ClaimLock {
    path: LockPath,
    service: Arc<dyn LockService>,
    record: String,
    /// The claim marked held on the lock service while it lives (its record kept fresher).
    _held: Option<LivenessHold>,
}

impl ClaimLock {
    /// Marked held on the lock service before the claim is written (`hold_liveness`).
    pub(super) async fn boxed(
        path: LockPath,
        service: &Arc<dyn LockService>,
        record: &str,
    ) -> Result<Box<dyn Lock>, LockError> {
        let _held = service.hold_liveness().await?;
        Ok(Box::new(ClaimLock { path, service: Arc::clone(service), record: record.to_owned(), _held }))
    }
}

#[async_trait]
impl Lock for ClaimLock {
    fn path(&self) -> &LockPath {
        &self.path
    }

    async fn still_held(&self) -> Result<bool, LockError> {
        Ok(self.service.liveness().as_deref() == Some(self.record.as_str()))
    }

    async fn release(self: Box<Self>) -> Result<(), LockError> {
        Ok(())
    }
}
