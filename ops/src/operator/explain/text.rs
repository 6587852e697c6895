//! `explain`'s text: the verdict and its causes, the clauses in the store and the index,
//! the retry window, the result and attempts, the open run, the locks and the index's lag.
//! Apart from the explanation itself because it is the longest part and only words.

use std::fmt::Write as _;

use autocomp_model::{ComponentState, Outcome, Timestamp};

use super::super::columns::table;
use super::super::locks::describe_lock;
use super::super::views::{age, describe_run};
use super::{ClauseCheck, Explanation, RetryWindow};

/// The table of clauses: each as written, whether it holds in the store and in the index.
fn clause_rows(checks: &[ClauseCheck]) -> Vec<Vec<String>> {
    let mark = |holds: bool| if holds { "pass" } else { "FAIL" };
    checks
        .iter()
        .map(|c| vec![format!("  {}", c.clause), mark(c.store).into(), c.index.map_or("absent", mark).into()])
        .collect()
}

impl Explanation {
    pub(super) fn to_text(&self) -> String {
        let mut out = self.clauses_text();
        if let Some(retry) = &self.retry {
            out.push_str(&self.retry_text(retry));
        }
        writeln!(out).ok();
        out.push_str(&self.result_text());
        out.push_str(&self.holders_text());
        out
    }

    /// The verdict, what holds the batch up, and the clauses.
    fn clauses_text(&self) -> String {
        let mut out = String::new();
        // Ready by the batch's own facts, yet no pass starts: the header says both.
        let refused = match self.contract_broken {
            Some(_) if self.state == ComponentState::Ready && !self.manual => ", but refused (contract broken)",
            _ => "",
        };
        writeln!(out, "{} for {} (records {}): {}{refused}", self.batch, self.component, self.event_type, self.state)
            .ok();
        let verdict = self.verdict();
        writeln!(out, "{verdict}").ok();
        if let Some(broken) = self.contract_broken.as_ref().filter(|_| !verdict.starts_with("refused")) {
            writeln!(out, "and once it is ready, no pass of {} starts: {broken}", self.component).ok();
        }
        for (depth, cause) in self.held_up_by.iter().enumerate() {
            writeln!(out, "{:width$}because {cause}", "", width = 2 * (depth + 1)).ok();
        }
        if let Some(next) = self.next_command() {
            writeln!(out, "next: {next}").ok();
        }
        writeln!(out, "evaluated at {} (store clock)\n", self.as_of).ok();
        if self.clauses.is_empty() {
            writeln!(out, "  (the trigger has no clauses: every batch is ready)").ok();
        } else {
            out.push_str(&table(&["  clause", "store", "index"], &clause_rows(&self.clauses)));
        }
        let index = match self.ready_in_index {
            Some(true) => "ready",
            Some(false) => "not ready",
            None => "no document for this batch (run `autocomp reindex` if the store has it)",
        };
        let store = if self.ready_in_store { "ready" } else { "not ready" };
        writeln!(out, "  => store: {store}; index: {index}").ok();
        out
    }

    /// The retry of a transient failure: its backoff, its window and its clauses.
    fn retry_text(&self, retry: &RetryWindow) -> String {
        let now = self.as_of;
        let window = if retry.opens_at <= now {
            format!("open since {}", retry.opens_at)
        } else {
            format!("opens at {} (in {})", retry.opens_at, age(retry.opens_at.since(now)))
        };
        let mut out = format!(
            "\nretry of the transient failure seq {} at {}: retry_backoff {}, window {window}\n",
            retry.failure.seq,
            retry.failure.at,
            humantime::format_duration(retry.backoff)
        );
        out.push_str(&table(&["  retry clause", "store", "index"], &clause_rows(&retry.clauses)));
        out
    }

    /// The component's own result and the attempts used.
    fn result_text(&self) -> String {
        let mut out = String::new();
        match &self.result {
            Some(e) => {
                let stale = if self.state == ComponentState::Stale {
                    " (stale: the batch's content changed after it was worked out; it counts for nothing)"
                } else {
                    ""
                };
                let (kind, outcome) = (&e.event_type, e.outcome.as_str());
                writeln!(out, "result: {kind} {outcome} seq {} by {} at {}{stale}", e.seq, e.agent, e.at)
            }
            None => writeln!(out, "result: none"),
        }
        .ok();
        match &self.result {
            Some(e) if e.outcome == Outcome::Failure && !e.is_transient_failure() => writeln!(
                out,
                "attempts: the last one failed permanently (seq {}); it is not retried until an operator reruns it",
                e.seq
            ),
            _ => {
                let attempts_note = if self.failed_attempts >= self.max_attempts {
                    " (the next claim gives up: it records a plain failure without working)"
                } else {
                    ""
                };
                writeln!(
                    out,
                    "retries used since the last reset: {} of max_attempts {} (abandoned runs and transient failures \
                     count){attempts_note}",
                    self.failed_attempts, self.max_attempts
                )
            }
        }
        .ok();
        out
    }

    /// The open run, the batch's and the poll's locks, and how far the index is behind.
    fn holders_text(&self) -> String {
        let mut out = String::new();
        let run = self.open_run.as_ref().map_or("none".into(), |run| describe_run(run, self.as_of));
        writeln!(out, "open run: {run}").ok();
        let now = Timestamp::now();
        let batch_lock = describe_lock(self.batch_lock.as_ref(), now);
        writeln!(out, "batch lock batch/{}/{}: {batch_lock}", self.component, self.batch).ok();
        writeln!(out, "poll lock poll/{}: {}", self.component, describe_lock(self.poll_lock.as_ref(), now)).ok();
        let lag = self.store_head.0.saturating_sub(self.index_cursor.0);
        writeln!(
            out,
            "index: committed up to seq {}, store head seq {} (behind by {lag})",
            self.index_cursor, self.store_head
        )
        .ok();
        out
    }
}
