//! PostgreSQL's steering record and log, and the notification outbox. A steering change is
//! computed here by `Steering::apply` from the record as read (with the server's clock) and
//! written only if the record's version has not moved (`autocomp_steer`); otherwise it reads
//! again. The outbox's functions lease rows with `SKIP LOCKED`, so notifiers never wait on or
//! take each other's notices.

use std::time::Duration;

use serde_json::Value;

use super::ops::{corrupt, prepare};
use super::text::{self, unjsoned, untext};
use super::{PgStore, Retry};
use crate::pipeline_state::{CursorMove, Enqueued, NewNotice, Notice, NoticeOutcome, Steered};
use crate::port::{StoreError, StoreResult};
use crate::steering_rules;
use autocomp_model::{Seq, Steering, SteeringEntry, SteeringRequest, Timestamp};

/// How long a change is computed again after other writers moved the record first, before it
/// is given up as `Unavailable`: long enough for any burst of concurrent changes (a pipeline's
/// runners each counting a failure), which a fixed number of attempts was not.
const STEER_PATIENCE: Duration = Duration::from_secs(30);
/// The longest pause between two attempts; each pause is drawn at random up to a bound that
/// doubles with every lost race, so writers that collided spread out instead of colliding again.
const STEER_MAX_PAUSE_MS: u64 = 64;

/// A pause of 0 to `bound_ms` milliseconds, drawn at random.
fn jitter(bound_ms: u64) -> Duration {
    use std::hash::BuildHasher;
    // Each `RandomState` is keyed anew: a different draw per call, per process.
    let random = std::collections::hash_map::RandomState::new().hash_one(std::time::Instant::now());
    Duration::from_micros(random % (bound_ms * 1_000 + 1))
}

const NOTICE_COLUMNS: &str = "key, channel, subject, body, created_at, attempts, last_error, sent_at";

fn notice(row: &tokio_postgres::Row) -> Notice {
    Notice {
        key: row.get("key"),
        channel: row.get("channel"),
        subject: untext(row.get("subject")),
        body: unjsoned(row.get("body")),
        created_at: Timestamp(row.get("created_at")),
        attempts: row.get::<_, i32>("attempts") as u32,
        last_error: row.get::<_, Option<String>>("last_error").map(untext),
        sent_at: row.get::<_, Option<i64>>("sent_at").map(Timestamp),
    }
}

impl PgStore {
    /// The record with its version and the server's clock.
    async fn read_steering(&self) -> StoreResult<(Steering, i64, Timestamp)> {
        self.run("steering", Retry::Safe, |client, _| {
            Box::pin(async move {
                let statement =
                    prepare(client, "SELECT state, version, autocomp_now() FROM steering WHERE id = 1").await?;
                let row = client.query_one(&statement, &[]).await.map_err(|e| self.read_failure(e))?;
                let mut steering: Steering =
                    serde_json::from_value(unjsoned(row.get(0))).map_err(|e| corrupt("steering record", e))?;
                let version: i64 = row.get(1);
                steering.version = version as u64;
                Ok((steering, version, Timestamp(row.get(2))))
            })
        })
        .await
    }

    pub(super) async fn pg_steering(&self) -> StoreResult<Steering> {
        Ok(self.read_steering().await?.0)
    }

    pub(super) async fn pg_steer(&self, request: SteeringRequest) -> StoreResult<Steered> {
        steering_rules::check_steering(&request)?;
        let request = steering_rules::bounded(request);
        let deadline = tokio::time::Instant::now() + STEER_PATIENCE;
        let mut lost = 0u32;
        loop {
            let (mut steering, version, at) = self.read_steering().await?;
            let applied = steering.apply(&request, at).map_err(steering_rules::refused)?;
            if !applied.changed {
                // Nothing to write: the head stays, no watcher wakes.
                return Ok(Steered { steering, entry: None, circuit_opened: false });
            }
            let state = serde_json::to_value(&steering).map_err(|e| StoreError::Unavailable(e.to_string()))?;
            let entry = match &applied.entry {
                Some(entry) => Some(serde_json::to_value(entry).map_err(|e| StoreError::Unavailable(e.to_string()))?),
                None => None,
            };
            let (state, entry) = (text::json(&state).into_owned(), entry.map(|e| text::json(&e).into_owned()));
            let (state, entry) = (&state, &entry);
            let written = self
                .run("steer", Retry::OnlyUnsent, |client, _| {
                    Box::pin(async move {
                        let statement = prepare(client, "SELECT autocomp_steer($1, $2, $3, $4)").await?;
                        let row = client
                            .query_one(&statement, &[&version, state, entry, &at.millis()])
                            .await
                            .map_err(|e| self.read_failure(e))?;
                        Ok(row.get::<_, bool>(0))
                    })
                })
                .await?;
            if written {
                return Ok(Steered { steering, entry: applied.entry, circuit_opened: applied.circuit_opened });
            }
            // Another writer changed the record since it was read: compute the change again.
            lost += 1;
            let pause = jitter((1u64 << lost.min(6)).min(STEER_MAX_PAUSE_MS));
            if tokio::time::Instant::now() + pause >= deadline {
                return Err(StoreError::Unavailable(format!(
                    "the steering record kept changing under {lost} attempts to change it over {}; try again",
                    humantime::format_duration(STEER_PATIENCE)
                )));
            }
            tokio::time::sleep(pause).await;
        }
    }

