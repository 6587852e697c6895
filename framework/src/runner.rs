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

use std::collections::{HashMap, HashSet};
use std::io::Write as _;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Instant;

use autocomp_http::telemetry;
use autocomp_model::{
    Agent, Batch, BatchId, ComponentDescriptor, ComponentName, EventType, HoldKind, IdempotencyKey, NewEvent, Outcome,
    PassOutcome, PassPhase, PassRecord, PoolName, Report, RunHolder, RunOutput, RunState, Seq, Steering,
    SteeringChange, SteeringRequest, Timestamp, Trigger, WorkDone, WorkResult,
};
use autocomp_sboi::BatchIndex;
use autocomp_store::{Claim, ObjectStore, StoreError};
use futures_util::{StreamExt, TryStreamExt};
use tokio::sync::{Semaphore, oneshot, watch};
use tracing::{Instrument, Span, debug, error, info, warn};

use crate::component::{CheckpointWriter, Component, WorkContext, WorkError, fitted_output};
use crate::config::ComponentConfig;
use crate::exit::{self, RunError};
use crate::locks::{Lock, LockError, LockHolder, LockPath, LockService, SessionState};
use crate::output::LogCapture;
use crate::reports::{Reports, Write};

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

/// Which batches a pass considers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selection {
    /// Whatever the index says is ready (the cron case).
    Ready,
    /// These candidates, which the index offered a moment ago (a watcher asks it before it
    /// decides to start a pass; asking again would double the pass's index queries). Each is
    /// locked and re-checked against the store like any other.
    Offered(Vec<BatchId>),
    /// Exactly this batch; `force` ignores the trigger (it is still locked and recorded).
    Batch {
        /// The batch.
        id: BatchId,
        /// Work on it even if the trigger does not select it.
        force: bool,
    },
}

/// What happened to one batch in a pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchResult {
    /// Its result event is in the store (a give-up after `max_attempts` too).
    Recorded {
        /// The batch.
        id: BatchId,
        /// The recorded event's outcome.
        outcome: Outcome,
        /// The work ran past `max_runtime` and was recorded as a failure saying so.
        timed_out: bool,
        /// What the registry tallies of it: its result and how long the work took.
        work: WorkDone,
    },
    /// Shut down before it finished: claim released without an event, ready again.
    Released {
        /// The batch.
        id: BatchId,
    },
    /// Someone else took the batch over; our result was refused.
    Fenced {
        /// The batch.
        id: BatchId,
    },
    /// The lock service was lost before recording; nothing recorded.
    NotRecorded {
        /// The batch.
        id: BatchId,
    },
    /// The store stayed unreachable (past its retries) when the result was to be recorded;
    /// nothing recorded, the run stays open until the next claim marks it abandoned.
    StoreUnreachable {
        /// The batch.
        id: BatchId,
    },
    /// A manually requested batch the trigger does not select.
    NotReady {
        /// The batch.
        id: BatchId,
        /// The clause that refused it, its type and what the batch holds.
        reason: String,
    },
    /// A manually requested batch whose lock is held by another worker.
    Busy {
        /// The batch.
        id: BatchId,
    },
    /// Locked and ready, but every slot of a resource pool its work needs was taken: its
    /// lock was let go of, it was neither claimed nor counted as an attempt, and a later
    /// pass takes it up. Not a failure.
    WaitingForPool {
        /// The batch.
        id: BatchId,
        /// The first pool (in the descriptor's order) that had no free slot.
        pool: PoolName,
    },
}

impl BatchResult {
    /// Whether the pass took the batch up (claimed it, or answered a manual run about it),
    /// rather than leaving it for a later pass because a pool was full.
    pub fn taken_up(&self) -> bool {
        !matches!(self, BatchResult::WaitingForPool { .. })
    }
}

/// What one pass did: how each batch it took up ended.
#[derive(Debug, Default)]
pub struct PassSummary {
    /// One per batch taken up (or left waiting for a pool), in no particular order; empty
    /// for an idle pass.
    pub results: Vec<BatchResult>,
    /// Lock paths (a batch's, a pool slot's) that held a node no lock service made (skipped,
    /// an alarm: exit 6).
    pub foreign_locks: Vec<String>,
    /// Why the pass stopped claiming (or never started) because the component or the whole
    /// pipeline is held (paused, draining, its circuit open), as `held_reason` words it.
    pub held: Option<String>,
}

impl PassSummary {
    /// How the registry shows the pass: idle when it took nothing up (a held pass, one whose
    /// batches all wait for a pool).
    pub fn pass_outcome(&self) -> PassOutcome {
        match self.exit_code() {
            _ if self.taken_up() == 0 && self.foreign_locks.is_empty() => PassOutcome::Idle,
            exit::OK => PassOutcome::Ok,
            exit::FAILED => PassOutcome::Failed,
            _ => PassOutcome::Error,
        }
    }

    /// Batches the pass took up (see [`BatchResult::taken_up`]).
    pub fn taken_up(&self) -> usize {
        self.results.iter().filter(|r| r.taken_up()).count()
    }

    /// Batches left for a later pass because a pool they need was full.
    pub fn waiting(&self) -> usize {
        self.results.len() - self.taken_up()
    }

    /// One line: how many batches and how each ended, which pools batches wait for, and the
    /// hold that stopped the claims. At most `MAX_DESCRIBED_CHARS` (the registry's limit; an
    /// operator's reason for a hold may be long).
    pub fn describe(&self) -> String {
        let line = self.describe_whole();
        if line.chars().count() <= MAX_DESCRIBED_CHARS {
            return line;
        }
        let cut = line.char_indices().nth(MAX_DESCRIBED_CHARS - 1).map_or(line.len(), |(at, _)| at);
        format!("{}…", &line[..cut])
    }

    fn describe_whole(&self) -> String {
        let mut notes = Vec::new();
        let mut waits: std::collections::BTreeMap<&PoolName, usize> = std::collections::BTreeMap::new();
        for result in &self.results {
            if let BatchResult::WaitingForPool { pool, .. } = result {
                *waits.entry(pool).or_default() += 1;
            }
        }
        for (pool, n) in waits {
            notes.push(format!("{} for pool {pool}", wait_for(n)));
        }
        if let Some(held) = &self.held {
            notes.push(format!("held: {held}"));
        }
        match self.foreign_locks.len() {
            0 => {}
            n => {
                notes.push(format!("{n} lock{} not made by autocomp (`autocomp locks`)", if n == 1 { "" } else { "s" }))
            }
        }
        let taken_up = self.taken_up();
        if taken_up == 0 {
            let nothing = if self.held.is_some() || self.waiting() > 0 { "nothing claimed" } else { "nothing ready" };
            return [nothing.to_owned()].into_iter().chain(notes).collect::<Vec<_>>().join("; ");
        }
        let mut counts: std::collections::BTreeMap<&str, usize> = std::collections::BTreeMap::new();
        for result in self.results.iter().filter(|r| r.taken_up()) {
            let kind = match result {
                BatchResult::Recorded { timed_out: true, .. } => "timed out",
                BatchResult::Recorded { outcome, .. } => outcome.as_str(),
                BatchResult::Released { .. } => "released",
                BatchResult::Fenced { .. } => "fenced",
                BatchResult::NotRecorded { .. } => "not recorded",
                BatchResult::StoreUnreachable { .. } => "store unreachable",
                BatchResult::NotReady { .. } => "not ready",
                BatchResult::Busy { .. } => "locked elsewhere",
                BatchResult::WaitingForPool { .. } => "waiting for a pool",
            };
            *counts.entry(kind).or_default() += 1;
        }
        let parts: Vec<String> = counts.into_iter().map(|(kind, n)| format!("{n} {kind}")).collect();
        let line = format!("{taken_up} batch{}: {}", if taken_up == 1 { "" } else { "es" }, parts.join(", "));
        [line].into_iter().chain(notes).collect::<Vec<_>>().join("; ")
    }

    /// Each recorded result, for the registry's tallies.
    pub fn work(&self) -> Vec<WorkDone> {
        let recorded = self.results.iter().filter_map(|r| match r {
            BatchResult::Recorded { work, .. } => Some(*work),
            _ => None,
        });
        recorded.collect()
    }

    /// Whether some batch's work ran past `max_runtime` (the process must then exit).
    pub fn timed_out(&self) -> bool {
        self.results.iter().any(|r| matches!(r, BatchResult::Recorded { timed_out: true, .. }))
    }

    /// The pass's exit code: 4 when a result went unrecorded (the lock service lost), 5
    /// when the store was unreachable for one, else 6 when a batch's lock path held a node
    /// no lock service made, else 1 when a batch failed, was fenced, was not ready or was
    /// busy (the last two only in a manual run), else 0.
    pub fn exit_code(&self) -> u8 {
        if self.results.iter().any(|r| matches!(r, BatchResult::NotRecorded { .. })) {
            return exit::LOCKS_LOST;
        }
        if self.results.iter().any(|r| matches!(r, BatchResult::StoreUnreachable { .. })) {
            return exit::UNREACHABLE;
        }
        if !self.foreign_locks.is_empty() {
            return exit::FOREIGN_LOCK;
        }
        let failed = self.results.iter().any(|r| {
            matches!(
                r,
                BatchResult::Recorded { outcome: Outcome::Failure, .. }
                    | BatchResult::Fenced { .. }
                    | BatchResult::NotReady { .. }
                    | BatchResult::Busy { .. }
            )
        });
        if failed { exit::FAILED } else { exit::OK }
    }
}

