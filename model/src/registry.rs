//! The pipeline as data: what each component is (its descriptor, as its own binary last
//! described it) and when each host last ran it. The registry is how the CLI, the services
//! and the monitor know the pipeline without any component's config file. It also owns the
//! one readiness rule every reader shares: a component's trigger, or the retry of its own
//! transient failure, and the state a batch is in for a component.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::work::check_work;
use super::{
    Agent, BatchFacts, BatchSummary, ChangeInterest, ComponentName, EventType, InvalidInput, Outcome, PoolName,
    Schedule, SummaryAt, Timestamp, Trigger, WorkDone, WorkHistory, duration_text,
};

/// Longest `version` and `host` accepted in the registry.
pub const MAX_LABEL_CHARS: usize = 255;

/// A component as its binary describes itself at a pass: its trigger after the config's
/// overrides, and the settings that decide when a batch is ready or given up on. Unknown
/// fields are ignored when read, so an older release can read what a newer one recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "json-schema", derive(schemars::JsonSchema))]
pub struct ComponentDescriptor {
    pub name: ComponentName,
    pub version: String,
    pub event_type: EventType,
    pub trigger: Trigger,
    /// Failed attempts (abandoned or transient) after which the next claim gives up.
    pub max_attempts: u32,
    /// How long a transient failure waits before it is retried.
    #[serde(with = "duration_text")]
    #[cfg_attr(feature = "json-schema", schemars(with = "crate::schema::DurationText"))]
    pub retry_backoff: Duration,
    /// Batches claimed per pass.
    pub queue_size: usize,
    /// Longest a batch's work may take.
    #[serde(with = "duration_text")]
    #[cfg_attr(feature = "json-schema", schemars(with = "crate::schema::DurationText"))]
    pub max_runtime: Duration,
    /// A source registers batches and records their first event (`batch-trigger`) instead of
    /// working on batches its trigger selects: a batch without its event waits for a delivery.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub source: bool,
    /// A batch ready for the component longer than this needs a person (the monitor marks
    /// it overdue, `autocomp alerts` reports it); unset: the reader's default.
    #[serde(default, with = "duration_text::option", skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "json-schema", schemars(with = "Option<crate::schema::DurationText>"))]
    pub overdue_after: Option<Duration>,
    /// No pass of the component on any host for this long needs a person; unset: the
    /// reader's default.
    #[serde(default, with = "duration_text::option", skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "json-schema", schemars(with = "Option<crate::schema::DurationText>"))]
    pub silent_after: Option<Duration>,
    /// The crontab schedule the component runs on, when its config says: then it is silent
    /// once it has missed a few scheduled passes (unless `silent_after` is set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<Schedule>,
    /// A human step: declared by an operator (`autocomp step add`), with a trigger and no
    /// binary; a person records its event (`autocomp approve` / `reject`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub manual: bool,
    /// The resource pools a batch's work holds a slot of, for its whole duration; taken in
    /// name order (one global order, so two components cannot wait on each other).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pools: Vec<PoolName>,
    /// Consecutive permanent failures on distinct batches after which the component pauses
    /// itself (its circuit opens); unset: never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub break_after: Option<u32>,
    /// The JSON Schema of the structured result it records (`Report::result`), when it
    /// publishes one: what a later step that reads the result may rely on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result_schema: Option<serde_json::Value>,
    /// The results of earlier steps it reads, each with the schema it expects: a pass
    /// refuses to start when a producer's published schema does not give what it expects.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reads: Vec<ResultRead>,
}

/// A step's reading of another step's structured result: the event type whose result it
/// reads and the JSON Schema of what it expects to find there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "json-schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct ResultRead {
    pub event_type: EventType,
    pub schema: serde_json::Value,
}

