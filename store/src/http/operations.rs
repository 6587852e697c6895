//! The store service's operations, each declared once (`StoreRequest`, `op`): its name, whether
//! it writes and whether that wakes the long polls, its summary, its request and answer bodies
//! (`wire`), and how the service answers it. The service's dispatch (`StoreRequest::serve`), the
//! client's calls (`op`) and the OpenAPI document all come from these lines.

use std::sync::Arc;
use std::time::Duration;

use super::bounded;
use super::wire::*;
use crate::pipeline_state::{Enqueued, Notice, Steered};
use crate::port::ready_claims::ReadyClaimRequest;
use crate::port::{
    BatchHead, BatchHistory, BatchListing, Cancellation, ChangePage, Claim, LogPage, ObjectStore, PruneAnswer,
    RestoreAnswer, StoreAbout,
};
use autocomp_http::error::ApiError;
use autocomp_model::{
    Batch, BatchSummary, Event, NewBatch, PassRecord, RegisteredComponent, Run, Seq, Steering, SteeringEntry,
    SteeringRequest, WorkPoint,
};

/// What answering an operation needs from the service answering it.
pub trait Serving: Sync {
    /// The store behind the service.
    fn store(&self) -> &Arc<dyn ObjectStore>;

    /// `wait_for_change` as the service answers it: at once after its own writes.
    fn long_poll(&self, since: Seq, timeout: Duration) -> impl Future<Output = Result<Seq, ApiError>> + Send;

    /// `wait_for_change_concerning` as the service answers it.
    fn long_poll_concerning(
        &self,
        request: WaitForChangeConcerning,
    ) -> impl Future<Output = Result<Seq, ApiError>> + Send;
}

