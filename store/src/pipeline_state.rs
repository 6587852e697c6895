//! The store's side of steering the pipeline: what a steering change answers, and the
//! notification outbox (items to send, each claimed by one notifier at a time and marked
//! sent once), with the rules every backend applies to them the same way.

use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::port::{StoreError, StoreResult};
use autocomp_model::{
    InvalidInput, Seq, Steering, SteeringChange, SteeringEntry, SteeringRefusal, SteeringRequest, Timestamp,
    is_concealing,
};

/// The notifiers' cursor before any notifier ran: the first starts at the store's head
/// (even an empty store's, 0), so it never mistakes a later pass for the first.
pub const CURSOR_UNSET: Seq = Seq(-1);

/// Most entries one read of the steering log returns.
pub const MAX_STEERING_LOG_PAGE: usize = 1_000;
/// Most notices one enqueue or take handles.
pub const MAX_NOTICES_PER_CALL: usize = 1_000;
/// Longest notice key.
pub const MAX_NOTICE_KEY_CHARS: usize = 300;
/// Largest notice body, serialized.
pub const MAX_NOTICE_BYTES: usize = 64 * 1024;
/// Longest lease a notifier may take on the notices it sends.
pub const MAX_NOTICE_LEASE: Duration = Duration::from_secs(3_600);
/// Longest a notifier may put off a failed notice's next delivery (`NoticeOutcome::Failed`).
pub const MAX_NOTICE_RETRY: Duration = Duration::from_secs(7 * 24 * 3_600);
/// Longest failure summary a breaker's count (`SteeringChange::Outcome`) is kept with in the
/// steering log; the rest is cut, marked with `…`.
pub const MAX_OUTCOME_SUMMARY_CHARS: usize = 2_000;

/// What `ObjectStore::steer` did: the state after the change, and its log entry (none for a
/// breaker count that opened nothing).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Steered {
    pub steering: Steering,
    pub entry: Option<SteeringEntry>,
    /// The change opened a component's circuit.
    pub circuit_opened: bool,
}

/// One item for one notification channel, as a notifier found it. Its key says what it is
/// about and where it goes (`mail:failure:B1:812`); an item whose key the outbox holds already
/// is not added again, so every notifier may enqueue what it found and each item is sent once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NewNotice {
    pub key: String,
    /// The channel that sends it (`mail`, `webhook`).
    pub channel: String,
    pub subject: String,
    /// What the channel sends: a JSON object (the webhook's payload; the mail's text and facts).
    pub body: Value,
}

/// A notice in the outbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Notice {
    pub key: String,
    pub channel: String,
    pub subject: String,
    pub body: Value,
    pub created_at: Timestamp,
    /// Deliveries tried and failed so far.
    pub attempts: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// When it was sent; `None` while pending.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sent_at: Option<Timestamp>,
}

/// How a notifier's delivery of a notice it took ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum NoticeOutcome {
    /// Delivered: never sent again.
    Sent,
    /// Not delivered (the receiver down, refused): tried again once `retry_in` has passed.
    Failed {
        error: String,
        #[serde(with = "autocomp_model::duration_text")]
        #[schemars(with = "String")]
        retry_in: Duration,
    },
}

/// What an enqueue did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Enqueued {
    /// The notices that were new (the others were in the outbox already).
    pub added: u64,
    /// The notifiers' cursor in the change feed after the call.
    pub cursor: Seq,
}

/// How far the notifiers have looked through the change feed, moved only from where the
/// caller read it (so two notifiers never move it backwards).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CursorMove {
    pub from: Seq,
    pub to: Seq,
}

pub(crate) fn refused(refusal: SteeringRefusal) -> StoreError {
    match refusal {
        SteeringRefusal::Invalid(e) => StoreError::Invalid(e),
        SteeringRefusal::Conflict(message) => StoreError::Conflict(message),
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
