//! One pass of a component: poll lock, the pipeline's steering (a paused, draining or
//! circuit-broken component claims nothing), ask the index, try-lock the candidates, re-check
//! them against the store, take a slot of each resource pool the component names, and claim
//! them together (one commit per round), release the poll lock, work in parallel with a time
//! bound, record each result fenced by its claim generation (results that finish together
//! share the store's group commit), tell the circuit breaker, unlock.
//! Outcome rules: permanent/transient errors, panics, timeouts, attempts,
//! graceful shutdown (release claims without events). With telemetry on, a pass is a trace:
//! a `pass` span, a `claim` span per round, a `batch` span per batch with its `work` and
//! `append` (docs/telemetry.md); off, every span here is a disabled one.
//!
//! A phase a module: `candidates` (ask the index, re-check in the store), `lock` (batch locks
//! and pool slots), `claim` (the claim rounds, which drive the two before), `work`, `record`
//! (a result, fenced by the claim; a release), `report` (what the registry is told). `pass`
//! holds what a pass knows as it goes, `summary` what it did. Claim uses candidates, lock and
//! record, work uses record; none uses one back.

mod breaker;
mod candidates;
mod claim;
mod dry_run;
mod hand_on;
mod identity;
mod live_output;
mod lock;
mod pass;
pub(crate) mod phases;
mod queue;
mod record;
mod report;
mod result_checks;
mod steering_cache;
mod summary;
mod takeover;
mod turn;
mod work;
mod work_threads;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use autocomp_model::{
    BatchId, ComponentDescriptor, ComponentName, EventType, PassOutcome, PassPhase, RunHolder, Seq, Trigger,
};
use autocomp_sboi::BatchIndex;
use autocomp_store::ObjectStore;
use autocomp_toolkit::telemetry;
use tokio::sync::watch;
use tracing::{Instrument, Span, debug};

use crate::component::Component;
use crate::config::ComponentConfig;
use crate::exit::RunError;
use crate::locks::{LockHolder, LockPath, LockService};
use crate::reports::{Reports, Write};

pub(crate) use candidates::held_reason;
pub(crate) use dry_run::DryRun;
pub use dry_run::PoolRoom;
pub use hand_on::registration_hand_ons;
pub use identity::{Identity, hostname};
use pass::{Pass, release_quietly};
// What `testing::run_work` records, as a pass would.
#[cfg(any(test, feature = "testing"))]
pub(crate) use record::report_of;
pub(crate) use report::record_pass;
pub use summary::{BatchResult, PassSummary};

/// The three ports a runner works against; nothing here knows which adapters they are.
#[derive(Clone)]
pub struct Pipeline {
    /// The truth: batches, events, claims, checkpoints, the component registry.
    pub store: Arc<dyn ObjectStore>,
    /// Which batches a trigger selects; every answer is re-checked against the store.
    pub index: Arc<dyn BatchIndex>,
    /// The poll and batch locks, and the session whose loss stops the pass.
    pub locks: Arc<dyn LockService>,
}

/// The `changed_seq` at which a watcher's look found each of its offered batches ready on
/// its summary (by the component's `readiness`, with no open run of the component): a claim
/// round of such batches only claims them while they are unchanged since, and may do so
/// without reading them first (`ObjectStore::claim_ready_judged`). A round with a batch the
/// look holds no stamp of is claimed as `claim_ready` judges it.
pub type Judged = std::collections::HashMap<BatchId, Seq>;

/// Which batches a pass considers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selection {
    /// Whatever the index says is ready (the cron case).
    Ready,
    /// These candidates, which the index offered a moment ago (a watcher asks it before it
    /// decides to start a pass; asking again would double the pass's index queries). Each is
    /// locked and re-checked against the store like any other; those the look found ready
    /// on their summaries (`Judged`) are claimed by the stamp they were judged at.
    Offered(Vec<BatchId>, Judged),
    /// The runs the store handed to this watcher's process (`HandOnStore`): each is claimed
    /// already, by the append that made its batch ready; no turn, no look, no claim.
    Handed,
    /// Exactly this batch; `force` ignores the trigger (it is still locked and recorded).
    Batch {
        /// The batch.
        id: BatchId,
        /// Work on it even if the trigger does not select it.
        force: bool,
    },
}

