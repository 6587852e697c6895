//! The operator's writes. Each checks everything first (reason, operator name, component,
//! batch, the batch's state), then makes exactly one store call, which appends one event
//! (or registers one batch). History only grows: a rerun or restart is a `Reset` marker
//! superseding events in the effective view, never an edit.
//!
//! `rerun`, `restart`, `cancel`, `skip` and `prioritize` are each one [`Action`], planned by
//! one function whatever asks for it: the CLI performs the plan, the monitor previews it
//! first (the same checks and refusals, the event it would append and the state changes
//! that follow) and may act on many batches at once.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fmt::{self, Write as _};
use std::path::Path;
use std::sync::Arc;

use autocomp_model::{
    Agent, Batch, BatchId, BatchType, ComponentName, ComponentState, Event, EventType, InvalidInput, NewBatch,
    NewEvent, Outcome, Run, RunState, Seq,
};
use autocomp_store::{CreateOutcome, ObjectStore, StoreError};
use serde_json::{Value, json};

use super::{Operator, OperatorError, PRIORITIZED, Step, check_reason, unknown_batch};

/// Most batches one bulk action may name: bounds the work (and the store reads) of one
/// request.
pub const MAX_BULK_BATCHES: usize = 10_000;

/// How many previews and refusals a bulk preview shows.
const BULK_SAMPLE: usize = 10;

/// Batches read per store call by a bulk preview.
const BULK_READ_PAGE: usize = 500;

/// Where `restart` starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RestartFrom {
    /// The effective failure with the lowest seq.
    FirstFailure,
    /// This event type's effective event.
    Type(String),
}

/// A component whose state the action changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateChange {
    pub component: ComponentName,
    pub before: ComponentState,
    pub after: ComponentState,
}

/// What an action did, for the operator to read.
#[derive(Debug, Clone)]
pub struct ActionReport {
    pub batch: BatchId,
    /// One line: what was recorded.
    pub message: String,
    /// The event appended, if any (`add` registers a batch, no event).
    pub event: Option<Event>,
    pub changes: Vec<StateChange>,
}

impl ActionReport {
    pub fn render(&self) -> String {
        let mut out = format!("{}\n", self.message);
        for change in &self.changes {
            writeln!(out, "  {}: {} -> {}", change.component, change.before, change.after).ok();
        }
        out
    }
}

/// An operator's action on one batch: what the CLI's `rerun`, `restart`, `cancel`, `skip`
/// and `prioritize` do, for callers that preview an action before performing it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// A Reset marker for the component's event type: it runs again if its trigger holds.
    Rerun { component: String },
    /// A Reset marker for the starting type and every type recorded after it.
    Restart { from: RestartFrom },
    /// Fences the component's running worker and records a failure flagged `cancelled`.
    Cancel { component: String },
    /// Records a success flagged `skipped` for the component.
    Skip { component: String },
    /// Sets the batch's priority (higher runs first) and records `Prioritized`.
    Prioritize { priority: i32 },
}

impl Action {
    /// The CLI command, also recorded as `action` in the event's details.
    pub fn name(&self) -> &'static str {
        match self {
            Action::Rerun { .. } => "rerun",
            Action::Restart { .. } => "restart",
            Action::Cancel { .. } => "cancel",
            Action::Skip { .. } => "skip",
            Action::Prioritize { .. } => "prioritize",
        }
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Action::Rerun { component } => write!(f, "rerun {component}: supersede its result so it runs again"),
            Action::Restart { from: RestartFrom::FirstFailure } => {
                f.write_str("restart from the first failure: supersede it and every result recorded after it")
            }
            Action::Restart { from: RestartFrom::Type(start) } => {
                write!(f, "restart from {start}: supersede it and every result recorded after it")
            }
            Action::Cancel { component } => {
                write!(f, "cancel {component}: stop its running worker and record a cancelled failure")
            }
            Action::Skip { component } => {
                write!(f, "skip {component}: record a skipped success so the steps after it may run")
            }
            Action::Prioritize { priority } => {
                write!(f, "prioritize: set the priority to {priority} (higher runs first)")
            }
        }
    }
}

