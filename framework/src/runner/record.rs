//! How a claimed batch ends: its result recorded (fenced by the claim, still holding its
//! lock; a result the store refuses recorded smaller or as a failure saying so), the circuit
//! breaker told; or its claim released without a result (shutdown, lost lock session).
//! Both the work and the claim phase (a give-up) end here.

use std::io::Write as _;

use autocomp_model::{
    Batch, BatchId, EventType, HoldKind, IdempotencyKey, NewEvent, Outcome, Report, RunOutput, RunState,
    SteeringChange, SteeringRequest, WorkDone, WorkResult,
};
use autocomp_store::{Claim, StoreError};
use autocomp_toolkit::telemetry;
use tracing::{Instrument, Span, debug, error, info, warn};

use super::pass::{Claimed, record_outcome, release_locks};
use super::phases::{self, Phase};
use super::{BatchResult, Runner};
use crate::component::{Component, WorkError};
use crate::config::ComponentConfig;
use crate::locks::{Lock, SessionState};

impl<C: Component> Runner<C> {
    /// Records the result, fenced by the claim, after checking we still hold the lock; then
    /// releases the lock and the pool slots, and tells the circuit breaker (if the component
    /// has one) of a permanent failure, or of a success while it was counting.
    pub(super) async fn record(&self, claimed: Claimed, mut report: Report, timed_out: bool) -> BatchResult {
        // A result that does not fit the schema this step publishes is not recorded.
        self.result_checks.check_published(&mut report);
        let Claimed { batch, claim, lock, slots, breaker_counting, span, .. } = claimed;
        let id = batch.id.clone();
        if !self.still_holds(lock.as_ref()).await {
            error!(batch = %id, "lost the batch lock before recording; nothing recorded");
            // Fenced if someone took the batch over meanwhile; otherwise it is ready again.
            self.pipeline.store.release(&id, &self.name, claim.generation()).await.ok();
            release_locks(self.pipeline.locks.as_ref(), Claimed::locks(lock, slots)).await;
            record_outcome(&span, "not_recorded", true);
            return BatchResult::NotRecorded { id };
        }
        let (appended, report) = self.append_result(&batch, &claim, report, &span).await;
        let result = match appended {
            Ok(()) => self.recorded(&id, claim.generation(), &report, timed_out),
            Err(e) if e.is_fenced() => self.fenced(id, claim.generation(), e, report.output.clone()).await,
            Err(e) => not_recorded(id, e),
        };
        phases::mark(Phase::Append);
        release_locks(self.pipeline.locks.as_ref(), Claimed::locks(lock, slots)).await;
        phases::mark(Phase::Release);
        record_result_outcome(&span, &result);
        if let BatchResult::Recorded { id, outcome, .. } = &result {
            let failed = *outcome == Outcome::Failure && !report.transient;
            if failed || (breaker_counting && *outcome == Outcome::Success) {
                self.tell_breaker(id, failed, &report).await;
            }
        }
        result
    }

    /// Whether the batch lock is still ours, the session connected: while disconnected, the
    /// commit waits (the session may come back, or be lost).
    async fn still_holds(&self, lock: &dyn Lock) -> bool {
        let mut session = self.pipeline.locks.session();
        let state = match session.wait_for(|s| *s != SessionState::Suspended).await {
            Ok(state) => *state,
            Err(_) => SessionState::Lost,
        };
        state == SessionState::Connected && lock.still_held().await.unwrap_or(false)
    }

    /// The result's event for `report`: its run and idempotency key are the claim's.
    fn event_of(&self, batch: &Batch, claim: &Claim, report: &Report) -> NewEvent {
        let key = IdempotencyKey::new(format!("{}.{}.{}", self.name, batch.id, claim.generation()))
            .expect("names and numbers make a valid key");
        let mut details = report.to_details();
        if self.component.reads_content() {
            // The content this result was worked out from: once the batch's content
            // changes after it, the result is stale and the step is done again.
            details[autocomp_model::CONTENT_SEQ_KEY] = serde_json::json!(batch.modified_seq.0);
        }
        NewEvent::new(self.event_type.clone(), report.outcome, self.identity.agent.clone())
            .with_details(details)
            .in_run(self.name.clone(), claim.generation())
            .with_idempotency_key(key)
    }

