//! Many locks in one write: a claim round's batch locks are created in one `multi` (one
//! zxid, all or nothing) after one round trip of reads that leaves out the busy ones (reads
//! cost no zxid; a refused create, or a `multi` refused for one of its creates, costs one),
//! and releases are deleted in one `multi` after one round trip of ownership reads, those
//! asked for while one is on its way joining the next.

use std::sync::{Arc, Weak};

use futures_util::future::join_all;
use tokio::sync::{mpsc, oneshot};
use tracing::warn;
use zookeeper_client as zk;

use super::protocol::foreign_reason;
use super::session::{Release, Sent, Shared};
use super::{MAX_RETRIES, RETRY_PAUSE};
use crate::locks::LockError;

/// How one `multi` came back: applied, or refused for the op at `index` (nothing applied).
type MultiAnswer = Result<(), (usize, zk::Error)>;

impl Shared {
    /// Creates each of `nodes` (reserved by the caller) that is free, all in one `multi`:
    /// `true` for each one now ours. A busy node found by the reads costs nothing; one
    /// taken between the reads and the `multi` costs that refused `multi` and another.
    pub(super) async fn create_many(&self, nodes: &[&str], data: &[u8]) -> Result<Vec<bool>, LockError> {
        let mut taken = vec![false; nodes.len()];
        let mut pending = self.free_of(nodes, &mut taken).await?;
        let mut resent = false;
        for _ in 0..MAX_RETRIES {
            if pending.is_empty() {
                return Ok(taken);
            }
            let batch: Vec<&str> = pending.iter().map(|&i| nodes[i]).collect();
            let sent = self.send(|client| multi_create(client, &batch, data, self)).await?;
            let answer = match sent {
                Sent::Answered(Ok(answer)) => answer,
                Sent::Answered(Err(e)) => return Err(self.failed("create", batch[0], e)),
                Sent::Interrupted => {
                    resent = true;
                    continue;
                }
            };
            match answer {
                Ok(()) => {
                    pending.drain(..).for_each(|i| taken[i] = true);
                }
                Err((index, zk::Error::NodeExists)) => {
                    let node = batch[index];
                    match self.owner_of(node).await? {
                        // All or nothing: an earlier copy of this very `multi` was applied.
                        Some(stat) if resent && stat.ephemeral_owner == self.session_id => {
                            pending.drain(..).for_each(|i| taken[i] = true);
                        }
                        Some(_) => {
                            pending.remove(index);
                        }
                        None => {} // gone again: create it with the others
                    }
                }
                Err((index, zk::Error::NoNode)) => self.create_parents(batch[index]).await?,
                Err((index, e)) => return Err(self.failed("create", batch[index], e)),
            }
        }
        Err(LockError::Unavailable(format!(
            "cannot create {} lock nodes ({}): they keep changing",
            nodes.len(),
            self.url
        )))
    }

    /// The indexes of `nodes` that do not exist, read in one round trip; a node our session
    /// already owns (an earlier create of ours) is marked taken. A node that is not a lock
    /// is the alarm, before anything is created.
    async fn free_of(&self, nodes: &[&str], taken: &mut [bool]) -> Result<Vec<usize>, LockError> {
        // Every read is sent when its future is first polled: one round trip for all.
        let reads =
            join_all(nodes.iter().map(|&node| self.call(move |client| async move { client.get_data(node).await })));
        let mut free = Vec::new();
        for (index, read) in reads.await.into_iter().enumerate() {
            let (answer, _) = read?;
            match answer {
                Err(zk::Error::NoNode) => free.push(index),
                Err(e) => return Err(self.failed("read", nodes[index], e)),
                Ok((data, stat)) => {
                    if let Some(reason) = foreign_reason(&data, &stat) {
                        return Err(self.foreign(nodes[index], reason));
                    }
                    taken[index] = stat.ephemeral_owner == self.session_id;
                }
            }
        }
        Ok(free)
    }

    /// Deletes `nodes` that our session owns, through the queue served by `serve_releases`
    /// (directly if that task is gone), so concurrent releases share one `multi`.
    pub(super) async fn delete_many(&self, nodes: Vec<String>) -> Result<(), LockError> {
        if nodes.is_empty() {
            return Ok(());
        }
        let (answer, answered) = oneshot::channel();
        let queued = self.releases.get().map(|queue| queue.send(Release { nodes: nodes.clone(), answer }));
        if let Some(Ok(())) = queued
            && let Ok(outcome) = answered.await
        {
            return outcome;
        }
        let nodes: Vec<&str> = nodes.iter().map(String::as_str).collect();
        self.delete_all_if_ours(&nodes).await
    }

