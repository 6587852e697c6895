//! The operator's writes. Each checks everything first (reason, operator name, component,
//! batch, the batch's state), then makes exactly one store call, which appends one event
//! (or registers one batch). History only grows: a rerun or restart is a `Reset` marker
//! superseding events in the effective view, never an edit.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::Path;

use autocomp_store::{
    Batch, BatchId, BatchType, ComponentName, CreateOutcome, Event, EventType, InvalidInput, NewBatch, NewEvent,
    ObjectStore, Outcome, StoreError,
};
use serde_json::{Value, json};

use autocomp_store::ComponentState;

use super::{Operator, OperatorError, PRIORITIZED, Step, check_reason};

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
        self.report(store, pipeline, batch, recorded, message).await
    }

    async fn report(
        &self,
        store: &dyn ObjectStore,
        pipeline: &[Step],
        batch: &Batch,
        recorded: Event,
        message: impl FnOnce(&Event) -> String,
    ) -> Result<ActionReport, OperatorError> {
        let after = store.get_batch(&batch.id).await?;
        Ok(ActionReport {
            batch: batch.id.clone(),
            message: message(&recorded),
            changes: changes(&states(pipeline, batch), &states(pipeline, &after)),
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

    /// Event types the pipeline records or any trigger mentions.
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
            known.insert(step.event_type());
            known.extend(trigger.requires.iter().chain(&trigger.blocked_by));
            known.extend(trigger.repeat_on_change.iter().chain(&trigger.transiently_failed));
        }
        if known.contains(&event_type) {
            return Ok(event_type);
        }
        let known: Vec<&str> = known.iter().map(|t| t.as_str()).collect();
        Err(InvalidInput::new(
            "event type",
            text,
            format!(
                "no component in the pipeline records it or waits for it (known: {}; `autocomp pipeline` lists \
                 the components)",
                known.join(", ")
            ),
        )
        .into())
    }

    /// `autocomp rerun`: a Reset marker for the component's event type, so its trigger
    /// holds again (if its requirements do). Nothing else changes.
    pub async fn rerun(&self, id: &str, component: &str, reason: &str) -> Result<ActionReport, OperatorError> {
        let reason = check_reason(reason)?;
        let agent = self.agent()?;
        let store = self.store().await?;
        let pipeline = self.pipeline(store.as_ref()).await?;
        let step = self.step(&pipeline, component)?;
        let batch = self.batch(store.as_ref(), id).await?;
        refuse_if_working(&batch, [step], "rerun")?;
        let types = vec![step.event_type().clone()];
        if batch.effective().get(step.event_type()).is_none() {
            return Err(OperatorError::Refused(format!(
                "{} has no {} result on {} to rerun (it is {}); nothing recorded",
                step.name(),
                step.event_type(),
                batch.id,
                step.state_of(&batch)
            )));
        }
        let summary = format!("rerun of {} requested by {agent}: {reason}", step.name());
        let extra = json!({"component": step.name(), "superseded": superseded(&batch, &types)});
        let event = NewEvent::reset(types, agent, self.details("rerun", reason, summary, extra));
        self.append(store.as_ref(), &pipeline, &batch, event, |e| {
            format!(
                "{}: recorded Reset of {} (seq {}): {} may run again",
                batch.id,
                step.event_type(),
                e.seq,
                step.name()
            )
        })
        .await
    }

    /// `autocomp restart`: a Reset marker for the starting type and every type whose
    /// effective event was recorded after it (a higher seq): the steps that ran after the
    /// starting point trigger again, in the order their requirements allow. Operator
    /// bookkeeping (`Prioritized`) is left alone.
    pub async fn restart(&self, id: &str, from: RestartFrom, reason: &str) -> Result<ActionReport, OperatorError> {
        let reason = check_reason(reason)?;
        let agent = self.agent()?;
        // The starting type is checked before the store is touched.
        let start_type = match &from {
            RestartFrom::Type(text) => Some((
                text.as_str(),
                EventType::new(text.as_str()).map_err(|e| InvalidInput::new("--from", text.as_str(), e.reason))?,
            )),
            RestartFrom::FirstFailure => None,
        };
        let store = self.store().await?;
        let pipeline = self.pipeline(store.as_ref()).await?;
        let batch = self.batch(store.as_ref(), id).await?;
        let view = batch.effective();
        let bookkeeping = |e: &&Event| e.event_type.as_str() != PRIORITIZED;
        let start = match &start_type {
            Some((text, start_type)) => view.get(start_type).ok_or_else(|| {
                let effective: Vec<&str> = view.iter().map(|e| e.event_type.as_str()).collect();
                InvalidInput::new(
                    "--from",
                    *text,
                    format!("batch {} has no effective {text} event (effective: {})", batch.id, effective.join(", ")),
                )
            })?,
            None => view
                .iter()
                .filter(bookkeeping)
                .filter(|e| e.outcome == Outcome::Failure)
                .min_by_key(|e| e.seq)
                .ok_or_else(|| OperatorError::Refused(format!("{} has no failed step to restart from", batch.id)))?,
        };
        let mut after: Vec<&Event> = view.iter().filter(bookkeeping).filter(|e| e.seq >= start.seq).collect();
        after.sort_by_key(|e| e.seq);
        let types: Vec<EventType> = after.iter().map(|e| e.event_type.clone()).collect();
        refuse_if_working(&batch, pipeline.iter().filter(|s| types.contains(s.event_type())), "restart")?;
        let named: Vec<&str> = types.iter().map(EventType::as_str).collect();
        let summary = format!("restart from {} (seq {}) requested by {agent}: {reason}", start.event_type, start.seq);
        let extra = json!({"from": start.event_type, "from_seq": start.seq, "superseded": superseded(&batch, &types)});
        let event = NewEvent::reset(types.clone(), agent, self.details("restart", reason, summary, extra));
        let from_type = start.event_type.clone();
        self.append(store.as_ref(), &pipeline, &batch, event, |e| {
            format!(
                "{}: recorded Reset (seq {}) of {} and everything after it: {}",
                batch.id,
                e.seq,
                from_type,
                named.join(", ")
            )
        })
        .await
    }

    /// `autocomp cancel`: fences the component's running worker (its run is closed as
    /// cancelled and the claim generation bumped, in the store, in the same transaction as
    /// the recorded failure flagged `cancelled`). The worker notices within a second, stops,
    /// and cannot record anything. With no open run only the failure is recorded.
    pub async fn cancel(&self, id: &str, component: &str, reason: &str) -> Result<ActionReport, OperatorError> {
        let reason = check_reason(reason)?;
        let agent = self.agent()?;
        let store = self.store().await?;
        let pipeline = self.pipeline(store.as_ref()).await?;
        let step = self.step(&pipeline, component)?;
        let batch = self.batch(store.as_ref(), id).await?;
        let summary = format!("cancelled by {agent}: {reason}");
        let extra = json!({"cancelled": true, "component": step.name()});
        let event = NewEvent::new(step.event_type().clone(), Outcome::Failure, agent)
            .with_details(self.details("cancel", reason, summary, extra));
        let cancellation = store.cancel_run(&batch.id, step.name(), event).await?;
        let run = cancellation.run.clone();
        self.report(store.as_ref(), &pipeline, &batch, cancellation.event, |e| match &run {
            Some(run) => format!(
                "{}: cancelled run {} of {} (held by {} on {} pid {} since {}); recorded a cancelled {} failure (seq {}); \
                 the worker is fenced and stops within seconds",
                batch.id,
                run.generation,
                step.name(),
                run.holder.agent,
                run.holder.host,
                run.holder.pid,
                run.started_at,
                e.event_type,
                e.seq
            ),
            None => format!(
                "{}: {} had no open run; recorded a cancelled {} failure (seq {})",
                batch.id,
                step.name(),
                e.event_type,
                e.seq
            ),
        })
        .await
    }

    /// `autocomp skip`: records a success flagged `skipped` for the component, so the
    /// components that require its event type may run.
    pub async fn skip(&self, id: &str, component: &str, reason: &str) -> Result<ActionReport, OperatorError> {
        let reason = check_reason(reason)?;
        let agent = self.agent()?;
        let store = self.store().await?;
        let pipeline = self.pipeline(store.as_ref()).await?;
        let step = self.step(&pipeline, component)?;
        let batch = self.batch(store.as_ref(), id).await?;
        refuse_if_working(&batch, [step], "skip")?;
        let summary = format!("skipped by {agent}: {reason}");
        let extra = json!({"skipped": true, "component": step.name()});
        let event = NewEvent::new(step.event_type().clone(), Outcome::Success, agent)
            .with_details(self.details("skip", reason, summary, extra));
        self.append(store.as_ref(), &pipeline, &batch, event, |e| {
            format!("{}: recorded a skipped {} success (seq {})", batch.id, e.event_type, e.seq)
        })
        .await
    }

    /// `autocomp prioritize`: the new priority and a `Prioritized` event saying who and
    /// why, in one transaction. Higher runs first.
    pub async fn prioritize(&self, id: &str, priority: i32, reason: &str) -> Result<ActionReport, OperatorError> {
        let reason = check_reason(reason)?;
        let agent = self.agent()?;
        let store = self.store().await?;
        let batch = self.batch(store.as_ref(), id).await?;
        let summary = format!("priority {} -> {priority} by {agent}: {reason}", batch.priority);
        let event = NewEvent::new(EventType::new(PRIORITIZED)?, Outcome::Success, agent).with_details(self.details(
            "prioritize",
            reason,
            summary,
            json!({}),
        ));
        let recorded = store.prioritize(&batch.id, priority, event).await?;
        Ok(ActionReport {
            batch: batch.id.clone(),
            message: format!("{}: priority {} -> {priority} (seq {})", batch.id, batch.priority, recorded.seq),
            event: Some(recorded),
            changes: Vec::new(),
        })
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
