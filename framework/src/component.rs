//! The `Component` trait: what a new autonomous component implements (one small file), and
//! the `WorkContext` the runner hands to its `work`: location, report collector, checkpoints
//! and the cancellation flag. Work is synchronous and runs on its own thread.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::output::{LiveOutput, StreamCapture};
use autocomp_model::{
    Batch, BatchId, ComponentName, DEFAULT_OUTPUT_BYTES, Failure, OutputStream, Report, RunOutput, Trigger,
};
use autocomp_store::ObjectStore;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// An autonomous component: who it is, which batches are ready for it, and its work on one
/// batch. The runner does the rest (locks, claims, the store re-check, recording the result);
/// a binary's `main` is [`crate::main`] with the component.
pub trait Component: Send + Sync + 'static {
    /// The `[settings]` table of the component's config file (`()` accepts none).
    type Settings: DeserializeOwned + Send + Sync + 'static;

    /// Names locks and claims: `[A-Za-z0-9][A-Za-z0-9._-]{0,63}`.
    fn name(&self) -> &str;
    /// Recorded with every result (in the agent, `<name>/<version>@<host>#<pid>`) and in the
    /// component registry.
    fn version(&self) -> &str;
    /// The event type its results are recorded as.
    fn event_type(&self) -> &str;
    /// Which batches are ready for it (the config's `[trigger]` may replace clauses).
    fn trigger(&self) -> Trigger;

    /// Whether the work reads the batch's content (its files, its metadata). Then each
    /// result records the content it was worked out from, and once the batch is re-delivered
    /// or edited after it, the result is *stale*: it satisfies no `requires` and blocks
    /// nothing, so this step is done again and the steps after it wait for the new result.
    /// A step that only reacts to other results (a notification, a person's approval)
    /// returns `false`, and its result stays whatever the content does.
    fn reads_content(&self) -> bool {
        true
    }

    /// The JSON Schema of the structured result `work` records with `set_result`, published
    /// in the component registry so that the steps reading it can be checked against it
    /// before they run. `None` (the default): it publishes none.
    fn result_schema(&self) -> Option<serde_json::Value> {
        None
    }

    /// The structured results of earlier steps `work` reads, each with the schema it expects:
    /// a pass refuses to start (exit 2) when a producer's published schema does not give what
    /// it expects. Empty (the default): it reads none.
    fn reads(&self) -> Vec<autocomp_model::ResultRead> {
        Vec::new()
    }

    /// Checks the settings at the start of every pass, before anything is locked or claimed
    /// (a root directory exists and is writable, a tool is installed): a refusal ends the
    /// pass with exit 2 naming the key, and no batch is touched, so a configuration mistake
    /// never becomes a failure on every batch. Checked again at every pass: a share being
    /// remounted is fine again once it is back.
    fn check_settings(&self, settings: &Self::Settings) -> Result<(), SettingError> {
        let _ = settings;
        Ok(())
    }

    /// Works on one batch. `Ok` records a success, or a failure if the report holds
    /// failures; an error records a failure, permanent or transient (retried after a backoff).
    fn work(&self, batch: &Batch, settings: &Self::Settings, context: &mut WorkContext) -> Result<(), WorkError>;
}

/// What the registry records of `component` configured by `config`: the config's readiness
/// settings, the trigger, and the contract the component publishes and reads. A runner's
/// passes and a refused pass describe it alike.
pub(crate) fn descriptor_of<C: Component>(
    component: &C,
    config: &crate::config::ComponentConfig,
    (name, event_type): (autocomp_model::ComponentName, autocomp_model::EventType),
    trigger: autocomp_model::Trigger,
) -> autocomp_model::ComponentDescriptor {
    let mut descriptor = config.descriptor(name, component.version(), event_type, trigger, false);
    descriptor.result_schema = component.result_schema();
    descriptor.reads = component.reads();
    descriptor
}

