//! Which runs' output `autocomp logs` prints and how each reads: numbering a component's
//! attempts on a batch, the runs without a result in their place, and printing their output,
//! neutralized for the terminal; the JSON of an attempt is `AttemptJson`, of a run without a
//! result `RunJson`.

use std::io::Write;
use std::time::Duration;

use autocomp_model::{ComponentName, Event, InvalidInput, Outcome, RunOutput, RunRef, RunState, Seq, Timestamp};
use autocomp_store::{BatchHead, LogPage, ObjectStore, SavedRunOutput};
use serde::Serialize;
use serde_json::Value;

use crate::operator::{Format, Operator, OperatorError};

/// Which runs' output `logs` prints.
#[derive(Debug, Clone, Default)]
pub struct LogsQuery {
    /// Only this component's runs.
    pub component: Option<ComponentName>,
    /// Only the Nth attempt (1 = the first run of a component on the batch).
    pub attempt: Option<u32>,
    /// Only the stream of this name (`stdout`, `stderr`, `log`).
    pub stream: Option<String>,
    /// Then, while a run of the batch (of `component`) goes on, what it prints as it is
    /// saved, until none is going (text only).
    pub follow: bool,
}

/// One run's result as `logs` shows it.
pub(super) struct Attempt<'e> {
    pub(super) component: &'e ComponentName,
    pub(super) number: u32,
    /// Its run (claim generation), as the monitor names it.
    pub(super) generation: i64,
    pub(super) event: &'e Event,
    pub(super) output: Option<RunOutput>,
}

/// An attempt in `logs --format json`: which, when, how it ended, and what it printed.
#[derive(Serialize)]
struct AttemptJson<'a> {
    component: &'a ComponentName,
    attempt: u32,
    seq: Seq,
    outcome: Outcome,
    at: Timestamp,
    duration_ms: Option<&'a Value>,
    /// Its run (claim generation).
    run: i64,
    /// How a failure ended, when it did: past `max_runtime`, worth retrying, or cancelled by
    /// an operator (then its output is the one its runner saved with the run).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    timed_out: bool,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    transient: bool,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    cancelled: bool,
    /// No streams when the run kept no output.
    output: &'a RunOutput,
}

/// A run without a result in `logs --format json`: still going (`open`), abandoned, or
/// (with no cancel event to hang it on) cancelled, and what it printed until `saved_at`.
#[derive(Serialize)]
struct RunJson<'a> {
    component: &'a ComponentName,
    run: i64,
    state: RunState,
    saved_at: Timestamp,
    /// All the run printed, or what it printed so far.
    whole: bool,
    output: &'a RunOutput,
}

const NO_OUTPUT: &RunOutput = &RunOutput { streams: Vec::new() };

/// Writes the selected attempts as they are found: text, or the items of a JSON array.
pub(super) struct Writer<'w> {
    pub(super) out: &'w mut dyn Write,
    pub(super) format: Format,
    /// Attempts written so far.
    pub(super) shown: usize,
}

impl Writer<'_> {
    /// Everything printed comes from the batch's runs: neutralized before the terminal.
    pub(super) fn write(&mut self, text: &str) -> Result<(), OperatorError> {
        let written = |e: std::io::Error| OperatorError::usage(format!("cannot write the output: {e}"));
        self.out.write_all(autocomp_toolkit::for_terminal(text).as_bytes()).map_err(written)?;
        self.out.flush().map_err(written)
    }

    fn attempt(&mut self, attempt: &Attempt<'_>) -> Result<(), OperatorError> {
        match self.format {
            Format::Text => self.write(&attempt_text(attempt))?,
            Format::Json => self.item(serde_json::to_value(attempt_json(attempt)).unwrap_or_default())?,
        }
        self.shown += 1;
        Ok(())
    }

    /// A run's output saved apart from any result (still going, or abandoned).
    fn saved(&mut self, saved: &SavedRunOutput, output: &RunOutput) -> Result<(), OperatorError> {
        match self.format {
            Format::Text => self.write(&saved_text(saved, output))?,
            Format::Json => {
                let (component, run, state, whole) = (&saved.component, saved.generation, saved.state, saved.whole);
                let json = RunJson { component, run, state, saved_at: saved.saved_at, whole, output };
                self.item(serde_json::to_value(json).unwrap_or_default())?
            }
        }
        self.shown += 1;
        Ok(())
    }

    /// One item of the JSON array; through `Value`, keys in name order, as every document
    /// prints them.
    fn item(&mut self, json: serde_json::Value) -> Result<(), OperatorError> {
        self.write(if self.shown == 0 { "[\n  " } else { ",\n  " })?;
        self.write(&json.to_string())
    }
}