/// What an action would do to one batch, computed from the same plan `perform` carries out,
/// with nothing written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActionPreview {
    pub batch: BatchId,
    /// The action, in one line (`Action`'s `Display`).
    pub action: String,
    /// The event type it would append (`Reset`, the component's type, `Prioritized`).
    pub records: String,
    /// The types a `Reset` would supersede; empty for the other actions.
    pub resets: Vec<EventType>,
    /// The components whose state would change. `perform` reports the same changes unless
    /// the batch changes in between (or a `settled_for` clause comes due meanwhile).
    pub changes: Vec<StateChange>,
    /// The message `perform` would print, with the seq the store would assign next if
    /// nothing else were written first.
    pub message: String,
}

/// What one action would do to many batches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BulkPreview {
    /// Distinct batches named (a repeated id counts, and would be acted on, once).
    pub total: usize,
    /// How many of them the action would apply to; the rest would be refused.
    pub applicable: usize,
    /// The previews of the first batches it would apply to, in the order named.
    pub sample: Vec<ActionPreview>,
    /// The first refusals, in the order named, each in the words `perform` would use.
    pub refused: Vec<(BatchId, String)>,
}

/// What one action did to many batches, in the order named.
#[derive(Debug)]
pub struct BulkOutcome {
    pub performed: Vec<ActionReport>,
    /// Batches the action was refused on (their state, an unknown id, no effective
    /// `--from` type), in the words `perform` uses; nothing was written for them.
    pub refused: Vec<(BatchId, String)>,
    /// A store or backend error that stopped the run at this batch (whether its event was
    /// written is unknown: `autocomp show` tells); the batches named after it were not
    /// attempted.
    pub stopped: Option<(BatchId, OperatorError)>,
}

fn states(pipeline: &[Step], batch: &Batch) -> Vec<(ComponentName, ComponentState)> {
    pipeline.iter().map(|step| (step.name().clone(), step.state_of(batch))).collect()
}

fn changes(before: &[(ComponentName, ComponentState)], after: &[(ComponentName, ComponentState)]) -> Vec<StateChange> {
    before
        .iter()
        .zip(after)
        .filter(|((_, old), (_, new))| old != new)
        .map(|((component, before), (_, after))| StateChange {
            component: component.clone(),
            before: *before,
            after: *after,
        })
        .collect()
}

/// An action on a component's result while it works would race its worker's own result.
fn refuse_if_working<'s>(
    batch: &Batch,
    steps: impl IntoIterator<Item = &'s Step>,
    action: &str,
) -> Result<(), OperatorError> {
    for step in steps {
        if let Some(run) = batch.open_run(step.name()) {
            return Err(OperatorError::Refused(format!(
                "{} is working on {} (run {} held by {} on {} pid {} since {}): its result would race this {action}; \
                 `autocomp cancel {} --component {} --reason ...` first, or wait for it",
                step.name(),
                batch.id,
                run.generation,
                run.holder.agent,
                run.holder.host,
                run.holder.pid,
                run.started_at,
                batch.id,
                step.name(),
            )));
        }
    }
    Ok(())
}

/// The effective events a Reset of `types` supersedes, for the record.
fn superseded(batch: &Batch, types: &[EventType]) -> Value {
    let view = batch.effective();
    let events: Vec<Value> = types
        .iter()
        .filter_map(|t| view.get(t))
        .map(|e| json!({"type": e.event_type, "seq": e.seq, "outcome": e.outcome, "agent": e.agent}))
        .collect();
    Value::Array(events)
}

impl Operator {
    /// Appends `event` and reports which components changed state.
    async fn append(
        &self,
        store: &dyn ObjectStore,
        pipeline: &[Step],
        batch: &Batch,
        event: NewEvent,
        message: impl FnOnce(&Event) -> String,
    ) -> Result<ActionReport, OperatorError> {
        let recorded = store.append_event(&batch.id, event).await?;
        Ok(ActionReport {
            batch: batch.id.clone(),
            message: message(&recorded),
            changes: changes_since(store, pipeline, batch).await?,
            event: Some(recorded),
        })
    }

