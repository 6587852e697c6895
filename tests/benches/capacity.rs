//! Capacity benchmark: many simulated workers against the distributed backends at once, to
//! measure what one pass and one batch cost on each backend and which backend runs out first.
//! It owns the workload (a C-stage chain of no-op components), the simulated workers (tokio
//! tasks that run the runner's pass through the public ports) and the per-backend accounting.
//!
//!     AUTOCOMP_BENCH_WORKERS=100,500 cargo bench -p autocomp-e2e --bench capacity
//!
//! Backends: a 3-node ZooKeeper ensemble (`autocomp_e2e::zk`, which lifts ZooKeeper's cap of
//! 60 connections per client address), one PostgreSQL server (fsync on, `track_functions=all`), and per
//! worker count a fresh database with two `sboi serve` processes following it.
//!
//! Workers: each has its own ZooKeeper session (`open_locks` with the ensemble's `zk://` URL),
//! uses sboi service `worker % 2` as its index, and shares one of `STORES` `PgStore` handles
//! (`pool_size=STORE_POOL`): one pool per worker would need N connections, over PostgreSQL's
//! `max_connections` at a few hundred workers. Each worker is a `--watch` loop
//! (framework/src/watch.rs) around the runner's pass (framework/src/runner.rs) with the default
//! `ComponentConfig`: head, steering, candidates (the trigger and the retry trigger, limit
//! 4 x queue), poll lock (waiting up to `poll_lock_timeout`), steering, try-lock each offered
//! candidate (a heartbeat pass asks the index itself) (`batch_lock_timeout`), one `get_batches` re-check, the attempts and
//! checkpoint reads, one `claim_many`, poll lock released; then per batch no-op work,
//! `still_held`, the fenced `append_event` (run, generation, idempotency key, as `record`
//! builds it) and the lock released; registry reports coalesced to one per second; idle
//! workers sleep in `wait_for_change` until the store moves or the heartbeat (60 s) is due.
//!
//! Workload: COMPONENTS stages in a chain (stage 0 takes batches of the run's type, stage k
//! requires stage k-1's event; each is blocked by its own). A chain, not independent steps:
//! it is a pipeline's shape (each result makes the batch ready for the next step, through the
//! follower's index update), every batch costs exactly COMPONENTS claims and results, and
//! consecutive stages never contend for the same batch row at the same moment, so the figures
//! are the per-pass costs, not row-lock contention. A feeder registers `AUTOCOMP_BENCH_RATE`
//! batches/s (default 20: 200 stage results/s) for warm-up + `AUTOCOMP_BENCH_SECS` (default
//! 60) measured seconds.
//!
//! Without `--bench` (`cargo test --all-targets`) it is a smoke run: 20 workers, 4 s.

use autocomp_test_servers::bench::{load_average, proc_stat};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use autocomp_e2e::percentile;
use autocomp_e2e::services::{Service, TOKEN};
use autocomp_e2e::zk::{self, ZooKeeper};
use autocomp_framework::config::ComponentConfig;
use autocomp_framework::locks::{Lock, LockHolder, LockPath, LockService, open_locks};
use autocomp_model::{
    Agent, Batch, BatchId, BatchType, ComponentDescriptor, ComponentName, EventType, IdempotencyKey, NewBatch,
    NewEvent, Outcome, PassOutcome, PassPhase, PassRecord, Report, RunHolder, Seq, Timestamp, Trigger, WorkDone,
    WorkResult,
};
use autocomp_sboi::BatchIndex;
use autocomp_sboi::http::HttpIndex;
use autocomp_store::{Claim, ObjectStore, PgStore};
use autocomp_test_servers::Postgres;
use autocomp_test_servers::postgres::Options as PgOptions;
use tokio::sync::watch;
use tokio::task::JoinSet;

/// Stages of the chain.
/// The runner's `OFFER_FRESH_FOR`: offered candidates older than this at the poll lock are
/// asked for again.
const OFFER_FRESH_FOR: Duration = Duration::from_millis(20);
const COMPONENTS: usize = 10;
/// `PgStore` handles the workers share, and the pool of each.
const STORES: usize = 8;
const STORE_POOL: usize = 4;
/// Sessions opened at once during the ramp-up.
const CONNECTS_IN_FLIGHT: usize = 32;
/// The runner's defaults (framework/src/config.rs, framework/src/runner.rs, watch.rs).
const MAX_CLAIMS_PER_ROUND: usize = 1_000;
const STORE_READS_IN_FLIGHT: usize = 8;
const QUICK_WORK_MS: u64 = 100;
const LONGEST_WAIT: Duration = Duration::from_secs(30);
const REPORT_EVERY: Duration = Duration::from_secs(1);
/// After an error a worker pauses this long before its next look (a real watcher would exit
/// and be restarted; the bench counts the error and goes on).
const ERROR_PAUSE: Duration = Duration::from_millis(200);
/// How long stopping may take: every worker's wait is cut short by the stop signal, so
/// this only bounds a hung request.
const STOP_LIMIT: Duration = Duration::from_secs(30);
const SESSION_TIMEOUT: &str = "10s";
/// How often connections and ZooKeeper's outstanding requests are sampled.
const SAMPLE_EVERY: Duration = Duration::from_secs(2);

// ---------------------------------------------------------------------------------------------
// Settings

struct Settings {
    smoke: bool,
    workers: Vec<usize>,
    secs: f64,
    warmup: f64,
    rate: f64,
    components: usize,
}

