//! The operator's read-only views: `show`, `status`, `explain`, `ready`, `locks`, and
//! `reindex` (which rebuilds the index, a cache, and writes nothing to the store). Each
//! returns a value that renders as text for people and as JSON (or CSV) for scripts.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use autocomp_model::{
    BatchFacts, BatchId, BatchSummary, Clause, ComponentName, Event, EventType, Outcome, Run, Seq, SummaryAt,
    Timestamp, Trigger,
};
use autocomp_sboi::{EngineOptions, IndexEngine, IndexError, IndexedBatch};
use autocomp_store::port::DETAILS_SHOWN_BYTES;
use autocomp_store::{BatchHead, LogCursor, LogPage, MAX_LOG_PAGE, ObjectStore};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{Value, json};

use super::columns::table;
use super::{Operator, OperatorError, Step};
use autocomp_framework::exit::RunError;
use autocomp_framework::locks::HeldLock;
use autocomp_model::{ComponentState, NotReady, RegisteredComponent, Steering, SteeringEntry};

/// `--format` of the single-batch views.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Text,
    Json,
}

/// A view as `--format` asks: its JSON as a document, or its text.
fn render_as(format: Format, json: impl FnOnce() -> Value, text: impl FnOnce() -> String) -> String {
    match format {
        Format::Json => json_document(&json()),
        Format::Text => text(),
    }
}

/// JSON as the commands print it: pretty, ending in a newline.
pub(crate) fn json_document(value: &Value) -> String {
    format!("{value:#}\n")
}

/// `--format` of the listing views.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TableFormat {
    Table,
    Json,
    Csv,
}

const PAGE: usize = 1_000;

/// What `explain` reads once per batch, whatever the component.
struct Seen {
    index_cursor: Seq,
    indexed: Option<IndexedBatch>,
    store_head: Seq,
    locks: Vec<HeldLock>,
    steering: Steering,
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

/// Whole seconds, as `1m 5s`.
fn age(duration: Duration) -> String {
    humantime::format_duration(Duration::from_secs(duration.as_secs())).to_string()
}

fn run_json(run: &Run) -> Value {
    let mut json = run.holder_json();
    json["claim_seq"] = json!(run.claim_seq);
    json
}

fn describe_run(run: &Run, now: Timestamp) -> String {
    format!(
        "generation {} held by {} on {} pid {} since {} ({})",
        run.generation,
        run.holder.agent,
        run.holder.host,
        run.holder.pid,
        run.started_at,
        age(now.since(run.started_at))
    )
}

/// A lock as JSON; `foreign` is why it is not a lock autocomp made (`null` for a real one).
fn lock_json(lock: &HeldLock, now: Timestamp) -> Value {
    let mut json = match &lock.holder {
        Some(holder) => json!({
            "path": lock.path,
            "agent": holder.agent,
            "host": holder.host,
            "pid": holder.pid,
            "since": holder.since,
            "age_seconds": now.since(holder.since).as_secs(),
        }),
        None => json!({"path": lock.path, "agent": null}),
    };
    json["foreign"] = json!(lock.foreign);
    json
}

/// Who holds a lock, in words: `free`, `FOREIGN node (<why>)`, or `held by <agent> on <host>
/// pid <pid> since <time> (<age>)`.
pub fn describe_lock(lock: Option<&HeldLock>, now: Timestamp) -> String {
    match lock {
        None => "free".into(),
        Some(HeldLock { foreign: Some(why), .. }) => format!("FOREIGN node, not a lock autocomp made ({why})"),
        Some(HeldLock { holder: None, .. }) => "held (holder not readable)".into(),
        Some(HeldLock { holder: Some(h), .. }) => {
            format!("held by {} on {} pid {} since {} ({})", h.agent, h.host, h.pid, h.since, age(now.since(h.since)))
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
    pub timeline: super::Timeline,
}

/// One event as `show --format json` lists it; details a page left out are null, with
/// their size and the command that prints them (`details_left_out`).
fn event_json(e: &Event, page: Option<&LogPage>) -> Value {
    let mut event = json!({
        "seq": e.seq, "type": e.event_type, "outcome": e.outcome, "agent": e.agent,
        "at": e.at, "details": e.details,
    });
    if let Some(bytes) = page.and_then(|page| page.left_out(e.seq)) {
        event["details_left_out"] = json!({"bytes": bytes, "command": event_command(&e.batch_id, e.seq)});
    }
    if let Some(run) = &e.run {
        event["run"] = json!({"component": run.component, "generation": run.generation});
    }
    if !e.resets.is_empty() {
        event["resets"] = json!(e.resets);
    }
    event
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
            writeln!(
                out,
                "  seq {} {}: details of {} left out; print them: {command}",
                e.seq,
                e.event_type,
                size_text(bytes)
            )
            .ok();
            continue;
        }
        let details = serde_json::to_string_pretty(&e.details).unwrap_or_default();
        writeln!(out, "  seq {} {}:", e.seq, e.event_type).ok();
        for line in details.lines() {
            writeln!(out, "    {line}").ok();
        }
    }
}

/// Bytes as people read them.
/// A size as people read it: `812 bytes`, `17.9 KiB`, `3.2 MiB`.
pub fn size_text(bytes: u64) -> String {
    match bytes {
        0..1024 => format!("{bytes} bytes"),
        1024..1_048_576 => format!("{:.1} KiB", bytes as f64 / 1024.0),
        _ => format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0)),
    }
}

