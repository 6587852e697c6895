//! The work phase: each claimed batch's work on an OS thread of its own while it runs
//! (`max_threads` at a time; the threads kept for the next batches, `work_threads`), bounded
//! by `max_runtime`, cancelled by a shutdown, a lost lock session or a takeover, panics
//! caught; its outcome handed to `record`.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use autocomp_model::{BatchId, Report, RunOutput, RunState};
use autocomp_toolkit::telemetry;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot, watch};
use tracing::{Instrument, Span, error, info, warn};

use super::live_output::LiveOutputSaver;
use super::pass::Claimed;
use super::phases::{self, Phase};
use super::record::{failed_report, report_of};
use super::{BatchResult, Runner, stop_requested};
use crate::component::{CheckpointWriter, Component, WorkContext, WorkError, fitted_output};
use crate::locks::SessionState;
use crate::output::{LiveOutput, LogCapture};

/// Whether a claimed batch's work may start: with this thread's permit, or not at all.
enum Start {
    Go(OwnedSemaphorePermit),
    /// A shutdown was requested: release the claim (holding the permit, if one was got).
    Release(Option<OwnedSemaphorePermit>),
    /// The lock session was lost: nothing recorded.
    SessionLost,
}

impl<C: Component> Runner<C> {
    /// Steps 5-7 for every claimed batch, `max_threads` at a time.
    pub(super) async fn work_all(self: &Arc<Self>, claimed: Vec<Claimed>) -> Vec<BatchResult> {
        self.breaker.start_pass();
        let permits = Arc::new(Semaphore::new(self.config.max_threads));
        let mut tasks = tokio::task::JoinSet::new();
        for batch in claimed {
            let (runner, permits) = (Arc::clone(self), Arc::clone(&permits));
            let span = batch.span.clone();
            tasks.spawn(phases::for_batch(async move { runner.work_one(batch, permits).await }).instrument(span));
        }
        let mut results = Vec::new();
        while let Some(joined) = tasks.join_next().await {
            match joined {
                Ok(result) => results.push(result),
                Err(e) => error!("a batch task failed: {e}"),
            }
        }
        let handed_back = self.breaker.handed_back_count();
        if handed_back > 0 {
            warn!(
                component = %self.name,
                "the circuit is open: {handed_back} claimed batch(es) handed back unworked (not counted as attempts; \
                 ready again once resumed)"
            );
        }
        results
    }

    /// One claimed batch from its wait for a thread to its recorded result (or release).
    async fn work_one(self: Arc<Self>, claimed: Claimed, permits: Arc<Semaphore>) -> BatchResult {
        let (shutdown, session) = (self.shutdown.clone(), self.pipeline.locks.session());
        let permit = match permit_to_start(permits, shutdown, session, &claimed.batch.id).await {
            Start::Go(permit) => permit,
            // The permit (if any) is held until the claim is released.
            Start::Release(_permit) => return self.release(claimed).await,
            Start::SessionLost => return self.give_up_after_session_loss(claimed).await,
        };
        if self.shutting_down() {
            return self.release(claimed).await;
        }
        if self.breaker.is_open() {
            // Claimed but not started when a result opened the circuit: not worked, and
            // released rather than abandoned, so it is no attempt.
            drop(permit);
            self.breaker.handed_back();
            return self.release(claimed).await;
        }
        let _working = self.breaker.working();
        if let Some(unfit) = self.result_checks.unfit_read(&claimed.batch, &self.name) {
            // A result it reads was recorded under a schema that does not give what it
            // declares: not worked on; the failure says which rerun refreshes it.
            drop(permit);
            let summary = "not worked on: a result it reads does not give what it declares (read_schema)";
            let mut report = failed_report(&self.config, summary);
            report.add_failure(unfit);
            return self.record(claimed, report, false).await;
        }
        self.run_work(claimed, permit).await
    }

    /// The work on its thread (`work_and_record`), its output saved while it goes on.
    async fn run_work(&self, claimed: Claimed, permit: OwnedSemaphorePermit) -> BatchResult {
        let live = LiveOutput::default();
        let mut saver = LiveOutputSaver::start(
            Arc::clone(&self.pipeline.store),
            claimed.batch.id.clone(),
            self.name.clone(),
            claimed.claim.generation(),
            live.clone(),
            self.config.max_output,
        );
        let result = self.work_and_record(claimed, permit, live, &mut saver).await;
        saver.finish(&result).await;
        result
    }

