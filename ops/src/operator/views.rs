//! What every view of the operator shares, apart from the commands that build them: the
//! `--format` choices, how a JSON document is printed, sizes and ages in words, and the one
//! JSON shape of a run (`show`'s open runs, `explain`'s open run, a steering action's
//! running work). Each read command has its own module (`show`, `status`, `pipeline`,
//! `explain`, `ready`, `locks`, `logs`, `reindex`) holding its view, its text and its method.

use std::time::Duration;

use autocomp_model::{Agent, BatchId, ComponentName, Run, Seq, Timestamp};
use serde::Serialize;

/// `--format` of the single-batch views.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Text,
    Json,
}

/// `--format` of the listing views.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TableFormat {
    Table,
    Json,
    Csv,
}

/// How many batches (summaries, ids) a listing reads from the store at a time.
pub(crate) const PAGE: usize = 1_000;

/// A view as `--format` asks: its JSON as a document, or its text.
pub(crate) fn render_as<T: Serialize>(
    format: Format,
    json: impl FnOnce() -> T,
    text: impl FnOnce() -> String,
) -> String {
    match format {
        Format::Json => json_document(&json()),
        Format::Text => text(),
    }
}

/// JSON as the commands print it: pretty, ending in a newline, object keys in name order
/// (through `Value`, whose maps are ordered by key), whatever order a view declares its
/// fields in.
pub(crate) fn json_document(value: &impl Serialize) -> String {
    let value = serde_json::to_value(value).unwrap_or_default();
    format!("{value:#}\n")
}

/// `text` cut to `max` characters (an ellipsis marking a cut), on a character boundary.
pub(crate) fn cut(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_owned(),
    }
}

/// Whole seconds, as `1m 5s`.
pub(crate) fn age(duration: Duration) -> String {
    humantime::format_duration(Duration::from_secs(duration.as_secs())).to_string()
}

/// A size as people read it: `812 bytes`, `17.9 KiB`, `3.2 MiB`.
pub fn size_text(bytes: u64) -> String {
    match bytes {
        0..1024 => format!("{bytes} bytes"),
        1024..1_048_576 => format!("{:.1} KiB", bytes as f64 / 1024.0),
        _ => format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0)),
    }
}

/// A run as every view prints it: which batch and component, its generation, who holds it
/// where, since when, and the change that opened it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RunView {
    pub batch: BatchId,
    pub component: ComponentName,
    pub generation: i64,
    pub agent: Agent,
    pub host: String,
    pub pid: u32,
    pub started_at: Timestamp,
    pub claim_seq: Seq,
}

impl From<&Run> for RunView {
    fn from(run: &Run) -> Self {
        RunView {
            batch: run.batch_id.clone(),
            component: run.component.clone(),
            generation: run.generation,
            agent: run.holder.agent.clone(),
            host: run.holder.host.clone(),
            pid: run.holder.pid,
            started_at: run.started_at,
            claim_seq: run.claim_seq,
        }
    }
}

/// `generation N held by AGENT on HOST pid PID since TIME (AGE)`.
pub(crate) fn describe_run(run: &Run, now: Timestamp) -> String {
    format!(
        "generation {} held by {} on {} pid {} since {} ({})",
        run.generation,
        run.holder.agent,
        run.holder.host,
        run.holder.pid,
        run.started_at,
        age(now.since(run.started_at))
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_text_is_cut_on_a_character_boundary() {
        assert_eq!(cut("ééé", 2), "éé…");
        assert_eq!(cut("abc", 3), "abc");
    }

    #[test]
    fn sizes_read_in_the_unit_that_fits() {
        assert_eq!(size_text(0), "0 bytes");
        assert_eq!(size_text(1023), "1023 bytes");
        assert_eq!(size_text(2765), "2.7 KiB");
        assert_eq!(size_text(64 * 1024 * 1024), "64.0 MiB");
    }
}

#[cfg(test)]
#[path = "read_json_tests.rs"]
mod read_json_tests;
