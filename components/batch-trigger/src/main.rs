//! `batch-trigger`, the pipeline's source: registers each settled delivery folder in the
//! incoming directory as a batch with a `Data_Received` event, and a re-delivered one as a
//! content change, as a `Source`: this file owns the decisions (the SDK's `source_main` the
//! command line, config, poll lock and registry report); `scan` reads folders, `pattern` names.

mod pattern;
mod scan;

use std::io::{Write as _, stdout};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime};

use autocomp_framework::exit::RunError;
use autocomp_framework::{
    Batch, BatchId, BatchType, CreateOutcome, EventType, IdempotencyKey, NewBatch, NewEvent, Outcome, Report,
    SettingError, Source, SourceContext, StoreError, duration_text, for_terminal, source_main,
};
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

/// The pipeline's source: registers settled delivery folders as batches.
struct BatchTrigger;

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

/// Settings checked and compiled.
struct Plan {
    incoming: PathBuf,
    pattern: NamePattern,
    marker: Option<NamePattern>,
    settle_for: Duration,
    batch_type: BatchType,
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
    /// Delivered again, but its history was pruned (the export that restores it): nothing is
    /// recorded until an import brings it back.
    Pruned(String),
}

impl Source for BatchTrigger {
    type Settings = Settings;
    type Plan = Plan;

    fn name(&self) -> &str {
        NAME
    }
    fn version(&self) -> &str {
        VERSION
    }
    fn event_type(&self) -> &str {
        EVENT_TYPE
    }
    fn about(&self) -> String {
        "The pipeline's source: registers settled delivery folders as batches (Data_Received).".into()
    }
    fn help(&self) -> &str {
        AFTER_HELP
    }
    fn pass_summary(&self, problems: usize) -> String {
        match problems {
            0 => "scanned".into(),
            n => format!("{n} deliveries with problems"),
        }
    }

    fn plan(&self, settings: Settings) -> Result<Plan, SettingError> {
        let pattern = NamePattern::parse(&settings.pattern).map_err(|e| SettingError::new("pattern", e))?;
        let marker = match settings.marker.as_str() {
            "" => None,
            text => Some(NamePattern::parse(text).map_err(|e| SettingError::new("marker", e))?),
        };
        let incoming = std::path::absolute(&settings.incoming)
            .map_err(|e| SettingError::new("incoming", format!("{}: {e}", settings.incoming.display())))?;
        Ok(Plan { incoming, pattern, marker, settle_for: settings.settle_for, batch_type: settings.batch_type })
    }

    async fn pass(&self, plan: &Plan, context: &mut SourceContext<'_>) -> Result<(), RunError> {
        Scanner { plan, context }.pass().await
    }
}

fn main() -> ExitCode {
    source_main(BatchTrigger)
}

struct Scanner<'a, 'c> {
    plan: &'a Plan,
    context: &'a mut SourceContext<'c>,
}

