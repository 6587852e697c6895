//! Pipeline metrics in the Prometheus text format, for the monitor's `/metrics` and for
//! `autocomp metrics` (node_exporter's textfile collector on hosts without a monitor): batches
//! per component and state, how long the oldest ready and working batches have waited, time
//! since each component's last pass and what silence means for it, results per outcome and
//! work durations (from the passes' reports the registry tallies), holds, circuit breakers and
//! resource pools (from the steering state), index lag. Counted by the
//! index and read from the registry; of the store only its open runs are read.

use std::fmt::Write as _;

use std::collections::BTreeMap;

use autocomp_model::{
    ComponentState, DURATION_BOUNDS_MS, HoldKind, PoolName, Selection, Timestamp, WorkHistory, WorkResult, WorkTallies,
};

use super::alerts::{AlertDefaults, MISSED_PASSES_CAP, SilenceRule, last_seen, ready_state};
use super::{Operator, OperatorError, Step};
use Kind::{Counter, Gauge, Histogram, Summary};

/// A metric family's type, as its `# TYPE` line names it.
#[derive(Clone, Copy)]
enum Kind {
    Gauge,
    Counter,
    /// Samples `<name>_bucket` (with `le`), `<name>_sum` and `<name>_count`.
    Histogram,
    /// Samples `<name>` (with `quantile`), `<name>_sum` and `<name>_count`.
    Summary,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Gauge => "gauge",
            Kind::Counter => "counter",
            Kind::Histogram => "histogram",
            Kind::Summary => "summary",
        }
    }
}

/// A metric family, declared once: the writer takes its name, type and help lines and its
/// samples' label names from here, so a sample cannot drift from its family.
struct Metric {
    name: &'static str,
    kind: Kind,
    help: &'static str,
    /// Label names, in order; `le` and `quantile` come from the kind.
    labels: &'static [&'static str],
}

const fn metric(name: &'static str, kind: Kind, labels: &'static [&'static str], help: &'static str) -> Metric {
    Metric { name, kind, help, labels }
}

/// A pool's size, slots in use and batches waiting, as the metrics count them.
type PoolTally = (f64, f64, f64);

const COMPONENT: &[&str] = &["component"];
const POOL: &[&str] = &["pool"];

const HELD: Metric = metric(
    "autocomp_component_held",
    Gauge,
    COMPONENT,
    "1 while the component claims no new work: paused, draining or its circuit open (its own hold or the whole pipeline's).",
);
const CONTRACT_BROKEN: Metric = metric(
    "autocomp_contract_broken",
    Gauge,
    COMPONENT,
    "1 while every pass of the component stops before any work: a result it reads is no longer published as it expects.",
);
const CIRCUIT_OPEN: Metric = metric(
    "autocomp_circuit_open",
    Gauge,
    COMPONENT,
    "1 while the component's circuit breaker holds it (components with break_after).",
);
const BREAKER_FAILURES: Metric = metric(
    "autocomp_breaker_consecutive_failures",
    Gauge,
    COMPONENT,
    "Consecutive permanent failures on distinct batches the circuit breaker counts (components with break_after).",
);
const POOL_SIZE: Metric =
    metric("autocomp_pool_size", Gauge, POOL, "A resource pool's size: batches' work it takes at once.");
const POOL_IN_USE: Metric = metric(
    "autocomp_pool_slots_in_use",
    Gauge,
    POOL,
    "Open runs of the components that declare the pool: each holds one of its slots.",
);
const POOL_WAITING: Metric = metric(
    "autocomp_pool_waiting",
    Gauge,
    POOL,
    "Batches ready for the components that declare the pool: each waits for a pass and a free slot.",
);

const BATCHES: Metric = metric("autocomp_batches", Gauge, &["component", "state"], "Batches per component and state.");
const BATCHES_OVERDUE: Metric = metric(
    "autocomp_batches_overdue",
    Gauge,
    COMPONENT,
    "Batches ready for a component longer than its overdue_after (monitor default otherwise).",
);
const OLDEST_READY_AGE: Metric = metric(
    "autocomp_oldest_ready_age_seconds",
    Gauge,
    COMPONENT,
    "How long the batch ready the longest has been ready (since its last activity); 0 when none is.",
);
const OLDEST_WORKING_AGE: Metric = metric(
    "autocomp_oldest_working_age_seconds",
    Gauge,
    COMPONENT,
    "How long the oldest open run of a component has been running; 0 when none is.",
);
const LAST_PASS_AGE: Metric = metric(
    "autocomp_last_pass_age_seconds",
    Gauge,
    COMPONENT,
    "Seconds since any host last reported a pass of the component.",
);
const SILENT_AFTER: Metric = metric(
    "autocomp_silent_after_seconds",
    Gauge,
    COMPONENT,
    "No pass on any host for this long makes the component silent (components silent by time, not schedule).",
);
const MISSED_PASSES: Metric = metric(
    "autocomp_missed_passes",
    Gauge,
    COMPONENT,
    "Passes of its crontab schedule since any host last ran the component (components silent by schedule).",
);
const RESULTS_TOTAL: Metric = metric(
    "autocomp_results_total",
    Counter,
    &["component", "outcome"],
    "Results recorded by a component's passes since it was registered, by outcome.",
);
const RESULTS_LAST_HOUR: Metric = metric(
    "autocomp_results_last_hour",
    Gauge,
    &["component", "outcome"],
    "Results recorded by a component's passes in the last hour of store time, by outcome.",
);
const WORK_DURATION: Metric = metric(
    "autocomp_work_duration_seconds",
    Histogram,
    COMPONENT,
    "How long a component's work on a batch took, every outcome, since it was registered.",
);
const WORK_DURATION_LAST_HOUR: Metric = metric(
    "autocomp_work_duration_last_hour_seconds",
    Summary,
    COMPONENT,
    "A component's work durations over the last hour of store time: p50 and p95 (estimated within their \
     histogram bucket; absent without results), sum and count.",
);
const MAX_RUNTIME: Metric = metric(
    "autocomp_max_runtime_seconds",
    Gauge,
    COMPONENT,
    "A component's max_runtime: a run older than this is overdue.",
);
const STORE_HEAD: Metric = metric("autocomp_store_head", Gauge, &[], "The store's newest change (seq).");
const INDEX_LAG: Metric = metric("autocomp_index_lag_changes", Gauge, &[], "Store changes the batch index is behind.");

impl Metric {
    /// Writes the family's help and type lines; its samples follow through the writer.
    fn write<'a>(&'a self, out: &'a mut String) -> Family<'a> {
        writeln!(out, "# HELP {} {}\n# TYPE {} {}", self.name, self.help, self.name, self.kind.as_str()).ok();
        Family { metric: self, out }
    }
}

/// The samples of one family, written after its help and type lines.
struct Family<'a> {
    metric: &'a Metric,
    out: &'a mut String,
}

