//! The notification outbox on PostgreSQL (`OutboxStore`): its functions lease rows with
//! `SKIP LOCKED`, so notifiers never wait on or take each other's notices.

use std::time::Duration;

use serde_json::Value;

use super::calls::prepare;
use super::text::{self, unjsoned, untext};
use super::{PgBackend, Retry};
use crate::pipeline_state::{CursorMove, Enqueued, NewNotice, Notice, NoticeOutcome};
use crate::port::{OutboxStore, StoreError, StoreResult};
use crate::steering_rules;
use autocomp_model::{Seq, Timestamp};

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

impl PgBackend {
    pub(super) async fn pg_enqueue_notices(
        &self,
        notices: Vec<NewNotice>,
        cursor: Option<CursorMove>,
    ) -> StoreResult<Enqueued> {
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

#[async_trait::async_trait]
impl OutboxStore for PgBackend {
    async fn enqueue_notices(&self, notices: Vec<NewNotice>, cursor: Option<CursorMove>) -> StoreResult<Enqueued> {
        self.pg_enqueue_notices(notices, cursor).await
    }

    async fn take_notices(&self, holder: &str, limit: usize, lease: Duration) -> StoreResult<Vec<Notice>> {
        self.pg_take_notices(holder, limit, lease).await
    }

    async fn settle_notice(&self, key: &str, holder: &str, outcome: NoticeOutcome) -> StoreResult<()> {
        self.pg_settle_notice(key, holder, outcome).await
    }

    async fn recent_notices(&self, limit: usize) -> StoreResult<Vec<Notice>> {
        self.pg_recent_notices(limit).await
    }
}
