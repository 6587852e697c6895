//! The lock protocol on the session: a lock is one ephemeral node holding its holder's
//! record; taking it is one create (its container parents made on demand), waiting a data
//! watch, releasing a delete after an ownership check. A node that is not a lock is foreign.

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

    /// Takes the lock at `node` for a task that reserved it, waiting until `deadline`.
    pub(super) async fn take(
        &self,
        node: &str,
        data: &[u8],
        deadline: Instant,
        reserved: &mut bool,
    ) -> Result<bool, LockError> {
        loop {
            if self.is_lost() {
                return Err(self.lost());
            }
            if !*reserved {
                *reserved = self.reserve(node);
            }
            if *reserved && self.create_lock(node, data).await? {
                return Ok(true);
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(false);
            }
            // Busy: unless the node is not a lock at all, wait for the holder's node to go (or
            // the deadline).
            let (watched, _) = self.call(|client| async move { client.get_and_watch_data(node).await }).await?;
            let watcher = match watched {
                Err(zk::Error::NoNode) if *reserved => continue, // gone already: create again
                Err(zk::Error::NoNode) => None,                  // another task of ours is taking it
                Err(e) => return Err(self.failed("watch", node, e)),
                Ok((data, stat, watcher)) => {
                    if let Some(reason) = foreign_reason(&data, &stat) {
                        return Err(self.foreign(node, reason));
                    }
                    if *reserved && stat.ephemeral_owner == self.session_id {
                        return Ok(true);
                    }
                    Some(watcher)
                }
            };
            let changed = async {
                match watcher {
                    Some(watcher) => drop(watcher.changed().await),
                    None => std::future::pending().await,
                }
            };
            let mut state = self.state.subscribe();
            tokio::select! {
                _ = changed => {}
                _ = tokio::time::sleep_until(deadline) => {}
                _ = state.wait_for(|s| *s == SessionState::Lost) => {}
                // Another task of ours holds or is taking it: it may be gone without a node
                // event (a reservation only), so look again soon.
                _ = tokio::time::sleep(IN_PROCESS_PAUSE), if !*reserved => {}
            }
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
