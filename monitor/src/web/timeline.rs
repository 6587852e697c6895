//! The batch page's timeline (`autocomp_ops::operator::Timeline`): a Gantt-like inline SVG,
//! a row per attempt of each step (a bar from its start to its end, coloured by what it came
//! to with the state classes, labelled with words; a thin bar before it for the wait since
//! the step was ready), and the same numbers in a table. Drawn on the server, no script.

use std::time::Duration;

use autocomp_model::Timestamp;
use autocomp_ops::operator::{Attempt, Timeline, duration_text};

use super::html::{esc, time, w};

/// The drawing's width, the label column's and the bars' area (SVG user units).
const WIDTH: f64 = 760.0;
const LABELS: f64 = 150.0;
const CHART: f64 = WIDTH - LABELS - 20.0;
const ROW: f64 = 22.0;
const TOP: f64 = 8.0;

/// A row of the drawing and of the table: a step's attempt, or a step not attempted yet.
struct Row<'t> {
    label: String,
    attempt: Option<&'t Attempt>,
    /// For a step without attempts: since when it is ready, if it is.
    ready_at: Option<Timestamp>,
}

fn rows(timeline: &Timeline) -> Vec<Row<'_>> {
    let mut rows = Vec::new();
    for step in &timeline.steps {
        if step.attempts.is_empty() {
            rows.push(Row { label: step.component.to_string(), attempt: None, ready_at: step.ready_at });
        }
        for (n, attempt) in step.attempts.iter().enumerate() {
            let label = format!("{} #{}", step.component, n + 1);
            rows.push(Row { label, attempt: Some(attempt), ready_at: attempt.ready_at });
        }
    }
    rows
}

/// What a bar says: `#2 success, ran 2.5s`.
fn bar_text(row: &Row<'_>) -> String {
    match row.attempt {
        Some(a) if a.end.is_none() => format!("working for {}", duration_text(a.ran)),
        Some(a) => format!("{}, ran {}", a.outcome_text(), duration_text(a.ran)),
        None if row.ready_at.is_some() => "ready, not attempted yet".to_owned(),
        None => "not attempted".to_owned(),
    }
}

fn plural(n: usize, what: &str) -> String {
    if n == 1 { format!("1 {what}") } else { format!("{n} {what}s") }
}

fn or_dash(duration: Option<Duration>) -> String {
    duration.map_or("–".to_owned(), duration_text)
}

/// The timeline section: heading, summary, drawing, table.
pub fn section(timeline: &Timeline) -> String {
    let mut out = String::from("<h2 id=\"timeline\">Timeline</h2>\n");
    let total = match timeline.total() {
        Some(total) => format!("{} from the first event to the newest step result", duration_text(total)),
        None if timeline.first_at.is_some() => "No step has recorded a result yet".to_owned(),
        None => "No events yet".to_owned(),
    };
    w!(out, "<p class=\"timeline-total\">{}. <small>({})</small></p>\n", esc(total), esc(timeline.basis()));
    let rows = rows(timeline);
    if rows.is_empty() {
        out.push_str("<p>No component has run a pass against this store yet.</p>\n");
        return out;
    }
    out.push_str(&svg(timeline, &rows));
    out.push_str(&table(&rows));
    out
}