impl ComponentDescriptor {
    /// A component that is `name` at `version`, records `event_type` and works on what
    /// `trigger` selects, with a component config's defaults for the rest: 3 attempts, a
    /// transient failure retried after 5 minutes, 10 batches a pass, an hour of work a batch;
    /// no alerts, schedule, pools or circuit breaker, no result published or read. The other
    /// fields are public: `ComponentDescriptor { manual: true, ..ComponentDescriptor::new(..) }`.
    pub fn new(name: ComponentName, version: impl Into<String>, event_type: EventType, trigger: Trigger) -> Self {
        Self {
            name,
            version: version.into(),
            event_type,
            trigger,
            max_attempts: 3,
            retry_backoff: Duration::from_secs(300),
            queue_size: 10,
            max_runtime: Duration::from_secs(3600),
            source: false,
            overdue_after: None,
            silent_after: None,
            schedule: None,
            manual: false,
            pools: Vec::new(),
            break_after: None,
            result_schema: None,
            reads: Vec::new(),
        }
    }

    /// With these failed attempts before a give-up, backoff before a transient failure's
    /// retry, claims per pass and longest work per batch.
    pub fn with_limits(
        mut self,
        max_attempts: u32,
        retry_backoff: Duration,
        queue_size: usize,
        max_runtime: Duration,
    ) -> Self {
        (self.max_attempts, self.retry_backoff, self.queue_size, self.max_runtime) =
            (max_attempts, retry_backoff, queue_size, max_runtime);
        self
    }

    pub fn validate(&self) -> Result<(), InvalidInput> {
        check_label("version", &self.version)?;
        if self.event_type.is_history_pruned() {
            return Err(InvalidInput::new(
                "event_type",
                self.event_type.as_str(),
                "is reserved for the record of a pruned history",
            ));
        }
        if self.max_attempts == 0 {
            return Err(InvalidInput::new("max_attempts", "0", "must be at least 1"));
        }
        if self.queue_size == 0 {
            return Err(InvalidInput::new("queue_size", "0", "must be at least 1"));
        }
        if self.break_after == Some(0) {
            return Err(InvalidInput::new("break_after", "0", "must be at least 1 (leave it out to never break)"));
        }
        if self.pools.windows(2).any(|pair| pair[0] >= pair[1]) {
            let pools: Vec<&str> = self.pools.iter().map(PoolName::as_str).collect();
            return Err(InvalidInput::new("pools", pools.join(","), "must be distinct, in name order"));
        }
        Ok(())
    }

    /// The trigger under which a transient failure of the component's own type is retried:
    /// the main trigger without that `blocked_by`, wanting the transient failure, settled for
    /// `retry_backoff`. `None` when the component is not blocked by its own type (then a
    /// failure is never "retried": the component simply runs again when its trigger holds).
    pub fn retry_trigger(&self) -> Option<Trigger> {
        let own = &self.event_type;
        let trigger = &self.trigger;
        trigger.blocked_by.contains(own).then(|| Trigger {
            blocked_by: trigger.blocked_by.iter().filter(|t| *t != own).cloned().collect(),
            transiently_failed: vec![own.clone()],
            settled_for: Some(trigger.settled_for.unwrap_or_default().max(self.retry_backoff)),
            ..trigger.clone()
        })
    }

    /// What a watcher of this component wakes for: what its trigger and its retry trigger
    /// read (`Trigger::interest`), and its own event type (a competing worker's result, a
    /// rerun after a reset of it).
    pub fn change_interest(&self) -> ChangeInterest {
        let retry = self.retry_trigger().map_or(ChangeInterest::Types(Default::default()), |t| t.interest());
        self.trigger.interest().union(retry).with_type(&self.event_type)
    }

    /// Whether a watcher of this component may be handed batches by the appends that make
    /// them ready (`HandOnStore`): a step whose readiness an append decides alone. Not a
    /// source or a human step (nobody works what they are handed), not one with pools (a
    /// slot is taken before the claim) nor one that waits for a batch to settle (readiness
    /// that comes with time, not with an append).
    pub fn takes_hand_ons(&self) -> bool {
        !self.source && !self.manual && self.pools.is_empty() && self.trigger.settled_for.is_none()
    }

