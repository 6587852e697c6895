//! The lock port: try-locks on `poll/<component>`, `batch/<component>/<batch-id>` and
//! `slot/<pool>/<index>` (one slot of a resource pool), each naming its holder, plus the lock
//! service's session state so the runner can hold commits while disconnected and stop when
//! the session is lost.
//! Adapters: `local` (flock files; the OS frees them on death), `zk` (one ephemeral
//! ZooKeeper node per lock; the server frees them when the session ends) and `pg` (one
//! PostgreSQL row per lock, each process's rows under a lease it renews; another process
//! takes them over once it has seen the lease not renewed for its whole length).
//!
//! What every backend promises (one contract suite runs against all three):
//! - a path is held by at most one [`Lock`] at a time, across services, sessions and
//!   processes, another task of the same service included; different paths never exclude
//!   each other;
//! - [`LockService::try_lock`] answers `None` once `wait` has passed with the path still busy,
//!   and hands a path that is released while it waits to the waiter;
//! - [`LockService::try_lock_many`] takes each free path at once and answers `None` for each
//!   busy one, as `try_lock` with no wait does for one;
//! - [`Lock::release`] and [`LockService::release_many`] free the paths at once;
//!   [`Lock::still_held`] is `true` until then;
//! - [`LockService::held`] of any other service lists every held path with the holder its
//!   taker stored: that is what operators see;
//! - something at a lock path that no lock service made is [`LockError::Foreign`] to a
//!   taker (an alarm, never "busy") and flagged in [`HeldLock::foreign`];
//! - a holder that calls [`LockService::close`] and exits leaves nothing held; a holder that
//!   dies without closing loses its locks within a bound of the backend's own (below).
//!
//! Where the backends differ:
//! - a dead holder's locks: flock frees them when the process is gone; ZooKeeper when the
//!   server expires its session, a session timeout later; PostgreSQL when another lock
//!   service has seen the holder's lease unrenewed for its whole length (on its own clock)
//!   and takes it over: on its next look after that (`try_lock` on a held path, `held`, or,
//!   for the holders of locks it found busy, its watch every third of its own lease);
//! - [`LockService::close`]: ZooKeeper and PostgreSQL delete every lock still held and end
//!   the session (every [`Lock`] then says it is not held, and nothing works afterwards);
//!   local has no session and does nothing: its locks go with their [`Lock`]s or the process;
//! - a [`Lock`] dropped without [`Lock::release`]: local frees it (its file descriptor
//!   closes); ZooKeeper and PostgreSQL keep it until `close` or the end of the session;
//! - [`LockService::session`]: always `Connected` locally; ZooKeeper's follows its
//!   connection, PostgreSQL's the age of its last lease renewal (`Suspended` at 0.3 of the
//!   lease, `Lost` at 0.5), and [`LockService::lost_session_grace`] bounds the work after a
//!   loss;
//! - the liveness record ([`LockService::liveness`], what runs name for claim-as-lock) and
//!   how another's is judged ([`LockService::judge_liveness`]): local `local:<host>:<pid>:
//!   <nonce>`, a file under `<dir>/live/` flocked for the service's life (a try of the flock:
//!   busy alive, free or absent dead; another host's unproven); ZooKeeper `zk:<session id
//!   hex>`, an ephemeral node `live/<session id hex>` made at connect (after a `sync`: present
//!   alive, absent dead); PostgreSQL `pg:<worker id>`, the worker row (absent dead, its beat
//!   changed alive, unchanged for its whole lease on the judge's clock dead and taken over,
//!   else unproven). None of them is a lock: `held` never lists them.

mod local;
mod pg;
mod zk;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use autocomp_model::{BatchId, ComponentName, InvalidInput, PoolName, Timestamp};
use serde::{Deserialize, Serialize};

pub use local::LocalLocks;
pub use pg::{DEFAULT_LEASE, PgLocks, PgLocksUrl};
pub use zk::{AUTH_ENV, DEFAULT_SESSION_TIMEOUT, ZkLocks, ZkTls, ZkUrl};

