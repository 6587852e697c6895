//! The sboi service's operations, each declared once (`IndexRequest`, `op`), and their
//! request and answer bodies, shared by the server, `HttpIndex` and the OpenAPI document so
//! none can drift. Requests refuse unknown fields: a typo is an error, not a silent default.

use autocomp_model::{BatchId, Selection, Seq, Trigger};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::browse::{Page, PageRequest, Tally};
use crate::document::IndexedBatch;
use crate::engine::CatchUp;

pub use autocomp_store::http::wire::Empty;

autocomp_http::operations! {
    /// A request to the sboi service: one variant per operation, each with its body and the
    /// reply that takes its answer. `catch_up` counts as a read: it only brings the index to
    /// what the store already says.
    pub enum IndexRequest in mod op {
        /// The batches ready for a trigger, in trigger order.
        read query: Query(QueryRequest) -> QueryAnswer;
        /// What the committed index holds for one batch (for `autocomp explain`).
        read document: Document(DocumentRequest) -> DocumentAnswer;
        /// Each selection's size and its quietest batch (a monitor's counts).
        read tally: Tally(TallyRequest) -> TallyAnswer;
        /// One page of a selection, in a stable order after a keyset cursor (a monitor's lists).
        read page: Page(PageRequest) -> PageAnswer;
        /// Brings the index up to the store's head now.
        read catch_up: CatchUp(Empty) -> CatchUp;
        /// Rebuilds the whole index from the store (`autocomp reindex`). Needs the token. Answers when the rebuild is committed; queries meanwhile read the previous index, and changes wait for it. To repair drift without that wait, use /v1/reconcile.
        write rebuild: Rebuild(Empty) -> RebuildAnswer;
        /// Compares every document with the store's batch and repairs what differs. Needs the token.
        write reconcile: Reconcile(Empty) -> ReconcileAnswer;
    }
}

/// Most selections one `/v1/tally` counts (a monitor's overview asks for components x
/// states, well under this).
pub const MAX_SELECTIONS: usize = 1_000;

/// `POST /v1/query`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct QueryRequest {
    /// As `autocomp_model::Trigger` serializes (the `[trigger]` of a component's config).
    #[serde(deserialize_with = "Trigger::deserialize_object")]
    pub trigger: Trigger,
    /// Answer as of the store's head as it is now: the committed index's answer corrected by
    /// the batches changed since its last commit, or, when more changed than a query
    /// corrects, after the index caught up (bounded; see `stale`).
    #[serde(default = "fresh_by_default")]
    pub fresh: bool,
}

fn fresh_by_default() -> bool {
    true
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct QueryAnswer {
    /// The ready batches in trigger order (priority descending, then oldest first), limited.
    pub batches: Vec<BatchId>,
    /// Every store change up to this seq is in the answer: the store's head a fresh query
    /// corrected to, otherwise the cursor of the index it read (which may be ahead of
    /// `/metrics`' `sboi_indexed_seq`: corrections are not indexed).
    pub indexed_seq: Seq,
    /// The answer may miss recent changes: a fresh query could neither correct nor catch up
    /// in its bound (or reach the store), or a non-fresh query found the index behind the
    /// last head it saw.
    pub stale: bool,
    /// Batches changed since the index's last commit that a fresh query evaluated from the
    /// store instead of the index (0 for every other answer).
    #[serde(default)]
    pub corrected: usize,
}

/// `POST /v1/document`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DocumentRequest {
    pub id: BatchId,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct DocumentAnswer {
    /// What the committed index holds for the batch; `null` when it holds nothing.
    pub document: Option<IndexedBatch>,
    pub indexed_seq: Seq,
}

/// `POST /v1/rebuild`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct RebuildAnswer {
    /// Batches indexed.
    pub batches: usize,
}

/// `POST /v1/reconcile`.
pub use super::follower::Reconciled as ReconcileAnswer;

/// `POST /v1/tally`: each selection's size and quietest batch.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TallyRequest {
    /// At most `MAX_SELECTIONS`.
    #[schemars(length(max = MAX_SELECTIONS))]
    pub selections: Vec<Selection>,
    /// Also find each selection's quietest batch (a read per selected batch).
    #[serde(default)]
    pub quietest: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct TallyAnswer {
    /// One per selection, in the request's order.
    pub tallies: Vec<Tally>,
    pub indexed_seq: Seq,
    pub stale: bool,
}

/// `POST /v1/page`: the request is `crate::PageRequest`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct PageAnswer {
    #[serde(flatten)]
    pub page: Page,
    pub indexed_seq: Seq,
    pub stale: bool,
}

/// `GET /health` while the service answers (perhaps from a lagging index: see `index_lag`
/// and `follower_error`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Health {
    /// Always `ok`.
    pub status: String,
    pub indexed_seq: Seq,
    /// The newest store head the service has seen.
    pub store_head_seq: Seq,
    pub index_lag: i64,
    /// The follower's last error, until it next succeeds.
    pub follower_error: Option<String>,
}
