//! The `/charts` page: per component, its results stacked by outcome, its p50/p95 work
//! duration and its backlog (ready count) over the last hour (per minute), 24 hours or 30
//! days (per hour), drawn here as inline SVG (no script), each with its numbers in a table.
//! One `work_series` read per view: it grows with components x steps, never with batches.

use std::collections::HashMap;
use std::sync::Arc;

use autocomp_model::{ComponentName, InvalidInput, SeriesStep, Timestamp, WorkResult, WorkTallies};
use autocomp_ops::operator::{OperatorError, duration_text};
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::Response;
use serde::Deserialize;

use super::app::App;
use super::error::WebError;
use super::gate::Caller;
use super::html::{Nav, esc, w};
use super::svg::{self, HEIGHT, LEFT, PLOT_H, PLOT_W, TOP, WIDTH};
use crate::filter::encode;

/// `/charts?component=NAME&range=hour|day|month`; both optional.
#[derive(Debug, Deserialize, Default)]
pub struct ChartQuery {
    component: Option<String>,
    range: Option<String>,
}

/// How far back the charts look, and in which steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Range {
    /// The current minute and the 59 before it.
    Hour,
    /// The current hour and the 23 before it.
    Day,
    /// The current hour and the 719 before it (30 days).
    Month,
}

impl Range {
    const ALL: [Range; 3] = [Range::Hour, Range::Day, Range::Month];

    pub fn parse(text: Option<&str>) -> Result<Self, InvalidInput> {
        match text.unwrap_or_default().trim() {
            "" | "hour" => Ok(Range::Hour),
            "day" => Ok(Range::Day),
            "month" => Ok(Range::Month),
            other => Err(InvalidInput::new("range", other, "expected hour, day or month")),
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Range::Hour => "hour",
            Range::Day => "day",
            Range::Month => "month",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Range::Hour => "Last hour",
            Range::Day => "Last 24 hours",
            Range::Month => "Last 30 days",
        }
    }

    fn span(self) -> &'static str {
        match self {
            Range::Hour => "the last hour",
            Range::Day => "the last 24 hours",
            Range::Month => "the last 30 days",
        }
    }

    pub fn step(self) -> SeriesStep {
        match self {
            Range::Hour => SeriesStep::Minute,
            Range::Day | Range::Month => SeriesStep::Hour,
        }
    }

    pub fn steps(self) -> usize {
        match self {
            Range::Hour => 60,
            Range::Day => 24,
            Range::Month => 720,
        }
    }

    /// The step's name: `minute` or `hour`.
    fn per(self) -> &'static str {
        self.step().as_str()
    }

    /// Where the x axis has a label: every 10 minutes, 3 hours, 5 days (UTC).
    fn tick(self, index: i64, at: Timestamp) -> Option<String> {
        match self {
            Range::Hour => (index % 10 == 0).then(|| svg::clock_text(at)),
            Range::Day => (index % 3 == 0).then(|| svg::clock_text(at)),
            Range::Month => (index % 24 == 0 && (index / 24) % 5 == 0).then(|| svg::day_text(at)),
        }
    }
}

/// One step of a component's chart: its start, what its work came to, its backlog sample.
#[derive(Debug, Clone)]
pub struct Slot {
    pub at: Timestamp,
    pub tallies: WorkTallies,
    pub backlog: Option<u64>,
}

impl Slot {
    fn counts(&self) -> [u64; 3] {
        WorkResult::ALL.map(|r| self.tallies.get(r).results)
    }

    fn total(&self) -> u64 {
        self.counts().iter().sum()
    }

    /// p50 and p95 of every result of the step, in milliseconds.
    fn quantiles(&self) -> Option<(f64, f64)> {
        let all = self.tallies.combined();
        let ms = |q: f64| all.quantile(q).map(|d| d.as_secs_f64() * 1000.0);
        Some((ms(0.5)?, ms(0.95)?))
    }
}

/// One component's steps, oldest first, gaps filled: no results, no backlog sample.
#[derive(Debug, Clone)]
pub struct Series {
    pub component: ComponentName,
    pub slots: Vec<Slot>,
}