    /// The work on its thread, bounded by `max_runtime`, cancelled by a shutdown (after
    /// `shutdown_grace`), a lost lock session or a takeover; its result recorded. `saver`
    /// is stopped once the work returns (or is left behind).
    async fn work_and_record(
        &self,
        claimed: Claimed,
        permit: OwnedSemaphorePermit,
        live: LiveOutput,
        saver: &mut LiveOutputSaver,
    ) -> BatchResult {
        // Waiting for a work thread is no work of this batch's.
        phases::mark(Phase::Other);
        let mut shutdown = self.shutdown.clone();
        let mut session = self.pipeline.locks.session();
        let cancelled = Arc::new(AtomicBool::new(false));
        let started = Instant::now();
        // The work thread's log lines; shared so a timed-out run keeps what it logged.
        let log = (self.config.max_output > 0).then(|| LogCapture::new(self.config.max_output));
        if let Some(log) = &log {
            live.register(log.stream());
        }
        // The work's span ends when the work does (the future is dropped below), not with
        // the batch's result.
        let work_span = match telemetry::enabled() {
            true => tracing::info_span!(target: telemetry::TARGET, "work"),
            false => Span::none(),
        };
        let mut finished =
            Box::pin(self.spawn_work(&claimed, Arc::clone(&cancelled), log.clone(), live).instrument(work_span));
        let _watch = self.watch_for_takeover(&claimed, Arc::clone(&cancelled));
        let grace = self.config.shutdown_grace;
        // The loss first when several are ready at once: a shutdown or a timeout that came with
        // it must not release the claim (exit 0) or wait a longer grace on a lost session.
        let outcome = tokio::select! {
            biased;
            _ = session_lost(&mut session) => {
                // Every batch's task sees the loss at once: all work is cancelled together.
                cancelled.store(true, Ordering::Relaxed);
                error!(batch = %claimed.batch.id, "lock service session lost: work cancelled, nothing recorded");
                self.let_lost_work_go(finished.as_mut()).await;
                saver.stop();
                drop(permit);
                return self.give_up_after_session_loss(claimed).await;
            }
            finished = &mut finished => Some(finished),
            _ = tokio::time::sleep(self.config.max_runtime) => None,
            _ = async { stop_requested(&mut shutdown).await; tokio::time::sleep(grace).await } => {
                cancelled.store(true, Ordering::Relaxed);
                info!(batch = %claimed.batch.id, "shutting down: work cancelled, claim released");
                self.let_cancelled_work_clean_up(finished.as_mut()).await;
                saver.stop();
                drop(permit);
                return self.release(claimed).await;
            }
        };
        phases::mark(Phase::Work);
        drop(permit);
        let Some(outcome) = outcome else {
            // Cancelled, the work gets `cancel_grace` to stop (a command's process group is
            // killed) and hand back what it printed, which the timed-out failure keeps: a hang
            // leaves its trace. Work still hung after that cannot hold anything (the process
            // exits after this pass); the failure keeps what it logged until then. The claim
            // stays ours meanwhile: nothing else records on it until we do.
            cancelled.store(true, Ordering::Relaxed);
            // The run's duration is until its timeout; the grace is the runner's.
            let ran = started.elapsed();
            let returned = tokio::time::timeout(self.config.cancel_grace, finished.as_mut()).await.ok();
            saver.stop();
            if returned.is_none() {
                warn!(batch = %claimed.batch.id, "timed-out work did not return within cancel_grace; leaving it behind");
            }
            let printed = returned.and_then(Result::ok).and_then(|(_, report)| report.output);
            let report = self.timed_out_report(ran, log.as_ref(), printed);
            return self.record(claimed, report, true).await;
        };
        drop(finished);
        saver.stop();
        let mut report = match outcome {
            Ok((result, report)) => report_of(result, report),
            Err(()) => failed_report(&self.config, "the work thread ended without a result"),
        };
        report.duration_ms = started.elapsed().as_millis() as u64;
        self.record(claimed, report, false).await
    }

