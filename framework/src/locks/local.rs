//! Local locks: `flock` on `<dir>/<lock path>.lock`. The OS releases a dead process's locks,
//! so nothing is ever stuck. Lock files are removed on release; because a waiter may have
//! opened the file just before it was removed, every acquisition re-checks that the path
//! still names the inode it locked, and retries otherwise.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio::sync::watch;

use super::{HeldLock, Lock, LockError, LockHolder, LockPath, LockService, SessionState};

const RETRY_INTERVAL: Duration = Duration::from_millis(20);

pub struct LocalLocks {
    dir: PathBuf,
    // The local "session" never changes: the lock files live as long as this process.
    session: watch::Sender<SessionState>,
}

impl LocalLocks {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into(), session: watch::Sender::new(SessionState::Connected) }
    }

    fn file_of(&self, path: &LockPath) -> PathBuf {
        self.dir.join(format!("{}.lock", path.relative()))
    }

    fn try_once(&self, path: &LockPath, holder: &LockHolder) -> Result<Option<LocalLock>, LockError> {
        let file_path = self.file_of(path);
        let unavailable =
            |what: &str, e: std::io::Error| LockError::Unavailable(format!("{what} {}: {e}", file_path.display()));
        if let Some(parent) = file_path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| unavailable("cannot create the lock directory for", e))?;
        }
        loop {
            let mut file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&file_path)
                .map_err(|e| unavailable("cannot open", e))?;
            match file.try_lock() {
                Ok(()) => {}
                Err(TryLockError::WouldBlock) => return Ok(None),
                Err(TryLockError::Error(e)) => return Err(unavailable("cannot lock", e)),
            }
            if !names_same_file(&file_path, &file) {
                continue; // its previous holder removed it while we were opening it
            }
            let record = serde_json::to_vec(holder).expect("holders serialize");
            file.set_len(0)
                .and_then(|()| file.write_all(&record))
                .map_err(|e| unavailable("cannot write the holder into", e))?;
            return Ok(Some(LocalLock { path: path.clone(), file_path, file }));
        }
    }
}

fn names_same_file(path: &Path, file: &File) -> bool {
    match (std::fs::metadata(path), file.metadata()) {
        (Ok(on_disk), Ok(ours)) => on_disk.ino() == ours.ino() && on_disk.dev() == ours.dev(),
        _ => false,
    }
}

#[async_trait]
impl LockService for LocalLocks {
    async fn try_lock(
        &self,
        path: &LockPath,
        holder: &LockHolder,
        wait: Duration,
    ) -> Result<Option<Box<dyn Lock>>, LockError> {
        let deadline = Instant::now() + wait;
        loop {
            if let Some(lock) = self.try_once(path, holder)? {
                return Ok(Some(Box::new(lock)));
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            tokio::time::sleep(RETRY_INTERVAL.min(deadline - now)).await;
        }
    }

    async fn held(&self) -> Result<Vec<HeldLock>, LockError> {
        let mut held = Vec::new();
        let mut pending = vec![self.dir.clone()];
        while let Some(dir) = pending.pop() {
            let entries = match std::fs::read_dir(&dir) {
                Ok(entries) => entries,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(LockError::Unavailable(format!("cannot list {}: {e}", dir.display()))),
            };
            for entry in entries.flatten() {
                let path = entry.path();
                if path.is_dir() {
                    pending.push(path);
                    continue;
                }
                let Some(relative) = path.strip_prefix(&self.dir).ok().and_then(|p| p.to_str()) else { continue };
                let Some(relative) = relative.strip_suffix(".lock") else { continue };
                let Ok(mut file) = File::open(&path) else { continue };
                // A lock we can take is held by nobody.
                if file.try_lock_shared().is_ok() {
                    continue;
                }
                let mut text = String::new();
                let holder = file.read_to_string(&mut text).ok().and_then(|_| serde_json::from_str(&text).ok());
                held.push(HeldLock { path: relative.to_owned(), holder });
            }
        }
        held.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(held)
    }

    fn session(&self) -> watch::Receiver<SessionState> {
        self.session.subscribe()
    }
}

struct LocalLock {
    path: LockPath,
    file_path: PathBuf,
    file: File,
}

#[async_trait]
impl Lock for LocalLock {
    fn path(&self) -> &LockPath {
        &self.path
    }

    async fn still_held(&self) -> Result<bool, LockError> {
        Ok(names_same_file(&self.file_path, &self.file))
    }

    async fn release(self: Box<Self>) -> Result<(), LockError> {
        // Remove while still locked, then unlock by closing: a waiter that opened the old
        // file sees it no longer named and retries on a fresh one.
        let removed = std::fs::remove_file(&self.file_path);
        drop(self.file);
        match removed {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(LockError::Unavailable(format!("cannot remove {}: {e}", self.file_path.display()))),
        }
    }
}
