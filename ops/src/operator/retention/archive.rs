//! The export files `autocomp prune` writes and `autocomp import` reads: JSON Lines, one
//! batch's whole history (`BatchHistory`) per line, compressed with zstd, one file per period
//! (the calendar month, UTC, of the batch's last activity) and prune run, named
//! `history-<period>-<run>.jsonl.zst`; beside them the run's manifest,
//! `manifest-<run>.json`, with each file's batches, events, runs, bytes and SHA-256.
//!
//! A file is written to a `.partial` name, synced, read back whole and checked (every line
//! parses, the counts and each line's digest are the ones written, the file's SHA-256 the
//! manifest's) and only then renamed: a file under its own name is complete.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};

use autocomp_model::{BatchId, Timestamp};
use autocomp_store::BatchHistory;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// `sha256:` and the hex digest of `bytes`: how a line and a file are named in the manifest
/// and in a pruned batch's `History_Pruned` event.
pub fn digest(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// One export file as the manifest describes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExportFile {
    pub file: String,
    /// The calendar month (UTC) of its batches' last activity, `YYYY-MM`.
    pub period: String,
    pub batches: u64,
    pub events: u64,
    pub runs: u64,
    /// Its compressed size.
    pub bytes: u64,
    pub sha256: String,
}

/// A prune run's manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// `autocomp prune`'s run, `YYYYMMDDTHHMMSSZ` (store clock).
    pub run: String,
    /// The store as the run's export read it.
    pub store: String,
    pub files: Vec<ExportFile>,
}

/// The period a batch's history is filed under.
pub fn period_of(last_activity: Timestamp) -> String {
    chrono::DateTime::from_timestamp_millis(last_activity.millis())
        .map_or_else(|| "unknown".to_owned(), |at| at.format("%Y-%m").to_string())
}

/// What was written of one line: the batch, its digest and what it holds.
#[derive(Debug, Clone)]
pub struct WrittenLine {
    pub id: BatchId,
    pub sha256: String,
    pub events: u64,
    pub runs: u64,
}

/// An export file being written: lines in, zstd out, to `<name>.partial`.
pub struct ExportWriter {
    dir: PathBuf,
    pub file: ExportFile,
    encoder: zstd::Encoder<'static, std::fs::File>,
    pub lines: Vec<WrittenLine>,
}

impl ExportWriter {
    pub fn create(dir: &Path, period: &str, run: &str) -> std::io::Result<ExportWriter> {
        let name = format!("history-{period}-{run}.jsonl.zst");
        let partial = dir.join(format!("{name}.partial"));
        let out = private_file(&partial)?;
        let mut encoder = zstd::Encoder::new(out, 3)?;
        // Each frame carries a checksum of its content: a damaged file fails to decompress
        // instead of reading back as other text.
        encoder.include_checksum(true)?;
        Ok(ExportWriter {
            dir: dir.to_path_buf(),
            file: ExportFile {
                file: name,
                period: period.to_owned(),
                batches: 0,
                events: 0,
                runs: 0,
                bytes: 0,
                sha256: String::new(),
            },
            encoder,
            lines: Vec::new(),
        })
    }

    /// Appends one batch's history as a line; answers the line's digest.
    pub fn write(&mut self, history: &BatchHistory) -> std::io::Result<String> {
        let mut line = serde_json::to_vec(history).map_err(std::io::Error::other)?;
        let sha256 = digest(&line);
        line.push(b'\n');
        self.encoder.write_all(&line)?;
        let (events, runs) = (history.batch.events.len() as u64, history.runs.len() as u64);
        self.file.batches += 1;
        self.file.events += events;
        self.file.runs += runs;
        self.lines.push(WrittenLine { id: history.batch.id.clone(), sha256: sha256.clone(), events, runs });
        Ok(sha256)
    }

    /// Finishes, syncs, reads the file back and checks it against what was written, then
    /// gives it its own name. Answers the file as the manifest lists it, and its lines.
    pub fn finish(self) -> Result<(ExportFile, Vec<WrittenLine>), String> {
        let ExportWriter { dir, mut file, encoder, lines } = self;
        let partial = dir.join(format!("{}.partial", file.file));
        let out = encoder.finish().map_err(|e| format!("{}: {e}", partial.display()))?;
        out.sync_all().map_err(|e| format!("{}: {e}", partial.display()))?;
        drop(out);
        let read = verify(&partial, &lines)?;
        file.bytes = read.bytes;
        file.sha256 = read.sha256;
        let named = dir.join(&file.file);
        std::fs::rename(&partial, &named).map_err(|e| format!("{}: {e}", named.display()))?;
        sync_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        Ok((file, lines))
    }
}

/// What reading a file back found.
pub struct ReadBack {
    pub bytes: u64,
    pub sha256: String,
}

