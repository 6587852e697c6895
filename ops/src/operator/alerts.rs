//! `autocomp alerts`: only what needs a person, one line each, so a cron line mails exactly
//! the news: components whose passes refuse to start (a broken contract), failed batches with
//! their most frequent reasons, batches ready for longer than
//! their component's threshold, runs past their
//! `max_runtime`, components no host has run for too long, an index far behind the store,
//! lock nodes autocomp did not make (when a locks backend is configured), components paused
//! too long or with their circuit open. Counts come from
//! the index and the registry; the store is read only for its open runs.
//! The monitor's overdue marks and the metrics use the same rules (`is_overdue`,
//! `overdue_runs`, `SilenceRule`).

use std::time::Duration;

use autocomp_model::{
    Batch, BatchId, ComponentName, ComponentState, Hold, HoldKind, RegisteredComponent, Run, Schedule, Selection,
    Timestamp,
};
use serde::Serialize;

use autocomp_framework::exit::RunError;

use super::failures::{FAILURES_READ, group_reasons};
use super::views::{Format, json_document};
use super::{Operator, OperatorError, Step};

/// Thresholds for components whose own config sets none.
#[derive(Debug, Clone)]
pub struct AlertDefaults {
    /// A batch ready longer than this (a component's `overdue_after` wins).
    pub ready_after: Duration,
    /// No pass on any host for this long, for components with neither `silent_after` nor a
    /// `schedule` in their config.
    pub silent_after: Duration,
    /// Scheduled passes a component with a `schedule` (and no `silent_after`) may miss.
    pub silent_periods: u32,
    /// Store changes the index may be behind.
    pub index_lag: u64,
    /// A component (or the pipeline) paused or draining longer than this. An open circuit
    /// is news at once.
    pub paused_after: Duration,
}

impl Default for AlertDefaults {
    fn default() -> Self {
        Self {
            ready_after: Duration::from_secs(3600),
            silent_after: Duration::from_secs(3600),
            silent_periods: 3,
            index_lag: 10_000,
            paused_after: Duration::from_secs(4 * 3600),
        }
    }
}

/// When a component counts as silent: its own `silent_after`, else missing `periods`
/// passes of its `schedule`, else the reader's default `silent_after`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SilenceRule {
    After(Duration),
    MissedPasses { schedule: Box<Schedule>, periods: u32 },
}

/// Most missed passes counted (a component stopped for a year on `* * * * *` is not
/// worth iterating a year of minutes for).
pub const MISSED_PASSES_CAP: u32 = 1_000;

impl SilenceRule {
    pub fn of(component: &RegisteredComponent, defaults: &AlertDefaults) -> Self {
        let descriptor = &component.descriptor;
        match (descriptor.silent_after, &descriptor.schedule) {
            (Some(after), _) => SilenceRule::After(after),
            (None, Some(schedule)) => SilenceRule::MissedPasses {
                schedule: Box::new(schedule.clone()),
                periods: defaults.silent_periods.max(1),
            },
            (None, None) => SilenceRule::After(defaults.silent_after),
        }
    }

    /// Whether a component last seen at `last_seen` is silent at `now`.
    pub fn is_silent(&self, last_seen: Timestamp, now: Timestamp) -> bool {
        match self {
            SilenceRule::After(after) => now.since(last_seen) >= *after,
            SilenceRule::MissedPasses { schedule, periods } => {
                schedule.missed_since(last_seen, now, MISSED_PASSES_CAP) >= *periods
            }
        }
    }

    /// The threshold, for a person: `1h`, or `3 missed passes of its schedule '*/5 * * * *'`.
    pub fn describe(&self) -> String {
        match self {
            SilenceRule::After(after) => text(*after),
            SilenceRule::MissedPasses { schedule, periods } => {
                format!("{periods} missed passes of its schedule '{schedule}'")
            }
        }
    }
}

/// When any host last reported a pass of the component (its registration if none has).
pub fn last_seen(component: &RegisteredComponent) -> Timestamp {
    component.last_seen().unwrap_or(component.registered_at)
}

