//! What is news: the items a notifier finds, each with its key (what it is about, without the
//! channel). Failures and last steps' successes come from the change feed after the
//! notifiers' cursor (every event after it, of every batch the feed lists, read a page at a
//! time); the rest is the pipeline's state now: the steering log and holds, the alerts'
//! overdue rules over the index, human steps' waiting batches, the day's counts. Every read
//! is bounded, and so is what one pass can find.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use autocomp_model::{
    BatchId, BatchSummary, ComponentState, Event, EventType, HoldKind, Outcome, Selection, Seq, SteeringChange,
    Timestamp,
};
use autocomp_sboi::{BatchIndex, PageOrder, PageRequest};
use autocomp_store::{CURSOR_UNSET, CursorMove, LogCursor, ObjectStore, StoreError};
use serde_json::{Map, Value, json};

use super::config::{EventKind, NotifyConfig};
use super::text::{quote, subject};
use crate::operator::{OperatorError, Step, held_too_long, overdue_after, ready_too_long, report_summary, run_overdue};

mod digest;

/// Batches one page of the change feed lists.
const FEED_PAGE: usize = 1_000;
/// Pages of the change feed one pass reads: past this many changed batches the notifier
/// is too far behind to tell each one, and skips to the head (saying so).
const MAX_FEED_PAGES: usize = 20;
/// Events one read of a batch's log returns, and the reads per batch.
const LOG_PAGE: usize = 500;
const MAX_LOG_PAGES: usize = 20;
/// Items of one kind one pass sends one by one (per component for overdue and waiting
/// batches); the rest of the feed's go out as one item with their counts.
const MAX_ITEMS: usize = 100;
const MAX_PER_COMPONENT: usize = 20;
/// Steering log entries read for opened circuits; an opening older than a day is news only
/// while the circuit is still open.
const STEERING_ENTRIES: usize = 200;
const CIRCUIT_NEWS_FOR: Duration = Duration::from_secs(24 * 3600);

/// One piece of news, for every channel: the key without its channel, a one-line subject,
/// the plain text a mail carries, and the facts a webhook receiver reads.
#[derive(Debug, Clone)]
pub struct Item {
    pub kind: EventKind,
    pub id: String,
    pub subject: String,
    pub text: String,
    pub facts: Map<String, Value>,
}

/// What one pass found, and where the notifiers' cursor moves with it.
pub struct Found {
    pub items: Vec<Item>,
    pub cursor: Option<CursorMove>,
    /// Said once, in the log and the report (a first run, a skip to the head).
    pub notes: Vec<String>,
}

pub struct Finder<'a> {
    pub store: &'a dyn ObjectStore,
    pub index: &'a dyn BatchIndex,
    pub config: &'a NotifyConfig,
    pub pipeline: Vec<Step>,
    pub now: Timestamp,
}

