//! What the charts (`charts`) share to draw an SVG by hand: the frame of a chart (its size in
//! user units and the plot area inside it), scales (linear counts, a log scale of durations),
//! their ticks and labels (humanized durations, UTC times), and number formatting.

use autocomp_model::Timestamp;

use super::html::{esc, w};

/// A chart's drawing in user units: the SVG scales it to its container (`viewBox`, width
/// 100%), so at a phone's 400 px it is drawn at about three quarters of this.
pub const WIDTH: f64 = 420.0;
pub const HEIGHT: f64 = 200.0;
/// Room for the y labels on the left, the x labels below.
pub const LEFT: f64 = 58.0;
pub const RIGHT: f64 = 10.0;
pub const TOP: f64 = 22.0;
pub const BOTTOM: f64 = 36.0;
pub const PLOT_W: f64 = WIDTH - LEFT - RIGHT;
pub const PLOT_H: f64 = HEIGHT - TOP - BOTTOM;

/// Where step `i` of `n` starts, and its width, on the x axis.
pub fn slot_x(i: usize, n: usize) -> (f64, f64) {
    let width = PLOT_W / n.max(1) as f64;
    (LEFT + i as f64 * width, width)
}

/// The middle of step `i` of `n`: where a line's point sits.
pub fn slot_mid(i: usize, n: usize) -> f64 {
    let (x, width) = slot_x(i, n);
    x + width / 2.0
}

/// The y of `value` on a linear scale from 0 (the bottom) to `max` (the top).
pub fn linear_y(value: f64, max: f64) -> f64 {
    let share = if max <= 0.0 { 0.0 } else { (value / max).clamp(0.0, 1.0) };
    TOP + PLOT_H * (1.0 - share)
}

/// A round top for a count axis at least `max` (at least 1), and its ticks from 0: 1, 2, 5
/// times a power of ten, at most 5 ticks above 0.
pub fn count_ticks(max: u64) -> (u64, Vec<u64>) {
    let max = max.max(1);
    let mut step = 1u64;
    loop {
        for factor in [1u64, 2, 5] {
            let candidate = step.saturating_mul(factor);
            if max.div_ceil(candidate) <= 5 {
                let top = max.div_ceil(candidate) * candidate;
                return (top, (0..=top / candidate).map(|k| k * candidate).collect());
            }
        }
        step = step.saturating_mul(10);
    }
}

/// The ticks of the duration axis (milliseconds): each ten times the one before, then the
/// minute, ten minutes and the hour (the histogram's longest bound).
const DURATION_TICKS_MS: [f64; 8] = [1.0, 10.0, 100.0, 1_000.0, 10_000.0, 60_000.0, 600_000.0, 3_600_000.0];

/// A log scale of durations covering `least..=most` milliseconds (durations under 1 ms are
/// drawn at 1 ms): its ends and ticks, at least two.
pub struct LogScale {
    low: f64,
    high: f64,
    pub ticks: Vec<f64>,
}

impl LogScale {
    pub fn covering(least: f64, most: f64) -> Self {
        let (least, most) = (least.max(1.0), most.max(1.0));
        let low_at = DURATION_TICKS_MS.iter().rposition(|t| *t <= least).unwrap_or(0);
        let high_at = DURATION_TICKS_MS
            .iter()
            .position(|t| *t >= most)
            .unwrap_or(DURATION_TICKS_MS.len() - 1)
            .max(low_at + 1)
            .min(DURATION_TICKS_MS.len() - 1);
        let low_at = low_at.min(high_at - 1);
        Self {
            low: DURATION_TICKS_MS[low_at],
            high: DURATION_TICKS_MS[high_at],
            ticks: DURATION_TICKS_MS[low_at..=high_at].to_vec(),
        }
    }

    pub fn y(&self, ms: f64) -> f64 {
        let (low, high) = (self.low.log10(), self.high.log10());
        let share = ((ms.max(1.0).log10() - low) / (high - low)).clamp(0.0, 1.0);
        TOP + PLOT_H * (1.0 - share)
    }
}

/// A duration in milliseconds as an axis writes it: `1 ms`, `250 ms`, `2.5 s`, `10 min`, `1 h`.
pub fn duration_label(ms: f64) -> String {
    match ms {
        ms if ms < 1_000.0 => format!("{} ms", trim(ms, 0)),
        ms if ms < 60_000.0 => format!("{} s", trim(ms / 1_000.0, 1)),
        ms if ms < 3_600_000.0 => format!("{} min", trim(ms / 60_000.0, 1)),
        ms => format!("{} h", trim(ms / 3_600_000.0, 1)),
    }
}

/// `value` with at most `decimals` decimals, without trailing zeros.
fn trim(value: f64, decimals: usize) -> String {
    let text = format!("{value:.decimals$}");
    if text.contains('.') { text.trim_end_matches('0').trim_end_matches('.').to_owned() } else { text }
}

/// A time as `YYYY-MM-DDThh:mm` (UTC): the start of a step.
pub fn minute_text(at: Timestamp) -> String {
    let text = at.to_string();
    text.get(..16).map_or(text.clone(), |t| format!("{t}Z"))
}

/// `hh:mm` of a time (UTC).
pub fn clock_text(at: Timestamp) -> String {
    at.to_string().get(11..16).unwrap_or_default().to_owned()
}

/// `MM-DD` of a time (UTC).
pub fn day_text(at: Timestamp) -> String {
    at.to_string().get(5..10).unwrap_or_default().to_owned()
}