/// The `range.steps()` steps ending with the one holding `now` for each of `components`,
/// filled from the sparse `points` (points of other components or steps are left out).
pub fn series(
    range: Range,
    now: Timestamp,
    components: &[ComponentName],
    points: Vec<autocomp_model::WorkPoint>,
) -> Vec<Series> {
    let step = range.step();
    let n = range.steps();
    let first = step.index_of(now) - (n as i64 - 1);
    let empty: Vec<Slot> = (0..n)
        .map(|i| Slot {
            at: Timestamp((first + i as i64) * step.millis()),
            tallies: WorkTallies::default(),
            backlog: None,
        })
        .collect();
    let mut all: Vec<Series> =
        components.iter().map(|c| Series { component: c.clone(), slots: empty.clone() }).collect();
    let position: HashMap<&ComponentName, usize> = components.iter().enumerate().map(|(i, c)| (c, i)).collect();
    for point in points {
        let Some(&c) = position.get(&point.component) else { continue };
        let i = step.index_of(point.at) - first;
        if let Some(slot) = usize::try_from(i).ok().and_then(|i| all[c].slots.get_mut(i)) {
            slot.tallies = point.tallies;
            slot.backlog = point.backlog;
        }
    }
    all
}

/// The first step of the window `range` shows at `now`: what `work_series` is asked from.
pub fn since(range: Range, now: Timestamp) -> Timestamp {
    let step = range.step();
    Timestamp((step.index_of(now) - (range.steps() as i64 - 1)) * step.millis())
}

/// A row of the tables behind the charts: a step, or for 30 days a day (UTC) of them.
struct Row {
    when: String,
    tallies: WorkTallies,
    backlog: Option<u64>,
}

/// A step's start in a table: `2026-11-27T02:53Z` (UTC; plain text, a table has many).
fn minute_time(at: Timestamp) -> String {
    esc(svg::minute_text(at)).to_string()
}

fn rows(range: Range, series: &Series) -> Vec<Row> {
    if range != Range::Month {
        return series
            .slots
            .iter()
            .map(|s| Row { when: minute_time(s.at), tallies: s.tallies.clone(), backlog: s.backlog })
            .collect();
    }
    let mut rows: Vec<(String, Row)> = Vec::new();
    for slot in &series.slots {
        let date = svg::date_text(slot.at);
        if rows.last().is_none_or(|(d, _)| *d != date) {
            let when = esc(&date).to_string();
            rows.push((date, Row { when, tallies: WorkTallies::default(), backlog: None }));
        }
        let row = &mut rows.last_mut().expect("pushed").1;
        for result in WorkResult::ALL {
            row.tallies.get_mut(result).add(slot.tallies.get(result));
        }
        row.backlog = slot.backlog.or(row.backlog);
    }
    rows.into_iter().map(|(_, row)| row).collect()
}

fn plural(n: u64, what: &str) -> String {
    if n == 1 { format!("1 {what}") } else { format!("{n} {what}s") }
}

fn ms_text(ms: f64) -> String {
    duration_text(std::time::Duration::from_secs_f64(ms / 1000.0))
}

/// What the whole window came to, in words.
fn summary(range: Range, series: &Series) -> String {
    let mut all = WorkTallies::default();
    for slot in &series.slots {
        for result in WorkResult::ALL {
            all.get_mut(result).add(slot.tallies.get(result));
        }
    }
    let counts = WorkResult::ALL.map(|r| all.get(r).results);
    let total: u64 = counts.iter().sum();
    let mut out = format!(
        "{} in {}: {} success, {} failure, {} transient",
        plural(total, "result"),
        range.span(),
        counts[0],
        counts[1],
        counts[2]
    );
    let combined = all.combined();
    if let (Some(p50), Some(p95)) = (combined.quantile(0.5), combined.quantile(0.95)) {
        w!(out, "; p50 {}, p95 {}", duration_text(p50), duration_text(p95));
    }
    match series.slots.iter().rev().find_map(|s| s.backlog.map(|b| (b, s.at))) {
        Some((ready, at)) => {
            w!(out, "; backlog {ready} ready (sampled in the {} from {} UTC)", range.per(), svg::minute_text(at))
        }
        None => w!(out, "; no backlog sample in {}", range.span()),
    }
    out.push('.');
    out
}

