//! A batch's timeline: per step of the pipeline, every attempt (start, end, outcome, flags),
//! when the step became ready, how long each attempt waited and ran; and the batch's total,
//! from its first event to the newest step result. `autocomp show` prints it as a table and
//! in its JSON; the monitor's batch page draws it (`Timeline` is plain data).
//!
//! Read without a whole log and without closed runs, which the store does not expose (only
//! open runs and `failed_attempts`' count): the newest `TIMELINE_EVENTS` events, plus the
//! first event when the log is longer. So, derived from events:
//! - an attempt is a result event of the step's type; it *started* at the result's time minus
//!   the report's `duration_ms` (the runner measures the work, so this is the work's start, a
//!   moment after the claim); a result without `duration_ms` (an operator's `skip`, a
//!   hand-recorded event) started when it was recorded. A run still open started at its
//!   claim (`Run::started_at`) and is still working.
//! - the step *became ready* when its trigger came to hold: the newest of its `requires`'
//!   effective events (all succeeded), a `Reset` covering its own type, its own transient
//!   failure plus the retry backoff; the batch's registration for a step that requires
//!   nothing. Content changes are not events: a rerun after a re-delivery counts from the
//!   events alone. Unknown when the requirements are older than the events read.
//! - *waited* = start − ready (zero if it started before, as a forced run does); *ran* =
//!   end − start.
//! - runs abandoned since the step's last `Reset` (a holder that died: no event, no times)
//!   are counted from `failed_attempts`, when the events read reach back to that `Reset`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use autocomp_model::{ComponentName, ComponentState, Event, EventType, Outcome, Run, Seq, Timestamp};
use autocomp_store::{BatchHead, LogCursor, MAX_LOG_PAGE, ObjectStore};
use serde::Serialize;
use serde_json::Value;

use super::columns::table;
use super::{Operator, OperatorError, Step};

/// Most events a timeline reads: the newest page of the log (and the first event).
pub const TIMELINE_EVENTS: usize = MAX_LOG_PAGE;

/// What the timeline needs of a step of the pipeline.
#[derive(Debug, Clone, PartialEq)]
pub struct StepSpec {
    pub component: ComponentName,
    pub event_type: EventType,
    pub requires: Vec<EventType>,
    /// How long after its own transient failure the step is ready again (`None`: it is not
    /// retried by itself).
    pub retry_after: Option<Duration>,
}

impl StepSpec {
    pub fn of(step: &Step) -> Self {
        StepSpec {
            component: step.name().clone(),
            event_type: step.event_type().clone(),
            requires: step.trigger().requires.clone(),
            retry_after: step.retry_trigger().map(|t| t.settled_for.unwrap_or_default()),
        }
    }
}

/// Where an attempt's start time comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartFrom {
    /// The open run's claim.
    Claim,
    /// The result's time minus the report's `duration_ms`.
    Report,
    /// The result's time: it carries no duration (an operator's event).
    Result,
}

impl StartFrom {
    pub fn as_str(self) -> &'static str {
        match self {
            StartFrom::Claim => "claim",
            StartFrom::Report => "report",
            StartFrom::Result => "result",
        }
    }
}

/// One attempt of a step: a result it recorded, or the run still open.
#[derive(Debug, Clone, PartialEq)]
pub struct Attempt {
    /// The result event's seq; `None` while the run is open.
    pub seq: Option<Seq>,
    /// The claim generation it was recorded under (`None`: recorded outside a run).
    pub generation: Option<i64>,
    pub ready_at: Option<Timestamp>,
    pub start: Timestamp,
    pub start_from: StartFrom,
    /// `None` while the run is open.
    pub end: Option<Timestamp>,
    /// `None` while the run is open.
    pub outcome: Option<Outcome>,
    /// The report's flags that are set: `transient`, `timed_out`, `cancelled`, `skipped`,
    /// `acknowledged`.
    pub flags: Vec<&'static str>,
    /// start − ready; `None` when the ready time is unknown.
    pub waited: Option<Duration>,
    /// end − start (until the read for an open run).
    pub ran: Duration,
}