/// Where a runner runs: the component's config, the pipeline's ports and the shutdown signal
/// that stops claiming.
pub struct Setup {
    /// The component's config (the file's settings applied).
    pub config: ComponentConfig,
    /// The store, the index and the locks.
    pub pipeline: Pipeline,
    /// Becomes true when the process is to stop claiming.
    pub shutdown: watch::Receiver<bool>,
}

/// Runs passes of one component against a pipeline: the component, its settings and
/// config, who this process is, and the shutdown signal that stops claiming.
pub struct Runner<C: Component> {
    component: Arc<C>,
    settings: Arc<C::Settings>,
    name: ComponentName,
    event_type: EventType,
    /// What the component is, as the registry records it: the effective trigger and the
    /// settings that decide readiness (its `readiness` is the store re-check).
    descriptor: ComponentDescriptor,
    /// The trigger under which a transient failure of our own type is retried.
    retry_trigger: Option<Trigger>,
    config: ComponentConfig,
    pipeline: Pipeline,
    identity: Identity,
    shutdown: watch::Receiver<bool>,
    /// What the registry has been told and what waits to be (a watcher coalesces).
    reports: Reports,
    /// How many batches the next pass claims at most: `queue_size`, grown under a backlog of
    /// quick work up to `queue_grows_to` (`adapt_queue`).
    claim_limit: AtomicUsize,
    /// The pipeline's steering as last read, kept across passes: read again only when a
    /// claim says its version moved, or while it holds the component.
    steering: steering_cache::SteeringCache,
    /// The component's turn, kept between a watcher's passes while they find all there is.
    turn: turn::KeptTurn,
    /// The circuit breaker within the pass at work: once open, nothing more starts.
    breaker: breaker::PassBreaker,
    /// The schemas of its contract, compiled: what its results must fit, and what it
    /// declares of the results it reads.
    result_checks: result_checks::ResultChecks,
    /// The threads its work runs on, kept between batches.
    work_threads: Arc<work_threads::WorkThreads>,
    /// Its offer to be handed batches, and the takers its results may hand batches on to.
    hand_ons: hand_on::HandOns,
}

impl<C: Component> Runner<C> {
    /// A runner for `component` with its effective `trigger`. A usage error (exit 2) when
    /// its name or event type is not valid, the config names another event type, or the
    /// descriptor the registry would record is invalid.
    pub fn new(component: C, settings: C::Settings, trigger: Trigger, setup: Setup) -> Result<Arc<Self>, RunError> {
        let Setup { config, pipeline, shutdown } = setup;
        let usage = |e: autocomp_model::InvalidInput| RunError::Usage(e.to_string());
        let name = ComponentName::new(component.name()).map_err(usage)?;
        let event_type = EventType::new(component.event_type()).map_err(usage)?;
        if let Some(configured) = config.event_type.as_deref().filter(|t| *t != event_type.as_str()) {
            return Err(RunError::Usage(format!(
                "the config says event_type = {configured:?}, but {} records {event_type}",
                component.name()
            )));
        }
        let identity = Identity::of(component.name(), component.version())?;
        let descriptor =
            crate::component::descriptor_of(&component, &config, (name.clone(), event_type.clone()), trigger);
        descriptor.validate().map_err(usage)?;
        let result_checks = result_checks::ResultChecks::of(&descriptor)?;
        let retry_trigger = descriptor.retry_trigger();
        Ok(Arc::new(Self {
            component: Arc::new(component),
            settings: Arc::new(settings),
            name,
            event_type,
            descriptor,
            retry_trigger,
            claim_limit: AtomicUsize::new(config.queue_size),
            pipeline,
            identity,
            shutdown,
            reports: Reports::default(),
            steering: steering_cache::SteeringCache::default(),
            turn: turn::KeptTurn::default(),
            breaker: breaker::PassBreaker::default(),
            result_checks,
            work_threads: Arc::default(),
            hand_ons: hand_on::HandOns::default(),
            config,
        }))
    }

    /// What a watcher of this component wakes for (`ComponentDescriptor::change_interest`).
    pub fn change_interest(&self) -> autocomp_model::ChangeInterest {
        self.descriptor.change_interest()
    }

    /// The component's name, as its locks, claims and registry entry carry it.
    pub fn name(&self) -> &ComponentName {
        &self.name
    }

    fn lock_holder(&self) -> LockHolder {
        self.identity.lock_holder()
    }

