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
use autocomp_model::InvalidInput;
use tokio::sync::watch;

use super::{HeldLock, Lock, LockError, LockHolder, LockPath, LockService, SessionState};

const RETRY_INTERVAL: Duration = Duration::from_millis(20);

/// The flock lock service of `local:<dir>` URLs: one host, any number of processes.
pub struct LocalLocks {
    dir: PathBuf,
    // The local "session" never changes: the lock files live as long as this process.
    session: watch::Sender<SessionState>,
}

impl LocalLocks {
    /// Locks under `dir` (created on the first lock; a missing one lists nothing held).
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
            // A locks directory that cannot be made (its permissions, a file in the way, a
            // read-only mount) is the configuration's fault: exit 2, not "lock service lost".
            std::fs::create_dir_all(parent).map_err(|e| {
                use std::io::ErrorKind::{NotADirectory, PermissionDenied, ReadOnlyFilesystem};
                let message = format!("cannot create the lock directory for {}: {e}", file_path.display());
                match e.kind() {
                    PermissionDenied | NotADirectory | ReadOnlyFilesystem => LockError::Invalid(InvalidInput::new(
                        "locks directory",
                        self.dir.display().to_string(),
                        message,
                    )),
                    _ => LockError::Unavailable(message),
                }
            })?;
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
            file.set_len(0)
                .and_then(|()| file.write_all(holder.record().as_bytes()))
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
                let mut record = Vec::new();
                let holder = file.read_to_end(&mut record).ok().and_then(|_| LockHolder::from_record(&record).ok());
                held.push(HeldLock { path: relative.to_owned(), holder, foreign: None });
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
        // file sees it no longer named and retries on a fresh one. Only our own file: if
        // ours was removed behind our back, the path may name the next holder's now.
        let removed = match (std::fs::metadata(&self.file_path), self.file.metadata()) {
            (Ok(on_disk), Ok(ours)) if on_disk.ino() == ours.ino() && on_disk.dev() == ours.dev() => {
                std::fs::remove_file(&self.file_path)
            }
            (Ok(_), Ok(_)) => Ok(()),
            (Err(e), _) | (_, Err(e)) => Err(e),
        };
        drop(self.file);
        match removed {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(LockError::Unavailable(format!("cannot remove {}: {e}", self.file_path.display()))),
        }
    }
}

/// What flock locks do that ZooKeeper's do not; the promises both keep are tested by the
/// contract suite (tests/tests/lock_contract.rs).
/// `inspect_locks` for `local:<dir>`: the directory is one this user can make lock files
/// in (a missing one is made at the first lock, so its nearest existing parent must be).
/// The probe file it makes is removed at once.
pub(super) fn inspect(dir: &Path) -> Result<super::LockInspection, LockError> {
    let mut problems = Vec::new();
    let description = if dir.as_os_str().is_empty() {
        return Err(InvalidInput::new("locks url", "local:", "names no directory; write local:/path/to/locks").into());
    } else if dir.is_dir() {
        let probe = dir.join(format!(".doctor-{}.lock", std::process::id()));
        match OpenOptions::new().write(true).create_new(true).open(&probe) {
            Ok(_) => {
                let _ = std::fs::remove_file(&probe);
            }
            Err(e) => problems.push(format!("cannot make a lock file in {}: {e}", dir.display())),
        }
        format!("flock lock directory {}", dir.display())
    } else if dir.exists() {
        problems.push(format!("{} is not a directory", dir.display()));
        format!("flock lock directory {}", dir.display())
    } else {
        format!("flock lock directory {} (not made yet: the first lock makes it)", dir.display())
    };
    Ok(super::LockInspection { description, problems })
}

#[cfg(test)]
mod tests {
    use autocomp_model::{BatchId, ComponentName, Timestamp};

    use super::*;

    fn holder() -> LockHolder {
        LockHolder { agent: "local-test".into(), host: "testhost".into(), pid: 1, since: Timestamp::now() }
    }

    fn batch_path() -> LockPath {
        LockPath::Batch(ComponentName::new("probe").unwrap(), BatchId::new("B1").unwrap())
    }

    #[tokio::test]
    async fn a_locks_directory_that_cannot_be_one_is_a_configuration_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("not-a-directory");
        std::fs::write(&file, "").unwrap();
        let locks = LocalLocks::new(&file);
        match locks.try_lock(&batch_path(), &holder(), Duration::ZERO).await {
            Err(LockError::Invalid(invalid)) => {
                assert_eq!(
                    (invalid.field.as_str(), invalid.value.as_str()),
                    ("locks directory", file.to_str().unwrap())
                );
            }
            other => panic!("not a configuration error: {:?}", other.map(|lock| lock.is_some())),
        }
    }

    #[tokio::test]
    async fn there_is_no_session_close_keeps_every_lock_and_the_process_frees_them() {
        let dir = tempfile::tempdir().unwrap();
        let locks = LocalLocks::new(dir.path());
        assert_eq!(*locks.session().borrow(), SessionState::Connected);
        assert_eq!(locks.lost_session_grace(), None, "flock locks never expire behind our back");

        let lock = locks.try_lock(&batch_path(), &holder(), Duration::ZERO).await.unwrap().expect("free");
        locks.close().await;
        assert!(lock.still_held().await.unwrap(), "close released a flock lock");
        assert_eq!(locks.held().await.unwrap().len(), 1);
        assert_eq!(*locks.session().borrow(), SessionState::Connected);
        // Still usable after close: the process exit is what ends its locks.
        let other = LockPath::Poll(ComponentName::new("probe").unwrap());
        assert!(locks.try_lock(&other, &holder(), Duration::ZERO).await.unwrap().is_some());
        lock.release().await.unwrap();
    }

    #[tokio::test]
    async fn a_lock_dropped_without_release_is_free_at_once_and_its_file_lists_as_not_held() {
        let dir = tempfile::tempdir().unwrap();
        let locks = LocalLocks::new(dir.path());
        let lock = locks.try_lock(&batch_path(), &holder(), Duration::ZERO).await.unwrap().expect("free");
        drop(lock);
        // The file stays (nobody removed it), unlocked: held by nobody.
        assert!(dir.path().join("batch/probe/B1.lock").exists());
        assert!(locks.held().await.unwrap().is_empty());
        let again = locks.try_lock(&batch_path(), &holder(), Duration::ZERO).await.unwrap();
        again.expect("a dropped lock is free").release().await.unwrap();
        assert!(!dir.path().join("batch/probe/B1.lock").exists(), "release removes the lock file");
    }

    #[tokio::test]
    async fn a_lock_file_removed_behind_the_holders_back_is_no_longer_held() {
        let dir = tempfile::tempdir().unwrap();
        let locks = LocalLocks::new(dir.path());
        let lock = locks.try_lock(&batch_path(), &holder(), Duration::ZERO).await.unwrap().expect("free");
        std::fs::remove_file(dir.path().join("batch/probe/B1.lock")).unwrap();
        assert!(!lock.still_held().await.unwrap());
        // The path names a fresh file now, free for the next taker.
        let next = locks.try_lock(&batch_path(), &holder(), Duration::ZERO).await.unwrap();
        let next = next.expect("the removed file still locks the path");
        // The first holder's release leaves the next holder's file alone: a third taker
        // is still refused.
        lock.release().await.unwrap();
        assert!(next.still_held().await.unwrap(), "releasing a lost lock removed the next holder's file");
        let third = locks.try_lock(&batch_path(), &holder(), Duration::ZERO).await.unwrap();
        assert!(third.is_none(), "a third taker got a held path");
        next.release().await.unwrap();
    }
}