/// The longest pass summary the component registry takes.
const MAX_DESCRIBED_CHARS: usize = 2_000;

/// Who this process is, as recorded in runs, events and lock nodes.
#[derive(Debug, Clone)]
pub struct Identity {
    /// `<component>/<version>@<host>#<pid>`: the agent of every event and run it records.
    pub agent: Agent,
    /// The host name (`localhost` when it cannot be read).
    pub host: String,
    /// This process.
    pub pid: u32,
}

impl Identity {
    /// This process running `component` at `version`; a usage error if the names do not
    /// make a valid agent.
    pub fn of(component: &str, version: &str) -> Result<Self, RunError> {
        let host = hostname();
        let pid = std::process::id();
        let agent =
            Agent::new(format!("{component}/{version}@{host}#{pid}")).map_err(|e| RunError::Usage(e.to_string()))?;
        Ok(Self { agent, host, pid })
    }

    /// What a lock node this process takes says of its holder.
    pub fn lock_holder(&self) -> LockHolder {
        LockHolder { agent: self.agent.to_string(), host: self.host.clone(), pid: self.pid, since: Timestamp::now() }
    }
}

/// Tells the registry what a component is and how its pass stands. An event type another
/// component already records is a configuration error (exit 2).
pub(crate) async fn record_pass(
    store: &dyn ObjectStore,
    descriptor: &ComponentDescriptor,
    identity: &Identity,
    phase: PassPhase,
) -> Result<(), RunError> {
    let record = PassRecord { descriptor: descriptor.clone(), host: identity.host.clone(), phase };
    match store.record_pass(record).await {
        Ok(()) => Ok(()),
        Err(StoreError::Conflict(message)) => Err(RunError::Usage(message)),
        Err(e) => Err(e.into()),
    }
}

/// This host's name as locks, runs and the registry record it (`localhost` when unknown).
pub fn hostname() -> String {
    let raw = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let clean: String = raw.trim().chars().filter(|c| c.is_ascii_graphic()).take(255).collect();
    if clean.is_empty() { "localhost".into() } else { clean }
}

/// A batch this pass claimed: its snapshot from the re-check, its run, its lock, the slots
/// of the resource pools its work holds (released with the lock, on every path), the
/// checkpoint an earlier attempt left, and whether the component's circuit breaker was
/// counting failures when it was claimed (then a success is reported to reset it).
struct Claimed {
    batch: Batch,
    claim: Claim,
    lock: Box<dyn Lock>,
    slots: Slots,
    checkpoint: Option<serde_json::Value>,
    breaker_counting: bool,
    /// The batch's span, from its claim to its unlock (disabled when telemetry is off).
    span: Span,
}

impl Claimed {
    /// The batch lock and the pool slots, to be released together.
    fn locks(lock: Box<dyn Lock>, slots: Slots) -> impl Iterator<Item = Box<dyn Lock>> {
        std::iter::once(lock).chain(slots)
    }
}

/// What a claim needs to know of the attempts before it, read before the claim: the failed
/// attempts the store counted since the batch's last reset, and the checkpoint left.
struct EarlierAttempts {
    since: Seq,
    failed_attempts: u32,
    checkpoint: Option<serde_json::Value>,
}

impl EarlierAttempts {
    /// The failed attempts as the store counts them once the claim has committed: those read
    /// before it, plus the run of ours that was open in `batch` (the re-check's snapshot,
    /// read before the count) since the last reset, which the claim marks abandoned. The
    /// snapshot, not `claim.abandoned`, says so: a claim retried after a lost answer reports
    /// no abandoned run although its first try marked one. Holding the batch lock, no other
    /// worker opens or ends a run of ours meanwhile; one that lost its lock and ends its run
    /// transiently between the snapshot and the count is counted twice (one attempt fewer
    /// before giving up; its result is fenced all the same), and the next pass counts right.
    fn after(&self, batch: &Batch, component: &ComponentName, claim: &Claim) -> u32 {
        let open_since_reset = |run: &autocomp_model::Run| run.claim_seq > self.since;
        let abandoned = batch.open_runs.iter().any(|run| &run.component == component && open_since_reset(run))
            || claim.abandoned.as_ref().is_some_and(open_since_reset);
        self.failed_attempts + u32::from(abandoned)
    }
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
}