/// Each component's runs on the batch so far, in seq order: the attempt numbers.
#[derive(Default)]
pub(super) struct Attempts(pub(super) Vec<(ComponentName, u32)>);

impl Attempts {
    /// Counts a run of `component`; its attempt number.
    pub(super) fn count(&mut self, component: &ComponentName) -> u32 {
        match self.0.iter_mut().find(|(name, _)| name == component) {
            Some((_, count)) => {
                *count += 1;
                *count
            }
            None => {
                self.0.push((component.clone(), 1));
                1
            }
        }
    }

    fn of(&self, component: &ComponentName) -> u32 {
        self.0.iter().find(|(name, _)| name == component).map_or(0, |(_, count)| *count)
    }

    fn max(&self) -> u32 {
        self.0.iter().map(|(_, count)| *count).max().unwrap_or(0)
    }
}

/// What `logs` reads a batch's log for.
pub(super) struct Selection<'q> {
    pub(super) query: &'q LogsQuery,
    pub(super) component: Option<&'q ComponentName>,
    /// The outputs saved apart from results: a cancelled run's is shown with its cancel.
    pub(super) saved: Vec<SavedRunOutput>,
}

impl Selection<'_> {
    /// The attempts of one page the query selects, each written as it is found; `event_at`
    /// reads alone an event whose details the page left out.
    pub(super) async fn page(
        &self,
        store: &dyn ObjectStore,
        page: &LogPage,
        attempts: &mut Attempts,
        written: &mut Vec<(ComponentName, i64)>,
        writer: &mut Writer<'_>,
    ) -> Result<(), OperatorError> {
        for event in &page.events {
            // A cancel ends the run it closed: that run's attempt, its output saved apart.
            let cancelled = event.cancelled_run();
            let Some(run) = event.run.as_ref().or(cancelled.as_ref()) else { continue };
            let number = attempts.count(&run.component);
            if self.component.is_some_and(|wanted| *wanted != run.component) {
                continue;
            }
            // The runs of the component before this one that ended without a result, in
            // their place; this run's own saved output goes with its cancel.
            self.unrecorded(
                |saved| saved.component == run.component && saved.generation < run.generation,
                written,
                writer,
            )?;
            written.push((run.component.clone(), run.generation));
            let whole = match page.left_out(event.seq) {
                Some(_) => autocomp_store::port::event_at(store, &event.batch_id, event.seq).await?,
                None => None,
            };
            let event = whole.as_ref().unwrap_or(event);
            let output = match &cancelled {
                Some(run) => self.saved_output(run),
                None => event.output(),
            };
            let output = output.map(|output| selected_streams(output, self.query.stream.as_deref()));
            let chosen = match self.query.attempt {
                Some(wanted) => wanted == number,
                // By default only the attempts that kept some output.
                None => output.as_ref().is_some_and(|output| !output.streams.is_empty()),
            };
            if chosen {
                let generation = run.generation;
                writer.attempt(&Attempt { component: &run.component, number, generation, event, output })?;
            }
        }
        Ok(())
    }

    /// The output saved for run `generation` of `component`, if any.
    pub(super) fn saved_output(&self, run: &RunRef) -> Option<RunOutput> {
        saved_of(&self.saved, run).map(|saved| saved.output.clone())
    }

    /// The runs without a result whose output was saved (still going, or abandoned after
    /// saving) that `which` picks and were not written yet, unless `--attempt` asks for one
    /// attempt. A cancelled run's output goes with its cancel.
    pub(super) fn unrecorded(
        &self,
        which: impl Fn(&SavedRunOutput) -> bool,
        written: &mut Vec<(ComponentName, i64)>,
        writer: &mut Writer<'_>,
    ) -> Result<(), OperatorError> {
        if self.query.attempt.is_some() {
            return Ok(());
        }
        for saved in &self.saved {
            let done = written.iter().any(|(c, g)| *c == saved.component && *g == saved.generation);
            if done || !self.wants(&saved.component) || !which(saved) {
                continue;
            }
            written.push((saved.component.clone(), saved.generation));
            let output = selected_streams(saved.output.clone(), self.query.stream.as_deref());
            if !output.streams.is_empty() {
                writer.saved(saved, &output)?;
            }
        }
        Ok(())
    }

    /// Nothing selected: a mistake in the query is an error, an empty answer is not.
    pub(super) async fn nothing(
        &self,
        operator: &Operator,
        head: &BatchHead,
        attempts: &Attempts,
        writer: &mut Writer<'_>,
    ) -> Result<(), OperatorError> {
        if let Some(name) = self.component
            && attempts.of(name) == 0
        {
            let store = operator.store().await?;
            let pipeline = operator.pipeline(store.as_ref()).await?;
            operator.step_named(&pipeline, name)?;
        }
        if let Some(wanted) = self.query.attempt {
            let had = match self.component {
                Some(name) => format!("{name} ran {} time(s) on {}", attempts.of(name), head.id()),
                None => format!("no component ran more than {} time(s) on {}", attempts.max(), head.id()),
            };
            return Err(InvalidInput::new("--attempt", wanted.to_string(), format!("no such attempt: {had}")).into());
        }
        match writer.format {
            Format::Json => writer.write("[]\n"),
            Format::Text => {
                let whose = self.component.map(|name| format!(" of {name}")).unwrap_or_default();
                let what = self.query.stream.as_deref().map(|name| format!(" on {name}")).unwrap_or_default();
                writer.write(&format!("{}: no run{whose} kept any output{what}\n", head.id()))
            }
        }
    }
}

