//! Test helpers for components: run a component's `work` on a directory and get its report
//! back ([`run_work`]), batches built in one line ([`TestBatch`]), and a temporary pipeline
//! (store, index, locks and config dir in a temp dir) to run a component's binary in, the way
//! cron starts it ([`TempPipeline`]).

use std::future::Future;
use std::io::{Read, Seek};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use autocomp_model::{
    Agent, Batch, BatchId, BatchType, ComponentName, Event, EventType, NewBatch, NewEvent, Outcome, PassOutcome,
    PassPhase, PassRecord, Report, Seq, Timestamp, Trigger,
};
use autocomp_store::prelude::*;
use autocomp_store::{SqliteStore, StoreError};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::component::{Component, WorkContext, WorkError};
use crate::config::ComponentConfig;

/// The agent of everything the helpers record themselves.
const AGENT: &str = "test";

/// Puts a component in the store's registry as if it had run an idle pass: `name` records
/// `event_type`, its trigger is `trigger` blocked by its own type, and the readiness settings
/// are the defaults (3 attempts, 5 min backoff, 10 per pass, 1 h runtime). For tests of
/// readers of the pipeline (the CLI's views, the monitor) that need no component binary.
pub async fn register_component(store: &dyn ObjectStore, name: &str, event_type: &str, trigger: Trigger) {
    let own = EventType::new(event_type).expect("a valid event type");
    let mut trigger = trigger;
    if !trigger.blocked_by.contains(&own) {
        trigger.blocked_by.push(own.clone());
    }
    let name = ComponentName::new(name).expect("a valid component name");
    let descriptor = ComponentConfig::default().descriptor(name, "1.0.0", own, trigger, false);
    let phase = PassPhase::Ended { outcome: PassOutcome::Idle, summary: String::new(), duration_ms: 1, work: vec![] };
    store.record_pass(PassRecord { descriptor, host: "host1".into(), phase }).await.expect("register a component");
}

/// A batch for a unit test: `TestBatch::new("B1").location(dir).succeeded("Data_Received").build()`.
/// Type `RoundTrip`, priority 0, events in the order added, store clock "now".
#[derive(Debug, Clone)]
pub struct TestBatch {
    batch: Batch,
}

impl TestBatch {
    /// Panics naming the id if it is not a valid batch id.
    pub fn new(id: &str) -> Self {
        let id = BatchId::new(id).unwrap_or_else(|e| panic!("TestBatch::new: {e}"));
        let now = Timestamp::now();
        // Seq 1 is the batch's creation, its only content change; events follow it.
        let created = Seq(1);
        TestBatch {
            batch: Batch {
                id,
                batch_type: BatchType::new("RoundTrip").expect("a valid batch type"),
                priority: 0,
                metadata: Map::new(),
                created_seq: created,
                modified_seq: created,
                changed_seq: created,
                created_at: now,
                modified_at: now,
                events: Vec::new(),
                open_runs: Vec::new(),
                as_of: now,
            },
        }
    }
    /// Sets metadata `location` (where `work` finds the files).
    pub fn location(self, dir: impl AsRef<Path>) -> Self {
        let location = dir.as_ref().to_string_lossy().into_owned();
        self.metadata("location", Value::String(location))
    }
    /// Sets one metadata key.
    pub fn metadata(mut self, key: &str, value: serde_json::Value) -> Self {
        self.batch.metadata.insert(key.to_owned(), value);
        self
    }
    /// Appends a success of `event_type`.
    pub fn succeeded(self, event_type: &str) -> Self {
        self.event(event_type, Report::new(0))
    }
    /// Appends a failure of `event_type` (`transient` flags it as retryable).
    pub fn failed(self, event_type: &str, transient: bool) -> Self {
        let mut report = Report::new(0);
        report.outcome = Outcome::Failure;
        report.transient = transient;
        self.event(event_type, report)
    }
    /// Appends a success of `event_type` carrying `result` as its structured result, as an
    /// earlier component would have recorded it (read back with `batch.result::<T>(type)`).
    pub fn with_result<T: Serialize>(self, event_type: &str, result: &T) -> Self {
        let mut report = Report::new(0);
        report.result = Some(
            serde_json::to_value(result)
                .unwrap_or_else(|e| panic!("TestBatch::with_result({event_type}): not JSON: {e}")),
        );
        self.event(event_type, report)
    }

    /// The batch as built.
    pub fn build(self) -> Batch {
        self.batch
    }

