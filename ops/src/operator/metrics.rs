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
use super::{Operator, OperatorError};
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

impl Operator {
    /// The pipeline's metrics as Prometheus text. `defaults` gives the overdue and silence
    /// thresholds of components whose config sets none.
    pub async fn metrics(&self, defaults: &AlertDefaults) -> Result<String, OperatorError> {
        let store = self.store().await?;
        let pipeline = self.pipeline(store.as_ref()).await?;
        let index = self.index(&store)?;
        let now = Timestamp::now();
        let seconds = |since: Timestamp| now.since(since).as_secs_f64();

        let mut selections = Vec::new();
        for step in &pipeline {
            selections.extend(step.state_selections(defaults.ready_after));
        }
        let counts = index.tally(&selections, false).await?;
        let ready: Vec<Selection> =
            pipeline.iter().map(|s| Selection::component_state(s.descriptor(), ready_state(s))).collect();
        let oldest_ready = index.tally(&ready, true).await?;

        let mut out = String::new();
        let per_step = ComponentState::ALL.len() + 1;
        let mut family = BATCHES.write(&mut out);
        for (i, step) in pipeline.iter().enumerate() {
            for (state, tally) in ComponentState::ALL.iter().zip(&counts[i * per_step..]) {
                family.sample(&[step.name().as_str(), state.as_str()], tally.count as f64);
            }
        }
        let mut family = BATCHES_OVERDUE.write(&mut out);
        for (i, step) in pipeline.iter().enumerate() {
            family.sample(&[step.name().as_str()], counts[(i + 1) * per_step - 1].count as f64);
        }
        let mut family = OLDEST_READY_AGE.write(&mut out);
        for (step, tally) in pipeline.iter().zip(&oldest_ready) {
            family.sample(&[step.name().as_str()], tally.quietest.map_or(0.0, seconds));
        }
        let runs = self.open_runs_of(&pipeline).await?;
        let mut family = OLDEST_WORKING_AGE.write(&mut out);
        for step in &pipeline {
            let oldest = runs.iter().filter(|run| run.component == *step.name()).map(|run| run.started_at).min();
            family.sample(&[step.name().as_str()], oldest.map_or(0.0, seconds));
        }
        let mut family = LAST_PASS_AGE.write(&mut out);
        for step in &pipeline {
            family.sample(&[step.name().as_str()], seconds(last_seen(&step.registered)));
        }
        // Each component is silent by one rule; its series says which (see `SilenceRule`).
        let rules: Vec<SilenceRule> = pipeline.iter().map(|step| SilenceRule::of(&step.registered, defaults)).collect();
        let mut family = SILENT_AFTER.write(&mut out);
        for (step, rule) in pipeline.iter().zip(&rules) {
            if let SilenceRule::After(after) = rule {
                family.sample(&[step.name().as_str()], after.as_secs_f64());
            }
        }
        let mut family = MISSED_PASSES.write(&mut out);
        for (step, rule) in pipeline.iter().zip(&rules) {
            if let SilenceRule::MissedPasses { schedule, .. } = rule {
                let missed = schedule.missed_since(last_seen(&step.registered), now, MISSED_PASSES_CAP);
                family.sample(&[step.name().as_str()], missed as f64);
            }
        }
        // Sources register deliveries rather than work on batches: they have no results.
        let workers: Vec<_> = pipeline.iter().filter(|step| !step.descriptor().source).collect();
        type Window = fn(&WorkHistory) -> &WorkTallies;
        let results: [(&Metric, Window); 2] =
            [(&RESULTS_TOTAL, |work| &work.total), (&RESULTS_LAST_HOUR, |work| &work.last_hour)];
        for (metric, window) in results {
            let mut family = metric.write(&mut out);
            for step in &workers {
                for result in WorkResult::ALL {
                    let count = window(&step.registered.work).get(result).results;
                    family.sample(&[step.name().as_str(), result.as_str()], count as f64);
                }
            }
        }
        let mut family = WORK_DURATION.write(&mut out);
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
        let mut family = WORK_DURATION_LAST_HOUR.write(&mut out);
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
        let mut family = MAX_RUNTIME.write(&mut out);
        for step in &pipeline {
            family.sample(&[step.name().as_str()], step.descriptor().max_runtime.as_secs_f64());
        }
        let steering = store.steering().await?;
        let mut family = HELD.write(&mut out);
        for step in &pipeline {
            family.sample(&[step.name().as_str()], f64::from(u8::from(steering.hold_of(step.name()).is_some())));
        }
        let mut family = CIRCUIT_OPEN.write(&mut out);
        for step in pipeline.iter().filter(|step| step.descriptor().break_after.is_some()) {
            let open = steering.components.get(step.name()).is_some_and(|hold| hold.kind == HoldKind::Circuit);
            family.sample(&[step.name().as_str()], f64::from(u8::from(open)));
        }
        let mut family = BREAKER_FAILURES.write(&mut out);
        for step in pipeline.iter().filter(|step| step.descriptor().break_after.is_some()) {
            let count = steering.breakers.get(step.name()).map_or(0, |breaker| breaker.consecutive);
            family.sample(&[step.name().as_str()], f64::from(count));
        }
        // Every open run of a component that declares a pool holds one of its slots; every
        // batch ready for it waits for a pass and a slot.
        let mut pools: BTreeMap<&PoolName, PoolTally> = BTreeMap::new();
        for (name, pool) in &steering.pools {
            pools.entry(name).or_default().0 = f64::from(pool.size);
        }
        for (step, tally) in pipeline.iter().zip(&oldest_ready) {
            let running = runs.iter().filter(|run| run.component == *step.name()).count() as f64;
            for pool in &step.descriptor().pools {
                let entry = pools.entry(pool).or_default();
                entry.1 += running;
                entry.2 += tally.count as f64;
            }
        }
        for (metric, which) in [(&POOL_SIZE, 0), (&POOL_IN_USE, 1), (&POOL_WAITING, 2)] {
            let mut family = metric.write(&mut out);
            for (name, pool) in &pools {
                family.sample(&[name.as_str()], [pool.0, pool.1, pool.2][which]);
            }
        }
        let index_seq = index.catch_up().await?.cursor();
        let head = store.head().await?;
        STORE_HEAD.write(&mut out).sample(&[], head.0 as f64);
        INDEX_LAG.write(&mut out).sample(&[], head.0.saturating_sub(index_seq.0).max(0) as f64);
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use autocomp_framework::config::Backends;
    use autocomp_model::{
        Agent, BatchId, BatchType, ComponentDescriptor, ComponentName, EventType, NewBatch, NewEvent, Outcome,
        PassOutcome, PassPhase, PassRecord, RunHolder, Schedule, Trigger, WorkDone,
    };

    use super::*;

    /// Registers `name` as having ended a pass that reported `work`.
    async fn register(
        store: &dyn autocomp_store::ObjectStore,
        name: &str,
        event_type: &str,
        requires: &str,
        tune: impl FnOnce(&mut ComponentDescriptor),
        work: Vec<WorkDone>,
    ) {
        let own = EventType::new(event_type).unwrap();
        let mut descriptor = ComponentDescriptor {
            name: ComponentName::new(name).unwrap(),
            version: "1.0.0".into(),
            event_type: own.clone(),
            trigger: Trigger::builder().requires(requires).blocked_by(event_type).build(),
            max_attempts: 3,
            retry_backoff: Duration::from_secs(300),
            queue_size: 10,
            max_runtime: Duration::from_secs(3600),
            source: false,
            overdue_after: None,
            silent_after: None,
            schedule: None,
            manual: false,
            pools: Vec::new(),
            break_after: None,
            result_schema: None,
            reads: Vec::new(),
        };
        tune(&mut descriptor);
        let phase = PassPhase::Ended { outcome: PassOutcome::Ok, summary: String::new(), duration_ms: 1, work };
        store.record_pass(PassRecord { descriptor, host: "host1".into(), phase }).await.unwrap();
    }

    fn done(result: WorkResult, duration_ms: u64) -> WorkDone {
        WorkDone { result, duration_ms }
    }

    /// The value of each series that depends on the wall clock, replaced.
    fn without_ages(text: &str) -> String {
        let lines = text.lines().map(|line| match line.rsplit_once(' ') {
            Some((series, _)) if !line.starts_with('#') && series.contains("_age_seconds") => format!("{series} AGE"),
            _ => line.to_owned(),
        });
        lines.map(|line| line + "\n").collect()
    }

    /// Every family, each kind of sample and label, both silence rules, sources
    /// without results: the text for one fixed registry and set of batches.
    #[tokio::test]
    async fn the_text_for_a_fixed_pipeline_is_pinned() {
        let dir = tempfile::tempdir().unwrap();
        let store_url = format!("sqlite://{}", dir.path().join("store.db").display());
        let index_url = format!("local:{}", dir.path().join("index").display());
        let backends = Backends { store: Some(store_url), index: Some(index_url), locks: None };
        let operator = Operator::new(dir.path(), backends, Some("tester".into())).unwrap();
        let store = operator.store().await.unwrap();
        let silent = |d: &mut ComponentDescriptor| {
            d.source = true;
            d.silent_after = Some(Duration::from_secs(600));
        };
        register(store.as_ref(), "trigger", "Data_Received", "Delivered", silent, vec![]).await;
        let yearly = |d: &mut ComponentDescriptor| {
            d.schedule = Some(Schedule::parse("0 0 1 1 *").unwrap());
            d.max_runtime = Duration::from_millis(1500);
        };
        let work = vec![
            done(WorkResult::Success, 3),
            done(WorkResult::Success, 40),
            done(WorkResult::Failure, 700),
            done(WorkResult::Transient, 5_000_000),
        ];
        register(store.as_ref(), "checker", "Checked", "Data_Received", yearly, work).await;
        register(store.as_ref(), "auditor", "Audited", "Checked", |_| {}, vec![]).await;

        let agent = Agent::new("test").unwrap();
        for (batch, events) in [
            ("B1", &[("Data_Received", Outcome::Success)][..]),
            ("B2", &[("Data_Received", Outcome::Success), ("Checked", Outcome::Failure)]),
            ("B3", &[("Data_Received", Outcome::Success), ("Checked", Outcome::Success)]),
            ("B4", &[("Data_Received", Outcome::Success)]),
        ] {
            let batch = BatchId::new(batch).unwrap();
            store.create_batch(NewBatch::new(batch.clone(), BatchType::new("RoundTrip").unwrap())).await.unwrap();
            for (event_type, outcome) in events {
                let event = NewEvent::new(EventType::new(*event_type).unwrap(), *outcome, agent.clone());
                store.append_event(&batch, event).await.unwrap();
            }
        }
        let holder = RunHolder { agent: Agent::new("checker").unwrap(), host: "host1".into(), pid: 7, claim_key: None };
        store.claim(&BatchId::new("B4").unwrap(), &ComponentName::new("checker").unwrap(), &holder).await.unwrap();

        let text = operator.metrics(&AlertDefaults::default()).await.unwrap();
        assert_eq!(without_ages(&text), PINNED, "{text}");
    }

    const PINNED: &str = r#"# HELP autocomp_batches Batches per component and state.
# TYPE autocomp_batches gauge
autocomp_batches{component="trigger",state="ready"} 0
autocomp_batches{component="trigger",state="person"} 0
autocomp_batches{component="trigger",state="waiting"} 0
autocomp_batches{component="trigger",state="working"} 0
autocomp_batches{component="trigger",state="retrying"} 0
autocomp_batches{component="trigger",state="failed"} 0
autocomp_batches{component="trigger",state="stale"} 0
autocomp_batches{component="trigger",state="skipped"} 0
autocomp_batches{component="trigger",state="success"} 4
autocomp_batches{component="checker",state="ready"} 1
autocomp_batches{component="checker",state="person"} 0
autocomp_batches{component="checker",state="waiting"} 0
autocomp_batches{component="checker",state="working"} 1
autocomp_batches{component="checker",state="retrying"} 0
autocomp_batches{component="checker",state="failed"} 1
autocomp_batches{component="checker",state="stale"} 0
autocomp_batches{component="checker",state="skipped"} 0
autocomp_batches{component="checker",state="success"} 1
autocomp_batches{component="auditor",state="ready"} 1
autocomp_batches{component="auditor",state="person"} 0
autocomp_batches{component="auditor",state="waiting"} 3
autocomp_batches{component="auditor",state="working"} 0
autocomp_batches{component="auditor",state="retrying"} 0
autocomp_batches{component="auditor",state="failed"} 0
autocomp_batches{component="auditor",state="stale"} 0
autocomp_batches{component="auditor",state="skipped"} 0
autocomp_batches{component="auditor",state="success"} 0
# HELP autocomp_batches_overdue Batches ready for a component longer than its overdue_after (monitor default otherwise).
# TYPE autocomp_batches_overdue gauge
autocomp_batches_overdue{component="trigger"} 0
autocomp_batches_overdue{component="checker"} 0
autocomp_batches_overdue{component="auditor"} 0
# HELP autocomp_oldest_ready_age_seconds How long the batch ready the longest has been ready (since its last activity); 0 when none is.
# TYPE autocomp_oldest_ready_age_seconds gauge
autocomp_oldest_ready_age_seconds{component="trigger"} AGE
autocomp_oldest_ready_age_seconds{component="checker"} AGE
autocomp_oldest_ready_age_seconds{component="auditor"} AGE
# HELP autocomp_oldest_working_age_seconds How long the oldest open run of a component has been running; 0 when none is.
# TYPE autocomp_oldest_working_age_seconds gauge
autocomp_oldest_working_age_seconds{component="trigger"} AGE
autocomp_oldest_working_age_seconds{component="checker"} AGE
autocomp_oldest_working_age_seconds{component="auditor"} AGE
# HELP autocomp_last_pass_age_seconds Seconds since any host last reported a pass of the component.
# TYPE autocomp_last_pass_age_seconds gauge
autocomp_last_pass_age_seconds{component="trigger"} AGE
autocomp_last_pass_age_seconds{component="checker"} AGE
autocomp_last_pass_age_seconds{component="auditor"} AGE
# HELP autocomp_silent_after_seconds No pass on any host for this long makes the component silent (components silent by time, not schedule).
# TYPE autocomp_silent_after_seconds gauge
autocomp_silent_after_seconds{component="trigger"} 600
autocomp_silent_after_seconds{component="auditor"} 3600
# HELP autocomp_missed_passes Passes of its crontab schedule since any host last ran the component (components silent by schedule).
# TYPE autocomp_missed_passes gauge
autocomp_missed_passes{component="checker"} 0
# HELP autocomp_results_total Results recorded by a component's passes since it was registered, by outcome.
# TYPE autocomp_results_total counter
autocomp_results_total{component="checker",outcome="success"} 2
autocomp_results_total{component="checker",outcome="failure"} 1
autocomp_results_total{component="checker",outcome="transient"} 1
autocomp_results_total{component="auditor",outcome="success"} 0
autocomp_results_total{component="auditor",outcome="failure"} 0
autocomp_results_total{component="auditor",outcome="transient"} 0
# HELP autocomp_results_last_hour Results recorded by a component's passes in the last hour of store time, by outcome.
# TYPE autocomp_results_last_hour gauge
autocomp_results_last_hour{component="checker",outcome="success"} 2
autocomp_results_last_hour{component="checker",outcome="failure"} 1
autocomp_results_last_hour{component="checker",outcome="transient"} 1
autocomp_results_last_hour{component="auditor",outcome="success"} 0
autocomp_results_last_hour{component="auditor",outcome="failure"} 0
autocomp_results_last_hour{component="auditor",outcome="transient"} 0
# HELP autocomp_work_duration_seconds How long a component's work on a batch took, every outcome, since it was registered.
# TYPE autocomp_work_duration_seconds histogram
autocomp_work_duration_seconds_bucket{component="checker",le="0.001"} 0
autocomp_work_duration_seconds_bucket{component="checker",le="0.002"} 0
autocomp_work_duration_seconds_bucket{component="checker",le="0.005"} 1
autocomp_work_duration_seconds_bucket{component="checker",le="0.01"} 1
autocomp_work_duration_seconds_bucket{component="checker",le="0.025"} 1
autocomp_work_duration_seconds_bucket{component="checker",le="0.05"} 2
autocomp_work_duration_seconds_bucket{component="checker",le="0.1"} 2
autocomp_work_duration_seconds_bucket{component="checker",le="0.25"} 2
autocomp_work_duration_seconds_bucket{component="checker",le="0.5"} 2
autocomp_work_duration_seconds_bucket{component="checker",le="1"} 3
autocomp_work_duration_seconds_bucket{component="checker",le="2.5"} 3
autocomp_work_duration_seconds_bucket{component="checker",le="5"} 3
autocomp_work_duration_seconds_bucket{component="checker",le="10"} 3
autocomp_work_duration_seconds_bucket{component="checker",le="30"} 3
autocomp_work_duration_seconds_bucket{component="checker",le="60"} 3
autocomp_work_duration_seconds_bucket{component="checker",le="120"} 3
autocomp_work_duration_seconds_bucket{component="checker",le="300"} 3
autocomp_work_duration_seconds_bucket{component="checker",le="600"} 3
autocomp_work_duration_seconds_bucket{component="checker",le="1800"} 3
autocomp_work_duration_seconds_bucket{component="checker",le="3600"} 3
autocomp_work_duration_seconds_bucket{component="checker",le="+Inf"} 4
autocomp_work_duration_seconds_sum{component="checker"} 5000.743
autocomp_work_duration_seconds_count{component="checker"} 4
autocomp_work_duration_seconds_bucket{component="auditor",le="0.001"} 0
autocomp_work_duration_seconds_bucket{component="auditor",le="0.002"} 0
autocomp_work_duration_seconds_bucket{component="auditor",le="0.005"} 0
autocomp_work_duration_seconds_bucket{component="auditor",le="0.01"} 0
autocomp_work_duration_seconds_bucket{component="auditor",le="0.025"} 0
autocomp_work_duration_seconds_bucket{component="auditor",le="0.05"} 0
autocomp_work_duration_seconds_bucket{component="auditor",le="0.1"} 0
autocomp_work_duration_seconds_bucket{component="auditor",le="0.25"} 0
autocomp_work_duration_seconds_bucket{component="auditor",le="0.5"} 0
autocomp_work_duration_seconds_bucket{component="auditor",le="1"} 0
autocomp_work_duration_seconds_bucket{component="auditor",le="2.5"} 0
autocomp_work_duration_seconds_bucket{component="auditor",le="5"} 0
autocomp_work_duration_seconds_bucket{component="auditor",le="10"} 0
autocomp_work_duration_seconds_bucket{component="auditor",le="30"} 0
autocomp_work_duration_seconds_bucket{component="auditor",le="60"} 0
autocomp_work_duration_seconds_bucket{component="auditor",le="120"} 0
autocomp_work_duration_seconds_bucket{component="auditor",le="300"} 0
autocomp_work_duration_seconds_bucket{component="auditor",le="600"} 0
autocomp_work_duration_seconds_bucket{component="auditor",le="1800"} 0
autocomp_work_duration_seconds_bucket{component="auditor",le="3600"} 0
autocomp_work_duration_seconds_bucket{component="auditor",le="+Inf"} 0
autocomp_work_duration_seconds_sum{component="auditor"} 0
autocomp_work_duration_seconds_count{component="auditor"} 0
# HELP autocomp_work_duration_last_hour_seconds A component's work durations over the last hour of store time: p50 and p95 (estimated within their histogram bucket; absent without results), sum and count.
# TYPE autocomp_work_duration_last_hour_seconds summary
autocomp_work_duration_last_hour_seconds{component="checker",quantile="0.5"} 0.05
autocomp_work_duration_last_hour_seconds{component="checker",quantile="0.95"} 3600
autocomp_work_duration_last_hour_seconds_sum{component="checker"} 5000.743
autocomp_work_duration_last_hour_seconds_count{component="checker"} 4
autocomp_work_duration_last_hour_seconds_sum{component="auditor"} 0
autocomp_work_duration_last_hour_seconds_count{component="auditor"} 0
# HELP autocomp_max_runtime_seconds A component's max_runtime: a run older than this is overdue.
# TYPE autocomp_max_runtime_seconds gauge
autocomp_max_runtime_seconds{component="trigger"} 3600
autocomp_max_runtime_seconds{component="checker"} 1.5
autocomp_max_runtime_seconds{component="auditor"} 3600
# HELP autocomp_component_held 1 while the component claims no new work: paused, draining or its circuit open (its own hold or the whole pipeline's).
# TYPE autocomp_component_held gauge
autocomp_component_held{component="trigger"} 0
autocomp_component_held{component="checker"} 0
autocomp_component_held{component="auditor"} 0
# HELP autocomp_circuit_open 1 while the component's circuit breaker holds it (components with break_after).
# TYPE autocomp_circuit_open gauge
# HELP autocomp_breaker_consecutive_failures Consecutive permanent failures on distinct batches the circuit breaker counts (components with break_after).
# TYPE autocomp_breaker_consecutive_failures gauge
# HELP autocomp_pool_size A resource pool's size: batches' work it takes at once.
# TYPE autocomp_pool_size gauge
# HELP autocomp_pool_slots_in_use Open runs of the components that declare the pool: each holds one of its slots.
# TYPE autocomp_pool_slots_in_use gauge
# HELP autocomp_pool_waiting Batches ready for the components that declare the pool: each waits for a pass and a free slot.
# TYPE autocomp_pool_waiting gauge
# HELP autocomp_store_head The store's newest change (seq).
# TYPE autocomp_store_head gauge
autocomp_store_head 11
# HELP autocomp_index_lag_changes Store changes the batch index is behind.
# TYPE autocomp_index_lag_changes gauge
autocomp_index_lag_changes 0
"#;
}
