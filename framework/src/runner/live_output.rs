//! A run's output while it goes on: what its streams hold is saved in the store every
//! `LIVE_OUTPUT_INTERVAL` (when it grew), apart from any result, for `autocomp logs --follow`
//! and the batch page; a cancelled run's output is saved once its work returns (the result
//! it cannot record would have carried it); once a result carries the output, or the claim
//! is handed back, what was saved goes.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use autocomp_model::{BatchId, ComponentName, RunOutput};
use autocomp_store::ObjectStore;
use tracing::debug;

use super::summary::BatchResult;
use crate::component::fitted_output;
use crate::output::LiveOutput;

/// How often a running run's output is saved when it grew: a run shorter than this saves
/// nothing (its result carries its output), so the fast path pays nothing for it.
pub(crate) const LIVE_OUTPUT_INTERVAL: Duration = Duration::from_secs(2);

/// One run's output saver: saves while it lives (the task stops when it is dropped), and
/// knows whether it saved anything.
pub(crate) struct LiveOutputSaver {
    task: Option<tokio::task::JoinHandle<()>>,
    run: RunKey,
    saved: Arc<AtomicBool>,
}

/// The run whose output is saved.
#[derive(Clone)]
struct RunKey {
    store: Arc<dyn ObjectStore>,
    batch: BatchId,
    component: ComponentName,
    generation: i64,
}

impl LiveOutputSaver {
    /// Saves what `live` holds every `LIVE_OUTPUT_INTERVAL` while it grows, fitted into
    /// `budget` bytes (0: saves nothing).
    pub(crate) fn start(
        store: Arc<dyn ObjectStore>,
        batch: BatchId,
        component: ComponentName,
        generation: i64,
        live: LiveOutput,
        budget: usize,
    ) -> Self {
        let run = RunKey { store, batch, component, generation };
        let saved = Arc::new(AtomicBool::new(false));
        let task = (budget > 0).then(|| tokio::spawn(save_while_it_grows(run.clone(), live, budget, saved.clone())));
        LiveOutputSaver { task, run, saved }
    }

    /// Stops saving (the work returned, or was left behind): a save from now on is the
    /// runner's own, after the result.
    pub(crate) fn stop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }

    /// After the run ended as `result`: a result now carries the output and a handed-back
    /// claim is worked again, so what was saved goes. Any other run keeps it: one refused as
    /// fenced (an operator's cancel, whose output `record` saved, or a takeover: the last
    /// trace of the run taken over), and one whose result the store did not take (cut off
    /// from it, the process must not wait out the store's retries before it gives its
    /// batches up; the run is taken over and keeps its last output, as a dead worker's).
    pub(crate) async fn finish(mut self, result: &BatchResult) {
        self.stop();
        let ended = matches!(result, BatchResult::Recorded { .. } | BatchResult::Released { .. });
        if !self.saved.load(Ordering::Relaxed) || !ended {
            return;
        }
        let run = &self.run;
        if let Err(e) = run.store.set_run_output(&run.batch, &run.component, run.generation, None, false).await {
            debug!(batch = %run.batch, "cannot remove the output saved while the run went on: {e}");
        }
    }
}

impl Drop for LiveOutputSaver {
    fn drop(&mut self) {
        self.stop();
    }
}

async fn save_while_it_grows(run: RunKey, live: LiveOutput, budget: usize, saved: Arc<AtomicBool>) {
    let mut printed_when_saved = 0;
    loop {
        tokio::time::sleep(LIVE_OUTPUT_INTERVAL).await;
        let (printed, output) = live.snapshot();
        if printed == printed_when_saved {
            continue;
        }
        let Some(output) = fitted_output(output, budget) else { continue };
        // Before the call: a save in flight when the task is stopped may still land, and its
        // row must then be removed with the others.
        saved.store(true, Ordering::Relaxed);
        match run.store.set_run_output(&run.batch, &run.component, run.generation, Some(output), false).await {
            Ok(()) => printed_when_saved = printed,
            // The run is no longer open (cancelled, taken over, recorded): its work is being
            // stopped, and only its whole output may be saved now.
            Err(e) if e.is_fenced() => return,
            Err(e) => debug!(batch = %run.batch, "cannot save the output so far (tried again later): {e}"),
        }
    }
}

/// Saves a run's whole output (what the result it could not record would have kept; none
/// printed is saved as such, so a follower knows the output is whole). The store takes it
/// only for a run an operator cancelled (or still open): whether it did.
pub(crate) async fn save_cancelled_output(
    store: &dyn ObjectStore,
    batch: &BatchId,
    component: &ComponentName,
    generation: i64,
    output: Option<RunOutput>,
) -> bool {
    let output = output.unwrap_or_default();
    match store.set_run_output(batch, component, generation, Some(output), true).await {
        Ok(()) => true,
        Err(e) => {
            debug!(batch = %batch, "the run's whole output is not saved apart: {e}");
            false
        }
    }
}
