//! What an action writes on one batch, decided before anything is written: the [`Plan`]
//! (one [`Write`] and the line it will print) and the [`Context`] every action plans in.
//! Each action's own module makes its plan; this holds what they share, so none of them
//! depends on another's.

use std::fmt::Write as _;

use autocomp_model::{Agent, Batch, ComponentName, Event, EventType, NewEvent, Run};
use serde::Serialize;
use serde_json::{Map, Value};

use crate::operator::{OperatorError, Step};

/// What every action plans with, whatever the batch: the operator's checked input and the
/// pipeline.
pub(super) struct Context {
    /// The action's name ([`super::Action::name`]), recorded as `action` in the details.
    pub action: &'static str,
    /// Trimmed.
    pub reason: String,
    pub agent: Agent,
    pub pipeline: Vec<Step>,
}

impl Context {
    /// The details every operator event carries: what was done, by whom, and why, with
    /// `extra` (the action's own fields) beside them.
    pub fn details(&self, summary: String, extra: impl Serialize) -> Value {
        let mut details = Map::new();
        details.insert("action".into(), Value::from(self.action));
        details.insert("reason".into(), Value::from(self.reason.as_str()));
        details.insert("summary".into(), Value::from(summary));
        if let Ok(Value::Object(extra)) = serde_json::to_value(extra) {
            details.extend(extra);
        }
        Value::Object(details)
    }
}

/// An action on a component's result while it works would race its worker's own result.
pub(super) fn refuse_if_working<'s>(
    batch: &Batch,
    steps: impl IntoIterator<Item = &'s Step>,
    action: &str,
) -> Result<(), OperatorError> {
    for step in steps {
        if let Some(run) = batch.open_run(step.name()) {
            return Err(OperatorError::Refused(format!(
                "{} is working on {} (run {} held by {} on {} pid {} since {}): its result would race this {action}; \
                 `autocomp cancel {} --component {} --reason ...` first, or wait for it",
                step.name(),
                batch.id,
                run.generation,
                run.holder.agent,
                run.holder.host,
                run.holder.pid,
                run.started_at,
                batch.id,
                step.name(),
            )));
        }
    }
    Ok(())
}

/// One effective event a Reset supersedes, as its details record it.
#[derive(Serialize)]
pub(super) struct Superseded<'e> {
    #[serde(rename = "type")]
    event_type: &'e EventType,
    seq: autocomp_model::Seq,
    outcome: autocomp_model::Outcome,
    agent: &'e Agent,
}

/// The effective events a Reset of `types` supersedes, for the record.
pub(super) fn superseded<'b>(batch: &'b Batch, types: &[EventType]) -> Vec<Superseded<'b>> {
    let view = batch.effective();
    types
        .iter()
        .filter_map(|t| view.get(t))
        .map(|e| Superseded { event_type: &e.event_type, seq: e.seq, outcome: e.outcome, agent: &e.agent })
        .collect()
}

/// The one store call an action makes on one batch.
pub(super) enum Write {
    Append(NewEvent),
    /// Closes the component's open run, if any, in the transaction recording the event.
    Cancel(ComponentName, NewEvent),
    /// Sets the priority in the transaction recording the event.
    Prioritize(i32, NewEvent),
}

impl Write {
    pub fn event(&self) -> &NewEvent {
        match self {
            Write::Append(event) | Write::Cancel(_, event) | Write::Prioritize(_, event) => event,
        }
    }

    pub fn event_mut(&mut self) -> &mut NewEvent {
        match self {
            Write::Append(event) | Write::Cancel(_, event) | Write::Prioritize(_, event) => event,
        }
    }

    /// What it writes, for a plan token: `Reset/success/Checked,Audited`, `Probed/failure`,
    /// `Prioritized/success/priority=5`.
    pub fn describe(&self) -> String {
        let event = self.event();
        let mut out = format!("{}/{}", event.event_type, event.outcome.as_str());
        if !event.resets.is_empty() {
            let types: Vec<&str> = event.resets.iter().map(EventType::as_str).collect();
            write!(out, "/{}", types.join(",")).ok();
        }
        if let Write::Prioritize(priority, _) = self {
            write!(out, "/priority={priority}").ok();
        }
        out
    }
}

/// The line `perform` prints, from the event recorded and, for a cancel, the run it closed.
pub(super) type Message = Box<dyn FnOnce(&Event, Option<&Run>) -> String + Send>;

/// What an action writes on one batch, decided before anything is written.
pub(super) struct Plan {
    pub write: Write,
    pub message: Message,
}

impl Plan {
    pub fn new(
        write: Write,
        message: impl FnOnce(&Event, Option<&Run>) -> String + Send + 'static,
    ) -> Result<Plan, OperatorError> {
        // The store refuses an event that fails this; a preview must refuse it as well.
        write.event().validate()?;
        Ok(Plan { write, message: Box::new(message) })
    }
}
