//! `BatchStore` on PostgreSQL: a write is one call of its server-side function; one that depends
//! on what the batch holds (a metadata merge, a cancel's record of the run it closes, a
//! prioritize's old priority) reads first, computes the write here with the rules every
//! backend shares, and sends it with what it read as a condition: if the batch moved in
//! between, nothing is written and it reads again. The long operations are in `reads`,
//! `writes` and `runs`.

use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Map, Value};

use super::calls::{Scope, prepare};
use super::rows::{BATCH_SELECT, SUMMARY_COLUMNS, SUMMARY_FROM, batch_from_row, run_from_json, summary_from_row};
use super::text::{self};
use super::{PgBackend, Retry};
use crate::port::ready_claims::{ReadyClaimRequest, ReadyClaims};
use crate::port::{
    AnnouncementMark, BatchHead, BatchListing, BatchStore, Cancellation, ChangePage, Claim, CreateOutcome, LogCursor,
    LogPage, StoreAbout, StoreError, StoreResult,
};
use autocomp_model::{
    Batch, BatchId, BatchSummary, ChangeInterest, ComponentName, Event, NewBatch, NewEvent, Run, RunHolder, Seq,
    Timestamp,
};

#[async_trait]
impl BatchStore for PgBackend {
    async fn create_batch(&self, batch: NewBatch) -> StoreResult<CreateOutcome> {
        self.pg_create_batch(batch).await
    }

    async fn register_batch(&self, batch: NewBatch, first: NewEvent) -> StoreResult<CreateOutcome> {
        self.pg_register_batch(batch, first).await
    }

    async fn get_batch(&self, id: &BatchId) -> StoreResult<Batch> {
        let mut found = self.load_batches(vec![id.as_str().to_string()]).await?;
        found.remove(id.as_str()).ok_or_else(|| StoreError::NotFound(id.clone()))
    }

    async fn get_batches(&self, ids: &[BatchId]) -> StoreResult<Vec<Batch>> {
        let mut found = self.load_batches(ids.iter().map(|id| id.as_str().to_string()).collect()).await?;
        Ok(ids.iter().filter_map(|id| found.remove(id.as_str())).collect())
    }

    async fn list_batches(&self, after: Option<&BatchId>, limit: usize) -> StoreResult<Vec<Batch>> {
        let sql = format!("{BATCH_SELECT} WHERE b.id > $1 ORDER BY b.id LIMIT $2");
        self.list_page("list_batches", &sql, after, limit, batch_from_row).await
    }

    async fn get_summaries(&self, ids: &[BatchId]) -> StoreResult<Vec<BatchSummary>> {
        self.pg_get_summaries(ids).await
    }

    async fn list_summaries(&self, after: Option<&BatchId>, limit: usize) -> StoreResult<Vec<BatchSummary>> {
        let sql = format!("SELECT {SUMMARY_COLUMNS} {SUMMARY_FROM} WHERE b.id > $1 ORDER BY b.id LIMIT $2");
        self.list_page("list_summaries", &sql, after, limit, summary_from_row).await
    }

    async fn batch_head(&self, id: &BatchId) -> StoreResult<BatchHead> {
        self.pg_batch_head(id).await
    }

    /// One statement: the page through the log's (batch, seq) index, the log's first and
    /// last seq (index ends) and its length (the batch row's count).
    async fn log_page(&self, id: &BatchId, cursor: LogCursor, limit: usize) -> StoreResult<LogPage> {
        self.log_page_sized(id, cursor, limit, None).await
    }

    async fn log_page_within(
        &self,
        id: &BatchId,
        cursor: LogCursor,
        limit: usize,
        details_up_to: u64,
    ) -> StoreResult<LogPage> {
        self.log_page_sized(id, cursor, limit, Some(details_up_to)).await
    }

    async fn run_state(&self, batch: &BatchId, component: &ComponentName) -> StoreResult<Option<Run>> {
        self.pg_run_state(batch, component).await
    }

    async fn get_listings(&self, ids: &[BatchId]) -> StoreResult<Vec<BatchListing>> {
        self.pg_get_listings(ids).await
    }

    async fn set_priority(&self, id: &BatchId, priority: i32) -> StoreResult<Seq> {
        self.run("set_priority", Retry::Safe, |client, _| {
            Box::pin(async move {
                let statement = prepare(client, "SELECT autocomp_set_priority($1, $2)").await?;
                let row = client
                    .query_one(&statement, &[&id.as_str(), &priority])
                    .await
                    .map_err(|e| self.failure(e, &Scope { batch: id, run: None }))?;
                Ok(Seq(row.get(0)))
            })
        })
        .await
    }

    async fn record_content_change(&self, id: &BatchId, metadata_patch: Map<String, Value>) -> StoreResult<Seq> {
        self.pg_record_content_change(id, metadata_patch).await
    }

    /// Group commit (`appends`): concurrent appends share one call and one commit.
    async fn append_event(&self, batch: &BatchId, event: NewEvent) -> StoreResult<Event> {
        self.pg_append(batch, event, Vec::new()).await.map(|handed| handed.event)
    }

    async fn claim(&self, batch: &BatchId, component: &ComponentName, holder: &RunHolder) -> StoreResult<Claim> {
        self.pg_claim(batch, component, holder).await
    }

    async fn claim_many(
        &self,
        batches: &[BatchId],
        component: &ComponentName,
        holder: &RunHolder,
    ) -> StoreResult<Vec<StoreResult<Claim>>> {
        self.pg_claim_many(batches, component, holder).await
    }