/// A setting a component or source refused: `[settings] <key>: <message>` in its config file.
#[derive(Debug, Clone)]
pub struct SettingError {
    /// The key under `[settings]`.
    pub key: String,
    /// What is wrong with its value.
    pub message: String,
}

impl SettingError {
    /// `key` is wrong because of `message`.
    pub fn new(key: impl Into<String>, message: impl Into<String>) -> Self {
        Self { key: key.into(), message: message.into() }
    }
}

/// Why `work` did not finish. How each is recorded:
///
/// | error | recorded as |
/// |---|---|
/// | `Permanent` | a failure; the batch waits for an operator's rerun |
/// | `Transient` | a failure flagged `transient`, retried after `retry_backoff` until `max_attempts` |
/// | `Cancelled` | nothing when the runner cancelled the work (timeout, shutdown, an operator's cancel: the runner records or releases); a failure otherwise |
///
/// I/O errors carry their path and are classified by kind: see [`WorkError::io`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WorkError {
    /// Retrying will not help: recorded as a failure.
    #[error("{0}")]
    Permanent(String),
    /// Might succeed later (a share was offline...): recorded as a failure flagged
    /// `transient`, and the batch is retried after the backoff until `max_attempts`.
    #[error("{0}")]
    Transient(String),
    /// The work stopped because [`WorkContext::is_cancelled`] said so.
    #[error("cancelled: {0}")]
    Cancelled(String),
}

impl WorkError {
    /// [`WorkError::Permanent`] with this message.
    pub fn permanent(message: impl Into<String>) -> Self {
        WorkError::Permanent(message.into())
    }

    /// [`WorkError::Transient`] with this message.
    pub fn transient(message: impl Into<String>) -> Self {
        WorkError::Transient(message.into())
    }

    /// [`WorkError::Cancelled`] with this message.
    pub fn cancelled(message: impl Into<String>) -> Self {
        WorkError::Cancelled(message.into())
    }

    /// An I/O error on `path`, its message naming the path, classified by its kind:
    ///
    /// - **permanent** (retrying the same batch gives the same answer): not found, permission
    ///   denied, invalid data or input, already exists, not a directory, is a directory,
    ///   read-only file system, file too large, unexpected end of file, unsupported;
    /// - **transient** (disks, mounts and shares come back): interrupted, timed out, would
    ///   block, connection refused/reset/aborted, not connected, broken pipe, storage full,
    ///   quota exceeded, resource busy, stale network file handle, network or host
    ///   unreachable, and any kind not listed here.
    pub fn io(path: impl AsRef<Path>, error: std::io::Error) -> Self {
        let message = format!("{}: {error}", path.as_ref().display());
        if is_permanent(error.kind()) { WorkError::Permanent(message) } else { WorkError::Transient(message) }
    }
}

fn is_permanent(kind: std::io::ErrorKind) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        kind,
        NotFound
            | PermissionDenied
            | InvalidData
            | InvalidInput
            | AlreadyExists
            | NotADirectory
            | IsADirectory
            | DirectoryNotEmpty
            | ReadOnlyFilesystem
            | FileTooLarge
            | InvalidFilename
            | TooManyLinks
            | UnexpectedEof
            | Unsupported
    )
}

/// `.with_path(&path)?` on an `io::Result`: the error names the path and is classified by
/// kind (see [`WorkError::io`]).
pub trait IoResultExt<T> {
    /// The error as [`WorkError::io`] on `path`.
    fn with_path(self, path: impl AsRef<Path>) -> Result<T, WorkError>;
}

impl<T> IoResultExt<T> for std::io::Result<T> {
    fn with_path(self, path: impl AsRef<Path>) -> Result<T, WorkError> {
        self.map_err(|e| WorkError::io(path, e))
    }
}

/// A result that does not fit an earlier step's type is permanent: the same batch gives the
/// same answer next time.
impl From<autocomp_model::InvalidInput> for WorkError {
    fn from(error: autocomp_model::InvalidInput) -> Self {
        WorkError::Permanent(error.to_string())
    }
}

