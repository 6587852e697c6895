//! `autocomp restart`: a Reset marker for the starting type and every type whose effective
//! event was recorded after it (a higher seq): the steps that ran after the starting point
//! trigger again, in the order their requirements allow. Operator bookkeeping
//! (`Prioritized`) is left alone.

use std::fmt;

use autocomp_model::{Batch, BatchId, Event, EventType, InvalidInput, NewEvent, Outcome, Seq};
use serde::Serialize;

use super::plan::{Context, Plan, Superseded, Write, refuse_if_working, superseded};
use super::report::{ActionReport, wrote};
use super::{Action, RestartFrom};
use crate::operator::{Operator, OperatorError, PRIORITIZED};

impl Operator {
    /// `autocomp restart` on batch `id`.
    pub async fn restart(&self, id: &BatchId, from: RestartFrom, reason: &str) -> Result<ActionReport, OperatorError> {
        self.perform(id, &Action::Restart { from }, reason).await
    }
}

pub(super) fn describe(f: &mut fmt::Formatter<'_>, from: &RestartFrom) -> fmt::Result {
    match from {
        RestartFrom::FirstFailure => {
            f.write_str("restart from the first failure: supersede it and every result recorded after it")
        }
        RestartFrom::Type(start) => write!(f, "restart from {start}: supersede it and every result recorded after it"),
    }
}

/// The starting type as `field` (`--from`, `--restart-from`) names it, checked before the
/// store is touched.
pub(super) fn start_type(text: &str, field: &str) -> Result<EventType, InvalidInput> {
    EventType::new(text).map_err(|e| InvalidInput::new(field, text, e.reason))
}

/// A restart, checked: from this type's effective event, or (`None`) the first failure.
pub(super) struct Restart(pub Option<EventType>);

/// The details a restart's Reset records besides the reason (a reject's adds its own).
#[derive(Serialize)]
pub(super) struct Span<'b> {
    pub from: &'b EventType,
    pub from_seq: Seq,
    pub superseded: Vec<Superseded<'b>>,
}

impl Restart {
    pub fn plan(&self, context: &Context, batch: &Batch) -> Result<Plan, OperatorError> {
        let agent = &context.agent;
        let (start, types) = restart_span(batch, self.0.as_ref(), "--from")?;
        let steps = context.pipeline.iter().filter(|s| types.contains(s.event_type()));
        refuse_if_working(batch, steps, context.action)?;
        let summary =
            format!("restart from {} (seq {}) requested by {agent}: {}", start.event_type, start.seq, context.reason);
        let span = Span { from: &start.event_type, from_seq: start.seq, superseded: superseded(batch, &types) };
        let event = NewEvent::reset(types, agent.clone(), context.details(summary, span));
        let (id, from_type, from_seq) = (batch.id.clone(), start.event_type.clone(), start.seq);
        Plan::new(Write::Append(event), move |e, _| {
            format!(
                "{id}: recorded {}: restart from {from_type} (seq {from_seq}) and everything recorded after it",
                wrote(e)
            )
        })
    }
}

/// Where a restart starts on `batch` (the effective event of `start_type`, or the first
/// effective failure) and the types it supersedes: that one and every type recorded after it,
/// operator bookkeeping (`Prioritized`) left alone. `field` names the option for errors.
pub(super) fn restart_span<'b>(
    batch: &'b Batch,
    start_type: Option<&EventType>,
    field: &str,
) -> Result<(&'b Event, Vec<EventType>), OperatorError> {
    let view = batch.effective();
    let bookkeeping = |e: &&Event| e.event_type.as_str() != PRIORITIZED;
    let start = match start_type {
        Some(start_type) => view.get(start_type).ok_or_else(|| {
            let text = start_type.as_str();
            let effective: Vec<&str> = view.iter().map(|e| e.event_type.as_str()).collect();
            InvalidInput::new(
                field,
                text,
                format!("batch {} has no effective {text} event (effective: {})", batch.id, effective.join(", ")),
            )
        })?,
        None => view
            .iter()
            .filter(bookkeeping)
            .filter(|e| e.outcome == Outcome::Failure)
            .min_by_key(|e| e.seq)
            .ok_or_else(|| OperatorError::Refused(format!("{} has no failed step to restart from", batch.id)))?,
    };
    let mut after: Vec<&Event> = view.iter().filter(bookkeeping).filter(|e| e.seq >= start.seq).collect();
    after.sort_by_key(|e| e.seq);
    Ok((start, after.iter().map(|e| e.event_type.clone()).collect()))
}
