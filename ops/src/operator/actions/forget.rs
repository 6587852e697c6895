//! `autocomp pipeline forget`: retires a component from the registry. Apart from the
//! actions because it acts on the pipeline's registry, not on a batch.

use autocomp_model::ComponentName;
use autocomp_store::StoreError;

use crate::operator::{Operator, OperatorError, check_reason};

impl Operator {
    /// Retires `component` (it no longer shows in `status`, `show` or the monitor; it comes
    /// back if it runs a pass again). Refused while it holds an open run on any batch:
    /// cancel those first.
    pub async fn forget(&self, component: &ComponentName, reason: &str) -> Result<String, OperatorError> {
        let reason = check_reason(reason)?;
        let agent = self.agent()?;
        let store = self.store().await?;
        let open = store.open_runs(Some(component)).await?;
        if let Some(run) = open.first() {
            return Err(OperatorError::Refused(format!(
                "{component} is working on {} batch(es) (e.g. {} run {} held by {}); `autocomp cancel` them or wait",
                open.len(),
                run.batch_id,
                run.generation,
                run.holder.agent
            )));
        }
        let retired = match store.retire_component(component, &agent, reason).await {
            Err(StoreError::Conflict(message)) => return Err(OperatorError::Refused(message)),
            other => other?,
        };
        let seen = retired.last_seen().map_or("never".to_owned(), |t| t.to_string());
        Ok(format!(
            "retired {component} (records {}, last seen {seen}) from the pipeline: {reason}\n",
            retired.descriptor.event_type
        ))
    }
}
