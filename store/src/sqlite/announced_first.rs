//! A stage's writes announced before they are synced (`synchronous=acknowledged`, the
//! default): on a file only this host's processes hold (`SqliteOptions::claims_from_other_hosts`
//! false), an append group and a registration commit without SQLite's sync, announce the
//! commit (so the next stage's watcher wakes and reads it now), and only then sync the
//! write-ahead log, before the writer is answered. An acknowledged write is on disk as under
//! `synchronous=full`; what changes is that this host's other processes may read it, and
//! start the next stage from it, up to one sync earlier.
//!
//! What a power loss (the one failure a sync guards against) can then take back is a commit
//! read in that window, and with it the runs and claims of the processes that read it, which
//! end with the host: its batch is ready again and runs again from the stage before, as after
//! any interruption. What such a process did outside the store in that millisecond (a call to
//! another host) is not taken back; `synchronous=full` keeps every commit unread until it is
//! on disk, for a step that cannot be run again. Nothing on another host starts from a commit
//! read early: the store service hands no runs on, and a file it serves syncs every claim it
//! answers (`runs::Commit::of_claims`: syncing the log makes everything before the claim
//! durable). Nor does a write answered without committing anything (a retried append, an
//! already registered batch): it syncs the log before it answers, since what it reports may
//! be another process's commit not yet synced. A process killed mid-way loses nothing: the
//! commit is in the log file, in the page cache.
//!
//! Why: in a trickle each stage's sync was on the path to the next stage (the watcher woke
//! only after it), and on a host whose CPUs sleep between stages a sync costs 0.8-1.3 ms
//! where a busy one's costs 0.2 (BENCHMARKS.md).

use std::path::PathBuf;
use std::sync::Arc;

use rusqlite::Connection;

use super::runs::{Commit, SYNCHRONOUS_FULL, with_synchronous};
use super::{SqliteBackend, Synchronous, announced};
use crate::port::{StoreError, StoreResult};

/// Whether what a stage's write committed, and every commit before it, is on disk: `Ok`, or
/// why it is not known to be.
pub(super) type Synced = Result<(), String>;

/// How a stage's write commits: without SQLite's sync (the log synced once the commit is
/// announced), or as the file was opened.
#[derive(Clone, Copy, Debug)]
pub(super) struct StageCommit {
    unsynced: bool,
}

impl StageCommit {
    /// `work`, whose transaction commits as this says.
    pub(super) fn run<T>(
        self,
        conn: &mut Connection,
        work: impl FnOnce(&mut Connection) -> StoreResult<T>,
    ) -> StoreResult<T> {
        match self.unsynced {
            // Unsynced only at `acknowledged`, whose connection is at FULL for every other write.
            true => with_synchronous(conn, Commit::Unsynced, SYNCHRONOUS_FULL, work),
            false => work(conn),
        }
    }
}

impl SqliteBackend {
    /// Whether a stage's writes are announced before they are synced: the file is opened
    /// `synchronous=acknowledged`, only this host's processes hold it, and its log is open
    /// to sync.
    pub(super) fn announces_before_syncing(&self) -> bool {
        self.synchronous == Synchronous::Acknowledged && !self.claims_from_other_hosts && self.log.is_some()
    }

    /// `with_connection` for a write on a stage's path (an append group, a registration):
    /// `work` commits as its `StageCommit` says, the commit is announced, and then, while
    /// the next write may already run, the log is synced where the write was announced
    /// first, or where it committed nothing (a retry's or a registered batch's answer may
    /// tell of a commit another process announced and has not synced yet). `settle` turns the
    /// work's outcome and whether it is on disk into the answers, inside the same blocking
    /// task: they are sent even if the caller stopped waiting.
    pub(super) async fn write_on_a_stage_path<T, R, F, S>(&self, work: F, settle: S) -> StoreResult<R>
    where
        T: Send + 'static,
        R: Send + 'static,
        F: FnOnce(&mut Connection, StageCommit) -> StoreResult<T> + Send + 'static,
        S: FnOnce(StoreResult<T>, Synced) -> R + Send + 'static,
    {
        let connection = Arc::clone(&self.connection);
        let wakes = Arc::clone(&self.wakes);
        let (first, log) = (self.announces_before_syncing(), self.log.clone());
        tokio::task::spawn_blocking(move || {
            let mut conn = connection.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            let (done, changed) = announced(&mut conn, &wakes, |conn| work(conn, StageCommit { unsynced: first }));
            drop(conn);
            let synced = match (&done, &log) {
                (Ok(_), Some(log)) if first || !changed => log.sync(),
                _ => Ok(()),
            };
            settle(done, synced)
        })
        .await
        .map_err(|e| self.naming_the_file(StoreError::Unavailable(format!("store task failed: {e}"))))
    }
}

