//! `autocomp show`: one batch without reading its whole log: its head (header, effective
//! view, open runs, each component's state, its timeline) and one page of its log, with how
//! to see the rest; `--all` streams the whole log a page at a time, `--event SEQ` prints one
//! event whole. The view, its JSON (`BatchJson`, `EventJson`), its text and the command.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use autocomp_model::{BatchId, ComponentName, ComponentState, Event, EventType, Outcome, RunRef, Seq, Timestamp};
use autocomp_store::port::DETAILS_SHOWN_BYTES;
use autocomp_store::{BatchHead, LogCursor, LogPage, MAX_LOG_PAGE, ObjectStore};
use serde::Serialize;
use serde_json::{Map, Value};

use super::columns::table;
use super::older_results::{OlderResult, older_results};
use super::timeline::{Timeline, TimelineJson};
use super::views::{Format, RunView, describe_run, json_document, render_as, size_text};
use super::{Operator, OperatorError};

/// How many events `autocomp show` lists unless told otherwise: the newest page.
pub const SHOW_EVENTS: usize = 50;

/// Which events of the log `autocomp show` lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogSpan {
    /// The newest `limit` events before this seq (`None`: the newest of all).
    Page { before: Option<Seq>, limit: usize },
    /// The whole log, read a page at a time and written as it is read (`--all`).
    All,
}

impl Default for LogSpan {
    fn default() -> Self {
        LogSpan::Page { before: None, limit: SHOW_EVENTS }
    }
}

/// `autocomp show`: one batch without reading its whole log: its head (header, effective
/// view, open runs, each component's state) and one page of its log, with how to see the
/// rest.
#[derive(Debug, Clone)]
pub struct BatchView {
    pub head: BatchHead,
    pub components: Vec<(ComponentName, ComponentState)>,
    /// The page shown (events oldest first); with `LogSpan::All` it is empty and the log is
    /// written after the head, page by page.
    pub log: LogPage,
    pub span: LogSpan,
    /// Per step, its attempts, waits and runs (`timeline::Timeline`).
    pub timeline: Timeline,
    /// Its effective results made under an older schema than their producers publish now.
    pub older_results: Vec<OlderResult>,
}

/// `show --format json`: the batch's head, its page of the log and how to reach the rest.
#[derive(Serialize)]
pub struct BatchJson<'a> {
    pub id: &'a BatchId,
    #[serde(rename = "type")]
    pub batch_type: &'a autocomp_model::BatchType,
    pub priority: i32,
    pub location: Option<&'a str>,
    pub metadata: &'a Map<String, Value>,
    pub created_seq: Seq,
    pub modified_seq: Seq,
    pub created_at: Timestamp,
    pub modified_at: Timestamp,
    pub as_of: Timestamp,
    pub stored_bytes: u64,
    pub components: BTreeMap<&'a ComponentName, ComponentState>,
    pub effective: BTreeMap<&'a EventType, EffectiveJson>,
    pub open_runs: Vec<RunView>,
    pub timeline: TimelineJson<'a>,
    /// Effective results made under an older schema, each with the rerun that refreshes it.
    pub older_results: &'a [OlderResult],
    /// Where the batch stands, in one line (`BatchView::verdict`).
    pub verdict: String,
    /// What a person runs next, null when nothing is theirs to do.
    pub next: Option<String>,
    /// Left out by `--all`, which writes the events after the head as it reads them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub events: Option<Vec<EventJson<'a>>>,
    pub log: LogJson,
}

/// An effective event in `show`'s JSON: its seq and outcome.
#[derive(Serialize)]
pub struct EffectiveJson {
    pub seq: Seq,
    pub outcome: Outcome,
}

/// Where the page shown sits in the log.
#[derive(Serialize)]
pub struct LogJson {
    pub total: u64,
    pub shown: u64,
    pub older_before: Option<Seq>,
    pub newer_after: Option<Seq>,
    pub older_command: Option<String>,
}

