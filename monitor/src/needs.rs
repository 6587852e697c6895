//! What the overview's "Needs a person" section is made of: failures per component with their
//! most frequent reasons, holds, batches waiting for a person, overdue and stale work. Counts
//! come from the overview's own index tallies; only the failure reasons cost reads, bounded.

use autocomp_model::{BatchId, ComponentName, ComponentState, Hold};
use autocomp_ops::operator::{OperatorError, Step, group_reasons};

use crate::data::{Monitor, Overview, cut};
use crate::filter::StateFilter;

/// The most failed batches whose heads are read per component: the reasons are a sample, so
/// the overview costs the same at a thousand failures as at twenty.
pub use autocomp_ops::operator::FAILURES_READ;
/// The most heads read for reasons across all components (a broken pipeline fails everywhere
/// at once; the overview must stay as fast then).
pub const FAILURES_READ_IN_ALL: usize = 100;
/// The most frequent reasons shown per component.
pub const TOP_REASONS: usize = 3;

/// Everything that waits on a person, in the order the overview shows it. Empty lists mean
/// nothing of that kind; `Needs::is_empty` means nothing at all.
#[derive(Debug, Clone, Default)]
pub struct Needs {
    /// Components whose every pass stops before any work (a broken contract), with why.
    pub contracts: Vec<(ComponentName, String)>,
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
            && self.contracts.is_empty()
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

impl Monitor {
    /// What needs a person, from `overview`'s counts and steering; the reasons of failures
    /// from the heads of at most `FAILURES_READ` failed batches per component (the first the
    /// index lists: it has no newest-first order), `FAILURES_READ_IN_ALL` in all. A batch
    /// no longer failed by the time its head is read is left out of the sample.
    pub async fn needs(&self, overview: &Overview) -> Result<Needs, OperatorError> {
        let mut needs = Needs { pipeline_hold: overview.steering.pipeline.clone(), ..Needs::default() };
        let mut budget = FAILURES_READ_IN_ALL;
        let steps: Vec<Step> = overview.rows.iter().map(|row| Step { registered: row.component.clone() }).collect();
        for step in &steps {
            if let Some(reason) = step.broken_contract(&steps) {
                needs.contracts.push((step.name().clone(), reason));
            }
        }
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
            let step = Step { registered: row.component.clone() };
            let read = self.operator().failure_reasons(&step, limit).await?;
            budget -= read.len().min(budget);
            needs.failures.push(FailuresAt { component: name.clone(), total, read: read.len(), reasons: top(read) });
        }
        Ok(needs)
    }
}

/// The most frequent of the reasons `read`, cut to a cell's length, at most `TOP_REASONS`,
/// ties by text.
fn top(read: Vec<(BatchId, Option<String>)>) -> Vec<(Option<String>, usize)> {
    let cut_short = read.into_iter().map(|(id, reason)| (id, reason.map(|r| cut(&r)))).collect();
    group_reasons(cut_short).into_iter().take(TOP_REASONS).map(|group| (group.reason, group.count)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_most_frequent_reasons_come_first_at_most_three() {
        let r = |text: &str| Some(text.to_owned());
        let reasons = [r("b"), r("a"), None, r("a"), r("c"), r("b"), r("a"), r("d")];
        let read = reasons.into_iter().enumerate().map(|(n, r)| (BatchId::new(format!("b{n}")).unwrap(), r)).collect();
        assert_eq!(top(read), [(r("a"), 3), (r("b"), 2), (None, 1)]);
    }
}
