//! The operator's steering of the whole pipeline: pause, drain and resume (one component or
//! all of it), resource pool sizes, and human steps (declared here, decided by `approve` and
//! `reject`). A steering action is one store call (`steer`) that the store records in its
//! steering log with the operator and the reason, previewed and confirmed like a batch
//! action (the plan is the steering state's version), by the CLI and the monitor alike.

use std::fmt;
use std::time::Duration;

use serde::{Serialize, Serializer};

use super::views::{Format, RunView};
use super::{ActionReport, Operator, OperatorError, check_reason};
use crate::operator::actions::{Action, json_of};
use autocomp_model::{
    BatchId, ComponentName, InvalidInput, PoolName, Run, Steering, SteeringChange, SteeringEntry, SteeringRequest,
    Timestamp,
};
use autocomp_store::{ObjectStore, StoreError};

mod form;
mod step;

pub use form::SteerForm;
pub use step::HumanStep;

/// How often `drain --wait` looks at the open runs.
const DRAIN_POLL: Duration = Duration::from_millis(500);
/// Most entries of the steering log `pipeline` shows.
pub const LOG_SHOWN: usize = 20;

/// Which part of the pipeline a pause, drain or resume is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// Every component (`--all`).
    All,
    Component(String),
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scope::All => f.write_str("the whole pipeline"),
            Scope::Component(name) => f.write_str(name),
        }
    }
}

/// An operator's action on the pipeline as a whole. It (de)serializes as the fields of the
/// monitor's steering form ([`SteerForm`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "SteerForm", into = "SteerForm")]
pub enum SteerAction {
    /// No new work is claimed; work already running goes on to its result.
    Pause { scope: Scope },
    /// A pause whose point is that running work finishes (`drain --wait` waits for it).
    Drain { scope: Scope },
    /// Lifts the hold (a pause, a drain or an open circuit); with `rerun_failed`, the
    /// batches that failed while the circuit was breaking are rerun.
    Resume { scope: Scope, rerun_failed: bool },
    /// Creates or resizes a resource pool.
    SetPool { pool: String, size: u32 },
}

impl SteerAction {
    pub fn name(&self) -> &'static str {
        match self {
            SteerAction::Pause { .. } => "pause",
            SteerAction::Drain { .. } => "drain",
            SteerAction::Resume { .. } => "resume",
            SteerAction::SetPool { .. } => "pool set",
        }
    }

    fn scope(&self) -> Option<&Scope> {
        match self {
            SteerAction::Pause { scope } | SteerAction::Drain { scope } | SteerAction::Resume { scope, .. } => {
                Some(scope)
            }
            SteerAction::SetPool { .. } => None,
        }
    }
}

impl fmt::Display for SteerAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SteerAction::Pause { scope } => write!(f, "pause {scope}: claim no new work; running work goes on"),
            SteerAction::Drain { scope } => {
                write!(f, "drain {scope}: claim no new work and let running work finish")
            }
            SteerAction::Resume { scope, rerun_failed: false } => write!(f, "resume {scope}: claim work again"),
            SteerAction::Resume { scope, rerun_failed: true } => {
                write!(f, "resume {scope} and rerun the batches that failed while its circuit was breaking")
            }
            SteerAction::SetPool { pool, size } => write!(f, "pool {pool}: at most {size} batches' work at once"),
        }
    }
}

/// What a steering action would do, with nothing written: confirm it with `version`. Its
/// JSON has these fields (`action` by its name, `running` as `RunView`s).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SteerPreview {
    #[serde(serialize_with = "action_name")]
    pub action: SteerAction,
    /// The action in one line.
    pub summary: String,
    /// The steering state's version it was planned against (the confirm's plan).
    pub version: u64,
    /// What it would record ("paused archiver").
    pub would: String,
    /// Work running now in its scope, which a pause or drain lets finish.
    #[serde(serialize_with = "run_views")]
    pub running: Vec<Run>,
    /// The batches `resume --rerun-failed` would rerun.
    pub reruns: Vec<BatchId>,
}

impl SteerPreview {
    pub fn render(&self, format: Format) -> String {
        match format {
            Format::Json => json_of(self),
            Format::Text => {
                let mut out = format!("{}\nwould record: {}\n", self.summary, self.would);
                if !self.running.is_empty() {
                    out.push_str(&format!("running now (goes on to its result): {}\n", runs_text(&self.running)));
                }
                if !self.reruns.is_empty() {
                    out.push_str(&format!("would rerun: {}\n", ids_text(&self.reruns)));
                }
                out.push_str(&format!("steering version: {} (--expect-version)\n", self.version));
                out
            }
        }
    }
}

