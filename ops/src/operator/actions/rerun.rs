//! `autocomp rerun`: a Reset marker for the component's event type, so its trigger holds
//! again (if its requirements do). Nothing else changes.

use std::fmt;

use autocomp_model::{Batch, BatchId, ComponentName, NewEvent};
use serde::Serialize;

use super::plan::{Context, Plan, Superseded, Write, refuse_if_working, superseded};
use super::report::{ActionReport, wrote};
use super::{Action, named};
use crate::operator::{Operator, OperatorError, Step};

impl Operator {
    /// `autocomp rerun` on batch `id`.
    pub async fn rerun(
        &self,
        id: &BatchId,
        component: &ComponentName,
        reason: &str,
    ) -> Result<ActionReport, OperatorError> {
        self.perform(id, &Action::Rerun { component: named(component) }, reason).await
    }
}

pub(super) fn describe(f: &mut fmt::Formatter<'_>, component: &str) -> fmt::Result {
    write!(f, "rerun {component}: supersede its result so it runs again")
}

/// A rerun of this component, checked.
pub(super) struct Rerun(pub Step);

/// The details a rerun's Reset records besides the reason.
#[derive(Serialize)]
struct Details<'b> {
    component: &'b ComponentName,
    superseded: Vec<Superseded<'b>>,
}

impl Rerun {
    pub fn plan(&self, context: &Context, batch: &Batch) -> Result<Plan, OperatorError> {
        let (step, agent) = (&self.0, &context.agent);
        refuse_if_working(batch, [step], context.action)?;
        if batch.effective().get(step.event_type()).is_none() {
            return Err(OperatorError::Refused(format!(
                "{} has no {} result on {} to rerun (it is {}); nothing recorded",
                step.name(),
                step.event_type(),
                batch.id,
                step.state_of(batch)
            )));
        }
        let types = vec![step.event_type().clone()];
        let summary = format!("rerun of {} requested by {agent}: {}", step.name(), context.reason);
        let details = Details { component: step.name(), superseded: superseded(batch, &types) };
        let event = NewEvent::reset(types, agent.clone(), context.details(summary, details));
        let (id, name) = (batch.id.clone(), step.name().clone());
        Plan::new(Write::Append(event), move |e, _| format!("{id}: recorded {}: {name} may run again", wrote(e)))
    }
}
