//! `batch-trigger`, the pipeline's source: registers each settled delivery folder in the
//! incoming directory as a batch with a `Data_Received` event, and a re-delivered one as a
//! content change. Owns the CLI, config and decisions; `scan` reads folders, `pattern` names.

mod pattern;
mod scan;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime};

use autocomp_framework::cli::{self, RunnerArgs};
use autocomp_framework::config::{self, Backends, ConfigError};
use autocomp_framework::exit::{self, EXIT_CODES_HELP, RunError};
use autocomp_framework::locks::{Lock, LockHolder, LockPath, open_locks};
use autocomp_framework::runner::Identity;
use autocomp_framework::{
    Batch, BatchId, BatchType, ComponentDescriptor, ComponentName, EventType, Outcome, Report, Timestamp, Trigger,
    duration_text,
};
// A scanner is not a trigger-driven `Component`: it writes to the store itself, through the
// port the framework's runner uses.
use autocomp_store::{
    IdempotencyKey, NewBatch, NewEvent, ObjectStore, PassOutcome, PassPhase, PassRecord, StoreError, open_store,
};
use clap::Parser;
use serde::Deserialize;
use serde_json::{Map, Value, json};
use tracing::{debug, info, warn};

use crate::pattern::NamePattern;
use crate::scan::{FolderScan, Settled, whole_seconds};

const NAME: &str = "batch-trigger";
const VERSION: &str = env!("CARGO_PKG_VERSION");
const EVENT_TYPE: &str = "Data_Received";
/// The batch metadata key holding the registered delivery's fingerprint.
const FINGERPRINT: &str = "fingerprint";

const AFTER_HELP: &str = "Scans [settings] incoming for folders matching `pattern` (default \
B<digits>-RT<digits>; <digits>, <letters>, <alnum> match one or more of that class, * anything). \
A folder is registered once settled: its completion `marker` (default tagmanifest-*.txt, \
written last) is present, or nothing inside changed for `settle_for` (default 60s). A folder \
whose content changed after registration is recorded as a re-delivery. --batch ID considers \
only that folder, whatever the pattern; --force registers it unsettled; --dry-run lists what \
would be done. Quiet when idle; one line per registered or re-delivered batch.\n\n";

