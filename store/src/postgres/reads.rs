//! PostgreSQL's longer reads of batches and of the change feed: summaries, heads, listings, run
//! states and change pages, each one consistent statement.

use std::collections::HashMap;
use std::sync::LazyLock;

use serde_json::{Map, Value};

use super::calls::{HORIZON, HORIZON_NOW, prepare};
use super::horizon::Horizon;
use super::rows::{
    SUMMARY_COLUMNS, SUMMARY_FROM, SUMMARY_WIDTH, corrupt, events_from_json, run_from_json, runs_from_json,
    summary_from_row,
};
use super::text::unjsoned;
use super::{Failure, PgBackend, Retry};
use crate::port::{BatchHead, BatchListing, ChangePage, StoreError, StoreResult};
use autocomp_model::{BatchId, BatchSummary, ComponentName, EventType, Run, Seq, Timestamp};

/// The summaries of the batches whose ids are `$1` (`get_summaries`).
static SUMMARIES_BY_ID: LazyLock<String> =
    LazyLock::new(|| format!("SELECT {SUMMARY_COLUMNS} {SUMMARY_FROM} WHERE b.id = ANY($1)"));
/// The listings of the batches whose ids are `$1` (`get_listings`): each summary, its
/// creation time and its open runs.
static LISTINGS_BY_ID: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT {SUMMARY_COLUMNS}, b.created_at,
            (SELECT jsonb_agg(to_jsonb(r) ORDER BY r.component, r.generation)::text
               FROM runs r WHERE r.batch_id = b.id AND r.state = 'open')
         {SUMMARY_FROM} WHERE b.id = ANY($1)"
    )
});

impl PgBackend {
    pub(super) async fn pg_get_summaries(&self, ids: &[BatchId]) -> StoreResult<Vec<BatchSummary>> {
        let asked: Vec<&str> = ids.iter().map(BatchId::as_str).collect();
        let asked = &asked;
        let mut found: HashMap<String, BatchSummary> = self
            .run("get_summaries", Retry::Safe, |client, _| {
                Box::pin(async move {
                    let rows = self.read_by_ids(client, &SUMMARIES_BY_ID, asked).await?;
                    rows.iter()
                        .map(|row| summary_from_row(row).map(|summary| (summary.id.as_str().to_string(), summary)))
                        .collect()
                })
            })
            .await?;
        // As `get_batches` answers: an id asked twice is answered once.
        Ok(ids.iter().filter_map(|id| found.remove(id.as_str())).collect())
    }

    /// One statement, so one snapshot: the summary, the batch row's own columns, its open
    /// runs, its effective events joined by seq, and the newest Reset of each type through
    /// the index of Reset markers.
    pub(super) async fn pg_batch_head(&self, id: &BatchId) -> StoreResult<BatchHead> {
        self.run("batch_head", Retry::Safe, |client, _| {
            Box::pin(async move {
                let sql = format!(
                    "SELECT {SUMMARY_COLUMNS}, b.metadata::text, b.created_at, b.event_count, b.stored_bytes,
                        (SELECT jsonb_agg(to_jsonb(r) ORDER BY r.component, r.generation)::text
                           FROM runs r WHERE r.batch_id = b.id AND r.state = 'open'),
                        (SELECT jsonb_agg(to_jsonb(e) - 'idempotency_key' ORDER BY e.type)::text
                           FROM batch_effective x JOIN events e ON e.seq = x.seq WHERE x.batch_id = b.id),
                        (SELECT jsonb_object_agg(covered, newest)::text FROM (
                            SELECT covered, MAX(r.seq) newest
                            FROM events r CROSS JOIN LATERAL jsonb_array_elements_text(r.resets) covered
                            WHERE r.batch_id = b.id AND r.type = 'Reset' AND r.resets IS NOT NULL
                            GROUP BY covered) resets),
                        autocomp_now()
                     {SUMMARY_FROM} WHERE b.id = $1"
                );
                let statement = prepare(client, &sql).await?;
                let row = client.query_opt(&statement, &[&id.as_str()]).await.map_err(|e| self.read_failure(e))?;
                let row = row.ok_or_else(|| Failure::Final(StoreError::NotFound(id.clone())))?;
                let summary = summary_from_row(&row)?;
                let metadata = match serde_json::from_str(row.get::<_, &str>(SUMMARY_WIDTH)).map(unjsoned) {
                    Ok(Value::Object(map)) => map,
                    Ok(_) => Map::new(),
                    Err(e) => return Err(corrupt("batch", e)),
                };
                let open_runs = runs_from_json(row.get(SUMMARY_WIDTH + 4))?;
                let last_resets = match row.get::<_, Option<&str>>(SUMMARY_WIDTH + 6) {
                    Some(text) => serde_json::from_str::<std::collections::BTreeMap<String, i64>>(text)
                        .map_err(|e| corrupt("Reset", e))?
                        .into_iter()
                        .map(|(covered, seq)| Ok((EventType::new(covered).map_err(|e| corrupt("Reset", e))?, Seq(seq))))
                        .collect::<Result<_, Failure>>()?,
                    None => Default::default(),
                };
                Ok(BatchHead {
                    modified_at: Timestamp(row.get(6)),
                    summary,
                    metadata,
                    created_at: Timestamp(row.get(SUMMARY_WIDTH + 1)),
                    open_runs,
                    effective: events_from_json(row.get(SUMMARY_WIDTH + 5))?,
                    last_resets,
                    event_count: row.get::<_, i64>(SUMMARY_WIDTH + 2).max(0) as u64,
                    stored_bytes: row.get::<_, i64>(SUMMARY_WIDTH + 3).max(0) as u64,
                    as_of: Timestamp(row.get(SUMMARY_WIDTH + 7)),
                })
            })
        })
        .await
    }

