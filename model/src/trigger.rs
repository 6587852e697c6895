//! Trigger semantics: the one pure definition of "this batch is ready for this
//! component". The batch index must answer exactly what `Trigger::select` answers over the
//! same batches, and the runner re-checks each candidate against the store with `matches`.

use std::cmp::Reverse;
use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{
    Batch, BatchFacts, BatchId, BatchSummary, BatchType, ChangeInterest, EventType, InvalidInput, Outcome, Timestamp,
};

/// What `failing_clause` names for a batch whose history was pruned: no trigger holds for it,
/// whatever its clauses say, until its history is imported again.
pub const PRUNED: &str = "pruned";

/// All clauses are ANDed; an empty list or `None` is a clause that always holds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "json-schema", derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields)]
pub struct Trigger {
    /// Each type's effective event exists and succeeded.
    pub requires: Vec<EventType>,
    /// None of these types has an effective event, whatever its outcome.
    pub blocked_by: Vec<EventType>,
    /// Each type has no effective event, or its effective event is older than the batch's
    /// last content change.
    pub repeat_on_change: Vec<EventType>,
    /// Each type's effective event is a failure flagged `transient` (the runner's retry
    /// query uses this, with `settled_for` as the backoff).
    pub transiently_failed: Vec<EventType>,
    /// The batch type is one of these.
    pub types: Vec<BatchType>,
    /// The batch id is one of these (manual runs).
    pub batches: Vec<BatchId>,
    /// No content change and no event for at least this long (debounce).
    #[serde(with = "super::duration_text::option", skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "json-schema", schemars(with = "Option<crate::schema::DurationText>"))]
    pub settled_for: Option<Duration>,
    /// At most this many batches, in trigger order.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<usize>,
}

impl Trigger {
    /// Reads a trigger that must be a JSON object (`deserialize_with` in request bodies):
    /// serde also reads a struct from an array of its fields in order, so `"trigger": []`
    /// would otherwise pass as the trigger that selects everything.
    pub fn deserialize_object<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Trigger, D::Error> {
        use serde::de::Error as _;
        let object = serde_json::Map::<String, serde_json::Value>::deserialize(deserializer)?;
        Trigger::deserialize(serde_json::Value::Object(object)).map_err(D::Error::custom)
    }

    /// Whether the batch is ready, with "now" being the store clock at which it was read.
    pub fn matches(&self, batch: &impl BatchFacts) -> bool {
        self.matches_at(batch, batch.read_at())
    }

    pub fn matches_at(&self, batch: &impl BatchFacts, now: Timestamp) -> bool {
        self.failing_clause(batch, now).is_none()
    }