impl Family<'_> {
    /// A sample labelled `values` (one per declared label, in order).
    fn sample(&mut self, values: &[&str], value: f64) {
        self.write("", values, None, value);
    }

    /// A histogram's cumulative count of observations up to `le`.
    fn bucket(&mut self, values: &[&str], le: &str, value: f64) {
        self.write("_bucket", values, Some(("le", le)), value);
    }

    /// A summary's estimate of `quantile`.
    fn quantile(&mut self, values: &[&str], quantile: &str, value: f64) {
        self.write("", values, Some(("quantile", quantile)), value);
    }

    /// A histogram's or summary's sum and count of observations.
    fn sum_and_count(&mut self, values: &[&str], sum: f64, count: f64) {
        self.write("_sum", values, None, sum);
        self.write("_count", values, None, count);
    }

    fn write(&mut self, suffix: &str, values: &[&str], extra: Option<(&str, &str)>, value: f64) {
        debug_assert_eq!(values.len(), self.metric.labels.len(), "{}: one value per label", self.metric.name);
        let pairs = self.metric.labels.iter().copied().zip(values.iter().copied()).chain(extra);
        let labels: Vec<String> = pairs.map(|(k, v)| format!("{k}=\"{}\"", label(v))).collect();
        let labels = if labels.is_empty() { String::new() } else { format!("{{{}}}", labels.join(",")) };
        writeln!(self.out, "{}{suffix}{labels} {value}", self.metric.name).ok();
    }
}

/// Escapes a label value (backslash, quote, newline), as the text format requires.
fn label(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// What the metrics are computed from, read once: the pipeline, the index's tallies, the
/// open runs and the steering state, at one clock reading.
struct Reading<'a> {
    pipeline: &'a [Step],
    now: Timestamp,
    /// Per step, a tally per state and then the overdue one (`state_selections`).
    counts: Vec<autocomp_sboi::Tally>,
    /// Per step, the batches ready for it and the quietest one's last activity.
    oldest_ready: Vec<autocomp_sboi::Tally>,
    runs: Vec<autocomp_model::Run>,
    steering: autocomp_model::Steering,
}

