//! The lock port: try-locks on `poll/<component>` and
//! `batch/<component>/<batch-id>`, each naming its holder, plus the lock service's session
//! state so the runner can hold commits while disconnected and stop when the session is lost.
//! Adapters: `local` (flock files; the OS frees them on death) and `zk` (one ephemeral
//! ZooKeeper node per lock; the server frees them when the session ends).

mod local;
mod zk;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use autocomp_model::{BatchId, ComponentName, InvalidInput, Timestamp};
use serde::{Deserialize, Serialize};

pub use local::LocalLocks;
pub use zk::{DEFAULT_SESSION_TIMEOUT, ZkLocks, ZkUrl};

/// What is locked. Both parts are validated names, so the path is safe as file and node name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum LockPath {
    /// One poller per component across all hosts.
    Poll(ComponentName),
    /// One worker per (component, batch) across all hosts.
    Batch(ComponentName, BatchId),
}

impl LockPath {
    /// `poll/<component>` or `batch/<component>/<batch-id>`.
    pub fn relative(&self) -> String {
        match self {
            LockPath::Poll(component) => format!("poll/{component}"),
            LockPath::Batch(component, batch) => format!("batch/{component}/{batch}"),
        }
    }
}

/// Who holds a lock, stored with it so operators can see who holds what.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockHolder {
    pub agent: String,
    pub host: String,
    pub pid: u32,
    pub since: Timestamp,
}

/// A lock someone holds right now, as `autocomp locks` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldLock {
    pub path: String,
    pub holder: Option<LockHolder>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionState {
    Connected,
    /// Disconnected, session possibly still alive: start nothing new, hold commits.
    Suspended,
    /// The session is gone and every lock with it: record nothing, exit.
    Lost,
}

#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error(transparent)]
    Invalid(#[from] InvalidInput),
    #[error("lock service unavailable: {0}")]
    Unavailable(String),
}

#[async_trait]
pub trait LockService: Send + Sync {
    /// Takes the lock if free, waiting up to `wait` for it; `None` if still busy then.
    async fn try_lock(
        &self,
        path: &LockPath,
        holder: &LockHolder,
        wait: Duration,
    ) -> Result<Option<Box<dyn Lock>>, LockError>;

    /// Every lock held right now.
    async fn held(&self) -> Result<Vec<HeldLock>, LockError>;

    /// The session's state, as it changes.
    fn session(&self) -> tokio::sync::watch::Receiver<SessionState>;

    /// Once the session is lost, how long cancelled work may still run before the process
    /// must be gone: after that another host may hold the locks. `None`: no limit of the
    /// lock service's own (locks that never expire behind our back).
    fn lost_session_grace(&self) -> Option<std::time::Duration> {
        None
    }

    /// Ends the session at process exit: deletes every lock still held and closes the
    /// connection, so nothing lingers after the process is gone. Nothing works afterwards.
    async fn close(&self) {}
}

#[async_trait]
pub trait Lock: Send + Sync {
    fn path(&self) -> &LockPath;

    /// Whether we still hold it (checked before every commit).
    async fn still_held(&self) -> Result<bool, LockError>;

    async fn release(self: Box<Self>) -> Result<(), LockError>;
}

/// Opens the lock service a backend URL names: `local:/var/lib/autocomp/locks`, or
/// `zk://host:port[,host:port...]/chroot[?session_timeout=10s]` (connects; an unreachable
/// ZooKeeper is `Unavailable`, naming the servers).
pub async fn open_locks(url: &str) -> Result<Arc<dyn LockService>, LockError> {
    if let Some(path) = url.strip_prefix("local:") {
        if path.is_empty() {
            return Err(InvalidInput::new("locks url", url, "names no directory; write local:/path/to/locks").into());
        }
        return Ok(Arc::new(LocalLocks::new(path)));
    }
    if url.starts_with("zk://") {
        return Ok(Arc::new(ZkLocks::connect(url).await?));
    }
    let reason = "unknown scheme; expected local:/path/to/locks or zk://host:port[,host:port...]/chroot";
    Err(InvalidInput::new("locks url", url, reason).into())
}
