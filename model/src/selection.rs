//! Selections: which batches a monitor page, a count or an export is about, as a boolean
//! expression over what the batch index holds for each batch. `matches_at` is the meaning;
//! the index translates the same expression into its own query and must agree with it.
//! A component's states (ready, working, failed, ...) are selections too, built from its
//! descriptor, so a count by state is one index query and equals `state_of` batch by batch.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{
    BatchFacts, BatchSummary, BatchType, ComponentDescriptor, ComponentName, ComponentState, EventType, Outcome,
    SummaryAt, Timestamp, Trigger,
};

/// A set of batches. Every leaf is something the batch index stores per batch; `Trigger`
/// is the trigger predicate itself, so readiness needs no second definition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "json-schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Selection {
    All,
    /// The trigger holds at the given time.
    #[serde(deserialize_with = "Trigger::deserialize_object")]
    Trigger(Trigger),
    /// The component has an open run on the batch.
    Running(ComponentName),
    /// The type's effective event exists and is current (not stale), whatever its outcome.
    Present(EventType),
    /// The type's effective event is current and succeeded.
    Succeeded(EventType),
    /// The type's effective event is current and failed.
    Failed(EventType),
    /// The type's effective event is current and a failure flagged transient.
    TransientlyFailed(EventType),
    /// The type's effective event is current and a success recorded by `skip`.
    Skipped(EventType),
    /// The type's effective event is current and a failure closed out by `acknowledge`.
    Acknowledged(EventType),
    /// The type's effective event is stale: worked out from content the batch no longer has.
    Stale(EventType),
    BatchType(BatchType),
    /// The batch id starts with this text.
    IdPrefix(String),
    /// Priority within the bounds (both inclusive).
    Priority {
        min: Option<i32>,
        max: Option<i32>,
    },
    /// No content change and no event for at least this long ("in its state for at least
    /// this long"), measured at the time the selection is evaluated.
    #[serde(with = "super::duration_text")]
    #[cfg_attr(feature = "json-schema", schemars(with = "crate::schema::DurationText"))]
    QuietFor(Duration),
    And(Vec<Selection>),
    Or(Vec<Selection>),
    Not(Box<Selection>),
}

impl Selection {
    pub fn nothing() -> Selection {
        Selection::Or(Vec::new())
    }

    pub fn and(self, other: Selection) -> Selection {
        match (self, other) {
            (Selection::All, other) | (other, Selection::All) => other,
            (Selection::And(mut left), Selection::And(right)) => {
                left.extend(right);
                Selection::And(left)
            }
            (Selection::And(mut left), other) => {
                left.push(other);
                Selection::And(left)
            }
            (one, other) => Selection::And(vec![one, other]),
        }
    }

    pub fn negate(self) -> Selection {
        match self {
            Selection::Not(inner) => *inner,
            other => Selection::Not(Box::new(other)),
        }
    }

    /// Whether the batch is selected, with `now` the store time time-based clauses use.
    pub fn matches_at(&self, batch: &impl BatchFacts, now: Timestamp) -> bool {
        self.matches_in(&batch.facts(), now)
    }

    fn matches_in(&self, batch: &BatchSummary, now: Timestamp) -> bool {
        let current = |t: &EventType| batch.current_of(t);
        match self {
            Selection::All => true,
            Selection::Trigger(trigger) => trigger.matches_at(&SummaryAt { summary: batch, at: now }, now),
            Selection::Running(component) => batch.running.contains(component),
            Selection::Present(t) => current(t).is_some(),
            Selection::Succeeded(t) => current(t).is_some_and(|e| e.outcome == Outcome::Success),
            Selection::Failed(t) => current(t).is_some_and(|e| e.outcome == Outcome::Failure),
            Selection::TransientlyFailed(t) => current(t).is_some_and(|e| e.transient),
            Selection::Skipped(t) => current(t).is_some_and(|e| e.skipped),
            Selection::Acknowledged(t) => current(t).is_some_and(|e| e.acknowledged),
            Selection::Stale(t) => batch.stale_of(t).is_some(),
            Selection::BatchType(t) => batch.batch_type == *t,
            Selection::IdPrefix(prefix) => batch.id.as_str().starts_with(prefix.as_str()),
            Selection::Priority { min, max } => {
                min.is_none_or(|min| batch.priority >= min) && max.is_none_or(|max| batch.priority <= max)
            }
            Selection::QuietFor(quiet) => now.since(batch.last_activity) >= *quiet,
            Selection::And(all) => all.iter().all(|s| s.matches_in(batch, now)),
            Selection::Or(any) => any.iter().any(|s| s.matches_in(batch, now)),
            Selection::Not(inner) => !inner.matches_in(batch, now),
        }
    }

