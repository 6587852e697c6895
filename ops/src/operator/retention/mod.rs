//! `autocomp prune --policy FILE` and `autocomp import FILE...`: finished batches' histories
//! leave the store once exported and verified, and come back from the export.
//!
//! A prune reads the policy (`policy`), finds the finished batches due under it, reads their
//! whole histories a page at a time and writes them to export files (`archive`), reads every
//! file back and checks it, writes the run's manifest, and only then prunes the batches in
//! transactions of `PRUNE_PAGE` each, `PRUNE_PAUSE` apart, while passes go on: a batch that changed since its export
//! read it is left (counted `moved`) for the next run. A pruned batch keeps its effective
//! events and a `History_Pruned` event naming its export file and its line's digest.
//!
//! An import reads an export file and puts back the history of each batch whose
//! `History_Pruned` event names that line's digest; any other line is left and counted. Lines
//! go to the store in pages sent before a line would take them past `RESTORE_BYTES`; over the
//! store service, a line alone over its request limit (4 MiB) is left too, naming the batch
//! and its size: the store's own URL, on a host that reaches it, imports that line.

mod archive;
mod policy;

use std::path::{Path, PathBuf};

use autocomp_model::{Agent, BatchId, BatchSummary, EventType, InvalidInput, NewEvent, Outcome, Seq};
use autocomp_store::{BatchHistory, ObjectStore, PruneAnswer, PruneTicket, RestoreAnswer};
use serde::Serialize;
use serde_json::json;

pub use archive::{ExportFile, Manifest, digest};
pub use policy::{RetentionPolicy, TypePolicy};

use super::views::{Format, PAGE, render_as, size_text};
use super::{Operator, OperatorError};
use autocomp_toolkit::terminal::one_line;

/// Batches per prune transaction, and the pause between two: passes go on meanwhile. On
/// SQLite a pass waiting for the write lock sleeps in growing steps (up to 100 ms) and found
/// the next transaction holding it every time when they followed at once: passes waited
/// seconds (BENCHMARKS.md, Retention).
const PRUNE_PAGE: usize = 200;
const PRUNE_PAUSE: std::time::Duration = std::time::Duration::from_millis(30);
/// Batches per history read: an answer of the store service stays well under its 64 MiB
/// unless the batches are near their own cap (then its client asks again in halves).
const HISTORY_PAGE: usize = 200;
/// Histories per restore call, and their most bytes (as exported) unless one alone is more:
/// a page is sent before a line would take it past either, so a call of several lines stays
/// under half the store service's 4 MiB request limit and a short transaction.
const RESTORE_PAGE: usize = 100;
const RESTORE_BYTES: usize = 2 << 20;
/// What a restore call's body holds besides its lines (`{"histories":[`, commas, `]}`), with
/// room to spare: a line alone is sent over the store service when it fits with this.
const RESTORE_ENVELOPE: usize = 1 << 10;
/// The agent of a `History_Pruned` event.
const PRUNE_AGENT: &str = "autocomp-prune";

/// What `autocomp prune` did (or, with `--dry-run`, would do).
#[derive(Debug, Clone, Serialize)]
pub struct PruneView {
    pub dry_run: bool,
    /// Batches due under the policy when the store was read.
    pub due: u64,
    /// Of those, exported and pruned.
    pub pruned: u64,
    /// Exported but changed before their prune: left for the next run.
    pub moved: u64,
    /// Exported, but another prune run pruned them first.
    pub pruned_meanwhile: u64,
    /// What in the policy prunes nothing (a type no batch has, a step nothing records), and
    /// what a prune that stopped left behind and this one removed.
    pub warnings: Vec<String>,
    pub events_removed: u64,
    pub runs_removed: u64,
    pub export_dir: PathBuf,
    pub manifest: Option<PathBuf>,
    pub files: Vec<ExportFile>,
    /// Batches the store held when it was read.
    pub batches: u64,
}

impl PruneView {
    pub fn render(&self, format: Format) -> String {
        render_as(format, || self, || self.to_text())
    }

    fn to_text(&self) -> String {
        let warnings: String =
            self.warnings.iter().map(|warning| format!("warning: {}\n", one_line(warning))).collect();
        warnings + &self.summary_text()
    }