    /// `autocomp add`: registers a batch. No event: it waits for whatever records its first
    /// one (a source component, or `autocomp event`). The operator and the reason, if
    /// given, are kept in its metadata (`registered_by`, `reason`).
    pub async fn add(
        &self,
        id: &str,
        batch_type: &str,
        priority: i32,
        location: Option<&Path>,
        reason: Option<&str>,
    ) -> Result<ActionReport, OperatorError> {
        let id = BatchId::new(id)?;
        let batch_type = BatchType::new(batch_type)?;
        let reason = reason.map(check_reason).transpose()?;
        let agent = self.agent()?;
        let mut new = NewBatch::new(id.clone(), batch_type).with_priority(priority);
        if let Some(location) = location {
            let absolute = std::path::absolute(location).map_err(|e| {
                InvalidInput::new("--location", location.display().to_string(), format!("cannot be made absolute: {e}"))
            })?;
            let text = absolute.to_str().ok_or_else(|| {
                InvalidInput::new("--location", absolute.display().to_string(), "must be valid UTF-8")
            })?;
            new = new.with_location(text);
        }
        new.metadata["registered_by"] = json!(agent);
        if let Some(reason) = reason {
            new.metadata["reason"] = json!(reason);
        }
        let store = self.store().await?;
        let message = match store.create_batch(new).await? {
            CreateOutcome::Created(batch) => format!(
                "{id}: registered (type {}, priority {}, seq {}); no event recorded: it waits for its first one",
                batch.batch_type, batch.priority, batch.created_seq
            ),
            CreateOutcome::AlreadyExists(_) => format!("{id}: already registered exactly so; nothing changed"),
        };
        Ok(ActionReport { batch: id, message, event: None, changes: Vec::new() })
    }

    /// `autocomp event`: records an event by hand (e.g. a `Data_Received` for a batch
    /// delivered outside the pipeline). The type must be one the pipeline records or waits
    /// for; `Reset` markers are written by `rerun` and `restart`.
    pub async fn record_event(
        &self,
        id: &str,
        event_type: &str,
        outcome: Outcome,
        reason: &str,
    ) -> Result<ActionReport, OperatorError> {
        let reason = check_reason(reason)?;
        let agent = self.agent()?;
        let store = self.store().await?;
        let pipeline = self.pipeline(store.as_ref()).await?;
        let event_type = self.known_event_type(&pipeline, event_type)?;
        let batch = self.batch(store.as_ref(), id).await?;
        refuse_if_working(&batch, pipeline.iter().filter(|s| *s.event_type() == event_type), "event")?;
        let summary = format!("recorded by hand by {agent}: {reason}");
        let details = self.details("event", reason, summary, json!({}));
        let event = NewEvent::new(event_type, outcome, agent).with_details(details);
        self.append(store.as_ref(), &pipeline, &batch, event, |e| {
            format!("{}: recorded {} {} (seq {})", batch.id, e.event_type, e.outcome.as_str(), e.seq)
        })
        .await
    }

    /// Event types the pipeline records or any trigger mentions, and those the component
    /// files in the config dir name: before a component's first pass registers it, its
    /// `<name>.toml` is all there is, and a fresh pipeline's first events come by hand.
    fn known_event_type(&self, pipeline: &[Step], text: &str) -> Result<EventType, OperatorError> {
        let event_type = EventType::new(text)?;
        if event_type.is_reset() {
            return Err(InvalidInput::new(
                "event type",
                text,
                "Reset markers are written by `autocomp rerun` and `autocomp restart`",
            )
            .into());
        }
        let mut known = BTreeSet::new();
        for step in pipeline {
            let trigger = step.trigger();
            known.insert(step.event_type().clone());
            known.extend(trigger.requires.iter().chain(&trigger.blocked_by).cloned());
            known.extend(trigger.repeat_on_change.iter().chain(&trigger.transiently_failed).cloned());
        }
        known.extend(configured_event_types(self.config_dir()));
        if known.contains(&event_type) {
            return Ok(event_type);
        }
        let dir = self.config_dir().display();
        let reason = if known.is_empty() {
            format!(
                "no component has registered an event type yet: register one by running its first pass (it records \
                 itself in the store), or write `event_type = \"{text}\"` in its config file {dir}/<component>.toml"
            )
        } else {
            let known: Vec<&str> = known.iter().map(|t| t.as_str()).collect();
            format!(
                "no component in the pipeline records it or waits for it (known: {}; `autocomp pipeline` lists the \
                 components, and a component file in {dir} may name its `event_type` before its first pass)",
                known.join(", ")
            )
        };
        Err(InvalidInput::new("event type", text, reason).into())
    }

