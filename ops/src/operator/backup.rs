//! `autocomp backup --to FILE`: an online, consistent copy of the embedded store while the
//! components run (the store crate's `backup_sqlite_file`: SQLite's `VACUUM INTO`, checked),
//! with what it holds. A PostgreSQL store is backed up with PostgreSQL's own tools, a store
//! service's file on its own host: both are refused here saying so.

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::views::{Format, render_as, size_text};
use super::{Operator, OperatorError};

/// `autocomp backup`: where the copy went and what it holds.
#[derive(Debug, Clone, Serialize)]
pub struct BackupView {
    /// The store's URL as `display_url` shows it.
    pub store: String,
    pub to: PathBuf,
    pub bytes: u64,
    pub schema_version: i64,
    /// The store's head in the copy: the store as of this seq.
    pub as_of_seq: i64,
    pub batches: i64,
    pub events: i64,
    /// Runs open in the copy: after a restore, taken over by the usual rules.
    pub open_runs: i64,
}

impl BackupView {
    pub fn render(&self, format: Format) -> String {
        render_as(format, || self, || self.to_text())
    }

    fn to_text(&self) -> String {
        format!(
            "backed up {} to {} ({}): the store as of seq {}, {} batches, {} events, {} runs open (after a restore \
             each is taken over by the usual rules); schema {}, integrity ok\n",
            self.store,
            self.to.display(),
            size_text(self.bytes),
            self.as_of_seq,
            self.batches,
            self.events,
            self.open_runs,
            self.schema_version
        )
    }
}

impl Operator {
    /// `autocomp backup --to FILE`: see the module.
    pub async fn backup(&self, to: &Path) -> Result<BackupView, OperatorError> {
        let url = self.store_url()?;
        let shown = autocomp_toolkit::display_url(&url);
        let Some(rest) = url.strip_prefix("sqlite://") else {
            let how = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
                "a PostgreSQL store is backed up with PostgreSQL's own tools: pg_basebackup and WAL archiving, for a \
                 point-in-time restore (README: Backup and restore)"
            } else if url.starts_with("http://") || url.starts_with("https://") {
                "a store service's file is backed up on the service's host: `autocomp backup --store \
                 sqlite:///path/of/its/file --to FILE` there"
            } else {
                "unknown scheme; autocomp backs up an embedded store, sqlite:///path/to/store.db"
            };
            return Err(autocomp_model::InvalidInput::new("store", shown, how).into());
        };
        let store = PathBuf::from(rest.split_once('?').map_or(rest, |(path, _)| path));
        let target = to.to_path_buf();
        let facts = tokio::task::spawn_blocking(move || autocomp_store::backup_sqlite_file(&store, &target))
            .await
            .map_err(|e| OperatorError::usage(format!("the backup stopped: {e}")))??;
        Ok(BackupView {
            store: shown,
            to: to.to_path_buf(),
            bytes: facts.bytes,
            schema_version: facts.schema_version,
            as_of_seq: facts.head,
            batches: facts.batches,
            events: facts.events,
            open_runs: facts.open_runs,
        })
    }
}
