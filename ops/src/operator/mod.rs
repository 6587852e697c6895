//! The operator's side of a pipeline, behind the `autocomp` CLI: append-only
//! actions (`add`, `event`, `rerun`, `restart`, `cancel`, `skip`, `prioritize`) and views
//! (`show`, `logs`, `status`, `explain`, `ready`, `reindex`, `locks`). The binary only parses
//! arguments and prints what these functions return.
//!
//! Every write is one store operation recording the operator (`operator:<name>`) as the
//! event's agent and the reason in its details; nothing is updated in place, and only
//! `prune` (`retention`) removes history, once it is exported and read back.
//! Input is checked before anything is written: a bad or unknown batch, component or event
//! type is an `OperatorError::Input` naming the field and the value (exit 2).
//!
//! The pipeline (component names, event types, triggers, retry settings) is read from the
//! store's component registry, where each component's own passes describe it; the config
//! directory only names the backends.

mod actions;
mod alerts;
mod backup;
mod columns;
mod explain;
mod failures;
mod locks;
mod logs;
mod metrics;
mod older_results;
mod pipeline;
mod premis;
mod ready;
mod reindex;
mod retention;
mod show;
mod status;
mod steering;
mod timeline;
mod views;

#[cfg(test)]
mod shapes_tests;
#[cfg(test)]
mod three_steps_tests;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use autocomp_model::{
    Agent, BatchFacts, ComponentDescriptor, ComponentName, ComponentState, EventType, InvalidInput, NotReady,
    RegisteredComponent, Trigger,
};
use autocomp_sboi::{BatchIndex, IndexEngine, IndexError, open_index};
use autocomp_store::{ObjectStore, StoreError, open_store};
use unicode_normalization::UnicodeNormalization as _;

use autocomp_framework::config::{Backends, ConfigError, SHARED_FILE};
use autocomp_framework::exit::{self, RunError};
use autocomp_framework::locks::{LockError, LockService, open_locks};

pub use actions::{
    Action, ActionForm, ActionPreview, ActionReport, BulkOutcome, BulkPreview, MAX_BULK_BATCHES, NewBatchRequest,
    RestartFrom, StateChange, checkbox,
};
pub use alerts::{
    Alert, AlertDefaults, AlertsView, FailedReason, SilenceRule, held_too_long, is_overdue, last_seen, overdue_after,
    ready_state, ready_too_long, run_overdue,
};
pub use backup::BackupView;
pub use explain::{BatchExplanation, ClauseCheck, Explanation, RetryWindow};
pub use failures::{FAILURES_READ, FailuresAt, FailuresView, ReasonGroup, group_reasons};
pub use locks::{LockView, LocksView, describe_lock};
pub use logs::LogsQuery;
pub use older_results::{OlderResult, older_results};
pub use pipeline::PipelineView;
pub use premis::{ExportCount, ExportScope};
pub use ready::{CandidateView, ReadyView};
pub use retention::{ExportFile, ImportView, Manifest, PruneView, RetentionPolicy, TypePolicy};
pub use show::{BatchView, LogSpan, SHOW_EVENTS, report_summary};
pub use status::StatusView;
pub use steering::{HumanStep, Scope, SteerAction, SteerForm, SteerPreview, SteerReport, hold_lines};
pub use timeline::{Attempt, StartFrom, StepSpec, StepTimeline, TIMELINE_EVENTS, Timeline, duration_text};
pub(crate) use views::cut;
pub use views::{Format, RunView, TableFormat, size_text};

/// The event type `prioritize` records (an operator's bookkeeping, never a component's
/// result: `restart` leaves it alone).
pub const PRIORITIZED: &str = "Prioritized";

/// Longest `--reason` accepted.
pub const MAX_REASON_CHARS: usize = 2_000;

