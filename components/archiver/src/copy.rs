//! The archiver's file work: a temp dir inside the archive root that removes itself unless
//! published, a streaming copy that hashes the source while copying and re-hashes the copy
//! from disk, and the atomic publish (rename, or exchange when replacing).

use std::cell::Cell;
use std::ffi::CString;
use std::fs::{File, FileTimes, Metadata, OpenOptions, Permissions};
use std::io::{self, Read, Seek, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use archiver::FileDigest;
use autocomp_framework::WorkError;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// Temp dirs are `.archiving.<batch id>.<pid>`: a leading dot can never start a batch id, so
/// a temp name is never mistaken for an archived batch.
const TEMP_PREFIX: &str = ".archiving.";
const CHUNK: usize = 1 << 20;
/// Checkpoints are store writes: often enough to show progress, rarely enough to be free.
const CHECKPOINT_EVERY: Duration = Duration::from_secs(2);

pub enum CopyError {
    Cancelled,
    Work(WorkError),
    Io { path: PathBuf, error: io::Error },
}

fn at(path: &Path) -> impl FnOnce(io::Error) -> CopyError + '_ {
    move |error| CopyError::Io { path: path.to_path_buf(), error }
}

/// Something wrong with one file of the copy: reported, and the batch is not published.
pub struct Problem {
    pub reference: String,
    pub kind: &'static str,
    pub description: String,
    pub details: Value,
}

pub struct Progress {
    temp: PathBuf,
    pub files: u64,
    pub bytes: u64,
    pub problems: Vec<Problem>,
    /// Each regular file copied and verified, with its copy's sha256: the copy's fixity.
    pub digests: Vec<FileDigest>,
    last_checkpoint: Cell<Instant>,
    buffer: Vec<u8>,
}

impl Progress {
    pub fn new(temp: &Path) -> Self {
        Self {
            temp: temp.to_path_buf(),
            files: 0,
            bytes: 0,
            problems: Vec::new(),
            digests: Vec::new(),
            last_checkpoint: Cell::new(Instant::now()),
            buffer: vec![0; CHUNK],
        }
    }

    /// What a later attempt needs to know: where this one's partial copy is.
    pub fn checkpoint(&self) -> Value {
        self.last_checkpoint.set(Instant::now());
        json!({ "temp": self.temp.display().to_string(), "files_copied": self.files, "bytes_copied": self.bytes })
    }

    pub fn checkpoint_due(&self) -> bool {
        self.last_checkpoint.get().elapsed() >= CHECKPOINT_EVERY
    }
}

/// Called between files and between chunks of a file: cancellation and checkpoints.
pub type Between<'a> = dyn FnMut(&Progress) -> Result<(), CopyError> + 'a;

/// Copies the tree under `source` into the (existing, empty) `dest`, mirroring modes and
/// modification times, each file and directory synced to disk.
pub fn copy_tree(source: &Path, dest: &Path, progress: &mut Progress, between: &mut Between) -> Result<(), CopyError> {
    let meta = std::fs::metadata(source).map_err(at(source))?;
    copy_dir(source, dest, Path::new(""), progress, between)?;
    finish_dir(dest, &meta)
}

fn copy_dir(
    source: &Path,
    dest: &Path,
    relative: &Path,
    progress: &mut Progress,
    between: &mut Between,
) -> Result<(), CopyError> {
    let mut entries =
        std::fs::read_dir(source).and_then(|entries| entries.collect::<Result<Vec<_>, _>>()).map_err(at(source))?;
    entries.sort_by_key(|entry| entry.file_name());
    for entry in entries {
        between(progress)?;
        let (from, to, relative) = (entry.path(), dest.join(entry.file_name()), relative.join(entry.file_name()));
        let meta = from.symlink_metadata().map_err(at(&from))?;
        let kind = meta.file_type();
        if kind.is_dir() {
            std::fs::create_dir(&to).map_err(at(&to))?;
            copy_dir(&from, &to, &relative, progress, between)?;
            finish_dir(&to, &meta)?;
        } else if kind.is_file() {
            copy_file(&from, &to, &relative, &meta, progress, between)?;
        } else if kind.is_symlink() {
            // Kept as a link: the structure checker decides whether links are acceptable.
            let target = std::fs::read_link(&from).map_err(at(&from))?;
            std::os::unix::fs::symlink(&target, &to).map_err(at(&to))?;
            progress.files += 1;
        } else {
            progress.problems.push(Problem {
                reference: relative.display().to_string(),
                kind: "unsupported_file_type",
                description: "not a regular file, directory or symlink (a pipe, socket or device?)".into(),
                details: Value::Null,
            });
        }
    }
    Ok(())
}