#[derive(Debug, Parser)]
#[command(
    name = NAME,
    version,
    about = "The pipeline's source: registers settled delivery folders as batches (Data_Received).",
    after_help = format!("{AFTER_HELP}{EXIT_CODES_HELP}")
)]
struct TriggerCli {
    #[command(flatten)]
    runner: RunnerArgs,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Settings {
    /// Where deliveries arrive, one folder per batch.
    incoming: PathBuf,
    /// Which folder names are batches.
    #[serde(default = "default_pattern")]
    pattern: String,
    /// A folder with no change inside for this long is complete.
    #[serde(default = "default_settle_for", with = "duration_text")]
    settle_for: Duration,
    /// A top-level file whose presence (written last) marks a complete delivery; "" for none.
    #[serde(default = "default_marker")]
    marker: String,
    #[serde(default = "default_batch_type")]
    batch_type: BatchType,
}

fn default_pattern() -> String {
    "B<digits>-RT<digits>".into()
}
fn default_settle_for() -> Duration {
    Duration::from_secs(60)
}
fn default_marker() -> String {
    "tagmanifest-*.txt".into()
}
fn default_batch_type() -> BatchType {
    BatchType::new("RoundTrip").expect("a valid batch type")
}

/// Settings checked and compiled, plus what the command line adds.
struct Plan {
    incoming: PathBuf,
    pattern: NamePattern,
    marker: Option<NamePattern>,
    settle_for: Duration,
    batch_type: BatchType,
    only: Option<BatchId>,
    force: bool,
    failures_cap: usize,
}

impl Plan {
    fn new(settings: Settings, args: &RunnerArgs, failures_cap: usize, file: &Path) -> Result<Self, RunError> {
        let bad = |key: &str, message: String| ConfigError::new(file, format!("[settings] {key}: {message}"));
        let pattern = NamePattern::parse(&settings.pattern).map_err(|e| bad("pattern", e))?;
        let marker = match settings.marker.as_str() {
            "" => None,
            text => Some(NamePattern::parse(text).map_err(|e| bad("marker", e))?),
        };
        let incoming = std::path::absolute(&settings.incoming)
            .map_err(|e| bad("incoming", format!("{}: {e}", settings.incoming.display())))?;
        let only = match &args.batch {
            Some(id) => Some(BatchId::new(id.as_str()).map_err(|e| RunError::Usage(e.to_string()))?),
            None => None,
        };
        Ok(Self {
            incoming,
            pattern,
            marker,
            settle_for: settings.settle_for,
            batch_type: settings.batch_type,
            only,
            force: args.force,
            failures_cap,
        })
    }
}

/// A folder that is (or will be) a batch.
struct Folder {
    id: BatchId,
    path: PathBuf,
}

/// What to do with one folder, decided from its scan and the store.
enum Action {
    Register(Settled),
    /// Registered, but its `Data_Received` for the current content is missing (a crash
    /// between the two writes, or an operator reset it to rerun batch-trigger).
    Receive,
    Redeliver {
        settled: Settled,
        previous: Option<Value>,
    },
    Unchanged,
    Waiting(String),
}

fn main() -> ExitCode {
    let cli = TriggerCli::parse();
    cli::init_logging(cli.runner.verbose, cli.runner.log_format);
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("{NAME}: cannot start the async runtime: {e}");
            return ExitCode::from(exit::FAILED);
        }
    };
    let code = match runtime.block_on(run(cli.runner)) {
        Ok(code) => code,
        Err(RunError::PollLockBusy(_)) => {
            // The previous scan is still running: normal under cron, so stay quiet.
            info!("poll lock of {NAME} busy; another scan is running");
            exit::POLL_LOCK_BUSY
        }
        Err(e) => {
            eprintln!("{NAME}: {e}");
            e.code()
        }
    };
    ExitCode::from(code)
}

async fn run(args: RunnerArgs) -> Result<u8, RunError> {
    for (given, flag) in [(args.schedule.is_some(), "--schedule"), (args.watch, "--watch")] {
        if given {
            return Err(RunError::Usage(format!(
                "{NAME} does not take {flag}: it is a scanner, not a trigger-driven component; run it from cron"
            )));
        }
    }
    let loaded = config::load(NAME, args.config.as_deref(), &args.config_dir)?;
    if let Some(configured) = loaded.component.event_type.as_deref().filter(|t| *t != EVENT_TYPE) {
        let message = format!("event_type = {configured:?}, but {NAME} records {EVENT_TYPE}");
        return Err(ConfigError::new(&loaded.file, message).into());
    }
    if !loaded.component.trigger.is_empty() {
        let message = format!("[trigger]: {NAME} scans a directory and has no trigger; remove the table");
        return Err(ConfigError::new(&loaded.file, message).into());
    }
    let settings: Settings = config::settings(&loaded.component.settings, &loaded.file)?;
    let plan = Plan::new(settings, &args, loaded.component.max_reported_failures, &loaded.file)?;
    let flags = Backends { store: args.store.clone(), index: args.index.clone(), locks: args.locks.clone() };
    let backends = loaded.backends.clone().overridden_by(flags);
    let store_url = required(backends.store, "store", "AUTOCOMP_STORE", &loaded.shared_file)?;
    let identity = Identity::of(NAME, VERSION)?;

    if args.dry_run {
        // Touches nothing: no lock, no write.
        let store = open_store(&store_url).await?;
        let mut scanner = Scanner { plan: &plan, store: store.as_ref(), identity: &identity, lock: None, problems: 0 };
        scanner.pass().await?;
        return Ok(if scanner.problems > 0 { exit::FAILED } else { exit::OK });
    }
    let locks_url = required(backends.locks, "locks", "AUTOCOMP_LOCKS", &loaded.shared_file)?;
    let locks = open_locks(&locks_url).await?;
    let name = ComponentName::new(NAME).expect("a valid component name");
    let holder = LockHolder {
        agent: identity.agent.to_string(),
        host: identity.host.clone(),
        pid: identity.pid,
        since: Timestamp::now(),
    };
    let lock = match locks.try_lock(&LockPath::Poll(name), &holder, loaded.component.poll_lock_timeout).await {
        Ok(Some(lock)) => lock,
        not_taken => {
            locks.close().await;
            not_taken?;
            return Err(RunError::PollLockBusy(NAME.into()));
        }
    };
    let started = std::time::Instant::now();
    let store = open_store(&store_url).await;
    let outcome = match store {
        Ok(store) => {
            let mut scanner = Scanner {
                plan: &plan,
                store: store.as_ref(),
                identity: &identity,
                lock: Some(lock.as_ref()),
                problems: 0,
            };
            let scanned = scanner.pass().await.map(|()| scanner.problems);
            match register(store.as_ref(), &loaded.component, &identity, &scanned, started).await {
                Ok(()) => scanned,
                Err(refused) => Err(refused),
            }
        }
        Err(e) => Err(e.into()),
    };
    if let Err(e) = lock.release().await {
        warn!("cannot release the poll lock: {e}");
    }
    locks.close().await;
    let problems = outcome?;
    Ok(if problems > 0 { exit::FAILED } else { exit::OK })
}

