//! `autocomp reindex`: rebuilds the index (a cache) from the whole store, with a progress
//! bar; an embedded index another release built is set aside first. Writes nothing to the
//! store.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use autocomp_framework::exit::RunError;
use autocomp_model::Timestamp;
use autocomp_sboi::{EngineOptions, IndexEngine, IndexError};
use autocomp_store::ObjectStore;
use indicatif::{ProgressBar, ProgressStyle};

use super::{Operator, OperatorError};

/// `autocomp reindex`: rebuilds the index from the whole store. The embedded index is
/// rebuilt here, with a progress bar on stderr (hidden when stderr is not a terminal);
/// an index service rebuilds its own (that needs the token). Returns a summary.
async fn rebuild(operator: &Operator) -> Result<String, OperatorError> {
    let store = operator.store().await?;
    let url = operator.index_url()?;
    if !url.starts_with("local:") {
        let indexed = operator.index(&store)?.rebuild().await?;
        return Ok(format!("reindexed {indexed} batches on {}\n", autocomp_toolkit::display_url(&url)));
    }
    let options = EngineOptions { page_size: 1_000, ..EngineOptions::default() };
    let (engine, moved_aside) = match operator.local_engine(&store, options.clone()) {
        Ok(engine) => (engine, None),
        Err(error) => set_aside_unreadable_index(operator, &store, options, error)?,
    };
    let total = store.count_batches().await?;
    let started = Instant::now();
    let bar = ProgressBar::new(total).with_style(
        ProgressStyle::with_template("reindexing [{bar:30}] {pos}/{len} batches {elapsed}").expect("valid template"),
    );
    let progress_bar = bar.clone();
    let indexed = engine
        .rebuild_with_progress(store.as_ref(), &mut move |done| {
            let done = done as u64;
            if done > progress_bar.length().unwrap_or(0) {
                progress_bar.set_length(done);
            }
            progress_bar.set_position(done);
        })
        .await;
    bar.finish_and_clear();
    let indexed = indexed?;
    let cursor = engine.committed_cursor()?;
    let mut summary = String::new();
    if let Some(old) = moved_aside {
        writeln!(summary, "the index could not be opened; moved it aside to {} (delete it at will)", old.display())
            .ok();
    }
    writeln!(
        summary,
        "reindexed {indexed} batches in {:.1}s into {}; committed up to store seq {cursor}",
        started.elapsed().as_secs_f64(),
        engine.dir().display()
    )
    .ok();
    Ok(summary)
}

/// An index another release built (other fields or schema version) cannot be opened,
/// let alone rebuilt in place. It is a cache: if the directory holds a tantivy index,
/// it is renamed to `<dir>.unreadable-<millis>` (not deleted: the URL might name the
/// wrong directory) and a fresh one is created. Anything else is the original error.
fn set_aside_unreadable_index(
    operator: &Operator,
    store: &Arc<dyn ObjectStore>,
    options: EngineOptions,
    error: OperatorError,
) -> Result<(IndexEngine, Option<PathBuf>), OperatorError> {
    let dir = operator.local_index_dir(store)?;
    let unreadable = matches!(&error, OperatorError::Run(RunError::Index(IndexError::Index { .. })));
    if !unreadable || !dir.join("meta.json").is_file() {
        return Err(error);
    }
    let mut aside = dir.clone().into_os_string();
    aside.push(format!(".unreadable-{}", Timestamp::now().millis()));
    let aside = PathBuf::from(aside);
    std::fs::rename(&dir, &aside)
        .map_err(|e| OperatorError::usage(format!("{error}; and cannot move it aside to {}: {e}", aside.display())))?;
    Ok((IndexEngine::open_with(&dir, options)?, Some(aside)))
}

impl Operator {
    /// `autocomp reindex`: see `rebuild`.
    pub async fn reindex(&self) -> Result<String, OperatorError> {
        rebuild(self).await
    }
}
