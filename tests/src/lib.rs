//! Support for the workspace's end-to-end tests: they run the real binaries as separate OS
//! processes, so this finds (building once if needed) the binaries of the workspace in the
//! same profile as the test itself, and gives them a `Pipeline` fixture: a temp dir with a
//! store (an embedded SQLite file, or any store URL such as a PostgreSQL database), index and
//! lock dir, the probe component's config, store read-backs and steering (as an operator's
//! pause or pool size would set it).

pub mod netns;
pub mod services;
pub mod zk;

use std::io::Read;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use autocomp_model::{
    Agent, Batch, BatchId, BatchType, ComponentName, Event, EventType, NewBatch, NewEvent, Outcome, Run, Seq,
};
use autocomp_store::{ObjectStore, SqliteStore, open_store};

/// The path of a workspace binary, e.g. `binary("autocomp")`.
pub fn binary(name: &str) -> PathBuf {
    let dir = profile_dir();
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        // `cargo test` builds only this package's targets; the binaries of the other crates
        // must be built explicitly (cargo holds no lock while tests run).
        let mut build = cargo();
        build.args(["build", "--workspace", "--bins", "--quiet"]);
        if dir.ends_with("release") {
            build.arg("--release");
        }
        let status = build.status().expect("cargo runs");
        assert!(status.success(), "building the workspace binaries failed");
    });
    let path = dir.join(name);
    assert!(path.exists(), "no binary {} after building the workspace", path.display());
    path
}

/// `cargo`, without the variables cargo set for this test process rather than for a build:
/// a build script that declares `rerun-if-env-changed=CARGO_MANIFEST_DIR` (ring's does)
/// would see it change and rebuild everything above it, here and again in the next build
/// from a shell.
pub fn cargo() -> Command {
    const SET_FOR_TESTS: [&str; 8] = [
        "CARGO_MANIFEST_",
        "CARGO_PKG_",
        "CARGO_CRATE_",
        "CARGO_BIN_",
        "CARGO_PRIMARY_",
        "CARGO_TARGET_TMPDIR",
        "CARGO_RUSTC_CURRENT_DIR",
        "OUT_DIR",
    ];
    let mut cargo = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    for (var, _) in std::env::vars_os() {
        if SET_FOR_TESTS.iter().any(|prefix| var.to_string_lossy().starts_with(prefix)) {
            cargo.env_remove(&var);
        }
    }
    cargo
}

/// `target/<profile>`: the test executable lives in `target/<profile>/deps/`.
/// `count` batches for the probe, with its ledger on (`ledger.txt`): `work_time` each, two
/// threads a worker, a heartbeat a second. What the drills that run two watchers share.
pub fn ledgered_batches(pipeline: &Pipeline, count: usize, work_time: &str) -> Vec<BatchId> {
    let ids = pipeline.register(count);
    pipeline.configure(&format!(
        "max_threads = 2\nqueue_size = 4\nwatch_heartbeat = \"1s\"\n\n[settings]\nwork_time = \"{work_time}\"\nledger = \"{}\"\n",
        pipeline.path("ledger.txt").display()
    ));
    ids
}

/// Two watching workers of the probe.
pub fn two_watchers(pipeline: &Pipeline) -> [Child; 2] {
    [pipeline.spawn(&["--watch"]), pipeline.spawn(&["--watch"])]
}

/// SIGTERM to each watcher: each finishes its work and exits 0 within a minute.
pub fn stop_watchers(workers: [Child; 2]) {
    for worker in workers {
        Command::new("kill").args(["-TERM", &worker.id().to_string()]).status().expect("kill runs");
        let stopped = finish(worker, Duration::from_secs(60));
        assert_eq!(stopped.code, Some(0), "{}", stopped.show());
    }
}

/// The previous release's binary `name` (`autocomp`, `probe-component`), as
/// `scripts/previous-release` builds it (scripts/test runs it first).
pub fn previous_release_binary(name: &str) -> PathBuf {
    let target = profile_dir().parent().expect("target/<profile>").to_path_buf();
    let path = target.join("previous-release/bin").join(name);
    assert!(path.exists(), "no {}: run scripts/previous-release (scripts/test runs it)", path.display());
    path
}

fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    exe.parent().and_then(|deps| deps.parent()).expect("target/<profile>/deps/<test>").to_path_buf()
}

