//! `autocomp alerts`: only what needs a person, one line each, so a cron line mails exactly
//! the news: batches ready for longer than their component's threshold, runs past their
//! `max_runtime`, components no host has run for too long, an index far behind the store.
//! Counts come from the index and the registry; the store is read only for its open runs. The monitor's overdue marks use the same rules (`overdue_runs`).

use std::time::Duration;

use autocomp_store::{Batch, BatchId, ComponentName, ComponentState, RegisteredComponent, Run, Selection, Timestamp};
use serde::Serialize;
use serde_json::json;

use super::views::Format;
use super::{Operator, OperatorError, Step};

/// Thresholds for components whose own config sets none.
#[derive(Debug, Clone)]
pub struct AlertDefaults {
    /// A batch ready longer than this (a component's `overdue_after` wins).
    pub ready_after: Duration,
    /// No pass on any host for this long (a component's `silent_after` wins).
    pub silent_after: Duration,
    /// Store changes the index may be behind.
    pub index_lag: u64,
}

impl Default for AlertDefaults {
    fn default() -> Self {
        Self { ready_after: Duration::from_secs(3600), silent_after: Duration::from_secs(3600), index_lag: 10_000 }
    }
}

/// What needs a person.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Alert {
    /// `count` batches ready for the component longer than `threshold`.
    ReadyTooLong { component: ComponentName, count: u64, oldest_since: Option<Timestamp>, threshold: String },
    /// A run past the component's `max_runtime`.
    WorkingTooLong { component: ComponentName, batch: BatchId, started_at: Timestamp, max_runtime: String },
    /// No pass of the component on any host since `last_seen`.
    Silent { component: ComponentName, last_seen: Timestamp, threshold: String },
    /// The index is `behind` store changes behind.
    IndexLag { behind: u64, index_seq: i64, store_head: i64 },
}

impl Alert {
    /// One line for a person.
    pub fn line(&self, now: Timestamp) -> String {
        let ago = |at: Timestamp| humantime::format_duration(Duration::from_secs(now.since(at).as_secs())).to_string();
        match self {
            Alert::ReadyTooLong { component, count, oldest_since, threshold } => {
                let oldest = oldest_since.map(|at| format!(", the oldest for {}", ago(at))).unwrap_or_default();
                let batches = if *count == 1 { "1 batch" } else { &format!("{count} batches") };
                format!(
                    "{component}: {batches} ready for longer than {threshold}{oldest} \
                     (`autocomp ready --component {component}`)"
                )
            }
            Alert::WorkingTooLong { component, batch, started_at, max_runtime } => format!(
                "{component}: working on {batch} for {}, longer than its max_runtime {max_runtime} \
                 (`autocomp explain {batch} --component {component}`)",
                ago(*started_at)
            ),
            Alert::Silent { component, last_seen, threshold } => format!(
                "{component}: no pass on any host for {} (silent after {threshold}; `autocomp pipeline`)",
                ago(*last_seen)
            ),
            Alert::IndexLag { behind, index_seq, store_head } => format!(
                "index: {behind} changes behind the store (index at seq {index_seq}, store at {store_head}; \
                 is the index service following?)"
            ),
        }
    }
}

/// `autocomp alerts`.
#[derive(Debug, Clone)]
pub struct AlertsView {
    pub alerts: Vec<Alert>,
    pub now: Timestamp,
}

impl AlertsView {
    /// Nothing at all when there is nothing to say (cron mails any output).
    pub fn render(&self, format: Format) -> String {
        match format {
            Format::Text => self.alerts.iter().map(|a| self.line(a) + "\n").collect(),
            Format::Json if self.alerts.is_empty() => String::new(),
            Format::Json => {
                let alerts: Vec<_> = self
                    .alerts
                    .iter()
                    .map(|alert| {
                        let mut value = json!(alert);
                        value["message"] = json!(self.line(alert));
                        value
                    })
                    .collect();
                format!("{:#}\n", json!(alerts))
            }
        }
    }

    fn line(&self, alert: &Alert) -> String {
        alert.line(self.now)
    }
}

fn text(duration: Duration) -> String {
    humantime::format_duration(duration).to_string()
}

