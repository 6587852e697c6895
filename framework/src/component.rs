//! The `Component` trait: what a new autonomous component implements (one small file), and
//! the `WorkContext` the runner hands to its `work`: location, report collector, checkpoints
//! and the cancellation flag. Work is synchronous and runs on its own thread.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use autocomp_store::{Batch, BatchId, ComponentName, Failure, ObjectStore, Report, Trigger};
use serde::de::DeserializeOwned;
use serde_json::Value;

pub trait Component: Send + Sync + 'static {
    /// The `[settings]` table of the component's config file (`()` accepts none).
    type Settings: DeserializeOwned + Send + Sync + 'static;

    /// Names locks and claims: `[A-Za-z0-9][A-Za-z0-9._-]{0,63}`.
    fn name(&self) -> &str;
    fn version(&self) -> &str;
    /// The event type its results are recorded as.
    fn event_type(&self) -> &str;
    /// Which batches are ready for it (the config's `[trigger]` may replace clauses).
    fn trigger(&self) -> Trigger;

    /// Works on one batch. `Ok` records a success, or a failure if the report holds
    /// failures; an error records a failure, permanent or transient (retried after a backoff).
    fn work(&self, batch: &Batch, settings: &Self::Settings, context: &mut WorkContext) -> Result<(), WorkError>;
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WorkError {
    /// Retrying will not help: recorded as a failure.
    #[error("{0}")]
    Permanent(String),
    /// Might succeed later (a share was offline...): recorded as a failure flagged
    /// `transient`, and the batch is retried after the backoff until `max_attempts`.
    #[error("{0}")]
    Transient(String),
}

impl WorkError {
    pub fn permanent(message: impl Into<String>) -> Self {
        WorkError::Permanent(message.into())
    }

    pub fn transient(message: impl Into<String>) -> Self {
        WorkError::Transient(message.into())
    }
}

impl From<std::io::Error> for WorkError {
    /// I/O errors are transient by default: disks and shares come back.
    fn from(error: std::io::Error) -> Self {
        WorkError::Transient(error.to_string())
    }
}

/// Saves checkpoints for one run, fenced by its generation.
#[derive(Clone)]
pub(crate) struct CheckpointWriter {
    pub store: Arc<dyn ObjectStore>,
    pub runtime: tokio::runtime::Handle,
    pub batch: BatchId,
    pub component: ComponentName,
    pub generation: i64,
}

pub struct WorkContext {
    location: Option<PathBuf>,
    report: Report,
    checkpoint: Option<Value>,
    checkpoints: Option<CheckpointWriter>,
    cancelled: Arc<AtomicBool>,
}

impl WorkContext {
    pub(crate) fn new(
        batch: &Batch,
        failures_cap: usize,
        checkpoint: Option<Value>,
        checkpoints: Option<CheckpointWriter>,
        cancelled: Arc<AtomicBool>,
    ) -> Self {
        Self {
            location: batch.location().map(PathBuf::from),
            report: Report::new(failures_cap),
            checkpoint,
            checkpoints,
            cancelled,
        }
    }

    /// A context attached to no run, for testing a component's `work` directly:
    /// checkpoints stay in memory, nothing is cancelled.
    pub fn detached(batch: &Batch, failures_cap: usize) -> Self {
        Self::new(batch, failures_cap, None, None, Arc::new(AtomicBool::new(false)))
    }

    /// The report so far.
    pub fn report(&self) -> &Report {
        &self.report
    }

    /// Where the batch's files are (metadata `location`, set by `batch-trigger`).
    pub fn location(&self) -> Result<&Path, WorkError> {
        self.location.as_deref().ok_or_else(|| WorkError::permanent("the batch has no `location` in its metadata"))
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

    pub(crate) fn into_report(self) -> Report {
        self.report
    }
}