/// The opening of a chart's SVG: its size, its name and description for assistive
/// technology (the drawing itself is one image), and the y axis.
fn open_svg(out: &mut String, id: &str, title: &str, desc: &str) {
    w!(
        out,
        "<svg class=\"chart-svg\" role=\"img\" aria-labelledby=\"{id}-title {id}-desc\" viewBox=\"0 0 {WIDTH} {HEIGHT}\" \
         preserveAspectRatio=\"xMidYMid meet\">\n<title id=\"{id}-title\">{}</title>\n<desc id=\"{id}-desc\">{}</desc>\n",
        esc(title),
        esc(desc)
    );
}

fn x_ticks(range: Range, series: &Series) -> Vec<(usize, String)> {
    let step = range.step();
    let n = series.slots.len();
    series
        .slots
        .iter()
        .enumerate()
        .filter(|(i, _)| svg::slot_x(*i, n).0 <= WIDTH - 18.0)
        .filter_map(|(i, s)| range.tick(step.index_of(s.at), s.at).map(|label| (i, label)))
        .collect()
}

fn x_axis_name(range: Range) -> String {
    format!("{}s, times UTC", range.per())
}

/// A word in the plot's middle when there is nothing to draw.
fn nothing(out: &mut String, words: &str) {
    w!(
        out,
        "<text class=\"nothing\" x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>\n",
        LEFT + PLOT_W / 2.0,
        TOP + PLOT_H / 2.0,
        esc(words)
    );
}

const RESULT_CLASSES: [&str; 3] = ["bar-success", "bar-failure", "bar-transient"];

/// (a) Results per step, stacked bottom to top: success (solid), failure (striped),
/// transient (solid, lighter).
fn results_svg(id: &str, range: Range, series: &Series) -> String {
    let n = series.slots.len();
    let max = series.slots.iter().map(Slot::total).max().unwrap_or(0);
    let (top, ticks) = svg::count_ticks(max);
    let total: u64 = series.slots.iter().map(Slot::total).sum();
    let busiest = series.slots.iter().max_by_key(|s| s.total()).filter(|s| s.total() > 0);
    let title = format!("Results per {} of {}, {}", range.per(), series.component, range.span());
    let mut desc = format!(
        "Bars stacked bottom to top: success, failure (striped), transient; {} in all",
        plural(total, "result")
    );
    if let Some(slot) = busiest {
        w!(desc, ", most ({}) in the {} from {} UTC", slot.total(), range.per(), svg::minute_text(slot.at));
    }
    desc.push_str(". The table below has every number.");
    let mut out = String::new();
    open_svg(&mut out, id, &title, &desc);
    w!(
        out,
        "<defs><pattern id=\"{id}-stripes\" width=\"5\" height=\"5\" patternUnits=\"userSpaceOnUse\" \
         patternTransform=\"rotate(45)\"><rect class=\"bar-failure\" width=\"5\" height=\"5\"/>\
         <line class=\"stripe\" x1=\"1\" y1=\"0\" x2=\"1\" y2=\"5\"/></pattern></defs>\n"
    );
    let labels: Vec<(f64, String)> =
        ticks.iter().map(|t| (svg::linear_y(*t as f64, top as f64), t.to_string())).collect();
    svg::y_axis(&mut out, &labels, "results");
    // Each outcome's bars as one path (a rectangle per step): a month's 720 steps stay small.
    // With few steps, each step's bars are a group with its numbers as a tooltip.
    let mut paths = [String::new(), String::new(), String::new()];
    out.push_str("<g class=\"bars\">");
    for (i, slot) in series.slots.iter().enumerate() {
        let counts = slot.counts();
        if counts.iter().all(|c| *c == 0) {
            continue;
        }
        let (x, width) = svg::slot_x(i, n);
        // Many steps: bars as wide as their step, but never thinner than a visible line.
        let (x, width) = if n > 100 { (x, width.max(1.5)) } else { (x + width * 0.1, width * 0.8) };
        if n <= 60 {
            w!(
                out,
                "<g><title>{} UTC: {} success, {} failure, {} transient</title>",
                esc(svg::minute_text(slot.at)),
                counts[0],
                counts[1],
                counts[2]
            );
        }
        let mut below = 0u64;
        for (k, count) in counts.iter().enumerate().filter(|(_, c)| **c > 0) {
            let (y_top, y_bottom) =
                (svg::linear_y((below + count) as f64, top as f64), svg::linear_y(below as f64, top as f64));
            let height = (y_bottom - y_top).max(0.5);
            if n <= 60 {
                let fill = if k == 1 { format!(" fill=\"url(#{id}-stripes)\"") } else { String::new() };
                w!(
                    out,
                    "<rect class=\"{}\"{fill} x=\"{x:.1}\" y=\"{y_top:.1}\" width=\"{width:.1}\" height=\"{height:.1}\"/>",
                    if k == 1 { "bar-striped" } else { RESULT_CLASSES[k] },
                );
            } else {
                w!(paths[k], "M{x:.1},{y_top:.1}h{width:.1}v{height:.1}h-{width:.1}z");
            }
            below += count;
        }
        if n <= 60 {
            out.push_str("</g>");
        }
    }
    for (k, d) in paths.iter().enumerate().filter(|(_, d)| !d.is_empty()) {
        let fill = if k == 1 { format!(" fill=\"url(#{id}-stripes)\"") } else { String::new() };
        w!(out, "<path class=\"{}\"{fill} d=\"{d}\"/>", if k == 1 { "bar-striped" } else { RESULT_CLASSES[k] });
    }
    out.push_str("</g>\n");
    if total == 0 {
        nothing(&mut out, &format!("no results in {}", range.span()));
    }
    svg::x_axis(&mut out, n, &x_ticks(range, series), &x_axis_name(range));
    out.push_str("</svg>\n");
    out
}

