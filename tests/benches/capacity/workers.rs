//! The capacity bench's simulated workers: each is the framework's own `--watch` loop
//! (`run_watching`) around a `Runner` of a no-op stage component, with a lock port of its own
//! (a ZooKeeper session or a PostgreSQL lease) wrapped in a counting decorator; what they
//! share (counters, samples, the runner's phase lines read by a tracing layer); the feeder.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use autocomp_framework::config::ComponentConfig;
use autocomp_framework::locks::{
    HeldLock, Liveness, LivenessHold, Lock, LockError, LockHolder, LockPath, LockService, SessionState,
};
use autocomp_framework::prelude::*;
use autocomp_framework::{BatchId, BatchType, NewBatch, Pipeline, Runner, Setup, Watched, run_watching};
use autocomp_model::{Selection, Seq};
use autocomp_sboi::{BatchIndex, CatchUp, IndexResult, IndexedBatch, Page, PageRequest, Tally};
use autocomp_store::ObjectStore;
use tokio::sync::watch;

/// After a watch ends in an error (the store or index unreachable, the session lost), the
/// worker starts another after this pause, as a supervisor would restart the process.
const RESTART_PAUSE: Duration = Duration::from_millis(200);

/// What every worker adds to, counted only while measuring.
#[derive(Default)]
pub struct Counters {
    pub results: AtomicU64,
    pub completed: AtomicU64,
    pub registered: AtomicU64,
    pub watch_errors: AtomicU64,
    pub feed_errors: AtomicU64,
    pub poll_taken: AtomicU64,
    pub poll_busy: AtomicU64,
    pub lock_many_calls: AtomicU64,
    pub batch_taken: AtomicU64,
    pub batch_busy: AtomicU64,
    pub release_many_calls: AtomicU64,
    pub released: AtomicU64,
    pub lock_errors: AtomicU64,
    pub passes_with_work: AtomicU64,
    pub idle_wakes: AtomicU64,
}

/// Latencies of the lock and index ports' calls, and the runner's per-pass phase totals (µs).
#[derive(Default)]
pub struct Samples {
    pub locks: BTreeMap<&'static str, Vec<Duration>>,
    pub phases: BTreeMap<&'static str, Vec<u64>>,
}

/// Shared by the feeder, the workers, the phase layer and the sampler.
#[derive(Default)]
pub struct Shared {
    pub measuring: AtomicBool,
    pub counters: Counters,
    pub samples: Mutex<Samples>,
    /// When each batch was registered, for the end-to-end latency of the last stage.
    pub registered_at: Mutex<HashMap<BatchId, Instant>>,
    pub end_to_end: Mutex<Vec<Duration>>,
    pub first_error: Mutex<Option<String>>,
}

impl Shared {
    pub fn measuring(&self) -> bool {
        self.measuring.load(Ordering::Relaxed)
    }

    pub fn count(&self, counter: &AtomicU64, by: u64) {
        if self.measuring() {
            counter.fetch_add(by, Ordering::Relaxed);
        }
    }

    pub fn error(&self, counter: &AtomicU64, what: &str, e: impl std::fmt::Display) {
        self.count(counter, 1);
        let mut first = self.first_error.lock().unwrap();
        if first.is_none() {
            *first = Some(format!("{what}: {e}"));
        }
    }

