//! `autocomp explain ID` without `--component`: every step of the batch that is not a
//! success, in pipeline order. A step that waits for another is one line with its cause (the
//! step it waits for is explained in full itself); the others are explained in full.

use std::fmt::Write as _;

use autocomp_model::{BatchId, ComponentState};
use serde::Serialize;

use super::super::views::{Format, render_as};
use super::super::{Operator, OperatorError};
use super::{Explanation, ExplanationJson};

/// `autocomp explain ID`: the explanations of every step not a success.
#[derive(Debug, Clone)]
pub struct BatchExplanation {
    pub batch: BatchId,
    /// Steps in pipeline order whose state is neither a success nor skipped.
    pub steps: Vec<Explanation>,
    /// How many steps the pipeline has (the others succeeded or were skipped).
    pub pipeline_steps: usize,
    /// Where its history went, if it was pruned, and the import that brings it back.
    pub pruned: Option<String>,
}

/// `explain ID --format json`.
#[derive(Serialize)]
pub struct BatchExplanationJson<'a> {
    pub id: &'a BatchId,
    pub pipeline_steps: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pruned: Option<&'a str>,
    /// Each step not a success, as `explain --component` describes it.
    pub steps: Vec<ExplanationJson<'a>>,
}

/// Succeeded, or skipped by an operator (a success that did no work): nothing to explain.
fn done(state: ComponentState) -> bool {
    matches!(state, ComponentState::Success | ComponentState::Skipped)
}

impl BatchExplanation {
    pub fn render(&self, format: Format) -> String {
        render_as(
            format,
            || BatchExplanationJson {
                id: &self.batch,
                pipeline_steps: self.pipeline_steps,
                pruned: self.pruned.as_deref(),
                steps: self.steps.iter().map(Explanation::json).collect(),
            },
            || self.to_text(),
        )
    }

    fn to_text(&self) -> String {
        if let Some(pruned) = &self.pruned {
            return format!("{}: {pruned}\n", self.batch);
        }
        if self.steps.is_empty() {
            return format!("{}: every one of its {} steps succeeded\n", self.batch, self.pipeline_steps);
        }
        let (waiting, own): (Vec<&Explanation>, Vec<&Explanation>) =
            self.steps.iter().partition(|step| step.state == ComponentState::Waiting);
        let mut out = String::new();
        for (n, step) in own.iter().enumerate() {
            if n > 0 {
                out.push_str("\n----\n\n");
            }
            out.push_str(&step.to_text());
        }
        if !waiting.is_empty() {
            if !own.is_empty() {
                out.push_str("\n----\n\n");
            }
            out.push_str("waiting for other steps:\n");
            for step in waiting {
                let cause = match step.held_up_by.is_empty() {
                    true => step.verdict(),
                    false => format!("because {}", step.held_up_by.join(", because ")),
                };
                writeln!(out, "  {}: {cause}", step.component).ok();
            }
        }
        out
    }
}

impl Operator {
    /// `autocomp explain ID`: every step of the batch not a success, from one read of its
    /// head (`Explanation::read_all`).
    pub async fn explain_batch(&self, id: &BatchId) -> Result<BatchExplanation, OperatorError> {
        let (head, all) = Explanation::read_all(self, id).await?;
        let pipeline_steps = all.len();
        let steps = all.into_iter().filter(|step| !done(step.state)).collect();
        let pruned = head.effective_event(&autocomp_model::EventType::history_pruned()).map(|marker| {
            let file = super::super::retention::export_of(marker);
            format!(
                "its history was pruned (seq {}) to {}: no step works on it until `autocomp import {}` brings it back",
                marker.seq,
                autocomp_toolkit::terminal::one_line(&file.display().to_string()),
                super::super::retention::shell_word(&file)
            )
        });
        Ok(BatchExplanation { batch: head.id().clone(), steps, pipeline_steps, pruned })
    }
}