    fn summary_text(&self) -> String {
        if self.dry_run {
            return format!(
                "{} of {} batches are due under the policy: `autocomp prune` without --dry-run exports them to {} \
                 and prunes them\n",
                self.due,
                self.batches,
                one_line(&self.export_dir.display().to_string())
            );
        }
        if self.due == 0 {
            return String::new();
        }
        let mut text = format!(
            "pruned {} batches of {} due ({} events, {} runs removed); {} changed since their export and stay for \
             the next run\n",
            self.pruned, self.due, self.events_removed, self.runs_removed, self.moved
        );
        if self.pruned_meanwhile > 0 {
            text.push_str(&format!("{} were pruned meanwhile by another run\n", self.pruned_meanwhile));
        }
        for file in &self.files {
            text.push_str(&format!(
                "  {}  {} batches, {} events, {}, {}\n",
                one_line(&self.export_dir.join(&file.file).display().to_string()),
                file.batches,
                file.events,
                size_text(file.bytes),
                file.sha256
            ));
        }
        if let Some(manifest) = &self.manifest {
            text.push_str(&format!("  manifest {}\n", one_line(&manifest.display().to_string())));
        }
        text
    }
}

/// What `autocomp import` put back.
#[derive(Debug, Clone, Serialize, Default)]
pub struct ImportView {
    pub files: Vec<PathBuf>,
    /// Lines read.
    pub batches: u64,
    pub restored: u64,
    pub events: u64,
    pub runs: u64,
    /// Lines whose batch's history is in the store already.
    pub not_pruned: u64,
    /// Lines whose batch was pruned to another export (its `History_Pruned` names another
    /// digest), or that the store does not have, or that no request to the store service
    /// carries (over its 4 MiB): each names its batch and why.
    pub other: Vec<String>,
}

impl ImportView {
    pub fn render(&self, format: Format) -> String {
        render_as(format, || self, || self.to_text())
    }

    fn to_text(&self) -> String {
        let mut text = format!(
            "restored {} of {} batches ({} events, {} runs); {} had their history in the store already\n",
            self.restored, self.batches, self.events, self.runs, self.not_pruned
        );
        for line in &self.other {
            text.push_str(&format!("  left: {}\n", autocomp_toolkit::terminal::for_terminal(line)));
        }
        text
    }
}

/// A batch exported and waiting for its prune.
struct Exported {
    id: BatchId,
    changed_seq: Seq,
    file: String,
    sha256: String,
    events: u64,
    runs: u64,
}

impl Operator {
    /// `autocomp prune`: see the module.
    pub async fn prune(&self, policy: &Path, dry_run: bool) -> Result<PruneView, OperatorError> {
        let policy = RetentionPolicy::read(policy)?;
        archive::check_dir(&policy.export_dir)?;
        let store = self.store().await?;
        let now = store.about().await?.clock;
        let components = store.components().await?;
        let (mut due, mut batches, mut after) = (Vec::new(), 0u64, None::<BatchId>);
        let mut types_seen = std::collections::BTreeSet::new();
        loop {
            let page = store.list_summaries(after.as_ref(), PAGE).await?;
            let Some(last) = page.last() else { break };
            after = Some(last.id.clone());
            batches += page.len() as u64;
            types_seen.extend(page.iter().map(|s| s.batch_type.clone()));
            due.extend(page.into_iter().filter(|s| policy.due(s, now, &components)).map(|s| s.id));
        }
        let mut view = PruneView {
            dry_run,
            due: due.len() as u64,
            pruned: 0,
            moved: 0,
            pruned_meanwhile: 0,
            warnings: policy.prunes_nothing(&types_seen, &components),
            events_removed: 0,
            runs_removed: 0,
            export_dir: policy.export_dir.clone(),
            manifest: None,
            files: Vec::new(),
            batches,
        };
        if dry_run || due.is_empty() {
            return Ok(view);
        }
        // One prune at a time writes to a directory; what one that stopped left half written
        // goes (nothing was pruned from it).
        let _lock = archive::lock_dir(&policy.export_dir)?;
        for left in archive::remove_partial_files(&policy.export_dir).map_err(|e| written(&policy.export_dir, e))? {
            view.warnings.push(format!("removed {left}, which a prune that stopped left half written"));
        }
        let run = chrono::DateTime::from_timestamp_millis(now.millis())
            .map_or_else(|| now.millis().to_string(), |at| at.format("%Y%m%dT%H%M%S%3fZ").to_string());
        let (files, exported) = export(store.as_ref(), &policy, &due, &run, now, &components).await?;
        let manifest = Manifest { run, store: self.store_shown(), files: files.clone() };
        let manifest_path =
            archive::write_manifest(&policy.export_dir, &manifest).map_err(|e| written(&policy.export_dir, e))?;
        let manifest_name = manifest_path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        view.files = files;
        view.manifest = Some(manifest_path);
        for (n, page) in exported.chunks(PRUNE_PAGE).enumerate() {
            if n > 0 {
                // Passes go on: a writer waiting on the store gets in between two transactions.
                tokio::time::sleep(PRUNE_PAUSE).await;
            }
            let tickets = page.iter().map(|e| ticket(e, &policy.export_dir, &manifest_name)).collect();
            for answer in store.prune_histories(tickets).await? {
                match answer {
                    PruneAnswer::Pruned { events, runs, .. } => {
                        view.pruned += 1;
                        view.events_removed += events;
                        view.runs_removed += runs;
                    }
                    PruneAnswer::AlreadyPruned => view.pruned_meanwhile += 1,
                    PruneAnswer::Moved { .. } | PruneAnswer::NotFound => view.moved += 1,
                }
            }
        }
        Ok(view)
    }

