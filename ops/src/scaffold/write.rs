//! Writing a plan: the files into a staging directory renamed into place, then the workspace
//! manifest, undone together on an error; and what the terminal is told was written.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use super::manifest::replace_file;
use super::plan::Plan;
use super::texts::ScriptNext;
use super::{Lang, refused};
use crate::operator::OperatorError;

impl Plan {
    pub(super) fn write(&self) -> Result<String, OperatorError> {
        let parent = self.target.parent().expect("checked in plan");
        let created =
            create_parents(parent).map_err(|e| refused(format!("cannot create {}: {e}", parent.display())))?;
        // Nothing half-written: on an error the crate goes (if it was moved into place), and so
        // do the directories made for it.
        let undo = |e: String, crate_written: bool| {
            if crate_written {
                std::fs::remove_dir_all(&self.target).ok();
            }
            for dir in created.iter().rev() {
                std::fs::remove_dir(dir).ok();
            }
            refused(format!("{e}; nothing was written"))
        };
        let paths = self.write_crate(parent).map_err(|e| undo(e, false))?;
        if let Some((path, text)) = &self.manifest {
            replace_file(path, text).map_err(|e| undo(e, true))?;
        }
        Ok(self.render(&paths))
    }

    /// Writes the crate into a hidden directory next to the target and renames it into
    /// place, so the target appears complete or not at all.
    fn write_crate(&self, parent: &Path) -> Result<Vec<PathBuf>, String> {
        let staging = tempfile::Builder::new()
            .prefix(".autocomp-new-")
            .tempdir_in(parent)
            .map_err(|e| format!("cannot write in {}: {e}", parent.display()))?;
        let mut paths = Vec::new();
        for (file, text) in &self.files {
            let path = staging.path().join(file);
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
            }
            std::fs::write(&path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
            paths.push(self.target.join(file));
        }
        if self.target.symlink_metadata().is_ok() {
            return Err(format!("{} appeared while it was being written", self.target.display()));
        }
        std::fs::rename(staging.path(), &self.target)
            .map_err(|e| format!("cannot move the crate to {}: {e}", self.target.display()))?;
        Ok(paths)
    }

    fn render(&self, paths: &[PathBuf]) -> String {
        let mut out = String::new();
        for path in paths {
            writeln!(out, "{}", path.display()).ok();
        }
        match &self.script {
            Some(script) => self.render_script(&mut out, script),
            None => self.render_crate(&mut out),
        }
        out
    }

    /// The next steps of a Python or shell step: its tests, its config, autocomp-exec.
    fn render_script(&self, out: &mut String, script: &ScriptNext) {
        let config = self.target.join(format!("{}.toml", self.name));
        let name = &self.name;
        out.push_str("\nNext:\n");
        writeln!(out, "  {}   # its tests, no autocomp needed", script.test(&self.target)).ok();
        let what = if script.lang == Lang::Python { "work() in the .py file" } else { "the .sh script" };
        writeln!(out, "  make {what} the real step, and the test_ file its tests").ok();
        writeln!(
            out,
            "  cp {} CONFIG_DIR/{name}.toml   # CONFIG_DIR holds autocomp.toml (/etc/autocomp by default)",
            config.display()
        )
        .ok();
        let dry_run = script.exec(name, &self.target, " --config-dir CONFIG_DIR --dry-run");
        writeln!(out, "  {dry_run}   # what one pass would claim").ok();
        writeln!(
            out,
            "  {}   # one pass, as cron starts it",
            script.exec(name, &self.target, " --config-dir CONFIG_DIR")
        )
        .ok();
        writeln!(out, "  (the crontab line: {})", self.target.join("README.md").display()).ok();
    }

    /// The membership and the next steps of a component crate: build, test, config, a pass.
    fn render_crate(&self, out: &mut String) {
        let config = self.target.join(format!("{}.toml", self.name));
        let name = &self.name;
        match (&self.manifest, &self.membership) {
            (Some((manifest, _)), Some(said)) => writeln!(out, "{} {said}", manifest.display()).ok(),
            (None, Some(said)) => writeln!(out, "({said})").ok(),
            _ => None,
        };
        out.push_str("\nNext:\n");
        let binary = match &self.workspace {
            Some(root) => {
                // `--workspace` resolves the dependencies' features as the workspace build did
                // (`-p NAME` alone unifies fewer, and rebuilds some eighty dependency crates);
                // `--bin` builds and tests this crate alone.
                writeln!(
                    out,
                    "  cd {} && cargo build --workspace --bin {name} && cargo test --workspace --bin {name}",
                    root.display()
                )
                .ok();
                root.join("target/debug").join(name)
            }
            None => {
                writeln!(out, "  cd {} && cargo build && cargo test", self.target.display()).ok();
                self.target.join("target/debug").join(name)
            }
        };
        writeln!(out, "  make work() in src/main.rs the real step, and src/tests.rs its tests").ok();
        writeln!(
            out,
            "  cp {} CONFIG_DIR/{name}.toml   # CONFIG_DIR holds autocomp.toml (/etc/autocomp by default)",
            config.display()
        )
        .ok();
        writeln!(out, "  {} --config-dir CONFIG_DIR --dry-run   # what one pass would claim", binary.display()).ok();
        writeln!(out, "  {} --config-dir CONFIG_DIR             # one pass, as cron starts it", binary.display()).ok();
    }
}

/// Creates `dir` and its missing parents; returns those it created, outermost first.
fn create_parents(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let missing: Vec<PathBuf> = dir.ancestors().take_while(|d| !d.exists()).map(Path::to_path_buf).collect();
    std::fs::create_dir_all(dir)?;
    Ok(missing.into_iter().rev().collect())
}