/// (b) p50 (solid, round points) and p95 (dashed, square points) of every result per step,
/// on a log scale of durations; no line where a step has no result.
fn durations_svg(id: &str, range: Range, series: &Series) -> String {
    let n = series.slots.len();
    let quantiles: Vec<Option<(f64, f64)>> = series.slots.iter().map(Slot::quantiles).collect();
    let least = quantiles.iter().flatten().map(|q| q.0).fold(f64::INFINITY, f64::min);
    let most = quantiles.iter().flatten().map(|q| q.1).fold(0.0, f64::max);
    let scale =
        if least.is_finite() { svg::LogScale::covering(least, most) } else { svg::LogScale::covering(1.0, 1_000.0) };
    let title = format!("p50 and p95 work duration per {} of {}, {}", range.per(), series.component, range.span());
    let mut desc = String::from("Solid line: p50 (half the results took less); dashed line: p95; log scale");
    match quantiles.iter().enumerate().filter_map(|(i, q)| q.map(|q| (i, q))).max_by(|a, b| a.1.1.total_cmp(&b.1.1)) {
        Some((i, (_, p95))) => w!(
            desc,
            "; the longest p95 {} in the {} from {} UTC",
            ms_text(p95),
            range.per(),
            svg::minute_text(series.slots[i].at)
        ),
        None => w!(desc, "; no results in {}", range.span()),
    }
    desc.push_str(". The table below has every number.");
    let mut out = String::new();
    open_svg(&mut out, id, &title, &desc);
    let labels: Vec<(f64, String)> = scale.ticks.iter().map(|t| (scale.y(*t), svg::duration_label(*t))).collect();
    svg::y_axis(&mut out, &labels, "duration");
    for (k, class) in [(0usize, "p50"), (1, "p95")] {
        let points: Vec<Option<(f64, f64)>> = quantiles
            .iter()
            .enumerate()
            .map(|(i, q)| q.map(|q| (svg::slot_mid(i, n), scale.y(if k == 0 { q.0 } else { q.1 }))))
            .collect();
        w!(out, "<path class=\"line {class}\" d=\"{}\"/>\n", svg::line_path(&points));
        out.push_str("<g class=\"points\">");
        for (x, y) in marked(&points, n) {
            if k == 0 {
                w!(out, "<circle class=\"dot {class}\" cx=\"{x:.1}\" cy=\"{y:.1}\" r=\"2.5\"/>");
            } else {
                w!(
                    out,
                    "<rect class=\"dot {class}\" x=\"{:.1}\" y=\"{:.1}\" width=\"5\" height=\"5\"/>",
                    x - 2.5,
                    y - 2.5
                );
            }
        }
        out.push_str("</g>\n");
    }
    if quantiles.iter().all(Option::is_none) {
        nothing(&mut out, &format!("no results in {}", range.span()));
    }
    svg::x_axis(&mut out, n, &x_ticks(range, series), &x_axis_name(range));
    out.push_str("</svg>\n");
    out
}