impl Reading<'_> {
    fn seconds(&self, since: Timestamp) -> f64 {
        self.now.since(since).as_secs_f64()
    }

    /// Batches per component and state, overdue batches, and the oldest ready and working
    /// batches' ages.
    fn write_batches(&self, out: &mut String) {
        let pipeline = self.pipeline;
        let per_step = ComponentState::ALL.len() + 1;
        let mut family = BATCHES.write(out);
        for (i, step) in pipeline.iter().enumerate() {
            for (state, tally) in ComponentState::ALL.iter().zip(&self.counts[i * per_step..]) {
                family.sample(&[step.name().as_str(), state.as_str()], tally.count as f64);
            }
        }
        let mut family = BATCHES_OVERDUE.write(out);
        for (i, step) in pipeline.iter().enumerate() {
            family.sample(&[step.name().as_str()], self.counts[(i + 1) * per_step - 1].count as f64);
        }
        let mut family = OLDEST_READY_AGE.write(out);
        for (step, tally) in pipeline.iter().zip(&self.oldest_ready) {
            family.sample(&[step.name().as_str()], tally.quietest.map_or(0.0, |t| self.seconds(t)));
        }
        let mut family = OLDEST_WORKING_AGE.write(out);
        for step in pipeline {
            let oldest = self.runs.iter().filter(|run| run.component == *step.name()).map(|run| run.started_at).min();
            family.sample(&[step.name().as_str()], oldest.map_or(0.0, |t| self.seconds(t)));
        }
    }

    /// Time since each component's last pass, and what silence means for it.
    fn write_silence(&self, out: &mut String, defaults: &AlertDefaults) {
        let pipeline = self.pipeline;
        let mut family = LAST_PASS_AGE.write(out);
        for step in pipeline {
            family.sample(&[step.name().as_str()], self.seconds(last_seen(&step.registered)));
        }
        // Each component is silent by one rule; its series says which (see `SilenceRule`).
        let rules: Vec<SilenceRule> = pipeline.iter().map(|step| SilenceRule::of(&step.registered, defaults)).collect();
        let mut family = SILENT_AFTER.write(out);
        for (step, rule) in pipeline.iter().zip(&rules) {
            if let SilenceRule::After(after) = rule {
                family.sample(&[step.name().as_str()], after.as_secs_f64());
            }
        }
        let mut family = MISSED_PASSES.write(out);
        for (step, rule) in pipeline.iter().zip(&rules) {
            if let SilenceRule::MissedPasses { schedule, .. } = rule {
                let missed = schedule.missed_since(last_seen(&step.registered), self.now, MISSED_PASSES_CAP);
                family.sample(&[step.name().as_str()], missed as f64);
            }
        }
    }

    /// Results per outcome and work durations, from the passes' reports the registry
    /// tallies; then each component's max_runtime.
    fn write_work(&self, out: &mut String) {
        // Sources register deliveries rather than work on batches: they have no results.
        let workers: Vec<_> = self.pipeline.iter().filter(|step| !step.descriptor().source).collect();
        type Window = fn(&WorkHistory) -> &WorkTallies;
        let results: [(&Metric, Window); 2] =
            [(&RESULTS_TOTAL, |work| &work.total), (&RESULTS_LAST_HOUR, |work| &work.last_hour)];
        for (metric, window) in results {
            let mut family = metric.write(out);
            for step in &workers {
                for result in WorkResult::ALL {
                    let count = window(&step.registered.work).get(result).results;
                    family.sample(&[step.name().as_str(), result.as_str()], count as f64);
                }
            }
        }
        let mut family = WORK_DURATION.write(out);
        for step in &workers {
            let all = step.registered.work.total.combined();
            let component = &[step.name().as_str()];
            let mut cumulative = 0;
            for (bound, count) in DURATION_BOUNDS_MS.iter().zip(&all.buckets) {
                cumulative += count;
                family.bucket(component, &(*bound as f64 / 1000.0).to_string(), cumulative as f64);
            }
            family.bucket(component, "+Inf", all.results as f64);
            family.sum_and_count(component, all.duration_ms_sum as f64 / 1000.0, all.results as f64);
        }
        let mut family = WORK_DURATION_LAST_HOUR.write(out);
        for step in &workers {
            let all = step.registered.work.last_hour.combined();
            let component = &[step.name().as_str()];
            for (quantile, q) in [("0.5", 0.5), ("0.95", 0.95)] {
                if let Some(duration) = all.quantile(q) {
                    family.quantile(component, quantile, duration.as_secs_f64());
                }
            }
            family.sum_and_count(component, all.duration_ms_sum as f64 / 1000.0, all.results as f64);
        }
        let mut family = MAX_RUNTIME.write(out);
        for step in self.pipeline {
            family.sample(&[step.name().as_str()], step.descriptor().max_runtime.as_secs_f64());
        }
    }

    /// Holds and circuit breakers, from the steering state.
    fn write_holds(&self, out: &mut String) {
        let steering = &self.steering;
        let mut family = HELD.write(out);
        for step in self.pipeline {
            family.sample(&[step.name().as_str()], f64::from(u8::from(steering.hold_of(step.name()).is_some())));
        }
        // A broken contract holds the component as surely as a pause, from the registry.
        let mut family = CONTRACT_BROKEN.write(out);
        for step in self.pipeline {
            family.sample(&[step.name().as_str()], f64::from(u8::from(step.broken_contract(self.pipeline).is_some())));
        }
        let breaking = || self.pipeline.iter().filter(|step| step.descriptor().break_after.is_some());
        let mut family = CIRCUIT_OPEN.write(out);
        for step in breaking() {
            let open = steering.components.get(step.name()).is_some_and(|hold| hold.kind == HoldKind::Circuit);
            family.sample(&[step.name().as_str()], f64::from(u8::from(open)));
        }
        let mut family = BREAKER_FAILURES.write(out);
        for step in breaking() {
            let count = steering.breakers.get(step.name()).map_or(0, |breaker| breaker.consecutive);
            family.sample(&[step.name().as_str()], f64::from(count));
        }
    }

    /// Resource pools: size, slots in use, batches waiting. Every open run of a component
    /// that declares a pool holds one of its slots; every batch ready for it waits for a pass
    /// and a slot.
    fn write_pools(&self, out: &mut String) {
        let mut pools: BTreeMap<&PoolName, PoolTally> = BTreeMap::new();
        for (name, pool) in &self.steering.pools {
            pools.entry(name).or_default().0 = f64::from(pool.size);
        }
        for (step, tally) in self.pipeline.iter().zip(&self.oldest_ready) {
            let running = self.runs.iter().filter(|run| run.component == *step.name()).count() as f64;
            for pool in &step.descriptor().pools {
                let entry = pools.entry(pool).or_default();
                entry.1 += running;
                entry.2 += tally.count as f64;
            }
        }
        for (metric, which) in [(&POOL_SIZE, 0), (&POOL_IN_USE, 1), (&POOL_WAITING, 2)] {
            let mut family = metric.write(out);
            for (name, pool) in &pools {
                family.sample(&[name.as_str()], [pool.0, pool.1, pool.2][which]);
            }
        }
    }
}

