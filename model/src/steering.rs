//! What operators (and the circuit breaker) set on the pipeline as a whole, as data: which
//! components are paused or draining and why, the resource pools and their sizes, and each
//! circuit breaker's count. One pure function (`Steering::apply`) decides every change,
//! whichever store holds the state, so every backend steers alike.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use super::{Agent, BatchId, ComponentName, InvalidInput, PoolName, Timestamp};

/// Most batches a breaker remembers as failed while it was counting (the ones
/// `resume --rerun-failed` reruns).
pub const MAX_BREAKER_BATCHES: usize = 1_000;
/// Largest pool size accepted.
pub const MAX_POOL_SIZE: u32 = 1_000;
/// Longest failure summary a breaker keeps (the rest is cut, marked with `…`).
const MAX_BREAKER_SUMMARY_CHARS: usize = 300;

/// The pipeline's steering state: holds, pools, breakers. Held by the store as one record
/// with a version that every change moves, beside an append-only log of the changes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "json-schema", derive(schemars::JsonSchema))]
pub struct Steering {
    /// Moved by every change: what a preview of a pipeline action plans against.
    pub version: u64,
    /// The whole pipeline's hold (`pause --all`): no component claims new work.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pipeline: Option<Hold>,
    /// Each held component's own hold, by name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub components: BTreeMap<ComponentName, Hold>,
    /// Named resource pools and their sizes.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub pools: BTreeMap<PoolName, Pool>,
    /// Each component's circuit breaker count, once it has counted a failure.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub breakers: BTreeMap<ComponentName, Breaker>,
}

/// Why a component claims no new work. Work already running goes on to its result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "json-schema", derive(schemars::JsonSchema))]
pub struct Hold {
    pub kind: HoldKind,
    /// The operator, or the component whose breaker opened.
    pub by: Agent,
    pub reason: String,
    pub since: Timestamp,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "json-schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum HoldKind {
    /// An operator's `pause`.
    Pause,
    /// An operator's `drain`: a pause whose point is that running work finishes (`drain
    /// --wait` returns once none runs).
    Drain,
    /// The component's circuit breaker opened: `break_after` consecutive failures.
    Circuit,
}

impl HoldKind {
    pub fn as_str(self) -> &'static str {
        match self {
            HoldKind::Pause => "paused",
            HoldKind::Drain => "draining",
            HoldKind::Circuit => "circuit open",
        }
    }
}

/// A named resource pool: at most `size` batches' work holds one of its slots at once,
/// across all hosts. Size 0 closes the pool: work needing it waits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "json-schema", derive(schemars::JsonSchema))]
pub struct Pool {
    pub size: u32,
    pub by: Agent,
    pub reason: String,
    pub since: Timestamp,
}

/// A component's circuit breaker: its consecutive permanent failures on distinct batches.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "json-schema", derive(schemars::JsonSchema))]
pub struct Breaker {
    pub consecutive: u32,
    /// The batches that failed, in order (at most `MAX_BREAKER_BATCHES`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failed: Vec<BatchId>,
    /// The last failure's summary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last: Option<String>,
}

/// One change to the steering state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "json-schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum SteeringChange {
    /// `pause` / `drain`: of one component, or of the whole pipeline (`component` null).
    Pause {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        component: Option<ComponentName>,
        #[serde(default)]
        drain: bool,
    },
    /// `resume`: lifts the component's own hold (a pause, a drain or an open circuit, and
    /// its breaker count), or the whole pipeline's (`component` null).
    Resume {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        component: Option<ComponentName>,
    },
    /// `pool set`: creates or resizes a pool.
    SetPool { pool: PoolName, size: u32 },
    /// A runner's permanent failure or success, for a component with `break_after`: counts
    /// toward the breaker, and opens the circuit (a hold) at `break_after`.
    Outcome {
        component: ComponentName,
        batch: BatchId,
        failed: bool,
        break_after: u32,
        #[serde(default)]
        summary: String,
    },
}

/// A change as asked: by whom, why, and (for a confirm) the version it was previewed at.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "json-schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct SteeringRequest {
    pub change: SteeringChange,
    pub by: Agent,
    pub reason: String,
    /// Refused as a conflict unless the state is still at this version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expect_version: Option<u64>,
}

