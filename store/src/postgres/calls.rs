//! What every PostgreSQL operation shares: one attempt on one connection (`Attempt`), the scope
//! that turns the server's refusals into errors, prepared statements, reads by id planned once
//! by key (`read_by_ids`), pages read in id order, and the reads of the head and horizon.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::LazyLock;

use deadpool_postgres::ClientWrapper;
use serde_json::Value;

use super::horizon::Horizon;
use super::rows::{BATCH_SELECT, batch_from_row, corrupt, events_from_json};
use super::{Failure, PgBackend, Retry, classify};
use crate::port::{LogCursor, LogPage, StoreError, StoreResult};
use crate::write_rules::{self};
use autocomp_model::{Batch, BatchId, ComponentName, EventType, Seq};

/// One attempt of an operation on one connection.
pub(crate) type Attempt<'c, T> = Pin<Box<dyn Future<Output = Result<T, Failure>> + Send + 'c>>;
/// Tells the compiler that a connection borrowed for `'c` never outlives the caller's `'a`
/// (so an attempt may borrow both).
pub(crate) type Within<'c, 'a> = std::marker::PhantomData<&'c &'a ()>;

/// Most batches one `list_batches` / `get_batches` page returns, and changes one feed page
/// (the same bounds as the embedded store).
/// How often a conditional write reads again before giving up (each retry means another
/// writer changed the batch in between: an operator racing a component).
pub(super) const CONDITIONAL_ROUNDS: usize = 20;

/// The batches named by `$1`, whole (`load_batches`).
static BATCHES_BY_ID: LazyLock<String> = LazyLock::new(|| format!("{BATCH_SELECT} WHERE b.id = ANY($1)"));

/// Opens a transaction whose next statement is planned once per connection (a generic plan)
/// by its index: the judged claim's read, which a watcher sends at every stage (and the reads
/// of batches by their ids, `read_by_ids`: whole, summaries, listings). PostgreSQL
/// planned it again at every execution (its plan for one batch id looked cheaper than the
/// generic one, which is the same primary-key lookup): 0.16 ms of planning for 0.03 of
/// execution. Planned once, a plan made while `batches` was nearly empty would be a
/// sequential scan kept until an `ANALYZE` replans it, so scans are disabled while it is
/// planned, and JIT with them (a disabled scan's cost would have it compiled; as schema 22
/// does for the stage's functions). Sent as one simple query ahead of it, pipelined: no round
/// trip of its own.
pub(super) const BEGIN_PLANNED_ONCE: &str =
    "BEGIN; SET LOCAL plan_cache_mode = force_generic_plan; SET LOCAL enable_seqscan = off; SET LOCAL jit = off";
/// Back to the planning the server is configured with, for the rest of the transaction (the
/// claim function's own statements, which PostgreSQL already plans once, and whose forced
/// generic plans ran 0.05 ms slower).
pub(super) const PLANNED_AS_CONFIGURED: &str =
    "SET LOCAL plan_cache_mode TO DEFAULT; SET LOCAL enable_seqscan TO DEFAULT; SET LOCAL jit TO DEFAULT";

/// What a fenced or batch-scoped write was about, to turn the server's refusals into errors.
pub(super) struct Scope<'a> {
    pub(super) batch: &'a BatchId,
    pub(super) run: Option<(&'a ComponentName, i64)>,
}

