//! The lock protocol on the session: a lock is one ephemeral node holding its holder's
//! record; taking it is a read then one create (its container parents made on demand),
//! waiting a data watch, releasing a delete after an ownership check. A node that is not a
//! lock is foreign.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use tracing::{debug, error, warn};
use zookeeper_client as zk;

use super::session::{Sent, Shared};
use super::{IN_PROCESS_PAUSE, MAX_RETRIES, parent_of};
use crate::locks::{LockError, LockHolder, SessionState};

/// What we store in a lock node: the holder, and the session that created the node (so a
/// copy of another lock's data under a node of some other session is told apart).
#[derive(Serialize, Deserialize)]
pub(super) struct NodeData {
    #[serde(flatten)]
    pub(super) holder: LockHolder,
    /// `0x...`; absent in nodes of releases that did not write it (then not checked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) session: Option<String>,
}

/// Why a node at a lock path is not a lock a lock service made, if it is not: such a node
/// is an alarm (someone or something else wrote there), not a busy lock.
pub(super) fn foreign_reason(data: &[u8], stat: &zk::Stat) -> Option<String> {
    if stat.ephemeral_owner == 0 {
        return Some("a persistent node: no session owns it, so it never goes away by itself".into());
    }
    let Ok(record) = serde_json::from_slice::<NodeData>(data) else {
        return Some(format!("its data ({} bytes) is not a lock holder record", data.len()));
    };
    let owner = format!("{:#x}", stat.ephemeral_owner);
    match record.session {
        Some(session) if session != owner => {
            Some(format!("its record names session {session}, but session {owner} owns the node"))
        }
        _ => None,
    }
}

/// A lock node as a taker found it.
enum Look {
    Absent,
    Present { data: Vec<u8>, stat: zk::Stat, watcher: Option<zk::OneshotWatcher> },
}

/// How long a waiter that lost races for a node pauses after the next release before it
/// looks again: a random share of `spread`, which starts at nothing (the first waiter to be
/// woken creates at once, as the only waiter does) and doubles with every loss up to
/// `HERD_SPREAD_MAX`. N waiters losing to each other spread out to roughly N create latencies.
#[derive(Default)]
struct Herd {
    spread: Duration,
}

/// The first spread after a lost race, and the most it grows to.
const HERD_SPREAD_MIN: Duration = Duration::from_millis(5);
const HERD_SPREAD_MAX: Duration = Duration::from_millis(500);

impl Herd {
    fn lost(&mut self) {
        self.spread = (self.spread * 2).clamp(HERD_SPREAD_MIN, HERD_SPREAD_MAX);
    }

    async fn pause(&self, deadline: Instant) {
        if self.spread.is_zero() {
            return;
        }
        let pause = self.spread.mul_f64(random_share());
        tokio::time::sleep_until(deadline.min(Instant::now() + pause)).await;
    }
}

/// A number in [0, 1), different in every call (std's hasher keys are random per instance):
/// no random crate for a jitter.
fn random_share() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher
        .write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos());
    (hasher.finish() >> 11) as f64 / (1u64 << 53) as f64
}

impl Shared {
    /// One ephemeral create at `node`: `true` if it is ours, `false` if someone else's.
    pub(super) async fn create_lock(&self, node: &str, data: &[u8]) -> Result<bool, LockError> {
        let mut resent = false;
        for _ in 0..MAX_RETRIES {
            let (answer, retried) = self
                .call(|client| async move { client.create(node, data, &self.options(zk::CreateMode::Ephemeral)).await })
                .await?;
            resent |= retried;
            match answer {
                Ok(_) => return Ok(true),
                Err(zk::Error::NodeExists) if resent => {
                    // An earlier copy of our create may have been applied: the owner says.
                    let (stat, _) = self.call(|client| async move { client.check_stat(node).await }).await?;
                    match stat.map_err(|e| self.failed("read", node, e))? {
                        Some(stat) => return Ok(stat.ephemeral_owner == self.session_id),
                        None => continue,
                    }
                }
                Err(zk::Error::NodeExists) => return Ok(false),
                Err(zk::Error::NoNode) => self.create_parents(node).await?,
                Err(e) => return Err(self.failed("create", node, e)),
            }
        }
        Err(LockError::Unavailable(format!("cannot create {node} ({}): its parent keeps disappearing", self.url)))
    }

