//! A batch as the batch index needs it: its header, the outcome and seq of each effective
//! event (no details, no agents), when it last saw activity and who is running on it. A
//! catch-up reads a million of these, so a store may keep them up to date as it writes
//! (`SummaryState`) instead of reading whole logs; `BatchSummary::of` is the definition.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use super::{Batch, BatchId, BatchType, ComponentName, Event, EventType, Outcome, Seq, Timestamp};

/// Everything a trigger or the index asks of a batch (see the module comment).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "json-schema", derive(schemars::JsonSchema))]
pub struct BatchSummary {
    pub id: BatchId,
    #[serde(rename = "type")]
    pub batch_type: BatchType,
    pub priority: i32,
    pub created_seq: Seq,
    pub modified_seq: Seq,
    pub changed_seq: Seq,
    /// The newest content change or event, whichever is later (`Batch::last_activity_at`).
    pub last_activity: Timestamp,
    /// The effective events, ordered by type name.
    pub effective: Vec<EventSummary>,
    /// Components with an open run on the batch, by name.
    pub running: Vec<ComponentName>,
}

/// One effective event, without its details: only what the index's terms are made of.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "json-schema", derive(schemars::JsonSchema))]
pub struct EventSummary {
    #[serde(rename = "type")]
    pub event_type: EventType,
    pub outcome: Outcome,
    pub seq: Seq,
    /// A failure the component said may succeed if retried (`Event::is_transient_failure`).
    pub transient: bool,
    /// A success an operator recorded with `skip` (`Event::is_skipped`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub skipped: bool,
    /// A failure an operator closed out with `acknowledge` (`Event::is_acknowledged`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub acknowledged: bool,
    /// The content version the result was worked out from (`Event::content_seq`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_seq: Option<Seq>,
}

impl EventSummary {
    pub fn of(event: &Event) -> Self {
        EventSummary {
            event_type: event.event_type.clone(),
            outcome: event.outcome,
            seq: event.seq,
            transient: event.is_transient_failure(),
            skipped: event.is_skipped(),
            acknowledged: event.is_acknowledged(),
            content_seq: event.content_seq(),
        }
    }

    /// Worked out from content the batch no longer has (`Event::is_stale_at`).
    pub fn is_stale_at(&self, modified_seq: Seq) -> bool {
        self.content_seq.is_some_and(|content| content < modified_seq)
    }
}

impl BatchSummary {
    /// The summary of a whole batch: what every store's summaries must equal.
    pub fn of(batch: &Batch) -> Self {
        SummaryState::of(batch).summary(SummaryHeader::of(batch))
    }

    /// The type's effective event, stale or not (what `show` and `status` describe).
    pub fn effective_of(&self, event_type: &EventType) -> Option<&EventSummary> {
        let at = self.effective.binary_search_by(|held| held.event_type.cmp(event_type)).ok()?;
        Some(&self.effective[at])
    }

    /// The type's effective event if it is not stale: the only events trigger clauses and
    /// selections count. A stale result is as if the step had not been done.
    pub fn current_of(&self, event_type: &EventType) -> Option<&EventSummary> {
        self.effective_of(event_type).filter(|event| !event.is_stale_at(self.modified_seq))
    }

    /// The event standing for the batch's pruned history (`EventType::HISTORY_PRUNED`), if
    /// its history was pruned: such a batch is ready for no component.
    pub fn pruned(&self) -> Option<&EventSummary> {
        self.effective_of(&EventType::history_pruned())
    }

    /// The type's effective event if it is stale.
    pub fn stale_of(&self, event_type: &EventType) -> Option<&EventSummary> {
        self.effective_of(event_type).filter(|event| event.is_stale_at(self.modified_seq))
    }
}

