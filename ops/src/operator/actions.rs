//! The operator's writes on batches. Each checks everything first (reason, operator name,
//! component, batch, the batch's state), then makes exactly one store call, which appends
//! one event (or registers one batch). History only grows: a rerun or restart is a `Reset`
//! marker superseding events in the effective view, never an edit.
//!
//! `rerun`, `restart`, `cancel`, `skip`, `acknowledge`, `prioritize`, `approve` and `reject` are each one
//! [`Action`], planned by its own module whatever asks for it: the CLI performs the plan
//! (`perform`), the monitor previews it first (`preview`: the same checks and refusals, the
//! event it would append and the state changes that follow), confirms what it previewed
//! once (`confirm`) and may act on many batches at once (`bulk`). `add`, `event` and
//! `forget` are writes of their own.
//!
//! **Honest answers.** Every answer names exactly what was written: the event's type, seq
//! and outcome (and flags), and for a `Reset` the types it supersedes. `skip` over a
//! success that counts is refused unless forced; `cancel` with no open run is refused unless
//! asked to record the cancelled failure anyway.

use std::fmt;

use autocomp_model::ComponentName;

mod acknowledge;
mod add;
mod approve;
mod bulk;
mod bulk_view;
mod cancel;
mod confirm;
mod event;
mod forget;
mod form;
mod perform;
mod plan;
mod prepared;
mod preview;
mod prioritize;
mod reject;
mod report;
mod rerun;
mod restart;
mod skip;

pub use add::NewBatchRequest;
pub use bulk::{BulkOutcome, BulkPreview, MAX_BULK_BATCHES};
pub use form::{ActionForm, checkbox};
pub use preview::ActionPreview;
pub(crate) use report::json_of;
pub use report::{ActionReport, StateChange};

/// Where `restart` starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RestartFrom {
    /// The effective failure with the lowest seq.
    FirstFailure,
    /// This event type's effective event.
    Type(String),
}

impl RestartFrom {
    /// How a form names the first failure (`from=first-failure`); any other value is a type.
    pub const FIRST_FAILURE: &'static str = "first-failure";
}

/// An operator's action on one batch: what the CLI's `rerun`, `restart`, `cancel`, `skip`
/// and `prioritize` do, for callers that preview an action before performing it. It
/// (de)serializes as the fields of the monitor's action form ([`ActionForm`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "ActionForm", into = "ActionForm")]
pub enum Action {
    /// A Reset marker for the component's event type: it runs again if its trigger holds.
    Rerun { component: String },
    /// A Reset marker for the starting type and every type recorded after it.
    Restart { from: RestartFrom },
    /// Fences the component's running worker and records a failure flagged `cancelled`.
    /// With no open run it is refused unless `record_anyway`.
    Cancel { component: String, record_anyway: bool },
    /// Records a success flagged `skipped` for the component. Over a success that counts
    /// (not skipped, not stale) it is refused unless `force`.
    Skip { component: String, force: bool },
    /// Records the component's effective failure again flagged `acknowledged`: closed out,
    /// it needs nobody (refused when there is no failure, or it is acknowledged already).
    Acknowledge { component: String },
    /// Sets the batch's priority (higher runs first) and records `Prioritized`.
    Prioritize { priority: i32 },
    /// A person's approval at a human step (a manual component) the batch waits at: its
    /// event, a success flagged `approved`.
    Approve { step: String },
    /// A person's rejection at a human step: its event, a failure flagged `rejected`; with
    /// `restart_from`, instead a Reset from that type (as `restart --from`) flagged
    /// `rejected`, so the batch goes back to be redone and comes to the step again.
    Reject { step: String, restart_from: Option<String> },
}

impl Action {
    /// The CLI command, also recorded as `action` in the event's details.
    pub fn name(&self) -> &'static str {
        match self {
            Action::Rerun { .. } => "rerun",
            Action::Restart { .. } => "restart",
            Action::Cancel { .. } => "cancel",
            Action::Skip { .. } => "skip",
            Action::Acknowledge { .. } => "acknowledge",
            Action::Prioritize { .. } => "prioritize",
            Action::Approve { .. } => "approve",
            Action::Reject { .. } => "reject",
        }
    }

    /// The component it names, if any.
    fn component(&self) -> Option<&str> {
        match self {
            Action::Rerun { component }
            | Action::Cancel { component, .. }
            | Action::Skip { component, .. }
            | Action::Acknowledge { component } => Some(component),
            Action::Approve { step } | Action::Reject { step, .. } => Some(step),
            Action::Restart { .. } | Action::Prioritize { .. } => None,
        }
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Action::Rerun { component } => rerun::describe(f, component),
            Action::Restart { from } => restart::describe(f, from),
            Action::Cancel { component, record_anyway } => cancel::describe(f, component, *record_anyway),
            Action::Skip { component, force } => skip::describe(f, component, *force),
            Action::Acknowledge { component } => acknowledge::describe(f, component),
            Action::Prioritize { priority } => prioritize::describe(f, *priority),
            Action::Approve { step } => approve::describe(f, step),
            Action::Reject { step, restart_from } => reject::describe(f, step, restart_from.as_deref()),
        }
    }
}

/// The component of a typed name, as an [`Action`] holds it (the form's text).
fn named(component: &ComponentName) -> String {
    component.as_str().to_owned()
}

#[cfg(test)]
#[path = "preview_tests.rs"]
mod preview_tests;