    async fn release(&self, batch: &BatchId, component: &ComponentName, generation: i64) -> StoreResult<()> {
        self.run("release", Retry::Safe, |client, _| {
            Box::pin(async move {
                let statement = prepare(client, "SELECT autocomp_release($1, $2, $3)").await?;
                client
                    .execute(&statement, &[&batch.as_str(), &component.as_str(), &generation])
                    .await
                    .map_err(|e| self.failure(e, &Scope { batch, run: Some((component, generation)) }))?;
                Ok(())
            })
        })
        .await
    }

    async fn save_checkpoint(
        &self,
        batch: &BatchId,
        component: &ComponentName,
        generation: i64,
        data: Value,
    ) -> StoreResult<()> {
        let data = &*text::json(&data);
        self.run("save_checkpoint", Retry::Safe, |client, _| {
            Box::pin(async move {
                let statement = prepare(client, "SELECT autocomp_save_checkpoint($1, $2, $3, $4)").await?;
                client
                    .execute(&statement, &[&batch.as_str(), &component.as_str(), &generation, data])
                    .await
                    .map_err(|e| self.failure(e, &Scope { batch, run: Some((component, generation)) }))?;
                Ok(())
            })
        })
        .await
    }

    async fn claim_ready(&self, request: &ReadyClaimRequest) -> StoreResult<ReadyClaims> {
        let claims = self.pg_claim_ready(request).await?;
        self.forget_dead_takers(request, &claims).await;
        Ok(claims)
    }

    async fn claim_ready_judged(&self, request: &ReadyClaimRequest, judged: &[Seq]) -> StoreResult<ReadyClaims> {
        self.pg_claim_ready_judged(request, judged).await
    }

    async fn load_checkpoint(&self, batch: &BatchId, component: &ComponentName) -> StoreResult<Option<Value>> {
        self.pg_load_checkpoint(batch, component).await
    }

    async fn open_runs(&self, component: Option<&ComponentName>) -> StoreResult<Vec<Run>> {
        let component = component.map(ComponentName::as_str);
        self.run("open_runs", Retry::Safe, |client, _| {
            Box::pin(async move {
                let statement = prepare(
                    client,
                    "SELECT to_jsonb(r)::text FROM runs r WHERE state = 'open' AND ($1::text IS NULL OR component = $1)
                     ORDER BY batch_id, component, generation",
                )
                .await?;
                let rows = client.query(&statement, &[&component]).await.map_err(|e| self.read_failure(e))?;
                rows.iter().map(|row| run_from_json(row.get(0))).collect()
            })
        })
        .await
    }

    async fn failed_attempts(&self, batch: &BatchId, component: &ComponentName, since: Seq) -> StoreResult<u32> {
        self.run("failed_attempts", Retry::Safe, |client, _| {
            Box::pin(async move {
                let statement = prepare(
                    client,
                    "SELECT COUNT(*) FROM runs WHERE batch_id = $1 AND component = $2 AND claim_seq > $3
                       AND (state = 'abandoned' OR transient)",
                )
                .await?;
                let row = client
                    .query_one(&statement, &[&batch.as_str(), &component.as_str(), &since.0])
                    .await
                    .map_err(|e| self.read_failure(e))?;
                Ok(u32::try_from(row.get::<_, i64>(0)).unwrap_or(u32::MAX))
            })
        })
        .await
    }

    async fn changes(&self, since: Seq, limit: usize) -> StoreResult<ChangePage> {
        self.pg_changes(since, limit).await
    }

    async fn changed_summaries(&self, since: Seq, limit: usize) -> StoreResult<(ChangePage, Vec<BatchSummary>)> {
        self.pg_changed_summaries(since, limit).await
    }

    /// Remembered with the notifications received before it while listening, so a wait from
    /// this head knows what each commit since concerned (`wait_for_change_concerning`).
    async fn head(&self) -> StoreResult<Seq> {
        let mark = self.inner.listener.mark();
        let head = self.horizon().await?;
        self.inner.listener.head_read(head, mark);
        Ok(head)
    }

    /// The server's clock is `autocomp_now()`, what stamps passes and the work series.
    async fn about(&self) -> StoreResult<StoreAbout> {
        let clock = self.read_number("about", "SELECT autocomp_now()").await?;
        let schema_version = self.schema_version().await?;
        Ok(StoreAbout {
            backend: "postgres".into(),
            schema_version: schema_version.into(),
            schema_wanted: super::LATEST_VERSION.into(),
            clock: Timestamp(clock),
        })
    }

    async fn wait_for_change(&self, since: Seq, timeout: Duration) -> StoreResult<Seq> {
        self.pg_wait_for_change(since, timeout).await
    }

    async fn wait_for_change_concerning(
        &self,
        since: Seq,
        interest: &ChangeInterest,
        timeout: Duration,
    ) -> StoreResult<Seq> {
        self.pg_wait_for_change_concerning(since, interest, timeout).await
    }

    async fn announcement_mark(&self) -> Option<AnnouncementMark> {
        self.inner.listener.mark().map(AnnouncementMark)
    }

    async fn wait_for_concerning_change(
        &self,
        since: Seq,
        read_after: Option<AnnouncementMark>,
        interest: &ChangeInterest,
        timeout: Duration,
    ) -> StoreResult<Option<Seq>> {
        self.pg_wait_for_concerning_change(since, read_after, interest, None, timeout).await
    }

    async fn cancel_run(
        &self,
        batch: &BatchId,
        component: &ComponentName,
        event: NewEvent,
    ) -> StoreResult<Cancellation> {
        self.pg_cancel_run(batch, component, event).await
    }

    async fn prioritize(&self, id: &BatchId, priority: i32, event: NewEvent) -> StoreResult<Event> {
        self.pg_prioritize(id, priority, event).await
    }

    async fn count_batches(&self) -> StoreResult<u64> {
        let count = self.read_number("count_batches", "SELECT COUNT(*) FROM batches").await?;
        Ok(count.max(0) as u64)
    }
}