/// What a steering action did. Its JSON has these fields (`running` as `RunView`s,
/// `reruns` as `{batch, message}`, `refused` as `{batch, reason}`).
#[derive(Debug, Serialize)]
pub struct SteerReport {
    pub message: String,
    /// Its entry in the steering log.
    pub entry: Option<SteeringEntry>,
    /// A repeated confirm: the log held this change already, nothing was written.
    pub already_done: bool,
    /// Work running in its scope when it was recorded.
    #[serde(serialize_with = "run_views")]
    pub running: Vec<Run>,
    /// `resume --rerun-failed`: each batch rerun.
    #[serde(serialize_with = "rerun_views")]
    pub reruns: Vec<ActionReport>,
    /// `resume --rerun-failed`: batches whose rerun was refused, and why.
    #[serde(serialize_with = "refusal_views")]
    pub refused: Vec<(BatchId, String)>,
}

impl SteerReport {
    /// What a change recorded as `entry` says, with the work still `running` in its scope.
    fn recorded(entry: Option<SteeringEntry>, running: Vec<Run>) -> SteerReport {
        SteerReport {
            message: entry
                .as_ref()
                .map(|e| format!("recorded at steering version {}: {}", e.version, e.said))
                .unwrap_or_default(),
            entry,
            already_done: false,
            running,
            reruns: Vec::new(),
            refused: Vec::new(),
        }
    }

    pub fn render(&self, format: Format) -> String {
        match format {
            Format::Json => json_of(self),
            Format::Text => {
                let mut out = format!("{}\n", self.message);
                if !self.running.is_empty() {
                    out.push_str(&format!("still running (goes on to its result): {}\n", runs_text(&self.running)));
                }
                for rerun in &self.reruns {
                    out.push_str(&format!("{}\n", rerun.message));
                }
                for (id, why) in &self.refused {
                    out.push_str(&format!("{id}: not rerun: {why}\n"));
                }
                out
            }
        }
    }
}

fn run_views<S: Serializer>(runs: &[Run], serializer: S) -> Result<S::Ok, S::Error> {
    serializer.collect_seq(runs.iter().map(RunView::from))
}

fn action_name<S: Serializer>(action: &SteerAction, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(action.name())
}

/// A batch a resume reran, and what its rerun recorded.
#[derive(Serialize)]
struct RerunView<'r> {
    batch: &'r BatchId,
    message: &'r str,
}

fn rerun_views<S: Serializer>(reruns: &[ActionReport], serializer: S) -> Result<S::Ok, S::Error> {
    serializer.collect_seq(reruns.iter().map(|r| RerunView { batch: &r.batch, message: &r.message }))
}

/// A batch a resume did not rerun, and why.
#[derive(Serialize)]
struct RefusalView<'r> {
    batch: &'r BatchId,
    reason: &'r str,
}

fn refusal_views<S: Serializer>(refused: &[(BatchId, String)], serializer: S) -> Result<S::Ok, S::Error> {
    serializer.collect_seq(refused.iter().map(|(batch, reason)| RefusalView { batch, reason }))
}

fn runs_text(runs: &[Run]) -> String {
    let shown: Vec<String> = runs.iter().take(10).map(|run| format!("{} on {}", run.component, run.batch_id)).collect();
    let more = runs.len().saturating_sub(shown.len());
    if more > 0 { format!("{} and {more} more", shown.join(", ")) } else { shown.join(", ") }
}

fn ids_text(ids: &[BatchId]) -> String {
    let shown: Vec<&str> = ids.iter().take(20).map(BatchId::as_str).collect();
    let more = ids.len().saturating_sub(shown.len());
    if more > 0 { format!("{} and {more} more", shown.join(", ")) } else { shown.join(", ") }
}

/// A steering change the store refused, in the operator's words.
fn steer_refusal(error: StoreError) -> OperatorError {
    match error {
        StoreError::ChangedSincePreview(message) => {
            // Someone else changed the steering between the read and the write: say so.
            OperatorError::Refused(format!(
                "the pipeline's steering changed while this was asked; nothing was done: ask again ({message})"
            ))
        }
        StoreError::AlreadyInState(message) => OperatorError::AlreadyInState(message),
        StoreError::Conflict(message) => OperatorError::Refused(message),
        e => e.into(),
    }
}

/// A steering action checked and turned into the store's request.
struct Planned {
    request: SteeringRequest,
    /// The component its scope names, if any.
    component: Option<ComponentName>,
}

