//! What the charts draw, shaped from the store's work series: the range shown (the last
//! hour per minute, 24 hours or 30 days per hour), one slot per step with its tallies and
//! backlog (a gap where nothing was recorded), per component. Shared by the page (`charts`)
//! and the drawings (`charts_svg`).

use std::collections::HashMap;

use autocomp_model::{ComponentName, InvalidInput, SeriesStep, Timestamp, WorkResult, WorkTallies};
use autocomp_ops::operator::duration_text;

use super::svg;

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
    pub(super) const ALL: [Range; 3] = [Range::Hour, Range::Day, Range::Month];

    pub fn parse(text: Option<&str>) -> Result<Self, InvalidInput> {
        match text.unwrap_or_default().trim() {
            "" | "hour" => Ok(Range::Hour),
            "day" => Ok(Range::Day),
            "month" => Ok(Range::Month),
            other => Err(InvalidInput::new("range", other, "expected hour, day or month")),
        }
    }

    pub(super) fn as_str(self) -> &'static str {
        match self {
            Range::Hour => "hour",
            Range::Day => "day",
            Range::Month => "month",
        }
    }

    pub(super) fn label(self) -> &'static str {
        match self {
            Range::Hour => "Last hour",
            Range::Day => "Last 24 hours",
            Range::Month => "Last 30 days",
        }
    }

    pub(super) fn span(self) -> &'static str {
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

    /// The fewest steps a chart ranged to its data shows: 12 minutes, 12 hours, 7 days.
    pub fn fewest_steps(self) -> usize {
        match self {
            Range::Hour | Range::Day => 12,
            Range::Month => 7 * 24,
        }
    }

    /// The step's name: `minute` or `hour`.
    pub(super) fn per(self) -> &'static str {
        self.step().as_str()
    }

    /// Where the x axis has a label: every 10 minutes, 3 hours, 5 days (UTC).
    pub(super) fn tick(self, index: i64, at: Timestamp) -> Option<String> {
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
    pub(super) fn counts(&self) -> [u64; 3] {
        WorkResult::ALL.map(|r| self.tallies.get(r).results)
    }

    pub(super) fn total(&self) -> u64 {
        self.counts().iter().sum()
    }

    /// p50 and p95 of every result of the step, in milliseconds.
    pub(super) fn quantiles(&self) -> Option<(f64, f64)> {
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

/// The series from the first step any of them has data in (results or a backlog sample),
/// leaving at least the range's `fewest_steps`: a run of a few minutes is drawn across the
/// chart, not as a sliver at the end of an hour. Every series keeps the same steps.
pub fn ranged_to_data(range: Range, all: &mut [Series]) {
    let has_data = |slot: &Slot| slot.total() > 0 || slot.backlog.is_some();
    let Some(steps) = all.first().map(|s| s.slots.len()) else { return };
    let first = all.iter().filter_map(|s| s.slots.iter().position(has_data)).min().unwrap_or(0);
    let start = first.min(steps.saturating_sub(range.fewest_steps()));
    for series in all {
        series.slots.drain(..start);
    }
}

/// Whether a series has any result or backlog sample.
pub fn is_empty(series: &Series) -> bool {
    series.slots.iter().all(|slot| slot.total() == 0 && slot.backlog.is_none())
}

/// The first step of the window `range` shows at `now`: what `work_series` is asked from.
pub fn since(range: Range, now: Timestamp) -> Timestamp {
    let step = range.step();
    Timestamp((step.index_of(now) - (range.steps() as i64 - 1)) * step.millis())
}

pub(super) fn plural(n: u64, what: &str) -> String {
    if n == 1 { format!("1 {what}") } else { format!("{n} {what}s") }
}

pub(super) fn ms_text(ms: f64) -> String {
    duration_text(std::time::Duration::from_secs_f64(ms / 1000.0))
}
