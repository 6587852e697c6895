//! The batch-index port: "which batches are ready for this trigger", and nothing of its
//! adapters: the embedded one (`LocalIndex`, in `local.rs`) and the one that asks the `sboi`
//! service (`HttpIndex`, in `http/`) implement it, and `open.rs` chooses between them.

use std::time::Duration;

use async_trait::async_trait;
use autocomp_model::{BatchId, Selection, Seq, Trigger};

use crate::browse::{Page, PageRequest, Tally};
use crate::document::IndexedBatch;
use crate::engine::{CatchUp, IndexResult};

#[async_trait]
pub trait BatchIndex: Send + Sync {
    /// The batches ready for `trigger`, in trigger order, as fresh as the adapter can make
    /// them (both adapters: as of the store's head when asked, unless more changed since
    /// the last commit than a query corrects). The caller re-checks each against the store.
    async fn query(&self, trigger: &Trigger) -> IndexResult<Vec<BatchId>>;

    /// `query`, and whether its answer is as fresh as `query` promises. False when a lagging
    /// index answered as it was (the service past the changes it corrects): a watcher then
    /// must not keep the answer as of the head it read. The embedded adapter says true: its
    /// callers ask `covers` first, which is exact for it.
    async fn query_checked(&self, trigger: &Trigger) -> IndexResult<(Vec<BatchId>, bool)> {
        Ok((self.query(trigger).await?, true))
    }

    /// Brings the index up to the store's head (or lets another writer do it).
    async fn catch_up(&self) -> IndexResult<CatchUp>;

    /// Waits, at most `bound`, until `query` would see every store change up to `seq`;
    /// whether it does. A long-lived process woken by a store change asks this first. The
    /// embedded index answers at once while the changes since its last commit are few
    /// enough for a query to correct; past that it catches up, or waits for the process
    /// that holds the writer to commit.
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