/// Reports the pass to the component registry as a source of `Data_Received`, so the
/// pipeline's readers know where that type comes from.
async fn register(
    store: &dyn ObjectStore,
    config: &config::ComponentConfig,
    identity: &Identity,
    scanned: &Result<usize, RunError>,
    started: std::time::Instant,
) -> Result<(), RunError> {
    let descriptor = ComponentDescriptor {
        name: ComponentName::new(NAME).expect("a valid component name"),
        version: VERSION.to_owned(),
        event_type: EventType::new(EVENT_TYPE).expect("a valid event type"),
        trigger: Trigger::default(),
        max_attempts: config.max_attempts,
        retry_backoff: config.retry_backoff,
        queue_size: config.queue_size,
        max_runtime: config.max_runtime,
        source: true,
        overdue_after: None,
        silent_after: config.silent_after,
        schedule: config.schedule.clone(),
    };
    let (outcome, summary) = match scanned {
        Ok(0) => (PassOutcome::Ok, "scanned".to_owned()),
        Ok(problems) => (PassOutcome::Failed, format!("{problems} deliveries with problems")),
        Err(e) => (PassOutcome::Error, e.to_string()),
    };
    let phase = PassPhase::Ended { outcome, summary, duration_ms: started.elapsed().as_millis() as u64, work: vec![] };
    match store.record_pass(PassRecord { descriptor, host: identity.host.clone(), phase }).await {
        Ok(()) => Ok(()),
        Err(StoreError::Conflict(message)) => Err(RunError::Usage(message)),
        Err(e) => {
            warn!("cannot report the pass to the component registry: {e}");
            Ok(())
        }
    }
}

/// Like `Backends::require`, for the two backends a scanner needs (it never asks the index).
fn required(url: Option<String>, key: &str, env: &str, shared_file: &Path) -> Result<String, ConfigError> {
    url.ok_or_else(|| {
        ConfigError::new(
            shared_file,
            format!("no {key} backend configured: set `{key} = \"...\"` here, ${env}, or --{key}"),
        )
    })
}

struct Scanner<'a> {
    plan: &'a Plan,
    store: &'a dyn ObjectStore,
    identity: &'a Identity,
    /// The poll lock; `None` in a dry run, which writes nothing.
    lock: Option<&'a dyn Lock>,
    /// Folders refused or that could not be handled; they make the exit code 1.
    problems: usize,
}

