//! The embedded object store: one SQLite file in WAL mode, safe for many processes on one
//! host. Every write is one IMMEDIATE transaction (so writers queue on the busy timeout
//! instead of failing on a lock upgrade), and every seq comes from the single `store_head`
//! counter inside that transaction, which makes seqs strictly increasing in commit order
//! (the component registry's writes change no batch and take no seq).

mod announced_first;
mod backup;
mod batches;
mod hand_on;
mod history;
mod outbox;
mod reads;
mod registry;
mod retention;
mod rows;
mod run_outputs;
mod runs;
mod schema;
mod statements;
mod steering;
mod summary;
mod tx;
mod wakes;
mod writes;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::Connection;

use crate::checked::Checked;
use crate::port::{HandedOn, StoreError, StoreResult};
use autocomp_model::{Batch, BatchId, ComponentName, InvalidInput, NewEvent};

pub use backup::{BackupFacts, backup_file};
pub use schema::LATEST_VERSION;

/// How often a waiter woken by file notifications still reads the head, in case one is
/// missed (a file system that does not deliver them for another host's writes).
const WATCHING_POLL: Duration = Duration::from_secs(2);
/// How long after an announcement a waiter keeps looking for the commit it announced.
const SETTLE_FOR: Duration = Duration::from_secs(1);

/// SQLite's `synchronous` setting, the durability/speed trade-off of a commit in WAL mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Synchronous {
    /// fsync the WAL at every commit before anyone may read it: an acknowledged event
    /// survives power loss too, and so does every commit any process has read.
    Full,
    /// The default: an acknowledged event or registration survives power loss, as under
    /// `Full`; on a file opened in process, this host's other processes may read it up to
    /// one fsync earlier, so the next stage does not wait for the disk (`announced_first`).
    Acknowledged,
    /// fsync at checkpoints only: an acknowledged event survives any process crash; an OS
    /// crash or power loss may lose the last commits, never corrupt the file.
    Normal,
}

#[derive(Debug, Clone)]
pub struct SqliteOptions {
    pub synchronous: Synchronous,
    /// How long a writer waits for another process's write transaction before giving up.
    pub busy_timeout: Duration,
    /// The most bytes of details and metadata one batch may store: an event or content change
    /// that would take it over is refused (`StoreError::Invalid`), so a runaway log cannot
    /// grow without bound.
    pub max_batch_bytes: u64,
    /// Whether opening brings an older file to this release's schema (the default); with
    /// `migrate=false` such a file is refused instead, and nothing is written: how `autocomp
    /// doctor` looks at a store without changing it.
    pub migrate: bool,
    /// Whether the file's claims may be held by processes on other hosts (the store service
    /// serves it over HTTP; the default, the safe side): an exclusive claim, its batches'
    /// lock, is then synced before it answers, since its holder outlives a power loss of
    /// this host. In-process (`open_store`) every holder of the file's claims runs on this
    /// host and ends with it, so a claim lost with the host leaves no holder to keep a
    /// second claimer off, and the claim's commit goes unsynced like any other claim's.
    pub claims_from_other_hosts: bool,
}

impl Default for SqliteOptions {
    fn default() -> Self {
        Self {
            synchronous: Synchronous::Acknowledged,
            busy_timeout: Duration::from_secs(30),
            max_batch_bytes: crate::port::DEFAULT_MAX_BATCH_BYTES,
            migrate: true,
            claims_from_other_hosts: true,
        }
    }
}

