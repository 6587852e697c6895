//! The day's digest: every step's batches per state, what failed in the last day, what waits
//! for a person and what is held, as one item a day. Apart from the news items as it counts
//! the whole pipeline rather than finding what changed.

use std::time::Duration;

use autocomp_model::{ComponentState, Selection, Timestamp};
use autocomp_sboi::{PageOrder, PageRequest, Tally};
use chrono::Timelike as _;
use serde_json::{Map, Value, json};

use super::{Finder, Item, facts};
use crate::notify::config::EventKind;
use crate::notify::text::{quote, subject};
use crate::operator::{OperatorError, Step};

/// Batches a digest names per human step.
const DIGEST_IDS: usize = 10;
const DAY: Duration = Duration::from_secs(24 * 3600);

impl Finder<'_> {
    /// The day's digest, once the day's `digest_at` has passed (its key is the date).
    pub(super) async fn digest(
        &self,
        steering: &autocomp_model::Steering,
        items: &mut Vec<Item>,
    ) -> Result<(), OperatorError> {
        let Some(utc) = chrono::DateTime::from_timestamp_millis(self.now.millis()) else { return Ok(()) };
        let at = self.config.digest_at;
        if (utc.hour(), utc.minute()) < (at.hour, at.minute) {
            return Ok(());
        }
        let date = utc.format("%Y-%m-%d").to_string();
        let counts = self.digest_counts().await?;
        let held = steering.pipeline.iter().map(|hold| ("the whole pipeline".to_owned(), hold));
        let held: Vec<(String, &autocomp_model::Hold)> =
            held.chain(steering.components.iter().map(|(name, hold)| (name.to_string(), hold))).collect();
        let text = digest_text(&date, self.now, &counts, &held);
        let held_facts: Vec<Value> = held
            .iter()
            .map(|(what, hold)| {
                json!({"what": what, "hold": hold.kind, "by": hold.by, "reason": hold.reason, "since": hold.since})
            })
            .collect();
        let summary = format!(
            "[autocomp] digest {date}: {} failed in 24h, {} waiting for a person, {} held",
            counts.failed_total,
            counts.waiting_total,
            held.len()
        );
        let DigestCounts { states, failed_today, waiting, .. } = counts;
        items.push(Item {
            kind: EventKind::Digest,
            id: format!("digest:{date}"),
            subject: subject(&summary),
            text,
            facts: facts(json!({
                "date": date, "states": states, "failed_last_24h": failed_today, "waiting_for_person": waiting,
                "held": held_facts,
            })),
        });
        Ok(())
    }

    /// Per step: its states (`ComponentState::ALL` order) and overdue, as the metrics count
    /// them, then its failures of the last day; and the oldest of a human step's waiting.
    async fn digest_counts(&self) -> Result<DigestCounts, OperatorError> {
        let mut selections = Vec::new();
        let mut rows = Vec::new();
        for step in &self.pipeline {
            let start = selections.len();
            selections.extend(step.state_selections(self.config.overdue_after));
            let failed = Selection::component_state(step.descriptor(), ComponentState::Failed);
            selections.push(failed.and(Selection::QuietFor(DAY).negate()));
            rows.push(start..selections.len());
        }
        let counts = self.index.tally(&selections, false).await?;
        let mut digest = DigestCounts::default();
        for (step, range) in self.pipeline.iter().zip(rows) {
            self.count_step(step, &counts[range], &mut digest).await?;
        }
        Ok(digest)
    }

    /// One step's row of the digest: `row` is its tallies in `digest_counts`' order.
    async fn count_step(&self, step: &Step, row: &[Tally], digest: &mut DigestCounts) -> Result<(), OperatorError> {
        let (overdue, failed) = (row[ComponentState::ALL.len()].count, row[row.len() - 1].count);
        let by_state: Map<String, Value> = ComponentState::ALL
            .iter()
            .zip(row)
            .map(|(state, tally)| (state.as_str().into(), json!(tally.count)))
            .collect();
        let shown: Vec<String> = ComponentState::ALL
            .iter()
            .zip(row)
            .filter(|(_, tally)| tally.count > 0)
            .map(|(state, tally)| format!("{} {}", state.as_str(), tally.count))
            .collect();
        let overdue_note = if overdue > 0 { format!(" ({overdue} overdue)") } else { String::new() };
        let shown = if shown.is_empty() { "no batches".to_owned() } else { shown.join(", ") };
        digest.lines.push(format!("  {}: {shown}{overdue_note}", step.name()));
        digest.states.insert(step.name().to_string(), Value::Object(by_state));
        digest.failed_total += failed;
        if failed > 0 {
            digest.failed_today.insert(step.name().to_string(), json!(failed));
        }
        let person_at = ComponentState::ALL.iter().position(|s| *s == ComponentState::Person).unwrap_or(0);
        let person = row[person_at].count;
        if step.descriptor().manual && person > 0 {
            digest.waiting_total += person;
            let selection = Selection::component_state(step.descriptor(), ComponentState::Person);
            let request = PageRequest { selection, order: PageOrder::Oldest, after: None, limit: DIGEST_IDS };
            let ids: Vec<String> = self.index.page(&request).await?.batches.iter().map(ToString::to_string).collect();
            digest.waiting.insert(step.name().to_string(), json!({"count": person, "oldest": ids}));
        }
        Ok(())
    }
}