    /// The first clause that does not hold, named as in the config; `None` when ready.
    pub fn failing_clause(&self, batch: &impl BatchFacts, now: Timestamp) -> Option<&'static str> {
        let facts = batch.facts();
        if facts.pruned().is_some() {
            return Some(PRUNED);
        }
        self.clauses().find(|clause| !clause.holds_in(&facts, now)).map(|clause| clause.name())
    }

    /// Every clause with whether it holds for the batch at store time `now`, in the order
    /// `failing_clause` checks them (for `autocomp explain`). The batch is ready exactly when
    /// all hold.
    pub fn explain(&self, batch: &impl BatchFacts, now: Timestamp) -> Vec<(Clause<'_>, bool)> {
        let facts = batch.facts();
        self.clauses().map(|clause| (clause, clause.holds_in(&facts, now))).collect()
    }

    /// The trigger split into its atomic clauses, one per listed event type: `types`,
    /// `batches`, then `requires`, `blocked_by`, `repeat_on_change`, `transiently_failed`
    /// per type, then `settled_for`. Clauses that always hold (empty lists) are left out.
    pub fn clauses(&self) -> impl Iterator<Item = Clause<'_>> + '_ {
        let types = (!self.types.is_empty()).then_some(Clause::Types(&self.types));
        let batches = (!self.batches.is_empty()).then_some(Clause::Batches(&self.batches));
        types
            .into_iter()
            .chain(batches)
            .chain(self.requires.iter().map(Clause::Requires))
            .chain(self.blocked_by.iter().map(Clause::BlockedBy))
            .chain(self.repeat_on_change.iter().map(Clause::RepeatOnChange))
            .chain(self.transiently_failed.iter().map(Clause::TransientlyFailed))
            .chain(self.settled_for.map(Clause::SettledFor))
    }

    /// What a watcher with this trigger wakes for: appends of (or resets covering) every
    /// event type a clause reads. Whatever else can make a batch ready for it concerns
    /// everyone (`ChangeConcern::Everyone`: a priority or content change, a run released or
    /// cancelled, the steering). Appends of other types can only make a batch *less* settled
    /// (`settled_for`), never ready: time does that, and a watcher's heartbeat looks then.
    /// A trigger that requires nothing may be ready for a batch just registered, which
    /// concerns only such triggers (`ChangeConcern::Created`): it wakes for every change.
    pub fn interest(&self) -> ChangeInterest {
        if self.requires.is_empty() {
            return ChangeInterest::Everything;
        }
        let read = [&self.requires, &self.blocked_by, &self.repeat_on_change, &self.transiently_failed];
        ChangeInterest::Types(read.into_iter().flatten().cloned().collect())
    }

    /// The ready batches in trigger order (priority descending, then oldest first), limited.
    pub fn select<'b>(&self, batches: impl IntoIterator<Item = &'b Batch>, now: Timestamp) -> Vec<BatchId> {
        let mut ready: Vec<&Batch> = batches.into_iter().filter(|b| self.matches_at(b, now)).collect();
        ready.sort_by_key(|b| order_key(b));
        ready.truncate(self.limit.unwrap_or(usize::MAX));
        ready.into_iter().map(|b| b.id.clone()).collect()
    }
}

impl Trigger {
    /// Builds a trigger from names written in code:
    /// `Trigger::builder().requires("Data_Received").blocked_by("Checksums_Verified").build()`.
    pub fn builder() -> TriggerBuilder {
        TriggerBuilder::default()
    }
}

/// Builds a `Trigger` from event type names (see `Trigger::builder`). Meant for the names a
/// component fixes in its code; configs override clauses in `[trigger]` instead.
#[derive(Debug, Clone, Default)]
pub struct TriggerBuilder {
    trigger: Trigger,
    invalid: Option<InvalidInput>,
}

impl TriggerBuilder {
    fn types(mut self, names: &[&str], field: &str, pick: impl Fn(&mut Trigger) -> &mut Vec<EventType>) -> Self {
        for name in names {
            match EventType::new(*name) {
                Ok(t) => pick(&mut self.trigger).push(t),
                Err(e) => {
                    let e = InvalidInput::new(format!("trigger {field}"), *name, e.reason);
                    self.invalid.get_or_insert(e);
                }
            }
        }
        self
    }

    /// Each type's effective event must exist and have succeeded.
    pub fn requires(self, types: impl TypeNames) -> Self {
        self.types(&types.names(), "requires", |t| &mut t.requires)
    }

    /// None of these types may have an effective event (a component lists its own type, so
    /// it works on a batch once; its transient failures are retried after `retry_backoff`).
    pub fn blocked_by(self, types: impl TypeNames) -> Self {
        self.types(&types.names(), "blocked_by", |t| &mut t.blocked_by)
    }

    /// Work again whenever the batch's content changed after this type's effective event.
    pub fn repeat_on_change(self, types: impl TypeNames) -> Self {
        self.types(&types.names(), "repeat_on_change", |t| &mut t.repeat_on_change)
    }

    /// Only batches of these types.
    pub fn batch_types(mut self, types: &[&str]) -> Self {
        for name in types {
            match BatchType::new(*name) {
                Ok(t) => self.trigger.types.push(t),
                Err(e) => {
                    self.invalid.get_or_insert(InvalidInput::new("trigger types", *name, e.reason));
                }
            }
        }
        self
    }

