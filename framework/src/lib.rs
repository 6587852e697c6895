//! The autocomp framework: what every autonomous component runs when cron starts it (the
//! `Component` trait, the runner, config, the lock port), and the `autocomp` admin CLI.
//!
//! A component is one small file: implement [`Component`], call [`cli::main`]. Everything a
//! component needs is re-exported here (`use autocomp_framework::prelude::*;`), so it
//! depends on this crate alone; [`testing`] runs its `work` in unit tests and its binary in
//! a temporary pipeline. `docs/writing-a-component.md` in the repository walks through one.

pub mod cli;
pub mod component;
pub mod config;
pub mod demo;
pub mod exit;
pub mod locks;
pub mod operator;
pub mod runner;
pub mod scaffold;
pub mod testing;
pub mod watch;

#[doc(inline)]
pub use autocomp_store::{
    Batch, BatchId, BatchType, ComponentDescriptor, ComponentName, ComponentState, Event, EventType, Failure,
    InvalidInput, Outcome, Report, Timestamp, Trigger, TriggerBuilder, TypeNames, duration_text,
};
pub use component::{Component, IoResultExt, MAX_RESULT_BYTES, WorkContext, WorkError};

/// What a component's file needs: `use autocomp_framework::prelude::*;`.
pub mod prelude {
    pub use crate::component::{Component, IoResultExt, WorkContext, WorkError};
    pub use crate::{Batch, Outcome, Trigger};
    pub use serde::{Deserialize, Serialize};
    pub use serde_json::{Value, json};
}
