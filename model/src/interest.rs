//! Who a store change concerns, and what a waiter wants to be woken for: a watcher sleeping
//! between passes wakes only for a change that can make a batch ready for it (or that
//! concerns everyone), not for every commit of every stage. `Trigger::interest` derives the
//! interest from a trigger; the stores announce each commit's `ChangeConcern`.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use super::{ComponentName, EventType};

/// What a waiter wants to be woken for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "json-schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum ChangeInterest {
    /// Every change that moves the head (what `wait_for_change` waits for).
    Everything,
    /// Appends of (or resets covering) these event types, and the changes that concern
    /// everyone (`ChangeConcern::Everyone`).
    Types(BTreeSet<EventType>),
}

impl ChangeInterest {
    /// This interest and `other`'s: woken by what concerns either.
    pub fn union(self, other: ChangeInterest) -> ChangeInterest {
        match (self, other) {
            (ChangeInterest::Types(mut mine), ChangeInterest::Types(theirs)) => {
                mine.extend(theirs);
                ChangeInterest::Types(mine)
            }
            _ => ChangeInterest::Everything,
        }
    }

    /// This interest and appends of `event_type`.
    pub fn with_type(self, event_type: &EventType) -> ChangeInterest {
        self.union(ChangeInterest::Types(BTreeSet::from([event_type.clone()])))
    }
}

/// Whom one commit concerns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChangeConcern {
    /// A change that can make a batch ready (or held) for a trigger that names none of its
    /// event types: a priority or content change, a run released or cancelled, the steering
    /// changed; and anything a store cannot tell more precisely of.
    Everyone,
    /// A batch registered, without events yet: ready at most for a trigger that requires
    /// nothing, whose waiters wake for every change (`Trigger::interest`). So a registration
    /// wakes no watcher of a step that requires an event, where it woke every watcher of
    /// every step before (once per batch each, a look each: the trickle's idle wake-ups).
    /// Announced as `c:`, which a release before this one reads as concerning everyone.
    Created,
    /// Events of these types appended (an event's own type and every type its `resets`
    /// covers). Empty for a change that makes no batch ready for anyone (a claim, a
    /// checkpoint): it still moves the head, so plain `wait_for_change` wakes for it.
    Types(BTreeSet<EventType>),
    /// A run of `component` opened for the taker whose liveness record is `liveness` by the
    /// append that made its batch ready (`HandOnStore`): announced beside that append's own
    /// concern, as `h:<component> <liveness>`, so the taker's wake says it was handed a run
    /// and no other waiter reads for one. It makes nothing ready for a trigger (only waiters
    /// for every change wake for it); a release before this one reads it as concerning
    /// everyone.
    Handed { component: ComponentName, liveness: String },
}

/// Announcements of the longest concern are cut to `*` (PostgreSQL's NOTIFY payload is at
/// most 8000 bytes; a wake file line stays short).
pub const MAX_CONCERN_PAYLOAD: usize = 4000;

/// How a registration is announced (`ChangeConcern::Created`): the PostgreSQL schema's
/// notify trigger on `batches` (migration 15) and the SQLite wake triggers write it.
pub const CREATED_PAYLOAD: &str = "c:";

/// How a hand-on is announced (`ChangeConcern::Handed`): `h:`, the component, a space, the
/// liveness record (a component name holds no space; the record is the rest of the line).
const HANDED_PREFIX: &str = "h:";

impl ChangeConcern {
    /// A change that concerns no trigger (it may still move the head).
    pub fn nobody() -> ChangeConcern {
        ChangeConcern::Types(BTreeSet::new())
    }

    /// An event appended: its type and every type it resets.
    pub fn of_event(event_type: &EventType, resets: &[EventType]) -> ChangeConcern {
        ChangeConcern::Types(std::iter::once(event_type).chain(resets).cloned().collect())
    }

    /// What one commit holding both changes concerns.
    pub fn merge(&mut self, other: ChangeConcern) {
        match (&mut *self, other) {
            (ChangeConcern::Types(mine), ChangeConcern::Types(theirs)) => mine.extend(theirs),
            // A registration and changes that concern nobody: still only what a
            // registration concerns.
            (ChangeConcern::Created, ChangeConcern::Created) => {}
            (ChangeConcern::Created, ChangeConcern::Types(theirs)) if theirs.is_empty() => {}
            (ChangeConcern::Types(mine), ChangeConcern::Created) if mine.is_empty() => *self = ChangeConcern::Created,
            // A batch registered with its first events (`register_batch`): it can be ready
            // only for a trigger requiring nothing, whose waiters wake for every change, or
            // for one requiring some of those events, which their types name.
            (ChangeConcern::Created, ChangeConcern::Types(theirs)) => *self = ChangeConcern::Types(theirs),
            (ChangeConcern::Types(_), ChangeConcern::Created) => {}
            // A hand-on is announced apart from its commit's concern, never merged into it.
            _ => *self = ChangeConcern::Everyone,
        }
    }