    /// Creates the missing container ancestors of `node`, the chroot included. Another
    /// process creating one first is fine; the server deleting an emptied one meanwhile makes
    /// us go up and create it again.
    pub(super) async fn create_parents(&self, node: &str) -> Result<(), LockError> {
        let mut pending = vec![parent_of(node)];
        let mut created = 0;
        for _ in 0..MAX_RETRIES {
            let Some(&dir) = pending.last() else {
                debug!(node, created, "created the lock's container parents");
                return Ok(());
            };
            let (answer, _) = self
                .call(|client| async move { client.create(dir, &[], &self.options(self.mode_of_parent(dir))).await })
                .await?;
            match answer {
                Ok(_) => {
                    created += 1;
                    pending.pop();
                }
                Err(zk::Error::NodeExists) => {
                    pending.pop();
                }
                // ZooKeeper checks the parent's ACL before whether the node exists: under a
                // parent closed to us (`setAcl / world:anyone:r`) an existing chroot is NoAuth.
                Err(zk::Error::NoAuth) if self.owner_of(dir).await?.is_some() => {
                    pending.pop();
                }
                Err(zk::Error::NoNode) if parent_of(dir) != "/" => pending.push(parent_of(dir)),
                Err(e) => return Err(self.failed("create", dir, e)),
            }
        }
        Err(LockError::Unavailable(format!("cannot create the parents of {node} ({})", self.url)))
    }

    /// The node's owner, or `None` if it does not exist.
    pub(super) async fn owner_of(&self, node: &str) -> Result<Option<zk::Stat>, LockError> {
        let (stat, _) = self.call(|client| async move { client.check_stat(node).await }).await?;
        stat.map_err(|e| self.failed("read", node, e))
    }

    /// Deletes `node` if our session owns it. A delete interrupted by connection trouble is
    /// not re-sent as is: ownership is read again first (the node may be gone and re-created
    /// by another worker since).
    pub(super) async fn delete_if_ours(&self, node: &str) -> Result<(), LockError> {
        if self.is_lost() {
            // Gone with the session, or going with it: asking a silent server only waits.
            return Ok(());
        }
        for _ in 0..MAX_RETRIES {
            let stat = match self.owner_of(node).await {
                Ok(Some(stat)) => stat,
                Ok(None) => return Ok(()),
                Err(_) if self.is_lost() => return Ok(()), // gone with the session
                Err(e) => return Err(e),
            };
            if stat.ephemeral_owner != self.session_id {
                warn!(
                    node,
                    owner = format!("{:#x}", stat.ephemeral_owner),
                    "the lock node is not ours any more; left alone"
                );
                return Ok(());
            }
            let version = Some(stat.version);
            match self.send(|client| async move { client.delete(node, version).await }).await {
                Ok(Sent::Answered(Ok(()) | Err(zk::Error::NoNode))) => return Ok(()),
                Ok(Sent::Answered(Err(zk::Error::BadVersion)) | Sent::Interrupted) => continue,
                Ok(Sent::Answered(Err(e))) => return Err(self.failed("delete", node, e)),
                Err(_) if self.is_lost() => return Ok(()),
                Err(e) => return Err(e),
            }
        }
        Err(LockError::Unavailable(format!("cannot delete {node} ({}): it keeps changing", self.url)))
    }

    /// Children of `<root>/<relative>`; none if it does not exist.
    pub(super) async fn children(&self, relative: &str) -> Result<Vec<String>, LockError> {
        let node = self.node_of(relative);
        let node = node.as_str();
        let (children, _) = self.call(|client| async move { client.list_children(node).await }).await?;
        match children {
            Ok(children) => Ok(children),
            Err(zk::Error::NoNode) => Ok(Vec::new()),
            Err(e) => Err(self.failed("list", node, e)),
        }
    }

