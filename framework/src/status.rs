//! Where each batch stands for each component of a pipeline: `success`, `failed`,
//! `working` (open run), `ready` (its trigger holds), `waiting` (anything else). The pipeline
//! is known from the config directory: each component file names its `event_type` and
//! `[trigger]`. Used by the demo's table and the operator commands.

use std::fmt;
use std::path::Path;

use autocomp_store::{Batch, ComponentName, EventType, Outcome, Trigger};

use crate::config::{self, ConfigError, SHARED_FILE};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ComponentState {
    Success,
    Failed,
    Working,
    Ready,
    Waiting,
}

impl ComponentState {
    pub fn as_str(self) -> &'static str {
        match self {
            ComponentState::Success => "success",
            ComponentState::Failed => "failed",
            ComponentState::Working => "working",
            ComponentState::Ready => "ready",
            ComponentState::Waiting => "waiting",
        }
    }
}

impl fmt::Display for ComponentState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

/// One component as the config directory describes it.
#[derive(Debug, Clone, PartialEq)]
pub struct PipelineStep {
    pub name: ComponentName,
    pub event_type: EventType,
    /// The trigger exactly as configured (clauses not written are empty).
    pub trigger: Trigger,
}

impl PipelineStep {
    pub fn state_of(&self, batch: &Batch) -> ComponentState {
        if batch.open_run(&self.name).is_some() {
            return ComponentState::Working;
        }
        match batch.effective().get(&self.event_type) {
            Some(event) if event.outcome == Outcome::Success => ComponentState::Success,
            Some(_) => ComponentState::Failed,
            None if self.trigger.matches(batch) => ComponentState::Ready,
            None => ComponentState::Waiting,
        }
    }
}

/// The components of the pipeline configured in `dir`: every `<name>.toml` beside
/// `autocomp.toml` that declares an `event_type`, in file-name order.
pub fn load_pipeline(dir: &Path) -> Result<Vec<PipelineStep>, ConfigError> {
    let entries = std::fs::read_dir(dir).map_err(|e| ConfigError::new(dir, format!("cannot list: {e}")))?;
    let mut files: Vec<_> = entries
        .flatten()
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "toml"))
        .filter(|path| path.file_name().is_some_and(|name| name != SHARED_FILE))
        .collect();
    files.sort();
    let mut steps = Vec::new();
    for file in files {
        let Some(name) = file.file_stem().and_then(|s| s.to_str()) else { continue };
        let loaded = config::load(name, Some(&file), dir)?;
        let Some(event_type) = &loaded.component.event_type else { continue };
        let invalid = |e: autocomp_store::InvalidInput| ConfigError::new(&file, e.to_string());
        steps.push(PipelineStep {
            name: ComponentName::new(name).map_err(invalid)?,
            event_type: EventType::new(event_type.as_str()).map_err(invalid)?,
            trigger: loaded.component.trigger(&Trigger::default(), &file)?,
        });
    }
    Ok(steps)
}
