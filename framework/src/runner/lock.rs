//! The locks a claim round takes: each candidate's batch lock (try-lock; locked elsewhere is
//! skipped), or, where a claim is the batch's lock, a `ClaimLock` standing for it, and a slot
//! of each resource pool the component names, held together in `HeldLocks` until a claim
//! takes them over or the round lets them go.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use autocomp_model::{Batch, BatchId, PoolName};
use tokio::sync::watch;
use tracing::{debug, info, warn};

use super::pass::{Pass, Slots, release_locks};
use super::summary::wait_for;
use super::takeover::ClaimLock;
use super::{BatchResult, Runner};
use crate::component::Component;
use crate::exit::RunError;
use crate::locks::{Lock, LockError, LockHolder, LockPath, LockService, SessionState};

impl<C: Component> Runner<C> {
    /// Claiming stops on a shutdown request and while the lock service is not connected: a
    /// claim made then could be worked on by another host once the session expires.
    pub(super) fn may_claim(&self, session: &watch::Receiver<SessionState>) -> bool {
        !self.shutting_down() && *session.borrow() == SessionState::Connected
    }

    /// `!may_claim`, saying so when it is the lock service that stops the claims.
    pub(super) fn must_stop_claiming(&self, session: &watch::Receiver<SessionState>) -> bool {
        if self.may_claim(session) {
            return false;
        }
        if !self.shutting_down() {
            warn!("lock service not connected: claiming nothing more this pass");
        }
        true
    }

    /// Locks candidates until `room` are locked, the candidates run out or claiming must
    /// stop: as many as there is room for at once (`try_lock_many`: one ZooKeeper write for
    /// all of them), again for the next ones in place of those locked elsewhere. Only once
    /// the candidates run out with room left is a busy one waited for, up to
    /// `batch_lock_timeout` each; still busy, it is skipped (answered `Busy` to a manual run).
    /// Where claims are the locks, the next `room` candidates, each with a `ClaimLock`: the
    /// claim decides who is busy.
    pub(super) async fn lock_round(
        &self,
        candidates: &mut std::vec::IntoIter<BatchId>,
        room: usize,
        pass: &mut Pass,
    ) -> Result<HeldLocks, RunError> {
        let mut locked = HeldLocks::new(&self.pipeline.locks);
        if self.claims_are_locks() {
            // The claim is the lock: the store refuses what another live process holds.
            let record = self.own_liveness()?;
            for id in candidates.by_ref().take(room) {
                let path = LockPath::Batch(self.name.clone(), id.clone());
                match ClaimLock::boxed(path, &self.pipeline.locks, &record).await {
                    Ok(lock) => locked.insert(id, lock),
                    Err(e) => {
                        locked.release_all().await;
                        return Err(e.into());
                    }
                }
            }
            return Ok(locked);
        }
        let mut busy = Vec::new();
        while locked.len() < room && self.may_claim(&pass.session) {
            let ids: Vec<BatchId> = candidates.by_ref().take(room - locked.len()).collect();
            if ids.is_empty() {
                break;
            }
            if let Err(e) = self.lock_at_once(ids, &mut locked, &mut busy, pass).await {
                locked.release_all().await;
                return Err(e.into());
            }
        }
        for id in busy {
            let wait = self.config.batch_lock_timeout;
            let room_left = locked.len() < room && !wait.is_zero() && self.may_claim(&pass.session);
            let path = LockPath::Batch(self.name.clone(), id.clone());
            let waited =
                if room_left { self.pipeline.locks.try_lock(&path, &pass.holder, wait).await } else { Ok(None) };
            match waited {
                Ok(Some(lock)) => locked.insert(id, lock),
                Ok(None) => skip_busy(id, pass),
                // Not a lock at all: an alarm (logged as it was found); the other batches go on.
                Err(LockError::Foreign { path, .. }) => pass.summary.foreign_locks.push(path),
                Err(e) => {
                    locked.release_all().await;
                    return Err(e.into());
                }
            }
        }
        Ok(locked)
    }

