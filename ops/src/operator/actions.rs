//! The operator's writes. Each checks everything first (reason, operator name, component,
//! batch, the batch's state), then makes exactly one store call, which appends one event
//! (or registers one batch). History only grows: a rerun or restart is a `Reset` marker
//! superseding events in the effective view, never an edit.
//!
//! `rerun`, `restart`, `cancel`, `skip` and `prioritize` are each one [`Action`], planned by
//! one function whatever asks for it: the CLI performs the plan, the monitor previews it
//! first (the same checks and refusals, the event it would append and the state changes
//! that follow) and may act on many batches at once.
//!
//! **Honest answers.** Every answer names exactly what was written: the event's type, seq
//! and outcome (and flags), and for a `Reset` the types it supersedes. `skip` over a
//! success that counts is refused unless forced; `cancel` with no open run is refused unless
//! asked to record the cancelled failure anyway.
//!
//! **Confirming what was previewed, once.** A preview carries a plan token
//! ([`ActionPreview::plan`]: the batch's version, its `changed_seq`, and the write planned
//! against it); [`Operator::perform_confirmed`] re-plans and acts only if both are still
//! the same, else refuses saying what changed. A bulk preview's token is a digest of the
//! distinct ids with each batch's version and planned write ([`BulkPreview::plan`]). A
//! confirm may carry an idempotency key: it is recorded in the event's details (and given
//! to the store as the append's key, where the store takes one), and a confirm whose key
//! the batch's log already holds writes nothing and answers "already done" with the earlier
//! seq. Within one process the writes on one batch are made one at a time (look for the key,
//! re-plan, write), so a double submit cannot slip between the look and the write; across
//! processes the store's idempotency key closes that gap for appends (rerun, restart,
//! skip), while `cancel_run` and `prioritize` take no key in the store yet.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt::{self, Write as _};
use std::path::Path;
use std::sync::{Arc, LazyLock, Mutex, Weak};

use autocomp_model::{
    Agent, Batch, BatchId, BatchType, ComponentName, ComponentState, Event, EventType, IdempotencyKey, InvalidInput,
    NewBatch, NewEvent, Outcome, Run, RunState, Seq,
};
use autocomp_store::{CreateOutcome, ObjectStore, StoreError};
use autocomp_store::prelude::*;
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};

use super::views::{Format, json_document};
use super::{Operator, OperatorError, PRIORITIZED, Step, check_reason, unknown_batch};

/// The key of an operator event's details that holds the idempotency key of the request
/// that wrote it.
const KEY_DETAIL: &str = "idempotency_key";

/// Most batches one bulk action may name: bounds the work (and the store reads) of one
/// request.
pub const MAX_BULK_BATCHES: usize = 10_000;

/// How many previews and refusals a bulk preview shows.
const BULK_SAMPLE: usize = 10;

/// Batches read per store call by a bulk preview.
const BULK_READ_PAGE: usize = 500;

mod form;

pub use form::{ActionForm, checkbox};

/// Where `restart` starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RestartFrom {
    /// The effective failure with the lowest seq.
    FirstFailure,
    /// This event type's effective event.
    Type(String),
}

impl RestartFrom {
    /// How a form names the first failure (`from=first-failure`); any other value is a type.
    pub const FIRST_FAILURE: &'static str = "first-failure";
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
    /// One line: what was recorded (type, seq, outcome; for a Reset the types it
    /// supersedes), or that the request was already done and at which seq.
    pub message: String,
    /// The event appended, if any (`add` registers a batch, no event); for a request already
    /// done, the event it recorded earlier.
    pub event: Option<Event>,
    pub changes: Vec<StateChange>,
    /// The request's idempotency key was found in the batch's log: nothing was written now,
    /// `event` is what the earlier attempt recorded.
    pub already_done: bool,
}

impl ActionReport {
    pub fn render(&self) -> String {
        let mut out = format!("{}\n", self.message);
        for change in &self.changes {
            writeln!(out, "  {}: {} -> {}", change.component, change.before, change.after).ok();
        }
        out
    }

    /// `batch`, `already_done`, `event` (`seq`, `type`, `outcome`, `agent`, `at`, and
    /// `resets` with `supersedes` for a Reset, `flags`), `changes`, `message`.
    pub fn to_json(&self) -> Value {
        let changes: Vec<Value> = self
            .changes
            .iter()
            .map(|c| json!({"component": c.component, "before": c.before.as_str(), "after": c.after.as_str()}))
            .collect();
        json!({
            "batch": self.batch,
            "already_done": self.already_done,
            "event": self.event.as_ref().map(event_json),
            "changes": changes,
            "message": self.message,
        })
    }

    pub fn render_as(&self, format: Format) -> String {
        match format {
            Format::Text => self.render(),
            Format::Json => json_document(&self.to_json()),
        }
    }
}

/// What an event is, for an answer: everything but the details' free text.
fn event_json(event: &Event) -> Value {
    let flags: Vec<&str> = ["cancelled", "skipped", "transient"].into_iter().filter(|f| event.flag(f)).collect();
    let mut value = json!({
        "seq": event.seq,
        "type": event.event_type,
        "outcome": event.outcome.as_str(),
        "agent": event.agent,
        "at": event.at,
        "flags": flags,
    });
    if event.event_type.is_reset() {
        value["resets"] = json!(event.resets);
        value["supersedes"] = event.details.get("superseded").cloned().unwrap_or_else(|| json!([]));
    }
    value
}

