//! A stage's writes announced before they are synced: on a file only this host's processes
//! hold (`SqliteOptions::claims_from_other_hosts` false) at `synchronous=full`, an append and
//! a registration commit without SQLite's sync, announce the commit (so the next stage's
//! watcher wakes and reads it now), and only then sync the write-ahead log, before the
//! writer is answered. An acknowledged write is on disk as under `synchronous=full`; what
//! changes is that this host's other processes may read it up to one sync earlier.
//!
//! Why it is safe: the only thing a power loss (the one failure a sync guards against) can
//! take back is a commit read in that window, and a power loss of this host also ends every
//! process that read it, its takers included (the store service hands no runs on, so every
//! taker of the file offered in-process, on this host). A writer on another host works
//! through the store service, whose own handle syncs its writes before they answer; syncing
//! the log makes everything written before durable too, the commits read early included.
//! A process killed mid-way loses nothing: the commit is in the log file, in the page cache.
//!
//! Why: in a trickle each stage's sync was on the path to the next stage (the watcher woke
//! only after it), and on a host whose CPUs sleep between stages a sync costs 0.8-1.3 ms
//! where a busy one's costs 0.2 (BENCHMARKS.md).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rusqlite::Connection;

use super::runs::{Commit, with_synchronous};
use super::{SqliteBackend, wakes};
use crate::port::{StoreError, StoreResult};

/// Whether the writes of a stage are durable: `Ok`, or why they are not known to be.
pub(super) type Synced = Result<(), String>;

impl SqliteBackend {
    /// `with_connection` for a write on a stage's path: the work's commit announced before its
    /// sync when the file's writes are announced first (`announces_before_syncing`), synced by
    /// its commit as any other write otherwise. The work's answer comes with whether what it
    /// committed is on disk; a writer answers only once it is.
    pub(super) async fn write_announced_first<T, F>(&self, work: F) -> StoreResult<(T, Synced)>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> StoreResult<T> + Send + 'static,
    {
        let connection = Arc::clone(&self.connection);
        let wakes = Arc::clone(&self.wakes);
        let (first, log) = (self.announces_before_syncing, write_ahead_log(&self.path));
        tokio::task::spawn_blocking(move || {
            let mut conn = connection.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            let before = conn.total_changes();
            let done = match first {
                true => with_synchronous(&mut conn, Commit::Unsynced, work),
                false => work(&mut conn),
            };
            let changed = conn.total_changes() != before;
            if changed {
                wakes.announce(&wakes::take_concerns(&conn));
            }
            drop(conn);
            let synced = match first && changed && done.is_ok() {
                true => sync(&log),
                false => Ok(()),
            };
            done.map(|answer| (answer, synced))
        })
        .await
        .map_err(|e| StoreError::Unavailable(format!("store task failed: {e}")))?
        .map_err(|e| self.naming_the_file(e))
    }
}

/// `<store>-wal`, the file SQLite keeps the store's commits in until a checkpoint.
fn write_ahead_log(store: &Path) -> PathBuf {
    let mut name = store.as_os_str().to_owned();
    name.push("-wal");
    PathBuf::from(name)
}

/// Syncs the write-ahead log, what `synchronous=full` does inside each commit: every commit
/// in it so far, this process's and the others', is on disk once this returns. The file is
/// opened anew each time (any descriptor of it syncs the same data): SQLite removes it when
/// the last connection to the store closes.
fn sync(log: &Path) -> Synced {
    std::fs::File::open(log)
        .and_then(|file| file.sync_data())
        .map_err(|e| format!("committed, but not known to be on disk: syncing {} failed: {e}", log.display()))
}

#[cfg(test)]
mod tests {
    use autocomp_model::{Agent, BatchId, ComponentName, IdempotencyKey, NewBatch, NewEvent, Outcome, RunHolder};

    use super::*;
    use crate::port::{BatchStore, CreateOutcome};
    use crate::sqlite::{SqliteOptions, Synchronous};

    async fn open(dir: &Path, options: SqliteOptions) -> SqliteBackend {
        SqliteBackend::open_with(dir.join("store.db"), options).await.unwrap()
    }

    /// A file opened in-process (`open_store`), as every component on the host opens it.
    fn in_process() -> SqliteOptions {
        SqliteOptions { claims_from_other_hosts: false, ..SqliteOptions::default() }
    }