/// A write's answer once what it committed is on disk: an outage if that is not known.
pub(super) fn on_disk<T>(answer: StoreResult<T>, synced: &Synced) -> StoreResult<T> {
    let answer = answer?;
    synced.clone().map_err(StoreError::Unavailable)?;
    Ok(answer)
}

/// The store's write-ahead log, open for syncing: SQLite's own file, named by the
/// connection (which resolves a symlinked store path), held open for the handle's life.
/// SQLite removes it only when the last connection to the store closes, so it is the same
/// file while this handle's connection is open, and a write-back error the kernel reports
/// to a descriptor opened before it is not missed.
#[derive(Debug)]
pub(super) struct WriteAheadLog {
    file: std::fs::File,
    path: PathBuf,
}

impl WriteAheadLog {
    /// The log of the store `conn` has open; `None` if it cannot be opened (then no write
    /// is announced before its sync).
    pub(super) fn of(conn: &Connection) -> Option<Arc<Self>> {
        let mut path = std::ffi::OsString::from(conn.path()?);
        path.push("-wal");
        let path = PathBuf::from(path);
        match std::fs::File::open(&path) {
            Ok(file) => Some(Arc::new(Self { file, path })),
            Err(error) => {
                tracing::debug!(log = %path.display(), "cannot open the write-ahead log to sync it: {error}");
                None
            }
        }
    }

    /// Syncs the log, what `synchronous=full` does inside each commit: every commit in it so
    /// far, this process's and the others', is on disk once this returns.
    fn sync(&self) -> Synced {
        self.file
            .sync_data()
            .map_err(|e| format!("committed, but not known to be on disk: syncing {} failed: {e}", self.path.display()))
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use autocomp_model::{Agent, BatchId, ComponentName, IdempotencyKey, NewBatch, NewEvent, Outcome, RunHolder};

    use super::*;
    use crate::port::{BatchStore, CreateOutcome};
    use crate::sqlite::{SqliteOptions, Synchronous};

    async fn open(path: &Path, options: SqliteOptions) -> SqliteBackend {
        SqliteBackend::open_with(path, options).await.unwrap()
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

    /// The handle's log swapped for a file that cannot be synced (Linux refuses to sync
    /// `/dev/null`): every sync of the log fails from now on, as a failing disk's would.
    fn failing_disk(store: &mut SqliteBackend) -> Option<Arc<WriteAheadLog>> {
        let null = WriteAheadLog { file: std::fs::File::open("/dev/null").unwrap(), path: "/dev/null".into() };
        assert!(null.sync().is_err(), "/dev/null cannot be synced");
        store.log.replace(Arc::new(null))
    }

    fn assert_not_on_disk<T: std::fmt::Debug>(answer: StoreResult<T>) {
        match answer {
            Err(StoreError::Unavailable(message)) => {
                assert!(message.contains("not known to be on disk"), "{message}");
                assert!(message.contains("/dev/null"), "names the log: {message}");
            }
            other => panic!("an outage, got {other:?}"),
        }
    }

    /// Only the default setting on a file that no other host's process holds announces a
    /// stage's writes first: the store service's handle (its claims held on other hosts)
    /// and `synchronous=full` sync before they announce; `normal` syncs at checkpoints only.
    #[tokio::test]
    async fn only_the_default_setting_of_a_file_in_process_announces_first() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.db");
        assert_eq!(SqliteOptions::default().synchronous, Synchronous::Acknowledged);
        assert!(open(&path, in_process()).await.announces_before_syncing());
        assert!(!open(&path, SqliteOptions::default()).await.announces_before_syncing(), "served");
        for synchronous in [Synchronous::Full, Synchronous::Normal] {
            let options = SqliteOptions { synchronous, ..in_process() };
            assert!(!open(&path, options).await.announces_before_syncing(), "{synchronous:?}");
        }
    }

    /// A registration commits unsynced and syncs the log after, leaving the connection
    /// syncing every other write in its commit, as the file was opened.
    #[tokio::test]
    async fn a_registration_leaves_the_other_writes_synced_in_their_commits() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(&dir.path().join("store.db"), in_process()).await;
        assert!(matches!(register(&store, "B1").await.unwrap(), CreateOutcome::Created(_)));
        assert_eq!(synchronous(&store), 2, "FULL");
    }