/// Reads an export file whole and checks every line against `lines` (same batch, same
/// digest, in order, none more or fewer).
fn verify(path: &Path, lines: &[WrittenLine]) -> Result<ReadBack, String> {
    let shown = path.display();
    let whole = std::fs::read(path).map_err(|e| format!("{shown}: {e}"))?;
    let mut expected = lines.iter();
    let mut n = 0usize;
    for_each_line(&whole[..], |line| {
        n += 1;
        let history: BatchHistory =
            serde_json::from_slice(line).map_err(|e| format!("{shown}: line {n} does not read back: {e}"))?;
        match expected.next() {
            Some(written) if written.id == history.batch.id && written.sha256 == digest(line) => Ok(()),
            Some(written) => Err(format!(
                "{shown}: line {n} reads back as {} , not what was written for {}",
                history.batch.id, written.id
            )),
            None => Err(format!("{shown}: line {n} was never written")),
        }
    })?;
    if n != lines.len() {
        return Err(format!("{shown}: {n} lines read back of {} written", lines.len()));
    }
    Ok(ReadBack { bytes: whole.len() as u64, sha256: digest(&whole) })
}

/// Calls `each` with every line (without its newline) of a zstd-compressed file's content.
pub fn for_each_line(compressed: impl Read, mut each: impl FnMut(&[u8]) -> Result<(), String>) -> Result<(), String> {
    let decoder = zstd::Decoder::new(compressed).map_err(|e| format!("not zstd: {e}"))?;
    let mut reader = BufReader::new(decoder);
    let mut line = Vec::new();
    loop {
        line.clear();
        let read = reader.read_until(b'\n', &mut line).map_err(|e| format!("cannot be decompressed: {e}"))?;
        if read == 0 {
            return Ok(());
        }
        if line.last() == Some(&b'\n') {
            line.pop();
        }
        each(&line)?;
    }
}

/// The file's digest as a manifest beside it lists it, if one does: `import` refuses a file
/// that is not what its prune run wrote.
pub fn listed_digest(file: &Path) -> Option<String> {
    let (dir, name) = (file.parent()?, file.file_name()?.to_str()?);
    let manifests = std::fs::read_dir(dir).ok()?.filter_map(Result::ok).map(|entry| entry.path());
    manifests
        .filter(|path| {
            path.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("manifest-") && n.ends_with(".json"))
        })
        .filter_map(|path| serde_json::from_slice::<Manifest>(&std::fs::read(path).ok()?).ok())
        .find_map(|manifest| manifest.files.into_iter().find(|listed| listed.file == name).map(|listed| listed.sha256))
}

/// A new file only its owner reads (mode 0600, as the store file): an export holds every
/// detail and metadata the store held. Never an existing one.
fn private_file(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path)
}

/// Writes the run's manifest (synced) beside its files.
pub fn write_manifest(dir: &Path, manifest: &Manifest) -> std::io::Result<PathBuf> {
    let path = dir.join(format!("manifest-{}.json", manifest.run));
    let mut out = private_file(&path)?;
    out.write_all(&serde_json::to_vec_pretty(manifest).map_err(std::io::Error::other)?)?;
    out.write_all(b"\n")?;
    out.sync_all()?;
    // The names too: nothing is pruned before the files and the manifest would survive a
    // power loss under their names.
    sync_dir(dir)?;
    Ok(path)
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

/// Refuses an export directory a prune cannot write to, before the store is read: it must be
/// a directory, or be made under an existing one, that this user may write.
pub fn check_dir(dir: &Path) -> Result<(), autocomp_model::InvalidInput> {
    let shown = dir.display().to_string();
    let refused = |reason: String| autocomp_model::InvalidInput::new("export_dir", &shown, reason);
    let existing = dir.ancestors().find(|ancestor| ancestor.exists()).unwrap_or(Path::new("/"));
    if !existing.is_dir() {
        return Err(refused(format!("{} is not a directory", existing.display())));
    }
    let path = std::ffi::CString::new(existing.as_os_str().as_encoded_bytes()).map_err(|e| refused(e.to_string()))?;
    // SAFETY: `path` is a NUL-terminated string that lives across the call.
    if unsafe { libc::access(path.as_ptr(), libc::W_OK | libc::X_OK) } != 0 {
        return Err(refused(format!("{} is not writable by this user", existing.display())));
    }
    Ok(())
}

/// The export directory, made (0700) if missing, held by this prune alone: a second prune at
/// the same time is refused rather than export the same batches twice. Held until dropped.
pub fn lock_dir(dir: &Path) -> Result<std::fs::File, crate::operator::OperatorError> {
    use std::os::unix::fs::DirBuilderExt;
    use std::os::unix::io::AsRawFd;
    let failed = |e: std::io::Error| {
        crate::operator::OperatorError::Refused(format!(
            "cannot use {} for exports: {e}; nothing pruned",
            dir.display()
        ))
    };
    // Only its owner's when it is new: what it holds is the store's history.
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(failed)?;
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join(".prune.lock"))
        .map_err(failed)?;
    // SAFETY: flock on a descriptor this function owns.
    if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Err(crate::operator::OperatorError::Refused(format!(
            "another autocomp prune is writing to {} (it holds .prune.lock): nothing pruned by this one",
            dir.display()
        )));
    }
    Ok(lock)
}

/// Removes the `.partial` files a prune that stopped left (with the directory locked, none is
/// being written); answers their names.
pub fn remove_partial_files(dir: &Path) -> std::io::Result<Vec<String>> {
    let mut removed = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        if name.starts_with("history-") && name.ends_with(".partial") {
            std::fs::remove_file(&path)?;
            removed.push(name);
        }
    }
    Ok(removed)
}

/// The files being written in one run, by period.
pub type Writers = BTreeMap<String, ExportWriter>;
