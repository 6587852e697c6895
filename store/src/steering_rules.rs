//! What every backend checks the same way on a steering change and on the notification
//! outbox (reasons, keys, channels, bodies, leases, retry times, the cursor), and how a
//! model's refusal becomes a store error, so the SQLite and PostgreSQL answers cannot drift.

use std::time::Duration;

use crate::error::{StoreError, StoreResult};
use crate::pipeline_state::*;
use autocomp_model::{InvalidInput, SteeringChange, SteeringRefusal, SteeringRequest, is_concealing};

pub(crate) fn refused(refusal: SteeringRefusal) -> StoreError {
    match refusal {
        SteeringRefusal::Invalid(e) => StoreError::Invalid(e),
        SteeringRefusal::AlreadyInState(message) => StoreError::AlreadyInState(message),
        SteeringRefusal::ChangedSincePreview(message) => StoreError::ChangedSincePreview(message),
        SteeringRefusal::Conflict(message) => StoreError::Conflict(message),
        // A refusal this release does not know yet: a conflict, as every refusal was once.
        other => StoreError::Conflict(other.to_string()),
    }
}

/// A steering request every backend accepts: a change the model can apply.
pub(crate) fn check_steering(request: &SteeringRequest) -> StoreResult<()> {
    if request.reason.chars().any(is_concealing) {
        return Err(InvalidInput::new("reason", &request.reason, "must not hide text from a terminal").into());
    }
    Ok(())
}

/// The request as every backend applies it: a breaker count's failure summary (a command's
/// output, of any length) cut to `MAX_OUTCOME_SUMMARY_CHARS`, since the change is kept whole in
/// the log entry of the count that opens the circuit.
pub(crate) fn bounded(mut request: SteeringRequest) -> SteeringRequest {
    if let SteeringChange::Outcome { summary, .. } = &mut request.change
        && let Some((at, _)) = summary.char_indices().nth(MAX_OUTCOME_SUMMARY_CHARS)
    {
        summary.truncate(at);
        summary.push('…');
    }
    request
}

pub(crate) fn check_log_limit(limit: usize) -> StoreResult<()> {
    if limit == 0 || limit > MAX_STEERING_LOG_PAGE {
        let why = format!("must be 1 to {MAX_STEERING_LOG_PAGE}");
        return Err(InvalidInput::new("limit", limit.to_string(), why).into());
    }
    Ok(())
}

pub(crate) fn check_notices(notices: &[NewNotice]) -> StoreResult<()> {
    if notices.len() > MAX_NOTICES_PER_CALL {
        let why = format!("at most {MAX_NOTICES_PER_CALL} per request");
        return Err(InvalidInput::new("notices", notices.len().to_string(), why).into());
    }
    for notice in notices {
        check_key(&notice.key)?;
        if !matches!(notice.channel.as_str(), "mail" | "webhook") {
            return Err(InvalidInput::new("channel", &notice.channel, "expected mail or webhook").into());
        }
        if notice.subject.is_empty() || notice.subject.chars().count() > 500 || notice.subject.contains(['\r', '\n']) {
            return Err(InvalidInput::new("subject", &notice.subject, "must be 1-500 characters on one line").into());
        }
        if !notice.body.is_object() || notice.body.to_string().len() > MAX_NOTICE_BYTES {
            let why = format!("must be a JSON object of at most {MAX_NOTICE_BYTES} bytes");
            return Err(InvalidInput::new("body", &notice.key, why).into());
        }
    }
    Ok(())
}

pub(crate) fn check_key(key: &str) -> StoreResult<()> {
    let printable = key.chars().all(|c| c.is_ascii_graphic());
    if key.is_empty() || key.chars().count() > MAX_NOTICE_KEY_CHARS || !printable {
        let why = format!("must be 1-{MAX_NOTICE_KEY_CHARS} printable ASCII characters without spaces");
        return Err(InvalidInput::new("notice key", key, why).into());
    }
    Ok(())
}

fn check_holder(holder: &str) -> StoreResult<()> {
    if holder.is_empty() || holder.chars().count() > 255 || holder.chars().any(char::is_control) {
        return Err(InvalidInput::new("holder", holder, "must be 1-255 printable characters").into());
    }
    Ok(())
}

pub(crate) fn check_take(holder: &str, limit: usize, lease: Duration) -> StoreResult<()> {
    check_holder(holder)?;
    if limit == 0 || limit > MAX_NOTICES_PER_CALL {
        let why = format!("must be 1 to {MAX_NOTICES_PER_CALL}");
        return Err(InvalidInput::new("limit", limit.to_string(), why).into());
    }
    if lease.is_zero() || lease > MAX_NOTICE_LEASE {
        let why = format!("must be more than 0 and at most {}", humantime::format_duration(MAX_NOTICE_LEASE));
        return Err(InvalidInput::new("lease", humantime::format_duration(lease).to_string(), why).into());
    }
    Ok(())
}

/// A settle every backend accepts: a notice key, a holder as `check_take` accepts it, and a
/// retry time of at most `MAX_NOTICE_RETRY` (an unbounded one overflowed the store's clock:
/// `Duration::MAX` wrapped around to a time already past, so "much later" meant "at once").
pub(crate) fn check_settle(key: &str, holder: &str, outcome: &NoticeOutcome) -> StoreResult<()> {
    check_key(key)?;
    check_holder(holder)?;
    if let NoticeOutcome::Failed { retry_in, .. } = outcome
        && *retry_in > MAX_NOTICE_RETRY
    {
        let why = format!("must be at most {}", humantime::format_duration(MAX_NOTICE_RETRY));
        return Err(InvalidInput::new("retry_in", humantime::format_duration(*retry_in).to_string(), why).into());
    }
    Ok(())
}

/// The error text kept with a failed delivery: one line, bounded.
pub(crate) fn kept_error(outcome: &NoticeOutcome) -> Option<String> {
    match outcome {
        NoticeOutcome::Sent => None,
        NoticeOutcome::Failed { error, .. } => {
            let line: String = error.chars().map(|c| if c.is_control() { ' ' } else { c }).take(500).collect();
            Some(line)
        }
    }
}

pub(crate) fn check_cursor(cursor: &Option<CursorMove>) -> StoreResult<()> {
    if let Some(CursorMove { from, to }) = cursor
        && to < from
    {
        return Err(InvalidInput::new("cursor", format!("{} -> {}", from.0, to.0), "must not move backwards").into());
    }
    Ok(())
}