impl BatchView {
    pub fn render(&self, format: Format) -> String {
        render_as(format, || self.to_json(), || self.to_text())
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

    pub fn to_json(&self) -> Value {
        let h = &self.head;
        let s = &h.summary;
        let effective: serde_json::Map<String, Value> = s
            .effective
            .iter()
            .map(|e| (e.event_type.to_string(), json!({"seq": e.seq, "outcome": e.outcome})))
            .collect();
        let components: serde_json::Map<String, Value> =
            self.components.iter().map(|(name, state)| (name.to_string(), json!(state.as_str()))).collect();
        let (older, _) = self.page_commands();
        json!({
            "id": s.id,
            "type": s.batch_type,
            "priority": s.priority,
            "location": h.location(),
            "metadata": h.metadata,
            "created_seq": s.created_seq,
            "modified_seq": s.modified_seq,
            "created_at": h.created_at,
            "modified_at": h.modified_at,
            "as_of": h.as_of,
            "stored_bytes": h.stored_bytes,
            "components": components,
            "effective": effective,
            "open_runs": h.open_runs.iter().map(run_json).collect::<Vec<_>>(),
            "timeline": self.timeline.to_json(),
            "events": self.log.events.iter().map(|e| event_json(e, Some(&self.log))).collect::<Vec<_>>(),
            "log": {
                "total": self.log.total,
                "shown": self.log.events.len(),
                "older_before": self.log.older,
                "newer_after": self.log.newer,
                "older_command": older,
            },
        })
    }

    /// Everything above the log.
    fn head_text(&self) -> String {
        let h = &self.head;
        let s = &h.summary;
        let mut out = String::new();
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
        writeln!(out, "\neffective view:").ok();
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
        out.push_str(&self.timeline.to_text());
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

/// `autocomp status`: per batch, each component's state.
#[derive(Debug, Clone)]
pub struct StatusView {
    pub components: Vec<ComponentName>,
    pub rows: Vec<(BatchId, Vec<ComponentState>)>,
    /// The holds on the pipeline (`hold_lines`), written under the table.
    pub held: Vec<String>,
}

impl StatusView {
    /// Written row by row into the output, never as a tree of values or cells first: a
    /// store of 200,000 batches renders in tens of megabytes, not hundreds.
    pub fn render(&self, format: TableFormat) -> String {
        match format {
            TableFormat::Json => {
                if self.rows.is_empty() {
                    return json_document(&Value::Array(Vec::new()));
                }
                // Each row as `json_document` would write it in the array, so the output
                // is the same document: keys (and component names) in name order.
                let mut names: Vec<(usize, &ComponentName)> = self.components.iter().enumerate().collect();
                names.sort_by(|a, b| a.1.cmp(b.1));
                let mut out = String::with_capacity(self.rows.len() * (40 + 30 * self.components.len()));
                out.push('[');
                for (n, (id, states)) in self.rows.iter().enumerate() {
                    out.push_str(if n == 0 { "\n  {\n" } else { ",\n  {\n" });
                    if names.is_empty() {
                        out.push_str("    \"components\": {},\n");
                    } else {
                        out.push_str("    \"components\": {\n");
                        for (i, (column, name)) in names.iter().enumerate() {
                            let comma = if i + 1 < names.len() { "," } else { "" };
                            writeln!(out, "      {}: \"{}\"{comma}", json!(name), states[*column]).ok();
                        }
                        out.push_str("    },\n");
                    }
                    writeln!(out, "    \"id\": {}", json!(id)).ok();
                    out.push_str("  }");
                }
                out.push_str("\n]\n");
                out
            }
            // Ids, component names and states are all [A-Za-z0-9._-]: nothing to quote.
            TableFormat::Csv => {
                let mut out = String::from("id");
                for name in &self.components {
                    write!(out, ",{name}").ok();
                }
                out.push('\n');
                for (id, states) in &self.rows {
                    out.push_str(id.as_str());
                    for state in states {
                        write!(out, ",{state}").ok();
                    }
                    out.push('\n');
                }
                out
            }
            // As `table` lays it out: left-aligned columns two spaces apart.
            TableFormat::Table => {
                let mut widths: Vec<usize> =
                    std::iter::once("batch".len()).chain(self.components.iter().map(|c| c.as_str().len())).collect();
                for (id, states) in &self.rows {
                    widths[0] = widths[0].max(id.as_str().len());
                    for (width, state) in widths[1..].iter_mut().zip(states) {
                        *width = (*width).max(state.as_str().len());
                    }
                }
                let line_length = widths.iter().map(|w| w + 2).sum::<usize>();
                let mut out = String::with_capacity((self.rows.len() + 1) * line_length);
                let mut line = |cells: &mut dyn Iterator<Item = &str>| {
                    let start = out.len();
                    for (cell, width) in cells.zip(&widths) {
                        write!(out, "{cell:<width$}  ").ok();
                    }
                    out.truncate(out[start..].trim_end().len() + start);
                    out.push('\n');
                };
                line(&mut std::iter::once("batch").chain(self.components.iter().map(ComponentName::as_str)));
                for (id, states) in &self.rows {
                    line(&mut std::iter::once(id.as_str()).chain(states.iter().map(|s| s.as_str())));
                }
                if !self.held.is_empty() {
                    out.push_str("\nheld (no new work is claimed):\n");
                    for held in &self.held {
                        writeln!(out, "  {held}").ok();
                    }
                }
                out
            }
        }
    }
}

/// `autocomp pipeline`: every component in the registry, how its trigger reads, where and
/// when it last ran.
#[derive(Debug, Clone)]
pub struct PipelineView {
    /// In pipeline order, retired ones last.
    pub components: Vec<RegisteredComponent>,
    /// Holds, pools and breaker counts.
    pub steering: Steering,
    /// The newest entries of the steering log, newest first.
    pub log: Vec<SteeringEntry>,
    /// The store's clock, for ages.
    pub now: Timestamp,
}

/// A trigger as one line of clauses: `requires Data_Received, blocked_by Checksums_Verified`.
fn trigger_text(descriptor: &autocomp_model::ComponentDescriptor) -> String {
    if descriptor.source {
        return "(source: records it when a delivery arrives)".into();
    }
    let clauses: Vec<String> = descriptor.trigger.clauses().map(|c| c.to_string()).collect();
    if clauses.is_empty() { "(every batch)".into() } else { clauses.join(", ") }
}

impl PipelineView {
    pub fn render(&self, format: Format) -> String {
        render_as(format, || self.to_json(), || self.to_text())
    }

    pub fn to_json(&self) -> Value {
        let components: Vec<Value> = self
            .components
            .iter()
            .map(|c| {
                let mut entry = serde_json::to_value(c).unwrap_or_default();
                entry["last_seen"] = json!(c.last_seen());
                entry["seconds_since_last_seen"] = json!(c.last_seen().map(|t| self.now.since(t).as_secs()));
                entry
            })
            .collect();
        let contracts: Vec<Value> = self
            .read_checks()
            .iter()
            .map(|check| {
                json!({
                    "reader": check.reader.name,
                    "reader_version": check.reader.version,
                    "event_type": check.read.event_type,
                    "requires": autocomp_model::required_fields(&check.read.schema),
                    "producer": check.producer.map(|p| &p.name),
                    "producer_version": check.producer.map(|p| &p.version),
                    // null: not checked (no producer registered, or it publishes no schema).
                    "compatible": check.verdict.as_ref().map(Result::is_ok),
                    "broken": check.broken(),
                })
            })
            .collect();
        json!({
            "now": self.now,
            "components": components,
            "contracts": contracts,
            "steering": self.steering,
            "steering_log": self.log,
        })
    }

    /// Each read of an active component, checked against what its producer publishes
    /// (`model::check_reads`): a broken contract shows before a pass refuses to start.
    pub fn read_checks(&self) -> Vec<autocomp_model::ReadCheck<'_>> {
        let active: Vec<&autocomp_model::ComponentDescriptor> =
            self.components.iter().filter(|c| !c.is_retired()).map(|c| &c.descriptor).collect();
        active.iter().flat_map(|reader| autocomp_model::check_reads(reader, &active)).collect()
    }

    /// The results the steps publish (their top-level fields) and read (the fields they
    /// require), and every broken contract; nothing when no step publishes or reads one.
    fn results_text(&self) -> String {
        let mut out = String::new();
        for c in self.components.iter().filter(|c| !c.is_retired()) {
            let d = &c.descriptor;
            if let Some(schema) = &d.result_schema {
                let fields = autocomp_model::published_fields(schema);
                let fields = if fields.is_empty() { "(no fields listed)".to_owned() } else { fields.join(", ") };
                writeln!(out, "  {} {} result: {fields}", d.name, d.event_type).ok();
            }
        }
        let checks = self.read_checks();
        for check in &checks {
            let fields = autocomp_model::required_fields(&check.read.schema);
            let fields = if fields.is_empty() { "(no field required)".to_owned() } else { fields.join(", ") };
            let verdict = match (&check.verdict, check.producer) {
                (_, None) => " (no component records it yet: not checked)".to_owned(),
                (None, Some(p)) => format!(" ({} publishes no schema: not checked)", p.name),
                (Some(Ok(())), Some(p)) => format!(" (compatible with {} {})", p.name, p.version),
                (Some(Err(_)), Some(_)) => " (BROKEN: see below)".to_owned(),
            };
            writeln!(out, "  {} reads {}: {fields}{verdict}", check.reader.name, check.read.event_type).ok();
        }
        let broken: Vec<String> = checks.iter().filter_map(|check| check.broken()).collect();
        if !broken.is_empty() {
            out.push_str("\nbroken contracts (the reader's passes do not start, exit 2):\n");
            for line in broken {
                writeln!(out, "  {line}").ok();
            }
        }
        if out.is_empty() { out } else { format!("\nresults and what reads them:\n{out}") }
    }

    fn to_text(&self) -> String {
        if self.components.is_empty() {
            return "no component has run a pass against this store yet\n".into();
        }
        let rows: Vec<Vec<String>> = self
            .components
            .iter()
            .map(|c| {
                let d = &c.descriptor;
                let hosts: Vec<String> = c
                    .hosts
                    .iter()
                    .map(|h| {
                        let outcome = if h.running() {
                            "running".to_owned()
                        } else {
                            h.outcome.map_or("-".to_owned(), |o| o.as_str().to_owned())
                        };
                        format!("{} ({outcome})", h.host)
                    })
                    .collect();
                let seen = match c.last_seen() {
                    Some(t) => format!("{} ago", age(self.now.since(t))),
                    None => "never".into(),
                };
                let state = match (&c.retired, self.steering.hold_of(&d.name)) {
                    (Some(r), _) => format!("retired {} by {}: {}", r.at, r.by, r.reason),
                    (None, Some(hold)) => hold.kind.as_str().to_owned(),
                    (None, None) if d.manual => "human step".into(),
                    (None, None) => "active".into(),
                };
                vec![
                    d.name.to_string(),
                    d.event_type.to_string(),
                    trigger_text(d),
                    hosts.join(", "),
                    seen,
                    d.version.clone(),
                    state,
                ]
            })
            .collect();
        let mut out =
            table(&["component", "records", "trigger", "hosts (last pass)", "last seen", "version", "state"], &rows);
        out.push_str(&self.results_text());
        out.push_str(&self.steering_text());
        out
    }

    /// Holds, pools, breaker counts and the newest steering changes, each section only when
    /// it has something to say.
    fn steering_text(&self) -> String {
        let mut out = String::new();
        let held = super::hold_lines(&self.steering);
        if !held.is_empty() {
            out.push_str("\nheld (no new work is claimed):\n");
            for line in held {
                writeln!(out, "  {line}").ok();
            }
        }
        if !self.steering.pools.is_empty() {
            out.push_str("\npools:\n");
            for (name, pool) in &self.steering.pools {
                let reason = autocomp_toolkit::terminal::one_line(&pool.reason);
                writeln!(out, "  {name}: size {} (set by {} at {}: {reason})", pool.size, pool.by, pool.since).ok();
            }
        }
        if !self.steering.breakers.is_empty() {
            out.push_str("\ncircuit breakers:\n");
            for (name, breaker) in &self.steering.breakers {
                let last =
                    breaker.last.as_deref().map(|last| format!(", last: {}", autocomp_toolkit::terminal::one_line(last)));
                let last = last.unwrap_or_default();
                writeln!(out, "  {name}: {} consecutive failures{last}", breaker.consecutive).ok();
            }
        }
        if !self.log.is_empty() {
            out.push_str("\nsteering log (newest first):\n");
            for entry in &self.log {
                let (said, reason) = (&entry.said, autocomp_toolkit::terminal::one_line(&entry.reason));
                writeln!(out, "  {} v{} {}: {said} ({reason})", entry.at, entry.version, entry.by).ok();
            }
        }
        out
    }
}

/// One trigger clause, evaluated in the store and in the index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClauseCheck {
    /// As written in a config: `requires Data_Received`.
    pub clause: String,
    pub store: bool,
    /// `None` when the index has no document for the batch.
    pub index: Option<bool>,
}

fn checks(trigger: &Trigger, batch: &impl BatchFacts, indexed: Option<&IndexedBatch>) -> Vec<ClauseCheck> {
    let now = batch.read_at();
    trigger
        .explain(batch, now)
        .into_iter()
        .map(|(clause, store)| ClauseCheck {
            clause: clause.to_string(),
            store,
            index: indexed.map(|doc| holds_in_index(&clause, doc, now)),
        })
        .collect()
}

fn all_hold(checks: &[ClauseCheck]) -> (bool, Option<bool>) {
    let index = checks.iter().map(|c| c.index).collect::<Option<Vec<bool>>>();
    (checks.iter().all(|c| c.store), index.map(|all| all.iter().all(|holds| *holds)))
}

/// A clause as the index answers it: over the terms `sboi`'s document precomputes from the
/// effective view (`present`, `succeeded`, `old`, `transient`, `last_activity`), the way
/// `sboi`'s query translates it. For diagnosis only: readiness is decided by the query.
fn holds_in_index(clause: &Clause<'_>, doc: &IndexedBatch, now: Timestamp) -> bool {
    let has = |terms: &[String], t: &EventType| terms.iter().any(|term| term == t.as_str());
    match clause {
        Clause::Types(types) => types.iter().any(|t| t.as_str() == doc.batch_type),
        Clause::Batches(ids) => ids.iter().any(|id| id.as_str() == doc.id),
        Clause::Requires(t) => has(&doc.succeeded, t),
        Clause::BlockedBy(t) => !has(&doc.present, t),
        // Not "current": absent, or older than the last content change.
        Clause::RepeatOnChange(t) => !has(&doc.present, t) || has(&doc.old, t),
        Clause::TransientlyFailed(t) => has(&doc.transient, t),
        Clause::SettledFor(quiet) => {
            let quiet_ms = i64::try_from(quiet.as_nanos().div_ceil(1_000_000)).unwrap_or(i64::MAX);
            quiet.is_zero() || doc.last_activity.millis() <= now.millis().saturating_sub(quiet_ms)
        }
    }
}

/// The retry path of a transient failure: the runner's retry trigger and its window.
#[derive(Debug, Clone)]
pub struct RetryWindow {
    pub failure: Event,
    pub backoff: Duration,
    /// When `settled_for` of the retry trigger is over (last activity + the backoff).
    pub opens_at: Timestamp,
    pub clauses: Vec<ClauseCheck>,
    pub ready_in_store: bool,
    pub ready_in_index: Option<bool>,
}

/// `autocomp explain`: why a batch is or is not ready for a component, clause by clause.
#[derive(Debug, Clone)]
pub struct Explanation {
    pub batch: BatchId,
    pub component: ComponentName,
    pub event_type: EventType,
    pub state: ComponentState,
    /// The store's clock when the batch was read; every clause is evaluated at it.
    pub as_of: Timestamp,
    pub clauses: Vec<ClauseCheck>,
    pub ready_in_store: bool,
    /// `None` when the index holds no document for the batch.
    pub ready_in_index: Option<bool>,
    pub retry: Option<RetryWindow>,
    /// Why a pass would not work on it (`None` when it would): the clause, its type and
    /// what the batch holds, or the retry backoff still running.
    pub refusal: Option<NotReady>,
    /// The component's own effective event, if any.
    pub result: Option<Event>,
    pub open_run: Option<Run>,
    pub batch_lock: Option<HeldLock>,
    pub poll_lock: Option<HeldLock>,
    /// Abandoned or transient runs since the last Reset of the component's type.
    pub failed_attempts: u32,
    pub max_attempts: u32,
    pub index_cursor: Seq,
    pub store_head: Seq,
    /// When a required step has not succeeded: the chain of steps back to what holds the
    /// batch up ("checksum-verifier failed at seq 54: ..."), nearest first.
    pub held_up_by: Vec<String>,
    /// A human step: a person decides it (`approve` / `reject`), no pass works on it.
    pub manual: bool,
    /// Why no pass claims anything of the component now, when it is held: "paused by
    /// operator:ann since ...: reason" (its own hold, else the whole pipeline's).
    pub held: Option<String>,
}

impl Explanation {
    /// One line: the verdict.
    /// Whether the component's own effective result is what blocks it (its event type is in
    /// its `blocked_by`, as every component's is by default).
    fn own_result_blocks(&self) -> bool {
        let own = format!("blocked_by {}", self.event_type);
        self.result.is_some() && self.clauses.iter().any(|c| c.clause == own && !c.store)
    }