impl<C: Component> Runner<C> {
    /// A runner for `component` with its effective `trigger`. A usage error (exit 2) when
    /// its name or event type is not valid, the config names another event type, or the
    /// descriptor the registry would record is invalid.
    pub fn new(
        component: C,
        settings: C::Settings,
        trigger: Trigger,
        config: ComponentConfig,
        pipeline: Pipeline,
        shutdown: watch::Receiver<bool>,
    ) -> Result<Arc<Self>, RunError> {
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
        let mut descriptor = config.descriptor(name.clone(), component.version(), event_type.clone(), trigger, false);
        descriptor.result_schema = component.result_schema();
        descriptor.reads = component.reads();
        descriptor.validate().map_err(usage)?;
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
            config,
        }))
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
        }
    }

    fn shutting_down(&self) -> bool {
        *self.shutdown.borrow()
    }

    /// The candidates the index offers, in trigger order; retries of transient failures last.
    /// Watch mode asks this between passes; a pass re-checks each one against the store.
    pub async fn candidates(&self) -> Result<Vec<BatchId>, RunError> {
        // Ask for more than we will claim: other hosts may hold some of them.
        let wanted = self.claim_limit().saturating_mul(4).max(16);
        let limited = |t: &Trigger| Trigger { limit: Some(t.limit.map_or(wanted, |l| l.min(wanted))), ..t.clone() };
        let mut ids = self.pipeline.index.query(&limited(&self.descriptor.trigger)).await?;
        if let Some(retry) = &self.retry_trigger {
            for id in self.pipeline.index.query(&limited(retry)).await? {
                if !ids.contains(&id) {
                    ids.push(id);
                }
            }
        }
        Ok(ids)
    }

    /// One pass: poll lock, candidates, claims, work, results, unlock; reported to the
    /// component registry (a pass that claims work says so before working; every pass
    /// reports how it ended, an idle one only that).
    pub async fn run_pass(self: &Arc<Self>, selection: &Selection) -> Result<PassSummary, RunError> {
        let span = self.pass_span(selection);
        let passed = self.untraced_pass(selection).instrument(span.clone()).await;
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
            Selection::Offered(_) => "offered",
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

    /// `run_pass` without its span.
    async fn untraced_pass(self: &Arc<Self>, selection: &Selection) -> Result<PassSummary, RunError> {
        let started = Instant::now();
        // A setting refused, or a result it reads that its producer no longer publishes as
        // expected (only a component that reads some pays the registry read).
        let refused = match self.component.check_settings(&self.settings) {
            Err(refused) => Err(format!("[settings] {}: {}", refused.key, refused.message)),
            Ok(()) => crate::contract::check_reads(self.pipeline.store.as_ref(), &self.descriptor).await,
        };
        if let Err(message) = refused {
            let phase = PassPhase::Ended {
                outcome: PassOutcome::Error,
                summary: format!("not started: {message}"),
                duration_ms: started.elapsed().as_millis() as u64,
                work: Vec::new(),
            };
            if let Err(e) = self.report_pass(phase).await {
                debug!("cannot report the refused pass to the component registry: {e}");
            }
            return Err(RunError::Usage(message));
        }
        let passed = self.locked_pass(selection).await;
        let (outcome, summary) = match &passed {
            Ok(summary) => (summary.pass_outcome(), summary.describe()),
            // Another pass is running and reports for itself.
            Err(RunError::PollLockBusy(_)) => return passed,
            // The registry refused us (an event type clash): nothing to add.
            Err(RunError::Usage(_)) => return passed,
            Err(e) => (PassOutcome::Error, e.to_string()),
        };
        let work = match &passed {
            Ok(summary) => {
                if matches!(selection, Selection::Ready | Selection::Offered(_)) {
                    self.adapt_queue(summary);
                }
                summary.work()
            }
            Err(_) => Vec::new(),
        };
        let phase = PassPhase::Ended { outcome, summary, duration_ms: started.elapsed().as_millis() as u64, work };
        if let Write::Now(phase) = self.reports.ended(phase, started) {
            let reported = self.report_pass(phase).await;
            if let (Ok(_), Err(RunError::Usage(message))) = (&passed, reported) {
                return Err(RunError::Usage(message));
            }
        }
        passed
    }

    /// From now on the registry hears of this runner's passes as a watcher's: ends written
    /// together at most once a second and before it sleeps, idle ones at its heartbeat.
    pub fn coalesce_reports(&self) {
        self.reports.coalesce();
    }

    /// Writes what the registry has not been told: everything (a heartbeat, shutdown), or
    /// only ends with recorded results. An event type clash is a usage error (exit 2); an
    /// outage is a warning, as for any report.
    pub async fn flush_reports(&self, everything: bool) -> Result<(), RunError> {
        match self.reports.flush(everything) {
            Write::Now(phase) => match self.report_pass(phase).await {
                Err(RunError::Usage(message)) => Err(RunError::Usage(message)),
                _ => Ok(()),
            },
            Write::Nothing => Ok(()),
        }
    }

    /// How soon results not yet written to the registry are due (`flush_reports(false)`
    /// then writes them); `None` when there are none.
    pub fn results_due_in(&self) -> Option<std::time::Duration> {
        self.reports.results_due_in()
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
        let next = if summary.taken_up() >= limit && quick { (limit * 2).min(ceiling) } else { self.config.queue_size };
        if next != limit {
            debug!(from = limit, to = next, "claims per pass");
            self.claim_limit.store(next, Ordering::Relaxed);
        }
    }

    /// Tells the registry what this component is and how its pass stands. An event type
    /// another component already records is a configuration error (exit 2).
    async fn report_pass(&self, phase: PassPhase) -> Result<(), RunError> {
        let reported = record_pass(self.pipeline.store.as_ref(), &self.descriptor, &self.identity, phase).await;
        match &reported {
            Ok(()) => self.reports.written(),
            Err(RunError::Usage(_)) => {}
            Err(e) => warn!("cannot report the pass to the component registry: {e}"),
        }
        reported
    }

    async fn locked_pass(self: &Arc<Self>, selection: &Selection) -> Result<PassSummary, RunError> {
        let holder = self.lock_holder();
        let poll_path = LockPath::Poll(self.name.clone());
        let mut shutdown = self.shutdown.clone();
        let asked = Instant::now();
        let poll_lock = tokio::select! {
            lock = self.pipeline.locks.try_lock(&poll_path, &holder, self.config.poll_lock_timeout) => lock?,
            _ = stop_requested(&mut shutdown) => return Ok(PassSummary::default()),
        };
        let Some(poll_lock) = poll_lock else {
            return Err(RunError::PollLockBusy(self.name.to_string()));
        };
        // Candidates offered before a wait for the poll lock are another pass's leftovers by
        // now (it held the lock to claim them): ask the index again rather than lock and
        // re-check batches that are most likely done.
        let asked_again;
        let selection = match selection {
            Selection::Offered(_) if asked.elapsed() > OFFER_FRESH_FOR => {
                asked_again = Selection::Ready;
                &asked_again
            }
            _ => selection,
        };
        let mut summary = PassSummary::default();
        let mut claimed = Vec::new();
        if let Err(e) = self.claim_batches(selection, &holder, &mut summary, &mut claimed).await {
            // Whatever was claimed before the error is handed back untouched: ready again,
            // not left open to be counted as an abandoned attempt. All at once: each release
            // may retry for the store's whole retry window, and a pass must not take N times it.
            futures_util::future::join_all(claimed.into_iter().map(|batch| self.release(batch))).await;
            release_quietly(poll_lock).await;
            return Err(e);
        }
        if !claimed.is_empty() && self.reports.report_start() {
            // Before any work: a component whose event type another one records must not work.
            if let Err(e @ RunError::Usage(_)) = self.report_pass(PassPhase::Started).await {
                futures_util::future::join_all(claimed.into_iter().map(|batch| self.release(batch))).await;
                release_quietly(poll_lock).await;
                return Err(e);
            }
        }
        let poll_lock = if self.config.hold_poll_lock {
            Some(poll_lock)
        } else {
            // The claims are made: the poll lock guards nothing more. Released beside the
            // work instead (one lock-service write off the stage's path), a pass whose
            // ZooKeeper went silent mid-work exited after its session could have expired in
            // one run of three of tests/tests/zookeeper.rs (not yet understood), so first.
            release_quietly(poll_lock).await;
            None
        };
        summary.results.extend(self.work_all(claimed).await);
        if let Some(lock) = poll_lock {
            release_quietly(lock).await;
        }
        Ok(summary)
    }

    /// Steps 2-4: steering, candidates, try-lock, re-check against the store, pool slots,
    /// claim. The pipeline's steering is read first (one store read): a held component (its
    /// own hold or the whole pipeline's) asks the index for nothing and claims nothing; a
    /// manual run is answered `NotReady` saying who holds it, unless forced. Then in rounds:
    /// read the steering again (a hold that lands mid-pass stops further claims; the pool
    /// sizes are this read's), lock as many candidates as the queue has room for, re-check
    /// them with one store read, take their pool slots, and claim the ready ones in one store
    /// transaction (one commit, durable before any work); a round that loses some (locked
    /// elsewhere, no longer ready) is followed by another until the queue is full, the
    /// candidates run out or a pool is full (every batch of the component needs the same
    /// pools). Claimed batches go into `claimed` as soon as their claims commit, so the caller
    /// can release them on an error.
    async fn claim_batches(
        self: &Arc<Self>,
        selection: &Selection,
        holder: &LockHolder,
        summary: &mut PassSummary,
        claimed: &mut Vec<Claimed>,
    ) -> Result<(), RunError> {
        let (manual, force) = match selection {
            Selection::Ready | Selection::Offered(_) => (false, false),
            Selection::Batch { force, .. } => (true, *force),
        };
        let mut steering = PassSteering::default();
        steering.now = self.pipeline.store.steering().await?;
        if !force && let Some(held) = held_reason(&self.name, &steering.now) {
            debug!(component = %self.name, "held, claiming nothing: {held}");
            if let Selection::Batch { id, .. } = selection {
                summary.results.push(BatchResult::NotReady { id: id.clone(), reason: held.clone() });
            }
            summary.held = Some(held);
            return Ok(());
        }
        let candidates = match selection {
            Selection::Ready => self.candidates().await?,
            Selection::Offered(ids) => ids.clone(),
            Selection::Batch { id, .. } => vec![id.clone()],
        };
        let mut candidates = candidates.into_iter();
        let session = self.pipeline.locks.session();
        let mut first_round = true;
        loop {
            let room = self.claim_limit().saturating_sub(claimed.len()).min(MAX_CLAIMS_PER_ROUND);
            if room == 0 || self.must_stop_claiming(&session) {
                break;
            }
            if !std::mem::take(&mut first_round) {
                steering.now = self.pipeline.store.steering().await?;
                if !force && let Some(held) = held_reason(&self.name, &steering.now) {
                    let claimed = claimed.len();
                    info!(component = %self.name, claimed, "held mid-pass, claiming nothing more: {held}");
                    summary.held = Some(held);
                    break;
                }
            }
            let mut locked = self.lock_round(&mut candidates, room, holder, &session, manual, summary).await?;
            if self.must_stop_claiming(&session) {
                locked.release_all().await;
                break;
            }
            if locked.is_empty() {
                break;
            }
            let waiting = summary.waiting();
            self.claim_round(locked, manual, force, &mut steering, summary, claimed).await?;
            if summary.waiting() > waiting {
                // A pool is full: the next round's batches would wait for it too.
                break;
            }
        }
        Ok(())
    }

    /// Claiming stops on a shutdown request and while the lock service is not connected: a
    /// claim made then could be worked on by another host once the session expires.
    fn may_claim(&self, session: &watch::Receiver<SessionState>) -> bool {
        !self.shutting_down() && *session.borrow() == SessionState::Connected
    }

    /// `!may_claim`, saying so when it is the lock service that stops the claims.
    fn must_stop_claiming(&self, session: &watch::Receiver<SessionState>) -> bool {
        if self.may_claim(session) {
            return false;
        }
        if !self.shutting_down() {
            warn!("lock service not connected: claiming nothing more this pass");
        }
        true
    }

    /// Try-locks candidates until `room` are locked, the candidates run out or claiming
    /// must stop. Locked elsewhere is skipped (answered `Busy` to a manual run).
    async fn lock_round(
        &self,
        candidates: &mut std::vec::IntoIter<BatchId>,
        room: usize,
        holder: &LockHolder,
        session: &watch::Receiver<SessionState>,
        manual: bool,
        summary: &mut PassSummary,
    ) -> Result<HeldLocks, RunError> {
        let mut locked = HeldLocks::default();
        while locked.len() < room && self.may_claim(session) {
            let Some(id) = candidates.next() else { break };
            let path = LockPath::Batch(self.name.clone(), id.clone());
            match self.pipeline.locks.try_lock(&path, holder, self.config.batch_lock_timeout).await {
                Ok(Some(lock)) => locked.insert(id, lock),
                Ok(None) => {
                    debug!(batch = %id, "locked by another worker; skipped");
                    if manual {
                        summary.results.push(BatchResult::Busy { id });
                    }
                }
                // Not a lock at all: an alarm (logged as it was found); the other batches go on.
                Err(LockError::Foreign { path, .. }) => summary.foreign_locks.push(path),
                Err(e) => {
                    locked.release_all().await;
                    return Err(e.into());
                }
            }
        }
        Ok(locked)
    }

    /// One round's claims of the batches it locked: the store re-check (one read), the pool
    /// slots of the ready ones (a batch with none free waits, unclaimed), each remaining
    /// batch's attempt count and checkpoint (read a few at a time, before the claim), then
    /// the claims (one transaction). Batches past `max_attempts` get their give-up recorded
    /// (together, so they share commits) instead of work. Every lock (and slot) not handed to
    /// a claimed batch is released before this returns, whichever way it returns.
    async fn claim_round(
        &self,
        mut locked: HeldLocks,
        manual: bool,
        force: bool,
        steering: &mut PassSteering,
        summary: &mut PassSummary,
        claimed: &mut Vec<Claimed>,
    ) -> Result<(), RunError> {
        let round = self.claim_locked(&mut locked, manual, force, steering, summary, claimed).await;
        locked.release_all().await;
        round
    }

    /// `claim_round` but for the locks: it releases whatever this leaves in `locked`.
    async fn claim_locked(
        &self,
        locked: &mut HeldLocks,
        manual: bool,
        force: bool,
        steering: &mut PassSteering,
        summary: &mut PassSummary,
        claimed: &mut Vec<Claimed>,
    ) -> Result<(), RunError> {
        let ready = self.recheck(locked, manual, force, summary).await?;
        let ready = self.take_slots(locked, ready, steering, summary).await?;
        if ready.is_empty() {
            return Ok(());
        }
        let breaker_counting = steering.now.breakers.contains_key(&self.name);
        let earlier = self.read_earlier_attempts(&ready, force).await?;
        let ids: Vec<BatchId> = ready.iter().map(|batch| batch.id.clone()).collect();
        // Each batch's span starts at its claim; the round's one store call has its own.
        let spans: Vec<Span> = ids.iter().map(|id| self.batch_span(id)).collect();
        let claim_span = match telemetry::enabled() {
            true => tracing::info_span!(target: telemetry::TARGET, "claim", autocomp.batches = ids.len()),
            false => Span::none(),
        };
        let holder = self.run_holder();
        let claiming = self.pipeline.store.claim_many(&ids, &self.name, &holder);
        let answers = claiming.instrument(claim_span).await.inspect_err(|_| {
            spans.iter().for_each(|span| record_outcome(span, "not_claimed", true));
        })?;
        let mut failure = (answers.len() != ready.len()).then(|| {
            let message = format!("the store answered {} of {} claims", answers.len(), ready.len());
            RunError::Store(StoreError::Unavailable(message))
        });
        let mut fresh = Vec::new();
        for (((batch, earlier), answer), span) in ready.into_iter().zip(earlier).zip(answers).zip(spans) {
            let claim = match answer {
                Ok(claim) => claim,
                Err(StoreError::NotFound(id)) => {
                    record_outcome(&span, "missing", true);
                    self.missing(id, manual, &mut failure);
                    continue;
                }
                Err(e) => {
                    record_outcome(&span, "not_claimed", true);
                    failure.get_or_insert(e.into());
                    continue;
                }
            };
            span.record("autocomp.generation", claim.generation());
            if telemetry::enabled() {
                let took_over = claim.abandoned.is_some();
                info!(target: telemetry::TARGET, parent: &span, generation = claim.generation(), took_over, "claimed");
            }
            if let Some(abandoned) = &claim.abandoned {
                warn!(batch = %batch.id, generation = abandoned.generation, holder = %abandoned.holder.agent,
                    "took over a run whose holder died or stalled; it is marked abandoned");
            }
            let failed_attempts = earlier.after(&batch, &self.name, &claim);
            let (lock, slots) = locked.take(&batch.id).expect("a ready batch is one the round locked");
            let checkpoint = earlier.checkpoint;
            fresh.push((Claimed { batch, claim, lock, slots, checkpoint, breaker_counting, span }, failed_attempts));
        }
        // The batches the store refused to claim: free before any give-up is recorded.
        locked.release_all().await;
        if let Some(error) = failure {
            claimed.extend(fresh.into_iter().map(|(batch, _)| batch));
            return Err(error);
        }
        let (gave_up, work): (Vec<_>, Vec<_>) =
            fresh.into_iter().partition(|(_, failed_attempts)| *failed_attempts >= self.config.max_attempts && !force);
        claimed.extend(work.into_iter().map(|(batch, _)| batch));
        let recorded: Vec<BatchResult> = futures_util::stream::iter(gave_up)
            .map(|(batch, failed_attempts)| {
                let mut report = Report::new(self.config.max_reported_failures);
                report.outcome = Outcome::Failure;
                report.summary = format!(
                    "gave up after {failed_attempts} failed attempts (abandoned or transient); max_attempts is {}",
                    self.config.max_attempts
                );
                let span = batch.span.clone();
                self.record(batch, report, false).instrument(span)
            })
            .buffer_unordered(RECORDS_IN_FLIGHT)
            .collect()
            .await;
        summary.results.extend(recorded);
        Ok(())
    }

    /// The locked batches the store holds and still finds ready (all it holds, when forced),
    /// in lock order; the others' locks are released at once. The index lagged behind the
    /// store, or a manual run asked for a batch that is not ready (answered `NotReady`).
    async fn recheck(
        &self,
        locked: &mut HeldLocks,
        manual: bool,
        force: bool,
        summary: &mut PassSummary,
    ) -> Result<Vec<Batch>, RunError> {
        let ids = locked.ids();
        let batches = self.pipeline.store.get_batches(&ids).await?;
        let mut batches: HashMap<BatchId, Batch> = batches.into_iter().map(|batch| (batch.id.clone(), batch)).collect();
        let mut ready = Vec::new();
        let mut missing = None;
        for id in ids {
            let Some(batch) = batches.remove(&id) else {
                self.missing(id, manual, &mut missing);
                continue;
            };
            if !force && let Err(refusal) = self.descriptor.readiness(&batch) {
                debug!(batch = %id, clause = refusal.clause, "no longer ready in the store; skipped");
                if manual {
                    summary.results.push(BatchResult::NotReady { id, reason: refusal.reason });
                }
                continue;
            }
            ready.push(batch);
        }
        let wanted: HashSet<&BatchId> = ready.iter().map(|batch| &batch.id).collect();
        locked.release_where(|id| !wanted.contains(id)).await;
        match missing {
            Some(error) => Err(error),
            None => Ok(ready),
        }
    }

    /// Takes a slot of each pool the component names for each ready batch, in order, and
    /// keeps them with the batch's lock; returns the batches that got them. Once a pool has
    /// no free slot, that batch and the ones after it wait for it (every batch needs the same
    /// pools): their locks are released at once and they are answered `WaitingForPool`,
    /// neither claimed nor counted as an attempt. A pool's size is the round's steering read.
    async fn take_slots(
        &self,
        locked: &mut HeldLocks,
        ready: Vec<Batch>,
        steering: &mut PassSteering,
        summary: &mut PassSummary,
    ) -> Result<Vec<Batch>, RunError> {
        if self.descriptor.pools.is_empty() || ready.is_empty() {
            return Ok(ready);
        }
        let holder = self.lock_holder();
        let mut full: Option<PoolName> = None;
        let mut slotted = Vec::new();
        let mut waiting = Vec::new();
        for batch in ready {
            if full.is_none() {
                match self.slots_for(&holder, steering, summary).await? {
                    Ok(slots) => {
                        locked.add_slots(&batch.id, slots);
                        slotted.push(batch);
                        continue;
                    }
                    Err(pool) => full = Some(pool),
                }
            }
            let pool = full.clone().expect("set above");
            debug!(batch = %batch.id, %pool, "every slot of pool {pool} is taken; left for a later pass");
            waiting.push(BatchResult::WaitingForPool { id: batch.id, pool });
        }
        let left: HashSet<&BatchId> = waiting
            .iter()
            .filter_map(|r| match r {
                BatchResult::WaitingForPool { id, .. } => Some(id),
                _ => None,
            })
            .collect();
        locked.release_where(|id| left.contains(id)).await;
        if let Some(pool) = full {
            // Info, not a warning: a full pool is the pool doing its job.
            info!(%pool, waiting = left.len(), "{} for pool {pool}: every slot is in use", wait_for(left.len()));
        }
        summary.results.extend(waiting);
        Ok(slotted)
    }

    /// One slot of each of the component's pools, in the descriptor's order (one global
    /// order, so two batches never each hold a slot the other waits for; none waits anyway:
    /// every try is at once), or the first pool without a free one (the slots taken so far
    /// released). A pool the steering does not define has size 0, warned about once a pass.
    async fn slots_for(
        &self,
        holder: &LockHolder,
        steering: &mut PassSteering,
        summary: &mut PassSummary,
    ) -> Result<Result<Slots, PoolName>, RunError> {
        let mut taken: Slots = Vec::new();
        for pool in &self.descriptor.pools {
            let size = steering.size_of(pool);
            let mut slot = None;
            for index in 0..size {
                let path = LockPath::Slot(pool.clone(), index);
                match self.pipeline.locks.try_lock(&path, holder, std::time::Duration::ZERO).await {
                    Ok(Some(lock)) => {
                        slot = Some(lock);
                        break;
                    }
                    Ok(None) => {}
                    // Not a lock at all: an alarm (logged as it was found); the other slots
                    // may be free.
                    Err(LockError::Foreign { path, .. }) => {
                        if !summary.foreign_locks.contains(&path) {
                            summary.foreign_locks.push(path);
                        }
                    }
                    Err(e) => {
                        release_locks(taken).await;
                        return Err(e.into());
                    }
                }
            }
            match slot {
                Some(lock) => taken.push(lock),
                None => {
                    release_locks(taken).await;
                    return Ok(Err(pool.clone()));
                }
            }
        }
        Ok(Ok(taken))
    }

    /// Each ready batch's failed attempts since its last reset (not read when forced: a
    /// forced run ignores `max_attempts`) and its checkpoint, `STORE_READS_IN_FLIGHT` at a
    /// time, in the order of `ready`. Read before the claim, so nothing is claimed when a
    /// read fails, and nothing is read per batch after it.
    async fn read_earlier_attempts(&self, ready: &[Batch], force: bool) -> Result<Vec<EarlierAttempts>, StoreError> {
        let (store, name) = (&self.pipeline.store, &self.name);
        futures_util::stream::iter(ready)
            .map(|batch| async move {
                let since = batch.last_reset_of(&self.event_type);
                let failed_attempts =
                    async { if force { Ok(0) } else { store.failed_attempts(&batch.id, name, since).await } };
                let (failed_attempts, checkpoint) =
                    tokio::try_join!(failed_attempts, store.load_checkpoint(&batch.id, name))?;
                Ok(EarlierAttempts { since, failed_attempts, checkpoint })
            })
            .buffered(STORE_READS_IN_FLIGHT)
            .try_collect()
            .await
    }

    /// A batch the store does not have: a manual run names it (exit 2); the index listing
    /// it is only warned about.
    fn missing(&self, id: BatchId, manual: bool, failure: &mut Option<RunError>) {
        if manual {
            failure.get_or_insert(RunError::Usage(format!("batch {id} does not exist")));
        } else {
            warn!(batch = %id, "the index lists a batch the store does not have; skipped (`autocomp reindex` rebuilds the index)");
        }
    }

    /// Steps 5-7 for every claimed batch, `max_threads` at a time.
    async fn work_all(self: &Arc<Self>, claimed: Vec<Claimed>) -> Vec<BatchResult> {
        let permits = Arc::new(Semaphore::new(self.config.max_threads));
        let mut tasks = tokio::task::JoinSet::new();
        for batch in claimed {
            let (runner, permits) = (Arc::clone(self), Arc::clone(&permits));
            let span = batch.span.clone();
            tasks.spawn(async move { runner.work_one(batch, permits).await }.instrument(span));
        }
        let mut results = Vec::new();
        while let Some(joined) = tasks.join_next().await {
            match joined {
                Ok(result) => results.push(result),
                Err(e) => error!("a batch task failed: {e}"),
            }
        }
        results
    }

    async fn work_one(self: Arc<Self>, claimed: Claimed, permits: Arc<Semaphore>) -> BatchResult {
        let mut shutdown = self.shutdown.clone();
        let mut session = self.pipeline.locks.session();
        let permit = tokio::select! {
            permit = permits.acquire_owned() => permit.expect("the semaphore is never closed"),
            _ = stop_requested(&mut shutdown) => return self.release(claimed).await,
            _ = session_lost(&mut session) => return self.give_up_after_session_loss(claimed).await,
        };
        // Cut off from the lock service, start nothing: the server may be expiring the
        // session, and another host may take this batch the moment it does.
        let suspended = *session.borrow() == SessionState::Suspended;
        if suspended {
            warn!(batch = %claimed.batch.id, "lock service unreachable: not starting work until it is back");
            let back = tokio::select! {
                back = session_back(&mut session) => back,
                _ = stop_requested(&mut shutdown) => return self.release(claimed).await,
            };
            if !back {
                drop(permit);
                return self.give_up_after_session_loss(claimed).await;
            }
        }
        if self.shutting_down() {
            return self.release(claimed).await;
        }
        let cancelled = Arc::new(AtomicBool::new(false));
        let started = Instant::now();
        // The work thread's log lines; shared so a timed-out run keeps what it logged.
        let log = (self.config.max_output > 0).then(|| LogCapture::new(self.config.max_output));
        // The work's span ends when the work does (the future is dropped below), not with
        // the batch's result.
        let work_span = match telemetry::enabled() {
            true => tracing::info_span!(target: telemetry::TARGET, "work"),
            false => Span::none(),
        };
        let mut finished =
            Box::pin(self.spawn_work(&claimed, Arc::clone(&cancelled), log.clone()).instrument(work_span));
        let _watch = self.watch_for_takeover(&claimed, Arc::clone(&cancelled));
        let grace = self.config.shutdown_grace;
        let outcome = tokio::select! {
            finished = &mut finished => Some(finished),
            _ = tokio::time::sleep(self.config.max_runtime) => None,
            _ = async { stop_requested(&mut shutdown).await; tokio::time::sleep(grace).await } => {
                cancelled.store(true, Ordering::Relaxed);
                info!(batch = %claimed.batch.id, "shutting down: work cancelled, claim released");
                self.let_cancelled_work_clean_up(finished.as_mut()).await;
                drop(permit);
                return self.release(claimed).await;
            }
            _ = session_lost(&mut session) => {
                // Every batch's task sees the loss at once: all work is cancelled together.
                cancelled.store(true, Ordering::Relaxed);
                error!(batch = %claimed.batch.id, "lock service session lost: work cancelled, nothing recorded");
                self.let_lost_work_go(finished.as_mut()).await;
                drop(permit);
                return self.give_up_after_session_loss(claimed).await;
            }
        };
        drop(permit);
        let Some(outcome) = outcome else {
            // Recorded first, so the result is fenced however long the thread takes; then the
            // thread gets `cancel_grace` to clean up. One still hung after that cannot hold
            // anything: the process exits after this pass.
            cancelled.store(true, Ordering::Relaxed);
            let mut report = failed_report(
                &self.config,
                &format!("did not finish within max_runtime {}", humantime::format_duration(self.config.max_runtime)),
            );
            report.timed_out = true;
            report.duration_ms = started.elapsed().as_millis() as u64;
            // What the work logged until now; streams it would have set itself are lost
            // with the work, which has not returned.
            if let Some(log) = log.as_ref().and_then(LogCapture::finish) {
                report.output = fitted_output(RunOutput { streams: vec![log] }, self.config.max_output);
            }
            let result = self.record(claimed, report, true).await;
            self.let_cancelled_work_clean_up(finished.as_mut()).await;
            return result;
        };
        drop(finished);
        let mut report = match outcome {
            Ok((result, report)) => report_of(result, report),
            Err(()) => failed_report(&self.config, "the work thread ended without a result"),
        };
        report.duration_ms = started.elapsed().as_millis() as u64;
        self.record(claimed, report, false).await
    }

    /// Cancels the work once its run stops being the open, current one in the store (an
    /// operator's `cancel`, or a takeover): checked every second while the work runs; the
    /// watch ends when the returned guard is dropped.
    fn watch_for_takeover(&self, claimed: &Claimed, cancelled: Arc<AtomicBool>) -> AbortOnDrop {
        let store = Arc::clone(&self.pipeline.store);
        let (id, component, generation) = (claimed.batch.id.clone(), self.name.clone(), claimed.claim.generation());
        AbortOnDrop(tokio::spawn(async move {
            loop {
                tokio::time::sleep(TAKEOVER_CHECK_INTERVAL).await;
                // One indexed read of the run, whatever the length of the batch's log.
                let Ok(run) = store.run_state(&id, &component).await else { continue };
                let still_ours = run.is_some_and(|run| run.generation == generation && run.state == RunState::Open);
                if !still_ours {
                    warn!(batch = %id, "the run was cancelled or taken over; stopping its work");
                    cancelled.store(true, Ordering::Relaxed);
                    return;
                }
            }
        }))
    }

    /// Waits up to `cancel_grace` for cancelled work to return (its result is discarded).
    /// After a lost session another host may take the batch once the server expires the
    /// session: cancelled work that has not stopped within the lock service's grace is left
    /// behind, and the pass ends (the process exits 4 without it).
    async fn let_lost_work_go<F: Future>(&self, work: std::pin::Pin<&mut F>) {
        let grace = self
            .pipeline
            .locks
            .lost_session_grace()
            .map_or(self.config.cancel_grace, |g| g.min(self.config.cancel_grace));
        if tokio::time::timeout(grace, work).await.is_err() {
            warn!("cancelled work did not stop within {grace:?} of losing the lock session; leaving it behind");
        }
    }

    async fn let_cancelled_work_clean_up<F: Future>(&self, work: std::pin::Pin<&mut F>) {
        if tokio::time::timeout(self.config.cancel_grace, work).await.is_err() {
            warn!("cancelled work did not return within cancel_grace; leaving it behind");
        }
    }

    /// Runs `work` on its own OS thread, panics caught; resolves when it returns.
    fn spawn_work(
        &self,
        claimed: &Claimed,
        cancelled: Arc<AtomicBool>,
        log: Option<LogCapture>,
    ) -> impl Future<Output = Result<(Result<(), WorkError>, Report), ()>> + use<C> {
        let (sender, receiver) = oneshot::channel();
        let component = Arc::clone(&self.component);
        let settings = Arc::clone(&self.settings);
        let batch = claimed.batch.clone();
        let checkpoints = CheckpointWriter {
            store: Arc::clone(&self.pipeline.store),
            runtime: tokio::runtime::Handle::current(),
            batch: batch.id.clone(),
            component: self.name.clone(),
            generation: claimed.claim.generation(),
        };
        let mut context = WorkContext::new(
            &batch,
            self.config.max_reported_failures,
            self.config.max_output,
            claimed.checkpoint.clone(),
            Some(checkpoints),
            cancelled,
        );
        let spawned = std::thread::Builder::new().name(format!("work-{}", batch.id)).spawn(move || {
            let installed = log.as_ref().map(LogCapture::install);
            let result = std::panic::catch_unwind(AssertUnwindSafe(|| component.work(&batch, &settings, &mut context)));
            drop(installed);
            if let Some(log) = log.as_ref().and_then(LogCapture::finish) {
                context.add_log(log);
            }
            let result = result.unwrap_or_else(|panic| {
                let message = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "a non-string panic payload".into());
                Err(WorkError::Permanent(format!("panicked: {message}")))
            });
            sender.send((result, context.into_report())).ok();
        });
        async move {
            spawned.map_err(|e| error!("cannot start a work thread: {e}"))?;
            receiver.await.map_err(|_| ())
        }
    }

    /// Records the result, fenced by the claim, after checking we still hold the lock; then
    /// releases the lock and the pool slots, and tells the circuit breaker (if the component
    /// has one) of a permanent failure, or of a success while it was counting.
    async fn record(&self, claimed: Claimed, report: Report, timed_out: bool) -> BatchResult {
        let Claimed { batch, claim, lock, slots, breaker_counting, span, .. } = claimed;
        let id = batch.id.clone();
        let mut session = self.pipeline.locks.session();
        // While disconnected, hold the commit: the session may come back, or be lost.
        let state = match session.wait_for(|s| *s != SessionState::Suspended).await {
            Ok(state) => *state,
            Err(_) => SessionState::Lost,
        };
        let still_held = state == SessionState::Connected && lock.still_held().await.unwrap_or(false);
        if !still_held {
            error!(batch = %id, "lost the batch lock before recording; nothing recorded");
            // Fenced if someone took the batch over meanwhile; otherwise it is ready again.
            self.pipeline.store.release(&id, &self.name, claim.generation()).await.ok();
            release_locks(Claimed::locks(lock, slots)).await;
            record_outcome(&span, "not_recorded", true);
            return BatchResult::NotRecorded { id };
        }
        let key = IdempotencyKey::new(format!("{}.{}.{}", self.name, id, claim.generation()))
            .expect("names and numbers make a valid key");
        let event_of = |report: &Report| {
            let mut details = report.to_details();
            if self.component.reads_content() {
                // The content this result was worked out from: once the batch's content
                // changes after it, the result is stale and the step is done again.
                details[autocomp_model::CONTENT_SEQ_KEY] = serde_json::json!(batch.modified_seq.0);
            }
            NewEvent::new(self.event_type.clone(), report.outcome, self.identity.agent.clone())
                .with_details(details)
                .in_run(self.name.clone(), claim.generation())
                .with_idempotency_key(key.clone())
        };
        let mut report = within_document_limit(report);
        // The result's store calls (one, or a smaller result after a refusal).
        let append_span = match telemetry::enabled() {
            true => tracing::info_span!(target: telemetry::TARGET, parent: &span, "append",
                autocomp.event_type = %self.event_type),
            false => Span::none(),
        };
        let mut appended =
            self.pipeline.store.append_event(&id, event_of(&report)).instrument(append_span.clone()).await;
        if let (Err(StoreError::Invalid(refusal)), Some(_)) = (&appended, &report.output) {
            // The output is what the result can best do without: the same result, smaller.
            warn!(batch = %id, "the store refused the result: {refusal}; recording it without its output");
            report.output = None;
            report.summary = with_note(&report.summary, "output dropped: the batch is at its size cap");
            appended = self.pipeline.store.append_event(&id, event_of(&report)).instrument(append_span.clone()).await;
        }
        if let Err(StoreError::Invalid(refusal)) = &appended {
            // The store refused the result itself (the batch is at its size cap, say): record
            // that in a few bytes, so the batch waits for a person instead of being worked
            // on again at every pass. The first append wrote nothing, so its key is free.
            warn!(batch = %id, "the store refused the result: {refusal}; recording that instead");
            let mut refused = failed_report(&self.config, &format!("the store refused the result: {refusal}"));
            refused.duration_ms = report.duration_ms;
            report = refused;
            appended = self.pipeline.store.append_event(&id, event_of(&report)).instrument(append_span.clone()).await;
        }
        drop(append_span);
        let line = summary_line(&id, &self.event_type, &report);
        let result = match appended {
            Ok(_) => {
                // Best effort: the result is recorded, and a closed stdout (`| head`) must
                // not turn the pass into a panic.
                if let Err(e) = writeln!(std::io::stdout().lock(), "{}", crate::for_terminal(&line)) {
                    debug!(batch = %id, "cannot print the result line: {e}");
                }
                info!(
                    batch = %id,
                    component = %self.name,
                    generation = claim.generation(),
                    outcome = report.outcome.as_str(),
                    duration_ms = report.duration_ms,
                    timed_out,
                    "recorded {}",
                    self.event_type
                );
                let result = match report.outcome {
                    Outcome::Success => WorkResult::Success,
                    Outcome::Failure if report.transient => WorkResult::Transient,
                    Outcome::Failure => WorkResult::Failure,
                };
                let work = WorkDone { result, duration_ms: report.duration_ms };
                BatchResult::Recorded { id: id.clone(), outcome: report.outcome, timed_out, work }
            }
            Err(e) if e.is_fenced() => {
                warn!(batch = %id, "result refused, another worker took the batch over: {e}");
                BatchResult::Fenced { id }
            }
            Err(e @ StoreError::Unavailable(_)) => {
                error!(batch = %id, "cannot record the result: {e}");
                BatchResult::StoreUnreachable { id }
            }
            Err(e) => {
                error!(batch = %id, "cannot record the result: {e}");
                BatchResult::NotRecorded { id }
            }
        };
        release_locks(Claimed::locks(lock, slots)).await;
        match &result {
            BatchResult::Recorded { outcome, .. } => {
                record_outcome(&span, outcome.as_str(), *outcome == Outcome::Failure);
            }
            BatchResult::Fenced { .. } => record_outcome(&span, "fenced", true),
            BatchResult::StoreUnreachable { .. } => record_outcome(&span, "store_unreachable", true),
            _ => record_outcome(&span, "not_recorded", true),
        }
        if let BatchResult::Recorded { id, outcome, .. } = &result {
            let failed = *outcome == Outcome::Failure && !report.transient;
            if failed || (breaker_counting && *outcome == Outcome::Success) {
                self.tell_breaker(id, failed, &report).await;
            }
        }
        result
    }

    /// Counts a permanent failure toward the component's circuit breaker, or resets its count
    /// after a success; says so when the count opens the circuit (the hold stops the next
    /// claims). A breaker that cannot be told is warned about: the result stands.
    async fn tell_breaker(&self, id: &BatchId, failed: bool, report: &Report) {
        let Some(break_after) = self.descriptor.break_after else { return };
        let notes = report_notes(report);
        let summary = if notes.is_empty() { report.outcome.as_str().to_owned() } else { notes.join("; ") };
        let request = SteeringRequest {
            change: SteeringChange::Outcome {
                component: self.name.clone(),
                batch: id.clone(),
                failed,
                break_after,
                summary,
            },
            by: self.identity.agent.clone(),
            reason: "circuit breaker".into(),
            expect_version: None,
        };
        match self.pipeline.store.steer(request).await {
            Ok(steered) if steered.circuit_opened => {
                let reason = steered.steering.components.get(&self.name).map_or("", |hold| hold.reason.as_str());
                warn!(
                    component = %self.name,
                    "circuit breaker opened, {} claims no new work until `autocomp resume {}`: {reason}",
                    self.name,
                    self.name
                );
            }
            Ok(_) => debug!(batch = %id, failed, "told the circuit breaker"),
            Err(e) => warn!(batch = %id, failed, "cannot tell the circuit breaker of this result: {e}"),
        }
    }

    /// Graceful shutdown: close the run without an event so the batch is ready again.
    async fn release(&self, claimed: Claimed) -> BatchResult {
        let id = claimed.batch.id.clone();
        if let Err(e) = self.pipeline.store.release(&id, &self.name, claimed.claim.generation()).await {
            warn!(batch = %id, "cannot release the claim: {e}");
        }
        release_locks(Claimed::locks(claimed.lock, claimed.slots)).await;
        record_outcome(&claimed.span, "released", false);
        BatchResult::Released { id }
    }

    /// The lock session is lost: record nothing, hand the claim back (refused as fenced if
    /// another worker took the batch over meanwhile); the pass ends with exit 4.
    async fn give_up_after_session_loss(&self, claimed: Claimed) -> BatchResult {
        let id = claimed.batch.id.clone();
        match self.pipeline.store.release(&id, &self.name, claimed.claim.generation()).await {
            Ok(()) => {}
            Err(e) if e.is_fenced() => debug!(batch = %id, "claim already taken over: {e}"),
            Err(e) => warn!(batch = %id, "cannot release the claim: {e}"),
        }
        release_locks(Claimed::locks(claimed.lock, claimed.slots)).await;
        record_outcome(&claimed.span, "not_recorded", true);
        BatchResult::NotRecorded { id }
    }

    /// Why the component claims nothing now, if it is held (its own hold or the whole
    /// pipeline's): one store read. A watcher asks before it asks the index.
    pub async fn held(&self) -> Result<Option<String>, RunError> {
        Ok(held_reason(&self.name, &self.pipeline.store.steering().await?))
    }

    /// `--dry-run`: what a pass would claim and why, touching nothing (no locks, no claims).
    /// `limit` caps the candidates listed (`None`: as many as a pass asks the index for,
    /// `Some(0)`: all); the rest are counted, so the caller can say they were left out. A
    /// held component (unless forced) says so, and each batch it would claim says it waits
    /// for the resume. Pool slots are not tried (that would take locks).
    pub async fn dry_run(&self, selection: &Selection, limit: Option<usize>) -> Result<DryRun, RunError> {
        let (mut candidates, force) = match selection {
            Selection::Ready | Selection::Offered(_) => (self.all_candidates().await?, false),
            Selection::Batch { id, force } => (vec![id.clone()], *force),
        };
        let held = if force { None } else { self.held().await? };
        let shown = match limit {
            Some(0) => candidates.len(),
            Some(limit) => limit,
            None => self.config.queue_size.saturating_mul(4).max(16),
        };
        let not_shown = candidates.len().saturating_sub(shown);
        candidates.truncate(shown);
        let mut lines = Vec::new();
        let mut would_claim = 0;
        for id in candidates {
            let batch = self.pipeline.store.get_batch(&id).await?;
            let verdict = match self.descriptor.readiness(&batch) {
                _ if would_claim >= self.config.queue_size => "would leave for the next pass (queue full)".to_owned(),
                Ok(()) if held.is_some() => {
                    would_claim += 1;
                    format!("would claim once resumed (held): every trigger clause holds (priority {})", batch.priority)
                }
                Ok(()) => {
                    would_claim += 1;
                    format!("would claim: every trigger clause holds (priority {})", batch.priority)
                }
                Err(_) if force => {
                    would_claim += 1;
                    "would claim: forced, trigger ignored".to_owned()
                }
                Err(refusal) if refusal.retrying => format!("would skip: {refusal}"),
                Err(refusal) => format!("would skip: {refusal}"),
            };
            lines.push(format!("{id} {verdict}"));
        }
        Ok(DryRun { lines, not_shown, held })
    }

    /// Every candidate the index offers, in the order `candidates` gives them, without the
    /// cap a pass applies: a dry run counts what it does not list. The trigger's own
    /// `limit` still holds, as it does for a pass.
    async fn all_candidates(&self) -> Result<Vec<BatchId>, RunError> {
        let mut ids = self.pipeline.index.query(&self.descriptor.trigger).await?;
        if let Some(retry) = &self.retry_trigger {
            for id in self.pipeline.index.query(retry).await? {
                if !ids.contains(&id) {
                    ids.push(id);
                }
            }
        }
        Ok(ids)
    }
}