impl Attempt {
    /// A result the step recorded, the step ready since `ready_at`.
    fn of_result(event: &Event, ready_at: Option<Timestamp>) -> Attempt {
        let duration = event.details.get("duration_ms").and_then(Value::as_u64);
        let (start, start_from) = match duration {
            Some(ms) => (Timestamp(event.at.0.saturating_sub(ms as i64)), StartFrom::Report),
            None => (event.at, StartFrom::Result),
        };
        let flags = ["transient", "timed_out", "cancelled", "skipped", "acknowledged"]
            .into_iter()
            .filter(|f| event.flag(f))
            .collect();
        Attempt {
            seq: Some(event.seq),
            generation: event.run.as_ref().map(|r| r.generation),
            ready_at,
            start,
            start_from,
            end: Some(event.at),
            outcome: Some(event.outcome),
            flags,
            waited: waited(ready_at, start),
            ran: event.at.since(start),
        }
    }

    /// The run still open, working since its claim; it has run until `as_of`.
    fn of_open_run(run: &Run, ready_at: Option<Timestamp>, as_of: Timestamp) -> Attempt {
        Attempt {
            seq: None,
            generation: Some(run.generation),
            ready_at,
            start: run.started_at,
            start_from: StartFrom::Claim,
            end: None,
            outcome: None,
            flags: Vec::new(),
            waited: waited(ready_at, run.started_at),
            ran: as_of.since(run.started_at),
        }
    }

    /// What it came to, as the component states name it (and the monitor colours it).
    pub fn state(&self) -> ComponentState {
        match self.outcome {
            None => ComponentState::Working,
            Some(Outcome::Success) if self.flags.contains(&"skipped") => ComponentState::Skipped,
            Some(Outcome::Success) => ComponentState::Success,
            Some(Outcome::Failure) if self.flags.contains(&"transient") => ComponentState::Retrying,
            Some(Outcome::Failure) if self.flags.contains(&"acknowledged") => ComponentState::Acknowledged,
            Some(Outcome::Failure) => ComponentState::Failed,
        }
    }

    /// The outcome with its flags, as the table words it: `failure (transient)`, `working`.
    pub fn outcome_text(&self) -> String {
        let outcome = self.outcome.map_or("working", Outcome::as_str);
        if self.flags.is_empty() { outcome.to_owned() } else { format!("{outcome} ({})", self.flags.join(", ")) }
    }

    fn json(&self) -> AttemptJson<'_> {
        AttemptJson {
            seq: self.seq,
            generation: self.generation,
            ready_at: self.ready_at,
            start: self.start,
            start_from: self.start_from.as_str(),
            end: self.end,
            waited_ms: self.waited.map(|d| d.as_millis() as u64),
            ran_ms: self.ran.as_millis() as u64,
            outcome: self.outcome.map_or("working", Outcome::as_str),
            state: self.state(),
            flags: &self.flags,
        }
    }
}

/// An attempt in `show`'s JSON: its times, where its start comes from and what it came to.
#[derive(Serialize)]
pub struct AttemptJson<'a> {
    pub seq: Option<Seq>,
    pub generation: Option<i64>,
    pub ready_at: Option<Timestamp>,
    pub start: Timestamp,
    pub start_from: &'static str,
    pub end: Option<Timestamp>,
    pub waited_ms: Option<u64>,
    pub ran_ms: u64,
    /// `working` while the run is open.
    pub outcome: &'static str,
    pub state: ComponentState,
    pub flags: &'a [&'static str],
}

/// One step's line of the timeline.
#[derive(Debug, Clone, PartialEq)]
pub struct StepTimeline {
    pub component: ComponentName,
    pub event_type: EventType,
    /// When it first became ready among the events read (for a step not attempted yet: since
    /// when it is ready, if it is).
    pub ready_at: Option<Timestamp>,
    /// Oldest first; the open run, if any, last.
    pub attempts: Vec<Attempt>,
    /// Runs abandoned since the step's last `Reset` (no event records them); `None` when not
    /// counted (the events read do not reach back to that `Reset`).
    pub abandoned: Option<u32>,
}

impl StepTimeline {
    /// A step before any of its events is read.
    fn empty(spec: &StepSpec) -> Self {
        StepTimeline {
            component: spec.component.clone(),
            event_type: spec.event_type.clone(),
            ready_at: None,
            attempts: Vec::new(),
            abandoned: None,
        }
    }

