//! ZooKeeper locks, selected by `zk://host:port[,host:port...]/chroot` (or `zks://` for TLS):
//! the URL's syntax, the pipeline's ZooKeeper identity and the ACL of every node we create.
//!
//! A lock is ONE ephemeral node at `<chroot>/poll/<component>`,
//! `<chroot>/batch/<component>/<batch-id>` or `<chroot>/slot/<pool>/<index>` (a resource
//! pool's slot) whose data is the JSON `LockHolder` plus the session id that created it. Its
//! parents are container nodes, created on demand (another process creating them first, or
//! the server removing an emptied one meanwhile, is expected), which the server deletes once
//! empty; the chroot itself (and any ancestor we create) is a
//! persistent node, so once made it cannot be taken over by whoever re-creates it first.
//! Try-lock reads the node first, then creates it if absent: a node there means busy, unless
//! it is not one a lock service made (persistent, foreign data, or a record naming another
//! session than its owner): that is `LockError::Foreign`, an alarm, never "busy". The read
//! costs no zxid where a refused create costs one, so passes finding a lock busy write nothing.
//! Waiting is a data watch on the node until the deadline; a waiter that lost a race for the
//! node backs off (a random pause, doubling with each loss) before the next one. Release checks
//! the node is still ours, then deletes it. A lock cycle is so two ZooKeeper writes (create +
//! delete), on a fresh path too, plus one container create for each missing parent. A round of
//! batch locks (`try_lock_many`) is one `multi` of creates, one write however many; releases
//! go through a queue that deletes all those asked for meanwhile in one `multi`.
//!
//! Identity and ACLs: with `auth_file=` (or `$AUTOCOMP_ZK_AUTH`) the session adds one digest
//! identity per `user:password` line, and every node we create carries `auth` (each of those
//! identities) with all rights plus `world:anyone` read, so only the pipeline's identities can
//! create, change or delete under the chroot (ZooKeeper checks a delete against the parent's
//! ACL: the containers' ACL is what protects a lock). At connect the chroot, `poll`, `batch`,
//! `slot`, each `batch/<component>` and each `slot/<pool>` are brought to that ACL (our
//! identities added, the world left read only), and a persistent child, `<chroot>/anchor`, is
//! kept under the chroot: never empty, the chroot cannot be deleted (and made again by someone
//! else as theirs) even where its parent lets the world delete children, and only our
//! identities may delete the anchor. A chroot whose parent lets anyone without an identity
//! create or delete children (`world:anyone` or an `ip:` entry with c or d, as `/` is by
//! ZooKeeper's default) is refused as a configuration error naming the two ways out: a chroot
//! one level down, whose parent we make with our ACL, or `setAcl` on the parent. Without an
//! identity nodes stay open to anyone, as before, with one warning.
//!
//! A create or delete whose reply is lost with the connection may or may not have happened.
//! A create is retried once the session is back, and a NodeExists after such a retry is
//! resolved by the node's `ephemeral_owner`: our session id means we hold it. A delete is never
//! retried blindly: ownership is read again first, so we can never delete another's lock.
//!
//! The session state is published for the runner: Disconnected => Suspended,
//! SyncConnected => Connected, Expired / Closed / AuthFailed => Lost (every lock is gone),
//! and Suspended for longer than a client-side deadline below the session timeout => Lost.
//! `close` deletes whatever is still held and closes the session, so nothing lingers after
//! the process exits.
//!
//! Liveness: at connect the session creates one ephemeral node `<chroot>/live/<session id
//! hex>` (its holder record, our ACL; `live` is persistent), and its record `zk:<session id
//! hex>` is what runs name; another process judges it by a `sync` and an `exists` (absent:
//! dead). One write per process start, none per claim; `held` never lists `live`.
//!
//! The rooms, each using only the ones before it: `tls` (`zks://`'s files and why a server
//! is not trusted), `url` (the URL's syntax), `identity` (the pipeline's digest identities),
//! `session` (the connection, its state and the requests that survive connection trouble),
//! `protocol` (the lock nodes: take, watch, release), `liveness` (the process's liveness node,
//! and the judgement of another's), `many` (many locks in one `multi`: a round's creates, the
//! release queue's deletes) and `acl` (the lock tree's ACLs and the chroot's anchor). This
//! file holds the lock service itself.

mod acl;
mod identity;
mod liveness;
mod many;
mod protocol;
mod session;
mod tls;
mod url;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use async_trait::async_trait;
use futures_util::future::join_all;
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{debug, warn};
use zookeeper_client as zk;

