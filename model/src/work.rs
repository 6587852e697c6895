//! What components' work came to, for the pipeline's result and duration metrics: each
//! batch's result and duration as its pass reports them, and their tallies per result with a
//! fixed histogram of durations (so a week of results costs the registry a few rows).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{ComponentName, InvalidInput, Timestamp};

/// Most batches one pass may report (a pass claims at most its `queue_size`).
pub const MAX_WORK_PER_PASS: usize = 100_000;

/// Upper bounds (inclusive, milliseconds) of the duration histogram's buckets; one more
/// bucket above the last holds everything longer. Fixed: stored tallies depend on them.
pub const DURATION_BOUNDS_MS: [u64; 20] = [
    1, 2, 5, 10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 30_000, 60_000, 120_000, 300_000, 600_000,
    1_800_000, 3_600_000,
];

/// Buckets in a tally: one per bound and one above the last.
pub const DURATION_BUCKETS: usize = DURATION_BOUNDS_MS.len() + 1;

/// How a batch's work ended, as recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "json-schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum WorkResult {
    Success,
    /// A failure that stays until an operator reruns it.
    Failure,
    /// A transient failure, retried by the component itself.
    Transient,
}

impl WorkResult {
    pub const ALL: [WorkResult; 3] = [WorkResult::Success, WorkResult::Failure, WorkResult::Transient];

    pub fn as_str(self) -> &'static str {
        match self {
            WorkResult::Success => "success",
            WorkResult::Failure => "failure",
            WorkResult::Transient => "transient",
        }
    }

    pub fn parse(text: &str) -> Result<Self, InvalidInput> {
        Self::ALL
            .into_iter()
            .find(|r| r.as_str() == text)
            .ok_or_else(|| InvalidInput::new("result", text, "expected success, failure or transient"))
    }
}

/// One batch's work in a pass: how it ended and how long the work took.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "json-schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct WorkDone {
    pub result: WorkResult,
    pub duration_ms: u64,
}

/// Results of one kind: how many, their summed duration, and a histogram of durations
/// (`buckets[i]` counts durations within `DURATION_BOUNDS_MS[i]`, above the bound before it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "json-schema", derive(schemars::JsonSchema))]
pub struct WorkTally {
    pub results: u64,
    pub duration_ms_sum: u64,
    pub buckets: Vec<u64>,
}

impl Default for WorkTally {
    fn default() -> Self {
        Self { results: 0, duration_ms_sum: 0, buckets: vec![0; DURATION_BUCKETS] }
    }
}

impl WorkTally {
    pub fn record(&mut self, duration_ms: u64) {
        self.results += 1;
        self.duration_ms_sum = self.duration_ms_sum.saturating_add(duration_ms);
        let bucket =
            DURATION_BOUNDS_MS.iter().position(|bound| duration_ms <= *bound).unwrap_or(DURATION_BOUNDS_MS.len());
        self.buckets[bucket] += 1;
    }

    /// Adds another tally (a stored one may have been written with fewer buckets: none is lost).
    pub fn add(&mut self, other: &WorkTally) {
        self.results = self.results.saturating_add(other.results);
        self.duration_ms_sum = self.duration_ms_sum.saturating_add(other.duration_ms_sum);
        if self.buckets.len() < other.buckets.len() {
            self.buckets.resize(other.buckets.len(), 0);
        }
        for (mine, theirs) in self.buckets.iter_mut().zip(&other.buckets) {
            *mine = mine.saturating_add(*theirs);
        }
    }