/// Why an operator command did nothing; a caller decides on the variant, never on the words.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OperatorError {
    /// Bad or unknown input, naming the field and the value; nothing was written (exit 2).
    #[error(transparent)]
    Input(#[from] InvalidInput),
    /// A valid request the batch's state refuses (e.g. a component is working on it);
    /// nothing was written (exit 1).
    #[error("{0}")]
    Refused(String),
    /// Refused because the state is that way already (paused, draining, its circuit open);
    /// nothing was written (exit 1). `drain --wait` waits all the same.
    #[error("{0}")]
    AlreadyInState(String),
    /// Configuration, backends, I/O: exit code as for components.
    #[error(transparent)]
    Run(#[from] RunError),
}

impl OperatorError {
    pub fn code(&self) -> u8 {
        match self {
            OperatorError::Input(_) => exit::USAGE,
            OperatorError::Refused(_) | OperatorError::AlreadyInState(_) => exit::FAILED,
            OperatorError::Run(e) => e.code(),
        }
    }

    fn usage(message: impl Into<String>) -> Self {
        OperatorError::Run(RunError::Usage(message.into()))
    }
}

impl From<StoreError> for OperatorError {
    fn from(error: StoreError) -> Self {
        match error {
            StoreError::Invalid(e) => OperatorError::Input(e),
            StoreError::NotFound(id) => OperatorError::Input(unknown_batch(id.as_str())),
            other => OperatorError::Run(RunError::Store(other)),
        }
    }
}

impl From<ConfigError> for OperatorError {
    fn from(error: ConfigError) -> Self {
        OperatorError::Run(RunError::Config(error))
    }
}

impl From<IndexError> for OperatorError {
    fn from(error: IndexError) -> Self {
        match error {
            IndexError::Store(e) => e.into(),
            other => OperatorError::Run(RunError::Index(other)),
        }
    }
}

impl From<LockError> for OperatorError {
    fn from(error: LockError) -> Self {
        OperatorError::Run(error.into())
    }
}

fn unknown_batch(id: &str) -> InvalidInput {
    InvalidInput::new("batch id", id, "no such batch is registered in the store")
}

/// One component of the pipeline as the registry holds it: its descriptor (trigger,
/// readiness settings) and where and when it last ran.
#[derive(Debug, Clone)]
pub struct Step {
    pub registered: RegisteredComponent,
}

impl Step {
    pub fn descriptor(&self) -> &ComponentDescriptor {
        &self.registered.descriptor
    }

    pub fn name(&self) -> &ComponentName {
        &self.descriptor().name
    }

    pub fn event_type(&self) -> &EventType {
        &self.descriptor().event_type
    }

    pub fn trigger(&self) -> &Trigger {
        &self.descriptor().trigger
    }

    /// See `ComponentDescriptor::retry_trigger`: as the runner builds it.
    pub fn retry_trigger(&self) -> Option<Trigger> {
        self.descriptor().retry_trigger()
    }

    /// Whether the runner's store re-check passes; otherwise why not. On a whole batch, a
    /// batch's head or a summary with the time it was read (`SummaryAt`).
    pub fn ready_in_store(&self, batch: &impl BatchFacts) -> Result<(), NotReady> {
        self.descriptor().readiness(batch)
    }

    pub fn state_of(&self, batch: &impl BatchFacts) -> ComponentState {
        self.descriptor().state_of(batch)
    }

    /// Why this step's passes refuse to start, when a result it reads is no longer published
    /// as it expects by its producer in `pipeline` (the registry's steps): the judgement the
    /// pass itself makes (`model::broken_contract`), with what to do about it.
    pub fn broken_contract(&self, pipeline: &[Step]) -> Option<String> {
        let producers: Vec<&ComponentDescriptor> = pipeline.iter().map(Step::descriptor).collect();
        let broken = autocomp_model::broken_contract(self.descriptor(), &producers)?;
        Some(format!("contract broken: {broken} ({})", autocomp_model::CONTRACT_FIX))
    }
}

/// The operator's handle on one pipeline: its config dir, backends and name.
#[derive(Clone)]
pub struct Operator {
    config_dir: PathBuf,
    shared_file: PathBuf,
    backends: Backends,
    name: Option<String>,
    /// The store and index, opened on first use and shared by clones (`acting_as`): a
    /// long-running monitor must not open a connection pool per request.
    opened: Arc<Opened>,
}

#[derive(Default)]
struct Opened {
    store: tokio::sync::OnceCell<Arc<dyn ObjectStore>>,
    index: std::sync::OnceLock<Arc<dyn BatchIndex>>,
}

impl Operator {
    /// Reads `<config_dir>/autocomp.toml` (if present); `overrides` (env, flags) win over it.
    /// `name` is the operator (`--as`); without it `$USER`, then `$LOGNAME`, then the login
    /// name of the process's user id (cron and systemd set neither variable). Only writes
    /// need it.
    pub fn new(config_dir: &Path, overrides: Backends, name: Option<String>) -> Result<Self, OperatorError> {
        let shared_file = config_dir.join(SHARED_FILE);
        let from_file: Backends = match autocomp_framework::config::read_config_file(&shared_file)? {
            Some(text) => autocomp_framework::config::parse_shared_file(&text, &shared_file)?,
            None => Backends::default(),
        };
        Ok(Self {
            config_dir: config_dir.to_path_buf(),
            shared_file,
            backends: from_file.overridden_by(overrides),
            name: name.filter(|n| !n.is_empty()).or_else(login_name),
            opened: Arc::default(),
        })
    }

    /// The same operator (backends, opened store) acting for `name`: the monitor's writes
    /// record the signed-in operator of each request.
    pub fn acting_as(&self, name: &str) -> Operator {
        Operator { name: Some(name.to_owned()), ..self.clone() }
    }

    pub fn config_dir(&self) -> &Path {
        &self.config_dir
    }

    fn backend(&self, value: &Option<String>, key: &str, env: &str) -> Result<String, OperatorError> {
        value.clone().ok_or_else(|| {
            ConfigError::new(
                &self.shared_file,
                format!("no {key} backend configured: set `{key} = \"...\"` here, ${env}, or --{key}"),
            )
            .into()
        })
    }

    /// The store, opened once per operator (and its clones).
    pub async fn store(&self) -> Result<Arc<dyn ObjectStore>, OperatorError> {
        let store = self
            .opened
            .store
            .get_or_try_init(|| async { Ok::<_, OperatorError>(open_store(&self.store_url()?).await?) })
            .await?;
        Ok(Arc::clone(store))
    }

    /// The store's URL as configured (flag, environment or config file).
    pub(crate) fn store_url(&self) -> Result<String, OperatorError> {
        self.backend(&self.backends.store, "store", "AUTOCOMP_STORE")
    }

    fn index_url(&self) -> Result<String, OperatorError> {
        self.backend(&self.backends.index, "index", "AUTOCOMP_INDEX")
    }

    /// The index, opened once per operator (and its clones), over `store`.
    pub fn index(&self, store: &Arc<dyn ObjectStore>) -> Result<Arc<dyn BatchIndex>, OperatorError> {
        if let Some(index) = self.opened.index.get() {
            return Ok(Arc::clone(index));
        }
        let index = open_index(&self.index_url()?, Arc::clone(store))?;
        Ok(Arc::clone(self.opened.index.get_or_init(|| index)))
    }

    /// The embedded index engine itself (for `reindex`'s progress bar), if the index URL
    /// names a local directory.
    fn local_engine(
        &self,
        store: &Arc<dyn ObjectStore>,
        options: autocomp_sboi::EngineOptions,
    ) -> Result<IndexEngine, OperatorError> {
        let dir = self.local_index_dir(store)?;
        Ok(IndexEngine::open_with(dir, options)?)
    }

    /// The directory of the embedded index (`local:/path`).
    fn local_index_dir(&self, store: &Arc<dyn ObjectStore>) -> Result<PathBuf, OperatorError> {
        let url = self.index_url()?;
        match url.strip_prefix("local:").filter(|path| !path.is_empty()) {
            Some(path) => Ok(PathBuf::from(path)),
            None => {
                // Let the port word the error for URLs it does not know.
                self.index(store)?;
                Err(OperatorError::usage(format!(
                    "this command needs the embedded index (local:/path); the index is {}",
                    autocomp_toolkit::display_url(&url)
                )))
            }
        }
    }

    async fn locks(&self) -> Result<Arc<dyn LockService>, OperatorError> {
        let url = self.backend(&self.backends.locks, "locks", "AUTOCOMP_LOCKS")?;
        Ok(open_locks(&url).await?)
    }

    /// Every lock held right now; the lock session is closed again at once, so a read-only
    /// look leaves no ZooKeeper session behind until its timeout. A batch whose claim is its
    /// lock (claim-as-lock: no node in the lock service) is held by its open run's holder,
    /// listed at its lock's path, `batch/<component>/<batch>`.
    pub(crate) async fn held_locks(&self) -> Result<Vec<autocomp_framework::locks::HeldLock>, OperatorError> {
        let locks = self.locks().await?;
        let held = locks.held().await;
        locks.close().await;
        let mut held = held?;
        let runs = self.store().await?.open_runs(None).await?;
        held.extend(runs_as_locks(runs, &held));
        held.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(held)
    }

    /// The components of the pipeline, from the store's component registry (retired ones
    /// left out), in pipeline order: a component after those recording the types it
    /// `requires` (then by name), so tables read left to right the way batches move.
    pub async fn pipeline(&self, store: &dyn ObjectStore) -> Result<Vec<Step>, OperatorError> {
        pipeline_of(store).await
    }

    /// The pipeline's component called `name`, or an error naming it and the known ones.
    pub fn step<'p>(&self, pipeline: &'p [Step], name: &str) -> Result<&'p Step, OperatorError> {
        self.step_named(pipeline, &ComponentName::new(name)?)
    }

    /// The pipeline's component called `name`, or an error naming it and the known ones.
    pub fn step_named<'p>(&self, pipeline: &'p [Step], name: &ComponentName) -> Result<&'p Step, OperatorError> {
        pipeline.iter().find(|step| step.name() == name).ok_or_else(|| {
            let known: Vec<&str> = pipeline.iter().map(|s| s.name().as_str()).collect();
            let known = if known.is_empty() {
                "no component has run a pass against this store yet: a component's first pass registers it".to_owned()
            } else {
                format!("known: {}", known.join(", "))
            };
            InvalidInput::new("component", name.as_str(), format!("not a component of the pipeline ({known})")).into()
        })
    }

    /// The agent every write records: `operator:<name>`.
    fn agent(&self) -> Result<Agent, OperatorError> {
        let Some(name) = &self.name else {
            return Err(InvalidInput::new(
                "--as",
                "",
                "no operator name: pass --as NAME (no $USER or $LOGNAME, and the user id has no login name)",
            )
            .into());
        };
        // One person, one name: a name typed decomposed (`A` + ring) is the `Å` the monitor's
        // accounts hold.
        let name: String = name.nfc().collect();
        let visible = |c: char| !c.is_whitespace() && !c.is_control() && !autocomp_model::is_concealing(c);
        let valid = (1..=64).contains(&name.chars().count()) && name.chars().all(visible);
        if !valid {
            return Err(InvalidInput::new(
                "--as",
                name,
                "must be 1-64 visible characters of any script, without spaces, control, bidi or zero-width characters",
            )
            .into());
        }
        Ok(Agent::new(format!("operator:{name}"))?)
    }
}