/// Copies the directory tree `from` into `to` (created if missing), files and all.
pub fn copy_tree(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// The `p` quantile (0..=1) of sorted samples; zero for none.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// The probe component's name and event type as `probe-component` defaults them.
pub const PROBE_NAME: &str = "probe";
pub const PROBED: &str = "Probed";
pub const DATA_RECEIVED: &str = "Data_Received";

/// How a finished component process ended.
#[derive(Debug)]
pub struct Finished {
    /// `None` if a signal ended it.
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
}

impl Finished {
    /// For assertion messages.
    pub fn show(&self) -> String {
        format!("exit {:?} after {:?}\n--- stdout\n{}--- stderr\n{}", self.code, self.elapsed, self.stdout, self.stderr)
    }
}

/// Polls `condition` every 20 ms until it holds (true) or `deadline` passes (false).
pub use autocomp_test_servers::wait_until;

/// Removes from `command` the environment that would change what an autocomp binary reads
/// (backend URLs, the config dir, tokens, certificates, the ZooKeeper identity, the log
/// filter, what a `postgres://` URL falls back on, the probe's own settings), so a test or a
/// bench says everything it means.
pub fn without_pipeline_env(command: &mut Command) -> &mut Command {
    for var in [
        "AUTOCOMP_STORE",
        "AUTOCOMP_INDEX",
        "AUTOCOMP_LOCKS",
        "AUTOCOMP_CONFIG_DIR",
        "AUTOCOMP_ZK_AUTH",
        "AUTOCOMP_TOKEN",
        "AUTOCOMP_TOKEN_FILE",
        "AUTOCOMP_CA_FILE",
        "AUTOCOMP_CLIENT_CERT",
        "AUTOCOMP_CLIENT_KEY",
        "RUST_LOG",
        "PGUSER",
        "PGPASSWORD",
        "PROBE_NAME",
        "PROBE_EVENT_TYPE",
        "PROBE_REQUIRES",
    ] {
        command.env_remove(var);
    }
    command
}

/// Asks a spawned process to stop (SIGTERM), as systemd or an operator does.
pub fn sigterm(child: &Child) {
    let pid = libc::pid_t::try_from(child.id()).expect("pid fits");
    // SAFETY: kill(2) on the pid of a child we spawned and have not reaped yet.
    let sent = unsafe { libc::kill(pid, libc::SIGTERM) };
    assert_eq!(sent, 0, "kill({pid}, SIGTERM) failed: {}", std::io::Error::last_os_error());
}

/// Waits for a spawned component (stdout and stderr piped) to exit, at most `limit`;
/// kills it and panics if it is still running then.
pub fn finish(mut child: Child, limit: Duration) -> Finished {
    let started = Instant::now();
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            if let Some(mut pipe) = pipe {
                pipe.read_to_string(&mut text).ok();
            }
            text
        })
    };
    let stdout = drain(child.stdout.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
    let stderr = drain(child.stderr.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
    let deadline = started + limit;
    let mut status = None;
    let exited = wait_until(deadline, || {
        status = child.try_wait().expect("try_wait on a child");
        status.is_some()
    });
    if !exited {
        child.kill().ok();
        child.wait().ok();
    }
    let finished = Finished {
        code: status.and_then(|s| s.code()),
        stdout: stdout.join().expect("stdout reader"),
        stderr: stderr.join().expect("stderr reader"),
        elapsed: started.elapsed(),
    };
    assert!(exited, "process {} still running after {limit:?}; killed it\n{}", child.id(), finished.show());
    finished
}

/// A whole pipeline in a temp dir: `config/autocomp.toml` naming a store (by default a
/// SQLite file under the dir; [`Pipeline::with_store`] takes any store URL), a local tantivy
/// index and local flock locks under the dir, the probe component's `config/probe.toml`, and a
/// handle on the store to register batches and read results.
pub struct Pipeline {
    // Fields drop in order: the store closes before its directory is removed.
    store: Arc<dyn ObjectStore>,
    /// The same store as `store` when it is the default SQLite file.
    sqlite: Option<SqliteStore>,
    store_url: String,
    runtime: tokio::runtime::Runtime,
    probe: PathBuf,
    dir: tempfile::TempDir,
}

impl Pipeline {
    /// `probe` is the probe component's binary (`env!("CARGO_BIN_EXE_probe-component")`).
    /// The store is a SQLite file in the pipeline's dir.
    pub fn new(probe: impl Into<PathBuf>) -> Self {
        Self::build(probe.into(), |root| format!("sqlite://{}", root.join("store.db").display()))
    }

    /// A pipeline whose store is `store_url` (e.g. `postgres://...`), for the components and
    /// for the test's own handle alike.
    pub fn with_store(probe: impl Into<PathBuf>, store_url: &str) -> Self {
        Self::build(probe.into(), |_| store_url.to_owned())
    }

    fn build(probe: PathBuf, store_url: impl FnOnce(&std::path::Path) -> String) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let root = dir.path();
        let store_url = store_url(root);
        std::fs::create_dir_all(root.join("config")).expect("config dir");
        let shared = format!(
            "store = \"{store_url}\"\nindex = \"local:{}\"\nlocks = \"local:{}\"\n",
            root.join("index").display(),
            root.join("locks").display(),
        );
        std::fs::write(root.join("config/autocomp.toml"), shared).expect("autocomp.toml");
        let runtime =
            tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime for the store");
        let (store, sqlite) = open(&runtime, &store_url);
        Self { store, sqlite, store_url, runtime, probe, dir }
    }

    /// Points `config/autocomp.toml` at another lock service, e.g. a `zk://` URL.
    pub fn use_locks(&self, url: &str) {
        self.use_backend("locks", url);
    }

    /// Points the pipeline's store at `url` (a server restored from a backup), for the
    /// components and the test's own handle alike.
    pub fn move_store(&mut self, url: &str) {
        self.use_backend("store", url);
        self.store_url = url.to_owned();
        self.reconnect();
    }

    /// Points `config/autocomp.toml`'s `store`, `index` or `locks` at `url`.
    pub fn use_backend(&self, key: &str, url: &str) {
        let file = self.config_dir().join("autocomp.toml");
        let text = std::fs::read_to_string(&file).expect("autocomp.toml");
        let prefix = format!("{key} =");
        let mut lines: Vec<String> = text.lines().filter(|l| !l.starts_with(&prefix)).map(str::to_owned).collect();
        lines.push(format!("{key} = \"{url}\""));
        std::fs::write(&file, lines.join("\n") + "\n").expect("autocomp.toml");
    }

    pub fn path(&self, relative: &str) -> PathBuf {
        self.dir.path().join(relative)
    }

    pub fn config_dir(&self) -> PathBuf {
        self.path("config")
    }

    /// Writes `config/probe.toml` with `settings` (top-level keys) and a probe that notes
    /// each batch it starts in a `started` dir and holds its work until a `go` file exists;
    /// returns both paths.
    pub fn hold_work_at_a_gate(&self, settings: &str) -> (PathBuf, PathBuf) {
        let (started, gate) = (self.path("started"), self.path("go"));
        std::fs::create_dir_all(&started).expect("the started dir");
        self.configure(&format!(
            "{settings}\n[settings]\nstarted = \"{}\"\nwait_for = \"{}\"\n",
            started.display(),
            gate.display()
        ));
        (started, gate)
    }

    /// Writes `config/probe.toml`.
    pub fn configure(&self, text: &str) {
        std::fs::write(self.config_dir().join(format!("{PROBE_NAME}.toml")), text).expect("probe.toml");
    }

    /// Runs a store call to completion.
    pub fn block_on<F: Future>(&self, future: F) -> F::Output {
        self.runtime.block_on(future)
    }

    /// The SQLite store of a [`Pipeline::new`] pipeline (panics for another store; see
    /// [`Pipeline::any_store`]).
    pub fn store(&self) -> &SqliteStore {
        self.sqlite.as_ref().expect("a pipeline made by Pipeline::new (a SQLite store); use any_store()")
    }

    /// The test's handle on the pipeline's store, whatever it is.
    pub fn any_store(&self) -> &dyn ObjectStore {
        self.store.as_ref()
    }

    /// Drops the test's store handle and opens the store URL afresh: a new connection pool
    /// (after a database restart or failover, so the test's own reads start clean).
    pub fn reconnect(&mut self) {
        (self.store, self.sqlite) = open(&self.runtime, &self.store_url);
    }

    /// Registers `count` batches `B0001`.. each with a successful `Data_Received`: ready for the probe.
    pub fn register(&self, count: usize) -> Vec<BatchId> {
        (1..=count)
            .map(|n| {
                let id = format!("B{n:04}");
                self.register_one(&id, true);
                BatchId::new(id).unwrap()
            })
            .collect()
    }

    /// Registers one batch, with a successful `Data_Received` or without any event.
    pub fn register_one(&self, id: &str, received: bool) -> BatchId {
        let id = BatchId::new(id).expect("a valid batch id");
        let location = self.path("incoming").join(id.as_str());
        let new = NewBatch::new(id.clone(), BatchType::new("RoundTrip").unwrap())
            .with_location(location.display().to_string());
        self.block_on(self.store.create_batch(new)).expect("batch registered");
        if received {
            let agent = Agent::new("batch-trigger/test@localhost#1").unwrap();
            let event = NewEvent::new(EventType::new(DATA_RECEIVED).unwrap(), Outcome::Success, agent);
            self.block_on(self.store.append_event(&id, event)).expect("Data_Received recorded");
        }
        id
    }

    /// The probe binary with `--config-dir` and `args`, stdout and stderr piped, and none of
    /// the environment that would change what it does (`without_pipeline_env`) but the test
    /// services' token.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(&self.probe);
        command.arg("--config-dir").arg(self.config_dir()).args(args);
        // What the test services accept; the embedded backends ignore it.
        without_pipeline_env(&mut command).env("AUTOCOMP_TOKEN", services::TOKEN);
        command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        command
    }

    pub fn spawn(&self, args: &[&str]) -> Child {
        self.command(args).spawn().expect("the probe starts")
    }

    /// The operator's CLI, `autocomp --config-dir ... --as ann ARGS`, without the
    /// environment that would change what it does; at most 60 s.
    pub fn autocomp(&self, args: &[&str]) -> Finished {
        let mut command = Command::new(binary("autocomp"));
        command.arg("--config-dir").arg(self.config_dir()).args(["--as", "ann"]).args(args);
        without_pipeline_env(&mut command).env("AUTOCOMP_TOKEN", services::TOKEN);
        command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        finish(command.spawn().expect("autocomp starts"), Duration::from_secs(60))
    }

    /// One pass of the probe, as cron would start it; at most 30 s.
    pub fn run(&self, args: &[&str]) -> Finished {
        finish(self.spawn(args), Duration::from_secs(30))
    }

    pub fn batch(&self, id: &BatchId) -> Batch {
        self.block_on(self.store.get_batch(id)).expect("batch readable")
    }

    /// The batch's events of `event_type`, in seq order.
    pub fn events(&self, id: &BatchId, event_type: &str) -> Vec<Event> {
        self.batch(id).events.into_iter().filter(|e| e.event_type.as_str() == event_type).collect()
    }

    pub fn all_batches(&self) -> Vec<Batch> {
        self.block_on(self.store.list_batches(None, 10_000)).expect("batches listed")
    }

    pub fn open_runs(&self) -> Vec<Run> {
        self.block_on(self.store.open_runs(None)).expect("open runs readable")
    }

    /// Abandoned or transient runs of the probe on `id`, over the batch's whole history.
    pub fn failed_attempts(&self, id: &BatchId) -> u32 {
        let component = ComponentName::new(PROBE_NAME).unwrap();
        self.block_on(self.store.failed_attempts(id, &component, Seq::ZERO)).expect("attempts readable")
    }

    pub fn head(&self) -> Seq {
        self.block_on(self.store.head()).expect("head readable")
    }

    /// Every file (not directory) under `locks/`: a lock file left behind.
    pub fn lock_files(&self) -> Vec<PathBuf> {
        let mut files = Vec::new();
        let mut pending = vec![self.path("locks")];
        while let Some(dir) = pending.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else { continue };
            for entry in entries.flatten() {
                let path = entry.path();
                if path.is_dir() {
                    pending.push(path);
                } else {
                    files.push(path);
                }
            }
        }
        files
    }
}