    /// Whether a waiter with `interest` must wake for this change.
    pub fn concerns(&self, interest: &ChangeInterest) -> bool {
        match (self, interest) {
            (ChangeConcern::Everyone, _) | (_, ChangeInterest::Everything) => true,
            (ChangeConcern::Created | ChangeConcern::Handed { .. }, ChangeInterest::Types(_)) => false,
            (ChangeConcern::Types(changed), ChangeInterest::Types(wanted)) => !changed.is_disjoint(wanted),
        }
    }

    /// Whether this announces a run of `component` handed to the taker `liveness`.
    pub fn hands_to(&self, component: &ComponentName, liveness: &str) -> bool {
        matches!(self, ChangeConcern::Handed { component: c, liveness: l } if c == component && l == liveness)
    }

    /// As the stores announce it: `*` for everyone, `c:` for a registration, `h:` for a
    /// hand-on, `t:` and the types separated by spaces otherwise (event type names hold no
    /// space).
    pub fn to_payload(&self) -> String {
        match self {
            ChangeConcern::Everyone => "*".to_owned(),
            ChangeConcern::Created => CREATED_PAYLOAD.to_owned(),
            ChangeConcern::Handed { component, liveness } => {
                let payload = format!("{HANDED_PREFIX}{component} {liveness}");
                if payload.len() > MAX_CONCERN_PAYLOAD { "*".to_owned() } else { payload }
            }
            ChangeConcern::Types(types) => {
                let names: Vec<&str> = types.iter().map(EventType::as_str).collect();
                let payload = format!("t:{}", names.join(" "));
                if payload.len() > MAX_CONCERN_PAYLOAD { "*".to_owned() } else { payload }
            }
        }
    }

