//! `archiver` (records `Data_Archived`): once a batch's checksums and structure are verified,
//! copies it into the archive root, re-hashes the copy from disk against the source and
//! publishes it atomically under `<archive_root>/<batch id>`. A batch re-delivered after it
//! was archived is verified again and then archived as a new version beside the old one
//! (`<batch id>.v2`, `.v3`, ...); an old copy is never overwritten unless `replace = true`.
//! `copy` owns the file work. Its result is an `archiver::ArchivedCopy` (this crate's
//! library): the copy's path and version and its fixity, for the steps after it.

mod copy;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use archiver::{ArchivedCopy, Fixity};
use autocomp_framework::EventType;
use autocomp_framework::prelude::*;
use serde_json::json;

use crate::copy::{CopyError, Progress};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Settings {
    /// Where archived batches go, one directory per batch id. Must exist: a typo must not
    /// quietly create a second archive.
    archive_root: PathBuf,
    /// Replace an archived copy that already exists (atomically) instead of failing.
    #[serde(default)]
    replace: bool,
}

struct Archiver;

impl Component for Archiver {
    type Settings = Settings;

    fn name(&self) -> &str {
        "archiver"
    }
    fn version(&self) -> &str {
        env!("CARGO_PKG_VERSION")
    }
    fn event_type(&self) -> &str {
        "Data_Archived"
    }
    fn trigger(&self) -> Trigger {
        Trigger::builder().requires(["Checksums_Verified", "Structure_Checked"]).blocked_by("Data_Archived").build()
    }
    fn result_schema(&self) -> Option<Value> {
        Some(autocomp_framework::result_schema_of::<ArchivedCopy>())
    }

    fn check_settings(&self, settings: &Settings) -> Result<(), SettingError> {
        let root = &settings.archive_root;
        let refused = |message: String| SettingError::new("archive_root", format!("{}: {message}", root.display()));
        match std::fs::metadata(root) {
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => return Err(refused("not a directory".into())),
            Err(e) => return Err(refused(format!("{e} (it must exist: create it, or mount the share)"))),
        }
        writable(root).map_err(|e| refused(format!("cannot write into it: {e}")))
    }

    fn work(&self, batch: &Batch, settings: &Settings, context: &mut WorkContext) -> Result<(), WorkError> {
        let source = context.location()?.to_path_buf();
        let root = &settings.archive_root;
        check_places(&source, root)?;
        // A batch id is a validated name: always a single, safe path component.
        let first = root.join(batch.id.as_str());
        let (target, version) = match first.symlink_metadata() {
            Err(_) => (first, 1),
            Ok(_) if settings.replace => (first, 1),
            // Our own copy of content the batch no longer has: the new content is a new version.
            Ok(_) if archived_from_older_content(batch) => next_version(root, batch.id.as_str()),
            Ok(_) => {
                already_archived(context, &first);
                return Ok(());
            }
        };
        copy::remove_stale_temps(root, batch.id.as_str(), previous_temp(context).as_deref());

        let temp = copy::TempDir::create(root, batch.id.as_str()).with_path(root)?;
        let mut progress = copy_batch(&source, temp.path(), context)?;
        for problem in progress.problems.drain(..) {
            context.add_failure(problem.reference, problem.kind, problem.description, problem.details);
        }
        if context.failures_so_far() > 0 {
            // Dropping `temp` removes the partial copy.
            context.set_summary(format!("not archived: {} problems in the copy", context.failures_so_far()));
            return Ok(());
        }
        match temp.publish(&target, settings.replace) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                // Someone published it between our check and the rename.
                already_archived(context, &target);
                return Ok(());
            }
            Err(e) => return Err(WorkError::io(&target, e)),
        }
        let kept = match version {
            1 => String::new(),
            _ => format!("; the earlier versions are kept beside it under {}", root.display()),
        };
        let summary = format!(
            "archived{} to {} ({} files, {} bytes, sha256 of the copy verified){kept}",
            if version > 1 { format!(" version {version}") } else { String::new() },
            target.display(),
            progress.files,
            progress.bytes
        );
        // A line of what it did, kept as the run's output (the operator's `autocomp logs`).
        tracing::info!("{summary}");
        context.set_summary(summary);
        let fixity = Fixity::of_files(std::mem::take(&mut progress.digests));
        context.set_result(&ArchivedCopy { archive_path: target.display().to_string(), version, fixity })
    }
}

/// The archive root is a directory (missing: most likely an unmounted share, worth
/// retrying), the batch's location one too, and the root is not inside the batch.
fn check_places(source: &Path, root: &Path) -> Result<(), WorkError> {
    match std::fs::metadata(root) {
        Ok(meta) if meta.is_dir() => {}
        Ok(_) => return Err(WorkError::permanent(format!("archive_root {} is not a directory", root.display()))),
        // Most likely an unmounted share: worth retrying.
        Err(e) => return Err(WorkError::transient(format!("archive_root {}: {e}", root.display()))),
    }
    if !std::fs::metadata(source).map(|m| m.is_dir()).with_path(source)? {
        return Err(WorkError::permanent(format!("the batch location {} is not a directory", source.display())));
    }
    // Copying a batch into a root inside itself would copy its own copy, forever.
    if let (Ok(source), Ok(root)) = (source.canonicalize(), root.canonicalize())
        && root.starts_with(&source)
    {
        return Err(WorkError::permanent(format!(
            "archive_root {} is inside the batch {}",
            root.display(),
            source.display()
        )));
    }
    Ok(())
}

