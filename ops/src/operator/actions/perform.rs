//! Performing an action on one batch: the one way every action is written, whoever asks
//! (the CLI, a confirmed preview, a bulk action, a resume rerunning failed batches), and the
//! entry points that ask for it.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, Weak};

use autocomp_model::{Batch, BatchId, IdempotencyKey, Seq};
use autocomp_store::{ObjectStore, StoreError};
use serde_json::Value;

use super::Action;
use super::confirm::{Expect, KEY_DETAIL, PlanToken, keyed};
use super::plan::{Plan, Write};
use super::prepared::Prepared;
use super::report::{ActionReport, changes_since};
use crate::operator::{Operator, OperatorError};

impl Operator {
    /// Performs `action` on batch `id` exactly as the CLI does: the same checks, the same
    /// refusals in the same words, the same one store call.
    pub async fn perform(&self, id: &BatchId, action: &Action, reason: &str) -> Result<ActionReport, OperatorError> {
        let prepared = Prepared::new(self, action, reason).await?;
        perform_prepared(&prepared, id, Expect::Nothing, None).await
    }

    /// `perform` as the CLI's `--expect-version` and `--key` ask: refused (an input error
    /// naming `--expect-version`, exit 2) unless the batch's version (its `changed_seq`) is
    /// still `version`; with `key`, a request whose key the batch's log already holds writes
    /// nothing and answers "already done" naming the earlier seq.
    pub async fn perform_expecting(
        &self,
        id: &BatchId,
        action: &Action,
        reason: &str,
        version: Option<Seq>,
        key: Option<&IdempotencyKey>,
    ) -> Result<ActionReport, OperatorError> {
        let prepared = Prepared::new(self, action, reason).await?;
        let expect = version.map_or(Expect::Nothing, Expect::Version);
        perform_prepared(&prepared, id, expect, key).await
    }

    /// Confirms a preview: `plan` is its [`super::ActionPreview::plan`], `key` the confirm's
    /// idempotency key. A request whose key the batch's log already holds writes nothing and
    /// answers "already done" naming the earlier seq; otherwise the action is re-planned and
    /// performed only if the batch's version and the planned write are those previewed, else
    /// it is refused (`OperatorError::Refused`) saying what changed, with nothing written.
    pub async fn perform_confirmed(
        &self,
        id: &BatchId,
        action: &Action,
        reason: &str,
        plan: &str,
        key: &IdempotencyKey,
    ) -> Result<ActionReport, OperatorError> {
        let prepared = Prepared::new(self, action, reason).await?;
        let token = PlanToken::parse(plan)?;
        perform_prepared(&prepared, id, Expect::Plan(token), Some(key)).await
    }

    /// What a confirm of `action` with `key` already did on batch `id`; reads only. The
    /// answer `perform_confirmed` would give it ("already done", with the event recorded
    /// then), a refusal if the key was used on the batch for another request, or `None` while
    /// the batch's log does not hold the key.
    pub async fn find_keyed(
        &self,
        id: &BatchId,
        action: &Action,
        reason: &str,
        key: &IdempotencyKey,
    ) -> Result<Option<ActionReport>, OperatorError> {
        let prepared = Prepared::new(self, action, reason).await?;
        let batch = prepared.store.get_batch(id).await?;
        keyed(&batch, key).map(|earlier| prepared.already_done(&batch, earlier, key)).transpose()
    }
}

/// The one way an action is performed on one batch: one write at a time on the batch in
/// this process; the request's key looked for in the log; the expectation checked; the plan
/// made and written. It runs as a task of its own, so a caller that gives up (a web request
/// whose client went away) cannot end it between the write and the end of its turn on the
/// batch: the next request with the same key finds the write.
pub(super) async fn perform_prepared(
    prepared: &Arc<Prepared>,
    id: &BatchId,
    expect: Expect,
    key: Option<&IdempotencyKey>,
) -> Result<ActionReport, OperatorError> {
    let (prepared, id, key) = (Arc::clone(prepared), id.clone(), key.cloned());
    let task = tokio::spawn(async move { perform_in_turn(&prepared, &id, expect, key.as_ref()).await });
    match task.await {
        Ok(answer) => answer,
        Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
        Err(error) => Err(StoreError::Unavailable(format!(
            "the write was cancelled ({error}: the process is shutting down); whether it was made, `autocomp show` \
             tells"
        ))
        .into()),
    }
}

