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
use serde_json::{Value, json};

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
    /// The report's flags that are set: `transient`, `timed_out`, `cancelled`, `skipped`.
    pub flags: Vec<&'static str>,
    /// start − ready; `None` when the ready time is unknown.
    pub waited: Option<Duration>,
    /// end − start (until the read for an open run).
    pub ran: Duration,
}

impl Attempt {
    /// What it came to, as the component states name it (and the monitor colours it).
    pub fn state(&self) -> ComponentState {
        match self.outcome {
            None => ComponentState::Working,
            Some(Outcome::Success) if self.flags.contains(&"skipped") => ComponentState::Skipped,
            Some(Outcome::Success) => ComponentState::Success,
            Some(Outcome::Failure) if self.flags.contains(&"transient") => ComponentState::Retrying,
            Some(Outcome::Failure) => ComponentState::Failed,
        }
    }

    /// The outcome with its flags, as the table words it: `failure (transient)`, `working`.
    pub fn outcome_text(&self) -> String {
        let outcome = self.outcome.map_or("working", Outcome::as_str);
        if self.flags.is_empty() { outcome.to_owned() } else { format!("{outcome} ({})", self.flags.join(", ")) }
    }

    fn to_json(&self) -> Value {
        json!({
            "seq": self.seq,
            "generation": self.generation,
            "ready_at": self.ready_at,
            "start": self.start,
            "start_from": self.start_from.as_str(),
            "end": self.end,
            "waited_ms": self.waited.map(|d| d.as_millis() as u64),
            "ran_ms": self.ran.as_millis() as u64,
            "outcome": self.outcome.map_or("working", Outcome::as_str),
            "state": self.state().as_str(),
            "flags": self.flags,
        })
    }
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
        let mut lines: Vec<StepTimeline> = steps
            .iter()
            .map(|s| StepTimeline {
                component: s.component.clone(),
                event_type: s.event_type.clone(),
                ready_at: None,
                attempts: Vec::new(),
                abandoned: None,
            })
            .collect();
        let mut replay = Replay::default();
        for event in events {
            for (spec, line) in steps.iter().zip(&mut lines).filter(|(s, _)| s.event_type == event.event_type) {
                let ready_at = replay.ready_at(spec, created_at);
                let duration = event.details.get("duration_ms").and_then(Value::as_u64);
                let (start, start_from) = match duration {
                    Some(ms) => (Timestamp(event.at.0.saturating_sub(ms as i64)), StartFrom::Report),
                    None => (event.at, StartFrom::Result),
                };
                let flags =
                    ["transient", "timed_out", "cancelled", "skipped"].into_iter().filter(|f| event.flag(f)).collect();
                line.attempts.push(Attempt {
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
                });
            }
            replay.apply(event);
        }
        for (spec, line) in steps.iter().zip(&mut lines) {
            let ready_now = replay.ready_at(spec, created_at);
            if let Some(run) = open_runs.iter().find(|r| r.component == spec.component) {
                line.attempts.push(Attempt {
                    seq: None,
                    generation: Some(run.generation),
                    ready_at: ready_now,
                    start: run.started_at,
                    start_from: StartFrom::Claim,
                    end: None,
                    outcome: None,
                    flags: Vec::new(),
                    waited: waited(ready_now, run.started_at),
                    ran: as_of.since(run.started_at),
                });
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

    pub fn to_json(&self) -> Value {
        let steps: Vec<Value> = self
            .steps
            .iter()
            .map(|s| {
                json!({
                    "component": s.component,
                    "event_type": s.event_type,
                    "ready_at": s.ready_at,
                    "waited_ms": s.waited().map(|d| d.as_millis() as u64),
                    "ran_ms": s.ran().as_millis() as u64,
                    "state": s.state().map(ComponentState::as_str),
                    "abandoned_runs": s.abandoned,
                    "attempts": s.attempts.iter().map(Attempt::to_json).collect::<Vec<_>>(),
                })
            })
            .collect();
        json!({
            "first_event_at": self.first_at,
            "last_result_at": self.last_result_at,
            "total_ms": self.total().map(|d| d.as_millis() as u64),
            "events_read": self.events_read,
            "events_total": self.events_total,
            "basis": self.basis(),
            "steps": steps,
        })
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
mod tests {
    use super::*;
    use autocomp_model::{Agent, BatchId, RunHolder, RunRef};

    const T0: i64 = 1_800_000_000_000;

    fn ty(name: &str) -> EventType {
        EventType::new(name).unwrap()
    }

    fn spec(component: &str, own: &str, requires: &[&str], retry_after: Option<u64>) -> StepSpec {
        StepSpec {
            component: ComponentName::new(component).unwrap(),
            event_type: ty(own),
            requires: requires.iter().map(|t| ty(t)).collect(),
            retry_after: retry_after.map(Duration::from_secs),
        }
    }

    /// verifier after Data_Received (retried 10 s after a transient failure), archiver after
    /// Verified.
    fn pipeline() -> Vec<StepSpec> {
        vec![
            spec("verifier", "Verified", &["Data_Received"], Some(10)),
            spec("archiver", "Archived", &["Verified"], None),
        ]
    }

    /// An event at T0 + `secs` s, seq `seq`; `run` the generation of `component`, if any.
    fn at(seq: i64, secs: i64, kind: &str, outcome: Outcome, details: Value, run: Option<(&str, i64)>) -> Event {
        Event {
            seq: Seq(seq),
            batch_id: BatchId::new("B1").unwrap(),
            event_type: ty(kind),
            outcome,
            agent: Agent::new("test").unwrap(),
            at: Timestamp(T0 + secs * 1000),
            details,
            run: run.map(|(c, generation)| RunRef { component: ComponentName::new(c).unwrap(), generation }),
            resets: Vec::new(),
        }
    }

    fn reset(seq: i64, secs: i64, types: &[&str]) -> Event {
        Event {
            event_type: EventType::reset(),
            resets: types.iter().map(|t| ty(t)).collect(),
            ..at(seq, secs, "Reset", Outcome::Success, json!({}), None)
        }
    }

    fn t(secs: i64) -> Timestamp {
        Timestamp(T0 + secs * 1000)
    }

    fn s(secs: u64) -> Duration {
        Duration::from_secs(secs)
    }

    fn build(events: &[Event], open: &[Run]) -> Timeline {
        Timeline::build(&pipeline(), events, None, events.len() as u64, open, t(-5), t(1000))
    }

    #[test]
    fn a_transient_failure_then_a_success_is_two_attempts_with_their_waits_and_runs() {
        let events = vec![
            at(2, 0, "Data_Received", Outcome::Success, json!({}), None),
            // Claimed at 30 s, ran 4 s.
            at(
                3,
                34,
                "Verified",
                Outcome::Failure,
                json!({"duration_ms": 4_000, "transient": true}),
                Some(("verifier", 1)),
            ),
            // Ready again at 44 s (backoff 10 s), started at 50 s, ran 2.5 s.
            at(4, 52, "Verified", Outcome::Success, json!({"duration_ms": 2_500}), Some(("verifier", 2))),
            // Ready at 52 s; started 60 s, ran 20 s.
            at(5, 80, "Archived", Outcome::Success, json!({"duration_ms": 20_000}), Some(("archiver", 1))),
        ];
        let timeline = build(&events, &[]);
        let verifier = &timeline.steps[0];
        assert_eq!(verifier.attempts.len(), 2);
        let (first, second) = (&verifier.attempts[0], &verifier.attempts[1]);
        assert_eq!((first.ready_at, first.start, first.end), (Some(t(0)), t(30), Some(t(34))));
        assert_eq!((first.waited, first.ran, first.state()), (Some(s(30)), s(4), ComponentState::Retrying));
        assert_eq!((first.generation, first.flags.clone()), (Some(1), vec!["transient"]));
        assert_eq!((second.ready_at, second.start), (Some(t(44)), Timestamp(T0 + 49_500)));
        assert_eq!((second.waited, second.ran), (Some(Duration::from_millis(5_500)), Duration::from_millis(2_500)));
        assert_eq!(second.state(), ComponentState::Success);
        assert_eq!(verifier.ready_at, Some(t(0)), "first became ready with Data_Received");
        assert_eq!(verifier.waited(), Some(Duration::from_millis(35_500)));
        assert_eq!(verifier.ran(), Duration::from_millis(6_500));

        let archiver = &timeline.steps[1];
        assert_eq!(archiver.attempts.len(), 1);
        let only = &archiver.attempts[0];
        assert_eq!((only.ready_at, only.start, only.waited, only.ran), (Some(t(52)), t(60), Some(s(8)), s(20)));
        assert_eq!(timeline.total(), Some(s(80)), "first event to the last step's result");
        assert!(!timeline.partial());

        let json = timeline.to_json();
        assert_eq!(json["total_ms"], 80_000);
        assert_eq!(json["steps"][0]["attempts"][1]["waited_ms"], 5_500);
        assert_eq!(json["steps"][0]["attempts"][0]["outcome"], "failure");
        assert_eq!(json["steps"][0]["attempts"][0]["state"], "retrying");
        assert_eq!(json["steps"][1]["ran_ms"], 20_000);

        let text = timeline.to_text();
        assert!(text.contains(": 1m 20s):"), "{text}");
        let row = text.lines().find(|l| l.trim_start().starts_with("verifier")).unwrap();
        let cells: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(cells[2..], ["35.5s", "6.5s", "2", "success"], "{text}");
        assert!(text.contains("    #1") && text.contains("failure (transient)"), "{text}");
        let archiver_row = text.lines().find(|l| l.trim_start().starts_with("archiver")).unwrap();
        assert_eq!(archiver_row.split_whitespace().skip(2).collect::<Vec<_>>(), ["8.0s", "20.0s", "1", "success"]);
    }

    #[test]
    fn an_open_run_is_working_since_its_claim_and_a_waiting_step_shows_since_when_it_is_ready() {
        let events = vec![
            at(2, 0, "Data_Received", Outcome::Success, json!({}), None),
            at(3, 5, "Verified", Outcome::Success, json!({"duration_ms": 1_000}), Some(("verifier", 1))),
        ];
        let run = Run {
            batch_id: BatchId::new("B1").unwrap(),
            component: ComponentName::new("archiver").unwrap(),
            generation: 3,
            holder: RunHolder { agent: Agent::new("a").unwrap(), host: "h".into(), pid: 1, claim_key: None },
            started_at: t(900),
            claim_seq: Seq(9),
            state: autocomp_model::RunState::Open,
            ended_at: None,
            transient: false,
        };
        let working = build(&events, std::slice::from_ref(&run));
        let attempt = &working.steps[1].attempts[0];
        assert_eq!((attempt.start_from, attempt.start, attempt.end), (StartFrom::Claim, t(900), None));
        assert_eq!((attempt.waited, attempt.ran, attempt.state()), (Some(s(895)), s(100), ComponentState::Working));
        assert_eq!(working.last_result_at, Some(t(5)), "an open run is no result");

        let waiting = build(&events, &[]);
        assert_eq!((waiting.steps[1].ready_at, waiting.steps[1].attempts.len()), (Some(t(5)), 0));
        assert!(waiting.to_text().contains("archiver"), "every step has its row");
    }

    #[test]
    fn a_rerun_is_ready_at_its_reset_and_an_operator_skip_starts_when_recorded() {
        let events = vec![
            at(2, 0, "Data_Received", Outcome::Success, json!({}), None),
            at(3, 10, "Verified", Outcome::Failure, json!({"duration_ms": 2_000}), Some(("verifier", 1))),
            reset(4, 100, &["Verified"]),
            at(5, 130, "Verified", Outcome::Failure, json!({"duration_ms": 10_000}), Some(("verifier", 2))),
            at(6, 200, "Verified", Outcome::Success, json!({"skipped": true}), None),
        ];
        let timeline = build(&events, &[]);
        let attempts = &timeline.steps[0].attempts;
        assert_eq!(attempts.len(), 3);
        assert_eq!((attempts[1].ready_at, attempts[1].waited), (Some(t(100)), Some(s(20))), "ready at the rerun");
        assert_eq!((attempts[2].start_from, attempts[2].ran, attempts[2].ready_at), (StartFrom::Result, s(0), None));
        assert_eq!(attempts[2].state(), ComponentState::Skipped);
        assert_eq!(attempts[2].generation, None);
    }

    #[test]
    fn a_partial_log_counts_from_the_first_event_and_leaves_unknown_ready_times_unknown() {
        let first = at(2, 0, "Data_Received", Outcome::Success, json!({}), None);
        // The newest events only: Data_Received is not among them.
        let newest =
            vec![at(900, 50, "Verified", Outcome::Success, json!({"duration_ms": 3_000}), Some(("verifier", 1)))];
        let timeline = Timeline::build(&pipeline(), &newest, Some(&first), 1_500, &[], t(-5), t(60));
        assert!(timeline.partial());
        assert_eq!(timeline.total(), Some(s(50)));
        assert_eq!(timeline.steps[0].attempts[0].waited, None);
        assert_eq!(timeline.to_json()["steps"][0]["waited_ms"], Value::Null);
        assert!(timeline.basis().contains("from the newest 1 of 1500 events"));
        assert!(timeline.to_text().lines().any(|l| l.starts_with("  verifier") && l.contains(" - ")));
    }

    #[test]
    fn an_empty_log_has_no_total() {
        let timeline = build(&[], &[]);
        assert_eq!((timeline.total(), timeline.first_at), (None, None));
        assert_eq!(timeline.steps.len(), 2);
        assert!(timeline.to_text().contains("timeline (no events yet):"));
    }

    /// Through `show` on a real SQLite store: an abandoned run, a transient failure, then a
    /// success of `verifier`; then `archiver`'s success.
    #[tokio::test]
    async fn show_has_the_timeline_of_a_retried_step_from_a_real_store() {
        use autocomp_framework::config::{Backends, ComponentConfig};
        use autocomp_model::{BatchType, NewBatch, NewEvent, PassOutcome, PassPhase, PassRecord, Trigger};

        let dir = tempfile::tempdir().unwrap();
        let backends = Backends {
            store: Some(format!("sqlite://{}", dir.path().join("store.db").display())),
            index: Some(format!("local:{}", dir.path().join("index").display())),
            locks: Some(format!("local:{}", dir.path().join("locks").display())),
        };
        let operator = Operator::new(dir.path(), backends, Some("tester".into())).unwrap();
        let store = operator.store().await.unwrap();
        let config = ComponentConfig { retry_backoff: Duration::ZERO, ..ComponentConfig::default() };
        for (name, own, requires) in [("verifier", "Verified", "Data_Received"), ("archiver", "Archived", "Verified")] {
            let trigger = Trigger::builder().requires(requires).blocked_by(own).build();
            let descriptor = config.descriptor(ComponentName::new(name).unwrap(), "1.0.0", ty(own), trigger, false);
            let phase =
                PassPhase::Ended { outcome: PassOutcome::Idle, summary: String::new(), duration_ms: 1, work: vec![] };
            store.record_pass(PassRecord { descriptor, host: "host1".into(), phase }).await.unwrap();
        }
        let b1 = BatchId::new("B1").unwrap();
        store.create_batch(NewBatch::new(b1.clone(), BatchType::new("RoundTrip").unwrap())).await.unwrap();
        let agent = Agent::new("test").unwrap();
        let received = NewEvent::new(ty("Data_Received"), Outcome::Success, agent.clone());
        store.append_event(&b1, received).await.unwrap();
        let holder = RunHolder { agent: agent.clone(), host: "h".into(), pid: 1, claim_key: None };
        let (verifier, archiver) = (ComponentName::new("verifier").unwrap(), ComponentName::new("archiver").unwrap());
        let result = |own: &str, outcome, details: Value, component: &ComponentName, generation| {
            NewEvent::new(ty(own), outcome, agent.clone()).with_details(details).in_run(component.clone(), generation)
        };
        // The first claim's holder dies: the next claim abandons it.
        store.claim(&b1, &verifier, &holder).await.unwrap();
        let second = store.claim(&b1, &verifier, &holder).await.unwrap().generation();
        let failure = json!({"duration_ms": 0, "transient": true, "summary": "mount not ready"});
        store.append_event(&b1, result("Verified", Outcome::Failure, failure, &verifier, second)).await.unwrap();
        let third = store.claim(&b1, &verifier, &holder).await.unwrap().generation();
        let success = json!({"duration_ms": 0});
        store.append_event(&b1, result("Verified", Outcome::Success, success.clone(), &verifier, third)).await.unwrap();
        let run = store.claim(&b1, &archiver, &holder).await.unwrap().generation();
        store.append_event(&b1, result("Archived", Outcome::Success, success, &archiver, run)).await.unwrap();
        let events = store.get_batch(&b1).await.unwrap().events;
        let when = |kind: &str, n: usize| events.iter().filter(|e| e.event_type.as_str() == kind).nth(n).unwrap().at;

        let view = operator.show_page("B1", crate::operator::LogSpan::default()).await.unwrap();
        let steps = &view.timeline.steps;
        let attempts = &steps[0].attempts;
        assert_eq!(attempts.len(), 2, "the failure and the success; the abandoned run is only counted");
        assert_eq!(steps[0].abandoned, Some(1));
        assert_eq!((attempts[0].generation, attempts[1].generation), (Some(second), Some(third)));
        assert_eq!(attempts[0].state(), ComponentState::Retrying);
        assert_eq!(attempts[1].state(), ComponentState::Success);
        // Ready with Data_Received, then again at the transient failure (no backoff).
        assert_eq!(
            (attempts[0].ready_at, attempts[1].ready_at),
            (Some(when("Data_Received", 0)), Some(when("Verified", 0)))
        );
        assert_eq!(attempts[0].waited, Some(when("Verified", 0).since(when("Data_Received", 0))));
        assert_eq!(attempts[1].waited, Some(when("Verified", 1).since(when("Verified", 0))));
        assert_eq!((attempts[0].ran, attempts[1].ran), (Duration::ZERO, Duration::ZERO));
        assert_eq!(steps[1].attempts[0].waited, Some(when("Archived", 0).since(when("Verified", 1))));
        assert_eq!(steps[1].abandoned, Some(0));
        let total = when("Archived", 0).since(when("Data_Received", 0));
        assert_eq!(view.timeline.total(), Some(total));

        let json = view.to_json();
        assert_eq!(json["timeline"]["total_ms"], total.as_millis() as u64);
        assert_eq!(json["timeline"]["steps"][0]["attempts"].as_array().unwrap().len(), 2);
        assert_eq!(json["timeline"]["steps"][0]["abandoned_runs"], 1);
        let text = view.render(crate::operator::Format::Text);
        let row = text.lines().find(|l| l.starts_with("  verifier") && l.contains("(+1 abandoned)"));
        assert!(row.is_some_and(|row| row.ends_with("success")), "{text}");
        assert!(text.contains("    #1") && text.contains("failure (transient)"), "{text}");
    }

    #[test]
    fn durations_read_in_the_unit_that_fits() {
        assert_eq!(duration_text(Duration::from_millis(350)), "350ms");
        assert_eq!(duration_text(Duration::from_millis(2_549)), "2.5s");
        assert_eq!(duration_text(Duration::from_millis(65_900)), "1m 5s");
        assert_eq!(duration_text(s(7_390)), "2h 3m 10s");
    }
}
