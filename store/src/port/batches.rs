//! `BatchStore`: batches and their runs, the change feed and the store's own description: the
//! operations every component's pass and every reader of batches use. Apart from the pipeline-wide
//! state (registry, steering, outbox, series), which only operators, runners and the monitor touch.

use std::time::Duration;

use serde_json::{Map, Value};

use autocomp_model::{
    Batch, BatchId, BatchSummary, ChangeInterest, ComponentName, Event, NewBatch, NewEvent, Run, RunHolder, Seq,
};

use super::ready_claims::{self, ReadyClaimRequest, ReadyClaims};
use super::{
    AnnouncementMark, BatchHead, BatchListing, Cancellation, ChangePage, Claim, CreateOutcome, LogCursor, LogPage,
    StoreAbout, StoreError, StoreResult, check_log_limit,
};
use crate::write_rules::{self, MAX_BATCH_PAGE, MAX_CHANGE_PAGE};

port_trait! {
    /// Batches, their logs and runs, and the change feed.
    pub trait BatchStore {
        /// Registers a batch. Idempotent when an identical batch exists; a different one with the
        /// same id is a `Conflict`.
        #[checked(batch.validate()?)]
        async fn create_batch(&self, batch: NewBatch) -> StoreResult<CreateOutcome>;

        /// Registers a batch with its first event in one commit (a delivery recorded as it is
        /// registered): no reader sees the batch without the event, and its watchers wake once.
        /// Idempotent by the batch's id, as `create_batch`: when an identical batch exists
        /// nothing is written and the answer is `AlreadyExists` with that batch (which lacks
        /// `first` only if it was registered without it: the caller appends it then). `first`
        /// names no run (a new batch has none) and no idempotency key (the id is the key); an
        /// event the store refuses (`Invalid`, over the cap) registers nothing.
        #[checked(batch.validate()?; first.validate()?; write_rules::check_first_event(&first)?)]
        async fn register_batch(&self, batch: NewBatch, first: NewEvent) -> StoreResult<CreateOutcome>;

        /// A whole batch: header, its whole log and open runs. Its cost grows with the log; to
        /// show or decide something about a batch read `batch_head` (and `log_page`), or
        /// `run_state` for one run, instead.
        async fn get_batch(&self, id: &BatchId) -> StoreResult<Batch>;

        /// The named batches that exist, whole, in the order asked, each once however often it is
        /// named (at its first place); unknown ids are left out. Listings read `get_listings` or `get_summaries` instead.
        #[checked(write_rules::check_page("ids", ids.len(), MAX_BATCH_PAGE)?)]
        async fn get_batches(&self, ids: &[BatchId]) -> StoreResult<Vec<Batch>>;

        /// Batches in id order, starting after `after`, at most `limit` of them.
        #[checked(write_rules::check_page("limit", limit, MAX_BATCH_PAGE)?)]
        async fn list_batches(&self, after: Option<&BatchId>, limit: usize) -> StoreResult<Vec<Batch>>;

        /// `get_batches` as the batch index needs it: each batch's `BatchSummary` (header,
        /// effective events without details, last activity, running components), in the order
        /// asked, each once, unknown ids left out. What a catch-up reads. The default summarizes
        /// `get_batches`; a store that keeps summaries as it writes reads no logs.
        #[checked(write_rules::check_page("ids", ids.len(), MAX_BATCH_PAGE)?)]
        async fn get_summaries(&self, ids: &[BatchId]) -> StoreResult<Vec<BatchSummary>> {
            Ok(self.get_batches(ids).await?.iter().map(BatchSummary::of).collect())
        }

        /// `list_batches` summarized (see `get_summaries`): what a rebuild and a reconcile read.
        #[checked(write_rules::check_page("limit", limit, MAX_BATCH_PAGE)?)]
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
        /// The default reads the whole batch (`LogPage::of`), as `batch_head`'s does; the limit
        /// is checked by the `Checked` wrapper, as every declared check is.
        #[checked(check_log_limit(limit)?)]
        async fn log_page(&self, id: &BatchId, cursor: LogCursor, limit: usize) -> StoreResult<LogPage> {
            Ok(LogPage::of(&self.get_batch(id).await?, cursor, limit))
        }

        /// `log_page` read by size: an event whose details pass `details_up_to` bytes (as
        /// compact JSON text) comes without them (`details` null) and is listed in
        /// `details_left_out` with their size, so a page costs at most about `limit` times
        /// `details_up_to` however large its events are; `event_at` reads one whole. The stores
        /// of this crate leave the details in the database; the default trims a whole page.
        #[checked(check_log_limit(limit)?)]
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
        #[checked(write_rules::check_page("ids", ids.len(), MAX_BATCH_PAGE)?)]
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
        #[checked(event.validate()?)]
        async fn append_event(&self, batch: &BatchId, event: NewEvent) -> StoreResult<Event>;

        /// Opens a new run of (batch, component) with the next generation; a run still open is
        /// marked abandoned (and fenced from then on), unless it is the batch's lock (its holder
        /// names a liveness): then the claim is a `Conflict` naming that run and its holder, and
        /// nothing is written (only an exclusive `claim_ready` takes such a run over).
        #[checked(holder.validate()?)]
        async fn claim(&self, batch: &BatchId, component: &ComponentName, holder: &RunHolder) -> StoreResult<Claim>;

        /// Claims several batches for one component at once, as one transaction (one commit): a
        /// pass claims everything it will work on together. Each answer is what `claim` would
        /// have answered for that batch, in the order asked; a batch's own error (`NotFound`,
        /// `Invalid`, the `Conflict` of a batch whose open run is its lock) does not keep the
        /// others from being claimed. The outer error means nothing
        /// was claimed. The default claims one by one (one transaction each, never an outer error),
        /// for adapters without a cheaper way.
        #[checked(holder.validate()?; write_rules::check_page("batches", batches.len(), MAX_BATCH_PAGE)?)]
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

        /// A pass's claim round in one transaction (one commit): unless forced, a held component
        /// (its own hold or the whole pipeline's) claims nothing (`held`); otherwise each batch is
        /// read, re-checked with the descriptor's `readiness` (all of them, when forced) and, if
        /// ready, claimed as `claim` would claim it, answered with what `failed_attempts` (from
        /// its event type's newest `Reset`) and `load_checkpoint` answer before the claim. A batch
        /// no longer ready is answered as read, and nothing is written for it; a batch the store
        /// does not have is its own `NotFound`. The steering comes back when its version is not
        /// the one the caller knows. The outer error means nothing was claimed. Exclusive, a
        /// batch whose open run of the component is another claim's, not taken over by
        /// `takeovers` with its generation and liveness, is answered `held` with that run and
        /// nothing is written for it; the claim commits durably. Not exclusive, so is a batch
        /// whose open run is its lock (its holder names a liveness), whatever `takeovers` says. Adapters that cannot do this
        /// in one transaction must not implement it: the default refuses.
        #[checked(ready_claims::check_request(request)?)]
        async fn claim_ready(&self, request: &ReadyClaimRequest) -> StoreResult<ReadyClaims> {
            let _ = request;
            Err(StoreError::Unavailable("this store adapter does not support claim_ready".into()))
        }

        /// `claim_ready` for batches the caller found ready with the request's descriptor on
        /// their summaries (at a time the store's clock is past), each with no open run of the
        /// component: `judged` is each batch's `changed_seq` then, in the order of `batches`.
        /// It answers as `claim_ready` does. A store may claim such a round without judging
        /// the batches itself, only while each is still exactly as judged: its `changed_seq`
        /// the stamp, no open run of the component, the steering at the version the caller
        /// knows and holding neither the component nor the pipeline (PostgreSQL sends its read
        /// and its claim in one transaction, one round trip fewer a stage). Anything moved
        /// since is judged again as `claim_ready` judges it; the default is `claim_ready`.
        #[checked(
            ready_claims::check_request(request)?;
            ready_claims::check_judged(&request.batches, judged)?
        )]
        async fn claim_ready_judged(&self, request: &ReadyClaimRequest, judged: &[Seq]) -> StoreResult<ReadyClaims> {
            // Refused here too: an adapter used unchecked (a service's client) takes this default.
            ready_claims::check_judged(&request.batches, judged)?;
            self.claim_ready(request).await
        }

        /// Closes a run without an event, so the batch is ready again. Releasing a run that is
        /// already released (and still current) is a no-op; `Fenced` if the run is otherwise not
        /// the current open one.
        async fn release(&self, batch: &BatchId, component: &ComponentName, generation: i64) -> StoreResult<()>;

        /// Saves a run's progress (a JSON object), replacing the previous checkpoint of
        /// (batch, component). Fenced like an append; removed when a run records its result.
        #[checked(autocomp_model::check_object("checkpoint", &data)?)]
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
        #[checked(write_rules::check_page("limit", limit, MAX_CHANGE_PAGE)?)]
        async fn changes(&self, since: Seq, limit: usize) -> StoreResult<ChangePage>;

        /// `changes` with each changed batch's summary (`get_summaries`), in the page's order,
        /// at most `limit` (as many as `get_summaries` answers at once): what a watcher's look
        /// reads. The default reads the two one after the other (a
        /// summary may then be of a later change of its batch, which the next page names
        /// again); a store that can answers both from one snapshot (PostgreSQL: one round trip
        /// fewer a look, and its page also names the batches changed after its head, named
        /// again by the next page: a reader may meet a batch twice, never misses one). The
        /// page's head may lag the commits its page shows (PostgreSQL's look takes the last
        /// confirmed horizon and never waits for a writer): a reader moves its cursor no
        /// further than the first page's head, and sleeps from a mark taken before its pages
        /// (`announcement_mark`).
        #[checked(write_rules::check_page("limit", limit, MAX_BATCH_PAGE)?)]
        async fn changed_summaries(&self, since: Seq, limit: usize) -> StoreResult<(ChangePage, Vec<BatchSummary>)> {
            let page = self.changes(since, limit).await?;
            let ids: Vec<BatchId> = page.changes.iter().map(|(_, id)| id.clone()).collect();
            let summaries = self.get_summaries(&ids).await?;
            Ok((page, summaries))
        }

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

        /// `wait_for_change` for a waiter that cares only about some changes: waits until a change
        /// after `since` concerns `interest` (an append of one of its event types, or a change that
        /// concerns everyone: see `ChangeConcern`) or `timeout` elapses, and returns the head. It
        /// may wake for a change that does not concern it (whatever the store cannot vouch for
        /// wakes it), never sleep through one that does. `since` should be a head this handle
        /// read (`head`): the stores of this crate then know what each commit since concerned.
        /// The default is `wait_for_change`: it wakes for every change.
        async fn wait_for_change_concerning(
            &self,
            since: Seq,
            interest: &ChangeInterest,
            timeout: Duration,
        ) -> StoreResult<Seq> {
            let _ = interest;
            self.wait_for_change(since, timeout).await
        }

        /// Taken before a read that a wait will start from (`wait_for_concerning_change`):
        /// where this handle's announcements of commits stand, if every commit from now on is
        /// announced to it. The default (a store that announces nothing) has none.
        async fn announcement_mark(&self) -> Option<AnnouncementMark> {
            None
        }

        /// `wait_for_change_concerning` for a waiter that reads the change feed next anyway:
        /// the head when the wait read it, `None` when an announcement concerning `interest`
        /// woke it and the head was not read (one round trip fewer: the feed read that follows
        /// answers its own head). `read_after`: the mark taken before the reads that saw every
        /// change up to `since` (a change feed whose head may lag the commits its pages show,
        /// as PostgreSQL's look: a waiter from such a head wakes for what those reads did not
        /// see, not for every change past it); without it `since` should be a head this handle
        /// read. The default reads the head.
        async fn wait_for_concerning_change(
            &self,
            since: Seq,
            read_after: Option<AnnouncementMark>,
            interest: &ChangeInterest,
            timeout: Duration,
        ) -> StoreResult<Option<Seq>> {
            let _ = read_after;
            self.wait_for_change_concerning(since, interest, timeout).await.map(Some)
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
        #[checked(event.validate()?; write_rules::check_cancellation(&event)?)]
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
        #[checked(event.validate()?; write_rules::check_operator_event(&event, "prioritize")?)]
        async fn prioritize(&self, id: &BatchId, priority: i32, event: NewEvent) -> StoreResult<Event> {
            let _ = (id, priority, event);
            Err(StoreError::Unavailable("this store adapter does not support prioritize".into()))
        }

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
}
