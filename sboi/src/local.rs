//! The embedded adapter of the batch-index port: the index directory opened in-process,
//! answering from its last commit corrected by the store's change feed. Apart from the port
//! so the port names none of its adapters.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use autocomp_model::{BatchId, Selection, Seq, Timestamp, Trigger};
use autocomp_store::ObjectStore;

use crate::browse::{Page, PageRequest, Tally};
use crate::document::IndexedBatch;
use crate::engine::{CatchUp, IndexEngine, IndexError, IndexResult};
use crate::port::BatchIndex;

/// The embedded index: a tantivy directory on this host. Queries answer fresh from the last
/// commit corrected by the store's change feed (`IndexEngine::query_fresh`), so no commit
/// (nor another process's writer) is on their path; catching up runs after them, in the
/// background, to keep the corrections few.
pub struct LocalIndex {
    engine: Arc<IndexEngine>,
    store: Arc<dyn ObjectStore>,
    /// Held by this process's writes (a background catch-up among them): one at a time, so
    /// they do not refuse each other the directory's writer with `WriterBusy`.
    writing: Arc<tokio::sync::Mutex<()>>,
    /// When this process last started a background catch-up (`catch_up_soon`).
    last_background: std::sync::Mutex<Option<std::time::Instant>>,
}

/// A fresh query correcting this many changes starts a catch-up at once; fewer wait for
/// `BACKGROUND_CATCH_UP_EVERY`. Every process on the host answers fresh, so the index need
/// not be current, only near: a commit per change from each of several watchers would cost
/// the host a writer's setup and several fsyncs per change, for answers no fresher.
const CATCH_UP_AT: usize = 256;
const BACKGROUND_CATCH_UP_EVERY: Duration = Duration::from_secs(1);

impl LocalIndex {
    pub fn new(engine: IndexEngine, store: Arc<dyn ObjectStore>) -> Self {
        Self { engine: Arc::new(engine), store, writing: Arc::default(), last_background: Default::default() }
    }

    pub fn engine(&self) -> &IndexEngine {
        &self.engine
    }

    /// After a fresh query that corrected `corrections` changes: a background catch-up when
    /// they are many, or when this process has not tried one for a while.
    fn catch_up_soon(&self, corrections: usize) {
        if corrections == 0 {
            return;
        }
        let mut last = self.last_background.lock().unwrap_or_else(|p| p.into_inner());
        if corrections < CATCH_UP_AT && last.is_some_and(|at| at.elapsed() < BACKGROUND_CATCH_UP_EVERY) {
            return;
        }
        *last = Some(std::time::Instant::now());
        drop(last);
        self.catch_up_in_background();
    }

    /// Starts a catch-up as a task of the current runtime unless one (or another write of
    /// this process) is running. A failure only leaves the next fresh query more to correct.
    fn catch_up_in_background(&self) {
        let Ok(writing) = Arc::clone(&self.writing).try_lock_owned() else { return };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let (engine, store) = (Arc::clone(&self.engine), Arc::clone(&self.store));
        runtime.spawn(async move {
            let _writing = writing;
            match engine.catch_up(store.as_ref()).await {
                Ok(_) => {}
                // The pass's own store reads report an outage; here it may only be the
                // runtime shutting down under the catch-up (a cancelled store task), which
                // is no news to an operator of a quiet cron pass.
                Err(error @ IndexError::Store(_)) => tracing::debug!("index: background catch-up: {error}"),
                Err(error) => tracing::warn!("index: background catch-up: {error}"),
            }
        });
    }

    /// Catches up after any write of this process.
    async fn catch_up_now(&self) -> IndexResult<CatchUp> {
        let _writing = self.writing.lock().await;
        self.engine.catch_up(self.store.as_ref()).await
    }
}

#[async_trait]
impl BatchIndex for LocalIndex {
    async fn query(&self, trigger: &Trigger) -> IndexResult<Vec<BatchId>> {
        // Embedded means same host as the store file, so this clock is the store's clock.
        if let Some(answer) = self.engine.query_fresh(self.store.as_ref(), trigger, Timestamp::now()).await? {
            self.catch_up_soon(answer.corrections);
            return Ok(answer.batches);
        }
        // Too much to correct: catch up first, as before fresh queries. A busy writer
        // elsewhere is fine: it is catching up for us, and the runner re-checks every
        // candidate against the store anyway.
        self.catch_up_now().await?;
        self.engine.query_at(trigger, Timestamp::now())
    }

    async fn catch_up(&self) -> IndexResult<CatchUp> {
        self.catch_up_now().await
    }

    async fn rebuild(&self) -> IndexResult<usize> {
        let _writing = self.writing.lock().await;
        self.engine.rebuild(self.store.as_ref()).await
    }

    async fn covers(&self, seq: Seq, bound: Duration) -> IndexResult<bool> {
        // A fresh query corrects whatever changed since the last commit, within a bound: it
        // covers the head at once, whoever holds the writer.
        // (The query that follows starts a catch-up if its corrections call for one.)
        if self.engine.fresh_through(self.store.as_ref()).await?.is_some_and(|through| through >= seq) {
            return Ok(true);
        }
        // Past the bound: catching up ourselves covers the head at once; while another
        // process holds the writer, its commits are what we wait for.
        let deadline = tokio::time::Instant::now() + bound;
        loop {
            match self.catch_up_now().await? {
                // Drained the feed after `seq` was read: everything up to it is committed.
                CatchUp::UpToDate { .. } | CatchUp::Applied { .. } => return Ok(true),
                CatchUp::WriterBusy { cursor } if cursor >= seq => return Ok(true),
                CatchUp::WriterBusy { .. } => {}
            }
            if self.engine.fresh_through(self.store.as_ref()).await?.is_some_and(|through| through >= seq) {
                return Ok(true);
            }
            if tokio::time::Instant::now() >= deadline {
                return Ok(false);
            }
            tokio::time::sleep(Duration::from_millis(5).min(deadline - tokio::time::Instant::now())).await;
        }
    }

    async fn document(&self, id: &BatchId) -> IndexResult<Option<IndexedBatch>> {
        self.engine.get(id)
    }

    async fn tally(&self, selections: &[Selection], quietest: bool) -> IndexResult<Vec<Tally>> {
        self.catch_up_now().await?;
        self.engine.tally_at(selections, Timestamp::now(), quietest)
    }

    async fn page(&self, request: &PageRequest) -> IndexResult<Page> {
        self.catch_up_now().await?;
        self.engine.page_at(request, Timestamp::now())
    }
}
