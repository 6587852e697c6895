//! `autocomp event`: records an event by hand (e.g. a `Data_Received` for a batch delivered
//! outside the pipeline). The type must be one the pipeline records or waits for, or one a
//! component file in the config dir names; `Reset` markers are written by `rerun` and
//! `restart`. Apart from the actions because it is no [`super::Action`]: it writes whatever
//! event the operator names, with no plan to preview.

use std::collections::BTreeSet;
use std::path::Path;

use autocomp_model::{BatchId, EventType, InvalidInput, NewEvent, Outcome};

use super::plan::{Context, refuse_if_working};
use super::report::{ActionReport, changes_since, wrote};
use crate::operator::{Operator, OperatorError, Step, check_reason};

/// A hand-made event records no details besides the reason.
#[derive(serde::Serialize)]
struct NoDetails {}

impl Operator {
    /// `autocomp event` on batch `id`.
    pub async fn record_event(
        &self,
        id: &BatchId,
        event_type: &str,
        outcome: Outcome,
        reason: &str,
    ) -> Result<ActionReport, OperatorError> {
        let reason = check_reason(reason)?.to_owned();
        let agent = self.agent()?;
        let store = self.store().await?;
        let pipeline = self.pipeline(store.as_ref()).await?;
        let event_type = known_event_type(&pipeline, self.config_dir(), event_type)?;
        let batch = store.get_batch(id).await?;
        crate::operator::retention::refuse_if_pruned(&batch, "record an event on")?;
        refuse_if_working(&batch, pipeline.iter().filter(|s| *s.event_type() == event_type), "event")?;
        let summary = format!("recorded by hand by {agent}: {reason}");
        let context = Context { action: "event", reason, agent, pipeline };
        let details = context.details(summary, NoDetails {});
        let event = NewEvent::new(event_type, outcome, context.agent.clone()).with_details(details);
        let recorded = store.append_event(&batch.id, event).await?;
        Ok(ActionReport {
            batch: batch.id.clone(),
            message: format!("{}: recorded {}", batch.id, wrote(&recorded)),
            changes: changes_since(store.as_ref(), &context.pipeline, &batch).await?,
            event: Some(recorded),
            already_done: false,
        })
    }
}

/// Event types the pipeline records or any trigger mentions, and those the component files
/// in the config dir name: before a component's first pass registers it, its
/// `<name>.toml` is all there is, and a fresh pipeline's first events come by hand.
fn known_event_type(pipeline: &[Step], config_dir: &Path, text: &str) -> Result<EventType, OperatorError> {
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
    known.extend(configured_event_types(config_dir));
    if known.contains(&event_type) {
        return Ok(event_type);
    }
    let dir = config_dir.display();
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