/// What `--dry-run` found: a line per candidate listed, and how many more there were.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DryRun {
    pub lines: Vec<String>,
    /// Candidates the index offers beyond the listed ones.
    pub not_shown: usize,
    /// Why nothing would be claimed now: the component (or the whole pipeline) is held.
    pub held: Option<String>,
}

const TAKEOVER_CHECK_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

/// At most this many batches are re-checked and claimed in one store call: a huge
/// `queue_size` is claimed in several commits, each well within the stores' page limits.
const MAX_CLAIMS_PER_ROUND: usize = 1_000;
/// How long the candidates a watcher was offered stay worth claiming: a poll lock that
/// took longer to get was held by another pass, which claimed from the same answer.
const OFFER_FRESH_FOR: std::time::Duration = std::time::Duration::from_millis(20);
/// Work this quick on average (per batch) lets a pass's claims grow under a backlog.
const QUICK_WORK_MS: u64 = 100;

/// A claim round's attempt counts and checkpoint reads in flight at once: enough to keep the
/// store busy without queueing a thread per claimed batch on its connection.
const STORE_READS_IN_FLIGHT: usize = 8;

/// Give-up results recorded at once: they queue together for the store's group commit.
const RECORDS_IN_FLIGHT: usize = 64;

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The batch locks a claim round holds and has not handed to a claimed batch, with the pool
/// slots taken for each. Releasing is async, so the round releases them itself on every path
/// it takes (`release_where`, `release_all`); a guard dropped still holding some (a panic, a
/// dropped pass) hands them to a task that releases them, rather than leaving them held
/// until the process exits.
#[derive(Default)]
struct HeldLocks {
    /// Batch ids in the order they were locked (the candidates' order), released ones too.
    order: Vec<BatchId>,
    locks: HashMap<BatchId, Box<dyn Lock>>,
    /// The pool slots taken for a locked batch: they go wherever its lock goes.
    slots: HashMap<BatchId, Slots>,
}