    /// The failure recorded for work past `max_runtime`, with what it printed when it
    /// returned after its cancel (`printed`), else what it logged until now.
    fn timed_out_report(&self, ran: Duration, log: Option<&LogCapture>, printed: Option<RunOutput>) -> Report {
        let mut report = failed_report(
            &self.config,
            &format!("did not finish within max_runtime {}", humantime::format_duration(self.config.max_runtime)),
        );
        report.timed_out = true;
        report.duration_ms = ran.as_millis() as u64;
        report.output = match printed {
            Some(printed) => fitted_output(printed, self.config.max_output),
            None => log
                .and_then(LogCapture::finish)
                .and_then(|log| fitted_output(RunOutput { streams: vec![log] }, self.config.max_output)),
        };
        report
    }

    /// Cancels the work once its run stops being the open, current one in the store (an
    /// operator's `cancel`, or a takeover): checked every second while the work runs; the
    /// watch ends when the returned guard is dropped.
    fn watch_for_takeover(&self, claimed: &Claimed, cancelled: Arc<AtomicBool>) -> AbortOnDrop {
        let store = Arc::clone(&self.pipeline.store);
        let (id, component, generation) = (claimed.batch.id.clone(), self.name.clone(), claimed.claim.generation());
        AbortOnDrop(tokio::spawn(async move {
            loop {
                tokio::time::sleep(TAKEOVER_CHECK_INTERVAL).await;
                // One indexed read of the run, whatever the length of the batch's log.
                let Ok(run) = store.run_state(&id, &component).await else { continue };
                let ours = run.filter(|run| run.generation == generation);
                if ours.as_ref().is_none_or(|run| run.state != RunState::Open) {
                    match ours.map(|run| run.state) {
                        Some(RunState::Cancelled) => {
                            warn!(batch = %id, "an operator cancelled this run; stopping its work")
                        }
                        _ => warn!(batch = %id, "another worker took the batch over; stopping its work"),
                    }
                    cancelled.store(true, Ordering::Relaxed);
                    return;
                }
            }
        }))
    }

    /// Waits up to `cancel_grace` for cancelled work to return (its result is discarded).
    /// After a lost session another host may take the batch once the server expires the
    /// session: cancelled work that has not stopped within the lock service's grace is left
    /// behind, and the pass ends (the process exits 4 without it).
    async fn let_lost_work_go<F: Future>(&self, work: std::pin::Pin<&mut F>) {
        let grace = self
            .pipeline
            .locks
            .lost_session_grace()
            .map_or(self.config.cancel_grace, |g| g.min(self.config.cancel_grace));
        if tokio::time::timeout(grace, work).await.is_err() {
            warn!("cancelled work did not stop within {grace:?} of losing the lock session; leaving it behind");
        }
    }

    async fn let_cancelled_work_clean_up<F: Future>(&self, work: std::pin::Pin<&mut F>) {
        if tokio::time::timeout(self.config.cancel_grace, work).await.is_err() {
            warn!("cancelled work did not return within cancel_grace; leaving it behind");
        }
    }

    /// Runs `work` on a work thread of its own while it runs (`work_threads`), panics caught;
    /// resolves when it returns.
    fn spawn_work(
        &self,
        claimed: &Claimed,
        cancelled: Arc<AtomicBool>,
        log: Option<LogCapture>,
        live: LiveOutput,
    ) -> impl Future<Output = Result<(Result<(), WorkError>, Report), ()>> + use<C> {
        let (sender, receiver) = oneshot::channel();
        let component = Arc::clone(&self.component);
        let settings = Arc::clone(&self.settings);
        let batch = claimed.batch.clone();
        let name = self.name.clone();
        let checkpoints = CheckpointWriter {
            store: Arc::clone(&self.pipeline.store),
            runtime: tokio::runtime::Handle::current(),
            batch: batch.id.clone(),
            component: self.name.clone(),
            generation: claimed.claim.generation(),
        };
        let mut context = WorkContext::new(&batch, self.config.max_reported_failures, self.config.max_output).attached(
            claimed.checkpoint.clone(),
            checkpoints,
            cancelled,
            live,
        );
        let spawned = self.work_threads.run(Box::new(move || {
            let installed = log.as_ref().map(LogCapture::install);
            let result = std::panic::catch_unwind(AssertUnwindSafe(|| component.work(&batch, &settings, &mut context)));
            drop(installed);
            if let Some(log) = log.as_ref().and_then(LogCapture::finish) {
                context.add_log(log);
            }
            let panicked = result.is_err();
            let result = result.unwrap_or_else(|panic| {
                let message = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "a non-string panic payload".into());
                // The default panic line names only the thread (`work`, which serves many
                // batches): this one says which batch and component, on stderr beside it.
                error!(batch = %batch.id, component = %name, "the work panicked: {}", autocomp_toolkit::for_terminal(&message));
                Err(WorkError::Permanent(format!("panicked: {message}")))
            });
            sender.send((result, context.into_report())).ok();
            !panicked
        }));
        async move {
            spawned.map_err(|e| error!("cannot start a work thread: {e}"))?;
            receiver.await.map_err(|_| ())
        }
    }
}