    pub fn verdict(&self) -> String {
        if let Some(run) = &self.open_run {
            return format!("working: run {} held by {}", run.generation, run.holder.agent);
        }
        if let Some(held) = &self.held {
            let otherwise = if self.refusal.is_none() { " (ready otherwise)" } else { "" };
            return format!("held: {held}{otherwise}");
        }
        // The refusal is the readiness rule's own answer; the clauses only say why.
        match &self.refusal {
            None if self.manual => {
                "waiting for a person: every clause holds in the store (`autocomp approve` or `reject` decides it)"
                    .into()
            }
            None if self.ready_in_store => "ready: every clause holds in the store".into(),
            None => match self.retry.as_ref().filter(|r| r.ready_in_store) {
                Some(retry) => format!("ready to retry its transient failure (seq {})", retry.failure.seq),
                None => "ready".into(),
            },
            Some(refusal) if refusal.clause == "source" => format!("source: {refusal}"),
            Some(refusal) if refusal.retrying => format!("retrying: {refusal}"),
            // Blocked by its own result: the step is done (or failed), not waiting for anything.
            Some(refusal) if refusal.clause == "blocked_by" && self.own_result_blocks() => {
                let result = self.result.as_ref().expect("own_result_blocks checked it");
                match result.failure_reason().filter(|_| result.outcome == Outcome::Failure) {
                    Some(reason) => {
                        let reason = autocomp_toolkit::terminal::one_line(&reason);
                        format!("failed at seq {}: {reason} (a rerun tries again)", result.seq)
                    }
                    None if result.outcome == Outcome::Failure => {
                        format!("failed at seq {} (a rerun tries again)", result.seq)
                    }
                    None if result.is_skipped() => format!("done: skipped at seq {} by {}", result.seq, result.agent),
                    None => format!("done: its result is a success, seq {}", result.seq),
                }
            }
            Some(refusal) => format!("not ready: {refusal}"),
        }
    }