use super::{HeldLock, Liveness, Lock, LockError, LockHolder, LockPath, LockService, SessionState};
use protocol::{NodeData, foreign_reason};
use session::{LOST_SESSION_GRACE_SHARE, Shared, session_gone};
pub use tls::ZkTls;
pub use url::ZkUrl;

/// The session timeout when the URL does not say `?session_timeout=...`.
pub const DEFAULT_SESSION_TIMEOUT: Duration = Duration::from_secs(10);

/// Where the pipeline's ZooKeeper identity comes from when the URL names no `auth_file`:
/// `user:password` (several identities one per line, as in the file).
pub const AUTH_ENV: &str = "AUTOCOMP_ZK_AUTH";

/// How often one request is re-sent after connection trouble before giving up.
const MAX_RETRIES: u32 = 50;

/// Pause before re-sending after connection trouble (the session state may lag the error).
const RETRY_PAUSE: Duration = Duration::from_millis(10);

/// Re-check interval while another task of this process holds or is taking the same path.
const IN_PROCESS_PAUSE: Duration = Duration::from_millis(10);

/// How long `close` waits for each deletion and for the server to end the session.
const CLOSE_WAIT: Duration = Duration::from_secs(3);

/// The persistent directory of the liveness nodes, under the chroot; never a lock's.
const LIVE: &str = "live";

/// The ZooKeeper lock service: one session per process.
pub struct ZkLocks {
    shared: Arc<Shared>,
    /// This session's liveness record (`zk:<session id hex>`), once its node is made;
    /// `None` for a connection that changes nothing (`inspect`).
    live: Option<String>,
}

impl ZkLocks {
    /// Connects and opens the session (over TLS for `zks://`, authenticated with the
    /// identities of `auth_file` or `$AUTOCOMP_ZK_AUTH` if either is set); fails (naming the
    /// servers) if no session is established within the session timeout. With an identity,
    /// also creates the chroot and brings the ACLs of the lock tree's directories to ours.
    /// Then creates the session's liveness node (see `liveness`): one write.
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        let mut locks = Self::connect_only(url).await?;
        let shared = Arc::clone(&locks.shared);
        let made = async {
            if shared.identity.is_some() {
                shared.protect_tree().await?;
            }
            shared.create_liveness().await
        };
        match made.await {
            Ok(record) => {
                locks.live = Some(record);
                Ok(locks)
            }
            Err(e) => {
                locks.close().await;
                Err(e)
            }
        }
    }

    /// Connects (and authenticates) as `connect` does, but changes nothing in the lock tree,
    /// then says how its directories' ACLs differ from what `connect` would set them to:
    /// what `autocomp doctor` reports. The session is closed before it answers.
    pub async fn inspect(url: &str) -> Result<super::LockInspection, LockError> {
        let locks = Self::connect_only(url).await?;
        let found = locks.shared.inspect_tree().await;
        locks.close().await;
        let problems = found?;
        let shared = &locks.shared;
        let identity = match &shared.identity {
            Some(source) => {
                let users: Vec<&str> =
                    shared.digests.iter().filter_map(|d| d.split_once(':').map(|(u, _)| u)).collect();
                format!("as {} ({source})", users.join(", "))
            }
            None => "with no identity".to_owned(),
        };
        Ok(super::LockInspection {
            description: format!("ZooKeeper {} answered {identity}; lock tree {}", shared.url, shared.root),
            problems,
        })
    }

    async fn connect_only(url: &str) -> Result<Self, LockError> {
        let shared = Shared::connect(url).await?;
        many::start_release_queue(&shared);
        Ok(Self { shared, live: None })
    }

    /// Our session id (the `ephemeral_owner` of every node we hold).
    pub fn session_id(&self) -> i64 {
        self.shared.session_id
    }

    /// The absolute node path of a lock.
    pub fn node_of(&self, path: &LockPath) -> String {
        self.shared.node_of(&path.relative())
    }
}

/// The node a node is under (`/` for a top-level one).
fn parent_of(node: &str) -> &str {
    match node.rfind('/') {
        Some(0) | None => "/",
        Some(i) => &node[..i],
    }
}

#[async_trait]
impl LockService for ZkLocks {
    async fn try_lock(
        &self,
        path: &LockPath,
        holder: &LockHolder,
        wait: Duration,
    ) -> Result<Option<Box<dyn Lock>>, LockError> {
        let shared = &self.shared;
        let node = shared.node_of(&path.relative());
        let record = NodeData { holder: holder.clone(), session: Some(format!("{:#x}", shared.session_id)) };
        let data = serde_json::to_vec(&record).expect("holders serialize");
        let mut reserved = false;
        let taken = shared.take(&node, &data, Instant::now() + wait, &mut reserved).await;
        match taken {
            Ok(true) => Ok(Some(Box::new(ZkLock { path: path.clone(), node, shared: Arc::clone(shared) }))),
            outcome => {
                if reserved {
                    shared.unreserve(&node);
                }
                outcome.map(|_| None)
            }
        }
    }

