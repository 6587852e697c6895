//! `HttpStore`: the `ObjectStore` port over the store service, so every caller works
//! unchanged with an `http://` URL. Appends and claims always carry an idempotency key (one
//! is made up when the caller gave none), so a retry after a lost answer never records
//! twice nor abandons the run it opened.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Map, Value};

use super::operations::op;
use super::wire;
use crate::pipeline_state::{CursorMove, Enqueued, NewNotice, Notice, NoticeOutcome, Steered};
use crate::port::ready_claims::{ReadyClaimRequest, ReadyClaims};
use crate::port::{
    BatchHead, BatchHistory, BatchListing, BatchStore, Cancellation, ChangePage, Claim, CreateOutcome, LogCursor,
    LogPage, OutboxStore, PruneAnswer, PruneTicket, RegistryStore, RestoreAnswer, RetentionStore, RunOutputStore,
    SavedRunOutput, SeriesStore, SteeringStore, StoreAbout, StoreError, StoreResult,
};
use autocomp_http::api::Operation;
use autocomp_http::client::{CallError, ClientOptions, HttpClient, Retry, client_token};
use autocomp_http::error::ErrorBody;
use autocomp_http::service::{MAX_BODY_BYTES, OPEN_READ_BODY_BYTES};
use autocomp_model::{
    Agent, Batch, BatchId, BatchSummary, ComponentName, Event, IdempotencyKey, NewBatch, NewEvent, PassRecord,
    RegisteredComponent, Run, RunHolder, Seq, Steering, SteeringEntry, SteeringRequest,
};
use autocomp_model::{BacklogSample, ChangeInterest, SeriesStep, Timestamp, WorkPoint};

pub struct HttpStore {
    client: HttpClient,
    /// Makes the idempotency keys of this client unique: host, pid, start time, counter.
    key_prefix: String,
    keys_made: AtomicU64,
    /// The largest request body the service takes from this client: small without a token
    /// (reads open from loopback), so pages of ids are cut to fit it.
    body_limit: usize,
    /// The service does not offer `wait_for_change_concerning` (a release before it): waits
    /// for every change instead, as the port's default does.
    waits_for_every_change: AtomicBool,
}

impl HttpStore {
    /// A client for the store service at `url` (`http://host:port[?retry_for=30s]`); the
    /// token comes from `$AUTOCOMP_TOKEN` or `$AUTOCOMP_TOKEN_FILE`.
    pub fn new(url: &str) -> StoreResult<Self> {
        Self::with_token(url, client_token()?)
    }

    /// A client that sends `token` (or none: reads only, from loopback).
    pub fn with_token(url: &str, token: Option<String>) -> StoreResult<Self> {
        let options = ClientOptions::parse(url, "store url")?;
        let body_limit = if token.is_some() { MAX_BODY_BYTES } else { OPEN_READ_BODY_BYTES };
        let client = HttpClient::new(options, "store service", token)?;
        let key_prefix = crate::write_rules::client_key_prefix("auto");
        Ok(Self {
            client,
            key_prefix,
            keys_made: AtomicU64::new(0),
            body_limit,
            waits_for_every_change: AtomicBool::new(false),
        })
    }

    async fn call<O: Operation>(&self, request: &O::Request, retry: Retry) -> StoreResult<O::Answer> {
        self.client.call::<O>(request, retry, None).await.map_err(StoreError::from)
    }

