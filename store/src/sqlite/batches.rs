//! `BatchStore` on the embedded file: each operation runs its blocking work (`reads`, `writes`,
//! `runs`) off the async threads on the store's one connection; appends wait in a group commit.

use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Map, Value};

use super::announced_first::on_disk;
use super::{LATEST_VERSION, SETTLE_FOR, SqliteBackend, WATCHING_POLL, reads, runs, schema, writes};
use crate::port::ready_claims::{ReadyClaimRequest, ReadyClaims};
use crate::port::{
    AnnouncementMark, BatchHead, BatchListing, BatchStore, Cancellation, ChangePage, Claim, CreateOutcome, LogCursor,
    LogPage, RegisteredHandingOn, StoreAbout, StoreError, StoreResult,
};
use crate::wake_history::Taker;
use autocomp_model::{
    Batch, BatchId, BatchSummary, ChangeInterest, ComponentName, Event, NewBatch, NewEvent, Run, RunHolder, Seq,
    Timestamp,
};

#[async_trait]
impl BatchStore for SqliteBackend {
    async fn create_batch(&self, batch: NewBatch) -> StoreResult<CreateOutcome> {
        self.with_connection(move |conn| writes::create_batch(conn, &batch)).await
    }

    async fn register_batch(&self, batch: NewBatch, first: NewEvent) -> StoreResult<CreateOutcome> {
        let cap = self.max_batch_bytes;
        self.register_on_a_stage_path(move |conn| writes::register_batch(conn, &batch, first, cap)).await
    }

    async fn get_batch(&self, id: &BatchId) -> StoreResult<Batch> {
        let id = id.clone();
        self.with_connection(move |conn| {
            reads::get_batches(conn, std::slice::from_ref(&id))?.pop().ok_or(StoreError::NotFound(id))
        })
        .await
    }

    async fn get_batches(&self, ids: &[BatchId]) -> StoreResult<Vec<Batch>> {
        let ids = ids.to_vec();
        self.with_connection(move |conn| reads::get_batches(conn, &ids)).await
    }

    async fn list_batches(&self, after: Option<&BatchId>, limit: usize) -> StoreResult<Vec<Batch>> {
        let after = after.cloned();
        self.with_connection(move |conn| reads::list_batches(conn, after.as_ref(), limit)).await
    }

    async fn get_summaries(&self, ids: &[BatchId]) -> StoreResult<Vec<BatchSummary>> {
        let ids = ids.to_vec();
        self.with_connection(move |conn| reads::get_summaries(conn, &ids)).await
    }

    async fn list_summaries(&self, after: Option<&BatchId>, limit: usize) -> StoreResult<Vec<BatchSummary>> {
        let after = after.cloned();
        self.with_connection(move |conn| reads::list_summaries(conn, after.as_ref(), limit)).await
    }

    async fn batch_head(&self, id: &BatchId) -> StoreResult<BatchHead> {
        let id = id.clone();
        self.with_connection(move |conn| reads::batch_head(conn, &id)).await
    }

    async fn log_page(&self, id: &BatchId, cursor: LogCursor, limit: usize) -> StoreResult<LogPage> {
        let id = id.clone();
        self.with_connection(move |conn| reads::log_page(conn, &id, cursor, limit, None)).await
    }

    async fn log_page_within(
        &self,
        id: &BatchId,
        cursor: LogCursor,
        limit: usize,
        details_up_to: u64,
    ) -> StoreResult<LogPage> {
        let id = id.clone();
        self.with_connection(move |conn| reads::log_page(conn, &id, cursor, limit, Some(details_up_to))).await
    }

    async fn run_state(&self, batch: &BatchId, component: &ComponentName) -> StoreResult<Option<Run>> {
        let (batch, component) = (batch.clone(), component.clone());
        self.with_connection(move |conn| reads::run_state(conn, &batch, &component)).await
    }

    async fn get_listings(&self, ids: &[BatchId]) -> StoreResult<Vec<BatchListing>> {
        let ids = ids.to_vec();
        self.with_connection(move |conn| reads::get_listings(conn, &ids)).await
    }

    async fn set_priority(&self, id: &BatchId, priority: i32) -> StoreResult<Seq> {
        let id = id.clone();
        self.with_connection(move |conn| writes::set_priority(conn, &id, priority)).await
    }

    async fn record_content_change(&self, id: &BatchId, metadata_patch: Map<String, Value>) -> StoreResult<Seq> {
        let (id, cap) = (id.clone(), self.max_batch_bytes);
        self.with_connection(move |conn| writes::record_content_change(conn, &id, metadata_patch, cap)).await
    }