/// The output saved for `run`, if any.
pub(super) fn saved_of<'s>(saved: &'s [SavedRunOutput], run: &RunRef) -> Option<&'s SavedRunOutput> {
    saved.iter().find(|s| s.component == run.component && s.generation == run.generation)
}

/// Only the stream asked for (all without `--stream`).
fn selected_streams(mut output: RunOutput, stream: Option<&str>) -> RunOutput {
    if let Some(name) = stream {
        output.streams.retain(|s| s.name == name);
    }
    output
}

/// The header of a run without a result whose output was saved, then its streams.
fn saved_text(saved: &SavedRunOutput, output: &RunOutput) -> String {
    let mut text = format!("== {} ==\n", saved_header(saved));
    text.push_str(&streams_text(output));
    text
}

/// `C run G: running, output so far (saved at T)`, or how it ended without a result.
fn saved_header(saved: &SavedRunOutput) -> String {
    let state = match saved.state {
        RunState::Open => "running, output so far".to_owned(),
        RunState::Abandoned => "abandoned (its worker stopped or was taken over), output until then".to_owned(),
        RunState::Cancelled => "cancelled by an operator, output until it stopped".to_owned(),
        other => other.as_str().to_owned(),
    };
    format!("{} run {}: {state} (saved at {})", saved.component, saved.generation, saved.saved_at)
}