/// One event as `show --format json` lists it; details a page left out are null, with
/// their size and the command that prints them (`details_left_out`).
#[derive(Serialize)]
pub struct EventJson<'a> {
    pub seq: Seq,
    #[serde(rename = "type")]
    pub event_type: &'a EventType,
    pub outcome: Outcome,
    pub agent: &'a autocomp_model::Agent,
    pub at: Timestamp,
    pub details: &'a Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub details_left_out: Option<LeftOut>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run: Option<&'a RunRef>,
    #[serde(skip_serializing_if = "<[EventType]>::is_empty")]
    pub resets: &'a [EventType],
}

/// Details too large for a page: their size and the command that prints them.
#[derive(Serialize)]
pub struct LeftOut {
    pub bytes: u64,
    pub command: String,
}

impl<'a> EventJson<'a> {
    /// `page`: the page the event was read in, which knows whether it left its details out.
    pub fn of(event: &'a Event, page: Option<&LogPage>) -> Self {
        let left_out = page.and_then(|page| page.left_out(event.seq));
        EventJson {
            seq: event.seq,
            event_type: &event.event_type,
            outcome: event.outcome,
            agent: &event.agent,
            at: event.at,
            details: &event.details,
            details_left_out: left_out
                .map(|bytes| LeftOut { bytes, command: event_command(&event.batch_id, event.seq) }),
            run: event.run.as_ref(),
            resets: &event.resets,
        }
    }
}

/// One line about an event's report: its resets, flags, summary and first failure (the
/// monitor's log shows the same words; the structured result it shows on its own).
pub fn report_summary(event: &Event) -> Vec<String> {
    let details = &event.details;
    let mut notes = Vec::new();
    if event.event_type.is_reset() {
        let covered: Vec<&str> = event.resets.iter().map(EventType::as_str).collect();
        notes.push(format!("resets {}", covered.join(", ")));
    }
    for flag in ["cancelled", "skipped", "transient", "timed_out"] {
        if event.flag(flag) {
            notes.push(flag.to_owned());
        }
    }
    if let Some(summary) = details.get("summary").and_then(Value::as_str).filter(|s| !s.is_empty()) {
        notes.push(summary.to_owned());
    }
    if let Some(total) = details.get("failures_total").and_then(Value::as_u64).filter(|n| *n > 0) {
        let first = &details["failures"][0];
        let (reference, description) =
            (first["reference"].as_str().unwrap_or_default(), first["description"].as_str().unwrap_or_default());
        let reference = if reference.is_empty() { "the batch" } else { reference };
        notes.push(format!("{total} failures, first: {reference}: {description}"));
    }
    notes
}

/// `report_summary`, and the structured result in short.
fn report_line(event: &Event) -> String {
    let mut notes = report_summary(event);
    if let Some(result) = event.details.get(autocomp_model::RESULT_KEY) {
        let mut text = result.to_string();
        if text.chars().count() > 120 {
            text = text.chars().take(119).collect::<String>() + "…";
        }
        notes.push(format!("result {text}"));
    }
    notes.join("; ")
}

/// The log's table rows, one per event.
fn log_rows(events: &[Event]) -> Vec<Vec<String>> {
    events
        .iter()
        .map(|e| {
            vec![
                format!("  {}", e.seq),
                e.at.to_string(),
                e.event_type.to_string(),
                e.outcome.as_str().to_owned(),
                e.agent.to_string(),
                report_line(e),
            ]
        })
        .collect()
}

const LOG_HEADER: [&str; 6] = ["  seq", "at", "type", "outcome", "agent", "report"];

/// The command that prints one event whole.
fn event_command(batch: &BatchId, seq: Seq) -> String {
    format!("autocomp show {batch} --event {seq}")
}