impl Planned {
    /// Checks the action's input and names the store request it makes (nothing read yet
    /// besides the pipeline, for the component's name).
    async fn new(
        operator: &Operator,
        store: &dyn ObjectStore,
        action: &SteerAction,
        reason: &str,
    ) -> Result<Planned, OperatorError> {
        let reason = check_reason(reason)?.to_owned();
        if let SteerAction::Resume { scope: Scope::All, rerun_failed: true } = action {
            // Only a component's circuit keeps a list of what failed while it broke.
            return Err(OperatorError::Input(InvalidInput::new(
                "rerun_failed",
                "--all",
                "rerunning the failed batches is for one component's open circuit: name the component \
                 (resume C --rerun-failed); the whole pipeline resumes with resume --all",
            )));
        }
        let by = operator.agent()?;
        let component = match action.scope() {
            Some(Scope::Component(name)) => {
                let pipeline = operator.pipeline(store).await?;
                Some(operator.step(&pipeline, name)?.name().clone())
            }
            _ => None,
        };
        let change = match action {
            SteerAction::Pause { .. } => SteeringChange::Pause { component: component.clone(), drain: false },
            SteerAction::Drain { .. } => SteeringChange::Pause { component: component.clone(), drain: true },
            SteerAction::Resume { .. } => SteeringChange::Resume { component: component.clone() },
            SteerAction::SetPool { pool, size } => {
                let pool = PoolName::new(pool.as_str())?;
                SteeringChange::SetPool { pool, size: *size }
            }
        };
        Ok(Planned { request: SteeringRequest { change, by, reason, expect_version: None }, component })
    }
}

/// The open runs in the scope: of the component, or of every component.
async fn running_in(store: &dyn ObjectStore, component: Option<&ComponentName>) -> Result<Vec<Run>, OperatorError> {
    Ok(store.open_runs(component).await?)
}

impl Operator {
    /// What `steer` would do, or its refusal in the same words; writes nothing.
    pub async fn preview_steer(&self, action: &SteerAction, reason: &str) -> Result<SteerPreview, OperatorError> {
        let store = self.store().await?;
        let planned = Planned::new(self, store.as_ref(), action, reason).await?;
        let steering = store.steering().await?;
        let reruns = reruns_of(&steering, action, planned.component.as_ref());
        let mut after = steering.clone();
        let applied = after.apply(&planned.request, Timestamp::now()).map_err(refusal)?;
        let would = applied.entry.map(|entry| entry.said).unwrap_or_default();
        let running = match action {
            SteerAction::SetPool { .. } | SteerAction::Resume { .. } => Vec::new(),
            _ => running_in(store.as_ref(), planned.component.as_ref()).await?,
        };
        Ok(SteerPreview {
            action: action.clone(),
            summary: action.to_string(),
            version: steering.version,
            would,
            running,
            reruns,
        })
    }

    /// Performs a steering action: one `steer` call recording the operator and the reason.
    /// With `expect_version` (a confirmed preview, or `--expect-version`) it acts only if
    /// the steering state is still at that version; a repeat of a change the log already
    /// holds at the next version, by the same operator, answers "already done". `resume
    /// --rerun-failed` then reruns, one by one, the batches the breaker remembered.
    pub async fn steer(
        &self,
        action: &SteerAction,
        reason: &str,
        expect_version: Option<u64>,
    ) -> Result<SteerReport, OperatorError> {
        let store = self.store().await?;
        let mut planned = Planned::new(self, store.as_ref(), action, reason).await?;
        let before = store.steering().await?;
        let version = expect_version.unwrap_or(before.version);
        // The reruns are the breaker's list at the version the change is made against.
        let reruns =
            if version == before.version { reruns_of(&before, action, planned.component.as_ref()) } else { Vec::new() };
        planned.request.expect_version = Some(version);
        let steered = match store.steer(planned.request.clone()).await {
            Ok(steered) => steered,
            Err(e) if expect_version.is_some() && e.is_conflict() => {
                return confirmed_again(store.as_ref(), &planned.request, version, e).await;
            }
            Err(e) => return Err(steer_refusal(e)),
        };
        let running = match action {
            SteerAction::Pause { .. } | SteerAction::Drain { .. } => {
                running_in(store.as_ref(), planned.component.as_ref()).await?
            }
            _ => Vec::new(),
        };
        let mut report = SteerReport::recorded(steered.entry, running);
        if let Some(component) = &planned.component {
            report.rerun_failed(self, component, reruns, &planned.request.reason).await?;
        }
        Ok(report)
    }

    /// `drain --wait`: waits until nothing in the scope runs (polling the open runs), at most
    /// `timeout`. Answers how long it waited; a timeout is `Refused` naming what still runs.
    pub async fn wait_drained(&self, scope: &Scope, timeout: Duration) -> Result<String, OperatorError> {
        let store = self.store().await?;
        let component = match scope {
            Scope::All => None,
            Scope::Component(name) => {
                let pipeline = self.pipeline(store.as_ref()).await?;
                Some(self.step(&pipeline, name)?.name().clone())
            }
        };
        let started = tokio::time::Instant::now();
        let deadline = started + timeout;
        loop {
            let running = running_in(store.as_ref(), component.as_ref()).await?;
            if running.is_empty() {
                let waited = humantime::format_duration(Duration::from_secs(started.elapsed().as_secs()));
                return Ok(format!("drained: nothing of {scope} runs (waited {waited})"));
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(OperatorError::Refused(format!(
                    "{scope} still runs after {}: {}",
                    humantime::format_duration(timeout),
                    runs_text(&running)
                )));
            }
            tokio::time::sleep(DRAIN_POLL.min(deadline - tokio::time::Instant::now())).await;
        }
    }