/// What is locked. Both parts are validated names, so the path is safe as file and node name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum LockPath {
    /// One poller per component across all hosts.
    Poll(ComponentName),
    /// One worker per (component, batch) across all hosts.
    Batch(ComponentName, BatchId),
    /// Slot `index` (0 to the pool's size - 1) of a resource pool: a pool of size N is N
    /// such locks, and a batch's work holds one of each pool its component names.
    Slot(PoolName, u32),
}

impl LockPath {
    /// `poll/<component>`, `batch/<component>/<batch-id>` or `slot/<pool>/<index>`.
    pub fn relative(&self) -> String {
        match self {
            LockPath::Poll(component) => format!("poll/{component}"),
            LockPath::Batch(component, batch) => format!("batch/{component}/{batch}"),
            LockPath::Slot(pool, index) => format!("slot/{pool}/{index}"),
        }
    }

    /// The lock a [`LockPath::relative`] path (as [`HeldLock::path`] lists it) names, or
    /// `None` if it names none (a node someone else put in the lock tree).
    pub fn parse(relative: &str) -> Option<Self> {
        let parts: Vec<&str> = relative.split('/').collect();
        match parts.as_slice() {
            ["poll", component] => Some(LockPath::Poll(ComponentName::new(*component).ok()?)),
            ["batch", component, batch] => {
                Some(LockPath::Batch(ComponentName::new(*component).ok()?, BatchId::new(*batch).ok()?))
            }
            // Only the index as `relative` writes it: `01` would be a second name for slot 1.
            ["slot", pool, index] if index.parse::<u32>().is_ok_and(|n| n.to_string() == *index) => {
                Some(LockPath::Slot(PoolName::new(*pool).ok()?, index.parse().ok()?))
            }
            _ => None,
        }
    }
}

/// Who holds a lock, stored with it so operators can see who holds what.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockHolder {
    /// The component's agent string, e.g. `probe/1.0@host#1234`.
    pub agent: String,
    /// The host the holding process runs on.
    pub host: String,
    /// The holding process's id on that host.
    pub pid: u32,
    /// When the lock was taken.
    pub since: Timestamp,
}

impl LockHolder {
    /// The record a lock stores of its holder (JSON), what [`LockHolder::from_record`] reads.
    pub(crate) fn record(&self) -> String {
        serde_json::to_string(self).expect("holders serialize")
    }

    /// The holder a lock's stored record names; an error for anything no lock service wrote
    /// (fields a backend adds to the record, as ZooKeeper's session, are passed over).
    pub(crate) fn from_record(record: &[u8]) -> Result<Self, serde_json::Error> {
        serde_json::from_slice(record)
    }
}

/// A lock someone holds right now, as `autocomp locks` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldLock {
    /// [`LockPath::relative`] of the lock.
    pub path: String,
    /// Who holds it; `None` if its record cannot be read (e.g. taken a moment ago, the
    /// holder not written yet).
    pub holder: Option<LockHolder>,
    /// Why this is not a lock a lock service made, if it is not (ZooKeeper: a persistent
    /// node, data that is not a holder record, a record naming another session than the
    /// node's owner). Such a node is an alarm: no pass takes the path while it is there.
    pub foreign: Option<String>,
}

/// How many slots of `pool` are held in `held` (a listing of the lock service's locks):
/// those of its current size and any left above it by a pool since shrunk.
pub fn slots_in_use(held: &[HeldLock], pool: &PoolName) -> u32 {
    let of_pool = |lock: &&HeldLock| matches!(LockPath::parse(&lock.path), Some(LockPath::Slot(p, _)) if &p == pool);
    u32::try_from(held.iter().filter(of_pool).count()).unwrap_or(u32::MAX)
}

/// The lock service's session, as [`LockService::session`] publishes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionState {
    /// Every lock taken is held: work and commit as usual.
    Connected,
    /// Disconnected, session possibly still alive: start nothing new, hold commits.
    Suspended,
    /// The session is gone and every lock with it: record nothing, exit.
    Lost,
}