    async fn register(store: &SqliteBackend, id: &str) -> StoreResult<CreateOutcome> {
        let batch = NewBatch::new(BatchId::new(id).unwrap(), "RoundTrip".parse().unwrap());
        let first = NewEvent::new("Data_Received".parse().unwrap(), Outcome::Success, Agent::new("a").unwrap());
        store.register_batch(batch, first).await
    }

    fn synchronous(store: &SqliteBackend) -> i64 {
        let conn = store.connection.lock().unwrap();
        conn.query_row("PRAGMA synchronous", [], |row| row.get(0)).unwrap()
    }

    /// Only a file that syncs every commit and that no other host's process holds announces
    /// a stage's writes first: the store service's handle (its claims held on other hosts)
    /// syncs before it announces, and `synchronous=normal` syncs at checkpoints only.
    #[tokio::test]
    async fn only_a_synced_file_of_this_hosts_processes_announces_first() {
        let dir = tempfile::tempdir().unwrap();
        assert!(open(dir.path(), in_process()).await.announces_before_syncing);
        assert!(!open(dir.path(), SqliteOptions::default()).await.announces_before_syncing, "served");
        let normal = SqliteOptions { synchronous: Synchronous::Normal, ..in_process() };
        assert!(!open(dir.path(), normal).await.announces_before_syncing, "synchronous=normal");
    }

    /// A registration commits unsynced and syncs the log after, and leaves the connection
    /// syncing every other write in its commit, as the file was opened.
    #[tokio::test]
    async fn a_registration_leaves_the_other_writes_synced_in_their_commits() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path(), in_process()).await;
        assert!(matches!(register(&store, "B1").await.unwrap(), CreateOutcome::Created(_)));
        assert_eq!(synchronous(&store), 2, "FULL");
    }

    /// A write whose log cannot be synced is answered as an outage naming the log, though
    /// it committed: its retry finds it as it stands.
    #[tokio::test]
    async fn a_write_not_known_to_be_on_disk_is_an_outage_and_its_retry_finds_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path(), in_process()).await;
        register(&store, "B1").await.unwrap();
        // The connection keeps writing the log it has open; the path names nothing now.
        std::fs::remove_file(dir.path().join("store.db-wal")).unwrap();
        match register(&store, "B2").await {
            Err(StoreError::Unavailable(message)) => {
                assert!(message.contains("not known to be on disk"), "{message}");
                assert!(message.contains("store.db-wal"), "{message}");
            }
            other => panic!("an outage, got {other:?}"),
        }
        assert!(matches!(register(&store, "B2").await.unwrap(), CreateOutcome::AlreadyExists(_)));
    }

    /// So is an append (its group's answer), and its retry with the same key is answered
    /// with the event it recorded.
    #[tokio::test]
    async fn an_append_not_known_to_be_on_disk_is_an_outage_and_its_retry_finds_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path(), in_process()).await;
        register(&store, "B1").await.unwrap();
        let (batch, step) = (BatchId::new("B1").unwrap(), ComponentName::new("checker").unwrap());
        let holder = RunHolder {
            agent: Agent::new("checker").unwrap(),
            host: "h".into(),
            pid: 1,
            claim_key: None,
            liveness: None,
        };
        let claim = store.claim(&batch, &step, &holder).await.unwrap();
        let result = NewEvent::new("Checked".parse().unwrap(), Outcome::Success, Agent::new("checker").unwrap())
            .in_run(step.clone(), claim.run.generation)
            .with_idempotency_key(IdempotencyKey::new("append-1").unwrap());
        std::fs::remove_file(dir.path().join("store.db-wal")).unwrap();
        match store.append_event(&batch, result.clone()).await {
            Err(StoreError::Unavailable(message)) => assert!(message.contains("not known to be on disk"), "{message}"),
            other => panic!("an outage, got {other:?}"),
        }
        let recorded = store.append_event(&batch, result).await.unwrap();
        let log = store.log_page(&batch, crate::port::LogCursor::Newest, 10).await.unwrap();
        assert_eq!(log.events.iter().filter(|e| e.event_type == recorded.event_type).count(), 1, "recorded once");
    }
}