    fn run_holder(&self) -> RunHolder {
        RunHolder {
            agent: self.identity.agent.clone(),
            host: self.identity.host.clone(),
            pid: self.identity.pid,
            claim_key: None,
            liveness: self.pipeline.locks.liveness(),
        }
    }

    fn shutting_down(&self) -> bool {
        *self.shutdown.borrow()
    }

    /// One pass: poll lock, candidates, claims, work, results, unlock; reported to the
    /// component registry (a pass that claims work says so before working; every pass
    /// reports how it ended, an idle one only that).
    pub async fn run_pass(self: &Arc<Self>, selection: &Selection) -> Result<PassSummary, RunError> {
        let span = self.pass_span(selection);
        let took_up = |passed: &Result<PassSummary, RunError>| passed.as_ref().map_or(0, PassSummary::taken_up);
        let (passed, timings) = phases::timed(self.untraced_pass(selection), took_up).instrument(span.clone()).await;
        timings.emit(&self.name, took_up(&passed));
        let (outcome, taken_up) = match &passed {
            Ok(summary) => (summary.pass_outcome().as_str(), summary.taken_up()),
            Err(RunError::PollLockBusy(_)) => ("busy", 0),
            Err(_) => ("error", 0),
        };
        span.record("autocomp.pass.outcome", outcome);
        span.record("autocomp.pass.batches", taken_up);
        if outcome == "error" {
            span.record("otel.status_code", "ERROR");
        }
        passed
    }

    /// The root span of a pass: each pass is a trace of its own, a watcher's too. Disabled
    /// (and free) when telemetry is off.
    fn pass_span(&self, selection: &Selection) -> Span {
        if !telemetry::enabled() {
            return Span::none();
        }
        let selection = match selection {
            Selection::Ready => "ready",
            Selection::Offered(..) => "offered",
            Selection::Handed => "handed",
            Selection::Batch { force: false, .. } => "batch",
            Selection::Batch { force: true, .. } => "forced",
        };
        tracing::info_span!(target: telemetry::TARGET, parent: None, "pass",
            autocomp.component = %self.name, autocomp.agent = %self.identity.agent, host.name = %self.identity.host,
            process.pid = self.identity.pid, autocomp.selection = selection,
            autocomp.pass.outcome = tracing::field::Empty, autocomp.pass.batches = tracing::field::Empty,
            otel.status_code = tracing::field::Empty)
    }

    /// A batch's span, a child of the pass's (the current span), from its claim on; its
    /// outcome is recorded when known (`record_outcome`).
    fn batch_span(&self, id: &BatchId) -> Span {
        if !telemetry::enabled() {
            return Span::none();
        }
        tracing::info_span!(target: telemetry::TARGET, "batch", autocomp.batch_id = %id,
            autocomp.component = %self.name, autocomp.generation = tracing::field::Empty,
            autocomp.outcome = tracing::field::Empty, otel.status_code = tracing::field::Empty)
    }

    /// Why a pass would not start, if it would not: a setting refused (`Usage`), or a result
    /// the component reads that its producer no longer publishes as expected
    /// (`ContractBroken`; only a component that reads some pays the registry read). What a
    /// pass and `--dry-run` both ask first.
    pub(crate) async fn pass_refusal(&self) -> Option<RunError> {
        if let Err(refused) = self.component.check_settings(&self.settings) {
            return Some(RunError::Usage(format!("[settings] {}: {}", refused.key, shown_refusal(&refused))));
        }
        crate::contract::check_reads(self.pipeline.store.as_ref(), &self.descriptor)
            .await
            .err()
            .map(RunError::ContractBroken)
    }