/// What the day's digest counts, per step and in all.
#[derive(Default)]
struct DigestCounts {
    /// One line per step: its batches per state, and how many of them are overdue.
    lines: Vec<String>,
    states: Map<String, Value>,
    failed_today: Map<String, Value>,
    /// Per human step: how many wait for a person, and the oldest few's ids.
    waiting: Map<String, Value>,
    failed_total: u64,
    waiting_total: u64,
}

/// The digest's mail text: the counts, then what failed, waits and is held.
fn digest_text(date: &str, now: Timestamp, counts: &DigestCounts, held: &[(String, &autocomp_model::Hold)]) -> String {
    let mut text = format!("autocomp's digest for {date} (UTC), made at {now}.\n\nBatches per component and state:\n");
    if counts.lines.is_empty() {
        text.push_str("  no component has registered yet\n");
    }
    text.push_str(&(counts.lines.join("\n") + "\n"));
    let failed = counts.failed_today.iter().map(|(name, n)| format!("{name}: {n}")).collect();
    section(&mut text, "\nFailed in the last 24 hours (and failed still):", "none", failed);
    let waiting = counts
        .waiting
        .iter()
        .map(|(name, wait)| {
            let ids: Vec<&str> = wait["oldest"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
            let more = wait["count"].as_u64().unwrap_or(0).saturating_sub(ids.len() as u64);
            let more = if more > 0 { format!(" and {more} more") } else { String::new() };
            format!("{name}: {} ({}{more})", wait["count"], ids.join(", "))
        })
        .collect();
    section(&mut text, "\nWaiting for a person:", "nothing", waiting);
    let holds = held
        .iter()
        .map(|(what, hold)| {
            let (kind, by, reason) = (hold.kind.as_str(), quote(hold.by.as_str()), quote(&hold.reason));
            format!("{what}: {kind} by {by} since {}: {reason}", hold.since)
        })
        .collect();
    section(&mut text, "\nHeld (paused, draining, circuit open):", "nothing", holds);
    text
}

/// A section of the digest: its title, then `none` on the same line, or an entry a line.
fn section(text: &mut String, title: &str, none: &str, entries: Vec<String>) {
    text.push_str(title);
    if entries.is_empty() {
        text.push_str(&format!(" {none}\n"));
        return;
    }
    text.push('\n');
    for entry in entries {
        text.push_str(&format!("  {entry}\n"));
    }
}