/// One entry of the steering log: a change that an operator (or a breaker) made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "json-schema", derive(schemars::JsonSchema))]
pub struct SteeringEntry {
    /// The state's version the change produced.
    pub version: u64,
    pub at: Timestamp,
    pub by: Agent,
    pub reason: String,
    pub change: SteeringChange,
    /// What it did, in words ("paused checksum-verifier").
    pub said: String,
}

/// Why a change was refused; nothing changed. A caller decides on the variant, not the words.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SteeringRefusal {
    Invalid(InvalidInput),
    /// The state does not allow it (not paused).
    Conflict(String),
    /// Held that way already (paused, draining, its circuit open).
    AlreadyInState(String),
    /// The steering moved since the version the change was previewed at.
    ChangedSincePreview(String),
}

impl fmt::Display for SteeringRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SteeringRefusal::Invalid(e) => e.fmt(f),
            SteeringRefusal::Conflict(message)
            | SteeringRefusal::AlreadyInState(message)
            | SteeringRefusal::ChangedSincePreview(message) => f.write_str(message),
        }
    }
}

impl From<InvalidInput> for SteeringRefusal {
    fn from(e: InvalidInput) -> Self {
        SteeringRefusal::Invalid(e)
    }
}

/// What `Steering::apply` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    /// For the steering log: `None` for a breaker count that opened nothing (counts are
    /// state, not news).
    pub entry: Option<SteeringEntry>,
    /// The breaker opened the circuit with this change (a notification goes out).
    pub circuit_opened: bool,
    /// False when the change left the state as it was (a success with nothing counted):
    /// the version did not move and a store writes nothing.
    pub changed: bool,
}

/// A run's outcome as the breaker counts it: `SteeringChange::Outcome`'s fields, borrowed.
struct RunOutcome<'a> {
    component: &'a ComponentName,
    batch: &'a BatchId,
    failed: bool,
    break_after: u32,
    summary: &'a str,
}

/// What counting an outcome came to: the answer already (no log entry: counts are state, not
/// news), or the circuit opened, with what the log says.
enum Counted {
    Answered(Applied),
    CircuitOpened(String),
}

impl Steering {
    /// The hold that keeps the component from claiming: its own, else the pipeline's.
    pub fn hold_of(&self, component: &ComponentName) -> Option<&Hold> {
        self.components.get(component).or(self.pipeline.as_ref())
    }

    /// Every hold: the whole pipeline's first (`None`), then each component's by name.
    pub fn holds(&self) -> impl Iterator<Item = (Option<&ComponentName>, &Hold)> {
        let pipeline = self.pipeline.iter().map(|hold| (None, hold));
        pipeline.chain(self.components.iter().map(|(name, hold)| (Some(name), hold)))
    }

    pub fn pool(&self, pool: &PoolName) -> Option<&Pool> {
        self.pools.get(pool)
    }

    /// Applies `request` at `at`, moving the version, or refuses it leaving `self` as it was.
    pub fn apply(&mut self, request: &SteeringRequest, at: Timestamp) -> Result<Applied, SteeringRefusal> {
        if let Some(expected) = request.expect_version.filter(|v| *v != self.version) {
            return Err(SteeringRefusal::ChangedSincePreview(format!(
                "the pipeline's steering changed since the preview (version {expected}, now {}): preview again",
                self.version
            )));
        }
        check_reason(&request.reason)?;
        let mut circuit_opened = false;
        let said = match &request.change {
            SteeringChange::Pause { component, drain } => self.pause(component.as_ref(), *drain, request, at)?,
            SteeringChange::Resume { component } => self.resume(component.as_ref())?,
            SteeringChange::SetPool { pool, size } => self.set_pool(pool, *size, request, at)?,
            SteeringChange::Outcome { component, batch, failed, break_after, summary } => {
                let outcome = RunOutcome { component, batch, failed: *failed, break_after: *break_after, summary };
                match self.count_outcome(&outcome, &request.by, at) {
                    Counted::Answered(applied) => return Ok(applied),
                    Counted::CircuitOpened(said) => {
                        circuit_opened = true;
                        said
                    }
                }
            }
        };
        let version = self.version + 1;
        let (by, reason, change) = (request.by.clone(), request.reason.clone(), request.change.clone());
        let entry = SteeringEntry { version, at, by, reason, change, said };
        Ok(self.bumped(Some(entry), circuit_opened))
    }