/// Opens the store `url` names; a plain `sqlite://` file also as a `SqliteStore`.
fn open(runtime: &tokio::runtime::Runtime, url: &str) -> (Arc<dyn ObjectStore>, Option<SqliteStore>) {
    if let Some(path) = url.strip_prefix("sqlite://").filter(|path| !path.contains('?')) {
        let store = runtime.block_on(SqliteStore::open(path)).expect("store opens");
        return (Arc::new(store.clone()), Some(store));
    }
    let store = runtime
        .block_on(open_store(url))
        .unwrap_or_else(|e| panic!("the store {} opens: {e}", autocomp_toolkit::display_url(url)));
    (store, None)
}

/// One line of the probe component's ledger: `pid batch start_ns end_ns`, written after each
/// batch's work, so tests can check exactly-once and non-overlap from outside the processes.
#[derive(Debug, Clone)]
pub struct LedgerEntry {
    pub pid: u32,
    pub batch: String,
    pub start: u128,
    pub end: u128,
}

impl Pipeline {
    /// The probe's ledger (`ledger.txt` in the pipeline dir), in the order it was written.
    pub fn ledger(&self) -> Vec<LedgerEntry> {
        let text = std::fs::read_to_string(self.path("ledger.txt")).unwrap_or_default();
        text.lines()
            .map(|line| {
                let parts: Vec<&str> = line.split(' ').collect();
                assert_eq!(parts.len(), 4, "bad ledger line {line:?}");
                LedgerEntry {
                    pid: parts[0].parse().unwrap(),
                    batch: parts[1].to_owned(),
                    start: parts[2].parse().unwrap(),
                    end: parts[3].parse().unwrap(),
                }
            })
            .collect()
    }
}