    /// Appends the result (in its `append` span); one the store refuses is recorded smaller
    /// (without its output), else as a failure saying so. Returns the report recorded.
    async fn append_result(
        &self,
        batch: &Batch,
        claim: &Claim,
        report: Report,
        span: &Span,
    ) -> (Result<(), StoreError>, Report) {
        let id = &batch.id;
        let mut report = within_document_limit(report);
        // The result's store calls (one, or a smaller result after a refusal).
        let append_span = match telemetry::enabled() {
            true => tracing::info_span!(target: telemetry::TARGET, parent: span, "append",
                autocomp.event_type = %self.event_type),
            false => Span::none(),
        };
        let append = |report: &Report| {
            let event = self.event_of(batch, claim, report);
            // The takers' components its batch is then ready for: their runs open in the append.
            let hand_on = self.hand_ons(batch, claim, &event);
            let store = &self.pipeline.store;
            async move {
                if hand_on.is_empty() {
                    return store.append_event(id, event).await;
                }
                let handed = store.append_handing_on(id, event, &hand_on).await?;
                for run in &handed.runs {
                    debug!(batch = %id, to = %run.component, holder = %run.holder.agent, "handed on");
                }
                Ok(handed.event)
            }
            .instrument(append_span.clone())
        };
        let mut appended = append(&report).await;
        if let (Err(StoreError::Invalid(refusal)), Some(_)) = (&appended, &report.output) {
            // The output is what the result can best do without: the same result, smaller.
            warn!(batch = %id, "the store refused the result: {refusal}; recording it without its output");
            report.output = None;
            report.summary = with_note(&report.summary, "output dropped: the batch is at its size cap");
            appended = append(&report).await;
        }
        if let Err(StoreError::Invalid(refusal)) = &appended {
            // The store refused the result itself (the batch is at its size cap, say): record
            // that in a few bytes, so the batch waits for a person instead of being worked
            // on again at every pass. The first append wrote nothing, so its key is free.
            warn!(batch = %id, "the store refused the result: {refusal}; recording that instead");
            let mut refused = failed_report(&self.config, &format!("the store refused the result: {refusal}"));
            refused.duration_ms = report.duration_ms;
            report = refused;
            appended = append(&report).await;
        }
        (appended.map(|_| ()), report)
    }

    /// A recorded result: its line on stdout, its log line, what the registry tallies of it.
    fn recorded(&self, id: &BatchId, generation: i64, report: &Report, timed_out: bool) -> BatchResult {
        let line = summary_line(id, &self.event_type, report);
        // Best effort: the result is recorded, and a closed stdout (`| head`) must not turn
        // the pass into a panic.
        if let Err(e) = writeln!(std::io::stdout().lock(), "{}", crate::for_terminal(&line)) {
            debug!(batch = %id, "cannot print the result line: {e}");
        }
        info!(
            batch = %id,
            component = %self.name,
            generation,
            outcome = report.outcome.as_str(),
            duration_ms = report.duration_ms,
            timed_out,
            "recorded {}",
            self.event_type
        );
        let result = match report.outcome {
            Outcome::Success => WorkResult::Success,
            Outcome::Failure if report.transient => WorkResult::Transient,
            Outcome::Failure => WorkResult::Failure,
        };
        let work = WorkDone { result, duration_ms: report.duration_ms };
        BatchResult::Recorded { id: id.clone(), outcome: report.outcome, timed_out, work }
    }

    /// Counts a permanent failure toward the component's circuit breaker, or resets its count
    /// after a success; says so when the count opens the circuit (the hold stops the next
    /// claims). A breaker that cannot be told is warned about: the result stands.
    async fn tell_breaker(&self, id: &BatchId, failed: bool, report: &Report) {
        let Some(break_after) = self.descriptor.break_after else { return };
        let notes = report_notes(report);
        let summary = if notes.is_empty() { report.outcome.as_str().to_owned() } else { notes.join("; ") };
        let request = SteeringRequest {
            change: SteeringChange::Outcome {
                component: self.name.clone(),
                batch: id.clone(),
                failed,
                break_after,
                summary,
            },
            by: self.identity.agent.clone(),
            reason: "circuit breaker".into(),
            expect_version: None,
        };
        match self.pipeline.store.steer(request).await {
            Ok(steered) if steered.circuit_opened => {
                let reason = steered.steering.components.get(&self.name).map_or("", |hold| hold.reason.as_str());
                let running = self.breaker.open();
                warn!(
                    component = %self.name,
                    "circuit breaker opened, {} claims no new work until `autocomp resume {}`: {reason}; \
                     {running} other batch(es) of this pass in flight (their results are recorded), the claimed \
                     ones not started are handed back unworked",
                    self.name,
                    self.name
                );
            }
            Ok(steered) => {
                // Opened by another result (of this pass or another host's): start nothing more.
                let open = steered.steering.components.get(&self.name).is_some_and(|h| h.kind == HoldKind::Circuit);
                if open && !self.breaker.is_open() {
                    self.breaker.open();
                }
                debug!(batch = %id, failed, "told the circuit breaker");
            }
            Err(e) => warn!(batch = %id, failed, "cannot tell the circuit breaker of this result: {e}"),
        }
    }