impl Finder<'_> {
    pub async fn find(&self) -> Result<Found, OperatorError> {
        let mut found = Found { items: Vec::new(), cursor: None, notes: Vec::new() };
        self.feed(&mut found).await?;
        let steering = self.store.steering().await?;
        if self.config.wants(EventKind::Circuit) {
            self.circuits(&steering, &mut found.items).await?;
        }
        if self.config.wants(EventKind::PausedTooLong) {
            self.paused(&steering, &mut found.items);
        }
        if self.config.wants(EventKind::Overdue) {
            self.overdue(&mut found.items).await?;
        }
        if self.config.wants(EventKind::WaitingForPerson) {
            self.waiting_for_person(&mut found.items).await?;
        }
        if self.config.wants(EventKind::Digest) {
            self.digest(&steering, &mut found.items).await?;
        }
        Ok(found)
    }

    /// The component that records `event_type`, if one does.
    fn producer(&self, event_type: &EventType) -> Option<&Step> {
        self.pipeline.iter().find(|step| step.event_type() == event_type)
    }

    /// Whether `event_type` is a last step's: a component no other component requires.
    fn is_last_step(&self, event_type: &EventType) -> bool {
        self.producer(event_type).is_some_and(|step| {
            !step.descriptor().source
                && !self.pipeline.iter().any(|other| other.trigger().requires.contains(step.event_type()))
        })
    }

    // ---- the change feed: failures and last steps' successes ----

    async fn feed(&self, found: &mut Found) -> Result<(), OperatorError> {
        let cursor = self.store.enqueue_notices(Vec::new(), None).await?.cursor;
        if cursor == CURSOR_UNSET {
            let head = self.store.head().await?;
            if head > Seq::ZERO {
                found.notes.push(format!(
                    "first run: the notifiers' cursor starts at the store's head (seq {head}); what happened before \
                     is not notified"
                ));
            }
            found.cursor = Some(CursorMove { from: cursor, to: head });
            return Ok(());
        }
        if !self.config.wants(EventKind::Failure) && !self.config.wants(EventKind::Success) {
            let head = self.store.head().await?;
            found.cursor = (head > cursor).then_some(CursorMove { from: cursor, to: head });
            return Ok(());
        }
        // Every batch changed after the cursor, each once; complete only once the feed is
        // exhausted (a batch changed again meanwhile is listed again at its new place).
        let (mut listed, mut seen) = (Vec::new(), HashSet::new());
        let (mut since, mut head, mut complete) = (cursor, cursor, false);
        for _ in 0..MAX_FEED_PAGES {
            let page = self.store.changes(since, FEED_PAGE).await?;
            head = head.max(page.head);
            let exhausted = page.changes.len() < FEED_PAGE || page.next >= page.head;
            for (_, id) in page.changes {
                if seen.insert(id.clone()) {
                    listed.push(id);
                }
            }
            since = since.max(page.next);
            if exhausted {
                complete = true;
                break;
            }
        }
        let to = if complete { since } else { head };
        if !complete {
            found.notes.push(format!(
                "more than {} batches changed since seq {cursor}: told what the first ones hold and skipped to the \
                 store's head (seq {head}); `autocomp status` shows the rest",
                MAX_FEED_PAGES * FEED_PAGE
            ));
        }
        let mut news = FeedNews::default();
        for id in &listed {
            self.examine(id, cursor, to, &mut news).await?;
        }
        found.items.extend(news.items);
        for (kind, counts) in news.beyond {
            found.items.push(self.burst(kind, cursor, to, &counts));
        }
        found.cursor = (to > cursor).then_some(CursorMove { from: cursor, to });
        Ok(())
    }

    /// The events of `id` in (`from`, `to`], a page at a time.
    async fn examine(&self, id: &BatchId, from: Seq, to: Seq, news: &mut FeedNews) -> Result<(), OperatorError> {
        let mut after = from;
        for _ in 0..MAX_LOG_PAGES {
            let page = match self.store.log_page(id, LogCursor::After(after), LOG_PAGE).await {
                Ok(page) => page,
                Err(StoreError::NotFound(_)) => return Ok(()),
                Err(e) => return Err(e.into()),
            };
            for event in page.events.iter().filter(|event| event.seq <= to) {
                self.consider(event, news);
            }
            match page.newer.filter(|seq| *seq < to) {
                Some(seq) => after = seq,
                None => return Ok(()),
            }
        }
        Ok(())
    }

    fn consider(&self, event: &Event, news: &mut FeedNews) {
        let kind = match event.outcome {
            // An operator's cancel, acknowledgement and a person's rejection are their own
            // doing; a transient failure is retried by itself.
            Outcome::Failure
                if !event.is_transient_failure()
                    && !event.flag("cancelled")
                    && !event.flag("rejected")
                    && !event.is_acknowledged() =>
            {
                EventKind::Failure
            }
            Outcome::Success if !event.is_skipped() && self.is_last_step(&event.event_type) => EventKind::Success,
            _ => return,
        };
        if !self.config.wants(kind) {
            return;
        }
        let component = self.producer(&event.event_type).map(|step| step.name().to_string());
        let told = news.items.iter().filter(|item| item.kind == kind).count();
        if told >= MAX_ITEMS {
            let who = component.unwrap_or_else(|| event.event_type.to_string());
            *news.beyond.entry(kind).or_default().entry(who).or_default() += 1;
            return;
        }
        news.items.push(match kind {
            EventKind::Failure => failure(event, component.as_deref()),
            _ => success(event, component.as_deref()),
        });
    }

    /// The feed's items past `MAX_ITEMS` of a kind, as one item with their counts.
    fn burst(&self, kind: EventKind, from: Seq, to: Seq, counts: &BTreeMap<String, u64>) -> Item {
        let total: u64 = counts.values().sum();
        let (what, word) = match kind {
            EventKind::Failure => ("failures", "permanent failures"),
            _ => ("successes", "batches done"),
        };
        let lines: Vec<String> = counts.iter().map(|(who, n)| format!("  {who}: {n}")).collect();
        let text = format!(
            "{total} more {word} than this notifier sends one by one ({MAX_ITEMS} of them went out on their own), \
             between seq {from} and {to}:\n\n{}\n\n`autocomp status` lists them.",
            lines.join("\n")
        );
        Item {
            kind,
            id: format!("{what}:{from}:{to}"),
            subject: subject(&format!("[autocomp] {total} more {word}")),
            text,
            facts: facts(json!({"count": total, "by_component": counts, "from_seq": from, "to_seq": to})),
        }
    }

    // ---- steering: opened circuits, long pauses ----

    async fn circuits(&self, steering: &autocomp_model::Steering, items: &mut Vec<Item>) -> Result<(), OperatorError> {
        for entry in self.store.steering_log(STEERING_ENTRIES).await? {
            let SteeringChange::Outcome { component, batch, summary, .. } = &entry.change else { continue };
            let open = steering.components.get(component).is_some_and(|h| h.kind == HoldKind::Circuit);
            if !open && self.now.since(entry.at) > CIRCUIT_NEWS_FOR {
                continue;
            }
            let now = if open { "It claims no new work until resumed" } else { "It has been resumed since" };
            let text = format!(
                "The circuit breaker of {component} opened at {} (by {}):\n\n  {}\n\n{now}. Once the cause is \
                 fixed: `autocomp resume {component} --rerun-failed --reason ...` (reruns the batches that failed \
                 while it was breaking).",
                entry.at,
                quote(entry.by.as_str()),
                quote(&entry.said),
            );
            items.push(Item {
                kind: EventKind::Circuit,
                id: format!("circuit:{component}:{}", entry.version),
                subject: subject(&format!("[autocomp] {component}: circuit open, claiming no new work")),
                text,
                facts: facts(json!({
                    "component": component, "version": entry.version, "at": entry.at, "batch": batch,
                    "said": entry.said, "summary": summary, "open": open,
                })),
            });
        }
        Ok(())
    }

    fn paused(&self, steering: &autocomp_model::Steering, items: &mut Vec<Item>) {
        for (component, hold) in steering.holds() {
            if !held_too_long(hold, self.now, self.config.paused_too_long) {
                continue;
            }
            let (what, scope, resume) = match component {
                Some(name) => (name.to_string(), name.to_string(), format!("autocomp resume {name}")),
                None => ("the whole pipeline".to_owned(), "all".to_owned(), "autocomp resume --all".to_owned()),
            };
            let text = format!(
                "{what} has been {} for {} (longer than {}), by {} since {}: {}\n\nNothing it holds claims new work \
                 meanwhile. When it may go on: `{resume} --reason ...`.",
                hold.kind.as_str(),
                ago(self.now, hold.since),
                humantime::format_duration(self.config.paused_too_long),
                quote(hold.by.as_str()),
                hold.since,
                quote(&hold.reason),
            );
            items.push(Item {
                kind: EventKind::PausedTooLong,
                id: format!("paused:{scope}:{}", hold.since.millis()),
                subject: subject(&format!(
                    "[autocomp] {what} {} for {}",
                    hold.kind.as_str(),
                    ago(self.now, hold.since)
                )),
                text,
                facts: facts(json!({
                    "component": component, "hold": hold.kind, "by": hold.by, "reason": hold.reason,
                    "since": hold.since,
                })),
            });
        }
    }

    // ---- the alerts' overdue rules, a human step's waiting batches ----

    async fn overdue(&self, items: &mut Vec<Item>) -> Result<(), OperatorError> {
        for step in &self.pipeline {
            self.overdue_batches(step, items).await?;
            self.overdue_runs(step, items).await?;
        }
        Ok(())
    }

    /// A step's batches ready (or waiting for a person) longer than its overdue_after.
    async fn overdue_batches(&self, step: &Step, items: &mut Vec<Item>) -> Result<(), OperatorError> {
        let ready_after = self.config.overdue_after;
        let threshold = overdue_after(step, ready_after);
        let selection = ready_too_long(step, ready_after);
        let (total, summaries) = self.oldest(selection).await?;
        for summary in &summaries {
            let since = summary.last_activity;
            let waits = if step.descriptor().manual { "waiting for a person" } else { "ready" };
            let whose =
                if step.descriptor().overdue_after.is_some() { "its overdue_after" } else { "notify.overdue_after" };
            let text = format!(
                "{} has been {waits} for {} since {since}, longer than {} ({whose}){}.\n\n\
                 `autocomp explain {} --component {}` says what holds it.",
                summary.id,
                step.name(),
                humantime::format_duration(threshold),
                of_total(total, "are overdue there"),
                summary.id,
                step.name(),
            );
            items.push(Item {
                kind: EventKind::Overdue,
                id: format!("overdue:{}:{}:{}", step.name(), summary.id, since.millis()),
                subject: subject(&format!(
                    "[autocomp] {}: {} {waits} for {}",
                    step.name(),
                    summary.id,
                    ago(self.now, since)
                )),
                text,
                facts: facts(json!({
                    "component": step.name(), "batch": summary.id, "since": since, "state": waits,
                    "threshold": humantime::format_duration(threshold).to_string(), "overdue_total": total,
                })),
            });
        }
        Ok(())
    }

    /// A step's runs past its max_runtime.
    async fn overdue_runs(&self, step: &Step, items: &mut Vec<Item>) -> Result<(), OperatorError> {
        let max_runtime = step.descriptor().max_runtime;
        let runs = self.store.open_runs(Some(step.name())).await?;
        let mut late: Vec<_> = runs.into_iter().filter(|run| run_overdue(step, run, self.now)).collect();
        late.sort_by_key(|run| run.started_at);
        for run in late.into_iter().take(MAX_PER_COMPONENT) {
            let text = format!(
                "{} has been working on {} for {} (since {}), longer than its max_runtime {}; the run is {} \
                 (pid {}).\n\n`autocomp explain {} --component {}`; `autocomp cancel` stops it.",
                step.name(),
                run.batch_id,
                ago(self.now, run.started_at),
                run.started_at,
                humantime::format_duration(max_runtime),
                quote(run.holder.agent.as_str()),
                run.holder.pid,
                run.batch_id,
                step.name(),
            );
            items.push(Item {
                kind: EventKind::Overdue,
                id: format!("overdue:{}:{}:{}", step.name(), run.batch_id, run.started_at.millis()),
                subject: subject(&format!(
                    "[autocomp] {}: working on {} for {}",
                    step.name(),
                    run.batch_id,
                    ago(self.now, run.started_at)
                )),
                text,
                facts: facts(json!({
                    "component": step.name(), "batch": run.batch_id, "since": run.started_at,
                    "state": "working", "max_runtime": humantime::format_duration(max_runtime).to_string(),
                    "run": run.holder_json(),
                })),
            });
        }
        Ok(())
    }

    /// One item per (human step, batch) that waits for a person there; the batch comes back
    /// as news when what it waits on is recorded anew.
    async fn waiting_for_person(&self, items: &mut Vec<Item>) -> Result<(), OperatorError> {
        for step in self.pipeline.iter().filter(|step| step.descriptor().manual) {
            let selection = Selection::component_state(step.descriptor(), ComponentState::Person);
            let (total, summaries) = self.oldest(selection).await?;
            for summary in &summaries {
                let since = ready_since(step, summary);
                let text = format!(
                    "{} waits for a person at {} (since {}){}.\n\n`autocomp show {}`, then `autocomp approve {} \
                     --step {} --reason ...` or `autocomp reject {} --step {} --reason ...`.",
                    summary.id,
                    step.name(),
                    summary.last_activity,
                    of_total(total, "wait there"),
                    summary.id,
                    summary.id,
                    step.name(),
                    summary.id,
                    step.name(),
                );
                items.push(Item {
                    kind: EventKind::WaitingForPerson,
                    id: format!("person:{}:{}:{}", step.name(), summary.id, since.0),
                    subject: subject(&format!("[autocomp] {}: {} waits for a person", step.name(), summary.id)),
                    text,
                    facts: facts(json!({
                        "component": step.name(), "batch": summary.id, "ready_seq": since,
                        "last_activity": summary.last_activity, "waiting_total": total,
                    })),
                });
            }
        }
        Ok(())
    }

    /// How many batches `selection` holds, and the oldest few's summaries.
    async fn oldest(&self, selection: Selection) -> Result<(u64, Vec<BatchSummary>), OperatorError> {
        let total = self.index.tally(std::slice::from_ref(&selection), false).await?[0].count;
        if total == 0 {
            return Ok((0, Vec::new()));
        }
        let request = PageRequest { selection, order: PageOrder::Oldest, after: None, limit: MAX_PER_COMPONENT };
        let page = self.index.page(&request).await?;
        Ok((total, self.store.get_summaries(&page.batches).await?))
    }
}
#[derive(Default)]
struct FeedNews {
    items: Vec<Item>,
    /// Past `MAX_ITEMS`: per kind, per component, how many more.
    beyond: BTreeMap<EventKind, BTreeMap<String, u64>>,
}

