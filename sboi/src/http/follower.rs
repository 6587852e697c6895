//! The follower: keeps the service's index directory caught up with the store. It catches
//! up, then long-polls the store until its head moves, so the index trails an append by
//! about one catch-up; a periodic reconcile compares the whole index with the store, page by
//! page, and repairs any drift, taking the writer only to fix a page. Errors are logged and
//! retried with backoff, never fatal. One write at a time, with the engine's one writer.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use autocomp_model::Seq;
use autocomp_store::ObjectStore;
use tokio::sync::{Notify, watch};

use crate::engine::{CatchUp, IndexEngine, IndexError, IndexResult, Repaired};

/// How long one long poll on the store waits before the follower asks again. Short enough
/// that a follower whose store vanished without closing the connection notices soon.
const LONG_POLL: Duration = Duration::from_secs(10);
/// While another process holds the index writer, how often to look at what it committed.
const WRITER_BUSY_PAUSE: Duration = Duration::from_millis(250);
/// Batches a reconcile reads per store request: each such read delays the catch-ups that
/// share the store service meanwhile (at 5,000, by hundreds of milliseconds).
const RECONCILE_PAGE: usize = 500;
/// A reconcile rests this many times as long as each page took: it is a background check,
/// and at full speed it doubled the index lag's p99 on two cores.
const RECONCILE_REST: u32 = 2;
/// After a catch-up that indexed something, the follower waits this long (or until a fresh
/// query needs it) before the next one, so that under a stream of commits the index commits a
/// few times a second, each commit taking every change since, instead of once per store
/// commit: a 20/s trickle through four steps is 180 store commits a second, and committing
/// (and merging) each took `sboi serve` 60% of a core on a 2-core host. A fresh query
/// corrects the committed index with the changes since (`max_corrections`), and one that
/// must wait for the index (`freshen`) wakes the follower, so fresh answers do not wait for
/// this; `/v1/document`, queries sent with `fresh: false` and the lag gauges trail by up to
/// this much more.
const COALESCE_COMMITS: Duration = Duration::from_millis(100);
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

/// What one reconcile did (`POST /v1/reconcile` answers with it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct Reconciled {
    /// Batches of the store compared with their documents.
    pub checked: usize,
    /// Documents that differed from their batch (or were missing), written again.
    pub rewritten: usize,
    /// Documents of batches the store does not have, deleted.
    pub deleted: usize,
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
                        tokio::select! {
                            _ = tokio::time::sleep(COALESCE_COMMITS) => {}
                            _ = self.wake.notified() => {}
                        }
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

    /// Compares every document with the store's batch and fixes what differs, one
    /// `list_summaries` page at a time: the comparison reads the committed index without the
    /// writer, and only a page with differences takes it, briefly, so catch-ups go on
    /// meanwhile. A document newer than the page's batch (a catch-up got there first) is left
    /// alone; documents of batches the store no longer lists are deleted.
    pub async fn reconcile(self: &Arc<Self>) -> IndexResult<Reconciled> {
        let page_size = self.engine.page_size().min(RECONCILE_PAGE);
        let mut reconciled = Reconciled::default();
        let mut after = None;
        loop {
            let page_started = tokio::time::Instant::now();
            let listed_after = self.store.head().await?;
            let page = self.store.list_summaries(after.as_ref(), page_size).await?;
            let to_end = page.len() < page_size;
            let last = page.last().map(|batch| batch.id.clone());
            reconciled.checked += page.len();
            // Reading a page of documents is CPU work: off the runtime's threads, which
            // serve queries and catch-ups meanwhile.
            let drift = {
                let (follower, after) = (Arc::clone(self), after.clone());
                tokio::task::spawn_blocking(move || follower.engine.drift(page, after.as_ref(), to_end, listed_after))
                    .await
                    .map_err(|e| IndexError::Index {
                        dir: self.engine.dir().to_path_buf(),
                        message: format!("comparing with the store: {e}"),
                    })??
            };
            // What this page cost, without any wait for the writer below.
            let worked = page_started.elapsed();
            if !drift.is_empty() {
                let _writer = self.writer.lock().await;
                let Repaired { rewritten, deleted } = self.engine.repair(drift).await?;
                if rewritten + deleted > 0 {
                    tracing::info!(rewritten, deleted, after = ?after, "reconcile: repaired documents that differed from the store");
                }
                reconciled.rewritten += rewritten;
                reconciled.deleted += deleted;
            }
            if to_end {
                return Ok(reconciled);
            }
            after = last;
            // Background work: rest twice as long as the page's reads took, so the walk takes
            // at most a third of the time of the cores it shares with catch-ups and queries.
            tokio::time::sleep(worked * RECONCILE_REST).await;
        }
    }

    /// Reconciles every `every`, starting one period from now: whatever drift the change
    /// feed could not repair (a document written by a buggy release, a hand-edited index)
    /// lasts at most one period.
    pub async fn reconcile_every(self: Arc<Self>, every: Duration) {
        let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            let started = std::time::Instant::now();
            match self.reconcile().await {
                Ok(Reconciled { checked, rewritten, deleted }) => {
                    tracing::info!(checked, rewritten, deleted, elapsed = ?started.elapsed(), "reconciled the index with the store")
                }
                Err(error) => tracing::warn!("reconcile: {error}; next try in {every:?}"),
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
