//! Batches, their append-only event logs and the runs (claims) components hold on them,
//! plus the validated inputs (`NewBatch`, `NewEvent`) the store accepts.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::{
    Agent, BatchId, BatchType, ComponentName, EffectiveView, EventType, IdempotencyKey, InvalidInput,
    MAX_DOCUMENT_BYTES, Seq, Timestamp,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "json-schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    Success,
    Failure,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Success => "success",
            Outcome::Failure => "failure",
        }
    }

    pub fn parse(text: &str) -> Result<Self, InvalidInput> {
        match text {
            "success" => Ok(Outcome::Success),
            "failure" => Ok(Outcome::Failure),
            other => Err(InvalidInput::new("outcome", other, "expected success or failure")),
        }
    }
}

/// A batch with its whole log and its open runs, as read from the store at `as_of`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "json-schema", derive(schemars::JsonSchema))]
pub struct Batch {
    pub id: BatchId,
    #[serde(rename = "type")]
    pub batch_type: BatchType,
    pub priority: i32,
    pub metadata: Map<String, Value>,
    pub created_seq: Seq,
    /// Last content change (creation, re-delivery, metadata edit); never moved by events.
    pub modified_seq: Seq,
    /// Last change of any kind; the change feed orders batches by it.
    pub changed_seq: Seq,
    pub created_at: Timestamp,
    pub modified_at: Timestamp,
    /// The log in `seq` order.
    pub events: Vec<Event>,
    pub open_runs: Vec<Run>,
    /// The store's clock when this snapshot was read: "now" for time-based trigger clauses.
    pub as_of: Timestamp,
}

impl Batch {
    pub fn effective(&self) -> EffectiveView<'_> {
        EffectiveView::of(&self.events)
    }

    /// The newest `Reset` covering `event_type` (`Seq::ZERO` when none): a component's
    /// attempts on the batch are counted from there.
    pub fn last_reset_of(&self, event_type: &EventType) -> Seq {
        self.events
            .iter()
            .rev()
            .find(|e| e.event_type.is_reset() && e.resets.contains(event_type))
            .map_or(Seq::ZERO, |e| e.seq)
    }

    /// Where the batch's files are (metadata key `location`).
    pub fn location(&self) -> Option<&str> {
        self.metadata.get("location").and_then(Value::as_str)
    }

    /// The newest content change or event, whichever is later (for `settled_for`).
    pub fn last_activity_at(&self) -> Timestamp {
        let last_event = self.events.iter().map(|e| e.at).max().unwrap_or_default();
        self.modified_at.max(last_event)
    }

    pub fn open_run(&self, component: &ComponentName) -> Option<&Run> {
        self.open_runs.iter().find(|run| &run.component == component)
    }

    /// The structured result an earlier step recorded (the `result` of the effective event
    /// of `event_type`), typed. `None` when the type has no effective event or the event
    /// carries no result; an error naming the type when the result does not fit `T`.
    pub fn result<T: serde::de::DeserializeOwned>(&self, event_type: &str) -> Result<Option<T>, InvalidInput> {
        let wanted = EventType::new(event_type)?;
        let view = self.effective();
        let Some(value) = view.get(&wanted).and_then(|e| e.details.get(crate::RESULT_KEY)) else {
            return Ok(None);
        };
        T::deserialize(value).map(Some).map_err(|e| {
            InvalidInput::new(format!("result of {event_type}"), value.to_string(), format!("does not fit: {e}"))
        })
    }
}

/// One recorded event. Never changed or deleted once the store acknowledged it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "json-schema", derive(schemars::JsonSchema))]
pub struct Event {
    pub seq: Seq,
    pub batch_id: BatchId,
    #[serde(rename = "type")]
    pub event_type: EventType,
    pub outcome: Outcome,
    pub agent: Agent,
    pub at: Timestamp,
    pub details: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<RunRef>,
    /// For `Reset` markers: the event types this marker supersedes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resets: Vec<EventType>,
}

impl Event {
    /// A boolean flag of the report (`transient`, `timed_out`, `cancelled`, `skipped`).
    pub fn flag(&self, name: &str) -> bool {
        self.details.get(name).and_then(Value::as_bool).unwrap_or(false)
    }