    /// Whether an append that leaves the batch as `summary` makes it ready for this
    /// component, to be handed on: it takes hand-ons, has no open run on the batch, and its
    /// trigger holds at the batch's last activity (the trigger alone: a retry of a transient
    /// failure waits for its backoff, so it is never handed on).
    pub fn ready_on_hand(&self, summary: &BatchSummary) -> bool {
        self.takes_hand_ons()
            && !summary.running.contains(&self.name)
            && self.trigger.matches_at(&SummaryAt { summary, at: summary.last_activity }, summary.last_activity)
    }

    /// Whether a pass would work on the batch as read: its trigger holds, or the retry of its
    /// own transient failure is due. Otherwise why not, naming the clause, the type and what
    /// the batch holds (`requires Checksums_Verified: its effective event is a failure, seq 812`).
    pub fn readiness(&self, batch: &impl BatchFacts) -> Result<(), NotReady> {
        if self.source {
            return Err(NotReady {
                clause: "source",
                reason: format!("{} is a source: it records {} when a delivery arrives", self.name, self.event_type),
                retrying: false,
            });
        }
        let now = batch.read_at();
        let facts = SummaryAt { summary: &batch.facts(), at: now };
        if let Some(pruned) = facts.summary.pruned() {
            return Err(NotReady {
                clause: crate::trigger::PRUNED,
                reason: format!(
                    "its history was pruned (seq {}): it is ready for nothing until `autocomp import` restores it",
                    pruned.seq
                ),
                retrying: false,
            });
        }
        let Some(clause) = self.trigger.clauses().find(|clause| !clause.holds(&facts, now)) else {
            return Ok(());
        };
        if let Some(retry) = self.retry_trigger() {
            if retry.matches(&facts) {
                return Ok(());
            }
            if let Some(failure) = facts.summary.current_of(&self.event_type).filter(|e| e.transient) {
                return Err(NotReady {
                    clause: "retry_backoff",
                    reason: format!(
                        "its transient failure (seq {}) is retried once the batch has been quiet for {} \
                         (retry_backoff)",
                        failure.seq,
                        humantime::format_duration(retry.settled_for.unwrap_or_default())
                    ),
                    retrying: true,
                });
            }
        }
        Err(NotReady { clause: clause.name(), reason: clause.why_not(&facts, now), retrying: false })
    }

    /// Where the batch stands for this component. A stale result reads `stale` whatever
    /// else holds: the step will be redone once what it requires is current again.
    pub fn state_of(&self, batch: &impl BatchFacts) -> ComponentState {
        let facts = batch.facts();
        if facts.running.contains(&self.name) {
            return ComponentState::Working;
        }
        let facts = SummaryAt { summary: &facts, at: batch.read_at() };
        let ready = || self.readiness(&facts).is_ok();
        match facts.summary.effective_of(&self.event_type) {
            Some(event) if event.is_stale_at(facts.summary.modified_seq) => ComponentState::Stale,
            Some(event) if event.skipped => ComponentState::Skipped,
            Some(event) if event.outcome == Outcome::Success => ComponentState::Success,
            Some(event) if event.transient && self.retry_trigger().is_some() => match ready() {
                true => ComponentState::Ready,
                false => ComponentState::Retrying,
            },
            Some(_) | None if self.manual && ready() => ComponentState::Person,
            Some(_) if ready() => ComponentState::Ready,
            Some(event) if event.acknowledged => ComponentState::Acknowledged,
            Some(_) => ComponentState::Failed,
            None if ready() => ComponentState::Ready,
            None => ComponentState::Waiting,
        }
    }
}

/// Why a batch is not ready for a component (see `ComponentDescriptor::readiness`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotReady {
    /// The clause as named in a `[trigger]` (or `retry_backoff`).
    pub clause: &'static str,
    /// The clause with its type and what the batch holds.
    pub reason: String,
    /// A transient failure waiting out its backoff.
    pub retrying: bool,
}

impl fmt::Display for NotReady {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.reason)
    }
}

