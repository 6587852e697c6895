//! The batch index (SBOI): answers "which batches are ready for this component" without
//! scanning every log. One tantivy document per batch, built from the store's effective
//! view, kept fresh by following the store's change feed with the cursor committed in the
//! index itself. Trigger semantics are the store's `Trigger`; this crate only translates.
//! `sboi serve` (`http/`, `src/bin/sboi.rs`) puts one index on HTTP for many hosts.

mod bitsets;
mod browse;
mod document;
mod engine;
pub mod http;
mod local;
mod open;
mod port;
mod query;

pub use browse::{MAX_PAGE, Page, PageKey, PageOrder, PageRequest, Tally};
pub use document::{IndexedBatch, SCHEMA_VERSION};
pub use engine::{
    CatchUp, Corrections, Drift, EngineOptions, FreshAnswer, IndexEngine, IndexError, IndexResult, MAX_CORRECTIONS,
    Repaired,
};
pub use http::HttpIndex;
pub use local::LocalIndex;
pub use open::open_index;
pub use port::BatchIndex;
pub use query::BlockedBy;