    /// Why a failure failed, in one line, for lists and summaries: its first reported
    /// failure as `type: description` (what differs between batches, the file it names, is
    /// left out, so equal reasons read alike), or else its summary. `None` for a success or
    /// a failure that says nothing.
    pub fn failure_reason(&self) -> Option<String> {
        fn text<'v>(key: &str, value: &'v Value) -> &'v str {
            value.get(key).and_then(Value::as_str).map(str::trim).unwrap_or("")
        }
        if self.outcome != Outcome::Failure {
            return None;
        }
        let first = self.details.get("failures").and_then(Value::as_array).and_then(|f| f.first());
        if let Some(first) = first {
            let (kind, description) = (text("type", first), text("description", first));
            let reason = match (kind.is_empty(), description.is_empty()) {
                (_, true) => kind.to_owned(),
                (true, false) => description.to_owned(),
                (false, false) => format!("{kind}: {description}"),
            };
            if !reason.is_empty() {
                return Some(reason);
            }
        }
        Some(text("summary", &self.details).to_owned()).filter(|summary| !summary.is_empty())
    }

    /// The command a failure names as what to run next instead of a rerun of its step (its
    /// first failure's `details.next`: a `read_schema` failure names the restart that records
    /// the result it could not read afresh, which a rerun of the reader alone would fail on
    /// again); `None` for a success, or a failure that names none.
    pub fn failure_next(&self) -> Option<&str> {
        if self.outcome != Outcome::Failure {
            return None;
        }
        let first = self.details.get("failures").and_then(Value::as_array).and_then(|f| f.first())?;
        first.get("details").and_then(|d| d.get("next")).and_then(Value::as_str).filter(|next| !next.is_empty())
    }

    /// Why a failure failed, whole, for one batch's page: `failure_reason` with what failed
    /// (the first failure's `reference`, e.g. the file) and how many more failures the run
    /// reported: "mismatch: md5 and sha256 differ (data/page-0002.txt; 2 more failures)".
    pub fn failure_text(&self) -> Option<String> {
        let reason = self.failure_reason()?;
        let failures = self.details.get("failures").and_then(Value::as_array);
        let reference = failures
            .and_then(|f| f.first())
            .and_then(|first| first.get("reference"))
            .and_then(Value::as_str)
            .map(str::trim)
            .filter(|r| !r.is_empty());
        // The report keeps the first failures and counts them all (`failures_total`).
        let listed = failures.map_or(0, |f| f.len() as u64);
        let total = self.details.get("failures_total").and_then(Value::as_u64).unwrap_or(listed).max(listed);
        let more = total.saturating_sub(1);
        let more = match more {
            0 => None,
            1 => Some("1 more failure".to_owned()),
            n => Some(format!("{n} more failures")),
        };
        Some(match (reference, more) {
            (None, None) => reason,
            (Some(reference), None) => format!("{reason} ({reference})"),
            (None, Some(more)) => format!("{reason} ({more})"),
            (Some(reference), Some(more)) => format!("{reason} ({reference}; {more})"),
        })
    }

    /// What the run printed, if its report kept any (`Report::output`).
    pub fn output(&self) -> Option<crate::RunOutput> {
        let output = self.details.get(crate::OUTPUT_KEY)?;
        serde_json::from_value(output.clone()).ok()
    }

    /// A failure the component said may succeed if retried.
    pub fn is_transient_failure(&self) -> bool {
        self.outcome == Outcome::Failure && self.flag("transient")
    }

    /// A failure an operator closed out with `acknowledge`: it stays a failure (what
    /// requires the type still waits) but needs nobody any more.
    pub fn is_acknowledged(&self) -> bool {
        self.outcome == Outcome::Failure && self.flag("acknowledged")
    }

    /// The run an operator's `cancel` closed (`details.cancelled_run`), if it closed one: the
    /// attempt this event ends, though it is not in that run.
    pub fn cancelled_run(&self) -> Option<RunRef> {
        if self.outcome != Outcome::Failure || !self.flag("cancelled") {
            return None;
        }
        let run = self.details.get("cancelled_run")?;
        let component = ComponentName::new(run.get("component")?.as_str()?).ok()?;
        Some(RunRef { component, generation: run.get("generation")?.as_i64()? })
    }

    /// A success an operator recorded with `skip` instead of the component's work.
    pub fn is_skipped(&self) -> bool {
        self.outcome == Outcome::Success && self.flag("skipped")
    }

    /// The batch content this result was worked out from (`details.content_seq`: the
    /// batch's `modified_seq` when the run re-checked it), for a component whose work reads
    /// the content; `None` for every other event.
    pub fn content_seq(&self) -> Option<Seq> {
        // Seqs start at 1: anything else names no content.
        self.details.get(CONTENT_SEQ_KEY).and_then(Value::as_i64).filter(|seq| *seq > 0).map(Seq)
    }

    /// Worked out from content the batch no longer has: its content changed after
    /// `content_seq`. A stale event counts for no trigger clause (see `Batch::current`).
    pub fn is_stale_at(&self, modified_seq: Seq) -> bool {
        self.content_seq().is_some_and(|content| content < modified_seq)
    }
}