    /// `autocomp rerun`: a Reset marker for the component's event type, so its trigger
    /// holds again (if its requirements do). Nothing else changes.
    pub async fn rerun(&self, id: &str, component: &str, reason: &str) -> Result<ActionReport, OperatorError> {
        self.perform(id, &Action::Rerun { component: component.to_owned() }, reason).await
    }

    /// `autocomp restart`: a Reset marker for the starting type and every type whose
    /// effective event was recorded after it (a higher seq): the steps that ran after the
    /// starting point trigger again, in the order their requirements allow. Operator
    /// bookkeeping (`Prioritized`) is left alone.
    pub async fn restart(&self, id: &str, from: RestartFrom, reason: &str) -> Result<ActionReport, OperatorError> {
        self.perform(id, &Action::Restart { from }, reason).await
    }

    /// `autocomp cancel`: fences the component's running worker (its run is closed as
    /// cancelled and the claim generation bumped, in the store, in the same transaction as
    /// the recorded failure flagged `cancelled`). The worker notices within a second, stops,
    /// and cannot record anything. With no open run only the failure is recorded.
    pub async fn cancel(&self, id: &str, component: &str, reason: &str) -> Result<ActionReport, OperatorError> {
        self.perform(id, &Action::Cancel { component: component.to_owned() }, reason).await
    }

    /// `autocomp skip`: records a success flagged `skipped` for the component, so the
    /// components that require its event type may run.
    pub async fn skip(&self, id: &str, component: &str, reason: &str) -> Result<ActionReport, OperatorError> {
        self.perform(id, &Action::Skip { component: component.to_owned() }, reason).await
    }

    /// `autocomp prioritize`: the new priority and a `Prioritized` event saying who and
    /// why, in one transaction. Higher runs first. Like any event it counts as activity, so
    /// it can hold back a component waiting for the batch to settle (`settled_for`).
    pub async fn prioritize(&self, id: &str, priority: i32, reason: &str) -> Result<ActionReport, OperatorError> {
        self.perform(id, &Action::Prioritize { priority }, reason).await
    }

    /// Performs `action` on batch `id` exactly as the CLI does: the same checks, the same
    /// refusals in the same words, the same one store call.
    pub async fn perform(&self, id: &str, action: &Action, reason: &str) -> Result<ActionReport, OperatorError> {
        let prepared = self.prepare(action, reason).await?;
        self.perform_prepared(&prepared, id).await
    }

    /// What `perform` would do to batch `id`, or its refusal in the same words; writes
    /// nothing. The changes are the planned event applied to a copy of the batch.
    pub async fn preview(&self, id: &str, action: &Action, reason: &str) -> Result<ActionPreview, OperatorError> {
        let prepared = self.prepare(action, reason).await?;
        let batch = self.batch(prepared.store.as_ref(), id).await?;
        let plan = self.plan(&prepared, &batch)?;
        let head = prepared.store.head().await?;
        Ok(prepared.preview(&batch, plan, Seq(head.0 + 1)))
    }