/// Each event's details, pretty, under its seq and type; details the page left out (too
/// large to show) as their size and the command that prints them.
fn write_reports(out: &mut String, page: &LogPage) {
    for e in &page.events {
        if let Some(bytes) = page.left_out(e.seq) {
            let command = event_command(&e.batch_id, e.seq);
            let size = size_text(bytes);
            writeln!(out, "  seq {} {}: details of {size} left out; print them: {command}", e.seq, e.event_type).ok();
            continue;
        }
        let details = serde_json::to_string_pretty(&e.details).unwrap_or_default();
        writeln!(out, "  seq {} {}:", e.seq, e.event_type).ok();
        for line in details.lines() {
            writeln!(out, "    {line}").ok();
        }
    }
}

impl BatchView {
    /// `autocomp show --before SEQ --limit N`: the batch's head and one page of its log;
    /// never the whole log (`LogSpan::All` reads none of it: see `write_all`).
    pub async fn read(operator: &Operator, id: &BatchId, span: LogSpan) -> Result<BatchView, OperatorError> {
        let store = operator.store().await?;
        let pipeline = operator.pipeline(store.as_ref()).await?;
        let head = store.batch_head(id).await?;
        let components = pipeline.iter().map(|step| (step.name().clone(), step.state_of(&head))).collect();
        let log = match span {
            LogSpan::Page { before, limit } => {
                let cursor = before.map_or(LogCursor::Newest, LogCursor::Before);
                store.log_page_within(head.id(), cursor, limit, DETAILS_SHOWN_BYTES).await?
            }
            LogSpan::All => LogPage {
                events: Vec::new(),
                total: head.event_count,
                older: None,
                newer: None,
                details_left_out: Vec::new(),
            },
        };
        let timeline = super::timeline::timeline_of(store.as_ref(), &pipeline, &head).await?;
        let older_results = older_results(&head, &pipeline);
        Ok(BatchView { head, components, log, span, timeline, older_results })
    }

    pub fn render(&self, format: Format) -> String {
        render_as(format, || self.json(), || self.to_text())
    }

    /// The commands that show the pages before and after this one.
    fn page_commands(&self) -> (Option<String>, Option<String>) {
        let id = self.head.id();
        let limit = match self.span {
            LogSpan::Page { limit, .. } if limit != SHOW_EVENTS => format!(" --limit {limit}"),
            _ => String::new(),
        };
        let older = self.log.older.map(|seq| format!("autocomp show {id} --before {seq}{limit}"));
        // The page after: the newest events before the first event after it, if any.
        let newer = self.log.newer.map(|_| format!("autocomp show {id}{limit}"));
        (older, newer)
    }