    /// `run_pass` without its span.
    async fn untraced_pass(self: &Arc<Self>, selection: &Selection) -> Result<PassSummary, RunError> {
        let started = Instant::now();
        let refused = self.pass_refusal().await;
        phases::mark(phases::Phase::Other);
        if let Some(refused) = refused {
            let message = refused.to_string();
            let phase = PassPhase::Ended {
                outcome: PassOutcome::Error,
                summary: format!("{}{message}", autocomp_model::NOT_STARTED),
                duration_ms: started.elapsed().as_millis() as u64,
                work: Vec::new(),
            };
            if let Err(e) = self.report_pass(phase).await {
                debug!("cannot report the refused pass to the component registry: {e}");
            }
            return Err(refused);
        }
        let passed = self.pass_queueing_for_pools(selection).await;
        let (outcome, summary) = match &passed {
            Ok(summary) => (summary.pass_outcome(), summary.describe()),
            // Another pass is running and reports for itself; a watcher's heartbeat that
            // deferred to it still keeps this host's row in the registry fresh.
            Err(RunError::PollLockBusy(_)) => {
                if matches!(selection, Selection::Ready) && self.turn.serves_a_watcher() {
                    self.note_deferred_heartbeat(started).await;
                }
                return passed;
            }
            // The registry refused us (an event type clash): nothing to add.
            Err(RunError::Usage(_) | RunError::ContractBroken(_)) => return passed,
            Err(e) => (PassOutcome::Error, e.to_string()),
        };
        let work = match &passed {
            Ok(summary) => {
                if matches!(selection, Selection::Ready | Selection::Offered(..)) {
                    self.adapt_queue(summary);
                }
                summary.work()
            }
            Err(_) => Vec::new(),
        };
        if passed.as_ref().is_ok_and(PassSummary::store_unreachable) {
            // Results the store could not take: it is gone, and a report would wait on it
            // (a connection whose packets vanish answers nothing), keeping this process, and
            // with it the liveness its open runs name, from ending so another host can take
            // them over.
            return passed;
        }
        let phase = PassPhase::Ended { outcome, summary, duration_ms: started.elapsed().as_millis() as u64, work };
        if let Write::Now(phase) = self.reports.ended(phase, started) {
            let reported = self.report_pass(phase).await;
            if let (Ok(_), Err(RunError::Usage(message))) = (&passed, reported) {
                return Err(RunError::Usage(message));
            }
        }
        passed
    }

    /// A watcher's heartbeat pass that found the turn held elsewhere: an idle pass of this
    /// host for the registry (its last pass, its release, a refusal since mended), kept with
    /// the watcher's other reports and written by the heartbeat's flush, as the pass that got
    /// the turn used to be. Without it a host whose heartbeats kept deferring stayed stale.
    async fn note_deferred_heartbeat(&self, started: Instant) {
        let phase = PassPhase::Ended {
            outcome: PassOutcome::Idle,
            summary: "deferred: another pass of the component holds its turn".into(),
            duration_ms: started.elapsed().as_millis() as u64,
            work: Vec::new(),
        };
        if let Write::Now(phase) = self.reports.ended(phase, started)
            && let Err(e) = self.report_pass(phase).await
        {
            debug!("cannot report the deferred heartbeat to the component registry: {e}");
        }
    }

    /// The most batches the next pass claims.
    fn claim_limit(&self) -> usize {
        self.claim_limit.load(Ordering::Relaxed)
    }

    /// After a pass that looked for ready work: one that filled its queue with quick work
    /// (a backlog draining) claims twice as many the next time, up to `queue_grows_to`; one
    /// that did not, or whose work was slow, goes back to `queue_size`. Large passes spread
    /// a pass's fixed cost (locks, the index, commits) over many batches; small ones keep a
    /// trickle's latency low and slow work from being claimed long before it can start.
    fn adapt_queue(&self, summary: &PassSummary) {
        let limit = self.claim_limit();
        let work = summary.work();
        let quick = !work.is_empty()
            && work.iter().map(|done| done.duration_ms).sum::<u64>() <= QUICK_WORK_MS * work.len() as u64;
        let ceiling = self.config.queue_grows_to.max(self.config.queue_size);
        // A pass that queued for its pool took its batches a slot at a time: claiming more
        // would only lock and re-check batches that wait for the pool again.
        let grow = summary.taken_up() >= limit && quick && summary.rounds <= 1;
        let next = if grow { (limit * 2).min(ceiling) } else { self.config.queue_size };
        if next != limit {
            debug!(from = limit, to = next, "claims per pass");
            self.claim_limit.store(next, Ordering::Relaxed);
        }
    }