/// Why a lock operation failed (a busy lock is not an error: `try_lock` answers `None`).
/// A caller decides on the variant (and an `Invalid`'s field), never on the words.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LockError {
    /// A bad locks URL or name; retrying does not help.
    #[error(transparent)]
    Invalid(#[from] InvalidInput),
    /// The lock service cannot answer (unreachable, closed, its session lost, a file it
    /// cannot write); the text says which and where.
    #[error("lock service unavailable: {0}")]
    Unavailable(String),
    /// Something at a lock path (or in the lock tree) that no lock service made: not "busy"
    /// but an alarm, since it never goes away by itself and someone else wrote it. `path`
    /// is the lock's relative path.
    #[error("{path} is not a lock autocomp made: {reason}; see `autocomp locks`, delete it once you know who made it")]
    Foreign {
        /// [`LockPath::relative`] of the lock (or the lock tree's node) in question.
        path: String,
        /// What is wrong with it, and where.
        reason: String,
    },
}

/// Where locks are taken: one per process, shared by its tasks (see the module for what
/// every backend promises and where they differ).
#[async_trait]
pub trait LockService: Send + Sync {
    /// Takes the lock if free, waiting up to `wait` for it; `None` if still busy then
    /// (`Duration::ZERO`: at once). Busy means held by anyone, another task of this very
    /// service included. `holder` is stored with the lock for [`LockService::held`].
    async fn try_lock(
        &self,
        path: &LockPath,
        holder: &LockHolder,
        wait: Duration,
    ) -> Result<Option<Box<dyn Lock>>, LockError>;

    /// Takes each of `paths` that is free, at once (no wait): one answer per path, in order,
    /// `None` for a busy one (as `try_lock` with `Duration::ZERO` would answer). A path that
    /// is not a lock at all is `LockError::Foreign` for the whole call, nothing taken: the
    /// caller drops it and asks again for the others. Any other error leaves nothing taken.
    /// The default takes them one by one; ZooKeeper creates the free ones in one `multi`
    /// (one write, however many paths), PostgreSQL in one statement.
    async fn try_lock_many(
        &self,
        paths: &[LockPath],
        holder: &LockHolder,
    ) -> Result<Vec<Option<Box<dyn Lock>>>, LockError> {
        let mut taken = Vec::with_capacity(paths.len());
        for path in paths {
            match self.try_lock(path, holder, Duration::ZERO).await {
                Ok(lock) => taken.push(lock),
                Err(e) => {
                    // Best effort: the error is what the caller needs to hear.
                    let _ = self.release_many(taken.into_iter().flatten().collect()).await;
                    return Err(e);
                }
            }
        }
        Ok(taken)
    }

    /// Releases every lock of `locks` (taken from this service) together, each freed when
    /// this returns, as [`Lock::release`] frees one; the first error if any failed (the others
    /// are still released). The default releases them side by side; ZooKeeper deletes them in
    /// one `multi` (one write), releases that other tasks ask for meanwhile joining the next;
    /// PostgreSQL in one statement.
    async fn release_many(&self, locks: Vec<Box<dyn Lock>>) -> Result<(), LockError> {
        let released = futures_util::future::join_all(locks.into_iter().map(|lock| lock.release())).await;
        released.into_iter().collect()
    }

    /// Every lock held right now, by any process, sorted by path, each with its holder as
    /// stored: what `autocomp locks` shows.
    async fn held(&self) -> Result<Vec<HeldLock>, LockError>;

    /// Whether a `try_lock` waiting for a path held elsewhere is told when it is released
    /// (ZooKeeper: a watch on its node) rather than trying again after a pause (flock,
    /// PostgreSQL, the default). A watcher giving its component's turn back needs to leave
    /// the lock free a while only for waiters that poll (`runner/turn.rs`, `RESTS_FOR`).
    fn waiters_told_at_release(&self) -> bool {
        false
    }

    /// Whether `path` is held right now, by anyone, read without taking it: a deferring
    /// watcher's check before it looks for work (a read at the lock service instead of the
    /// store's). A dead holder's path reads free within the bound its locks are freed in
    /// (PostgreSQL: once this process has seen its beat unchanged for its whole lease), so
    /// the watcher then tries, and takes it over. `None` where a read cannot tell, the
    /// default (a flock is known only by trying it).
    async fn is_held(&self, path: &LockPath) -> Result<Option<bool>, LockError> {
        let _ = path;
        Ok(None)
    }