    /// Pauses or drains a component (or the pipeline), or turns a pause into a drain and back.
    fn pause(
        &mut self,
        component: Option<&ComponentName>,
        drain: bool,
        request: &SteeringRequest,
        at: Timestamp,
    ) -> Result<String, SteeringRefusal> {
        let kind = if drain { HoldKind::Drain } else { HoldKind::Pause };
        let hold = Hold { kind, by: request.by.clone(), reason: request.reason.clone(), since: at };
        let (slot, what) = match component {
            Some(name) => (self.components.get_mut(name), name.to_string()),
            None => (self.pipeline.as_mut(), "the pipeline".to_string()),
        };
        match slot {
            Some(held) if held.kind == kind || held.kind == HoldKind::Circuit => {
                return Err(SteeringRefusal::AlreadyInState(format!(
                    "{what} is {} already, by {} since {}: {}",
                    held.kind.as_str(),
                    held.by,
                    held.since,
                    held.reason
                )));
            }
            // A pause becomes a drain (or back): the newer word stands.
            Some(held) => *held = hold,
            None => match component {
                Some(name) => {
                    self.components.insert(name.clone(), hold);
                }
                None => self.pipeline = Some(hold),
            },
        }
        Ok(format!("{} {what}", if drain { "draining" } else { "paused" }))
    }

    /// Lifts a component's hold (and its breaker's count), or the whole pipeline's.
    fn resume(&mut self, component: Option<&ComponentName>) -> Result<String, SteeringRefusal> {
        let Some(name) = component else {
            let Some(held) = self.pipeline.take() else {
                return Err(SteeringRefusal::Conflict("the pipeline is not paused as a whole".into()));
            };
            let still: Vec<String> = self.components.keys().map(ToString::to_string).collect();
            let mut said = format!("resumed the pipeline ({} since {})", held.kind.as_str(), held.since);
            if !still.is_empty() {
                said.push_str(&format!("; still held on their own: {}", still.join(", ")));
            }
            return Ok(said);
        };
        let Some(held) = self.components.remove(name) else {
            let note = match &self.pipeline {
                Some(p) => format!(" (the whole pipeline is {}: resume --all)", p.kind.as_str()),
                None => String::new(),
            };
            return Err(SteeringRefusal::Conflict(format!("{name} is not paused{note}")));
        };
        let breaker = self.breakers.remove(name).unwrap_or_default();
        Ok(match held.kind {
            HoldKind::Circuit => {
                format!("resumed {name} (its circuit was open after {} consecutive failures)", breaker.consecutive)
            }
            kind => format!("resumed {name} ({} since {})", kind.as_str(), held.since),
        })
    }

    fn set_pool(
        &mut self,
        pool: &PoolName,
        size: u32,
        request: &SteeringRequest,
        at: Timestamp,
    ) -> Result<String, SteeringRefusal> {
        if size > MAX_POOL_SIZE {
            return Err(InvalidInput::new("size", size.to_string(), format!("must be 0 to {MAX_POOL_SIZE}")).into());
        }
        let pool_now = Pool { size, by: request.by.clone(), reason: request.reason.clone(), since: at };
        Ok(match self.pools.insert(pool.clone(), pool_now) {
            Some(old) => format!("pool {pool}: size {} (was {})", size, old.size),
            None => format!("pool {pool}: size {size} (new)"),
        })
    }