    /// The duration below which a share `q` (0 to 1) of the results fall, estimated from the
    /// histogram by interpolating within the bucket that holds it (as Prometheus'
    /// `histogram_quantile` does); the longest bound when it falls above them. `None` when empty.
    pub fn quantile(&self, q: f64) -> Option<Duration> {
        let total: u64 = self.buckets.iter().sum();
        if total == 0 {
            return None;
        }
        let rank = q.clamp(0.0, 1.0) * total as f64;
        let mut below = 0u64;
        for (i, count) in self.buckets.iter().enumerate() {
            let Some(&upper) = DURATION_BOUNDS_MS.get(i) else { break };
            if *count > 0 && (below + count) as f64 >= rank {
                let lower = if i == 0 { 0 } else { DURATION_BOUNDS_MS[i - 1] };
                let within = ((rank - below as f64) / *count as f64).clamp(0.0, 1.0);
                let ms = lower as f64 + (upper - lower) as f64 * within;
                return Some(Duration::from_secs_f64(ms / 1000.0));
            }
            below += count;
        }
        Some(Duration::from_millis(DURATION_BOUNDS_MS[DURATION_BOUNDS_MS.len() - 1]))
    }
}

/// Tallies per result.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "json-schema", derive(schemars::JsonSchema))]
pub struct WorkTallies {
    #[serde(default)]
    pub success: WorkTally,
    #[serde(default)]
    pub failure: WorkTally,
    #[serde(default)]
    pub transient: WorkTally,
}

impl WorkTallies {
    pub fn of(work: &[WorkDone]) -> Self {
        let mut tallies = Self::default();
        for done in work {
            tallies.get_mut(done.result).record(done.duration_ms);
        }
        tallies
    }

    pub fn get(&self, result: WorkResult) -> &WorkTally {
        match result {
            WorkResult::Success => &self.success,
            WorkResult::Failure => &self.failure,
            WorkResult::Transient => &self.transient,
        }
    }

    pub fn get_mut(&mut self, result: WorkResult) -> &mut WorkTally {
        match result {
            WorkResult::Success => &mut self.success,
            WorkResult::Failure => &mut self.failure,
            WorkResult::Transient => &mut self.transient,
        }
    }

    /// The results with something in them, in `WorkResult::ALL` order.
    pub fn non_empty(&self) -> impl Iterator<Item = (WorkResult, &WorkTally)> {
        WorkResult::ALL.into_iter().map(|r| (r, self.get(r))).filter(|(_, t)| t.results > 0)
    }

    /// Every result together (for durations regardless of how the work ended).
    pub fn combined(&self) -> WorkTally {
        let mut all = WorkTally::default();
        for result in WorkResult::ALL {
            all.add(self.get(result));
        }
        all
    }
}

/// A component's results as the registry keeps them: since it was first registered, and in
/// the last hour of store time (the current minute and the 59 before it).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "json-schema", derive(schemars::JsonSchema))]
pub struct WorkHistory {
    #[serde(default)]
    pub total: WorkTallies,
    #[serde(default)]
    pub last_hour: WorkTallies,
}

/// How many minutes of per-minute tallies the registry keeps (the last hour, with room).
pub const WORK_MINUTES_KEPT: i64 = 120;
/// The minutes counted as the last hour: the current one and the 59 before it.
pub const WORK_MINUTES_IN_HOUR: i64 = 60;

/// How many hours of per-hour tallies and backlog samples the registry keeps: 31 days, so a
/// 30-day chart is always whole.
pub const WORK_HOURS_KEPT: i64 = 24 * 31;

/// The steps a component's history is kept in: minutes for the last `WORK_MINUTES_KEPT`,
/// hours for the last `WORK_HOURS_KEPT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "json-schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum SeriesStep {
    Minute,
    Hour,
}

impl SeriesStep {
    pub fn millis(self) -> i64 {
        match self {
            SeriesStep::Minute => 60_000,
            SeriesStep::Hour => 3_600_000,
        }
    }

    /// How many steps back the registry keeps.
    pub fn kept(self) -> i64 {
        match self {
            SeriesStep::Minute => WORK_MINUTES_KEPT,
            SeriesStep::Hour => WORK_HOURS_KEPT,
        }
    }

    /// The number of the step `at` falls in (milliseconds since the epoch / step).
    pub fn index_of(self, at: Timestamp) -> i64 {
        at.millis().div_euclid(self.millis())
    }