    /// `autocomp import`: see the module.
    pub async fn import(&self, files: &[PathBuf]) -> Result<ImportView, OperatorError> {
        let store = self.store().await?;
        let request_limit = autocomp_store::max_request_bytes(&self.store_url()?);
        let mut view = ImportView { files: files.to_vec(), ..ImportView::default() };
        // Every file read and checked whole before anything is written: a damaged file
        // restores nothing.
        let mut read = Vec::with_capacity(files.len());
        for file in files {
            read.push(read_export(file)?);
        }
        for lines in read {
            view.batches += lines.len() as u64;
            let mut page = RestorePage::default();
            for line in lines {
                let id = &line.history.batch.id;
                match pruned_to(store.as_ref(), id, &line.sha256).await? {
                    ExportMatch::ThisExport => {}
                    ExportMatch::Kept => {
                        view.not_pruned += 1;
                        continue;
                    }
                    ExportMatch::Elsewhere(why) => {
                        view.other.push(format!("{id}: {why}"));
                        continue;
                    }
                }
                if let Some(refused) = too_large_to_send(&line, request_limit) {
                    view.other.push(refused.to_string());
                    continue;
                }
                // Sent before this line would take it past its bounds, not after: a page
                // that passed them could be more than the store service takes.
                if page.is_full_for(line.bytes) {
                    restore(store.as_ref(), std::mem::take(&mut page).histories, &mut view).await?;
                }
                page.bytes += line.bytes;
                page.histories.push(line.history);
            }
            restore(store.as_ref(), page.histories, &mut view).await?;
        }
        Ok(view)
    }

    fn store_shown(&self) -> String {
        self.store_url().map(|url| autocomp_toolkit::display_url(&url)).unwrap_or_default()
    }
}

/// Histories waiting for their restore call, with their bytes as exported.
#[derive(Default)]
struct RestorePage {
    histories: Vec<BatchHistory>,
    bytes: usize,
}

impl RestorePage {
    /// Whether a line of `bytes` must go in the next call: this one holds something, and the
    /// line would take it past `RESTORE_PAGE` lines or `RESTORE_BYTES`. A line alone is sent
    /// whatever its size (`too_large_to_send` has refused one the store would not take).
    fn is_full_for(&self, bytes: usize) -> bool {
        !self.histories.is_empty() && (self.histories.len() >= RESTORE_PAGE || self.bytes + bytes > RESTORE_BYTES)
    }
}