    /// What `perform_many` would do; writes nothing. Input that is wrong whatever the batch
    /// (reason, operator name, component, `--from`, more than `MAX_BULK_BATCHES` ids) is an
    /// error of the whole call; a batch the action would be refused on is counted and listed.
    pub async fn preview_many(
        &self,
        ids: &[BatchId],
        action: &Action,
        reason: &str,
    ) -> Result<BulkPreview, OperatorError> {
        let ids = distinct_within_bound(ids)?;
        let prepared = self.prepare(action, reason).await?;
        let mut next = prepared.store.head().await?;
        let mut preview = BulkPreview { total: ids.len(), applicable: 0, sample: Vec::new(), refused: Vec::new() };
        for page in ids.chunks(BULK_READ_PAGE) {
            let page: Vec<BatchId> = page.iter().map(|id| (*id).clone()).collect();
            let mut found: HashMap<BatchId, Batch> =
                prepared.store.get_batches(&page).await?.into_iter().map(|b| (b.id.clone(), b)).collect();
            for id in page {
                let planned = match found.remove(&id) {
                    Some(batch) => self.plan(&prepared, &batch).map(|plan| (batch, plan)),
                    None => Err(unknown_batch(id.as_str()).into()),
                };
                match planned {
                    Ok((batch, plan)) => {
                        preview.applicable += 1;
                        // Performed in this order, each appends one event.
                        next = Seq(next.0 + 1);
                        if preview.sample.len() < BULK_SAMPLE {
                            preview.sample.push(prepared.preview(&batch, plan, next));
                        }
                    }
                    Err(error) => {
                        let words = refusal_words(error)?;
                        if preview.refused.len() < BULK_SAMPLE {
                            preview.refused.push((id, words));
                        }
                    }
                }
            }
        }
        Ok(preview)
    }

    /// Performs `action` on each batch named (once, in the order named) as `perform` does.
    /// Input that is wrong whatever the batch fails the whole call before anything is
    /// written; a refused batch is listed and the others go on; a store or backend error
    /// stops the run there (`BulkOutcome::stopped`).
    pub async fn perform_many(
        &self,
        ids: &[BatchId],
        action: &Action,
        reason: &str,
    ) -> Result<BulkOutcome, OperatorError> {
        let ids = distinct_within_bound(ids)?;
        let prepared = self.prepare(action, reason).await?;
        let mut outcome = BulkOutcome { performed: Vec::new(), refused: Vec::new(), stopped: None };
        for id in ids {
            match self.perform_prepared(&prepared, id.as_str()).await {
                Ok(report) => outcome.performed.push(report),
                Err(error) => match refusal_words(error) {
                    Ok(words) => outcome.refused.push((id.clone(), words)),
                    Err(error) => {
                        outcome.stopped = Some((id.clone(), error));
                        break;
                    }
                },
            }
        }
        Ok(outcome)
    }

    async fn perform_prepared(&self, prepared: &Prepared, id: &str) -> Result<ActionReport, OperatorError> {
        let batch = self.batch(prepared.store.as_ref(), id).await?;
        let plan = self.plan(prepared, &batch)?;
        prepared.execute(&batch, plan).await
    }

    /// Every check that does not depend on the batch, in the order the CLI has always made
    /// them, so the same bad input gets the same error whichever check it fails first.
    async fn prepare(&self, action: &Action, reason: &str) -> Result<Prepared, OperatorError> {
        let reason = check_reason(reason)?.to_owned();
        let agent = self.agent()?;
        // The starting type is checked before the store is touched.
        let start_type = match action {
            Action::Restart { from: RestartFrom::Type(text) } => {
                Some(EventType::new(text.as_str()).map_err(|e| InvalidInput::new("--from", text.as_str(), e.reason))?)
            }
            _ => None,
        };
        let store = self.store().await?;
        let pipeline = self.pipeline(store.as_ref()).await?;
        let step = |component: &str| self.step(&pipeline, component).cloned();
        let target = match action {
            Action::Rerun { component } => Target::Rerun(step(component)?),
            Action::Restart { .. } => Target::Restart(start_type),
            Action::Cancel { component } => Target::Cancel(step(component)?),
            Action::Skip { component } => Target::Skip(step(component)?),
            Action::Prioritize { priority } => Target::Prioritize(*priority),
        };
        Ok(Prepared { action: action.clone(), target, reason, agent, store, pipeline })
    }