async fn perform_in_turn(
    prepared: &Prepared,
    id: &BatchId,
    expect: Expect,
    key: Option<&IdempotencyKey>,
) -> Result<ActionReport, OperatorError> {
    let _turn = one_at_a_time(&prepared.store, id).await;
    let batch = prepared.store.get_batch(id).await?;
    if let Some(key) = key
        && let Some(earlier) = keyed(&batch, key)
    {
        return prepared.already_done(&batch, earlier, key);
    }
    expect.check_version(&batch)?;
    let plan = prepared.plan(&batch)?;
    expect.check_write(&plan)?;
    prepared.execute(&batch, plan, key).await
}

/// Per (store, batch) in this process: the writes on one batch go one at a time, so a
/// request looks for its key and re-plans only after the one before it wrote.
type Turns = Mutex<HashMap<(usize, BatchId), Weak<tokio::sync::Mutex<()>>>>;
static TURNS: LazyLock<Turns> = LazyLock::new(Turns::default);

async fn one_at_a_time(store: &Arc<dyn ObjectStore>, batch: &BatchId) -> tokio::sync::OwnedMutexGuard<()> {
    let key = (Arc::as_ptr(store).cast::<()>() as usize, batch.clone());
    let turn = {
        let mut turns = TURNS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        turns.retain(|_, turn| turn.strong_count() > 0);
        match turns.get(&key).and_then(Weak::upgrade) {
            Some(turn) => turn,
            None => {
                let turn = Arc::new(tokio::sync::Mutex::new(()));
                turns.insert(key, Arc::downgrade(&turn));
                turn
            }
        }
    };
    turn.lock_owned().await
}

impl Prepared {
    /// Makes the plan's one store call and reports what changed. With `key`, the event's
    /// details record it, and an append gives it to the store as the append's idempotency
    /// key: a concurrent request with the same key from another process gets this event back
    /// instead of writing a second.
    async fn execute(
        &self,
        batch: &Batch,
        plan: Plan,
        key: Option<&IdempotencyKey>,
    ) -> Result<ActionReport, OperatorError> {
        let store = self.store.as_ref();
        let Plan { mut write, message } = plan;
        let mut head = None;
        if let Some(key) = key {
            let event = write.event_mut();
            if let Value::Object(details) = &mut event.details {
                details.insert(KEY_DETAIL.into(), Value::from(key.as_str()));
            }
            if let Write::Append(event) = &mut write {
                event.idempotency_key = Some(key.clone());
                head = Some(store.head().await?);
            }
        }
        let (recorded, closed) = match write {
            Write::Append(event) => match store.append_event(&batch.id, event).await {
                // The key was used for another event (another batch, another request).
                Err(StoreError::Conflict(words)) => {
                    return Err(OperatorError::Refused(format!("{words}; nothing written")));
                }
                other => (other?, None),
            },
            Write::Cancel(component, event) => {
                let cancellation = store.cancel_run(&batch.id, &component, event).await?;
                (cancellation.event, cancellation.run)
            }
            Write::Prioritize(priority, event) => (store.prioritize(&batch.id, priority, event).await?, None),
        };
        // The store answered with an event older than this call: another process's request
        // with the same key wrote it first.
        if let (Some(key), Some(head)) = (key, head)
            && recorded.seq <= head
        {
            return self.already_done(batch, &recorded, key);
        }
        Ok(ActionReport {
            batch: batch.id.clone(),
            message: message(&recorded, closed.as_ref()),
            changes: changes_since(store, &self.context.pipeline, batch).await?,
            event: Some(recorded),
            already_done: false,
        })
    }
}
