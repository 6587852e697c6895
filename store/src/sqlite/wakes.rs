//! Pushed wake-ups for an embedded store: a file watch (inotify on Linux) on `<store>-wake`,
//! so a commit by any process on the host wakes the waiters at once instead of at their next
//! poll. A commit writes its WAL frames before it becomes visible (the WAL index is shared
//! memory, which no notification reports), so after each write it commits a handle appends a
//! line to `<store>-wake`: the notification waiters can trust to come after the change is
//! there to read. The line says whom the commit concerns (`ChangeConcern::to_payload`, what
//! the connection's temporary triggers collected while it wrote: `track_concerns`), so
//! `wait_for_change_concerning` wakes a waiter only for commits that concern it.
//!
//! Only that file is watched, and its readers keep it open: a watch on the directory woke
//! every waiting process for every WAL frame any commit wrote and every open of the wake file
//! (each process's reader opened it at every line), a herd of wake-ups on the host's cores at
//! the moment the next stage should run.

use std::io::{Read, Seek};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use notify::{EventKind, RecommendedWatcher, RecursiveMode, Watcher};
use rusqlite::Connection;
use tokio::sync::watch;

use super::statements::Prepared;
use crate::port::{AnnouncementMark, HandOnNotice};
use crate::wake_history::WakeHistory;
use autocomp_model::{ChangeConcern, ComponentName, Seq};

/// One per store handle (clones share it); the watch starts with the first waiter.
pub(super) struct FileWakes {
    path: PathBuf,
    wakes: watch::Sender<u64>,
    /// `<store>-wake` is watched: a commit from now on wakes the waiters. Cleared for good
    /// when the file is removed or renamed under the watch (waiters poll from then on).
    watching: Arc<AtomicBool>,
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
    watching: Arc<AtomicBool>,
}

impl Wakes {
    /// Whether a commit after this call wakes `changed` (else the waiter must poll).
    pub(super) fn watching(&mut self) -> bool {
        self.receiver.borrow_and_update();
        self.watching.load(Ordering::SeqCst)
    }