/// What needs a person.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Alert {
    /// Every pass of the component stops before any work: a result it reads is no longer
    /// published as it expects (`reason` names the field, both steps and the fix).
    ContractBroken { component: ComponentName, reason: String },
    /// The component's last pass on `host` did not start (exit 2): its configuration refused
    /// (`reason`, as the registry holds it: a misspelt key, a setting refused).
    PassRefused { component: ComponentName, host: String, reason: String },
    /// `count` batches ready for the component longer than `threshold`.
    ReadyTooLong { component: ComponentName, count: u64, oldest_since: Option<Timestamp>, threshold: String },
    /// `count` batches failed at the component (permanently: a rerun tries again), with the
    /// most frequent reasons among the first `FAILURES_READ` of them.
    Failed { component: ComponentName, count: u64, reasons: Vec<FailedReason> },
    /// A run past the component's `max_runtime`.
    WorkingTooLong { component: ComponentName, batch: BatchId, started_at: Timestamp, max_runtime: String },
    /// No pass of the component on any host since `last_seen`.
    Silent { component: ComponentName, last_seen: Timestamp, threshold: String },
    /// The index is `behind` store changes behind.
    IndexLag { behind: u64, index_seq: i64, store_head: i64 },
    /// Something at a lock path (or in the lock tree) that no lock service made: no pass
    /// takes that lock while it is there, and someone else wrote it.
    ForeignLock { path: String, reason: String },
    /// A component (`None`: the whole pipeline) held longer than `paused_after`, or its
    /// circuit open (at once).
    Held { component: Option<ComponentName>, hold: Hold },
}

/// One of the most frequent reasons of a component's failures, and how many of those read
/// gave it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FailedReason {
    /// `None`: the failure said nothing.
    pub reason: Option<String>,
    pub count: usize,
}

/// The most reasons an alert line names.
const ALERT_REASONS: usize = 3;

impl Alert {
    /// One line for a person.
    pub fn line(&self, now: Timestamp) -> String {
        let ago = |at: Timestamp| humantime::format_duration(Duration::from_secs(now.since(at).as_secs())).to_string();
        match self {
            Alert::ContractBroken { component, reason } => format!(
                "{component}: every pass stops before any work (exit 2), {}",
                autocomp_toolkit::terminal::one_line(
                    reason.strip_prefix(autocomp_model::NOT_STARTED).unwrap_or(reason)
                )
            ),
            Alert::PassRefused { component, host, reason } => format!(
                "{component}: its last pass on {host} did not start (exit 2): {}",
                autocomp_toolkit::terminal::one_line(reason)
            ),
            Alert::ReadyTooLong { component, count, oldest_since, threshold } => {
                let oldest = oldest_since.map(|at| format!(", the oldest for {}", ago(at))).unwrap_or_default();
                let batches = if *count == 1 { "1 batch" } else { &format!("{count} batches") };
                format!(
                    "{component}: {batches} ready for longer than {threshold}{oldest} \
                     (`autocomp ready --component {component}`)"
                )
            }
            Alert::Failed { component, count, reasons } => {
                let batches = if *count == 1 { "1 batch" } else { &format!("{count} batches") };
                let reasons: Vec<String> = reasons
                    .iter()
                    .map(|r| {
                        let reason = r.reason.as_deref().map(autocomp_toolkit::terminal::one_line);
                        format!("{}x {}", r.count, reason.as_deref().unwrap_or("(no reason given)"))
                    })
                    .collect();
                let reasons = if reasons.is_empty() { String::new() } else { format!(": {}", reasons.join("; ")) };
                format!("{component}: {batches} failed{reasons} (`autocomp failures --component {component}`)")
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
            Alert::ForeignLock { path, reason } => format!(
                "locks: {path} is not a lock autocomp made: {reason}; no pass takes it while it is there \
                 (`autocomp locks`; delete it once you know who made it)"
            ),
            Alert::Held { component, hold } => {
                let (what, resume) = match component {
                    Some(name) => (name.to_string(), format!("autocomp resume {name}")),
                    None => ("the whole pipeline".to_owned(), "autocomp resume --all".to_owned()),
                };
                let rerun = if hold.kind == HoldKind::Circuit { " --rerun-failed" } else { "" };
                format!(
                    "{what}: {} for {} by {}: {} (`{resume}{rerun} --reason ...`)",
                    hold.kind.as_str(),
                    ago(hold.since),
                    hold.by,
                    autocomp_toolkit::terminal::one_line(&hold.reason)
                )
            }
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
                let lines: Vec<AlertLine> =
                    self.alerts.iter().map(|alert| AlertLine { alert, message: self.line(alert) }).collect();
                json_document(&serde_json::to_value(lines).expect("alerts serialize to JSON"))
            }
        }
    }

    fn line(&self, alert: &Alert) -> String {
        alert.line(self.now)
    }
}

/// An alert as `--format json` prints it: its fields and its line.
#[derive(Serialize)]
struct AlertLine<'a> {
    #[serde(flatten)]
    alert: &'a Alert,
    message: String,
}

