//! `autocomp add`: registers a batch. No event: it waits for whatever records its first
//! one (a source component, or `autocomp event`). Apart from the actions because it makes a
//! batch rather than acting on one.

use std::path::Path;

use autocomp_model::{BatchId, BatchType, InvalidInput, NewBatch};
use autocomp_store::CreateOutcome;
use serde_json::Value;

use super::report::ActionReport;
use crate::operator::{Operator, OperatorError, check_reason};

/// What `autocomp add` registers besides the id and the type.
#[derive(Debug, Clone, Default)]
pub struct NewBatchRequest<'a> {
    pub priority: i32,
    /// Where the batch's content is (made absolute).
    pub location: Option<&'a Path>,
    /// Why, kept in the batch's metadata (`reason`).
    pub reason: Option<&'a str>,
}

impl Operator {
    /// `autocomp add`: registers batch `id` of `batch_type`. The operator and the reason, if
    /// given, are kept in its metadata (`registered_by`, `reason`).
    pub async fn add(
        &self,
        id: &BatchId,
        batch_type: &str,
        request: NewBatchRequest<'_>,
    ) -> Result<ActionReport, OperatorError> {
        let batch_type = BatchType::new(batch_type)?;
        let reason = request.reason.map(check_reason).transpose()?;
        let agent = self.agent()?;
        let mut new = NewBatch::new(id.clone(), batch_type).with_priority(request.priority);
        if let Some(location) = request.location {
            new = new.with_location(absolute(location)?);
        }
        new.metadata["registered_by"] = Value::from(agent.as_str());
        if let Some(reason) = reason {
            new.metadata["reason"] = Value::from(reason);
        }
        let store = self.store().await?;
        let message = match store.create_batch(new).await? {
            CreateOutcome::Created(batch) => format!(
                "{id}: registered (type {}, priority {}, seq {}); no event recorded: it waits for its first one",
                batch.batch_type, batch.priority, batch.created_seq
            ),
            CreateOutcome::AlreadyExists(_) => format!("{id}: already registered exactly so; nothing changed"),
        };
        Ok(ActionReport { batch: id.clone(), message, event: None, changes: Vec::new(), already_done: false })
    }
}

/// `--location` made absolute, as text.
fn absolute(location: &Path) -> Result<String, InvalidInput> {
    let absolute = std::path::absolute(location).map_err(|e| {
        InvalidInput::new("--location", location.display().to_string(), format!("cannot be made absolute: {e}"))
    })?;
    let text = absolute
        .to_str()
        .ok_or_else(|| InvalidInput::new("--location", absolute.display().to_string(), "must be valid UTF-8"))?;
    Ok(text.to_owned())
}
