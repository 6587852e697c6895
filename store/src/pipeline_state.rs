//! The store's side of steering the pipeline: what a steering change answers, and the
//! notification outbox (items to send, each claimed by one notifier at a time and marked
//! sent once) with its bounds. Plain types; the checks on them are `steering_rules`.

use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use autocomp_model::{Seq, Steering, SteeringEntry, Timestamp};

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