    /// A read by ids, each id once, in requests of at most what the service takes (ids and
    /// body bytes), answers concatenated. A request the service refuses as too large (its
    /// answer over `MAX_ANSWER_BYTES`) is asked again as two halves, down to single ids,
    /// which it always answers: callers never see the cap.
    async fn by_ids<O, Item>(&self, ids: &[BatchId]) -> StoreResult<Vec<Item>>
    where
        O: Operation<Request = wire::ByIds, Answer = Vec<Item>>,
    {
        let ids = wire::distinct(ids.to_vec());
        let mut answers = Vec::with_capacity(ids.len());
        // Still to ask, the next request on top.
        let mut pending: Vec<&[BatchId]> = self.requests_of(&ids);
        pending.reverse();
        while let Some(chunk) = pending.pop() {
            match self.client.call::<O>(&wire::ByIds { ids: chunk.to_vec() }, Retry::Safe, None).await {
                Ok(items) => answers.extend(items),
                Err(CallError::Api { status, .. })
                    if status == reqwest::StatusCode::PAYLOAD_TOO_LARGE && chunk.len() > 1 =>
                {
                    let (first, second) = chunk.split_at(chunk.len() / 2);
                    pending.extend([second, first]);
                }
                Err(error) => return Err(error.into()),
            }
        }
        Ok(answers)
    }

    /// `ids` cut into requests of at most `MAX_BATCH_PAGE` ids (what the service's stores
    /// read at once) whose bodies fit `body_limit`.
    fn requests_of<'a>(&self, ids: &'a [BatchId]) -> Vec<&'a [BatchId]> {
        // `{"ids":[` and `]}`, with room to spare.
        const ENVELOPE: usize = 64;
        let mut requests = Vec::new();
        let (mut start, mut bytes) = (0, ENVELOPE);
        for (at, id) in ids.iter().enumerate() {
            // Quoted and escaped as JSON, and a comma.
            let size = serde_json::to_string(id.as_str()).map_or(id.as_str().len() * 6, |text| text.len()) + 1;
            if at > start && (bytes + size > self.body_limit || at - start == crate::write_rules::MAX_BATCH_PAGE) {
                requests.push(&ids[start..at]);
                (start, bytes) = (at, ENVELOPE);
            }
            bytes += size;
        }
        if start < ids.len() {
            requests.push(&ids[start..]);
        }
        requests
    }

    /// A listing in id order, `limit` items after `after`, in pages the service answers: a
    /// page refused as too large is asked again at half the size (down to one item).
    async fn listed<O, Item>(
        &self,
        mut after: Option<BatchId>,
        limit: usize,
        id_of: fn(&Item) -> &BatchId,
    ) -> StoreResult<Vec<Item>>
    where
        O: Operation<Request = wire::ListBatches, Answer = Vec<Item>>,
    {
        let limit = limit.min(wire::MAX_ITEMS);
        let (mut answers, mut page) = (Vec::new(), limit);
        while answers.len() < limit {
            let asked = page.min(limit - answers.len());
            let request = wire::ListBatches { after: after.clone(), limit: asked };
            match self.client.call::<O>(&request, Retry::Safe, None).await {
                Ok(items) => {
                    let short = items.len() < asked;
                    answers.extend(items);
                    match answers.last() {
                        Some(last) if !short => after = Some(id_of(last).clone()),
                        _ => break,
                    }
                }
                Err(CallError::Api { status, .. }) if status == reqwest::StatusCode::PAYLOAD_TOO_LARGE && asked > 1 => {
                    page = asked / 2;
                }
                Err(error) => return Err(error.into()),
            }
        }
        Ok(answers)
    }

    fn fresh_key(&self) -> IdempotencyKey {
        let n = self.keys_made.fetch_add(1, Ordering::Relaxed);
        IdempotencyKey::new(format!("{}.{n}", self.key_prefix)).expect("made of printable ASCII, under 128 characters")
    }
}

#[async_trait]
impl BatchStore for HttpStore {
    async fn create_batch(&self, batch: NewBatch) -> StoreResult<CreateOutcome> {
        let answer: wire::Created = self.call::<op::CreateBatch>(&batch, Retry::Safe).await?;
        Ok(answer.into())
    }