    /// Only batches quiet (no content change, no event) for at least this long.
    pub fn settled_for(mut self, quiet: Duration) -> Self {
        self.trigger.settled_for = Some(quiet);
        self
    }

    /// The trigger, or the first invalid name with the clause it was given to.
    pub fn try_build(self) -> Result<Trigger, InvalidInput> {
        match self.invalid {
            Some(e) => Err(e),
            None => Ok(self.trigger),
        }
    }

    /// The trigger. Panics naming the clause and the value if a name is invalid: the names
    /// are constants in the component's code, so its first run (or its unit test) shows it.
    pub fn build(self) -> Trigger {
        self.try_build().unwrap_or_else(|e| panic!("invalid trigger in the component's code: {e}"))
    }
}

/// One event type name or several: `"A"`, `["A", "B"]`, `&["A"][..]`.
pub trait TypeNames {
    fn names(&self) -> Vec<&str>;
}

impl TypeNames for &str {
    fn names(&self) -> Vec<&str> {
        vec![self]
    }
}

impl<const N: usize> TypeNames for [&str; N] {
    fn names(&self) -> Vec<&str> {
        self.to_vec()
    }
}

impl TypeNames for &[&str] {
    fn names(&self) -> Vec<&str> {
        self.to_vec()
    }
}

/// Trigger order: priority descending, then oldest `created_seq` first (unique per batch).
pub fn order_key(batch: &Batch) -> (Reverse<i32>, i64) {
    (Reverse(batch.priority), batch.created_seq.0)
}