    pub(super) async fn pg_run_state(&self, batch: &BatchId, component: &ComponentName) -> StoreResult<Option<Run>> {
        self.run("run_state", Retry::Safe, |client, _| {
            Box::pin(async move {
                let statement = prepare(
                    client,
                    "SELECT EXISTS (SELECT 1 FROM batches WHERE id = $1),
                            (SELECT to_jsonb(r)::text FROM runs r WHERE batch_id = $1 AND component = $2
                             ORDER BY generation DESC LIMIT 1)",
                )
                .await?;
                let row = client
                    .query_one(&statement, &[&batch.as_str(), &component.as_str()])
                    .await
                    .map_err(|e| self.read_failure(e))?;
                if !row.get::<_, bool>(0) {
                    return Err(Failure::Final(StoreError::NotFound(batch.clone())));
                }
                row.get::<_, Option<&str>>(1).map(run_from_json).transpose()
            })
        })
        .await
    }

    pub(super) async fn pg_get_listings(&self, ids: &[BatchId]) -> StoreResult<Vec<BatchListing>> {
        let asked: Vec<&str> = ids.iter().map(BatchId::as_str).collect();
        let asked = &asked;
        let mut found: HashMap<String, BatchListing> = self
            .run("get_listings", Retry::Safe, |client, _| {
                Box::pin(async move {
                    let rows = self.read_by_ids(client, &LISTINGS_BY_ID, asked).await?;
                    rows.iter()
                        .map(|row| {
                            let listing = BatchListing {
                                summary: summary_from_row(row)?,
                                created_at: Timestamp(row.get(SUMMARY_WIDTH)),
                                open_runs: runs_from_json(row.get(SUMMARY_WIDTH + 1))?,
                            };
                            Ok((listing.summary.id.as_str().to_string(), listing))
                        })
                        .collect()
                })
            })
            .await?;
        Ok(ids.iter().filter_map(|id| found.remove(id.as_str())).collect())
    }

    pub(super) async fn pg_changes(&self, since: Seq, limit: usize) -> StoreResult<ChangePage> {
        // Only up to the horizon: a seq above it may belong to a transaction that has not
        // committed yet and would be skipped if the cursor passed it. Remembered as a head
        // read (`head`), so a wait from the page's head knows what each commit since
        // concerned without reading the head again.
        let mark = self.inner.listener.mark();
        let head = self.horizon().await?;
        let changes = self.changes_up_to(since, head, limit).await?;
        self.inner.listener.head_read(head, mark);
        let next = match changes.last() {
            Some((seq, _)) if changes.len() == limit => *seq,
            _ => head.max(since),
        };
        Ok(ChangePage { changes, next, head })
    }