    async fn register_batch(&self, batch: NewBatch, first: NewEvent) -> StoreResult<CreateOutcome> {
        let request = wire::RegisterBatch { batch, first };
        let answer = match self.call::<op::RegisterBatch>(&request, Retry::Safe).await {
            Ok(answer) => answer,
            // What an older service offers instead: the batch, then its event, in two
            // commits (a reader may see the batch between them, as before this operation).
            Err(StoreError::ServiceOlder(why)) => {
                tracing::debug!("{why}; registering in two commits instead");
                let wire::RegisterBatch { batch, first } = request;
                return match self.create_batch(batch).await? {
                    CreateOutcome::Created(mut created) => {
                        let event = self.append_event(&created.id, first).await?;
                        created.changed_seq = event.seq;
                        created.events.push(event);
                        Ok(CreateOutcome::Created(created))
                    }
                    existing => Ok(existing),
                };
            }
            Err(other) => return Err(other),
        };
        Ok(answer.into())
    }

    async fn get_batch(&self, id: &BatchId) -> StoreResult<Batch> {
        self.call::<op::GetBatch>(&wire::ById { id: id.clone() }, Retry::Safe).await
    }

    async fn get_batches(&self, ids: &[BatchId]) -> StoreResult<Vec<Batch>> {
        self.by_ids::<op::GetBatches, _>(ids).await
    }

    async fn list_batches(&self, after: Option<&BatchId>, limit: usize) -> StoreResult<Vec<Batch>> {
        self.listed::<op::ListBatches, _>(after.cloned(), limit, |batch| &batch.id).await
    }

    async fn get_summaries(&self, ids: &[BatchId]) -> StoreResult<Vec<BatchSummary>> {
        self.by_ids::<op::GetSummaries, _>(ids).await
    }

    async fn list_summaries(&self, after: Option<&BatchId>, limit: usize) -> StoreResult<Vec<BatchSummary>> {
        self.listed::<op::ListSummaries, _>(after.cloned(), limit, |summary| &summary.id).await
    }

    async fn batch_head(&self, id: &BatchId) -> StoreResult<BatchHead> {
        self.call::<op::BatchHead>(&wire::ById { id: id.clone() }, Retry::Safe).await
    }

    async fn log_page(&self, id: &BatchId, cursor: LogCursor, limit: usize) -> StoreResult<LogPage> {
        self.call::<op::LogPage>(&wire::LogPageRequest::new(id.clone(), cursor, limit), Retry::Safe).await
    }

    async fn log_page_within(
        &self,
        id: &BatchId,
        cursor: LogCursor,
        limit: usize,
        details_up_to: u64,
    ) -> StoreResult<LogPage> {
        let request = wire::LogPageRequest {
            details_up_to: Some(details_up_to),
            ..wire::LogPageRequest::new(id.clone(), cursor, limit)
        };
        self.call::<op::LogPage>(&request, Retry::Safe).await
    }

    async fn run_state(&self, batch: &BatchId, component: &ComponentName) -> StoreResult<Option<Run>> {
        let request = wire::OfComponent { batch: batch.clone(), component: component.clone() };
        let answer: wire::RunStateAnswer = self.call::<op::RunState>(&request, Retry::Safe).await?;
        Ok(answer.run)
    }

    async fn get_listings(&self, ids: &[BatchId]) -> StoreResult<Vec<BatchListing>> {
        self.by_ids::<op::GetListings, _>(ids).await
    }

    async fn set_priority(&self, id: &BatchId, priority: i32) -> StoreResult<Seq> {
        let answer: wire::SeqAnswer =
            self.call::<op::SetPriority>(&wire::SetPriority { id: id.clone(), priority }, Retry::Safe).await?;
        Ok(answer.seq)
    }

    async fn record_content_change(&self, id: &BatchId, metadata_patch: Map<String, Value>) -> StoreResult<Seq> {
        // Merging the same patch twice leaves the same metadata; at worst `modified_seq`
        // moves once more, which re-triggers nothing that had not already been triggered.
        let request = wire::ContentChange { id: id.clone(), metadata_patch };
        let answer: wire::SeqAnswer = self.call::<op::RecordContentChange>(&request, Retry::Safe).await?;
        Ok(answer.seq)
    }

    async fn append_event(&self, batch: &BatchId, mut event: NewEvent) -> StoreResult<Event> {
        if event.idempotency_key.is_none() {
            event.idempotency_key = Some(self.fresh_key());
        }
        self.call::<op::AppendEvent>(&wire::AppendEvent { batch: batch.clone(), event }, Retry::Safe).await
    }

