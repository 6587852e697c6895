//! The follower: keeps the service's index directory caught up with the store. It catches
//! up, then long-polls the store until its head moves, so the index trails an append by
//! about one catch-up; a periodic full rebuild (reconcile) repairs any drift. Errors are
//! logged and retried with backoff, never fatal. One catch-up or rebuild at a time.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use autocomp_store::{ObjectStore, Seq};
use tokio::sync::{Notify, watch};

use crate::engine::{CatchUp, IndexEngine, IndexResult};

/// How long one long poll on the store waits before the follower asks again. Short enough
/// that a follower whose store vanished without closing the connection notices soon.
const LONG_POLL: Duration = Duration::from_secs(10);
/// While another process holds the index writer, how often to look at what it committed.
const WRITER_BUSY_PAUSE: Duration = Duration::from_millis(250);
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// How far the index has come, as this service knows it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Progress {
    /// Every store change up to this seq is in the committed index.
    pub indexed_seq: Seq,
    /// The newest store head this service has seen.
    pub store_head: Seq,
}

impl Progress {
    /// Store head seq minus indexed seq, as last seen.
    pub fn lag(&self) -> i64 {
        self.store_head.0.saturating_sub(self.indexed_seq.0).max(0)
    }
}

pub struct Follower {
    engine: IndexEngine,
    store: Arc<dyn ObjectStore>,
    /// tantivy allows one writer per directory; taking this first keeps this process's
    /// catch-ups and rebuilds from refusing each other with `WriterBusy`.
    writer: tokio::sync::Mutex<()>,
    progress: watch::Sender<Progress>,
    /// Wakes the follower out of its long poll when a fresh query needs it now.
    wake: Notify,
    last_error: Mutex<Option<String>>,
}

impl Follower {
    pub fn new(engine: IndexEngine, store: Arc<dyn ObjectStore>) -> IndexResult<Arc<Self>> {
        let committed = engine.committed_cursor()?;
        let progress = Progress { indexed_seq: committed, store_head: committed };
        Ok(Arc::new(Self {
            engine,
            store,
            writer: tokio::sync::Mutex::new(()),
            progress: watch::Sender::new(progress),
            wake: Notify::new(),
            last_error: Mutex::new(None),
        }))
    }

    pub fn engine(&self) -> &IndexEngine {
        &self.engine
    }

    pub fn store(&self) -> &dyn ObjectStore {
        self.store.as_ref()
    }

    pub fn progress(&self) -> Progress {
        *self.progress.borrow()
    }