    /// Appends an event whose details are `report`, as the runner records one.
    fn event(mut self, event_type: &str, report: Report) -> Self {
        let event_type = EventType::new(event_type).unwrap_or_else(|e| panic!("TestBatch: {e}"));
        let seq = Seq(self.batch.changed_seq.0 + 1);
        self.batch.changed_seq = seq;
        self.batch.events.push(Event {
            seq,
            batch_id: self.batch.id.clone(),
            event_type,
            outcome: report.outcome,
            agent: Agent::new(AGENT).expect("a valid agent"),
            at: self.batch.as_of,
            details: report.to_details(),
            run: None,
            resets: Vec::new(),
        });
        self
    }
}

/// What one `work` call did, as the runner would record it.
#[derive(Debug)]
pub struct WorkRun {
    /// What `work` returned.
    pub returned: Result<(), WorkError>,
    /// The report as it would be recorded (outcome, summary, failures, result, flags).
    pub report: Report,
}

impl WorkRun {
    /// The structured result `work` set, typed; panics naming the error if it does not fit.
    pub fn result<T: DeserializeOwned>(&self) -> Option<T> {
        let value = self.report.result.as_ref()?;
        Some(T::deserialize(value).unwrap_or_else(|e| panic!("the result {value} does not fit: {e}")))
    }
    /// Whether it would be recorded as a success.
    pub fn succeeded(&self) -> bool {
        self.report.outcome == Outcome::Success
    }
    /// Whether it would be recorded as a transient failure (retried after the backoff).
    pub fn is_transient(&self) -> bool {
        self.report.outcome == Outcome::Failure && self.report.transient
    }
}

/// Parses settings as the config file's `[settings]` table would give them (TOML text);
/// panics naming the problem.
pub fn settings<S: DeserializeOwned>(toml: &str) -> S {
    let table: toml::Table = toml.parse().unwrap_or_else(|e| panic!("settings are not TOML: {e}\n{toml}"));
    crate::config::settings(&table, Path::new("<test settings>")).unwrap_or_else(|e| panic!("{e}"))
}

/// Runs the component's `work` once on `batch` with `settings`, on this thread, with a
/// context attached to no store (checkpoints stay in memory, never cancelled), and returns
/// what it did as the runner would record it (the same rules: an error makes a failure,
/// `Transient` flags it, the report's cap is 100 failures).
pub fn run_work<C: Component>(component: &C, settings: &C::Settings, batch: &Batch) -> WorkRun {
    let mut context = WorkContext::detached(batch, ComponentConfig::default().max_reported_failures);
    let returned = component.work(batch, settings, &mut context);
    let report = crate::runner::report_of(returned.clone(), context.into_report());
    WorkRun { returned, report }
}

/// `run_work` on a batch `B1` whose location is `dir`, with `Data_Received` recorded.
pub fn run_work_on<C: Component>(component: &C, settings: &C::Settings, dir: &Path) -> WorkRun {
    let batch = TestBatch::new("B1").location(dir).succeeded("Data_Received").build();
    run_work(component, settings, &batch)
}

/// Longest a binary run by [`TempPipeline::run`] may take before the test fails (and the
/// process is killed): a hung component must fail its test, not hang it.
const RUN_DEADLINE: Duration = Duration::from_secs(300);

/// A pipeline in a temp dir for end-to-end tests of a component binary: an SQLite store, a
/// local index, local locks and a config dir whose `autocomp.toml` names them. Blocking
/// methods (it runs its own runtime), for plain `#[test]`s. Removed when dropped.
pub struct TempPipeline {
    // Dropped in this order: the store's connection, the runtime it ran on, the files.
    store: SqliteStore,
    runtime: tokio::runtime::Runtime,
    dir: tempfile::TempDir,
}