    pub fn render(&self, format: Format) -> String {
        render_as(format, || self.to_json(), || self.to_text())
    }

    pub fn to_json(&self) -> Value {
        let clauses = |checks: &[ClauseCheck]| -> Value {
            checks.iter().map(|c| json!({"clause": c.clause, "store": c.store, "index": c.index})).collect()
        };
        json!({
            "id": self.batch,
            "component": self.component,
            "event_type": self.event_type,
            "state": self.state.as_str(),
            "verdict": self.verdict(),
            "as_of": self.as_of,
            "clauses": clauses(&self.clauses),
            "ready_in_store": self.ready_in_store,
            "ready_in_index": self.ready_in_index,
            "refusal": self.refusal.as_ref().map(|r| json!({"clause": r.clause, "reason": r.reason, "retrying": r.retrying})),
            "retry": self.retry.as_ref().map(|r| json!({
                "failure_seq": r.failure.seq,
                "backoff_seconds": r.backoff.as_secs(),
                "opens_at": r.opens_at,
                "clauses": clauses(&r.clauses),
                "ready_in_store": r.ready_in_store,
                "ready_in_index": r.ready_in_index,
            })),
            "result": self.result.as_ref().map(|e| json!({
                "seq": e.seq, "outcome": e.outcome, "agent": e.agent, "at": e.at,
            })),
            "open_run": self.open_run.as_ref().map(run_json),
            "batch_lock": self.batch_lock.as_ref().map(|l| lock_json(l, Timestamp::now())),
            "poll_lock": self.poll_lock.as_ref().map(|l| lock_json(l, Timestamp::now())),
            "failed_attempts": self.failed_attempts,
            "max_attempts": self.max_attempts,
            "index_cursor": self.index_cursor,
            "store_head": self.store_head,
            "held_up_by": self.held_up_by,
            "manual": self.manual,
            "held": self.held,
        })
    }