/// `output` within `budget`, or `None` when it holds nothing (or the budget is 0).
pub(crate) fn fitted_output(output: RunOutput, budget: usize) -> Option<RunOutput> {
    if budget == 0 {
        return None;
    }
    let output = output.fit(budget);
    (!output.is_empty()).then_some(output)
}

/// Largest structured result, serialized: half the store's document limit, leaving the
/// rest of the event's report room.
pub const MAX_RESULT_BYTES: usize = autocomp_model::MAX_DOCUMENT_BYTES / 2;

/// Saves checkpoints for one run, fenced by its generation.
#[derive(Clone)]
pub(crate) struct CheckpointWriter {
    /// Where checkpoints are saved.
    pub store: Arc<dyn ObjectStore>,
    /// The runtime the blocking work thread saves on.
    pub runtime: tokio::runtime::Handle,
    /// The batch the run works on.
    pub batch: BatchId,
    /// Whose run it is.
    pub component: ComponentName,
    /// The run's claim generation: a save after a takeover is refused as fenced.
    pub generation: i64,
}

/// What `work` gets besides the batch: where the batch's files are, the report it fills in
/// (failures, summary, result), the checkpoint an earlier attempt saved and the way to save
/// its own, whether the runner has cancelled it, and the output it keeps with the result.
pub struct WorkContext {
    location: Option<PathBuf>,
    report: Report,
    /// Streams the component set itself (`set_output`), and the captured `log`.
    output: RunOutput,
    output_budget: usize,
    /// Streams captured as they are printed (`capture`), which the runner saves while the
    /// run goes on.
    live: LiveOutput,
    checkpoint: Option<Value>,
    checkpoints: Option<CheckpointWriter>,
    cancelled: Arc<AtomicBool>,
}

impl WorkContext {
    /// The context of work on `batch` keeping `failures_cap` failures and `output_budget`
    /// bytes of output with its result: no checkpoint to start from, its own kept in memory,
    /// never cancelled (`attached` gives it a run's).
    pub(crate) fn new(batch: &Batch, failures_cap: usize, output_budget: usize) -> Self {
        Self {
            location: batch.location().map(PathBuf::from),
            report: Report::new(failures_cap),
            output: RunOutput::default(),
            output_budget,
            live: LiveOutput::default(),
            checkpoint: None,
            checkpoints: None,
            cancelled: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Attached to a run: the checkpoint it starts from, where it saves its own, the flag
    /// the runner sets to cancel it, and the streams the runner saves while it goes on.
    pub(crate) fn attached(
        self,
        checkpoint: Option<Value>,
        checkpoints: CheckpointWriter,
        cancelled: Arc<AtomicBool>,
        live: LiveOutput,
    ) -> Self {
        Self { checkpoint, checkpoints: Some(checkpoints), cancelled, live, ..self }
    }

    /// A context attached to no run, for testing a component's `work` directly:
    /// checkpoints stay in memory, nothing is cancelled, output has the default budget.
    pub fn detached(batch: &Batch, failures_cap: usize) -> Self {
        Self::new(batch, failures_cap, DEFAULT_OUTPUT_BYTES)
    }

    /// The report so far.
    pub fn report(&self) -> &Report {
        &self.report
    }

    /// Where the batch's files are (metadata `location`, set by `batch-trigger`).
    pub fn location(&self) -> Result<&Path, WorkError> {
        self.location.as_deref().ok_or_else(|| WorkError::permanent("the batch has no `location` in its metadata"))
    }

    /// Records that the batch as a whole failed (no file or part to name): the outcome
    /// becomes a failure, with this kind and description in the report.
    pub fn fail(&mut self, kind: impl Into<String>, description: impl Into<String>) {
        self.add_failure(String::new(), kind, description, Value::Null);
    }

    /// Records the step's structured result (any serde value, e.g. `{"pages": 412}`), shown
    /// by `autocomp show` and read, typed, by later components with `batch.result::<T>(type)`.
    /// Replaces an earlier one. At most [`MAX_RESULT_BYTES`] serialized.
    pub fn set_result<T: Serialize + ?Sized>(&mut self, result: &T) -> Result<(), WorkError> {
        let value = serde_json::to_value(result)
            .map_err(|e| WorkError::permanent(format!("the result cannot be recorded as JSON: {e}")))?;
        let size = serde_json::to_vec(&value).map_or(usize::MAX, |bytes| bytes.len());
        if size > MAX_RESULT_BYTES {
            return Err(WorkError::permanent(format!(
                "the result is {size} bytes serialized; at most {MAX_RESULT_BYTES} bytes fit in an event (half the \
                 store's 1 MiB document limit)"
            )));
        }
        self.report.result = Some(value);
        Ok(())
    }

    /// `Err(WorkError::Cancelled)` once the run is cancelled: `context.check_cancelled()?`
    /// between units of work.
    pub fn check_cancelled(&self) -> Result<(), WorkError> {
        if self.is_cancelled() { Err(WorkError::cancelled("the run was cancelled")) } else { Ok(()) }
    }

    /// Records one problem found; the report keeps the first `max_reported_failures`.
    pub fn add_failure(
        &mut self,
        reference: impl Into<String>,
        kind: impl Into<String>,
        description: impl Into<String>,
        details: Value,
    ) {
        self.report.add_failure(Failure {
            reference: reference.into(),
            kind: kind.into(),
            description: description.into(),
            details,
        });
    }

    /// How many failures were added so far (all of them, also those past the report's cap).
    pub fn failures_so_far(&self) -> usize {
        self.report.failures_total
    }

    /// A one-line summary of what was done, shown in the event and on stdout.
    pub fn set_summary(&mut self, summary: impl Into<String>) {
        self.report.summary = summary.into();
    }

    /// Set when the run is cancelled (timeout, shutdown, operator): stop soon.
    pub fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::Relaxed)
    }

