//! The notification outbox on the embedded file (`OutboxStore`): notices by key, leased to one
//! notifier at a time, and the notifiers' cursor; each take or settle is one immediate
//! transaction, so concurrent notifiers on one file take each notice once.

use std::time::Duration;

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};
use serde_json::Value;

use super::statements::Prepared;
use super::steering::corrupt;
use super::{SqliteBackend, unavailable};
use crate::pipeline_state::{CursorMove, Enqueued, NewNotice, Notice, NoticeOutcome};
use crate::port::{OutboxStore, StoreError, StoreResult};
use crate::steering_rules;
use autocomp_model::{Seq, Timestamp};

pub fn enqueue_notices(
    conn: &mut Connection,
    notices: &[NewNotice],
    cursor: Option<CursorMove>,
) -> StoreResult<Enqueued> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(unavailable)?;
    let now = Timestamp::now().millis();
    let mut added = 0;
    for notice in notices {
        added += tx
            .execute_prepared(
                "INSERT INTO notices (key, channel, subject, body, created_at, due_at) VALUES (?1, ?2, ?3, ?4, ?5, ?5)
                 ON CONFLICT (key) DO NOTHING",
                params![notice.key, notice.channel, notice.subject, notice.body.to_string(), now],
            )
            .map_err(unavailable)? as u64;
    }
    if let Some(CursorMove { from, to }) = cursor {
        tx.execute_prepared("UPDATE notice_cursor SET seq = ?2 WHERE id = 1 AND seq = ?1", params![from.0, to.0])
            .map_err(unavailable)?;
    }
    let cursor = tx
        .query_row_prepared("SELECT seq FROM notice_cursor WHERE id = 1", [], |row| row.get(0))
        .map_err(unavailable)?;
    tx.commit().map_err(unavailable)?;
    Ok(Enqueued { added, cursor: Seq(cursor) })
}

const NOTICE_COLUMNS: &str = "key, channel, subject, body, created_at, attempts, last_error, sent_at";

fn notice_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<(Notice, String)> {
    let body: String = row.get(3)?;
    Ok((
        Notice {
            key: row.get(0)?,
            channel: row.get(1)?,
            subject: row.get(2)?,
            body: Value::Null,
            created_at: Timestamp(row.get(4)?),
            attempts: row.get(5)?,
            last_error: row.get(6)?,
            sent_at: row.get::<_, Option<i64>>(7)?.map(Timestamp),
        },
        body,
    ))
}

fn with_bodies(rows: Vec<(Notice, String)>) -> StoreResult<Vec<Notice>> {
    rows.into_iter()
        .map(|(mut notice, body)| {
            notice.body = serde_json::from_str(&body).map_err(|e| corrupt("notice body", e))?;
            Ok(notice)
        })
        .collect()
}

pub fn take_notices(conn: &mut Connection, holder: &str, limit: usize, lease: Duration) -> StoreResult<Vec<Notice>> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(unavailable)?;
    let now = Timestamp::now().millis();
    let rows = {
        let mut statement = tx
            .prepare_cached(&format!(
                "SELECT {NOTICE_COLUMNS} FROM notices
                 WHERE sent_at IS NULL AND due_at <= ?1 AND (lease_until IS NULL OR lease_until <= ?1)
                 ORDER BY created_at, key LIMIT ?2"
            ))
            .map_err(unavailable)?;
        statement
            .query_map(params![now, limit as i64], notice_row)
            .and_then(Iterator::collect::<rusqlite::Result<Vec<_>>>)
            .map_err(unavailable)?
    };
    let until = now + lease.as_millis() as i64;
    for (notice, _) in &rows {
        tx.execute_prepared(
            "UPDATE notices SET holder = ?2, lease_until = ?3 WHERE key = ?1",
            params![notice.key, holder, until],
        )
        .map_err(unavailable)?;
    }
    tx.commit().map_err(unavailable)?;
    with_bodies(rows)
}

pub fn settle_notice(conn: &mut Connection, key: &str, holder: &str, outcome: &NoticeOutcome) -> StoreResult<()> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(unavailable)?;
    let now = Timestamp::now().millis();
    let held: Option<(Option<String>, Option<i64>, Option<i64>)> = tx
        .query_row_prepared("SELECT holder, lease_until, sent_at FROM notices WHERE key = ?1", [key], |row| {
            Ok((row.get(0)?, row.get(1)?, row.get(2)?))
        })
        .optional()
        .map_err(unavailable)?;
    match held {
        None => return Err(StoreError::Conflict(format!("notice {key} is not in the outbox"))),
        Some((_, _, Some(_))) => return Err(StoreError::Conflict(format!("notice {key} was sent already"))),
        Some((Some(h), Some(until), None)) if h == holder && until > now => {}
        Some(_) => {
            return Err(StoreError::Conflict(format!(
                "notice {key} is not leased to {holder} (its lease ran out, or another notifier took it)"
            )));
        }
    }
    match outcome {
        NoticeOutcome::Sent => tx.execute_prepared(
            "UPDATE notices SET sent_at = ?2, holder = NULL, lease_until = NULL WHERE key = ?1",
            params![key, now],
        ),
        NoticeOutcome::Failed { retry_in, .. } => tx.execute_prepared(
            "UPDATE notices SET attempts = attempts + 1, last_error = ?2, due_at = ?3, holder = NULL,
                    lease_until = NULL WHERE key = ?1",
            params![key, steering_rules::kept_error(outcome), now + retry_in.as_millis() as i64],
        ),
    }
    .map_err(unavailable)?;
    tx.commit().map_err(unavailable)
}

pub fn recent_notices(conn: &mut Connection, limit: usize) -> StoreResult<Vec<Notice>> {
    let mut statement = conn
        .prepare_cached(&format!("SELECT {NOTICE_COLUMNS} FROM notices ORDER BY created_at DESC, key DESC LIMIT ?1"))
        .map_err(unavailable)?;
    let rows = statement
        .query_map([limit as i64], notice_row)
        .and_then(Iterator::collect::<rusqlite::Result<Vec<_>>>)
        .map_err(unavailable)?;
    with_bodies(rows)
}

#[async_trait]
impl OutboxStore for SqliteBackend {
    async fn enqueue_notices(&self, notices: Vec<NewNotice>, cursor: Option<CursorMove>) -> StoreResult<Enqueued> {
        self.with_connection(move |conn| enqueue_notices(conn, &notices, cursor)).await
    }

    async fn take_notices(&self, holder: &str, limit: usize, lease: Duration) -> StoreResult<Vec<Notice>> {
        let holder = holder.to_owned();
        self.with_connection(move |conn| take_notices(conn, &holder, limit, lease)).await
    }

    async fn settle_notice(&self, key: &str, holder: &str, outcome: NoticeOutcome) -> StoreResult<()> {
        let (key, holder) = (key.to_owned(), holder.to_owned());
        self.with_connection(move |conn| settle_notice(conn, &key, &holder, &outcome)).await
    }

    async fn recent_notices(&self, limit: usize) -> StoreResult<Vec<Notice>> {
        self.with_connection(move |conn| recent_notices(conn, limit)).await
    }
}
