//! The autocomp component SDK: what every autonomous component runs when cron (or
//! `--watch`) starts it.
//!
//! A component is one small file: implement [`Component`] (or [`Source`], for a component
//! that registers batches instead of working on them) and call [`main`]. Everything its file
//! needs is in the [`prelude`] (`use autocomp_framework::prelude::*;`), so it depends on this
//! crate alone. With the `testing` feature (take it as a dev-dependency), `testing` runs its
//! `work` in unit tests and its binary in a temporary pipeline.
//! `docs/writing-a-component.md` in the repository walks through one.
//!
//! Beside the component's own API, three modules are public for the tools built on the same
//! parts (the operator application, the lock tests): [`config`] (backends and config files),
//! [`locks`] (the lock port and its flock and ZooKeeper adapters) and [`exit`] (exit codes).
#![warn(missing_docs)]

mod cli;
mod component;
pub mod config;
mod contract;
pub mod exit;
pub mod locks;
mod output;
mod refusal;
mod reports;
mod runner;
mod source;
mod verdict;
// Also in the crate's own unit tests, which build batches with it.
#[cfg(any(test, feature = "testing"))]
pub mod testing;
mod watch;

#[doc(inline)]
pub use autocomp_model::{
    Batch, BatchId, BatchType, ComponentDescriptor, ComponentName, ComponentState, Event, EventType, Failure,
    IdempotencyKey, InvalidInput, NewBatch, NewEvent, Outcome, RESULT_KEY, Report, ResultRead, SteeringChange,
    Timestamp, Trigger, TriggerBuilder, TypeNames, duration_text,
};
/// A run's output (`WorkContext::set_output`): streams kept within a budget.
#[doc(inline)]
pub use autocomp_model::{DEFAULT_OUTPUT_BYTES, MAX_OUTPUT_BYTES, OutputCapture, OutputStream, RunOutput};
#[doc(inline)]
pub use autocomp_store::{CreateOutcome, StoreError};
/// Makes user text (a file name, a reason, a report line) safe to print on a terminal:
/// control and bidi characters become visible `\uXXXX` escapes.
pub use autocomp_toolkit::for_terminal;
pub use cli::{LogFormat, RunnerArgs, init_logging, main, run};
pub use component::{Component, IoResultExt, MAX_RESULT_BYTES, SettingError, WorkContext, WorkError};
pub use contract::{reads_result, result_schema_of};
/// A stream captured while the run goes on (`WorkContext::capture`).
pub use output::StreamCapture;
/// The runner and `--watch` loop themselves, for running many components' passes in one
/// process against ports opened by the caller (the capacity bench simulates thousands of
/// workers as tokio tasks this way): what `main` runs, minus the command line and signals.
pub use runner::{Judged, Pipeline, Runner, Selection, Setup};
pub use runner::{PoolRoom, hostname, registration_hand_ons};
/// JSON Schemas of result types (`#[derive(JsonSchema)]`, in the [`prelude`]): a component
/// publishes its result's ([`result_schema_of`]) and declares the ones it reads
/// ([`reads_result`]) without depending on `schemars` itself.
pub use schemars;
/// JSON values, as results and settings are read and written: `serde_json::to_value`,
/// `from_value` and the rest without depending on `serde_json` itself.
pub use serde_json;
pub use source::{Source, SourceContext, source_main};
/// How a component logs: its work's `info!`, `warn!` and `error!` lines (on the work thread)
/// are kept with the run's result as its `log` output, whatever level stderr shows.
pub use tracing;
/// `--watch`'s loop around a [`Runner`] and what it wakes on (see [`Runner`]).
pub use watch::{Watched, run_watching};

/// What a component's file needs: `use autocomp_framework::prelude::*;`.
pub mod prelude {
    pub use crate::component::{Component, IoResultExt, SettingError, WorkContext, WorkError};
    /// `#[derive(JsonSchema)]` on a result type resolves `schemars` through this.
    pub use crate::schemars::{self, JsonSchema};
    pub use crate::serde_json::{self, Value, json};
    pub use crate::source::{Source, SourceContext};
    pub use crate::{Batch, Outcome, ResultRead, Trigger, reads_result, result_schema_of};
    pub use serde::{Deserialize, Serialize};
}