fn text(duration: Duration) -> String {
    humantime::format_duration(duration).to_string()
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
        ComponentState::Ready | ComponentState::Person => {
            batch.as_of.since(batch.last_activity_at()) >= overdue_after(step, ready_after)
        }
        ComponentState::Working => batch
            .open_run(step.name())
            .is_some_and(|run| batch.as_of.since(run.started_at) >= step.descriptor().max_runtime),
        _ => false,
    }
}

/// Whether `run` of `step` has been working longer than its `max_runtime` at `now`.
pub fn run_overdue(step: &Step, run: &Run, now: Timestamp) -> bool {
    now.since(run.started_at) >= step.descriptor().max_runtime
}

/// Whether a pause or drain has held longer than `after` at `now` (an open circuit is news
/// at once, by its own rule).
pub fn held_too_long(hold: &Hold, now: Timestamp, after: Duration) -> bool {
    hold.kind != HoldKind::Circuit && now.since(hold.since) >= after
}

/// The batches ready for `step` longer than its threshold, as an index selection.
pub fn ready_too_long(step: &Step, ready_after: Duration) -> Selection {
    Selection::component_state(step.descriptor(), ready_state(step))
        .and(Selection::QuietFor(overdue_after(step, ready_after)))
}

/// The state of a batch that waits for the step to do it: `person` at a human step, else
/// `ready`.
pub fn ready_state(step: &Step) -> ComponentState {
    if step.descriptor().manual { ComponentState::Person } else { ComponentState::Ready }
}

