//! Local locks: `flock` on `<dir>/<lock path>.lock`. The OS releases a dead process's locks,
//! so nothing is ever stuck. Lock files are removed on release; because a waiter may have
//! opened the file just before it was removed, every acquisition re-checks that the path
//! still names the inode it locked, and retries otherwise.
//!
//! Liveness: the first `liveness()` makes `<dir>/live/<pid>.<nonce>` and flocks it for the
//! life of the service; its record is `local:<host>:<pid>:<nonce>`. Another service on this
//! host judges it by a try of the same flock: busy is alive; taken (the process is gone, the
//! OS freed its flock) or the file absent is dead, and the judge removes the file; the file
//! decides whatever host the record names (a renamed host's runs are not kept forever). A
//! service whose own file is removed or replaced counts as dead: its session is `Lost`.
//! `held` never lists `live`.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use autocomp_model::InvalidInput;
use tokio::sync::watch;
use tracing::{error, warn};

use super::{HeldLock, Liveness, Lock, LockError, LockHolder, LockPath, LockService, SessionState};

const RETRY_INTERVAL: Duration = Duration::from_millis(20);

/// The directory of the liveness files, under the lock directory; never a lock's.
const LIVE: &str = "live";
/// The prefix of a local liveness record.
const SCHEME: &str = "local:";

/// The flock lock service of `local:<dir>` URLs: one host, any number of processes.
pub struct LocalLocks {
    dir: PathBuf,
    // The local "session" never changes: the lock files live as long as this process.
    session: watch::Sender<SessionState>,
    /// This host's name, as liveness records say it.
    host: String,
    /// This service's liveness file, made and flocked by the first `liveness()`.
    live: Mutex<Option<LiveFile>>,
}

/// A liveness file, flocked while this service lives; removed when it is dropped.
struct LiveFile {
    record: String,
    path: PathBuf,
    file: File,
}

impl Drop for LiveFile {
    fn drop(&mut self) {
        // Removed while still locked (a judge that opened it meanwhile sees it gone), then
        // unlocked as the descriptor closes.
        if names_same_file(&self.path, &self.file) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

impl LocalLocks {
    /// Locks under `dir` (created on the first lock; a missing one lists nothing held).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            session: watch::Sender::new(SessionState::Connected),
            host: crate::hostname(),
            live: Mutex::new(None),
        }
    }

    /// Makes and flocks this service's liveness file: its record.
    fn make_live_file(&self) -> std::io::Result<LiveFile> {
        let dir = self.dir.join(LIVE);
        std::fs::create_dir_all(&dir)?;
        let (pid, nonce) = (std::process::id(), random_nonce());
        let path = dir.join(format!("{pid}.{nonce}"));
        let file = OpenOptions::new().read(true).write(true).create_new(true).open(&path)?;
        if let Err(e) = file.try_lock() {
            let _ = std::fs::remove_file(&path);
            return Err(match e {
                TryLockError::Error(e) => e,
                TryLockError::WouldBlock => std::io::Error::other("a file this very process just made is locked"),
            });
        }
        Ok(LiveFile { record: format!("{SCHEME}{}:{pid}:{nonce}", self.host), path, file })
    }

