//! What every backend decides the same way around a write: which operator events are
//! acceptable, when a retried append or create is the same request, how a metadata patch
//! merges, when a retried claim gets its run back, what a cancellation records about the run it closed, and how the component
//! registry refuses a pass or a retirement, and how a batch's stored bytes are capped
//! (`max_batch_bytes`). Backends call these so the SQLite and PostgreSQL stores cannot drift
//! apart in their answers.

use serde_json::{Map, Value};

use crate::error::{StoreError, StoreResult};
use autocomp_model::{
    Batch, BatchId, ComponentName, Event, EventType, IdempotencyKey, InvalidInput, NewBatch, NewEvent, Outcome,
    Retirement, Run, RunHolder, RunState,
};

/// Most batches one `get_batches` / `list_batches` / `claim_many` call takes or returns, on
/// every backend (a bigger page is refused naming the field, not cut short).
pub(crate) const MAX_BATCH_PAGE: usize = 10_000;
/// Most changes one page of the change feed returns.
pub(crate) const MAX_CHANGE_PAGE: usize = 100_000;

/// The refusal of a page over its limit.
/// Refuses more than `max` items (ids asked, a listing's limit) as `page_too_large`.
pub(crate) fn check_page(field: &str, asked: usize, max: usize) -> StoreResult<()> {
    if asked > max {
        return Err(page_too_large(field, asked, max));
    }
    Ok(())
}

pub(crate) fn page_too_large(field: &str, asked: usize, max: usize) -> StoreError {
    InvalidInput::new(field, asked.to_string(), format!("at most {max} per request")).into()
}

/// A claim whose key already opened `run` (generation `current` being the batch's newest):
/// a retry after a lost answer gets that run back (the claim's run, nothing abandoned) while it
/// is still the open current one of the same holder; otherwise the key was spent and the claim
/// is a `Conflict`.
pub(crate) fn retried_claim(
    run: Run,
    current: i64,
    batch: &BatchId,
    component: &ComponentName,
    holder: &RunHolder,
) -> StoreResult<Run> {
    if run.state == RunState::Open && run.generation == current && run.holder == *holder {
        return Ok(run);
    }
    let key = holder.claim_key.as_ref().map_or("", IdempotencyKey::as_str);
    Err(StoreError::Conflict(format!(
        "claim key {key} was already used by run {} of {component} on {batch}, now {}",
        run.generation,
        run.state.as_str()
    )))
}

/// An operator's event, recorded beside another change in the same transaction: no Reset
/// marker, no run (it is nobody's claim), no idempotency key (these operations are not
/// blind retries: re-running one is a new decision, recorded anew).
pub(crate) fn check_operator_event(new: &NewEvent, operation: &str) -> StoreResult<()> {
    let refuse = |field: &str, value: &str, reason: &str| -> StoreResult<()> {
        Err(InvalidInput::new(field, value, format!("{operation}: {reason}")).into())
    };
    if new.event_type.is_reset() {
        return refuse("event type", EventType::RESET, "records a result, not a Reset marker");
    }
    if let Some(run) = &new.run {
        return refuse(
            "run",
            &format!("{}#{}", run.component, run.generation),
            "an operator's event is not part of a run",
        );
    }
    if let Some(key) = &new.idempotency_key {
        return refuse("idempotency key", key.as_str(), "not supported");
    }
    Ok(())
}

/// `cancel_run`'s event: an operator's failure flagged `"cancelled": true`.
pub(crate) fn check_cancellation(new: &NewEvent) -> StoreResult<()> {
    check_operator_event(new, "cancel_run")?;
    if new.outcome != Outcome::Failure {
        return Err(InvalidInput::new("outcome", new.outcome.as_str(), "cancel_run records a failure").into());
    }
    if !new.details.get("cancelled").and_then(Value::as_bool).unwrap_or(false) {
        let preview: String = new.details.to_string().chars().take(64).collect();
        return Err(
            InvalidInput::new("details", preview, "cancel_run records a failure flagged \"cancelled\": true").into()
        );
    }
    Ok(())
}

/// Adds `cancelled_run` to a cancellation's details, naming the run it closes.
pub(crate) fn describe_cancelled_run(details: &mut Value, run: &Run) {
    if let Value::Object(details) = details {
        details.insert("cancelled_run".into(), run.holder_json());
    }
}

/// Adds the old and new priority to a `prioritize` event's details.
pub(crate) fn describe_priority_change(details: &mut Value, priority: i32, previous: i32) {
    if let Value::Object(details) = details {
        details.insert("priority".into(), priority.into());
        details.insert("previous_priority".into(), previous.into());
    }
}

/// A retried append found the event its key recorded: the first answer if the request is
/// the same, else a conflict (the key was reused for something else).
pub(crate) fn earlier_append(batch: &BatchId, new: &NewEvent, earlier: Event) -> StoreResult<Event> {
    let same = earlier.batch_id == *batch
        && earlier.event_type == new.event_type
        && earlier.outcome == new.outcome
        && earlier.agent == new.agent
        && earlier.details == new.details
        && earlier.run == new.run
        && earlier.resets == new.resets;
    if same {
        Ok(earlier)
    } else {
        let key = new.idempotency_key.as_ref().map_or("", |k| k.as_str());
        Err(StoreError::Conflict(format!(
            "idempotency key {key} was already used for a different event (seq {})",
            earlier.seq
        )))
    }
}