    /// Group commit (`append_queued`), handing nothing on.
    async fn append_event(&self, batch: &BatchId, event: NewEvent) -> StoreResult<Event> {
        self.append_queued(batch, event, Vec::new()).await.map(|handed| handed.event)
    }

    async fn claim(&self, batch: &BatchId, component: &ComponentName, holder: &RunHolder) -> StoreResult<Claim> {
        let (batch, component, holder) = (batch.clone(), component.clone(), holder.clone());
        self.with_connection(move |conn| runs::claim(conn, &batch, &component, &holder)).await
    }

    async fn claim_many(
        &self,
        batches: &[BatchId],
        component: &ComponentName,
        holder: &RunHolder,
    ) -> StoreResult<Vec<StoreResult<Claim>>> {
        let (batches, component, holder) = (batches.to_vec(), component.clone(), holder.clone());
        let served = self.served();
        self.with_connection(move |conn| runs::claim_many(conn, &batches, &component, &holder, served)).await
    }

    async fn claim_ready(&self, request: &ReadyClaimRequest) -> StoreResult<ReadyClaims> {
        let (request, served) = (request.clone(), self.served());
        self.with_connection(move |conn| runs::claim_ready(conn, &request, served)).await
    }

    async fn release(&self, batch: &BatchId, component: &ComponentName, generation: i64) -> StoreResult<()> {
        let (batch, component) = (batch.clone(), component.clone());
        self.with_connection(move |conn| runs::release(conn, &batch, &component, generation)).await
    }

    async fn save_checkpoint(
        &self,
        batch: &BatchId,
        component: &ComponentName,
        generation: i64,
        data: Value,
    ) -> StoreResult<()> {
        let (batch, component) = (batch.clone(), component.clone());
        self.with_connection(move |conn| runs::save_checkpoint(conn, &batch, &component, generation, &data)).await
    }

    async fn load_checkpoint(&self, batch: &BatchId, component: &ComponentName) -> StoreResult<Option<Value>> {
        let (batch, component) = (batch.clone(), component.clone());
        self.with_connection(move |conn| runs::load_checkpoint(conn, &batch, &component)).await
    }

    async fn open_runs(&self, component: Option<&ComponentName>) -> StoreResult<Vec<Run>> {
        let component = component.cloned();
        self.with_connection(move |conn| runs::open_runs(conn, component.as_ref())).await
    }

    async fn failed_attempts(&self, batch: &BatchId, component: &ComponentName, since: Seq) -> StoreResult<u32> {
        let (batch, component) = (batch.clone(), component.clone());
        self.with_connection(move |conn| runs::failed_attempts(conn, &batch, &component, since)).await
    }

    /// Its head is remembered as a head read is (`head`): a wait from it knows what each
    /// commit since concerned without reading the head again.
    async fn changes(&self, since: Seq, limit: usize) -> StoreResult<ChangePage> {
        let mark = self.wakes.mark();
        let page = self.with_connection(move |conn| reads::changes(conn, since, limit)).await?;
        self.wakes.head_read(page.head, mark);
        Ok(page)
    }

    async fn changed_summaries(&self, since: Seq, limit: usize) -> StoreResult<(ChangePage, Vec<BatchSummary>)> {
        let mark = self.wakes.mark();
        let read = self.with_connection(move |conn| reads::changed_summaries(conn, since, limit)).await?;
        self.wakes.head_read(read.0.head, mark);
        Ok(read)
    }

    /// Remembered with the announcements read before it while watching, so a wait from this
    /// head knows what each commit since concerned (`wait_for_change_concerning`).
    async fn head(&self) -> StoreResult<Seq> {
        let mark = self.wakes.mark();
        let head = self.with_connection(reads::head).await?;
        self.wakes.head_read(head, mark);
        Ok(head)
    }

    /// The file is on this host: its clock is the host's.
    async fn about(&self) -> StoreResult<StoreAbout> {
        let schema_version = self.with_connection(|conn| schema::schema_version(conn)).await?;
        Ok(StoreAbout {
            backend: "sqlite".into(),
            schema_version,
            schema_wanted: LATEST_VERSION,
            clock: Timestamp::now(),
        })
    }