    /// What the prepared action writes on `batch`, or why it is refused: the one place each
    /// action's rules live, for `perform` and `preview` alike.
    fn plan(&self, prepared: &Prepared, batch: &Batch) -> Result<Plan, OperatorError> {
        let (reason, agent, action) = (prepared.reason.as_str(), &prepared.agent, prepared.action.name());
        let id = batch.id.clone();
        match &prepared.target {
            Target::Rerun(step) => {
                refuse_if_working(batch, [step], action)?;
                if batch.effective().get(step.event_type()).is_none() {
                    return Err(OperatorError::Refused(format!(
                        "{} has no {} result on {} to rerun (it is {}); nothing recorded",
                        step.name(),
                        step.event_type(),
                        batch.id,
                        step.state_of(batch)
                    )));
                }
                let types = vec![step.event_type().clone()];
                let summary = format!("rerun of {} requested by {agent}: {reason}", step.name());
                let extra = json!({"component": step.name(), "superseded": superseded(batch, &types)});
                let event = NewEvent::reset(types, agent.clone(), self.details(action, reason, summary, extra));
                let (event_type, name) = (step.event_type().clone(), step.name().clone());
                Plan::new(Write::Append(event), move |e, _| {
                    format!("{id}: recorded Reset of {event_type} (seq {}): {name} may run again", e.seq)
                })
            }
            Target::Restart(start_type) => {
                let view = batch.effective();
                let bookkeeping = |e: &&Event| e.event_type.as_str() != PRIORITIZED;
                let start = match start_type {
                    Some(start_type) => view.get(start_type).ok_or_else(|| {
                        let text = start_type.as_str();
                        let effective: Vec<&str> = view.iter().map(|e| e.event_type.as_str()).collect();
                        InvalidInput::new(
                            "--from",
                            text,
                            format!(
                                "batch {} has no effective {text} event (effective: {})",
                                batch.id,
                                effective.join(", ")
                            ),
                        )
                    })?,
                    None => view
                        .iter()
                        .filter(bookkeeping)
                        .filter(|e| e.outcome == Outcome::Failure)
                        .min_by_key(|e| e.seq)
                        .ok_or_else(|| {
                            OperatorError::Refused(format!("{} has no failed step to restart from", batch.id))
                        })?,
                };
                let mut after: Vec<&Event> = view.iter().filter(bookkeeping).filter(|e| e.seq >= start.seq).collect();
                after.sort_by_key(|e| e.seq);
                let types: Vec<EventType> = after.iter().map(|e| e.event_type.clone()).collect();
                refuse_if_working(batch, prepared.pipeline.iter().filter(|s| types.contains(s.event_type())), action)?;
                let named = types.iter().map(EventType::as_str).collect::<Vec<_>>().join(", ");
                let summary =
                    format!("restart from {} (seq {}) requested by {agent}: {reason}", start.event_type, start.seq);
                let extra =
                    json!({"from": start.event_type, "from_seq": start.seq, "superseded": superseded(batch, &types)});
                let event = NewEvent::reset(types, agent.clone(), self.details(action, reason, summary, extra));
                let from_type = start.event_type.clone();
                Plan::new(Write::Append(event), move |e, _| {
                    format!("{id}: recorded Reset (seq {}) of {from_type} and everything after it: {named}", e.seq)
                })
            }
            Target::Cancel(step) => {
                let summary = format!("cancelled by {agent}: {reason}");
                let extra = json!({"cancelled": true, "component": step.name()});
                let event = NewEvent::new(step.event_type().clone(), Outcome::Failure, agent.clone())
                    .with_details(self.details(action, reason, summary, extra));
                let name = step.name().clone();
                Plan::new(Write::Cancel(name.clone(), event), move |e, run| match run {
                    Some(run) => format!(
                        "{id}: cancelled run {} of {name} (held by {} on {} pid {} since {}); recorded a cancelled {} \
                         failure (seq {}); the worker is fenced and stops within seconds",
                        run.generation,
                        run.holder.agent,
                        run.holder.host,
                        run.holder.pid,
                        run.started_at,
                        e.event_type,
                        e.seq
                    ),
                    None => format!(
                        "{id}: {name} had no open run; recorded a cancelled {} failure (seq {})",
                        e.event_type, e.seq
                    ),
                })
            }
            Target::Skip(step) => {
                refuse_if_working(batch, [step], action)?;
                let summary = format!("skipped by {agent}: {reason}");
                let extra = json!({"skipped": true, "component": step.name()});
                let event = NewEvent::new(step.event_type().clone(), Outcome::Success, agent.clone())
                    .with_details(self.details(action, reason, summary, extra));
                Plan::new(Write::Append(event), move |e, _| {
                    format!("{id}: recorded a skipped {} success (seq {})", e.event_type, e.seq)
                })
            }
            Target::Prioritize(priority) => {
                let (priority, previous) = (*priority, batch.priority);
                let summary = format!("priority {previous} -> {priority} by {agent}: {reason}");
                let event = NewEvent::new(EventType::new(PRIORITIZED)?, Outcome::Success, agent.clone())
                    .with_details(self.details(action, reason, summary, json!({})));
                Plan::new(Write::Prioritize(priority, event), move |e, _| {
                    format!("{id}: priority {previous} -> {priority} (seq {})", e.seq)
                })
            }
        }
    }
}

