//! Test support for the component crates (feature `testing`): the Library of Congress `bagit`
//! tool as the reference (its absence fails the test, saying how to install it), and a
//! throwaway embedded pipeline (SQLite store, local index and locks, a config directory) to
//! run a component binary against, the way cron runs it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use autocomp_store::{
    Agent, BatchId, BatchType, EffectiveView, Event, EventType, NewBatch, NewEvent, ObjectStore, Outcome, SqliteStore,
};

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

/// A pipeline of one host: a store file, index and lock directories, and a config directory
/// whose `autocomp.toml` names them. Everything lives in a temporary directory.
pub struct Pipeline {
    dir: tempfile::TempDir,
    runtime: tokio::runtime::Runtime,
}

impl Default for Pipeline {
    fn default() -> Self {
        Self::new()
    }
}

impl Pipeline {
    pub fn new() -> Pipeline {
        let dir = tempfile::tempdir().expect("temp dir");
        let root = dir.path();
        std::fs::create_dir(root.join("config")).unwrap();
        let shared = format!(
            "store = \"sqlite://{}\"\nindex = \"local:{}\"\nlocks = \"local:{}\"\n",
            root.join("store.db").display(),
            root.join("index").display(),
            root.join("locks").display()
        );
        std::fs::write(root.join("config/autocomp.toml"), shared).unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        Pipeline { dir, runtime }
    }

    pub fn config_dir(&self) -> PathBuf {
        self.dir.path().join("config")
    }

    /// Writes `<component>.toml` into the config directory.
    pub fn configure(&self, component: &str, toml: &str) {
        std::fs::write(self.config_dir().join(format!("{component}.toml")), toml).unwrap();
    }

    fn store(&self) -> SqliteStore {
        self.runtime.block_on(SqliteStore::open(self.dir.path().join("store.db"))).expect("store opens")
    }

    /// Registers a batch at `location` with a successful `Data_Received`, as `batch-trigger` does.
    pub fn register(&self, id: &str, location: &Path) {
        let store = self.store();
        let id = BatchId::new(id).unwrap();
        let batch = NewBatch::new(id.clone(), BatchType::new("RoundTrip").unwrap())
            .with_location(location.to_string_lossy().into_owned());
        let event = NewEvent::new(
            EventType::new("Data_Received").unwrap(),
            Outcome::Success,
            Agent::new("test/0@localhost#0").unwrap(),
        );
        self.runtime.block_on(async {
            store.create_batch(batch).await.expect("batch registered");
            store.append_event(&id, event).await.expect("Data_Received recorded");
        });
    }

    /// Runs a component binary once against this pipeline, as cron would.
    pub fn run(&self, binary: &Path, args: &[&str]) -> Output {
        Command::new(binary)
            .arg("--config-dir")
            .arg(self.config_dir())
            .args(args)
            .env_remove("AUTOCOMP_STORE")
            .env_remove("AUTOCOMP_INDEX")
            .env_remove("AUTOCOMP_LOCKS")
            .env_remove("AUTOCOMP_CONFIG_DIR")
            .output()
            .expect("the component binary runs")
    }

    /// The batch's effective event of a type, if recorded.
    pub fn event(&self, id: &str, event_type: &str) -> Option<Event> {
        let store = self.store();
        let batch = self.runtime.block_on(store.get_batch(&BatchId::new(id).unwrap())).expect("batch exists");
        EffectiveView::of(&batch.events).get(&EventType::new(event_type).unwrap()).cloned()
    }
}