    /// The JSON document, as a type.
    pub fn json(&self) -> BatchJson<'_> {
        let h = &self.head;
        let s = &h.summary;
        let effective =
            s.effective.iter().map(|e| (&e.event_type, EffectiveJson { seq: e.seq, outcome: e.outcome })).collect();
        let events = self.log.events.iter().map(|e| EventJson::of(e, Some(&self.log))).collect();
        let (verdict, next) = self.verdict();
        BatchJson {
            verdict,
            next,
            id: &s.id,
            batch_type: &s.batch_type,
            priority: s.priority,
            location: h.location(),
            metadata: &h.metadata,
            created_seq: s.created_seq,
            modified_seq: s.modified_seq,
            created_at: h.created_at,
            modified_at: h.modified_at,
            as_of: h.as_of,
            stored_bytes: h.stored_bytes,
            components: self.components.iter().map(|(name, state)| (name, *state)).collect(),
            effective,
            open_runs: h.open_runs.iter().map(RunView::from).collect(),
            timeline: self.timeline.json(),
            older_results: &self.older_results,
            events: Some(events),
            log: LogJson {
                total: self.log.total,
                shown: self.log.events.len() as u64,
                older_before: self.log.older,
                newer_after: self.log.newer,
                older_command: self.page_commands().0,
            },
        }
    }

    /// The JSON document as a value (tests and the monitor index into it).
    pub fn to_json(&self) -> Value {
        serde_json::to_value(self.json()).unwrap_or_default()
    }

    /// Where the batch stands, in one line, and what a person runs next if it is theirs to
    /// act: the first step (in pipeline order) that needs a person (failed, then waiting for
    /// a decision), else the first at work, retrying, ready, stale or waiting; "done" when
    /// every step succeeded (or was skipped). A batch whose history was pruned says where it
    /// went, and the import that brings it back.
    pub fn verdict(&self) -> (String, Option<String>) {
        let id = self.head.id();
        if let Some(marker) = self.head.effective_event(&autocomp_model::EventType::history_pruned()) {
            let file = super::retention::export_of(marker);
            let shown = autocomp_toolkit::terminal::one_line(&file.display().to_string()).into_owned();
            let pruned = format!("pruned: its history (seq {}, {}) is in {shown}", marker.seq, marker.at);
            return (pruned, Some(format!("autocomp import {}", super::retention::shell_word(&file))));
        }
        let first = |wanted: ComponentState| self.components.iter().find(|(_, state)| *state == wanted);
        if let Some((name, _)) = first(ComponentState::Failed) {
            let event_type = self.timeline.steps.iter().find(|step| step.component == *name).map(|s| &s.event_type);
            let failed = event_type.and_then(|t| self.head.effective_event(t));
            let why = failed.and_then(Event::failure_text);
            let why = why.map(|why| format!(": {}", autocomp_toolkit::terminal::one_line(&why))).unwrap_or_default();
            let rerun = failed.and_then(Event::failure_next).map_or_else(
                || format!("autocomp rerun {id} --component {name} --reason ..."),
                |next| autocomp_toolkit::terminal::one_line(next).into_owned(),
            );
            return (format!("failed at {name}{why}"), Some(rerun));
        }
        if let Some((name, _)) = first(ComponentState::Person) {
            let approve = format!("autocomp approve {id} --step {name} --reason ...   (or `autocomp reject`)");
            return (format!("waiting for a person at {name}"), Some(approve));
        }
        let named = |state: ComponentState, words: &str| first(state).map(|(name, _)| format!("{words} {name}"));
        let verdict = named(ComponentState::Working, "working:")
            .or_else(|| named(ComponentState::Retrying, "retrying a transient failure at"))
            .or_else(|| named(ComponentState::Ready, "ready for"))
            .or_else(|| named(ComponentState::Stale, "to be redone (its content changed) at"))
            .or_else(|| named(ComponentState::Acknowledged, "closed: an operator acknowledged its failure at"))
            .or_else(|| named(ComponentState::Waiting, "waiting at"));
        match verdict {
            Some(verdict) => (verdict, None),
            None if self.components.is_empty() => ("no components registered".into(), None),
            None => ("done: every step succeeded".into(), None),
        }
    }

    /// Everything above the log.
    fn head_text(&self) -> String {
        let h = &self.head;
        let s = &h.summary;
        let mut out = String::new();
        let (verdict, next) = self.verdict();
        writeln!(out, "{}: {verdict}", s.id).ok();
        if let Some(next) = next {
            writeln!(out, "next: {next}").ok();
        }
        writeln!(out).ok();
        writeln!(out, "batch {}  type {}  priority {}", s.id, s.batch_type, s.priority).ok();
        writeln!(out, "location {}", autocomp_toolkit::terminal::one_line(h.location().unwrap_or("(none)"))).ok();
        writeln!(
            out,
            "registered seq {} at {}; last content change seq {} at {}",
            s.created_seq, h.created_at, s.modified_seq, h.modified_at
        )
        .ok();
        writeln!(out, "stores {} of details and metadata in {} events", size_text(h.stored_bytes), h.event_count).ok();
        if !self.components.is_empty() {
            writeln!(out, "\ncomponents:").ok();
            let width = self.components.iter().map(|(name, _)| name.as_str().len()).max().unwrap_or(0);
            for (name, state) in &self.components {
                writeln!(out, "  {name:<width$}  {state}").ok();
            }
        }
        writeln!(out, "\nopen runs:").ok();
        if h.open_runs.is_empty() {
            writeln!(out, "  none").ok();
        }
        for run in &h.open_runs {
            writeln!(out, "  {}: {}", run.component, describe_run(run, h.as_of)).ok();
        }
        out.push_str(&self.effective_text());
        if !self.older_results.is_empty() {
            writeln!(out, "\nresults made under an older schema:").ok();
            for older in &self.older_results {
                writeln!(out, "  {}", older.line()).ok();
            }
        }
        out.push_str(&self.timeline.to_text());
        out
    }

    /// The effective view, a line per type, stale, skipped and transient results marked.
    fn effective_text(&self) -> String {
        let s = &self.head.summary;
        let mut out = String::from("\neffective view:\n");
        if s.effective.is_empty() {
            writeln!(out, "  (empty)").ok();
        }
        let width = s.effective.iter().map(|e| e.event_type.as_str().len()).max().unwrap_or(0);
        for e in &s.effective {
            let note = match e.content_seq {
                Some(content) if e.is_stale_at(s.modified_seq) => {
                    format!("  stale: worked out from the content of seq {content}, changed since")
                }
                _ if e.skipped => "  skipped".to_owned(),
                _ if e.transient => "  transient".to_owned(),
                _ => String::new(),
            };
            writeln!(out, "  {:<width$}  seq {}  {}{note}", e.event_type, e.seq, e.outcome.as_str()).ok();
        }
        out
    }

    fn to_text(&self) -> String {
        let mut out = self.head_text();
        let (total, shown) = (self.log.total, self.log.events.len());
        let which = match self.span {
            _ if shown as u64 == total => format!("{total} events, oldest first"),
            LogSpan::Page { before: Some(before), .. } => {
                format!("{total} events; the {shown} before seq {before}, oldest first")
            }
            _ => format!("{total} events; the newest {shown}, oldest first"),
        };
        writeln!(out, "\nlog ({which}):").ok();
        out.push_str(&table(&LOG_HEADER, &log_rows(&self.log.events)));
        let (older, newer) = self.page_commands();
        if let Some(older) = older {
            writeln!(out, "  older events: {older} (--limit N: up to {MAX_LOG_PAGE} a page; --all: the whole log)")
                .ok();
        }
        if let Some(newer) = newer {
            writeln!(out, "  newer events: {newer}").ok();
        }
        writeln!(out, "\nreports:").ok();
        write_reports(&mut out, &self.log);
        out
    }
}