/// An action checked against everything but a batch, ready to be planned on any number.
struct Prepared {
    action: Action,
    target: Target,
    /// Trimmed.
    reason: String,
    agent: Agent,
    store: Arc<dyn ObjectStore>,
    pipeline: Vec<Step>,
}

/// The action's checked input.
enum Target {
    Rerun(Step),
    /// `None`: from the first failure.
    Restart(Option<EventType>),
    Cancel(Step),
    Skip(Step),
    Prioritize(i32),
}

/// The one store call an action makes on one batch.
enum Write {
    Append(NewEvent),
    /// Closes the component's open run, if any, in the transaction recording the event.
    Cancel(ComponentName, NewEvent),
    /// Sets the priority in the transaction recording the event.
    Prioritize(i32, NewEvent),
}

impl Write {
    fn event(&self) -> &NewEvent {
        match self {
            Write::Append(event) | Write::Cancel(_, event) | Write::Prioritize(_, event) => event,
        }
    }
}

/// The line `perform` prints, from the event recorded and, for a cancel, the run it closed.
type Message = Box<dyn FnOnce(&Event, Option<&Run>) -> String + Send>;

/// What an action writes on one batch, decided before anything is written.
struct Plan {
    write: Write,
    message: Message,
}

impl Plan {
    fn new(
        write: Write,
        message: impl FnOnce(&Event, Option<&Run>) -> String + Send + 'static,
    ) -> Result<Plan, OperatorError> {
        // The store refuses an event that fails this; a preview must refuse it as well.
        write.event().validate()?;
        Ok(Plan { write, message: Box::new(message) })
    }
}

impl Prepared {
    /// Makes the plan's one store call and reports what changed.
    async fn execute(&self, batch: &Batch, plan: Plan) -> Result<ActionReport, OperatorError> {
        let store = self.store.as_ref();
        let (recorded, closed) = match plan.write {
            Write::Append(event) => (store.append_event(&batch.id, event).await?, None),
            Write::Cancel(component, event) => {
                let cancellation = store.cancel_run(&batch.id, &component, event).await?;
                (cancellation.event, cancellation.run)
            }
            Write::Prioritize(priority, event) => (store.prioritize(&batch.id, priority, event).await?, None),
        };
        Ok(ActionReport {
            batch: batch.id.clone(),
            message: (plan.message)(&recorded, closed.as_ref()),
            changes: changes_since(store, &self.pipeline, batch).await?,
            event: Some(recorded),
        })
    }

    /// The plan applied to a copy of the batch as the store applies it, the event recorded
    /// as `seq` at the batch's store clock.
    fn preview(&self, batch: &Batch, plan: Plan, seq: Seq) -> ActionPreview {
        // The effective view needs the log in seq order, whatever seq the caller expected.
        let last = batch.events.last().map_or(batch.changed_seq, |e| e.seq.max(batch.changed_seq));
        let seq = seq.max(Seq(last.0 + 1));
        let event = plan.write.event().clone().recorded(&batch.id, seq, batch.as_of);
        let mut after = batch.clone();
        let mut closed = None;
        match &plan.write {
            Write::Append(_) => {}
            Write::Cancel(component, _) => {
                closed = batch.open_run(component).map(|run| Run {
                    state: RunState::Cancelled,
                    ended_at: Some(batch.as_of),
                    ..run.clone()
                });
                after.open_runs.retain(|run| run.component != *component);
            }
            Write::Prioritize(priority, _) => after.priority = *priority,
        }
        after.events.push(event.clone());
        after.changed_seq = seq;
        ActionPreview {
            batch: batch.id.clone(),
            action: self.action.to_string(),
            records: event.event_type.to_string(),
            resets: event.resets.clone(),
            changes: changes(&states(&self.pipeline, batch), &states(&self.pipeline, &after)),
            message: (plan.message)(&event, closed.as_ref()),
        }
    }
}