/// The points a line's marks go on: every one when there are few steps, else those the
/// line alone would not show (no neighbour on either side).
fn marked(points: &[Option<(f64, f64)>], n: usize) -> Vec<(f64, f64)> {
    if n <= 60 { points.iter().flatten().copied().collect() } else { svg::lone(points) }
}

/// (c) The backlog (ready count) as sampled in each step; no line where there is no sample.
fn backlog_svg(id: &str, range: Range, series: &Series) -> String {
    let n = series.slots.len();
    let max = series.slots.iter().filter_map(|s| s.backlog).max().unwrap_or(0);
    let (top, ticks) = svg::count_ticks(max);
    let sampled = series.slots.iter().filter(|s| s.backlog.is_some()).count();
    let title = format!("Backlog (batches ready) per {} of {}, {}", range.per(), series.component, range.span());
    let mut desc = format!("Ready count as last sampled in each {}; {sampled} of {n} have a sample", range.per());
    if let Some(slot) = series.slots.iter().rev().find(|s| s.backlog.is_some()) {
        w!(desc, "; the newest {} ({} UTC), the most {max}", slot.backlog.unwrap_or(0), svg::minute_text(slot.at));
    }
    desc.push_str(". The table below has every number.");
    let mut out = String::new();
    open_svg(&mut out, id, &title, &desc);
    let labels: Vec<(f64, String)> =
        ticks.iter().map(|t| (svg::linear_y(*t as f64, top as f64), t.to_string())).collect();
    svg::y_axis(&mut out, &labels, "ready");
    let points: Vec<Option<(f64, f64)>> = series
        .slots
        .iter()
        .enumerate()
        .map(|(i, s)| s.backlog.map(|b| (svg::slot_mid(i, n), svg::linear_y(b as f64, top as f64))))
        .collect();
    w!(out, "<path class=\"line backlog\" d=\"{}\"/>\n", svg::line_path(&points));
    out.push_str("<g class=\"points\">");
    for (x, y) in marked(&points, n) {
        w!(out, "<circle class=\"dot backlog\" cx=\"{x:.1}\" cy=\"{y:.1}\" r=\"2.5\"/>");
    }
    out.push_str("</g>\n");
    if sampled == 0 {
        nothing(&mut out, &format!("no backlog sample in {}", range.span()));
    }
    svg::x_axis(&mut out, n, &x_ticks(range, series), &x_axis_name(range));
    out.push_str("</svg>\n");
    out
}

/// Which chart: its heading, its id's suffix.
#[derive(Clone, Copy)]
enum Kind {
    Results,
    Durations,
    Backlog,
}

impl Kind {
    const ALL: [Kind; 3] = [Kind::Results, Kind::Durations, Kind::Backlog];

    fn suffix(self) -> &'static str {
        match self {
            Kind::Results => "results",
            Kind::Durations => "durations",
            Kind::Backlog => "backlog",
        }
    }

    fn heading(self, range: Range) -> String {
        match self {
            Kind::Results => format!("Results per {}", range.per()),
            Kind::Durations => format!("Work duration per {} (p50, p95)", range.per()),
            Kind::Backlog => format!("Backlog per {}", range.per()),
        }
    }
}