/// The time span the drawing covers: the first event (or the earliest time shown) to the
/// newest end (the read time while a run is open).
fn span(timeline: &Timeline, rows: &[Row<'_>]) -> (Timestamp, Timestamp) {
    let starts = rows.iter().flat_map(|r| [r.ready_at, r.attempt.map(|a| a.start)]).flatten();
    let from = starts.chain(timeline.first_at).min().unwrap_or(timeline.as_of);
    let ends = rows.iter().filter_map(|r| r.attempt).map(|a| a.end.unwrap_or(timeline.as_of));
    // A step's ready time counts only while it is not attempted: a retry may be claimed
    // before its backoff is over.
    let pending = rows.iter().filter(|r| r.attempt.is_none()).filter_map(|r| r.ready_at);
    let to = ends.chain(pending).max().unwrap_or(from).max(from);
    (from, to)
}

fn svg(timeline: &Timeline, rows: &[Row<'_>]) -> String {
    let (from, to) = span(timeline, rows);
    let scale = Scale { from, length: (to.0 - from.0).max(1) as f64 };
    let height = TOP + ROW * rows.len() as f64 + 24.0;
    let mut out = String::new();
    let attempts = rows.iter().filter(|r| r.attempt.is_some()).count();
    w!(
        out,
        "<div class=\"scroll\" role=\"region\" aria-labelledby=\"timeline-title\" tabindex=\"0\">\n\
         <svg class=\"timeline-chart\" role=\"img\" \
         aria-labelledby=\"timeline-title\" width=\"{WIDTH}\" height=\"{height}\" viewBox=\"0 0 {WIDTH} {height}\">\n\
         <title id=\"timeline-title\">Timeline: {} of {}, {} to {}</title>\n",
        esc(plural(attempts, "attempt")),
        esc(plural(timeline.steps.len(), "step")),
        esc(from),
        esc(to)
    );
    for (i, row) in rows.iter().enumerate() {
        out.push_str(&row_svg(&scale, timeline.as_of, TOP + ROW * i as f64, row));
    }
    let axis = TOP + ROW * rows.len() as f64 + 4.0;
    w!(
        out,
        "<g class=\"axis\"><line x1=\"{LABELS}\" y1=\"{axis:.1}\" x2=\"{:.1}\" y2=\"{axis:.1}\"/>\
         <text x=\"{LABELS}\" y=\"{:.1}\">0</text><text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">+{}</text></g>\n",
        LABELS + CHART,
        axis + 14.0,
        LABELS + CHART,
        axis + 14.0,
        esc(duration_text(to.since(from)))
    );
    out.push_str("</svg>\n</div>\n");
    out
}

/// Where a time is drawn: `from` at the left of the chart, the span `length` (ms) across it.
struct Scale {
    from: Timestamp,
    length: f64,
}

impl Scale {
    fn x(&self, at: Timestamp) -> f64 {
        LABELS + (at.0 - self.from.0) as f64 / self.length * CHART
    }
}

/// One row of the chart at height `y`: its label, and its attempt's wait and bar (an open
/// one up to `as_of`) with their words beside it; a step not attempted, its words alone.
fn row_svg(scale: &Scale, as_of: Timestamp, y: f64, row: &Row<'_>) -> String {
    let mut out = String::new();
    let middle = y + ROW / 2.0 + 4.0;
    w!(out, "<g class=\"timeline-row\"><text class=\"label\" x=\"4\" y=\"{middle:.1}\">{}</text>", esc(&row.label));
    let text = bar_text(row);
    match row.attempt {
        Some(attempt) => {
            let (start, end) = (scale.x(attempt.start), scale.x(attempt.end.unwrap_or(as_of)));
            if let Some(ready) = attempt.ready_at.filter(|ready| *ready < attempt.start) {
                let from = scale.x(ready);
                w!(
                    out,
                    "<rect class=\"wait\" x=\"{from:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"4\"><title>waited {}\
                     </title></rect>",
                    y + ROW / 2.0 - 2.0,
                    (start - from).max(1.0),
                    esc(or_dash(attempt.waited))
                );
            }
            w!(
                out,
                "<rect class=\"bar state-{}\" x=\"{start:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{:.1}\">\
                 <title>{}: {}</title></rect>",
                esc(attempt.state().as_str()),
                y + 3.0,
                (end - start).max(2.0),
                ROW - 6.0,
                esc(&row.label),
                esc(&text)
            );
            // The label beside the bar, on the side with room.
            let (at, anchor) = if end < LABELS + CHART / 2.0 { (end + 4.0, "start") } else { (start - 4.0, "end") };
            w!(
                out,
                "<text class=\"bar-label\" x=\"{at:.1}\" y=\"{middle:.1}\" text-anchor=\"{anchor}\">{}</text>",
                esc(&text)
            );
        }
        None => {
            let at = row.ready_at.map_or(LABELS, |at| scale.x(at));
            w!(out, "<text class=\"bar-label\" x=\"{at:.1}\" y=\"{middle:.1}\">{}</text>", esc(&text));
        }
    }
    out.push_str("</g>\n");
    out
}

fn table(rows: &[Row<'_>]) -> String {
    let mut out = String::from(
        "<div class=\"scroll\" role=\"region\" aria-labelledby=\"timeline-caption\" tabindex=\"0\">\n\
         <table class=\"grid timeline-table\"><caption id=\"timeline-caption\">Timeline: each step's attempts</caption>\
         <thead><tr><th scope=\"col\">Attempt</th><th scope=\"col\">Ready</th><th scope=\"col\">Started</th>\
         <th scope=\"col\">Ended</th><th scope=\"col\">Waited</th><th scope=\"col\">Ran</th>\
         <th scope=\"col\">Outcome</th></tr></thead><tbody>\n",
    );
    let at = |t: Option<Timestamp>| t.map_or("–".to_owned(), time);
    for row in rows {
        w!(out, "<tr><th scope=\"row\">{}</th><td>{}</td>", esc(&row.label), at(row.ready_at));
        match row.attempt {
            Some(a) => w!(
                out,
                "<td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"outcome-{}\">{}</td>",
                time(a.start),
                a.end.map_or("working".to_owned(), time),
                esc(or_dash(a.waited)),
                esc(duration_text(a.ran)),
                esc(a.outcome.map_or("working", |o| o.as_str())),
                esc(a.outcome_text())
            ),
            None => w!(out, "<td>–</td><td>–</td><td>–</td><td>–</td><td>{}</td>", esc(bar_text(row))),
        }
        out.push_str("</tr>\n");
    }
    out.push_str("</tbody></table></div>\n");
    out
}
