//! `autocomp skip`: records a success flagged `skipped` for the component, so the
//! components that require its event type may run. Over a success that counts (not skipped,
//! not stale) it is refused unless `force`.

use std::fmt;

use autocomp_model::{Agent, Batch, BatchId, ComponentName, NewEvent, Outcome, Seq};
use serde::Serialize;

use super::plan::{Context, Plan, Write, refuse_if_working};
use super::report::{ActionReport, wrote};
use super::{Action, named};
use crate::operator::{Operator, OperatorError, Step};

impl Operator {
    /// `autocomp skip` on batch `id` (refused over a success).
    pub async fn skip(
        &self,
        id: &BatchId,
        component: &ComponentName,
        reason: &str,
    ) -> Result<ActionReport, OperatorError> {
        self.perform(id, &Action::Skip { component: named(component), force: false }, reason).await
    }
}

pub(super) fn describe(f: &mut fmt::Formatter<'_>, component: &str, force: bool) -> fmt::Result {
    if force {
        write!(
            f,
            "skip {component}: record a skipped success so the steps after it may run (forced: even over a success)"
        )
    } else {
        write!(f, "skip {component}: record a skipped success so the steps after it may run")
    }
}

/// A skip of this component, checked.
pub(super) struct Skip {
    pub step: Step,
    pub force: bool,
}

#[derive(Serialize)]
struct Details<'b> {
    skipped: bool,
    component: &'b ComponentName,
    /// The success a forced skip records over.
    #[serde(skip_serializing_if = "Option::is_none")]
    forced_over: Option<Over<'b>>,
}

#[derive(Serialize)]
struct Over<'b> {
    seq: Seq,
    agent: &'b Agent,
}

impl Skip {
    pub fn plan(&self, context: &Context, batch: &Batch) -> Result<Plan, OperatorError> {
        let step = &self.step;
        refuse_if_working(batch, [step], context.action)?;
        // A success that counts: not an earlier skip, not worked out from content the batch
        // no longer has.
        let success = batch
            .effective()
            .get(step.event_type())
            .filter(|e| e.outcome == Outcome::Success && !e.is_skipped() && !e.is_stale_at(batch.modified_seq));
        if let Some(success) = success
            && !self.force
        {
            return Err(OperatorError::Refused(format!(
                "{} already succeeded on {}: its effective {} is a success (seq {}, by {}); a skip would record a \
                 skipped success over it; nothing recorded; --force skips anyway",
                step.name(),
                batch.id,
                success.event_type,
                success.seq,
                success.agent
            )));
        }
        let summary = format!("skipped by {}: {}", context.agent, context.reason);
        let forced_over = success.map(|e| Over { seq: e.seq, agent: &e.agent });
        let details = context.details(summary, Details { skipped: true, component: step.name(), forced_over });
        let event =
            NewEvent::new(step.event_type().clone(), Outcome::Success, context.agent.clone()).with_details(details);
        let (id, name, over) = (batch.id.clone(), step.name().clone(), success.map(|e| e.seq));
        Plan::new(Write::Append(event), move |e, _| match over {
            Some(over) => format!(
                "{id}: recorded {} over {name}'s success (seq {over}), as forced: the steps after {name} may run",
                wrote(e)
            ),
            None => format!("{id}: recorded {}: the steps after {name} may run", wrote(e)),
        })
    }
}