impl Settings {
    fn from_env() -> Self {
        let smoke = !std::env::args().skip(1).any(|arg| arg == "--bench");
        let number = |name: &str, default: f64| -> f64 {
            match std::env::var(name) {
                Ok(text) => text.trim().parse().ok().filter(|v: &f64| v.is_finite() && *v > 0.0).unwrap_or_else(|| {
                    eprintln!("{name}={text:?} is not a positive number; using {default}");
                    default
                }),
                Err(_) => default,
            }
        };
        let workers = match std::env::var("AUTOCOMP_BENCH_WORKERS") {
            Ok(text) => text.split(',').filter_map(|n| n.trim().parse().ok()).filter(|n| *n > 0).collect(),
            Err(_) => Vec::new(),
        };
        let workers = match (workers.is_empty(), smoke) {
            (false, _) => workers,
            (true, true) => vec![20],
            (true, false) => vec![500],
        };
        let secs = number("AUTOCOMP_BENCH_SECS", if smoke { 4.0 } else { 60.0 });
        Self {
            smoke,
            workers,
            secs,
            warmup: (secs / 6.0).clamp(2.0, 10.0),
            rate: number("AUTOCOMP_BENCH_RATE", if smoke { 5.0 } else { 20.0 }),
            components: number("AUTOCOMP_BENCH_COMPONENTS", COMPONENTS as f64) as usize,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Phases and samples

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Phase {
    Head,
    Steering,
    IndexQuery,
    PollLock,
    BatchLocks,
    Recheck,
    Attempts,
    Claim,
    StillHeld,
    Append,
    Release,
    Registry,
    Wait,
    Pass,
}

const PHASES: [Phase; 14] = [
    Phase::Head,
    Phase::Steering,
    Phase::IndexQuery,
    Phase::PollLock,
    Phase::BatchLocks,
    Phase::Recheck,
    Phase::Attempts,
    Phase::Claim,
    Phase::StillHeld,
    Phase::Append,
    Phase::Release,
    Phase::Registry,
    Phase::Wait,
    Phase::Pass,
];

impl Phase {
    fn describe(self) -> &'static str {
        match self {
            Phase::Head => "store head (watch loop)",
            Phase::Steering => "store steering read",
            Phase::IndexQuery => "index query (each)",
            Phase::PollLock => "poll lock try_lock (incl. wait)",
            Phase::BatchLocks => "batch locks, one round",
            Phase::Recheck => "re-check get_batches",
            Phase::Attempts => "attempts + checkpoint reads",
            Phase::Claim => "claim_many",
            Phase::StillHeld => "lock still_held before append",
            Phase::Append => "append_event (fenced)",
            Phase::Release => "lock release (each)",
            Phase::Registry => "registry record_pass",
            Phase::Wait => "wait_for_change (idle sleep)",
            Phase::Pass => "whole pass (poll lock to last release)",
        }
    }
}

/// One worker's samples, kept only while the run is measuring.
#[derive(Default)]
struct Samples {
    phases: BTreeMap<Phase, Vec<Duration>>,
    /// Index query latencies per sboi service.
    index: [Vec<Duration>; 2],
}

/// What every worker adds to, counted only while measuring.
#[derive(Default)]
struct Counters {
    passes: AtomicU64,
    poll_busy: AtomicU64,
    batches: AtomicU64,
    completed: AtomicU64,
    lock_taken: AtomicU64,
    lock_busy: AtomicU64,
    lock_released: AtomicU64,
    not_ready: AtomicU64,
    fenced: AtomicU64,
    errors: AtomicU64,
    registered: AtomicU64,
    wakes: AtomicU64,
}

/// Shared by the feeder, the workers and the sampler.
struct Shared {
    measuring: AtomicBool,
    counters: Counters,
    /// When each batch was registered, for the end-to-end latency of the last stage.
    registered_at: Mutex<HashMap<BatchId, Instant>>,
    end_to_end: Mutex<Vec<Duration>>,
    first_error: Mutex<Option<String>>,
}

impl Shared {
    fn count(&self, counter: &AtomicU64) {
        if self.measuring.load(Ordering::Relaxed) {
            counter.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn error(&self, what: &str, e: impl std::fmt::Display) {
        self.count(&self.counters.errors);
        let mut first = self.first_error.lock().unwrap();
        if first.is_none() {
            *first = Some(format!("{what}: {e}"));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The workload

/// One stage of the chain, as every worker of it sees it.
struct Stage {
    name: ComponentName,
    event_type: EventType,
    descriptor: ComponentDescriptor,
    retry: Option<Trigger>,
    last: bool,
}

fn stages(run: &str, count: usize) -> (BatchType, Vec<Arc<Stage>>) {
    let batch_type = BatchType::new(format!("Cap_{run}")).unwrap();
    let config = ComponentConfig::default();
    let stages = (0..count)
        .map(|k| {
            let name = ComponentName::new(format!("cap{run}-s{k}")).unwrap();
            let event_type = EventType::new(format!("Cap_{run}_S{k}")).unwrap();
            let trigger = if k == 0 {
                Trigger::builder().batch_types(&[batch_type.as_str()]).blocked_by(event_type.as_str()).build()
            } else {
                let before = format!("Cap_{run}_S{}", k - 1);
                Trigger::builder().requires(before.as_str()).blocked_by(event_type.as_str()).build()
            };
            let descriptor = config.descriptor(name.clone(), "1.0", event_type.clone(), trigger, false);
            let retry = descriptor.retry_trigger();
            Arc::new(Stage { name, event_type, descriptor, retry, last: k + 1 == count })
        })
        .collect();
    (batch_type, stages)
}

// ---------------------------------------------------------------------------------------------
// A simulated worker

/// What a worker's pass needs; shared with the tasks that record its batches.
struct Worker {
    number: usize,
    stage: Arc<Stage>,
    config: ComponentConfig,
    locks: Arc<dyn LockService>,
    store: Arc<dyn ObjectStore>,
    index: Arc<HttpIndex>,
    index_number: usize,
    agent: Agent,
    shared: Arc<Shared>,
    samples: Mutex<Samples>,
}

/// A batch this pass claimed, with its lock.
struct Claimed {
    batch: Batch,
    claim: Claim,
    lock: Box<dyn Lock>,
}

impl Worker {
    fn sample(&self, phase: Phase, took: Duration) {
        if self.shared.measuring.load(Ordering::Relaxed) {
            self.samples.lock().unwrap().phases.entry(phase).or_default().push(took);
        }
    }

    async fn timed<T>(&self, phase: Phase, work: impl Future<Output = T>) -> T {
        let started = Instant::now();
        let out = work.await;
        self.sample(phase, started.elapsed());
        out
    }

    fn holder(&self) -> LockHolder {
        // The pid is the worker's number: each simulated worker is a process of its own.
        LockHolder {
            agent: self.agent.to_string(),
            host: "bench".into(),
            pid: self.number as u32,
            since: Timestamp::now(),
        }
    }

    async fn query(&self, trigger: &Trigger) -> Result<Vec<BatchId>, String> {
        let started = Instant::now();
        let answer = self.index.query(trigger).await.map_err(|e| e.to_string());
        let took = started.elapsed();
        if self.shared.measuring.load(Ordering::Relaxed) {
            let mut samples = self.samples.lock().unwrap();
            samples.phases.entry(Phase::IndexQuery).or_default().push(took);
            samples.index[self.index_number].push(took);
        }
        answer
    }

    /// `Runner::candidates`: the trigger, then the retry trigger, each limited to 4 x the
    /// claim limit (at least 16).
    async fn candidates(&self, claim_limit: usize) -> Result<Vec<BatchId>, String> {
        let wanted = claim_limit.saturating_mul(4).max(16);
        let limited = |t: &Trigger| Trigger { limit: Some(t.limit.map_or(wanted, |l| l.min(wanted))), ..t.clone() };
        let mut ids = self.query(&limited(&self.stage.descriptor.trigger)).await?;
        if let Some(retry) = &self.stage.retry {
            for id in self.query(&limited(retry)).await? {
                if !ids.contains(&id) {
                    ids.push(id);
                }
            }
        }
        Ok(ids)
    }

    async fn release(&self, lock: Box<dyn Lock>) {
        let released = self.timed(Phase::Release, lock.release()).await;
        match released {
            Ok(()) => self.shared.count(&self.shared.counters.lock_released),
            Err(e) => self.shared.error("release", e),
        }
    }

    async fn release_all(&self, locks: Vec<Box<dyn Lock>>) {
        let mut releases = JoinSet::new();
        for lock in locks {
            let started = Instant::now();
            releases.spawn(async move { (lock.release().await, started.elapsed()) });
        }
        while let Some(joined) = releases.join_next().await {
            match joined {
                Ok((Ok(()), took)) => {
                    self.sample(Phase::Release, took);
                    self.shared.count(&self.shared.counters.lock_released);
                }
                Ok((Err(e), _)) => self.shared.error("release", e),
                Err(e) => self.shared.error("release task", e),
            }
        }
    }

    /// One pass: `Runner::locked_pass` with no-op work. Answers the batches recorded, or
    /// `None` when the poll lock was busy.
    async fn pass(
        self: &Arc<Self>,
        claim_limit: usize,
        offered: Option<Vec<BatchId>>,
    ) -> Result<Option<Vec<WorkDone>>, String> {
        let started = Instant::now();
        let holder = self.holder();
        let poll_path = LockPath::Poll(self.stage.name.clone());
        let poll = self
            .timed(Phase::PollLock, self.locks.try_lock(&poll_path, &holder, self.config.poll_lock_timeout))
            .await
            .map_err(|e| format!("poll lock: {e}"))?;
        let Some(poll) = poll else {
            self.shared.count(&self.shared.counters.poll_busy);
            return Ok(None);
        };
        // As the runner: candidates offered before a wait for the poll lock (another pass
        // held it, claiming from the same answer) are asked for again.
        let offered = offered.filter(|_| started.elapsed() <= OFFER_FRESH_FOR);
        let claimed = self.claim_batches(&holder, claim_limit, offered).await;
        self.release(poll).await;
        let claimed = claimed?;
        let mut records = JoinSet::new();
        for batch in claimed {
            let worker = Arc::clone(self);
            records.spawn(async move { worker.record(batch).await });
        }
        let mut work = Vec::new();
        while let Some(joined) = records.join_next().await {
            match joined {
                Ok(Some(done)) => work.push(done),
                Ok(None) => {}
                Err(e) => self.shared.error("record task", e),
            }
        }
        self.sample(Phase::Pass, started.elapsed());
        self.shared.count(&self.shared.counters.passes);
        Ok(Some(work))
    }

    /// `Runner::claim_batches` for `Selection::Ready`: steering, candidates, then rounds of
    /// try-locks, one re-check, the attempts reads and one `claim_many`.
    async fn claim_batches(
        &self,
        holder: &LockHolder,
        claim_limit: usize,
        offered: Option<Vec<BatchId>>,
    ) -> Result<Vec<Claimed>, String> {
        self.timed(Phase::Steering, self.store.steering()).await.map_err(|e| format!("steering: {e}"))?;
        // `Selection::Offered`: a watcher's pass takes what the index offered it (no second
        // query); a heartbeat pass (`Selection::Ready`) asks the index itself.
        let candidates = match offered {
            Some(ids) => ids,
            None => self.candidates(claim_limit).await?,
        };
        let mut candidates = candidates.into_iter();
        let mut claimed: Vec<Claimed> = Vec::new();
        let mut first_round = true;
        // At most one round per candidate: every round takes at least one.
        loop {
            let room = claim_limit.saturating_sub(claimed.len()).min(MAX_CLAIMS_PER_ROUND);
            if room == 0 {
                break;
            }
            if !std::mem::take(&mut first_round) {
                self.timed(Phase::Steering, self.store.steering()).await.map_err(|e| format!("steering: {e}"))?;
            }
            let round_started = Instant::now();
            let mut locked: Vec<(BatchId, Box<dyn Lock>)> = Vec::new();
            let mut tried = false;
            while locked.len() < room {
                let Some(id) = candidates.next() else { break };
                tried = true;
                let path = LockPath::Batch(self.stage.name.clone(), id.clone());
                match self.locks.try_lock(&path, holder, self.config.batch_lock_timeout).await {
                    Ok(Some(lock)) => {
                        self.shared.count(&self.shared.counters.lock_taken);
                        locked.push((id, lock));
                    }
                    Ok(None) => self.shared.count(&self.shared.counters.lock_busy),
                    Err(e) => {
                        self.release_all(locked.into_iter().map(|(_, lock)| lock).collect()).await;
                        self.release_claimed(claimed).await;
                        return Err(format!("batch lock: {e}"));
                    }
                }
            }
            if tried {
                self.sample(Phase::BatchLocks, round_started.elapsed());
            }
            if locked.is_empty() {
                break;
            }
            match self.claim_round(locked).await {
                Ok(round) => claimed.extend(round),
                Err(e) => {
                    self.release_claimed(claimed).await;
                    return Err(e);
                }
            }
        }
        Ok(claimed)
    }

    /// `Runner::claim_locked`: re-check, attempts and checkpoint, claim. Releases every lock
    /// it does not hand back with a claim.
    async fn claim_round(&self, locked: Vec<(BatchId, Box<dyn Lock>)>) -> Result<Vec<Claimed>, String> {
        let ids: Vec<BatchId> = locked.iter().map(|(id, _)| id.clone()).collect();
        let batches = match self.timed(Phase::Recheck, self.store.get_batches(&ids)).await {
            Ok(batches) => batches,
            Err(e) => {
                self.release_all(locked.into_iter().map(|(_, lock)| lock).collect()).await;
                return Err(format!("re-check: {e}"));
            }
        };
        let mut by_id: HashMap<BatchId, Batch> = batches.into_iter().map(|b| (b.id.clone(), b)).collect();
        let mut ready = Vec::new();
        let mut unwanted = Vec::new();
        for (id, lock) in locked {
            match by_id.remove(&id) {
                Some(batch) if self.stage.descriptor.readiness(&batch).is_ok() => ready.push((batch, lock)),
                _ => {
                    self.shared.count(&self.shared.counters.not_ready);
                    unwanted.push(lock);
                }
            }
        }
        self.release_all(unwanted).await;
        if ready.is_empty() {
            return Ok(Vec::new());
        }
        if let Err(e) = self.timed(Phase::Attempts, self.read_earlier_attempts(&ready)).await {
            self.release_all(ready.into_iter().map(|(_, lock)| lock).collect()).await;
            return Err(format!("attempts: {e}"));
        }
        let ids: Vec<BatchId> = ready.iter().map(|(batch, _)| batch.id.clone()).collect();
        let run_holder =
            RunHolder { agent: self.agent.clone(), host: "bench".into(), pid: self.number as u32, claim_key: None };
        let answers = match self.timed(Phase::Claim, self.store.claim_many(&ids, &self.stage.name, &run_holder)).await {
            Ok(answers) => answers,
            Err(e) => {
                self.release_all(ready.into_iter().map(|(_, lock)| lock).collect()).await;
                return Err(format!("claim_many: {e}"));
            }
        };
        let mut claimed = Vec::new();
        let mut refused = Vec::new();
        let mut answers = answers.into_iter();
        for (batch, lock) in ready {
            match answers.next() {
                Some(Ok(claim)) => claimed.push(Claimed { batch, claim, lock }),
                Some(Err(e)) => {
                    self.shared.error("claim", e);
                    refused.push(lock);
                }
                None => refused.push(lock),
            }
        }
        self.release_all(refused).await;
        Ok(claimed)
    }

    /// Each ready batch's failed attempts since its last reset and its checkpoint,
    /// `STORE_READS_IN_FLIGHT` batches at a time (`Runner::read_earlier_attempts`).
    async fn read_earlier_attempts(&self, ready: &[(Batch, Box<dyn Lock>)]) -> Result<(), String> {
        for chunk in ready.chunks(STORE_READS_IN_FLIGHT) {
            let mut reads = JoinSet::new();
            for (batch, _) in chunk {
                let (store, id, name) = (Arc::clone(&self.store), batch.id.clone(), self.stage.name.clone());
                let since = batch.last_reset_of(&self.stage.event_type);
                reads.spawn(async move {
                    let (attempts, checkpoint) =
                        tokio::join!(store.failed_attempts(&id, &name, since), store.load_checkpoint(&id, &name));
                    attempts.map(|_| ()).and(checkpoint.map(|_| ())).map_err(|e| e.to_string())
                });
            }
            while let Some(joined) = reads.join_next().await {
                joined.map_err(|e| e.to_string())??;
            }
        }
        Ok(())
    }

    /// Hands claims back after an error, as the runner does (`release` of each run).
    async fn release_claimed(&self, claimed: Vec<Claimed>) {
        for Claimed { batch, claim, lock } in claimed {
            self.store.release(&batch.id, &self.stage.name, claim.generation()).await.ok();
            self.release(lock).await;
        }
    }

    /// `Runner::record` for a no-op success: the lock checked, the fenced result appended,
    /// the lock released.
    async fn record(&self, claimed: Claimed) -> Option<WorkDone> {
        let Claimed { batch, claim, lock } = claimed;
        let held = self.timed(Phase::StillHeld, lock.still_held()).await;
        if !matches!(held, Ok(true)) {
            self.shared.error("still_held", format!("{held:?} for {}", batch.id));
            self.store.release(&batch.id, &self.stage.name, claim.generation()).await.ok();
            self.release(lock).await;
            return None;
        }
        let key = IdempotencyKey::new(format!("{}.{}.{}", self.stage.name, batch.id, claim.generation())).unwrap();
        let report = Report::new(self.config.max_reported_failures);
        let event = NewEvent::new(self.stage.event_type.clone(), Outcome::Success, self.agent.clone())
            .with_details(report.to_details())
            .in_run(self.stage.name.clone(), claim.generation())
            .with_idempotency_key(key);
        let appended = self.timed(Phase::Append, self.store.append_event(&batch.id, event)).await;
        self.release(lock).await;
        match appended {
            Ok(_) => {
                self.shared.count(&self.shared.counters.batches);
                if self.stage.last {
                    let registered = self.shared.registered_at.lock().unwrap().remove(&batch.id);
                    if let Some(at) = registered
                        && self.shared.measuring.load(Ordering::Relaxed)
                    {
                        self.shared.counters.completed.fetch_add(1, Ordering::Relaxed);
                        self.shared.end_to_end.lock().unwrap().push(at.elapsed());
                    }
                }
                Some(WorkDone { result: WorkResult::Success, duration_ms: 0 })
            }
            Err(e) if e.is_fenced() => {
                self.shared.count(&self.shared.counters.fenced);
                None
            }
            Err(e) => {
                self.shared.error("append", e);
                None
            }
        }
    }

    /// The registry's pass record, as a watcher coalesces them.
    async fn report(&self, phase: PassPhase) {
        let record = PassRecord { descriptor: self.stage.descriptor.clone(), host: "bench".into(), phase };
        if let Err(e) = self.timed(Phase::Registry, self.store.record_pass(record)).await {
            self.shared.error("record_pass", e);
        }
    }

    /// `watch_loop`: look (head, steering, candidates), pass when offered or at the heartbeat,
    /// again at once after a pass that worked, else sleep in the change feed.
    async fn watch(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        let mut last_pass: Option<Instant> = None;
        let mut claim_limit = self.config.queue_size;
        let mut pending: Vec<WorkDone> = Vec::new();
        let mut pending_passes = 0usize;
        let mut last_report: Option<Instant> = None;
        let mut started_reported = false;
        while !*stop.borrow() {
            let looked = self.look(last_pass, claim_limit).await;
            let (seen, heartbeat_due, offered) = match looked {
                Ok(looked) => looked,
                Err(e) => {
                    self.shared.error("look", e);
                    pause(&mut stop, ERROR_PAUSE).await;
                    continue;
                }
            };
            let mut go_again = false;
            if heartbeat_due || !offered.is_empty() {
                last_pass = Some(Instant::now());
                let selection = if heartbeat_due { None } else { Some(offered) };
                match self.pass(claim_limit, selection).await {
                    Ok(Some(work)) => {
                        if !work.is_empty() && !started_reported {
                            // A watcher's first claiming pass says `Started` before its work.
                            self.report(PassPhase::Started).await;
                            started_reported = true;
                        }
                        // `Runner::adapt_queue`: a full queue of quick work doubles the claims.
                        let quick = !work.is_empty()
                            && work.iter().map(|d| d.duration_ms).sum::<u64>() <= QUICK_WORK_MS * work.len() as u64;
                        let ceiling = self.config.queue_grows_to.max(self.config.queue_size);
                        claim_limit = if work.len() >= claim_limit && quick {
                            (claim_limit * 2).min(ceiling)
                        } else {
                            self.config.queue_size
                        };
                        go_again = !work.is_empty();
                        pending_passes += 1;
                        pending.extend(work);
                    }
                    Ok(None) => {}
                    Err(e) => {
                        self.shared.error("pass", e);
                        pause(&mut stop, ERROR_PAUSE).await;
                        continue;
                    }
                }
            }
            // Coalesced registry ends: with results, at most once a second while busy, and
            // before sleeping; every pass at the heartbeat.
            let due = last_report.is_none_or(|at| at.elapsed() >= REPORT_EVERY);
            if pending_passes > 0 && (heartbeat_due || (!pending.is_empty() && (due || !go_again))) {
                let work = std::mem::take(&mut pending);
                let outcome = if work.is_empty() { PassOutcome::Idle } else { PassOutcome::Ok };
                let summary = format!("{pending_passes} passes, {} batches", work.len());
                pending_passes = 0;
                last_report = Some(Instant::now());
                self.report(PassPhase::Ended { outcome, summary, duration_ms: 0, work }).await;
            }
            if go_again {
                continue;
            }
            let until_heartbeat =
                self.config.watch_heartbeat.saturating_sub(last_pass.map_or(Duration::ZERO, |at| at.elapsed()));
            let wait = until_heartbeat.min(LONGEST_WAIT);
            let started = Instant::now();
            tokio::select! {
                head = self.store.wait_for_change(seen, wait) => {
                    self.sample(Phase::Wait, started.elapsed());
                    match head {
                        Ok(head) if head > seen => self.shared.count(&self.shared.counters.wakes),
                        Ok(_) => {}
                        Err(e) => {
                            self.shared.error("wait_for_change", e);
                            pause(&mut stop, ERROR_PAUSE).await;
                        }
                    }
                }
                _ = stop.changed() => {}
            }
        }
    }

    /// The watch loop's look before a pass: the head (what the sleep starts from), the
    /// steering (is it held?) and the candidates, unless the heartbeat pass is due anyway.
    async fn look(&self, last_pass: Option<Instant>, claim_limit: usize) -> Result<(Seq, bool, Vec<BatchId>), String> {
        let seen = self.timed(Phase::Head, self.store.head()).await.map_err(|e| format!("head: {e}"))?;
        let heartbeat_due = last_pass.is_none_or(|at| at.elapsed() >= self.config.watch_heartbeat);
        if heartbeat_due {
            return Ok((seen, true, Vec::new()));
        }
        self.timed(Phase::Steering, self.store.steering()).await.map_err(|e| format!("steering: {e}"))?;
        let offered = self.candidates(claim_limit).await?;
        Ok((seen, false, offered))
    }
}

/// Sleeps `pause`, or less if the run stops.
async fn pause(stop: &mut watch::Receiver<bool>, pause: Duration) {
    tokio::select! {
        _ = tokio::time::sleep(pause) => {}
        _ = stop.changed() => {}
    }
}

// ---------------------------------------------------------------------------------------------
// The feeder

async fn feed(
    store: Arc<dyn ObjectStore>,
    batch_type: BatchType,
    rate: f64,
    shared: Arc<Shared>,
    prefix: String,
    mut stop: watch::Receiver<bool>,
) -> (usize, Vec<Duration>) {
    let mut ticks = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
    // Behind schedule (a slow commit), catch up: the rate over the run is the rate asked for.
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut latencies = Vec::new();
    let mut n = 0usize;
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            _ = stop.changed() => return (n, latencies),
        }
        if *stop.borrow() {
            return (n, latencies);
        }
        let id = BatchId::new(format!("{prefix}-{n:07}")).unwrap();
        shared.registered_at.lock().unwrap().insert(id.clone(), Instant::now());
        let started = Instant::now();
        match store.create_batch(NewBatch::new(id, batch_type.clone())).await {
            Ok(_) => {
                if shared.measuring.load(Ordering::Relaxed) {
                    latencies.push(started.elapsed());
                }
                shared.count(&shared.counters.registered);
            }
            Err(e) => shared.error("create_batch", e),
        }
        n += 1;
    }
}

// ---------------------------------------------------------------------------------------------
// Backend accounting: /proc, psql, ZooKeeper's four-letter words

fn pids() -> impl Iterator<Item = String> {
    std::fs::read_dir("/proc").into_iter().flatten().flatten().filter_map(|entry| {
        let name = entry.file_name().to_str()?.to_owned();
        name.bytes().all(|b| b.is_ascii_digit()).then_some(name)
    })
}

fn cmdline(pid: &str) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|bytes| bytes.split(|b| *b == 0).map(|a| String::from_utf8_lossy(a).into_owned()).collect())
        .unwrap_or_default()
}

/// The pid of the process whose command line has an argument equal to `arg` and one
/// containing `also` (the services are our children, but `Service` keeps its `Child` private).
fn pid_with_args(arg: &str, also: &str) -> Option<String> {
    pids().find(|pid| {
        let args = cmdline(pid);
        args.iter().any(|a| a == arg) && args.iter().any(|a| a.contains(also))
    })
}

/// CPU seconds of a process and of its live children (PostgreSQL's backends).
fn tree_cpu(pid: &str) -> f64 {
    let own = pid.parse::<u32>().ok();
    let mut total = proc_stat(pid).map_or(0.0, |(_, cpu, reaped)| cpu + reaped);
    for child in pids() {
        if let Some((parent, cpu, _)) = proc_stat(&child)
            && Some(parent) == own
        {
            total += cpu;
        }
    }
    total
}

fn own_cpu() -> f64 {
    proc_stat("self").map_or(0.0, |(_, cpu, _)| cpu)
}

/// A ZooKeeper node's java process and its `zoo.cfg`, found by its client port.
fn zk_node(port: u16) -> Option<(String, String)> {
    pids().find_map(|pid| {
        let args = cmdline(&pid);
        if !args.iter().any(|a| a.contains("QuorumPeerMain")) {
            return None;
        }
        let config = args.iter().find(|a| a.ends_with("zoo.cfg"))?.clone();
        let text = std::fs::read_to_string(&config).ok()?;
        text.lines().any(|line| line == format!("clientPort={port}")).then_some((pid, config))
    })
}

/// `mntr` of one node as name -> value.
fn mntr(port: u16) -> BTreeMap<String, String> {
    zk::four_letter(port, "mntr")
        .unwrap_or_default()
        .lines()
        .filter_map(|line| line.split_once('\t'))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect()
}

fn mntr_number(m: &BTreeMap<String, String>, key: &str) -> f64 {
    m.get(key).and_then(|v| v.parse().ok()).unwrap_or(0.0)
}

/// The ensemble's last zxid (the leader's): every write moves it by one.
fn zxid(zookeeper: &ZooKeeper) -> i64 {
    (0..3).map(|n| zookeeper.zxid(n)).max().unwrap_or(0)
}

/// `pg_stat_database` for the run's database: commits + rollbacks, and tuples written.
fn pg_database_stats(pg: &Postgres, database: &str) -> [f64; 4] {
    let out = pg.psql(
        "postgres",
        &format!(
            "SELECT xact_commit, xact_rollback, tup_inserted + tup_updated + tup_deleted, tup_fetched \
             FROM pg_stat_database WHERE datname = '{database}'"
        ),
    );
    let mut numbers = out.trim().split('|').map(|n| n.trim().parse::<f64>().unwrap_or(0.0));
    [(); 4].map(|_| numbers.next().unwrap_or(0.0))
}

/// Calls of each of the store's server-side functions (`track_functions=all`).
fn pg_function_calls(pg: &Postgres, database: &str) -> BTreeMap<String, f64> {
    pg.psql(database, "SELECT funcname, calls FROM pg_stat_user_functions")
        .lines()
        .filter_map(|line| line.split_once('|'))
        .map(|(name, calls)| (name.trim().to_owned(), calls.trim().parse().unwrap_or(0.0)))
        .collect()
}

/// Connections to the run's database: (all, active).
fn pg_connections(pg: &Postgres, database: &str) -> (f64, f64) {
    let out = pg.psql(
        "postgres",
        &format!(
            "SELECT count(*), count(*) FILTER (WHERE state = 'active') FROM pg_stat_activity \
             WHERE datname = '{database}'"
        ),
    );
    let mut numbers = out.trim().split('|').map(|n| n.trim().parse::<f64>().unwrap_or(0.0));
    (numbers.next().unwrap_or(0.0), numbers.next().unwrap_or(0.0))
}

/// What the sampler saw while measuring.
#[derive(Default, Clone)]
struct Sampled {
    samples: usize,
    pg_connections_max: f64,
    pg_active_sum: f64,
    pg_active_max: f64,
    zk_outstanding_max: f64,
    zk_connections_max: f64,
}

// ---------------------------------------------------------------------------------------------
// Output

fn short(d: Duration) -> String {
    let us = d.as_secs_f64() * 1e6;
    if us >= 1_000_000.0 {
        format!("{:.2} s", us / 1e6)
    } else if us >= 1_000.0 {
        format!("{:.2} ms", us / 1000.0)
    } else {
        format!("{us:.0} µs")
    }
}

fn p50_p99(samples: &mut [Duration]) -> String {
    samples.sort();
    format!("{} / {}", short(percentile(samples, 0.5)), short(percentile(samples, 0.99)))
}

fn table(header: &[&str], rows: &[Vec<String>]) {
    println!("| {} |", header.join(" | "));
    println!("|{}|", header.iter().map(|_| "---").collect::<Vec<_>>().join("|"));
    for row in rows {
        println!("| {} |", row.join(" | "));
    }
    println!();
}

/// The headline figures of one worker count, for the slope table at the end.
struct Summary {
    workers: usize,
    ramp_secs: f64,
    passes_per_sec: f64,
    batches_per_sec: f64,
    zk_writes_per_sec: f64,
    zk_writes_per_batch: f64,
    pg_xact_per_sec: f64,
    pg_xact_per_batch: f64,
    queries_per_sec: f64,
    queries_per_batch: f64,
    idle_wakes_per_sec: f64,
    bench_cores: f64,
    e2e: String,
}

// ---------------------------------------------------------------------------------------------
// One run at N workers

struct Backends<'a> {
    zookeeper: &'a ZooKeeper,
    pg: &'a Postgres,
    logs: &'a Path,
}

fn run_at(runtime: &tokio::runtime::Runtime, backends: &Backends, settings: &Settings, workers: usize) -> Summary {
    let run = format!("n{workers}");
    let database = format!("capacity_{run}");
    let db_url = backends.pg.create_database(&database);
    // The schema first (`PgStore::open` migrates), so both followers start on a ready store.
    runtime.block_on(async { PgStore::open(&format!("{db_url}?pool_size=1")).await.expect("the store opens") });
    let index_dirs = tempfile::tempdir().expect("a temp dir");
    let mut services: Vec<Service> = (0..2)
        .map(|i| {
            Service::index_unstarted(
                &db_url,
                &index_dirs.path().join(format!("index{i}")),
                backends.logs,
                &format!("sboi-{run}-{i}"),
            )
        })
        .collect();
    progress("starting two sboi services (builds the workspace binaries the first time)");
    for service in &mut services {
        service.restart();
    }
    let sboi_pids: Vec<String> = services
        .iter()
        .map(|s| pid_with_args(&format!("127.0.0.1:{}", s.port), "sboi").expect("the sboi process"))
        .collect();
    let zk_pids: Vec<String> =
        (0..3).filter_map(|n| zk_node(backends.zookeeper.client_port(n)).map(|(pid, _)| pid)).collect();
    let postmaster = backends.pg.pid().to_string();
    let locks_url = backends.zookeeper.url(&format!("capacity-{run}"), SESSION_TIMEOUT);
    let (batch_type, stages) = stages(&run, settings.components);
    println!("## {workers} workers\n");
    println!(
        "{} stages, {} workers each (worker i runs stage i mod {}), {STORES} `PgStore`s of pool_size={STORE_POOL}, \
         sboi services on ports {} and {}, locks at `{locks_url}`, feeder {} batches/s, warm-up {:.0} s, \
         measured {:.0} s. Load average before: {}.\n",
        settings.components,
        workers.div_ceil(settings.components),
        settings.components,
        services[0].port,
        services[1].port,
        settings.rate,
        settings.warmup,
        settings.secs,
        load_average()
    );
    let shared = Arc::new(Shared {
        measuring: AtomicBool::new(false),
        counters: Counters::default(),
        registered_at: Mutex::new(HashMap::new()),
        end_to_end: Mutex::new(Vec::new()),
        first_error: Mutex::new(None),
    });
    let summary = runtime.block_on(async {
        let stores: Vec<Arc<dyn ObjectStore>> = {
            let mut stores: Vec<Arc<dyn ObjectStore>> = Vec::new();
            for _ in 0..STORES {
                let store = PgStore::open(&format!("{db_url}?pool_size={STORE_POOL}")).await.expect("a PgStore");
                stores.push(Arc::new(store));
            }
            stores
        };
        let feeder_store: Arc<dyn ObjectStore> =
            Arc::new(PgStore::open(&format!("{db_url}?pool_size=2")).await.expect("the feeder's PgStore"));
        let indexes: Vec<Arc<HttpIndex>> = services
            .iter()
            .map(|s| Arc::new(HttpIndex::with_token(&s.url(), Some(TOKEN.into())).expect("an index client")))
            .collect();

        progress("ramp-up: opening the ZooKeeper sessions");
        // Ramp-up: one ZooKeeper session per worker, CONNECTS_IN_FLIGHT at a time.
        let ramp_started = Instant::now();
        let mut connects = JoinSet::new();
        let mut sessions: Vec<Option<Arc<dyn LockService>>> = vec![None; workers];
        let mut connect_times = Vec::new();
        let mut connect_errors = 0usize;
        let mut next = 0usize;
        while next < workers || !connects.is_empty() {
            while next < workers && connects.len() < CONNECTS_IN_FLIGHT {
                let url = locks_url.clone();
                let number = next;
                connects.spawn(async move {
                    let started = Instant::now();
                    (number, open_locks(&url).await, started.elapsed())
                });
                next += 1;
            }
            let Some(joined) = connects.join_next().await else { break };
            let (number, opened, took) = joined.expect("a connect task");
            match opened {
                Ok(locks) => {
                    sessions[number] = Some(locks);
                    connect_times.push(took);
                }
                Err(e) => {
                    connect_errors += 1;
                    shared.error("open_locks", e);
                }
            }
        }
        let ramp = ramp_started.elapsed();
        let established = sessions.iter().filter(|s| s.is_some()).count();

        let (stop_sender, stop) = watch::channel(false);
        // The runner's defaults: timeouts, queue sizes, heartbeat and descriptor.
        let config = ComponentConfig::default();
        let mut tasks = JoinSet::new();
        let mut all_workers = Vec::new();
        for (number, locks) in sessions.iter().enumerate() {
            let Some(locks) = locks else { continue };
            let stage = Arc::clone(&stages[number % stages.len()]);
            let agent = Agent::new(format!("{}/1.0@bench#{number}", stage.name)).unwrap();
            let worker = Arc::new(Worker {
                number,
                stage,
                config: config.clone(),
                locks: Arc::clone(locks),
                store: Arc::clone(&stores[number % STORES]),
                index: Arc::clone(&indexes[number % 2]),
                index_number: number % 2,
                agent,
                shared: Arc::clone(&shared),
                samples: Mutex::new(Samples::default()),
            });
            all_workers.push(Arc::clone(&worker));
            tasks.spawn(worker.watch(stop.clone()));
        }
        let feeder = tokio::spawn(feed(
            Arc::clone(&feeder_store),
            batch_type.clone(),
            settings.rate,
            Arc::clone(&shared),
            format!("C{workers}"),
            stop.clone(),
        ));
        progress("workers and feeder started; warming up");
        tokio::time::sleep(Duration::from_secs_f64(settings.warmup)).await;
        progress("measuring");

        // Measured window: counters and backend figures from here to the end.
        let zk_ports: Vec<u16> = (0..3).map(|n| backends.zookeeper.client_port(n)).collect();
        for port in &zk_ports {
            zk::four_letter(*port, "srst");
        }
        let (pg, db) = (backends.pg, database.clone());
        let before = tokio::task::block_in_place(|| {
            (
                zxid(backends.zookeeper),
                pg_database_stats(pg, &db),
                pg_function_calls(pg, &db),
                tree_cpu(&postmaster),
                sboi_pids.iter().map(|p| tree_cpu(p)).collect::<Vec<_>>(),
                zk_pids.iter().map(|p| tree_cpu(p)).sum::<f64>(),
                own_cpu(),
            )
        });
        shared.measuring.store(true, Ordering::Relaxed);
        let measured_started = Instant::now();
        let measured_for = Duration::from_secs_f64(settings.secs);
        let mut sampled = Sampled::default();
        while measured_started.elapsed() < measured_for {
            let left = measured_for.saturating_sub(measured_started.elapsed());
            tokio::time::sleep(left.min(SAMPLE_EVERY)).await;
            let (all, active) = tokio::task::block_in_place(|| pg_connections(pg, &db));
            let zk: Vec<BTreeMap<String, String>> = zk_ports.iter().map(|p| mntr(*p)).collect();
            sampled.samples += 1;
            sampled.pg_connections_max = sampled.pg_connections_max.max(all);
            sampled.pg_active_max = sampled.pg_active_max.max(active);
            sampled.pg_active_sum += active;
            let outstanding = zk.iter().map(|m| mntr_number(m, "zk_outstanding_requests")).fold(0.0, f64::max);
            let connections: f64 = zk.iter().map(|m| mntr_number(m, "zk_num_alive_connections")).sum();
            sampled.zk_outstanding_max = sampled.zk_outstanding_max.max(outstanding);
            sampled.zk_connections_max = sampled.zk_connections_max.max(connections);
        }
        shared.measuring.store(false, Ordering::Relaxed);
        let elapsed = measured_started.elapsed().as_secs_f64();
        let zk_mntr: Vec<BTreeMap<String, String>> = zk_ports.iter().map(|p| mntr(*p)).collect();
        let after = tokio::task::block_in_place(|| {
            (
                zxid(backends.zookeeper),
                pg_database_stats(pg, &db),
                pg_function_calls(pg, &db),
                tree_cpu(&postmaster),
                sboi_pids.iter().map(|p| tree_cpu(p)).collect::<Vec<_>>(),
                zk_pids.iter().map(|p| tree_cpu(p)).sum::<f64>(),
                own_cpu(),
            )
        });

        progress("stopping");
        // Stop: the feeder and every worker's wait end on the signal; a hung task is aborted.
        stop_sender.send_replace(true);
        let (fed, mut register_latencies) = feeder.await.expect("the feeder");
        let deadline = Instant::now() + STOP_LIMIT;
        while !tasks.is_empty() {
            match tokio::time::timeout(deadline.saturating_duration_since(Instant::now()), tasks.join_next()).await {
                Ok(_) => {}
                Err(_) => {
                    eprintln!("{} workers did not stop within {STOP_LIMIT:?}; aborting them", tasks.len());
                    tasks.abort_all();
                    while tasks.join_next().await.is_some() {}
                }
            }
        }
        let closing = sessions.iter().flatten().map(|locks| {
            let locks = Arc::clone(locks);
            async move { tokio::time::timeout(Duration::from_secs(5), locks.close()).await.ok() }
        });
        let mut closes = JoinSet::new();
        for close in closing {
            closes.spawn(close);
        }
        while closes.join_next().await.is_some() {}
        let backlog = shared.registered_at.lock().unwrap().len();

        // ---- Report
        let c = &shared.counters;
        let get = |counter: &AtomicU64| counter.load(Ordering::Relaxed) as f64;
        let per_sec = |v: f64| v / elapsed;
        let passes = get(&c.passes);
        let batches = get(&c.batches);
        let mut merged = Samples::default();
        for worker in &all_workers {
            let mut samples = worker.samples.lock().unwrap();
            for (phase, list) in std::mem::take(&mut samples.phases) {
                merged.phases.entry(phase).or_default().extend(list);
            }
            for i in 0..2 {
                merged.index[i].append(&mut samples.index[i]);
            }
        }
        println!("### Sessions and throughput\n");
        connect_times.sort();
        let mut e2e = std::mem::take(&mut *shared.end_to_end.lock().unwrap());
        let e2e_text = p50_p99(&mut e2e);
        table(
            &["figure", "value"],
            &[
                vec!["ZooKeeper sessions established".into(), format!("{established} of {workers} ({connect_errors} failed)")],
                vec![
                    "ramp-up (all sessions, 32 connecting at a time)".into(),
                    format!(
                        "{:.2} s ({:.0} sessions/s; connect p50 / p99 {})",
                        ramp.as_secs_f64(),
                        established as f64 / ramp.as_secs_f64().max(1e-9),
                        p50_p99(&mut connect_times)
                    ),
                ],
                vec!["measured window".into(), format!("{elapsed:.1} s")],
                vec![
                    "batches registered (feeder)".into(),
                    format!("{:.0} ({:.1}/s; create_batch p50 / p99 {})", get(&c.registered), per_sec(get(&c.registered)), p50_p99(&mut register_latencies)),
                ],
                vec!["passes that got the poll lock".into(), format!("{passes:.0} ({:.1}/s)", per_sec(passes))],
                vec!["passes that found the poll lock busy (after waiting)".into(), format!("{:.0} ({:.1}/s)", get(&c.poll_busy), per_sec(get(&c.poll_busy)))],
                vec!["stage results appended (batches/s worked)".into(), format!("{batches:.0} ({:.1}/s; {:.2} per pass)", per_sec(batches), batches / passes.max(1.0))],
                vec!["batches through all stages".into(), format!("{:.0} ({:.1}/s)", get(&c.completed), per_sec(get(&c.completed)))],
                vec!["end-to-end latency, registration to last stage, p50 / p99".into(), e2e_text.clone()],
                vec!["backlog at the end (registered, last stage not done)".into(), format!("{backlog} of {fed} registered in the whole run")],
                vec![
                    "batch locks taken / busy / released".into(),
                    format!("{:.0} / {:.0} / {:.0}", get(&c.lock_taken), get(&c.lock_busy), get(&c.lock_released)),
                ],
                vec!["locked but not ready at the re-check".into(), format!("{:.0}", get(&c.not_ready))],
                vec!["fenced results / errors".into(), format!("{:.0} / {:.0}", get(&c.fenced), get(&c.errors))],
                vec!["idle wakes (wait_for_change saw the head move)".into(), format!("{:.0} ({:.1}/s)", get(&c.wakes), per_sec(get(&c.wakes)))],
            ],
        );
        if let Some(first) = shared.first_error.lock().unwrap().as_ref() {
            println!("first error: {first}\n");
        }
        println!("### Pass phases (every call in the window; per pass = calls / passes that got the poll lock)\n");
        let mut rows = Vec::new();
        for phase in PHASES {
            let Some(list) = merged.phases.get_mut(&phase) else { continue };
            let calls = list.len() as f64;
            rows.push(vec![
                phase.describe().into(),
                format!("{calls:.0}"),
                format!("{:.1}", per_sec(calls)),
                format!("{:.2}", calls / passes.max(1.0)),
                p50_p99(list),
            ]);
        }
        table(&["phase", "calls", "calls/s", "per pass", "p50 / p99"], &rows);

        println!("### ZooKeeper (3-node ensemble)\n");
        let zk_writes = (after.0 - before.0) as f64;
        let zk_cpu = after.5 - before.5;
        let mut zk_rows = vec![
            vec!["writes (zxid delta: creates, deletes, sessions)".into(), format!("{zk_writes:.0} ({:.0}/s; {:.2} per pass, {:.2} per batch)", per_sec(zk_writes), zk_writes / passes.max(1.0), zk_writes / batches.max(1.0))],
            vec!["sessions (alive connections, max sampled)".into(), format!("{:.0}", sampled.zk_connections_max)],
            vec!["outstanding requests (max sampled, any node)".into(), format!("{:.0}", sampled.zk_outstanding_max)],
            vec!["ZooKeeper CPU (3 JVMs)".into(), format!("{zk_cpu:.1} s ({:.2} cores)", zk_cpu / elapsed)],
        ];
        for (n, m) in zk_mntr.iter().enumerate() {
            zk_rows.push(vec![
                format!("node {n} mntr ({})", m.get("zk_server_state").map_or("?", |s| s.as_str())),
                format!(
                    "znodes {}, ephemerals {}, watches {}, connections {}, latency avg/max {} / {} ms since srst, packets in {}",
                    m.get("zk_znode_count").map_or("?", |s| s.as_str()),
                    m.get("zk_ephemerals_count").map_or("?", |s| s.as_str()),
                    m.get("zk_watch_count").map_or("?", |s| s.as_str()),
                    m.get("zk_num_alive_connections").map_or("?", |s| s.as_str()),
                    m.get("zk_avg_latency").map_or("?", |s| s.as_str()),
                    m.get("zk_max_latency").map_or("?", |s| s.as_str()),
                    m.get("zk_packets_received").map_or("?", |s| s.as_str()),
                ),
            ]);
        }
        table(&["figure", "value"], &zk_rows);

        println!("### PostgreSQL (database {database})\n");
        let xacts = (after.1[0] - before.1[0]) + (after.1[1] - before.1[1]);
        let tuples = after.1[2] - before.1[2];
        let pg_cpu = after.3 - before.3;
        let mut pg_rows = vec![
            vec!["transactions (xact_commit + xact_rollback delta)".into(), format!("{xacts:.0} ({:.0}/s; {:.2} per pass, {:.2} per batch)", per_sec(xacts), xacts / passes.max(1.0), xacts / batches.max(1.0))],
            vec!["tuples written (ins + upd + del)".into(), format!("{tuples:.0} ({:.1} per batch)", tuples / batches.max(1.0))],
            vec![
                "connections to the database (max sampled; active avg / max)".into(),
                format!(
                    "{:.0} ({STORES} x {STORE_POOL} pooled + {STORES} listeners + feeder + 2 sboi); active {:.1} / {:.0}",
                    sampled.pg_connections_max,
                    sampled.pg_active_sum / sampled.samples.max(1) as f64,
                    sampled.pg_active_max
                ),
            ],
            vec!["server CPU (postmaster and backends)".into(), format!("{pg_cpu:.1} s ({:.2} cores; {:.0} µs per batch)", pg_cpu / elapsed, pg_cpu / batches.max(1.0) * 1e6)],
        ];
        for (name, calls) in &after.2 {
            let calls = calls - before.2.get(name).copied().unwrap_or(0.0);
            if calls > 0.0 {
                pg_rows.push(vec![format!("function {name}"), format!("{calls:.0} calls ({:.1}/s; {:.2} per batch)", per_sec(calls), calls / batches.max(1.0))]);
            }
        }
        table(&["figure", "value"], &pg_rows);

        println!("### sboi (two services)\n");
        let mut sboi_rows = Vec::new();
        for (i, service) in services.iter().enumerate() {
            let cpu = after.4[i] - before.4[i];
            let queries = merged.index[i].len() as f64;
            sboi_rows.push(vec![
                format!("service {i} (port {})", service.port),
                format!("{queries:.0} ({:.0}/s)", per_sec(queries)),
                p50_p99(&mut merged.index[i]),
                format!("{cpu:.1} s ({:.2} cores; {:.0} µs per query)", cpu / elapsed, cpu / queries.max(1.0) * 1e6),
            ]);
        }
        table(&["service", "queries", "p50 / p99", "CPU"], &sboi_rows);
        let bench_cpu = after.6 - before.6;
        println!(
            "bench process CPU (workers, clients, feeder): {bench_cpu:.1} s ({:.2} cores). Load average after: {}.\n",
            bench_cpu / elapsed,
            load_average()
        );
        let queries = merged.phases.get(&Phase::IndexQuery).map_or(0, Vec::len) as f64;
        Summary {
            workers,
            ramp_secs: ramp.as_secs_f64(),
            passes_per_sec: per_sec(passes),
            batches_per_sec: per_sec(batches),
            zk_writes_per_sec: per_sec(zk_writes),
            zk_writes_per_batch: zk_writes / batches.max(1.0),
            pg_xact_per_sec: per_sec(xacts),
            pg_xact_per_batch: xacts / batches.max(1.0),
            queries_per_sec: per_sec(queries),
            queries_per_batch: queries / batches.max(1.0),
            idle_wakes_per_sec: per_sec(get(&c.wakes)),
            bench_cores: bench_cpu / elapsed,
            e2e: e2e_text,
        }
    });
    drop(services);
    summary
}

/// A progress line on stderr, with the seconds since the bench started.
fn progress(what: &str) {
    static STARTED: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    let started = STARTED.get_or_init(Instant::now);
    eprintln!("[{:7.1} s] {what}", started.elapsed().as_secs_f64());
}

fn main() {
    progress("starting");
    let settings = Settings::from_env();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("a runtime");
    println!("# Capacity benchmark ({})\n", if settings.smoke { "smoke run" } else { "full" });
    println!(
        "machine: {} cores shared by ZooKeeper (3 JVMs), PostgreSQL, 2 sboi services per run and this \
         process; {}; load average at the start: {}\n",
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        Timestamp::now(),
        load_average()
    );
    println!(
        "workers {:?}, {} stages, feeder {} batches/s, warm-up {:.0} s, measured {:.0} s per worker count\n",
        settings.workers, settings.components, settings.rate, settings.warmup, settings.secs
    );
    let logs = tempfile::tempdir().expect("a temp dir for logs");
    // Production's container check interval (60 s), not the tests' 500 ms: an emptied
    // `batch/<component>` parent is not deleted and re-created between passes.
    progress("starting the ZooKeeper ensemble");
    // The harness lifts ZooKeeper's cap of 60 connections per client address.
    let zookeeper = ZooKeeper::start(zk::Options { nodes: 3, ..zk::Options::default() });
    progress("starting PostgreSQL");
    let pg = Postgres::start_with(PgOptions::default().setting("track_functions", "all"));
    let backends = Backends { zookeeper: &zookeeper, pg: &pg, logs: logs.path() };
    let summaries: Vec<Summary> = settings.workers.iter().map(|&n| run_at(&runtime, &backends, &settings, n)).collect();

    println!("## Slope\n");
    let rows: Vec<Vec<String>> = summaries
        .iter()
        .map(|s| {
            vec![
                s.workers.to_string(),
                format!("{:.1}", s.ramp_secs),
                format!("{:.1}", s.passes_per_sec),
                format!("{:.1}", s.batches_per_sec),
                format!("{:.0} ({:.2}/batch)", s.zk_writes_per_sec, s.zk_writes_per_batch),
                format!("{:.0} ({:.2}/batch)", s.pg_xact_per_sec, s.pg_xact_per_batch),
                format!("{:.0} ({:.2}/batch)", s.queries_per_sec, s.queries_per_batch),
                format!("{:.1}", s.idle_wakes_per_sec),
                format!("{:.2}", s.bench_cores),
                s.e2e.clone(),
            ]
        })
        .collect();
    table(
        &[
            "workers",
            "ramp-up s",
            "passes/s",
            "batches/s",
            "ZK writes/s",
            "PG xact/s",
            "index queries/s",
            "idle wakes/s",
            "bench cores",
            "end-to-end p50 / p99",
        ],
        &rows,
    );
    if settings.smoke {
        let first = &summaries[0];
        assert!(first.batches_per_sec > 0.0, "the smoke run worked no batch");
    }
    // Dropped in order: the services went with each run; PostgreSQL and ZooKeeper here.
    drop(pg);
    drop(zookeeper);
}
