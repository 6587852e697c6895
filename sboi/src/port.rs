//! The batch-index port: "which batches are ready for this trigger". The embedded adapter
//! (`LocalIndex`) opens the index directory in-process and catches up from the store before
//! each query; `HttpIndex` (in `http/`) asks the `sboi` service, which follows the store.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use autocomp_model::{BatchId, InvalidInput, Selection, Seq, Timestamp, Trigger};
use autocomp_store::{ObjectStore, StoreError};

use crate::browse::{Page, PageRequest, Tally};

use crate::document::IndexedBatch;
use crate::engine::{CatchUp, IndexEngine, IndexError, IndexResult};
use crate::http::HttpIndex;

#[async_trait]
pub trait BatchIndex: Send + Sync {
    /// The batches ready for `trigger`, in trigger order, as fresh as the adapter can make
    /// them. The caller re-checks each against the store: the index may lag.
    async fn query(&self, trigger: &Trigger) -> IndexResult<Vec<BatchId>>;

    /// Brings the index up to the store's head (or lets another writer do it).
    async fn catch_up(&self) -> IndexResult<CatchUp>;

    /// Waits, at most `bound`, until `query` would see every store change up to `seq`;
    /// whether it does. A long-lived process woken by a store change asks this first: an
    /// embedded index that another process is writing answers from its last commit, and the
    /// change that woke the caller may not be in it yet.
    async fn covers(&self, seq: Seq, bound: Duration) -> IndexResult<bool>;

    /// Rebuilds the index from the whole store; returns the number of batches indexed.
    async fn rebuild(&self) -> IndexResult<usize>;

    /// What the index holds for one batch as committed now (no catch-up first), if anything:
    /// `explain` sets it beside the store's answer, clause by clause.
    async fn document(&self, id: &BatchId) -> IndexResult<Option<IndexedBatch>>;

    /// Each selection's size (and with `quietest` the last activity of its quietest batch),
    /// as fresh as `query`: the monitor's counts, from the index, never a store scan.
    async fn tally(&self, selections: &[Selection], quietest: bool) -> IndexResult<Vec<Tally>>;

    /// One page of a selection, in the request's order after its cursor, as fresh as `query`.
    async fn page(&self, request: &PageRequest) -> IndexResult<Page>;
}

/// The embedded index: a tantivy directory on this host, caught up in-process.
pub struct LocalIndex {
    engine: IndexEngine,
    store: Arc<dyn ObjectStore>,
}

impl LocalIndex {
    pub fn new(engine: IndexEngine, store: Arc<dyn ObjectStore>) -> Self {
        Self { engine, store }
    }

    pub fn engine(&self) -> &IndexEngine {
        &self.engine
    }
}

#[async_trait]
impl BatchIndex for LocalIndex {
    async fn query(&self, trigger: &Trigger) -> IndexResult<Vec<BatchId>> {
        // A busy writer elsewhere is fine: it is catching up for us, and the runner
        // re-checks every candidate against the store anyway.
        self.engine.catch_up(self.store.as_ref()).await?;
        // Embedded means same host as the store file, so this clock is the store's clock.
        self.engine.query_at(trigger, Timestamp::now())
    }

    async fn catch_up(&self) -> IndexResult<CatchUp> {
        self.engine.catch_up(self.store.as_ref()).await
    }

    async fn rebuild(&self) -> IndexResult<usize> {
        self.engine.rebuild(self.store.as_ref()).await
    }

    async fn covers(&self, seq: Seq, bound: Duration) -> IndexResult<bool> {
        // Catching up ourselves covers the head at once; while another process holds the
        // writer, its commits are what we wait for (it commits within milliseconds).
        let deadline = tokio::time::Instant::now() + bound;
        loop {
            match self.engine.catch_up(self.store.as_ref()).await? {
                // Drained the feed after `seq` was read: everything up to it is committed.
                CatchUp::UpToDate { .. } | CatchUp::Applied { .. } => return Ok(true),
                CatchUp::WriterBusy { cursor } if cursor >= seq => return Ok(true),
                CatchUp::WriterBusy { .. } => {}
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
        self.engine.catch_up(self.store.as_ref()).await?;
        self.engine.tally_at(selections, Timestamp::now(), quietest)
    }

    async fn page(&self, request: &PageRequest) -> IndexResult<Page> {
        self.engine.catch_up(self.store.as_ref()).await?;
        self.engine.page_at(request, Timestamp::now())
    }
}

/// Opens the index a backend URL names: `local:/var/lib/autocomp/index`, or the sboi
/// service at `http://host:port[?retry_for=30s]` (which follows the store itself, so
/// `store` is not used then).
pub fn open_index(url: &str, store: Arc<dyn ObjectStore>) -> IndexResult<Arc<dyn BatchIndex>> {
    if let Some(path) = url.strip_prefix("local:") {
        if path.is_empty() {
            return Err(invalid(url, "names no directory; write local:/path/to/index"));
        }
        return Ok(Arc::new(LocalIndex::new(IndexEngine::open(path)?, store)));
    }
    if url.starts_with("http://") || url.starts_with("https://") {
        return Ok(Arc::new(HttpIndex::new(url)?));
    }
    Err(invalid(url, "unknown scheme; expected local:/path/to/index or http://host:port"))
}

fn invalid(url: &str, reason: &str) -> IndexError {
    IndexError::Store(StoreError::Invalid(InvalidInput::new("index url", autocomp_http::display_url(url), reason)))
}