/// One atomic clause of a trigger, borrowed from it (see `Trigger::clauses`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Clause<'t> {
    /// The batch type is one of these.
    Types(&'t [BatchType]),
    /// The batch id is one of these.
    Batches(&'t [BatchId]),
    /// This type's effective event exists and succeeded.
    Requires(&'t EventType),
    /// This type has no effective event.
    BlockedBy(&'t EventType),
    /// This type has no effective event, or one older than the last content change.
    RepeatOnChange(&'t EventType),
    /// This type's effective event is a failure flagged `transient`.
    TransientlyFailed(&'t EventType),
    /// No content change and no event for at least this long.
    SettledFor(Duration),
}

impl Clause<'_> {
    /// The clause's name as written in a config's `[trigger]` (what `failing_clause` returns).
    pub fn name(&self) -> &'static str {
        match self {
            Clause::Types(_) => "types",
            Clause::Batches(_) => "batches",
            Clause::Requires(_) => "requires",
            Clause::BlockedBy(_) => "blocked_by",
            Clause::RepeatOnChange(_) => "repeat_on_change",
            Clause::TransientlyFailed(_) => "transiently_failed",
            Clause::SettledFor(_) => "settled_for",
        }
    }

    /// Whether the clause holds for the batch at store time `now`.
    pub fn holds(&self, batch: &impl BatchFacts, now: Timestamp) -> bool {
        self.holds_in(&batch.facts(), now)
    }

    /// Why the clause does not hold, naming its type and what the batch holds:
    /// `requires Checksums_Verified: its effective event is a failure, seq 812`.
    pub fn why_not(&self, batch: &impl BatchFacts, now: Timestamp) -> String {
        let batch = batch.facts();
        let state = |t: &EventType| match batch.effective_of(t) {
            None => format!("the batch has no effective {t} event"),
            Some(e) if e.is_stale_at(batch.modified_seq) => format!(
                "its effective event (seq {}) is stale: it was worked out from the content of seq {}, and the \
                 content changed at seq {}",
                e.seq,
                e.content_seq.unwrap_or_default(),
                batch.modified_seq
            ),
            Some(e) if e.transient => format!("its effective event is a transient failure, seq {}", e.seq),
            Some(e) if e.skipped => format!("its effective event is a skipped success, seq {}", e.seq),
            Some(e) => format!("its effective event is a {}, seq {}", e.outcome.as_str(), e.seq),
        };
        let reason = match *self {
            Clause::Types(_) => format!("the batch is of type {}", batch.batch_type),
            Clause::Batches(_) => format!("the batch is {}", batch.id),
            Clause::Requires(t) | Clause::BlockedBy(t) | Clause::TransientlyFailed(t) => state(t),
            Clause::RepeatOnChange(t) => match batch.current_of(t) {
                Some(e) => format!(
                    "its effective event (seq {}) is newer than the last content change (seq {})",
                    e.seq, batch.modified_seq
                ),
                None => state(t),
            },
            Clause::SettledFor(_) => format!(
                "the last activity was {} ago",
                humantime::format_duration(Duration::from_secs(now.since(batch.last_activity).as_secs()))
            ),
        };
        format!("{self}: {reason}")
    }

    /// The reference semantics of each clause. Only current events count: a stale result
    /// (worked out from content the batch no longer has) neither satisfies `requires` nor
    /// blocks, as if its step had not been done.
    fn holds_in(&self, batch: &BatchSummary, now: Timestamp) -> bool {
        let current = |event_type: &EventType| batch.current_of(event_type);
        match *self {
            Clause::Types(types) => types.contains(&batch.batch_type),
            Clause::Batches(ids) => ids.contains(&batch.id),
            Clause::Requires(t) => current(t).is_some_and(|e| e.outcome == Outcome::Success),
            Clause::BlockedBy(t) => current(t).is_none(),
            Clause::RepeatOnChange(t) => current(t).is_none_or(|e| e.seq < batch.modified_seq),
            Clause::TransientlyFailed(t) => current(t).is_some_and(|e| e.transient),
            Clause::SettledFor(quiet) => now.since(batch.last_activity) >= quiet,
        }
    }
}

/// As written in a config: `requires Data_Received`, `types RoundTrip|Delivery`, `settled_for 5m`.
impl fmt::Display for Clause<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let joined = |names: Vec<&str>| names.join("|");
        match self {
            Clause::Types(types) => write!(f, "types {}", joined(types.iter().map(BatchType::as_str).collect())),
            Clause::Batches(ids) => write!(f, "batches {}", joined(ids.iter().map(BatchId::as_str).collect())),
            Clause::Requires(t) | Clause::BlockedBy(t) | Clause::RepeatOnChange(t) | Clause::TransientlyFailed(t) => {
                write!(f, "{} {t}", self.name())
            }
            Clause::SettledFor(quiet) => write!(f, "settled_for {}", humantime::format_duration(*quiet)),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::{Event, Seq, fixtures};

    fn event(seq: i64, kind: &str, outcome: Outcome, at: i64) -> Event {
        fixtures::event(seq, kind, outcome, json!({}), at)
    }

    fn reset(seq: i64, types: &[&str]) -> Event {
        Event {
            resets: types.iter().map(|t| EventType::new(*t).unwrap()).collect(),
            ..event(seq, "Reset", Outcome::Success, 0)
        }
    }

    fn batch(events: Vec<Event>) -> Batch {
        fixtures::batch(events, 1_000_000)
    }

    fn types(names: &[&str]) -> Vec<EventType> {
        names.iter().map(|t| EventType::new(*t).unwrap()).collect()
    }

    fn checksum_trigger() -> Trigger {
        Trigger {
            requires: types(&["Data_Received"]),
            blocked_by: types(&["Checksums_Verified"]),
            ..Trigger::default()
        }
    }

    /// A result worked out from content the batch no longer has counts for nothing: its
    /// step is ready again, and a step requiring it waits for the redone result.
    #[test]
    fn a_stale_result_neither_blocks_nor_satisfies_requires() {
        let worked_out_from = |seq: i64, kind: &str, content: i64| {
            fixtures::event(seq, kind, Outcome::Success, json!({ crate::CONTENT_SEQ_KEY: content }), 0)
        };
        let archiver = Trigger {
            requires: types(&["Checksums_Verified"]),
            blocked_by: types(&["Data_Archived"]),
            ..Trigger::default()
        };
        let mut done = batch(vec![
            event(2, "Data_Received", Outcome::Success, 0),
            worked_out_from(3, "Checksums_Verified", 1),
            worked_out_from(4, "Data_Archived", 1),
        ]);
        assert!(!checksum_trigger().matches(&done) && !archiver.matches(&done), "all current: nothing to do");
        done.modified_seq = Seq(5);
        done.events.push(event(6, "Data_Received", Outcome::Success, 0));
        assert!(checksum_trigger().matches(&done), "a re-delivery makes the verification stale: verify again");
        assert!(!archiver.matches(&done), "the archiver waits for the new verification");
        let why = archiver.clauses().find(|c| !c.holds(&done, done.as_of)).unwrap().why_not(&done, done.as_of);
        assert!(why.contains("is stale") && why.contains("seq 5"), "{why}");
        done.events.push(worked_out_from(7, "Checksums_Verified", 5));
        assert!(archiver.matches(&done), "verified again: archive again");
        assert!(!checksum_trigger().matches(&done));
    }

    #[test]
    fn requires_a_successful_effective_event() {
        let t = checksum_trigger();
        assert_eq!(t.failing_clause(&batch(vec![]), Timestamp(0)), Some("requires"));
        assert!(!t.matches(&batch(vec![event(2, "Data_Received", Outcome::Failure, 0)])));
        assert!(t.matches(&batch(vec![event(2, "Data_Received", Outcome::Success, 0)])));
        // The newest event decides: a later failure replaces an earlier success.
        assert!(!t.matches(&batch(vec![
            event(2, "Data_Received", Outcome::Success, 0),
            event(3, "Data_Received", Outcome::Failure, 0)
        ])));
    }

    #[test]
    fn blocked_by_any_outcome_until_reset() {
        let t = checksum_trigger();
        let mut events =
            vec![event(2, "Data_Received", Outcome::Success, 0), event(3, "Checksums_Verified", Outcome::Failure, 0)];
        assert_eq!(t.failing_clause(&batch(events.clone()), Timestamp(0)), Some("blocked_by"));
        events.push(reset(4, &["Checksums_Verified"]));
        assert!(t.matches(&batch(events.clone())));
        events.push(event(5, "Checksums_Verified", Outcome::Success, 0));
        assert!(!t.matches(&batch(events)));
    }

    #[test]
    fn a_reset_covering_a_requirement_makes_the_batch_wait() {
        let t = checksum_trigger();
        let events = vec![event(2, "Data_Received", Outcome::Success, 0), reset(3, &["Data_Received", "Other"])];
        assert!(batch(events.clone()).effective().is_empty());
        assert_eq!(t.failing_clause(&batch(events), Timestamp(0)), Some("requires"));
    }

    #[test]
    fn repeat_on_change_fires_after_a_content_change() {
        let t = Trigger { repeat_on_change: types(&["Indexed"]), ..Trigger::default() };
        let mut b = batch(vec![event(5, "Indexed", Outcome::Success, 0)]);
        assert_eq!(t.failing_clause(&b, Timestamp(0)), Some("repeat_on_change"));
        b.modified_seq = Seq(6);
        assert!(t.matches(&b));
    }

    #[test]
    fn transiently_failed_wants_a_transient_failure_as_the_effective_event() {
        let t = Trigger { transiently_failed: types(&["Exec_Done"]), ..Trigger::default() };
        let plain = event(2, "Exec_Done", Outcome::Failure, 0);
        assert_eq!(t.failing_clause(&batch(vec![plain.clone()]), Timestamp(0)), Some("transiently_failed"));
        let transient = Event { details: json!({"transient": true}), ..plain };
        assert!(t.matches(&batch(vec![transient.clone()])));
        let retried = event(3, "Exec_Done", Outcome::Success, 0);
        assert!(!t.matches(&batch(vec![transient, retried])));
    }

    #[test]
    fn settled_for_counts_from_the_last_event_or_change() {
        let t = Trigger { settled_for: Some(Duration::from_secs(60)), ..Trigger::default() };
        let b = batch(vec![event(2, "Data_Received", Outcome::Success, 100_000)]);
        assert!(!t.matches_at(&b, Timestamp(159_999)));
        assert!(t.matches_at(&b, Timestamp(160_000)));
    }

    #[test]
    fn select_orders_by_priority_then_age_and_limits() {
        let mut low_old = batch(vec![]);
        low_old.id = BatchId::new("low-old").unwrap();
        let mut high_new = batch(vec![]);
        high_new.id = BatchId::new("high-new").unwrap();
        high_new.priority = 5;
        high_new.created_seq = Seq(9);
        let mut low_new = batch(vec![]);
        low_new.id = BatchId::new("low-new").unwrap();
        low_new.created_seq = Seq(7);
        let all = [low_new, low_old, high_new];
        let ids = |t: &Trigger| t.select(&all, Timestamp(0)).iter().map(|id| id.to_string()).collect::<Vec<_>>();
        assert_eq!(ids(&Trigger::default()), ["high-new", "low-old", "low-new"]);
        assert_eq!(ids(&Trigger { limit: Some(2), ..Trigger::default() }), ["high-new", "low-old"]);
    }

    #[test]
    fn triggers_parse_from_config_text() {
        let t: Trigger = serde_json::from_value(json!({
            "requires": ["Data_Received"], "settled_for": "5m", "limit": 10
        }))
        .unwrap();
        assert_eq!(t.settled_for, Some(Duration::from_secs(300)));
        let err = serde_json::from_value::<Trigger>(json!({"requires": ["bad-type"]})).unwrap_err();
        assert!(err.to_string().contains("event type"), "{err}");
        let err = serde_json::from_value::<Trigger>(json!({"requirez": []})).unwrap_err();
        assert!(err.to_string().contains("requirez"), "{err}");
        let err = serde_json::from_value::<Trigger>(json!({"settled_for": "soon"})).unwrap_err();
        assert!(err.to_string().contains("soon"), "{err}");
    }

    #[test]
    fn explain_evaluates_every_clause_and_agrees_with_failing_clause() {
        let t = Trigger {
            types: vec![BatchType::new("RoundTrip").unwrap()],
            requires: types(&["Data_Received", "Structure_Checked"]),
            blocked_by: types(&["Checksums_Verified"]),
            settled_for: Some(Duration::from_secs(60)),
            ..Trigger::default()
        };
        let b = batch(vec![
            event(2, "Data_Received", Outcome::Success, 100_000),
            event(3, "Checksums_Verified", Outcome::Failure, 100_000),
        ]);
        let explained: Vec<(String, bool)> =
            t.explain(&b, Timestamp(130_000)).into_iter().map(|(c, holds)| (c.to_string(), holds)).collect();
        assert_eq!(
            explained,
            [
                ("types RoundTrip".to_owned(), true),
                ("requires Data_Received".to_owned(), true),
                ("requires Structure_Checked".to_owned(), false),
                ("blocked_by Checksums_Verified".to_owned(), false),
                ("settled_for 1m".to_owned(), false),
            ]
        );
        assert_eq!(t.failing_clause(&b, Timestamp(130_000)), Some("requires"));
        // The first failing clause of `explain` is `failing_clause`, and all holding is `matches`.
        let ready = batch(vec![
            event(2, "Data_Received", Outcome::Success, 0),
            event(3, "Structure_Checked", Outcome::Success, 0),
        ]);
        for (candidate, now) in [(&b, Timestamp(130_000)), (&b, Timestamp(0)), (&ready, Timestamp(60_000))] {
            let explained = t.explain(candidate, now);
            let first_failing = explained.iter().find(|(_, holds)| !holds).map(|(c, _)| c.name());
            assert_eq!(first_failing, t.failing_clause(candidate, now));
            assert_eq!(explained.iter().all(|(_, holds)| *holds), t.matches_at(candidate, now));
        }
        assert!(t.matches_at(&ready, Timestamp(60_000)));
        assert!(Trigger::default().explain(&b, Timestamp(0)).is_empty(), "an empty trigger has no clauses");
    }
}