    /// The attempts' waits summed (those whose ready time is known).
    pub fn waited(&self) -> Option<Duration> {
        let known: Vec<Duration> = self.attempts.iter().filter_map(|a| a.waited).collect();
        (!known.is_empty()).then(|| known.iter().sum())
    }

    /// The attempts' run times summed.
    pub fn ran(&self) -> Duration {
        self.attempts.iter().map(|a| a.ran).sum()
    }

    /// The newest attempt's state.
    pub fn state(&self) -> Option<ComponentState> {
        self.attempts.last().map(Attempt::state)
    }

    /// `2`, or `2 (+1 abandoned)`.
    pub fn attempts_text(&self) -> String {
        match self.abandoned {
            Some(n) if n > 0 => format!("{} (+{n} abandoned)", self.attempts.len()),
            _ => self.attempts.len().to_string(),
        }
    }
}

/// A batch's timeline (see the module's documentation for what is derived how).
#[derive(Debug, Clone, PartialEq)]
pub struct Timeline {
    /// In pipeline order.
    pub steps: Vec<StepTimeline>,
    /// The log's first event.
    pub first_at: Option<Timestamp>,
    /// The newest result of any step of the pipeline.
    pub last_result_at: Option<Timestamp>,
    /// How many events were read (the newest ones) of how many the log holds.
    pub events_read: usize,
    pub events_total: u64,
    /// The store's clock when read: where open runs end for now.
    pub as_of: Timestamp,
}

/// A timeline in `show`'s JSON: the batch's total, what it is made of, and each step.
#[derive(Serialize)]
pub struct TimelineJson<'a> {
    pub first_event_at: Option<Timestamp>,
    pub last_result_at: Option<Timestamp>,
    pub total_ms: Option<u64>,
    pub events_read: usize,
    pub events_total: u64,
    pub basis: String,
    pub steps: Vec<StepJson<'a>>,
}

/// A step of the timeline in `show`'s JSON.
#[derive(Serialize)]
pub struct StepJson<'a> {
    pub component: &'a ComponentName,
    pub event_type: &'a EventType,
    pub ready_at: Option<Timestamp>,
    pub waited_ms: Option<u64>,
    pub ran_ms: u64,
    pub state: Option<ComponentState>,
    pub abandoned_runs: Option<u32>,
    pub attempts: Vec<AttemptJson<'a>>,
}

/// The log as replayed so far: per type the effective event, and the newest `Reset` time.
#[derive(Default)]
struct Replay<'e> {
    effective: BTreeMap<&'e EventType, &'e Event>,
    reset_at: BTreeMap<&'e EventType, Timestamp>,
}

impl<'e> Replay<'e> {
    fn apply(&mut self, event: &'e Event) {
        if event.event_type.is_reset() {
            for covered in &event.resets {
                self.effective.remove(covered);
                self.reset_at.insert(covered, event.at);
            }
        } else {
            self.effective.insert(&event.event_type, event);
        }
    }

    /// When `step`'s trigger came to hold, as the log stands; `None` if it does not hold by
    /// the events read (a requirement missing or failed, or its own result still effective).
    fn ready_at(&self, step: &StepSpec, created_at: Timestamp) -> Option<Timestamp> {
        let mut since = Vec::new();
        for required in &step.requires {
            match self.effective.get(required) {
                Some(event) if event.outcome == Outcome::Success => since.push(event.at),
                _ => return None,
            }
        }
        if step.requires.is_empty() {
            since.push(created_at);
        }
        match self.effective.get(&step.event_type) {
            Some(own) if own.is_transient_failure() => {
                let backoff = step.retry_after?;
                since.push(Timestamp(own.at.0.saturating_add(backoff.as_millis() as i64)));
            }
            Some(_) => return None,
            None => {}
        }
        if let Some(reset) = self.reset_at.get(&step.event_type) {
            since.push(*reset);
        }
        since.into_iter().max()
    }
}

fn waited(ready: Option<Timestamp>, start: Timestamp) -> Option<Duration> {
    ready.map(|ready| start.since(ready))
}

