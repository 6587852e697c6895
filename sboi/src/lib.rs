//! The batch index (SBOI): answers "which batches are ready for this component" fast, by
//! following the object store's change feed. The tantivy engine arrives with issue #3; until
//! then this crate holds the place in the dependency chain `store <- sboi <- framework`.

pub use autocomp_store as store;