impl PgBackend {
    /// `log_page`, with details over `details_up_to` bytes (as JSON text) left in the
    /// database: the page's events leave the server without them.
    pub(super) async fn log_page_sized(
        &self,
        id: &BatchId,
        cursor: LogCursor,
        limit: usize,
        details_up_to: Option<u64>,
    ) -> StoreResult<LogPage> {
        let up_to = details_up_to.map_or(i64::MAX, |bytes| i64::try_from(bytes).unwrap_or(i64::MAX));
        let (condition, bound) = match cursor {
            LogCursor::Newest => ("seq < $2 ORDER BY seq DESC", i64::MAX),
            LogCursor::Before(seq) => ("seq < $2 ORDER BY seq DESC", seq.0),
            LogCursor::After(seq) => ("seq > $2 ORDER BY seq", seq.0),
        };
        // The size is measured only when a limit is asked: rendering jsonb as text costs.
        let size = if details_up_to.is_some() { "octet_length(details::text)::bigint" } else { "0::bigint" };
        let sql = format!(
            "WITH p AS (SELECT *, {size} AS details_bytes FROM events
                        WHERE batch_id = $1 AND {condition} LIMIT $3)
             SELECT b.event_count,
                (SELECT MIN(seq) FROM events WHERE batch_id = b.id),
                (SELECT MAX(seq) FROM events WHERE batch_id = b.id),
                (SELECT jsonb_agg((to_jsonb(p) - 'idempotency_key' - 'details_bytes' - 'details')
                        || jsonb_build_object('details', CASE WHEN p.details_bytes > $4::bigint THEN 'null'::jsonb
                                                              ELSE p.details END)
                        ORDER BY p.seq)::text FROM p),
                (SELECT jsonb_agg(jsonb_build_array(p.seq, p.details_bytes) ORDER BY p.seq)::text
                   FROM p WHERE p.details_bytes > $4::bigint)
             FROM batches b WHERE b.id = $1"
        );
        let sql = &sql;
        let (total, first, last, events, left_out) = self
            .run("log_page", Retry::Safe, |client, _| {
                Box::pin(async move {
                    let statement = prepare(client, sql).await?;
                    let row = client
                        .query_opt(&statement, &[&id.as_str(), &bound, &(limit as i64), &up_to])
                        .await
                        .map_err(|e| self.read_failure(e))?;
                    let row = row.ok_or_else(|| Failure::Final(StoreError::NotFound(id.clone())))?;
                    let events = events_from_json(row.get(3))?;
                    let left_out: Vec<(Seq, u64)> = match row.get::<_, Option<&str>>(4) {
                        Some(text) => serde_json::from_str(text).map_err(|e| corrupt("event", e))?,
                        None => Vec::new(),
                    };
                    let ends = (row.get::<_, Option<i64>>(1), row.get::<_, Option<i64>>(2));
                    Ok((row.get::<_, i64>(0), ends.0, ends.1, events, left_out))
                })
            })
            .await?;
        Ok(LogPage {
            older: events.first().map(|e| e.seq).filter(|seq| first.is_some_and(|first| first < seq.0)),
            newer: events.last().map(|e| e.seq).filter(|seq| last.is_some_and(|last| last > seq.0)),
            events,
            total: total.max(0) as u64,
            details_left_out: left_out,
        })
    }

    /// Maps a statement's error: the store functions' own refusals (`AC404` unknown batch,
    /// `AC410` fenced), then connection and server failures.
    pub(super) fn failure(&self, error: tokio_postgres::Error, scope: &Scope<'_>) -> Failure {
        if let Some(db) = error.as_db_error() {
            match db.code().code() {
                "AC404" => return Failure::Final(StoreError::NotFound(scope.batch.clone())),
                "AC413" => {
                    let what = db.detail().unwrap_or("this write");
                    return Failure::Final(self.over_cap(scope.batch, db.message(), what));
                }
                "AC410" => {
                    if let Some((component, generation)) = scope.run {
                        return Failure::Final(StoreError::Fenced {
                            batch: scope.batch.clone(),
                            component: component.clone(),
                            generation,
                            reason: db.message().to_string(),
                        });
                    }
                }
                // Two appends with one key at once: the loser rolled back; again, it finds the winner's.
                "23505" => return Failure::Unsent(super::describe_error(&error)),
                _ => {}
            }
        }
        classify(&self.inner.options, &error, false)
    }

    /// `max_batch_bytes`, as the store functions take it.
    pub(super) fn cap(&self) -> i64 {
        i64::try_from(self.inner.options.max_batch_bytes).unwrap_or(i64::MAX)
    }

    /// A write refused by the cap; `sizes` is what the store function said: the bytes the
    /// batch stores and would store.
    pub(super) fn over_cap(&self, batch: &BatchId, sizes: &str, what: &str) -> StoreError {
        let mut numbers = sizes.split(' ').map(|n| n.parse::<u64>().unwrap_or_default());
        let (holds, would) = (numbers.next().unwrap_or_default(), numbers.next().unwrap_or_default());
        write_rules::over_batch_cap(batch, what, holds, would, self.inner.options.max_batch_bytes)
    }

    pub(super) fn read_failure(&self, error: tokio_postgres::Error) -> Failure {
        classify(&self.inner.options, &error, false)
    }

    /// One page of an id-ordered listing: `sql` takes the id to start after (`$1`, "" for the
    /// first page) and the page size (`$2`); each row is read by `from_row`.
    pub(super) async fn list_page<T: Send>(
        &self,
        operation: &'static str,
        sql: &str,
        after: Option<&BatchId>,
        limit: usize,
        from_row: fn(&tokio_postgres::Row) -> Result<T, Failure>,
    ) -> StoreResult<Vec<T>> {
        let after = after.map_or("", BatchId::as_str);
        self.run(operation, Retry::Safe, |client, _| {
            Box::pin(async move {
                let statement = prepare(client, sql).await?;
                let rows =
                    client.query(&statement, &[&after, &(limit as i64)]).await.map_err(|e| self.read_failure(e))?;
                rows.iter().map(from_row).collect()
            })
        })
        .await
    }

    /// The batches named, whole (`read_by_ids`).
    pub(super) async fn load_batches(&self, ids: Vec<String>) -> StoreResult<HashMap<String, Batch>> {
        self.run("get_batches", Retry::Safe, move |client, _| {
            let ids = ids.clone();
            Box::pin(async move {
                let rows = self.read_by_ids(client, &BATCHES_BY_ID, &ids).await?;
                rows.iter().map(|row| batch_from_row(row).map(|batch| (batch.id.as_str().to_string(), batch))).collect()
            })
        })
        .await
    }

    /// `sql`, a read of the batches whose ids are `$1` (`b.id = ANY($1)`), in a transaction
    /// whose read is planned once per connection (`BEGIN_PLANNED_ONCE`, sent with it: no round
    /// trip of its own), by the batches' key. Left to choose, PostgreSQL planned it again at
    /// every call: for a few ids 0.30 ms of planning for 0.06 of execution (stage bench,
    /// `get_batch`); for some hundreds of a young or bloated table, a sequential scan of it,
    /// 24-42 ms a call where the lookups by key took 1.6-1.9 (`sboi serve` reading a feed
    /// page's summaries in the peers bench's backlog, BENCHMARKS.md).
    pub(super) async fn read_by_ids<I>(
        &self,
        client: &ClientWrapper,
        sql: &str,
        ids: &I,
    ) -> Result<Vec<tokio_postgres::Row>, Failure>
    where
        I: tokio_postgres::types::ToSql + Sync,
    {
        let statement = prepare(client, sql).await?;
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [ids];
        // Sent in this order (`biased`: each is sent when first polled), every one awaited,
        // so the connection is idle again, whichever failed, before it goes back to the pool;
        // a read only, so the first failure is the answer.
        let (begun, rows, committed) = tokio::join!(
            biased;
            client.batch_execute(BEGIN_PLANNED_ONCE),
            client.query(&statement, &params),
            client.batch_execute("COMMIT"),
        );
        begun.map_err(|e| self.read_failure(e))?;
        let rows = rows.map_err(|e| self.read_failure(e))?;
        committed.map_err(|e| self.read_failure(e))?;
        Ok(rows)
    }

    /// The horizon of the change feed: every seq up to it is committed or gone for good.
    /// Read after this call began, by it or by a read of another caller's (`SharedHorizon`).
    pub(super) async fn horizon(&self) -> StoreResult<Seq> {
        let slot = match self.inner.horizon.after(tokio::time::Instant::now()).await {
            Horizon::Shared(head) => return Ok(head),
            Horizon::ToRead(slot) => slot,
        };
        let slot = &slot;
        let head = self
            .run("head", Retry::Safe, |client, _| {
                Box::pin(async move {
                    let head = async {
                        let statement = prepare(client, HORIZON).await?;
                        let row = client.query_one(&statement, &[]).await.map_err(|e| self.read_failure(e))?;
                        Ok(Seq(row.get(0)))
                    }
                    .await;
                    slot.ended(&head);
                    head
                })
            })
            .await;
        // Ended before any attempt did (no connection): the callers waiting for it read their own.
        slot.ended(&head);
        head
    }

    /// The newest seq handed out, committed or not: a cheap "has anything happened?".
    pub(super) async fn latest_seq_taken(&self) -> StoreResult<Seq> {
        self.read_number("head", "SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM store_seq").await.map(Seq)
    }

    /// A statement without parameters that answers one number.
    pub(super) async fn read_number(&self, operation: &str, sql: &'static str) -> StoreResult<i64> {
        self.run(operation, Retry::Safe, |client, _| {
            Box::pin(async move {
                let statement = prepare(client, sql).await?;
                let row = client.query_one(&statement, &[]).await.map_err(|e| self.read_failure(e))?;
                Ok(row.get(0))
            })
        })
        .await
    }
}