impl Timeline {
    /// The timeline of a batch from `events` (in seq order: the whole log, or its newest
    /// part), the log's `first` event when `events` does not start with it, how many events
    /// the log holds, the batch's open runs, registration time and read time.
    pub fn build(
        steps: &[StepSpec],
        events: &[Event],
        first: Option<&Event>,
        events_total: u64,
        open_runs: &[Run],
        created_at: Timestamp,
        as_of: Timestamp,
    ) -> Timeline {
        let mut lines: Vec<StepTimeline> = steps.iter().map(StepTimeline::empty).collect();
        let mut replay = Replay::default();
        for event in events {
            for (spec, line) in steps.iter().zip(&mut lines).filter(|(s, _)| s.event_type == event.event_type) {
                line.attempts.push(Attempt::of_result(event, replay.ready_at(spec, created_at)));
            }
            replay.apply(event);
        }
        for (spec, line) in steps.iter().zip(&mut lines) {
            let ready_now = replay.ready_at(spec, created_at);
            if let Some(run) = open_runs.iter().find(|r| r.component == spec.component) {
                line.attempts.push(Attempt::of_open_run(run, ready_now, as_of));
            }
            line.ready_at = line.attempts.first().map_or(ready_now, |a| a.ready_at);
        }
        let last_result_at = lines.iter().flat_map(|l| &l.attempts).filter_map(|a| a.end).max();
        Timeline {
            steps: lines,
            first_at: first.or(events.first()).map(|e| e.at),
            last_result_at,
            events_read: events.len(),
            events_total,
            as_of,
        }
    }

    /// First event to the newest step result.
    pub fn total(&self) -> Option<Duration> {
        Some(self.last_result_at?.since(self.first_at?))
    }

    /// Whether only the newest part of the log was read.
    pub fn partial(&self) -> bool {
        (self.events_read as u64) < self.events_total
    }

    /// What the numbers are made of, in a sentence (the text and the monitor say it).
    pub fn basis(&self) -> String {
        let mut basis = "an attempt's start is its result's time minus the report's duration_ms \
                         (an open run's: its claim)"
            .to_owned();
        if self.partial() {
            write!(basis, "; from the newest {} of {} events", self.events_read, self.events_total).ok();
        }
        basis
    }

    /// The timeline in `show`'s JSON.
    pub fn json(&self) -> TimelineJson<'_> {
        let steps = self
            .steps
            .iter()
            .map(|s| StepJson {
                component: &s.component,
                event_type: &s.event_type,
                ready_at: s.ready_at,
                waited_ms: s.waited().map(|d| d.as_millis() as u64),
                ran_ms: s.ran().as_millis() as u64,
                state: s.state(),
                abandoned_runs: s.abandoned,
                attempts: s.attempts.iter().map(Attempt::json).collect(),
            })
            .collect();
        TimelineJson {
            first_event_at: self.first_at,
            last_result_at: self.last_result_at,
            total_ms: self.total().map(|d| d.as_millis() as u64),
            events_read: self.events_read,
            events_total: self.events_total,
            basis: self.basis(),
            steps,
        }
    }

    /// The `timeline` section of `autocomp show`: a row per step, and a row per attempt
    /// under a step tried more than once.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        let total = match (self.first_at, self.last_result_at, self.total()) {
            (Some(first), Some(last), Some(total)) => {
                format!("first event {first}, newest step result {last}: {}", duration_text(total))
            }
            (Some(first), _, _) => format!("first event {first}, no step result yet"),
            _ => "no events yet".to_owned(),
        };
        writeln!(out, "\ntimeline ({total}):").ok();
        let mut rows = Vec::new();
        let opt = |d: Option<Duration>| d.map_or("-".to_owned(), duration_text);
        let at = |t: Option<Timestamp>| t.map_or("-".to_owned(), |t| t.to_string());
        for step in &self.steps {
            let outcome = step.attempts.last().map_or("-".to_owned(), Attempt::outcome_text);
            rows.push(vec![
                format!("  {}", step.component),
                at(step.ready_at),
                opt(step.waited()),
                duration_text(step.ran()),
                step.attempts_text(),
                outcome,
            ]);
            if step.attempts.len() > 1 {
                for (n, attempt) in step.attempts.iter().enumerate() {
                    rows.push(vec![
                        format!("    #{}", n + 1),
                        at(attempt.ready_at),
                        opt(attempt.waited),
                        duration_text(attempt.ran),
                        String::new(),
                        attempt.outcome_text(),
                    ]);
                }
            }
        }
        out.push_str(&table(&["  step", "ready", "waited", "ran", "attempts", "outcome"], &rows));
        writeln!(out, "  ({})", self.basis()).ok();
        out
    }
}

