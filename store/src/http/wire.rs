//! The request and answer bodies of the store service's operations (declared in `operations`),
//! shared by the server, `HttpStore` and the OpenAPI document so none can drift, and the bounds
//! of a request. Requests refuse unknown fields: a typo is an error, not a silent default.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::pipeline_state::{CursorMove, NewNotice, NoticeOutcome};
use crate::port::ready_claims::{ReadyAnswer, ReadyClaims};
use crate::port::{Claim, CreateOutcome, LogCursor, StoreError};
use autocomp_http::error::ErrorDetail;
use autocomp_model::{Agent, Batch, BatchId, ComponentName, NewBatch, NewEvent, Run, RunHolder, Seq, Steering};
use autocomp_model::{BacklogSample, SeriesStep, Timestamp};

/// Most items one request may ask for (ids, batches, changes).
pub const MAX_ITEMS: usize = 100_000;
/// Longest a `wait_for_change` long poll may be asked to wait.
pub const MAX_WAIT_MS: u64 = 60_000;
/// Largest answer (JSON bytes) a read of several batches, histories, summaries or listings, or
/// a claim round (`claim_ready`), may have; past it the read is refused with 413 `too_large` and the
/// caller asks for fewer ids (`HttpStore` halves its request by itself). The default `max_batch_bytes` (64 MiB) is the
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
pub struct RegisterBatch {
    pub batch: NewBatch,
    /// Recorded in the same commit; names no run and no idempotency key.
    pub first: NewEvent,
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
    // Boxed: a claim carries two runs, each several times an error's size.
    Claim(Box<Claim>),
    Error(ErrorDetail),
}

/// `claim_ready`'s answer (`ReadyClaims`): the steering when it moved from the version the
/// caller knows, whether a hold refused the whole round, and one entry per batch, in the order
/// asked: `{"ready": ...}` (claimed, or not ready and untouched when `claim` is null) or
/// `{"error": ...}` as `claim_many`'s.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct ReadyClaimsAnswer {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steering: Option<Steering>,
    pub held: bool,
    pub answers: Vec<ReadyClaimAnswer>,
}

/// One batch's entry in `ReadyClaimsAnswer`.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum ReadyClaimAnswer {
    Ready(Box<ReadyAnswer>),
    Error(ErrorDetail),
}

impl From<ReadyClaims> for ReadyClaimsAnswer {
    fn from(claims: ReadyClaims) -> Self {
        let answers = claims
            .answers
            .into_iter()
            .map(|answer| match answer {
                Ok(ready) => ReadyClaimAnswer::Ready(Box::new(ready)),
                Err(error) => ReadyClaimAnswer::Error(*autocomp_http::error::ApiError::from(error).detail),
            })
            .collect();
        ReadyClaimsAnswer { steering: claims.steering, held: claims.held, answers }
    }
}

impl From<Created> for CreateOutcome {
    fn from(Created { created, batch }: Created) -> Self {
        if created { CreateOutcome::Created(batch) } else { CreateOutcome::AlreadyExists(batch) }
    }
}

impl From<CreateOutcome> for Created {
    fn from(outcome: CreateOutcome) -> Self {
        match outcome {
            CreateOutcome::Created(batch) => Created { created: true, batch },
            CreateOutcome::AlreadyExists(batch) => Created { created: false, batch },
        }
    }
}

impl From<Result<Claim, StoreError>> for ClaimAnswer {
    fn from(answer: Result<Claim, StoreError>) -> Self {
        match answer {
            Ok(claim) => ClaimAnswer::Claim(Box::new(claim)),
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
pub struct SetRunOutput {
    pub batch: BatchId,
    pub component: ComponentName,
    pub generation: i64,
    /// Null removes what was saved.
    pub output: Option<autocomp_model::RunOutput>,
    /// All the run printed (its work returned), not only what it printed so far.
    pub whole: bool,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PruneHistories {
    /// At most `MAX_RETENTION_PAGE` (1000).
    pub tickets: Vec<crate::port::PruneTicket>,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RestoreHistories {
    /// At most `MAX_RETENTION_PAGE` (1000).
    pub histories: Vec<crate::port::BatchHistory>,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunOutputs {
    pub outputs: Vec<crate::port::SavedRunOutput>,
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
pub struct WaitForChangeConcerning {
    pub since: Seq,
    /// What wakes the poll: `"everything"`, or `{"types": [...]}`: appends of those event
    /// types and the changes that concern everyone.
    pub interest: autocomp_model::ChangeInterest,
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
