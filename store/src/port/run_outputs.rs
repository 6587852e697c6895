//! `RunOutputStore`: what a run printed, kept apart from its result while the run has none: a
//! running run's output so far (its runner saves it every few seconds) and a cancelled run's
//! (saved by its fenced runner once the work returns). A recorded result carries its own
//! output; the runner then removes the one saved apart.

use autocomp_model::{BatchId, ComponentName, RunOutput, RunState, Timestamp};
use serde::{Deserialize, Serialize};

use super::{StoreError, StoreResult};

/// The most saved outputs `run_outputs` answers for one batch (the newest saved).
pub const MAX_RUN_OUTPUTS: usize = 32;

/// A run's output saved apart from a result (`RunOutputStore::set_run_output`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SavedRunOutput {
    pub component: ComponentName,
    pub generation: i64,
    /// The run's state now: `open` while it runs, `cancelled` once an operator cancelled it,
    /// `abandoned` when its worker died or stalled after saving it.
    pub state: RunState,
    /// When it was saved, by the store's clock.
    pub saved_at: Timestamp,
    /// All the run printed (its work returned: a cancelled run's), or what it printed so far.
    pub whole: bool,
    pub output: RunOutput,
}

port_trait! {
    /// Output of runs without a result.
    pub trait RunOutputStore {
        /// Saves (replacing) what run `generation` of (batch, component) printed: so far, while
        /// that run is open; or `whole` (its work returned), while it is open or after an
        /// operator cancelled it; `Fenced` otherwise (recorded, released, taken over; a cancelled
        /// run's output so far), so a snapshot never lands after the whole. `None` removes what
        /// was saved, whatever the run's state (its result holds the output now). Moves no seq:
        /// nothing waits for it.
        #[checked(if let Some(output) = &output { output.validate()? })]
        async fn set_run_output(
            &self,
            batch: &BatchId,
            component: &ComponentName,
            generation: i64,
            output: Option<RunOutput>,
            whole: bool,
        ) -> StoreResult<()>;

        /// The outputs saved for a batch's runs, oldest saved first, at most `MAX_RUN_OUTPUTS`
        /// (the newest); `NotFound` for a batch the store does not have.
        async fn run_outputs(&self, batch: &BatchId) -> StoreResult<Vec<SavedRunOutput>>;
    }
}

/// A run keeps output apart from a result while it is open, and its whole output once
/// cancelled (its fenced runner saves what the work printed until it stopped); any other
/// save is `Fenced`.
pub(crate) fn check_keeps_output(
    batch: &BatchId,
    component: &ComponentName,
    generation: i64,
    state: Option<RunState>,
    whole: bool,
) -> StoreResult<()> {
    let reason = match state {
        Some(RunState::Open) => return Ok(()),
        Some(RunState::Cancelled) if whole => return Ok(()),
        Some(RunState::Cancelled) => "is cancelled: only its whole output may be saved now".to_owned(),
        None => "was never claimed".to_owned(),
        Some(closed) => format!("is already closed ({})", closed.as_str()),
    };
    Err(StoreError::Fenced { batch: batch.clone(), component: component.clone(), generation, reason })
}