    async fn claim(&self, batch: &BatchId, component: &ComponentName, holder: &RunHolder) -> StoreResult<Claim> {
        // With a claim key a retry returns the run the first attempt opened, instead of
        // abandoning a run we never heard of.
        let holder = holder.keyed(|| self.fresh_key());
        let request = wire::ClaimRequest { batch: batch.clone(), component: component.clone(), holder };
        self.call::<op::Claim>(&request, Retry::Safe).await
    }

    async fn claim_many(
        &self,
        batches: &[BatchId],
        component: &ComponentName,
        holder: &RunHolder,
    ) -> StoreResult<Vec<StoreResult<Claim>>> {
        // Safe to send again after a lost answer because every claim in it carries a claim
        // key (one made up here when the holder has none; keys are per batch and component,
        // so one serves the whole pass): a batch the first attempt claimed answers the run it
        // opened (nothing abandoned, nothing written), one it did not is claimed now, and one
        // whose run moved on since answers `Conflict`, exactly as retried single claims would.
        let holder = holder.keyed(|| self.fresh_key());
        // One request, never chunks: an error must mean that nothing was claimed, and the
        // service refuses (naming the field) more than one request may carry.
        let request = wire::ClaimManyRequest { batches: batches.to_vec(), component: component.clone(), holder };
        let answer: wire::ClaimManyAnswer = self.call::<op::ClaimMany>(&request, Retry::Safe).await?;
        if answer.answers.len() != batches.len() {
            return Err(StoreError::Unavailable(format!(
                "the store service answered {} claims for {} batches",
                answer.answers.len(),
                batches.len()
            )));
        }
        Ok(answer
            .answers
            .into_iter()
            .map(|answer| match answer {
                wire::ClaimAnswer::Claim(claim) => Ok(*claim),
                wire::ClaimAnswer::Error(error) => {
                    Err(CallError::Api { status: reqwest::StatusCode::OK, body: ErrorBody { error } }.into())
                }
            })
            .collect())
    }

    async fn claim_ready(&self, request: &ReadyClaimRequest) -> StoreResult<ReadyClaims> {
        // Safe to send again after a lost answer, as `claim_many` is: every claim carries the
        // claim key, and the service answers a batch holding a run it opened as that run.
        let request = ReadyClaimRequest { holder: request.holder.keyed(|| self.fresh_key()), ..request.clone() };
        let mut claims =
            ReadyClaims { steering: None, held: false, answers: Vec::with_capacity(request.batches.len()) };
        // Still to ask, the next part on top. An answer over `MAX_ANSWER_BYTES` is refused
        // after its claims were made: asked again as two halves with the same claim key (down
        // to single batches, always answered), the service answers the runs it opened.
        let mut pending: Vec<&[BatchId]> = vec![&request.batches];
        while let Some(part) = pending.pop() {
            let asked = ReadyClaimRequest { batches: part.to_vec(), ..request.clone() };
            let answer = match self.client.call::<op::ClaimReady>(&asked, Retry::Safe, None).await {
                Ok(answer) => ready_claims(answer, part.len())?,
                Err(CallError::Api { status, .. })
                    if status == reqwest::StatusCode::PAYLOAD_TOO_LARGE && part.len() > 1 =>
                {
                    let (first, second) = part.split_at(part.len() / 2);
                    pending.extend([second, first]);
                    continue;
                }
                Err(error) => return Err(error.into()),
            };
            // Each part is a newer read of the steering than the one before.
            claims.steering = answer.steering.or(claims.steering);
            if answer.held {
                // Held since an earlier part: its claims go unworked, as a retry's finding a
                // hold leaves them, and are taken over once their holder is gone.
                return Ok(ReadyClaims { steering: claims.steering, held: true, answers: Vec::new() });
            }
            claims.answers.extend(answer.answers);
        }
        Ok(claims)
    }

