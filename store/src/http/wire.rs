//! The request and answer bodies of the store service, one pair per `ObjectStore`
//! operation, shared by the server and `HttpStore` so the two cannot drift apart.
//! Requests refuse unknown fields: a typo is an error, not a silently ignored setting.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::port::{Claim, StoreError};
use autocomp_http::service::ErrorDetail;
use autocomp_model::{Agent, Batch, BatchId, ComponentName, NewEvent, RunHolder, Seq};

/// Every operation: its name (the path `/v1/<name>`) and whether it writes (needs the token).
pub const OPERATIONS: &[(&str, bool)] = &[
    ("create_batch", true),
    ("get_batch", false),
    ("get_batches", false),
    ("list_batches", false),
    ("get_summaries", false),
    ("list_summaries", false),
    ("set_priority", true),
    ("record_content_change", true),
    ("append_event", true),
    ("claim", true),
    ("claim_many", true),
    ("release", true),
    ("save_checkpoint", true),
    ("load_checkpoint", false),
    ("open_runs", false),
    ("failed_attempts", false),
    ("changes", false),
    ("head", false),
    ("wait_for_change", false),
    ("cancel_run", true),
    ("prioritize", true),
    ("count_batches", false),
    ("record_pass", true),
    ("components", false),
    ("retire_component", true),
];

/// Most items one request may ask for (ids, batches, changes).
pub const MAX_ITEMS: usize = 100_000;
/// Longest a `wait_for_change` long poll may be asked to wait.
pub const MAX_WAIT_MS: u64 = 60_000;

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Empty {}

#[derive(Debug, Serialize, Deserialize)]
pub struct Created {
    /// False when an identical batch already existed and nothing changed.
    pub created: bool,
    pub batch: Batch,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ById {
    pub id: BatchId,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ByIds {
    pub ids: Vec<BatchId>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListBatches {
    #[serde(default)]
    pub after: Option<BatchId>,
    pub limit: usize,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetPriority {
    pub id: BatchId,
    pub priority: i32,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContentChange {
    pub id: BatchId,
    pub metadata_patch: Map<String, Value>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AppendEvent {
    pub batch: BatchId,
    pub event: NewEvent,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClaimRequest {
    pub batch: BatchId,
    pub component: ComponentName,
    pub holder: RunHolder,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClaimManyRequest {
    pub batches: Vec<BatchId>,
    pub component: ComponentName,
    pub holder: RunHolder,
}

/// `claim_many`'s answer: one per batch, in the order asked.
#[derive(Debug, Serialize, Deserialize)]
pub struct ClaimManyAnswer {
    pub answers: Vec<ClaimAnswer>,
}

/// One batch's answer: `{"claim": ...}`, or `{"error": ...}` shaped as an error response's
/// body, so a client reads it back into the very `StoreError` a single claim would give.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum ClaimAnswer {
    Claim(Claim),
    Error(ErrorDetail),
}

impl From<Result<Claim, StoreError>> for ClaimAnswer {
    fn from(answer: Result<Claim, StoreError>) -> Self {
        match answer {
            Ok(claim) => ClaimAnswer::Claim(claim),
            Err(error) => ClaimAnswer::Error(*autocomp_http::service::ApiError::from(error).detail),
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunId {
    pub batch: BatchId,
    pub component: ComponentName,
    pub generation: i64,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SaveCheckpoint {
    pub batch: BatchId,
    pub component: ComponentName,
    pub generation: i64,
    pub data: Value,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OfComponent {
    pub batch: BatchId,
    pub component: ComponentName,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Checkpoint {
    pub data: Option<Value>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpenRuns {
    #[serde(default)]
    pub component: Option<ComponentName>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FailedAttempts {
    pub batch: BatchId,
    pub component: ComponentName,
    pub since: Seq,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Changes {
    pub since: Seq,
    pub limit: usize,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WaitForChange {
    pub since: Seq,
    pub timeout_ms: u64,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CancelRun {
    pub batch: BatchId,
    pub component: ComponentName,
    pub event: NewEvent,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Prioritize {
    pub id: BatchId,
    pub priority: i32,
    pub event: NewEvent,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetireComponent {
    pub name: ComponentName,
    pub by: Agent,
    pub reason: String,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct SeqAnswer {
    pub seq: Seq,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Head {
    pub head: Seq,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Count {
    pub count: u64,
}
