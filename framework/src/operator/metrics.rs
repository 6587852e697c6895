//! Pipeline metrics in the Prometheus text format, for the monitor's `/metrics` and for
//! `autocomp metrics` (node_exporter's textfile collector on hosts without a monitor): batches
//! per component and state, how long the oldest ready and working batches have waited, time
//! since each component's last pass, index lag. Counted by the index and read from the
//! registry; of the store only its open runs are read.

use std::fmt::Write as _;

use autocomp_store::{ComponentState, Selection, Timestamp};

use super::alerts::{AlertDefaults, ready_too_long};
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
        writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge").ok();
        Family { out }
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        let labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{}\"", label(v))).collect();
        let labels = if labels.is_empty() { String::new() } else { format!("{{{}}}", labels.join(",")) };
        writeln!(self.out, "{name}{labels} {value}").ok();
    }
}

impl Operator {
    /// The pipeline's metrics as Prometheus text. `defaults` gives the overdue threshold of
    /// components whose config sets none.
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
            let registered = &step.registered;
            let last = registered.hosts.iter().map(|h| h.last_seen).max().unwrap_or(registered.registered_at);
            family.sample("autocomp_last_pass_age_seconds", &[("component", step.name().as_str())], seconds(last));
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
