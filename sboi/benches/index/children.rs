//! The index bench's child processes: the store's share of a catch-up (`feed`) and the catch-up itself (`catch-up`), each measured in a process of its own, with the store timed through a wrapping `ObjectStore`.

use super::*;

#[derive(Clone, Copy)]
pub(super) enum ChildMode {
    Feed,
    CatchUp,
}

#[derive(serde::Serialize, serde::Deserialize, Default)]
pub(super) struct ChildReport {
    pub(super) batches: usize,
    pub(super) events: u64,
    pub(super) seconds: f64,
    /// Time spent inside store calls (changes + get_summaries).
    pub(super) store_seconds: f64,
    pub(super) cpu_seconds: f64,
    pub(super) peak_rss_bytes: u64,
    pub(super) index_bytes: u64,
    pub(super) docs: u64,
    pub(super) options: String,
}

/// An `ObjectStore` that times every call into the real one.
struct TimedStore<S> {
    inner: S,
    nanos: AtomicU64,
}

impl<S> TimedStore<S> {
    async fn timed<T>(&self, work: impl Future<Output = T>) -> T {
        let start = Instant::now();
        let result = work.await;
        self.nanos.fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
        result
    }

    fn seconds(&self) -> f64 {
        self.nanos.load(Ordering::Relaxed) as f64 / 1e9
    }
}

#[async_trait]
impl<S: ObjectStore> BatchStore for TimedStore<S> {
    async fn create_batch(&self, batch: NewBatch) -> StoreResult<CreateOutcome> {
        self.timed(self.inner.create_batch(batch)).await
    }

    async fn register_batch(&self, batch: NewBatch, first: NewEvent) -> StoreResult<CreateOutcome> {
        self.timed(self.inner.register_batch(batch, first)).await
    }

    async fn get_batch(&self, id: &BatchId) -> StoreResult<Batch> {
        self.timed(self.inner.get_batch(id)).await
    }

    async fn get_batches(&self, ids: &[BatchId]) -> StoreResult<Vec<Batch>> {
        self.timed(self.inner.get_batches(ids)).await
    }

    async fn list_batches(&self, after: Option<&BatchId>, limit: usize) -> StoreResult<Vec<Batch>> {
        self.timed(self.inner.list_batches(after, limit)).await
    }

    async fn get_summaries(&self, ids: &[BatchId]) -> StoreResult<Vec<BatchSummary>> {
        self.timed(self.inner.get_summaries(ids)).await
    }

    async fn list_summaries(&self, after: Option<&BatchId>, limit: usize) -> StoreResult<Vec<BatchSummary>> {
        self.timed(self.inner.list_summaries(after, limit)).await
    }

    async fn set_priority(&self, id: &BatchId, priority: i32) -> StoreResult<Seq> {
        self.timed(self.inner.set_priority(id, priority)).await
    }

    async fn record_content_change(&self, id: &BatchId, patch: Map<String, Value>) -> StoreResult<Seq> {
        self.timed(self.inner.record_content_change(id, patch)).await
    }

    async fn append_event(&self, batch: &BatchId, event: NewEvent) -> StoreResult<Event> {
        self.timed(self.inner.append_event(batch, event)).await
    }

    async fn claim(&self, batch: &BatchId, component: &ComponentName, holder: &RunHolder) -> StoreResult<Claim> {
        self.timed(self.inner.claim(batch, component, holder)).await
    }

    async fn release(&self, batch: &BatchId, component: &ComponentName, generation: i64) -> StoreResult<()> {
        self.timed(self.inner.release(batch, component, generation)).await
    }

    async fn save_checkpoint(
        &self,
        batch: &BatchId,
        component: &ComponentName,
        generation: i64,
        data: Value,
    ) -> StoreResult<()> {
        self.timed(self.inner.save_checkpoint(batch, component, generation, data)).await
    }

    async fn load_checkpoint(&self, batch: &BatchId, component: &ComponentName) -> StoreResult<Option<Value>> {
        self.timed(self.inner.load_checkpoint(batch, component)).await
    }

    async fn open_runs(&self, component: Option<&ComponentName>) -> StoreResult<Vec<Run>> {
        self.timed(self.inner.open_runs(component)).await
    }

    async fn failed_attempts(&self, batch: &BatchId, component: &ComponentName, since: Seq) -> StoreResult<u32> {
        self.timed(self.inner.failed_attempts(batch, component, since)).await
    }

    async fn changes(&self, since: Seq, limit: usize) -> StoreResult<ChangePage> {
        self.timed(self.inner.changes(since, limit)).await
    }