    /// Takes the lock at `node` for a task that reserved it, waiting until `deadline`. The
    /// node is read before any create: a read costs no zxid where a refused create costs one,
    /// so passes finding the lock busy write nothing, and the same read sets the watch a
    /// waiter waits on. A waiter woken by a release that has lost a race for the node before
    /// (its create refused) first pauses a random share of a spread that doubles with each
    /// loss: a crowd of waiters spreads its creates out instead of all but one being refused.
    pub(super) async fn take(
        &self,
        node: &str,
        data: &[u8],
        deadline: Instant,
        reserved: &mut bool,
    ) -> Result<bool, LockError> {
        let mut herd = Herd::default();
        loop {
            if self.is_lost() {
                return Err(self.lost());
            }
            if !*reserved {
                *reserved = self.reserve(node);
            }
            let waiting = Instant::now() < deadline;
            if !*reserved && !waiting {
                return Ok(false); // another task of ours holds or is taking it: no request at all
            }
            let watcher = match self.look(node, waiting).await? {
                Look::Absent if *reserved => {
                    if self.create_lock(node, data).await? {
                        return Ok(true);
                    }
                    herd.lost();
                    continue; // created by someone else first: read (and watch) it again
                }
                Look::Absent => None, // another task of ours is taking it
                Look::Present { data, stat, watcher } => {
                    if let Some(reason) = foreign_reason(&data, &stat) {
                        return Err(self.foreign(node, reason));
                    }
                    if *reserved && stat.ephemeral_owner == self.session_id {
                        return Ok(true); // an earlier create of ours was applied
                    }
                    watcher
                }
            };
            if !waiting {
                return Ok(false);
            }
            if self.wait_for_change(watcher, deadline, *reserved).await {
                herd.pause(deadline).await;
            }
        }
    }

    /// The node as it is now (read with a watch on it if `watch`), or `Absent`.
    async fn look(&self, node: &str, watch: bool) -> Result<Look, LockError> {
        let answer = if watch {
            let (answer, _) = self.call(|client| async move { client.get_and_watch_data(node).await }).await?;
            answer.map(|(data, stat, watcher)| Look::Present { data, stat, watcher: Some(watcher) })
        } else {
            let (answer, _) = self.call(|client| async move { client.get_data(node).await }).await?;
            answer.map(|(data, stat)| Look::Present { data, stat, watcher: None })
        };
        match answer {
            Ok(look) => Ok(look),
            Err(zk::Error::NoNode) => Ok(Look::Absent),
            Err(e) => Err(self.failed("read", node, e)),
        }
    }

    /// Waits for the watched node to change (or the deadline, or the session's loss); `true`
    /// when the node changed. Without a watch (another task of ours holds or is taking the
    /// node, which may end with no node event: a reservation only), looks again soon.
    async fn wait_for_change(&self, watcher: Option<zk::OneshotWatcher>, deadline: Instant, reserved: bool) -> bool {
        let changed = async {
            match watcher {
                Some(watcher) => drop(watcher.changed().await),
                None => std::future::pending().await,
            }
        };
        let mut state = self.state.subscribe();
        tokio::select! {
            _ = changed => true,
            _ = tokio::time::sleep_until(deadline) => false,
            _ = state.wait_for(|s| *s == SessionState::Lost) => false,
            _ = tokio::time::sleep(IN_PROCESS_PAUSE), if !reserved => false,
        }
    }

    /// The alarm for a node at a lock path that is not a lock.
    pub(super) fn foreign(&self, node: &str, reason: String) -> LockError {
        let path = node.strip_prefix(&self.root).unwrap_or(node).trim_start_matches('/').to_owned();
        error!(node, "{reason}: not a lock of autocomp's; it needs a person ({})", self.url);
        LockError::Foreign { path, reason: format!("{reason} ({node} on {})", self.url) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    pub(super) fn a_node_is_foreign_when_persistent_not_a_holder_record_or_another_sessions() {
        let stat = |owner: i64| zk::Stat {
            czxid: 1,
            mzxid: 1,
            pzxid: 1,
            ctime: 0,
            mtime: 0,
            version: 0,
            cversion: 0,
            aversion: 0,
            ephemeral_owner: owner,
            data_length: 0,
            num_children: 0,
        };
        let holder =
            LockHolder { agent: "probe/1@h#1".into(), host: "h".into(), pid: 1, since: autocomp_model::Timestamp(0) };
        let record = |session: Option<&str>| {
            serde_json::to_vec(&NodeData { holder: holder.clone(), session: session.map(str::to_owned) }).unwrap()
        };
        assert_eq!(foreign_reason(&record(Some("0x2a")), &stat(0x2a)), None);
        assert_eq!(foreign_reason(&record(None), &stat(0x2a)), None, "a node of an older release");
        assert!(foreign_reason(&record(Some("0x2a")), &stat(0)).unwrap().contains("persistent"));
        assert!(foreign_reason(b"junk", &stat(0x2a)).unwrap().contains("not a lock holder record"));
        assert!(foreign_reason(&record(Some("0x2a")), &stat(0x2b)).unwrap().contains("names session 0x2a"));
        // What an older release reads of ours: the holder, the session ignored.
        let read: LockHolder = serde_json::from_slice(&record(Some("0x2a"))).unwrap();
        assert_eq!(read, holder);
    }
}