/// Exactly what an event is: `Reset (seq 12, success) superseding Checked, Audited`,
/// `Probed (seq 13, failure, flagged cancelled)`.
fn wrote(event: &Event) -> String {
    let mut out = format!("{} (seq {}, {}", event.event_type, event.seq, event.outcome.as_str());
    for flag in ["cancelled", "skipped"] {
        if event.flag(flag) {
            write!(out, ", flagged {flag}").ok();
        }
    }
    out.push(')');
    if !event.resets.is_empty() {
        let types: Vec<&str> = event.resets.iter().map(EventType::as_str).collect();
        write!(out, " superseding {}", types.join(", ")).ok();
    }
    out
}

/// An operator's action on one batch: what the CLI's `rerun`, `restart`, `cancel`, `skip`
/// and `prioritize` do, for callers that preview an action before performing it. It
/// (de)serializes as the fields of the monitor's action form ([`ActionForm`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "ActionForm", into = "ActionForm")]
pub enum Action {
    /// A Reset marker for the component's event type: it runs again if its trigger holds.
    Rerun { component: String },
    /// A Reset marker for the starting type and every type recorded after it.
    Restart { from: RestartFrom },
    /// Fences the component's running worker and records a failure flagged `cancelled`.
    /// With no open run it is refused unless `record_anyway`.
    Cancel { component: String, record_anyway: bool },
    /// Records a success flagged `skipped` for the component. Over a success that counts
    /// (not skipped, not stale) it is refused unless `force`.
    Skip { component: String, force: bool },
    /// Sets the batch's priority (higher runs first) and records `Prioritized`.
    Prioritize { priority: i32 },
    /// A person's approval at a human step (a manual component) the batch waits at: its
    /// event, a success flagged `approved`.
    Approve { step: String },
    /// A person's rejection at a human step: its event, a failure flagged `rejected`; with
    /// `restart_from`, instead a Reset from that type (as `restart --from`) flagged
    /// `rejected`, so the batch goes back to be redone and comes to the step again.
    Reject { step: String, restart_from: Option<String> },
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
            Action::Approve { .. } => "approve",
            Action::Reject { .. } => "reject",
        }
    }

    /// The component it names, if any.
    fn component(&self) -> Option<&str> {
        match self {
            Action::Rerun { component } | Action::Cancel { component, .. } | Action::Skip { component, .. } => {
                Some(component)
            }
            Action::Approve { step } | Action::Reject { step, .. } => Some(step),
            Action::Restart { .. } | Action::Prioritize { .. } => None,
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
            Action::Cancel { component, record_anyway: false } => {
                write!(f, "cancel {component}: stop its running worker and record a cancelled failure")
            }
            Action::Cancel { component, record_anyway: true } => write!(
                f,
                "cancel {component}: stop its running worker, if any, and record a cancelled failure (even with no \
                 worker running)"
            ),
            Action::Skip { component, force: false } => {
                write!(f, "skip {component}: record a skipped success so the steps after it may run")
            }
            Action::Skip { component, force: true } => write!(
                f,
                "skip {component}: record a skipped success so the steps after it may run (forced: even over a \
                 success)"
            ),
            Action::Prioritize { priority } => {
                write!(f, "prioritize: set the priority to {priority} (higher runs first)")
            }
            Action::Approve { step } => write!(f, "approve {step}: record its success, so the steps after it may run"),
            Action::Reject { step, restart_from: None } => {
                write!(f, "reject {step}: record its failure (it stays failed until rerun)")
            }
            Action::Reject { step, restart_from: Some(start) } => write!(
                f,
                "reject {step} and restart from {start}: supersede {start} and every result recorded after it, so \
                 the batch is redone from there and comes to {step} again"
            ),
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
    /// The outcome of the event it would append.
    pub outcome: Outcome,
    /// The types a `Reset` would supersede; empty for the other actions.
    pub resets: Vec<EventType>,
    /// The components whose state would change. `perform` reports the same changes unless
    /// the batch changes in between (or a `settled_for` clause comes due meanwhile).
    pub changes: Vec<StateChange>,
    /// The message `perform` would print, with the seq the store would assign next if
    /// nothing else were written first.
    pub message: String,
    /// The batch's version the plan was made against: its `changed_seq`, which every event,
    /// claim and release moves (what the CLI's `--expect-version` compares).
    pub version: Seq,
    /// The plan token: the version and the planned write, for a confirm to post back
    /// ([`Operator::perform_confirmed`] acts only if both are unchanged).
    pub plan: String,
}

impl ActionPreview {
    /// The CLI's `--dry-run`: what it would record, the state changes, the version.
    pub fn render_as(&self, format: Format) -> String {
        match format {
            Format::Json => {
                let changes: Vec<Value> = self
                    .changes
                    .iter()
                    .map(|c| json!({"component": c.component, "before": c.before.as_str(), "after": c.after.as_str()}))
                    .collect();
                json_document(&json!({
                    "batch": self.batch,
                    "action": self.action,
                    "records": self.records,
                    "outcome": self.outcome.as_str(),
                    "resets": self.resets,
                    "changes": changes,
                    "message": self.message,
                    "version": self.version,
                    "plan": self.plan,
                }))
            }
            Format::Text => {
                let mut out = format!("dry run, nothing written: {}\nit would say: {}\n", self.action, self.message);
                for change in &self.changes {
                    writeln!(out, "  {}: {} -> {}", change.component, change.before, change.after).ok();
                }
                writeln!(
                    out,
                    "batch version {0}: add `--expect-version {0}` to act only if {1} has not changed since",
                    self.version, self.batch
                )
                .ok();
                out
            }
        }
    }
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
    /// The plan token: `TOTAL:DIGEST`, the SHA-256 (hex) of the distinct ids in order, each
    /// with its version and planned write (or refusal), for a confirm to post back
    /// ([`Operator::perform_many_confirmed`] acts only if it is unchanged).
    pub plan: String,
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
            already_done: false,
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
        Ok(ActionReport { batch: id, message, event: None, changes: Vec::new(), already_done: false })
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
        self.append(store.as_ref(), &pipeline, &batch, event, |e| format!("{}: recorded {}", batch.id, wrote(e))).await
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
    /// and cannot record anything. With no open run it is refused (see [`Action::Cancel`]'s
    /// `record_anyway`).
    pub async fn cancel(&self, id: &str, component: &str, reason: &str) -> Result<ActionReport, OperatorError> {
        self.perform(id, &Action::Cancel { component: component.to_owned(), record_anyway: false }, reason).await
    }

    /// `autocomp skip`: records a success flagged `skipped` for the component, so the
    /// components that require its event type may run. Over a success it is refused (see
    /// [`Action::Skip`]'s `force`).
    pub async fn skip(&self, id: &str, component: &str, reason: &str) -> Result<ActionReport, OperatorError> {
        self.perform(id, &Action::Skip { component: component.to_owned(), force: false }, reason).await
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
        self.perform_prepared(&prepared, id, Expect::Nothing, None).await
    }

    /// `perform` as the CLI's `--expect-version` and `--key` ask: refused (an input error
    /// naming `--expect-version`, exit 2) unless the batch's version (its `changed_seq`) is
    /// still `version`; with `key`, a request whose key the batch's log already holds writes
    /// nothing and answers "already done" naming the earlier seq.
    pub async fn perform_expecting(
        &self,
        id: &str,
        action: &Action,
        reason: &str,
        version: Option<Seq>,
        key: Option<&IdempotencyKey>,
    ) -> Result<ActionReport, OperatorError> {
        let prepared = self.prepare(action, reason).await?;
        let expect = version.map_or(Expect::Nothing, Expect::Version);
        self.perform_prepared(&prepared, id, expect, key).await
    }

    /// Confirms a preview: `plan` is its [`ActionPreview::plan`], `key` the confirm's
    /// idempotency key. A request whose key the batch's log already holds writes nothing and
    /// answers "already done" naming the earlier seq; otherwise the action is re-planned and
    /// performed only if the batch's version and the planned write are those previewed, else
    /// it is refused (`OperatorError::Refused`) saying what changed, with nothing written.
    pub async fn perform_confirmed(
        &self,
        id: &str,
        action: &Action,
        reason: &str,
        plan: &str,
        key: &IdempotencyKey,
    ) -> Result<ActionReport, OperatorError> {
        let prepared = self.prepare(action, reason).await?;
        let token = PlanToken::parse(plan)?;
        self.perform_prepared(&prepared, id, Expect::Plan(token), Some(key)).await
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
        let mut preview = BulkPreview {
            total: ids.len(),
            applicable: 0,
            sample: Vec::new(),
            refused: Vec::new(),
            plan: String::new(),
        };
        let mut digest = BulkDigest::default();
        for page in ids.chunks(BULK_READ_PAGE) {
            let (page, mut found) = batches_by_id(prepared.store.as_ref(), page).await?;
            for id in page {
                let batch = found.remove(&id);
                let planned = match &batch {
                    Some(batch) => self.plan(&prepared, batch),
                    None => Err(unknown_batch(id.as_str()).into()),
                };
                digest.add(&id, batch.as_ref(), planned.as_ref().ok());
                match (batch, planned) {
                    (Some(batch), Ok(plan)) => {
                        preview.applicable += 1;
                        // Performed in this order, each appends one event.
                        next = Seq(next.0 + 1);
                        if preview.sample.len() < BULK_SAMPLE {
                            preview.sample.push(prepared.preview(&batch, plan, next));
                        }
                    }
                    (_, planned) => {
                        let error = planned.err().unwrap_or_else(|| unknown_batch(id.as_str()).into());
                        let words = refusal_words(error)?;
                        if preview.refused.len() < BULK_SAMPLE {
                            preview.refused.push((id, words));
                        }
                    }
                }
            }
        }
        preview.plan = digest.token();
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
        let plans = ids.iter().map(|id| (*id, Expect::Nothing, None)).collect();
        Ok(self.perform_each(&prepared, plans).await)
    }

    /// Confirms a bulk preview: `plan` is its [`BulkPreview::plan`], `key` the confirm's
    /// idempotency key (each batch's key is derived from it and the batch id). Unless some
    /// batch's log already holds its key (a repeated confirm: what it did is answered as
    /// already done, and the rest is done), the ids, their versions and planned writes must
    /// be those previewed, else it is refused (`OperatorError::Refused`) saying so, with
    /// nothing written; each batch is then written only if it did not change since this
    /// check (else it is listed as refused).
    pub async fn perform_many_confirmed(
        &self,
        ids: &[BatchId],
        action: &Action,
        reason: &str,
        plan: &str,
        key: &IdempotencyKey,
    ) -> Result<BulkOutcome, OperatorError> {
        let ids = distinct_within_bound(ids)?;
        let prepared = self.prepare(action, reason).await?;
        let (previewed, _) = BulkDigest::parse(plan)?;
        let keys: HashMap<&BatchId, IdempotencyKey> = ids.iter().map(|id| (*id, derived_key(key, id))).collect();
        let mut digest = BulkDigest::default();
        let mut versions: HashMap<BatchId, Seq> = HashMap::new();
        let mut repeated = false;
        for page in ids.chunks(BULK_READ_PAGE) {
            let (page, mut found) = batches_by_id(prepared.store.as_ref(), page).await?;
            for id in page {
                let batch = found.remove(&id);
                let planned = batch.as_ref().map(|batch| self.plan(&prepared, batch));
                digest.add(&id, batch.as_ref(), planned.as_ref().and_then(|p| p.as_ref().ok()));
                if let Some(batch) = batch {
                    repeated |= keyed(&batch, &keys[&id]).is_some();
                    versions.insert(id, batch.changed_seq);
                }
            }
        }
        let now = digest.token();
        if !repeated && now != plan {
            let (count, _) = BulkDigest::parse(&now)?;
            return Err(OperatorError::Refused(format!(
                "the batches changed since your preview ({previewed} batches then, {count} now; a batch was written \
                 since, or what the action would write on it differs): nothing was done; review and confirm again"
            )));
        }
        let plans = ids
            .iter()
            .map(|id| {
                // A repeated confirm does what the first left undone, as the batches are now.
                let expect = match versions.get(*id) {
                    Some(version) if !repeated => Expect::Batch(*version),
                    _ => Expect::Nothing,
                };
                (*id, expect, Some(&keys[id]))
            })
            .collect();
        Ok(self.perform_each(&prepared, plans).await)
    }

    async fn perform_each(
        &self,
        prepared: &Arc<Prepared>,
        plans: Vec<(&BatchId, Expect, Option<&IdempotencyKey>)>,
    ) -> BulkOutcome {
        let mut outcome = BulkOutcome { performed: Vec::new(), refused: Vec::new(), stopped: None };
        for (id, expect, key) in plans {
            match self.perform_prepared(prepared, id.as_str(), expect, key).await {
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
        outcome
    }

    /// The one way an action is performed on one batch: one write at a time on the batch in
    /// this process; the request's key looked for in the log; the expectation checked; the
    /// plan made and written. It runs as a task of its own, so a caller that gives up (a web
    /// request whose client went away) cannot end it between the write and the end of its
    /// turn on the batch: the next request with the same key finds the write.
    async fn perform_prepared(
        &self,
        prepared: &Arc<Prepared>,
        id: &str,
        expect: Expect,
        key: Option<&IdempotencyKey>,
    ) -> Result<ActionReport, OperatorError> {
        let (operator, prepared, id, key) = (self.clone(), Arc::clone(prepared), id.to_owned(), key.cloned());
        let task = tokio::spawn(async move { operator.perform_in_turn(&prepared, &id, expect, key.as_ref()).await });
        match task.await {
            Ok(answer) => answer,
            Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
            Err(error) => Err(StoreError::Unavailable(format!(
                "the write was cancelled ({error}: the process is shutting down); whether it was made, `autocomp \
                 show` tells"
            ))
            .into()),
        }
    }

    async fn perform_in_turn(
        &self,
        prepared: &Prepared,
        id: &str,
        expect: Expect,
        key: Option<&IdempotencyKey>,
    ) -> Result<ActionReport, OperatorError> {
        let valid = BatchId::new(id)?;
        let _turn = one_at_a_time(&prepared.store, &valid).await;
        let batch = self.batch(prepared.store.as_ref(), id).await?;
        if let Some(key) = key
            && let Some(earlier) = keyed(&batch, key)
        {
            return prepared.already_done(&batch, earlier, key);
        }
        let now = batch.changed_seq;
        match &expect {
            Expect::Nothing => {}
            Expect::Version(version) if *version != now => {
                return Err(InvalidInput::new(
                    "--expect-version",
                    version.to_string(),
                    format!(
                        "batch {id} is at version {now} now: it changed since (`autocomp show {id}` tells how); \
                         nothing was done"
                    ),
                )
                .into());
            }
            Expect::Plan(token) if token.version != now => {
                return Err(OperatorError::Refused(format!(
                    "the batch changed since your preview (seq {} -> {now}): nothing was done; review and confirm \
                     again",
                    token.version
                )));
            }
            Expect::Batch(version) if *version != now => {
                return Err(OperatorError::Refused(format!(
                    "{id} changed since the preview was checked (seq {version} -> {now}): nothing was done on it"
                )));
            }
            Expect::Version(_) | Expect::Plan(_) | Expect::Batch(_) => {}
        }
        let plan = self.plan(prepared, &batch)?;
        if let Expect::Plan(token) = &expect {
            let writes = plan.write.describe();
            if token.writes != writes {
                return Err(OperatorError::Refused(format!(
                    "what this action would write changed since your preview ({} -> {writes}): nothing was done; \
                     review and confirm again",
                    token.writes
                )));
            }
        }
        prepared.execute(&batch, plan, key).await
    }

    /// Every check that does not depend on the batch, in the order the CLI has always made
    /// them, so the same bad input gets the same error whichever check it fails first.
    async fn prepare(&self, action: &Action, reason: &str) -> Result<Arc<Prepared>, OperatorError> {
        let reason = check_reason(reason)?.to_owned();
        let agent = self.agent()?;
        // The starting type is checked before the store is touched.
        let start_type = match action {
            Action::Restart { from: RestartFrom::Type(text) } => {
                Some(EventType::new(text.as_str()).map_err(|e| InvalidInput::new("--from", text.as_str(), e.reason))?)
            }
            Action::Reject { restart_from: Some(text), .. } => Some(
                EventType::new(text.as_str())
                    .map_err(|e| InvalidInput::new("--restart-from", text.as_str(), e.reason))?,
            ),
            _ => None,
        };
        let store = self.store().await?;
        let pipeline = self.pipeline(store.as_ref()).await?;
        let step = |component: &str| self.step(&pipeline, component).cloned();
        let target = match action {
            Action::Rerun { component } => Target::Rerun(step(component)?),
            Action::Restart { .. } => Target::Restart(start_type),
            Action::Cancel { component, record_anyway } => Target::Cancel(step(component)?, *record_anyway),
            Action::Skip { component, force } => Target::Skip(step(component)?, *force),
            Action::Prioritize { priority } => Target::Prioritize(*priority),
            Action::Approve { step: name } => Target::Approve(human_step(step(name)?)?),
            Action::Reject { step: name, .. } => Target::Reject(human_step(step(name)?)?, start_type),
        };
        Ok(Arc::new(Prepared { action: action.clone(), target, reason, agent, store, pipeline }))
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
                let name = step.name().clone();
                Plan::new(Write::Append(event), move |e, _| {
                    format!("{id}: recorded {}: {name} may run again", wrote(e))
                })
            }
            Target::Restart(start_type) => {
                let (start, types) = restart_span(batch, start_type.as_ref(), "--from")?;
                refuse_if_working(batch, prepared.pipeline.iter().filter(|s| types.contains(s.event_type())), action)?;
                let summary =
                    format!("restart from {} (seq {}) requested by {agent}: {reason}", start.event_type, start.seq);
                let extra =
                    json!({"from": start.event_type, "from_seq": start.seq, "superseded": superseded(batch, &types)});
                let event = NewEvent::reset(types, agent.clone(), self.details(action, reason, summary, extra));
                let (from_type, from_seq) = (start.event_type.clone(), start.seq);
                Plan::new(Write::Append(event), move |e, _| {
                    format!(
                        "{id}: recorded {}: restart from {from_type} (seq {from_seq}) and everything recorded after it",
                        wrote(e)
                    )
                })
            }
            Target::Approve(step) => {
                refuse_unless_waiting_for_a_person(step, batch, action)?;
                let summary = format!("approved by {agent}: {reason}");
                let extra = json!({"approved": true, "component": step.name()});
                let event = NewEvent::new(step.event_type().clone(), Outcome::Success, agent.clone())
                    .with_details(self.details(action, reason, summary, extra));
                let name = step.name().clone();
                Plan::new(Write::Append(event), move |e, _| {
                    format!("{id}: recorded {}: approved at {name}; the steps after it may run", wrote(e))
                })
            }
            Target::Reject(step, None) => {
                refuse_unless_waiting_for_a_person(step, batch, action)?;
                let summary = format!("rejected by {agent}: {reason}");
                let extra = json!({"rejected": true, "component": step.name()});
                let event = NewEvent::new(step.event_type().clone(), Outcome::Failure, agent.clone())
                    .with_details(self.details(action, reason, summary, extra));
                let name = step.name().clone();
                Plan::new(Write::Append(event), move |e, _| {
                    format!("{id}: recorded {}: rejected at {name}; it stays failed until rerun", wrote(e))
                })
            }
            Target::Reject(step, Some(start_type)) => {
                refuse_unless_waiting_for_a_person(step, batch, action)?;
                let (start, types) = restart_span(batch, Some(start_type), "--restart-from")?;
                refuse_if_working(batch, prepared.pipeline.iter().filter(|s| types.contains(s.event_type())), action)?;
                let summary = format!(
                    "rejected at {} by {agent}, restart from {} (seq {}): {reason}",
                    step.name(),
                    start.event_type,
                    start.seq
                );
                let extra = json!({"rejected": true, "component": step.name(), "from": start.event_type,
                                   "from_seq": start.seq, "superseded": superseded(batch, &types)});
                let event = NewEvent::reset(types, agent.clone(), self.details(action, reason, summary, extra));
                let (name, from_type) = (step.name().clone(), start.event_type.clone());
                Plan::new(Write::Append(event), move |e, _| {
                    format!(
                        "{id}: recorded {}: rejected at {name}; restart from {from_type}: the batch is redone from \
                         there and comes to {name} again",
                        wrote(e)
                    )
                })
            }
            Target::Cancel(step, record_anyway) => {
                let name = step.name().clone();
                let open = batch.open_run(&name);
                if open.is_none() && !record_anyway {
                    return Err(OperatorError::Refused(format!(
                        "{name} has no open run on {}: nothing to cancel; --record-anyway records a cancelled failure \
                         anyway",
                        batch.id
                    )));
                }
                let summary = format!("cancelled by {agent}: {reason}");
                let extra = json!({"cancelled": true, "component": step.name()});
                let event = NewEvent::new(step.event_type().clone(), Outcome::Failure, agent.clone())
                    .with_details(self.details(action, reason, summary, extra));
                let planned_a_run = open.is_some();
                Plan::new(Write::Cancel(name.clone(), event), move |e, run| match run {
                    Some(run) => format!(
                        "{id}: recorded {}: cancelled run {} of {name} (held by {} on {} pid {} since {}); the worker \
                         is fenced and stops within seconds",
                        wrote(e),
                        run.generation,
                        run.holder.agent,
                        run.holder.host,
                        run.holder.pid,
                        run.started_at,
                    ),
                    None if planned_a_run => format!(
                        "{id}: recorded {}: {name}'s run ended before the cancel reached the store, so no run was \
                         cancelled; the failure is recorded all the same",
                        wrote(e)
                    ),
                    None => format!("{id}: recorded {}: {name} had no open run; recorded anyway as asked", wrote(e)),
                })
            }
            Target::Skip(step, force) => {
                refuse_if_working(batch, [step], action)?;
                // A success that counts: not an earlier skip, not worked out from content the
                // batch no longer has.
                let success = batch
                    .effective()
                    .get(step.event_type())
                    .filter(|e| e.outcome == Outcome::Success && !e.is_skipped() && !e.is_stale_at(batch.modified_seq));
                if let Some(success) = success
                    && !force
                {
                    return Err(OperatorError::Refused(format!(
                        "{} already succeeded on {}: its effective {} is a success (seq {}, by {}); a skip would \
                         record a skipped success over it; nothing recorded; --force skips anyway",
                        step.name(),
                        batch.id,
                        success.event_type,
                        success.seq,
                        success.agent
                    )));
                }
                let summary = format!("skipped by {agent}: {reason}");
                let mut extra = json!({"skipped": true, "component": step.name()});
                if let Some(success) = success {
                    extra["forced_over"] = json!({"seq": success.seq, "agent": success.agent});
                }
                let over = success.map(|e| e.seq);
                let event = NewEvent::new(step.event_type().clone(), Outcome::Success, agent.clone())
                    .with_details(self.details(action, reason, summary, extra));
                let name = step.name().clone();
                Plan::new(Write::Append(event), move |e, _| match over {
                    Some(over) => format!(
                        "{id}: recorded {} over {name}'s success (seq {over}), as forced: the steps after {name} may \
                         run",
                        wrote(e)
                    ),
                    None => format!("{id}: recorded {}: the steps after {name} may run", wrote(e)),
                })
            }
            Target::Prioritize(priority) => {
                let (priority, previous) = (*priority, batch.priority);
                let summary = format!("priority {previous} -> {priority} by {agent}: {reason}");
                let event = NewEvent::new(EventType::new(PRIORITIZED)?, Outcome::Success, agent.clone())
                    .with_details(self.details(action, reason, summary, json!({})));
                Plan::new(Write::Prioritize(priority, event), move |e, _| {
                    format!("{id}: recorded {}: priority {previous} -> {priority}", wrote(e))
                })
            }
        }
    }
}

/// Where a restart starts on `batch` (the effective event of `start_type`, or the first
/// effective failure) and the types it supersedes: that one and every type recorded after it,
/// operator bookkeeping (`Prioritized`) left alone. `field` names the option for errors.
fn restart_span<'b>(
    batch: &'b Batch,
    start_type: Option<&EventType>,
    field: &str,
) -> Result<(&'b Event, Vec<EventType>), OperatorError> {
    let view = batch.effective();
    let bookkeeping = |e: &&Event| e.event_type.as_str() != PRIORITIZED;
    let start = match start_type {
        Some(start_type) => view.get(start_type).ok_or_else(|| {
            let text = start_type.as_str();
            let effective: Vec<&str> = view.iter().map(|e| e.event_type.as_str()).collect();
            InvalidInput::new(
                field,
                text,
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
    Ok((start, after.iter().map(|e| e.event_type.clone()).collect()))
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
    /// With `record_anyway`.
    Cancel(Step, bool),
    /// With `force`.
    Skip(Step, bool),
    Prioritize(i32),
    /// A human step.
    Approve(Step),
    /// A human step, and the type to restart from, if any.
    Reject(Step, Option<EventType>),
}

/// `step` if it is a human step (a manual component), else an input error naming it.
fn human_step(step: Step) -> Result<Step, OperatorError> {
    if step.descriptor().manual {
        return Ok(step);
    }
    Err(InvalidInput::new(
        "step",
        step.name().as_str(),
        "not a human step: a component works on it (`autocomp step add` declares a step a person decides)",
    )
    .into())
}

/// A human step's decision needs the batch to be waiting for a person there.
fn refuse_unless_waiting_for_a_person(step: &Step, batch: &Batch, action: &str) -> Result<(), OperatorError> {
    let state = step.state_of(batch);
    if state == ComponentState::Person {
        return Ok(());
    }
    Err(OperatorError::Refused(format!(
        "{} is not waiting for a person at {} (it is {state}); nothing recorded (an {action} decides a batch the step \
         is ready for)",
        batch.id,
        step.name()
    )))
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

    fn event_mut(&mut self) -> &mut NewEvent {
        match self {
            Write::Append(event) | Write::Cancel(_, event) | Write::Prioritize(_, event) => event,
        }
    }

    /// What it writes, for a plan token: `Reset/success/Checked,Audited`, `Probed/failure`,
    /// `Prioritized/success/priority=5`.
    fn describe(&self) -> String {
        let event = self.event();
        let mut out = format!("{}/{}", event.event_type, event.outcome.as_str());
        if !event.resets.is_empty() {
            let types: Vec<&str> = event.resets.iter().map(EventType::as_str).collect();
            write!(out, "/{}", types.join(",")).ok();
        }
        if let Write::Prioritize(priority, _) = self {
            write!(out, "/priority={priority}").ok();
        }
        out
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

/// What a write must still match when it is made.
enum Expect {
    Nothing,
    /// The CLI's `--expect-version`: the batch's version.
    Version(Seq),
    /// A confirmed preview's plan token: the version and the planned write.
    Plan(PlanToken),
    /// A bulk confirm's check: the version read when the digest was checked.
    Batch(Seq),
}

/// A single preview's plan token, `VERSION:WRITES` ([`Write::describe`]).
struct PlanToken {
    version: Seq,
    writes: String,
}

impl PlanToken {
    fn new(version: Seq, write: &Write) -> PlanToken {
        PlanToken { version, writes: write.describe() }
    }

    fn parse(text: &str) -> Result<PlanToken, InvalidInput> {
        let bad = || InvalidInput::new("plan", text, "expected VERSION:WRITES, as the preview's confirm form posts it");
        let (version, writes) = text.split_once(':').ok_or_else(bad)?;
        let version = version.parse::<i64>().map_err(|_| bad())?;
        if writes.is_empty() {
            return Err(bad());
        }
        Ok(PlanToken { version: Seq(version), writes: writes.to_owned() })
    }
}

impl fmt::Display for PlanToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.version, self.writes)
    }
}

/// A bulk preview's plan token, `TOTAL:SHA256`: the distinct ids in order, each with its
/// version and planned write, or `-` for an id with no batch and `refused` for a refusal.
#[derive(Default)]
struct BulkDigest {
    lines: BTreeMap<String, String>,
}

impl BulkDigest {
    fn add(&mut self, id: &BatchId, batch: Option<&Batch>, plan: Option<&Plan>) {
        let version = batch.map_or("-".to_owned(), |b| b.changed_seq.to_string());
        let writes = plan.map_or("refused".to_owned(), |p| p.write.describe());
        self.lines.insert(id.as_str().to_owned(), format!("{version}\t{writes}"));
    }

    fn token(&self) -> String {
        let mut hash = Sha256::new();
        for (id, line) in &self.lines {
            hash.update(id.as_bytes());
            hash.update(b"\t");
            hash.update(line.as_bytes());
            hash.update(b"\n");
        }
        format!("{}:{}", self.lines.len(), hex::encode(hash.finalize()))
    }

    /// The count and the digest of a token.
    fn parse(text: &str) -> Result<(usize, String), InvalidInput> {
        let bad =
            || InvalidInput::new("plan", text, "expected COUNT:DIGEST, as the bulk preview's confirm form posts it");
        let (count, digest) = text.split_once(':').ok_or_else(bad)?;
        let count = count.parse::<usize>().map_err(|_| bad())?;
        if digest.len() != 64 || !digest.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad());
        }
        Ok((count, digest.to_owned()))
    }
}

/// Each batch's key of a bulk confirm: the SHA-256 (hex) of the bulk key and the batch id.
fn derived_key(bulk: &IdempotencyKey, batch: &BatchId) -> IdempotencyKey {
    let mut hash = Sha256::new();
    hash.update(bulk.as_str().as_bytes());
    hash.update(b"\n");
    hash.update(batch.as_str().as_bytes());
    IdempotencyKey::new(hex::encode(hash.finalize())).expect("64 hex digits are a valid idempotency key")
}

/// The event of the batch's log a request with `key` recorded, if any.
fn keyed<'b>(batch: &'b Batch, key: &IdempotencyKey) -> Option<&'b Event> {
    batch.events.iter().find(|e| e.details.get(KEY_DETAIL).and_then(Value::as_str) == Some(key.as_str()))
}