    /// Sleeps until a commit is announced in `<store>-wake` (a file watch; any process's
    /// commit), then reads the head; polls every 50 ms where the file cannot be watched, and
    /// every `WATCHING_POLL` anyway. A wake that finds the head unmoved (an announcement read
    /// before its commit's WAL index update reached this process's view) looks again soon,
    /// backing off, for `SETTLE_FOR`.
    async fn wait_for_change(&self, since: Seq, timeout: Duration) -> StoreResult<Seq> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut wakes = self.wakes.wakes();
        let mut settling: Option<(tokio::time::Instant, Duration)> = None;
        loop {
            // Before the read: a commit after it wakes the wait below.
            let watching = wakes.watching();
            let head = self.head().await?;
            let now = tokio::time::Instant::now();
            if head > since || now >= deadline {
                return Ok(head);
            }
            let poll = match settling {
                Some((until, pause)) if now < until => {
                    settling = Some((until, (pause * 2).min(Duration::from_millis(50))));
                    pause
                }
                _ if watching => WATCHING_POLL,
                _ => Duration::from_millis(50),
            };
            tokio::select! {
                _ = wakes.changed() => {
                    if settling.is_none_or(|(until, _)| now >= until) {
                        settling = Some((tokio::time::Instant::now() + SETTLE_FOR, Duration::from_millis(2)));
                    }
                }
                _ = tokio::time::sleep_until((now + poll).min(deadline)) => {}
            }
        }
    }

    /// Reads what the lines of `<store>-wake` announced since `since` (see `WakeHistory`); where
    /// the file cannot be watched, any head move wakes it, as `wait_for_change`.
    async fn wait_for_change_concerning(
        &self,
        since: Seq,
        interest: &ChangeInterest,
        timeout: Duration,
    ) -> StoreResult<Seq> {
        match self.wait_for_concerning_change(since, None, interest, timeout).await? {
            Some(head) => Ok(head),
            None => self.head().await,
        }
    }

    async fn wait_for_concerning_change(
        &self,
        since: Seq,
        read_after: Option<AnnouncementMark>,
        interest: &ChangeInterest,
        timeout: Duration,
    ) -> StoreResult<Option<Seq>> {
        self.wait_as(since, read_after, interest, None, timeout).await
    }

    async fn cancel_run(
        &self,
        batch: &BatchId,
        component: &ComponentName,
        event: NewEvent,
    ) -> StoreResult<Cancellation> {
        let (batch, component, cap) = (batch.clone(), component.clone(), self.max_batch_bytes);
        self.with_connection(move |conn| writes::cancel_run(conn, &batch, &component, event, cap)).await
    }

    async fn prioritize(&self, id: &BatchId, priority: i32, event: NewEvent) -> StoreResult<Event> {
        let (id, cap) = (id.clone(), self.max_batch_bytes);
        self.with_connection(move |conn| writes::prioritize(conn, &id, priority, event, cap)).await
    }

    async fn count_batches(&self) -> StoreResult<u64> {
        self.with_connection(reads::count_batches).await
    }
}

impl SqliteBackend {
    /// `register_batch`, handing the new batch on to the takers of `hand_on`
    /// (`HandOnStore::register_handing_on`).
    pub(super) async fn register_with_hand_ons(
        &self,
        batch: NewBatch,
        first: NewEvent,
        hand_on: &[ComponentName],
    ) -> StoreResult<RegisteredHandingOn> {
        let (cap, hand_on) = (self.max_batch_bytes, hand_on.to_vec());
        self.register_on_a_stage_path(move |conn| writes::register_handing_on(conn, &batch, first, cap, &hand_on)).await
    }

    /// A registration (`register`, its one transaction) written as a stage's write: committed
    /// as its `StageCommit` says, announced, and answered once it is on disk.
    async fn register_on_a_stage_path<T, F>(&self, register: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut rusqlite::Connection) -> StoreResult<T> + Send + 'static,
    {
        self.write_on_a_stage_path(
            move |conn, commit| commit.run(conn, register),
            |registered, synced| on_disk(registered, &synced),
        )
        .await?
        .map_err(|e| self.naming_the_file(e))
    }

    /// `wait_for_concerning_change`, also woken by a run handed to `taker`, if it waits as one
    /// (`HandOnStore::wait_as_taker`).
    pub(super) async fn wait_as(
        &self,
        since: Seq,
        read_after: Option<AnnouncementMark>,
        interest: &ChangeInterest,
        taker: Option<Taker<'_>>,
        timeout: Duration,
    ) -> StoreResult<Option<Seq>> {
        let mut wakes = self.wakes.wakes();
        let mut waiting = crate::wake_history::Waiting {
            history: &self.wakes.history,
            taker,
            complete: || wakes.watching(),
            read_head: || self.head(),
            poll_head: || self.head(),
            poll_complete: WATCHING_POLL,
            poll_incomplete: Duration::from_millis(50),
        };
        waiting.concerning_or_announced(since, read_after, interest, timeout).await
    }
}
