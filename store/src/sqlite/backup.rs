//! An online, consistent copy of an embedded store file while components write to it:
//! SQLite's `VACUUM INTO` (one read transaction: writers go on under WAL, and the copy is the
//! store as of that transaction, compacted), into a new 0600 file, synced, then opened and
//! checked (`PRAGMA integrity_check`, its schema version, its head, its counts).

use std::path::Path;
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};

use super::{create_private, unavailable};
use crate::port::{StoreError, StoreResult};
use autocomp_model::InvalidInput;

/// What a backup holds, read back from the copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackupFacts {
    pub bytes: u64,
    pub schema_version: i64,
    /// The newest seq in the copy: it is the store as of this seq.
    pub head: i64,
    pub batches: i64,
    pub events: i64,
    /// Runs open in the copy: after a restore, each is taken over or recovered by the usual
    /// rules (its holder is gone).
    pub open_runs: i64,
}

/// Copies the store file `store` into `to` (which must not exist), consistent while other
/// processes write to the store; the copy is checked before this returns.
pub fn backup_file(store: &Path, to: &Path) -> StoreResult<BackupFacts> {
    let invalid = |reason: String| -> StoreError { InvalidInput::new("--to", to.display().to_string(), reason).into() };
    if !store.is_file() {
        return Err(InvalidInput::new("store", store.display().to_string(), "no store file there").into());
    }
    if to.is_dir() {
        return Err(invalid("is a directory: name the new file".into()));
    }
    if to.exists() {
        return Err(invalid("exists: a backup never overwrites a file".into()));
    }
    create_private(to).map_err(|e| invalid(format!("cannot create it: {e}")))?;
    let copied = copy(store, to);
    if copied.is_err() {
        std::fs::remove_file(to).ok();
    }
    copied?;
    std::fs::File::open(to).and_then(|file| file.sync_all()).map_err(|e| invalid(format!("cannot sync it: {e}")))?;
    check(to)
}

fn copy(store: &Path, to: &Path) -> StoreResult<()> {
    let conn = Connection::open_with_flags(store, OpenFlags::SQLITE_OPEN_READ_ONLY).map_err(unavailable)?;
    conn.busy_timeout(Duration::from_secs(30)).map_err(unavailable)?;
    let target = to
        .to_str()
        .ok_or_else(|| StoreError::from(InvalidInput::new("--to", to.display().to_string(), "not a UTF-8 path")))?;
    match conn.execute("VACUUM INTO ?1", [target]) {
        Ok(_) => Ok(()),
        // The target's side: the store itself is fine.
        Err(rusqlite::Error::SqliteFailure(failure, message))
            if matches!(
                failure.code,
                rusqlite::ErrorCode::DiskFull | rusqlite::ErrorCode::CannotOpen | rusqlite::ErrorCode::ReadOnly
            ) =>
        {
            let why = message.unwrap_or_else(|| failure.to_string());
            Err(InvalidInput::new("--to", to.display().to_string(), format!("cannot write the copy there: {why}"))
                .into())
        }
        Err(e) => Err(unavailable(e)),
    }
}

/// Opens the copy read-only and reads what it holds; a copy that fails SQLite's integrity
/// check is an error naming it.
fn check(copy: &Path) -> StoreResult<BackupFacts> {
    let conn = Connection::open_with_flags(copy, OpenFlags::SQLITE_OPEN_READ_ONLY).map_err(unavailable)?;
    let integrity: String = conn.query_row("PRAGMA integrity_check", [], |row| row.get(0)).map_err(unavailable)?;
    if integrity != "ok" {
        let reason = format!("the backup {} fails SQLite's integrity check: {integrity}", copy.display());
        return Err(StoreError::Unavailable(reason));
    }
    let count = |sql: &str| conn.query_row(sql, [], |row| row.get::<_, i64>(0)).map_err(unavailable);
    Ok(BackupFacts {
        bytes: std::fs::metadata(copy).map(|m| m.len()).unwrap_or(0),
        schema_version: super::schema::schema_version(&conn)?,
        head: super::tx::head_in(&conn)?.0,
        batches: count("SELECT COUNT(*) FROM batches")?,
        events: count("SELECT COUNT(*) FROM events")?,
        open_runs: count("SELECT COUNT(*) FROM runs WHERE state = 'open'")?,
    })
}
