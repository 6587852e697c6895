//! `autocomp reject`: a person's rejection at a human step: the step's failure flagged
//! `rejected`; with `--restart-from`, instead a Reset from that type (as `restart --from`)
//! flagged `rejected`, so the batch goes back to be redone and comes to the step again.

use std::fmt;

use autocomp_model::{Batch, ComponentName, EventType, NewEvent, Outcome};
use serde::Serialize;

use super::approve::refuse_unless_waiting_for_a_person;
use super::plan::{Context, Plan, Write, refuse_if_working, superseded};
use super::report::wrote;
use super::restart::{Span, restart_span};
use crate::operator::{OperatorError, Step};

pub(super) fn describe(f: &mut fmt::Formatter<'_>, step: &str, restart_from: Option<&str>) -> fmt::Result {
    match restart_from {
        None => write!(f, "reject {step}: record its failure (it stays failed until rerun)"),
        Some(start) => write!(
            f,
            "reject {step} and restart from {start}: supersede {start} and every result recorded after it, so the \
             batch is redone from there and comes to {step} again"
        ),
    }
}

/// A rejection at this human step, checked, and the type to restart from, if any.
pub(super) struct Reject {
    pub step: Step,
    pub restart_from: Option<EventType>,
}

#[derive(Serialize)]
struct Details<'b> {
    rejected: bool,
    component: &'b ComponentName,
    /// With a restart: where from and what it supersedes.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    span: Option<Span<'b>>,
}

impl Reject {
    pub fn plan(&self, context: &Context, batch: &Batch) -> Result<Plan, OperatorError> {
        let step = &self.step;
        refuse_unless_waiting_for_a_person(step, batch, context.action)?;
        match &self.restart_from {
            None => self.fail(context, batch),
            Some(start_type) => self.restart(context, batch, start_type),
        }
    }

    /// The step's failure: it stays failed until rerun.
    fn fail(&self, context: &Context, batch: &Batch) -> Result<Plan, OperatorError> {
        let step = &self.step;
        let summary = format!("rejected by {}: {}", context.agent, context.reason);
        let details = context.details(summary, Details { rejected: true, component: step.name(), span: None });
        let event =
            NewEvent::new(step.event_type().clone(), Outcome::Failure, context.agent.clone()).with_details(details);
        let (id, name) = (batch.id.clone(), step.name().clone());
        Plan::new(Write::Append(event), move |e, _| {
            format!("{id}: recorded {}: rejected at {name}; it stays failed until rerun", wrote(e))
        })
    }

    /// A Reset from `start_type`, so the batch is redone and comes to the step again.
    fn restart(&self, context: &Context, batch: &Batch, start_type: &EventType) -> Result<Plan, OperatorError> {
        let (step, agent) = (&self.step, &context.agent);
        let (start, types) = restart_span(batch, Some(start_type), "--restart-from")?;
        let steps = context.pipeline.iter().filter(|s| types.contains(s.event_type()));
        refuse_if_working(batch, steps, context.action)?;
        let summary = format!(
            "rejected at {} by {agent}, restart from {} (seq {}): {}",
            step.name(),
            start.event_type,
            start.seq,
            context.reason
        );
        let span = Span { from: &start.event_type, from_seq: start.seq, superseded: superseded(batch, &types) };
        let details = Details { rejected: true, component: step.name(), span: Some(span) };
        let event = NewEvent::reset(types, agent.clone(), context.details(summary, details));
        let (id, name, from_type) = (batch.id.clone(), step.name().clone(), start.event_type.clone());
        Plan::new(Write::Append(event), move |e, _| {
            format!(
                "{id}: recorded {}: rejected at {name}; restart from {from_type}: the batch is redone from there and \
                 comes to {name} again",
                wrote(e)
            )
        })
    }
}