    fn to_text(&self) -> String {
        let mut out = String::new();
        let mark = |holds: bool| if holds { "pass" } else { "FAIL" };
        let index_mark = |holds: Option<bool>| holds.map_or("absent", mark);
        let rows = |checks: &[ClauseCheck]| -> Vec<Vec<String>> {
            checks
                .iter()
                .map(|c| vec![format!("  {}", c.clause), mark(c.store).into(), index_mark(c.index).into()])
                .collect()
        };
        writeln!(out, "{} for {} (records {}): {}", self.batch, self.component, self.event_type, self.state).ok();
        writeln!(out, "{}", self.verdict()).ok();
        for (depth, cause) in self.held_up_by.iter().enumerate() {
            writeln!(out, "{:width$}because {cause}", "", width = 2 * (depth + 1)).ok();
        }
        writeln!(out, "evaluated at {} (store clock)\n", self.as_of).ok();
        if self.clauses.is_empty() {
            writeln!(out, "  (the trigger has no clauses: every batch is ready)").ok();
        } else {
            out.push_str(&table(&["  clause", "store", "index"], &rows(&self.clauses)));
        }
        writeln!(
            out,
            "  => store: {}; index: {}",
            if self.ready_in_store { "ready" } else { "not ready" },
            match self.ready_in_index {
                Some(true) => "ready",
                Some(false) => "not ready",
                None => "no document for this batch (run `autocomp reindex` if the store has it)",
            }
        )
        .ok();
        if let Some(retry) = &self.retry {
            let now = self.as_of;
            let window = if retry.opens_at <= now {
                format!("open since {}", retry.opens_at)
            } else {
                format!("opens at {} (in {})", retry.opens_at, age(retry.opens_at.since(now)))
            };
            writeln!(
                out,
                "\nretry of the transient failure seq {} at {}: retry_backoff {}, window {window}",
                retry.failure.seq,
                retry.failure.at,
                humantime::format_duration(retry.backoff)
            )
            .ok();
            out.push_str(&table(&["  retry clause", "store", "index"], &rows(&retry.clauses)));
        }
        writeln!(out).ok();
        match &self.result {
            Some(e) => writeln!(
                out,
                "result: {} {} seq {} by {} at {}{}",
                e.event_type,
                e.outcome.as_str(),
                e.seq,
                e.agent,
                e.at,
                if self.state == ComponentState::Stale {
                    " (stale: the batch's content changed after it was worked out; it counts for nothing)"
                } else {
                    ""
                }
            ),
            None => writeln!(out, "result: none"),
        }
        .ok();
        match &self.result {
            Some(e) if e.outcome == autocomp_model::Outcome::Failure && !e.is_transient_failure() => writeln!(
                out,
                "attempts: the last one failed permanently (seq {}); it is not retried until an operator reruns it",
                e.seq
            ),
            _ => {
                let attempts_note = if self.failed_attempts >= self.max_attempts {
                    " (the next claim gives up: it records a plain failure without working)"
                } else {
                    ""
                };
                writeln!(
                    out,
                    "retries used since the last reset: {} of max_attempts {} (abandoned runs and transient failures \
                     count){attempts_note}",
                    self.failed_attempts, self.max_attempts
                )
            }
        }
        .ok();
        let run = self.open_run.as_ref().map_or("none".into(), |run| describe_run(run, self.as_of));
        writeln!(out, "open run: {run}").ok();
        let now = Timestamp::now();
        writeln!(
            out,
            "batch lock batch/{}/{}: {}",
            self.component,
            self.batch,
            describe_lock(self.batch_lock.as_ref(), now)
        )
        .ok();
        writeln!(out, "poll lock poll/{}: {}", self.component, describe_lock(self.poll_lock.as_ref(), now)).ok();
        let lag = self.store_head.0.saturating_sub(self.index_cursor.0);
        writeln!(
            out,
            "index: committed up to seq {}, store head seq {} (behind by {lag})",
            self.index_cursor, self.store_head
        )
        .ok();
        out
    }
}

/// Why `step` waits on `batch`, followed back along the `requires` chain to its root: for
/// the first required type without an effective success, the step that records it and what
/// that step's state is; a step that is itself waiting is followed further. Bounded by the
/// pipeline's length, so a cycle in the configuration cannot loop.
fn held_up_by(pipeline: &[Step], step: &Step, batch: &BatchHead) -> Vec<String> {
    let mut causes = Vec::new();
    let mut current = step;
    for _ in 0..pipeline.len() {
        // A stale success counts as none: the requirement does not hold.
        let missing = current.trigger().requires.iter().find(|required| {
            !batch.summary.current_of(required).is_some_and(|event| event.outcome == autocomp_model::Outcome::Success)
        });
        let Some(missing) = missing else { break };
        let Some(producer) = pipeline.iter().find(|other| other.event_type() == missing) else {
            causes.push(format!("{} waits for {missing}, which no component of the pipeline records", current.name()));
            break;
        };
        let state = producer.state_of(batch);
        let what = match (state, batch.effective_event(missing)) {
            (ComponentState::Failed | ComponentState::Retrying, Some(event)) => {
                let said = report_summary(event).into_iter().next();
                let said =
                    said.map(|line| format!(": {}", autocomp_toolkit::terminal::one_line(&line))).unwrap_or_default();
                let kind = if state == ComponentState::Retrying { "failed transiently (retrying)" } else { "failed" };
                format!("{} {kind} at seq {}{said}", producer.name(), event.seq)
            }
            (ComponentState::Working, _) => format!("{} is working on it", producer.name()),
            (ComponentState::Ready, _) => format!("{} is ready and waits for its next pass", producer.name()),
            (state, _) => format!("{} is {}", producer.name(), state.as_str()),
        };
        causes.push(format!("{} waits for {missing}: {what}", current.name()));
        if state != ComponentState::Waiting || std::ptr::eq(producer, current) {
            break;
        }
        current = producer;
    }
    causes
}

/// One candidate of `autocomp ready`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CandidateView {
    pub id: BatchId,
    pub priority: i32,
    pub would_claim: bool,
    /// Why (not): `would claim`, `locked by ...`, `not ready in the store: ...`.
    pub verdict: String,
}

/// `autocomp ready`: what a pass of the component would claim now, in claim order.
#[derive(Debug, Clone)]
pub struct ReadyView {
    pub component: ComponentName,
    pub queue_size: usize,
    pub candidates: Vec<CandidateView>,
}

impl ReadyView {
    pub fn render(&self, format: Format) -> String {
        match format {
            Format::Json => {
                let rows: Vec<Value> = self
                    .candidates
                    .iter()
                    .map(|c| {
                        json!({"id": c.id, "priority": c.priority, "would_claim": c.would_claim, "verdict": c.verdict})
                    })
                    .collect();
                json_document(&Value::Array(rows))
            }
            Format::Text if self.candidates.is_empty() => format!("nothing is ready for {}\n", self.component),
            Format::Text => {
                let claimed = self.candidates.iter().filter(|c| c.would_claim).count();
                let mut out = format!(
                    "{} would claim {claimed} batch(es) now (queue_size {}), in this order:\n",
                    self.component, self.queue_size
                );
                let rows: Vec<Vec<String>> = self
                    .candidates
                    .iter()
                    .map(|c| vec![format!("  {}", c.id), c.priority.to_string(), c.verdict.clone()])
                    .collect();
                out.push_str(&table(&["  batch", "priority", "verdict"], &rows));
                out
            }
        }
    }
}

/// A held lock as `autocomp locks` lists it.
#[derive(Debug, Clone)]
pub struct LockView {
    pub lock: HeldLock,
    /// Since the holder took it (by the holder's clock; for display only).
    pub age: Option<Duration>,
}

#[derive(Debug, Clone)]
pub struct LocksView {
    pub locks: Vec<LockView>,
    /// `--stale`: only locks older than this are listed.
    pub stale: Option<Duration>,
}

impl LocksView {
    pub fn render(&self, format: Format) -> String {
        let now = Timestamp::now();
        match format {
            Format::Json => json_document(&Value::Array(self.locks.iter().map(|l| lock_json(&l.lock, now)).collect())),
            // Quiet when `--stale` finds nothing, so cron mails only trouble.
            Format::Text if self.locks.is_empty() && self.stale.is_some() => String::new(),
            Format::Text if self.locks.is_empty() => "no locks held\n".into(),
            Format::Text => {
                let rows: Vec<Vec<String>> = self
                    .locks
                    .iter()
                    .map(|view| match (&view.lock.foreign, &view.lock.holder) {
                        (Some(_), _) => vec![view.lock.path.clone(), "FOREIGN (see below)".into()],
                        (None, Some(h)) => vec![
                            view.lock.path.clone(),
                            h.agent.clone(),
                            h.host.clone(),
                            h.pid.to_string(),
                            h.since.to_string(),
                            view.age.map(age).unwrap_or_default(),
                        ],
                        (None, None) => vec![view.lock.path.clone(), "(holder not readable)".into()],
                    })
                    .collect();
                let mut out = table(&["lock", "holder", "host", "pid", "since", "age"], &rows);
                // The reasons are long; one line each under the table, where a person reads them.
                for view in &self.locks {
                    if let Some(why) = &view.lock.foreign {
                        let path = &view.lock.path;
                        writeln!(
                            out,
                            "FOREIGN {path}: not a lock autocomp made: {why}; no pass takes it while it is there"
                        )
                        .ok();
                    }
                }
                out
            }
        }
    }
}