    /// Graceful shutdown: close the run without an event so the batch is ready again.
    pub(super) async fn release(&self, claimed: Claimed) -> BatchResult {
        let id = claimed.batch.id.clone();
        if let Err(e) = self.pipeline.store.release(&id, &self.name, claimed.claim.generation()).await {
            warn!(batch = %id, "cannot release the claim: {e}");
        }
        release_locks(self.pipeline.locks.as_ref(), Claimed::locks(claimed.lock, claimed.slots)).await;
        record_outcome(&claimed.span, "released", false);
        BatchResult::Released { id }
    }

    /// Hands claims back untouched (a pass that fails before its work): ready again, not
    /// left open to be counted as an abandoned attempt. All at once: each release may retry
    /// for the store's whole retry window, and a pass must not take N times it.
    pub(super) async fn hand_back(&self, claimed: Vec<Claimed>) {
        futures_util::future::join_all(claimed.into_iter().map(|batch| self.release(batch))).await;
    }

    /// The lock session is lost: record nothing, hand the claim back (refused as fenced if
    /// another worker took the batch over meanwhile); the pass ends with exit 4.
    pub(super) async fn give_up_after_session_loss(&self, claimed: Claimed) -> BatchResult {
        let id = claimed.batch.id.clone();
        match self.pipeline.store.release(&id, &self.name, claimed.claim.generation()).await {
            Ok(()) => {}
            Err(e) if e.is_fenced() => debug!(batch = %id, "claim already taken over: {e}"),
            Err(e) => warn!(batch = %id, "cannot release the claim: {e}"),
        }
        release_locks(self.pipeline.locks.as_ref(), Claimed::locks(claimed.lock, claimed.slots)).await;
        record_outcome(&claimed.span, "not_recorded", true);
        BatchResult::NotRecorded { id }
    }
}

impl<C: Component> Runner<C> {
    /// A result the store refused as fenced: the run is no longer the open, current one.
    /// Says why by the run's state in the store: an operator's cancel (which recorded the
    /// run's cancelled failure itself; what the work printed, `output`, is saved with the
    /// run), or another worker's takeover.
    async fn fenced(&self, id: BatchId, generation: i64, e: StoreError, output: Option<RunOutput>) -> BatchResult {
        // The store keeps a run's whole output only once an operator cancelled it: a run taken
        // over is refused. Asked first, whatever the newest run is by now.
        let store = self.pipeline.store.as_ref();
        let saved = super::live_output::save_cancelled_output(store, &id, &self.name, generation, output).await;
        let run = self.pipeline.store.run_state(&id, &self.name).await.ok().flatten();
        if saved || run.is_some_and(|run| run.generation == generation && run.state == RunState::Cancelled) {
            warn!(batch = %id, "result not recorded: an operator cancelled this run (its cancelled failure is recorded)");
        } else {
            warn!(batch = %id, "result refused, another worker took the batch over: {e}");
        }
        BatchResult::Fenced { id }
    }
}

/// A result the store did not take: the store unreachable, or not recorded for another
/// reason (fenced: `Runner::fenced`).
fn not_recorded(id: BatchId, e: StoreError) -> BatchResult {
    match e {
        e if e.is_unavailable() => {
            error!(batch = %id, "cannot record the result: {e}");
            BatchResult::StoreUnreachable { id }
        }
        e => {
            error!(batch = %id, "cannot record the result: {e}");
            BatchResult::NotRecorded { id }
        }
    }
}

/// How a batch's result ends its span.
fn record_result_outcome(span: &Span, result: &BatchResult) {
    match result {
        BatchResult::Recorded { outcome, .. } => record_outcome(span, outcome.as_str(), *outcome == Outcome::Failure),
        BatchResult::Fenced { .. } => record_outcome(span, "fenced", true),
        BatchResult::StoreUnreachable { .. } => record_outcome(span, "store_unreachable", true),
        _ => record_outcome(span, "not_recorded", true),
    }
}