    /// `pg_changes` and the changed batches' summaries: the horizon, then the page and the
    /// summaries in one statement, both sent at once on one connection (pipelined: one round
    /// trip; `biased`, so sent in that order, each when first polled, and the server runs them
    /// in the order sent: the page is read after the horizon). The page also names the
    /// batches whose change committed after the horizon (`next_cursor`).
    ///
    /// While this handle listens, the horizon is the last one confirmed, which never waits for
    /// a writer (`HORIZON_NOW`) and may lag the commits the page shows: the look's sleep
    /// starts from its mark (`announcement_mark`), waking for what its page did not show, so
    /// the lag costs it nothing but a page that names some batches again. Not listening,
    /// waiters compare heads, and a lagging one would wake them at once: the horizon then
    /// waits for the writers in flight, one read at a time per handle, its answer shared by
    /// the callers that asked before it began (`SharedHorizon`).
    pub(super) async fn pg_changed_summaries(
        &self,
        since: Seq,
        limit: usize,
    ) -> StoreResult<(ChangePage, Vec<BatchSummary>)> {
        let listening = self.inner.listener.mark().is_some();
        let (known, slot) = match listening {
            true => (None, None),
            false => match self.inner.horizon.after(tokio::time::Instant::now()).await {
                Horizon::Shared(head) => (Some(head), None),
                Horizon::ToRead(slot) => (None, Some(slot)),
            },
        };
        let slot = slot.as_ref();
        let read = self
            .run("changed_summaries", Retry::Safe, |client, _| {
                Box::pin(async move {
                    let page = prepare(client, &CHANGED_SUMMARIES).await?;
                    let (since, limit) = (since.0, limit as i64);
                    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&since, &limit];
                    let (head, rows) = match known {
                        Some(head) => (head, client.query(&page, &params).await.map_err(|e| self.read_failure(e))?),
                        None => {
                            let horizon = prepare(client, if listening { HORIZON_NOW } else { HORIZON }).await?;
                            // Answered as soon as the horizon's row is in, not after the page.
                            let head = async {
                                let head = client.query_one(&horizon, &[]).await.map(|row| Seq(row.get(0)));
                                if let Some(slot) = slot {
                                    slot.ended(&head);
                                }
                                head
                            };
                            tokio::try_join!(biased; head, client.query(&page, &params))
                                .map_err(|e| self.read_failure(e))?
                        }
                    };
                    let summaries = rows.iter().map(summary_from_row).collect::<Result<Vec<_>, _>>()?;
                    Ok((head, summaries))
                })
            })
            .await;
        if let Some(slot) = slot {
            // Ended before any attempt did (no connection): the callers waiting for it read their own.
            slot.ended(&read.as_ref().map(|(head, _)| *head));
        }
        let (head, summaries) = read?;
        let changes: Vec<(Seq, BatchId)> = summaries.iter().map(|s| (s.changed_seq, s.id.clone())).collect();
        Ok((ChangePage { next: next_cursor(&changes, limit, since, head), changes, head }, summaries))
    }

    /// The batches changed after `since` up to the horizon `head` read before, at most `limit`.
    async fn changes_up_to(&self, since: Seq, head: Seq, limit: usize) -> StoreResult<Vec<(Seq, BatchId)>> {
        self.run("changes", Retry::Safe, |client, _| {
            Box::pin(async move {
                let statement = prepare(
                    client,
                    "SELECT changed_seq, id FROM batches WHERE changed_seq > $1 AND changed_seq <= $2
                     ORDER BY changed_seq LIMIT $3",
                )
                .await?;
                let rows = client
                    .query(&statement, &[&since.0, &head.0, &(limit as i64)])
                    .await
                    .map_err(|e| self.read_failure(e))?;
                rows.iter()
                    .map(|row| {
                        let id = BatchId::new(row.get::<_, String>(1)).map_err(|e| corrupt("batch", e))?;
                        Ok((Seq(row.get(0)), id))
                    })
                    .collect()
            })
        })
        .await
    }
}

/// A page of the batches changed after `$1` with their summaries, at most `$2`, in feed order.
static CHANGED_SUMMARIES: LazyLock<String> = LazyLock::new(|| {
    format!("SELECT {SUMMARY_COLUMNS} {SUMMARY_FROM} WHERE b.changed_seq > $1 ORDER BY b.changed_seq LIMIT $2")
});

/// Where the next page of a watcher's look starts, for a page read after the horizon
/// `head`: never past the horizon, since a seq above it may belong to a transaction still in
/// flight, which the cursor would skip for good. The page itself names what committed past
/// the horizon too: a batch changed up to the horizon and again after it (claimed by another
/// step between the horizon's read and the page's) shows only its later change, and leaving
/// that out named the batch nowhere, so a watcher woken for its earlier change slept through
/// it. Such a batch is named again on the next page.
fn next_cursor(changes: &[(Seq, BatchId)], limit: usize, since: Seq, head: Seq) -> Seq {
    match changes.last() {
        Some((seq, _)) if changes.len() == limit => (*seq).min(head).max(since),
        _ => head.max(since),
    }
}
