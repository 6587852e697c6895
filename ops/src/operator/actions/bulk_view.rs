//! How one action on several batches answers on the CLI (`approve ID ID ...`): the preview
//! of `--dry-run` and what was done, as text and JSON. Apart from `bulk` (the planning and
//! the writes), as `preview` and `report` are for one batch.

use std::fmt::Write as _;

use autocomp_model::BatchId;
use serde::Serialize;

use super::bulk::{BulkOutcome, BulkPreview};
use super::preview::ActionPreview;
use super::report::{ActionReport, json_of};
use crate::operator::views::Format;

/// A batch an action was (or would be) refused on, in `perform`'s words.
#[derive(Serialize)]
struct RefusedView<'a> {
    batch: &'a BatchId,
    reason: &'a str,
}

/// `--dry-run` over several batches, as JSON.
#[derive(Serialize)]
struct BulkPreviewView<'a> {
    total: usize,
    applicable: usize,
    sample: &'a [ActionPreview],
    refused: Vec<RefusedView<'a>>,
}

/// What one action did to several batches, as JSON.
#[derive(Serialize)]
struct BulkOutcomeView<'a> {
    action: &'a str,
    performed: &'a [ActionReport],
    refused: Vec<RefusedView<'a>>,
    /// The batch whose store call failed, and the error; the batches after it were not
    /// attempted.
    stopped: Option<RefusedView<'a>>,
}

fn refused(list: &[(BatchId, String)]) -> Vec<RefusedView<'_>> {
    list.iter().map(|(batch, reason)| RefusedView { batch, reason }).collect()
}

impl BulkPreview {
    /// `--dry-run` with several batch ids: how many it would act on, the first previews and
    /// the first refusals.
    pub fn render_as(&self, format: Format) -> String {
        if format == Format::Json {
            let view = BulkPreviewView {
                total: self.total,
                applicable: self.applicable,
                sample: &self.sample,
                refused: refused(&self.refused),
            };
            return json_of(&view);
        }
        let mut out =
            format!("dry run, nothing written: it would act on {} of {} batch(es)\n", self.applicable, self.total);
        for preview in &self.sample {
            writeln!(out, "  would say: {}", preview.message).ok();
        }
        if self.sample.len() < self.applicable {
            writeln!(out, "  ... and {} more", self.applicable - self.sample.len()).ok();
        }
        for (id, words) in &self.refused {
            writeln!(out, "  refused on {id}: {words}").ok();
        }
        let refused = self.total - self.applicable;
        if self.refused.len() < refused {
            writeln!(out, "  ... and {} more refused", refused - self.refused.len()).ok();
        }
        out
    }
}

impl BulkOutcome {
    /// What `action` did to each batch: a line per batch written, then the refusals, then
    /// where a store error stopped it, then the counts.
    pub fn render_as(&self, action: &str, format: Format) -> String {
        let stopped = self.stopped.as_ref().map(|(id, error)| (id, error.to_string()));
        if format == Format::Json {
            let view = BulkOutcomeView {
                action,
                performed: &self.performed,
                refused: refused(&self.refused),
                stopped: stopped.as_ref().map(|(batch, reason)| RefusedView { batch, reason }),
            };
            return json_of(&view);
        }
        let mut out = String::new();
        for report in &self.performed {
            out.push_str(&report.render());
        }
        for (id, words) in &self.refused {
            writeln!(out, "refused on {id} (nothing written): {words}").ok();
        }
        if let Some((id, error)) = &stopped {
            writeln!(out, "stopped at {id} (whether it was written, `autocomp show {id}` tells): {error}").ok();
        }
        writeln!(
            out,
            "{action}: done on {}, refused on {}{}",
            self.performed.len(),
            self.refused.len(),
            if stopped.is_some() { ", stopped by an error before the rest" } else { "" }
        )
        .ok();
        out
    }
}