impl HeldLocks {
    fn insert(&mut self, id: BatchId, lock: Box<dyn Lock>) {
        self.order.push(id.clone());
        self.locks.insert(id, lock);
    }

    /// Keeps `slots` with the lock of `id` (which the round holds).
    fn add_slots(&mut self, id: &BatchId, slots: Slots) {
        debug_assert!(self.locks.contains_key(id), "slots for a batch the round does not hold");
        self.slots.entry(id.clone()).or_default().extend(slots);
    }

    fn len(&self) -> usize {
        self.locks.len()
    }

    fn is_empty(&self) -> bool {
        self.locks.is_empty()
    }

    /// The batches still locked, in the order they were locked.
    fn ids(&self) -> Vec<BatchId> {
        self.order.iter().filter(|id| self.locks.contains_key(*id)).cloned().collect()
    }

    /// Hands the lock of `id` and its pool slots over: releasing them is the caller's
    /// business from then on.
    fn take(&mut self, id: &BatchId) -> Option<(Box<dyn Lock>, Slots)> {
        let lock = self.locks.remove(id)?;
        Some((lock, self.slots.remove(id).unwrap_or_default()))
    }

    /// Releases the locks (and slots) of the batches `unwanted` picks, all at once; keeps
    /// the others.
    async fn release_where(&mut self, unwanted: impl Fn(&BatchId) -> bool) {
        let mut released: Vec<_> = self.locks.extract_if(|id, _| unwanted(id)).map(|(_, lock)| lock).collect();
        released.extend(self.slots.extract_if(|id, _| unwanted(id)).flat_map(|(_, slots)| slots));
        release_locks(released).await;
    }