/// The whole log of a batch, oldest first, a page (`MAX_LOG_PAGE` events) at a time, read by
/// size (details over `DETAILS_SHOWN_BYTES` left out): `each` gets every page in turn, and no
/// more than one page is held.
async fn for_each_page(
    store: &dyn ObjectStore,
    batch: &BatchId,
    mut each: impl FnMut(&LogPage) -> Result<(), OperatorError>,
) -> Result<(), OperatorError> {
    let mut after = Seq::ZERO;
    loop {
        let page = store.log_page_within(batch, LogCursor::After(after), MAX_LOG_PAGE, DETAILS_SHOWN_BYTES).await?;
        each(&page)?;
        match page.newer {
            Some(newer) => after = newer,
            None => return Ok(()),
        }
    }
}

/// Text or JSON written to the output, neutralized for the terminal (it comes from the
/// batch's events).
type Write<'w> = dyn FnMut(&str) -> Result<(), OperatorError> + 'w;

/// `autocomp show --all`: the head, then the whole log oldest first, read and written a page
/// at a time (`MAX_LOG_PAGE` events), so the log is never all in memory. Text lists the log,
/// then goes through it again for the reports; JSON streams `events`.
async fn write_all(
    operator: &Operator,
    id: &BatchId,
    format: Format,
    out: &mut dyn std::io::Write,
) -> Result<(), OperatorError> {
    let view = BatchView::read(operator, id, LogSpan::All).await?;
    let store = operator.store().await?;
    let written = |e: std::io::Error| OperatorError::usage(format!("cannot write the output: {e}"));
    let mut write = |text: &str| out.write_all(autocomp_toolkit::for_terminal(text).as_bytes()).map_err(written);
    match format {
        Format::Json => write_all_json(&view, store.as_ref(), &mut write).await,
        Format::Text => write_all_text(&view, store.as_ref(), &mut write).await,
    }
}