impl SqliteOptions {
    /// Parses the query part of a `sqlite://` URL: `synchronous=acknowledged|full|normal`, `busy_timeout=30s`,
    /// `max_batch_bytes=64MiB`, `migrate=true|false`.
    pub fn from_query(query: &str) -> Result<Self, String> {
        let mut options = Self::default();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            match key {
                "synchronous" => {
                    options.synchronous = match value {
                        "full" => Synchronous::Full,
                        "acknowledged" => Synchronous::Acknowledged,
                        "normal" => Synchronous::Normal,
                        other => return Err(format!("synchronous={other:?} is not acknowledged, full or normal")),
                    }
                }
                "busy_timeout" => {
                    options.busy_timeout =
                        humantime::parse_duration(value).map_err(|e| format!("busy_timeout={value:?}: {e}"))?;
                }
                "max_batch_bytes" => options.max_batch_bytes = crate::write_rules::parse_max_batch_bytes(value)?,
                "migrate" => {
                    options.migrate = match value {
                        "true" => true,
                        "false" => false,
                        other => return Err(format!("migrate={other:?} is not true or false")),
                    }
                }
                other => {
                    return Err(format!(
                        "unknown option {other:?}; known: synchronous, busy_timeout, max_batch_bytes, migrate"
                    ));
                }
            }
        }
        Ok(options)
    }
}

/// A handle on one store file. Clones share one connection; open more handles (or more
/// processes) for parallel access: SQLite serializes the writers.
#[derive(Clone)]
pub struct SqliteBackend {
    connection: Arc<Mutex<Connection>>,
    /// Appends waiting for the connection: whoever gets it next commits them all at once.
    appends: Arc<Mutex<Vec<writes::PendingAppend>>>,
    path: PathBuf,
    /// `SqliteOptions::max_batch_bytes`.
    max_batch_bytes: u64,
    /// `SqliteOptions::claims_from_other_hosts`.
    claims_from_other_hosts: bool,
    /// `SqliteOptions::synchronous`.
    synchronous: Synchronous,
    /// The write-ahead log, held open to sync it (`None` at `synchronous=normal`).
    log: Option<Arc<announced_first::WriteAheadLog>>,
    /// Wakes `wait_for_change` when the store file is written.
    wakes: wakes::SharedWakes,
}

pub(crate) fn unavailable(error: rusqlite::Error) -> StoreError {
    StoreError::Unavailable(error.to_string())
}

/// Why the open file is not a store autocomp made: not SQLite at all, or a SQLite database of
/// something else (tables, but none of ours). `None` for a store of ours or a new, empty
/// database.
fn foreign(conn: &Connection) -> Option<&'static str> {
    let tables = conn.query_row(
        "SELECT COUNT(*), COUNT(*) FILTER (WHERE name = 'schema_version') FROM sqlite_master WHERE type = 'table'",
        [],
        |row| Ok((row.get::<_, i64>(0)?, row.get::<_, i64>(1)?)),
    );
    match tables {
        Err(rusqlite::Error::SqliteFailure(failure, _)) if failure.code == rusqlite::ErrorCode::NotADatabase => {
            Some("is not a SQLite database")
        }
        Ok((tables, 0)) if tables > 0 => Some("is a SQLite database of something else (it has no autocomp schema)"),
        _ => None,
    }
}

/// Creates a new store file empty and 0600 whatever the umask, before SQLite writes a byte
/// of it: SQLite gives its `-wal` and `-shm` the store file's mode, so all three stay
/// private (under umask 022 they were 0644, readable past `--reads-need-token`). An
/// existing file is left as it is.
fn create_private(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}

/// `work` on the connection, then, if it changed anything, what it committed announced to
/// the host's waiters (or rolled back: a spurious wake costs a waiter one head read); with
/// whether it changed anything.
fn announced<T>(conn: &mut Connection, wakes: &wakes::FileWakes, work: impl FnOnce(&mut Connection) -> T) -> (T, bool) {
    let before = conn.total_changes();
    let done = work(conn);
    let changed = conn.total_changes() != before;
    if changed {
        wakes.announce(&wakes::take_concerns(conn));
    }
    (done, changed)
}

/// The embedded store as every caller holds it: the file behind the checks every backend
/// shares (`Checked`).
pub type SqliteStore = Checked<SqliteBackend>;

impl SqliteStore {
    pub async fn open(path: impl AsRef<Path>) -> StoreResult<Self> {
        SqliteBackend::open(path).await.map(Checked::new)
    }

    /// Opens (creating if needed) and migrates the store file.
    pub async fn open_with(path: impl AsRef<Path>, options: SqliteOptions) -> StoreResult<Self> {
        SqliteBackend::open_with(path, options).await.map(Checked::new)
    }