/// The most ledger entries whose work ran at once (intervals from start to end; one that
/// ends as another starts does not overlap it).
pub fn max_concurrency(ledger: &[LedgerEntry]) -> usize {
    // Ends sort before starts at the same instant: (time, 0) for an end, (time, 1) for a start.
    let mut edges: Vec<(u128, u8)> = ledger.iter().flat_map(|e| [(e.start, 1), (e.end, 0)]).collect();
    edges.sort();
    let (mut open, mut most) = (0usize, 0usize);
    for (_, start) in edges {
        if start == 1 {
            open += 1;
            most = most.max(open);
        } else {
            open -= 1;
        }
    }
    most
}

impl Pipeline {
    /// Applies a steering change as an operator would (`operator:tester`), through the store
    /// port, as `autocomp pause` and the others do; panics if the store refuses it.
    pub fn steer(&self, change: autocomp_model::SteeringChange) -> autocomp_store::Steered {
        let request = autocomp_model::SteeringRequest {
            change,
            by: Agent::new("operator:tester").unwrap(),
            reason: "steered by the test".into(),
            expect_version: None,
        };
        self.block_on(self.store.steer(request)).expect("the store takes the steering change")
    }

    /// The pipeline's steering state as the store holds it.
    pub fn steering(&self) -> autocomp_model::Steering {
        self.block_on(self.store.steering()).expect("steering readable")
    }