/// The pipeline's metrics as Prometheus text. `defaults` gives the overdue and silence
/// thresholds of components whose config sets none.
async fn metrics_text(operator: &Operator, defaults: &AlertDefaults) -> Result<String, OperatorError> {
    let store = operator.store().await?;
    let pipeline = operator.pipeline(store.as_ref()).await?;
    let index = operator.index(&store)?;
    let now = Timestamp::now();
    let mut selections = Vec::new();
    for step in &pipeline {
        selections.extend(step.state_selections(defaults.ready_after));
    }
    let counts = index.tally(&selections, false).await?;
    let ready: Vec<Selection> =
        pipeline.iter().map(|s| Selection::component_state(s.descriptor(), ready_state(s))).collect();
    let oldest_ready = index.tally(&ready, true).await?;
    let runs = operator.open_runs_of(&pipeline).await?;
    let steering = store.steering().await?;
    let reading = Reading { pipeline: &pipeline, now, counts, oldest_ready, runs, steering };
    let mut out = String::new();
    reading.write_batches(&mut out);
    reading.write_silence(&mut out, defaults);
    reading.write_work(&mut out);
    reading.write_holds(&mut out);
    reading.write_pools(&mut out);
    let index_seq = index.catch_up().await?.cursor();
    let head = store.head().await?;
    STORE_HEAD.write(&mut out).sample(&[], head.0 as f64);
    INDEX_LAG.write(&mut out).sample(&[], head.0.saturating_sub(index_seq.0).max(0) as f64);
    Ok(out)
}

impl Operator {
    /// The pipeline's metrics as Prometheus text: see `metrics_text`.
    pub async fn metrics(&self, defaults: &AlertDefaults) -> Result<String, OperatorError> {
        metrics_text(self, defaults).await
    }
}

#[cfg(test)]
#[path = "metrics_tests.rs"]
mod tests;
