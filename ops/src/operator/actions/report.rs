//! What an action did, as the operator reads it: [`ActionReport`] (text and JSON), the
//! state changes it made, and the one line naming an event. Apart because every action,
//! `add` and `event` answer with it.

use std::fmt::Write as _;

use autocomp_model::{Agent, Batch, BatchId, ComponentName, ComponentState, Event, EventType, Seq, Timestamp};
use autocomp_store::ObjectStore;
use serde::{Serialize, Serializer};
use serde_json::Value;

use crate::operator::views::Format;
use crate::operator::{OperatorError, Step};

/// A component whose state the action changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StateChange {
    pub component: ComponentName,
    pub before: ComponentState,
    pub after: ComponentState,
}

/// What an action did, for the operator to read. Its JSON: `batch`, `already_done`,
/// `event` (`seq`, `type`, `outcome`, `agent`, `at`, and `resets` with `supersedes` for a
/// Reset, `flags`), `changes`, `message`.
#[derive(Debug, Clone, Serialize)]
pub struct ActionReport {
    pub batch: BatchId,
    /// One line: what was recorded (type, seq, outcome; for a Reset the types it
    /// supersedes), or that the request was already done and at which seq.
    pub message: String,
    /// The event appended, if any (`add` registers a batch, no event); for a request already
    /// done, the event it recorded earlier.
    #[serde(serialize_with = "event_view")]
    pub event: Option<Event>,
    pub changes: Vec<StateChange>,
    /// The request's idempotency key was found in the batch's log: nothing was written now,
    /// `event` is what the earlier attempt recorded.
    pub already_done: bool,
}

impl ActionReport {
    pub fn render(&self) -> String {
        let mut out = format!("{}\n", self.message);
        write_changes(&mut out, &self.changes);
        out
    }

    pub fn render_as(&self, format: Format) -> String {
        match format {
            Format::Text => self.render(),
            Format::Json => json_of(self),
        }
    }
}

/// Pretty JSON ending in a newline, as every command prints it (keys in order: the views
/// go through a JSON value, whose map is ordered by key).
pub(crate) fn json_of(view: &impl Serialize) -> String {
    let value = serde_json::to_value(view).expect("a view serializes to JSON");
    crate::operator::views::json_document(&value)
}

/// `  checker: failed -> ready`, one line per change.
pub(super) fn write_changes(out: &mut String, changes: &[StateChange]) {
    for change in changes {
        writeln!(out, "  {}: {} -> {}", change.component, change.before, change.after).ok();
    }
}

/// What an event is, for an answer: everything but the details' free text.
#[derive(Serialize)]
struct EventView<'e> {
    seq: Seq,
    #[serde(rename = "type")]
    event_type: &'e EventType,
    outcome: autocomp_model::Outcome,
    agent: &'e Agent,
    at: Timestamp,
    flags: Vec<&'static str>,
    /// A Reset's: the types it supersedes.
    #[serde(skip_serializing_if = "Option::is_none")]
    resets: Option<&'e [EventType]>,
    /// A Reset's: the events it superseded, as its details recorded them.
    #[serde(skip_serializing_if = "Option::is_none")]
    supersedes: Option<Value>,
}

impl<'e> EventView<'e> {
    fn of(event: &'e Event) -> Self {
        let flags = OPERATOR_FLAGS.into_iter().chain(["transient"]).filter(|f| event.flag(f)).collect();
        let reset = event.event_type.is_reset();
        let supersedes = event.details.get("superseded").cloned().unwrap_or_else(|| Value::Array(Vec::new()));
        EventView {
            seq: event.seq,
            event_type: &event.event_type,
            outcome: event.outcome,
            agent: &event.agent,
            at: event.at,
            flags,
            resets: reset.then_some(event.resets.as_slice()),
            supersedes: reset.then_some(supersedes),
        }
    }
}

fn event_view<S: Serializer>(event: &Option<Event>, serializer: S) -> Result<S::Ok, S::Error> {
    event.as_ref().map(EventView::of).serialize(serializer)
}

/// The flags an operator's action sets on the event it records, which its answer names.
const OPERATOR_FLAGS: [&str; 5] = ["cancelled", "skipped", "acknowledged", "approved", "rejected"];

/// Exactly what an event is: `Reset (seq 12, success) superseding Checked, Audited`,
/// `Probed (seq 13, failure, flagged cancelled)`.
pub(super) fn wrote(event: &Event) -> String {
    let mut out = format!("{} (seq {}, {}", event.event_type, event.seq, event.outcome.as_str());
    for flag in OPERATOR_FLAGS {
        if event.flag(flag) {
            write!(out, ", flagged {flag}").ok();
        }
    }
    out.push(')');
    if !event.resets.is_empty() {
        let types: Vec<&str> = event.resets.iter().map(EventType::as_str).collect();
        write!(out, " superseding {}", types.join(", ")).ok();
    }
    out
}

pub(super) fn states(pipeline: &[Step], batch: &Batch) -> Vec<(ComponentName, ComponentState)> {
    pipeline.iter().map(|step| (step.name().clone(), step.state_of(batch))).collect()
}

pub(super) fn changes(
    before: &[(ComponentName, ComponentState)],
    after: &[(ComponentName, ComponentState)],
) -> Vec<StateChange> {
    before
        .iter()
        .zip(after)
        .filter(|((_, old), (_, new))| old != new)
        .map(|((component, before), (_, after))| StateChange {
            component: component.clone(),
            before: *before,
            after: *after,
        })
        .collect()
}

/// The state changes between `before` and the batch as the store holds it now.
pub(super) async fn changes_since(
    store: &dyn ObjectStore,
    pipeline: &[Step],
    before: &Batch,
) -> Result<Vec<StateChange>, OperatorError> {
    let after = store.get_batch(&before.id).await?;
    Ok(changes(&states(pipeline, before), &states(pipeline, &after)))
}
