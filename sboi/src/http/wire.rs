//! The request and answer bodies of the sboi service, shared by the server and `HttpIndex`
//! so the two cannot drift apart. Requests refuse unknown fields: a typo is an error, not a
//! silently ignored setting.

use autocomp_model::{BatchId, Selection, Seq, Trigger};
use serde::{Deserialize, Serialize};

use crate::browse::{Page, Tally};
use crate::document::IndexedBatch;

pub use autocomp_store::http::wire::Empty;

/// Every operation: its name (the path `/v1/<name>`) and whether it writes (needs the token).
/// `catch_up` counts as a read: it only brings the cache to what the store already says.
pub const OPERATIONS: &[(&str, bool)] = &[
    ("query", false),
    ("document", false),
    ("tally", false),
    ("page", false),
    ("catch_up", false),
    ("rebuild", true),
    ("reconcile", true),
];

/// `POST /v1/query`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueryRequest {
    /// As `autocomp_model::Trigger` serializes (the `[trigger]` of a component's config).
    #[serde(deserialize_with = "Trigger::deserialize_object")]
    pub trigger: Trigger,
    /// First bring the index up to the store's head as it is now (bounded; see `stale`).
    #[serde(default = "fresh_by_default")]
    pub fresh: bool,
}

fn fresh_by_default() -> bool {
    true
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueryAnswer {
    /// The ready batches in trigger order (priority descending, then oldest first), limited.
    pub batches: Vec<BatchId>,
    /// Every store change up to this seq was in the index the query read.
    pub indexed_seq: Seq,
    /// The index may miss recent changes: a fresh query could not catch up in its bound (or
    /// reach the store), or a non-fresh query found the index behind the last head it saw.
    pub stale: bool,
}

/// `POST /v1/document`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DocumentRequest {
    pub id: BatchId,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DocumentAnswer {
    /// What the committed index holds for the batch; `null` when it holds nothing.
    pub document: Option<IndexedBatch>,
    pub indexed_seq: Seq,
}

/// `POST /v1/rebuild`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RebuildAnswer {
    /// Batches indexed.
    pub batches: usize,
}

/// `POST /v1/reconcile`.
pub use super::follower::Reconciled as ReconcileAnswer;

/// `POST /v1/tally`: each selection's size and quietest batch.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TallyRequest {
    pub selections: Vec<Selection>,
    /// Also find each selection's quietest batch (a read per selected batch).
    #[serde(default)]
    pub quietest: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TallyAnswer {
    /// One per selection, in the request's order.
    pub tallies: Vec<Tally>,
    pub indexed_seq: Seq,
    pub stale: bool,
}

/// `POST /v1/page`: the request is `crate::PageRequest`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PageAnswer {
    #[serde(flatten)]
    pub page: Page,
    pub indexed_seq: Seq,
    pub stale: bool,
}