    /// The checkpoint an earlier attempt (or this one) saved, if any.
    pub fn checkpoint(&self) -> Option<&Value> {
        self.checkpoint.as_ref()
    }

    /// Saves progress for the next attempt should this one die. Must be a JSON object.
    pub fn save_checkpoint(&mut self, value: Value) -> Result<(), WorkError> {
        if let Some(writer) = &self.checkpoints {
            let saved = writer.runtime.block_on(writer.store.save_checkpoint(
                &writer.batch,
                &writer.component,
                writer.generation,
                value.clone(),
            ));
            saved.map_err(|e| match e {
                e if e.is_fenced() => WorkError::permanent(format!("cannot save a checkpoint: {e}")),
                e => WorkError::transient(format!("cannot save a checkpoint: {e}")),
            })?;
        }
        self.checkpoint = Some(value);
        Ok(())
    }

    /// How many bytes of output the result keeps, all streams together (`max_output` in
    /// the component's config; 0: none). A component capturing output itself (a command's
    /// stdout and stderr) sizes its capture with it.
    pub fn output_budget(&self) -> usize {
        self.output_budget
    }

    /// Keeps `stream` as part of the run's output (replacing one of the same name), e.g. a
    /// command's `stdout` captured with `OutputCapture`. The runner fits every stream into
    /// [`WorkContext::output_budget`]. The `log` stream is the framework's: the work
    /// thread's log lines.
    pub fn set_output(&mut self, stream: OutputStream) {
        self.output.set(stream);
    }

    /// A stream of the run's output (a command's `stdout`, say) captured as it is printed,
    /// within [`WorkContext::output_budget`]: the runner saves what it holds every few
    /// seconds while the run goes on (`autocomp logs --follow` and the batch page show it,
    /// and it stays if the run is cancelled), and the result keeps it unless the work sets a
    /// stream of the same name itself. Push from any thread.
    pub fn capture(&mut self, name: &str) -> StreamCapture {
        let stream = StreamCapture::new(name, self.output_budget);
        self.live.register(stream.clone());
        stream
    }