    /// Opens a store file that nothing writes while it is open (a benchmark's cached data
    /// set) strictly read-only: SQLite's `immutable`, so not even the WAL index is touched.
    /// Writes through this handle fail; a file at another schema version is refused.
    #[doc(hidden)]
    pub async fn open_immutable(path: impl AsRef<Path>) -> StoreResult<Self> {
        SqliteBackend::open_immutable(path).await.map(Checked::new)
    }

    /// Writes a store file as an older release left it, for upgrade tests.
    #[doc(hidden)]
    pub fn create_at_schema_version(path: impl AsRef<Path>, version: i64) -> StoreResult<()> {
        SqliteBackend::create_at_schema_version(path, version)
    }
}

impl SqliteBackend {
    async fn open(path: impl AsRef<Path>) -> StoreResult<Self> {
        Self::open_with(path, SqliteOptions::default()).await
    }

    /// Opens (creating if needed) and migrates the store file.
    async fn open_with(path: impl AsRef<Path>, options: SqliteOptions) -> StoreResult<Self> {
        let path = path.as_ref().to_path_buf();
        let opened_path = path.clone();
        let max_batch_bytes = options.max_batch_bytes;
        let (claims_from_other_hosts, synchronous) = (options.claims_from_other_hosts, options.synchronous);
        let (connection, log) = tokio::task::spawn_blocking(move || {
            let conn = Self::connect(&opened_path, &options)?;
            let log = match options.synchronous {
                Synchronous::Normal => None,
                Synchronous::Full | Synchronous::Acknowledged => announced_first::WriteAheadLog::of(&conn),
            };
            Ok::<_, StoreError>((conn, log))
        })
        .await
        .map_err(|e| StoreError::Unavailable(format!("opening the store failed: {e}")))??;
        let wakes = Arc::new(wakes::FileWakes::new(&path));
        Ok(Self {
            connection: Arc::new(Mutex::new(connection)),
            appends: Arc::default(),
            path,
            max_batch_bytes,
            claims_from_other_hosts,
            synchronous,
            log,
            wakes,
        })
    }