/// The legend under a chart: each mark in words beside its swatch.
fn legend(kind: Kind) -> &'static str {
    match kind {
        Kind::Results => {
            "<ul class=\"chart-legend\"><li><span class=\"swatch swatch-success\" aria-hidden=\"true\"></span> success \
             (bottom)</li><li><span class=\"swatch swatch-failure\" aria-hidden=\"true\"></span> failure (middle, \
             striped)</li><li><span class=\"swatch swatch-transient\" aria-hidden=\"true\"></span> transient \
             (top)</li></ul>\n"
        }
        Kind::Durations => {
            "<ul class=\"chart-legend\"><li><span class=\"swatch swatch-p50\" aria-hidden=\"true\"></span> p50, solid \
             line, round points</li><li><span class=\"swatch swatch-p95\" aria-hidden=\"true\"></span> p95, dashed \
             line, square points</li></ul>\n"
        }
        Kind::Backlog => {
            "<ul class=\"chart-legend\"><li><span class=\"swatch swatch-backlog\" aria-hidden=\"true\"></span> batches \
             ready, as sampled (a gap: no sample)</li></ul>\n"
        }
    }
}

/// The table of the numbers behind one chart, in a closed `<details>`.
fn table(id: &str, kind: Kind, range: Range, series: &Series, rows: &[Row]) -> String {
    let (first_column, grouping) = match range {
        Range::Hour => ("Minute (UTC)", "per minute".to_owned()),
        Range::Day => ("Hour (UTC)", "per hour".to_owned()),
        Range::Month => (
            "Day (UTC)",
            match kind {
                Kind::Backlog => "per day (UTC): the newest hourly sample of each day".to_owned(),
                _ => "per day (UTC), summed from the hourly tallies; the first and last days are partial".to_owned(),
            },
        ),
    };
    let what = match kind {
        Kind::Results => "Results by outcome",
        Kind::Durations => "Work duration, p50 and p95",
        Kind::Backlog => "Backlog (batches ready)",
    };
    let mut out = String::new();
    w!(
        out,
        "<details class=\"chart-data\" id=\"{id}-data\"><summary>The numbers behind this chart</summary>\n\
         <div class=\"scroll\" role=\"region\" aria-labelledby=\"{id}-caption\" tabindex=\"0\">\n\
         <table class=\"grid chart-table\"><caption id=\"{id}-caption\">{} of {}, {}, {}</caption>\n<thead><tr>\
         <th scope=\"col\">{first_column}</th>",
        esc(what),
        esc(&series.component),
        esc(range.span()),
        esc(grouping)
    );
    match kind {
        Kind::Results => out.push_str(
            "<th scope=\"col\">success</th><th scope=\"col\">failure</th><th scope=\"col\">transient</th>\
             <th scope=\"col\">total</th>",
        ),
        Kind::Durations => {
            out.push_str("<th scope=\"col\">results</th><th scope=\"col\">p50</th><th scope=\"col\">p95</th>")
        }
        Kind::Backlog => out.push_str("<th scope=\"col\">ready</th>"),
    }
    out.push_str("</tr></thead>\n<tbody>\n");
    for row in rows {
        w!(out, "<tr><th scope=\"row\">{}</th>", row.when);
        match kind {
            Kind::Results => {
                let counts = WorkResult::ALL.map(|r| row.tallies.get(r).results);
                w!(
                    out,
                    "<td>{}</td><td>{}</td><td>{}</td><td>{}</td>",
                    counts[0],
                    counts[1],
                    counts[2],
                    counts.iter().sum::<u64>()
                );
            }
            Kind::Durations => {
                let all = row.tallies.combined();
                let q = |q: f64| all.quantile(q).map_or("–".to_owned(), duration_text);
                w!(out, "<td>{}</td><td>{}</td><td>{}</td>", all.results, esc(q(0.5)), esc(q(0.95)));
            }
            Kind::Backlog => match row.backlog {
                Some(ready) => w!(out, "<td>{ready}</td>"),
                None => out.push_str("<td>no sample</td>"),
            },
        }
        out.push_str("</tr>\n");
    }
    out.push_str("</tbody></table>\n</div>\n</details>\n");
    out
}