impl Operator {
    /// `autocomp show`: the batch's head and the newest page of its log.
    pub async fn show(&self, id: &str) -> Result<BatchView, OperatorError> {
        self.show_page(id, LogSpan::default()).await
    }

    /// `autocomp show --before SEQ --limit N`: the batch's head and one page of its log;
    /// never the whole log (`LogSpan::All` reads none of it: see `show_all`).
    pub async fn show_page(&self, id: &str, span: LogSpan) -> Result<BatchView, OperatorError> {
        let store = self.store().await?;
        let pipeline = self.pipeline(store.as_ref()).await?;
        let head = self.head(store.as_ref(), id).await?;
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
        Ok(BatchView { head, components, log, span, timeline })
    }

    /// `autocomp show --all`: the head, then the whole log oldest first, read and written a
    /// page at a time (`MAX_LOG_PAGE` events), so the log is never all in memory. Text lists
    /// the log, then goes through it again for the reports; JSON streams `events`.
    pub async fn show_all(&self, id: &str, format: Format, out: &mut dyn std::io::Write) -> Result<(), OperatorError> {
        let view = self.show_page(id, LogSpan::All).await?;
        let store = self.store().await?;
        let batch = view.head.id().clone();
        let written = |e: std::io::Error| OperatorError::usage(format!("cannot write the output: {e}"));
        let mut write = |text: &str| out.write_all(autocomp_toolkit::for_terminal(text).as_bytes()).map_err(written);
        match format {
            Format::Json => {
                let mut head = view.to_json();
                if let Some(object) = head.as_object_mut() {
                    object.remove("events");
                    object["log"]["shown"] = json!(view.head.event_count);
                }
                let head = format!("{head:#}");
                write(head.strip_suffix('}').unwrap_or(&head).trim_end())?;
                write(",\n  \"events\": [")?;
                let mut first = true;
                for_each_page(store.as_ref(), &batch, |page| {
                    for event in &page.events {
                        write(if first { "\n    " } else { ",\n    " })?;
                        write(&event_json(event, Some(page)).to_string())?;
                        first = false;
                    }
                    Ok(())
                })
                .await?;
                write("\n  ]\n}\n")
            }
            Format::Text => {
                write(&view.head_text())?;
                write(&format!("\nlog ({} events, oldest first):\n", view.head.event_count))?;
                let mut header = Some(&LOG_HEADER);
                for_each_page(store.as_ref(), &batch, |page| {
                    let rows = log_rows(&page.events);
                    let text = match header.take() {
                        Some(header) => table(header, &rows),
                        // Later pages: the rows alone, aligned within their page.
                        None => table(&LOG_HEADER, &rows)
                            .split_once('\n')
                            .map(|(_, rows)| rows.to_owned())
                            .unwrap_or_default(),
                    };
                    write(&text)
                })
                .await?;
                write("\nreports:\n")?;
                for_each_page(store.as_ref(), &batch, |page| {
                    let mut text = String::new();
                    write_reports(&mut text, page);
                    write(&text)
                })
                .await
            }
        }
    }

    /// `autocomp show ID --event SEQ`: one event whole, details included (what a page that
    /// left them out names), as JSON in either format: details are JSON.
    pub async fn show_event(&self, id: &str, seq: i64) -> Result<String, OperatorError> {
        let store = self.store().await?;
        let head = self.head(store.as_ref(), id).await?;
        let found = autocomp_store::port::event_at(store.as_ref(), head.id(), Seq(seq)).await?;
        let event = found.ok_or_else(|| {
            autocomp_model::InvalidInput::new(
                "--event",
                seq.to_string(),
                format!("batch {} has no event with this seq", head.id()),
            )
        })?;
        Ok(format!("{:#}\n", event_json(&event, None)))
    }

    /// `autocomp pipeline`: the registry, active components in pipeline order, then the
    /// retired ones.
    pub async fn pipeline_view(&self) -> Result<PipelineView, OperatorError> {
        let store = self.store().await?;
        let active: Vec<RegisteredComponent> =
            self.pipeline(store.as_ref()).await?.into_iter().map(|step| step.registered).collect();
        let retired = store.components().await?.into_iter().filter(RegisteredComponent::is_retired);
        let components = active.into_iter().chain(retired).collect();
        let (steering, log) = self.steering().await?;
        Ok(PipelineView { components, steering, log, now: Timestamp::now() })
    }

    /// `autocomp status`: every batch (or those where the component, or any component, is
    /// in `state`), with each component's state (or only the named component's).
    pub async fn status(
        &self,
        component: Option<&str>,
        state: Option<ComponentState>,
    ) -> Result<StatusView, OperatorError> {
        let store = self.store().await?;
        let pipeline = self.pipeline(store.as_ref()).await?;
        let steps: Vec<&Step> = match component {
            Some(name) => vec![self.step(&pipeline, name)?],
            None => pipeline.iter().collect(),
        };
        // Summaries a page at a time, never a log: a summary holds all a state depends on.
        // Time-based clauses are evaluated at this host's clock as the page is read.
        let (mut rows, mut after) = (Vec::new(), None::<BatchId>);
        loop {
            let page = store.list_summaries(after.as_ref(), PAGE).await?;
            let Some(last) = page.last() else { break };
            after = Some(last.id.clone());
            let at = Timestamp::now();
            rows.extend(
                page.iter()
                    .map(|summary| {
                        let facts = SummaryAt { summary, at };
                        (summary.id.clone(), steps.iter().map(|step| step.state_of(&facts)).collect::<Vec<_>>())
                    })
                    .filter(|(_, states)| state.is_none_or(|wanted| states.contains(&wanted))),
            );
        }
        let held = super::hold_lines(&store.steering().await?);
        Ok(StatusView { components: steps.iter().map(|s| s.name().clone()).collect(), rows, held })
    }

    /// `autocomp explain`. Catches the index up first, as a component's pass would. Reads
    /// the batch's head, never its log.
    pub async fn explain(&self, id: &str, component: &str) -> Result<Explanation, OperatorError> {
        let store = self.store().await?;
        let pipeline = self.pipeline(store.as_ref()).await?;
        let step = self.step(&pipeline, component)?;
        let head = self.head(store.as_ref(), id).await?;
        let seen = self.explain_context(&store, head.id()).await?;
        self.explain_step(store.as_ref(), &pipeline, step, &head, &seen).await
    }

    /// `explain` for every component of the pipeline at once (the monitor's batch page):
    /// one index catch-up and one read of the lock service for all of them, and the batch's
    /// head (never its log) they are all explained from.
    pub async fn explain_all(&self, id: &str) -> Result<(BatchHead, Vec<Explanation>), OperatorError> {
        let store = self.store().await?;
        let pipeline = self.pipeline(store.as_ref()).await?;
        let head = self.head(store.as_ref(), id).await?;
        let seen = self.explain_context(&store, head.id()).await?;
        let mut explanations = Vec::with_capacity(pipeline.len());
        for step in &pipeline {
            explanations.push(self.explain_step(store.as_ref(), &pipeline, step, &head, &seen).await?);
        }
        Ok((head, explanations))
    }