    /// The session's state, as it changes (always `Connected` for a backend without
    /// sessions).
    fn session(&self) -> tokio::sync::watch::Receiver<SessionState>;

    /// Once the session is lost, how long cancelled work may still run before the process
    /// must be gone: after that another host may hold the locks. `None`: no limit of the
    /// lock service's own (locks that never expire behind our back).
    fn lost_session_grace(&self) -> Option<std::time::Duration> {
        None
    }

    /// Ends the session at process exit: deletes every lock still held and closes the
    /// connection, so nothing lingers after the process is gone. Nothing works afterwards.
    /// The default does nothing: for a backend whose locks the OS frees with the process.
    async fn close(&self) {}

    /// This process's liveness record, which its runs name (`RunHolder::liveness`): while
    /// it is kept, a claim that finds one of those runs open is refused; once it is gone (the
    /// process dead, its session expired, its lease observed unrenewed: on PostgreSQL also a
    /// live process's lease dormant, holding nothing, for a lease), the run may be taken
    /// over. `None` for a service that keeps none: then every claim takes batch locks. A
    /// service keeps one record for its life: once made, it is never another, only gone
    /// (`None` for good), which a taker of hand-ons relies on (`Runner::handed_record`).
    fn liveness(&self) -> Option<String> {
        None
    }

    /// Marks a claim naming this process's liveness record as held until the answer is
    /// dropped, before the claim is written: a service that keeps the record less fresh while
    /// nothing is held on it keeps it as for a held lock meanwhile (PostgreSQL renews every
    /// tenth of its lease instead of every fifth, and renews a dormant lease first). `None`
    /// where the record's upkeep does not depend on it.
    async fn hold_liveness(&self) -> Result<Option<LivenessHold>, LockError> {
        Ok(None)
    }

    /// Whether this service keeps liveness records, so that claims are the batches' locks:
    /// fixed for the service's life, so a process never mixes exclusive claims with batch
    /// locks (a `liveness` of `None` from such a service means the record is gone: claim
    /// nothing). `false` by default.
    fn keeps_liveness(&self) -> bool {
        false
    }

    /// How the process whose liveness record is `record` (another run's holder) stands:
    /// `Dead` only with proof (its record gone, or its lease observed unrenewed for a whole
    /// lease on this process's own clock), else `Alive` or `Unproven` (not a record of this
    /// service, or not watched long enough yet: ask again on a later pass).
    async fn judge_liveness(&self, record: &str) -> Result<Liveness, LockError> {
        let _ = record;
        Ok(Liveness::Unproven)
    }
}

/// What [`LockService::judge_liveness`] found of a run's holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Liveness {
    /// Its record is there (renewed, its session open, its file locked): the run is its.
    Alive,
    /// Proven gone: its run may be taken over.
    Dead,
    /// Neither proven: leave the run alone for now.
    Unproven,
}

/// A claim naming this process's liveness record, marked held on the lock service
/// ([`LockService::hold_liveness`]) until dropped.
pub struct LivenessHold {
    /// The service's own marker, let go when dropped.
    _held: Box<dyn Send + Sync>,
}

impl LivenessHold {
    /// Holds `held` (the service's own marker, let go when dropped).
    pub fn new(held: impl Send + Sync + 'static) -> Self {
        Self { _held: Box::new(held) }
    }
}

/// One lock taken by [`LockService::try_lock`], held until released (or lost).
#[async_trait]
pub trait Lock: Send + Sync {
    /// What is locked.
    fn path(&self) -> &LockPath;

    /// Whether we still hold it (checked before every commit): `true` from `try_lock` on,
    /// `false` once it is gone behind our back (the session ended, the lock removed).
    async fn still_held(&self) -> Result<bool, LockError>;

    /// Gives the lock up: the next taker (a waiter included) gets it at once. Taking the
    /// lock by value, it is released once. A lock already gone with its session releases
    /// as `Ok`. Whoever holds the path now is left alone: ZooKeeper deletes only a node of
    /// its own session, local only the very file it locked (an outside `rm` may have let
    /// another holder create a new one).
    async fn release(self: Box<Self>) -> Result<(), LockError>;