/// Where a batch stands for one component.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "json-schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum ComponentState {
    /// Its effective event succeeded.
    Success,
    /// An operator's `skip` stands for its work: a success that did no work.
    Skipped,
    /// Its result was worked out from content the batch no longer has (the batch was
    /// re-delivered or edited since): it counts for no trigger and the step will be redone.
    Stale,
    /// Its effective event is a failure that stays until an operator reruns it.
    Failed,
    /// A failure an operator closed out (`acknowledge`): still a failure, needing nobody;
    /// a rerun opens it again.
    Acknowledged,
    /// A transient failure waiting out `retry_backoff`; the component retries it by itself.
    Retrying,
    /// A run is open (a component is working on it).
    Working,
    /// A pass would work on it now.
    Ready,
    /// Ready for a human step: waiting for a person to approve or reject it.
    Person,
    /// Anything else: what it requires has not happened yet.
    Waiting,
}

impl ComponentState {
    pub const ALL: [ComponentState; 10] = [
        ComponentState::Ready,
        ComponentState::Person,
        ComponentState::Waiting,
        ComponentState::Working,
        ComponentState::Retrying,
        ComponentState::Failed,
        ComponentState::Acknowledged,
        ComponentState::Stale,
        ComponentState::Skipped,
        ComponentState::Success,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ComponentState::Success => "success",
            ComponentState::Skipped => "skipped",
            ComponentState::Stale => "stale",
            ComponentState::Failed => "failed",
            ComponentState::Acknowledged => "acknowledged",
            ComponentState::Retrying => "retrying",
            ComponentState::Working => "working",
            ComponentState::Ready => "ready",
            ComponentState::Person => "person",
            ComponentState::Waiting => "waiting",
        }
    }

    pub fn parse(text: &str) -> Result<Self, InvalidInput> {
        Self::ALL.into_iter().find(|s| s.as_str() == text).ok_or_else(|| {
            InvalidInput::new(
                "state",
                text,
                "expected ready, person, waiting, working, retrying, failed, acknowledged, stale, skipped or success",
            )
        })
    }
}

impl fmt::Display for ComponentState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

/// How a pass ended, as the registry shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "json-schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum PassOutcome {
    /// Nothing was ready.
    Idle,
    /// Every batch it worked on was recorded as a success.
    Ok,
    /// At least one batch was recorded as a failure (or refused, or not ready when asked for).
    Failed,
    /// The pass could not finish: lock service lost, store unreachable, a timeout.
    Error,
}

impl PassOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            PassOutcome::Idle => "idle",
            PassOutcome::Ok => "ok",
            PassOutcome::Failed => "failed",
            PassOutcome::Error => "error",
        }
    }

    pub fn parse(text: &str) -> Result<Self, InvalidInput> {
        [PassOutcome::Idle, PassOutcome::Ok, PassOutcome::Failed, PassOutcome::Error]
            .into_iter()
            .find(|o| o.as_str() == text)
            .ok_or_else(|| InvalidInput::new("pass outcome", text, "expected idle, ok, failed or error"))
    }
}

/// One report of a component's pass to the registry. `Started` is sent only by a pass that
/// claimed work (so `pipeline` shows it running); every pass sends `Ended`, an idle one only
/// that: one small write per cron start.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "json-schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct PassRecord {
    pub descriptor: ComponentDescriptor,
    pub host: String,
    pub phase: PassPhase,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "json-schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum PassPhase {
    /// The pass claimed batches and is working on them.
    Started,
    /// The pass is over; it began `duration_ms` before the store received this. `work`: each
    /// batch whose result it recorded, for the registry's result and duration tallies.
    Ended {
        outcome: PassOutcome,
        summary: String,
        duration_ms: u64,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        work: Vec<WorkDone>,
    },
}

impl PassRecord {
    /// An end that reports recorded work: sending it twice would count its results twice.
    pub fn carries_work(&self) -> bool {
        matches!(&self.phase, PassPhase::Ended { work, .. } if !work.is_empty())
    }

    pub fn validate(&self) -> Result<(), InvalidInput> {
        self.descriptor.validate()?;
        check_label("host", &self.host)?;
        if let PassPhase::Ended { summary, work, .. } = &self.phase {
            if summary.chars().count() > 2_000 {
                return Err(InvalidInput::new("pass summary", summary, "at most 2000 characters"));
            }
            check_work(work)?;
        }
        Ok(())
    }
}