/// The state changes between `before` and the batch as the store holds it now.
async fn changes_since(
    store: &dyn ObjectStore,
    pipeline: &[Step],
    before: &Batch,
) -> Result<Vec<StateChange>, OperatorError> {
    let after = store.get_batch(&before.id).await?;
    Ok(changes(&states(pipeline, before), &states(pipeline, &after)))
}

/// The ids of a bulk action, each once in the order first named, if there are not too many.
fn distinct_within_bound(ids: &[BatchId]) -> Result<Vec<&BatchId>, OperatorError> {
    if ids.len() > MAX_BULK_BATCHES {
        return Err(InvalidInput::new(
            "batch ids",
            format!("{} ids", ids.len()),
            format!("at most {MAX_BULK_BATCHES} batches per bulk action"),
        )
        .into());
    }
    let mut seen = HashSet::new();
    Ok(ids.iter().filter(|id| seen.insert(*id)).collect())
}

/// A bulk action's answer for one batch: its refusal (by the batch's state, or the batch
/// unknown or without the `--from` type) in the words `perform` uses. Any other error is
/// the whole call's.
fn refusal_words(error: OperatorError) -> Result<String, OperatorError> {
    match error {
        OperatorError::Refused(words) => Ok(words),
        OperatorError::Input(invalid) => Ok(invalid.to_string()),
        other => Err(other),
    }
}

impl Operator {
    /// `autocomp pipeline forget`: retires a component from the registry (it no longer
    /// shows in `status`, `show` or the monitor; it comes back if it runs a pass again).
    /// Refused while it holds an open run on any batch: cancel those first.
    pub async fn forget(&self, component: &str, reason: &str) -> Result<String, OperatorError> {
        let reason = check_reason(reason)?;
        let agent = self.agent()?;
        let name = ComponentName::new(component)?;
        let store = self.store().await?;
        let open = store.open_runs(Some(&name)).await?;
        if let Some(run) = open.first() {
            return Err(OperatorError::Refused(format!(
                "{name} is working on {} batch(es) (e.g. {} run {} held by {}); `autocomp cancel` them or wait",
                open.len(),
                run.batch_id,
                run.generation,
                run.holder.agent
            )));
        }
        let retired = match store.retire_component(&name, &agent, reason).await {
            Err(StoreError::Conflict(message)) => return Err(OperatorError::Refused(message)),
            other => other?,
        };
        let seen = retired.last_seen().map_or("never".to_owned(), |t| t.to_string());
        Ok(format!(
            "retired {name} (records {}, last seen {seen}) from the pipeline: {reason}\n",
            retired.descriptor.event_type
        ))
    }
}

#[cfg(test)]
#[path = "preview_tests.rs"]
mod preview_tests;

/// The `event_type`s the component files (`<name>.toml`) in `config_dir` name. A file that
/// is not a component's (or does not parse) names none: it is its component's to report.
fn configured_event_types(config_dir: &Path) -> Vec<EventType> {
    let Ok(entries) = std::fs::read_dir(config_dir) else { return Vec::new() };
    let mut types = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        let name = path.file_stem().and_then(|stem| stem.to_str()).unwrap_or_default();
        let is_component_file = path.extension().is_some_and(|ext| ext == "toml")
            && path.file_name().is_some_and(|file| file != autocomp_framework::config::SHARED_FILE);
        if !is_component_file || name.is_empty() {
            continue;
        }
        match autocomp_framework::config::load(name, None, config_dir) {
            Ok(loaded) => types.extend(loaded.component.event_type.and_then(|t| EventType::new(t).ok())),
            Err(e) => tracing::debug!("{}: not read as a component file: {e}", path.display()),
        }
    }
    types
}
