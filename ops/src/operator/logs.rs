//! `autocomp logs ID`: what each run of a batch printed (a command's stdout and stderr, a
//! Rust component's log lines), kept with its result event, or saved apart for a run without
//! one (cancelled by an operator, still running, abandoned): the command itself. Which runs it
//! prints and how each reads is `attempts.rs`; `--follow` is `follow.rs`.

mod attempts;
mod follow;

use std::io::Write;

use autocomp_model::{BatchId, InvalidInput, Seq};
use autocomp_store::port::DETAILS_SHOWN_BYTES;
use autocomp_store::{LogCursor, MAX_LOG_PAGE};

use super::{Format, Operator, OperatorError};
pub use attempts::LogsQuery;
use attempts::{Attempts, Selection, Writer};

/// Writes the output of the batch's runs that `query` selects, oldest first: a header per
/// attempt, then each stream's text; or a JSON array of them. Reads the log a page at a time
/// and writes as it goes, so no more than a page of events is held.
async fn write_logs(
    operator: &Operator,
    id: &BatchId,
    query: &LogsQuery,
    writer: &mut Writer<'_>,
) -> Result<(), OperatorError> {
    if query.attempt == Some(0) {
        return Err(InvalidInput::new("--attempt", "0", "attempts are numbered from 1").into());
    }
    if query.follow && writer.format == Format::Json {
        return Err(InvalidInput::new("--follow", "--format json", "follows in text only").into());
    }
    let store = operator.store().await?;
    let head = store.batch_head(id).await?;
    let saved = store.run_outputs(id).await?;
    let selection = Selection { query, component: query.component.as_ref(), saved };
    let mut attempts = Attempts::default();
    let mut written = Vec::new();
    let mut after = Seq::ZERO;
    loop {
        // By size: a page of a thousand events whose output is near 1 MiB each must not be
        // held at once; an event a page left out is read alone when wanted.
        let page = store.log_page_within(head.id(), LogCursor::After(after), MAX_LOG_PAGE, DETAILS_SHOWN_BYTES).await?;
        selection.page(store.as_ref(), &page, &mut attempts, &mut written, writer).await?;
        after = page.events.last().map_or(after, |event| event.seq);
        match page.newer {
            Some(newer) => after = newer,
            None => break,
        }
    }
    selection.unrecorded(|_| true, &mut written, writer)?;
    if query.follow {
        let follow = follow::Follow::new(&selection, Attempts(attempts.0.clone()), after);
        if follow.run(operator, store.as_ref(), head.id(), writer).await? {
            return Ok(());
        }
    }
    match writer.shown {
        0 => selection.nothing(operator, &head, &attempts, writer).await,
        _ if writer.format == Format::Json => writer.write("\n]\n"),
        _ => Ok(()),
    }
}

impl Operator {
    /// `autocomp logs`: see `write_logs`.
    pub async fn logs(
        &self,
        id: &BatchId,
        query: &LogsQuery,
        format: Format,
        out: &mut dyn Write,
    ) -> Result<(), OperatorError> {
        write_logs(self, id, query, &mut Writer { out, format, shown: 0 }).await
    }
}