impl TempPipeline {
    /// A fresh pipeline in a temp dir (removed when dropped): a SQLite store, an index
    /// directory, flock locks and a config dir whose `autocomp.toml` names them.
    pub fn new() -> Self {
        let dir = tempfile::tempdir().expect("a temp dir");
        let root = dir.path();
        std::fs::create_dir(root.join("config")).expect("the config dir");
        let shared = format!(
            "store = \"sqlite://{}\"\nindex = \"local:{}\"\nlocks = \"local:{}\"\n",
            root.join("store.db").display(),
            root.join("index").display(),
            root.join("locks").display()
        );
        std::fs::write(root.join("config/autocomp.toml"), shared).expect("autocomp.toml");
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
        let store = runtime.block_on(SqliteStore::open(root.join("store.db"))).expect("the store opens");
        TempPipeline { store, runtime, dir }
    }
    /// The temp dir (put deliveries under it).
    pub fn root(&self) -> &Path {
        self.dir.path()
    }
    /// `--config-dir` for the binary (also `AUTOCOMP_CONFIG_DIR` in `run`).
    pub fn config_dir(&self) -> PathBuf {
        self.root().join("config")
    }
    /// The lock service URL `autocomp.toml` names (`local:<root>/locks`), to hold a lock
    /// from the test as another process would.
    pub fn locks_url(&self) -> String {
        format!("local:{}", self.root().join("locks").display())
    }
    /// Writes `<config dir>/<component>.toml`.
    pub fn configure(&self, component: &str, toml: &str) {
        let file = self.config_dir().join(format!("{component}.toml"));
        std::fs::write(&file, toml).unwrap_or_else(|e| panic!("cannot write {}: {e}", file.display()));
    }
    /// Registers a batch (type `RoundTrip`) at `location` with a `Data_Received` success.
    pub fn add_batch(&self, id: &str, location: &Path) {
        self.add_bare_batch(id, location);
        self.record(id, "Data_Received", Outcome::Success, serde_json::json!({}));
    }
    /// Registers a batch with no event at all.
    pub fn add_bare_batch(&self, id: &str, location: &Path) {
        self.create(NewBatch::new(batch_id(id), round_trip()).with_location(location.to_string_lossy()));
    }
    /// Registers a batch with neither a location nor an event, as `autocomp add` does before
    /// its files arrive.
    pub fn add_unlocated_batch(&self, id: &str) {
        self.create(NewBatch::new(batch_id(id), round_trip()));
    }
    /// Records an event by hand (agent `test`), e.g. what an earlier step would have.
    pub fn record(&self, id: &str, event_type: &str, outcome: autocomp_model::Outcome, details: serde_json::Value) {
        let event_type = EventType::new(event_type).unwrap_or_else(|e| panic!("record: {e}"));
        let event = NewEvent::new(event_type, outcome, agent()).with_details(details);
        self.append(id, event);
    }
    /// Records a success of a step whose work read the batch's content as it is now (its
    /// `content_seq`): stale, like the component's own result, once the content changes.
    pub fn record_on_content(&self, id: &str, event_type: &str) {
        let content = self.batch(id).modified_seq.0;
        self.record(id, event_type, Outcome::Success, serde_json::json!({ autocomp_model::CONTENT_SEQ_KEY: content }));
    }
    /// Records a content change (a re-delivery), as a source does.
    pub fn record_content_change(&self, id: &str) {
        let mut patch = serde_json::Map::new();
        patch.insert("redelivered".into(), serde_json::json!(true));
        self.block_on(self.store.record_content_change(&batch_id(id), patch))
            .unwrap_or_else(|e| panic!("recording a content change of {id}: {e}"));
    }
    /// Appends a `Reset` marker superseding `event_types`, as `autocomp rerun` does (agent
    /// `operator:test`, the reason in its details).
    pub fn reset(&self, id: &str, event_types: &[&str], reason: &str) {
        let types = event_types.iter().map(|t| EventType::new(*t).unwrap_or_else(|e| panic!("reset: {e}"))).collect();
        let operator = Agent::new("operator:test").expect("a valid agent");
        self.append(id, NewEvent::reset(types, operator, serde_json::json!({ "reason": reason })));
    }
    /// The batch as the store holds it now.
    pub fn batch(&self, id: &str) -> Batch {
        self.find_batch(id).unwrap_or_else(|| panic!("batch {id} is not registered"))
    }
    /// The batch as the store holds it now, or `None` if it is not registered.
    pub fn find_batch(&self, id: &str) -> Option<Batch> {
        match self.block_on(self.store.get_batch(&batch_id(id))) {
            Ok(batch) => Some(batch),
            Err(StoreError::NotFound(_)) => None,
            Err(e) => panic!("reading batch {id}: {e}"),
        }
    }
    /// How many batches are registered.
    pub fn batch_count(&self) -> u64 {
        self.block_on(self.store.count_batches()).unwrap_or_else(|e| panic!("counting batches: {e}"))
    }
    /// The batch's effective event of `event_type`, if any.
    pub fn event(&self, id: &str, event_type: &str) -> Option<Event> {
        let event_type = EventType::new(event_type).unwrap_or_else(|e| panic!("event: {e}"));
        self.batch(id).effective().get(&event_type).cloned()
    }
    /// Every event of `event_type` in the batch's log (superseded ones too), oldest first.
    pub fn events(&self, id: &str, event_type: &str) -> Vec<Event> {
        self.batch(id).events.into_iter().filter(|e| e.event_type == *event_type).collect()
    }
    /// Applies a steering change (a pause, a resume, a pool size) as `operator:test` would.
    pub fn steer(&self, change: autocomp_model::SteeringChange) {
        let by = autocomp_model::Agent::new("operator:test").expect("a valid agent");
        let request = autocomp_model::SteeringRequest { change, by, reason: "test".into(), expect_version: None };
        self.block_on(self.store.steer(request)).unwrap_or_else(|e| panic!("steering: {e}"));
    }