/// A report the store would refuse as too large (a huge result or failure details) becomes
/// a failure saying so, with the failures' count kept: refused, it would record nothing.
fn within_document_limit(mut report: Report) -> Report {
    let size_of = |report: &Report| serde_json::to_vec(&report.to_details()).map_or(usize::MAX, |bytes| bytes.len());
    let mut size = size_of(&report);
    if size <= autocomp_model::MAX_DOCUMENT_BYTES {
        return report;
    }
    if report.output.take().is_some() {
        // The output goes first: the result and the failures are what later steps read.
        report.summary = with_note(&report.summary, "output dropped: the report was over the store's limit per event");
        size = size_of(&report);
        if size <= autocomp_model::MAX_DOCUMENT_BYTES {
            return report;
        }
    }
    let mut trimmed = Report::new(report.failures_cap);
    trimmed.outcome = Outcome::Failure;
    trimmed.duration_ms = report.duration_ms;
    trimmed.failures_total = report.failures_total;
    trimmed.summary = format!(
        "the report was {size} bytes, over the store's limit of {} bytes per event; its result and failure \
         list were dropped ({} failures found)",
        autocomp_model::MAX_DOCUMENT_BYTES,
        report.failures_total
    );
    trimmed
}

/// `summary; note`, or the note alone.
fn with_note(summary: &str, note: &str) -> String {
    if summary.is_empty() { note.to_owned() } else { format!("{summary}; {note}") }
}

pub(super) fn failed_report(config: &ComponentConfig, summary: &str) -> Report {
    let mut report = Report::new(config.max_reported_failures);
    report.outcome = Outcome::Failure;
    report.summary = summary.to_owned();
    report
}

/// How `work`'s return shapes the recorded report (`testing::run_work` applies it too).
pub(crate) fn report_of(result: Result<(), WorkError>, mut report: Report) -> Report {
    match result {
        Ok(()) => {}
        Err(error) => {
            report.outcome = Outcome::Failure;
            report.transient = matches!(error, WorkError::Transient(_));
            report.summary =
                if report.summary.is_empty() { error.to_string() } else { format!("{}; {error}", report.summary) };
        }
    }
    report
}

/// One line per processed batch on stdout (what cron mails).
fn summary_line(id: &BatchId, event_type: &EventType, report: &Report) -> String {
    let seconds = report.duration_ms as f64 / 1000.0;
    let mut line = format!("{id} {event_type} {} {seconds:.1}s", report.outcome.as_str());
    let notes = report_notes(report);
    if !notes.is_empty() {
        line.push_str(": ");
        line.push_str(&notes.join("; "));
    }
    line
}

/// What the summary line says of a report after its outcome: transient, its summary, its
/// first failure (also what a circuit breaker keeps of a failure).
fn report_notes(report: &Report) -> Vec<String> {
    let mut notes = Vec::new();
    if report.transient {
        notes.push("transient, will retry".to_owned());
    }
    if !report.summary.is_empty() {
        notes.push(report.summary.clone());
    }
    if report.failures_total > 0 {
        let first = &report.failures[0];
        let reference = if first.reference.is_empty() { "the batch" } else { first.reference.as_str() };
        notes.push(format!("{} failures, first: {reference}: {}", report.failures_total, first.description));
    }
    notes
}

#[cfg(test)]
mod tests {
    use autocomp_model::RunOutput;

    use super::*;

    #[test]
    fn a_report_over_the_document_limit_loses_its_output_before_its_result() {
        let mut report = Report::new(10);
        report.summary = "2 pages".into();
        report.result = Some(serde_json::json!({"pages": 2}));
        let huge = autocomp_model::OutputStream {
            name: "log".into(),
            head: "x".repeat(autocomp_model::MAX_DOCUMENT_BYTES),
            ..Default::default()
        };
        report.output = Some(RunOutput { streams: vec![huge] });
        let kept = within_document_limit(report.clone());
        assert_eq!((kept.outcome, kept.result.clone(), kept.output.clone()), (Outcome::Success, report.result, None));
        assert!(kept.summary.starts_with("2 pages; output dropped"), "{}", kept.summary);
        let small = Report { output: Some(RunOutput::default()), ..Report::new(10) };
        assert_eq!(within_document_limit(small.clone()), small, "within the limit: untouched");
    }

    #[test]
    fn summary_lines_name_the_first_failure() {
        let mut report = Report::new(10);
        report.duration_ms = 1234;
        report.add_failure(autocomp_model::Failure {
            reference: "data/a.tif".into(),
            kind: "checksum".into(),
            description: "md5 mismatch".into(),
            details: serde_json::Value::Null,
        });
        let line = summary_line(&BatchId::new("B1").unwrap(), &EventType::new("Checked").unwrap(), &report);
        assert_eq!(line, "B1 Checked failure 1.2s: 1 failures, first: data/a.tif: md5 mismatch");
    }
}