/// Each stream under its own line (`--- stderr, K of N bytes kept ---`).
fn streams_text(output: &RunOutput) -> String {
    let mut text = String::new();
    for stream in &output.streams {
        let cut = if stream.omitted_bytes > 0 {
            format!(", {} of {} bytes kept", stream.kept_bytes(), stream.total_bytes())
        } else {
            String::new()
        };
        text.push_str(&format!("--- {}{cut} ---\n", autocomp_toolkit::terminal::one_line(&stream.name)));
        let body = stream.text();
        text.push_str(&body);
        if !body.ends_with('\n') {
            text.push('\n');
        }
    }
    text
}

pub(super) fn attempt_text(attempt: &Attempt<'_>) -> String {
    let event = attempt.event;
    let took =
        event.details.get("duration_ms").and_then(Value::as_u64).map_or_else(String::new, |ms| {
            format!(", took {}", crate::operator::duration_text(Duration::from_millis(ms)))
        });
    let mut outcome = event.outcome.as_str().to_owned();
    for flag in ["timed_out", "transient", "cancelled"] {
        if event.flag(flag) {
            outcome = format!("{outcome} ({})", flag.replace('_', " "));
        }
    }
    let mut text = format!(
        "== {} attempt {} (seq {}, run {}): {outcome} at {}{took} ==\n",
        attempt.component, attempt.number, event.seq, attempt.generation, event.at
    );
    match attempt.output.as_ref().filter(|output| !output.streams.is_empty()) {
        Some(output) => text.push_str(&streams_text(output)),
        None => text.push_str("(no output kept)\n"),
    }
    text
}

fn attempt_json<'a>(attempt: &'a Attempt<'_>) -> AttemptJson<'a> {
    let event = attempt.event;
    AttemptJson {
        component: attempt.component,
        attempt: attempt.number,
        seq: event.seq,
        outcome: event.outcome,
        at: event.at,
        duration_ms: event.details.get("duration_ms"),
        run: attempt.generation,
        timed_out: event.flag("timed_out"),
        transient: event.flag("transient"),
        cancelled: event.flag("cancelled"),
        output: attempt.output.as_ref().unwrap_or(NO_OUTPUT),
    }
}

#[cfg(test)]
mod tests {
    use autocomp_model::{Agent, BatchId, EventType, OutputStream, RunRef};
    use serde_json::json;

    use super::*;

    #[test]
    fn an_attempt_reads_as_a_header_and_its_streams_with_the_cut_marked() {
        let stream =
            OutputStream { name: "stderr".into(), head: "first\n".into(), tail: "last".into(), omitted_bytes: 90 };
        let output = RunOutput { streams: vec![stream] };
        let event = Event {
            seq: Seq(7),
            batch_id: BatchId::new("B1").unwrap(),
            event_type: EventType::new("Ocr_Done").unwrap(),
            outcome: Outcome::Failure,
            agent: Agent::new("ocr/1@h#1").unwrap(),
            at: Timestamp(0),
            details: json!({"duration_ms": 1500, "timed_out": true, "output": output}),
            run: Some(RunRef { component: ComponentName::new("ocr").unwrap(), generation: 1 }),
            resets: Vec::new(),
        };
        let component = ComponentName::new("ocr").unwrap();
        let attempt =
            Attempt { component: &component, number: 2, generation: 1, event: &event, output: event.output() };
        let text = attempt_text(&attempt);
        assert!(text.starts_with("== ocr attempt 2 (seq 7, run 1): failure (timed out) at 1970-"), "{text}");
        assert!(
            text.contains(
                ", took 1.5s ==\n--- stderr, 10 of 100 bytes kept ---\nfirst\n[... 90 bytes not kept ...]\nlast\n"
            ),
            "{text}"
        );
        let json = serde_json::to_value(attempt_json(&attempt)).unwrap();
        assert_eq!((json["attempt"].as_u64(), json["seq"].as_i64()), (Some(2), Some(7)));
        assert_eq!(json["output"]["streams"][0]["tail"], "last");
        let only_stdout = selected_streams(output, Some("stdout"));
        assert!(only_stdout.streams.is_empty());
    }
}