    /// Reads an announcement. Whatever is not a readable list of types (an older release's
    /// empty payload, a torn or cut line) concerns everyone: a waiter may wake for nothing,
    /// never sleep through readiness.
    pub fn from_payload(payload: &str) -> ChangeConcern {
        if payload == CREATED_PAYLOAD {
            return ChangeConcern::Created;
        }
        if let Some(handed) = payload.strip_prefix(HANDED_PREFIX) {
            let taker = handed.split_once(' ').filter(|(_, liveness)| !liveness.is_empty());
            let component =
                taker.and_then(|(component, liveness)| Some((ComponentName::new(component).ok()?, liveness)));
            return component.map_or(ChangeConcern::Everyone, |(component, liveness)| ChangeConcern::Handed {
                component,
                liveness: liveness.to_owned(),
            });
        }
        let Some(names) = payload.strip_prefix("t:") else { return ChangeConcern::Everyone };
        let types: Result<BTreeSet<EventType>, _> =
            names.split(' ').filter(|n| !n.is_empty()).map(EventType::new).collect();
        types.map_or(ChangeConcern::Everyone, ChangeConcern::Types)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::json;

    use super::*;
    use crate::fixtures::{batch, event, ty};
    use crate::{Batch, BatchId, Outcome, Seq, Timestamp, Trigger};

    const TYPES: [&str; 4] = ["A_Done", "B_Done", "C_Done", "D_Done"];
    const NOW: i64 = 1_000_000_000;

    /// The types of `TYPES` whose bit is set in `mask`.
    fn subset(mask: u8) -> Vec<EventType> {
        TYPES.iter().enumerate().filter(|(i, _)| mask & (1 << i) != 0).map(|(_, t)| ty(t)).collect()
    }

    /// An event of `TYPES[kind]` (or, for kind 4, a Reset of `resets`): a success, a
    /// failure, a skipped success or a transient failure, worked out from the batch's
    /// content, older content or none.
    fn logged(seq: i64, (kind, outcome, content, resets): (usize, u8, u8, u8), at: i64) -> crate::Event {
        let (outcome, mut details) = match outcome {
            0 => (Outcome::Success, json!({})),
            1 => (Outcome::Failure, json!({})),
            2 => (Outcome::Success, json!({"skipped": true})),
            _ => (Outcome::Failure, json!({"transient": true})),
        };
        if content > 0 {
            details[crate::CONTENT_SEQ_KEY] = json!(i64::from(2 - content));
        }
        let kind = TYPES.get(kind).copied().unwrap_or("Reset");
        let mut event = event(seq, kind, outcome, details, at);
        if kind == "Reset" {
            event.resets = subset(resets);
        }
        event
    }

    type Logged = (usize, u8, u8, u8);

    fn logged_strategy() -> impl Strategy<Value = Logged> {
        (0usize..5, 0u8..4, 0u8..3, 0u8..16)
    }

    /// One change of the store, applied to the batches as the store would, with whom it
    /// concerns as the stores announce it.
    #[derive(Debug, Clone)]
    enum Change {
        Append(usize, Logged),
        Content(usize),
        Priority(usize, i32),
        Create(Vec<Logged>),
    }

    fn change_strategy() -> impl Strategy<Value = Change> {
        prop_oneof![
            4 => (0usize..3, logged_strategy()).prop_map(|(b, e)| Change::Append(b, e)),
            1 => (0usize..3).prop_map(Change::Content),
            1 => (0usize..3, -2i32..3).prop_map(|(b, p)| Change::Priority(b, p)),
            1 => proptest::collection::vec(logged_strategy(), 0..4).prop_map(Change::Create),
        ]
    }

    /// A clause's types as a mask of `TYPES`: mostly none or one (so that a type is read
    /// by one clause only, and a clause left out of the interest shows), sometimes several.
    fn clause_strategy() -> impl Strategy<Value = u8> {
        prop_oneof![3 => Just(0u8), 3 => (0u8..4).prop_map(|i| 1 << i), 1 => 0u8..16]
    }

    fn new_batch(id: usize, log: &[Logged], ago: i64) -> Batch {
        let events = log.iter().enumerate().map(|(i, e)| logged(i as i64 + 2, *e, NOW - ago * 1000)).collect();
        let mut b = batch(events, NOW);
        b.id = BatchId::new(format!("B{id}")).unwrap();
        b.created_seq = Seq(id as i64);
        b
    }

    fn apply(change: &Change, batches: &mut Vec<Batch>) -> ChangeConcern {
        const SEQ: i64 = 100;
        match change {
            Change::Append(at, e) => {
                let b = &mut batches[*at];
                let appended = logged(SEQ, *e, NOW);
                let concern = ChangeConcern::of_event(&appended.event_type, &appended.resets);
                b.events.push(appended);
                concern
            }
            Change::Content(at) => {
                batches[*at].modified_seq = Seq(SEQ);
                batches[*at].modified_at = Timestamp(NOW);
                ChangeConcern::Everyone
            }
            Change::Priority(at, priority) => {
                batches[*at].priority = *priority;
                ChangeConcern::Everyone
            }
            Change::Create(log) => {
                batches.push(new_batch(batches.len(), log, 0));
                // A batch registered without events (`create_batch`) or with them in the same
                // commit (`register_batch`): what the stores announce for that commit.
                log.iter().fold(ChangeConcern::Created, |mut concern, e| {
                    let appended = logged(SEQ, *e, NOW);
                    concern.merge(ChangeConcern::of_event(&appended.event_type, &appended.resets));
                    concern
                })
            }
        }
    }

    proptest! {
        // Most random triggers select nothing from a random batch either way: enough
        // cases that every clause meets the changes that flip it (a clause left out of
        // the interest fails within the first thousand or so).
        #![proptest_config(ProptestConfig::with_cases(4000))]

        /// For any trigger and any change: a change that makes a batch ready for the
        /// trigger (`Trigger::select` answers a batch it did not answer before) concerns
        /// the trigger's interest; without `settled_for`, so does any change of the answer
        /// at all. (With `settled_for`, an append of another type only makes a batch less
        /// quiet: out of the answer, never into it.)
        #[test]
        fn a_change_that_alters_the_selection_concerns_the_interest(
            clauses in (clause_strategy(), clause_strategy(), clause_strategy(), clause_strategy()),
            settled: bool,
            logs in proptest::collection::vec((proptest::collection::vec(logged_strategy(), 0..5), 0i64..120), 3),
            change in change_strategy(),
        ) {
            let (requires, blocked_by, repeat_on_change, transiently_failed) = clauses;
            let trigger = Trigger {
                requires: subset(requires),
                blocked_by: subset(blocked_by),
                repeat_on_change: subset(repeat_on_change),
                transiently_failed: subset(transiently_failed),
                settled_for: settled.then_some(std::time::Duration::from_secs(60)),
                ..Trigger::default()
            };
            let mut batches: Vec<Batch> =
                logs.iter().enumerate().map(|(i, (log, ago))| new_batch(i, log, *ago)).collect();
            let before = trigger.select(&batches, Timestamp(NOW));
            let concern = apply(&change, &mut batches);
            let after = trigger.select(&batches, Timestamp(NOW));
            let newly_ready = after.iter().any(|id| !before.contains(id));
            let concerns = concern.concerns(&trigger.interest());
            prop_assert!(concerns || !newly_ready, "{:?} made a batch ready but does not concern {:?}", change, trigger);
            if !settled {
                prop_assert!(concerns || before == after, "{:?} altered the answer of {:?}", change, trigger);
            }
        }
    }

    /// Every event type a clause reads is in the interest, and nothing else.
    #[test]
    fn the_interest_is_every_type_the_trigger_reads() {
        let trigger = Trigger {
            requires: subset(0b0001),
            blocked_by: subset(0b0010),
            repeat_on_change: subset(0b0100),
            transiently_failed: subset(0b1000),
            ..Trigger::default()
        };
        assert_eq!(trigger.interest(), ChangeInterest::Types(TYPES.iter().map(|t| ty(t)).collect()));
        let bare = Trigger { settled_for: Some(std::time::Duration::from_secs(1)), ..Trigger::default() };
        assert_eq!(bare.interest(), ChangeInterest::Everything, "requiring nothing, a new batch may be ready for it");
        let unrequiring = Trigger { blocked_by: subset(0b0010), ..Trigger::default() };
        assert_eq!(unrequiring.interest(), ChangeInterest::Everything);
    }

    fn types(names: &[&str]) -> BTreeSet<EventType> {
        names.iter().map(|n| ty(n)).collect()
    }

    #[test]
    fn an_announcement_reads_back_as_written_and_anything_else_concerns_everyone() {
        for concern in [
            ChangeConcern::Everyone,
            ChangeConcern::Created,
            ChangeConcern::nobody(),
            ChangeConcern::Types(types(&["A_Done", "B_Done"])),
            ChangeConcern::Handed {
                component: ComponentName::new("checker").unwrap(),
                liveness: "pg:worker 7:abc".to_owned(),
            },
        ] {
            assert_eq!(ChangeConcern::from_payload(&concern.to_payload()), concern);
        }
        for unreadable in ["", ".", "t:bad-name", "x:A_Done", "t:A_Do\u{0}", "h:checker", "h:checker ", "h:b@d x"] {
            assert_eq!(ChangeConcern::from_payload(unreadable), ChangeConcern::Everyone, "{unreadable:?}");
        }
        let many = ChangeConcern::Types((0..1000).map(|i| ty(&format!("Type_{i:05}"))).collect());
        assert_eq!(many.to_payload(), "*", "too long for one notification");
    }

    #[test]
    fn a_waiter_wakes_for_its_types_and_for_everyone() {
        let interest = ChangeInterest::Types(types(&["A_Done"]));
        assert!(ChangeConcern::Types(types(&["A_Done", "C_Done"])).concerns(&interest));
        assert!(!ChangeConcern::Types(types(&["C_Done"])).concerns(&interest));
        assert!(!ChangeConcern::nobody().concerns(&interest));
        assert!(ChangeConcern::Everyone.concerns(&interest));
        assert!(ChangeConcern::nobody().concerns(&ChangeInterest::Everything));
        let mut merged = ChangeConcern::nobody();
        merged.merge(ChangeConcern::of_event(&ty("C_Done"), &[ty("A_Done")]));
        assert!(merged.concerns(&interest), "a reset of A_Done concerns a waiter on A_Done");
        merged.merge(ChangeConcern::Everyone);
        assert_eq!(merged, ChangeConcern::Everyone);
        assert!(!ChangeConcern::Created.concerns(&interest), "a registration wakes no step that requires an event");
        let handed = ChangeConcern::Handed { component: ComponentName::new("checker").unwrap(), liveness: "l".into() };
        assert!(!handed.concerns(&interest), "a hand-on makes nothing ready");
        assert!(handed.concerns(&ChangeInterest::Everything));
        assert!(handed.hands_to(&ComponentName::new("checker").unwrap(), "l"));
        assert!(!handed.hands_to(&ComponentName::new("checker").unwrap(), "m"));
        assert!(ChangeConcern::Created.concerns(&ChangeInterest::Everything));
        let mut registered = ChangeConcern::nobody();
        registered.merge(ChangeConcern::Created);
        registered.merge(ChangeConcern::nobody());
        assert_eq!(registered, ChangeConcern::Created);
        registered.merge(ChangeConcern::of_event(&ty("A_Done"), &[]));
        assert_eq!(
            registered,
            ChangeConcern::Types(types(&["A_Done"])),
            "a registration with its events concerns their types"
        );
        assert!(!registered.concerns(&ChangeInterest::Types(types(&["C_Done"]))));
        assert_eq!(interest.clone().union(ChangeInterest::Everything), ChangeInterest::Everything);
        assert_eq!(interest.with_type(&ty("B_Done")), ChangeInterest::Types(types(&["A_Done", "B_Done"])));
    }
}