const TAKEOVER_CHECK_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Waits for a thread's permit, then, cut off from the lock service, for the session to come
/// back: start nothing while the server may be expiring the session (another host may take
/// this batch the moment it does), and nothing once it is lost.
async fn permit_to_start(
    permits: Arc<Semaphore>,
    mut shutdown: watch::Receiver<bool>,
    mut session: watch::Receiver<SessionState>,
    batch: &BatchId,
) -> Start {
    let permit = tokio::select! {
        biased;
        _ = session_lost(&mut session) => return Start::SessionLost,
        _ = stop_requested(&mut shutdown) => return Start::Release(None),
        permit = permits.acquire_owned() => permit.expect("the semaphore is never closed"),
    };
    // The permit may come free because the loss ended another batch's work before this task
    // was told of it: no work starts once the session is lost (the server may already have
    // given this batch's lock away).
    let state = *session.borrow();
    if state == SessionState::Lost {
        drop(permit);
        return Start::SessionLost;
    }
    if state == SessionState::Suspended {
        warn!(batch = %batch, "lock service unreachable: not starting work until it is back");
        let back = tokio::select! {
            back = session_back(&mut session) => back,
            _ = stop_requested(&mut shutdown) => return Start::Release(Some(permit)),
        };
        if !back {
            drop(permit);
            return Start::SessionLost;
        }
    }
    Start::Go(permit)
}

/// Waits out a disconnection: true when the session is connected again, false when lost.
async fn session_back(session: &mut watch::Receiver<SessionState>) -> bool {
    let state = session.wait_for(|state| *state != SessionState::Suspended).await.map(|state| *state);
    state.is_ok_and(|state| state == SessionState::Connected)
}

/// Resolves once the lock service session is lost (or its state can no longer be known).
async fn session_lost(session: &mut watch::Receiver<SessionState>) {
    session.wait_for(|state| *state == SessionState::Lost).await.ok();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// How a batch's start goes with `permits` free, a shutdown requested or not and the
    /// session in `state`, each ready from the first poll (the senders stay alive meanwhile).
    async fn start_with(permits: usize, stop: bool, state: SessionState) -> Start {
        let (_stop, shutdown) = watch::channel(stop);
        let (_state, session) = watch::channel(state);
        permit_to_start(Arc::new(Semaphore::new(permits)), shutdown, session, &BatchId::new("B1").unwrap()).await
    }

    #[tokio::test]
    async fn no_work_starts_once_the_session_is_lost_even_with_a_permit_free() {
        // Both ready at once, as when the loss ends another batch's work and frees its
        // permit: the select may pick either, so ask many times.
        for _ in 0..64 {
            let start = start_with(1, false, SessionState::Lost).await;
            assert!(matches!(start, Start::SessionLost), "work would start after the session was lost");
        }
    }

    #[tokio::test]
    async fn a_shutdown_that_comes_with_the_loss_gives_the_batch_up_rather_than_releasing_it() {
        for _ in 0..64 {
            let start = start_with(0, true, SessionState::Lost).await;
            assert!(matches!(start, Start::SessionLost), "released on a lost session");
        }
    }

    #[tokio::test]
    async fn work_starts_with_a_permit_while_the_session_is_connected() {
        assert!(matches!(start_with(1, false, SessionState::Connected).await, Start::Go(_)));
    }
}