    /// The batches where `descriptor`'s component is in `state`: exactly those for which
    /// `descriptor.state_of(batch) == state` when read at `now`.
    pub fn component_state(descriptor: &ComponentDescriptor, state: ComponentState) -> Selection {
        let own = &descriptor.event_type;
        let working = Selection::Running(descriptor.name.clone());
        let ready = readiness(descriptor);
        let idle = working.clone().negate();
        let retried = descriptor.retry_trigger().is_some();
        let stale = Selection::Stale(own.clone());
        match state {
            ComponentState::Working => working,
            ComponentState::Stale => idle.and(stale),
            ComponentState::Skipped => idle.and(Selection::Skipped(own.clone())),
            ComponentState::Success => {
                idle.and(Selection::Succeeded(own.clone())).and(Selection::Skipped(own.clone()).negate())
            }
            // A human step's ready batches wait for a person; no pass works on them.
            ComponentState::Ready | ComponentState::Person
                if (state == ComponentState::Person) != descriptor.manual =>
            {
                Selection::nothing()
            }
            ComponentState::Ready | ComponentState::Person => {
                idle.and(Selection::Succeeded(own.clone()).negate()).and(stale.negate()).and(ready)
            }
            ComponentState::Retrying if retried => {
                idle.and(Selection::TransientlyFailed(own.clone())).and(ready.negate())
            }
            ComponentState::Retrying => Selection::nothing(),
            ComponentState::Failed | ComponentState::Acknowledged => {
                let mut failed = idle.and(Selection::Failed(own.clone())).and(ready.negate());
                if retried {
                    failed = failed.and(Selection::TransientlyFailed(own.clone()).negate());
                }
                let acknowledged = Selection::Acknowledged(own.clone());
                match state {
                    ComponentState::Acknowledged => failed.and(acknowledged),
                    _ => failed.and(acknowledged.negate()),
                }
            }
            ComponentState::Waiting => {
                idle.and(Selection::Present(own.clone()).negate()).and(stale.negate()).and(ready.negate())
            }
        }
    }
}

/// The batches a pass of the component would work on (its trigger, or the retry of its own
/// transient failure): `ComponentDescriptor::readiness` as a selection.
fn readiness(descriptor: &ComponentDescriptor) -> Selection {
    if descriptor.source {
        return Selection::nothing();
    }
    let trigger = Selection::Trigger(descriptor.trigger.clone());
    match descriptor.retry_trigger() {
        Some(retry) => Selection::Or(vec![trigger, Selection::Trigger(retry)]),
        None => trigger,
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::json;

    use super::*;
    use crate::fixtures::{batch, descriptor, event};
    use crate::{Run, RunHolder, RunState, Seq};

    const TYPES: [&str; 3] = ["Checksums_Verified", "Pages_Counted", "Data_Archived"];
    const NOW: i64 = 1_000_000_000;

    fn open_run(component: &ComponentName) -> Run {
        Run {
            batch_id: crate::BatchId::new("B1").unwrap(),
            component: component.clone(),
            generation: 1,
            holder: RunHolder {
                agent: crate::Agent::new("page-counter").unwrap(),
                host: "h".into(),
                pid: 1,
                claim_key: None,
                liveness: None,
            },
            started_at: Timestamp(NOW),
            claim_seq: Seq(99),
            state: RunState::Open,
            ended_at: None,
            transient: false,
        }
    }

    #[test]
    fn a_selection_is_read_strictly() {
        let read = |text: &str| serde_json::from_str::<Selection>(text);
        assert!(read(r#"{"trigger":{"requires":["Data_Received"]}}"#).is_ok());
        assert!(read(r#"{"trigger":[]}"#).is_err(), "a trigger given as an array");
        assert!(read(r#"{"priority":{"min":1,"mxa":0}}"#).is_err(), "a misspelt bound");
        assert!(read(r#"{"quiet_for":"5m"}"#).is_ok());
        assert!(read(r#""everything""#).is_err());
    }

    proptest! {
        /// Exactly one state selection holds for every batch, and it is `state_of`'s state:
        /// the descriptor's trigger (requires Checksums_Verified, maybe blocked by its own
        /// type), its retry with backoff, a source, an open run, any log of current, stale
        /// and skipped results.
        #[test]
        fn state_selections_agree_with_state_of(
            log in proptest::collection::vec((0usize..3, 0u8..5, 0i64..600, 0u8..3), 0..5),
            running: bool,
            blocked_by_own: bool,
            source: bool,
        ) {
            let mut descriptor = descriptor();
            descriptor.source = source;
            if !blocked_by_own {
                descriptor.trigger.blocked_by.clear();
            }
            let events = log.iter().enumerate().map(|(i, (kind, outcome, ago, content))| {
                let (outcome, mut details) = match outcome {
                    0 => (Outcome::Success, json!({})),
                    1 => (Outcome::Failure, json!({})),
                    2 => (Outcome::Success, json!({"skipped": true})),
                    3 => (Outcome::Failure, json!({"transient": true})),
                    _ => (Outcome::Failure, json!({"acknowledged": true})),
                };
                // Worked out from no content, the batch's content (seq 1), or older content.
                if *content > 0 {
                    details[crate::CONTENT_SEQ_KEY] = json!(i64::from(2 - content));
                }
                event(i as i64 + 2, TYPES[*kind], outcome, details, NOW - ago * 1000)
            }).collect();
            let mut batch = batch(events, NOW);
            if running {
                batch.open_runs.push(open_run(&descriptor.name));
            }
            let expected = descriptor.state_of(&batch);
            for state in ComponentState::ALL {
                let selected = Selection::component_state(&descriptor, state).matches_at(&batch, batch.as_of);
                prop_assert_eq!(selected, state == expected, "state {:?}, expected {:?}", state, expected);
            }
        }
    }
}