/// What trigger clauses, selections and component states are evaluated on: a batch's
/// summary and the store time it was read at. A whole `Batch` is summarized on the way (its
/// log holds nothing more a trigger asks); a summary read alone comes with its time in
/// `SummaryAt`, so `status` never reads a log.
pub trait BatchFacts {
    fn facts(&self) -> Cow<'_, BatchSummary>;
    /// The store's clock when the batch was read: "now" for time-based clauses.
    fn read_at(&self) -> Timestamp;
}

impl BatchFacts for Batch {
    fn facts(&self) -> Cow<'_, BatchSummary> {
        Cow::Owned(BatchSummary::of(self))
    }

    fn read_at(&self) -> Timestamp {
        self.as_of
    }
}

impl<T: BatchFacts + ?Sized> BatchFacts for &T {
    fn facts(&self) -> Cow<'_, BatchSummary> {
        (**self).facts()
    }

    fn read_at(&self) -> Timestamp {
        (**self).read_at()
    }
}

/// A summary with the store time it was read at.
#[derive(Debug, Clone, Copy)]
pub struct SummaryAt<'a> {
    pub summary: &'a BatchSummary,
    pub at: Timestamp,
}

impl BatchFacts for SummaryAt<'_> {
    fn facts(&self) -> Cow<'_, BatchSummary> {
        Cow::Borrowed(self.summary)
    }

    fn read_at(&self) -> Timestamp {
        self.at
    }
}

/// The part of a summary that events and runs change, kept by a store one write at a
/// time. Folding a batch's log through `record` and its runs through `run_opened` /
/// `run_closed` gives what `BatchSummary::of` derives from the whole batch (the store
/// contract tests hold every backend to that).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SummaryState {
    /// When the newest event was recorded (zero without events).
    pub last_event_at: Timestamp,
    /// Ordered by type name, one per type.
    pub effective: Vec<EventSummary>,
    /// Ordered by name, one per component.
    pub running: Vec<ComponentName>,
}

impl SummaryState {
    /// The state of a whole batch, from its effective view and open runs.
    pub fn of(batch: &Batch) -> Self {
        let mut running: Vec<ComponentName> = batch.open_runs.iter().map(|run| run.component.clone()).collect();
        running.sort();
        running.dedup();
        SummaryState {
            last_event_at: batch.events.iter().map(|event| event.at).max().unwrap_or_default(),
            effective: batch.effective().iter().map(EventSummary::of).collect(),
            running,
        }
    }

    /// Applies an event appended after every event already folded in: a `Reset` marker
    /// removes the types it covers, any other event replaces its type's (as `EffectiveView`).
    pub fn record(&mut self, event: &Event) {
        self.last_event_at = self.last_event_at.max(event.at);
        if event.event_type.is_reset() {
            self.effective.retain(|summary| !event.resets.contains(&summary.event_type));
            return;
        }
        let summary = EventSummary::of(event);
        match self.effective.binary_search_by(|held| held.event_type.cmp(&event.event_type)) {
            Ok(at) => self.effective[at] = summary,
            Err(at) => self.effective.insert(at, summary),
        }
    }

    pub fn run_opened(&mut self, component: &ComponentName) {
        if let Err(at) = self.running.binary_search(component) {
            self.running.insert(at, component.clone());
        }
    }

    pub fn run_closed(&mut self, component: &ComponentName) {
        if let Ok(at) = self.running.binary_search(component) {
            self.running.remove(at);
        }
    }

    /// The whole summary, given the batch's header.
    pub fn summary(self, header: SummaryHeader) -> BatchSummary {
        BatchSummary {
            id: header.id,
            batch_type: header.batch_type,
            priority: header.priority,
            created_seq: header.created_seq,
            modified_seq: header.modified_seq,
            changed_seq: header.changed_seq,
            last_activity: header.modified_at.max(self.last_event_at),
            effective: self.effective,
            running: self.running,
        }
    }
}

/// The batch row's own fields a summary carries.
#[derive(Debug, Clone)]
pub struct SummaryHeader {
    pub id: BatchId,
    pub batch_type: BatchType,
    pub priority: i32,
    pub created_seq: Seq,
    pub modified_seq: Seq,
    pub changed_seq: Seq,
    pub modified_at: Timestamp,
}