    /// Runs a future on the pipeline's runtime (e.g. holding a lock as another process would).
    pub fn block_on<F: Future>(&self, future: F) -> F::Output {
        self.runtime.block_on(future)
    }
    /// The command `run` starts, for a test that watches the process while it works: the
    /// config dir in `AUTOCOMP_CONFIG_DIR`, the backend variables removed (so the test's own
    /// environment cannot point it elsewhere), stdin null (no terminal, as under cron).
    pub fn command(&self, binary: &Path) -> Command {
        let mut command = Command::new(binary);
        command
            .env("AUTOCOMP_CONFIG_DIR", self.config_dir())
            .env_remove("AUTOCOMP_STORE")
            .env_remove("AUTOCOMP_INDEX")
            .env_remove("AUTOCOMP_LOCKS")
            .stdin(Stdio::null());
        command
    }
    /// Runs `binary` once, as cron would: `--config-dir` set (through `AUTOCOMP_CONFIG_DIR`, so
    /// `args` may still give one), no terminal, with `args`. A run that outlives the deadline
    /// (five minutes) is killed and fails the test.
    pub fn run(&self, binary: &Path, args: &[&str]) -> Output {
        let mut command = self.command(binary);
        command.args(args);
        finish(command, binary, args)
    }
    /// Runs the `autocomp` CLI (`binary`) against this pipeline with `args`, as operator
    /// `test` unless `args` say `--as`.
    pub fn autocomp(&self, binary: &Path, args: &[&str]) -> Output {
        let mut command = self.command(binary);
        command.env("USER", "test").args(args);
        finish(command, binary, args)
    }

    fn create(&self, batch: NewBatch) {
        let id = batch.id.clone();
        self.block_on(self.store.create_batch(batch)).unwrap_or_else(|e| panic!("registering batch {id}: {e}"));
    }

    fn append(&self, id: &str, event: NewEvent) {
        let event_type = event.event_type.clone();
        self.block_on(self.store.append_event(&batch_id(id), event))
            .unwrap_or_else(|e| panic!("recording {event_type} on {id}: {e}"));
    }
}

impl Default for TempPipeline {
    fn default() -> Self {
        Self::new()
    }
}

fn batch_id(id: &str) -> BatchId {
    BatchId::new(id).unwrap_or_else(|e| panic!("{e}"))
}

fn round_trip() -> BatchType {
    BatchType::new("RoundTrip").expect("a valid batch type")
}

fn agent() -> Agent {
    Agent::new(AGENT).expect("a valid agent")
}

/// Runs `command` to its end within [`RUN_DEADLINE`]. Its output goes to unnamed temp files,
/// not pipes: a grandchild left holding a pipe open would keep a reader waiting after the
/// binary itself exited.
fn finish(mut command: Command, binary: &Path, args: &[&str]) -> Output {
    let mut stdout = tempfile::tempfile().expect("a temp file for stdout");
    let mut stderr = tempfile::tempfile().expect("a temp file for stderr");
    command.stdout(stdout.try_clone().expect("a stdout handle")).stderr(stderr.try_clone().expect("a stderr handle"));
    let mut child = command.spawn().unwrap_or_else(|e| panic!("cannot run {}: {e}", binary.display()));
    let deadline = Instant::now() + RUN_DEADLINE;
    let status = loop {
        if let Some(status) = child.try_wait().expect("the child can be waited for") {
            break status;
        }
        if Instant::now() >= deadline {
            child.kill().ok();
            child.wait().ok();
            panic!(
                "{} {args:?} did not finish within {}s; stdout: {}; stderr: {}",
                binary.display(),
                RUN_DEADLINE.as_secs(),
                String::from_utf8_lossy(&read_all(&mut stdout)),
                String::from_utf8_lossy(&read_all(&mut stderr))
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Output { status, stdout: read_all(&mut stdout), stderr: read_all(&mut stderr) }
}

fn read_all(file: &mut std::fs::File) -> Vec<u8> {
    let mut bytes = Vec::new();
    file.rewind().expect("the output file rewinds");
    file.read_to_end(&mut bytes).expect("the output file reads");
    bytes
}

#[cfg(test)]
#[path = "testing_tests.rs"]
mod tests;