/// The details key a result records the content version it was worked out from under.
pub const CONTENT_SEQ_KEY: &str = "content_seq";

/// The claim generation an event was recorded under.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "json-schema", derive(schemars::JsonSchema))]
pub struct RunRef {
    pub component: ComponentName,
    pub generation: i64,
}

/// Who holds a run: enough for an operator (or a restarted agent) to find the process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "json-schema", derive(schemars::JsonSchema))]
pub struct RunHolder {
    pub agent: Agent,
    pub host: String,
    pub pid: u32,
    /// A client-chosen key that makes a retried claim return the run the first one opened
    /// instead of abandoning it (the HTTP client sets one on every claim).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim_key: Option<IdempotencyKey>,
    /// The holding process's liveness record in the lock service (`zk:<session>`,
    /// `pg:<worker>`, `local:<host>:<pid>:<nonce>`): what a claimer that finds the run open
    /// asks the lock service about before it may take the run over. `None` for a holder
    /// that keeps none (a claim guarded by a batch lock instead).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub liveness: Option<String>,
}

impl RunHolder {
    /// This holder with a claim key, `fresh()`'s when it has none: what a client that may
    /// retry a claim after a lost answer sends, so the retry finds the run it opened.
    pub fn keyed(&self, fresh: impl FnOnce() -> IdempotencyKey) -> RunHolder {
        let mut holder = self.clone();
        holder.claim_key.get_or_insert_with(fresh);
        holder
    }

    pub fn validate(&self) -> Result<(), InvalidInput> {
        let printable = self.host.chars().all(|c| c.is_ascii_graphic());
        if self.host.is_empty() || self.host.len() > 255 || !printable {
            return Err(InvalidInput::new("host", &self.host, "must be 1-255 printable ASCII characters"));
        }
        if let Some(liveness) = &self.liveness
            && (liveness.is_empty() || liveness.len() > 255 || !liveness.chars().all(|c| c.is_ascii_graphic()))
        {
            return Err(InvalidInput::new("liveness", liveness, "must be 1-255 printable ASCII characters"));
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "json-schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum RunState {
    /// Claimed; the holder may record one event with this generation.
    Open,
    /// Closed by the event it recorded.
    Recorded,
    /// Closed without an event (graceful shutdown): the batch is ready again.
    Released,
    /// Superseded by a later claim while still open: its holder died or stalled.
    Abandoned,
    /// Closed by an operator's `cancel` (`ObjectStore::cancel_run`), which fenced its holder
    /// and recorded a failure flagged `cancelled`. Not a failed attempt: nobody crashed.
    Cancelled,
}

impl RunState {
    pub fn as_str(self) -> &'static str {
        match self {
            RunState::Open => "open",
            RunState::Recorded => "recorded",
            RunState::Released => "released",
            RunState::Abandoned => "abandoned",
            RunState::Cancelled => "cancelled",
        }
    }

    pub fn parse(text: &str) -> Result<Self, InvalidInput> {
        match text {
            "open" => Ok(RunState::Open),
            "recorded" => Ok(RunState::Recorded),
            "released" => Ok(RunState::Released),
            "abandoned" => Ok(RunState::Abandoned),
            "cancelled" => Ok(RunState::Cancelled),
            other => {
                Err(InvalidInput::new("run state", other, "expected open, recorded, released, abandoned or cancelled"))
            }
        }
    }
}

/// One claim generation of (batch, component): the "started" marker of a piece of work.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "json-schema", derive(schemars::JsonSchema))]
pub struct Run {
    pub batch_id: BatchId,
    pub component: ComponentName,
    pub generation: i64,
    pub holder: RunHolder,
    pub started_at: Timestamp,
    /// The change that opened the run; attempts are counted by it.
    pub claim_seq: Seq,
    pub state: RunState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<Timestamp>,
    /// The run ended in a transient failure (counts as an attempt, like abandonment).
    #[serde(default)]
    pub transient: bool,
}

impl Run {
    /// Who held the run and since when, as an event's details and the views name it:
    /// `component`, `generation`, `agent`, `host`, `pid`, `started_at`.
    pub fn holder_json(&self) -> Value {
        serde_json::json!({
            "component": self.component,
            "generation": self.generation,
            "agent": self.holder.agent,
            "host": self.holder.host,
            "pid": self.holder.pid,
            "started_at": self.started_at,
        })
    }
}

/// A batch to register.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "json-schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct NewBatch {
    pub id: BatchId,
    #[serde(rename = "type")]
    pub batch_type: BatchType,
    #[serde(default)]
    pub priority: i32,
    /// Must be a JSON object; the key `location` says where the batch's files are.
    #[serde(default = "empty_object")]
    pub metadata: Value,
}