    fn sample_call(&self, call: &'static str, took: Duration) {
        if self.measuring() {
            self.samples.lock().unwrap().locks.entry(call).or_default().push(took);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The workload: a chain of no-op stages

/// One stage of the chain as a component: no work, but it tells the bench of each result
/// (and, at the last stage, of the batch's end-to-end latency).
pub struct Stage {
    name: String,
    event_type: String,
    trigger: Trigger,
    last: bool,
    shared: Arc<Shared>,
}

impl Component for Stage {
    type Settings = ();
    fn name(&self) -> &str {
        &self.name
    }
    fn version(&self) -> &str {
        "1.0"
    }
    fn event_type(&self) -> &str {
        &self.event_type
    }
    fn trigger(&self) -> Trigger {
        self.trigger.clone()
    }
    fn work(&self, batch: &Batch, _: &(), _: &mut WorkContext) -> Result<(), WorkError> {
        self.shared.count(&self.shared.counters.results, 1);
        if self.last {
            let registered = self.shared.registered_at.lock().unwrap().remove(&batch.id);
            if let Some(at) = registered
                && self.shared.measuring()
            {
                self.shared.counters.completed.fetch_add(1, Ordering::Relaxed);
                self.shared.end_to_end.lock().unwrap().push(at.elapsed());
            }
        }
        Ok(())
    }
}

/// The chain's names: stage 0 takes batches of the run's type, stage k requires stage
/// k-1's event; each is blocked by its own.
pub struct Chain {
    pub batch_type: BatchType,
    stages: Vec<(String, String, Trigger)>,
}

impl Chain {
    pub fn new(run: &str, count: usize) -> Self {
        let batch_type = BatchType::new(format!("Cap_{run}")).unwrap();
        let stages = (0..count)
            .map(|k| {
                let event_type = format!("Cap_{run}_S{k}");
                let trigger = if k == 0 {
                    Trigger::builder().batch_types(&[batch_type.as_str()]).blocked_by(event_type.as_str()).build()
                } else {
                    Trigger::builder()
                        .requires(format!("Cap_{run}_S{}", k - 1).as_str())
                        .blocked_by(event_type.as_str())
                        .build()
                };
                (format!("cap{run}-s{k}"), event_type, trigger)
            })
            .collect();
        Self { batch_type, stages }
    }

    pub fn len(&self) -> usize {
        self.stages.len()
    }

    fn stage(&self, k: usize, shared: &Arc<Shared>) -> Stage {
        let (name, event_type, trigger) = self.stages[k].clone();
        Stage { name, event_type, trigger, last: k + 1 == self.stages.len(), shared: Arc::clone(shared) }
    }
}

/// What one worker runs against: the shared store and index, its own lock port.
pub struct Ports {
    pub store: Arc<dyn ObjectStore>,
    pub index: Arc<dyn BatchIndex>,
    pub locks: Arc<dyn LockService>,
}

/// One simulated worker: stage `k`'s runner in the `--watch` loop with the default config,
/// started again after an error until `stop`.
pub async fn run_worker(chain: Arc<Chain>, k: usize, ports: Ports, shared: Arc<Shared>, stop: watch::Receiver<bool>) {
    let config = ComponentConfig::default();
    let heartbeat = config.watch_heartbeat;
    let stage = chain.stage(k, &shared);
    let trigger = stage.trigger.clone();
    let locks: Arc<dyn LockService> = Arc::new(CountingLocks { inner: ports.locks, shared: Arc::clone(&shared) });
    let pipeline = Pipeline { store: Arc::clone(&ports.store), index: Arc::clone(&ports.index), locks };
    let setup = Setup { config, pipeline, shutdown: stop.clone() };
    let runner = match Runner::new(stage, (), trigger, setup) {
        Ok(runner) => runner,
        Err(e) => return shared.error(&shared.counters.watch_errors, "Runner::new", e),
    };
    while !*stop.borrow() {
        let watched = Watched { store: Arc::clone(&ports.store), index: Arc::clone(&ports.index) };
        match run_watching(&runner, watched, heartbeat, stop.clone()).await {
            Ok(_) => {}
            Err(e) => {
                shared.error(&shared.counters.watch_errors, "run_watching", e);
                let mut stop = stop.clone();
                tokio::select! {
                    _ = tokio::time::sleep(RESTART_PAUSE) => {}
                    _ = stop.changed() => {}
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The lock port, counted

/// The worker's lock port as the runner sees it, counting and timing each call on the way
/// (the locks it hands out are the inner service's own: `release_many` may look inside them).
struct CountingLocks {
    inner: Arc<dyn LockService>,
    shared: Arc<Shared>,
}

#[async_trait]
impl LockService for CountingLocks {
    async fn try_lock(
        &self,
        path: &LockPath,
        holder: &LockHolder,
        wait: Duration,
    ) -> Result<Option<Box<dyn Lock>>, LockError> {
        let started = Instant::now();
        let answer = self.inner.try_lock(path, holder, wait).await;
        let c = &self.shared.counters;
        let poll = matches!(path, LockPath::Poll(_));
        self.shared
            .sample_call(if poll { "try_lock (poll, incl. wait)" } else { "try_lock (other)" }, started.elapsed());
        match (&answer, poll) {
            (Ok(Some(_)), true) => self.shared.count(&c.poll_taken, 1),
            (Ok(None), true) => self.shared.count(&c.poll_busy, 1),
            (Ok(Some(_)), false) => self.shared.count(&c.batch_taken, 1),
            (Ok(None), false) => self.shared.count(&c.batch_busy, 1),
            (Err(e), _) => self.shared.error(&c.lock_errors, "try_lock", e),
        }
        answer
    }

    fn waiters_told_at_release(&self) -> bool {
        self.inner.waiters_told_at_release()
    }

    async fn try_lock_many(
        &self,
        paths: &[LockPath],
        holder: &LockHolder,
    ) -> Result<Vec<Option<Box<dyn Lock>>>, LockError> {
        let started = Instant::now();
        let answer = self.inner.try_lock_many(paths, holder).await;
        self.shared.sample_call("try_lock_many", started.elapsed());
        let c = &self.shared.counters;
        self.shared.count(&c.lock_many_calls, 1);
        match &answer {
            Ok(taken) => {
                let got = taken.iter().filter(|t| t.is_some()).count() as u64;
                self.shared.count(&c.batch_taken, got);
                self.shared.count(&c.batch_busy, taken.len() as u64 - got);
            }
            Err(e) => self.shared.error(&c.lock_errors, "try_lock_many", e),
        }
        answer
    }

    async fn release_many(&self, locks: Vec<Box<dyn Lock>>) -> Result<(), LockError> {
        let (count, started) = (locks.len() as u64, Instant::now());
        let answer = self.inner.release_many(locks).await;
        self.shared.sample_call("release_many", started.elapsed());
        let c = &self.shared.counters;
        self.shared.count(&c.release_many_calls, 1);
        match &answer {
            Ok(()) => self.shared.count(&c.released, count),
            Err(e) => self.shared.error(&c.lock_errors, "release_many", e),
        }
        answer
    }

    async fn held(&self) -> Result<Vec<HeldLock>, LockError> {
        self.inner.held().await
    }

    async fn is_held(&self, path: &LockPath) -> Result<Option<bool>, LockError> {
        let started = Instant::now();
        let answer = self.inner.is_held(path).await;
        self.shared.sample_call("is_held", started.elapsed());
        answer
    }

    fn session(&self) -> watch::Receiver<SessionState> {
        self.inner.session()
    }

    fn lost_session_grace(&self) -> Option<Duration> {
        self.inner.lost_session_grace()
    }

    async fn close(&self) {
        self.inner.close().await
    }

    fn liveness(&self) -> Option<String> {
        self.inner.liveness()
    }

    fn keeps_liveness(&self) -> bool {
        self.inner.keeps_liveness()
    }

    async fn hold_liveness(&self) -> Result<Option<LivenessHold>, LockError> {
        self.inner.hold_liveness().await
    }

    async fn judge_liveness(&self, record: &str) -> Result<Liveness, LockError> {
        let started = Instant::now();
        let answer = self.inner.judge_liveness(record).await;
        self.shared.sample_call("judge_liveness", started.elapsed());
        if let Err(e) = &answer {
            self.shared.error(&self.shared.counters.lock_errors, "judge_liveness", e);
        }
        answer
    }
}

// ---------------------------------------------------------------------------------------------
// The feeder

/// Registers batches at `rate` per second until `stop`; answers how many and the
/// `create_batch` latencies while measuring.
pub async fn feed(
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
                if shared.measuring() {
                    latencies.push(started.elapsed());
                }
                shared.count(&shared.counters.registered, 1);
            }
            Err(e) => shared.error(&shared.counters.feed_errors, "create_batch", e),
        }
        n += 1;
    }
}

// ---------------------------------------------------------------------------------------------
// The index port, counted

/// One sboi service's client as the runners see it, counting and timing `query` and
/// `covers` (the calls a watcher makes) for the service's row of the report.
pub struct CountingIndex {
    pub inner: Arc<dyn BatchIndex>,
    pub shared: Arc<Shared>,
    /// The report's key for this service's calls.
    pub queries: &'static str,
    pub covers: &'static str,
}

#[async_trait]
impl BatchIndex for CountingIndex {
    async fn query(&self, trigger: &Trigger) -> IndexResult<Vec<BatchId>> {
        let started = Instant::now();
        let answer = self.inner.query(trigger).await;
        self.shared.sample_call(self.queries, started.elapsed());
        answer
    }
    // Passed on, not left to the default: that would call every answer fresh, and a watcher
    // would keep a lagging service's answer.
    async fn query_checked(&self, trigger: &Trigger) -> IndexResult<(Vec<BatchId>, bool)> {
        let started = Instant::now();
        let answer = self.inner.query_checked(trigger).await;
        self.shared.sample_call(self.queries, started.elapsed());
        answer
    }
    async fn catch_up(&self) -> IndexResult<CatchUp> {
        self.inner.catch_up().await
    }
    async fn covers(&self, seq: Seq, bound: Duration) -> IndexResult<bool> {
        let started = Instant::now();
        let answer = self.inner.covers(seq, bound).await;
        self.shared.sample_call(self.covers, started.elapsed());
        answer
    }
    async fn rebuild(&self) -> IndexResult<usize> {
        self.inner.rebuild().await
    }
    async fn document(&self, id: &BatchId) -> IndexResult<Option<IndexedBatch>> {
        self.inner.document(id).await
    }
    async fn tally(&self, selections: &[Selection], quietest: bool) -> IndexResult<Vec<Tally>> {
        self.inner.tally(selections, quietest).await
    }
    async fn page(&self, request: &PageRequest) -> IndexResult<Page> {
        self.inner.page(request).await
    }
}