/// Why `line` cannot be sent, when it is more than one call to the store takes even alone
/// (`limit`: the store service's request limit; an embedded store has none). Refused as the
/// input it is, naming its size: nothing of it is written, the other lines go on.
fn too_large_to_send(line: &ExportLine, limit: Option<usize>) -> Option<InvalidInput> {
    let limit = limit?;
    if line.bytes + RESTORE_ENVELOPE <= limit {
        return None;
    }
    let reason = format!(
        "is {} bytes as exported, more than one request to the store service may carry ({limit} \
         bytes): nothing written; import this file with the store's own URL (--store sqlite:///... on the \
         service's host, or postgres://...)",
        line.bytes
    );
    Some(InvalidInput::new("history", line.history.batch.id.as_str(), reason))
}

/// Puts back what `page` holds, counting the answers into `view`.
async fn restore(store: &dyn ObjectStore, page: Vec<BatchHistory>, view: &mut ImportView) -> Result<(), OperatorError> {
    if page.is_empty() {
        return Ok(());
    }
    let ids: Vec<BatchId> = page.iter().map(|history| history.batch.id.clone()).collect();
    for (answer, id) in store.restore_histories(page).await?.into_iter().zip(ids) {
        match answer {
            RestoreAnswer::Restored { events, runs } => {
                view.restored += 1;
                view.events += events;
                view.runs += runs;
            }
            RestoreAnswer::NotPruned => view.not_pruned += 1,
            RestoreAnswer::NotFound => view.other.push(format!("{id}: not in this store")),
        }
    }
    Ok(())
}

/// One line of an export file: a batch's history, the line's digest and its length.
pub(crate) struct ExportLine {
    pub sha256: String,
    pub bytes: usize,
    pub history: BatchHistory,
}

/// An export file's lines, each with its digest, read whole; a file that does not decompress
/// or a line that is not a batch's history is refused naming the file and the line.
pub(crate) fn read_export(file: &Path) -> Result<Vec<ExportLine>, OperatorError> {
    let shown = file.display().to_string();
    if shown.ends_with(".partial") {
        let reason = "is what a prune that stopped left half written, not an export (the next prune removes it)";
        return Err(InvalidInput::new("FILE", shown, reason).into());
    }
    let whole = std::fs::read(file).map_err(|e| InvalidInput::new("FILE", &shown, format!("cannot be read: {e}")))?;
    if let Some(listed) = archive::listed_digest(file)
        && listed != digest(&whole)
    {
        let reason = format!("is not the file its manifest lists ({listed}, this is {})", digest(&whole));
        return Err(InvalidInput::new("FILE", shown, reason).into());
    }
    let mut lines = Vec::new();
    let mut n = 0usize;
    archive::for_each_line(&whole[..], |line| {
        n += 1;
        let history: BatchHistory =
            serde_json::from_slice(line).map_err(|e| format!("line {n} is not a batch's history: {e}"))?;
        lines.push(ExportLine { sha256: digest(line), bytes: line.len(), history });
        Ok(())
    })
    .map_err(|reason| InvalidInput::new("FILE", &shown, reason))?;
    Ok(lines)
}

/// Writes the due batches' histories to one file per period, each read back and checked.
async fn export(
    store: &dyn ObjectStore,
    policy: &RetentionPolicy,
    due: &[BatchId],
    run: &str,
    now: autocomp_model::Timestamp,
    components: &[autocomp_model::RegisteredComponent],
) -> Result<(Vec<ExportFile>, Vec<Exported>), OperatorError> {
    let dir = &policy.export_dir;
    let mut writers = archive::Writers::new();
    let mut changed = std::collections::HashMap::new();
    for page in due.chunks(HISTORY_PAGE) {
        for mut history in store.histories(page).await? {
            let summary = BatchSummary::of(&history.batch);
            // The line is the batch's history alone, not when it was read: an unchanged batch
            // exported twice is the same line, with the same digest.
            history.batch.as_of = summary.last_activity;
            // Read again, whole: a batch that moved since the listing is left for the next run.
            if !policy.due(&summary, now, components) {
                continue;
            }
            let period = archive::period_of(summary.last_activity);
            if !writers.contains_key(&period) {
                let writer = archive::ExportWriter::create(dir, &period, run).map_err(|e| written(dir, e))?;
                writers.insert(period.clone(), writer);
            }
            let writer = writers.get_mut(&period).expect("inserted above");
            writer.write(&history).map_err(|e| written(dir, e))?;
            changed.insert(history.batch.id.clone(), history.batch.changed_seq);
        }
    }
    let (mut files, mut exported) = (Vec::new(), Vec::new());
    for (_, writer) in writers {
        let (file, lines) = writer.finish().map_err(|reason| {
            OperatorError::usage(format!("the export did not read back as written, nothing was pruned: {reason}"))
        })?;
        for line in lines {
            let changed_seq = changed[&line.id];
            let (sha256, events, runs) = (line.sha256, line.events, line.runs);
            exported.push(Exported { id: line.id, changed_seq, file: file.file.clone(), sha256, events, runs });
        }
        files.push(file);
    }
    Ok((files, exported))
}

