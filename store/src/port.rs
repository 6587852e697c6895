//! The object store's port: every operation the rest of autocomp may perform on the source of
//! truth, one trait per concern (`BatchStore`, `RegistryStore`, `SteeringStore`, `OutboxStore`,
//! `SeriesStore`, `RunOutputStore`, `RetentionStore`, `HandOnStore`, each in its own module), the umbrella `ObjectStore` a caller holds all of them
//! by, and the values they take and answer. Async because its distributed adapter is an HTTP
//! client and its callers run on tokio; the embedded SQLite adapter runs its blocking work off
//! the async threads.

/// Declares one concern's trait and, from the same lines, its `Checked` impl: a method's
/// `#[checked(...)]` statements run before the call is handed to the backend, so an
/// operation's bound and input checks are declared with it and the wrapper needs no line of
/// its own.
macro_rules! port_trait {
    ($(#[$meta:meta])* pub trait $trait:ident $(: $sup:ident)? { $($methods:tt)* }) => {
        port_trait!(@munch [$(#[$meta])* $(#[supertrait($sup)])?] $trait [] [] $($methods)*);
    };
    (@munch [$($meta:tt)*] $trait:ident [$($declared:tt)*] [$($checked:tt)*]) => {
        port_trait!(@emit [$($meta)*] [] $trait [$($declared)*] [$($checked)*]);
    };
    (@emit [#[supertrait($sup:ident)] $($meta:tt)*] [$($kept:tt)*] $trait:ident [$($declared:tt)*] [$($checked:tt)*]) => {
        port_trait!(@emit [$($meta)*] [$($kept)*] $trait [$($declared)*] [$($checked)*] $sup);
    };
    (@emit [#[$first:meta] $($meta:tt)*] [$($kept:tt)*] $trait:ident [$($declared:tt)*] [$($checked:tt)*] $($sup:ident)?) => {
        port_trait!(@emit [$($meta)*] [$($kept)* #[$first]] $trait [$($declared)*] [$($checked)*] $($sup)?);
    };
    (@emit [] [$($meta:tt)*] $trait:ident [$($declared:tt)*] [$($checked:tt)*] $($sup:ident)?) => {
        $($meta)*
        #[async_trait::async_trait]
        pub trait $trait: Send + Sync $(+ $sup)? {
            $($declared)*
        }

        #[async_trait::async_trait]
        impl<S: $trait> $trait for crate::checked::Checked<S> {
            $($checked)*
        }
    };
    (@munch [$($meta:tt)*] $trait:ident [$($declared:tt)*] [$($checked:tt)*]
        $(#[doc = $doc:literal])*
        $(#[checked($($check:tt)*)])?
        async fn $name:ident(&$self:ident $(, $arg:ident: $ty:ty)* $(,)?) -> $ret:ty;
        $($rest:tt)*
    ) => {
        port_trait!(@munch [$($meta)*] $trait
            [$($declared)* $(#[doc = $doc])* async fn $name(&$self $(, $arg: $ty)*) -> $ret;]
            [$($checked)* async fn $name(&$self $(, $arg: $ty)*) -> $ret {
                $($($check)*;)?
                <S as $trait>::$name(&$self.inner $(, $arg)*).await
            }]
            $($rest)*);
    };
    (@munch [$($meta:tt)*] $trait:ident [$($declared:tt)*] [$($checked:tt)*]
        $(#[doc = $doc:literal])*
        $(#[checked($($check:tt)*)])?
        async fn $name:ident(&$self:ident $(, $arg:ident: $ty:ty)* $(,)?) -> $ret:ty $default:block
        $($rest:tt)*
    ) => {
        port_trait!(@munch [$($meta)*] $trait
            [$($declared)* $(#[doc = $doc])* async fn $name(&$self $(, $arg: $ty)*) -> $ret $default]
            [$($checked)* async fn $name(&$self $(, $arg: $ty)*) -> $ret {
                $($($check)*;)?
                <S as $trait>::$name(&$self.inner $(, $arg)*).await
            }]
            $($rest)*);
    };
}

mod batches;
pub(crate) mod hand_on;
mod outbox;
pub(crate) mod ready_claims;
mod registry;
pub(crate) mod retention;
pub(crate) mod run_outputs;
mod series;
mod steering;

pub use batches::BatchStore;
pub use hand_on::{HandOnNotice, HandOnStore, HandedOn, MAX_HAND_ONS, RegisteredHandingOn, TakerOffer};
pub use outbox::OutboxStore;
pub use registry::RegistryStore;
pub use retention::{BatchHistory, MAX_RETENTION_PAGE, PruneAnswer, PruneTicket, RestoreAnswer, RetentionStore};
pub use run_outputs::{MAX_RUN_OUTPUTS, RunOutputStore, SavedRunOutput};
pub use series::SeriesStore;
pub use steering::SteeringStore;

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use autocomp_model::{
    Batch, BatchFacts, BatchId, BatchSummary, ComponentName, Event, EventType, InvalidInput, Run, Seq, Timestamp,
};

pub use crate::error::{StoreError, StoreResult};

#[derive(Debug, Clone, PartialEq)]
pub enum CreateOutcome {
    Created(Batch),
    /// An identical batch was already registered; nothing changed.
    AlreadyExists(Batch),
}

impl CreateOutcome {
    pub fn batch(&self) -> &Batch {
        match self {
            CreateOutcome::Created(b) | CreateOutcome::AlreadyExists(b) => b,
        }
    }
}

/// A store's description of itself (`ObjectStore::about`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct StoreAbout {
    /// The backend holding the data: `sqlite` or `postgres` (behind the store service, the
    /// service's backend).
    pub backend: String,
    /// The schema version the store is at.
    pub schema_version: i64,
    /// The schema version the release that opened it needs (behind the store service, the
    /// service's release).
    pub schema_wanted: i64,
    /// The store's clock when it answered, in milliseconds since the epoch: what stamps the
    /// registry's passes and the work series.
    pub clock: Timestamp,
}

/// Where a store handle's announcements of commits stood before a read
/// (`BatchStore::announcement_mark`): every commit that read did not see is announced after
/// it. Meaningful only to the handle that gave it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AnnouncementMark(pub(crate) u64);

/// A fresh claim: the generation to fence the result with, and the run it superseded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Claim {
    pub run: Run,
    /// The previous run if it was still open: its holder died or stalled, and is now fenced.
    pub abandoned: Option<Run>,
}

impl Claim {
    pub fn generation(&self) -> i64 {
        self.run.generation
    }
}

/// What an operator's `cancel_run` did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Cancellation {
    /// The failure it recorded, flagged `cancelled`.
    pub event: Event,
    /// The run it closed (now `cancelled`) and fenced, if one was open.
    pub run: Option<Run>,
}

/// One page of the change feed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ChangePage {
    /// Batches changed after the requested seq, each once, in order of their latest change.
    pub changes: Vec<(Seq, BatchId)>,
    /// Where to continue from: the last listed change, or `head` once the feed is exhausted.
    pub next: Seq,
    /// The newest seq in the store when the page was read.
    pub head: Seq,
}

/// Most events one page of a batch's log holds (`ObjectStore::log_page`).
pub const MAX_LOG_PAGE: usize = 1_000;

/// The default cap on a batch's stored bytes (`max_batch_bytes`): 64 MiB.
pub const DEFAULT_MAX_BATCH_BYTES: u64 = 64 * 1024 * 1024;

/// A batch without its log: everything the operator's views show and explain besides the
/// events themselves, read without reading the log (`ObjectStore::batch_head`). Bounded by
/// the number of event types, not by the length of the history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct BatchHead {
    /// Header, effective events without details, last activity, running components: what
    /// triggers and component states are evaluated on.
    pub summary: BatchSummary,
    pub metadata: Map<String, Value>,
    pub created_at: Timestamp,
    pub modified_at: Timestamp,
    pub open_runs: Vec<Run>,
    /// The summary's effective events in full (details included), by type name.
    pub effective: Vec<Event>,
    /// For each type a `Reset` has covered, the seq of the newest `Reset` covering it
    /// (`Batch::last_reset_of`).
    pub last_resets: BTreeMap<EventType, Seq>,
    /// How many events the whole log holds.
    pub event_count: u64,
    /// The bytes of details and metadata the batch holds, as the store measures them
    /// against its `max_batch_bytes`.
    pub stored_bytes: u64,
    /// The store's clock when this was read.
    pub as_of: Timestamp,
}

impl BatchHead {
    pub fn id(&self) -> &BatchId {
        &self.summary.id
    }

    /// Where the batch's files are (metadata key `location`), as `Batch::location`.
    pub fn location(&self) -> Option<&str> {
        self.metadata.get("location").and_then(Value::as_str)
    }

    pub fn open_run(&self, component: &ComponentName) -> Option<&Run> {
        self.open_runs.iter().find(|run| &run.component == component)
    }

    /// The type's effective event in full, as `Batch::effective().get`.
    pub fn effective_event(&self, event_type: &EventType) -> Option<&Event> {
        self.effective.iter().find(|event| &event.event_type == event_type)
    }

    /// As `Batch::last_reset_of`: `Seq::ZERO` when no `Reset` covered the type.
    pub fn last_reset_of(&self, event_type: &EventType) -> Seq {
        self.last_resets.get(event_type).copied().unwrap_or(Seq::ZERO)
    }

    /// The newest content change or event, whichever is later (`Batch::last_activity_at`).
    pub fn last_activity_at(&self) -> Timestamp {
        self.summary.last_activity
    }
}

impl BatchHead {
    /// The head of a whole batch, as every store's `batch_head` must answer it (stored bytes
    /// counted as compact JSON text, as the embedded store counts them).
    pub fn of(batch: &Batch) -> Self {
        let mut last_resets = BTreeMap::new();
        for event in batch.events.iter().rev().filter(|event| event.event_type.is_reset()) {
            for covered in &event.resets {
                last_resets.entry(covered.clone()).or_insert(event.seq);
            }
        }
        let details: usize = batch.events.iter().map(|event| event.details.to_string().len()).sum();
        let metadata = Value::Object(batch.metadata.clone()).to_string().len();
        BatchHead {
            summary: BatchSummary::of(batch),
            metadata: batch.metadata.clone(),
            created_at: batch.created_at,
            modified_at: batch.modified_at,
            open_runs: batch.open_runs.clone(),
            effective: batch.effective().iter().cloned().collect(),
            last_resets,
            event_count: batch.events.len() as u64,
            stored_bytes: (details + metadata) as u64,
            as_of: batch.as_of,
        }
    }
}

impl BatchFacts for BatchHead {
    fn facts(&self) -> Cow<'_, BatchSummary> {
        Cow::Borrowed(&self.summary)
    }

    fn read_at(&self) -> Timestamp {
        self.as_of
    }
}

/// A batch as a listing of batches shows it (`ObjectStore::get_listings`): its summary,
/// when it was registered, and its open runs (who works on it since when). No log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct BatchListing {
    pub summary: BatchSummary,
    pub created_at: Timestamp,
    pub open_runs: Vec<Run>,
}

impl BatchListing {
    pub fn open_run(&self, component: &ComponentName) -> Option<&Run> {
        self.open_runs.iter().find(|run| &run.component == component)
    }
}

/// Where a page of a batch's log starts (`ObjectStore::log_page`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogCursor {
    /// The newest events.
    Newest,
    /// The newest events older than this seq: the `older` cursor of a later page.
    Before(Seq),
    /// The oldest events newer than this seq (`Seq::ZERO`: from the first event): the
    /// `newer` cursor of an earlier page, or how a reader streams the whole log in order.
    After(Seq),
}

/// One page of a batch's log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct LogPage {
    /// At most the limit asked for, in seq order (oldest first) whichever way the page was
    /// read.
    pub events: Vec<Event>,
    /// How many events the whole log holds.
    pub total: u64,
    /// When older events exist: the seq to read the page before this one with
    /// (`LogCursor::Before`), the first listed event's.
    pub older: Option<Seq>,
    /// When newer events exist: the seq to read the page after this one with
    /// (`LogCursor::After`), the last listed event's.
    pub newer: Option<Seq>,
    /// The events of a page read by size (`ObjectStore::log_page_within`) whose details were
    /// left out (`details` null), each as (seq, the bytes of its details); read one whole
    /// with `event_at`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub details_left_out: Vec<(Seq, u64)>,
}

impl LogPage {
    /// The page of a whole batch's log, as every store's `log_page` must answer it.
    pub fn of(batch: &Batch, cursor: LogCursor, limit: usize) -> Self {
        let events = &batch.events;
        let (from, to) = match cursor {
            LogCursor::Newest => {
                let to = events.len();
                (to.saturating_sub(limit), to)
            }
            LogCursor::Before(seq) => {
                let to = events.partition_point(|event| event.seq < seq);
                (to.saturating_sub(limit), to)
            }
            LogCursor::After(seq) => {
                let from = events.partition_point(|event| event.seq <= seq);
                (from, (from + limit).min(events.len()))
            }
        };
        let page = &events[from..to];
        LogPage {
            events: page.to_vec(),
            total: events.len() as u64,
            older: page.first().filter(|_| from > 0).map(|event| event.seq),
            newer: page.last().filter(|_| to < events.len()).map(|event| event.seq),
            details_left_out: Vec::new(),
        }
    }

    /// The page as `log_page_within` answers it: the details of each event whose details
    /// pass `details_up_to` bytes (compact JSON text) left out and listed.
    pub fn within(mut self, details_up_to: u64) -> Self {
        for event in &mut self.events {
            let bytes = event.details.to_string().len() as u64;
            if bytes > details_up_to {
                event.details = Value::Null;
                self.details_left_out.push((event.seq, bytes));
            }
        }
        self
    }

    /// The bytes of the event's details when this page left them out.
    pub fn left_out(&self, seq: Seq) -> Option<u64> {
        self.details_left_out.iter().find(|(left_out, _)| *left_out == seq).map(|(_, bytes)| *bytes)
    }
}

/// How much of an event's details a page read by size shows (`log_page_within`): 16 KiB,
/// so a monitor page of 50 events holds at most about 800 KiB of details and a page of
/// `MAX_LOG_PAGE` at most 16 MiB, whatever the events hold (each up to 1 MiB).
pub const DETAILS_SHOWN_BYTES: u64 = 16 << 10;

/// One event of a batch, whole (details included): what a page read by size links to.
/// `None` when the batch has no event with that seq.
pub async fn event_at(store: &(impl BatchStore + ?Sized), id: &BatchId, seq: Seq) -> StoreResult<Option<Event>> {
    let before = Seq(seq.0.saturating_sub(1));
    let page = store.log_page(id, LogCursor::After(before), 1).await?;
    Ok(page.events.into_iter().next().filter(|event| event.seq == seq))
}

/// A page size a log page may be asked for: 1 to `MAX_LOG_PAGE`.
pub(crate) fn check_log_limit(limit: usize) -> StoreResult<()> {
    if limit == 0 || limit > MAX_LOG_PAGE {
        return Err(InvalidInput::new("limit", limit.to_string(), format!("must be 1 to {MAX_LOG_PAGE}")).into());
    }
    Ok(())
}

/// Every concern of the store at once: what a caller holds (`Arc<dyn ObjectStore>`) when it
/// needs more than one of them. Implemented for every type that implements them all.
pub trait ObjectStore:
    BatchStore + HandOnStore + RegistryStore + SteeringStore + OutboxStore + SeriesStore + RunOutputStore + RetentionStore
{
}

impl<
    S: BatchStore
        + HandOnStore
        + RegistryStore
        + SteeringStore
        + OutboxStore
        + SeriesStore
        + RunOutputStore
        + RetentionStore
        + ?Sized,
> ObjectStore for S
{
}
