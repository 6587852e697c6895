//! Which batches a pass considers: what the index offers (the trigger's answer, retries
//! last), whether a hold stops the claims, and the re-check of each locked candidate in the
//! store (the index may lag behind it; the claim re-checks in its transaction, a component
//! with pools reads first too). `--dry-run` (`dry_run`) is this phase alone.

use std::collections::{HashMap, HashSet};

use autocomp_model::{Batch, BatchId, BatchSummary, ComponentName, HoldKind, Steering, SummaryAt, Trigger};
use tracing::{debug, warn};

use super::lock::HeldLocks;
use super::pass::Pass;
use super::{BatchResult, Judged, Runner};
use crate::component::Component;
use crate::exit::RunError;

impl<C: Component> Runner<C> {
    /// The candidates the index offers, in trigger order; retries of transient failures last.
    /// Watch mode asks this between passes; a pass re-checks each one against the store.
    pub async fn candidates(&self) -> Result<Vec<BatchId>, RunError> {
        self.query_index(Some(self.candidate_cap())).await
    }

    /// Every candidate the index offers, in the order `candidates` gives them, without the
    /// cap a pass applies: a dry run counts what it does not list. The trigger's own
    /// `limit` still holds, as it does for a pass.
    pub(super) async fn all_candidates(&self) -> Result<Vec<BatchId>, RunError> {
        self.query_index(None).await
    }

    /// The questions `candidates` asks the index, in its order (the trigger, then the retry
    /// trigger), each limited as it limits them: a watcher answers them from the store's
    /// change feed between the index's answers (`watch::feed`).
    pub(crate) fn candidate_triggers(&self) -> Vec<Trigger> {
        self.limited_triggers(Some(self.candidate_cap()))
    }

    /// How many candidates each trigger offers a pass: more than it will claim, as other
    /// hosts may hold some of them.
    fn candidate_cap(&self) -> usize {
        self.claim_limit().saturating_mul(4).max(16)
    }

    /// The trigger and the retry trigger, each at most `cap`.
    fn limited_triggers(&self, cap: Option<usize>) -> Vec<Trigger> {
        let limited = |t: &Trigger| match cap {
            Some(wanted) => Trigger { limit: Some(t.limit.map_or(wanted, |l| l.min(wanted))), ..t.clone() },
            None => t.clone(),
        };
        std::iter::once(&self.descriptor.trigger).chain(&self.retry_trigger).map(limited).collect()
    }

    /// The trigger's answer then the retry trigger's (without repeats), each at most `cap`.
    async fn query_index(&self, cap: Option<usize>) -> Result<Vec<BatchId>, RunError> {
        let mut ids = Vec::new();
        for trigger in self.limited_triggers(cap) {
            for id in self.pipeline.index.query(&trigger).await? {
                if !ids.contains(&id) {
                    ids.push(id);
                }
            }
        }
        Ok(ids)
    }