impl SummaryHeader {
    pub fn of(batch: &Batch) -> Self {
        SummaryHeader {
            id: batch.id.clone(),
            batch_type: batch.batch_type.clone(),
            priority: batch.priority,
            created_seq: batch.created_seq,
            modified_seq: batch.modified_seq,
            changed_seq: batch.changed_seq,
            modified_at: batch.modified_at,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Agent, Run, RunHolder, RunState};
    use serde_json::json;

    fn event(seq: i64, event_type: &str, outcome: Outcome, transient: bool, resets: &[&str]) -> Event {
        Event {
            seq: Seq(seq),
            batch_id: BatchId::new("B").unwrap(),
            event_type: EventType::new(event_type).unwrap(),
            outcome,
            agent: Agent::new("test").unwrap(),
            at: Timestamp(1_000 + seq),
            details: json!({ "transient": transient }),
            run: None,
            resets: resets.iter().map(|t| EventType::new(*t).unwrap()).collect(),
        }
    }

    fn run(component: &str) -> Run {
        Run {
            batch_id: BatchId::new("B").unwrap(),
            component: ComponentName::new(component).unwrap(),
            generation: 1,
            holder: RunHolder {
                agent: Agent::new("a").unwrap(),
                host: "h".into(),
                pid: 1,
                claim_key: None,
                liveness: None,
            },
            started_at: Timestamp(0),
            claim_seq: Seq(1),
            state: RunState::Open,
            ended_at: None,
            transient: false,
        }
    }

    /// A small deterministic generator: the folds must agree on every log it makes.
    fn logs() -> impl Iterator<Item = Vec<Event>> {
        let types = ["A", "B", "C", "Reset"];
        let mut rng = autocomp_test_servers::XorShift(0x9e37_79b9_7f4a_7c15);
        let mut next = move |n: u64| rng.below(n as usize) as u64;
        (0..500).map(move |_| {
            let length = next(12) as i64;
            (1..=length)
                .map(|seq| {
                    let event_type = types[next(4) as usize];
                    let outcome = if next(2) == 0 { Outcome::Success } else { Outcome::Failure };
                    let resets: Vec<&str> = if event_type == "Reset" {
                        types[..3].iter().copied().filter(|_| next(2) == 0).collect()
                    } else {
                        Vec::new()
                    };
                    event(seq * 3, event_type, outcome, next(2) == 0, &resets)
                })
                .collect()
        })
    }

    #[test]
    fn folding_a_log_event_by_event_gives_the_summary_of_the_whole_batch() {
        for events in logs() {
            let batch = Batch {
                id: BatchId::new("B").unwrap(),
                batch_type: BatchType::new("T").unwrap(),
                priority: 2,
                metadata: Default::default(),
                created_seq: Seq(1),
                modified_seq: Seq(7),
                changed_seq: Seq(99),
                created_at: Timestamp(5),
                modified_at: Timestamp(1_010),
                events: events.clone(),
                open_runs: vec![run("archiver"), run("verifier")],
                as_of: Timestamp(2_000),
            };
            let mut state = SummaryState::default();
            for event in &events {
                state.record(event);
            }
            for component in ["verifier", "archiver", "gone"] {
                state.run_opened(&ComponentName::new(component).unwrap());
            }
            state.run_closed(&ComponentName::new("gone").unwrap());
            assert_eq!(state, SummaryState::of(&batch), "log {events:?}");
            let summary = BatchSummary::of(&batch);
            assert_eq!(summary.last_activity, batch.last_activity_at());
            let effective: Vec<&EventType> = batch.effective().iter().map(|event| &event.event_type).collect();
            assert_eq!(summary.effective.iter().map(|event| &event.event_type).collect::<Vec<_>>(), effective);
        }
    }
}
