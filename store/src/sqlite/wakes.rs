//! Pushed wake-ups for an embedded store: a file watch (inotify on Linux) on the store file's
//! directory, so a commit by any process on the host wakes the waiters in `wait_for_change`
//! at once instead of at their next poll. A commit writes its WAL frames before it becomes
//! visible (the WAL index is shared memory, which no notification reports), so after each
//! write it commits a handle also appends a line to `<store>-wake`: the notification waiters
//! can trust to come after the change is there to read. The line says whom the commit
//! concerns (`ChangeConcern::to_payload`, what the connection's temporary triggers collected
//! while it wrote: `track_concerns`), so `wait_for_change_concerning` wakes a waiter only for
//! commits that concern it.

use std::io::{Read, Seek};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use notify::{EventKind, RecommendedWatcher, RecursiveMode, Watcher};
use rusqlite::Connection;
use tokio::sync::watch;

use crate::wake_history::WakeHistory;
use autocomp_model::{ChangeConcern, Seq};

/// One per store handle (clones share it); the watch starts with the first waiter.
pub(super) struct FileWakes {
    path: PathBuf,
    wakes: watch::Sender<u64>,
    /// The directory is watched: a commit from now on wakes the waiters.
    watching: AtomicBool,
    /// Set at the first waiter: the watch is started once, and a failed start not retried.
    started: AtomicBool,
    watcher: Mutex<Option<RecommendedWatcher>>,
    /// `<store>-wake`, opened at the first announcement (`None` inside once it cannot be:
    /// waiters then rely on the WAL's own notifications and their polls).
    announcer: Mutex<Option<Option<std::fs::File>>>,
    /// What the lines of `<store>-wake` said, read as they are appended.
    pub(super) history: Arc<WakeHistory>,
}

/// `<store>-wake` is emptied before an announcement once it has grown this long (a reader
/// that finds it shorter than it had read wakes its waiters: lines may be lost).
const WAKE_FILE_MAX: u64 = 256 * 1024;

/// A waiter's view of the wake-ups.
pub(super) struct Wakes {
    receiver: watch::Receiver<u64>,
    watching: bool,
}

impl Wakes {
    /// Whether a commit after this call wakes `changed` (else the waiter must poll).
    pub(super) fn watching(&mut self) -> bool {
        self.receiver.borrow_and_update();
        self.watching
    }