    /// The lock as its backend's own type, for a service's `release_many` to tell its own
    /// locks (which it can release together) from others; `None` by default.
    fn as_any(&self) -> Option<&dyn std::any::Any> {
        None
    }
}

/// What `inspect_locks` found: the service as it answered, and each way its lock tree
/// differs from what the framework sets (empty when none does).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockInspection {
    /// What answered, as whom (never a password).
    pub description: String,
    /// One line per difference, each saying what to do.
    pub problems: Vec<String>,
}

/// Looks at the lock service a URL names without changing it, for `autocomp doctor`: a
/// ZooKeeper is connected to and authenticated with, and its lock tree's ACLs are read and
/// compared with the framework's, not set (as a pass's connection does); a local lock
/// directory is checked to be one this user can make lock files in; a PostgreSQL database is
/// connected to and its lock tables (or this user's right to make them) checked.
pub async fn inspect_locks(url: &str) -> Result<LockInspection, LockError> {
    if let Some(path) = url.strip_prefix("local:") {
        return local::inspect(std::path::Path::new(path));
    }
    if url.starts_with("zk://") || url.starts_with("zks://") {
        return ZkLocks::inspect(url).await;
    }
    if is_postgres(url) {
        return PgLocks::inspect(url).await;
    }
    Err(unknown_scheme(url))
}

fn is_postgres(url: &str) -> bool {
    url.starts_with("postgres://") || url.starts_with("postgresql://")
}

fn unknown_scheme(url: &str) -> LockError {
    let reason = "unknown scheme; expected local:/path/to/locks, zk[s]://host:port[,host:port...]/chroot or \
                  postgres://user@host[:port]/database";
    InvalidInput::new("locks url", autocomp_toolkit::display_url(url), reason).into()
}

/// Opens the lock service a backend URL names: `local:/var/lib/autocomp/locks`, or
/// `zk://host:port[,host:port...]/chroot[?session_timeout=10s&auth_file=/path]`, or `zks://`
/// for TLS (`ca_file=`, optional `cert_file=` and `key_file=`; see [`ZkUrl::parse`]), or
/// `postgres://user@host[:port][,host2...]/database[?lease=10s&...]` (the store's URL options,
/// see [`PgLocksUrl::parse`]). Connects; an unreachable server is `Unavailable`, naming it.
pub async fn open_locks(url: &str) -> Result<Arc<dyn LockService>, LockError> {
    if let Some(path) = url.strip_prefix("local:") {
        if path.is_empty() {
            return Err(InvalidInput::new(
                "locks url",
                autocomp_toolkit::display_url(url),
                "names no directory; write local:/path/to/locks",
            )
            .into());
        }
        return Ok(Arc::new(LocalLocks::new(path)));
    }
    if url.starts_with("zk://") || url.starts_with("zks://") {
        return Ok(Arc::new(ZkLocks::connect(url).await?));
    }
    if is_postgres(url) {
        return Ok(Arc::new(PgLocks::connect(url).await?));
    }
    Err(unknown_scheme(url))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_lock_path_parses_back_from_its_relative_form_and_nothing_else_does() {
        let paths = [
            LockPath::Poll(ComponentName::new("probe").unwrap()),
            LockPath::Batch(ComponentName::new("probe").unwrap(), BatchId::new("B0001").unwrap()),
            LockPath::Slot(PoolName::new("tape").unwrap(), 0),
            LockPath::Slot(PoolName::new("tape").unwrap(), 12),
        ];
        for path in paths {
            assert_eq!(LockPath::parse(&path.relative()), Some(path.clone()), "{}", path.relative());
        }
        assert_eq!(LockPath::Slot(PoolName::new("tape").unwrap(), 3).relative(), "slot/tape/3");
        for junk in [
            "",
            "poll",
            "poll/",
            "poll/a/b",
            "batch/probe",
            "slot/tape",
            "slot/tape/x",
            "slot/tape/01",
            "slot/tape/-1",
            "other/x",
        ] {
            assert_eq!(LockPath::parse(junk), None, "{junk}");
        }
    }
}
