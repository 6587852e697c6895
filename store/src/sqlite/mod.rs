//! The embedded object store: one SQLite file in WAL mode, safe for many processes on one
//! host. Every write is one IMMEDIATE transaction (so writers queue on the busy timeout
//! instead of failing on a lock upgrade), and every seq comes from the single `store_head`
//! counter inside that transaction, which makes seqs strictly increasing in commit order
//! (the component registry's writes change no batch and take no seq).

mod history;
mod ops;
mod rows;
mod schema;
mod steering;
mod summary;
mod wakes;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use rusqlite::Connection;
use serde_json::{Map, Value};

use crate::pipeline_state::{CursorMove, Enqueued, NewNotice, Notice, NoticeOutcome, Steered};
use crate::port::{
    BatchHead, BatchListing, BatchStore, Cancellation, ChangePage, Claim, CreateOutcome, LogCursor, LogPage,
    OutboxStore, RegistryStore, SeriesStore, SteeringStore, StoreAbout, StoreError, StoreResult,
};
use crate::steering_rules;
use autocomp_model::{
    Agent, BacklogSample, Batch, BatchId, BatchSummary, ComponentName, Event, InvalidInput, NewBatch, NewEvent,
    PassRecord, RegisteredComponent, Run, RunHolder, Seq, SeriesStep, Steering, SteeringEntry, SteeringRequest,
    Timestamp, WorkPoint,
};

pub use schema::LATEST_VERSION;

/// How often a waiter woken by file notifications still reads the head, in case one is
/// missed (a file system that does not deliver them for another host's writes).
const WATCHING_POLL: Duration = Duration::from_secs(2);
/// How long after a file notification a waiter keeps looking for the commit it announced.
const SETTLE_FOR: Duration = Duration::from_secs(1);

/// SQLite's `synchronous` setting, the durability/speed trade-off of a commit in WAL mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Synchronous {
    /// fsync the WAL at every commit: an acknowledged event survives power loss too.
    Full,
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
}

impl Default for SqliteOptions {
    fn default() -> Self {
        Self {
            synchronous: Synchronous::Full,
            busy_timeout: Duration::from_secs(30),
            max_batch_bytes: crate::port::DEFAULT_MAX_BATCH_BYTES,
            migrate: true,
        }
    }
}