    /// Resolves at the next wake-up after the last `watching` call.
    pub(super) async fn changed(&mut self) {
        if !self.watching || self.receiver.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

impl FileWakes {
    pub(super) fn new(path: &Path) -> Self {
        let (wakes, _) = watch::channel(0);
        Self {
            path: path.to_path_buf(),
            wakes,
            watching: AtomicBool::new(false),
            started: AtomicBool::new(false),
            watcher: Mutex::new(None),
            announcer: Mutex::new(None),
            history: Arc::default(),
        }
    }

    fn wake_file(&self) -> PathBuf {
        let mut path = self.path.clone().into_os_string();
        path.push("-wake");
        path.into()
    }

    /// Before a head read: the history's mark, if every commit from now on is announced to it.
    pub(super) fn mark(&self) -> Option<u64> {
        self.watching.load(Ordering::SeqCst).then(|| self.history.mark())
    }

    /// After a head read that `mark` preceded.
    pub(super) fn head_read(&self, head: Seq, mark: Option<u64>) {
        if let Some(mark) = mark {
            self.history.head_read(head, mark);
        }
    }

    /// The wake-ups, starting the watch on first use. A watch that cannot start (no inotify
    /// instances left, a file system without notifications) leaves the waiters polling.
    pub(super) fn wakes(&self) -> Wakes {
        let receiver = self.wakes.subscribe();
        if !self.started.swap(true, Ordering::SeqCst) {
            match self.watch() {
                Ok(started) => {
                    *self.watcher.lock().unwrap_or_else(|p| p.into_inner()) = Some(started);
                    self.watching.store(true, Ordering::SeqCst);
                }
                Err(error) => {
                    tracing::debug!(store = %self.path.display(), "cannot watch the store file: {error}; polling");
                }
            }
        }
        Wakes { receiver, watching: self.watching.load(Ordering::SeqCst) }
    }

    /// After a commit: one line appended to `<store>-wake` saying whom it concerns (no sync:
    /// only the notification matters), so every waiter on the host wakes now that the change
    /// can be read, and reads whether it concerns it.
    pub(super) fn announce(&self, concerns: &[ChangeConcern]) {
        use std::io::Write;
        let mut announcer = self.announcer.lock().unwrap_or_else(|p| p.into_inner());
        let file = announcer.get_or_insert_with(|| {
            let path = self.wake_file();
            // Private whatever the umask, like the store file beside it.
            let mut open = std::fs::OpenOptions::new();
            std::os::unix::fs::OpenOptionsExt::mode(&mut open, 0o600);
            match open.create(true).append(true).open(&path) {
                Ok(file) => Some(file),
                Err(error) => {
                    tracing::debug!(file = %std::path::Path::new(&path).display(), "cannot announce commits: {error}");
                    None
                }
            }
        });
        if let Some(file) = file {
            if file.metadata().is_ok_and(|meta| meta.len() > WAKE_FILE_MAX) {
                let _ = file.set_len(0);
            }
            // One write of the whole line: appends of concurrent writers do not interleave.
            let line: String = concerns.iter().map(|concern| format!("{}\n", concern.to_payload())).collect();
            if file.write_all(line.as_bytes()).is_err() {
                let _ = file.set_len(0);
            }
        }
    }

    fn watch(&self) -> notify::Result<RecommendedWatcher> {
        let directory = match self.path.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
            _ => PathBuf::from("."),
        };
        // The store file and its `-wal`/`-shm` companions; other files in the directory
        // (an index, logs) are not the store moving.
        let name = self.path.file_name().map(|n| n.to_os_string()).unwrap_or_default();
        let wakes = self.wakes.clone();
        // From the file's length now: what was announced before the watch is not news.
        let mut lines = WakeLines::from_end_of(self.wake_file());
        let history = Arc::clone(&self.history);
        let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
            let Ok(event) = event else { return };
            if !matches!(event.kind, EventKind::Modify(_) | EventKind::Create(_) | EventKind::Any) {
                return;
            }
            let ours = event.paths.iter().any(|path| {
                path.file_name().is_some_and(|file| file.as_encoded_bytes().starts_with(name.as_encoded_bytes()))
            });
            if ours {
                if event.paths.iter().any(|path| path.file_name() == lines.path.file_name()) {
                    for concern in lines.read_new() {
                        history.push(concern);
                    }
                }
                wakes.send_modify(|n| *n = n.wrapping_add(1));
            }
        })?;
        watcher.watch(&directory, RecursiveMode::NonRecursive)?;
        Ok(watcher)
    }
}

/// Shared by a handle's clones.
pub(super) type SharedWakes = Arc<FileWakes>;

/// Reads the lines appended to `<store>-wake` since the last read.
struct WakeLines {
    path: PathBuf,
    offset: u64,
    /// The start of a line not yet whole.
    partial: Vec<u8>,
}

impl WakeLines {
    fn from_end_of(path: PathBuf) -> Self {
        let offset = std::fs::metadata(&path).map_or(0, |meta| meta.len());
        Self { path, offset, partial: Vec::new() }
    }

    /// Whom the commits announced since the last read concern. Whatever cannot be read
    /// whole concerns everyone: the file emptied since (its lines lost), a read that fails,
    /// an older release's announcement (a `.` and no line).
    fn read_new(&mut self) -> Vec<ChangeConcern> {
        let mut concerns = Vec::new();
        let mut appended = Vec::new();
        let read = std::fs::File::open(&self.path).and_then(|mut file| {
            if file.metadata()?.len() < self.offset {
                concerns.push(ChangeConcern::Everyone);
                self.offset = 0;
                self.partial.clear();
            }
            file.seek(std::io::SeekFrom::Start(self.offset))?;
            file.read_to_end(&mut appended)
        });
        match read {
            Ok(length) => self.offset += length as u64,
            Err(_) => return vec![ChangeConcern::Everyone],
        }
        self.partial.extend_from_slice(&appended);
        if let Some(dot) = self.partial.iter().rposition(|byte| *byte == b'.') {
            concerns.push(ChangeConcern::Everyone);
            self.partial.drain(..=dot);
        }
        if let Some(end) = self.partial.iter().rposition(|byte| *byte == b'\n') {
            let whole: Vec<u8> = self.partial.drain(..=end).collect();
            for line in whole.split(|byte| *byte == b'\n').filter(|line| !line.is_empty()) {
                concerns.push(std::str::from_utf8(line).map_or(ChangeConcern::Everyone, ChangeConcern::from_payload));
            }
        }
        concerns
    }
}