    async fn release(&self, batch: &BatchId, component: &ComponentName, generation: i64) -> StoreResult<()> {
        let request = wire::RunId { batch: batch.clone(), component: component.clone(), generation };
        let _: wire::Empty = self.call::<op::Release>(&request, Retry::Safe).await?;
        Ok(())
    }

    async fn save_checkpoint(
        &self,
        batch: &BatchId,
        component: &ComponentName,
        generation: i64,
        data: Value,
    ) -> StoreResult<()> {
        let request = wire::SaveCheckpoint { batch: batch.clone(), component: component.clone(), generation, data };
        let _: wire::Empty = self.call::<op::SaveCheckpoint>(&request, Retry::Safe).await?;
        Ok(())
    }

    async fn load_checkpoint(&self, batch: &BatchId, component: &ComponentName) -> StoreResult<Option<Value>> {
        let request = wire::OfComponent { batch: batch.clone(), component: component.clone() };
        let answer: wire::Checkpoint = self.call::<op::LoadCheckpoint>(&request, Retry::Safe).await?;
        Ok(answer.data)
    }

    async fn open_runs(&self, component: Option<&ComponentName>) -> StoreResult<Vec<Run>> {
        self.call::<op::OpenRuns>(&wire::OpenRuns { component: component.cloned() }, Retry::Safe).await
    }

    async fn failed_attempts(&self, batch: &BatchId, component: &ComponentName, since: Seq) -> StoreResult<u32> {
        let request = wire::FailedAttempts { batch: batch.clone(), component: component.clone(), since };
        let answer: wire::Count = self.call::<op::FailedAttempts>(&request, Retry::Safe).await?;
        Ok(u32::try_from(answer.count).unwrap_or(u32::MAX))
    }

    async fn changes(&self, since: Seq, limit: usize) -> StoreResult<ChangePage> {
        self.call::<op::Changes>(&wire::Changes { since, limit: limit.min(wire::MAX_ITEMS) }, Retry::Safe).await
    }

    async fn head(&self) -> StoreResult<Seq> {
        let answer: wire::Head = self.call::<op::Head>(&wire::Empty {}, Retry::Safe).await?;
        Ok(answer.head)
    }

    async fn about(&self) -> StoreResult<StoreAbout> {
        self.call::<op::About>(&wire::Empty {}, Retry::Safe).await
    }

    async fn wait_for_change(&self, since: Seq, timeout: Duration) -> StoreResult<Seq> {
        let timeout = timeout.min(Duration::from_millis(wire::MAX_WAIT_MS));
        let request = wire::WaitForChange { since, timeout_ms: timeout.as_millis() as u64 };
        let answer: wire::Head = self
            .client
            .call::<op::WaitForChange>(&request, Retry::Safe, Some(timeout + Duration::from_secs(10)))
            .await
            .map_err(StoreError::from)?;
        Ok(answer.head)
    }

    async fn wait_for_change_concerning(
        &self,
        since: Seq,
        interest: &ChangeInterest,
        timeout: Duration,
    ) -> StoreResult<Seq> {
        if self.waits_for_every_change.load(Ordering::Relaxed) {
            return self.wait_for_change(since, timeout).await;
        }
        let timeout = timeout.min(Duration::from_millis(wire::MAX_WAIT_MS));
        let request =
            wire::WaitForChangeConcerning { since, interest: interest.clone(), timeout_ms: timeout.as_millis() as u64 };
        let answer = self
            .client
            .call::<op::WaitForChangeConcerning>(&request, Retry::Safe, Some(timeout + Duration::from_secs(10)))
            .await
            .map_err(StoreError::from);
        match answer {
            Ok(answer) => Ok(answer.head),
            // What the service offers instead: a wake for every change (a watcher looks more
            // often, and misses nothing).
            Err(StoreError::ServiceOlder(why)) => {
                tracing::warn!("{why}; meanwhile waiting for every change of the store instead");
                self.waits_for_every_change.store(true, Ordering::Relaxed);
                self.wait_for_change(since, timeout).await
            }
            Err(other) => Err(other),
        }
    }

