//! What an action would do to one batch ([`ActionPreview`]), computed from the same plan
//! `perform` carries out, with nothing written: the CLI's `--dry-run` and the monitor's
//! preview page.

use std::fmt::Write as _;

use autocomp_model::{Batch, BatchId, EventType, Outcome, Run, RunState, Seq};
use serde::Serialize;

use super::Action;
use super::confirm::PlanToken;
use super::plan::{Plan, Write};
use super::prepared::Prepared;
use super::report::{StateChange, changes, json_of, states, write_changes};
use crate::operator::views::Format;
use crate::operator::{Operator, OperatorError};

/// What an action would do to one batch, computed from the same plan `perform` carries out,
/// with nothing written. Its JSON has these fields, by these names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ActionPreview {
    pub batch: BatchId,
    /// The action, in one line (`Action`'s `Display`).
    pub action: String,
    /// The event type it would append (`Reset`, the component's type, `Prioritized`).
    pub records: String,
    /// The outcome of the event it would append.
    pub outcome: Outcome,
    /// The types a `Reset` would supersede; empty for the other actions.
    pub resets: Vec<EventType>,
    /// The components whose state would change. `perform` reports the same changes unless
    /// the batch changes in between (or a `settled_for` clause comes due meanwhile).
    pub changes: Vec<StateChange>,
    /// The message `perform` would print, with the seq the store would assign next if
    /// nothing else were written first.
    pub message: String,
    /// The batch's version the plan was made against: its `changed_seq`, which every event,
    /// claim and release moves (what the CLI's `--expect-version` compares).
    pub version: Seq,
    /// The plan token: the version and the planned write, for a confirm to post back
    /// ([`Operator::perform_confirmed`] acts only if both are unchanged).
    pub plan: String,
}

impl ActionPreview {
    /// The CLI's `--dry-run`: what it would record, the state changes, the version.
    pub fn render_as(&self, format: Format) -> String {
        match format {
            Format::Json => json_of(self),
            Format::Text => {
                let mut out = format!("dry run, nothing written: {}\nit would say: {}\n", self.action, self.message);
                write_changes(&mut out, &self.changes);
                writeln!(
                    out,
                    "batch version {0}: add `--expect-version {0}` to act only if {1} has not changed since",
                    self.version, self.batch
                )
                .ok();
                out
            }
        }
    }
}

impl Operator {
    /// What `perform` would do to batch `id`, or its refusal in the same words; writes
    /// nothing. The changes are the planned event applied to a copy of the batch.
    pub async fn preview(&self, id: &BatchId, action: &Action, reason: &str) -> Result<ActionPreview, OperatorError> {
        let prepared = Prepared::new(self, action, reason).await?;
        let batch = prepared.store.get_batch(id).await?;
        let plan = prepared.plan(&batch)?;
        let head = prepared.store.head().await?;
        Ok(prepared.preview(&batch, plan, Seq(head.0 + 1)))
    }
}

impl Prepared {
    /// The plan applied to a copy of the batch as the store applies it, the event recorded
    /// as `seq` at the batch's store clock.
    pub fn preview(&self, batch: &Batch, plan: Plan, seq: Seq) -> ActionPreview {
        // The effective view needs the log in seq order, whatever seq the caller expected.
        let last = batch.events.last().map_or(batch.changed_seq, |e| e.seq.max(batch.changed_seq));
        let seq = seq.max(Seq(last.0 + 1));
        let token = PlanToken::new(batch.changed_seq, &plan.write);
        let event = plan.write.event().clone().recorded(&batch.id, seq, batch.as_of);
        let mut after = batch.clone();
        let mut closed = None;
        match &plan.write {
            Write::Append(_) => {}
            Write::Cancel(component, _) => {
                closed = batch.open_run(component).map(|run| Run {
                    state: RunState::Cancelled,
                    ended_at: Some(batch.as_of),
                    ..run.clone()
                });
                after.open_runs.retain(|run| run.component != *component);
            }
            Write::Prioritize(priority, _) => after.priority = *priority,
        }
        after.events.push(event.clone());
        after.changed_seq = seq;
        let pipeline = &self.context.pipeline;
        ActionPreview {
            batch: batch.id.clone(),
            action: self.action.to_string(),
            records: event.event_type.to_string(),
            outcome: event.outcome,
            resets: event.resets.clone(),
            changes: changes(&states(pipeline, batch), &states(pipeline, &after)),
            message: (plan.message)(&event, closed.as_ref()),
            version: batch.changed_seq,
            plan: token.to_string(),
        }
    }
}
