//! `autocomp acknowledge`: an operator closes out a component's failure (a failed run, a
//! cancel, a give-up or a person's rejection at a human step): the same failure recorded
//! again flagged `acknowledged`, who and why, with the failure it closes. It stays a failure
//! (what requires the type still waits) but leaves "Needs a person", `alerts` and the failed
//! counts for the state `acknowledged`; a rerun opens it again, as for any failure.

use std::fmt;

use autocomp_model::{Agent, Batch, ComponentName, NewEvent, Outcome, Seq};
use serde::Serialize;

use super::plan::{Context, Plan, Write, refuse_if_working};
use super::report::wrote;
use crate::operator::{OperatorError, Step};

pub(super) fn describe(f: &mut fmt::Formatter<'_>, component: &str) -> fmt::Result {
    write!(
        f,
        "acknowledge {component}'s failure: close it out (it stays a failure, needs nobody; a rerun opens it again)"
    )
}

/// An acknowledgement of this component's failure, checked.
pub(super) struct Acknowledge(pub Step);

#[derive(Serialize)]
struct Details<'b> {
    acknowledged: bool,
    component: &'b ComponentName,
    /// The failure it closes out.
    acknowledges: Closed<'b>,
    /// The content the failure was worked out from, kept: new content still makes the step
    /// stale, to be redone, as it would the failure itself.
    #[serde(skip_serializing_if = "Option::is_none")]
    content_seq: Option<i64>,
}

#[derive(Serialize)]
struct Closed<'b> {
    seq: Seq,
    agent: &'b Agent,
    /// Its reason, so the close-out says what it closed without the older event.
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
}

impl Acknowledge {
    pub fn plan(&self, context: &Context, batch: &Batch) -> Result<Plan, OperatorError> {
        let step = &self.0;
        refuse_if_working(batch, [step], context.action)?;
        let view = batch.effective();
        let effective = view.get(step.event_type());
        let failure = match effective {
            Some(event) if event.is_stale_at(batch.modified_seq) => {
                return Err(OperatorError::Refused(format!(
                    "{}'s result on {} (seq {}) was worked out from content the batch no longer has: the step is \
                     redone by itself; nothing recorded",
                    step.name(),
                    batch.id,
                    event.seq
                )));
            }
            Some(event) if event.is_transient_failure() && step.retry_trigger().is_some() => {
                return Err(OperatorError::Refused(format!(
                    "{}'s failure on {} (seq {}) is transient and retried by itself; acknowledge it once it has \
                     given up (or pause {} to stop the retries); nothing recorded",
                    step.name(),
                    batch.id,
                    event.seq,
                    step.name()
                )));
            }
            Some(event) if event.outcome == Outcome::Failure && !event.is_acknowledged() => event,
            Some(event) if event.is_acknowledged() => {
                return Err(OperatorError::Refused(format!(
                    "{}'s failure on {} is acknowledged already (seq {}, by {}); nothing recorded",
                    step.name(),
                    batch.id,
                    event.seq,
                    event.agent
                )));
            }
            _ => {
                let what = effective.map_or("no result".to_owned(), |event| {
                    format!("a {} (seq {})", event.outcome.as_str(), event.seq)
                });
                return Err(OperatorError::Refused(format!(
                    "{} has no failure on {} to acknowledge: its effective {} is {what}; nothing recorded",
                    step.name(),
                    batch.id,
                    step.event_type()
                )));
            }
        };
        let reason = failure.failure_text().map(|text| autocomp_toolkit::terminal::one_line(&text).into_owned());
        let summary = match &reason {
            Some(was) => format!(
                "acknowledged by {}: {} (the failure at seq {}: {was})",
                context.agent, context.reason, failure.seq
            ),
            None => {
                format!("acknowledged by {}: {} (the failure at seq {})", context.agent, context.reason, failure.seq)
            }
        };
        let closed = Closed { seq: failure.seq, agent: &failure.agent, reason };
        let content_seq = failure.content_seq().map(|seq| seq.0);
        let details = Details { acknowledged: true, component: step.name(), acknowledges: closed, content_seq };
        let details = context.details(summary, details);
        let event =
            NewEvent::new(step.event_type().clone(), Outcome::Failure, context.agent.clone()).with_details(details);
        let (id, name, over) = (batch.id.clone(), step.name().clone(), failure.seq);
        Plan::new(Write::Append(event), move |e, _| {
            format!(
                "{id}: recorded {}: {name}'s failure (seq {over}) is closed out; `autocomp rerun {id} --component \
                 {name} --reason ...` opens it again",
                wrote(e)
            )
        })
    }
}