    pub fn as_str(self) -> &'static str {
        match self {
            SeriesStep::Minute => "minute",
            SeriesStep::Hour => "hour",
        }
    }
}

/// One step of a component's history, in store time: what its recorded work came to in that
/// minute or hour, and its backlog (batches ready for it) as last sampled in it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "json-schema", derive(schemars::JsonSchema))]
pub struct WorkPoint {
    pub component: ComponentName,
    /// Where the step starts.
    pub at: Timestamp,
    #[serde(default)]
    pub tallies: WorkTallies,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backlog: Option<u64>,
}

/// A component's backlog as sampled now: how many batches are ready for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "json-schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct BacklogSample {
    pub component: ComponentName,
    pub ready: u64,
}

/// Most samples one `record_backlog` takes (one per component).
pub const MAX_BACKLOG_SAMPLES: usize = 10_000;

pub(crate) fn check_work(work: &[WorkDone]) -> Result<(), InvalidInput> {
    if work.len() > MAX_WORK_PER_PASS {
        return Err(InvalidInput::new(
            "pass work",
            format!("{} batches", work.len()),
            format!("at most {MAX_WORK_PER_PASS} per pass"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tally(durations: &[u64]) -> WorkTally {
        let mut tally = WorkTally::default();
        durations.iter().for_each(|d| tally.record(*d));
        tally
    }

    #[test]
    fn durations_land_in_the_bucket_of_their_bound() {
        let t = tally(&[0, 1, 2, 3, 3_600_000, 3_600_001]);
        assert_eq!(t.buckets[0], 2, "0 and 1 ms are within the first bound");
        assert_eq!(t.buckets[1], 1);
        assert_eq!(t.buckets[2], 1);
        assert_eq!(t.buckets[DURATION_BUCKETS - 2], 1);
        assert_eq!(t.buckets[DURATION_BUCKETS - 1], 1, "longer than the last bound");
        assert_eq!(t.results, 6);
        assert_eq!(t.duration_ms_sum, 7_200_007);
    }

    #[test]
    fn quantiles_fall_in_the_bucket_that_holds_them() {
        // 90 quick results (within 10 ms) and 10 slow ones (1-2.5 s).
        let t = tally(&[[8u64; 90].as_slice(), [2_000u64; 10].as_slice()].concat());
        let p50 = t.quantile(0.5).unwrap();
        assert!(p50 > Duration::from_millis(5) && p50 <= Duration::from_millis(10), "{p50:?}");
        let p95 = t.quantile(0.95).unwrap();
        assert!(p95 > Duration::from_millis(1_000) && p95 <= Duration::from_millis(2_500), "{p95:?}");
        assert_eq!(WorkTally::default().quantile(0.5), None);
        assert_eq!(tally(&[10_000_000]).quantile(0.99), Some(Duration::from_secs(3600)), "capped at the last bound");
    }

    #[test]
    fn tallies_add_up_and_split_by_result() {
        let work = [
            WorkDone { result: WorkResult::Success, duration_ms: 3 },
            WorkDone { result: WorkResult::Success, duration_ms: 40 },
            WorkDone { result: WorkResult::Transient, duration_ms: 7 },
        ];
        let mut tallies = WorkTallies::of(&work);
        assert_eq!(tallies.success.results, 2);
        assert_eq!(tallies.failure.results, 0);
        assert_eq!(tallies.transient.duration_ms_sum, 7);
        tallies.success.add(&tally(&[1]));
        assert_eq!(tallies.combined().results, 4);
        assert_eq!(
            tallies.non_empty().map(|(r, _)| r).collect::<Vec<_>>(),
            [WorkResult::Success, WorkResult::Transient]
        );
        let short = WorkTally { results: 1, duration_ms_sum: 1, buckets: vec![1] };
        let mut widened = WorkTally::default();
        widened.add(&short);
        assert_eq!(widened.buckets[0], 1);
    }
}
