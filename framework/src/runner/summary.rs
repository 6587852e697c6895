//! What one pass did (`PassSummary`, a `BatchResult` per batch) and what follows from it:
//! the exit code, the registry's outcome and one-line summary. Plain values, apart from the
//! runner that fills them in.

use std::collections::BTreeMap;

use autocomp_model::{BatchId, Outcome, PassOutcome, PoolName, WorkDone};

use crate::exit;

/// What happened to one batch in a pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchResult {
    /// Its result event is in the store (a give-up after `max_attempts` too).
    Recorded {
        /// The batch.
        id: BatchId,
        /// The recorded event's outcome.
        outcome: Outcome,
        /// The work ran past `max_runtime` and was recorded as a failure saying so.
        timed_out: bool,
        /// What the registry tallies of it: its result and how long the work took.
        work: WorkDone,
    },
    /// Shut down before it finished: claim released without an event, ready again.
    Released {
        /// The batch.
        id: BatchId,
    },
    /// Someone else took the batch over; our result was refused.
    Fenced {
        /// The batch.
        id: BatchId,
    },
    /// The lock service was lost before recording; nothing recorded.
    NotRecorded {
        /// The batch.
        id: BatchId,
    },
    /// The store stayed unreachable (past its retries) when the result was to be recorded;
    /// nothing recorded, the run stays open until the next claim marks it abandoned.
    StoreUnreachable {
        /// The batch.
        id: BatchId,
    },
    /// A manually requested batch the trigger does not select.
    NotReady {
        /// The batch.
        id: BatchId,
        /// The clause that refused it, its type and what the batch holds.
        reason: String,
        /// Whether `--force` would run it (not a batch whose history was pruned).
        forcible: bool,
    },
    /// A manually requested batch whose lock is held by another worker.
    Busy {
        /// The batch.
        id: BatchId,
    },
    /// Locked and ready, but every slot of a resource pool its work needs was taken: its
    /// lock was let go of, it was neither claimed nor counted as an attempt, and a later
    /// round of the pass (once its own work frees a slot) or a later pass takes it up. Not a
    /// failure.
    WaitingForPool {
        /// The batch.
        id: BatchId,
        /// The first pool (in the descriptor's order) that had no free slot.
        pool: PoolName,
    },
}

impl BatchResult {
    /// Whether the pass took the batch up (claimed it, or answered a manual run about it),
    /// rather than leaving it for a later pass because a pool was full.
    pub fn taken_up(&self) -> bool {
        !matches!(self, BatchResult::WaitingForPool { .. })
    }
}

/// What one pass did: how each batch it took up ended.
#[derive(Debug, Default)]
pub struct PassSummary {
    /// One per batch taken up (or left waiting for a pool), in no particular order; empty
    /// for an idle pass.
    pub results: Vec<BatchResult>,
    /// Lock paths (a batch's, a pool slot's) that held a node no lock service made (skipped,
    /// an alarm: exit 6).
    pub foreign_locks: Vec<String>,
    /// Why the pass stopped claiming (or never started) because the component or the whole
    /// pipeline is held (paused, draining, its circuit open), as `held_reason` words it.
    pub held: Option<String>,
    /// The claim rounds it took: more than one when it queued for a full pool (`queue`).
    pub rounds: usize,
}

impl PassSummary {
    /// How the registry shows the pass: idle when it took nothing up (a held pass, one whose
    /// batches all wait for a pool).
    pub fn pass_outcome(&self) -> PassOutcome {
        match self.exit_code() {
            _ if self.taken_up() == 0 && self.foreign_locks.is_empty() => PassOutcome::Idle,
            exit::OK => PassOutcome::Ok,
            exit::FAILED => PassOutcome::Failed,
            _ => PassOutcome::Error,
        }
    }

    /// Batches the pass took up (see [`BatchResult::taken_up`]).
    pub fn taken_up(&self) -> usize {
        self.results.iter().filter(|r| r.taken_up()).count()
    }

    /// Batches left for a later pass because a pool they need was full.
    pub fn waiting(&self) -> usize {
        self.results.len() - self.taken_up()
    }

    /// One line: how many batches and how each ended, which pools batches wait for, and the
    /// hold that stopped the claims. At most `MAX_DESCRIBED_CHARS` (the registry's limit; an
    /// operator's reason for a hold may be long).
    pub fn describe(&self) -> String {
        let line = self.describe_whole();
        if line.chars().count() <= MAX_DESCRIBED_CHARS {
            return line;
        }
        let cut = line.char_indices().nth(MAX_DESCRIBED_CHARS - 1).map_or(line.len(), |(at, _)| at);
        format!("{}…", &line[..cut])
    }