    /// Try-locks `ids` at once: the locked ones go into `locked`, the busy ones into `busy`. A
    /// path that is not a lock at all is an alarm (logged as it was found), kept in the pass's
    /// summary; the other batches are tried again without it.
    async fn lock_at_once(
        &self,
        mut ids: Vec<BatchId>,
        locked: &mut HeldLocks,
        busy: &mut Vec<BatchId>,
        pass: &mut Pass,
    ) -> Result<(), LockError> {
        loop {
            let paths: Vec<LockPath> = ids.iter().map(|id| LockPath::Batch(self.name.clone(), id.clone())).collect();
            match self.pipeline.locks.try_lock_many(&paths, &pass.holder).await {
                Ok(answers) => {
                    for (id, answer) in ids.into_iter().zip(answers) {
                        match answer {
                            Some(lock) => locked.insert(id, lock),
                            None => busy.push(id),
                        }
                    }
                    return Ok(());
                }
                Err(LockError::Foreign { path, reason }) => {
                    let before = ids.len();
                    ids.retain(|id| LockPath::Batch(self.name.clone(), id.clone()).relative() != path);
                    if ids.len() == before {
                        return Err(LockError::Foreign { path, reason }); // none of ours: not to be retried
                    }
                    pass.summary.foreign_locks.push(path);
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Takes a slot of each pool the component names for each ready batch, in order, and
    /// keeps them with the batch's lock; returns the batches that got them. Once a pool has
    /// no free slot, that batch and the ones after it wait for it (every batch needs the same
    /// pools): their locks are released at once and they are answered `WaitingForPool`,
    /// neither claimed nor counted as an attempt. A pool's size is the round's steering read.
    pub(super) async fn take_slots(
        &self,
        locked: &mut HeldLocks,
        ready: Vec<Batch>,
        pass: &mut Pass,
    ) -> Result<Vec<Batch>, RunError> {
        if self.descriptor.pools.is_empty() || ready.is_empty() {
            return Ok(ready);
        }
        let holder = self.lock_holder();
        let mut full: Option<PoolName> = None;
        let mut slotted = Vec::new();
        let mut waiting = Vec::new();
        for batch in ready {
            if full.is_none() {
                match self.slots_for(&holder, pass).await? {
                    Ok(slots) => {
                        locked.add_slots(&batch.id, slots);
                        slotted.push(batch);
                        continue;
                    }
                    Err(pool) => full = Some(pool),
                }
            }
            let pool = full.clone().expect("set above");
            debug!(batch = %batch.id, %pool, "every slot of pool {pool} is taken; it waits for one to free");
            waiting.push(BatchResult::WaitingForPool { id: batch.id, pool });
        }
        let left: HashSet<&BatchId> = waiting
            .iter()
            .filter_map(|r| match r {
                BatchResult::WaitingForPool { id, .. } => Some(id),
                _ => None,
            })
            .collect();
        locked.release_where(|id| left.contains(id)).await;
        if let Some(pool) = full {
            // Info, not a warning: a full pool is the pool doing its job.
            info!(%pool, waiting = left.len(), "{} for pool {pool}: every slot is in use", wait_for(left.len()));
        }
        pass.summary.results.extend(waiting);
        Ok(slotted)
    }

    /// One slot of each of the component's pools, in the descriptor's order (one global
    /// order, so two batches never each hold a slot the other waits for; none waits anyway:
    /// every try is at once), or the first pool without a free one (the slots taken so far
    /// released). A pool the steering does not define has size 0, warned about once a pass.
    async fn slots_for(&self, holder: &LockHolder, pass: &mut Pass) -> Result<Result<Slots, PoolName>, RunError> {
        let mut taken: Slots = Vec::new();
        for pool in &self.descriptor.pools {
            let size = pass.steering.size_of(pool);
            let mut slot = None;
            for index in 0..size {
                let path = LockPath::Slot(pool.clone(), index);
                match self.pipeline.locks.try_lock(&path, holder, std::time::Duration::ZERO).await {
                    Ok(Some(lock)) => {
                        slot = Some(lock);
                        break;
                    }
                    Ok(None) => {}
                    // Not a lock at all: an alarm (logged as it was found); the other slots
                    // may be free.
                    Err(LockError::Foreign { path, .. }) => {
                        if !pass.summary.foreign_locks.contains(&path) {
                            pass.summary.foreign_locks.push(path);
                        }
                    }
                    Err(e) => {
                        release_locks(self.pipeline.locks.as_ref(), taken).await;
                        return Err(e.into());
                    }
                }
            }
            match slot {
                Some(lock) => taken.push(lock),
                None => {
                    release_locks(self.pipeline.locks.as_ref(), taken).await;
                    return Ok(Err(pool.clone()));
                }
            }
        }
        Ok(Ok(taken))
    }
}

/// A batch locked by another worker: skipped (answered `Busy` to a manual run).
pub(super) fn skip_busy(id: BatchId, pass: &mut Pass) {
    debug!(batch = %id, "locked by another worker; skipped");
    if pass.manual {
        pass.summary.results.push(BatchResult::Busy { id });
    }
}

/// The batch locks a claim round holds and has not handed to a claimed batch, with the pool
/// slots taken for each. Releasing is async, so the round releases them itself on every path
/// it takes (`release_where`, `release_all`); a guard dropped still holding some (a panic, a
/// dropped pass) hands them to a task that releases them, rather than leaving them held
/// until the process exits.
pub(super) struct HeldLocks {
    /// Where they were taken, which releases them together.
    service: Arc<dyn LockService>,
    /// Batch ids in the order they were locked (the candidates' order), released ones too.
    order: Vec<BatchId>,
    locks: HashMap<BatchId, Box<dyn Lock>>,
    /// The pool slots taken for a locked batch: they go wherever its lock goes.
    slots: HashMap<BatchId, Slots>,
}

impl HeldLocks {
    pub(super) fn new(service: &Arc<dyn LockService>) -> Self {
        Self { service: Arc::clone(service), order: Vec::new(), locks: HashMap::new(), slots: HashMap::new() }
    }

    pub(super) fn insert(&mut self, id: BatchId, lock: Box<dyn Lock>) {
        self.order.push(id.clone());
        self.locks.insert(id, lock);
    }

    /// Keeps `slots` with the lock of `id` (which the round holds).
    pub(super) fn add_slots(&mut self, id: &BatchId, slots: Slots) {
        debug_assert!(self.locks.contains_key(id), "slots for a batch the round does not hold");
        self.slots.entry(id.clone()).or_default().extend(slots);
    }

    pub(super) fn len(&self) -> usize {
        self.locks.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.locks.is_empty()
    }

    /// The batches still locked, in the order they were locked.
    pub(super) fn ids(&self) -> Vec<BatchId> {
        self.order.iter().filter(|id| self.locks.contains_key(*id)).cloned().collect()
    }

    /// Hands the lock of `id` and its pool slots over: releasing them is the caller's
    /// business from then on.
    pub(super) fn take(&mut self, id: &BatchId) -> Option<(Box<dyn Lock>, Slots)> {
        let lock = self.locks.remove(id)?;
        Some((lock, self.slots.remove(id).unwrap_or_default()))
    }

    /// Releases the locks (and slots) of the batches `unwanted` picks, all at once; keeps
    /// the others.
    pub(super) async fn release_where(&mut self, unwanted: impl Fn(&BatchId) -> bool) {
        let mut released: Vec<_> = self.locks.extract_if(|id, _| unwanted(id)).map(|(_, lock)| lock).collect();
        released.extend(self.slots.extract_if(|id, _| unwanted(id)).flat_map(|(_, slots)| slots));
        release_locks(self.service.as_ref(), released).await;
    }

    pub(super) async fn release_all(&mut self) {
        let locks = self.drain();
        release_locks(self.service.as_ref(), locks).await;
    }

    /// Every lock and slot still held, taken out of the guard.
    fn drain(&mut self) -> Vec<Box<dyn Lock>> {
        let mut all: Vec<_> = self.locks.drain().map(|(_, lock)| lock).collect();
        all.extend(self.slots.drain().flat_map(|(_, slots)| slots));
        all
    }
}

impl Drop for HeldLocks {
    fn drop(&mut self) {
        if self.locks.is_empty() && self.slots.is_empty() {
            return;
        }
        let locks = self.drain();
        warn!(locks = locks.len(), "a claim round ended without releasing its batch locks; releasing them now");
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                let service = Arc::clone(&self.service);
                drop(runtime.spawn(async move { release_locks(service.as_ref(), locks).await }));
            }
            // No runtime to release on: the locks go with the process (flock) or its
            // session, which the lock service closes at exit.
            Err(_) => warn!("no runtime to release the batch locks on; they end with the process"),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use autocomp_model::{ComponentName, Timestamp};

    use super::*;
    use crate::locks::LocalLocks;

    /// A round's batch locks end released on every path: those it lets go of explicitly at
    /// once, and those it never got to (a panic, a dropped pass) when the guard is dropped.
    /// Flock files tell the two apart: a release removes the file, a plain drop leaves it.
    #[tokio::test]
    async fn held_locks_are_released_explicitly_or_by_the_guards_drop() {
        let dir = tempfile::tempdir().unwrap();
        let locks: Arc<dyn LockService> = Arc::new(LocalLocks::new(dir.path()));
        let holder = LockHolder { agent: "test".into(), host: "testhost".into(), pid: 1, since: Timestamp::now() };
        let ids: Vec<BatchId> = ["B1", "B2", "B3"].iter().map(|id| BatchId::new(*id).unwrap()).collect();
        let file = |id: &BatchId| dir.path().join(format!("batch/probe/{id}.lock"));
        let mut held = HeldLocks::new(&locks);
        for id in &ids {
            let path = LockPath::Batch(ComponentName::new("probe").unwrap(), id.clone());
            held.insert(id.clone(), locks.try_lock(&path, &holder, Duration::ZERO).await.unwrap().expect("free"));
        }

        held.release_where(|id| id == &ids[1]).await;
        assert!(!file(&ids[1]).exists(), "release_where did not release B2");
        assert_eq!(held.ids(), vec![ids[0].clone(), ids[2].clone()], "the others stay held, in lock order");
        let (taken, no_slots) = held.take(&ids[0]).expect("B1 is held");
        assert!(no_slots.is_empty());
        drop(held);

        let deadline = Instant::now() + Duration::from_secs(10);
        while file(&ids[2]).exists() {
            assert!(Instant::now() < deadline, "the dropped guard never released B3");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(file(&ids[0]).exists() && taken.still_held().await.unwrap(), "a lock taken out is the taker's");
        taken.release().await.unwrap();
    }
}