impl Step {
    /// The component's batches in each state (`ComponentState::ALL` order), then those ready
    /// longer than its threshold: the per-component tallies of the metrics and the monitor's
    /// overview, `ComponentState::ALL.len() + 1` of them.
    pub fn state_selections(&self, ready_after: Duration) -> impl Iterator<Item = Selection> + '_ {
        let states = ComponentState::ALL.into_iter().map(|state| Selection::component_state(self.descriptor(), state));
        states.chain([ready_too_long(self, ready_after)])
    }
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
                step.is_some_and(|step| run_overdue(step, run, now))
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
        let failed: Vec<Selection> =
            pipeline.iter().map(|step| Selection::component_state(step.descriptor(), ComponentState::Failed)).collect();
        let failed = index.tally(&failed, false).await?;
        let overdue = self.overdue_runs(&pipeline).await?;
        for ((step, tally), failed) in pipeline.iter().zip(tallies).zip(failed) {
            if let Some(reason) = step.broken_contract(&pipeline) {
                alerts.push(Alert::ContractBroken { component: step.name().clone(), reason });
            } else {
                // A pass refused for a broken contract is said above; any other refusal is
                // its configuration's, seen by nothing but the registry.
                let refused = step.registered.hosts.iter().filter(|host| {
                    host.outcome == Some(autocomp_model::PassOutcome::Error) && host.refused().is_some()
                });
                for host in refused {
                    alerts.push(Alert::PassRefused {
                        component: step.name().clone(),
                        host: host.host.clone(),
                        reason: host.summary.clone(),
                    });
                }
            }
            if failed.count > 0 {
                let read = self.failure_reasons(step, FAILURES_READ).await?;
                let reasons = group_reasons(read)
                    .into_iter()
                    .take(ALERT_REASONS)
                    .map(|group| FailedReason { reason: group.reason, count: group.count })
                    .collect();
                alerts.push(Alert::Failed { component: step.name().clone(), count: failed.count, reasons });
            }
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
            let rule = SilenceRule::of(&step.registered, defaults);
            let last_seen = last_seen(&step.registered);
            // A human step has no passes to miss.
            if !step.descriptor().manual && rule.is_silent(last_seen, now) {
                alerts.push(Alert::Silent { component: step.name().clone(), last_seen, threshold: rule.describe() });
            }
        }

        let steering = store.steering().await?;
        for (component, hold) in steering.holds() {
            if hold.kind == HoldKind::Circuit || held_too_long(hold, now, defaults.paused_after) {
                alerts.push(Alert::Held { component: component.cloned(), hold: hold.clone() });
            }
        }

        let index_seq = index.catch_up().await?.cursor();
        let store_head = store.head().await?;
        let behind = u64::try_from(store_head.0.saturating_sub(index_seq.0)).unwrap_or_default();
        if behind > defaults.index_lag {
            alerts.push(Alert::IndexLag { behind, index_seq: index_seq.0, store_head: store_head.0 });
        }
        if self.backends.locks.is_some() {
            alerts.extend(self.foreign_locks().await?);
        }
        Ok(AlertsView { alerts, now })
    }

    /// Lock nodes no lock service made, and a lock tree this identity may not protect.
    async fn foreign_locks(&self) -> Result<Vec<Alert>, OperatorError> {
        match self.held_locks().await {
            Ok(held) => Ok(held
                .into_iter()
                .filter_map(|lock| Some(Alert::ForeignLock { reason: lock.foreign?, path: lock.path }))
                .collect()),
            // Raised while connecting: the tree's ACL is not ours to fix.
            Err(OperatorError::Run(RunError::ForeignLock(reason))) => {
                Ok(vec![Alert::ForeignLock { path: "(lock tree)".into(), reason }])
            }
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn component(extra: serde_json::Value) -> RegisteredComponent {
        let mut descriptor = json!({
            "name": "archiver", "version": "1", "event_type": "Data_Archived", "trigger": {},
            "max_attempts": 3, "retry_backoff": "5m", "queue_size": 10, "max_runtime": "1h",
        });
        descriptor.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        serde_json::from_value(json!({
            "descriptor": descriptor, "registered_at": Timestamp(0), "changed_at": Timestamp(0), "hosts": [],
            "retired": null,
        }))
        .unwrap()
    }

    #[test]
    fn a_foreign_lock_says_what_it_is_and_what_to_do() {
        let alert = Alert::ForeignLock { path: "poll/probe".into(), reason: "a persistent node".into() };
        let line = alert.line(Timestamp(0));
        assert!(line.starts_with("locks: poll/probe is not a lock autocomp made: a persistent node"), "{line}");
        assert!(line.contains("`autocomp locks`"), "{line}");
        let view = AlertsView { alerts: vec![alert], now: Timestamp(0) };
        let json: serde_json::Value = serde_json::from_str(&view.render(Format::Json)).unwrap();
        assert_eq!(json[0]["kind"], "foreign_lock");
        assert_eq!(json[0]["path"], "poll/probe");
    }

    #[test]
    fn failed_batches_say_how_many_why_and_where_to_look() {
        let component = ComponentName::new("checksum-verifier").unwrap();
        let reason = |reason: Option<&str>, count| FailedReason { reason: reason.map(str::to_owned), count };
        let reasons = vec![reason(Some("mismatch: md5 and sha256 differ"), 3), reason(None, 1)];
        let alert = Alert::Failed { component: component.clone(), count: 4, reasons };
        assert_eq!(
            alert.line(Timestamp(0)),
            "checksum-verifier: 4 batches failed: 3x mismatch: md5 and sha256 differ; 1x (no reason given) \
             (`autocomp failures --component checksum-verifier`)"
        );
        let one = Alert::Failed { component, count: 1, reasons: vec![] };
        assert_eq!(
            one.line(Timestamp(0)),
            "checksum-verifier: 1 batch failed (`autocomp failures --component checksum-verifier`)"
        );
        let view = AlertsView { alerts: vec![alert], now: Timestamp(0) };
        let json: serde_json::Value = serde_json::from_str(&view.render(Format::Json)).unwrap();
        assert_eq!((json[0]["kind"].as_str(), json[0]["count"].as_u64()), (Some("failed"), Some(4)));
        assert_eq!(json[0]["reasons"][0], json!({"reason": "mismatch: md5 and sha256 differ", "count": 3}));
    }

    #[test]
    fn silence_is_its_own_silent_after_else_missed_scheduled_passes_else_the_default() {
        let defaults = AlertDefaults { silent_periods: 3, ..AlertDefaults::default() };
        let own = component(json!({"silent_after": "10m", "schedule": "*/5 * * * *"}));
        assert_eq!(SilenceRule::of(&own, &defaults), SilenceRule::After(Duration::from_secs(600)));
        let plain = component(json!({}));
        assert_eq!(SilenceRule::of(&plain, &defaults), SilenceRule::After(Duration::from_secs(3600)));

        let scheduled = SilenceRule::of(&component(json!({"schedule": "*/5 * * * *"})), &defaults);
        assert_eq!(scheduled.describe(), "3 missed passes of its schedule '*/5 * * * *'");
        // 2023-11-14 22:15 UTC: a quarter hour in every zone with whole-quarter-hour offsets.
        let last = Timestamp(1_700_000_100_000);
        let after = |minutes: i64| Timestamp(last.0 + minutes * 60_000);
        assert!(!scheduled.is_silent(last, after(15)), "the third one is due, not yet missed");
        assert!(scheduled.is_silent(last, after(16)), "the third one a minute late: missed");
        assert!(SilenceRule::After(Duration::from_secs(600)).is_silent(last, after(10)));
        assert!(!SilenceRule::After(Duration::from_secs(600)).is_silent(last, after(9)));
    }
}
