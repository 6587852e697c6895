//! Confirming what was previewed, once. A preview carries a plan token ([`PlanToken`]: the
//! batch's version, its `changed_seq`, and the write planned against it); a confirm
//! re-plans and acts only if both are still the same, else refuses saying what changed. A
//! confirm may carry an idempotency key: it is recorded in the event's details (and given to
//! the store as the append's key, where the store takes one), and a confirm whose key the
//! batch's log already holds writes nothing and answers "already done" with the earlier
//! seq. A bulk confirm derives each batch's key from its own ([`derived_key`]).
//!
//! Within one process the writes on one batch are made one at a time (look for the key,
//! re-plan, write: `perform`), so a double submit cannot slip between the look and the
//! write; across processes the store's idempotency key closes that gap for appends (rerun,
//! restart, skip), while `cancel_run` and `prioritize` take no key in the store yet.

use std::fmt;

use autocomp_model::{Batch, BatchId, Event, IdempotencyKey, InvalidInput, Seq};
use serde_json::Value;
use sha2::{Digest as _, Sha256};

use super::plan::{Plan, Write};
use super::prepared::Prepared;
use super::report::{ActionReport, wrote};
use crate::operator::OperatorError;

/// The key of an operator event's details that holds the idempotency key of the request
/// that wrote it.
pub(super) const KEY_DETAIL: &str = "idempotency_key";

/// What a write must still match when it is made.
pub(super) enum Expect {
    Nothing,
    /// The CLI's `--expect-version`: the batch's version.
    Version(Seq),
    /// A confirmed preview's plan token: the version and the planned write.
    Plan(PlanToken),
    /// A bulk confirm's check: the version read when the digest was checked.
    Batch(Seq),
}

impl Expect {
    /// Refuses, with nothing written, unless `batch` is at the version expected.
    pub fn check_version(&self, batch: &Batch) -> Result<(), OperatorError> {
        let (id, now) = (&batch.id, batch.changed_seq);
        match self {
            Expect::Version(version) if *version != now => Err(InvalidInput::new(
                "--expect-version",
                version.to_string(),
                format!(
                    "batch {id} is at version {now} now: it changed since (`autocomp show {id}` tells how); nothing \
                     was done"
                ),
            )
            .into()),
            Expect::Plan(token) if token.version != now => Err(OperatorError::Refused(format!(
                "the batch changed since your preview (seq {} -> {now}): nothing was done; review and confirm again",
                token.version
            ))),
            Expect::Batch(version) if *version != now => Err(OperatorError::Refused(format!(
                "{id} changed since the preview was checked (seq {version} -> {now}): nothing was done on it"
            ))),
            _ => Ok(()),
        }
    }

    /// Refuses, with nothing written, unless `plan` writes what the confirmed preview planned.
    pub fn check_write(&self, plan: &Plan) -> Result<(), OperatorError> {
        if let Expect::Plan(token) = self {
            let writes = plan.write.describe();
            if token.writes != writes {
                return Err(OperatorError::Refused(format!(
                    "what this action would write changed since your preview ({} -> {writes}): nothing was done; \
                     review and confirm again",
                    token.writes
                )));
            }
        }
        Ok(())
    }
}

/// A single preview's plan token, `VERSION:WRITES` ([`Write::describe`]).
pub(super) struct PlanToken {
    version: Seq,
    writes: String,
}

impl PlanToken {
    pub fn new(version: Seq, write: &Write) -> PlanToken {
        PlanToken { version, writes: write.describe() }
    }

    pub fn parse(text: &str) -> Result<PlanToken, InvalidInput> {
        let bad = || InvalidInput::new("plan", text, "expected VERSION:WRITES, as the preview's confirm form posts it");
        let (version, writes) = text.split_once(':').ok_or_else(bad)?;
        let version = version.parse::<i64>().map_err(|_| bad())?;
        if writes.is_empty() {
            return Err(bad());
        }
        Ok(PlanToken { version: Seq(version), writes: writes.to_owned() })
    }
}

impl fmt::Display for PlanToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.version, self.writes)
    }
}

/// Each batch's key of a bulk confirm: the SHA-256 (hex) of the bulk key and the batch id.
pub(super) fn derived_key(bulk: &IdempotencyKey, batch: &BatchId) -> IdempotencyKey {
    let mut hash = Sha256::new();
    hash.update(bulk.as_str().as_bytes());
    hash.update(b"\n");
    hash.update(batch.as_str().as_bytes());
    IdempotencyKey::new(hex::encode(hash.finalize())).expect("64 hex digits are a valid idempotency key")
}

/// The event of the batch's log a request with `key` recorded, if any.
pub(super) fn keyed<'b>(batch: &'b Batch, key: &IdempotencyKey) -> Option<&'b Event> {
    batch.events.iter().find(|e| e.details.get(KEY_DETAIL).and_then(Value::as_str) == Some(key.as_str()))
}

impl Prepared {
    /// The answer to a request whose key the log holds: what it wrote then, if it was this
    /// action; else a refusal (the key was used for something else).
    pub fn already_done(
        &self,
        batch: &Batch,
        earlier: &Event,
        key: &IdempotencyKey,
    ) -> Result<ActionReport, OperatorError> {
        let detail = |name: &str| earlier.details.get(name).and_then(Value::as_str);
        let same = detail("action") == Some(self.action.name())
            && self.action.component().is_none_or(|component| detail("component") == Some(component));
        if !same {
            return Err(OperatorError::Refused(format!(
                "the key {key} was already used on {} for another request ({} by {}, {}); nothing was done: a new \
                 request needs a new key",
                batch.id,
                detail("action").unwrap_or("an event"),
                earlier.agent,
                wrote(earlier)
            )));
        }
        Ok(ActionReport {
            batch: batch.id.clone(),
            message: format!(
                "{}: already done: seq {} — this request recorded {} (by {} at {}); nothing was written now",
                batch.id,
                earlier.seq,
                wrote(earlier),
                earlier.agent,
                earlier.at
            ),
            event: Some(earlier.clone()),
            changes: Vec::new(),
            already_done: true,
        })
    }
}