    pub(super) async fn pg_steering_log(&self, limit: usize) -> StoreResult<Vec<SteeringEntry>> {
        steering_rules::check_log_limit(limit)?;
        self.run("steering_log", Retry::Safe, |client, _| {
            Box::pin(async move {
                let statement =
                    prepare(client, "SELECT entry FROM steering_log ORDER BY version DESC LIMIT $1").await?;
                let rows = client.query(&statement, &[&(limit as i64)]).await.map_err(|e| self.read_failure(e))?;
                rows.iter()
                    .map(|row| serde_json::from_value(unjsoned(row.get(0))).map_err(|e| corrupt("steering log", e)))
                    .collect()
            })
        })
        .await
    }

    pub(super) async fn pg_enqueue_notices(
        &self,
        notices: Vec<NewNotice>,
        cursor: Option<CursorMove>,
    ) -> StoreResult<Enqueued> {
        steering_rules::check_notices(&notices)?;
        steering_rules::check_cursor(&cursor)?;
        let keys: Vec<&str> = notices.iter().map(|n| n.key.as_str()).collect();
        let channels: Vec<&str> = notices.iter().map(|n| n.channel.as_str()).collect();
        let subjects: Vec<String> = notices.iter().map(|n| text::text(&n.subject).into_owned()).collect();
        let bodies: Vec<Value> = notices.iter().map(|n| text::json(&n.body).into_owned()).collect();
        let (from, to) = (cursor.map(|c| c.from.0), cursor.map(|c| c.to.0));
        let (keys, channels, subjects, bodies) = (&keys, &channels, &subjects, &bodies);
        self.run("enqueue_notices", Retry::Safe, |client, _| {
            Box::pin(async move {
                let statement =
                    prepare(client, "SELECT r_added, r_cursor FROM autocomp_enqueue_notices($1, $2, $3, $4, $5, $6)")
                        .await?;
                let row = client
                    .query_one(&statement, &[keys, channels, subjects, bodies, &from, &to])
                    .await
                    .map_err(|e| self.read_failure(e))?;
                Ok(Enqueued { added: row.get::<_, i64>(0) as u64, cursor: Seq(row.get(1)) })
            })
        })
        .await
    }

    pub(super) async fn pg_take_notices(
        &self,
        holder: &str,
        limit: usize,
        lease: Duration,
    ) -> StoreResult<Vec<Notice>> {
        steering_rules::check_take(holder, limit, lease)?;
        let (limit, lease_ms) = (limit as i32, lease.as_millis() as i64);
        let holder = &text::text(holder).into_owned();
        let mut taken = self
            .run("take_notices", Retry::OnlyUnsent, |client, _| {
                Box::pin(async move {
                    let sql = format!("SELECT {NOTICE_COLUMNS} FROM autocomp_take_notices($1, $2, $3)");
                    let statement = prepare(client, &sql).await?;
                    let rows = client
                        .query(&statement, &[holder, &limit, &lease_ms])
                        .await
                        .map_err(|e| self.read_failure(e))?;
                    Ok(rows.iter().map(notice).collect::<Vec<_>>())
                })
            })
            .await?;
        taken.sort_by(|a, b| (a.created_at, &a.key).cmp(&(b.created_at, &b.key)));
        Ok(taken)
    }

    pub(super) async fn pg_settle_notice(&self, key: &str, holder: &str, outcome: NoticeOutcome) -> StoreResult<()> {
        steering_rules::check_settle(key, holder, &outcome)?;
        let (sent, retry_ms) = match &outcome {
            NoticeOutcome::Sent => (true, 0i64),
            NoticeOutcome::Failed { retry_in, .. } => (false, retry_in.as_millis() as i64),
        };
        let error = steering_rules::kept_error(&outcome).map(|e| text::text(&e).into_owned());
        let holder_text = text::text(holder).into_owned();
        let (error, holder_text) = (&error, &holder_text);
        let answer: String = self
            .run("settle_notice", Retry::OnlyUnsent, |client, _| {
                Box::pin(async move {
                    let statement = prepare(client, "SELECT autocomp_settle_notice($1, $2, $3, $4, $5)").await?;
                    let row = client
                        .query_one(&statement, &[&key, holder_text, &sent, error, &retry_ms])
                        .await
                        .map_err(|e| self.read_failure(e))?;
                    Ok(row.get(0))
                })
            })
            .await?;
        match answer.as_str() {
            "ok" => Ok(()),
            "missing" => Err(StoreError::Conflict(format!("notice {key} is not in the outbox"))),
            "sent" => Err(StoreError::Conflict(format!("notice {key} was sent already"))),
            _ => Err(StoreError::Conflict(format!(
                "notice {key} is not leased to {holder} (its lease ran out, or another notifier took it)"
            ))),
        }
    }

    pub(super) async fn pg_recent_notices(&self, limit: usize) -> StoreResult<Vec<Notice>> {
        steering_rules::check_take("reader", limit, Duration::from_secs(1))?;
        self.run("recent_notices", Retry::Safe, |client, _| {
            Box::pin(async move {
                let sql = format!("SELECT {NOTICE_COLUMNS} FROM notices ORDER BY created_at DESC, key DESC LIMIT $1");
                let statement = prepare(client, &sql).await?;
                let rows = client.query(&statement, &[&(limit as i64)]).await.map_err(|e| self.read_failure(e))?;
                Ok(rows.iter().map(notice).collect())
            })
        })
        .await
    }
}
