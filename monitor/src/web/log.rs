//! A page of a batch's log as its page shows it: oldest first, the effective events marked,
//! each event's result and full report (an event too large to show linked whole instead),
//! with links to the older and the newest events.

use autocomp_model::{Event, RESULT_KEY, Seq};
use autocomp_ops::operator::{report_summary, size_text};
use autocomp_store::{BatchHead, LogPage};

use super::html::{esc, json_block, time, w};
use crate::filter::encode;

/// Links to the pages of the log around this one, above the page (its events are oldest
/// first): older events (`?before=`), and back to the newest when this is not it.
fn log_pager(head: &BatchHead, log: &LogPage, before: Option<Seq>) -> String {
    if log.older.is_none() && before.is_none() {
        return String::new();
    }
    let path = format!("/batches/{}", encode(head.id().as_str()));
    let mut out = String::from("<nav class=\"pager\" aria-label=\"Pages of the log\"><p>");
    if let Some(older) = log.older {
        w!(out, "<a href=\"{}?before={}#log\" rel=\"prev\">Older events</a> ", esc(&path), esc(older));
    }
    if before.is_some() {
        w!(out, "<a href=\"{}#log\">Newest events</a>", esc(&path));
    }
    out.push_str("</p></nav>\n");
    out
}

/// The log section of a batch's page: the page of its log `log` (before `before`, if given).
pub(super) fn log(head: &BatchHead, log: &LogPage, before: Option<Seq>) -> String {
    let mut out = String::new();
    w!(out, "<h2 id=\"log\">Log</h2>\n");
    if log.total == 0 {
        out.push_str("<p>No events yet: the batch waits for its first one.</p>\n");
        return out;
    }
    let pager = log_pager(head, log, before);
    if log.events.is_empty() {
        w!(out, "<p>No events before seq {} on this page.</p>\n", esc(before.unwrap_or_default()));
        out.push_str(&pager);
        return out;
    }
    let effective: Vec<Seq> = head.summary.effective.iter().map(|e| e.seq).collect();
    let which = if log.events.len() as u64 == log.total {
        format!("{} events, oldest first", log.total)
    } else {
        let (first, last) = (log.events[0].seq, log.events[log.events.len() - 1].seq);
        format!("events seq {first} to {last}, {} of {}, oldest first", log.events.len(), log.total)
    };
    out.push_str(&pager);
    w!(
        out,
        "<div class=\"scroll\" role=\"region\" aria-labelledby=\"log-caption\" tabindex=\"0\">\n\
         <table class=\"grid log\"><caption id=\"log-caption\">Log: {} (append-only; \
         <span class=\"effective-mark\">effective</span> events are what triggers see)</caption>\n\
         <thead><tr><th scope=\"col\">Seq</th><th scope=\"col\">Time</th><th scope=\"col\">Type</th>\
         <th scope=\"col\">Outcome</th><th scope=\"col\">Agent</th><th scope=\"col\">Summary</th>\
         <th scope=\"col\">Report</th></tr></thead><tbody>\n",
        esc(which)
    );
    let path = format!("/batches/{}", encode(head.id().as_str()));
    for e in &log.events {
        out.push_str(&log_row(e, effective.contains(&e.seq), log.left_out(e.seq), &path));
    }
    out.push_str("</tbody></table></div>\n");
    out
}

/// One event of the log: its row, and its result and report (or a link to it whole, when
/// its details were left out of the page: `left_out` bytes).
fn log_row(e: &Event, is_effective: bool, left_out: Option<u64>, path: &str) -> String {
    let mut out = String::new();
    w!(
        out,
        "<tr{}><th scope=\"row\">{}</th><td>{}</td><td><code>{}</code>{}</td><td class=\"outcome-{}\">{}</td>\
         <td>{}</td><td>{}</td><td>",
        if is_effective { " class=\"effective\"" } else { "" },
        esc(e.seq),
        time(e.at),
        esc(&e.event_type),
        if is_effective { " <span class=\"effective-mark\">effective</span>" } else { "" },
        esc(e.outcome.as_str()),
        esc(e.outcome.as_str()),
        esc(&e.agent),
        esc(report_summary(e).join("; "))
    );
    if let Some(bytes) = left_out {
        // Read by size: a page costs its events' heads, not their megabytes of details.
        w!(
            out,
            "<p class=\"left-out\">Its details, {}, are too large to show here: \
             <a href=\"{}/events/{}\" download=\"event-{}.json\">the whole event (JSON)</a>.</p></td></tr>\n",
            esc(size_text(bytes)),
            esc(&path),
            esc(e.seq),
            esc(e.seq)
        );
        return out;
    }
    if let Some(result) = e.details.get(RESULT_KEY) {
        w!(out, "<details id=\"result-{}\" open><summary>Result</summary>{}</details>", esc(e.seq), json_block(result));
    }
    // The run's output has a section of its own (below the log): not twice on the page.
    let mut details = e.details.clone();
    let had_output = details.as_object_mut().and_then(|d| d.remove(autocomp_model::OUTPUT_KEY)).is_some();
    w!(
        out,
        "<details id=\"report-{}\"><summary>Full report</summary>{}{}</details>",
        esc(e.seq),
        json_block(&details),
        if had_output {
            format!("<p>Its output: <a href=\"#output-{}\">under Run output</a>.</p>", esc(e.seq))
        } else {
            String::new()
        }
    );
    out.push_str("</td></tr>\n");
    out
}
