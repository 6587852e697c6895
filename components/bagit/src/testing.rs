//! Test support for the component crates (feature `testing`): the Library of Congress `bagit`
//! tool as the reference (its absence fails the test, saying how to install it). A pipeline to
//! run a component binary against is the framework's (`autocomp_framework::testing`).

use std::path::Path;
use std::process::{Command, Output};

/// The `bagit` tool, run as `python3 -m bagit` so that its library is importable too (some
/// corruptions are made through `bagit.Bag.save()`, which rewrites the tag manifests).
pub struct BagitTool {
    python: String,
}

/// Finds the tool. Panics (never skips) if it is not installed.
pub fn bagit_tool() -> BagitTool {
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let probe = Command::new(&python).args(["-c", "import bagit; print(bagit.VERSION)"]).output();
    match probe {
        Ok(output) if output.status.success() => BagitTool { python },
        Ok(output) => panic!(
            "the Library of Congress bagit tool is required as the reference for these tests: \
             `pip install bagit` (for {python}); importing it failed: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        ),
        Err(e) => panic!(
            "the Library of Congress bagit tool is required as the reference for these tests: \
             install Python 3 and `pip install bagit`; running {python} failed: {e}"
        ),
    }
}

/// What `bagit --validate` said.
#[derive(Debug, Clone)]
pub struct Verdict {
    pub valid: bool,
    /// Its log, which names what it found.
    pub log: String,
}

impl BagitTool {
    /// `bagit.py --md5 --sha256 [extra] <dir>`: turns the directory into a bag in place.
    pub fn make_bag(&self, dir: &Path, extra: &[&str]) {
        let output = Command::new(&self.python)
            .args(["-m", "bagit", "--md5", "--sha256"])
            .args(extra)
            .arg(dir)
            .output()
            .expect("python runs");
        assert!(output.status.success(), "bagit could not make a bag of {}: {}", dir.display(), log(&output));
    }

    /// `bagit.py --validate <dir>`.
    pub fn validate(&self, dir: &Path) -> Verdict {
        let output =
            Command::new(&self.python).args(["-m", "bagit", "--validate"]).arg(dir).output().expect("python runs");
        Verdict { valid: output.status.success(), log: log(&output) }
    }

    /// Sets bag-info fields through bagit's API, which rewrites bag-info.txt and the tag
    /// manifests consistently (so only the field itself can be wrong).
    pub fn set_bag_info(&self, dir: &Path, field: &str, value: &str) {
        self.python(dir, &format!("bag.info[{field:?}] = {value:?}\nbag.save()"));
    }

    /// Rewrites the tag manifests after an edit of a tag file, as a careless packager would.
    pub fn resave(&self, dir: &Path) {
        self.python(dir, "bag.save()");
    }

    fn python(&self, dir: &Path, body: &str) {
        let script = format!("import sys, bagit\nbag = bagit.Bag(sys.argv[1])\n{body}\n");
        let output = Command::new(&self.python).args(["-c", &script]).arg(dir).output().expect("python runs");
        assert!(output.status.success(), "bagit script failed on {}: {}", dir.display(), log(&output));
    }
}

fn log(output: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}
