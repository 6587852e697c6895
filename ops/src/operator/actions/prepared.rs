//! An action checked against everything but a batch ([`Prepared`]), ready to be planned on
//! any number of batches: each action's checked input ([`Target`]) plans itself.

use std::sync::Arc;

use autocomp_model::{Batch, EventType};
use autocomp_store::ObjectStore;

use super::acknowledge::Acknowledge;
use super::approve::{Approve, human_step};
use super::cancel::Cancel;
use super::plan::{Context, Plan};
use super::prioritize::Prioritize;
use super::reject::Reject;
use super::rerun::Rerun;
use super::restart::{Restart, start_type};
use super::skip::Skip;
use super::{Action, RestartFrom};
use crate::operator::{Operator, OperatorError, Step, check_reason};

/// An action checked against everything but a batch.
pub(super) struct Prepared {
    pub action: Action,
    pub target: Target,
    pub context: Context,
    pub store: Arc<dyn ObjectStore>,
}

/// The action's checked input.
pub(super) enum Target {
    Rerun(Rerun),
    Restart(Restart),
    Cancel(Cancel),
    Skip(Skip),
    Acknowledge(Acknowledge),
    Prioritize(Prioritize),
    Approve(Approve),
    Reject(Reject),
}

impl Prepared {
    /// Every check that does not depend on the batch, in the order the CLI has always made
    /// them, so the same bad input gets the same error whichever check it fails first.
    pub async fn new(operator: &Operator, action: &Action, reason: &str) -> Result<Arc<Prepared>, OperatorError> {
        let reason = check_reason(reason)?.to_owned();
        let agent = operator.agent()?;
        // The starting type is checked before the store is touched.
        let start = match action {
            Action::Restart { from: RestartFrom::Type(text) } => Some(start_type(text, "--from")?),
            Action::Reject { restart_from: Some(text), .. } => Some(start_type(text, "--restart-from")?),
            _ => None,
        };
        let store = operator.store().await?;
        let pipeline = operator.pipeline(store.as_ref()).await?;
        let target = Target::of(operator, &pipeline, action, start)?;
        let context = Context { action: action.name(), reason, agent, pipeline };
        Ok(Arc::new(Prepared { action: action.clone(), target, context, store }))
    }

    /// What the prepared action writes on `batch`, or why it is refused: for `perform` and
    /// `preview` alike.
    pub fn plan(&self, batch: &Batch) -> Result<Plan, OperatorError> {
        let context = &self.context;
        crate::operator::retention::refuse_if_pruned(batch, context.action)?;
        match &self.target {
            Target::Rerun(rerun) => rerun.plan(context, batch),
            Target::Restart(restart) => restart.plan(context, batch),
            Target::Cancel(cancel) => cancel.plan(context, batch),
            Target::Skip(skip) => skip.plan(context, batch),
            Target::Acknowledge(acknowledge) => acknowledge.plan(context, batch),
            Target::Prioritize(prioritize) => prioritize.plan(context, batch),
            Target::Approve(approve) => approve.plan(context, batch),
            Target::Reject(reject) => reject.plan(context, batch),
        }
    }
}

impl Target {
    /// The action's component (or human step) found in the pipeline, with `start`, its
    /// starting type, if it has one.
    fn of(
        operator: &Operator,
        pipeline: &[Step],
        action: &Action,
        start: Option<EventType>,
    ) -> Result<Target, OperatorError> {
        let step = |component: &str| operator.step(pipeline, component).cloned();
        // A decision names a human step: an unknown one is the `step` field's error.
        let human = |name: &str| match step(name) {
            Err(OperatorError::Input(mut input)) => {
                input.field = "step".into();
                Err(OperatorError::Input(input))
            }
            other => other.and_then(human_step),
        };
        Ok(match action {
            Action::Rerun { component } => Target::Rerun(Rerun(step(component)?)),
            Action::Restart { .. } => Target::Restart(Restart(start)),
            Action::Cancel { component, record_anyway } => {
                Target::Cancel(Cancel { step: step(component)?, record_anyway: *record_anyway })
            }
            Action::Skip { component, force } => Target::Skip(Skip { step: step(component)?, force: *force }),
            Action::Acknowledge { component } => Target::Acknowledge(Acknowledge(step(component)?)),
            Action::Prioritize { priority } => Target::Prioritize(Prioritize(*priority)),
            Action::Approve { step: name } => Target::Approve(Approve(human(name)?)),
            Action::Reject { step: name, .. } => Target::Reject(Reject { step: human(name)?, restart_from: start }),
        })
    }
}