    async fn cancel_run(
        &self,
        batch: &BatchId,
        component: &ComponentName,
        event: NewEvent,
    ) -> StoreResult<Cancellation> {
        let request = wire::CancelRun { batch: batch.clone(), component: component.clone(), event };
        self.call::<op::CancelRun>(&request, Retry::OnlyUnsent).await
    }

    async fn prioritize(&self, id: &BatchId, priority: i32, event: NewEvent) -> StoreResult<Event> {
        let request = wire::Prioritize { id: id.clone(), priority, event };
        self.call::<op::Prioritize>(&request, Retry::OnlyUnsent).await
    }

    async fn count_batches(&self) -> StoreResult<u64> {
        let answer: wire::Count = self.call::<op::CountBatches>(&wire::Empty {}, Retry::Safe).await?;
        Ok(answer.count)
    }
}

#[async_trait]
impl RegistryStore for HttpStore {
    async fn record_pass(&self, pass: PassRecord) -> StoreResult<()> {
        // A repeated pass report only moves the host's `last_seen` again, unless it carries
        // work: then a repeat would count its results twice.
        let retry = if pass.carries_work() { Retry::OnlyUnsent } else { Retry::Safe };
        let _: wire::Empty = self.call::<op::RecordPass>(&pass, retry).await?;
        Ok(())
    }

    async fn components(&self) -> StoreResult<Vec<RegisteredComponent>> {
        self.call::<op::Components>(&wire::Empty {}, Retry::Safe).await
    }

    async fn retire_component(
        &self,
        name: &ComponentName,
        by: &Agent,
        reason: &str,
    ) -> StoreResult<RegisteredComponent> {
        // Repeated after it was done, it would answer that the component is retired already.
        let request = wire::RetireComponent { name: name.clone(), by: by.clone(), reason: reason.to_string() };
        self.call::<op::RetireComponent>(&request, Retry::OnlyUnsent).await
    }
}

#[async_trait]
impl SteeringStore for HttpStore {
    async fn steering(&self) -> StoreResult<Steering> {
        self.call::<op::Steering>(&wire::Empty {}, Retry::Safe).await
    }

    async fn steer(&self, request: SteeringRequest) -> StoreResult<Steered> {
        // Repeated after it was done, a pause would answer that it is paused already, and a
        // breaker's count would count twice.
        self.call::<op::Steer>(&request, Retry::OnlyUnsent).await
    }

    async fn steering_log(&self, limit: usize) -> StoreResult<Vec<SteeringEntry>> {
        self.call::<op::SteeringLog>(&wire::Limit { limit }, Retry::Safe).await
    }
}

#[async_trait]
impl OutboxStore for HttpStore {
    async fn enqueue_notices(&self, notices: Vec<NewNotice>, cursor: Option<CursorMove>) -> StoreResult<Enqueued> {
        // Safe to repeat: keys already held are not added again, and the cursor moves only from
        // where it was read.
        self.call::<op::EnqueueNotices>(&wire::EnqueueNotices { notices, cursor }, Retry::Safe).await
    }

    async fn take_notices(&self, holder: &str, limit: usize, lease: Duration) -> StoreResult<Vec<Notice>> {
        let request = wire::TakeNotices { holder: holder.to_owned(), limit, lease_ms: lease.as_millis() as u64 };
        // A repeat would take (and lease) the next ones; the first answer's are leased until
        // their lease runs out, then taken again: late, never lost.
        self.call::<op::TakeNotices>(&request, Retry::OnlyUnsent).await
    }

    async fn settle_notice(&self, key: &str, holder: &str, outcome: NoticeOutcome) -> StoreResult<()> {
        let request = wire::SettleNotice { key: key.to_owned(), holder: holder.to_owned(), outcome };
        let _: wire::Empty = self.call::<op::SettleNotice>(&request, Retry::OnlyUnsent).await?;
        Ok(())
    }

    async fn recent_notices(&self, limit: usize) -> StoreResult<Vec<Notice>> {
        self.call::<op::RecentNotices>(&wire::Limit { limit }, Retry::Safe).await
    }
}

