//! `Checked`: the bound and input checks every SQL backend shares, done once in a wrapper around
//! it (as a `Directory` is wrapped by a managed one), so a backend only stores and a new backend
//! cannot forget one. `SqliteStore` and `PgStore` are their backends checked; the store service
//! checks for `HttpStore` at the other end. Checks that depend on what the store holds (a
//! batch's bytes, a run's fence) stay with the backend that reads it.

use std::ops::Deref;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Map, Value};

use crate::pipeline_state::{CursorMove, Enqueued, NewNotice, Notice, NoticeOutcome, Steered};
use crate::port::{
    BatchHead, BatchListing, BatchStore, Cancellation, ChangePage, Claim, CreateOutcome, LogCursor, LogPage,
    OutboxStore, RegistryStore, SeriesStore, SteeringStore, StoreAbout, StoreResult, check_log_limit,
};
use crate::steering_rules;
use crate::write_rules::{self, MAX_BATCH_PAGE, MAX_CHANGE_PAGE, page_too_large};
use autocomp_model::{
    Agent, BacklogSample, Batch, BatchId, BatchSummary, ComponentName, Event, NewBatch, NewEvent, PassRecord,
    RegisteredComponent, Run, RunHolder, Seq, SeriesStep, Steering, SteeringEntry, SteeringRequest, Timestamp,
    WorkPoint,
};

/// A backend behind the checks: every operation is checked, then handed to the backend.
/// Derefs to the backend for what is its own (its file, its schema version).
#[derive(Clone)]
pub struct Checked<S> {
    inner: S,
}

impl<S> Checked<S> {
    pub fn new(inner: S) -> Self {
        Self { inner }
    }
}

impl<S> Deref for Checked<S> {
    type Target = S;

    fn deref(&self) -> &S {
        &self.inner
    }
}

/// What the SQL backends read at most at once (ids asked, a listing's limit), refused past it.
fn page(field: &str, asked: usize, max: usize) -> StoreResult<()> {
    if asked > max {
        return Err(page_too_large(field, asked, max));
    }
    Ok(())
}

#[async_trait]
impl<S: BatchStore> BatchStore for Checked<S> {
    async fn create_batch(&self, batch: NewBatch) -> StoreResult<CreateOutcome> {
        batch.validate()?;
        self.inner.create_batch(batch).await
    }

    async fn get_batch(&self, id: &BatchId) -> StoreResult<Batch> {
        self.inner.get_batch(id).await
    }

    async fn get_batches(&self, ids: &[BatchId]) -> StoreResult<Vec<Batch>> {
        page("ids", ids.len(), MAX_BATCH_PAGE)?;
        self.inner.get_batches(ids).await
    }

    async fn list_batches(&self, after: Option<&BatchId>, limit: usize) -> StoreResult<Vec<Batch>> {
        page("limit", limit, MAX_BATCH_PAGE)?;
        self.inner.list_batches(after, limit).await
    }

    async fn get_summaries(&self, ids: &[BatchId]) -> StoreResult<Vec<BatchSummary>> {
        page("ids", ids.len(), MAX_BATCH_PAGE)?;
        self.inner.get_summaries(ids).await
    }

    async fn list_summaries(&self, after: Option<&BatchId>, limit: usize) -> StoreResult<Vec<BatchSummary>> {
        page("limit", limit, MAX_BATCH_PAGE)?;
        self.inner.list_summaries(after, limit).await
    }

    async fn batch_head(&self, id: &BatchId) -> StoreResult<BatchHead> {
        self.inner.batch_head(id).await
    }

    async fn log_page(&self, id: &BatchId, cursor: LogCursor, limit: usize) -> StoreResult<LogPage> {
        check_log_limit(limit)?;
        self.inner.log_page(id, cursor, limit).await
    }

    async fn log_page_within(
        &self,
        id: &BatchId,
        cursor: LogCursor,
        limit: usize,
        details_up_to: u64,
    ) -> StoreResult<LogPage> {
        check_log_limit(limit)?;
        self.inner.log_page_within(id, cursor, limit, details_up_to).await
    }

    async fn run_state(&self, batch: &BatchId, component: &ComponentName) -> StoreResult<Option<Run>> {
        self.inner.run_state(batch, component).await
    }

    async fn get_listings(&self, ids: &[BatchId]) -> StoreResult<Vec<BatchListing>> {
        page("ids", ids.len(), MAX_BATCH_PAGE)?;
        self.inner.get_listings(ids).await
    }

    async fn set_priority(&self, id: &BatchId, priority: i32) -> StoreResult<Seq> {
        self.inner.set_priority(id, priority).await
    }

    async fn record_content_change(&self, id: &BatchId, metadata_patch: Map<String, Value>) -> StoreResult<Seq> {
        self.inner.record_content_change(id, metadata_patch).await
    }

    async fn append_event(&self, batch: &BatchId, event: NewEvent) -> StoreResult<Event> {
        event.validate()?;
        self.inner.append_event(batch, event).await
    }

    async fn claim(&self, batch: &BatchId, component: &ComponentName, holder: &RunHolder) -> StoreResult<Claim> {
        holder.validate()?;
        self.inner.claim(batch, component, holder).await
    }

