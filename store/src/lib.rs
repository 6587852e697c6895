//! The object store: the source of truth of an autocomp pipeline.
//!
//! It owns the `ObjectStore` port every other crate talks to (a trait per concern, `prelude`
//! for all of them), the rules every write obeys (`write_rules`) and the checks every SQL
//! backend gets once (`Checked`), its adapters (the embedded SQLite file, PostgreSQL, and
//! `HttpStore`, the client of the store service), the store service that puts any backend on
//! HTTP, and `open_store`, which picks an adapter by URL. The data it keeps is `autocomp_model`'s.
//! Nothing here knows about indexes, locks or components.

mod checked;
mod error;
pub mod http;
mod open;
pub mod pipeline_state;
pub mod port;
pub mod postgres;
mod series;
pub mod sqlite;
mod steering_rules;
mod wake_history;
mod write_rules;

pub use checked::Checked;
pub use http::HttpStore;
pub use open::{max_request_bytes, open_store, open_store_to_serve};
pub use pipeline_state::{CURSOR_UNSET, CursorMove, Enqueued, NewNotice, Notice, NoticeOutcome, Steered};
pub use port::ready_claims::{ReadyAnswer, ReadyClaimRequest, ReadyClaims, Takeover};
pub use port::{
    AnnouncementMark, BatchHead, BatchHistory, BatchListing, BatchStore, Cancellation, ChangePage, Claim,
    CreateOutcome, DEFAULT_MAX_BATCH_BYTES, HandOnNotice, HandOnStore, HandedOn, LogCursor, LogPage, MAX_LOG_PAGE,
    MAX_RETENTION_PAGE, MAX_RUN_OUTPUTS, ObjectStore, OutboxStore, PruneAnswer, PruneTicket, RegisteredHandingOn,
    RegistryStore, RestoreAnswer, RetentionStore, RunOutputStore, SavedRunOutput, SeriesStore, SteeringStore,
    StoreAbout, StoreError, StoreResult, TakerOffer,
};
pub use postgres::{PgOptions, PgStore};
pub use sqlite::{
    BackupFacts, LATEST_VERSION as LATEST_SCHEMA_VERSION, SqliteOptions, SqliteStore, Synchronous,
    backup_file as backup_sqlite_file,
};
pub use write_rules::{MIN_MAX_BATCH_BYTES, parse_max_batch_bytes};

/// The store's traits, for callers that hold an `ObjectStore` and call its operations:
/// `use autocomp_store::prelude::*;` brings every concern's methods into scope.
pub mod prelude {
    pub use crate::port::{
        BatchStore, HandOnStore, ObjectStore, OutboxStore, RegistryStore, RetentionStore, RunOutputStore, SeriesStore,
        SteeringStore,
    };
}