fn failure(event: &Event, component: Option<&str>) -> Item {
    let who = component.unwrap_or(event.event_type.as_str());
    let said: Vec<String> = report_summary(event).iter().map(|line| quote(line)).collect();
    let said = if said.is_empty() { "(no summary)".to_owned() } else { said.join("; ") };
    let rerun = match component {
        Some(name) => format!("`autocomp rerun {} --component {name} --reason ...`", event.batch_id),
        None => format!("record {} again", event.event_type),
    };
    let text = format!(
        "{who} recorded a permanent failure of {} at {} (event {}, {}, by {}):\n\n  {said}\n\n`autocomp show {}` \
         shows the batch; once the cause is fixed, {rerun}.",
        event.batch_id,
        event.at,
        event.seq,
        event.event_type,
        quote(event.agent.as_str()),
        event.batch_id,
    );
    let summary = event.details.get("summary").and_then(Value::as_str).unwrap_or_default();
    let first = summary.lines().next().unwrap_or_default();
    let headline = if first.is_empty() { String::new() } else { format!(": {first}") };
    Item {
        kind: EventKind::Failure,
        id: format!("failure:{}:{}", event.batch_id, event.seq),
        subject: subject(&format!("[autocomp] {who} failed on {}{headline}", event.batch_id)),
        text,
        facts: event_facts(event, component),
    }
}