    /// The follower's last error, until it next succeeds (for `/health`).
    pub fn last_error(&self) -> Option<String> {
        self.last_error.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn set_error(&self, error: Option<String>) {
        *self.last_error.lock().unwrap_or_else(|p| p.into_inner()) = error;
    }

    /// Records a store head read elsewhere (a fresh query, `/metrics`).
    pub fn saw_head(&self, head: Seq) {
        self.progress.send_if_modified(|p| {
            let newer = head > p.store_head;
            p.store_head = p.store_head.max(head);
            newer
        });
    }

    fn indexed_through(&self, indexed: Seq, head: Seq) {
        self.progress.send_modify(|p| {
            p.indexed_seq = p.indexed_seq.max(indexed);
            p.store_head = p.store_head.max(head).max(p.indexed_seq);
        });
    }

    /// One catch-up, after any running in this process. The answer's cursor is the seq up
    /// to which every change is indexed: the head read before the feed was drained, or the
    /// committed cursor while another process holds the writer.
    pub async fn catch_up(&self) -> IndexResult<CatchUp> {
        let _writer = self.writer.lock().await;
        self.catch_up_holding_writer().await
    }

    /// `catch_up`, unless a catch-up or rebuild holds the writer for longer than `bound`:
    /// then `WriterBusy` with what is indexed so far, as when another process writes.
    pub async fn catch_up_within(&self, bound: Duration) -> IndexResult<CatchUp> {
        match tokio::time::timeout(bound, self.writer.lock()).await {
            Ok(_writer) => self.catch_up_holding_writer().await,
            Err(_) => Ok(CatchUp::WriterBusy { cursor: self.progress().indexed_seq }),
        }
    }

    async fn catch_up_holding_writer(&self) -> IndexResult<CatchUp> {
        // Read before draining the feed: every change up to it is then in the index.
        let head = self.store.head().await?;
        let outcome = self.engine.catch_up(self.store.as_ref()).await?;
        let indexed = match outcome {
            CatchUp::WriterBusy { cursor } => cursor,
            done => done.cursor().max(head),
        };
        self.indexed_through(indexed, head);
        Ok(match outcome {
            CatchUp::UpToDate { .. } => CatchUp::UpToDate { cursor: indexed },
            CatchUp::Applied { batches, .. } => CatchUp::Applied { batches, cursor: indexed },
            busy @ CatchUp::WriterBusy { .. } => busy,
        })
    }

    /// Rebuilds the index from the whole store, after any catch-up running in this process.
    pub async fn rebuild(&self) -> IndexResult<usize> {
        let _writer = self.writer.lock().await;
        let head = self.store.head().await?;
        let batches = self.engine.rebuild(self.store.as_ref()).await?;
        // The rebuild drains the feed after listing, so it covers at least `head`.
        self.indexed_through(self.engine.committed_cursor()?.max(head), head);
        Ok(batches)
    }

    /// Waits until the index holds every change up to `target`, for at most `bound`; waking
    /// the follower so it does not finish a long poll first. False if the bound passed.
    pub async fn wait_until_indexed(&self, target: Seq, bound: Duration) -> bool {
        let mut progress = self.progress.subscribe();
        if progress.borrow().indexed_seq >= target {
            return true;
        }
        self.wake.notify_one();
        matches!(tokio::time::timeout(bound, progress.wait_for(|p| p.indexed_seq >= target)).await, Ok(Ok(_)))
    }

    /// Follows the store for ever: catch up, then sleep in a long poll until the head moves
    /// past what is indexed (or a fresh query wakes it). Errors (a store restarting, a full
    /// disk) are logged and retried with backoff.
    pub async fn follow(self: Arc<Self>) {
        let mut backoff = FIRST_BACKOFF;
        loop {
            let indexed = match self.catch_up().await {
                Ok(CatchUp::WriterBusy { cursor }) => {
                    tracing::debug!(%cursor, "another process holds the index writer; reading what it commits");
                    tokio::select! {
                        _ = tokio::time::sleep(WRITER_BUSY_PAUSE) => {}
                        _ = self.wake.notified() => {}
                    }
                    continue;
                }
                Ok(outcome) => {
                    if let CatchUp::Applied { batches, cursor } = outcome {
                        tracing::debug!(batches, %cursor, "caught up");
                    }
                    outcome.cursor()
                }
                Err(error) => {
                    backoff = self.failed("catching up", &error.to_string(), backoff).await;
                    continue;
                }
            };
            tokio::select! {
                head = self.store.wait_for_change(indexed, LONG_POLL) => match head {
                    Ok(head) => {
                        self.saw_head(head);
                        self.set_error(None);
                        backoff = FIRST_BACKOFF;
                    }
                    Err(error) => backoff = self.failed("waiting for store changes", &error.to_string(), backoff).await,
                },
                _ = self.wake.notified() => {}
            }
        }
    }

    /// Logs a failure, pauses for `backoff`, and returns the next backoff.
    async fn failed(&self, doing: &str, error: &str, backoff: Duration) -> Duration {
        tracing::warn!(retry_in = ?backoff, "follower: {doing}: {error}");
        self.set_error(Some(format!("{doing}: {error}")));
        tokio::time::sleep(backoff).await;
        (backoff * 2).min(MAX_BACKOFF)
    }

    /// Rebuilds the index every `every`, starting one period from now: whatever drift the
    /// change feed could not repair (a document written by a buggy release, a hand-edited
    /// store) lasts at most one period.
    pub async fn reconcile_every(self: Arc<Self>, every: Duration) {
        let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            let started = std::time::Instant::now();
            match self.rebuild().await {
                Ok(batches) => tracing::info!(batches, elapsed = ?started.elapsed(), "reconciled: rebuilt the index"),
                Err(error) => tracing::warn!("reconcile: rebuilding the index: {error}; next try in {every:?}"),
            }
        }
    }

    /// Waits up to `bound` for a catch-up or rebuild in progress to commit, and keeps the
    /// follower from starting another while the guard lives: a stopping service then leaves
    /// no half-applied page to redo (harmless, but wasted).
    pub async fn quiesce(&self, bound: Duration) -> Option<tokio::sync::MutexGuard<'_, ()>> {
        let guard = tokio::time::timeout(bound, self.writer.lock()).await.ok();
        if guard.is_none() {
            tracing::warn!("stopping while the index is still being written; the next start re-applies that page");
        }
        guard
    }
}
