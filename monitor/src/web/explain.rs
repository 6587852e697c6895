//! Why each component is (not) ready for a batch, as its page shows it: the failures first,
//! each component's state, and each explanation with its trigger's clauses in the store and
//! in the index, the retry window, the locks and the index's lag.

use autocomp_model::{ComponentState, Outcome, Timestamp};
use autocomp_ops::operator::{Explanation, describe_lock, report_summary};

use super::html::{age, check, esc, state_badge, time, w};

/// The verdict first: each component whose effective result is a failure, in pipeline
/// order, with its report's summary and a way to the actions; each component at work, with
/// a way to its output so far.
pub(super) fn failures(explanations: &[Explanation]) -> String {
    let mut out = String::new();
    for e in explanations {
        // What a going run printed so far is further down the page.
        let going = if e.open_run.is_some() { "; <a href=\"#output-so-far\">its output so far</a>" } else { "" };
        let Some(failure) = e.result.as_ref().filter(|r| r.outcome == Outcome::Failure) else {
            if let Some(run) = &e.open_run {
                w!(
                    out,
                    "<p class=\"verdict\">{} at <a href=\"#explain-{1}\">{1}</a>: run {2} since {3} (<a \
                     href=\"#output-so-far\">its output so far</a>).</p>\n",
                    state_badge(e.state, false),
                    esc(&e.component),
                    esc(run.generation),
                    time(run.started_at)
                );
            }
            continue;
        };
        let notes = report_summary(failure);
        w!(
            out,
            "<p class=\"verdict\" id=\"failed-{1}\">{0} at <a href=\"#explain-{1}\">{1}</a>: <code>{2}</code> seq {3} \
             by {4} at {5}{6}{7} (<a href=\"#actions\">actions</a>{8}).</p>\n",
            state_badge(e.state, false),
            esc(&e.component),
            esc(&failure.event_type),
            esc(failure.seq),
            esc(&failure.agent),
            time(failure.at),
            if notes.is_empty() { "" } else { ": " },
            esc(notes.join("; ")),
            going
        );
        // The end of what the failed run printed to stderr (or logged): usually the reason.
        out.push_str(&super::output::verdict_tail(failure));
    }
    out
}

pub(super) fn states(explanations: &[Explanation]) -> String {
    if explanations.is_empty() {
        return String::new();
    }
    let mut out = String::from(
        "<div class=\"scroll\" role=\"region\" aria-label=\"Each component's state\" tabindex=\"0\">\
         <table class=\"grid\"><caption>Each component's state</caption><thead><tr>\
         <th scope=\"col\">Component</th><th scope=\"col\">Records</th><th scope=\"col\">State</th>\
         <th scope=\"col\">Verdict</th></tr></thead><tbody>\n",
    );
    for e in explanations {
        w!(
            out,
            "<tr><th scope=\"row\"><a href=\"#explain-{}\">{}</a></th><td><code>{}</code></td><td>{}</td><td>{}</td></tr>\n",
            esc(&e.component),
            esc(&e.component),
            esc(&e.event_type),
            state_badge(e.state, false),
            esc(verdict(e))
        );
    }
    out.push_str("</tbody></table></div>\n");
    out
}

/// `checks`: each clause as written, whether it holds in the store and in the index.
fn clause_table<'c>(
    caption: &str,
    checks: impl ExactSizeIterator<Item = (&'c str, bool, Option<bool>)>,
    store: bool,
    index: Option<bool>,
) -> String {
    let mut out = String::new();
    if checks.len() == 0 {
        out.push_str("<p>The trigger has no clauses: every batch is ready.</p>\n");
        return out;
    }
    w!(
        out,
        "<div class=\"scroll\" role=\"region\" aria-label=\"{0}\" tabindex=\"0\">\
         <table class=\"grid clauses\"><caption>{0}</caption><thead><tr><th scope=\"col\">Clause</th>\
         <th scope=\"col\">Store</th><th scope=\"col\">Index</th></tr></thead><tbody>\n",
        esc(caption)
    );
    for (clause, holds_in_store, holds_in_index) in checks {
        w!(
            out,
            "<tr><th scope=\"row\"><code>{}</code></th><td>{}</td><td>{}</td></tr>\n",
            esc(clause),
            check(Some(holds_in_store)),
            check(holds_in_index)
        );
    }
    w!(
        out,
        "</tbody><tfoot><tr><th scope=\"row\">All clauses</th><td>{}</td><td>{}</td></tr></tfoot></table></div>\n",
        check(Some(store)),
        check(index)
    );
    out
}