/// A duration as the timeline shows it: `350ms`, `2.5s`, `1m 5s`, `2h 3m 10s`.
pub fn duration_text(duration: Duration) -> String {
    match duration.as_millis() {
        ms @ 0..1_000 => format!("{ms}ms"),
        ms @ 1_000..60_000 => format!("{:.1}s", ms as f64 / 1000.0),
        _ => humantime::format_duration(Duration::from_secs(duration.as_secs())).to_string(),
    }
}

/// The newest `TIMELINE_EVENTS` of the log, read by size: an event whose details a page
/// leaves out (over `DETAILS_SHOWN_BYTES`, usually for its kept output) is read again alone
/// and keeps only its small values (flags, duration), so the page never holds a thousand
/// megabyte-sized events at once: a page view costs about one event beyond the page.
async fn timeline_page(store: &dyn ObjectStore, head: &BatchHead) -> Result<autocomp_store::LogPage, OperatorError> {
    use autocomp_store::port::{DETAILS_SHOWN_BYTES, event_at};
    let mut page = store.log_page_within(head.id(), LogCursor::Newest, TIMELINE_EVENTS, DETAILS_SHOWN_BYTES).await?;
    for (seq, _) in std::mem::take(&mut page.details_left_out) {
        let Some(whole) = event_at(store, head.id(), seq).await? else { continue };
        let small = match whole.details {
            Value::Object(details) => Value::Object(
                details
                    .into_iter()
                    .filter(|(_, value)| value.to_string().len() as u64 <= DETAILS_SHOWN_BYTES)
                    .collect(),
            ),
            _ => Value::Null,
        };
        if let Some(event) = page.events.iter_mut().find(|event| event.seq == seq) {
            event.details = small;
        }
    }
    Ok(page)
}

/// The timeline of the batch `head` heads, as `Timeline` documents it: one page of the log
/// (the newest `TIMELINE_EVENTS`), its first event when the log is longer, and one
/// `failed_attempts` per step.
pub(crate) async fn timeline_of(
    store: &dyn ObjectStore,
    pipeline: &[Step],
    head: &BatchHead,
) -> Result<Timeline, OperatorError> {
    let page = timeline_page(store, head).await?;
    let first = match page.older {
        Some(_) => store.log_page(head.id(), LogCursor::After(Seq::ZERO), 1).await?.events.into_iter().next(),
        None => None,
    };
    let specs: Vec<StepSpec> = pipeline.iter().map(StepSpec::of).collect();
    let mut timeline =
        Timeline::build(&specs, &page.events, first.as_ref(), page.total, &head.open_runs, head.created_at, head.as_of);
    let read_from = page.events.first().map_or(Seq::ZERO, |e| e.seq);
    for step in &mut timeline.steps {
        let since = head.last_reset_of(&step.event_type);
        // Only when every result since that Reset was read.
        if page.older.is_some() && since < read_from {
            continue;
        }
        let failed = store.failed_attempts(head.id(), &step.component, since).await?;
        let transient = step
            .attempts
            .iter()
            .filter(|a| a.generation.is_some() && a.seq.is_some_and(|s| s > since) && a.flags.contains(&"transient"))
            .count();
        step.abandoned = Some(failed.saturating_sub(transient as u32));
    }
    Ok(timeline)
}

impl Operator {
    /// The timeline of the batch `head` heads (the monitor's batch page draws it).
    pub async fn timeline(&self, head: &BatchHead) -> Result<Timeline, OperatorError> {
        let store = self.store().await?;
        let pipeline = self.pipeline(store.as_ref()).await?;
        timeline_of(store.as_ref(), &pipeline, head).await
    }
}

#[cfg(test)]
#[path = "timeline_tests.rs"]
mod tests;