    /// The pass under the poll lock: claims, the registry told of them, work and results.
    async fn locked_pass(self: &Arc<Self>, selection: &Selection) -> Result<PassSummary, RunError> {
        if *selection == Selection::Handed {
            return self.handed_pass().await;
        }
        let holder = self.lock_holder();
        let asked = Instant::now();
        let Some(turn) = self.poll_lock(&holder, selection).await? else {
            return Ok(PassSummary::default());
        };
        phases::mark(phases::Phase::PollLock);
        // Candidates offered before a wait for the poll lock are another pass's leftovers by
        // now (it held the lock to claim them): ask the index again rather than lock and
        // re-check batches that are most likely done.
        let asked_again;
        let selection = match selection {
            Selection::Offered(..) if asked.elapsed() > OFFER_FRESH_FOR => {
                asked_again = Selection::Ready;
                &asked_again
            }
            _ => selection,
        };
        let mut pass = Pass::new(selection, holder, self.pipeline.locks.session());
        let claimed = match self.claim_batches(selection, &mut pass).await {
            // Before any work: a component whose event type another one records must not work.
            Ok(()) => self.report_start(&pass.claimed).await,
            Err(e) => Err(e),
        };
        phases::mark(phases::Phase::Other);
        if let Err(e) = claimed {
            // Whatever was claimed before the error is handed back untouched: ready again,
            // not left open to be counted as an abandoned attempt.
            self.hand_back(pass.claimed).await;
            release_quietly(turn.lock).await;
            return Err(e);
        }
        // A pass that found work and claimed less than it had room for left nothing behind:
        // a watcher keeps the turn for its next pass (`turn`). One that claimed nothing (a
        // heartbeat, batches taken meanwhile) gives it back as before.
        let caught_up = !pass.claimed.is_empty() && pass.claimed.len() < self.claim_limit();
        let turn = if self.config.hold_poll_lock {
            Some(turn)
        } else {
            // The claims are made: the poll lock guards nothing more. Released beside the
            // work instead (one lock-service write off the stage's path), a pass whose
            // ZooKeeper went silent mid-work exited after its session could have expired in
            // one run of three of tests/tests/zookeeper.rs (not yet understood), so first.
            if let Some(turn) = self.turn.keep_or_return(turn, caught_up) {
                release_quietly(turn.lock).await;
            }
            None
        };
        phases::mark(phases::Phase::Release);
        let Pass { mut summary, claimed, .. } = pass;
        summary.results.extend(self.work_giving_back_turn(claimed).await);
        phases::skip();
        if let Some(turn) = turn.and_then(|turn| self.turn.keep_or_return(turn, caught_up)) {
            release_quietly(turn.lock).await;
            phases::mark(phases::Phase::Release);
        }
        Ok(summary)
    }

    /// A taker's pass over the runs handed to it: no turn (the runs are the claims), the
    /// registry told of them, their work and results.
    async fn handed_pass(self: &Arc<Self>) -> Result<PassSummary, RunError> {
        let mut pass = Pass::new(&Selection::Handed, self.lock_holder(), self.pipeline.locks.session());
        let claimed = match self.take_handed(&mut pass).await {
            Ok(()) => self.report_start(&pass.claimed).await,
            Err(e) => Err(e),
        };
        phases::mark(phases::Phase::Other);
        if let Err(e) = claimed {
            self.hand_back(pass.claimed).await;
            return Err(e);
        }
        let Pass { mut summary, claimed, .. } = pass;
        summary.results.extend(self.work_all(claimed).await);
        phases::skip();
        Ok(summary)
    }

    /// The component's poll lock (the turn a watcher kept, if it still holds it), `None`
    /// when a shutdown is requested while waiting for it; another pass holding it is
    /// `PollLockBusy`. A watcher's pass (over what it was offered, or its heartbeat's) does
    /// not wait: the holder looks and claims, and its results (of this component's event
    /// type) wake the watcher to look again; a deferring watcher retries. Waiting instead
    /// made every watcher of a component a queue behind one lock: at 50 watchers a
    /// component, most passes waited out the whole `poll_lock_timeout` for work already
    /// claimed (docs/capacity.md). A watcher's later rounds for a pool (`queue`) stop at a
    /// busy turn too: the batches waiting for a slot have it look again soon.
    async fn poll_lock(&self, holder: &LockHolder, selection: &Selection) -> Result<Option<turn::TurnLock>, RunError> {
        let session = *self.pipeline.locks.session().borrow();
        match self.turn.take(session) {
            Some(turn::Taken::Reuse(kept)) => return Ok(Some(kept)),
            Some(turn::Taken::Release(kept)) => release_quietly(kept.lock).await,
            None => {}
        }
        let mut shutdown = self.shutdown.clone();
        tokio::select! {
            _ = self.turn.given_back(turn::GIVEN_BACK_WITHIN) => {}
            _ = stop_requested(&mut shutdown) => return Ok(None),
        }
        let poll_path = LockPath::Poll(self.name.clone());
        let wait = match selection {
            Selection::Offered(..) => std::time::Duration::ZERO,
            // A watcher's heartbeat pass defers like its other passes: the holder looks and
            // claims, and the watcher retries. Over PostgreSQL locks a waiter polls, so at
            // 2,000 watchers the heartbeats' waits were a herd of a few hundred pollers, most
            // of the server's statements (docs/capacity.md).
            Selection::Ready if self.turn.serves_a_watcher() => std::time::Duration::ZERO,
            Selection::Ready | Selection::Handed | Selection::Batch { .. } => self.config.poll_lock_timeout,
        };
        let poll_lock = tokio::select! {
            lock = self.pipeline.locks.try_lock(&poll_path, holder, wait) => lock?,
            _ = stop_requested(&mut shutdown) => return Ok(None),
        };
        match poll_lock {
            Some(lock) => Ok(Some(turn::TurnLock::taken_now(lock))),
            None => Err(RunError::PollLockBusy(self.name.to_string())),
        }
    }

