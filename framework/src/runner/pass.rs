//! What a pass knows as it claims (the `Pass` every claim phase takes instead of six
//! arguments), what it holds of each claimed batch, and the lock releases every phase ends
//! with. Apart so the phase modules share it without using each other.

use std::collections::HashSet;

use autocomp_model::{Batch, PoolName, Steering};
use autocomp_store::Claim;
use tokio::sync::watch;
use tracing::{Span, warn};

use super::{Judged, PassSummary, Selection};
use crate::locks::{Lock, LockHolder, LockService, SessionState};

/// What a pass knows while it claims: whether an operator named the batch (`manual`) and
/// ignores its trigger (`force`), who it is to the lock service, the lock session whose
/// loss stops the claims, the steering it goes by, what it found so far and the batches it
/// claimed (released by the caller on an error).
pub(super) struct Pass {
    pub(super) manual: bool,
    pub(super) force: bool,
    pub(super) holder: LockHolder,
    pub(super) session: watch::Receiver<SessionState>,
    pub(super) steering: PassSteering,
    pub(super) summary: PassSummary,
    pub(super) claimed: Vec<Claimed>,
    /// The stamps the watcher's look found offered batches ready at (`Selection::Offered`).
    pub(super) judged: Judged,
}

impl Pass {
    /// A pass over `selection`, nothing claimed yet.
    pub(super) fn new(selection: &Selection, holder: LockHolder, session: watch::Receiver<SessionState>) -> Self {
        let (manual, force) = match selection {
            Selection::Ready | Selection::Offered(..) | Selection::Handed => (false, false),
            Selection::Batch { force, .. } => (true, *force),
        };
        Self {
            manual,
            force,
            holder,
            session,
            steering: PassSteering::default(),
            summary: PassSummary::default(),
            claimed: Vec::new(),
            judged: match selection {
                Selection::Offered(_, judged) => judged.clone(),
                _ => Judged::new(),
            },
        }
    }
}

/// A batch this pass claimed: its snapshot from the re-check, its run, its lock, the slots
/// of the resource pools its work holds (released with the lock, on every path), the
/// checkpoint an earlier attempt left, and whether the component's circuit breaker was
/// counting failures when it was claimed (then a success is reported to reset it).
pub(super) struct Claimed {
    pub(super) batch: Batch,
    pub(super) claim: Claim,
    pub(super) lock: Box<dyn Lock>,
    pub(super) slots: Slots,
    pub(super) checkpoint: Option<serde_json::Value>,
    pub(super) breaker_counting: bool,
    /// The batch's span, from its claim to its unlock (disabled when telemetry is off).
    pub(super) span: Span,
}

impl Claimed {
    /// The batch lock and the pool slots, to be released together.
    pub(super) fn locks(lock: Box<dyn Lock>, slots: Slots) -> impl Iterator<Item = Box<dyn Lock>> {
        std::iter::once(lock).chain(slots)
    }
}

/// The pool slots a batch's work holds, one per pool the component names.
pub(super) type Slots = Vec<Box<dyn Lock>>;

/// The pipeline's steering as a pass goes by it: the newest read (at the start of the
/// current claim round), and the pools it found no size for, warned about once a pass.
#[derive(Default)]
pub(super) struct PassSteering {
    pub(super) now: Steering,
    pub(super) warned: HashSet<PoolName>,
}

impl PassSteering {
    /// The pool's size; 0 (every batch needing it waits) for a pool the store does not define.
    pub(super) fn size_of(&mut self, pool: &PoolName) -> u32 {
        if let Some(defined) = self.now.pool(pool) {
            return defined.size;
        }
        if self.warned.insert(pool.clone()) {
            warn!(%pool, "pool {pool} has no size: autocomp pool set {pool} N (until then no batch gets a slot of it)");
        }
        0
    }
}

/// How a batch ended, on its span (nothing on a disabled one): `success` or `failure` for a
/// recorded result, else what became of it (`released`, `fenced`, `not_recorded`, ...).
pub(super) fn record_outcome(span: &Span, outcome: &str, error: bool) {
    span.record("autocomp.outcome", outcome);
    if error {
        span.record("otel.status_code", "ERROR");
    }
}

/// Releases several locks together (`release_many`: one ZooKeeper write for all of them,
/// shared with releases other tasks ask for meanwhile); a failure is logged, not fatal: the
/// locks die with the process (or its session) anyway.
pub(super) async fn release_locks(service: &dyn LockService, locks: impl IntoIterator<Item = Box<dyn Lock>>) {
    let locks: Vec<Box<dyn Lock>> = locks.into_iter().collect();
    if locks.is_empty() {
        return;
    }
    let paths: Vec<String> = locks.iter().map(|lock| lock.path().relative()).collect();
    if let Err(e) = service.release_many(locks).await {
        warn!(locks = ?paths, "cannot release the locks: {e}");
    }
}

/// Releases a lock; a failure is logged, not fatal: the lock dies with the process anyway.
pub(super) async fn release_quietly(lock: Box<dyn Lock>) {
    let path = lock.path().relative();
    if let Err(e) = lock.release().await {
        warn!(lock = %path, "cannot release the lock: {e}");
    }
}