impl Scanner<'_> {
    async fn pass(&mut self) -> Result<(), RunError> {
        let folders = self.folders()?;
        if folders.is_empty() {
            return Ok(());
        }
        let ids: Vec<BatchId> = folders.iter().map(|f| f.id.clone()).collect();
        let known: HashMap<BatchId, Batch> =
            self.store.get_batches(&ids).await?.into_iter().map(|b| (b.id.clone(), b)).collect();
        let now = SystemTime::now();
        for folder in folders {
            let started = Instant::now();
            let scan = match FolderScan::of(&folder.path, self.plan.marker.as_ref()) {
                Ok(scan) => scan,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    debug!(folder = %folder.path.display(), "changed while scanning; next time");
                    continue;
                }
                Err(e) => {
                    self.problem(format!("cannot scan {}: {e}", folder.path.display()));
                    continue;
                }
            };
            let batch = known.get(&folder.id);
            let action = self.decide(batch, &scan, now);
            match self.lock {
                None => println!("{}", dry_run_line(&folder, &scan, &action)),
                Some(lock) => {
                    if !matches!(action, Action::Unchanged | Action::Waiting(_)) && !lock.still_held().await? {
                        return Err(RunError::LocksLost(format!("the poll lock of {NAME} was lost")));
                    }
                    if let Err(e) = self.act(&folder, batch, &scan, action, started).await {
                        if matches!(e, StoreError::Unavailable(_)) {
                            return Err(e.into());
                        }
                        self.problem(format!("cannot register {}: {e}", folder.path.display()));
                    }
                }
            }
        }
        Ok(())
    }

    fn problem(&mut self, message: String) {
        eprintln!("{NAME}: {message}");
        self.problems += 1;
    }

    /// The batch folders in `incoming`, sorted by name. Folders that match the pattern but
    /// are not valid batch ids are reported and skipped; anything else is left alone.
    fn folders(&mut self) -> Result<Vec<Folder>, RunError> {
        let incoming = &self.plan.incoming;
        if let Some(id) = &self.plan.only {
            let path = incoming.join(id.as_str());
            if !path.is_dir() {
                return Err(RunError::Usage(format!("--batch {id}: no folder {}", path.display())));
            }
            return Ok(vec![Folder { id: id.clone(), path }]);
        }
        let entries = std::fs::read_dir(incoming)
            .map_err(|e| RunError::Usage(format!("incoming directory {}: {e}", incoming.display())))?;
        let mut folders = Vec::new();
        for entry in entries {
            let entry =
                entry.map_err(|e| RunError::Usage(format!("incoming directory {}: {e}", incoming.display())))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = entry.path();
            // Deliveries may be symlinked in, so follow a link at the top level.
            if !path.is_dir() || !self.plan.pattern.matches(&name) {
                continue;
            }
            match BatchId::new(name.as_str()) {
                Ok(id) => folders.push(Folder { id, path }),
                Err(e) => self.problem(format!("skipping folder {}: {e}", path.display())),
            }
        }
        folders.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(folders)
    }

    fn decide(&self, batch: Option<&Batch>, scan: &FolderScan, now: SystemTime) -> Action {
        if scan.files == 0 {
            // A delivery that has created its folder but not yet its files.
            return Action::Waiting("the folder is empty".into());
        }
        let settled = if self.plan.force { Ok(Settled::Forced) } else { scan.settled(now, self.plan.settle_for) };
        let waiting = |quiet: Duration| {
            let marker = match &self.plan.marker {
                Some(marker) => format!(", no {marker} written last"),
                None => String::new(),
            };
            Action::Waiting(format!(
                "last change {} ago, settle_for {}{marker}",
                whole_seconds(quiet),
                humantime::format_duration(self.plan.settle_for)
            ))
        };
        let Some(batch) = batch else {
            return settled.map_or_else(waiting, Action::Register);
        };
        let previous = batch.metadata.get(FINGERPRINT);
        if previous == Some(&scan.fingerprint()) {
            return if received_since_last_change(batch) { Action::Unchanged } else { Action::Receive };
        }
        match settled {
            Ok(settled) => Action::Redeliver { settled, previous: previous.cloned() },
            Err(quiet) => waiting(quiet),
        }
    }

    async fn act(
        &self,
        folder: &Folder,
        batch: Option<&Batch>,
        scan: &FolderScan,
        action: Action,
        started: Instant,
    ) -> Result<(), StoreError> {
        let location = folder.path.display().to_string();
        let (line, details, key) = match action {
            Action::Unchanged => return Ok(()),
            Action::Waiting(why) => {
                info!(batch = %folder.id, "waiting: {why}");
                return Ok(());
            }
            Action::Register(settled) => {
                let mut new = NewBatch::new(folder.id.clone(), self.plan.batch_type.clone()).with_location(&location);
                new.metadata[FINGERPRINT] = scan.fingerprint();
                let created = self.store.create_batch(new).await?;
                let line = format!("{} registered: {} ({settled})", folder.id, describe(scan, &location));
                (line, json!({ "settled": settled.to_string() }), received_key(created.batch()))
            }
            Action::Receive => {
                let batch = batch.expect("only a known batch is received again");
                let line = format!("{} registered: {}", folder.id, describe(scan, &location));
                (line, json!({}), received_key(batch))
            }
            Action::Redeliver { settled, previous } => {
                let mut patch = Map::new();
                patch.insert(FINGERPRINT.into(), scan.fingerprint());
                patch.insert("location".into(), Value::String(location.clone()));
                let seq = self.store.record_content_change(&folder.id, patch).await?;
                let what = describe(scan, &location);
                // Without a fingerprint the batch was registered by hand (`autocomp add`)
                // before its files arrived: this is its first delivery.
                let line = match &previous {
                    Some(p) => format!(
                        "{} re-delivered: {what} ({settled}; was {} files, {} bytes)",
                        folder.id, p["files"], p["bytes"]
                    ),
                    None => {
                        format!("{} registered: {what} ({settled}; the batch existed without a delivery)", folder.id)
                    }
                };
                let details =
                    json!({ "settled": settled.to_string(), "redelivery": previous.is_some(), "previous": previous });
                (line, details, IdempotencyKey::new(format!("{NAME}.{seq}.{seq}")).expect("a valid key"))
            }
        };
        let mut report = Report::new(self.plan.failures_cap);
        report.duration_ms = started.elapsed().as_millis() as u64;
        report.summary = format!("received {}", describe(scan, &location));
        let mut full = report.to_details();
        let extra = json!({ "files": scan.files, "bytes": scan.bytes, "location": location, "fingerprint": scan.fingerprint() });
        for (key, value) in extra.as_object().into_iter().flatten().chain(details.as_object().into_iter().flatten()) {
            full[key] = value.clone();
        }
        let event = NewEvent::new(event_type(), Outcome::Success, self.identity.agent.clone())
            .with_details(full)
            .with_idempotency_key(key);
        self.store.append_event(&folder.id, event).await?;
        println!("{line}");
        Ok(())
    }
}