    async fn claim_many(
        &self,
        batches: &[BatchId],
        component: &ComponentName,
        holder: &RunHolder,
    ) -> StoreResult<Vec<StoreResult<Claim>>> {
        holder.validate()?;
        page("batches", batches.len(), MAX_BATCH_PAGE)?;
        self.inner.claim_many(batches, component, holder).await
    }

    async fn release(&self, batch: &BatchId, component: &ComponentName, generation: i64) -> StoreResult<()> {
        self.inner.release(batch, component, generation).await
    }

    async fn save_checkpoint(
        &self,
        batch: &BatchId,
        component: &ComponentName,
        generation: i64,
        data: Value,
    ) -> StoreResult<()> {
        autocomp_model::check_object("checkpoint", &data)?;
        self.inner.save_checkpoint(batch, component, generation, data).await
    }

    async fn load_checkpoint(&self, batch: &BatchId, component: &ComponentName) -> StoreResult<Option<Value>> {
        self.inner.load_checkpoint(batch, component).await
    }

    async fn open_runs(&self, component: Option<&ComponentName>) -> StoreResult<Vec<Run>> {
        self.inner.open_runs(component).await
    }

    async fn failed_attempts(&self, batch: &BatchId, component: &ComponentName, since: Seq) -> StoreResult<u32> {
        self.inner.failed_attempts(batch, component, since).await
    }

    async fn changes(&self, since: Seq, limit: usize) -> StoreResult<ChangePage> {
        page("limit", limit, MAX_CHANGE_PAGE)?;
        self.inner.changes(since, limit).await
    }

    async fn head(&self) -> StoreResult<Seq> {
        self.inner.head().await
    }

    async fn about(&self) -> StoreResult<StoreAbout> {
        self.inner.about().await
    }

    async fn wait_for_change(&self, since: Seq, timeout: Duration) -> StoreResult<Seq> {
        self.inner.wait_for_change(since, timeout).await
    }

    async fn cancel_run(
        &self,
        batch: &BatchId,
        component: &ComponentName,
        event: NewEvent,
    ) -> StoreResult<Cancellation> {
        event.validate()?;
        write_rules::check_cancellation(&event)?;
        self.inner.cancel_run(batch, component, event).await
    }

    async fn prioritize(&self, id: &BatchId, priority: i32, event: NewEvent) -> StoreResult<Event> {
        event.validate()?;
        write_rules::check_operator_event(&event, "prioritize")?;
        self.inner.prioritize(id, priority, event).await
    }

    async fn count_batches(&self) -> StoreResult<u64> {
        self.inner.count_batches().await
    }
}

#[async_trait]
impl<S: RegistryStore> RegistryStore for Checked<S> {
    async fn record_pass(&self, pass: PassRecord) -> StoreResult<()> {
        pass.validate()?;
        self.inner.record_pass(pass).await
    }

    async fn components(&self) -> StoreResult<Vec<RegisteredComponent>> {
        self.inner.components().await
    }

    async fn retire_component(
        &self,
        name: &ComponentName,
        by: &Agent,
        reason: &str,
    ) -> StoreResult<RegisteredComponent> {
        let reason = write_rules::retirement_reason(reason)?;
        self.inner.retire_component(name, by, &reason).await
    }
}

#[async_trait]
impl<S: SteeringStore> SteeringStore for Checked<S> {
    async fn steering(&self) -> StoreResult<Steering> {
        self.inner.steering().await
    }

    async fn steer(&self, request: SteeringRequest) -> StoreResult<Steered> {
        steering_rules::check_steering(&request)?;
        self.inner.steer(request).await
    }

    async fn steering_log(&self, limit: usize) -> StoreResult<Vec<SteeringEntry>> {
        steering_rules::check_log_limit(limit)?;
        self.inner.steering_log(limit).await
    }
}

#[async_trait]
impl<S: OutboxStore> OutboxStore for Checked<S> {
    async fn enqueue_notices(&self, notices: Vec<NewNotice>, cursor: Option<CursorMove>) -> StoreResult<Enqueued> {
        steering_rules::check_notices(&notices)?;
        steering_rules::check_cursor(&cursor)?;
        self.inner.enqueue_notices(notices, cursor).await
    }

    async fn take_notices(&self, holder: &str, limit: usize, lease: Duration) -> StoreResult<Vec<Notice>> {
        steering_rules::check_take(holder, limit, lease)?;
        self.inner.take_notices(holder, limit, lease).await
    }

    async fn settle_notice(&self, key: &str, holder: &str, outcome: NoticeOutcome) -> StoreResult<()> {
        steering_rules::check_settle(key, holder, &outcome)?;
        self.inner.settle_notice(key, holder, outcome).await
    }

    async fn recent_notices(&self, limit: usize) -> StoreResult<Vec<Notice>> {
        steering_rules::check_take("reader", limit, Duration::from_secs(1))?;
        self.inner.recent_notices(limit).await
    }
}

#[async_trait]
impl<S: SeriesStore> SeriesStore for Checked<S> {
    async fn work_series(
        &self,
        step: SeriesStep,
        since: Timestamp,
        component: Option<&ComponentName>,
    ) -> StoreResult<Vec<WorkPoint>> {
        self.inner.work_series(step, since, component).await
    }

    async fn record_backlog(&self, samples: Vec<BacklogSample>) -> StoreResult<()> {
        write_rules::check_backlog(&samples)?;
        self.inner.record_backlog(samples).await
    }
}
