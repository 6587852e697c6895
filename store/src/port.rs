//! The `ObjectStore` port: every operation the rest of autocomp may perform on the source of
//! truth. Async because its distributed adapter is an HTTP client and its callers run on
//! tokio; the embedded SQLite adapter runs its blocking work off the async threads.

use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use autocomp_model::{
    Agent, Batch, BatchId, BatchSummary, ComponentName, Event, InvalidInput, NewBatch, NewEvent, PassRecord,
    RegisteredComponent, Run, RunHolder, Seq,
};

pub type StoreResult<T> = Result<T, StoreError>;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Bad input; nothing was written.
    #[error(transparent)]
    Invalid(#[from] InvalidInput),
    #[error("batch {0} does not exist")]
    NotFound(BatchId),
    /// The request contradicts what the store already holds; nothing was written.
    #[error("conflict: {0}")]
    Conflict(String),
    /// A fenced write whose run is no longer the current open run; nothing was written.
    #[error("fenced: run {generation} of {component} on batch {batch} {reason}")]
    Fenced { batch: BatchId, component: ComponentName, generation: i64, reason: String },
    /// The store could not be reached or read (I/O, lock timeout, corrupt file, network).
    #[error("store unavailable: {0}")]
    Unavailable(String),
}

impl StoreError {
    pub fn is_fenced(&self) -> bool {
        matches!(self, StoreError::Fenced { .. })
    }
}

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

#[async_trait]
pub trait ObjectStore: Send + Sync {
    /// Registers a batch. Idempotent when an identical batch exists; a different one with the
    /// same id is a `Conflict`.
    async fn create_batch(&self, batch: NewBatch) -> StoreResult<CreateOutcome>;

    async fn get_batch(&self, id: &BatchId) -> StoreResult<Batch>;

    /// The named batches that exist, in the order asked; unknown ids are left out.
    async fn get_batches(&self, ids: &[BatchId]) -> StoreResult<Vec<Batch>>;

    /// Batches in id order, starting after `after`, at most `limit` of them.
    async fn list_batches(&self, after: Option<&BatchId>, limit: usize) -> StoreResult<Vec<Batch>>;

    /// `get_batches` as the batch index needs it: each batch's `BatchSummary` (header,
    /// effective events without details, last activity, running components), in the order
    /// asked, unknown ids left out. What a catch-up reads. The default summarizes
    /// `get_batches`; a store that keeps summaries as it writes reads no logs.
    async fn get_summaries(&self, ids: &[BatchId]) -> StoreResult<Vec<BatchSummary>> {
        Ok(self.get_batches(ids).await?.iter().map(BatchSummary::of).collect())
    }

    /// `list_batches` summarized (see `get_summaries`): what a rebuild and a reconcile read.
    async fn list_summaries(&self, after: Option<&BatchId>, limit: usize) -> StoreResult<Vec<BatchSummary>> {
        Ok(self.list_batches(after, limit).await?.iter().map(BatchSummary::of).collect())
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