#[async_trait]
impl SeriesStore for HttpStore {
    async fn work_series(
        &self,
        step: SeriesStep,
        since: Timestamp,
        component: Option<&ComponentName>,
    ) -> StoreResult<Vec<WorkPoint>> {
        let request = wire::WorkSeriesRequest { step, since, component: component.cloned() };
        self.call::<op::WorkSeries>(&request, Retry::Safe).await
    }

    async fn record_backlog(&self, samples: Vec<BacklogSample>) -> StoreResult<()> {
        // A sample replaces the step's last one: sending it twice changes nothing.
        self.call::<op::RecordBacklog>(&wire::RecordBacklog { samples }, Retry::Safe).await.map(|_| ())
    }
}

#[async_trait]
impl RunOutputStore for HttpStore {
    async fn set_run_output(
        &self,
        batch: &BatchId,
        component: &ComponentName,
        generation: i64,
        output: Option<autocomp_model::RunOutput>,
        whole: bool,
    ) -> StoreResult<()> {
        // Replacing (or removing) what was saved: sending it twice changes nothing.
        let (batch, component) = (batch.clone(), component.clone());
        let request = wire::SetRunOutput { batch, component, generation, output, whole };
        let _: wire::Empty = self.call::<op::SetRunOutput>(&request, Retry::Safe).await?;
        Ok(())
    }

    async fn run_outputs(&self, batch: &BatchId) -> StoreResult<Vec<SavedRunOutput>> {
        let request = wire::ById { id: batch.clone() };
        let answer: wire::RunOutputs = self.call::<op::GetRunOutputs>(&request, Retry::Safe).await?;
        Ok(answer.outputs)
    }
}

#[async_trait]
impl RetentionStore for HttpStore {
    async fn histories(&self, ids: &[BatchId]) -> StoreResult<Vec<BatchHistory>> {
        // Refused as the other backends' `Checked` refuses it, repeats counted: `by_ids` drops
        // repeats before it sends, so the service alone would take what a store refuses.
        crate::write_rules::check_page("ids", ids.len(), crate::port::MAX_RETENTION_PAGE)?;
        // An answer over `MAX_ANSWER_BYTES` (histories of batches near their own cap) is asked
        // again in halves: an export never meets the cap.
        self.by_ids::<op::GetHistories, _>(ids).await
    }

    async fn prune_histories(&self, tickets: Vec<PruneTicket>) -> StoreResult<Vec<PruneAnswer>> {
        // Sent again after a lost answer, a pruned batch is answered `already_pruned`.
        self.call::<op::PruneHistories>(&wire::PruneHistories { tickets }, Retry::Safe).await
    }

    async fn restore_histories(&self, histories: Vec<BatchHistory>) -> StoreResult<Vec<RestoreAnswer>> {
        // Sent again after a lost answer, a restored batch is answered `not_pruned`.
        self.call::<op::RestoreHistories>(&wire::RestoreHistories { histories }, Retry::Safe).await
    }
}

/// `claim_ready`'s answer to a request of `asked` batches, each batch's error as `claim` would
/// return it.
fn ready_claims(answer: wire::ReadyClaimsAnswer, asked: usize) -> StoreResult<ReadyClaims> {
    if !answer.held && answer.answers.len() != asked {
        return Err(StoreError::Unavailable(format!(
            "the store service answered {} claims for {asked} batches",
            answer.answers.len()
        )));
    }
    let answers = answer
        .answers
        .into_iter()
        .map(|answer| match answer {
            wire::ReadyClaimAnswer::Ready(ready) => Ok(*ready),
            wire::ReadyClaimAnswer::Error(error) => {
                Err(CallError::Api { status: reqwest::StatusCode::OK, body: ErrorBody { error } }.into())
            }
        })
        .collect();
    Ok(ReadyClaims { steering: answer.steering, held: answer.held, answers })
}

/// Keeps no takers (the defaults): the store service does not yet carry the hand-on
/// operations, so a component behind it claims every batch by its pass.
#[async_trait]
impl crate::port::HandOnStore for HttpStore {}
