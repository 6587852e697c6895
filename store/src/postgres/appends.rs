//! Appends on PostgreSQL in groups: concurrent appends through one handle queue in lanes and
//! each lane's leader sends its group as one call, so a busy runner's appends share commits.

use serde_json::Value;

use super::calls::{CONDITIONAL_ROUNDS, Scope, optional_json, prepare};
use super::rows::{EventRow, corrupt, runs_from_json};
use super::text::{self};
use super::{Failure, PgBackend, Retry};
use crate::port::{HandedOn, StoreError, StoreResult};
use crate::write_rules::{self};
use autocomp_model::{BatchId, ComponentName, Event, IdempotencyKey, NewEvent, Run, Seq, Timestamp};

/// Most appends one group carries: enough to share a commit among a busy host's writers.
pub(super) const MAX_GROUP: usize = 64;
/// Groups in flight at once per handle: one commits while the next fills.
pub(super) const APPEND_LANES: usize = 2;

/// Appends waiting for a group, and how many tasks are sending groups.
#[derive(Default)]
pub(crate) struct AppendQueue {
    pending: Vec<PendingAppend>,
    leaders: usize,
}

pub(crate) struct PendingAppend {
    batch: BatchId,
    event: NewEvent,
    /// The steps to hand the batch on to (`HandOnStore::append_handing_on`).
    hand_on: Vec<ComponentName>,
    reply: tokio::sync::oneshot::Sender<StoreResult<HandedOn>>,
}

impl PgBackend {
    /// Group commit: appends through this handle queue, and up to `APPEND_LANES` background
    /// tasks send what is queued as one call of `autocomp_append_group` (one transaction,
    /// one commit flush), each append answered on its own.
    pub(super) async fn pg_append(
        &self,
        batch: &BatchId,
        mut event: NewEvent,
        hand_on: Vec<ComponentName>,
    ) -> StoreResult<HandedOn> {
        // With a key a retry after a lost answer returns the first event instead of a second.
        if event.idempotency_key.is_none() {
            event.idempotency_key = Some(self.fresh_key());
        }
        let (reply, answer) = tokio::sync::oneshot::channel();
        let lead = {
            let mut queue = self.inner.appends.lock().unwrap_or_else(|p| p.into_inner());
            queue.pending.push(PendingAppend { batch: batch.clone(), event, hand_on, reply });
            let lead = queue.leaders < APPEND_LANES;
            if lead {
                queue.leaders += 1;
            }
            lead
        };
        if lead {
            tokio::spawn(self.clone().lead_appends());
        }
        answer.await.map_err(|_| StoreError::Unavailable("the append was lost with its store task".into()))?
    }

    /// Sends queued appends as groups until the queue is empty.
    pub(super) async fn lead_appends(self) {
        loop {
            let group: Vec<PendingAppend> = {
                let mut queue = self.inner.appends.lock().unwrap_or_else(|p| p.into_inner());
                if queue.pending.is_empty() {
                    queue.leaders -= 1;
                    return;
                }
                let take = queue.pending.len().min(MAX_GROUP);
                queue.pending.drain(..take).collect()
            };
            let answers = self.append_group(&group).await;
            for (pending, answer) in group.into_iter().zip(answers) {
                let answer = answer.and_then(|recorded| match recorded {
                    Recorded::New(seq, at, runs) => {
                        Ok(HandedOn { event: pending.event.clone().recorded(&pending.batch, seq, at), runs })
                    }
                    Recorded::Earlier(earlier) => write_rules::earlier_append(&pending.batch, &pending.event, earlier)
                        .map(|event| HandedOn { event, runs: Vec::new() }),
                });
                let _ = pending.reply.send(answer); // the caller may have gone; the event stands regardless
            }
        }
    }

    /// One group, one call. When PostgreSQL refuses the data of one of its appends (a
    /// data exception fails the whole call), each append is sent again alone, so only the
    /// one at fault is refused.
    pub(super) async fn append_group(&self, group: &[PendingAppend]) -> Vec<StoreResult<Recorded>> {
        let answers = self.send_group(group).await;
        let refused_data =
            |answer: &StoreResult<Recorded>| matches!(answer, Err(StoreError::Invalid(i)) if i.field == "data");
        if group.len() > 1 && answers.first().is_some_and(refused_data) {
            let mut alone = Vec::with_capacity(group.len());
            for pending in group {
                alone.extend(self.send_group(std::slice::from_ref(pending)).await);
            }
            return alone;
        }
        answers
    }