    /// A waiting `try_lock` watches the node and tries again when it is deleted.
    fn waiters_told_at_release(&self) -> bool {
        true
    }

    /// An ephemeral node is there: one read at the server the session is connected to (no
    /// `sync`: a stale answer only moves a deferring watcher's look to its next retry, or lets
    /// it look once for nothing). A node that is no session's is not a lock at all: `None`, so
    /// the pass that tries it reports it (`LockError::Foreign`).
    async fn is_held(&self, path: &LockPath) -> Result<Option<bool>, LockError> {
        let node = self.shared.node_of(&path.relative());
        Ok(match self.shared.owner_of(&node).await? {
            None => Some(false),
            Some(stat) if stat.ephemeral_owner != 0 => Some(true),
            Some(_) => None,
        })
    }

    /// The paths another task of ours holds or is taking are busy without a request; the
    /// others are read in one round trip, and the free ones created in one `multi`.
    async fn try_lock_many(
        &self,
        paths: &[LockPath],
        holder: &LockHolder,
    ) -> Result<Vec<Option<Box<dyn Lock>>>, LockError> {
        let shared = &self.shared;
        if shared.is_lost() {
            return Err(shared.lost());
        }
        let record = NodeData { holder: holder.clone(), session: Some(format!("{:#x}", shared.session_id)) };
        let data = serde_json::to_vec(&record).expect("holders serialize");
        let nodes: Vec<String> = paths.iter().map(|path| shared.node_of(&path.relative())).collect();
        let mine: Vec<usize> = (0..nodes.len()).filter(|&i| shared.reserve(&nodes[i])).collect();
        let asked: Vec<&str> = mine.iter().map(|&i| nodes[i].as_str()).collect();
        let created = shared.create_many(&asked, &data).await;
        let mut answers: Vec<Option<Box<dyn Lock>>> = paths.iter().map(|_| None).collect();
        let created = match created {
            Ok(created) => created,
            Err(e) => {
                mine.iter().for_each(|&i| shared.unreserve(&nodes[i]));
                return Err(e);
            }
        };
        for (&i, taken) in mine.iter().zip(created) {
            if taken {
                let node = nodes[i].clone();
                answers[i] = Some(Box::new(ZkLock { path: paths[i].clone(), node, shared: Arc::clone(shared) }));
            } else {
                shared.unreserve(&nodes[i]);
            }
        }
        Ok(answers)
    }

    /// This service's own locks in one `multi` (shared with releases asked for meanwhile);
    /// any other lock by its own `release`.
    async fn release_many(&self, locks: Vec<Box<dyn Lock>>) -> Result<(), LockError> {
        let shared = &self.shared;
        let (ours, others): (Vec<_>, Vec<_>) =
            locks.into_iter().partition(|lock| zk_lock(lock.as_ref()).is_some_and(|l| Arc::ptr_eq(&l.shared, shared)));
        let nodes: Vec<String> =
            ours.iter().filter_map(|lock| zk_lock(lock.as_ref())).map(|l| l.node.clone()).collect();
        drop(ours);
        let (deleted, released) =
            tokio::join!(shared.delete_many(nodes.clone()), join_all(others.into_iter().map(|lock| lock.release())));
        nodes.iter().for_each(|node| shared.unreserve(node));
        deleted.and(released.into_iter().collect())
    }

    async fn held(&self) -> Result<Vec<HeldLock>, LockError> {
        let shared = &self.shared;
        let mut paths: Vec<String> = shared.children("poll").await?.into_iter().map(|c| format!("poll/{c}")).collect();
        // Two levels under each: `batch/<component>/<batch-id>`, `slot/<pool>/<index>`.
        for parent in ["batch", "slot"] {
            for child in shared.children(parent).await? {
                let under = format!("{parent}/{child}");
                paths.extend(shared.children(&under).await?.into_iter().map(|leaf| format!("{under}/{leaf}")));
            }
        }
        // Every read is sent when its future is made: one round trip for all of them.
        let client = shared.client()?;
        let reads: Vec<_> = paths.iter().map(|path| client.get_data(&shared.node_of(path))).collect();
        let mut held = Vec::with_capacity(paths.len());
        for (path, read) in paths.into_iter().zip(reads) {
            match read.await {
                Ok((data, stat)) => held.push(HeldLock {
                    holder: LockHolder::from_record(&data).ok(),
                    foreign: foreign_reason(&data, &stat),
                    path,
                }),
                Err(zk::Error::NoNode) => {} // released meanwhile
                Err(e) if session_gone(&e) => return Err(shared.lost()),
                Err(e) => return Err(shared.failed("read", &shared.node_of(&path), e)),
            }
        }
        held.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(held)
    }