/// The components of the pipeline, from the store's component registry (retired ones left
/// out), in pipeline order: a component after those recording the types it `requires` (then
/// by name), so tables read left to right the way batches move.
pub async fn pipeline_of(store: &dyn ObjectStore) -> Result<Vec<Step>, OperatorError> {
    let steps: Vec<Step> = store
        .components()
        .await?
        .into_iter()
        .filter(|registered| !registered.is_retired())
        .map(|registered| Step { registered })
        .collect();
    // Depth in the `requires` graph; bounded by the number of steps, so a cycle ends.
    let mut depth = vec![0usize; steps.len()];
    for _ in 0..steps.len() {
        for (i, step) in steps.iter().enumerate() {
            let producers = steps.iter().enumerate().filter(|(_, p)| step.trigger().requires.contains(p.event_type()));
            depth[i] = producers.map(|(j, _)| depth[j] + 1).max().unwrap_or(0).min(steps.len());
        }
    }
    let mut ordered: Vec<(usize, Step)> = depth.into_iter().zip(steps).collect();
    ordered.sort_by(|(a, x), (b, y)| a.cmp(b).then_with(|| x.name().cmp(y.name())));
    Ok(ordered.into_iter().map(|(_, step)| step).collect())
}

/// Who runs this process when `--as` is not given: `$USER`, `$LOGNAME`, or the login name
/// of the real user id from the password database.
pub fn login_name() -> Option<String> {
    let from_env = |var| std::env::var(var).ok().filter(|v: &String| !v.is_empty());
    from_env("USER").or_else(|| from_env("LOGNAME")).or_else(login_name_of_uid)
}

