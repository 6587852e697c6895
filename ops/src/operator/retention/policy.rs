//! The retention policy (`autocomp prune --policy FILE`): where exports go and, per batch type,
//! when a finished batch's history leaves the store. A TOML file:
//!
//! ```toml
//! export_dir = "/var/lib/autocomp/history"
//!
//! [types.newspaper]
//! after = "180d"                  # quiet this long (no event, no content change)
//! require = ["Data_Archived"]     # and these steps succeeded (optional)
//! ```
//!
//! A batch of a listed type is pruned once it is finished: no run is open on it, every step
//! it has a result of succeeded (or was skipped) on its current content, it is ready for no
//! registered component, it has each `require`d success, and it has been quiet for `after`.
//! A type the file does not list is never pruned.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use autocomp_model::{
    BatchSummary, BatchType, EventType, InvalidInput, Outcome, RegisteredComponent, SummaryAt, Timestamp,
};
use serde::Deserialize;

/// The whole file.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetentionPolicy {
    /// Where the exports and their manifests are written (made if missing).
    pub export_dir: PathBuf,
    /// Per batch type, when its batches' histories are pruned.
    #[serde(default)]
    pub types: BTreeMap<BatchType, TypePolicy>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TypePolicy {
    /// How long a finished batch stays quiet before its history is pruned.
    #[serde(with = "autocomp_model::duration_text")]
    pub after: Duration,
    /// Event types whose success the batch must hold (its last step, say).
    #[serde(default)]
    pub require: Vec<EventType>,
}

impl RetentionPolicy {
    /// Reads and checks the policy file; an error names the file, the key and the value.
    pub fn read(path: &Path) -> Result<RetentionPolicy, InvalidInput> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path)
            .map_err(|e| InvalidInput::new("--policy", &shown, format!("cannot be read: {e}")))?;
        let policy: RetentionPolicy = toml::from_str(&text).map_err(|e| {
            let line: String = e.message().lines().next().unwrap_or("").chars().take(300).collect();
            let at = e.span().map(|span| text[..span.start].lines().count().max(1));
            let at = at.map_or(String::new(), |line| format!(" (line {line})"));
            InvalidInput::new("--policy", &shown, format!("is not a retention policy{at}: {line}"))
        })?;
        if !policy.export_dir.is_absolute() {
            let dir = policy.export_dir.display().to_string();
            return Err(InvalidInput::new(
                "export_dir",
                dir,
                "must be an absolute path: a pruned batch names its export by it, wherever the import runs",
            ));
        }
        if let Some((batch_type, _)) =
            policy.types.iter().find(|(_, policy)| policy.require.iter().any(EventType::is_history_pruned))
        {
            return Err(InvalidInput::new(
                format!("types.{batch_type}.require"),
                EventType::HISTORY_PRUNED,
                "is the record of a pruned history, never a step's result",
            ));
        }
        if policy.types.is_empty() {
            return Err(InvalidInput::new(
                "--policy",
                shown,
                "lists no batch type under [types.<type>]: nothing would be pruned",
            ));
        }
        Ok(policy)
    }

    /// What in the policy can prune nothing: a batch type no batch of the store has, a
    /// required step no registered component records. Warnings, not refusals: a type may
    /// come later, but a typo would otherwise prune nothing, silently, for ever.
    pub fn prunes_nothing(
        &self,
        types_seen: &std::collections::BTreeSet<BatchType>,
        components: &[RegisteredComponent],
    ) -> Vec<String> {
        let mut warnings = Vec::new();
        for (batch_type, policy) in &self.types {
            if !types_seen.contains(batch_type) {
                warnings.push(format!("the policy's type {batch_type} is the type of no batch in the store"));
            }
            for required in &policy.require {
                if !components.iter().any(|component| component.descriptor.event_type == *required) {
                    warnings.push(format!(
                        "types.{batch_type}.require names {required}, which no registered component records: \
                         no batch of {batch_type} is due"
                    ));
                }
            }
        }
        warnings
    }

    /// Whether the batch is finished and due under its type's policy (see the module), with
    /// `now` the store's clock and `components` the registry's.
    pub fn due(&self, summary: &BatchSummary, now: Timestamp, components: &[RegisteredComponent]) -> bool {
        let Some(policy) = self.types.get(&summary.batch_type) else { return false };
        if summary.pruned().is_some() || !summary.running.is_empty() || now.since(summary.last_activity) < policy.after
        {
            return false;
        }
        let finished = summary
            .effective
            .iter()
            .all(|event| event.outcome == Outcome::Success && !event.is_stale_at(summary.modified_seq));
        let required = policy
            .require
            .iter()
            .all(|event_type| summary.current_of(event_type).is_some_and(|event| event.outcome == Outcome::Success));
        let facts = SummaryAt { summary, at: now };
        finished
            && required
            && components
                .iter()
                .filter(|component| component.retired.is_none())
                .all(|component| component.descriptor.readiness(&facts).is_err())
    }
}