    fn session(&self) -> watch::Receiver<SessionState> {
        self.shared.state.subscribe()
    }

    /// A session given up at 0.75 of its timeout leaves a quarter of it before the server
    /// expires it: cancelled work gets a tenth, not `cancel_grace`.
    fn lost_session_grace(&self) -> Option<Duration> {
        Some(self.shared.session_timeout.mul_f64(LOST_SESSION_GRACE_SHARE))
    }

    fn keeps_liveness(&self) -> bool {
        true
    }

    /// `zk:<session id hex>` while the session lasts (its node goes with it); `None` once it
    /// is lost or its close has begun: this client never opens another session, and the
    /// process exits.
    fn liveness(&self) -> Option<String> {
        let shared = &self.shared;
        self.live.clone().filter(|_| !shared.closing.load(Ordering::Relaxed) && !shared.is_lost())
    }

    /// A `sync`, then whether the record's node exists (see `liveness`).
    async fn judge_liveness(&self, record: &str) -> Result<Liveness, LockError> {
        self.shared.judge_liveness(record).await
    }

    async fn close(&self) {
        let shared = &self.shared;
        if *shared.state.borrow() == SessionState::Lost {
            // Expired, or given up on because the server went silent: there is nothing to
            // delete or to wait for (the server drops our nodes with the session).
            shared.closing.store(true, Ordering::Relaxed);
            shared.client.lock().expect("never poisoned").take();
            return;
        }
        let nodes: Vec<String> = shared.reserved.lock().expect("never poisoned").drain().collect();
        for node in &nodes {
            match tokio::time::timeout(CLOSE_WAIT, shared.delete_if_ours(node)).await {
                Ok(Ok(())) => debug!(node, "deleted a lock still held at close"),
                Ok(Err(e)) => warn!(node, "cannot delete a lock at close: {e}"),
                Err(_) => warn!(node, "cannot delete a lock at close: no answer within {CLOSE_WAIT:?}"),
            }
        }
        shared.closing.store(true, Ordering::Relaxed);
        // None: another close took the client and is ending the session.
        let client = shared.client.lock().expect("never poisoned").take();
        if let Some(client) = client {
            let mut watcher = client.state_watcher();
            // The session is closed when the last clone of the client is gone; wait for the
            // server's answer, so a process exiting right after leaves nothing behind.
            drop(client);
            if !watcher.peek_state().is_terminated() {
                let closed = async { while !watcher.changed().await.is_terminated() {} };
                if tokio::time::timeout(CLOSE_WAIT, closed).await.is_err() {
                    warn!("the ZooKeeper session did not close within {CLOSE_WAIT:?}; its nodes go with its timeout");
                }
            }
        }
        // The session task says so too, but later: a caller sees the session over on return.
        shared.state.send_replace(SessionState::Lost);
    }
}

struct ZkLock {
    path: LockPath,
    node: String,
    shared: Arc<Shared>,
}

#[async_trait]
impl Lock for ZkLock {
    fn path(&self) -> &LockPath {
        &self.path
    }

    /// The node exists and our session owns it.
    async fn still_held(&self) -> Result<bool, LockError> {
        if self.shared.is_lost() {
            return Ok(false);
        }
        match self.shared.owner_of(&self.node).await {
            Ok(stat) => Ok(stat.is_some_and(|stat| stat.ephemeral_owner == self.shared.session_id)),
            Err(_) if self.shared.is_lost() => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Through the release queue: released with whatever other tasks release meanwhile.
    async fn release(self: Box<Self>) -> Result<(), LockError> {
        let deleted = self.shared.delete_many(vec![self.node.clone()]).await;
        self.shared.unreserve(&self.node);
        deleted
    }

    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }
}

/// The lock as one of ZooKeeper's, if it is one.
fn zk_lock(lock: &dyn Lock) -> Option<&ZkLock> {
    lock.as_any().and_then(|any| any.downcast_ref::<ZkLock>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parents_go_up_to_the_root() {
        assert_eq!(parent_of("/autocomp/batch/probe/B1"), "/autocomp/batch/probe");
        assert_eq!(parent_of("/autocomp"), "/");
    }
}
