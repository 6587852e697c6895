//! This process's liveness record on ZooKeeper, and the judgement of another's.
//!
//! At connect the service creates ONE ephemeral node, `<root>/live/<session id hex>`, holding
//! the same holder record a lock node holds (so an operator sees who), with the ACL every node
//! of ours gets, before [`ZkLocks::liveness`](super::ZkLocks) can answer `zk:<session id hex>`.
//! `live` itself is persistent (made once, never reaped and made again): a process start costs
//! one write, a claim none; the node goes with the session (closed or expired), in the
//! session's own close transaction.
//!
//! Judging `zk:<sid>` is a `sync` then an `exists` of `live/<sid>`: absent is `Dead` (an
//! expired session never comes back, and a process creates its node before it names it
//! anywhere), present is `Alive`; any other record (another scheme, malformed) is `Unproven`.
//!
//! A process whose own node is deleted behind its back (someone with the pipeline's identity,
//! or anyone when no identity is configured) is judged dead by the others and may see its
//! runs taken over: it publishes its session as `Lost` at once, so it stops as on an expiry.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use tracing::{debug, error};
use zookeeper_client as zk;

use super::LIVE;
use super::protocol::NodeData;
use super::session::{Shared, session_gone};
use crate::locks::{Liveness, LockError, LockHolder, SessionState};

/// The prefix of a ZooKeeper liveness record.
const SCHEME: &str = "zk:";

/// The name of a session's liveness node: its id in lower-case hex, no `0x`.
fn node_name(session_id: i64) -> String {
    format!("{:x}", session_id as u64)
}

/// The liveness record of a session: `zk:<session id hex>`.
pub(super) fn record_of(session_id: i64) -> String {
    format!("{SCHEME}{}", node_name(session_id))
}

/// The session a `zk:` record names, exactly as [`record_of`] writes it; `None` for anything
/// else (another service's record, or a malformed one).
pub(super) fn session_of(record: &str) -> Option<i64> {
    let hex = record.strip_prefix(SCHEME)?;
    let id = u64::from_str_radix(hex, 16).ok()? as i64;
    (node_name(id) == hex).then_some(id)
}

/// What the liveness node holds: who this process is, as a lock node says it.
fn live_data(session_id: i64) -> Vec<u8> {
    let program = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.file_name().map(|name| name.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "autocomp".to_owned());
    let (host, pid) = (crate::hostname(), std::process::id());
    let holder =
        LockHolder { agent: format!("{program}@{host}#{pid}"), host, pid, since: autocomp_model::Timestamp::now() };
    let record = NodeData { holder, session: Some(format!("{session_id:#x}")) };
    serde_json::to_vec(&record).expect("holders serialize")
}

impl Shared {
    /// The absolute path of a session's liveness node.
    fn live_node_of(&self, session_id: i64) -> String {
        self.node_of(&format!("{LIVE}/{}", node_name(session_id)))
    }

    /// Creates this session's liveness node (and `live` if missing), then watches it; the
    /// record the node stands for. A node there that is not ours is the alarm.
    pub(super) async fn create_liveness(self: &Arc<Self>) -> Result<String, LockError> {
        let node = self.live_node_of(self.session_id);
        if !self.create_lock(&node, &live_data(self.session_id)).await? {
            let reason = "a node of another session (or a persistent one) is at this session's liveness node".into();
            return Err(self.foreign(&node, reason));
        }
        watch_own_node(Arc::downgrade(self), node);
        Ok(record_of(self.session_id))
    }

    /// How the process whose record is `record` stands: see the module.
    pub(super) async fn judge_liveness(&self, record: &str) -> Result<Liveness, LockError> {
        let Some(session_id) = session_of(record) else { return Ok(Liveness::Unproven) };
        if session_id == self.session_id && !self.is_lost() {
            return Ok(Liveness::Alive);
        }
        let node = self.live_node_of(session_id);
        let node = node.as_str();
        // A server behind the leader could still miss the node's creation: catch it up first.
        let (synced, _) = self.call(|client| async move { client.sync(node).await }).await?;
        match synced {
            Ok(()) | Err(zk::Error::NoNode) => {}
            Err(e) => return Err(self.failed("sync", node, e)),
        }
        Ok(match self.owner_of(node).await? {
            Some(_) => Liveness::Alive,
            None => Liveness::Dead,
        })
    }
}

/// Watches this session's liveness node until the session ends: deleted behind our back, the
/// others judge us dead, so the session is published `Lost` (work stops as on an expiry).
fn watch_own_node(shared: Weak<Shared>, node: String) {
    tokio::spawn(async move {
        loop {
            let Some(strong) = shared.upgrade() else { return };
            let Ok(client) = strong.client() else { return };
            drop(strong);
            let watcher = match client.check_and_watch_stat(&node).await {
                Ok((Some(_), watcher)) => watcher,
                Ok((None, _)) => return lost_own_node(&shared, &node),
                Err(e) if session_gone(&e) => return,
                Err(e) => {
                    // Connection trouble: look again once the session is back (or gone).
                    debug!(node, "cannot watch the liveness node: {e}");
                    let Some(strong) = shared.upgrade() else { return };
                    if strong.reconnected().await.is_err() {
                        return;
                    }
                    continue;
                }
            };
            drop(client);
            let event = watcher.changed().await;
            match event.event_type {
                zk::EventType::NodeDeleted => return lost_own_node(&shared, &node),
                zk::EventType::Session if event.session_state.is_terminated() => return,
                _ => {} // its data set, or the connection: watch again
            }
        }
    });
}

fn lost_own_node(shared: &Weak<Shared>, node: &str) {
    let Some(shared) = shared.upgrade() else { return };
    if shared.closing.load(Ordering::Relaxed) || shared.is_lost() {
        return;
    }
    error!(
        node,
        "this process's liveness node was deleted by someone else ({}): other hosts now judge it dead and may \
         take its runs over; giving up every lock and cancelling all work",
        shared.url
    );
    shared.state.send_replace(SessionState::Lost);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_names_its_session_exactly_and_nothing_else_is_ours() {
        for session in [0x1_0000_0000_0042_i64, 1, i64::MIN, -2] {
            assert_eq!(session_of(&record_of(session)), Some(session), "{}", record_of(session));
        }
        assert_eq!(record_of(0x72ab_0000_0001), "zk:72ab00000001");
        for foreign in
            ["", "zk:", "zk:0x72ab", "zk:72AB", "zk:072ab", "zk:12345678901234567", "pg:72ab", "local:h:1:2", "72ab"]
        {
            assert_eq!(session_of(foreign), None, "{foreign}");
        }
    }
}