    /// Resolves at the next wake-up after the last `watching` call.
    pub(super) async fn changed(&mut self) {
        // Not watching, nothing sends (but the removal that ended the watch, which must wake).
        if self.receiver.changed().await.is_err() {
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
            watching: Arc::new(AtomicBool::new(false)),
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

    /// A taker offered through this handle: its hand-ons wake the handle's waiters, and the
    /// watch starts now (a hand-on announced before it would not be heard).
    pub(super) fn expect_hand_ons(&self, component: &ComponentName, liveness: &str) {
        self.history.expect_hand_ons(component, liveness);
        drop(self.wakes());
    }

    /// `HandOnStore::hand_on_notice`, from the lines of `<store>-wake` read so far (which
    /// carry no runs: the taker reads them, a read of its own file).
    pub(super) fn hand_on_notice(
        &self,
        component: &ComponentName,
        liveness: &str,
        since: Option<AnnouncementMark>,
    ) -> HandOnNotice {
        let complete = self.watching.load(Ordering::SeqCst);
        self.history.hand_on_notice(component, liveness, since, complete).notice
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
        Wakes { receiver, watching: Arc::clone(&self.watching) }
    }

    /// After a commit: one line appended to `<store>-wake` saying whom it concerns (no sync:
    /// only the notification matters), so every waiter on the host wakes now that the change
    /// can be read, and reads whether it concerns it.
    pub(super) fn announce(&self, concerns: &[ChangeConcern]) {
        use std::io::Write;
        let mut announcer = self.announcer.lock().unwrap_or_else(|p| p.into_inner());
        // One look at the file a commit: removed under it (announce in the file that has the
        // name now, which the processes started since watch), or grown past its bound.
        let (mut removed, mut full) = (false, false);
        if let Some(Some(file)) = announcer.as_ref() {
            use std::os::unix::fs::MetadataExt;
            if let Ok(meta) = file.metadata() {
                (removed, full) = (meta.nlink() == 0, meta.len() > WAKE_FILE_MAX);
            }
        }
        if removed {
            *announcer = None;
        }
        let opened_now = announcer.is_none();
        let file = announcer.get_or_insert_with(|| {
            let path = self.wake_file();
            match open_wake_file(&path) {
                Ok(file) => Some(file),
                Err(error) => {
                    tracing::debug!(file = %path.display(), "cannot announce commits: {error}");
                    None
                }
            }
        });
        if let Some(file) = file {
            if (full && !removed) || (opened_now && file.metadata().is_ok_and(|meta| meta.len() > WAKE_FILE_MAX)) {
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
        let path = self.wake_file();
        // Created if no writer has announced yet (private, as the announcer makes it), so
        // there is a file to watch; what it holds now is not news.
        open_wake_file(&path).map_err(notify::Error::io)?;
        let mut lines = WakeLines::from_end_of(path.clone());
        let (wakes, history, watching) = (self.wakes.clone(), Arc::clone(&self.history), Arc::clone(&self.watching));
        let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
            let Ok(event) = event else { return };
            use notify::event::ModifyKind;
            let gone = match event.kind {
                EventKind::Modify(ModifyKind::Name(_)) | EventKind::Remove(_) => true,
                // Unlinked while a reader holds it open: the inode lives on, and only its
                // link count says so (a writer started later makes a new file, unwatched).
                EventKind::Modify(ModifyKind::Metadata(_)) => lines.unlinked(),
                EventKind::Modify(_) | EventKind::Any => false,
                _ => return,
            };
            if !gone {
                for concern in lines.read_new() {
                    history.push(concern);
                }
            } else if watching.swap(false, Ordering::SeqCst) {
                // Whatever is announced from now on is not heard: one gap, for good.
                history.announcements_stopped();
            }
            wakes.send_modify(|n| *n = n.wrapping_add(1));
        })?;
        watcher.watch(&path, RecursiveMode::NonRecursive)?;
        Ok(watcher)
    }
}

/// `<store>-wake` opened to append, created if missing: private whatever the umask, like the
/// store file beside it.
fn open_wake_file(path: &Path) -> std::io::Result<std::fs::File> {
    let mut open = std::fs::OpenOptions::new();
    std::os::unix::fs::OpenOptionsExt::mode(&mut open, 0o600);
    open.create(true).append(true).open(path)
}

/// Shared by a handle's clones.
pub(super) type SharedWakes = Arc<FileWakes>;

/// Reads the lines appended to `<store>-wake` since the last read, through one open file.
struct WakeLines {
    path: PathBuf,
    /// Kept open: an open is an event for every watch on the file.
    file: Option<std::fs::File>,
    offset: u64,
    /// The start of a line not yet whole.
    partial: Vec<u8>,
}

impl WakeLines {
    fn from_end_of(path: PathBuf) -> Self {
        let offset = std::fs::metadata(&path).map_or(0, |meta| meta.len());
        Self { path, file: None, offset, partial: Vec::new() }
    }

    /// Whether the file read is no longer `<store>-wake`: unlinked (its link count, read
    /// through the open file, as a replacement at the same path does not fool it).
    fn unlinked(&self) -> bool {
        use std::os::unix::fs::MetadataExt;
        match &self.file {
            Some(file) => file.metadata().map_or(true, |meta| meta.nlink() == 0),
            None => !self.path.exists(),
        }
    }

    /// Whom the commits announced since the last read concern. Whatever cannot be read
    /// whole concerns everyone: the file emptied since (its lines lost), a read that fails,
    /// an older release's announcement (a `.` and no line).
    fn read_new(&mut self) -> Vec<ChangeConcern> {
        let mut concerns = Vec::new();
        let mut appended = Vec::new();
        let file = match self.file.take() {
            Some(file) => Ok(file),
            None => std::fs::File::open(&self.path),
        };
        let read = file.and_then(|mut file| {
            if file.metadata()?.len() < self.offset {
                concerns.push(ChangeConcern::Everyone);
                self.offset = 0;
                self.partial.clear();
            }
            file.seek(std::io::SeekFrom::Start(self.offset))?;
            let length = file.read_to_end(&mut appended)?;
            self.file = Some(file);
            Ok(length)
        });
        match read {
            Ok(length) => self.offset += length as u64,
            Err(_) => return vec![ChangeConcern::Everyone],
        }
        self.partial.extend_from_slice(&appended);
        // Whole lines, and an older release's dots between them: a `.` where a line would
        // start (no line starts with one), not one inside a line (a liveness record's host).
        let mut read_to = 0;
        while let Some(&first) = self.partial.get(read_to) {
            if first == b'.' {
                concerns.push(ChangeConcern::Everyone);
                read_to += 1;
                continue;
            }
            let Some(length) = self.partial[read_to..].iter().position(|byte| *byte == b'\n') else { break };
            let line = &self.partial[read_to..read_to + length];
            if !line.is_empty() {
                concerns.push(std::str::from_utf8(line).map_or(ChangeConcern::Everyone, ChangeConcern::from_payload));
            }
            read_to += length + 1;
        }
        self.partial.drain(..read_to);
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
/// while one of this release merges the two as one commit's concern (`ChangeConcern::merge`);
/// then a line for each run handed on (`hand_on::hand_on_in` collects `h:` lines), after the
/// commit's concern, as PostgreSQL notifies them.
pub(super) fn take_concerns(conn: &Connection) -> Vec<ChangeConcern> {
    let collected = conn.prepare_cached("SELECT DISTINCT concern FROM wake_concerns").and_then(|mut statement| {
        statement.query_map([], |row| row.get::<_, String>(0))?.collect::<rusqlite::Result<Vec<String>>>()
    });
    let emptied = conn.execute_prepared("DELETE FROM wake_concerns", []);
    let (Ok(collected), Ok(_)) = (collected, emptied) else { return vec![ChangeConcern::Everyone] };
    let (handed, concerns): (Vec<ChangeConcern>, Vec<ChangeConcern>) = collected
        .iter()
        .map(|one| ChangeConcern::from_payload(one))
        .partition(|concern| matches!(concern, ChangeConcern::Handed { .. }));
    let merged = concerns.iter().cloned().fold(ChangeConcern::nobody(), |mut concern, one| {
        concern.merge(one);
        concern
    });
    let registered = concerns.contains(&ChangeConcern::Created);
    let mut lines = match merged {
        ChangeConcern::Types(types) if registered && !types.is_empty() => {
            vec![ChangeConcern::Created, ChangeConcern::Types(types)]
        }
        merged => vec![merged],
    };
    lines.extend(handed);
    lines
}

/// Collects, inside the transaction that hands a run on, the line announcing it to its taker
/// (`ChangeConcern::Handed`): rolled back with the transaction, announced after its commit.
pub(super) fn announce_hand_on(tx: &Connection, component: &ComponentName, liveness: &str) -> rusqlite::Result<()> {
    let handed = ChangeConcern::Handed { component: component.clone(), liveness: liveness.to_owned() };
    tx.execute_prepared("INSERT INTO temp.wake_concerns VALUES (?1)", [handed.to_payload()]).map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    fn until(what: &str, mut done: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while !done() {
            assert!(Instant::now() < deadline, "{what} within 5 s");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// SQLite's own writes beside the store (its WAL frames), another file in the directory
    /// and a reader opening `<store>-wake` wake nobody; each announcement wakes once.
    #[tokio::test]
    async fn only_an_announced_commit_wakes_the_watch() {
        let dir = tempfile::tempdir().unwrap();
        let wakes = FileWakes::new(&dir.path().join("store.db"));
        let mut waiter = wakes.wakes();
        assert!(waiter.watching());
        std::fs::write(dir.path().join("store.db-wal"), b"frames").unwrap();
        std::fs::write(dir.path().join("index.db"), b"elsewhere").unwrap();
        drop(std::fs::File::open(wakes.wake_file()).unwrap());
        wakes.announce(&[ChangeConcern::Created]);
        // The reader notes the line in the history, then wakes: wait for both.
        until("the announcement read", || wakes.history.mark() == 1 && *waiter.receiver.borrow() >= 1);
        assert_eq!(*waiter.receiver.borrow(), 1, "one wake-up: the announcement's");
        wakes.announce(&[ChangeConcern::Everyone]);
        until("the second announcement read", || wakes.history.mark() == 2 && *waiter.receiver.borrow() >= 2);
        assert_eq!(*waiter.receiver.borrow(), 2);
    }

    /// A hand-on to a taker on a dotted host name reads back whole, and an older release's
    /// dots between lines still wake everyone.
    #[test]
    fn a_dot_inside_a_line_is_part_of_it_and_one_between_lines_is_an_older_release() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.db-wake");
        std::fs::write(&path, "").unwrap();
        let mut lines = WakeLines::from_end_of(path.clone());
        let handed = ChangeConcern::Handed {
            component: ComponentName::new("checker").unwrap(),
            liveness: "local:scan01.archive.example.org:4242:n0nce".into(),
        };
        let written = format!("{}\n.t:A_Done\n.", handed.to_payload());
        std::fs::write(&path, written).unwrap();
        let read = lines.read_new();
        let done = ChangeConcern::Types([autocomp_model::EventType::new("A_Done").unwrap()].into());
        assert_eq!(read, [handed, ChangeConcern::Everyone, done, ChangeConcern::Everyone]);
    }

    /// The wake file removed under the watch (an operator's mistake: the restore removes it
    /// with the components stopped): its waiters wake, and poll from then on.
    #[tokio::test]
    async fn a_removed_wake_file_leaves_the_waiters_polling() {
        let dir = tempfile::tempdir().unwrap();
        let wakes = FileWakes::new(&dir.path().join("store.db"));
        let mut waiter = wakes.wakes();
        assert!(waiter.watching() && wakes.mark().is_some());
        // Announced and read first: the reader and the announcer hold the file open.
        wakes.announce(&[ChangeConcern::Created]);
        until("the announcement read", || wakes.history.mark() == 1);
        std::fs::remove_file(wakes.wake_file()).unwrap();
        until("the waiter told", || !waiter.watching());
        assert!(wakes.mark().is_none(), "no head read is vouched for by announcements any more");
        assert_eq!(wakes.history.mark(), 2, "the gap is one entry concerning everyone");
        // Its announcer writes to the file that has the name now, where a process started
        // since watches, not to the one removed.
        wakes.announce(&[ChangeConcern::Everyone]);
        assert_eq!(std::fs::read_to_string(wakes.wake_file()).unwrap(), "*\n");
    }
}
