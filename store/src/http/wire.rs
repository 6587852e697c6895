//! The store service's operations, each declared once (`StoreRequest`, `op`), and their
//! request and answer bodies, shared by the server, `HttpStore` and the OpenAPI document so
//! none can drift. Requests refuse unknown fields: a typo is an error, not a silent default.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::pipeline_state::{CursorMove, Enqueued, NewNotice, Notice, NoticeOutcome, Steered};
use crate::port::{
    BatchHead, BatchListing, Cancellation, ChangePage, Claim, LogCursor, LogPage, StoreAbout, StoreError,
};
use autocomp_http::error::ErrorDetail;
use autocomp_model::{
    Agent, Batch, BatchId, BatchSummary, ComponentName, Event, NewBatch, NewEvent, PassRecord, RegisteredComponent,
    Run, RunHolder, Seq, Steering, SteeringEntry, SteeringRequest,
};
use autocomp_model::{BacklogSample, SeriesStep, Timestamp, WorkPoint};

autocomp_http::operations! {
    /// A request to the store service: one variant per `ObjectStore` operation, each with
    /// its body and the reply that takes its answer.
    pub enum StoreRequest in mod op {
        /// Registers a batch; idempotent when an identical batch exists (created=false), 409 conflict when a different one does.
        write create_batch: CreateBatch(NewBatch) -> Created;
        /// A batch with its whole log and open runs.
        read get_batch: GetBatch(ById) -> Batch;
        /// The named batches that exist, in the order asked, each once however often it is named (at most 100000 ids); 413 too_large when the answer would pass 64 MiB with more than one batch in it: ask for fewer ids.
        read get_batches: GetBatches(ByIds) -> Vec<Batch>;
        /// Batches in id order after `after`, at most `limit` (<= 100000); 413 too_large when the answer would pass 64 MiB with more than one batch in it: ask for a lower limit.
        read list_batches: ListBatches(ListBatches) -> Vec<Batch>;
        /// The named batches that exist, each as the batch index reads it (BatchSummary: header, effective events without details, last activity, running components), in the order asked, each once (at most 100000 ids; 413 too_large past 64 MiB of answer).
        read get_summaries: GetSummaries(ByIds) -> Vec<BatchSummary>;
        /// Batch summaries (see get_summaries) in id order after `after`, at most `limit` (<= 100000).
        read list_summaries: ListSummaries(ListBatches) -> Vec<BatchSummary>;
        /// The named batches that exist, each as a listing shows it (its summary, when it was registered, its open runs), in the order asked, each once (at most 100000 ids; 413 too_large past 64 MiB of answer); no log is read.
        read get_listings: GetListings(ByIds) -> Vec<BatchListing>;
        /// A batch without its log: header, metadata, summary, the effective events in full, open runs, the newest Reset of each type, the log's length and the batch's stored bytes; its cost does not grow with the log.
        read batch_head: BatchHead(ById) -> BatchHead;
        /// A page of a batch's log, in seq order: the newest `limit` (1 to 1000) events, those before `before`, or those after `after` (at most one of the two); `older` and `newer` are the cursors of the neighbouring pages. With details_up_to, events whose details pass it come without them (see details_left_out).
        read log_page: LogPage(LogPageRequest) -> LogPage;
        /// The newest run of (batch, component), the open one if one is open, with its generation and state (`run` null when never claimed): a holder of generation g may still write exactly while it is that generation and open.
        read run_state: RunState(OfComponent) -> RunStateAnswer;
        /// Sets a batch's priority.
        write set_priority: SetPriority(SetPriority) -> SeqAnswer;
        /// Merges a metadata patch (null removes a key) and moves modified_seq.
        write record_content_change: RecordContentChange(ContentChange) -> SeqAnswer;
        /// Appends an event; with `run` it is fenced (409 fenced unless that generation is the open, current run).
        write append_event: AppendEvent(AppendEvent) -> Event;
        /// Opens the next run of (batch, component); a run still open is marked abandoned. With holder.claim_key, a retry returns the run the first attempt opened.
        write claim: Claim(ClaimRequest) -> Claim;
        /// Claims several batches for one component in one transaction (one commit): a pass's claims. Answers one entry per batch, in the order asked, each what claim would answer for it: {"claim": Claim} or {"error": ...} (not_found for an unknown batch, conflict for a claim key already used by a run no longer open); one batch's error does not keep the others from being claimed. An error response means nothing was claimed. With holder.claim_key (one key serves every batch), a retry returns the runs the first attempt opened.
        write claim_many: ClaimMany(ClaimManyRequest) -> ClaimManyAnswer;
        /// Closes a run without an event; releasing twice is a no-op.
        write release: Release(RunId) -> Empty;
        /// Replaces the run's checkpoint (fenced like an append).
        write save_checkpoint: SaveCheckpoint(SaveCheckpoint) -> Empty;
        /// The last checkpoint of (batch, component).
        read load_checkpoint: LoadCheckpoint(OfComponent) -> Checkpoint;
        /// Open runs, of one component or of all.
        read open_runs: OpenRuns(OpenRuns) -> Vec<Run>;
        /// Runs opened after `since` that ended abandoned or in a transient failure.
        read failed_attempts: FailedAttempts(FailedAttempts) -> Count;
        /// The change feed: batches changed after `since`, each once (limit <= 100000).
        read changes: Changes(Changes) -> ChangePage;
        /// The newest seq in the store.
        read head: Head(Empty) -> Head;
        /// The service's store: its backend, its schema against the service's release, its clock.
        read about: About(Empty) -> StoreAbout;
        /// Long poll: answers once the head passes `since`, or after timeout_ms (<= 60000).
        read wait_for_change: WaitForChange(WaitForChange) -> Head;
        /// An operator's cancel: closes the open run as cancelled, fences its holder and appends the failure, in one transaction.
        write cancel_run: CancelRun(CancelRun) -> Cancellation;
        /// Sets the priority and appends the operator's event, in one transaction.
        write prioritize: Prioritize(Prioritize) -> Event;
        /// How many batches the store holds.
        read count_batches: CountBatches(Empty) -> Count;
        /// Records a component's pass in the component registry, by the store's clock: the descriptor when it differs from the one held, the host's record always. A retired component that runs again is back in the pipeline. 409 conflict when another component in the pipeline already records the event type. Takes no seq: not in the change feed.
        write record_pass: RecordPass(PassRecord) -> Empty;
        /// Every component in the registry, retired ones included, by name; each with its hosts by name.
        read components: Components(Empty) -> Vec<RegisteredComponent>;
        /// An operator's `pipeline forget`: marks the component retired (by whom, why) and answers it. 400 naming the component when the registry does not hold it; 409 conflict when it is retired already.
        write retire_component: RetireComponent(RetireComponent) -> RegisteredComponent;
        /// The pipeline's steering state: holds (paused, draining, circuit open), resource pools and breaker counts.
        read steering: Steering(Empty) -> Steering;
        /// Applies a steering change (pause, resume, pool size, a breaker's count) in one transaction with its log entry; moves the head so watchers wake. 409 conflict when the state does not allow it (already paused, not paused, changed since expect_version).
        write steer: Steer(SteeringRequest) -> Steered;
        /// The newest `limit` (1 to 1000) entries of the steering log, newest first.
        read steering_log: SteeringLog(Limit) -> Vec<SteeringEntry>;
        /// Adds the notices the outbox does not hold yet (by key) and moves the notifiers' cursor if it is still at cursor.from; answers how many were new and the cursor.
        write enqueue_notices: EnqueueNotices(EnqueueNotices) -> Enqueued;
        /// Leases up to `limit` due notices to `holder` for lease_ms: no other notifier takes them meanwhile.
        write take_notices: TakeNotices(TakeNotices) -> Vec<Notice>;
        /// Settles a notice its holder took: sent, or failed (retried after retry_in). 409 conflict when it is not leased to that holder.
        write settle_notice: SettleNotice(SettleNotice) -> Empty;
        /// The newest `limit` notices (1 to 1000), pending and sent, newest first.
        read recent_notices: RecentNotices(Limit) -> Vec<Notice>;
        /// Components' work over time, per minute (the last 120) or per hour (the last 744), from the step holding `since` on, of one component or all: only steps with results or a backlog sample, by component and time, in store time.
        read work_series: WorkSeries(WorkSeriesRequest) -> Vec<WorkPoint>;
        /// Records each component's backlog (batches ready for it) as sampled now: the newest sample of the current minute and hour, by the store's clock (at most 10000 samples, each component once). Takes no seq.
        write record_backlog: RecordBacklog(RecordBacklog) -> Empty;
    }
}