/// Per (store, batch) in this process: the writes on one batch go one at a time, so a
/// request looks for its key and re-plans only after the one before it wrote.
type Turns = Mutex<HashMap<(usize, BatchId), Weak<tokio::sync::Mutex<()>>>>;
static TURNS: LazyLock<Turns> = LazyLock::new(Turns::default);

async fn one_at_a_time(store: &Arc<dyn ObjectStore>, batch: &BatchId) -> tokio::sync::OwnedMutexGuard<()> {
    let key = (Arc::as_ptr(store).cast::<()>() as usize, batch.clone());
    let turn = {
        let mut turns = TURNS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        turns.retain(|_, turn| turn.strong_count() > 0);
        match turns.get(&key).and_then(Weak::upgrade) {
            Some(turn) => turn,
            None => {
                let turn = Arc::new(tokio::sync::Mutex::new(()));
                turns.insert(key, Arc::downgrade(&turn));
                turn
            }
        }
    };
    turn.lock_owned().await
}

impl Prepared {
    /// Makes the plan's one store call and reports what changed. With `key`, the event's
    /// details record it, and an append gives it to the store as the append's idempotency
    /// key: a concurrent request with the same key from another process gets this event back
    /// instead of writing a second.
    async fn execute(
        &self,
        batch: &Batch,
        plan: Plan,
        key: Option<&IdempotencyKey>,
    ) -> Result<ActionReport, OperatorError> {
        let store = self.store.as_ref();
        let Plan { mut write, message } = plan;
        let mut head = None;
        if let Some(key) = key {
            let event = write.event_mut();
            if let Value::Object(details) = &mut event.details {
                details.insert(KEY_DETAIL.into(), json!(key));
            }
            if let Write::Append(event) = &mut write {
                event.idempotency_key = Some(key.clone());
                head = Some(store.head().await?);
            }
        }
        let (recorded, closed) = match write {
            Write::Append(event) => match store.append_event(&batch.id, event).await {
                // The key was used for another event (another batch, another request).
                Err(StoreError::Conflict(words)) => {
                    return Err(OperatorError::Refused(format!("{words}; nothing written")));
                }
                other => (other?, None),
            },
            Write::Cancel(component, event) => {
                let cancellation = store.cancel_run(&batch.id, &component, event).await?;
                (cancellation.event, cancellation.run)
            }
            Write::Prioritize(priority, event) => (store.prioritize(&batch.id, priority, event).await?, None),
        };
        // The store answered with an event older than this call: another process's request
        // with the same key wrote it first.
        if let (Some(key), Some(head)) = (key, head)
            && recorded.seq <= head
        {
            return self.already_done(batch, &recorded, key);
        }
        Ok(ActionReport {
            batch: batch.id.clone(),
            message: message(&recorded, closed.as_ref()),
            changes: changes_since(store, &self.pipeline, batch).await?,
            event: Some(recorded),
            already_done: false,
        })
    }

