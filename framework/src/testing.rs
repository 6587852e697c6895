//! Test helpers for components: run a component's `work` on a directory and get its report
//! back ([`run_work`]), batches built in one line ([`TestBatch`]), and a temporary pipeline
//! (store, index, locks and config dir in a temp dir) to run a component's binary in, the way
//! cron starts it ([`TempPipeline`]).

use std::path::{Path, PathBuf};
use std::process::Output;

use autocomp_store::{Batch, Event, Report};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::component::{Component, WorkError};

/// A batch for a unit test: `TestBatch::new("B1").location(dir).succeeded("Data_Received").build()`.
/// Type `RoundTrip`, priority 0, events in the order added, store clock "now".
#[derive(Debug, Clone)]
pub struct TestBatch {
    batch: Batch,
}

impl TestBatch {
    /// Panics naming the id if it is not a valid batch id.
    pub fn new(id: &str) -> Self {
        let _ = id;
        unimplemented!()
    }
    /// Sets metadata `location` (where `work` finds the files).
    pub fn location(self, dir: impl AsRef<Path>) -> Self {
        let _ = dir;
        unimplemented!()
    }
    /// Sets one metadata key.
    pub fn metadata(self, key: &str, value: serde_json::Value) -> Self {
        let _ = (key, value);
        unimplemented!()
    }
    /// Appends a success of `event_type`.
    pub fn succeeded(self, event_type: &str) -> Self {
        let _ = event_type;
        unimplemented!()
    }
    /// Appends a failure of `event_type` (`transient` flags it as retryable).
    pub fn failed(self, event_type: &str, transient: bool) -> Self {
        let _ = (event_type, transient);
        unimplemented!()
    }
    /// Appends a success of `event_type` carrying `result` as its structured result, as an
    /// earlier component would have recorded it (read back with `batch.result::<T>(type)`).
    pub fn with_result<T: Serialize>(self, event_type: &str, result: &T) -> Self {
        let _ = (event_type, result);
        unimplemented!()
    }
    pub fn build(self) -> Batch {
        self.batch
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
        unimplemented!()
    }
    /// Whether it would be recorded as a success.
    pub fn succeeded(&self) -> bool {
        unimplemented!()
    }
    /// Whether it would be recorded as a transient failure (retried after the backoff).
    pub fn is_transient(&self) -> bool {
        unimplemented!()
    }
}

/// Parses settings as the config file's `[settings]` table would give them (TOML text);
/// panics naming the problem.
pub fn settings<S: DeserializeOwned>(toml: &str) -> S {
    let _ = toml;
    unimplemented!()
}

/// Runs the component's `work` once on `batch` with `settings`, on this thread, with a
/// context attached to no store (checkpoints stay in memory, never cancelled), and returns
/// what it did as the runner would record it (the same rules: an error makes a failure,
/// `Transient` flags it, the report's cap is 100 failures).
pub fn run_work<C: Component>(component: &C, settings: &C::Settings, batch: &Batch) -> WorkRun {
    let _ = (component, settings, batch);
    unimplemented!()
}

/// `run_work` on a batch `B1` whose location is `dir`, with `Data_Received` recorded.
pub fn run_work_on<C: Component>(component: &C, settings: &C::Settings, dir: &Path) -> WorkRun {
    let _ = (component, settings, dir);
    unimplemented!()
}

/// A pipeline in a temp dir for end-to-end tests of a component binary: an SQLite store, a
/// local index, local locks and a config dir whose `autocomp.toml` names them. Blocking
/// methods (it runs its own runtime), for plain `#[test]`s. Removed when dropped.
pub struct TempPipeline {
    dir: tempfile::TempDir,
}

impl TempPipeline {
    pub fn new() -> Self {
        unimplemented!()
    }
    /// The temp dir (put deliveries under it).
    pub fn root(&self) -> &Path {
        self.dir.path()
    }
    /// `--config-dir` for the binary (also `AUTOCOMP_CONFIG_DIR` in `run`).
    pub fn config_dir(&self) -> PathBuf {
        unimplemented!()
    }
    /// Writes `<config dir>/<component>.toml`.
    pub fn configure(&self, component: &str, toml: &str) {
        let _ = (component, toml);
        unimplemented!()
    }
    /// Registers a batch (type `RoundTrip`) at `location` with a `Data_Received` success.
    pub fn add_batch(&self, id: &str, location: &Path) {
        let _ = (id, location);
        unimplemented!()
    }
    /// Registers a batch with no event at all.
    pub fn add_bare_batch(&self, id: &str, location: &Path) {
        let _ = (id, location);
        unimplemented!()
    }
    /// Records an event by hand (agent `test`), e.g. what an earlier step would have.
    pub fn record(&self, id: &str, event_type: &str, outcome: autocomp_store::Outcome, details: serde_json::Value) {
        let _ = (id, event_type, outcome, details);
        unimplemented!()
    }
    /// The batch as the store holds it now.
    pub fn batch(&self, id: &str) -> Batch {
        let _ = id;
        unimplemented!()
    }
    /// The batch's effective event of `event_type`, if any.
    pub fn event(&self, id: &str, event_type: &str) -> Option<Event> {
        let _ = (id, event_type);
        unimplemented!()
    }
    /// Runs `binary` once, as cron would: `--config-dir` set, no terminal, with `args`.
    pub fn run(&self, binary: &Path, args: &[&str]) -> Output {
        let _ = (binary, args);
        unimplemented!()
    }
    /// Runs the `autocomp` CLI (`binary`) against this pipeline with `args`.
    pub fn autocomp(&self, binary: &Path, args: &[&str]) -> Output {
        let _ = (binary, args);
        unimplemented!()
    }
}

impl Default for TempPipeline {
    fn default() -> Self {
        Self::new()
    }
}