    /// Adds the work thread's captured log lines, unless the component set a `log` itself.
    pub(crate) fn add_log(&mut self, log: OutputStream) {
        if self.output.stream(&log.name).is_none() {
            self.output.set(log);
        }
    }

    /// The report as `work` left it, its output fitted into the budget, for the runner to
    /// record.
    pub(crate) fn into_report(mut self) -> Report {
        for stream in self.live.finish_unfinished() {
            if self.output.stream(&stream.name).is_none() {
                self.output.set(stream);
            }
        }
        let mut report = self.report;
        report.output = fitted_output(self.output, self.output_budget);
        report
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Error, ErrorKind};

    use super::*;

    #[test]
    fn io_errors_name_their_path_and_are_classified_by_kind() {
        let permanent = [
            ErrorKind::NotFound,
            ErrorKind::PermissionDenied,
            ErrorKind::InvalidData,
            ErrorKind::InvalidInput,
            ErrorKind::NotADirectory,
            ErrorKind::UnexpectedEof,
        ];
        for kind in permanent {
            let error = WorkError::io("/data/B1/page.tif", Error::from(kind));
            assert!(
                matches!(&error, WorkError::Permanent(m) if m.starts_with("/data/B1/page.tif: ")),
                "{kind:?}: {error:?}"
            );
        }
        let transient = [
            ErrorKind::Interrupted,
            ErrorKind::TimedOut,
            ErrorKind::WouldBlock,
            ErrorKind::ConnectionReset,
            ErrorKind::StorageFull,
            ErrorKind::StaleNetworkFileHandle,
            ErrorKind::Other,
        ];
        for kind in transient {
            let error = WorkError::io("/mnt/share", Error::from(kind));
            assert!(matches!(&error, WorkError::Transient(m) if m.starts_with("/mnt/share: ")), "{kind:?}: {error:?}");
        }
        let missing = std::fs::read("/no/such/file").with_path("/no/such/file").unwrap_err();
        assert_eq!(missing, WorkError::Permanent("/no/such/file: No such file or directory (os error 2)".into()));
    }

    #[test]
    fn a_result_over_the_limit_is_refused_naming_the_limit() {
        let batch = crate::testing::TestBatch::new("B1").build();
        let mut context = WorkContext::detached(&batch, 10);
        let huge = "x".repeat(MAX_RESULT_BYTES);
        let error = context.set_result(&huge).unwrap_err();
        assert!(error.to_string().contains(&MAX_RESULT_BYTES.to_string()), "{error}");
        assert!(context.report().result.is_none(), "nothing set");
        context.set_result(&serde_json::json!({"pages": 412})).unwrap();
        assert_eq!(context.into_report().result, Some(serde_json::json!({"pages": 412})));
    }

    #[test]
    fn output_set_by_the_work_is_fitted_into_the_budget_and_absent_when_empty() {
        let batch = crate::testing::TestBatch::new("B1").build();
        let stream =
            |name: &str, text: &str| OutputStream { name: name.into(), head: text.into(), ..Default::default() };
        let context = WorkContext::detached(&batch, 10);
        assert_eq!(context.output_budget(), DEFAULT_OUTPUT_BYTES);
        assert_eq!(context.into_report().output, None, "nothing printed: no output");
        let mut context = WorkContext::new(&batch, 10, 100);
        context.set_output(stream("stdout", &"o".repeat(500)));
        context.set_output(stream("stderr", "oops\n"));
        context.add_log(stream("stderr", "not this one"));
        let output = context.into_report().output.unwrap();
        assert_eq!(output.stream("stderr").unwrap().head, "oops\n");
        assert_eq!(output.stream("stdout").unwrap().kept_bytes(), 95);
        let mut context = WorkContext::new(&batch, 10, 0);
        context.set_output(stream("stdout", "x"));
        assert_eq!(context.into_report().output, None, "max_output = 0 keeps none");
    }
}