fn login_name_of_uid() -> Option<String> {
    let mut buffer = vec![0 as libc::c_char; 4096];
    let mut entry: libc::passwd = unsafe { std::mem::zeroed() };
    let mut found: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: getpwuid_r writes only into `entry` and `buffer`, whose sizes we pass; on
    // success `found` points at `entry`, whose `pw_name` points into `buffer`.
    let status = unsafe { libc::getpwuid_r(libc::getuid(), &mut entry, buffer.as_mut_ptr(), buffer.len(), &mut found) };
    if status != 0 || found.is_null() || entry.pw_name.is_null() {
        return None;
    }
    // SAFETY: a successful getpwuid_r leaves a NUL-terminated name inside `buffer`.
    let name = unsafe { std::ffi::CStr::from_ptr(entry.pw_name) };
    name.to_str().ok().filter(|n| !n.is_empty()).map(str::to_owned)
}

/// A required `--reason`: something a later reader can act on, of bounded size.
pub fn check_reason(reason: &str) -> Result<&str, OperatorError> {
    let trimmed = reason.trim();
    if trimmed.is_empty() {
        return Err(InvalidInput::new("--reason", reason, "must say why (it is recorded with the event)").into());
    }
    if trimmed.chars().count() > MAX_REASON_CHARS {
        return Err(InvalidInput::new("--reason", reason, format!("at most {MAX_REASON_CHARS} characters")).into());
    }
    Ok(trimmed)
}

/// The open runs claimed as their batch's lock (their holder names a liveness record), as
/// the batch locks they are; a run claimed under a batch lock is held by that lock alone.
fn runs_as_locks(
    runs: Vec<autocomp_model::Run>,
    held: &[autocomp_framework::locks::HeldLock],
) -> Vec<autocomp_framework::locks::HeldLock> {
    use autocomp_framework::locks::{HeldLock, LockHolder, LockPath};
    let locked: std::collections::HashSet<&str> = held.iter().map(|lock| lock.path.as_str()).collect();
    runs.into_iter()
        .filter(|run| run.holder.liveness.is_some())
        .map(|run| {
            let path = LockPath::Batch(run.component.clone(), run.batch_id.clone()).relative();
            let holder = LockHolder {
                agent: run.holder.agent.to_string(),
                host: run.holder.host.clone(),
                pid: run.holder.pid,
                since: run.started_at,
            };
            HeldLock { path, holder: Some(holder), foreign: None }
        })
        .filter(|lock| !locked.contains(lock.path.as_str()))
        .collect()
}