/// The explanation's verdict; at a human step the batch is ready for, what that means.
fn verdict(e: &Explanation) -> String {
    if e.state == ComponentState::Person {
        return format!("waiting for a person: every clause holds; approve or reject it at {} (above)", e.component);
    }
    e.verdict()
}

pub(super) fn explain(e: &Explanation) -> String {
    let mut out = String::new();
    w!(
        out,
        "<section class=\"explain\" aria-labelledby=\"explain-{0}\"><h3 id=\"explain-{0}\">{0} <small>records \
         <code>{1}</code></small> {2}</h3>\n<p class=\"verdict\">{3}</p>\n",
        esc(&e.component),
        esc(&e.event_type),
        state_badge(e.state, false),
        esc(verdict(e))
    );
    if let Some(refusal) = &e.refusal {
        w!(out, "<p>Not ready because of <code>{}</code>: {}</p>\n", esc(refusal.clause), esc(&refusal.reason));
    }
    if !e.held_up_by.is_empty() {
        // Back along the requires chain to what holds the batch up, nearest first.
        out.push_str("<ol class=\"held-up-by\" aria-label=\"Held up by\">\n");
        for cause in &e.held_up_by {
            w!(out, "<li>because {}</li>\n", esc(cause));
        }
        out.push_str("</ol>\n");
    }
    out.push_str(&clause_table(
        &format!("Trigger clauses of {} on {}, evaluated at {}", e.component, e.batch, e.as_of),
        e.clauses.iter().map(|c| (c.clause.as_str(), c.store, c.index)),
        e.ready_in_store,
        e.ready_in_index,
    ));
    if e.ready_in_index.is_none() {
        out.push_str(
            "<p>The index has no document for this batch (<code>autocomp reindex</code> if the store has it).</p>\n",
        );
    }
    out.push_str(&retry_window(e));
    out.push_str(&facts(e));
    out
}

/// The retry of a transient failure, if one is waited for: its window, and the retry
/// trigger's clauses.
fn retry_window(e: &Explanation) -> String {
    let mut out = String::new();
    let Some(retry) = &e.retry else { return out };
    let window = if retry.opens_at <= e.as_of {
        format!("open since {}", retry.opens_at)
    } else {
        format!("opens at {} (in {})", retry.opens_at, age(retry.opens_at.since(e.as_of)))
    };
    w!(
        out,
        "<p>Retry of the transient failure seq {} at {}: retry_backoff {}, window {}.</p>\n",
        esc(retry.failure.seq),
        time(retry.failure.at),
        esc(humantime::format_duration(retry.backoff)),
        esc(window)
    );
    out.push_str(&clause_table(
        &format!("Retry clauses of {}", e.component),
        retry.clauses.iter().map(|c| (c.clause.as_str(), c.store, c.index)),
        retry.ready_in_store,
        retry.ready_in_index,
    ));
    out
}

/// The explanation's facts: the effective result, attempts, the open run, the locks and the
/// index's lag; the end of its section.
fn facts(e: &Explanation) -> String {
    let mut out = String::new();
    let result = match &e.result {
        Some(r) => format!("{} {} seq {} by {} at {}", r.event_type, r.outcome.as_str(), r.seq, r.agent, r.at),
        None => "none".into(),
    };
    let run = match &e.open_run {
        Some(run) => format!(
            "generation {} held by {} on {} pid {} since {}",
            run.generation, run.holder.agent, run.holder.host, run.holder.pid, run.started_at
        ),
        None => "none".into(),
    };
    let now = Timestamp::now();
    let lag = e.store_head.0.saturating_sub(e.index_cursor.0);
    w!(
        out,
        "<dl class=\"facts\"><dt>Result</dt><dd>{}</dd>\
         <dt>Failed attempts since the last reset</dt><dd>{} of max_attempts {}</dd>\
         <dt>Open run</dt><dd>{}</dd>\
         <dt>Batch lock <code>batch/{}/{}</code></dt><dd>{}</dd>\
         <dt>Poll lock <code>poll/{}</code></dt><dd>{}</dd>\
         <dt>Index</dt><dd>committed up to seq {}, store head seq {} (behind by {})</dd></dl>\n</section>\n",
        esc(result),
        esc(e.failed_attempts),
        esc(e.max_attempts),
        esc(run),
        esc(&e.component),
        esc(&e.batch),
        esc(describe_lock(e.batch_lock.as_ref(), now)),
        esc(&e.component),
        esc(describe_lock(e.poll_lock.as_ref(), now)),
        esc(e.index_cursor),
        esc(e.store_head),
        esc(lag)
    );
    out
}