impl Scanner<'_, '_> {
    async fn pass(&mut self) -> Result<(), RunError> {
        let folders = self.folders()?;
        if folders.is_empty() {
            return Ok(());
        }
        let ids: Vec<BatchId> = folders.iter().map(|f| f.id.clone()).collect();
        let known = self.context.known(&ids).await?;
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
            if self.context.dry_run() {
                // Best effort: a closed stdout (`| head`) must not panic the pass.
                if let Err(e) = writeln!(stdout().lock(), "{}", for_terminal(&dry_run_line(&folder, &scan, &action))) {
                    debug!("cannot print the dry-run line: {e}");
                }
                continue;
            }
            if !matches!(action, Action::Unchanged | Action::Waiting(_)) {
                self.context.ensure_lock_held().await?;
            }
            if let Err(e) = self.act(&folder, batch, &scan, action, started).await {
                if e.is_unavailable() {
                    return Err(e.into());
                }
                self.problem(format!("cannot register {}: {e}", folder.path.display()));
            }
        }
        Ok(())
    }

    fn problem(&mut self, message: String) {
        self.context.problem(message);
    }

    /// The batch folders in `incoming`, sorted by name. Folders that match the pattern but
    /// are not valid batch ids are reported and skipped; anything else is left alone.
    fn folders(&mut self) -> Result<Vec<Folder>, RunError> {
        let incoming = &self.plan.incoming;
        if let Some(id) = self.context.only() {
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
        let settled = if self.context.force() { Ok(Settled::Forced) } else { scan.settled(now, self.plan.settle_for) };
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
        if previous != Some(&scan.fingerprint())
            && let Some(marker) = batch.effective().get(&EventType::history_pruned())
        {
            let export =
                marker.details.get("restore").and_then(Value::as_str).unwrap_or("autocomp import (its export)");
            return Action::Pruned(export.to_owned());
        }
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
        let (line, event, key) = match action {
            Action::Unchanged => return Ok(()),
            Action::Waiting(why) => {
                info!(batch = %folder.id, "waiting: {why}");
                return Ok(());
            }
            Action::Pruned(restore) => {
                warn!(batch = %folder.id, "delivered again, but its history was pruned: `{restore}` first; nothing recorded");
                return Ok(());
            }
            Action::Register(settled) => {
                let mut new = NewBatch::new(folder.id.clone(), self.plan.batch_type.clone()).with_location(&location);
                new.metadata[FINGERPRINT] = scan.fingerprint();
                let line = format!("{} registered: {} ({settled})", folder.id, describe(scan, &location));
                let event = self.received(scan, &location, json!({ "settled": settled.to_string() }), started);
                // The batch and its delivery in one commit. Answered as it stands: a batch this
                // very call registered before its answer was lost (the store sends it again),
                // or one registered by hand, with its delivery (its line is printed: the
                // delivery is recorded) or without it (recorded now).
                match self.context.register_batch(new, event.clone()).await? {
                    CreateOutcome::Created(_) => {}
                    CreateOutcome::AlreadyExists(existing) if received_since_last_change(&existing) => {
                        debug!(batch = %folder.id, "registered already, with its delivery; nothing more to record");
                    }
                    CreateOutcome::AlreadyExists(existing) => {
                        self.context
                            .append_event(&folder.id, event.with_idempotency_key(received_key(&existing)))
                            .await?;
                    }
                }
                print_line(&folder.id, &line);
                return Ok(());
            }
            Action::Receive => {
                let batch = batch.expect("only a known batch is received again");
                let line = format!("{} registered: {}", folder.id, describe(scan, &location));
                (line, self.received(scan, &location, json!({}), started), received_key(batch))
            }
            Action::Redeliver { settled, previous } => {
                let (line, details, key) = self.redeliver(folder, scan, settled, previous).await?;
                (line, self.received(scan, &location, details, started), key)
            }
        };
        self.context.append_event(&folder.id, event.with_idempotency_key(key)).await?;
        print_line(&folder.id, &line);
        Ok(())
    }

    /// The `Data_Received` event of a delivery: its report, the scan's figures and `details`.
    fn received(&self, scan: &FolderScan, location: &str, details: Value, started: Instant) -> NewEvent {
        let mut report = Report::new(self.context.failures_cap());
        report.duration_ms = started.elapsed().as_millis() as u64;
        report.summary = format!("received {}", describe(scan, location));
        let mut full = report.to_details();
        let extra = json!({ "files": scan.files, "bytes": scan.bytes, "location": location, "fingerprint": scan.fingerprint() });
        for (key, value) in extra.as_object().into_iter().flatten().chain(details.as_object().into_iter().flatten()) {
            full[key] = value.clone();
        }
        NewEvent::new(event_type(), Outcome::Success, self.context.agent().clone()).with_details(full)
    }

    /// Records the new content of a known batch (its fingerprint and location): the line,
    /// the event's details and its idempotency key (the change's own seq).
    async fn redeliver(
        &self,
        folder: &Folder,
        scan: &FolderScan,
        settled: Settled,
        previous: Option<Value>,
    ) -> Result<(String, Value, IdempotencyKey), StoreError> {
        let location = folder.path.display().to_string();
        let mut patch = Map::new();
        patch.insert(FINGERPRINT.into(), scan.fingerprint());
        patch.insert("location".into(), Value::String(location.clone()));
        let seq = self.context.record_content_change(&folder.id, patch).await?;
        let what = describe(scan, &location);
        // Without a fingerprint the batch was registered by hand (`autocomp add`)
        // before its files arrived: this is its first delivery.
        let line = match &previous {
            Some(p) => format!(
                "{} re-delivered: {what} ({settled}; was {} files, {} bytes)",
                folder.id, p["files"], p["bytes"]
            ),
            None => format!("{} registered: {what} ({settled}; the batch existed without a delivery)", folder.id),
        };
        let details = json!({ "settled": settled.to_string(), "redelivery": previous.is_some(), "previous": previous });
        Ok((line, details, IdempotencyKey::new(format!("{NAME}.{seq}.{seq}")).expect("a valid key")))
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

/// The pass's line about a delivery recorded, on stdout, neutralized for a terminal.
fn print_line(batch: &BatchId, line: &str) {
    // Best effort: the event is recorded; a closed stdout must not panic the pass.
    if let Err(e) = writeln!(stdout().lock(), "{}", for_terminal(line)) {
        debug!(%batch, "cannot print the result line: {e}");
    }
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
        Action::Pruned(restore) => format!("{id} delivered again, but its history was pruned: `{restore}` first"),
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