/// One host's record of running a component, in store time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "json-schema", derive(schemars::JsonSchema))]
pub struct HostRecord {
    pub host: String,
    /// The version that host last ran.
    pub version: String,
    /// The last time the host reported any pass.
    pub last_seen: Timestamp,
    pub pass_started_at: Option<Timestamp>,
    pub pass_ended_at: Option<Timestamp>,
    pub outcome: Option<PassOutcome>,
    #[serde(default)]
    pub summary: String,
    pub duration_ms: Option<u64>,
}

/// How a host's pass summary begins when the pass did not start (a broken contract, a
/// configuration refused): the runner writes it, the operator's views read it.
pub const NOT_STARTED: &str = "not started: ";

impl HostRecord {
    /// Why this host's last pass did not start, when it did not (and no pass runs now).
    pub fn refused(&self) -> Option<&str> {
        self.summary.strip_prefix(NOT_STARTED).filter(|_| !self.running())
    }

    /// A pass started and not yet ended (or its process died before it could say so).
    pub fn running(&self) -> bool {
        match (self.pass_started_at, self.pass_ended_at) {
            (Some(started), Some(ended)) => started > ended,
            (Some(_), None) => true,
            _ => false,
        }
    }
}

/// An operator's `pipeline forget`: the component is no longer part of the pipeline.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "json-schema", derive(schemars::JsonSchema))]
pub struct Retirement {
    pub at: Timestamp,
    pub by: Agent,
    pub reason: String,
}

/// A component in the registry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "json-schema", derive(schemars::JsonSchema))]
pub struct RegisteredComponent {
    /// As its newest pass described it.
    pub descriptor: ComponentDescriptor,
    /// Its first pass.
    pub registered_at: Timestamp,
    /// When the descriptor last changed (a new version, trigger or setting).
    pub changed_at: Timestamp,
    /// Hosts that ran it, by name.
    pub hosts: Vec<HostRecord>,
    /// Set by `pipeline forget`; cleared when it runs again.
    pub retired: Option<Retirement>,
    /// What its recorded work came to, in total and over the last hour.
    #[serde(default)]
    pub work: WorkHistory,
}

impl RegisteredComponent {
    pub fn name(&self) -> &ComponentName {
        &self.descriptor.name
    }

    /// The versions its hosts last ran, each with its hosts, the last pass's version (the
    /// descriptor's) first: more than one while hosts are upgraded one at a time.
    pub fn versions(&self) -> Vec<(&str, Vec<&str>)> {
        let mut versions: Vec<(&str, Vec<&str>)> = Vec::new();
        for host in &self.hosts {
            match versions.iter_mut().find(|(version, _)| *version == host.version) {
                Some((_, hosts)) => hosts.push(&host.host),
                None => versions.push((&host.version, vec![&host.host])),
            }
        }
        versions.sort_by_key(|(version, _)| *version != self.descriptor.version);
        versions
    }

    /// `1.2.0 on h2; 1.1.0 on h1, h3` when its hosts run more than one version.
    pub fn mixed_versions(&self) -> Option<String> {
        let versions = self.versions();
        (versions.len() > 1).then(|| {
            let each: Vec<String> =
                versions.iter().map(|(version, hosts)| format!("{version} on {}", hosts.join(", "))).collect();
            each.join("; ")
        })
    }

    /// The newest pass report from any host.
    pub fn last_seen(&self) -> Option<Timestamp> {
        self.hosts.iter().map(|h| h.last_seen).max()
    }

    pub fn is_retired(&self) -> bool {
        self.retired.is_some()
    }
}