fn event_type() -> EventType {
    EventType::new(EVENT_TYPE).expect("a valid event type")
}

/// Whether the effective `Data_Received` (any outcome) postdates the last content change.
fn received_since_last_change(batch: &Batch) -> bool {
    batch.effective().get(&event_type()).is_some_and(|event| event.seq > batch.modified_seq)
}

/// One `Data_Received` per state of the batch: a retried write of the same state (or a
/// second scanner whose lock service failed it) cannot record it twice. Seqs are
/// store-wide, so the key is unique without the batch id.
fn received_key(batch: &Batch) -> IdempotencyKey {
    IdempotencyKey::new(format!("{NAME}.{}.{}", batch.modified_seq, batch.changed_seq)).expect("a valid key")
}

fn describe(scan: &FolderScan, location: &str) -> String {
    format!("{} files, {} at {location}", scan.files, human_bytes(scan.bytes))
}

fn dry_run_line(folder: &Folder, scan: &FolderScan, action: &Action) -> String {
    let id = &folder.id;
    let what = describe(scan, &folder.path.display().to_string());
    match action {
        Action::Register(settled) => format!("{id} would register: {what} ({settled})"),
        Action::Receive => format!("{id} would record its missing {EVENT_TYPE}: {what}"),
        Action::Redeliver { settled, .. } => format!("{id} would record a re-delivery: {what} ({settled})"),
        Action::Unchanged => format!("{id} registered, unchanged"),
        Action::Waiting(why) => format!("{id} waiting: {why}"),
    }
}

fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_like_sizes() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(3 << 30), "3.0 GiB");
    }
}
