//! What a runner tells the component registry about its passes. A cron pass reports as it
//! goes (started, ended). A watcher coalesces: under a backlog its passes follow each other
//! within milliseconds, so it writes their ends together at most once per `REPORT_EVERY`
//! and before it sleeps, and a pass that found nothing writes nothing until its heartbeat.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use autocomp_model::{MAX_WORK_PER_PASS, PassOutcome, PassPhase, WorkDone};

/// How often a busy watcher writes its passes' ends to the registry.
pub(crate) const REPORT_EVERY: Duration = Duration::from_secs(1);

/// The registry's longest pass summary.
const MAX_SUMMARY_CHARS: usize = 2_000;

#[derive(Default)]
pub(crate) struct Reports {
    coalescing: AtomicBool,
    /// A registry write succeeded in this process: the event type is ours (a clash would
    /// have been refused), so a watcher's later passes need not say they started.
    written: AtomicBool,
    pending: Mutex<Pending>,
}

#[derive(Default)]
struct Pending {
    /// The passes ended and not yet written: how many, the first's start, the worst
    /// outcome and the summary that goes with it, and every result they recorded.
    passes: usize,
    first_started: Option<Instant>,
    outcome: Option<PassOutcome>,
    summary: String,
    work: Vec<WorkDone>,
    last_written: Option<Instant>,
}

/// What to write now.
pub(crate) enum Write {
    Nothing,
    Now(PassPhase),
}

impl Reports {
    /// From now on, pass ends are coalesced (watch mode).
    pub(crate) fn coalesce(&self) {
        self.coalescing.store(true, Ordering::Relaxed);
    }

    /// Whether a pass that claimed work writes `Started` first: always, unless coalescing
    /// and the registry has already accepted this process's reports.
    pub(crate) fn report_start(&self) -> bool {
        !(self.coalescing.load(Ordering::Relaxed) && self.written.load(Ordering::Relaxed))
    }

    /// The registry accepted a write.
    pub(crate) fn written(&self) {
        self.written.store(true, Ordering::Relaxed);
    }

    /// A pass ended (it started at `started`): written at once unless coalescing; else kept,
    /// and written with the others when results are waiting and `REPORT_EVERY` has passed.
    pub(crate) fn ended(&self, phase: PassPhase, started: Instant) -> Write {
        if !self.coalescing.load(Ordering::Relaxed) {
            return Write::Now(phase);
        }
        let PassPhase::Ended { outcome, summary, work, .. } = phase else {
            return Write::Now(phase);
        };
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        pending.passes += 1;
        pending.first_started.get_or_insert(started);
        if pending.outcome.is_none_or(|worst| severity(outcome) >= severity(worst)) {
            pending.outcome = Some(outcome);
            pending.summary = summary;
        }
        pending.work.extend(work);
        let full = pending.work.len() >= MAX_WORK_PER_PASS / 2;
        if !pending.work.is_empty() && (pending.due() || full) { pending.take() } else { Write::Nothing }
    }

    /// What is kept: all of it with `everything` (a heartbeat, shutdown), else only when it
    /// holds recorded results and `REPORT_EVERY` has passed since the last write (a watcher
    /// about to sleep: the monitor should not wait long for them, and a trickle of batches
    /// should not cost a registry commit each, beside the next stage's claim).
    pub(crate) fn flush(&self, everything: bool) -> Write {
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        if pending.passes == 0 || (!everything && (pending.work.is_empty() || !pending.due())) {
            return Write::Nothing;
        }
        pending.take()
    }

    /// How soon results kept now become due (a watcher sleeps no longer); `None` when none
    /// are kept.
    pub(crate) fn results_due_in(&self) -> Option<Duration> {
        let pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        if pending.work.is_empty() {
            return None;
        }
        Some(pending.last_written.map_or(Duration::ZERO, |at| REPORT_EVERY.saturating_sub(at.elapsed())))
    }
}

impl Pending {
    fn due(&self) -> bool {
        self.last_written.is_none_or(|at| at.elapsed() >= REPORT_EVERY)
    }

