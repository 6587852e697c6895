//! The `ObjectStore` port: every operation the rest of autocomp may perform on the source of
//! truth. Async because its distributed adapter is an HTTP client and its callers run on
//! tokio; the embedded SQLite adapter runs its blocking work off the async threads.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use autocomp_model::{
    Agent, BacklogSample, Batch, BatchFacts, BatchId, BatchSummary, ComponentName, Event, EventType, InvalidInput,
    NewBatch, NewEvent, PassRecord, RegisteredComponent, Run, RunHolder, Seq, SeriesStep, Steering, SteeringEntry,
    SteeringRequest, Timestamp, WorkPoint,
};

pub use crate::error::{StoreError, StoreResult};
use crate::pipeline_state::{CursorMove, Enqueued, NewNotice, Notice, NoticeOutcome, Steered};

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
pub async fn event_at(store: &dyn ObjectStore, id: &BatchId, seq: Seq) -> StoreResult<Option<Event>> {
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

#[async_trait]
pub trait ObjectStore: Send + Sync {
    /// Registers a batch. Idempotent when an identical batch exists; a different one with the
    /// same id is a `Conflict`.
    async fn create_batch(&self, batch: NewBatch) -> StoreResult<CreateOutcome>;

    /// A whole batch: header, its whole log and open runs. Its cost grows with the log; to
    /// show or decide something about a batch read `batch_head` (and `log_page`), or
    /// `run_state` for one run, instead.
    async fn get_batch(&self, id: &BatchId) -> StoreResult<Batch>;

    /// The named batches that exist, whole, in the order asked, each once however often it is
    /// named (at its first place); unknown ids are left out. Listings read `get_listings` or `get_summaries` instead.
    async fn get_batches(&self, ids: &[BatchId]) -> StoreResult<Vec<Batch>>;

    /// Batches in id order, starting after `after`, at most `limit` of them.
    async fn list_batches(&self, after: Option<&BatchId>, limit: usize) -> StoreResult<Vec<Batch>>;

    /// `get_batches` as the batch index needs it: each batch's `BatchSummary` (header,
    /// effective events without details, last activity, running components), in the order
    /// asked, each once, unknown ids left out. What a catch-up reads. The default summarizes
    /// `get_batches`; a store that keeps summaries as it writes reads no logs.
    async fn get_summaries(&self, ids: &[BatchId]) -> StoreResult<Vec<BatchSummary>> {
        Ok(self.get_batches(ids).await?.iter().map(BatchSummary::of).collect())
    }

    /// `list_batches` summarized (see `get_summaries`): what a rebuild and a reconcile read.
    async fn list_summaries(&self, after: Option<&BatchId>, limit: usize) -> StoreResult<Vec<BatchSummary>> {
        Ok(self.list_batches(after, limit).await?.iter().map(BatchSummary::of).collect())
    }

    /// A batch without its log (`BatchHead`): header, metadata, summary, the effective
    /// events in full, open runs, the newest `Reset` of each type, the log's length and the
    /// batch's stored bytes, as one consistent read whose cost does not grow with the log.
    ///
    /// The default reads the whole batch (`BatchHead::of`), for adapters without a cheaper
    /// way; every store of this crate reads no log.
    async fn batch_head(&self, id: &BatchId) -> StoreResult<BatchHead> {
        Ok(BatchHead::of(&self.get_batch(id).await?))
    }

    /// A page of a batch's log (at most `limit`, 1 to `MAX_LOG_PAGE`, events; in seq order),
    /// read without reading the rest of the log: the newest events, those before a seq, or
    /// those after one.
    /// The default reads the whole batch (`LogPage::of`), as `batch_head`'s does.
    async fn log_page(&self, id: &BatchId, cursor: LogCursor, limit: usize) -> StoreResult<LogPage> {
        check_log_limit(limit)?;
        Ok(LogPage::of(&self.get_batch(id).await?, cursor, limit))
    }

    /// `log_page` read by size: an event whose details pass `details_up_to` bytes (as
    /// compact JSON text) comes without them (`details` null) and is listed in
    /// `details_left_out` with their size, so a page costs at most about `limit` times
    /// `details_up_to` however large its events are; `event_at` reads one whole. The stores
    /// of this crate leave the details in the database; the default trims a whole page.
    async fn log_page_within(
        &self,
        id: &BatchId,
        cursor: LogCursor,
        limit: usize,
        details_up_to: u64,
    ) -> StoreResult<LogPage> {
        Ok(self.log_page(id, cursor, limit).await?.within(details_up_to))
    }

    /// The newest run of (batch, component), which is the open one if one is open (every
    /// claim takes a higher generation and abandons the run open before it), with its
    /// generation and state; `None` when the component never claimed the batch. A holder of
    /// generation `g` may still write exactly when the answer is `Some(run)` with
    /// `run.generation == g` and `run.state == RunState::Open`: an operator's cancel leaves
    /// its run `cancelled`, a takeover a newer generation, a release or result a closed
    /// state. One indexed read, whatever the batch's history. `NotFound` for an unknown batch.
    ///
    /// The default reads the whole batch, which holds open runs only: it answers the open run,
    /// or `None` once none is open, which a holder reads the same way (not its open run).
    async fn run_state(&self, batch: &BatchId, component: &ComponentName) -> StoreResult<Option<Run>> {
        Ok(self.get_batch(batch).await?.open_run(component).cloned())
    }

    /// `get_summaries` with what a listing shows beside each summary (`BatchListing`): the
    /// named batches that exist, in the order asked, unknown ids left out, each once (as
    /// `get_batches` answers it). Reads no log; the default, for adapters without a
    /// cheaper way, summarizes `get_batches`.
    async fn get_listings(&self, ids: &[BatchId]) -> StoreResult<Vec<BatchListing>> {
        let batches = self.get_batches(ids).await?;
        Ok(batches
            .iter()
            .map(|batch| BatchListing {
                summary: BatchSummary::of(batch),
                created_at: batch.created_at,
                open_runs: batch.open_runs.clone(),
            })
            .collect())
    }

    async fn set_priority(&self, id: &BatchId, priority: i32) -> StoreResult<Seq>;

    /// A content change (re-delivery, metadata edit): merges `metadata_patch` into the
    /// metadata (a `null` value removes the key) and moves `modified_seq`.
    async fn record_content_change(&self, id: &BatchId, metadata_patch: Map<String, Value>) -> StoreResult<Seq>;

    /// Appends an event; the store assigns `seq` and `at`. With `run` set it succeeds only
    /// while that generation is the open, current run of (batch, component), and closes it;
    /// otherwise it fails with `Fenced`. A retried append with the same idempotency key
    /// returns the first append's event.
    async fn append_event(&self, batch: &BatchId, event: NewEvent) -> StoreResult<Event>;

    /// Opens a new run of (batch, component) with the next generation; a run still open is
    /// marked abandoned (and fenced from then on).
    async fn claim(&self, batch: &BatchId, component: &ComponentName, holder: &RunHolder) -> StoreResult<Claim>;

    /// Claims several batches for one component at once, as one transaction (one commit): a
    /// pass claims everything it will work on together. Each answer is what `claim` would
    /// have answered for that batch, in the order asked; a batch's own error (`NotFound`,
    /// `Invalid`) does not keep the others from being claimed. The outer error means nothing
    /// was claimed. The default claims one by one (one transaction each, never an outer error),
    /// for adapters without a cheaper way.
    async fn claim_many(
        &self,
        batches: &[BatchId],
        component: &ComponentName,
        holder: &RunHolder,
    ) -> StoreResult<Vec<StoreResult<Claim>>> {
        let mut answers = Vec::with_capacity(batches.len());
        for batch in batches {
            answers.push(self.claim(batch, component, holder).await);
        }
        Ok(answers)
    }

    /// Closes a run without an event, so the batch is ready again. Releasing a run that is
    /// already released (and still current) is a no-op; `Fenced` if the run is otherwise not
    /// the current open one.
    async fn release(&self, batch: &BatchId, component: &ComponentName, generation: i64) -> StoreResult<()>;

    /// Saves a run's progress (a JSON object), replacing the previous checkpoint of
    /// (batch, component). Fenced like an append; removed when a run records its result.
    async fn save_checkpoint(
        &self,
        batch: &BatchId,
        component: &ComponentName,
        generation: i64,
        data: Value,
    ) -> StoreResult<()>;

    /// The last checkpoint of (batch, component), left by this or an earlier attempt.
    async fn load_checkpoint(&self, batch: &BatchId, component: &ComponentName) -> StoreResult<Option<Value>>;

    /// Open runs, of one component or of all.
    async fn open_runs(&self, component: Option<&ComponentName>) -> StoreResult<Vec<Run>>;

    /// Runs of (batch, component) opened after `since` that ended abandoned or in a transient
    /// failure: what `max_attempts` counts.
    async fn failed_attempts(&self, batch: &BatchId, component: &ComponentName, since: Seq) -> StoreResult<u32>;

    /// Batches changed after `since` (creations, appends, content and priority changes,
    /// claims, releases), at most `limit`.
    async fn changes(&self, since: Seq, limit: usize) -> StoreResult<ChangePage>;

    /// The newest seq in the store.
    async fn head(&self) -> StoreResult<Seq>;

    /// What the store says of itself: its backend, its schema against this release's and
    /// its clock (`autocomp doctor` compares that with the host's). Changes nothing.
    async fn about(&self) -> StoreResult<StoreAbout>;

    /// Waits until the head passes `since` or `timeout` elapses, and returns the head: how a
    /// follower of the change feed sleeps without missing a change. The store service
    /// answers at once after its own writes; the default polls every 50 ms.
    async fn wait_for_change(&self, since: Seq, timeout: Duration) -> StoreResult<Seq> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let head = self.head().await?;
            if head > since || tokio::time::Instant::now() >= deadline {
                return Ok(head);
            }
            tokio::time::sleep_until((tokio::time::Instant::now() + Duration::from_millis(50)).min(deadline)).await;
        }
    }

    /// An operator's cancel, in one transaction: the open run of
    /// (batch, component), if any, is closed as `cancelled` and the claim generation bumped,
    /// so its holder is fenced from every write from then on (the runner notices within a
    /// second and stops the work); then `event` is appended. `event` must be a failure whose
    /// details say `"cancelled": true`, with no run, no Reset and no idempotency key. When a
    /// run was closed, the store adds `cancelled_run` (component, generation, agent, host,
    /// pid, started_at) to the details. With no open run only the event is appended.
    ///
    /// Adapters that cannot do this atomically must not implement it: the default refuses.
    async fn cancel_run(
        &self,
        batch: &BatchId,
        component: &ComponentName,
        event: NewEvent,
    ) -> StoreResult<Cancellation> {
        let _ = (batch, component, event);
        Err(StoreError::Unavailable("this store adapter does not support cancel_run".into()))
    }

    /// Sets a batch's priority and appends `event` (the operator's record of the change: no
    /// run, no Reset, no idempotency key) in one transaction. The store adds `priority` and
    /// `previous_priority` to the event's details. Like any event it counts as activity for
    /// `settled_for`. The default refuses (see `cancel_run`).
    async fn prioritize(&self, id: &BatchId, priority: i32, event: NewEvent) -> StoreResult<Event> {
        let _ = (id, priority, event);
        Err(StoreError::Unavailable("this store adapter does not support prioritize".into()))
    }

    /// Records a component's pass in the component registry, stamped with the store's clock:
    /// the descriptor is written only when it differs from the one held, the host's record
    /// (last seen, last pass start or end, outcome) always. A retired component that runs
    /// again is back in the pipeline. Refused as a `Conflict` when another component in the
    /// pipeline (not retired) already records the same event type.
    async fn record_pass(&self, pass: PassRecord) -> StoreResult<()>;

    /// Every component in the registry, retired ones included, by name.
    async fn components(&self) -> StoreResult<Vec<RegisteredComponent>>;

    /// An operator's `pipeline forget`: marks the component retired (by whom, why) and
    /// returns it. Unknown names are `Invalid` naming the component; retiring a retired
    /// component again is a `Conflict` saying when and by whom it was retired.
    async fn retire_component(
        &self,
        name: &ComponentName,
        by: &Agent,
        reason: &str,
    ) -> StoreResult<RegisteredComponent>;

    /// The pipeline's steering state: holds (paused, draining, circuit open), resource pools
    /// and breaker counts, as the last change left it (`Steering::default()` before any).
    async fn steering(&self) -> StoreResult<Steering>;

    /// Applies a steering change as `Steering::apply` decides it, in one transaction: the new
    /// state, its entry in the steering log (when it has one), and a seq taken from the
    /// store's counter so the head moves and every watcher wakes to honour it. A change that
    /// leaves the state as it was (a success with no breaker count) writes nothing. Refused
    /// (nothing written) as `Invalid` or `Conflict` as `apply` refuses it.
    async fn steer(&self, request: SteeringRequest) -> StoreResult<Steered>;

    /// The newest `limit` (1 to `MAX_STEERING_LOG_PAGE`) entries of the steering log,
    /// newest first: who paused, resumed, resized a pool or opened a circuit, when and why.
    async fn steering_log(&self, limit: usize) -> StoreResult<Vec<SteeringEntry>>;

    /// Adds the notices whose keys the outbox does not hold yet and, with `cursor`, moves the
    /// notifiers' cursor from `cursor.from` to `cursor.to` if it is still at `from` (another
    /// notifier may have moved it: then it stays). Answers how many were new and the cursor.
    /// `cursor: None` only reads the cursor (`CURSOR_UNSET` before any notifier moved it).
    async fn enqueue_notices(&self, notices: Vec<NewNotice>, cursor: Option<CursorMove>) -> StoreResult<Enqueued>;

    /// Takes up to `limit` pending notices that are due (never sent, past their retry time,
    /// not leased to another notifier) for `holder`, leased to it for `lease`: no other
    /// notifier takes them until it settles them or the lease runs out. Oldest first.
    async fn take_notices(&self, holder: &str, limit: usize, lease: Duration) -> StoreResult<Vec<Notice>>;

    /// Settles a notice `holder` took: sent (never taken again), or failed (taken again once
    /// `retry_in` has passed, its attempts counted). A `Conflict` when the notice is not
    /// leased to `holder` now (its lease ran out, whether or not another took it since, or it
    /// was sent); `Invalid` naming `holder` or `retry_in` (at most `MAX_NOTICE_RETRY`).
    async fn settle_notice(&self, key: &str, holder: &str, outcome: NoticeOutcome) -> StoreResult<()>;

    /// The newest `limit` notices (1 to `MAX_NOTICES_PER_CALL`), pending and sent, newest first.
    async fn recent_notices(&self, limit: usize) -> StoreResult<Vec<Notice>>;

    /// What components' work came to over time, per minute (the last `WORK_MINUTES_KEPT`) or
    /// per hour (the last `WORK_HOURS_KEPT`), from the step holding `since` on, of one
    /// component or all: only the steps with results or a backlog sample, by component and
    /// time, in store time.
    async fn work_series(
        &self,
        step: SeriesStep,
        since: Timestamp,
        component: Option<&ComponentName>,
    ) -> StoreResult<Vec<WorkPoint>>;

    /// Records each component's backlog as sampled now (the monitor samples it): the newest
    /// sample of the current minute and of the current hour, by the store's clock. Samples
    /// older than the registry keeps are dropped. Takes no seq.
    async fn record_backlog(&self, samples: Vec<BacklogSample>) -> StoreResult<()>;

    /// How many batches the store holds (the default pages through `list_batches`).
    async fn count_batches(&self) -> StoreResult<u64> {
        let (mut count, mut after) = (0u64, None::<BatchId>);
        loop {
            let page = self.list_batches(after.as_ref(), 1_000).await?;
            let Some(last) = page.last() else { return Ok(count) };
            after = Some(last.id.clone());
            count += page.len() as u64;
        }
    }
}