/// `show --all --format json`: the head's document without `events`, then `events` last,
/// an event at a time.
async fn write_all_json(view: &BatchView, store: &dyn ObjectStore, write: &mut Write<'_>) -> Result<(), OperatorError> {
    let mut head = view.json();
    head.events = None;
    head.log.shown = view.head.event_count;
    let head = json_document(&head);
    write(head.trim_end().strip_suffix('}').unwrap_or(&head).trim_end())?;
    write(",\n  \"events\": [")?;
    let mut first = true;
    for_each_page(store, view.head.id(), |page| {
        for event in &page.events {
            write(if first { "\n    " } else { ",\n    " })?;
            // Through `Value`, as the document prints: keys in name order.
            write(&serde_json::to_value(EventJson::of(event, Some(page))).unwrap_or_default().to_string())?;
            first = false;
        }
        Ok(())
    })
    .await?;
    write("\n  ]\n}\n")
}

/// `show --all`: the head, the log's table a page at a time, then every report.
async fn write_all_text(view: &BatchView, store: &dyn ObjectStore, write: &mut Write<'_>) -> Result<(), OperatorError> {
    let batch = view.head.id();
    write(&view.head_text())?;
    write(&format!("\nlog ({} events, oldest first):\n", view.head.event_count))?;
    let mut header = Some(&LOG_HEADER);
    for_each_page(store, batch, |page| {
        let rows = log_rows(&page.events);
        let text = match header.take() {
            Some(header) => table(header, &rows),
            // Later pages: the rows alone, aligned within their page.
            None => table(&LOG_HEADER, &rows).split_once('\n').map(|(_, rows)| rows.to_owned()).unwrap_or_default(),
        };
        write(&text)
    })
    .await?;
    write("\nreports:\n")?;
    for_each_page(store, batch, |page| {
        let mut text = String::new();
        write_reports(&mut text, page);
        write(&text)
    })
    .await
}

/// `autocomp show ID --event SEQ`: one event whole, details included (what a page that left
/// them out names), as JSON in either format: details are JSON.
async fn event_document(operator: &Operator, id: &BatchId, seq: i64) -> Result<String, OperatorError> {
    let store = operator.store().await?;
    let head = store.batch_head(id).await?;
    let found = autocomp_store::port::event_at(store.as_ref(), head.id(), Seq(seq)).await?;
    let event = found.ok_or_else(|| {
        autocomp_model::InvalidInput::new(
            "--event",
            seq.to_string(),
            format!("batch {} has no event with this seq", head.id()),
        )
    })?;
    Ok(json_document(&EventJson::of(&event, None)))
}

impl Operator {
    /// `autocomp show`: the batch's head and the newest page of its log.
    pub async fn show(&self, id: &BatchId) -> Result<BatchView, OperatorError> {
        BatchView::read(self, id, LogSpan::default()).await
    }

    /// `autocomp show --before SEQ --limit N`: see `BatchView::read`.
    pub async fn show_page(&self, id: &BatchId, span: LogSpan) -> Result<BatchView, OperatorError> {
        BatchView::read(self, id, span).await
    }

    /// `autocomp show --all`: see `write_all`.
    pub async fn show_all(
        &self,
        id: &BatchId,
        format: Format,
        out: &mut dyn std::io::Write,
    ) -> Result<(), OperatorError> {
        write_all(self, id, format, out).await
    }

    /// `autocomp show ID --event SEQ`: see `event_document`.
    pub async fn show_event(&self, id: &BatchId, seq: i64) -> Result<String, OperatorError> {
        event_document(self, id, seq).await
    }
}

#[cfg(test)]
#[path = "show_tests.rs"]
mod tests;
