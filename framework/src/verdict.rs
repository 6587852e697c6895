//! One pass as the binaries run it: the runner's pass, what it tells the operator on stderr
//! and its exit code, and the verdict the long-running loops (`--schedule`, `--watch`) share
//! on whether to go on. Both loops use it; it uses neither.

use std::sync::Arc;

use tracing::error;

use crate::component::Component;
use crate::exit::{self, RunError};
use crate::runner::{BatchResult, Runner, Selection};

/// How one pass ended, for the loops that run many.
pub(crate) struct PassOutcome {
    /// The exit code a cron pass would end with.
    pub code: u8,
    /// A batch timed out: the process must exit, so its hung work cannot hold anything.
    pub timed_out: bool,
    /// Batches the pass took up (recorded, released, fenced, ...): 0 for an idle pass, a
    /// held one, or one whose batches all wait for a pool.
    pub handled: usize,
    /// Batches left for a later pass because a pool they need was full.
    pub waiting: usize,
}

/// One pass and its exit code.
pub(crate) async fn pass<C: Component>(
    runner: &Arc<Runner<C>>,
    selection: &Selection,
) -> Result<PassOutcome, RunError> {
    let summary = runner.run_pass(selection).await?;
    for result in &summary.results {
        match result {
            BatchResult::NotReady { id, reason, forcible } => {
                let force = if *forcible { " (use --force to run it anyway)" } else { "" };
                eprintln!(
                    "{}: batch {id} is not ready: {}{force}",
                    runner.name(),
                    crate::for_terminal(&reason.to_string())
                )
            }
            BatchResult::Busy { id } => eprintln!("{}: batch {id} is locked by another worker", runner.name()),
            // A cron pass says nothing (waiting is normal; the registry's pass summary counts
            // them); a manual run asked for this very batch.
            BatchResult::WaitingForPool { id, pool } if matches!(selection, Selection::Batch { .. }) => eprintln!(
                "{}: batch {id} waits for pool {pool}: every slot is in use; nothing claimed, try again later",
                runner.name()
            ),
            _ => {}
        }
    }
    let timed_out = summary.timed_out();
    if timed_out {
        error!("a batch timed out; exiting so its hung work cannot hold anything");
    }
    Ok(PassOutcome { code: summary.exit_code(), timed_out, handled: summary.taken_up(), waiting: summary.waiting() })
}

/// What a long-running loop (`--schedule`, `--watch`) does after a pass.
pub(crate) enum PassEnd {
    /// Keep going.
    Continue {
        /// Batches the pass took up: a watcher that worked on some looks again at once.
        handled: usize,
        /// Batches left waiting for a pool: a watcher looks again soon, as a slot frees
        /// without the store moving (its holder's result is recorded just before).
        waiting: usize,
        /// Another pass held the poll lock: a watcher looks again soon too, since the holder
        /// may claim nothing of what this pass was offered, and then nothing it commits wakes
        /// the watcher.
        busy: bool,
    },
    /// Exit with this code: the lock service was lost or a batch timed out.
    Stop(u8),
    /// The pass refused to start (a broken contract): a watcher waits for it to be mended.
    Refused(String),
    /// Exit with this error's code (the store or index unreachable, a usage error).
    Error(RunError),
}

/// The rules both loops share: a busy poll lock is another pass at work, not an error; a
/// failed batch is remembered in `worst` (the exit code at shutdown); a lost lock service or
/// a timed-out batch ends the process with that pass's code.
pub(crate) fn pass_verdict(outcome: Result<PassOutcome, RunError>, worst: &mut u8) -> PassEnd {
    let outcome = match outcome {
        Ok(outcome) => outcome,
        Err(RunError::PollLockBusy(_)) => return PassEnd::Continue { handled: 0, waiting: 0, busy: true },
        Err(RunError::ContractBroken(reason)) => return PassEnd::Refused(reason),
        Err(e) => return PassEnd::Error(e),
    };
    if outcome.code == exit::FAILED {
        *worst = exit::FAILED;
    }
    if outcome.code == exit::LOCKS_LOST || outcome.timed_out {
        return PassEnd::Stop(outcome.code);
    }
    PassEnd::Continue { handled: outcome.handled, waiting: outcome.waiting, busy: false }
}
