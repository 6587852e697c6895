//! `autocomp step add`: declares a human step, a component without a binary whose event a
//! person records (`approve` / `reject`) once its trigger holds. Apart from the steering
//! actions because it writes the component registry, not the steering log.

use std::time::Duration;

use autocomp_model::{
    BatchType, ComponentDescriptor, ComponentName, EventType, InvalidInput, PassOutcome, PassPhase, PassRecord, Trigger,
};
use autocomp_store::StoreError;

use crate::operator::{Operator, OperatorError, check_reason};

/// A human step as `autocomp step add` declares it: a component without a binary, whose
/// event a person records (`approve` / `reject`) once its trigger holds.
#[derive(Debug, Clone, Default)]
pub struct HumanStep {
    pub name: String,
    pub event_type: String,
    pub requires: Vec<String>,
    /// Batch types it applies to (all when empty).
    pub types: Vec<String>,
    /// Waiting for a person longer than this is overdue (alerts, notifications).
    pub overdue_after: Option<Duration>,
}

impl Operator {
    /// `autocomp step add`: records the human step in the component registry, as a pass of
    /// `operator:<name>` would (the registry's host record says who declared it and why).
    /// Its trigger: `requires` the listed types, `blocked_by` its own type (one decision per
    /// batch until an operator reruns it), optionally limited to batch types. Declaring it
    /// again with other settings updates it; a name or event type a component already uses
    /// is refused.
    pub async fn declare_step(&self, step: &HumanStep, reason: &str) -> Result<String, OperatorError> {
        let reason = check_reason(reason)?;
        let agent = self.agent()?;
        let descriptor = step.descriptor()?;
        let store = self.store().await?;
        let pipeline = self.pipeline(store.as_ref()).await?;
        let name = descriptor.name.clone();
        if let Some(other) = pipeline.iter().find(|s| *s.name() == name && !s.descriptor().manual) {
            return Err(InvalidInput::new(
                "step",
                name.as_str(),
                format!("{} is a component with a binary (it records {})", other.name(), other.event_type()),
            )
            .into());
        }
        let event_type = descriptor.event_type.clone();
        let summary = format!("declared by {agent}: {reason}");
        let phase = PassPhase::Ended {
            outcome: PassOutcome::Idle,
            summary: summary.chars().take(2_000).collect(),
            duration_ms: 0,
            work: Vec::new(),
        };
        let pass = PassRecord { descriptor, host: agent.to_string(), phase };
        match store.record_pass(pass).await {
            Ok(()) => {}
            Err(StoreError::Conflict(message)) => {
                return Err(InvalidInput::new("--event-type", event_type.as_str(), message).into());
            }
            Err(e) => return Err(e.into()),
        }
        Ok(format!(
            "{name}: human step recorded in the pipeline; batches ready for it wait for a person (`autocomp status \
             --component {name} --state person`; `autocomp approve ID --step {name} --reason ...`)\n"
        ))
    }
}

impl HumanStep {
    /// The component the step is: checked names and types, a trigger that `requires` the
    /// listed types and is `blocked_by` its own, no binary (`manual`).
    fn descriptor(&self) -> Result<ComponentDescriptor, OperatorError> {
        let name = ComponentName::new(self.name.as_str())?;
        let event_type = EventType::new(self.event_type.as_str())?;
        let field = |field: &'static str| move |e: InvalidInput| InvalidInput::new(field, e.value, e.reason);
        let requires = self
            .requires
            .iter()
            .map(|t| EventType::new(t.as_str()).map_err(field("--requires")))
            .collect::<Result<Vec<_>, _>>()?;
        if requires.is_empty() {
            return Err(
                InvalidInput::new("--requires", "", "a human step needs what it decides on: name a type").into()
            );
        }
        let types = self
            .types
            .iter()
            .map(|t| BatchType::new(t.as_str()).map_err(field("--types")))
            .collect::<Result<Vec<_>, _>>()?;
        let trigger = Trigger { requires, blocked_by: vec![event_type.clone()], types, ..Trigger::default() };
        let described = ComponentDescriptor::new(name, "manual", event_type, trigger).with_limits(
            1,
            Duration::from_secs(300),
            1,
            Duration::from_secs(86_400),
        );
        Ok(ComponentDescriptor { overdue_after: self.overdue_after, manual: true, ..described })
    }
}