    /// Counts a run's outcome toward its component's breaker, opening the circuit (a hold by
    /// `by`) at `break_after` consecutive failures.
    fn count_outcome(&mut self, outcome: &RunOutcome, by: &Agent, at: Timestamp) -> Counted {
        let RunOutcome { component, batch, failed, break_after, summary } = *outcome;
        let open = self.components.get(component).is_some_and(|h| h.kind == HoldKind::Circuit);
        let breaker = self.breakers.entry(component.clone()).or_default();
        if !failed {
            // Nothing counted: nothing to reset. A success while the circuit is open
            // (work that was already running) keeps the failed list, which
            // `resume --rerun-failed` needs.
            if open || breaker.consecutive == 0 {
                if breaker.consecutive == 0 && breaker.failed.is_empty() {
                    self.breakers.remove(component);
                }
                return Counted::Answered(Applied { entry: None, circuit_opened: false, changed: false });
            }
            self.breakers.remove(component);
            return Counted::Answered(self.bumped(None, false));
        }
        if !breaker.failed.contains(batch) {
            breaker.consecutive += 1;
            if breaker.failed.len() < MAX_BREAKER_BATCHES {
                breaker.failed.push(batch.clone());
            }
        }
        breaker.last = Some(cut(summary, MAX_BREAKER_SUMMARY_CHARS));
        let count = breaker.consecutive;
        if break_after == 0 || count < break_after || self.components.contains_key(component) {
            return Counted::Answered(self.bumped(None, false));
        }
        let reason = format!(
            "circuit open: {count} consecutive failures, last: {batch}: {}",
            cut(summary, MAX_BREAKER_SUMMARY_CHARS)
        );
        let hold = Hold { kind: HoldKind::Circuit, by: by.clone(), reason: reason.clone(), since: at };
        self.components.insert(component.clone(), hold);
        Counted::CircuitOpened(format!("{component}: {reason}"))
    }

    fn bumped(&mut self, entry: Option<SteeringEntry>, circuit_opened: bool) -> Applied {
        self.version += 1;
        Applied { entry, circuit_opened, changed: true }
    }
}

fn check_reason(reason: &str) -> Result<(), InvalidInput> {
    if reason.trim().is_empty() || reason.chars().count() > 2_000 || reason.chars().any(|c| c.is_control()) {
        return Err(InvalidInput::new("reason", reason, "must be 1-2000 printable characters"));
    }
    Ok(())
}