    /// Of `summaries` (a watcher's look judged its triggers on them), the batches this
    /// component's `readiness` finds ready with no open run of the component, at their
    /// `changed_seq`: a claim of them goes by that stamp (`Judged`), which proves the state
    /// unchanged. Judged at the batch's own last activity, a time of the store's clock that
    /// the store's now is past: the one clause time changes (`settled_for`, a retry's backoff)
    /// only ever comes to hold, so a batch ready then is ready at the claim whatever this
    /// host's clock says. A trigger with `settled_for`, and a retry (its backoff), is never
    /// ready at that instant: such batches are claimed as `claim_ready` judges them.
    pub(crate) fn judged_ready<'a>(&self, summaries: impl Iterator<Item = &'a BatchSummary>) -> Judged {
        summaries
            .filter(|summary| !summary.running.contains(&self.name))
            .filter(|summary| self.descriptor.readiness(&SummaryAt { summary, at: summary.last_activity }).is_ok())
            .map(|summary| (summary.id.clone(), summary.changed_seq))
            .collect()
    }

    /// Why the component claims nothing now, if it is held (its own hold or the whole
    /// pipeline's): one store read, kept for the next pass's start. A watcher asks before it
    /// asks the index.
    pub async fn held(&self) -> Result<Option<String>, RunError> {
        let steering = self.pipeline.store.steering().await?;
        self.steering.keep(&steering);
        Ok(held_reason(&self.name, &steering))
    }

    /// Whether the steering this runner last saw may hold the component: it has seen none,
    /// or the one it saw holds it (a resume is seen only by a read, `held`). When it says
    /// no, a watcher looks without reading the steering: a hold that landed since is caught
    /// by the claim, which claims nothing while held and answers the steering saying so.
    pub fn may_be_held(&self) -> bool {
        self.steering.get().is_none_or(|steering| held_reason(&self.name, &steering).is_some())
    }

    /// The locked batches the store holds and still finds ready (all it holds, when forced),
    /// in lock order; the others' locks are released at once. The index lagged behind the
    /// store, or a manual run asked for a batch that is not ready (answered `NotReady`).
    pub(super) async fn recheck(&self, locked: &mut HeldLocks, pass: &mut Pass) -> Result<Vec<Batch>, RunError> {
        let ids = locked.ids();
        let batches = self.pipeline.store.get_batches(&ids).await?;
        let mut batches: HashMap<BatchId, Batch> = batches.into_iter().map(|batch| (batch.id.clone(), batch)).collect();
        let mut ready = Vec::new();
        let mut missing = None;
        for id in ids {
            let Some(batch) = batches.remove(&id) else {
                self.missing(id, pass.manual, &mut missing);
                continue;
            };
            if !pass.force && self.descriptor.readiness(&batch).is_err() {
                self.no_longer_ready(&batch, pass);
                continue;
            }
            ready.push(batch);
        }
        let wanted: HashSet<&BatchId> = ready.iter().map(|batch| &batch.id).collect();
        locked.release_where(|id| !wanted.contains(id)).await;
        match missing {
            Some(error) => Err(error),
            None => Ok(ready),
        }
    }

    /// A batch the store found no longer ready (the index lagged behind it): skipped, and a
    /// manual run is answered `NotReady` with the clause that does not hold.
    pub(super) fn no_longer_ready(&self, batch: &Batch, pass: &mut Pass) {
        let (clause, reason) = match self.descriptor.readiness(batch) {
            Err(refusal) => (refusal.clause, refusal.reason),
            // The store judged the same snapshot with the same descriptor: not reached.
            Ok(()) => ("store", "the store found it not ready".to_owned()),
        };
        debug!(batch = %batch.id, clause, "no longer ready in the store; skipped");
        if pass.manual {
            let forcible = clause != autocomp_model::PRUNED;
            pass.summary.results.push(BatchResult::NotReady { id: batch.id.clone(), reason, forcible });
        }
    }

    /// A batch the store does not have: a manual run names it (exit 2); the index listing
    /// it is only warned about.
    pub(super) fn missing(&self, id: BatchId, manual: bool, failure: &mut Option<RunError>) {
        if manual {
            failure.get_or_insert(RunError::Usage(format!("batch {id} does not exist")));
        } else {
            warn!(batch = %id, "the index lists a batch the store does not have; skipped (`autocomp reindex` rebuilds the index)");
        }
    }
}

/// Why `component` claims nothing, if it is held: its own hold (a pause, a drain, its open
/// circuit) else the whole pipeline's, in one line naming who, since when, why and the
/// command that lifts it.
pub(crate) fn held_reason(component: &ComponentName, steering: &Steering) -> Option<String> {
    let (hold, what, resume) = match steering.components.get(component) {
        Some(hold) => (hold, component.to_string(), format!("autocomp resume {component}")),
        None => (steering.pipeline.as_ref()?, "the pipeline".to_owned(), "autocomp resume --all".to_owned()),
    };
    let reason = &hold.reason;
    Some(match hold.kind {
        // The reason says "circuit open: N consecutive failures, last: ...", and `by` is the
        // runner whose failure opened it.
        HoldKind::Circuit => format!("{what} is held since {}: {reason} ({resume})", hold.since),
        kind => format!("{what} is {} by {} since {}: {reason} ({resume})", kind.as_str(), hold.by, hold.since),
    })
}

#[cfg(test)]
mod tests {
    use autocomp_model::{Agent, Timestamp};

    use super::*;

    #[test]
    fn a_hold_is_worded_with_who_since_when_why_and_the_command_that_lifts_it() {
        let name = ComponentName::new("checksum-verifier").unwrap();
        let mut steering = Steering::default();
        assert_eq!(held_reason(&name, &steering), None);
        let hold = |kind, by: &str, reason: &str| autocomp_model::Hold {
            kind,
            by: Agent::new(by).unwrap(),
            reason: reason.into(),
            since: Timestamp(0),
        };
        steering.pipeline = Some(hold(HoldKind::Drain, "operator:bob", "db upgrade"));
        assert_eq!(
            held_reason(&name, &steering).unwrap(),
            "the pipeline is draining by operator:bob since 1970-01-01T00:00:00.000Z: db upgrade \
             (autocomp resume --all)"
        );
        // The component's own hold comes first: resuming the pipeline would not lift it.
        steering.components.insert(name.clone(), hold(HoldKind::Pause, "operator:ann", "tape maintenance"));
        assert_eq!(
            held_reason(&name, &steering).unwrap(),
            "checksum-verifier is paused by operator:ann since 1970-01-01T00:00:00.000Z: tape maintenance \
             (autocomp resume checksum-verifier)"
        );
        let circuit = hold(HoldKind::Circuit, "checksum-verifier/1.0@h#1", "circuit open: 3 consecutive failures");
        steering.components.insert(name.clone(), circuit);
        assert_eq!(
            held_reason(&name, &steering).unwrap(),
            "checksum-verifier is held since 1970-01-01T00:00:00.000Z: circuit open: 3 consecutive failures \
             (autocomp resume checksum-verifier)"
        );
    }
}