/// Most items one request may ask for (ids, batches, changes).
pub const MAX_ITEMS: usize = 100_000;
/// Longest a `wait_for_change` long poll may be asked to wait.
pub const MAX_WAIT_MS: u64 = 60_000;
/// Largest answer (JSON bytes) a read of several batches, summaries or listings may have;
/// past it the read is refused with 413 `too_large` and the caller asks for fewer ids
/// (`HttpStore` halves its request by itself). The default `max_batch_bytes` (64 MiB) is the
/// same figure, so any one batch of a store on defaults fits in one answer; an answer of one
/// item is never refused (a batch is bounded by its store's `max_batch_bytes`, and
/// `get_batch` answers it whole too), so a store with a larger cap still reads every batch.
pub const MAX_ANSWER_BYTES: u64 = 64 << 20;

/// `ids` without repeats, each at its first place: an id asked twice is read and answered
/// once (eight copies of one large batch cost what one does).
pub fn distinct(ids: Vec<BatchId>) -> Vec<BatchId> {
    let mut seen = std::collections::HashSet::with_capacity(ids.len());
    ids.into_iter().filter(|id| seen.insert(id.clone())).collect()
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Empty {}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct Created {
    /// False when an identical batch already existed and nothing changed.
    pub created: bool,
    pub batch: Batch,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WorkSeriesRequest {
    pub step: SeriesStep,
    /// Milliseconds since the epoch: the first step read is the one holding it.
    pub since: Timestamp,
    /// One component; all when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub component: Option<ComponentName>,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RecordBacklog {
    pub samples: Vec<BacklogSample>,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ById {
    pub id: BatchId,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ByIds {
    /// At most `MAX_ITEMS` (100000).
    pub ids: Vec<BatchId>,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListBatches {
    #[serde(default)]
    pub after: Option<BatchId>,
    /// At most `MAX_ITEMS` (100000).
    pub limit: usize,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LogPageRequest {
    pub id: BatchId,
    /// The newest events older than this seq (a page's `older`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub before: Option<Seq>,
    /// The oldest events newer than this seq (a page's `newer`; 0 from the first event).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<Seq>,
    /// 1 to 1000.
    pub limit: usize,
    /// Read by size: details over this many bytes (as JSON text) are left out (null) and
    /// listed in the page's `details_left_out`; absent: every event whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details_up_to: Option<u64>,
}

impl LogPageRequest {
    pub fn new(id: BatchId, cursor: LogCursor, limit: usize) -> Self {
        let (before, after) = match cursor {
            LogCursor::Newest => (None, None),
            LogCursor::Before(seq) => (Some(seq), None),
            LogCursor::After(seq) => (None, Some(seq)),
        };
        Self { id, before, after, limit, details_up_to: None }
    }

    /// The cursor asked for; both `before` and `after` is bad input naming them.
    pub fn cursor(&self) -> Result<LogCursor, autocomp_model::InvalidInput> {
        match (self.before, self.after) {
            (None, None) => Ok(LogCursor::Newest),
            (Some(before), None) => Ok(LogCursor::Before(before)),
            (None, Some(after)) => Ok(LogCursor::After(after)),
            (Some(before), Some(after)) => Err(autocomp_model::InvalidInput::new(
                "before",
                before.to_string(),
                format!("give before or after ({after}), not both"),
            )),
        }
    }
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct RunStateAnswer {
    /// The newest run, or null when the component never claimed the batch.
    pub run: Option<Run>,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SetPriority {
    pub id: BatchId,
    pub priority: i32,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ContentChange {
    pub id: BatchId,
    pub metadata_patch: Map<String, Value>,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AppendEvent {
    pub batch: BatchId,
    pub event: NewEvent,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ClaimRequest {
    pub batch: BatchId,
    pub component: ComponentName,
    pub holder: RunHolder,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ClaimManyRequest {
    /// At most `MAX_ITEMS` (100000).
    pub batches: Vec<BatchId>,
    pub component: ComponentName,
    pub holder: RunHolder,
}

/// `claim_many`'s answer: one per batch, in the order asked.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct ClaimManyAnswer {
    pub answers: Vec<ClaimAnswer>,
}

/// One batch's answer: `{"claim": ...}`, or `{"error": ...}` shaped as an error response's
/// body, so a client reads it back into the very `StoreError` a single claim would give.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum ClaimAnswer {
    Claim(Claim),
    Error(ErrorDetail),
}

impl From<Result<Claim, StoreError>> for ClaimAnswer {
    fn from(answer: Result<Claim, StoreError>) -> Self {
        match answer {
            Ok(claim) => ClaimAnswer::Claim(claim),
            Err(error) => ClaimAnswer::Error(*autocomp_http::error::ApiError::from(error).detail),
        }
    }
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunId {
    pub batch: BatchId,
    pub component: ComponentName,
    pub generation: i64,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SaveCheckpoint {
    pub batch: BatchId,
    pub component: ComponentName,
    pub generation: i64,
    pub data: Value,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OfComponent {
    pub batch: BatchId,
    pub component: ComponentName,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct Checkpoint {
    pub data: Option<Value>,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OpenRuns {
    #[serde(default)]
    pub component: Option<ComponentName>,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FailedAttempts {
    pub batch: BatchId,
    pub component: ComponentName,
    pub since: Seq,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Changes {
    pub since: Seq,
    /// At most `MAX_ITEMS` (100000).
    pub limit: usize,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WaitForChange {
    pub since: Seq,
    /// At most `MAX_WAIT_MS` (60000).
    pub timeout_ms: u64,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CancelRun {
    pub batch: BatchId,
    pub component: ComponentName,
    pub event: NewEvent,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Prioritize {
    pub id: BatchId,
    pub priority: i32,
    pub event: NewEvent,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RetireComponent {
    pub name: ComponentName,
    pub by: Agent,
    pub reason: String,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Limit {
    pub limit: usize,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EnqueueNotices {
    pub notices: Vec<NewNotice>,
    #[serde(default)]
    pub cursor: Option<CursorMove>,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TakeNotices {
    pub holder: String,
    pub limit: usize,
    pub lease_ms: u64,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SettleNotice {
    pub key: String,
    pub holder: String,
    pub outcome: NoticeOutcome,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct SeqAnswer {
    pub seq: Seq,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct Head {
    pub head: Seq,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct Count {
    pub count: u64,
}

/// `GET /health` while the store answers.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct Health {
    /// Always `ok`.
    pub status: String,
    pub head: Seq,
}