/// Copies the batch into `temp`, saving a checkpoint as it goes and stopping when the run is
/// cancelled (the partial copy goes with `temp`).
fn copy_batch(source: &Path, temp: &Path, context: &mut WorkContext) -> Result<Progress, WorkError> {
    let mut progress = Progress::new(temp);
    context.save_checkpoint(progress.checkpoint())?;
    let copied = copy::copy_tree(source, temp, &mut progress, &mut |progress: &Progress| {
        if context.is_cancelled() {
            return Err(CopyError::Cancelled);
        }
        if progress.checkpoint_due() {
            context.save_checkpoint(progress.checkpoint()).map_err(CopyError::Work)?;
        }
        Ok(())
    });
    match copied {
        Ok(()) => Ok(progress),
        Err(CopyError::Cancelled) => Err(WorkError::permanent(format!(
            "cancelled after copying {} files; the partial copy was removed",
            progress.files
        ))),
        Err(CopyError::Work(e)) => Err(e),
        Err(CopyError::Io { path, error }) => Err(WorkError::io(&path, error)),
    }
}

/// Whether this process may create entries in `dir` (a read-only mount included). Asked of
/// the kernel (access(2)), not by writing a probe: a file made in the archive root would
/// show there to anyone watching it, as something that is not a batch.
fn writable(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    // SAFETY: `path` is a NUL-terminated string that outlives the call; access only reads it.
    match unsafe { libc::access(path.as_ptr(), libc::W_OK | libc::X_OK) } {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

/// Whether this archiver archived the batch before and its content changed since: the
/// batch's `Data_Archived` is a success worked out from older content (stale).
fn archived_from_older_content(batch: &Batch) -> bool {
    let view = batch.effective();
    view.get(&EventType::new("Data_Archived").expect("a valid type name"))
        .is_some_and(|archived| archived.outcome == Outcome::Success && archived.is_stale_at(batch.modified_seq))
}

/// The first free `<id>.v<n>` under the root (n from 2): where a re-delivered batch's new
/// content is archived.
fn next_version(root: &Path, id: &str) -> (PathBuf, u32) {
    (2..)
        .map(|n| (root.join(format!("{id}.v{n}")), n))
        .find(|(path, _)| path.symlink_metadata().is_err())
        .expect("some version number is free")
}

fn already_archived(context: &mut WorkContext, target: &Path) {
    context.add_failure(
        target.display().to_string(),
        "already_archived",
        format!("already archived at {}; set replace = true to overwrite it", target.display()),
        json!({ "archive": target.display().to_string() }),
    );
    context.set_summary(format!("not archived: {} already exists", target.display()));
}

/// The temp dir an earlier attempt recorded in its checkpoint (it may have died mid-copy).
fn previous_temp(context: &WorkContext) -> Option<PathBuf> {
    context.checkpoint()?.get("temp")?.as_str().map(PathBuf::from)
}

fn main() -> ExitCode {
    autocomp_framework::main(Archiver)
}

#[cfg(test)]
mod tests {
    use autocomp_framework::testing::{TestBatch, run_work, run_work_on, settings};

    use super::*;

    fn archiving_to(root: &Path) -> Settings {
        settings(&format!("archive_root = {:?}", root.display().to_string()))
    }

    #[test]
    fn a_folder_is_copied_under_its_batch_id() {
        let dir = tempfile::tempdir().unwrap();
        let (source, root) = (dir.path().join("B1"), dir.path().join("archive"));
        std::fs::create_dir_all(source.join("data")).unwrap();
        std::fs::write(source.join("data/page.txt"), "a page\n").unwrap();
        std::fs::create_dir(&root).unwrap();

        let run = run_work_on(&Archiver, &archiving_to(&root), &source);
        assert!(run.succeeded(), "{:?}", run.report);
        assert_eq!(std::fs::read_to_string(root.join("B1/data/page.txt")).unwrap(), "a page\n");
        assert!(run.report.summary.starts_with(&format!("archived to {} (1 files", root.join("B1").display())));

        let archived = run.result::<ArchivedCopy>().expect("a result");
        assert_eq!((archived.archive_path.as_str(), archived.version), (&*root.join("B1").to_string_lossy(), 1));
        assert_eq!(archived.fixity, Fixity::compute(&root.join("B1")).unwrap(), "the copy's fixity");
        assert_eq!((archived.fixity.files, archived.fixity.bytes), (1, 7));
        // A later step reads it typed from the batch's event.
        let later = TestBatch::new("B1").with_result("Data_Archived", run.report.result.as_ref().unwrap()).build();
        assert_eq!(later.result::<ArchivedCopy>("Data_Archived").unwrap(), Some(archived));
        let schema = Archiver.result_schema().expect("a published schema");
        assert_eq!(schema["required"], json!(["archive_path", "version", "fixity"]), "{schema:#}");
    }

    #[test]
    fn a_missing_location_is_a_permanent_failure_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("never-delivered");
        let batch = TestBatch::new("B2").location(&missing).succeeded("Checksums_Verified").build();
        let run = run_work(&Archiver, &archiving_to(dir.path()), &batch);
        assert!(!run.succeeded() && !run.is_transient(), "{:?}", run.report);
        assert!(run.report.summary.starts_with(&missing.display().to_string()), "{}", run.report.summary);
    }

    #[test]
    fn a_missing_archive_root_is_retried() {
        let dir = tempfile::tempdir().unwrap();
        let run = run_work_on(&Archiver, &archiving_to(&dir.path().join("unmounted")), dir.path());
        assert!(run.is_transient(), "{:?}", run.report);
        assert!(run.report.summary.contains("unmounted"), "{}", run.report.summary);
    }
}