    /// One group, one call; retried whole (every append carries a key, so a retry after a
    /// lost answer finds what the first attempt recorded).
    pub(super) async fn send_group(&self, group: &[PendingAppend]) -> Vec<StoreResult<Recorded>> {
        let column = |f: &dyn Fn(&PendingAppend) -> Option<&str>| group.iter().map(f).collect::<Vec<_>>();
        let batches = column(&|p| Some(p.batch.as_str()));
        let types = column(&|p| Some(p.event.event_type.as_str()));
        let outcomes = column(&|p| Some(p.event.outcome.as_str()));
        let agents = column(&|p| Some(p.event.agent.as_str()));
        let components = column(&|p| p.event.run.as_ref().map(|r| r.component.as_str()));
        let keys = column(&|p| p.event.idempotency_key.as_ref().map(IdempotencyKey::as_str));
        let stored_details: Vec<std::borrow::Cow<'_, Value>> =
            group.iter().map(|p| text::json(&p.event.details)).collect();
        let details: Vec<&Value> = stored_details.iter().map(|d| &**d).collect();
        let generations: Vec<Option<i64>> = group.iter().map(|p| p.event.run.as_ref().map(|r| r.generation)).collect();
        let resets: Vec<Option<Value>> = group.iter().map(|p| optional_json(&p.event.resets)).collect();
        let hand_ons: Vec<Option<Value>> =
            group.iter().map(|p| (!p.hand_on.is_empty()).then(|| serde_json::json!(p.hand_on))).collect();
        let cap = self.cap();
        // The append group with hand-ons is schema 24's; a group naming none calls the one
        // every schema this release runs on has (`schema::OLDEST_RUNNABLE`), whose takers
        // table is then absent and whose watchers never offer.
        let handing_on = group.iter().any(|p| !p.hand_on.is_empty());
        let (sql, columns) = match handing_on {
            true => (
                "SELECT r_index, r_seq, r_at, r_earlier::text, r_refused, r_reason, r_handed::text
                 FROM autocomp_append_group($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
                11,
            ),
            false => (
                "SELECT r_index, r_seq, r_at, r_earlier::text, r_refused, r_reason
                 FROM autocomp_append_group($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
                10,
            ),
        };
        let answered = self
            .run("append_event", Retry::Safe, |client, _| {
                let params: [&(dyn tokio_postgres::types::ToSql + Sync); 11] = [
                    &batches,
                    &types,
                    &outcomes,
                    &agents,
                    &details,
                    &components,
                    &generations,
                    &resets,
                    &keys,
                    &cap,
                    &hand_ons,
                ];
                Box::pin(async move {
                    let statement = prepare(client, sql).await?;
                    let rows = client
                        .query(&statement, &params[..columns])
                        .await
                        .map_err(|e| self.failure(e, &Scope { batch: &group[0].batch, run: None }))?;
                    let mut answers: Vec<Option<StoreResult<Recorded>>> = group.iter().map(|_| None).collect();
                    for row in &rows {
                        let index = usize::try_from(row.get::<_, i32>(0) - 1).map_err(|e| corrupt("answer", e))?;
                        let pending = group.get(index).ok_or_else(|| corrupt("answer", index))?;
                        let answer = self.answer_of(row, pending, handing_on)?;
                        answers[index] = Some(answer);
                    }
                    answers
                        .into_iter()
                        .map(|answer| answer.ok_or_else(|| corrupt("answer", "an append went unanswered")))
                        .collect::<Result<Vec<_>, _>>()
                })
            })
            .await;
        match answered {
            Ok(answers) => answers,
            Err(error) => {
                let message = error.to_string();
                let mut first = Some(error);
                group
                    .iter()
                    .map(|_| Err(first.take().unwrap_or_else(|| StoreError::Unavailable(message.clone()))))
                    .collect()
            }
        }
    }
}

impl PgBackend {
    /// One append's answer in its group's rows: a refusal (not found, over the cap, fenced),
    /// the event its key had recorded before, or the new event's seq and time with the runs
    /// it handed its batch on to (the rows carry them when the group named hand-ons). The
    /// outer error is a corrupt answer.
    fn answer_of(
        &self,
        row: &tokio_postgres::Row,
        pending: &PendingAppend,
        handing_on: bool,
    ) -> Result<StoreResult<Recorded>, Failure> {
        Ok(match (row.get::<_, Option<&str>>(4), row.get::<_, Option<&str>>(3)) {
            (Some("AC404"), _) => Err(StoreError::NotFound(pending.batch.clone())),
            (Some("AC413"), _) => {
                let sizes = row.get::<_, Option<String>>(5).unwrap_or_default();
                Err(self.over_cap(&pending.batch, &sizes, "this event"))
            }
            (Some(_), _) => {
                let run = pending.event.run.as_ref().ok_or_else(|| corrupt("answer", "fenced, no run"))?;
                Err(StoreError::Fenced {
                    batch: pending.batch.clone(),
                    component: run.component.clone(),
                    generation: run.generation,
                    reason: row.get::<_, Option<String>>(5).unwrap_or_default(),
                })
            }
            (None, Some(earlier)) => {
                let earlier: EventRow = serde_json::from_str(earlier).map_err(|e| corrupt("event", e))?;
                Ok(Recorded::Earlier(earlier.into_event()?))
            }
            (None, None) => {
                let handed = match handing_on {
                    true => runs_from_json(row.get::<_, Option<&str>>(6))?,
                    false => Vec::new(),
                };
                Ok(Recorded::New(Seq(row.get(1)), Timestamp(row.get(2)), handed))
            }
        })
    }
}

/// What an append's group recorded for it.
pub(super) enum Recorded {
    /// Recorded at this seq and time, with the runs it opened for the steps it handed its
    /// batch on to.
    New(Seq, Timestamp, Vec<Run>),
    /// Its idempotency key had recorded this event before; nothing new was written.
    Earlier(Event),
}

pub(super) fn busy(id: &BatchId) -> StoreError {
    StoreError::Unavailable(format!(
        "batch {id} kept changing while this write was prepared ({CONDITIONAL_ROUNDS} rounds); nothing was written"
    ))
}