    /// Deletes those of `nodes` our session owns in one `multi`, each only at the version
    /// read with its owner (so never a node another session made since). A `multi` refused
    /// because one changed meanwhile, or interrupted, is read again and re-sent.
    async fn delete_all_if_ours(&self, nodes: &[&str]) -> Result<(), LockError> {
        for _ in 0..MAX_RETRIES {
            if self.is_lost() {
                return Ok(()); // gone with the session, or going with it
            }
            let owners = join_all(nodes.iter().map(|&node| self.owner_of(node))).await;
            let mut ours = Vec::new();
            for (&node, owner) in nodes.iter().zip(owners) {
                match owner {
                    Ok(Some(stat)) if stat.ephemeral_owner == self.session_id => ours.push((node, stat.version)),
                    Ok(Some(stat)) => warn!(
                        node,
                        owner = format!("{:#x}", stat.ephemeral_owner),
                        "the lock node is not ours any more; left alone"
                    ),
                    Ok(None) => {}
                    Err(_) if self.is_lost() => return Ok(()),
                    Err(e) => return Err(e),
                }
            }
            if ours.is_empty() {
                return Ok(());
            }
            match self.send(|client| multi_delete(client, &ours)).await {
                Ok(Sent::Answered(Ok(Ok(())))) => return Ok(()),
                Ok(Sent::Answered(Ok(Err((_, zk::Error::NoNode | zk::Error::BadVersion)))) | Sent::Interrupted) => {
                    tokio::time::sleep(RETRY_PAUSE).await;
                }
                Ok(Sent::Answered(Ok(Err((index, e))))) => return Err(self.failed("delete", ours[index].0, e)),
                Ok(Sent::Answered(Err(e))) => return Err(self.failed("delete", ours[0].0, e)),
                Err(_) if self.is_lost() => return Ok(()),
                Err(e) => return Err(e),
            }
        }
        Err(LockError::Unavailable(format!(
            "cannot delete {} lock nodes ({}): they keep changing",
            nodes.len(),
            self.url
        )))
    }
}

/// Serves the release queue until the lock service is gone: whatever was queued while the
/// last `multi` was on its way goes in the next one, and each release is answered with it.
pub(super) fn serve_releases(shared: Weak<Shared>, mut queue: mpsc::UnboundedReceiver<Release>) {
    tokio::spawn(async move {
        while let Some(first) = queue.recv().await {
            let mut batch = vec![first];
            while let Ok(more) = queue.try_recv() {
                batch.push(more);
            }
            let Some(shared) = shared.upgrade() else { return };
            let nodes: Vec<&str> = batch.iter().flat_map(|release| release.nodes.iter().map(String::as_str)).collect();
            let outcome = shared.delete_all_if_ours(&nodes).await;
            drop(nodes);
            for release in batch {
                let _ = release.answer.send(copy_of(&outcome));
            }
            drop(shared);
        }
    });
}

/// The outcome of a shared `multi` for each release in it (a lock error is not `Clone`).
fn copy_of(outcome: &Result<(), LockError>) -> Result<(), LockError> {
    match outcome {
        Ok(()) => Ok(()),
        Err(LockError::Foreign { path, reason }) => {
            Err(LockError::Foreign { path: path.clone(), reason: reason.clone() })
        }
        Err(e) => Err(LockError::Unavailable(e.to_string())),
    }
}

/// One `multi` creating every node of `nodes` as a lock holding `data`.
async fn multi_create(
    client: zk::Client,
    nodes: &[&str],
    data: &[u8],
    shared: &Shared,
) -> Result<MultiAnswer, zk::Error> {
    let options = shared.options(zk::CreateMode::Ephemeral);
    let mut writer = client.new_multi_writer();
    for node in nodes {
        writer.add_create(node, data, &options)?;
    }
    answer_of(writer.commit().await)
}

/// One `multi` deleting every node of `nodes` at its version.
async fn multi_delete(client: zk::Client, nodes: &[(&str, i32)]) -> Result<MultiAnswer, zk::Error> {
    let mut writer = client.new_multi_writer();
    for &(node, version) in nodes {
        writer.add_delete(node, Some(version))?;
    }
    answer_of(writer.commit().await)
}

/// A `multi`'s answer: the request failing (connection trouble, the session) is the outer
/// error, for `send` to handle as any request's; an op refused is the inner one.
fn answer_of(committed: Result<Vec<zk::MultiWriteResult>, zk::MultiWriteError>) -> Result<MultiAnswer, zk::Error> {
    match committed {
        Ok(_) => Ok(Ok(())),
        Err(zk::MultiWriteError::OperationFailed { index, source }) => Ok(Err((index, source))),
        Err(zk::MultiWriteError::RequestFailed { source }) => Err(source),
    }
}

/// Keeps the lock service's queue of releases and the task serving it.
pub(super) fn start_release_queue(shared: &Arc<Shared>) {
    let (queue, served) = mpsc::unbounded_channel();
    if shared.releases.set(queue).is_ok() {
        serve_releases(Arc::downgrade(shared), served);
    }
}