/// A create found the id registered: fine if identical, else a conflict saying how.
pub(crate) fn existing_batch(new: &NewBatch, existing: Batch) -> StoreResult<Batch> {
    let differences: Vec<String> = [
        (existing.batch_type != new.batch_type)
            .then(|| format!("type {} (registered) vs {}", existing.batch_type, new.batch_type)),
        (existing.priority != new.priority)
            .then(|| format!("priority {} (registered) vs {}", existing.priority, new.priority)),
        (Value::Object(existing.metadata.clone()) != new.metadata).then(|| "metadata differs".to_owned()),
    ]
    .into_iter()
    .flatten()
    .collect();
    if differences.is_empty() {
        Ok(existing)
    } else {
        Err(StoreError::Conflict(format!(
            "batch {} is already registered differently: {}",
            new.id,
            differences.join("; ")
        )))
    }
}

/// The first event of a registration (`register_batch`) names no run, since a new batch has
/// none, and no idempotency key, since the batch's id makes the registration idempotent.
pub(crate) fn check_first_event(first: &NewEvent) -> StoreResult<()> {
    if let Some(run) = &first.run {
        return Err(StoreError::Invalid(InvalidInput::new(
            "first.run",
            run.component.as_str(),
            "a batch being registered has no runs; register it, claim it, then append",
        )));
    }
    if let Some(key) = &first.idempotency_key {
        return Err(StoreError::Invalid(InvalidInput::new(
            "first.idempotency_key",
            key.as_str(),
            "a registration is idempotent by its batch id; its first event takes no key",
        )));
    }
    Ok(())
}

/// Merges a content change's patch into metadata (a `null` removes the key) and checks the
/// result is still an acceptable document.
pub(crate) fn merge_metadata(metadata: Value, patch: Map<String, Value>) -> StoreResult<Value> {
    let mut metadata = match metadata {
        Value::Object(map) => map,
        _ => Map::new(),
    };
    for (key, value) in patch {
        if value.is_null() {
            metadata.remove(&key);
        } else {
            metadata.insert(key, value);
        }
    }
    let metadata = Value::Object(metadata);
    autocomp_model::check_object("metadata", &metadata)?;
    Ok(metadata)
}

/// Longest reason an operator may give for retiring a component.
pub(crate) const MAX_REASON_CHARS: usize = 2_000;

/// A retirement's reason, trimmed: the operator's record of why, so it may not be empty.
pub(crate) fn retirement_reason(reason: &str) -> StoreResult<String> {
    let trimmed = reason.trim();
    if trimmed.is_empty() {
        return Err(InvalidInput::new("reason", reason, "must say why the component is retired").into());
    }
    if trimmed.chars().count() > MAX_REASON_CHARS {
        return Err(InvalidInput::new("reason", reason, format!("at most {MAX_REASON_CHARS} characters")).into());
    }
    Ok(trimmed.to_string())
}

/// A pass whose event type another component in the pipeline already records. The usual
/// cause is a renamed component whose old name is still registered, so the refusal says how
/// to retire it.
pub(crate) fn event_type_taken(event_type: &EventType, other: &str) -> StoreError {
    StoreError::Conflict(format!(
        "event type {event_type} is already recorded by component {other}; if that component was renamed, \
         retire it with `autocomp pipeline forget {other} --reason ...`"
    ))
}

/// A retirement of a component the registry does not hold, listing those it does.
pub(crate) fn unknown_component(name: &ComponentName, known: &[String]) -> StoreError {
    let known = if known.is_empty() { "none".to_string() } else { known.join(", ") };
    InvalidInput::new("component", name.as_str(), format!("not in the component registry (known: {known})")).into()
}

/// A retirement of a component that is retired already.
pub(crate) fn retired_already(name: &ComponentName, retirement: &Retirement) -> StoreError {
    StoreError::Conflict(format!(
        "component {name} was already retired at {} by {}: {}",
        retirement.at, retirement.by, retirement.reason
    ))
}

/// A prefix that makes the idempotency keys one client process invents unique across
/// hosts and restarts: `<tag>.<host>.<pid>.<start time in ns>`.
pub(crate) fn client_key_prefix(tag: &str) -> String {
    let host: String = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .unwrap_or_default()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
        .take(40)
        .collect();
    let started = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    format!("{tag}.{host}.{}.{}", std::process::id(), started.as_nanos())
}

/// Refuses more backlog samples than one call takes, and two samples of one component.
pub(crate) fn check_backlog(samples: &[autocomp_model::BacklogSample]) -> Result<(), InvalidInput> {
    if samples.len() > autocomp_model::MAX_BACKLOG_SAMPLES {
        return Err(InvalidInput::new(
            "samples",
            samples.len().to_string(),
            format!("at most {} per call", autocomp_model::MAX_BACKLOG_SAMPLES),
        ));
    }
    let mut seen = std::collections::HashSet::new();
    for sample in samples {
        if !seen.insert(sample.component.as_str()) {
            return Err(InvalidInput::new("component", sample.component.as_str(), "sampled twice in one call"));
        }
    }
    Ok(())
}