autocomp_http::operations! {
    /// A request to the store service: one variant per `ObjectStore` operation, each with
    /// its body and the reply that takes its answer.
    pub enum StoreRequest in mod op serving Serving {
        /// Registers a batch; idempotent when an identical batch exists (created=false), 409 conflict when a different one does.
        write(wakes) create_batch: CreateBatch(NewBatch) -> Created
            = |s, batch, reply| reply.send(Created::from(s.store().create_batch(batch).await?));
        /// Registers a batch with its first event in one commit; idempotent as create_batch (created=false and nothing written when an identical batch exists); the event names no run and no idempotency key, and one the store refuses registers nothing.
        write(wakes) register_batch: RegisterBatch(RegisterBatch) -> Created
            = |s, r, reply| reply.send(Created::from(s.store().register_batch(r.batch, r.first).await?));
        /// A batch with its whole log and open runs.
        read get_batch: GetBatch(ById) -> Batch
            = |s, request, reply| bounded::batch(s.store(), request.id, reply).await?;
        /// The named batches that exist, in the order asked, each once however often it is named (at most 100000 ids); 413 too_large when the answer would pass 64 MiB with more than one batch in it: ask for fewer ids.
        read get_batches: GetBatches(ByIds) -> Vec<Batch>
            = |s, request, reply| bounded::batches(s.store(), request.ids, reply).await?;
        /// Batches in id order after `after`, at most `limit` (<= 100000); 413 too_large when the answer would pass 64 MiB with more than one batch in it: ask for a lower limit.
        read list_batches: ListBatches(ListBatches) -> Vec<Batch>
            = |s, request, reply| bounded::listed_batches(s.store(), request, reply).await?;
        /// The named batches that exist, each as the batch index reads it (BatchSummary: header, effective events without details, last activity, running components), in the order asked, each once (at most 100000 ids; 413 too_large past 64 MiB of answer).
        read get_summaries: GetSummaries(ByIds) -> Vec<BatchSummary>
            = |s, request, reply| reply.send(bounded::summaries(s.store().as_ref(), request.ids).await?);
        /// Batch summaries (see get_summaries) in id order after `after`, at most `limit` (<= 100000).
        read list_summaries: ListSummaries(ListBatches) -> Vec<BatchSummary>
            = |s, request, reply| reply.send(bounded::listed_summaries(s.store().as_ref(), request).await?);
        /// The named batches that exist, each as a listing shows it (its summary, when it was registered, its open runs), in the order asked, each once (at most 100000 ids; 413 too_large past 64 MiB of answer); no log is read.
        read get_listings: GetListings(ByIds) -> Vec<BatchListing>
            = |s, request, reply| reply.send(bounded::listings(s.store().as_ref(), request.ids).await?);
        /// A batch without its log: header, metadata, summary, the effective events in full, open runs, the newest Reset of each type, the log's length and the batch's stored bytes; its cost does not grow with the log.
        read batch_head: BatchHead(ById) -> BatchHead
            = |s, request, reply| reply.send(s.store().batch_head(&request.id).await?);
        /// A page of a batch's log, in seq order: the newest `limit` (1 to 1000) events, those before `before`, or those after `after` (at most one of the two); `older` and `newer` are the cursors of the neighbouring pages. With details_up_to, events whose details pass it come without them (see details_left_out).
        read log_page: LogPage(LogPageRequest) -> LogPage
            = |s, request, reply| reply.send(bounded::log_page(s.store().as_ref(), request).await?);
        /// The newest run of (batch, component), the open one if one is open, with its generation and state (`run` null when never claimed): a holder of generation g may still write exactly while it is that generation and open.
        read run_state: RunState(OfComponent) -> RunStateAnswer
            = |s, r, reply| reply.send(RunStateAnswer { run: s.store().run_state(&r.batch, &r.component).await? });
        /// Sets a batch's priority.
        write(wakes) set_priority: SetPriority(SetPriority) -> SeqAnswer
            = |s, r, reply| reply.send(SeqAnswer { seq: s.store().set_priority(&r.id, r.priority).await? });
        /// Merges a metadata patch (null removes a key) and moves modified_seq.
        write(wakes) record_content_change: RecordContentChange(ContentChange) -> SeqAnswer
            = |s, r, reply| reply.send(SeqAnswer { seq: s.store().record_content_change(&r.id, r.metadata_patch).await? });
        /// Appends an event; with `run` it is fenced (409 fenced unless that generation is the open, current run).
        write(wakes) append_event: AppendEvent(AppendEvent) -> Event
            = |s, r, reply| reply.send(s.store().append_event(&r.batch, r.event).await?);
        /// Opens the next run of (batch, component); a run still open is marked abandoned, unless it is the batch's lock (its holder names a liveness): then 409 conflict naming that run and its holder, nothing written. With holder.claim_key, a retry returns the run the first attempt opened.
        write(wakes) claim: Claim(ClaimRequest) -> Claim
            = |s, r, reply| reply.send(s.store().claim(&r.batch, &r.component, &r.holder).await?);
        /// Claims several batches for one component in one transaction (one commit): a pass's claims. Answers one entry per batch, in the order asked, each what claim would answer for it: {"claim": Claim} or {"error": ...} (not_found for an unknown batch, conflict for a claim key already used by a run no longer open or for a batch whose open run is its lock); one batch's error does not keep the others from being claimed. An error response means nothing was claimed. With holder.claim_key (one key serves every batch), a retry returns the runs the first attempt opened.
        write(wakes) claim_many: ClaimMany(ClaimManyRequest) -> ClaimManyAnswer
            = |s, r, reply| reply.send(bounded::claim_many(s.store().as_ref(), r).await?);
        /// A pass's claim round in one transaction (one commit): unless `force`, nothing is claimed while the component or the pipeline is held (held=true, no answers); otherwise each batch is read, re-checked with the descriptor's readiness and claimed only if ready, answered with the batch as read, its claim (null when not ready: nothing written), its failed attempts since its event type's newest Reset and its checkpoint, both as before the claim; an unknown batch is its own not_found; a batch whose open run is its lock (its holder names a liveness), or exclusive another claim's not named in `takeovers`, is answered `held` with that run, nothing written. `steering` comes back when its version is not `known_steering`. An error response means nothing was claimed, but for 413 too_large: an answer that would pass 64 MiB with more than one batch in it, its claims made; ask for fewer batches with the same holder.claim_key. With holder.claim_key, a retry returns the runs the first attempt opened.
        write(wakes) claim_ready: ClaimReady(ReadyClaimRequest) -> ReadyClaimsAnswer
            = |s, r, reply| reply.send(bounded::claim_ready(s.store().as_ref(), r).await?);
        /// Closes a run without an event; releasing twice is a no-op.
        write(wakes) release: Release(RunId) -> Empty
            = |s, r, reply| reply.send(s.store().release(&r.batch, &r.component, r.generation).await.map(|()| Empty {})?);
        /// Replaces the run's checkpoint (fenced like an append).
        write(wakes) save_checkpoint: SaveCheckpoint(SaveCheckpoint) -> Empty
            = |s, r, reply| {
            s.store().save_checkpoint(&r.batch, &r.component, r.generation, r.data).await?;
            reply.send(Empty {})
        };
        /// Saves (replacing) what a run printed: so far while it is open, or whole (its work returned) while it is open or once cancelled (409 fenced otherwise); null output removes it, whatever the run's state. Moves no seq.
        write(quiet) set_run_output: SetRunOutput(SetRunOutput) -> Empty
            = |s, r, reply| {
            s.store().set_run_output(&r.batch, &r.component, r.generation, r.output, r.whole).await?;
            reply.send(Empty {})
        };
        /// The outputs saved for a batch's runs without a result (running, cancelled, or abandoned after saving), oldest saved first, at most 32.
        read run_outputs: GetRunOutputs(ById) -> RunOutputs
            = |s, r, reply| reply.send(RunOutputs { outputs: s.store().run_outputs(&r.id).await? });
        /// The named batches' whole histories (each batch with its whole log, and every run any component had on it), in the order asked, each once, unknown ids left out (at most 1000 ids): what an export writes. 413 too_large when the answer would pass 64 MiB with more than one batch in it: ask for fewer ids.
        read histories: GetHistories(ByIds) -> Vec<BatchHistory>
            = |s, r, reply| reply.send(bounded::histories(s.store().as_ref(), r.ids).await?);
        /// Prunes each ticket's batch (at most 1000) unless it changed since its export read it or a run is open on it: every event but its effective ones, its runs, checkpoints and saved outputs are removed and the ticket's History_Pruned event appended. One answer per ticket, in order.
        write(wakes) prune_histories: PruneHistories(PruneHistories) -> Vec<PruneAnswer>
            = |s, r, reply| reply.send(s.store().prune_histories(r.tickets).await?);
        /// Puts each pruned batch's exported history back (at most 1000): its History_Pruned event removed, every exported event and run the store lacks inserted as exported, its summary worked out from the whole log. One answer per history, in order.
        write(wakes) restore_histories: RestoreHistories(RestoreHistories) -> Vec<RestoreAnswer>
            = |s, r, reply| reply.send(s.store().restore_histories(r.histories).await?);
        /// The last checkpoint of (batch, component).
        read load_checkpoint: LoadCheckpoint(OfComponent) -> Checkpoint
            = |s, r, reply| reply.send(Checkpoint { data: s.store().load_checkpoint(&r.batch, &r.component).await? });
        /// Open runs, of one component or of all.
        read open_runs: OpenRuns(OpenRuns) -> Vec<Run>
            = |s, r, reply| reply.send(s.store().open_runs(r.component.as_ref()).await?);
        /// Runs opened after `since` that ended abandoned or in a transient failure.
        read failed_attempts: FailedAttempts(FailedAttempts) -> Count
            = |s, r, reply| {
            let count = s.store().failed_attempts(&r.batch, &r.component, r.since).await?;
            reply.send(Count { count: count.into() })
        };
        /// The change feed: batches changed after `since`, each once (limit <= 100000).
        read changes: Changes(Changes) -> ChangePage
            = |s, r, reply| reply.send(s.store().changes(r.since, bounded::at_most("limit", r.limit)?).await?);
        /// The newest seq in the store.
        read head: Head(Empty) -> Head
            = |s, Empty {}, reply| reply.send(Head { head: s.store().head().await? });
        /// The service's store: its backend, its schema against the service's release, its clock.
        read about: About(Empty) -> StoreAbout
            = |s, Empty {}, reply| reply.send(s.store().about().await?);
        /// Long poll: answers once the head passes `since`, or after timeout_ms (<= 60000).
        read wait_for_change: WaitForChange(WaitForChange) -> Head
            = |s, r, reply| reply.send(Head { head: s.long_poll(r.since, bounded::wait(r.timeout_ms)?).await? });
        /// Long poll for a watcher: answers once a change after `since` concerns `interest` (an append of one of its event types, or a change that concerns everyone: a priority or content change, a run released or cancelled, the steering; a batch registered concerns only an interest in everything, one registered with its first event also that event's type), or after timeout_ms (<= 60000); it may answer for a change that does not concern it, never sleeps through one that does. `since` should be a head this service answered.
        read wait_for_change_concerning: WaitForChangeConcerning(WaitForChangeConcerning) -> Head
            = |s, r, reply| reply.send(Head { head: s.long_poll_concerning(r).await? });
        /// An operator's cancel: closes the open run as cancelled, fences its holder and appends the failure, in one transaction.
        write(wakes) cancel_run: CancelRun(CancelRun) -> Cancellation
            = |s, r, reply| reply.send(s.store().cancel_run(&r.batch, &r.component, r.event).await?);
        /// Sets the priority and appends the operator's event, in one transaction.
        write(wakes) prioritize: Prioritize(Prioritize) -> Event
            = |s, r, reply| reply.send(s.store().prioritize(&r.id, r.priority, r.event).await?);
        /// How many batches the store holds.
        read count_batches: CountBatches(Empty) -> Count
            = |s, Empty {}, reply| reply.send(Count { count: s.store().count_batches().await? });
        /// Records a component's pass in the component registry, by the store's clock: the descriptor when it differs from the one held, the host's record always. A retired component that runs again is back in the pipeline. 409 conflict when another component in the pipeline already records the event type. Takes no seq: not in the change feed.
        write(quiet) record_pass: RecordPass(PassRecord) -> Empty
            = |s, pass, reply| reply.send(s.store().record_pass(pass).await.map(|()| Empty {})?);
        /// Every component in the registry, retired ones included, by name; each with its hosts by name.
        read components: Components(Empty) -> Vec<RegisteredComponent>
            = |s, Empty {}, reply| reply.send(s.store().components().await?);
        /// An operator's `pipeline forget`: marks the component retired (by whom, why) and answers it. 400 naming the component when the registry does not hold it; 409 conflict when it is retired already.
        write(quiet) retire_component: RetireComponent(RetireComponent) -> RegisteredComponent
            = |s, r, reply| reply.send(s.store().retire_component(&r.name, &r.by, &r.reason).await?);
        /// The pipeline's steering state: holds (paused, draining, circuit open), resource pools and breaker counts.
        read steering: Steering(Empty) -> Steering
            = |s, Empty {}, reply| reply.send(s.store().steering().await?);
        /// Applies a steering change (pause, resume, pool size, a breaker's count) in one transaction with its log entry; moves the head so watchers wake. 409 conflict when the state does not allow it (already paused, not paused, changed since expect_version).
        write(wakes) steer: Steer(SteeringRequest) -> Steered
            = |s, request, reply| reply.send(s.store().steer(request).await?);
        /// The newest `limit` (1 to 1000) entries of the steering log, newest first.
        read steering_log: SteeringLog(Limit) -> Vec<SteeringEntry>
            = |s, r, reply| reply.send(s.store().steering_log(r.limit).await?);
        /// Adds the notices the outbox does not hold yet (by key) and moves the notifiers' cursor if it is still at cursor.from; answers how many were new and the cursor.
        write(quiet) enqueue_notices: EnqueueNotices(EnqueueNotices) -> Enqueued
            = |s, r, reply| reply.send(s.store().enqueue_notices(r.notices, r.cursor).await?);
        /// Leases up to `limit` due notices to `holder` for lease_ms: no other notifier takes them meanwhile.
        write(quiet) take_notices: TakeNotices(TakeNotices) -> Vec<Notice>
            = |s, r, reply| {
            let lease = Duration::from_millis(r.lease_ms);
            reply.send(s.store().take_notices(&r.holder, r.limit, lease).await?)
        };
        /// Settles a notice its holder took: sent, or failed (retried after retry_in). 409 conflict when it is not leased to that holder.
        write(quiet) settle_notice: SettleNotice(SettleNotice) -> Empty
            = |s, r, reply| reply.send(s.store().settle_notice(&r.key, &r.holder, r.outcome).await.map(|()| Empty {})?);
        /// The newest `limit` notices (1 to 1000), pending and sent, newest first.
        read recent_notices: RecentNotices(Limit) -> Vec<Notice>
            = |s, r, reply| reply.send(s.store().recent_notices(r.limit).await?);
        /// Components' work over time, per minute (the last 120) or per hour (the last 744), from the step holding `since` on, of one component or all: only steps with results or a backlog sample, by component and time, in store time.
        read work_series: WorkSeries(WorkSeriesRequest) -> Vec<WorkPoint>
            = |s, r, reply| reply.send(s.store().work_series(r.step, r.since, r.component.as_ref()).await?);
        /// Records each component's backlog (batches ready for it) as sampled now: the newest sample of the current minute and hour, by the store's clock (at most 10000 samples, each component once). Takes no seq.
        write(quiet) record_backlog: RecordBacklog(RecordBacklog) -> Empty
            = |s, r, reply| reply.send(s.store().record_backlog(r.samples).await.map(|()| Empty {})?);
    }
}
