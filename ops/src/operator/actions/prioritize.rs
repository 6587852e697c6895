//! `autocomp prioritize`: the new priority and a `Prioritized` event saying who and why, in
//! one transaction. Higher runs first. Like any event it counts as activity, so it can hold
//! back a component waiting for the batch to settle (`settled_for`).

use std::fmt;

use autocomp_model::{Batch, BatchId, EventType, NewEvent, Outcome};

use super::Action;
use super::plan::{Context, Plan, Write};
use super::report::{ActionReport, wrote};
use crate::operator::{Operator, OperatorError, PRIORITIZED};

impl Operator {
    /// `autocomp prioritize` on batch `id`.
    pub async fn prioritize(&self, id: &BatchId, priority: i32, reason: &str) -> Result<ActionReport, OperatorError> {
        self.perform(id, &Action::Prioritize { priority }, reason).await
    }
}

pub(super) fn describe(f: &mut fmt::Formatter<'_>, priority: i32) -> fmt::Result {
    write!(f, "prioritize: set the priority to {priority} (higher runs first)")
}

/// A new priority.
pub(super) struct Prioritize(pub i32);

/// A prioritize records no details besides the reason.
#[derive(serde::Serialize)]
struct NoDetails {}

impl Prioritize {
    pub fn plan(&self, context: &Context, batch: &Batch) -> Result<Plan, OperatorError> {
        let (priority, previous) = (self.0, batch.priority);
        let summary = format!("priority {previous} -> {priority} by {}: {}", context.agent, context.reason);
        let event = NewEvent::new(EventType::new(PRIORITIZED)?, Outcome::Success, context.agent.clone())
            .with_details(context.details(summary, NoDetails {}));
        let id = batch.id.clone();
        Plan::new(Write::Prioritize(priority, event), move |e, _| {
            format!("{id}: recorded {}: priority {previous} -> {priority}", wrote(e))
        })
    }
}