    async fn release_all(&mut self) {
        release_locks(self.drain()).await;
    }

    /// Every lock and slot still held, taken out of the guard.
    fn drain(&mut self) -> Vec<Box<dyn Lock>> {
        let mut all: Vec<_> = self.locks.drain().map(|(_, lock)| lock).collect();
        all.extend(self.slots.drain().flat_map(|(_, slots)| slots));
        all
    }
}

impl Drop for HeldLocks {
    fn drop(&mut self) {
        if self.locks.is_empty() && self.slots.is_empty() {
            return;
        }
        let locks = self.drain();
        warn!(locks = locks.len(), "a claim round ended without releasing its batch locks; releasing them now");
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn(release_locks(locks))),
            // No runtime to release on: the locks go with the process (flock) or its
            // session, which the lock service closes at exit.
            Err(_) => warn!("no runtime to release the batch locks on; they end with the process"),
        }
    }
}

/// "1 batch waits", "2 batches wait".
fn wait_for(n: usize) -> String {
    if n == 1 { "1 batch waits".to_owned() } else { format!("{n} batches wait") }
}

/// The pool slots a batch's work holds, one per pool the component names.
type Slots = Vec<Box<dyn Lock>>;

/// The pipeline's steering as a pass goes by it: the newest read (at the start of the
/// current claim round), and the pools it found no size for, warned about once a pass.
#[derive(Default)]
struct PassSteering {
    now: Steering,
    warned: HashSet<PoolName>,
}

