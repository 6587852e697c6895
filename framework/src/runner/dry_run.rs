//! `--dry-run`: what a pass would claim and why, touching nothing (no locks, no claims):
//! the candidates phase alone, the steering's hold, and the room the component's pools have
//! now (read at the lock service, not taken).

use autocomp_model::{PoolName, Steering};

use super::{Runner, Selection};
use crate::component::Component;
use crate::exit::RunError;
use crate::locks::{HeldLock, slots_in_use};

/// What `--dry-run` found: a line per candidate listed, and how many more there were.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DryRun {
    pub lines: Vec<String>,
    /// Candidates the index offers beyond the listed ones.
    pub not_shown: usize,
    /// Why nothing would be claimed now: the component (or the whole pipeline) is held.
    pub held: Option<String>,
    /// Why the pass would not even start (a broken contract, a setting refused): it claims
    /// nothing, and exits 2.
    pub refused: Option<String>,
}

/// The pool of a component's that lets the fewest batches start now (the first of them, in
/// the component's order): its name, its size as the steering defines it (`None`: not at
/// all) and its slots in use at the lock service. What a dry run, `autocomp ready` and
/// `explain` say of a batch that waits for a pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolRoom {
    /// The pool.
    pub pool: PoolName,
    /// Its size, as the steering defines it; `None` when it does not.
    pub size: Option<u32>,
    /// Its slots held now, by any process.
    pub in_use: u32,
}

impl PoolRoom {
    /// The room of the fullest of `pools` (`None` without pools), from the steering's sizes
    /// and a listing of the lock service's locks.
    pub fn of(pools: &[PoolName], steering: &Steering, held: &[HeldLock]) -> Option<PoolRoom> {
        let rooms = pools.iter().map(|pool| PoolRoom {
            pool: pool.clone(),
            size: steering.pool(pool).map(|defined| defined.size),
            in_use: slots_in_use(held, pool),
        });
        rooms.min_by_key(PoolRoom::free)
    }

    /// Batches that may start now (none for a pool without a size).
    pub fn free(&self) -> u32 {
        self.size.unwrap_or(0).saturating_sub(self.in_use)
    }

    /// How a batch ready but waiting for the pool is described.
    pub fn wait(&self) -> String {
        let pool = &self.pool;
        match self.size {
            None => format!("waits for pool {pool}, which has no size (autocomp pool set {pool} N)"),
            Some(0) => format!("waits for pool {pool}, which is closed (size 0; autocomp pool set {pool} N opens it)"),
            Some(size) => format!(
                "waits for pool {pool}: {} of its {size} slot(s) in use; claimed once one frees (in this pass \
                 when its own work frees it)",
                self.in_use
            ),
        }
    }
}

impl<C: Component> Runner<C> {
    /// `--dry-run`: what a pass would claim and why, touching nothing (no locks, no claims).
    /// `limit` caps the candidates listed (`None`: as many as a pass asks the index for,
    /// `Some(0)`: all); the rest are counted, so the caller can say they were left out. A
    /// held component (unless forced) says so, and each batch it would claim says it waits
    /// for the resume. A component with pools counts their free slots at the lock service:
    /// the batches past them say they wait for the pool (a pass claims them as its own work
    /// frees slots).
    pub async fn dry_run(&self, selection: &Selection, limit: Option<usize>) -> Result<DryRun, RunError> {
        let (mut candidates, force) = match selection {
            Selection::Ready | Selection::Offered(..) | Selection::Handed => (self.all_candidates().await?, false),
            Selection::Batch { id, force } => (vec![id.clone()], *force),
        };
        let refused = self.pass_refusal().await.map(|refused| refused.to_string());
        let held = if force { None } else { self.held().await? };
        let room = self.pool_room().await?;
        let shown = match limit {
            Some(0) => candidates.len(),
            Some(limit) => limit,
            None => self.config.queue_size.saturating_mul(4).max(16),
        };
        let not_shown = candidates.len().saturating_sub(shown);
        candidates.truncate(shown);
        let mut lines = Vec::new();
        let mut would_claim = 0;
        for id in candidates {
            let batch = self.pipeline.store.get_batch(&id).await?;
            let claimable = match self.descriptor.readiness(&batch) {
                _ if would_claim >= self.config.queue_size => {
                    Err("would leave for the next pass (queue full)".to_owned())
                }
                Ok(()) => Ok(format!("every trigger clause holds (priority {})", batch.priority)),
                Err(_) if force => Ok("forced, trigger ignored".to_owned()),
                Err(refusal) => Err(format!("would skip: {refusal}")),
            };
            let verdict = match claimable {
                Err(verdict) => verdict,
                Ok(why) => {
                    would_claim += 1;
                    match &room {
                        // Ready by its own facts; the refusal (on stderr) is the component's.
                        _ if refused.is_some() => {
                            format!("would not claim: no pass starts (why: on stderr), though {why}")
                        }
                        _ if held.is_some() => format!("would claim once resumed (held): {why}"),
                        Some(room) if would_claim > room.free() as usize => format!("{}: {why}", room.wait()),
                        _ => format!("would claim: {why}"),
                    }
                }
            };
            lines.push(format!("{id} {verdict}"));
        }
        Ok(DryRun { lines, not_shown, held, refused })
    }

    /// For a component with pools, the one with the fewest free slots now (sizes from the
    /// steering this runner keeps, slots in use read at the lock service); `None` without
    /// pools.
    async fn pool_room(&self) -> Result<Option<PoolRoom>, RunError> {
        if self.descriptor.pools.is_empty() {
            return Ok(None);
        }
        // The steering `held` read and kept just before, when it did.
        let steering = match self.steering.get() {
            Some(kept) => kept,
            None => self.pipeline.store.steering().await?,
        };
        let held = self.pipeline.locks.held().await.map_err(RunError::from)?;
        Ok(PoolRoom::of(&self.descriptor.pools, &steering, &held))
    }
}
