//! `autocomp cancel`: fences the component's running worker (its run is closed as
//! cancelled and the claim generation bumped, in the store, in the same transaction as the
//! recorded failure flagged `cancelled`). The worker notices within a second, stops, and
//! cannot record anything. With no open run it is refused unless `record_anyway`.

use std::fmt;

use autocomp_model::{Batch, BatchId, ComponentName, NewEvent, Outcome, Run};
use serde::Serialize;

use super::plan::{Context, Plan, Write};
use super::report::{ActionReport, wrote};
use super::{Action, named};
use crate::operator::{Operator, OperatorError, Step};

impl Operator {
    /// `autocomp cancel` on batch `id` (refused with no open run).
    pub async fn cancel(
        &self,
        id: &BatchId,
        component: &ComponentName,
        reason: &str,
    ) -> Result<ActionReport, OperatorError> {
        self.perform(id, &Action::Cancel { component: named(component), record_anyway: false }, reason).await
    }
}

pub(super) fn describe(f: &mut fmt::Formatter<'_>, component: &str, record_anyway: bool) -> fmt::Result {
    if record_anyway {
        write!(
            f,
            "cancel {component}: stop its running worker, if any, and record a cancelled failure (even with no \
             worker running)"
        )
    } else {
        write!(f, "cancel {component}: stop its running worker and record a cancelled failure")
    }
}

/// A cancel of this component's run, checked.
pub(super) struct Cancel {
    pub step: Step,
    pub record_anyway: bool,
}

#[derive(Serialize)]
struct Details<'s> {
    cancelled: bool,
    component: &'s ComponentName,
}

impl Cancel {
    pub fn plan(&self, context: &Context, batch: &Batch) -> Result<Plan, OperatorError> {
        let (id, name) = (batch.id.clone(), self.step.name().clone());
        let open = batch.open_run(&name);
        if open.is_none() && !self.record_anyway {
            return Err(OperatorError::Refused(format!(
                "{name} has no open run on {id}: nothing to cancel; --record-anyway records a cancelled failure anyway"
            )));
        }
        let summary = format!("cancelled by {}: {}", context.agent, context.reason);
        let details = context.details(summary, Details { cancelled: true, component: &name });
        let event = NewEvent::new(self.step.event_type().clone(), Outcome::Failure, context.agent.clone())
            .with_details(details);
        let planned_a_run = open.is_some();
        Plan::new(Write::Cancel(name.clone(), event), move |e, run| message(&id, &name, planned_a_run, e, run))
    }
}

/// What a cancel says: the run it closed, or why none was.
fn message(
    id: &BatchId,
    name: &ComponentName,
    planned_a_run: bool,
    event: &autocomp_model::Event,
    run: Option<&Run>,
) -> String {
    match run {
        Some(run) => format!(
            "{id}: recorded {}: cancelled run {} of {name} (held by {} on {} pid {} since {}); the worker is fenced \
             and stops within seconds",
            wrote(event),
            run.generation,
            run.holder.agent,
            run.holder.host,
            run.holder.pid,
            run.started_at,
        ),
        None if planned_a_run => format!(
            "{id}: recorded {}: {name}'s run ended before the cancel reached the store, so no run was cancelled; the \
             failure is recorded all the same",
            wrote(event)
        ),
        None => format!("{id}: recorded {}: {name} had no open run; recorded anyway as asked", wrote(event)),
    }
}