    fn connect(path: &Path, options: &SqliteOptions) -> StoreResult<Connection> {
        let describe = |e: rusqlite::Error| StoreError::Unavailable(format!("store file {}: {e}", path.display()));
        let not_ours = |reason: &str| {
            StoreError::Invalid(InvalidInput::new(
                "store file",
                path.display().to_string(),
                format!(
                    "{reason}; point the store URL at the pipeline's store file, or at a path that does not exist yet \
                         for a new store"
                ),
            ))
        };
        // A file that is there but was not made by autocomp is refused, never taken over: an
        // empty one is what a truncation or a mistyped `touch` leaves. A store autocomp makes
        // is empty only for the moment between its creator's open and its first write (the
        // header, microseconds later), so an empty file is given a second to fill before it is
        // refused: another process creating the store at the same time is waited for.
        let empty = || std::fs::metadata(path).is_ok_and(|meta| meta.is_file() && meta.len() == 0);
        if empty() {
            let deadline = std::time::Instant::now() + Duration::from_secs(1);
            while empty() && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            if empty() {
                return Err(not_ours("is an empty file, not a store autocomp made"));
            }
        }
        let mut conn = if options.migrate {
            create_private(path).map_err(|e| StoreError::Unavailable(format!("store file {}: {e}", path.display())))?;
            Connection::open(path).map_err(describe)?
        } else {
            // Nothing is written without migrate: not even a new file for a mistyped path.
            if !path.exists() {
                return Err(StoreError::NoStoreFile(format!(
                    "there is no store file at {}; the first component pass or `autocomp add` creates it",
                    path.display()
                )));
            }
            let flags = rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX;
            Connection::open_with_flags(path, flags).map_err(describe)?
        };
        conn.busy_timeout(options.busy_timeout).map_err(describe)?;
        statements::keep_prepared(&conn);
        if let Some(reason) = foreign(&conn) {
            return Err(not_ours(reason));
        }
        let mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0)).map_err(describe)?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(StoreError::Unavailable(format!(
                "store file {}: cannot use WAL journaling (got {mode}); is it on a network file system?",
                path.display()
            )));
        }
        let synchronous = match options.synchronous {
            Synchronous::Full | Synchronous::Acknowledged => "FULL",
            Synchronous::Normal => "NORMAL",
        };
        conn.execute_batch(&format!("PRAGMA synchronous = {synchronous}; PRAGMA foreign_keys = ON;"))
            .map_err(describe)?;
        // The store's statements are key lookups whose plans never depend on the bound
        // values; without the planner stability guarantee SQLite re-prepares them on almost
        // every execution (23% of a catch-up's CPU, measured in the index benchmark).
        conn.set_db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true).map_err(describe)?;
        rusqlite::vtab::array::load_module(&conn).map_err(describe)?;
        if options.migrate {
            schema::migrate(&mut conn)?;
        } else {
            let current = schema::schema_version(&conn).unwrap_or(0);
            if current != LATEST_VERSION {
                let mismatch = if current > LATEST_VERSION { StoreError::SchemaNewer } else { StoreError::SchemaOlder };
                return Err(mismatch(format!(
                    "the store file {} has schema version {current}, this release needs {LATEST_VERSION}; \
                     opening it without migrate=false (any component's pass, or an `autocomp` command) migrates it",
                    path.display()
                )));
            }
        }
        wakes::track_concerns(&conn).map_err(describe)?;
        Ok(conn)
    }

    /// Opens a store file that nothing writes while it is open (a benchmark's cached data
    /// set) strictly read-only: SQLite's `immutable`, so not even the WAL index is touched.
    /// Writes through this handle fail; a file at another schema version is refused.
    #[doc(hidden)]
    async fn open_immutable(path: impl AsRef<Path>) -> StoreResult<Self> {
        let path = path.as_ref().to_path_buf();
        let opened_path = path.clone();
        let connection = tokio::task::spawn_blocking(move || {
            let describe =
                |e: rusqlite::Error| StoreError::Unavailable(format!("store file {}: {e}", opened_path.display()));
            let flags = rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY
                | rusqlite::OpenFlags::SQLITE_OPEN_URI
                | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX;
            let uri = format!("file:{}?immutable=1", opened_path.display());
            let conn = Connection::open_with_flags(uri, flags).map_err(describe)?;
            conn.set_db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true).map_err(describe)?;
            rusqlite::vtab::array::load_module(&conn).map_err(describe)?;
            let version = schema::schema_version(&conn)?;
            if version != LATEST_VERSION {
                let mismatch = if version > LATEST_VERSION { StoreError::SchemaNewer } else { StoreError::SchemaOlder };
                return Err(mismatch(format!(
                    "store file {}: schema version {version}, this release reads {LATEST_VERSION}",
                    opened_path.display()
                )));
            }
            Ok(conn)
        })
        .await
        .map_err(|e| StoreError::Unavailable(format!("opening the store failed: {e}")))??;
        Ok(Self {
            connection: Arc::new(Mutex::new(connection)),
            appends: Arc::default(),
            wakes: Arc::new(wakes::FileWakes::new(&path)),
            path,
            max_batch_bytes: crate::port::DEFAULT_MAX_BATCH_BYTES,
            claims_from_other_hosts: true,
            synchronous: Synchronous::Full,
            log: None,
        })
    }

    /// `get_batches` the way it read before it became set-based (three statements per
    /// batch), for the benchmark's before/after in one run.
    #[doc(hidden)]
    pub async fn get_batches_one_by_one(&self, ids: &[BatchId]) -> StoreResult<Vec<Batch>> {
        let ids = ids.to_vec();
        self.with_connection(move |conn| reads::get_batches_one_by_one(conn, &ids)).await
    }

    /// Writes a store file as an older release left it, for upgrade tests.
    #[doc(hidden)]
    fn create_at_schema_version(path: impl AsRef<Path>, version: i64) -> StoreResult<()> {
        let mut conn = Connection::open(path.as_ref()).map_err(unavailable)?;
        schema::migrate_up_to(&mut conn, version)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub async fn schema_version(&self) -> StoreResult<i64> {
        self.with_connection(|conn| schema::schema_version(conn)).await
    }

    /// How this handle's claims are served (`runs::Commit::of_claims`).
    fn served(&self) -> runs::Served {
        runs::Served {
            to_other_hosts: self.claims_from_other_hosts,
            synced_file: self.synchronous != Synchronous::Normal,
        }
    }

    /// Group commit: concurrent appends through this handle (the store service's 16
    /// clients, a runner's threads) share one transaction and one fsync. Each waits in the
    /// queue; whichever task holds the connection next commits everything queued by then,
    /// each append with the runs it hands its batch on to.
    async fn append_queued(
        &self,
        batch: &BatchId,
        event: NewEvent,
        hand_on: Vec<ComponentName>,
    ) -> StoreResult<HandedOn> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let pending = writes::PendingAppend { batch: batch.clone(), event, hand_on, reply };
        self.appends.lock().unwrap_or_else(|p| p.into_inner()).push(pending);
        let (queue, cap) = (Arc::clone(&self.appends), self.max_batch_bytes);
        self.write_on_a_stage_path(
            move |conn, commit| {
                let group = std::mem::take(&mut *queue.lock().unwrap_or_else(|p| p.into_inner()));
                match group.is_empty() {
                    true => Ok(Vec::new()),
                    // Never refused for its setting (`with_synchronous`): the group's replies
                    // always come back with their answers.
                    false => commit.run(conn, move |conn| Ok(writes::append_group(conn, group, cap))),
                }
            },
            |done, synced| {
                for (reply, answer) in done.unwrap_or_default() {
                    // The caller may have gone; the event stands regardless.
                    let _ = reply.send(announced_first::on_disk(answer, &synced));
                }
            },
        )
        .await?;
        let answer =
            answer.await.map_err(|_| StoreError::Unavailable("the append was lost with its store task".into()));
        answer?.map_err(|e| self.naming_the_file(e))
    }

    /// Runs blocking SQLite work on tokio's blocking pool, never on an async worker thread.
    async fn with_connection<T, F>(&self, work: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> StoreResult<T> + Send + 'static,
    {
        let connection = Arc::clone(&self.connection);
        let wakes = Arc::clone(&self.wakes);
        tokio::task::spawn_blocking(move || {
            // A panic mid-transaction rolled the transaction back when it unwound; the
            // connection itself is still sound.
            let mut conn = connection.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            announced(&mut conn, &wakes, work).0
        })
        .await
        .map_err(|e| StoreError::Unavailable(format!("store task failed: {e}")))?
        .map_err(|e| self.naming_the_file(e))
    }

    /// An outage names the store file, so an operator knows which disk or file to look at
    /// ("store file /var/lib/autocomp/store.db: database or disk is full").
    fn naming_the_file(&self, error: StoreError) -> StoreError {
        match error {
            StoreError::Unavailable(message) => {
                StoreError::Unavailable(format!("store file {}: {message}", self.path.display()))
            }
            other => other,
        }
    }
}

#[cfg(test)]
mod file_mode_tests {
    use std::os::unix::fs::PermissionsExt;

    use autocomp_model::{BatchId, BatchType, NewBatch};

    use super::*;
    use crate::port::BatchStore;

    /// Whatever the umask lets through (022 when tests run), a new store file and the `-wal`
    /// and `-shm` SQLite makes beside it are the owner's alone, and so is `-wake`.
    #[tokio::test]
    async fn a_new_store_file_and_its_companions_are_private() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let path = dir.path().join("store.db");
        let store = SqliteStore::open(&path).await.unwrap();
        let batch = NewBatch::new(BatchId::new("B1").unwrap(), BatchType::new("RoundTrip").unwrap());
        store.create_batch(batch).await.unwrap();
        for name in ["store.db", "store.db-wal", "store.db-shm", "store.db-wake"] {
            let mode = std::fs::metadata(dir.path().join(name)).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "{name}");
        }
    }
}
