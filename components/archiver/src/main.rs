//! `archiver` (records `Data_Archived`): once a batch's checksums and structure are verified,
//! copies it into the archive root, re-hashes the copy from disk against the source and
//! publishes it atomically under `<archive_root>/<batch id>`. `copy` owns the file work.

mod copy;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use autocomp_framework::{Component, WorkContext, WorkError, cli};
use autocomp_store::{Batch, EventType, Trigger};
use serde::Deserialize;
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
        let types = |names: &[&str]| names.iter().map(|n| EventType::new(*n).expect("valid event types")).collect();
        Trigger {
            requires: types(&["Checksums_Verified", "Structure_Checked"]),
            blocked_by: types(&["Data_Archived"]),
            ..Trigger::default()
        }
    }

    fn work(&self, batch: &Batch, settings: &Settings, context: &mut WorkContext) -> Result<(), WorkError> {
        let source = context.location()?.to_path_buf();
        let root = &settings.archive_root;
        match std::fs::metadata(root) {
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => return Err(WorkError::permanent(format!("archive_root {} is not a directory", root.display()))),
            // Most likely an unmounted share: worth retrying.
            Err(e) => return Err(WorkError::transient(format!("archive_root {}: {e}", root.display()))),
        }
        if !std::fs::metadata(&source).map(|m| m.is_dir()).map_err(|e| io_at(&source, e))? {
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
        // A batch id is a validated name: always a single, safe path component.
        let target = root.join(batch.id.as_str());
        if target.symlink_metadata().is_ok() && !settings.replace {
            already_archived(context, &target);
            return Ok(());
        }
        copy::remove_stale_temps(root, batch.id.as_str(), previous_temp(context).as_deref());

        let temp = copy::TempDir::create(root, batch.id.as_str()).map_err(|e| io_at(root, e))?;
        let mut progress = Progress::new(temp.path());
        context.save_checkpoint(progress.checkpoint())?;
        let copied = copy::copy_tree(&source, temp.path(), &mut progress, &mut |progress: &Progress| {
            if context.is_cancelled() {
                return Err(CopyError::Cancelled);
            }
            if progress.checkpoint_due() {
                context.save_checkpoint(progress.checkpoint()).map_err(CopyError::Work)?;
            }
            Ok(())
        });
        match copied {
            Ok(()) => {}
            Err(CopyError::Cancelled) => {
                return Err(WorkError::permanent(format!(
                    "cancelled after copying {} files; the partial copy was removed",
                    progress.files
                )));
            }
            Err(CopyError::Work(e)) => return Err(e),
            Err(CopyError::Io { path, error }) => return Err(io_at(&path, error)),
        }
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
            Err(e) => return Err(io_at(&target, e)),
        }
        context.set_summary(format!(
            "archived to {} ({} files, {} bytes, sha256 of the copy verified)",
            target.display(),
            progress.files,
            progress.bytes
        ));
        Ok(())
    }
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

fn io_at(path: &Path, error: std::io::Error) -> WorkError {
    // I/O trouble (a share gone, a full disk) may pass; the runner caps the retries.
    WorkError::transient(format!("{}: {error}", path.display()))
}

fn main() -> ExitCode {
    cli::main(Archiver)
}
