//! The object store: the source of truth of an autocomp pipeline.
//!
//! It owns the data model (batches, their append-only event logs, claims), the one pure
//! definition of trigger semantics, the `ObjectStore` port every other crate talks to, and the
//! embedded SQLite backend behind it, and the store service that puts any backend on HTTP
//! with the `HttpStore` client that reaches it. Nothing here knows about indexes, locks or components.

pub mod http;
pub mod logging;
pub mod model;
pub mod port;
pub mod postgres;
pub mod sqlite;
mod write_rules;

pub use http::HttpStore;
pub use model::*;
pub use port::{
    Cancellation, ChangePage, Claim, CreateOutcome, ObjectStore, StoreError, StoreResult, display_url, open_store,
};
pub use postgres::{PgOptions, PgStore};
pub use sqlite::{LATEST_VERSION as LATEST_SCHEMA_VERSION, SqliteOptions, SqliteStore, Synchronous};