    /// A batch's head, naming the id if it is malformed or unknown.
    pub(crate) async fn head(&self, store: &dyn ObjectStore, id: &str) -> Result<BatchHead, OperatorError> {
        let id = BatchId::new(id)?;
        Ok(store.batch_head(&id).await?)
    }

    /// What every component's explanation of one batch shares: the index's side, the heads
    /// and the locks held.
    async fn explain_context(&self, store: &Arc<dyn ObjectStore>, batch: &BatchId) -> Result<Seen, OperatorError> {
        let index = self.index(store)?;
        let index_cursor = index.catch_up().await?.cursor();
        let indexed = index.document(batch).await?;
        let store_head = store.head().await?;
        let locks = self.held_locks().await?;
        let steering = store.steering().await?;
        Ok(Seen { index_cursor, indexed, store_head, locks, steering })
    }

    async fn explain_step(
        &self,
        store: &dyn ObjectStore,
        pipeline: &[Step],
        step: &Step,
        head: &BatchHead,
        seen: &Seen,
    ) -> Result<Explanation, OperatorError> {
        let find_lock = |path: String| seen.locks.iter().find(|l| l.path == path).cloned();
        let indexed = seen.indexed.as_ref();
        let id = head.id();
        let clauses = checks(step.trigger(), head, indexed);
        let (ready_in_store, ready_in_index) = all_hold(&clauses);
        let result = head.effective_event(step.event_type()).cloned();
        let retry = match (step.retry_trigger(), &result) {
            (Some(retry), Some(failure)) if failure.is_transient_failure() => {
                let clauses = checks(&retry, head, indexed);
                let (ready_in_store, ready_in_index) = all_hold(&clauses);
                let backoff = retry.settled_for.unwrap_or_default();
                let opens_at = Timestamp(head.last_activity_at().millis().saturating_add(backoff.as_millis() as i64));
                Some(RetryWindow {
                    failure: failure.clone(),
                    backoff,
                    opens_at,
                    clauses,
                    ready_in_store,
                    ready_in_index,
                })
            }
            _ => None,
        };
        let failed_attempts = store.failed_attempts(id, step.name(), head.last_reset_of(step.event_type())).await?;
        Ok(Explanation {
            component: step.name().clone(),
            event_type: step.event_type().clone(),
            state: step.state_of(head),
            as_of: head.as_of,
            clauses,
            ready_in_store,
            ready_in_index,
            retry,
            refusal: step.ready_in_store(head).err(),
            result,
            open_run: head.open_run(step.name()).cloned(),
            batch_lock: find_lock(format!("batch/{}/{}", step.name(), id)),
            poll_lock: find_lock(format!("poll/{}", step.name())),
            failed_attempts,
            max_attempts: step.descriptor().max_attempts,
            index_cursor: seen.index_cursor,
            store_head: seen.store_head,
            held_up_by: held_up_by(pipeline, step, head),
            batch: id.clone(),
            manual: step.descriptor().manual,
            held: seen.steering.hold_of(step.name()).map(|hold| {
                let whose =
                    if seen.steering.components.contains_key(step.name()) { "" } else { "the whole pipeline is " };
                let reason = autocomp_toolkit::terminal::one_line(&hold.reason);
                format!("{whose}{} by {} since {}: {reason}", hold.kind.as_str(), hold.by, hold.since)
            }),
        })
    }

    /// `autocomp ready`: the index's candidates (the trigger's, then its transient-failure
    /// retries), each re-checked in the store (its summary) and against the batch locks, as a
    /// pass would; the first `queue_size` that pass are what it would claim. Touches nothing
    /// and reads no log.
    pub async fn ready(&self, component: &str) -> Result<ReadyView, OperatorError> {
        let store = self.store().await?;
        let pipeline = self.pipeline(store.as_ref()).await?;
        let step = self.step(&pipeline, component)?;
        let index = self.index(&store)?;
        let mut ids = index.query(step.trigger()).await?;
        if let Some(retry) = step.retry_trigger() {
            for id in index.query(&retry).await? {
                if !ids.contains(&id) {
                    ids.push(id);
                }
            }
        }
        let held = self.held_locks().await?;
        // Summaries, never logs: every candidate the index lists may be re-checked.
        let mut batches: BTreeMap<BatchId, BatchSummary> = BTreeMap::new();
        for chunk in ids.chunks(PAGE) {
            batches.extend(store.get_summaries(chunk).await?.into_iter().map(|b| (b.id.clone(), b)));
        }
        let now = Timestamp::now();
        let queue_size = step.descriptor().queue_size;
        let mut candidates = Vec::with_capacity(ids.len());
        let mut claimed = 0;
        for id in ids {
            let Some(summary) = batches.get(&id) else {
                let verdict = "skip: the index lists it, the store does not have it (`autocomp reindex`)".into();
                candidates.push(CandidateView { id, priority: 0, would_claim: false, verdict });
                continue;
            };
            let path = format!("batch/{}/{}", step.name(), id);
            let facts = SummaryAt { summary, at: now };
            let verdict = match (step.ready_in_store(&facts), held.iter().find(|l| l.path == path)) {
                (Err(refusal), _) => format!("skip: {refusal} (the index lags)"),
                (Ok(()), Some(lock)) => format!("skip: locked, {}", describe_lock(Some(lock), Timestamp::now())),
                (Ok(()), None) if claimed >= queue_size => "left for the next pass (queue full)".into(),
                (Ok(()), None) => {
                    claimed += 1;
                    // Attempts count from the newest Reset of its type: the head knows it.
                    let since = store.batch_head(&id).await?.last_reset_of(step.event_type());
                    let attempts = store.failed_attempts(&id, step.name(), since).await?;
                    if attempts >= step.descriptor().max_attempts {
                        format!(
                            "would claim and give up: {attempts} failed attempts, max_attempts {}",
                            step.descriptor().max_attempts
                        )
                    } else {
                        "would claim".into()
                    }
                }
            };
            let would_claim = verdict.starts_with("would claim");
            candidates.push(CandidateView { id, priority: summary.priority, would_claim, verdict });
        }
        Ok(ReadyView { component: step.name().clone(), queue_size, candidates })
    }

    /// `autocomp reindex`: rebuilds the index from the whole store. The embedded index is
    /// rebuilt here, with a progress bar on stderr (hidden when stderr is not a terminal);
    /// an index service rebuilds its own (that needs the token). Returns a summary.
    pub async fn reindex(&self) -> Result<String, OperatorError> {
        let store = self.store().await?;
        let url = self.index_url()?;
        if !url.starts_with("local:") {
            let indexed = self.index(&store)?.rebuild().await?;
            return Ok(format!("reindexed {indexed} batches on {}\n", autocomp_toolkit::display_url(&url)));
        }
        let options = EngineOptions { page_size: 1_000, ..EngineOptions::default() };
        let (engine, moved_aside) = match self.local_engine(&store, options.clone()) {
            Ok(engine) => (engine, None),
            Err(error) => self.set_aside_unreadable_index(&store, options, error)?,
        };
        let total = store.count_batches().await?;
        let started = Instant::now();
        let bar = ProgressBar::new(total).with_style(
            ProgressStyle::with_template("reindexing [{bar:30}] {pos}/{len} batches {elapsed}")
                .expect("valid template"),
        );
        let progress_bar = bar.clone();
        let indexed = engine
            .rebuild_with_progress(store.as_ref(), &mut move |done| {
                let done = done as u64;
                if done > progress_bar.length().unwrap_or(0) {
                    progress_bar.set_length(done);
                }
                progress_bar.set_position(done);
            })
            .await;
        bar.finish_and_clear();
        let indexed = indexed?;
        let cursor = engine.committed_cursor()?;
        let mut summary = String::new();
        if let Some(old) = moved_aside {
            writeln!(summary, "the index could not be opened; moved it aside to {} (delete it at will)", old.display())
                .ok();
        }
        writeln!(
            summary,
            "reindexed {indexed} batches in {:.1}s into {}; committed up to store seq {cursor}",
            started.elapsed().as_secs_f64(),
            engine.dir().display()
        )
        .ok();
        Ok(summary)
    }