fn ticket(exported: &Exported, dir: &Path, manifest: &str) -> PruneTicket {
    let agent = Agent::new(PRUNE_AGENT).expect("a valid agent");
    let marker = NewEvent::new(EventType::history_pruned(), Outcome::Success, agent).with_details(json!({
        "summary": format!("history exported to {} and pruned", exported.file),
        "export": exported.file,
        "export_dir": dir,
        "manifest": manifest,
        "sha256": exported.sha256,
        "events": exported.events,
        "runs": exported.runs,
        "restore": format!("autocomp import {}", shell_word(&dir.join(&exported.file))),
    }));
    PruneTicket { id: exported.id.clone(), changed_seq: exported.changed_seq, marker }
}

/// How an export line stands to the store's batch.
enum ExportMatch {
    /// The batch was pruned to this very line.
    ThisExport,
    /// The batch's history is in the store.
    Kept,
    /// Pruned to another export, or not in this store.
    Elsewhere(String),
}

/// Whether the batch's history was pruned to the export line with digest `sha256`.
async fn pruned_to(store: &dyn ObjectStore, id: &BatchId, sha256: &str) -> Result<ExportMatch, OperatorError> {
    let head = match store.batch_head(id).await {
        Ok(head) => head,
        Err(autocomp_store::StoreError::NotFound(_)) => return Ok(ExportMatch::Elsewhere("not in this store".into())),
        Err(e) => return Err(e.into()),
    };
    let Some(marker) = head.effective_event(&EventType::history_pruned()) else { return Ok(ExportMatch::Kept) };
    match marker.details.get("sha256").and_then(serde_json::Value::as_str) {
        Some(recorded) if recorded == sha256 => Ok(ExportMatch::ThisExport),
        recorded => Ok(ExportMatch::Elsewhere(format!(
            "its History_Pruned names another line ({}, in {}), not this one ({sha256}): nothing written",
            recorded.unwrap_or("no digest"),
            marker.details.get("export").and_then(serde_json::Value::as_str).unwrap_or("?"),
        ))),
    }
}

/// The export file a `History_Pruned` event names (as it was written: the policy's
/// `export_dir` and the file's name).
pub fn export_of(marker: &autocomp_model::Event) -> PathBuf {
    let text = |key: &str| marker.details.get(key).and_then(serde_json::Value::as_str).unwrap_or("?").to_owned();
    Path::new(&text("export_dir")).join(text("export"))
}

/// Refuses every action on a batch whose history was pruned, naming the export that
/// restores it: an event recorded on the part of the log left would mix with the history
/// imported later, and the batch is worked on by nothing until then.
pub(crate) fn refuse_if_pruned(batch: &autocomp_model::Batch, action: &str) -> Result<(), OperatorError> {
    let Some(marker) = batch.effective().get(&EventType::history_pruned()) else { return Ok(()) };
    let file = export_of(marker);
    Err(OperatorError::Refused(format!(
        "{}'s history was pruned (seq {}) to {}: `autocomp import {}` restores it, then {action} it; nothing recorded",
        batch.id,
        marker.seq,
        one_line(&file.display().to_string()),
        shell_word(&file)
    )))
}

/// `path` as one word of a shell command: quoted unless it is plain.
pub(crate) fn shell_word(path: &Path) -> String {
    let text = path.display().to_string();
    let plain = !text.is_empty() && text.chars().all(|c| c.is_ascii_alphanumeric() || "/._-+:@%,=".contains(c));
    if plain { text } else { format!("'{}'", text.replace('\'', "'\\''")) }
}

fn written(dir: &Path, error: std::io::Error) -> OperatorError {
    OperatorError::usage(format!("cannot write the export in {}: {error}; nothing was pruned", dir.display()))
}