fn check_label(field: &str, value: &str) -> Result<(), InvalidInput> {
    let printable = value.chars().all(|c| !c.is_control());
    if value.is_empty() || value.chars().count() > MAX_LABEL_CHARS || !printable {
        return Err(InvalidInput::new(field, value, "must be 1-255 printable characters"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::fixtures::{batch, descriptor, event};

    #[test]
    fn refusals_name_the_clause_the_type_and_its_effective_state() {
        let d = descriptor();
        let failed = batch(vec![event(812, "Checksums_Verified", Outcome::Failure, json!({}), 0)], 1_000);
        let refusal = d.readiness(&failed).unwrap_err();
        assert_eq!(refusal.clause, "requires");
        assert_eq!(refusal.reason, "requires Checksums_Verified: its effective event is a failure, seq 812");
        assert_eq!(d.state_of(&failed), ComponentState::Waiting);
        let nothing = batch(vec![], 1_000);
        assert_eq!(
            d.readiness(&nothing).unwrap_err().reason,
            "requires Checksums_Verified: the batch has no effective Checksums_Verified event"
        );
    }

    #[test]
    fn a_transient_failure_is_retrying_until_its_backoff_is_over() {
        let d = descriptor();
        let events = vec![
            event(2, "Checksums_Verified", Outcome::Success, json!({}), 0),
            event(3, "Pages_Counted", Outcome::Failure, json!({"transient": true}), 1_000),
        ];
        let waiting = batch(events.clone(), 1_000 + 299_000);
        assert_eq!(d.state_of(&waiting), ComponentState::Retrying);
        let refusal = d.readiness(&waiting).unwrap_err();
        assert!(refusal.retrying && refusal.reason.contains("seq 3"), "{refusal}");
        let due = batch(events, 1_000 + 300_000);
        assert_eq!(d.state_of(&due), ComponentState::Ready);
        let permanent = batch(
            vec![
                event(2, "Checksums_Verified", Outcome::Success, json!({}), 0),
                event(3, "Pages_Counted", Outcome::Failure, json!({}), 0),
            ],
            1_000_000,
        );
        assert_eq!(d.state_of(&permanent), ComponentState::Failed);
    }

    #[test]
    fn a_batch_is_ready_on_hand_by_the_trigger_alone_and_never_for_a_step_that_waits_or_holds_it() {
        let d = descriptor();
        let verified = batch(vec![event(2, "Checksums_Verified", Outcome::Success, json!({}), 1_000)], 1_000);
        assert!(d.takes_hand_ons());
        assert!(d.ready_on_hand(&BatchSummary::of(&verified)));
        // Its own run open on the batch: already worked on.
        let mut running = verified.clone();
        running.open_runs.push(crate::fixtures::open_run("page-counter"));
        assert!(!d.ready_on_hand(&BatchSummary::of(&running)));
        // Not ready by the trigger: a failure it requires, or its own result there.
        let failed = batch(vec![event(2, "Checksums_Verified", Outcome::Failure, json!({}), 1_000)], 1_000);
        assert!(!d.ready_on_hand(&BatchSummary::of(&failed)));
        // A retry of its own transient failure waits for its backoff: never handed on.
        let transient = batch(
            vec![
                event(2, "Checksums_Verified", Outcome::Success, json!({}), 0),
                event(3, "Pages_Counted", Outcome::Failure, json!({"transient": true}), 1_000),
            ],
            1_000_000,
        );
        assert!(d.readiness(&transient).is_ok(), "due for its retry");
        assert!(!d.ready_on_hand(&BatchSummary::of(&transient)));
        // Steps that take no hand-ons: readiness that comes with time, a source, pools.
        let settled = Trigger { settled_for: Some(Duration::from_secs(1)), ..d.trigger.clone() };
        for taker in [
            ComponentDescriptor { trigger: settled, ..descriptor() },
            ComponentDescriptor { source: true, ..descriptor() },
            ComponentDescriptor { manual: true, ..descriptor() },
            ComponentDescriptor { pools: vec![PoolName::new("scanners").unwrap()], ..descriptor() },
        ] {
            assert!(!taker.takes_hand_ons() && !taker.ready_on_hand(&BatchSummary::of(&verified)), "{taker:?}");
        }
    }

    #[test]
    fn descriptors_round_trip_and_ignore_fields_a_newer_release_added() {
        let d = descriptor();
        let mut json = serde_json::to_value(&d).unwrap();
        assert_eq!(json["retry_backoff"], "5m");
        assert_eq!(serde_json::from_value::<ComponentDescriptor>(json.clone()).unwrap(), d);
        json["added_later"] = json!(true);
        assert_eq!(serde_json::from_value::<ComponentDescriptor>(json).unwrap(), d);
    }
}