    /// The answer to a request whose key the log holds: what it wrote then, if it was this
    /// action; else a refusal (the key was used for something else).
    fn already_done(
        &self,
        batch: &Batch,
        earlier: &Event,
        key: &IdempotencyKey,
    ) -> Result<ActionReport, OperatorError> {
        let detail = |name: &str| earlier.details.get(name).and_then(Value::as_str);
        let same = detail("action") == Some(self.action.name())
            && self.action.component().is_none_or(|component| detail("component") == Some(component));
        if !same {
            return Err(OperatorError::Refused(format!(
                "the key {key} was already used on {} for another request ({} by {}, {}); nothing was done: a new \
                 request needs a new key",
                batch.id,
                detail("action").unwrap_or("an event"),
                earlier.agent,
                wrote(earlier)
            )));
        }
        Ok(ActionReport {
            batch: batch.id.clone(),
            message: format!(
                "{}: already done: seq {} — this request recorded {} (by {} at {}); nothing was written now",
                batch.id,
                earlier.seq,
                wrote(earlier),
                earlier.agent,
                earlier.at
            ),
            event: Some(earlier.clone()),
            changes: Vec::new(),
            already_done: true,
        })
    }

    /// The plan applied to a copy of the batch as the store applies it, the event recorded
    /// as `seq` at the batch's store clock.
    fn preview(&self, batch: &Batch, plan: Plan, seq: Seq) -> ActionPreview {
        // The effective view needs the log in seq order, whatever seq the caller expected.
        let last = batch.events.last().map_or(batch.changed_seq, |e| e.seq.max(batch.changed_seq));
        let seq = seq.max(Seq(last.0 + 1));
        let token = PlanToken::new(batch.changed_seq, &plan.write);
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
            outcome: event.outcome,
            resets: event.resets.clone(),
            changes: changes(&states(&self.pipeline, batch), &states(&self.pipeline, &after)),
            message: (plan.message)(&event, closed.as_ref()),
            version: batch.changed_seq,
            plan: token.to_string(),
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

    /// What a confirm of `action` with `key` already did on batch `id`; reads only. The
    /// answer `perform_confirmed` would give it ("already done", with the event recorded
    /// then), a refusal if the key was used on the batch for another request, or `None` while
    /// the batch's log does not hold the key.
    pub async fn find_keyed(
        &self,
        id: &str,
        action: &Action,
        reason: &str,
        key: &IdempotencyKey,
    ) -> Result<Option<ActionReport>, OperatorError> {
        let prepared = self.prepare(action, reason).await?;
        let batch = self.batch(prepared.store.as_ref(), id).await?;
        keyed(&batch, key).map(|earlier| prepared.already_done(&batch, earlier, key)).transpose()
    }

    /// The events a bulk confirm with `key` recorded on any of `ids` (each batch's key
    /// derived from `key` and its id, as `perform_many_confirmed` does); reads only. An id
    /// with no batch has none.
    pub async fn find_keyed_many(&self, ids: &[BatchId], key: &IdempotencyKey) -> Result<Vec<Event>, OperatorError> {
        let ids = distinct_within_bound(ids)?;
        let store = self.store().await?;
        let mut found = Vec::new();
        for page in ids.chunks(BULK_READ_PAGE) {
            let page: Vec<BatchId> = page.iter().map(|id| (*id).clone()).collect();
            for batch in store.get_batches(&page).await? {
                found.extend(keyed(&batch, &derived_key(key, &batch.id)).cloned());
            }
        }
        Ok(found)
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

/// One page of a bulk action's ids and the batches among them that exist, by id: one store
/// read, whatever the page's size.
async fn batches_by_id(
    store: &dyn ObjectStore,
    ids: &[&BatchId],
) -> Result<(Vec<BatchId>, HashMap<BatchId, Batch>), OperatorError> {
    let page: Vec<BatchId> = ids.iter().map(|id| (*id).clone()).collect();
    let found = store.get_batches(&page).await?.into_iter().map(|b| (b.id.clone(), b)).collect();
    Ok((page, found))
}