impl NewBatch {
    pub fn new(id: BatchId, batch_type: BatchType) -> Self {
        Self { id, batch_type, priority: 0, metadata: empty_object() }
    }

    pub fn with_location(mut self, location: impl Into<String>) -> Self {
        if let Value::Object(map) = &mut self.metadata {
            map.insert("location".into(), Value::String(location.into()));
        }
        self
    }

    pub fn with_priority(mut self, priority: i32) -> Self {
        self.priority = priority;
        self
    }

    pub fn validate(&self) -> Result<(), InvalidInput> {
        check_object("metadata", &self.metadata)
    }

    /// The batch as its registration at `seq` and `at` writes it, before any event.
    pub fn registered(&self, seq: Seq, at: Timestamp) -> Batch {
        Batch {
            id: self.id.clone(),
            batch_type: self.batch_type.clone(),
            priority: self.priority,
            metadata: self.metadata.as_object().cloned().unwrap_or_default(),
            created_seq: seq,
            modified_seq: seq,
            changed_seq: seq,
            created_at: at,
            modified_at: at,
            events: Vec::new(),
            open_runs: Vec::new(),
            as_of: at,
        }
    }
}

/// An event to append. The store assigns `seq` and `at`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "json-schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct NewEvent {
    #[serde(rename = "type")]
    pub event_type: EventType,
    pub outcome: Outcome,
    pub agent: Agent,
    #[serde(default = "empty_object")]
    pub details: Value,
    /// Fences the append: it succeeds only while this is the open, current run.
    #[serde(default)]
    pub run: Option<RunRef>,
    #[serde(default)]
    pub resets: Vec<EventType>,
    /// A retried append with the same key returns the first append's event.
    #[serde(default)]
    pub idempotency_key: Option<IdempotencyKey>,
}

fn empty_object() -> Value {
    Value::Object(Map::new())
}

impl NewEvent {
    pub fn new(event_type: EventType, outcome: Outcome, agent: Agent) -> Self {
        Self {
            event_type,
            outcome,
            agent,
            details: empty_object(),
            run: None,
            resets: Vec::new(),
            idempotency_key: None,
        }
    }

    /// A `Reset` marker superseding the effective events of `types`.
    pub fn reset(types: Vec<EventType>, agent: Agent, details: Value) -> Self {
        Self { resets: types, details, ..Self::new(EventType::reset(), Outcome::Success, agent) }
    }

    pub fn with_details(mut self, details: Value) -> Self {
        self.details = details;
        self
    }

    pub fn in_run(mut self, component: ComponentName, generation: i64) -> Self {
        self.run = Some(RunRef { component, generation });
        self
    }

    pub fn with_idempotency_key(mut self, key: IdempotencyKey) -> Self {
        self.idempotency_key = Some(key);
        self
    }

    /// The event as the store recorded it, with the `seq` and `at` it assigned.
    pub fn recorded(self, batch: &BatchId, seq: Seq, at: Timestamp) -> Event {
        Event {
            seq,
            batch_id: batch.clone(),
            event_type: self.event_type,
            outcome: self.outcome,
            agent: self.agent,
            at,
            details: self.details,
            run: self.run,
            resets: self.resets,
        }
    }