/// How long a component may go without a pass on any host.
pub fn silent_after(component: &RegisteredComponent, defaults: &AlertDefaults) -> Duration {
    component.descriptor.silent_after.unwrap_or(defaults.silent_after)
}

/// How long a batch may be ready for the component.
pub fn overdue_after(step: &Step, default: Duration) -> Duration {
    step.descriptor().overdue_after.unwrap_or(default)
}

/// Whether the component is in `batch` overdue: ready longer than its threshold (by the
/// batch's last activity, which is what made it ready), or working longer than its
/// `max_runtime` (by its open run), measured by the store's clock when the batch was read.
pub fn is_overdue(step: &Step, batch: &Batch, ready_after: Duration) -> bool {
    match step.state_of(batch) {
        ComponentState::Ready => batch.as_of.since(batch.last_activity_at()) >= overdue_after(step, ready_after),
        ComponentState::Working => batch
            .open_run(step.name())
            .is_some_and(|run| batch.as_of.since(run.started_at) >= step.descriptor().max_runtime),
        _ => false,
    }
}

/// The batches ready for `step` longer than its threshold, as an index selection.
pub fn ready_too_long(step: &Step, ready_after: Duration) -> Selection {
    Selection::component_state(step.descriptor(), ComponentState::Ready)
        .and(Selection::QuietFor(overdue_after(step, ready_after)))
}

impl Operator {
    /// The open runs of `steps`' components: one indexed read per component of what is
    /// being worked on now (never a read of every batch).
    pub async fn open_runs_of(&self, steps: &[Step]) -> Result<Vec<Run>, OperatorError> {
        let store = self.store().await?;
        let mut runs = Vec::new();
        for step in steps {
            runs.extend(store.open_runs(Some(step.name())).await?);
        }
        Ok(runs)
    }

    /// The open runs of `steps` older than their component's `max_runtime`.
    pub async fn overdue_runs(&self, steps: &[Step]) -> Result<Vec<Run>, OperatorError> {
        let now = Timestamp::now();
        let runs = self.open_runs_of(steps).await?;
        Ok(runs
            .into_iter()
            .filter(|run| {
                let step = steps.iter().find(|step| *step.name() == run.component);
                step.is_some_and(|step| now.since(run.started_at) >= step.descriptor().max_runtime)
            })
            .collect())
    }

    /// `autocomp alerts`: everything that needs a person now, in pipeline order.
    pub async fn alerts(&self, defaults: &AlertDefaults) -> Result<AlertsView, OperatorError> {
        let store = self.store().await?;
        let pipeline = self.pipeline(store.as_ref()).await?;
        let index = self.index(&store)?;
        let now = Timestamp::now();
        let mut alerts = Vec::new();

        let waiting: Vec<Selection> = pipeline.iter().map(|step| ready_too_long(step, defaults.ready_after)).collect();
        let tallies = index.tally(&waiting, true).await?;
        let overdue = self.overdue_runs(&pipeline).await?;
        for (step, tally) in pipeline.iter().zip(tallies) {
            if tally.count > 0 {
                alerts.push(Alert::ReadyTooLong {
                    component: step.name().clone(),
                    count: tally.count,
                    oldest_since: tally.quietest,
                    threshold: text(overdue_after(step, defaults.ready_after)),
                });
            }
            for run in overdue.iter().filter(|run| run.component == *step.name()).cloned() {
                alerts.push(Alert::WorkingTooLong {
                    component: step.name().clone(),
                    batch: run.batch_id,
                    started_at: run.started_at,
                    max_runtime: text(step.descriptor().max_runtime),
                });
            }
            let registered = &step.registered;
            let last_seen = registered.hosts.iter().map(|h| h.last_seen).max().unwrap_or(registered.registered_at);
            let threshold = silent_after(registered, defaults);
            if now.since(last_seen) >= threshold {
                alerts.push(Alert::Silent { component: step.name().clone(), last_seen, threshold: text(threshold) });
            }
        }

        let index_seq = index.catch_up().await?.cursor();
        let store_head = store.head().await?;
        let behind = u64::try_from(store_head.0.saturating_sub(index_seq.0)).unwrap_or_default();
        if behind > defaults.index_lag {
            alerts.push(Alert::IndexLag { behind, index_seq: index_seq.0, store_head: store_head.0 });
        }
        Ok(AlertsView { alerts, now })
    }
}
