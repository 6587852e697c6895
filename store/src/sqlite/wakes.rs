//! Pushed wake-ups for an embedded store: a file watch (inotify on Linux) on the store file's
//! directory, so a commit by any process on the host wakes the waiters in `wait_for_change`
//! at once instead of at their next poll. A commit writes its WAL frames before it becomes
//! visible (the WAL index is shared memory, which no notification reports), so after each
//! write it commits a handle also appends a byte to `<store>-wake`: the notification waiters
//! can trust to come after the change is there to read.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use notify::{EventKind, RecommendedWatcher, RecursiveMode, Watcher};
use tokio::sync::watch;

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
}

/// `<store>-wake` is emptied once it has grown this long.
const WAKE_FILE_MAX: u64 = 4096;

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

    /// After a commit: one byte appended to `<store>-wake` (no sync: only the notification
    /// matters), so every waiter on the host wakes now that the change can be read.
    pub(super) fn announce(&self) {
        use std::io::Write;
        let mut announcer = self.announcer.lock().unwrap_or_else(|p| p.into_inner());
        let file = announcer.get_or_insert_with(|| {
            let mut path = self.path.clone().into_os_string();
            path.push("-wake");
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
            let written = file.write_all(b".");
            if written.is_err() || file.metadata().is_ok_and(|meta| meta.len() > WAKE_FILE_MAX) {
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
        let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
            let Ok(event) = event else { return };
            if !matches!(event.kind, EventKind::Modify(_) | EventKind::Create(_) | EventKind::Any) {
                return;
            }
            let ours = event.paths.iter().any(|path| {
                path.file_name().is_some_and(|file| file.as_encoded_bytes().starts_with(name.as_encoded_bytes()))
            });
            if ours {
                wakes.send_modify(|n| *n = n.wrapping_add(1));
            }
        })?;
        watcher.watch(&directory, RecursiveMode::NonRecursive)?;
        Ok(watcher)
    }
}

/// Shared by a handle's clones.
pub(super) type SharedWakes = Arc<FileWakes>;