/// `YYYY-MM-DD` of a time (UTC).
pub fn date_text(at: Timestamp) -> String {
    at.to_string().get(..10).unwrap_or_default().to_owned()
}

/// The y axis: a grid line and a label at each tick, and the axis' name above it.
pub fn y_axis(out: &mut String, ticks: &[(f64, String)], name: &str) {
    out.push_str("<g class=\"axis y\">");
    for (y, label) in ticks {
        w!(
            out,
            "<line class=\"grid\" x1=\"{LEFT}\" y1=\"{y:.1}\" x2=\"{:.1}\" y2=\"{y:.1}\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
            LEFT + PLOT_W,
            LEFT - 4.0,
            y + 4.0,
            esc(label)
        );
    }
    w!(out, "<text class=\"name\" x=\"4\" y=\"10\">{}</text></g>\n", esc(name));
}

/// The x axis: the baseline, a tick and a label at each of `ticks` (step index, label), and
/// its name (which says the times are UTC) below.
pub fn x_axis(out: &mut String, n: usize, ticks: &[(usize, String)], name: &str) {
    let base = TOP + PLOT_H;
    w!(out, "<g class=\"axis x\"><line x1=\"{LEFT}\" y1=\"{base:.1}\" x2=\"{:.1}\" y2=\"{base:.1}\"/>", LEFT + PLOT_W);
    for (i, label) in ticks {
        let (x, _) = slot_x(*i, n);
        w!(
            out,
            "<line x1=\"{x:.1}\" y1=\"{base:.1}\" x2=\"{x:.1}\" y2=\"{:.1}\"/>\
             <text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
            base + 4.0,
            base + 16.0,
            esc(label)
        );
    }
    w!(
        out,
        "<text class=\"name\" x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text></g>\n",
        LEFT + PLOT_W,
        HEIGHT - 3.0,
        esc(name)
    );
}

/// A line through `points` (x, y; `None` a gap), as path data: each run of points is its
/// own subpath, and a point alone is drawn as a short tick so it still shows.
pub fn line_path(points: &[Option<(f64, f64)>]) -> String {
    let mut d = String::new();
    let mut run = 0usize;
    for (k, point) in points.iter().enumerate() {
        match point {
            Some((x, y)) => {
                let command = if run == 0 { 'M' } else { 'L' };
                w!(d, "{command}{x:.1},{y:.1} ");
                run += 1;
                let alone = run == 1 && points.get(k + 1).is_none_or(Option::is_none);
                if alone {
                    w!(d, "L{:.1},{y:.1} ", x + 0.01);
                }
            }
            None => run = 0,
        }
    }
    d.trim_end().to_owned()
}

/// The points of `points` with no neighbour on either side: a line does not show them, so a
/// chart with too many steps to mark every point marks these.
pub fn lone(points: &[Option<(f64, f64)>]) -> Vec<(f64, f64)> {
    let at = |k: usize| points.get(k).copied().flatten();
    (0..points.len()).filter_map(|k| at(k).filter(|_| (k == 0 || at(k - 1).is_none()) && at(k + 1).is_none())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn count_axes_end_on_round_numbers() {
        assert_eq!(count_ticks(0), (1, vec![0, 1]));
        assert_eq!(count_ticks(4), (4, vec![0, 1, 2, 3, 4]));
        assert_eq!(count_ticks(7), (8, vec![0, 2, 4, 6, 8]));
        assert_eq!(count_ticks(12_345).0, 15_000);
        assert!(count_ticks(u64::MAX / 2).1.len() >= 2);
    }

    #[test]
    fn the_duration_scale_covers_what_it_shows() {
        let scale = LogScale::covering(8.0, 2_000.0);
        assert_eq!(scale.ticks, vec![1.0, 10.0, 100.0, 1_000.0, 10_000.0]);
        assert!((scale.y(1.0) - (TOP + PLOT_H)).abs() < 1e-9);
        assert!((scale.y(10_000.0) - TOP).abs() < 1e-9);
        assert_eq!(LogScale::covering(0.0, 0.0).ticks, vec![1.0, 10.0]);
        assert_eq!(LogScale::covering(1e9, 1e9).ticks, vec![600_000.0, 3_600_000.0]);
        assert_eq!(duration_label(250.0), "250 ms");
        assert_eq!(duration_label(2_500.0), "2.5 s");
        assert_eq!(duration_label(600_000.0), "10 min");
        assert_eq!(duration_label(3_600_000.0), "1 h");
    }

    #[test]
    fn lines_break_at_gaps_and_a_lone_point_shows() {
        let d = line_path(&[Some((1.0, 2.0)), Some((3.0, 4.0)), None, Some((5.0, 6.0)), None]);
        assert_eq!(d, "M1.0,2.0 L3.0,4.0 M5.0,6.0 L5.0,6.0");
        assert_eq!(line_path(&[None, None]), "");
        assert_eq!(lone(&[Some((1.0, 2.0)), Some((3.0, 4.0)), None, Some((5.0, 6.0)), None]), [(5.0, 6.0)]);
    }

    #[test]
    fn times_are_written_in_utc() {
        let at = Timestamp(1_795_000_000_000);
        assert_eq!(minute_text(at), format!("{}Z", &at.to_string()[..16]));
        assert_eq!(clock_text(at).len(), 5);
        assert_eq!(day_text(at).len(), 5);
        assert_eq!(date_text(at).len(), 10);
    }
}
