//! `autocomp failures`: each component's failed batches with their reasons grouped, the most
//! frequent first, as the monitor's "Needs a person" ranks them (it reads them here), and
//! the commands that look closer or try again. The view, its JSON, its text and the command.
//! Counts come from the index; reasons from the heads of a sample of failed batches (never
//! a log), so the command costs the same at a thousand failures as at twenty.

use std::collections::HashMap;
use std::fmt::Write as _;

use autocomp_model::{BatchId, ComponentName, ComponentState, Outcome, Selection};
use autocomp_sboi::{PageOrder, PageRequest};
use serde::Serialize;

use super::views::{Format, cut, render_as};
use super::{Operator, OperatorError, Step};

/// The most failed batches whose heads are read per component by default: the reasons are
/// a sample (`--sample` reads more).
pub const FAILURES_READ: usize = 20;
/// The most reasons kept per component (the monitor shows the first three).
pub const MAX_REASONS: usize = 10;
/// The most batch ids listed under one reason.
pub const IDS_PER_REASON: usize = 10;
/// The most characters of a reason as grouped (the whole reason is `explain`'s).
pub const REASON_CHARS: usize = 200;

/// One reason among a component's failed batches: how many of those read gave it, and
/// (some of) which.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReasonGroup {
    /// `Event::failure_reason`, cut short; `None`: the failure said nothing.
    pub reason: Option<String>,
    pub count: usize,
    /// At most `IDS_PER_REASON`, oldest first.
    pub batches: Vec<BatchId>,
}

/// One component's failures.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FailuresAt {
    pub component: ComponentName,
    /// Failed batches the index counts (all of them).
    pub total: u64,
    /// Failed batches whose reason was read (the first the index lists, oldest first).
    pub read: usize,
    /// The reasons among those read, the most frequent first, ties by text.
    pub reasons: Vec<ReasonGroup>,
    /// What the first batch's failure names as what to run next instead of a rerun (a
    /// `read_schema` failure: the restart of the result it could not read).
    pub next: Option<String>,
}

/// `autocomp failures`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FailuresView {
    /// Components with failed batches, in pipeline order.
    pub components: Vec<FailuresAt>,
}

/// The reasons of `read` (batch, reason) pairs grouped, most frequent first, ties by text;
/// at most `MAX_REASONS`.
pub fn group_reasons(read: Vec<(BatchId, Option<String>)>) -> Vec<ReasonGroup> {
    let mut groups: Vec<ReasonGroup> = Vec::new();
    let mut at: HashMap<Option<String>, usize> = HashMap::new();
    for (id, reason) in read {
        let n = *at.entry(reason.clone()).or_insert_with(|| {
            groups.push(ReasonGroup { reason, count: 0, batches: Vec::new() });
            groups.len() - 1
        });
        groups[n].count += 1;
        if groups[n].batches.len() < IDS_PER_REASON {
            groups[n].batches.push(id);
        }
    }
    groups.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.reason.cmp(&b.reason)));
    groups.truncate(MAX_REASONS);
    groups
}

impl FailuresView {
    pub fn render(&self, format: Format) -> String {
        render_as(format, || self, || self.to_text())
    }

    /// Per component: the count, then each reason with its count and ids, then what to run.
    /// "no failed batches" when there are none.
    fn to_text(&self) -> String {
        if self.components.is_empty() {
            return "no failed batches\n".into();
        }
        let mut out = String::new();
        for at in &self.components {
            let batches =
                if at.total == 1 { "1 failed batch".to_owned() } else { format!("{} failed batches", at.total) };
            let sample = if (at.read as u64) < at.total {
                format!(" (reasons of the first {})", at.read)
            } else {
                String::new()
            };
            writeln!(out, "{}: {batches}{sample}", at.component).ok();
            for group in &at.reasons {
                let reason = group.reason.as_deref().map(autocomp_toolkit::terminal::one_line);
                let reason = reason.as_deref().unwrap_or("(no reason given)");
                let more = group.count.saturating_sub(group.batches.len());
                let more = if more > 0 { format!(" and {more} more") } else { String::new() };
                let ids: Vec<&str> = group.batches.iter().map(BatchId::as_str).collect();
                writeln!(out, "  {:>4}x  {reason}", group.count).ok();
                writeln!(out, "         {}{more}", ids.join(" ")).ok();
            }
            if let Some(first) = at.reasons.first().and_then(|g| g.batches.first()) {
                writeln!(out, "  look closer: autocomp explain {first}").ok();
                match &at.next {
                    Some(next) => writeln!(out, "  try again:   {}", autocomp_toolkit::terminal::one_line(next)).ok(),
                    None => {
                        writeln!(out, "  try again:   autocomp rerun {first} --component {} --reason ...", at.component)
                            .ok()
                    }
                };
                // Several ids close out a whole group at once.
                writeln!(out, "  close out:   autocomp acknowledge {first} --component {} --reason ...", at.component)
                    .ok();
            }
        }
        out
    }
}