    /// The log synced is the store's own, also when the store's path is a symlink (SQLite
    /// keeps the log beside the file the link names).
    #[tokio::test]
    async fn a_symlinked_store_syncs_the_log_beside_its_file() {
        let dir = tempfile::tempdir().unwrap();
        let link = dir.path().join("link.db");
        std::os::unix::fs::symlink(dir.path().join("store.db"), &link).unwrap();
        let store = open(&link, in_process()).await;
        assert!(store.announces_before_syncing());
        assert_eq!(store.log.as_ref().unwrap().path, dir.path().join("store.db-wal"));
        assert!(matches!(register(&store, "B1").await.unwrap(), CreateOutcome::Created(_)));
    }

    /// A write whose log cannot be synced is answered as an outage naming the log, though it
    /// committed; so is its retry, which commits nothing but tells of that commit, until the
    /// log syncs again.
    #[tokio::test]
    async fn a_registration_not_known_to_be_on_disk_is_an_outage_and_so_is_its_retry() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = open(&dir.path().join("store.db"), in_process()).await;
        let log = failing_disk(&mut store);
        assert_not_on_disk(register(&store, "B1").await);
        assert_not_on_disk(register(&store, "B1").await);
        store.log = log;
        assert!(matches!(register(&store, "B1").await.unwrap(), CreateOutcome::AlreadyExists(_)));
    }

    /// So is an append (its group's answer) and its retry with the same key, which, once the
    /// log syncs, is answered with the one event recorded.
    #[tokio::test]
    async fn an_append_not_known_to_be_on_disk_is_an_outage_and_so_is_its_retry() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = open(&dir.path().join("store.db"), in_process()).await;
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
        let log = failing_disk(&mut store);
        assert_not_on_disk(store.append_event(&batch, result.clone()).await);
        assert_not_on_disk(store.append_event(&batch, result.clone()).await);
        store.log = log;
        let recorded = store.append_event(&batch, result).await.unwrap();
        assert_eq!(synchronous(&store), 2, "FULL after an append too");
        let log = store.log_page(&batch, crate::port::LogCursor::Newest, 10).await.unwrap();
        assert_eq!(log.events.iter().filter(|e| e.event_type == recorded.event_type).count(), 1, "recorded once");
    }

    /// A handle that syncs in its commits (the store service's, `synchronous=full`) still
    /// syncs the log before it answers a write that committed nothing: the batch it reports
    /// may be another process's commit, announced and not yet synced.
    #[tokio::test]
    async fn a_served_handle_answers_an_already_registered_batch_once_the_log_is_synced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.db");
        let writer = open(&path, in_process()).await;
        register(&writer, "B1").await.unwrap();
        let mut served = open(&path, SqliteOptions::default()).await;
        assert!(!served.announces_before_syncing());
        let log = failing_disk(&mut served);
        assert_not_on_disk(register(&served, "B1").await);
        served.log = log;
        assert!(matches!(register(&served, "B1").await.unwrap(), CreateOutcome::AlreadyExists(_)));
    }
}