    /// The probe's registry entry: its hosts' last passes.
    pub fn probe_registered(&self) -> Option<autocomp_model::RegisteredComponent> {
        let components = self.block_on(self.store.components()).expect("registry readable");
        components.into_iter().find(|c| c.name().as_str() == PROBE_NAME)
    }
}

/// Groups ledger entries by batch, asserting that no two intervals of one batch overlap.
pub fn disjoint_by_batch(ledger: &[LedgerEntry]) -> std::collections::BTreeMap<String, Vec<LedgerEntry>> {
    let mut by_batch: std::collections::BTreeMap<String, Vec<LedgerEntry>> = Default::default();
    for entry in ledger {
        by_batch.entry(entry.batch.clone()).or_default().push(entry.clone());
    }
    for (batch, entries) in &mut by_batch {
        entries.sort_by_key(|e| e.start);
        for pair in entries.windows(2) {
            assert!(pair[1].start >= pair[0].end, "work on {batch} overlapped: {pair:?}");
        }
    }
    by_batch
}

/// Waits (at most 30 s) until `condition` holds while the probe `child` still runs; kills it
/// and fails the test if it exits first or the condition never holds.
pub fn wait_while_running(child: &mut Child, what: &str, mut condition: impl FnMut() -> bool) {
    let held = wait_until(Instant::now() + Duration::from_secs(30), || {
        assert!(child.try_wait().unwrap().is_none(), "the probe exited before {what}");
        condition()
    });
    if !held {
        child.kill().ok();
        child.wait().ok();
        panic!("the probe never got to {what}");
    }
}

/// `(batch, pid)` of every batch whose work began (the probe's `started` setting writes a
/// file per batch holding the pid working it), sorted.
pub fn started(dir: &std::path::Path) -> Vec<(String, u32)> {
    let mut found: Vec<(String, u32)> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| {
            let e = e.ok()?;
            let pid = std::fs::read_to_string(e.path()).ok()?.trim().parse().ok()?;
            Some((e.file_name().into_string().ok()?, pid))
        })
        .collect();
    found.sort();
    found
}