    fn take(&mut self) -> Write {
        let passes = std::mem::take(&mut self.passes);
        let started = self.first_started.take().unwrap_or_else(Instant::now);
        let outcome = self.outcome.take().unwrap_or(PassOutcome::Idle);
        let summary = std::mem::take(&mut self.summary);
        let summary = match passes {
            0 | 1 => summary,
            n => shortened(format!("{n} passes; the one that counts: {summary}")),
        };
        self.last_written = Some(Instant::now());
        let work = std::mem::take(&mut self.work);
        Write::Now(PassPhase::Ended { outcome, summary, duration_ms: started.elapsed().as_millis() as u64, work })
    }
}

/// Which of several passes' outcomes the registry shows: the worst.
fn severity(outcome: PassOutcome) -> u8 {
    match outcome {
        PassOutcome::Idle => 0,
        PassOutcome::Ok => 1,
        PassOutcome::Failed => 2,
        PassOutcome::Error => 3,
    }
}

fn shortened(line: String) -> String {
    if line.chars().count() <= MAX_SUMMARY_CHARS {
        return line;
    }
    let cut = line.char_indices().nth(MAX_SUMMARY_CHARS - 1).map_or(line.len(), |(at, _)| at);
    format!("{}…", &line[..cut])
}

#[cfg(test)]
mod tests {
    use super::*;
    use autocomp_model::WorkResult;

    fn ended(outcome: PassOutcome, summary: &str, results: usize) -> PassPhase {
        let work = vec![WorkDone { result: WorkResult::Success, duration_ms: 1 }; results];
        PassPhase::Ended { outcome, summary: summary.into(), duration_ms: 1, work }
    }

    #[test]
    fn a_cron_pass_writes_each_end_at_once() {
        let reports = Reports::default();
        assert!(matches!(reports.ended(ended(PassOutcome::Idle, "nothing ready", 0), Instant::now()), Write::Now(_)));
        assert!(reports.report_start());
    }

    #[test]
    fn a_watcher_writes_its_first_end_then_coalesces_until_a_second_has_passed_or_it_flushes() {
        let reports = Reports::default();
        reports.coalesce();
        assert!(reports.report_start(), "until the registry accepted a write");
        reports.written();
        assert!(!reports.report_start());
        let first = reports.ended(ended(PassOutcome::Ok, "2 batches: 2 success", 2), Instant::now());
        assert!(matches!(first, Write::Now(PassPhase::Ended { ref work, .. }) if work.len() == 2));
        assert!(matches!(
            reports.ended(ended(PassOutcome::Failed, "1 batch: 1 failure", 1), Instant::now()),
            Write::Nothing
        ));
        assert!(matches!(
            reports.ended(ended(PassOutcome::Ok, "3 batches: 3 success", 3), Instant::now()),
            Write::Nothing
        ));
        assert!(matches!(reports.ended(ended(PassOutcome::Idle, "nothing ready", 0), Instant::now()), Write::Nothing));
        assert!(matches!(reports.flush(false), Write::Nothing), "the last write was just now");
        assert!(reports.results_due_in().is_some_and(|due| due <= REPORT_EVERY));
        let Write::Now(PassPhase::Ended { outcome, summary, work, .. }) = reports.flush(true) else {
            panic!("results are waiting: written at the heartbeat or exit");
        };
        assert_eq!(outcome, PassOutcome::Failed, "the worst outcome shows");
        assert_eq!(summary, "3 passes; the one that counts: 1 batch: 1 failure");
        assert_eq!(work.len(), 4, "every result is tallied once");
        assert!(matches!(reports.flush(true), Write::Nothing), "nothing left");
    }

    #[test]
    fn idle_passes_wait_for_the_heartbeat() {
        let reports = Reports::default();
        reports.coalesce();
        assert!(matches!(reports.ended(ended(PassOutcome::Idle, "nothing ready", 0), Instant::now()), Write::Nothing));
        assert!(matches!(reports.flush(false), Write::Nothing), "no results: not worth a write");
        assert!(matches!(reports.flush(true), Write::Now(PassPhase::Ended { outcome: PassOutcome::Idle, .. })));
    }
}
