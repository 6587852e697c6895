//! Pipeline metrics in the Prometheus text format, for the monitor's `/metrics` and for
//! `autocomp metrics` (node_exporter's textfile collector on hosts without a monitor): batches
//! per component and state, how long the oldest ready and working batches have waited, time
//! since each component's last pass and what silence means for it, results per outcome and
//! work durations (from the passes' reports the registry tallies), index lag. Counted by the
//! index and read from the registry; of the store only its open runs are read.

use std::fmt::Write as _;

use autocomp_model::{ComponentState, DURATION_BOUNDS_MS, Selection, Timestamp, WorkHistory, WorkResult, WorkTallies};

use super::alerts::{AlertDefaults, MISSED_PASSES_CAP, SilenceRule, last_seen, ready_too_long};
use super::{Operator, OperatorError};

/// Escapes a label value (backslash, quote, newline), as the text format requires.
fn label(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// One metric family: its help and type lines, then its samples.
struct Family<'a> {
    out: &'a mut String,
}

impl<'a> Family<'a> {
    fn gauge(out: &'a mut String, name: &str, help: &str) -> Family<'a> {
        Self::new(out, name, help, "gauge")
    }

    fn new(out: &'a mut String, name: &str, help: &str, kind: &str) -> Family<'a> {
        writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}").ok();
        Family { out }
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        let labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{}\"", label(v))).collect();
        let labels = if labels.is_empty() { String::new() } else { format!("{{{}}}", labels.join(",")) };
        writeln!(self.out, "{name}{labels} {value}").ok();
    }
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
            selections.extend(ComponentState::ALL.iter().map(|s| Selection::component_state(step.descriptor(), *s)));
            selections.push(ready_too_long(step, defaults.ready_after));
        }
        let counts = index.tally(&selections, false).await?;
        let ready: Vec<Selection> =
            pipeline.iter().map(|s| Selection::component_state(s.descriptor(), ComponentState::Ready)).collect();
        let oldest_ready = index.tally(&ready, true).await?;

        let mut out = String::new();
        let per_step = ComponentState::ALL.len() + 1;
        let mut family = Family::gauge(&mut out, "autocomp_batches", "Batches per component and state.");
        for (i, step) in pipeline.iter().enumerate() {
            for (state, tally) in ComponentState::ALL.iter().zip(&counts[i * per_step..]) {
                family.sample(
                    "autocomp_batches",
                    &[("component", step.name().as_str()), ("state", state.as_str())],
                    tally.count as f64,
                );
            }
        }
        let mut family = Family::gauge(
            &mut out,
            "autocomp_batches_overdue",
            "Batches ready for a component longer than its overdue_after (monitor default otherwise).",
        );
        for (i, step) in pipeline.iter().enumerate() {
            let overdue = counts[(i + 1) * per_step - 1].count as f64;
            family.sample("autocomp_batches_overdue", &[("component", step.name().as_str())], overdue);
        }
        let mut family = Family::gauge(
            &mut out,
            "autocomp_oldest_ready_age_seconds",
            "How long the batch ready the longest has been ready (since its last activity); 0 when none is.",
        );
        for (step, tally) in pipeline.iter().zip(&oldest_ready) {
            let age = tally.quietest.map_or(0.0, seconds);
            family.sample("autocomp_oldest_ready_age_seconds", &[("component", step.name().as_str())], age);
        }
        let runs = self.open_runs_of(&pipeline).await?;
        let working_ages: Vec<f64> = pipeline
            .iter()
            .map(|step| {
                let oldest = runs.iter().filter(|run| run.component == *step.name()).map(|run| run.started_at).min();
                oldest.map_or(0.0, seconds)
            })
            .collect();
        let mut family = Family::gauge(
            &mut out,
            "autocomp_oldest_working_age_seconds",
            "How long the oldest open run of a component has been running; 0 when none is.",
        );
        for (step, age) in pipeline.iter().zip(working_ages) {
            family.sample("autocomp_oldest_working_age_seconds", &[("component", step.name().as_str())], age);
        }
        let mut family = Family::gauge(
            &mut out,
            "autocomp_last_pass_age_seconds",
            "Seconds since any host last reported a pass of the component.",
        );
        for step in &pipeline {
            let last = last_seen(&step.registered);
            family.sample("autocomp_last_pass_age_seconds", &[("component", step.name().as_str())], seconds(last));
        }
        // Each component is silent by one rule; its series says which (see `SilenceRule`).
        let rules: Vec<SilenceRule> = pipeline.iter().map(|step| SilenceRule::of(&step.registered, defaults)).collect();
        let mut family = Family::gauge(
            &mut out,
            "autocomp_silent_after_seconds",
            "No pass on any host for this long makes the component silent (components silent by time, not schedule).",
        );
        for (step, rule) in pipeline.iter().zip(&rules) {
            if let SilenceRule::After(after) = rule {
                let name = "autocomp_silent_after_seconds";
                family.sample(name, &[("component", step.name().as_str())], after.as_secs_f64());
            }
        }
        let mut family = Family::gauge(
            &mut out,
            "autocomp_missed_passes",
            "Passes of its crontab schedule since any host last ran the component (components silent by schedule).",
        );
        for (step, rule) in pipeline.iter().zip(&rules) {
            if let SilenceRule::MissedPasses { schedule, .. } = rule {
                let missed = schedule.missed_since(last_seen(&step.registered), now, MISSED_PASSES_CAP);
                family.sample("autocomp_missed_passes", &[("component", step.name().as_str())], missed as f64);
            }
        }
        // Sources register deliveries rather than work on batches: they have no results.
        let workers: Vec<_> = pipeline.iter().filter(|step| !step.descriptor().source).collect();
        type Window = fn(&WorkHistory) -> &WorkTallies;
        let results: [(&str, &str, &str, Window); 2] = [
            (
                "autocomp_results_total",
                "Results recorded by a component's passes since it was registered, by outcome.",
                "counter",
                |work| &work.total,
            ),
            (
                "autocomp_results_last_hour",
                "Results recorded by a component's passes in the last hour of store time, by outcome.",
                "gauge",
                |work| &work.last_hour,
            ),
        ];
        for (name, help, kind, window) in results {
            let mut family = Family::new(&mut out, name, help, kind);
            for step in &workers {
                for result in WorkResult::ALL {
                    let count = window(&step.registered.work).get(result).results;
                    family.sample(
                        name,
                        &[("component", step.name().as_str()), ("outcome", result.as_str())],
                        count as f64,
                    );
                }
            }
        }
        let mut family = Family::new(
            &mut out,
            "autocomp_work_duration_seconds",
            "How long a component's work on a batch took, every outcome, since it was registered.",
            "histogram",
        );
        for step in &workers {
            let all = step.registered.work.total.combined();
            let component = step.name().as_str();
            let mut cumulative = 0;
            for (bound, count) in DURATION_BOUNDS_MS.iter().zip(&all.buckets) {
                cumulative += count;
                let le = (*bound as f64 / 1000.0).to_string();
                family.sample(
                    "autocomp_work_duration_seconds_bucket",
                    &[("component", component), ("le", &le)],
                    cumulative as f64,
                );
            }
            family.sample(
                "autocomp_work_duration_seconds_bucket",
                &[("component", component), ("le", "+Inf")],
                all.results as f64,
            );
            family.sample(
                "autocomp_work_duration_seconds_sum",
                &[("component", component)],
                all.duration_ms_sum as f64 / 1000.0,
            );
            family.sample("autocomp_work_duration_seconds_count", &[("component", component)], all.results as f64);
        }
        let name = "autocomp_work_duration_last_hour_seconds";
        let mut family = Family::new(
            &mut out,
            name,
            "A component's work durations over the last hour of store time: p50 and p95 (estimated within their \
             histogram bucket; absent without results), sum and count.",
            "summary",
        );
        for step in &workers {
            let all = step.registered.work.last_hour.combined();
            let component = step.name().as_str();
            for (quantile, q) in [("0.5", 0.5), ("0.95", 0.95)] {
                if let Some(duration) = all.quantile(q) {
                    family.sample(name, &[("component", component), ("quantile", quantile)], duration.as_secs_f64());
                }
            }
            family.sample(&format!("{name}_sum"), &[("component", component)], all.duration_ms_sum as f64 / 1000.0);
            family.sample(&format!("{name}_count"), &[("component", component)], all.results as f64);
        }
        let mut family = Family::gauge(
            &mut out,
            "autocomp_max_runtime_seconds",
            "A component's max_runtime: a run older than this is overdue.",
        );
        for step in &pipeline {
            let max_runtime = step.descriptor().max_runtime.as_secs_f64();
            family.sample("autocomp_max_runtime_seconds", &[("component", step.name().as_str())], max_runtime);
        }
        let index_seq = index.catch_up().await?.cursor();
        let head = store.head().await?;
        Family::gauge(&mut out, "autocomp_store_head", "The store's newest change (seq).").sample(
            "autocomp_store_head",
            &[],
            head.0 as f64,
        );
        Family::gauge(&mut out, "autocomp_index_lag_changes", "Store changes the batch index is behind.").sample(
            "autocomp_index_lag_changes",
            &[],
            head.0.saturating_sub(index_seq.0).max(0) as f64,
        );
        Ok(out)
    }
}