    fn describe_whole(&self) -> String {
        let mut notes = Vec::new();
        let mut waits: BTreeMap<&PoolName, usize> = BTreeMap::new();
        for result in &self.results {
            if let BatchResult::WaitingForPool { pool, .. } = result {
                *waits.entry(pool).or_default() += 1;
            }
        }
        for (pool, n) in waits {
            notes.push(format!("{} for pool {pool}", wait_for(n)));
        }
        if let Some(held) = &self.held {
            notes.push(format!("held: {held}"));
        }
        match self.foreign_locks.len() {
            0 => {}
            n => {
                notes.push(format!("{n} lock{} not made by autocomp (`autocomp locks`)", if n == 1 { "" } else { "s" }))
            }
        }
        let taken_up = self.taken_up();
        if taken_up == 0 {
            let nothing = if self.held.is_some() || self.waiting() > 0 { "nothing claimed" } else { "nothing ready" };
            return [nothing.to_owned()].into_iter().chain(notes).collect::<Vec<_>>().join("; ");
        }
        let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
        for result in self.results.iter().filter(|r| r.taken_up()) {
            let kind = match result {
                BatchResult::Recorded { timed_out: true, .. } => "timed out",
                BatchResult::Recorded { outcome, .. } => outcome.as_str(),
                BatchResult::Released { .. } => "released",
                BatchResult::Fenced { .. } => "fenced",
                BatchResult::NotRecorded { .. } => "not recorded",
                BatchResult::StoreUnreachable { .. } => "store unreachable",
                BatchResult::NotReady { .. } => "not ready",
                BatchResult::Busy { .. } => "locked elsewhere",
                BatchResult::WaitingForPool { .. } => "waiting for a pool",
            };
            *counts.entry(kind).or_default() += 1;
        }
        let parts: Vec<String> = counts.into_iter().map(|(kind, n)| format!("{n} {kind}")).collect();
        let line = format!("{taken_up} batch{}: {}", if taken_up == 1 { "" } else { "es" }, parts.join(", "));
        [line].into_iter().chain(notes).collect::<Vec<_>>().join("; ")
    }

    /// Each recorded result, for the registry's tallies.
    pub fn work(&self) -> Vec<WorkDone> {
        let recorded = self.results.iter().filter_map(|r| match r {
            BatchResult::Recorded { work, .. } => Some(*work),
            _ => None,
        });
        recorded.collect()
    }

    /// Whether some batch's result went unrecorded because the store could not be reached.
    pub fn store_unreachable(&self) -> bool {
        self.results.iter().any(|r| matches!(r, BatchResult::StoreUnreachable { .. }))
    }

    /// Whether some batch's work ran past `max_runtime` (the process must then exit).
    pub fn timed_out(&self) -> bool {
        self.results.iter().any(|r| matches!(r, BatchResult::Recorded { timed_out: true, .. }))
    }

    /// The pass's exit code: 4 when a result went unrecorded (the lock service lost), 5
    /// when the store was unreachable for one, else 6 when a batch's lock path held a node
    /// no lock service made, else 1 when a batch failed, was fenced, was not ready or was
    /// busy (the last two only in a manual run), else 0.
    pub fn exit_code(&self) -> u8 {
        if self.results.iter().any(|r| matches!(r, BatchResult::NotRecorded { .. })) {
            return exit::LOCKS_LOST;
        }
        if self.store_unreachable() {
            return exit::UNREACHABLE;
        }
        if !self.foreign_locks.is_empty() {
            return exit::FOREIGN_LOCK;
        }
        let failed = self.results.iter().any(|r| {
            matches!(
                r,
                BatchResult::Recorded { outcome: Outcome::Failure, .. }
                    | BatchResult::Fenced { .. }
                    | BatchResult::NotReady { .. }
                    | BatchResult::Busy { .. }
            )
        });
        if failed { exit::FAILED } else { exit::OK }
    }
}

/// The longest pass summary the component registry takes.
const MAX_DESCRIBED_CHARS: usize = 2_000;

/// "1 batch waits", "2 batches wait".
pub(super) fn wait_for(n: usize) -> String {
    if n == 1 { "1 batch waits".to_owned() } else { format!("{n} batches wait") }
}

#[cfg(test)]
mod tests {
    use autocomp_model::WorkResult;

    use super::*;

    #[test]
    fn a_pass_whose_batches_wait_for_a_pool_is_idle_exits_0_and_says_which_pool() {
        let tape = PoolName::new("tape").unwrap();
        let waiting = |id: &str| BatchResult::WaitingForPool { id: BatchId::new(id).unwrap(), pool: tape.clone() };
        let mut summary = PassSummary { results: vec![waiting("B1"), waiting("B2")], ..PassSummary::default() };
        assert_eq!(summary.describe(), "nothing claimed; 2 batches wait for pool tape");
        assert_eq!((summary.exit_code(), summary.pass_outcome()), (exit::OK, PassOutcome::Idle));
        assert_eq!((summary.taken_up(), summary.waiting()), (0, 2));
        let work = WorkDone { result: WorkResult::Success, duration_ms: 5 };
        let id = BatchId::new("B3").unwrap();
        summary.results.push(BatchResult::Recorded { id, outcome: Outcome::Success, timed_out: false, work });
        summary.held = Some("probe is paused by operator:ann since T: x (autocomp resume probe)".into());
        assert_eq!(
            summary.describe(),
            "1 batch: 1 success; 2 batches wait for pool tape; held: probe is paused by operator:ann since T: x \
             (autocomp resume probe)"
        );
        assert_eq!((summary.exit_code(), summary.pass_outcome()), (exit::OK, PassOutcome::Ok));
        let held_only = PassSummary { held: Some("the pipeline is paused".into()), ..PassSummary::default() };
        assert_eq!(held_only.describe(), "nothing claimed; held: the pipeline is paused");
        assert_eq!(held_only.pass_outcome(), PassOutcome::Idle);
        let long = PassSummary { held: Some("x".repeat(5_000)), ..PassSummary::default() };
        assert_eq!(long.describe().chars().count(), MAX_DESCRIBED_CHARS, "the registry refuses longer");
    }
}
