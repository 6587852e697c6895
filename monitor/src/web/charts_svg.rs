//! The three charts of a component on the `/charts` page, drawn as inline SVG images (no
//! script) from its series: results stacked by outcome, p50/p95 work duration on a log
//! scale, and the backlog; each with a title, a description and a key. Apart from the page
//! (`charts`), which shapes the series and tables the same numbers.

use super::chart_series::{Range, Series, Slot, ms_text, plural};
use super::html::{esc, w};
use super::svg::{self, HEIGHT, LEFT, PLOT_H, PLOT_W, TOP, WIDTH};

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
pub(super) fn results_svg(id: &str, range: Range, series: &Series) -> String {
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
    result_bars(&mut out, id, series, top);
    if total == 0 {
        nothing(&mut out, &format!("no results in {}", range.span()));
    }
    svg::x_axis(&mut out, n, &x_ticks(range, series), &x_axis_name(range));
    out.push_str("</svg>\n");
    out
}

/// Each step's bars, stacked bottom to top by outcome. Each outcome's bars as one path (a
/// rectangle per step): a month's 720 steps stay small. With few steps, each step's bars are
/// a group with its numbers as a tooltip.
fn result_bars(out: &mut String, id: &str, series: &Series, top: u64) {
    let n = series.slots.len();
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
}

/// (b) p50 (solid, round points) and p95 (dashed, square points) of every result per step,
/// on a log scale of durations; no line where a step has no result.
pub(super) fn durations_svg(id: &str, range: Range, series: &Series) -> String {
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
pub(super) fn backlog_svg(id: &str, range: Range, series: &Series) -> String {
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
pub(super) enum Kind {
    Results,
    Durations,
    Backlog,
}

impl Kind {
    pub(super) const ALL: [Kind; 3] = [Kind::Results, Kind::Durations, Kind::Backlog];

    pub(super) fn suffix(self) -> &'static str {
        match self {
            Kind::Results => "results",
            Kind::Durations => "durations",
            Kind::Backlog => "backlog",
        }
    }

    pub(super) fn heading(self, range: Range) -> String {
        match self {
            Kind::Results => format!("Results per {}", range.per()),
            Kind::Durations => format!("Work duration per {} (p50, p95)", range.per()),
            Kind::Backlog => format!("Backlog per {}", range.per()),
        }
    }
}

/// The legend under a chart: each mark in words beside its swatch.
pub(super) fn legend(kind: Kind) -> &'static str {
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