impl Operator {
    /// The reasons of the first `limit` batches the index lists as failed at `step` (oldest
    /// first): one index page and one head read each, never a log. A batch no longer failed
    /// (or gone) by the time its head is read is left out.
    pub async fn failure_reasons(
        &self,
        step: &Step,
        limit: usize,
    ) -> Result<Vec<(BatchId, Option<String>)>, OperatorError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let store = self.store().await?;
        let index = self.index(&store)?;
        let selection = Selection::component_state(step.descriptor(), ComponentState::Failed);
        let page = index.page(&PageRequest { selection, order: PageOrder::Oldest, after: None, limit }).await?;
        let mut reasons = Vec::with_capacity(page.batches.len());
        for id in page.batches.into_iter().take(limit) {
            let Ok(head) = store.batch_head(&id).await else { continue };
            let failure =
                head.effective.iter().find(|e| e.event_type == *step.event_type() && e.outcome == Outcome::Failure);
            let Some(failure) = failure else { continue };
            let reason = failure.failure_reason().map(|reason| cut(&reason, REASON_CHARS));
            reasons.push((id, reason));
        }
        Ok(reasons)
    }

    /// `autocomp failures`: the failed batches of every component (or `component`'s) with
    /// the reasons of the first `sample` of each, grouped.
    pub async fn failures(
        &self,
        component: Option<&ComponentName>,
        sample: usize,
    ) -> Result<FailuresView, OperatorError> {
        let store = self.store().await?;
        let pipeline = self.pipeline(store.as_ref()).await?;
        let steps: Vec<&Step> = match component {
            Some(name) => vec![self.step_named(&pipeline, name)?],
            None => pipeline.iter().collect(),
        };
        let index = self.index(&store)?;
        index.catch_up().await?;
        let selections: Vec<Selection> =
            steps.iter().map(|step| Selection::component_state(step.descriptor(), ComponentState::Failed)).collect();
        let tallies = index.tally(&selections, false).await?;
        let mut components = Vec::new();
        for (step, tally) in steps.into_iter().zip(tallies) {
            if tally.count == 0 {
                continue;
            }
            let read = self.failure_reasons(step, sample).await?;
            let read_count = read.len();
            let reasons = group_reasons(read);
            let next = match reasons.first().and_then(|group| group.batches.first()) {
                Some(first) => store.batch_head(first).await.ok().and_then(|head| {
                    let failed = head.effective_event(step.event_type())?;
                    failed.failure_next().map(str::to_owned)
                }),
                None => None,
            };
            components.push(FailuresAt {
                component: step.name().clone(),
                total: tally.count,
                read: read_count,
                reasons,
                next,
            });
        }
        Ok(FailuresView { components })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(text: &str) -> BatchId {
        BatchId::new(text).unwrap()
    }

    #[test]
    fn reasons_group_most_frequent_first_with_their_batches() {
        let r = |text: &str| Some(text.to_owned());
        let read = vec![(id("b1"), r("b")), (id("b2"), r("a")), (id("b3"), None), (id("b4"), r("a"))];
        let groups = group_reasons(read);
        assert_eq!(groups[0], ReasonGroup { reason: r("a"), count: 2, batches: vec![id("b2"), id("b4")] });
        assert_eq!(groups[1].reason, None, "None sorts before any text at equal counts");
        assert_eq!(groups[2].batches, [id("b1")]);
    }

    #[test]
    fn the_text_names_each_reason_its_batches_and_what_to_run() {
        let view = FailuresView {
            components: vec![FailuresAt {
                component: ComponentName::new("checksum-verifier").unwrap(),
                total: 30,
                read: 20,
                reasons: vec![ReasonGroup {
                    reason: Some("mismatch: md5 and sha256 differ\u{1b}[2J".into()),
                    count: 12,
                    batches: vec![id("b1"), id("b2")],
                }],
                next: None,
            }],
        };
        let text = view.render(Format::Text);
        assert!(text.starts_with("checksum-verifier: 30 failed batches (reasons of the first 20)\n"), "{text}");
        assert!(text.contains("  12x  mismatch: md5 and sha256 differ"), "{text}");
        assert!(!text.contains('\u{1b}'), "terminal escapes are neutralized: {text:?}");
        assert!(text.contains("b1 b2 and 10 more"), "{text}");
        assert!(text.contains("autocomp explain b1"), "{text}");
        let none = FailuresView { components: vec![] };
        assert_eq!(none.render(Format::Text), "no failed batches\n");
    }
}