    /// A try of the flock of the liveness file named `pid` and `nonce`: busy is alive; taken
    /// or absent is dead (the file is removed then: its process is gone).
    fn judge_live_file(&self, pid: u32, nonce: &str) -> Result<Liveness, LockError> {
        let path = self.dir.join(LIVE).join(format!("{pid}.{nonce}"));
        let unavailable =
            |what: &str, e: std::io::Error| LockError::Unavailable(format!("{what} {}: {e}", path.display()));
        let file = match File::open(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Liveness::Dead),
            Err(e) => return Err(unavailable("cannot open", e)),
        };
        match file.try_lock() {
            Ok(()) => {
                if names_same_file(&path, &file) {
                    let _ = std::fs::remove_file(&path);
                }
                Ok(Liveness::Dead)
            }
            Err(TryLockError::WouldBlock) => Ok(Liveness::Alive),
            Err(TryLockError::Error(e)) => Err(unavailable("cannot try the lock of", e)),
        }
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

/// 16 hex digits, different in every call (std's hasher keys are random per instance).
fn random_nonce() -> String {
    use std::hash::BuildHasher;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    format!("{:016x}", std::collections::hash_map::RandomState::new().hash_one(now.as_nanos()))
}

/// The host, pid and nonce a `local:` record names, exactly as `make_live_file` writes them;
/// `None` for anything else (another service's record, or a malformed one).
fn parse_record(record: &str) -> Option<(&str, u32, &str)> {
    let rest = record.strip_prefix(SCHEME)?;
    let (rest, nonce) = rest.rsplit_once(':')?;
    let (host, pid) = rest.rsplit_once(':')?;
    let pid_number: u32 = pid.parse().ok()?;
    let well_formed = !host.is_empty()
        && pid_number.to_string() == pid
        && nonce.len() == 16
        && nonce.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    well_formed.then_some((host, pid_number, nonce))
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
                if path == self.dir.join(LIVE) {
                    continue; // liveness files, not locks
                }
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

    fn keeps_liveness(&self) -> bool {
        true
    }

    /// `local:<host>:<pid>:<nonce>`, its file made and flocked at the first call; `None` (with
    /// a warning) while it cannot be made, and for good once the file no longer names ours
    /// (removed or replaced behind our back: others judge us dead from then on, so the
    /// session is `Lost` and the process records nothing more).
    fn liveness(&self) -> Option<String> {
        let mut live = self.live.lock().expect("never poisoned");
        if *self.session.borrow() == SessionState::Lost {
            return None;
        }
        match live.as_ref() {
            Some(file) if names_same_file(&file.path, &file.file) => return Some(file.record.clone()),
            Some(file) => {
                error!("the liveness file {} is gone or replaced: this process counts as dead", file.path.display());
                self.session.send_replace(SessionState::Lost);
                return None;
            }
            None => {}
        }
        match self.make_live_file() {
            Ok(file) => {
                let record = file.record.clone();
                *live = Some(file);
                Some(record)
            }
            Err(e) => {
                warn!("cannot make a liveness file under {}: {e}", self.dir.join(LIVE).display());
                None
            }
        }
    }

    async fn judge_liveness(&self, record: &str) -> Result<Liveness, LockError> {
        // The host a record names is not asked: the file in this lock directory decides, so a
        // host renamed (or a container made anew) since does not keep its runs forever.
        let Some((_host, pid, nonce)) = parse_record(record) else { return Ok(Liveness::Unproven) };
        if self.live.lock().expect("never poisoned").as_ref().is_some_and(|file| file.record == record) {
            return Ok(Liveness::Alive);
        }
        self.judge_live_file(pid, nonce)
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
    async fn a_liveness_file_is_alive_while_its_service_lives_and_dead_once_its_flock_is_free() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (LocalLocks::new(dir.path()), LocalLocks::new(dir.path()));
        let record = a.liveness().expect("a liveness file");
        let prefix = format!("local:{}:{}:", crate::hostname(), std::process::id());
        assert!(record.starts_with(&prefix), "{record}");
        assert_eq!(a.liveness().as_ref(), Some(&record), "one file per service");
        assert_ne!(b.liveness().as_ref(), Some(&record), "each service its own");
        assert_eq!(a.judge_liveness(&record).await.unwrap(), Liveness::Alive, "its own");
        assert_eq!(b.judge_liveness(&record).await.unwrap(), Liveness::Alive, "another's, flocked");
        assert!(a.held().await.unwrap().is_empty(), "a liveness file listed as a lock");

        // Gone with its service: the file is removed, and its record dead.
        drop(a);
        assert_eq!(b.judge_liveness(&record).await.unwrap(), Liveness::Dead);

        // Left behind unlocked (its process killed): dead, and the judge removes it.
        let (_, nonce) = record.rsplit_once(':').unwrap();
        let left = dir.path().join(LIVE).join(format!("1.{nonce}"));
        std::fs::write(&left, "").unwrap();
        let killed = format!("local:{}:1:{nonce}", crate::hostname());
        assert_eq!(b.judge_liveness(&killed).await.unwrap(), Liveness::Dead);
        assert!(!left.exists(), "the judge left a dead process's file");
    }

    #[test]
    fn a_record_names_host_pid_and_nonce_exactly_and_nothing_else_is_ours() {
        let nonce = "0123456789abcdef";
        assert_eq!(parse_record(&format!("local:h:42:{nonce}")), Some(("h", 42, nonce)));
        assert_eq!(parse_record(&format!("local:a:b:42:{nonce}")), Some(("a:b", 42, nonce)), "a host with a colon");
        for foreign in [
            "",
            "local:",
            "local:h:42",
            "local::42:0123456789abcdef",
            "local:h:042:0123456789abcdef",
            "local:h:-1:0123456789abcdef",
            "local:h:42:0123456789ABCDEF",
            "local:h:42:0123456789abcde",
            "zk:72ab",
            "pg:1-2-0123456789abcdef",
        ] {
            assert_eq!(parse_record(foreign), None, "{foreign}");
        }
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