/// The horizon of the change feed (`horizon`), one number.
pub(super) const HORIZON: &str = "SELECT autocomp_horizon()";
/// The horizon as last confirmed, never waiting for a writer (a look's, `pg_changed_summaries`).
pub(super) const HORIZON_NOW: &str = "SELECT autocomp_feed_horizon(false)";

pub(super) async fn prepare(client: &ClientWrapper, sql: &str) -> Result<tokio_postgres::Statement, Failure> {
    client.prepare_cached(sql).await.map_err(|e| match e.code() {
        // The schema is missing or other than this release expects: not something a retry fixes.
        Some(code) if code.code().starts_with("42") => {
            let message = e.as_db_error().map_or_else(|| e.to_string(), |db| db.message().to_string());
            Failure::Final(StoreError::Unavailable(format!("preparing a store statement: {message}")))
        }
        // Anything else (the server ended the connection, is shutting down, ...): a Parse
        // writes nothing, so it is safe to send again on a fresh connection.
        _ => Failure::Unsent(super::describe_error(&e)),
    })
}

/// `prepare`, or `None` when the statement names a table, column or function the store's
/// schema does not have yet (a migration not applied: the caller does without what it brings).
pub(super) async fn prepare_if_defined(
    client: &ClientWrapper,
    sql: &str,
) -> Result<Option<tokio_postgres::Statement>, Failure> {
    use tokio_postgres::error::SqlState;
    match client.prepare_cached(sql).await {
        Ok(statement) => Ok(Some(statement)),
        Err(e)
            if [SqlState::UNDEFINED_TABLE, SqlState::UNDEFINED_COLUMN, SqlState::UNDEFINED_FUNCTION]
                .iter()
                .any(|undefined| e.code() == Some(undefined)) =>
        {
            Ok(None)
        }
        // Any other refusal, as every statement's.
        Err(_) => prepare(client, sql).await.map(Some),
    }
}

pub(super) fn optional_json(values: &[EventType]) -> Option<Value> {
    (!values.is_empty()).then(|| Value::Array(values.iter().map(|t| Value::String(t.as_str().into())).collect()))
}