fn copy_file(
    from: &Path,
    to: &Path,
    relative: &Path,
    meta: &Metadata,
    progress: &mut Progress,
    between: &mut Between,
) -> Result<(), CopyError> {
    let mut input = File::open(from).map_err(at(from))?;
    // Read-write: the verification re-reads through this descriptor, which keeps working
    // even when the mirrored mode forbids opening the file again.
    let mut output = OpenOptions::new().read(true).write(true).create_new(true).mode(0o600).open(to).map_err(at(to))?;
    let mut hasher = Sha256::new();
    let mut buffer = std::mem::take(&mut progress.buffer);
    let mut copied = 0u64;
    let result = loop {
        let n = match input.read(&mut buffer) {
            Ok(0) => break Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => break Err(CopyError::Io { path: from.to_path_buf(), error: e }),
        };
        hasher.update(&buffer[..n]);
        if let Err(e) = output.write_all(&buffer[..n]) {
            break Err(CopyError::Io { path: to.to_path_buf(), error: e });
        }
        copied += n as u64;
        progress.bytes += n as u64;
        // Multi-GB files: cancellation must not wait for the whole file.
        if let Err(e) = between(progress) {
            break Err(e);
        }
    };
    progress.buffer = buffer;
    result?;
    let source_sha256 = hex::encode(hasher.finalize());

    let times = FileTimes::new().set_modified(meta.modified().map_err(at(from))?);
    let copy_sha256 = seal(&mut output, meta.permissions(), times, &mut progress.buffer).map_err(at(to))?;
    let reference = relative.display().to_string();
    match checked(reference, meta.len(), copied, (source_sha256, copy_sha256)) {
        Ok(digest) => progress.digests.push(digest),
        Err(problem) => progress.problems.push(problem),
    }
    progress.files += 1;
    Ok(())
}