    /// The steering state and the newest entries of its log.
    pub async fn steering(&self) -> Result<(Steering, Vec<SteeringEntry>), OperatorError> {
        let store = self.store().await?;
        let steering = store.steering().await?;
        let log = store.steering_log(LOG_SHOWN).await?;
        Ok((steering, log))
    }
}

/// A confirm whose change the store refused: "already done" if the log holds it (a confirm
/// sent twice), else the refusal.
async fn confirmed_again(
    store: &dyn ObjectStore,
    request: &SteeringRequest,
    version: u64,
    refused: StoreError,
) -> Result<SteerReport, OperatorError> {
    if let Some(entry) = logged(store, request, version).await? {
        return Ok(SteerReport {
            message: format!("already done at steering version {}: {}", entry.version, entry.said),
            entry: Some(entry),
            already_done: true,
            running: Vec::new(),
            reruns: Vec::new(),
            refused: Vec::new(),
        });
    }
    Err(match refused {
        StoreError::AlreadyInState(message) => OperatorError::AlreadyInState(format!("{message}; nothing was done")),
        StoreError::Conflict(message) | StoreError::ChangedSincePreview(message) => {
            OperatorError::Refused(format!("{message}; nothing was done"))
        }
        other => other.into(),
    })
}

/// The log's entry for `request` made at `version` by the same operator, if the log holds
/// one: a confirm sent twice.
async fn logged(
    store: &dyn ObjectStore,
    request: &SteeringRequest,
    version: u64,
) -> Result<Option<SteeringEntry>, OperatorError> {
    let log = store.steering_log(LOG_SHOWN).await?;
    Ok(log.into_iter().find(|entry| {
        entry.version == version + 1
            && entry.by == request.by
            && entry.change == request.change
            && entry.reason == request.reason
    }))
}

impl SteerReport {
    /// `resume --rerun-failed`: reruns each batch the breaker remembered, one by one; a
    /// refused rerun is listed with its reason.
    async fn rerun_failed(
        &mut self,
        operator: &Operator,
        component: &ComponentName,
        reruns: Vec<BatchId>,
        reason: &str,
    ) -> Result<(), OperatorError> {
        let rerun = Action::Rerun { component: component.to_string() };
        for id in reruns {
            match operator.perform(&id, &rerun, reason).await {
                Ok(done) => self.reruns.push(done),
                Err(OperatorError::Refused(why)) => self.refused.push((id, why)),
                Err(OperatorError::Input(e)) => self.refused.push((id, e.to_string())),
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// The batches a resume would rerun: the breaker's list of the component, for
/// `resume --rerun-failed` of a component.
fn reruns_of(steering: &Steering, action: &SteerAction, component: Option<&ComponentName>) -> Vec<BatchId> {
    match (action, component) {
        (SteerAction::Resume { rerun_failed: true, .. }, Some(component)) => {
            steering.breakers.get(component).map(|b| b.failed.clone()).unwrap_or_default()
        }
        _ => Vec::new(),
    }
}

fn refusal(refusal: autocomp_model::SteeringRefusal) -> OperatorError {
    match refusal {
        autocomp_model::SteeringRefusal::Invalid(e) => OperatorError::Input(e),
        autocomp_model::SteeringRefusal::AlreadyInState(message) => OperatorError::AlreadyInState(message),
        autocomp_model::SteeringRefusal::Conflict(message)
        | autocomp_model::SteeringRefusal::ChangedSincePreview(message) => OperatorError::Refused(message),
        // A refusal this release does not know yet: refused, as every refusal was once.
        other => OperatorError::Refused(other.to_string()),
    }
}

/// One line per hold, for `status` and `pipeline`: `archiver: paused by operator:ann since
/// 2026-11-27T10:00:00Z: tape maintenance`.
pub fn hold_lines(steering: &Steering) -> Vec<String> {
    let line = |what: &str, hold: &autocomp_model::Hold| {
        let reason = autocomp_toolkit::terminal::one_line(&hold.reason);
        format!("{what}: {} by {} since {}: {reason}", hold.kind.as_str(), hold.by, hold.since)
    };
    let name =
        |component: Option<&ComponentName>| component.map_or("the whole pipeline".to_owned(), ToString::to_string);
    steering.holds().map(|(component, hold)| line(&name(component), hold)).collect()
}