    async fn head(&self) -> StoreResult<Seq> {
        self.timed(self.inner.head()).await
    }

    async fn about(&self) -> StoreResult<autocomp_store::StoreAbout> {
        self.inner.about().await
    }
}

#[async_trait]
impl<S: ObjectStore> RegistryStore for TimedStore<S> {
    async fn record_pass(&self, pass: autocomp_model::PassRecord) -> StoreResult<()> {
        self.inner.record_pass(pass).await
    }

    async fn components(&self) -> StoreResult<Vec<autocomp_model::RegisteredComponent>> {
        self.inner.components().await
    }

    async fn retire_component(
        &self,
        name: &ComponentName,
        by: &Agent,
        reason: &str,
    ) -> StoreResult<autocomp_model::RegisteredComponent> {
        self.inner.retire_component(name, by, reason).await
    }
}

#[async_trait]
impl<S: ObjectStore> SteeringStore for TimedStore<S> {
    async fn steering(&self) -> StoreResult<autocomp_model::Steering> {
        self.inner.steering().await
    }

    async fn steer(&self, request: autocomp_model::SteeringRequest) -> StoreResult<autocomp_store::Steered> {
        self.inner.steer(request).await
    }

    async fn steering_log(&self, limit: usize) -> StoreResult<Vec<autocomp_model::SteeringEntry>> {
        self.inner.steering_log(limit).await
    }
}

#[async_trait]
impl<S: ObjectStore> OutboxStore for TimedStore<S> {
    async fn enqueue_notices(
        &self,
        notices: Vec<autocomp_store::NewNotice>,
        cursor: Option<autocomp_store::CursorMove>,
    ) -> StoreResult<autocomp_store::Enqueued> {
        self.inner.enqueue_notices(notices, cursor).await
    }

    async fn take_notices(
        &self,
        holder: &str,
        limit: usize,
        lease: Duration,
    ) -> StoreResult<Vec<autocomp_store::Notice>> {
        self.inner.take_notices(holder, limit, lease).await
    }

    async fn settle_notice(&self, key: &str, holder: &str, outcome: autocomp_store::NoticeOutcome) -> StoreResult<()> {
        self.inner.settle_notice(key, holder, outcome).await
    }

    async fn recent_notices(&self, limit: usize) -> StoreResult<Vec<autocomp_store::Notice>> {
        self.inner.recent_notices(limit).await
    }
}

#[async_trait]
impl<S: ObjectStore> SeriesStore for TimedStore<S> {
    async fn work_series(
        &self,
        step: autocomp_model::SeriesStep,
        since: Timestamp,
        component: Option<&ComponentName>,
    ) -> StoreResult<Vec<autocomp_model::WorkPoint>> {
        self.inner.work_series(step, since, component).await
    }

    async fn record_backlog(&self, samples: Vec<autocomp_model::BacklogSample>) -> StoreResult<()> {
        self.inner.record_backlog(samples).await
    }
}

#[async_trait::async_trait]
impl<S: ObjectStore> autocomp_store::RunOutputStore for TimedStore<S> {
    async fn set_run_output(
        &self,
        batch: &BatchId,
        component: &ComponentName,
        generation: i64,
        output: Option<autocomp_model::RunOutput>,
        whole: bool,
    ) -> StoreResult<()> {
        self.inner.set_run_output(batch, component, generation, output, whole).await
    }

    async fn run_outputs(&self, batch: &BatchId) -> StoreResult<Vec<autocomp_store::SavedRunOutput>> {
        self.inner.run_outputs(batch).await
    }
}

/// No runner appends through the timed store: it hands nothing on (the defaults).
#[async_trait::async_trait]
impl<S: ObjectStore> autocomp_store::HandOnStore for TimedStore<S> {}

#[async_trait::async_trait]
impl<S: ObjectStore> autocomp_store::RetentionStore for TimedStore<S> {
    async fn histories(&self, ids: &[BatchId]) -> StoreResult<Vec<autocomp_store::BatchHistory>> {
        self.inner.histories(ids).await
    }

    async fn prune_histories(
        &self,
        tickets: Vec<autocomp_store::PruneTicket>,
    ) -> StoreResult<Vec<autocomp_store::PruneAnswer>> {
        self.inner.prune_histories(tickets).await
    }

    async fn restore_histories(
        &self,
        histories: Vec<autocomp_store::BatchHistory>,
    ) -> StoreResult<Vec<autocomp_store::RestoreAnswer>> {
        self.inner.restore_histories(histories).await
    }
}

fn proc_status_kib(key: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status.lines().find_map(|line| line.strip_prefix(key)?.trim().strip_suffix("kB")?.trim().parse().ok()).unwrap_or(0)
}