fn cut(text: &str, max: usize) -> String {
    let one_line: String = text.chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
    match one_line.char_indices().nth(max) {
        Some((at, _)) => format!("{}…", &one_line[..at]),
        None => one_line,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent(name: &str) -> Agent {
        Agent::new(name).unwrap()
    }

    fn ask(change: SteeringChange) -> SteeringRequest {
        SteeringRequest { change, by: agent("operator:ann"), reason: "tape maintenance".into(), expect_version: None }
    }

    fn name(text: &str) -> ComponentName {
        ComponentName::new(text).unwrap()
    }

    fn failure(batch: &str, break_after: u32) -> SteeringRequest {
        SteeringRequest {
            change: SteeringChange::Outcome {
                component: name("archiver"),
                batch: BatchId::new(batch).unwrap(),
                failed: true,
                break_after,
                summary: format!("{batch}: disk full"),
            },
            by: agent("archiver/1.0@h1#7"),
            reason: "breaker".into(),
            expect_version: None,
        }
    }

    #[test]
    fn a_pause_holds_its_component_and_a_second_pause_is_refused_naming_the_first() {
        let mut s = Steering::default();
        let at = Timestamp(1_000);
        let applied = s.apply(&ask(SteeringChange::Pause { component: Some(name("archiver")), drain: false }), at);
        assert_eq!(applied.unwrap().entry.unwrap().said, "paused archiver");
        assert_eq!(s.hold_of(&name("archiver")).unwrap().kind, HoldKind::Pause);
        assert!(s.hold_of(&name("checker")).is_none());
        let again = s.apply(&ask(SteeringChange::Pause { component: Some(name("archiver")), drain: false }), at);
        let Err(SteeringRefusal::AlreadyInState(message)) = again else { panic!("{again:?}") };
        assert!(message.contains("paused already, by operator:ann"), "{message}");
        assert_eq!(s.version, 1);
        // A drain over a pause is a change of word, not a refusal.
        s.apply(&ask(SteeringChange::Pause { component: Some(name("archiver")), drain: true }), at).unwrap();
        assert_eq!(s.hold_of(&name("archiver")).unwrap().kind, HoldKind::Drain);
    }

    #[test]
    fn the_pipeline_hold_covers_every_component_and_resume_all_names_the_ones_still_held() {
        let mut s = Steering::default();
        let at = Timestamp(1_000);
        s.apply(&ask(SteeringChange::Pause { component: None, drain: false }), at).unwrap();
        s.apply(&ask(SteeringChange::Pause { component: Some(name("archiver")), drain: false }), at).unwrap();
        assert!(s.hold_of(&name("anything")).is_some());
        let said = s.apply(&ask(SteeringChange::Resume { component: None }), at).unwrap().entry.unwrap().said;
        assert!(said.ends_with("still held on their own: archiver"), "{said}");
        assert!(s.hold_of(&name("anything")).is_none());
        let refused = s.apply(&ask(SteeringChange::Resume { component: Some(name("checker")) }), at);
        assert!(matches!(refused, Err(SteeringRefusal::Conflict(m)) if m == "checker is not paused"));
    }

    #[test]
    fn a_stale_preview_is_refused_and_changes_nothing() {
        let mut s = Steering::default();
        let at = Timestamp(1_000);
        s.apply(&ask(SteeringChange::SetPool { pool: PoolName::new("tape").unwrap(), size: 2 }), at).unwrap();
        let mut stale = ask(SteeringChange::SetPool { pool: PoolName::new("tape").unwrap(), size: 3 });
        stale.expect_version = Some(0);
        assert!(matches!(s.apply(&stale, at), Err(SteeringRefusal::ChangedSincePreview(_))));
        assert_eq!(s.pools[&PoolName::new("tape").unwrap()].size, 2);
        let too_big = ask(SteeringChange::SetPool { pool: PoolName::new("tape").unwrap(), size: MAX_POOL_SIZE + 1 });
        assert!(matches!(s.apply(&too_big, at), Err(SteeringRefusal::Invalid(e)) if e.field == "size"));
        let mut blank = ask(SteeringChange::Resume { component: None });
        blank.reason = " ".into();
        assert!(matches!(s.apply(&blank, at), Err(SteeringRefusal::Invalid(e)) if e.field == "reason"));
    }

    #[test]
    fn the_breaker_opens_after_distinct_consecutive_failures_and_a_success_resets_it() {
        let mut s = Steering::default();
        let at = Timestamp(1_000);
        s.apply(&failure("B1", 3), at).unwrap();
        s.apply(&failure("B1", 3), at).unwrap(); // the same batch again counts once
        s.apply(&failure("B2", 3), at).unwrap();
        assert_eq!(s.breakers[&name("archiver")].consecutive, 2);
        let mut success = failure("B9", 3);
        if let SteeringChange::Outcome { failed, .. } = &mut success.change {
            *failed = false;
        }
        s.apply(&success, at).unwrap();
        assert!(s.breakers.is_empty());
        let version = s.version;
        assert!(!s.apply(&success, at).unwrap().changed, "a success with nothing counted changes nothing");
        assert_eq!(s.version, version);
        for batch in ["B3", "B4"] {
            assert!(!s.apply(&failure(batch, 3), at).unwrap().circuit_opened);
        }
        let opened = s.apply(&failure("B5", 3), at).unwrap();
        assert!(opened.circuit_opened);
        let hold = s.hold_of(&name("archiver")).unwrap();
        assert_eq!(hold.kind, HoldKind::Circuit);
        assert_eq!(hold.reason, "circuit open: 3 consecutive failures, last: B5: B5: disk full");
        // Work already running fails too: remembered for the rerun, without reopening.
        assert!(!s.apply(&failure("B6", 3), at).unwrap().circuit_opened);
        s.apply(&success, at).unwrap();
        let failed: Vec<&str> = s.breakers[&name("archiver")].failed.iter().map(BatchId::as_str).collect();
        assert_eq!(failed, ["B3", "B4", "B5", "B6"]);
        let said = s.apply(&ask(SteeringChange::Resume { component: Some(name("archiver")) }), at).unwrap();
        assert!(said.entry.unwrap().said.contains("after 4 consecutive failures"));
        assert!(s.breakers.is_empty() && s.hold_of(&name("archiver")).is_none());
    }
}