impl PassSteering {
    /// The pool's size; 0 (every batch needing it waits) for a pool the store does not define.
    fn size_of(&mut self, pool: &PoolName) -> u32 {
        if let Some(defined) = self.now.pool(pool) {
            return defined.size;
        }
        if self.warned.insert(pool.clone()) {
            warn!(%pool, "pool {pool} has no size: autocomp pool set {pool} N (until then no batch gets a slot of it)");
        }
        0
    }
}

/// Why `component` claims nothing, if it is held: its own hold (a pause, a drain, its open
/// circuit) else the whole pipeline's, in one line naming who, since when, why and the
/// command that lifts it.
pub(crate) fn held_reason(component: &ComponentName, steering: &Steering) -> Option<String> {
    let (hold, what, resume) = match steering.components.get(component) {
        Some(hold) => (hold, component.to_string(), format!("autocomp resume {component}")),
        None => (steering.pipeline.as_ref()?, "the pipeline".to_owned(), "autocomp resume --all".to_owned()),
    };
    let reason = &hold.reason;
    Some(match hold.kind {
        // The reason says "circuit open: N consecutive failures, last: ...", and `by` is the
        // runner whose failure opened it.
        HoldKind::Circuit => format!("{what} is held since {}: {reason} ({resume})", hold.since),
        kind => format!("{what} is {} by {} since {}: {reason} ({resume})", kind.as_str(), hold.by, hold.since),
    })
}

/// How a batch ended, on its span (nothing on a disabled one): `success` or `failure` for a
/// recorded result, else what became of it (`released`, `fenced`, `not_recorded`, ...).
fn record_outcome(span: &Span, outcome: &str, error: bool) {
    span.record("autocomp.outcome", outcome);
    if error {
        span.record("otel.status_code", "ERROR");
    }
}

/// Releases several locks at once (each may be a round trip to the lock service).
async fn release_locks(locks: impl IntoIterator<Item = Box<dyn Lock>>) {
    futures_util::future::join_all(locks.into_iter().map(release_quietly)).await;
}

/// Releases a lock; a failure is logged, not fatal: the lock dies with the process anyway.
async fn release_quietly(lock: Box<dyn Lock>) {
    let path = lock.path().relative();
    if let Err(e) = lock.release().await {
        warn!(lock = %path, "cannot release the lock: {e}");
    }
}