/// The temporary table and triggers (this connection's alone, nothing in the file) that
/// collect whom a write concerns: the same rules as PostgreSQL's notify triggers (schema 10).
const TRACK_CONCERNS: &str = "
CREATE TEMP TABLE IF NOT EXISTS wake_concerns (concern TEXT NOT NULL);
CREATE TEMP TRIGGER IF NOT EXISTS wake_batch_created AFTER INSERT ON main.batches
BEGIN INSERT INTO wake_concerns VALUES ('c:'); END;
CREATE TEMP TRIGGER IF NOT EXISTS wake_batch_changed AFTER UPDATE OF priority, modified_seq ON main.batches
WHEN OLD.priority IS NOT NEW.priority OR OLD.modified_seq IS NOT NEW.modified_seq
BEGIN INSERT INTO wake_concerns VALUES ('*'); END;
CREATE TEMP TRIGGER IF NOT EXISTS wake_event_appended AFTER INSERT ON main.events
BEGIN
    INSERT INTO wake_concerns VALUES ('t:' || NEW.type);
    INSERT INTO wake_concerns SELECT 't:' || value FROM json_each(NEW.resets)
        WHERE NEW.resets IS NOT NULL AND json_valid(NEW.resets);
END;
CREATE TEMP TRIGGER IF NOT EXISTS wake_run_freed AFTER UPDATE OF state ON main.runs
WHEN OLD.state = 'open' AND NEW.state IN ('released', 'cancelled')
BEGIN INSERT INTO wake_concerns VALUES ('*'); END;
CREATE TEMP TRIGGER IF NOT EXISTS wake_steered AFTER UPDATE ON main.steering
BEGIN INSERT INTO wake_concerns VALUES ('*'); END;
";

/// Sets up `TRACK_CONCERNS` on a connection that writes (after its migrations).
pub(super) fn track_concerns(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute_batch(TRACK_CONCERNS)
}

/// Whom the connection's writes since the last call concern (a rolled-back write left
/// nothing: it concerns nobody), emptying the collection: one line's worth, or two for a
/// batch registered with its first events (`c:`, then their types), so that a waiter of the
/// release before, which reads `c:` as concerning everyone, still wakes for a new batch,
/// while one of this release merges the two as one commit's concern (`ChangeConcern::merge`).
pub(super) fn take_concerns(conn: &Connection) -> Vec<ChangeConcern> {
    let collected = conn.prepare_cached("SELECT DISTINCT concern FROM wake_concerns").and_then(|mut statement| {
        statement.query_map([], |row| row.get::<_, String>(0))?.collect::<rusqlite::Result<Vec<String>>>()
    });
    let emptied = conn.execute("DELETE FROM wake_concerns", []);
    let (Ok(collected), Ok(_)) = (collected, emptied) else { return vec![ChangeConcern::Everyone] };
    let concerns: Vec<ChangeConcern> = collected.iter().map(|one| ChangeConcern::from_payload(one)).collect();
    let merged = concerns.iter().cloned().fold(ChangeConcern::nobody(), |mut concern, one| {
        concern.merge(one);
        concern
    });
    let registered = concerns.contains(&ChangeConcern::Created);
    match merged {
        ChangeConcern::Types(types) if registered && !types.is_empty() => {
            vec![ChangeConcern::Created, ChangeConcern::Types(types)]
        }
        merged => vec![merged],
    }
}