/// The smallest `max_batch_bytes` a store takes: one document of the largest size an event's
/// details may have fits in an empty batch, and a typo (`64` for `64MiB`) is caught.
pub const MIN_MAX_BATCH_BYTES: u64 = autocomp_model::MAX_DOCUMENT_BYTES as u64;

/// Parses a `max_batch_bytes` value: a number of bytes, or one with a binary suffix
/// (`KiB`, `MiB`, `GiB`: `64MiB`). At least `MIN_MAX_BATCH_BYTES`.
pub fn parse_max_batch_bytes(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    let digits_end = trimmed.find(|c: char| !c.is_ascii_digit()).unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(digits_end);
    let unit_bytes: u64 = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        other => {
            return Err(format!(
                "max_batch_bytes={text:?}: unknown unit {other:?}; write bytes, or a number with KiB, MiB or GiB (64MiB)"
            ));
        }
    };
    let bytes = number
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(unit_bytes))
        .filter(|bytes| *bytes <= i64::MAX as u64)
        .ok_or_else(|| format!("max_batch_bytes={text:?}: not a size in bytes (64MiB, 67108864)"))?;
    if bytes < MIN_MAX_BATCH_BYTES {
        return Err(format!(
            "max_batch_bytes={text:?} is {bytes} bytes; at least {MIN_MAX_BATCH_BYTES} (1MiB), so that an event of the \
             largest details allowed fits"
        ));
    }
    Ok(bytes)
}

/// Bytes as people read them: `67108864 bytes (64.0 MiB)`.
fn shown_bytes(bytes: u64) -> String {
    format!("{bytes} bytes ({:.1} MiB)", bytes as f64 / (1024.0 * 1024.0))
}

/// The refusal of a write (`what`: "this event", "this content change") that would take a
/// batch's stored bytes from `holds` to `would`, over the store's cap: bad input naming the
/// batch, the cap and the size, never an outage. Nothing was written.
pub(crate) fn over_batch_cap(batch: &BatchId, what: &str, holds: u64, would: u64, cap: u64) -> StoreError {
    InvalidInput::new(
        "batch",
        batch.as_str(),
        format!(
            "{what} would take the details and metadata it stores to {}, over the store's cap of {} \
             (max_batch_bytes); it stores {} now. Nothing was written. A batch this large is a runaway log \
             or oversized reports; if it is expected, raise max_batch_bytes in the store URL (or \
             `autocomp-store serve --max-batch-bytes`)",
            shown_bytes(would),
            shown_bytes(cap),
            shown_bytes(holds)
        ),
    )
    .into()
}

/// Refuses a write of `adds` more bytes (less `removes`) to a batch holding `holds`.
pub(crate) fn check_batch_bytes(
    batch: &BatchId,
    what: &str,
    holds: u64,
    removes: u64,
    adds: u64,
    cap: u64,
) -> StoreResult<()> {
    let would = holds.saturating_sub(removes).saturating_add(adds);
    if adds > removes && would > cap {
        return Err(over_batch_cap(batch, what, holds, would, cap));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_batch_bytes_reads_bytes_and_binary_units_and_refuses_the_rest() {
        assert_eq!(parse_max_batch_bytes("67108864"), Ok(64 << 20));
        assert_eq!(parse_max_batch_bytes("64MiB"), Ok(64 << 20));
        assert_eq!(parse_max_batch_bytes("2GiB"), Ok(2 << 30));
        assert_eq!(parse_max_batch_bytes("1024KiB"), Ok(1 << 20));
        for bad in ["", "64MB", "-1", "1.5GiB", "64 MiB x", "99999999999999999999GiB"] {
            let err = parse_max_batch_bytes(bad).unwrap_err();
            assert!(err.contains("max_batch_bytes"), "{bad}: {err}");
        }
        assert!(parse_max_batch_bytes("64").unwrap_err().contains("at least"), "a typo for 64MiB");
    }

    #[test]
    fn a_write_over_the_cap_is_refused_naming_batch_cap_and_size() {
        let batch = BatchId::new("B1").unwrap();
        assert!(check_batch_bytes(&batch, "this event", 90, 0, 10, 100).is_ok(), "exactly the cap fits");
        let err = check_batch_bytes(&batch, "this event", 90, 0, 11, 100).unwrap_err();
        let StoreError::Invalid(input) = &err else { panic!("{err}") };
        assert_eq!((input.field.as_str(), input.value.as_str()), ("batch", "B1"));
        assert!(input.reason.contains("101 bytes") && input.reason.contains("100 bytes"), "{err}");
        assert!(input.reason.contains("max_batch_bytes") && input.reason.contains("90 bytes"), "{err}");
        // Shrinking a batch that is over (a lowered cap) is always allowed.
        assert!(check_batch_bytes(&batch, "this content change", 500, 50, 10, 100).is_ok());
    }
}