/// Resolves once a shutdown is requested (never, if the sender is gone without one).
pub(crate) async fn stop_requested(shutdown: &mut watch::Receiver<bool>) {
    if shutdown.wait_for(|stop| *stop).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Waits out a disconnection: true when the session is connected again, false when lost.
async fn session_back(session: &mut watch::Receiver<SessionState>) -> bool {
    let state = session.wait_for(|state| *state != SessionState::Suspended).await.map(|state| *state);
    state.is_ok_and(|state| state == SessionState::Connected)
}

/// Resolves once the lock service session is lost (or its state can no longer be known).
async fn session_lost(session: &mut watch::Receiver<SessionState>) {
    session.wait_for(|state| *state == SessionState::Lost).await.ok();
}

/// A report the store would refuse as too large (a huge result or failure details) becomes
/// a failure saying so, with the failures' count kept: refused, it would record nothing.
fn within_document_limit(mut report: Report) -> Report {
    let size_of = |report: &Report| serde_json::to_vec(&report.to_details()).map_or(usize::MAX, |bytes| bytes.len());
    let mut size = size_of(&report);
    if size <= autocomp_model::MAX_DOCUMENT_BYTES {
        return report;
    }
    if report.output.take().is_some() {
        // The output goes first: the result and the failures are what later steps read.
        report.summary = with_note(&report.summary, "output dropped: the report was over the store's limit per event");
        size = size_of(&report);
        if size <= autocomp_model::MAX_DOCUMENT_BYTES {
            return report;
        }
    }
    let mut trimmed = Report::new(report.failures_cap);
    trimmed.outcome = Outcome::Failure;
    trimmed.duration_ms = report.duration_ms;
    trimmed.failures_total = report.failures_total;
    trimmed.summary = format!(
        "the report was {size} bytes, over the store's limit of {} bytes per event; its result and failure \
         list were dropped ({} failures found)",
        autocomp_model::MAX_DOCUMENT_BYTES,
        report.failures_total
    );
    trimmed
}

/// `summary; note`, or the note alone.
fn with_note(summary: &str, note: &str) -> String {
    if summary.is_empty() { note.to_owned() } else { format!("{summary}; {note}") }
}

fn failed_report(config: &ComponentConfig, summary: &str) -> Report {
    let mut report = Report::new(config.max_reported_failures);
    report.outcome = Outcome::Failure;
    report.summary = summary.to_owned();
    report
}

/// How `work`'s return shapes the recorded report (`testing::run_work` applies it too).
pub(crate) fn report_of(result: Result<(), WorkError>, mut report: Report) -> Report {
    match result {
        Ok(()) => {}
        Err(error) => {
            report.outcome = Outcome::Failure;
            report.transient = matches!(error, WorkError::Transient(_));
            report.summary =
                if report.summary.is_empty() { error.to_string() } else { format!("{}; {error}", report.summary) };
        }
    }
    report
}

/// One line per processed batch on stdout (what cron mails).
fn summary_line(id: &BatchId, event_type: &EventType, report: &Report) -> String {
    let seconds = report.duration_ms as f64 / 1000.0;
    let mut line = format!("{id} {event_type} {} {seconds:.1}s", report.outcome.as_str());
    let notes = report_notes(report);
    if !notes.is_empty() {
        line.push_str(": ");
        line.push_str(&notes.join("; "));
    }
    line
}

/// What the summary line says of a report after its outcome: transient, its summary, its
/// first failure (also what a circuit breaker keeps of a failure).
fn report_notes(report: &Report) -> Vec<String> {
    let mut notes = Vec::new();
    if report.transient {
        notes.push("transient, will retry".to_owned());
    }
    if !report.summary.is_empty() {
        notes.push(report.summary.clone());
    }
    if report.failures_total > 0 {
        let first = &report.failures[0];
        let reference = if first.reference.is_empty() { "the batch" } else { first.reference.as_str() };
        notes.push(format!("{} failures, first: {reference}: {}", report.failures_total, first.description));
    }
    notes
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::locks::LocalLocks;

    #[test]
    fn a_report_over_the_document_limit_loses_its_output_before_its_result() {
        let mut report = Report::new(10);
        report.summary = "2 pages".into();
        report.result = Some(serde_json::json!({"pages": 2}));
        let huge = autocomp_model::OutputStream {
            name: "log".into(),
            head: "x".repeat(autocomp_model::MAX_DOCUMENT_BYTES),
            ..Default::default()
        };
        report.output = Some(RunOutput { streams: vec![huge] });
        let kept = within_document_limit(report.clone());
        assert_eq!((kept.outcome, kept.result.clone(), kept.output.clone()), (Outcome::Success, report.result, None));
        assert!(kept.summary.starts_with("2 pages; output dropped"), "{}", kept.summary);
        let small = Report { output: Some(RunOutput::default()), ..Report::new(10) };
        assert_eq!(within_document_limit(small.clone()), small, "within the limit: untouched");
    }

    /// A round's batch locks end released on every path: those it lets go of explicitly at
    /// once, and those it never got to (a panic, a dropped pass) when the guard is dropped.
    /// Flock files tell the two apart: a release removes the file, a plain drop leaves it.
    #[tokio::test]
    async fn held_locks_are_released_explicitly_or_by_the_guards_drop() {
        let dir = tempfile::tempdir().unwrap();
        let locks = LocalLocks::new(dir.path());
        let holder = LockHolder { agent: "test".into(), host: "testhost".into(), pid: 1, since: Timestamp::now() };
        let ids: Vec<BatchId> = ["B1", "B2", "B3"].iter().map(|id| BatchId::new(*id).unwrap()).collect();
        let file = |id: &BatchId| dir.path().join(format!("batch/probe/{id}.lock"));
        let mut held = HeldLocks::default();
        for id in &ids {
            let path = LockPath::Batch(ComponentName::new("probe").unwrap(), id.clone());
            held.insert(id.clone(), locks.try_lock(&path, &holder, Duration::ZERO).await.unwrap().expect("free"));
        }

        held.release_where(|id| id == &ids[1]).await;
        assert!(!file(&ids[1]).exists(), "release_where did not release B2");
        assert_eq!(held.ids(), vec![ids[0].clone(), ids[2].clone()], "the others stay held, in lock order");
        let (taken, no_slots) = held.take(&ids[0]).expect("B1 is held");
        assert!(no_slots.is_empty());
        drop(held);

        let deadline = Instant::now() + Duration::from_secs(10);
        while file(&ids[2]).exists() {
            assert!(Instant::now() < deadline, "the dropped guard never released B3");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(file(&ids[0]).exists() && taken.still_held().await.unwrap(), "a lock taken out is the taker's");
        taken.release().await.unwrap();
    }

    #[test]
    fn a_hold_is_worded_with_who_since_when_why_and_the_command_that_lifts_it() {
        let name = ComponentName::new("checksum-verifier").unwrap();
        let mut steering = Steering::default();
        assert_eq!(held_reason(&name, &steering), None);
        let hold = |kind, by: &str, reason: &str| autocomp_model::Hold {
            kind,
            by: Agent::new(by).unwrap(),
            reason: reason.into(),
            since: Timestamp(0),
        };
        steering.pipeline = Some(hold(HoldKind::Drain, "operator:bob", "db upgrade"));
        assert_eq!(
            held_reason(&name, &steering).unwrap(),
            "the pipeline is draining by operator:bob since 1970-01-01T00:00:00.000Z: db upgrade \
             (autocomp resume --all)"
        );
        // The component's own hold comes first: resuming the pipeline would not lift it.
        steering.components.insert(name.clone(), hold(HoldKind::Pause, "operator:ann", "tape maintenance"));
        assert_eq!(
            held_reason(&name, &steering).unwrap(),
            "checksum-verifier is paused by operator:ann since 1970-01-01T00:00:00.000Z: tape maintenance \
             (autocomp resume checksum-verifier)"
        );
        let circuit = hold(HoldKind::Circuit, "checksum-verifier/1.0@h#1", "circuit open: 3 consecutive failures");
        steering.components.insert(name.clone(), circuit);
        assert_eq!(
            held_reason(&name, &steering).unwrap(),
            "checksum-verifier is held since 1970-01-01T00:00:00.000Z: circuit open: 3 consecutive failures \
             (autocomp resume checksum-verifier)"
        );
    }

    #[test]
    fn a_pass_whose_batches_wait_for_a_pool_is_idle_exits_0_and_says_which_pool() {
        let tape = PoolName::new("tape").unwrap();
        let waiting = |id: &str| BatchResult::WaitingForPool { id: BatchId::new(id).unwrap(), pool: tape.clone() };
        let mut summary = PassSummary { results: vec![waiting("B1"), waiting("B2")], ..PassSummary::default() };
        assert_eq!(summary.describe(), "nothing claimed; 2 batches wait for pool tape");
        assert_eq!((summary.exit_code(), summary.pass_outcome()), (exit::OK, PassOutcome::Idle));
        assert_eq!((summary.taken_up(), summary.waiting()), (0, 2));
        let work = WorkDone { result: WorkResult::Success, duration_ms: 5 };
        let id = BatchId::new("B3").unwrap();
        summary.results.push(BatchResult::Recorded { id, outcome: Outcome::Success, timed_out: false, work });
        summary.held = Some("probe is paused by operator:ann since T: x (autocomp resume probe)".into());
        assert_eq!(
            summary.describe(),
            "1 batch: 1 success; 2 batches wait for pool tape; held: probe is paused by operator:ann since T: x \
             (autocomp resume probe)"
        );
        assert_eq!((summary.exit_code(), summary.pass_outcome()), (exit::OK, PassOutcome::Ok));
        let held_only = PassSummary { held: Some("the pipeline is paused".into()), ..PassSummary::default() };
        assert_eq!(held_only.describe(), "nothing claimed; held: the pipeline is paused");
        assert_eq!(held_only.pass_outcome(), PassOutcome::Idle);
        let long = PassSummary { held: Some("x".repeat(5_000)), ..PassSummary::default() };
        assert_eq!(long.describe().chars().count(), MAX_DESCRIBED_CHARS, "the registry refuses longer");
    }

    #[test]
    fn summary_lines_name_the_first_failure() {
        let mut report = Report::new(10);
        report.duration_ms = 1234;
        report.add_failure(autocomp_model::Failure {
            reference: "data/a.tif".into(),
            kind: "checksum".into(),
            description: "md5 mismatch".into(),
            details: serde_json::Value::Null,
        });
        let line = summary_line(&BatchId::new("B1").unwrap(), &EventType::new("Checked").unwrap(), &report);
        assert_eq!(line, "B1 Checked failure 1.2s: 1 failures, first: data/a.tif: md5 mismatch");
    }
}