/// One component's three charts, each with its legend and table; `level` is the charts'
/// heading level. Not landmarks: every component has charts of the same names.
fn component_charts(out: &mut String, prefix: &str, range: Range, series: &Series, level: u8) {
    let rows = rows(range, series);
    out.push_str("<div class=\"charts-grid\">\n");
    for kind in Kind::ALL {
        let id = format!("{prefix}-{}", kind.suffix());
        w!(out, "<div class=\"chart\">\n<h{level} id=\"{id}-h\">{}</h{level}>\n", esc(kind.heading(range)));
        out.push_str(&match kind {
            Kind::Results => results_svg(&id, range, series),
            Kind::Durations => durations_svg(&id, range, series),
            Kind::Backlog => backlog_svg(&id, range, series),
        });
        out.push_str(legend(kind));
        out.push_str(&table(&id, kind, range, series, &rows));
        out.push_str("</div>\n");
    }
    out.push_str("</div>\n");
}

fn href(component: Option<&ComponentName>, range: Range) -> String {
    match component {
        Some(c) => format!("/charts?component={}&range={}", encode(c.as_str()), range.as_str()),
        None => format!("/charts?range={}", range.as_str()),
    }
}

/// The range and component switchers: links, the current one marked.
fn switchers(out: &mut String, components: &[ComponentName], chosen: Option<&ComponentName>, range: Range) {
    out.push_str("<nav class=\"chart-switch\" aria-label=\"Range\"><ul>");
    for r in Range::ALL {
        let current = if r == range { " aria-current=\"page\"" } else { "" };
        w!(out, "<li><a href=\"{}\"{current}>{}</a></li>", esc(href(chosen, r)), esc(r.label()));
    }
    out.push_str("</ul></nav>\n<nav class=\"chart-switch\" aria-label=\"Components\"><ul>");
    let current = if chosen.is_none() { " aria-current=\"page\"" } else { "" };
    w!(out, "<li><a href=\"{}\"{current}>All components</a></li>", esc(href(None, range)));
    for c in components {
        let current = if Some(c) == chosen { " aria-current=\"page\"" } else { "" };
        w!(out, "<li><a href=\"{}\"{current}>{}</a></li>", esc(href(Some(c), range)), esc(c));
    }
    out.push_str("</ul></nav>\n");
}

/// The page's body: every component compact, or one with its charts at full width.
pub fn body(range: Range, components: &[ComponentName], chosen: Option<&ComponentName>, all: &[Series]) -> String {
    let mut out = String::new();
    match chosen {
        Some(c) => w!(out, "<h1>Charts: {}</h1>\n", esc(c)),
        None => out.push_str("<h1>Charts</h1>\n"),
    }
    w!(
        out,
        "<p>{}: results by outcome, work duration (p50, p95) and backlog per {}, by the store's clock; times UTC. \
         The registry keeps per-minute tallies for 2 hours and per-hour tallies and backlog samples for 31 days; \
         each monitor samples the backlog (batches ready; at a human step, waiting for a person) once a minute \
         unless its <code>--sample-every</code> says otherwise.</p>\n",
        esc(range.label()),
        esc(range.per())
    );
    if components.is_empty() {
        out.push_str("<p>No component has run a pass against this store yet: there is nothing to chart.</p>\n");
        return out;
    }
    switchers(&mut out, components, chosen, range);
    for (i, series) in all.iter().enumerate() {
        if chosen.is_some() {
            w!(out, "<p class=\"chart-summary\">{}</p>\n", esc(summary(range, series)));
            component_charts(&mut out, "c0", range, series, 2);
        } else {
            let prefix = format!("c{i}");
            w!(
                out,
                "<section class=\"chart-component\" aria-labelledby=\"{prefix}-name\">\n<h2 id=\"{prefix}-name\">\
                 <a href=\"{}\">{}</a></h2>\n<p class=\"chart-summary\">{}</p>\n",
                esc(href(Some(&series.component), range)),
                esc(&series.component),
                esc(summary(range, series))
            );
            component_charts(&mut out, &prefix, range, series, 3);
            out.push_str("</section>\n");
        }
    }
    out
}