impl SqliteOptions {
    /// Parses the query part of a `sqlite://` URL: `synchronous=full|normal`, `busy_timeout=30s`,
    /// `max_batch_bytes=64MiB`, `migrate=true|false`.
    pub fn from_query(query: &str) -> Result<Self, String> {
        let mut options = Self::default();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            match key {
                "synchronous" => {
                    options.synchronous = match value {
                        "full" => Synchronous::Full,
                        "normal" => Synchronous::Normal,
                        other => return Err(format!("synchronous={other:?} is not full or normal")),
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
pub struct SqliteStore {
    connection: Arc<Mutex<Connection>>,
    /// Appends waiting for the connection: whoever gets it next commits them all at once.
    appends: Arc<Mutex<Vec<ops::PendingAppend>>>,
    path: PathBuf,
    /// `SqliteOptions::max_batch_bytes`.
    max_batch_bytes: u64,
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

impl SqliteStore {
    pub async fn open(path: impl AsRef<Path>) -> StoreResult<Self> {
        Self::open_with(path, SqliteOptions::default()).await
    }

    /// Opens (creating if needed) and migrates the store file.
    pub async fn open_with(path: impl AsRef<Path>, options: SqliteOptions) -> StoreResult<Self> {
        let path = path.as_ref().to_path_buf();
        let opened_path = path.clone();
        let max_batch_bytes = options.max_batch_bytes;
        let connection = tokio::task::spawn_blocking(move || Self::connect(&opened_path, &options))
            .await
            .map_err(|e| StoreError::Unavailable(format!("opening the store failed: {e}")))??;
        let wakes = Arc::new(wakes::FileWakes::new(&path));
        Ok(Self { connection: Arc::new(Mutex::new(connection)), appends: Arc::default(), path, max_batch_bytes, wakes })
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
            Synchronous::Full => "FULL",
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
        Ok(conn)
    }

    /// Opens a store file that nothing writes while it is open (a benchmark's cached data
    /// set) strictly read-only: SQLite's `immutable`, so not even the WAL index is touched.
    /// Writes through this handle fail; a file at another schema version is refused.
    #[doc(hidden)]
    pub async fn open_immutable(path: impl AsRef<Path>) -> StoreResult<Self> {
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
        })
    }

    /// `get_batches` the way it read before it became set-based (three statements per
    /// batch), for the benchmark's before/after in one run.
    #[doc(hidden)]
    pub async fn get_batches_one_by_one(&self, ids: &[BatchId]) -> StoreResult<Vec<Batch>> {
        let ids = ids.to_vec();
        self.with_connection(move |conn| ops::get_batches_one_by_one(conn, &ids)).await
    }

    /// Writes a store file as an older release left it, for upgrade tests.
    #[doc(hidden)]
    pub fn create_at_schema_version(path: impl AsRef<Path>, version: i64) -> StoreResult<()> {
        let mut conn = Connection::open(path.as_ref()).map_err(unavailable)?;
        schema::migrate_up_to(&mut conn, version)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub async fn schema_version(&self) -> StoreResult<i64> {
        self.with_connection(|conn| schema::schema_version(conn)).await
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
            let before = conn.total_changes();
            let done = work(&mut conn);
            if conn.total_changes() != before {
                // Committed (or rolled back: a spurious wake costs a waiter one head read).
                wakes.announce();
            }
            done
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

#[async_trait]
impl BatchStore for SqliteStore {
    async fn create_batch(&self, batch: NewBatch) -> StoreResult<CreateOutcome> {
        batch.validate()?;
        self.with_connection(move |conn| ops::create_batch(conn, &batch)).await
    }

    async fn get_batch(&self, id: &BatchId) -> StoreResult<Batch> {
        let id = id.clone();
        self.with_connection(move |conn| {
            ops::get_batches(conn, std::slice::from_ref(&id))?.pop().ok_or(StoreError::NotFound(id))
        })
        .await
    }

    async fn get_batches(&self, ids: &[BatchId]) -> StoreResult<Vec<Batch>> {
        let ids = ids.to_vec();
        self.with_connection(move |conn| ops::get_batches(conn, &ids)).await
    }

    async fn list_batches(&self, after: Option<&BatchId>, limit: usize) -> StoreResult<Vec<Batch>> {
        let after = after.cloned();
        self.with_connection(move |conn| ops::list_batches(conn, after.as_ref(), limit)).await
    }

    async fn get_summaries(&self, ids: &[BatchId]) -> StoreResult<Vec<BatchSummary>> {
        let ids = ids.to_vec();
        self.with_connection(move |conn| ops::get_summaries(conn, &ids)).await
    }

    async fn list_summaries(&self, after: Option<&BatchId>, limit: usize) -> StoreResult<Vec<BatchSummary>> {
        let after = after.cloned();
        self.with_connection(move |conn| ops::list_summaries(conn, after.as_ref(), limit)).await
    }

    async fn batch_head(&self, id: &BatchId) -> StoreResult<BatchHead> {
        let id = id.clone();
        self.with_connection(move |conn| ops::batch_head(conn, &id)).await
    }

    async fn log_page(&self, id: &BatchId, cursor: LogCursor, limit: usize) -> StoreResult<LogPage> {
        let id = id.clone();
        self.with_connection(move |conn| ops::log_page(conn, &id, cursor, limit, None)).await
    }

    async fn log_page_within(
        &self,
        id: &BatchId,
        cursor: LogCursor,
        limit: usize,
        details_up_to: u64,
    ) -> StoreResult<LogPage> {
        let id = id.clone();
        self.with_connection(move |conn| ops::log_page(conn, &id, cursor, limit, Some(details_up_to))).await
    }

    async fn run_state(&self, batch: &BatchId, component: &ComponentName) -> StoreResult<Option<Run>> {
        let (batch, component) = (batch.clone(), component.clone());
        self.with_connection(move |conn| ops::run_state(conn, &batch, &component)).await
    }

    async fn get_listings(&self, ids: &[BatchId]) -> StoreResult<Vec<BatchListing>> {
        let ids = ids.to_vec();
        self.with_connection(move |conn| ops::get_listings(conn, &ids)).await
    }

    async fn set_priority(&self, id: &BatchId, priority: i32) -> StoreResult<Seq> {
        let id = id.clone();
        self.with_connection(move |conn| ops::set_priority(conn, &id, priority)).await
    }

    async fn record_content_change(&self, id: &BatchId, metadata_patch: Map<String, Value>) -> StoreResult<Seq> {
        let (id, cap) = (id.clone(), self.max_batch_bytes);
        self.with_connection(move |conn| ops::record_content_change(conn, &id, metadata_patch, cap)).await
    }

    /// Group commit: concurrent appends through this handle (the store service's 16
    /// clients, a runner's threads) share one transaction and one fsync. Each waits in the
    /// queue; whichever task holds the connection next commits everything queued by then.
    async fn append_event(&self, batch: &BatchId, event: NewEvent) -> StoreResult<Event> {
        event.validate()?;
        let (reply, answer) = tokio::sync::oneshot::channel();
        let pending = ops::PendingAppend { batch: batch.clone(), event, reply };
        self.appends.lock().unwrap_or_else(|p| p.into_inner()).push(pending);
        let (queue, cap) = (Arc::clone(&self.appends), self.max_batch_bytes);
        self.with_connection(move |conn| {
            let group = std::mem::take(&mut *queue.lock().unwrap_or_else(|p| p.into_inner()));
            if !group.is_empty() {
                ops::append_group(conn, group, cap);
            }
            Ok(())
        })
        .await?;
        let answer =
            answer.await.map_err(|_| StoreError::Unavailable("the append was lost with its store task".into()));
        answer?.map_err(|e| self.naming_the_file(e))
    }

    async fn claim(&self, batch: &BatchId, component: &ComponentName, holder: &RunHolder) -> StoreResult<Claim> {
        holder.validate()?;
        let (batch, component, holder) = (batch.clone(), component.clone(), holder.clone());
        self.with_connection(move |conn| ops::claim(conn, &batch, &component, &holder)).await
    }

    async fn claim_many(
        &self,
        batches: &[BatchId],
        component: &ComponentName,
        holder: &RunHolder,
    ) -> StoreResult<Vec<StoreResult<Claim>>> {
        holder.validate()?;
        let (batches, component, holder) = (batches.to_vec(), component.clone(), holder.clone());
        self.with_connection(move |conn| ops::claim_many(conn, &batches, &component, &holder)).await
    }

    async fn release(&self, batch: &BatchId, component: &ComponentName, generation: i64) -> StoreResult<()> {
        let (batch, component) = (batch.clone(), component.clone());
        self.with_connection(move |conn| ops::release(conn, &batch, &component, generation)).await
    }

    async fn save_checkpoint(
        &self,
        batch: &BatchId,
        component: &ComponentName,
        generation: i64,
        data: Value,
    ) -> StoreResult<()> {
        autocomp_model::check_object("checkpoint", &data)?;
        let (batch, component) = (batch.clone(), component.clone());
        self.with_connection(move |conn| ops::save_checkpoint(conn, &batch, &component, generation, &data)).await
    }

    async fn load_checkpoint(&self, batch: &BatchId, component: &ComponentName) -> StoreResult<Option<Value>> {
        let (batch, component) = (batch.clone(), component.clone());
        self.with_connection(move |conn| ops::load_checkpoint(conn, &batch, &component)).await
    }

    async fn open_runs(&self, component: Option<&ComponentName>) -> StoreResult<Vec<Run>> {
        let component = component.cloned();
        self.with_connection(move |conn| ops::open_runs(conn, component.as_ref())).await
    }

    async fn failed_attempts(&self, batch: &BatchId, component: &ComponentName, since: Seq) -> StoreResult<u32> {
        let (batch, component) = (batch.clone(), component.clone());
        self.with_connection(move |conn| ops::failed_attempts(conn, &batch, &component, since)).await
    }

    async fn changes(&self, since: Seq, limit: usize) -> StoreResult<ChangePage> {
        self.with_connection(move |conn| ops::changes(conn, since, limit)).await
    }

    async fn head(&self) -> StoreResult<Seq> {
        self.with_connection(ops::head).await
    }

    /// The file is on this host: its clock is the host's.
    async fn about(&self) -> StoreResult<StoreAbout> {
        let schema_version = self.with_connection(|conn| schema::schema_version(conn)).await?;
        Ok(StoreAbout {
            backend: "sqlite".into(),
            schema_version,
            schema_wanted: LATEST_VERSION,
            clock: Timestamp::now(),
        })
    }

    /// Sleeps until the store file is written (a file watch; any process's commit), then
    /// reads the head; polls every 50 ms where the file cannot be watched, and every
    /// `WATCHING_POLL` anyway. A commit writes its WAL frames before it becomes visible
    /// (the WAL index is shared memory, which no notification reports), so a wake that finds
    /// the head unmoved looks again soon, backing off, for `SETTLE_FOR`.
    async fn wait_for_change(&self, since: Seq, timeout: Duration) -> StoreResult<Seq> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut wakes = self.wakes.wakes();
        let mut settling: Option<(tokio::time::Instant, Duration)> = None;
        loop {
            // Before the read: a commit after it wakes the wait below.
            let watching = wakes.watching();
            let head = self.head().await?;
            let now = tokio::time::Instant::now();
            if head > since || now >= deadline {
                return Ok(head);
            }
            let poll = match settling {
                Some((until, pause)) if now < until => {
                    settling = Some((until, (pause * 2).min(Duration::from_millis(50))));
                    pause
                }
                _ if watching => WATCHING_POLL,
                _ => Duration::from_millis(50),
            };
            tokio::select! {
                _ = wakes.changed() => {
                    if settling.is_none_or(|(until, _)| now >= until) {
                        settling = Some((tokio::time::Instant::now() + SETTLE_FOR, Duration::from_millis(2)));
                    }
                }
                _ = tokio::time::sleep_until((now + poll).min(deadline)) => {}
            }
        }
    }

    async fn cancel_run(
        &self,
        batch: &BatchId,
        component: &ComponentName,
        event: NewEvent,
    ) -> StoreResult<Cancellation> {
        event.validate()?;
        let (batch, component, cap) = (batch.clone(), component.clone(), self.max_batch_bytes);
        self.with_connection(move |conn| ops::cancel_run(conn, &batch, &component, event, cap)).await
    }

    async fn prioritize(&self, id: &BatchId, priority: i32, event: NewEvent) -> StoreResult<Event> {
        event.validate()?;
        let (id, cap) = (id.clone(), self.max_batch_bytes);
        self.with_connection(move |conn| ops::prioritize(conn, &id, priority, event, cap)).await
    }

    async fn count_batches(&self) -> StoreResult<u64> {
        self.with_connection(ops::count_batches).await
    }
}

#[async_trait]
impl RegistryStore for SqliteStore {
    async fn record_pass(&self, pass: PassRecord) -> StoreResult<()> {
        pass.validate()?;
        self.with_connection(move |conn| ops::record_pass(conn, &pass)).await
    }

    async fn components(&self) -> StoreResult<Vec<RegisteredComponent>> {
        self.with_connection(ops::components).await
    }

    async fn retire_component(
        &self,
        name: &ComponentName,
        by: &Agent,
        reason: &str,
    ) -> StoreResult<RegisteredComponent> {
        let reason = crate::write_rules::retirement_reason(reason)?;
        let (name, by) = (name.clone(), by.clone());
        self.with_connection(move |conn| ops::retire_component(conn, &name, &by, &reason)).await
    }
}

#[async_trait]
impl SteeringStore for SqliteStore {
    async fn steering(&self) -> StoreResult<Steering> {
        self.with_connection(steering::steering).await
    }

    async fn steer(&self, request: SteeringRequest) -> StoreResult<Steered> {
        steering_rules::check_steering(&request)?;
        self.with_connection(move |conn| steering::steer(conn, &request)).await
    }

    async fn steering_log(&self, limit: usize) -> StoreResult<Vec<SteeringEntry>> {
        steering_rules::check_log_limit(limit)?;
        self.with_connection(move |conn| steering::steering_log(conn, limit)).await
    }
}

#[async_trait]
impl OutboxStore for SqliteStore {
    async fn enqueue_notices(&self, notices: Vec<NewNotice>, cursor: Option<CursorMove>) -> StoreResult<Enqueued> {
        steering_rules::check_notices(&notices)?;
        steering_rules::check_cursor(&cursor)?;
        self.with_connection(move |conn| steering::enqueue_notices(conn, &notices, cursor)).await
    }

    async fn take_notices(&self, holder: &str, limit: usize, lease: Duration) -> StoreResult<Vec<Notice>> {
        steering_rules::check_take(holder, limit, lease)?;
        let holder = holder.to_owned();
        self.with_connection(move |conn| steering::take_notices(conn, &holder, limit, lease)).await
    }

    async fn settle_notice(&self, key: &str, holder: &str, outcome: NoticeOutcome) -> StoreResult<()> {
        steering_rules::check_key(key)?;
        let (key, holder) = (key.to_owned(), holder.to_owned());
        self.with_connection(move |conn| steering::settle_notice(conn, &key, &holder, &outcome)).await
    }

    async fn recent_notices(&self, limit: usize) -> StoreResult<Vec<Notice>> {
        steering_rules::check_take("reader", limit, Duration::from_secs(1))?;
        self.with_connection(move |conn| steering::recent_notices(conn, limit)).await
    }
}

#[async_trait]
impl SeriesStore for SqliteStore {
    async fn work_series(
        &self,
        step: SeriesStep,
        since: Timestamp,
        component: Option<&ComponentName>,
    ) -> StoreResult<Vec<WorkPoint>> {
        let component = component.cloned();
        self.with_connection(move |conn| history::work_series(conn, step, since, component.as_ref())).await
    }

    async fn record_backlog(&self, samples: Vec<BacklogSample>) -> StoreResult<()> {
        crate::write_rules::check_backlog(&samples)?;
        self.with_connection(move |conn| history::record_backlog(conn, &samples)).await
    }
}

#[cfg(test)]
mod file_mode_tests {
    use std::os::unix::fs::PermissionsExt;

    use autocomp_model::{BatchId, BatchType, NewBatch};

    use super::*;

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
