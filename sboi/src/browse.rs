//! What a monitor asks the index besides triggers: how many batches a selection holds (and
//! how long the quietest has been in it), and one page of them in a stable order with a
//! keyset cursor, so paging a million batches never skips or repeats one and never counts
//! an offset.

use autocomp_model::{BatchId, Selection, Timestamp};
use serde::{Deserialize, Serialize};

/// The most batches one page holds.
pub const MAX_PAGE: usize = 1_000;

/// A selection's size, and the last activity (content change or event) of its quietest
/// batch: "ready for 3 hours" reads off it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Tally {
    pub count: u64,
    pub quietest: Option<Timestamp>,
}

/// Page order: oldest first (registration order), or highest priority first and oldest
/// first within a priority (the order passes claim in).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum PageOrder {
    #[default]
    Oldest,
    Priority,
}

/// Where a page ended: the last batch's sort values. The next page starts after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct PageKey {
    pub priority: i64,
    pub created_seq: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PageRequest {
    pub selection: Selection,
    #[serde(default)]
    pub order: PageOrder,
    #[serde(default)]
    pub after: Option<PageKey>,
    /// At most `MAX_PAGE` (1000); more is cut to it.
    pub limit: usize,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Page {
    pub batches: Vec<BatchId>,
    /// Set when more batches follow: pass it as `after` for the next page.
    pub next: Option<PageKey>,
}