/// `/charts`: every component of the pipeline (or the one asked for) over the range asked for.
pub async fn page(
    State(app): State<Arc<App>>,
    caller: Caller,
    headers: HeaderMap,
    uri: axum::http::Uri,
    query: Result<Query<ChartQuery>, QueryRejection>,
) -> Result<Response, WebError> {
    let query =
        query.map(|Query(q)| q).map_err(|e| WebError::invalid(InvalidInput::new("query string", "", e.body_text())))?;
    let range = Range::parse(query.range.as_deref())?;
    let operator = app.monitor.operator();
    let store = operator.store().await?;
    let pipeline = operator.pipeline(store.as_ref()).await?;
    let chosen = match query.component.as_deref().map(str::trim).filter(|c| !c.is_empty()) {
        Some(name) => Some(operator.step(&pipeline, name)?.name().clone()),
        None => None,
    };
    let components: Vec<ComponentName> = pipeline.iter().map(|s| s.name().clone()).collect();
    let now = Timestamp::now();
    let points = if components.is_empty() {
        Vec::new()
    } else {
        store.work_series(range.step(), since(range, now), chosen.as_ref()).await.map_err(OperatorError::from)?
    };
    let shown: Vec<ComponentName> = match &chosen {
        Some(c) => vec![c.clone()],
        None => components.clone(),
    };
    let all = series(range, now, &shown, points);
    let body = body(range, &components, chosen.as_ref(), &all);
    let title = match &chosen {
        Some(c) => format!("Charts: {c}"),
        None => "Charts".to_owned(),
    };
    Ok(super::respond::respond(&headers, &caller, &title, Nav::Charts, &super::respond::here(&uri), &body))
}

#[cfg(test)]
mod tests {
    use autocomp_model::{WorkDone, WorkPoint};

    use super::*;

    fn name(text: &str) -> ComponentName {
        ComponentName::new(text).unwrap()
    }

    #[test]
    fn ranges_parse_and_a_bad_one_names_the_field() {
        assert_eq!(Range::parse(None).unwrap(), Range::Hour);
        assert_eq!(Range::parse(Some("month")).unwrap().steps(), 720);
        let error = Range::parse(Some("week")).unwrap_err();
        assert_eq!((error.field.as_str(), error.value.as_str()), ("range", "week"));
    }

    #[test]
    fn sparse_points_fill_their_steps_and_the_rest_are_gaps() {
        let now = Timestamp(1_795_000_000_000);
        let a = name("alpha");
        let work = [WorkDone { result: WorkResult::Success, duration_ms: 8 }];
        let points = vec![
            WorkPoint { component: a.clone(), at: now, tallies: WorkTallies::of(&work), backlog: Some(4) },
            WorkPoint { component: name("retired"), at: now, tallies: WorkTallies::default(), backlog: Some(1) },
        ];
        let all = series(Range::Hour, now, std::slice::from_ref(&a), points);
        assert_eq!(all.len(), 1);
        let slots = &all[0].slots;
        assert_eq!(slots.len(), 60);
        assert_eq!(slots[59].backlog, Some(4));
        assert_eq!(slots[59].total(), 1);
        assert!(slots[..59].iter().all(|s| s.backlog.is_none() && s.total() == 0));
        assert_eq!(slots[0].at, since(Range::Hour, now));
        // 30 days: a row per day, the backlog the newest sample of it.
        let month = series(Range::Month, now, std::slice::from_ref(&a), Vec::new());
        let days = rows(Range::Month, &month[0]);
        assert!((30..=31).contains(&days.len()), "{}", days.len());
    }

    #[test]
    fn charts_are_images_with_a_title_and_a_table() {
        let now = Timestamp(1_795_000_000_000);
        let a = name("alpha");
        let all = series(Range::Day, now, std::slice::from_ref(&a), Vec::new());
        let page = body(Range::Day, std::slice::from_ref(&a), None, &all);
        assert_eq!(page.matches("role=\"img\"").count(), 3);
        assert_eq!(page.matches("<table").count(), 3);
        assert!(page.contains("no results in the last 24 hours"));
        assert!(page.contains("times UTC"));
    }
}