    /// An index another release built (other fields or schema version) cannot be opened,
    /// let alone rebuilt in place. It is a cache: if the directory holds a tantivy index,
    /// it is renamed to `<dir>.unreadable-<millis>` (not deleted: the URL might name the
    /// wrong directory) and a fresh one is created. Anything else is the original error.
    fn set_aside_unreadable_index(
        &self,
        store: &Arc<dyn ObjectStore>,
        options: EngineOptions,
        error: OperatorError,
    ) -> Result<(IndexEngine, Option<PathBuf>), OperatorError> {
        let dir = self.local_index_dir(store)?;
        let unreadable = matches!(&error, OperatorError::Run(RunError::Index(IndexError::Index { .. })));
        if !unreadable || !dir.join("meta.json").is_file() {
            return Err(error);
        }
        let mut aside = dir.clone().into_os_string();
        aside.push(format!(".unreadable-{}", Timestamp::now().millis()));
        let aside = PathBuf::from(aside);
        std::fs::rename(&dir, &aside).map_err(|e| {
            OperatorError::usage(format!("{error}; and cannot move it aside to {}: {e}", aside.display()))
        })?;
        Ok((IndexEngine::open_with(&dir, options)?, Some(aside)))
    }

    /// `autocomp locks`: every held lock with its holder and age; with `stale`, only those
    /// held longer than that (locks whose holder cannot be read are left out then, foreign
    /// nodes never: they need a person whatever their age).
    pub async fn locks_held(&self, stale: Option<Duration>) -> Result<LocksView, OperatorError> {
        let held = self.held_locks().await?;
        let now = Timestamp::now();
        let locks = held
            .into_iter()
            .map(|lock| {
                let age = lock.holder.as_ref().map(|h| now.since(h.since));
                LockView { lock, age }
            })
            .filter(|view| {
                view.lock.foreign.is_some() || stale.is_none_or(|limit| view.age.is_some_and(|age| age > limit))
            })
            .collect();
        Ok(LocksView { locks, stale })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use autocomp_model::{Agent, Batch, BatchType, EventType, NewBatch, NewEvent, Outcome, Trigger};
    use autocomp_store::{ObjectStore, SqliteStore};
    use serde_json::json;

    use super::*;

    fn ty(name: &str) -> EventType {
        EventType::new(name).unwrap()
    }

    #[test]
    fn sizes_read_in_the_unit_that_fits() {
        assert_eq!(size_text(0), "0 bytes");
        assert_eq!(size_text(1023), "1023 bytes");
        assert_eq!(size_text(2765), "2.7 KiB");
        assert_eq!(size_text(64 * 1024 * 1024), "64.0 MiB");
    }

    /// Every batch in the store, whole.
    async fn all_batches(store: &dyn ObjectStore) -> Vec<Batch> {
        store.list_batches(None, 1_000).await.unwrap()
    }

    /// The index side of `explain` answers each clause as the store does, on batches that
    /// exercise every clause (the index is caught up, so freshness plays no part).
    #[tokio::test]
    async fn index_clauses_agree_with_the_store_clause_by_clause() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path().join("store.db")).await.unwrap();
        let agent = Agent::new("test").unwrap();
        let event = |t: &str, outcome| NewEvent::new(ty(t), outcome, agent.clone());
        let histories: Vec<(&str, Vec<NewEvent>)> = vec![
            ("B1", vec![event("Data_Received", Outcome::Success)]),
            ("B2", vec![event("Data_Received", Outcome::Success), event("Checked", Outcome::Failure)]),
            (
                "B3",
                vec![
                    event("Data_Received", Outcome::Success),
                    event("Checked", Outcome::Failure).with_details(json!({"transient": true})),
                ],
            ),
            ("B4", vec![event("Data_Received", Outcome::Success), event("Indexed", Outcome::Success)]),
            ("B5", vec![event("Data_Received", Outcome::Failure)]),
            (
                "B6",
                vec![
                    event("Data_Received", Outcome::Success),
                    event("Checked", Outcome::Success),
                    NewEvent::reset(vec![ty("Checked")], agent.clone(), json!({})),
                ],
            ),
            ("B7", vec![]),
        ];
        for (id, events) in histories {
            let id = BatchId::new(id).unwrap();
            store.create_batch(NewBatch::new(id.clone(), BatchType::new("RoundTrip").unwrap())).await.unwrap();
            for event in events {
                store.append_event(&id, event).await.unwrap();
            }
        }
        // B4's content changed after it was indexed: `Indexed` is now old.
        store.record_content_change(&BatchId::new("B4").unwrap(), serde_json::Map::new()).await.unwrap();
        let engine = IndexEngine::open(dir.path().join("index")).unwrap();
        engine.catch_up(&store).await.unwrap();

        let triggers = [
            Trigger { requires: vec![ty("Data_Received")], blocked_by: vec![ty("Checked")], ..Trigger::default() },
            Trigger { repeat_on_change: vec![ty("Indexed")], ..Trigger::default() },
            Trigger { transiently_failed: vec![ty("Checked")], ..Trigger::default() },
            Trigger { types: vec![BatchType::new("Other").unwrap()], ..Trigger::default() },
            Trigger { batches: vec![BatchId::new("B1").unwrap(), BatchId::new("B3").unwrap()], ..Trigger::default() },
            Trigger { settled_for: Some(Duration::from_secs(3600)), ..Trigger::default() },
            Trigger { settled_for: Some(Duration::ZERO), ..Trigger::default() },
        ];
        let mut compared = 0;
        for batch in all_batches(&store).await {
            let indexed = engine.get(&batch.id).unwrap().expect("indexed");
            for trigger in &triggers {
                for check in checks(trigger, &batch, Some(&indexed)) {
                    assert_eq!(Some(check.store), check.index, "{} {}", batch.id, check.clause);
                    compared += 1;
                }
                let ready_in_index = engine.query_at(trigger, batch.as_of).unwrap().contains(&batch.id);
                assert_eq!(all_hold(&checks(trigger, &batch, Some(&indexed))).1, Some(ready_in_index), "{}", batch.id);
            }
        }
        assert!(compared >= 7 * 8, "compared {compared} clauses");
    }
}

#[cfg(test)]
#[path = "explain_tests.rs"]
mod explain_tests;

#[cfg(test)]
#[path = "show_tests.rs"]
mod show_tests;