/// User + system CPU time of this process (all threads), from /proc (USER_HZ = 100).
pub(super) fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the parenthesized command name; utime and stime are fields 14 and 15.
    let rest = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or("");
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok()).unwrap_or(0);
    (ticks(11) + ticks(12)) as f64 / 100.0
}

pub(super) fn child(mode: ChildMode) {
    let store_path = PathBuf::from(std::env::var(CHILD_STORE).expect("store path"));
    let report = runtime().block_on(async {
        let store = SqliteStore::open_with(&store_path, store_options()).await.expect("open the store");
        let store = TimedStore { inner: store, nanos: AtomicU64::new(0) };
        match mode {
            ChildMode::Feed => read_feed(&store).await,
            ChildMode::CatchUp => catch_up_fresh(&store).await,
        }
    });
    let report = ChildReport { cpu_seconds: cpu_seconds(), peak_rss_bytes: proc_status_kib("VmHWM:") * 1024, ..report };
    println!("{RESULT_PREFIX}{}", serde_json::to_string(&report).expect("json"));
}

/// What the engine reads from the store during a catch-up, without the indexing.
async fn read_feed(store: &TimedStore<SqliteStore>) -> ChildReport {
    let page_size = engine_options().page_size;
    let start = Instant::now();
    let (mut cursor, mut batches, mut events) = (Seq::ZERO, 0, 0);
    loop {
        let page = store.changes(cursor, page_size).await.expect("changes");
        if page.changes.is_empty() {
            break;
        }
        let ids: Vec<BatchId> = page.changes.into_iter().map(|(_, id)| id).collect();
        for batch in store.get_summaries(&ids).await.expect("get_summaries") {
            batches += 1;
            events += batch.effective.len() as u64;
        }
        cursor = page.next;
    }
    ChildReport {
        batches,
        events,
        seconds: start.elapsed().as_secs_f64(),
        store_seconds: store.seconds(),
        options: format!("page_size {page_size}"),
        ..ChildReport::default()
    }
}

async fn catch_up_fresh(store: &TimedStore<SqliteStore>) -> ChildReport {
    let dir = PathBuf::from(std::env::var(CHILD_INDEX).expect("index dir"));
    let options = engine_options();
    let described = format!("{options:?}");
    let engine = IndexEngine::open_with(&dir, options).expect("open the index");
    let start = Instant::now();
    let outcome = engine.catch_up(store).await.expect("catch up");
    let seconds = start.elapsed().as_secs_f64();
    let CatchUp::Applied { batches, .. } = outcome else { panic!("a fresh index should apply the feed: {outcome:?}") };
    ChildReport {
        batches,
        seconds,
        store_seconds: store.seconds(),
        index_bytes: dir_size(&dir),
        docs: engine.num_docs().expect("num_docs"),
        options: described,
        ..ChildReport::default()
    }
}

/// `EngineOptions::default()`, or tuned through `AUTOCOMP_BENCH_PAGE_SIZE`,
/// `AUTOCOMP_BENCH_COMMIT_EVERY`, `AUTOCOMP_BENCH_WRITER_THREADS`, `AUTOCOMP_BENCH_WRITER_MIB`.
pub(super) fn engine_options() -> EngineOptions {
    let var = |name: &str| std::env::var(name).ok().and_then(|v| v.trim().parse::<usize>().ok());
    let defaults = EngineOptions::default();
    EngineOptions {
        page_size: var("AUTOCOMP_BENCH_PAGE_SIZE").unwrap_or(defaults.page_size),
        commit_every: var("AUTOCOMP_BENCH_COMMIT_EVERY").unwrap_or(defaults.commit_every),
        writer_threads: var("AUTOCOMP_BENCH_WRITER_THREADS").unwrap_or(defaults.writer_threads),
        writer_memory_bytes: var("AUTOCOMP_BENCH_WRITER_MIB").map_or(defaults.writer_memory_bytes, |mib| mib << 20),
        ..defaults
    }
}

pub(super) fn run_child(mode: &str, config: &Config) -> ChildReport {
    let output = Command::new(std::env::current_exe().expect("current exe"))
        .env(CHILD_MODE, mode)
        .env(CHILD_STORE, config.store_path())
        .env(CHILD_INDEX, config.index_dir())
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .expect("run the child process");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "child {mode} failed: {}\n{stdout}", output.status);
    let line = stdout.lines().find_map(|line| line.strip_prefix(RESULT_PREFIX)).expect("the child's result line");
    serde_json::from_str(line).expect("the child's result")
}