/// Gives the copy the source's mode and modification time, syncs it, and hashes it again as
/// it reached the disk.
fn seal(output: &mut File, permissions: Permissions, times: FileTimes, buffer: &mut [u8]) -> io::Result<String> {
    output.set_permissions(permissions).and_then(|()| output.set_times(times)).and_then(|()| output.sync_all())?;
    // Drop the copy's pages from the cache so the re-hash reads what reached the disk.
    // SAFETY: posix_fadvise is advice on our own open descriptor.
    unsafe { libc::posix_fadvise(output.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    output.rewind()?;
    hash_reader(output, buffer)
}

/// A copied file's digest when it is whole and equal to its source (`sums`: the source's
/// sha256 then the copy's), else the problem with it.
fn checked(reference: String, expected: u64, copied: u64, sums: (String, String)) -> Result<FileDigest, Problem> {
    let (source_sha256, copy_sha256) = sums;
    if copied != expected {
        return Err(Problem {
            reference,
            kind: "source_changed",
            description: format!("the source changed while archiving: {expected} bytes expected, {copied} read"),
            details: Value::Null,
        });
    }
    if copy_sha256 != source_sha256 {
        return Err(Problem {
            reference,
            kind: "copy_mismatch",
            description: "the archived copy's sha256 differs from the source's".into(),
            details: json!({ "source_sha256": source_sha256, "copy_sha256": copy_sha256 }),
        });
    }
    Ok(FileDigest { path: reference, sha256: copy_sha256, bytes: copied })
}

fn hash_reader(reader: &mut impl Read, buffer: &mut [u8]) -> io::Result<String> {
    let mut hasher = Sha256::new();
    loop {
        match reader.read(buffer) {
            Ok(0) => return Ok(hex::encode(hasher.finalize())),
            Ok(n) => hasher.update(&buffer[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// After its entries exist: mirror the source directory's mode and mtime, then sync it so
/// its entries are durable before the publishing rename.
fn finish_dir(dir: &Path, meta: &Metadata) -> Result<(), CopyError> {
    let handle = File::open(dir).map_err(at(dir))?;
    let times = FileTimes::new().set_modified(meta.modified().map_err(at(dir))?);
    handle
        .set_times(times)
        .and_then(|()| handle.set_permissions(meta.permissions()))
        .and_then(|()| handle.sync_all())
        .map_err(at(dir))
}

/// A temp dir in the archive root, removed when dropped unless published.
pub struct TempDir {
    path: PathBuf,
    published: bool,
}

impl TempDir {
    pub fn create(root: &Path, batch_id: &str) -> io::Result<Self> {
        let path = root.join(format!("{TEMP_PREFIX}{batch_id}.{}", std::process::id()));
        if path.symlink_metadata().is_ok() {
            force_remove(&path)?;
        }
        std::fs::create_dir(&path)?;
        Ok(Self { path, published: false })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Renames the finished copy to `target` in one step, so the archive shows either no
    /// batch or the whole batch. With `replace`, an existing archive is swapped out
    /// atomically (RENAME_EXCHANGE) and then removed; without, an existing one is an
    /// `AlreadyExists` error (RENAME_NOREPLACE: a plain rename would replace an empty dir).
    pub fn publish(mut self, target: &Path, replace: bool) -> io::Result<()> {
        let exists = target.symlink_metadata().is_ok();
        if replace && exists {
            match rename2(&self.path, target, libc::RENAME_EXCHANGE) {
                Ok(()) => {}
                Err(e) if unsupported(&e) => {
                    // No atomic exchange on this file system: move the old one aside first.
                    // The archive briefly shows no batch, never a partial one.
                    let mut aside = self.path.clone().into_os_string();
                    aside.push(".old");
                    std::fs::rename(target, &aside)?;
                    std::fs::rename(&self.path, target)?;
                    std::fs::rename(&aside, &self.path)?;
                }
                Err(e) => return Err(e),
            }
            // `self.path` now holds the previous archive; dropping removes it.
            sync_parent(target)?;
            return Ok(());
        }
        match rename2(&self.path, target, libc::RENAME_NOREPLACE) {
            Ok(()) => {}
            Err(e) if unsupported(&e) => {
                if target.symlink_metadata().is_ok() {
                    return Err(io::Error::from(io::ErrorKind::AlreadyExists));
                }
                std::fs::rename(&self.path, target)?;
            }
            Err(e) => return Err(e),
        }
        self.published = true;
        sync_parent(target)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if !self.published
            && let Err(e) = force_remove(&self.path)
        {
            tracing::warn!("cannot remove the temp dir {}: {e}", self.path.display());
        }
    }
}

fn unsupported(error: &io::Error) -> bool {
    matches!(error.raw_os_error(), Some(libc::EINVAL | libc::ENOSYS | libc::EOPNOTSUPP))
}

fn rename2(from: &Path, to: &Path, flags: libc::c_uint) -> io::Result<()> {
    let c = |p: &Path| CString::new(p.as_os_str().as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput));
    let (from, to) = (c(from)?, c(to)?);
    // SAFETY: two valid NUL-terminated paths relative to the working directory.
    let rc = unsafe { libc::renameat2(libc::AT_FDCWD, from.as_ptr(), libc::AT_FDCWD, to.as_ptr(), flags) };
    if rc == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

/// Makes a rename durable: the directory holding the new name is synced.
fn sync_parent(path: &Path) -> io::Result<()> {
    match path.parent() {
        Some(parent) => File::open(parent)?.sync_all(),
        None => Ok(()),
    }
}

/// Removes temp dirs of this batch left by attempts that died (the batch lock guarantees no
/// live worker of this batch is copying now), including the one a checkpoint names.
pub fn remove_stale_temps(root: &Path, batch_id: &str, from_checkpoint: Option<&Path>) {
    let mut stale: Vec<PathBuf> = std::fs::read_dir(root)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|entry| is_temp_of(&entry.file_name().to_string_lossy(), batch_id))
        .map(|entry| entry.path())
        .collect();
    // A checkpoint is trusted only as far as it names one of our temp dirs.
    if let Some(previous) = from_checkpoint
        && previous.file_name().is_some_and(|name| is_temp_of(&name.to_string_lossy(), batch_id))
        && previous.symlink_metadata().is_ok()
        && !stale.iter().any(|s| s == previous)
    {
        stale.push(previous.to_path_buf());
    }
    for path in stale {
        match force_remove(&path) {
            Ok(()) => tracing::info!("removed {} left by an earlier attempt", path.display()),
            Err(e) => tracing::warn!("cannot remove {} left by an earlier attempt: {e}", path.display()),
        }
    }
}

/// `.archiving.<id>.<pid>` or `.archiving.<id>.<pid>.old`, for exactly this id (an id may
/// contain dots, so `B1`'s pattern must not match `B1.x`'s temp dirs).
pub fn is_temp_of(name: &str, batch_id: &str) -> bool {
    let Some(rest) = name.strip_prefix(TEMP_PREFIX).and_then(|r| r.strip_prefix(batch_id)) else {
        return false;
    };
    let Some(suffix) = rest.strip_prefix('.') else { return false };
    let pid = suffix.strip_suffix(".old").unwrap_or(suffix);
    !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit())
}

/// `remove_dir_all`, first making directories writable again where a mirrored read-only
/// mode would stop it (no obstacle for root, but archivers need not run as root).
fn force_remove(path: &Path) -> io::Result<()> {
    if std::fs::remove_dir_all(path).is_ok() || path.symlink_metadata().is_err() {
        return Ok(());
    }
    make_writable(path);
    std::fs::remove_dir_all(path)
}

fn make_writable(dir: &Path) {
    let Ok(meta) = dir.symlink_metadata() else { return };
    if !meta.is_dir() {
        return;
    }
    let mut permissions = meta.permissions();
    permissions.set_mode(permissions.mode() | 0o700);
    std::fs::set_permissions(dir, permissions).ok();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        make_writable(&entry.path());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temp_names_belong_to_exactly_one_batch() {
        assert!(is_temp_of(".archiving.B1.123", "B1"));
        assert!(is_temp_of(".archiving.B1.123.old", "B1"));
        assert!(!is_temp_of(".archiving.B1.x.123", "B1"));
        assert!(!is_temp_of(".archiving.B12.123", "B1"));
        assert!(!is_temp_of(".archiving.B1.", "B1"));
        assert!(!is_temp_of("B1", "B1"));
    }
}