fn success(event: &Event, component: Option<&str>) -> Item {
    let who = component.unwrap_or(event.event_type.as_str());
    let text = format!(
        "{} is through the pipeline: {who}, its last step, succeeded at {} (event {}, {}).\n\n`autocomp show {}`",
        event.batch_id, event.at, event.seq, event.event_type, event.batch_id,
    );
    Item {
        kind: EventKind::Success,
        id: format!("success:{}:{}", event.batch_id, event.seq),
        subject: subject(&format!("[autocomp] {} done ({who} succeeded)", event.batch_id)),
        text,
        facts: event_facts(event, component),
    }
}

/// An event as a webhook receiver reads it: raw values (JSON escapes them), bounded.
fn event_facts(event: &Event, component: Option<&str>) -> Map<String, Value> {
    let details = &event.details;
    let text = |key: &str| details.get(key).and_then(Value::as_str).map(|s| s.chars().take(2_000).collect::<String>());
    let failures: Vec<Value> =
        details.get("failures").and_then(Value::as_array).into_iter().flatten().take(10).cloned().collect();
    facts(json!({
        "batch": event.batch_id, "component": component, "event_type": event.event_type, "seq": event.seq,
        "at": event.at, "agent": event.agent, "outcome": event.outcome.as_str(), "summary": text("summary"),
        "failures": failures, "failures_total": details.get("failures_total"),
    }))
}

fn facts(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map,
        _ => Map::new(),
    }
}

/// The seq at which a batch's wait at a human step began: its newest result among the
/// types the step requires (unrelated activity on the batch does not make it news again).
fn ready_since(step: &Step, summary: &BatchSummary) -> Seq {
    let requires = &step.trigger().requires;
    let met = summary.effective.iter().filter(|event| requires.contains(&event.event_type)).map(|event| event.seq);
    met.max().unwrap_or(summary.created_seq)
}

/// How many batches are in the same case, when more than this one.
fn of_total(total: u64, case: &str) -> String {
    if total > 1 { format!("; {total} batches {case} in all") } else { String::new() }
}

fn ago(now: Timestamp, since: Timestamp) -> String {
    humantime::format_duration(Duration::from_secs(now.since(since).as_secs())).to_string()
}