    pub fn validate(&self) -> Result<(), InvalidInput> {
        check_object("details", &self.details)?;
        match (self.event_type.is_reset(), self.resets.is_empty()) {
            (true, true) => {
                Err(InvalidInput::new("resets", "[]", "a Reset marker must name the event types it resets"))
            }
            (false, false) => Err(InvalidInput::new(
                "resets",
                self.resets.iter().map(EventType::as_str).collect::<Vec<_>>().join(","),
                format!("only a Reset marker may reset types, not a {} event", self.event_type),
            )),
            _ if self.event_type.is_reset() && self.run.is_some() => {
                Err(InvalidInput::new("run", "set", "a Reset marker is an operator action, not part of a run"))
            }
            _ if self.resets.iter().any(EventType::is_reset) => {
                Err(InvalidInput::new("resets", EventType::RESET, "a Reset marker cannot reset Reset markers"))
            }
            // Only pruning writes it and only importing removes it: a pruned batch stays out
            // of every pass until its whole history is back.
            _ if self.event_type.is_history_pruned() => Err(InvalidInput::new(
                "type",
                EventType::HISTORY_PRUNED,
                "is written only by `autocomp prune` (an `autocomp import` of its export restores the history)",
            )),
            _ if self.resets.iter().any(EventType::is_history_pruned) => Err(InvalidInput::new(
                "resets",
                EventType::HISTORY_PRUNED,
                "a pruned history is restored by `autocomp import` of its export, not reset",
            )),
            _ => Ok(()),
        }
    }
}

/// `metadata` and `details` are JSON objects of bounded size.
pub fn check_object(field: &str, document: &Value) -> Result<(), InvalidInput> {
    if !document.is_object() {
        let preview: String = document.to_string().chars().take(64).collect();
        return Err(InvalidInput::new(field, preview, "must be a JSON object"));
    }
    let size = serde_json::to_vec(document).map(|v| v.len()).unwrap_or(usize::MAX);
    if size > MAX_DOCUMENT_BYTES {
        let preview: String = document.to_string().chars().take(64).collect();
        return Err(InvalidInput::new(
            field,
            preview,
            format!("is {size} bytes of JSON, at most {MAX_DOCUMENT_BYTES} allowed"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::fixtures::event;

    #[test]
    fn a_failures_reason_is_its_first_failure_without_the_file_it_names_or_else_its_summary() {
        let failed = |details| event(1, "Checksums_Verified", Outcome::Failure, details, 0);
        let checksum = json!({"summary": "checked 7 files (13.3 kB)", "failures": [
            {"reference": "data/1.tif", "type": "missing", "description": "listed in manifest-md5.txt but not in the bag"},
            {"reference": "data/2.tif", "type": "extra", "description": "in no manifest"}]});
        let reason = failed(checksum).failure_reason();
        assert_eq!(reason.as_deref(), Some("missing: listed in manifest-md5.txt but not in the bag"));
        let cancelled = json!({"summary": "cancelled by alice: stuck", "failures": []});
        assert_eq!(failed(cancelled).failure_reason().as_deref(), Some("cancelled by alice: stuck"));
        assert_eq!(failed(json!({"summary": "  "})).failure_reason(), None, "says nothing");
        let success = event(1, "Checksums_Verified", Outcome::Success, json!({"summary": "ok"}), 0);
        assert_eq!(success.failure_reason(), None);
    }

    #[test]
    fn a_failures_whole_text_names_the_file_and_counts_the_others() {
        let failed = |details| event(1, "Checksums_Verified", Outcome::Failure, details, 0);
        let two = json!({"failures": [
            {"reference": "data/page-0002.txt", "type": "mismatch", "description": "md5 and sha256 differ"},
            {"reference": "data/page-0003.txt", "type": "mismatch", "description": "md5 and sha256 differ"}]});
        assert_eq!(
            failed(two).failure_text().as_deref(),
            Some("mismatch: md5 and sha256 differ (data/page-0002.txt; 1 more failure)")
        );
        let one =
            json!({"failures": [{"reference": "data/1.tif", "type": "missing", "description": "not in the bag"}]});
        assert_eq!(failed(one).failure_text().as_deref(), Some("missing: not in the bag (data/1.tif)"));
        let whole = json!({"failures_total": 3, "failures": [{"type": "timeout", "description": "ran 600 s"}]});
        assert_eq!(failed(whole).failure_text().as_deref(), Some("timeout: ran 600 s (2 more failures)"));
        assert_eq!(
            failed(json!({"summary": "cancelled by alice"})).failure_text().as_deref(),
            Some("cancelled by alice")
        );
        let success = event(1, "Checksums_Verified", Outcome::Success, json!({"summary": "ok"}), 0);
        assert_eq!(success.failure_text(), None);
    }
}