    /// The pass's work; meanwhile a kept turn that falls due (the work outlasts `KEPT_IDLE`)
    /// is given back beside it, in a task of its own: slow work does not hold the turn, and a
    /// release waiting on a silent lock service does not hold the pass.
    async fn work_giving_back_turn(self: &Arc<Self>, claimed: Vec<pass::Claimed>) -> Vec<BatchResult> {
        let work = self.work_all(claimed);
        tokio::pin!(work);
        loop {
            let Some(due) = self.turn.due_in() else { return work.await };
            tokio::select! {
                results = &mut work => return results,
                _ = tokio::time::sleep(due) => {
                    if let Some(turn) = self.turn.expired(false) {
                        debug!("giving the component's turn back beside the work");
                        self.turn.giving_back(tokio::spawn(release_quietly(turn.lock)));
                    }
                }
            }
        }
    }

    /// From now on a pass that claims all it finds keeps the component's turn for the next
    /// one (a watcher; `turn`).
    pub(crate) fn keep_turns(&self) {
        self.turn.enable(self.pipeline.locks.waiters_told_at_release());
    }

    /// Gives back the kept turn once it is due (idle or held long enough), or whatever its
    /// age with `all` (the watch ends).
    pub(crate) async fn give_back_turn(&self, all: bool) {
        if let Some(turn) = self.turn.expired(all) {
            debug!("giving the component's turn back");
            release_quietly(turn.lock).await;
        }
    }

    /// Whether another pass holds the component's turn, read at the lock service without
    /// taking it: `None` when the service cannot tell by a read; `Some(false)` when this
    /// runner keeps the turn itself (the watcher then looks as usual).
    pub(crate) async fn turn_held_elsewhere(&self) -> Option<bool> {
        if self.turn.due_in().is_some() {
            return Some(false);
        }
        match self.pipeline.locks.is_held(&LockPath::Poll(self.name.clone())).await {
            Ok(held) => held,
            Err(e) => {
                debug!("cannot read whether the poll lock is held: {e}");
                None
            }
        }
    }

    /// How long until the kept turn is due to be given back, if one is kept.
    pub(crate) fn turn_due_in(&self) -> Option<std::time::Duration> {
        self.turn.due_in()
    }
}

/// How long the candidates a watcher was offered stay worth claiming: a poll lock that
/// took longer to get was held by another pass, which claimed from the same answer.
const OFFER_FRESH_FOR: std::time::Duration = std::time::Duration::from_millis(20);

/// Work this quick on average (per batch) lets a pass's claims grow under a backlog.
const QUICK_WORK_MS: u64 = 100;

/// Resolves once a shutdown is requested (never, if the sender is gone without one).
pub(crate) async fn stop_requested(shutdown: &mut watch::Receiver<bool>) {
    if shutdown.wait_for(|stop| *stop).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// A setting's refusal as the registry (which the monitor, alerts and their mail show) and
/// stderr may say it: on one line, any URL's password hidden, and a secret's value (a key
/// named like `token` or `password`) not at all, since the check's words quote the value.
fn shown_refusal(refused: &crate::component::SettingError) -> String {
    let last = refused.key.rsplit('.').next().unwrap_or(&refused.key);
    if autocomp_toolkit::redact::is_secret_key(last) {
        return "its value is refused (not shown: a secret)".to_owned();
    }
    autocomp_toolkit::redact::redact_urls_in(&autocomp_toolkit::terminal::one_line(&refused.message))
}
