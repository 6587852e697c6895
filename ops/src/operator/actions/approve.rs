//! `autocomp approve`: a person's approval at a human step (a manual component) the batch
//! waits at, recorded as the step's success flagged `approved`. Also what a human step's
//! decisions share (`reject` is the other).

use std::fmt;

use autocomp_model::{Batch, ComponentName, ComponentState, InvalidInput, NewEvent, Outcome};
use serde::Serialize;

use super::plan::{Context, Plan, Write};
use super::report::wrote;
use crate::operator::{OperatorError, Step};

pub(super) fn describe(f: &mut fmt::Formatter<'_>, step: &str) -> fmt::Result {
    write!(f, "approve {step}: record its success, so the steps after it may run")
}

/// An approval at this human step, checked.
pub(super) struct Approve(pub Step);

#[derive(Serialize)]
struct Details<'s> {
    approved: bool,
    component: &'s ComponentName,
}

impl Approve {
    pub fn plan(&self, context: &Context, batch: &Batch) -> Result<Plan, OperatorError> {
        let step = &self.0;
        refuse_unless_waiting_for_a_person(step, batch, context.action)?;
        let summary = format!("approved by {}: {}", context.agent, context.reason);
        let details = context.details(summary, Details { approved: true, component: step.name() });
        let event =
            NewEvent::new(step.event_type().clone(), Outcome::Success, context.agent.clone()).with_details(details);
        let (id, name) = (batch.id.clone(), step.name().clone());
        Plan::new(Write::Append(event), move |e, _| {
            format!("{id}: recorded {}: approved at {name}; the steps after it may run", wrote(e))
        })
    }
}

/// `step` if it is a human step (a manual component), else an input error naming it.
pub(super) fn human_step(step: Step) -> Result<Step, OperatorError> {
    if step.descriptor().manual {
        return Ok(step);
    }
    Err(InvalidInput::new(
        "step",
        step.name().as_str(),
        "not a human step: a component works on it (`autocomp step add` declares a step a person decides)",
    )
    .into())
}

/// A human step's decision needs the batch to be waiting for a person there.
pub(super) fn refuse_unless_waiting_for_a_person(
    step: &Step,
    batch: &Batch,
    action: &str,
) -> Result<(), OperatorError> {
    let state = step.state_of(batch);
    if state == ComponentState::Person {
        return Ok(());
    }
    Err(OperatorError::Refused(format!(
        "{} is not waiting for a person at {} (it is {state}); nothing recorded (an {action} decides a batch the step \
         is ready for)",
        batch.id,
        step.name()
    )))
}
