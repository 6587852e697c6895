//! What the overview's "Needs a person" section is made of: failures per component with their
//! most frequent reasons, holds, batches waiting for a person, overdue and stale work. Counts
//! come from the overview's own index tallies; only the failure reasons cost reads, bounded.

use std::collections::HashMap;

use autocomp_model::{ComponentName, ComponentState, Hold, Outcome, Selection};
use autocomp_ops::operator::OperatorError;
use autocomp_sboi::{PageOrder, PageRequest};

use crate::data::{Monitor, Overview, cut};
use crate::filter::StateFilter;

/// The most failed batches whose heads are read per component: the reasons are a sample, so
/// the overview costs the same at a thousand failures as at twenty.
pub const FAILURES_READ: usize = 20;
/// The most heads read for reasons across all components (a broken pipeline fails everywhere
/// at once; the overview must stay as fast then).
pub const FAILURES_READ_IN_ALL: usize = 100;
/// The most frequent reasons shown per component.
pub const TOP_REASONS: usize = 3;

/// Everything that waits on a person, in the order the overview shows it. Empty lists mean
/// nothing of that kind; `Needs::is_empty` means nothing at all.
#[derive(Debug, Clone, Default)]
pub struct Needs {
    /// Components with failed batches, in pipeline order.
    pub failures: Vec<FailuresAt>,
    /// The whole pipeline's hold, if any.
    pub pipeline_hold: Option<Hold>,
    /// Held components (paused, draining, circuit open), in pipeline order.
    pub holds: Vec<(ComponentName, Hold)>,
    /// Human steps with batches waiting for a decision, in pipeline order.
    pub person: Vec<(ComponentName, u64)>,
    /// Components with overdue batches (ready, waiting for a person or working too long).
    pub overdue: Vec<(ComponentName, u64)>,
    /// Components with stale results: worked out from content a batch no longer has.
    pub stale: Vec<(ComponentName, u64)>,
}

impl Needs {
    pub fn is_empty(&self) -> bool {
        self.failures.is_empty()
            && self.pipeline_hold.is_none()
            && self.holds.is_empty()
            && self.person.is_empty()
            && self.overdue.is_empty()
            && self.stale.is_empty()
    }
}

/// One component's failures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailuresAt {
    pub component: ComponentName,
    /// Failed batches the index counts (all of them).
    pub total: u64,
    /// Failed batches whose reason was read (at most `FAILURES_READ`, the first the index lists).
    pub read: usize,
    /// The most frequent reasons among those read (a failure's `Event::failure_reason`, cut short;
    /// `None` when it gave none), with how many of them gave it, the most frequent first.
    pub reasons: Vec<(Option<String>, usize)>,
}

/// The most frequent of `reasons`, at most `TOP_REASONS`, ties by text.
fn top(reasons: Vec<Option<String>>) -> Vec<(Option<String>, usize)> {
    let mut counts: HashMap<Option<String>, usize> = HashMap::new();
    for reason in reasons {
        *counts.entry(reason).or_default() += 1;
    }
    let mut counts: Vec<(Option<String>, usize)> = counts.into_iter().collect();
    counts.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    counts.truncate(TOP_REASONS);
    counts
}

impl Monitor {
    /// What needs a person, from `overview`'s counts and steering; the reasons of failures
    /// from the heads of at most `FAILURES_READ` failed batches per component (the first the
    /// index lists: it has no newest-first order), `FAILURES_READ_IN_ALL` in all. A batch
    /// no longer failed by the time its head is read is left out of the sample.
    pub async fn needs(&self, overview: &Overview) -> Result<Needs, OperatorError> {
        let mut needs = Needs { pipeline_hold: overview.steering.pipeline.clone(), ..Needs::default() };
        let mut budget = FAILURES_READ_IN_ALL;
        for row in &overview.rows {
            let name = row.component.name();
            let descriptor = &row.component.descriptor;
            if let Some(hold) = overview.steering.hold_of(name) {
                needs.holds.push((name.clone(), hold.clone()));
            }
            let count = |state| row.count(StateFilter::State(state));
            if descriptor.manual && count(ComponentState::Person) > 0 {
                needs.person.push((name.clone(), count(ComponentState::Person)));
            }
            if row.count(StateFilter::Overdue) > 0 {
                needs.overdue.push((name.clone(), row.count(StateFilter::Overdue)));
            }
            if count(ComponentState::Stale) > 0 {
                needs.stale.push((name.clone(), count(ComponentState::Stale)));
            }
            let total = count(ComponentState::Failed);
            if total == 0 {
                continue;
            }
            let limit = FAILURES_READ.min(budget);
            let reasons = if limit == 0 { Vec::new() } else { self.failure_reasons(descriptor, limit).await? };
            budget -= reasons.len().min(budget);
            needs.failures.push(FailuresAt {
                component: name.clone(),
                total,
                read: reasons.len(),
                reasons: top(reasons),
            });
        }
        Ok(needs)
    }

    /// The reasons of the first `limit` batches the index lists as failed at `descriptor`'s
    /// component: one index page and one head read each (never a log).
    async fn failure_reasons(
        &self,
        descriptor: &autocomp_model::ComponentDescriptor,
        limit: usize,
    ) -> Result<Vec<Option<String>>, OperatorError> {
        let store = self.operator().store().await?;
        let index = self.operator().index(&store)?;
        let selection = Selection::component_state(descriptor, ComponentState::Failed);
        let page = index.page(&PageRequest { selection, order: PageOrder::Oldest, after: None, limit }).await?;
        let mut reasons = Vec::with_capacity(page.batches.len());
        for id in page.batches.iter().take(limit) {
            // Gone or unreadable since the index listed it: not part of the sample.
            let Ok(head) = store.batch_head(id).await else { continue };
            let Some(failure) =
                head.effective.iter().find(|e| e.event_type == descriptor.event_type && e.outcome == Outcome::Failure)
            else {
                continue;
            };
            reasons.push(failure.failure_reason().map(|reason| cut(&reason)));
        }
        Ok(reasons)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_most_frequent_reasons_come_first_at_most_three() {
        let r = |text: &str| Some(text.to_owned());
        let reasons = vec![r("b"), r("a"), None, r("a"), r("c"), r("b"), r("a"), r("d")];
        assert_eq!(top(reasons), [(r("a"), 3), (r("b"), 2), (None, 1)]);
    }
}
