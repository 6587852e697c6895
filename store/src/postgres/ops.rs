//! The `ObjectStore` operations on PostgreSQL. A write is one call of its server-side
//! function; one that depends on what the batch holds (a metadata merge, a cancel's record of
//! the run it closes, a prioritize's old priority) reads first, computes the write here with
//! the rules every backend shares, and sends it with what it read as a condition: if the batch
//! moved in between, nothing is written and it reads again.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use async_trait::async_trait;
use deadpool_postgres::ClientWrapper;
use serde::Deserialize;
use serde_json::{Map, Value};

use super::text::{self, unjsoned, untext};
use super::{Failure, PgStore, Retry, classify};
use crate::pipeline_state::{CursorMove, Enqueued, NewNotice, Notice, NoticeOutcome, Steered};
use crate::port::{
    BatchHead, BatchListing, BatchStore, Cancellation, ChangePage, Claim, CreateOutcome, LogCursor, LogPage,
    OutboxStore, RegistryStore, SeriesStore, SteeringStore, StoreAbout, StoreError, StoreResult, check_log_limit,
};
use crate::write_rules::{self, MAX_BATCH_PAGE, MAX_CHANGE_PAGE, page_too_large};
use autocomp_model::{
    Agent, Batch, BatchId, BatchSummary, BatchType, ComponentDescriptor, ComponentName, Event, EventSummary, EventType,
    HostRecord, IdempotencyKey, NewBatch, NewEvent, Outcome, PassOutcome, PassPhase, PassRecord, RegisteredComponent,
    Retirement, Run, RunHolder, RunRef, RunState, Seq, Steering, SteeringEntry, SteeringRequest, SummaryHeader,
    SummaryState, Timestamp, WorkHistory, WorkResult, WorkTallies, WorkTally,
};
use autocomp_model::{BacklogSample, SeriesStep, WorkPoint};

/// One attempt of an operation on one connection.
pub(crate) type Attempt<'c, T> = Pin<Box<dyn Future<Output = Result<T, Failure>> + Send + 'c>>;
/// Tells the compiler that a connection borrowed for `'c` never outlives the caller's `'a`
/// (so an attempt may borrow both).
pub(crate) type Within<'c, 'a> = std::marker::PhantomData<&'c &'a ()>;

/// Most batches one `list_batches` / `get_batches` page returns, and changes one feed page
/// (the same bounds as the embedded store).
/// How often a conditional write reads again before giving up (each retry means another
/// writer changed the batch in between: an operator racing a component).
const CONDITIONAL_ROUNDS: usize = 20;
/// How often a waiter that is woken by notifications still reads the head, in case they
/// cannot reach it: one cheap read per process every two seconds while idle.
const LISTENING_POLL: Duration = Duration::from_secs(2);

/// A batch with its log (as arrays of columns: no JSON is built on the server) and open runs.
const BATCH_SELECT: &str = "SELECT b.id, b.type, b.priority, b.metadata::text, b.created_seq, b.modified_seq,
        b.changed_seq, b.created_at, b.modified_at,
        e.seqs, e.types, e.outcomes, e.agents, e.ats, e.details, e.run_components, e.run_generations, e.resets,
        (SELECT jsonb_agg(to_jsonb(r) ORDER BY r.component, r.generation)::text
           FROM runs r WHERE r.batch_id = b.id AND r.state = 'open'),
        autocomp_now()
    FROM batches b
    LEFT JOIN LATERAL (
        SELECT array_agg(seq) seqs, array_agg(type) types, array_agg(outcome) outcomes, array_agg(agent) agents,
               array_agg(at) ats, array_agg(details::text) details, array_agg(run_component) run_components,
               array_agg(run_generation) run_generations, array_agg(resets::text) resets
        FROM (SELECT * FROM events WHERE batch_id = b.id ORDER BY seq) ordered
    ) e ON true";

/// A batch's summary (`BatchSummary`) from the maintained columns and `batch_effective`, and
/// its running components from its open runs: columns 0 to 14 of every read that summarizes.
const SUMMARY_COLUMNS: &str = "b.id, b.type, b.priority, b.created_seq, b.modified_seq, b.changed_seq, b.modified_at,
        b.last_event_at, f.types, f.outcomes, f.seqs, f.transients, f.skipped, f.content_seqs,
        (SELECT array_agg(DISTINCT r.component ORDER BY r.component) FROM runs r
           WHERE r.batch_id = b.id AND r.state = 'open')";
const SUMMARY_FROM: &str = "FROM batches b
    LEFT JOIN LATERAL (
        SELECT array_agg(type ORDER BY type) types, array_agg(outcome ORDER BY type) outcomes,
               array_agg(seq ORDER BY type) seqs, array_agg(transient ORDER BY type) transients,
               array_agg(skipped ORDER BY type) skipped, array_agg(content_seq ORDER BY type) content_seqs
        FROM batch_effective WHERE batch_id = b.id
    ) f ON true";

/// A summary out of `SUMMARY_COLUMNS`.
fn summary_from_row(row: &tokio_postgres::Row) -> Result<BatchSummary, Failure> {
    let header = SummaryHeader {
        id: BatchId::new(row.get::<_, String>(0)).map_err(|e| corrupt("batch", e))?,
        batch_type: BatchType::new(row.get::<_, String>(1)).map_err(|e| corrupt("batch", e))?,
        priority: row.get(2),
        created_seq: Seq(row.get(3)),
        modified_seq: Seq(row.get(4)),
        changed_seq: Seq(row.get(5)),
        modified_at: Timestamp(row.get(6)),
    };
    let mut effective = Vec::new();
    if let Some(types) = row.get::<_, Option<Vec<String>>>(8) {
        let outcomes: Vec<String> = row.get(9);
        let seqs: Vec<i64> = row.get(10);
        let transients: Vec<bool> = row.get(11);
        let skipped: Vec<bool> = row.get(12);
        let content_seqs: Vec<Option<i64>> = row.get(13);
        for (i, event_type) in types.into_iter().enumerate() {
            effective.push(EventSummary {
                event_type: EventType::new(event_type).map_err(|e| corrupt("effective event", e))?,
                outcome: Outcome::parse(&outcomes[i]).map_err(|e| corrupt("effective event", e))?,
                seq: Seq(seqs[i]),
                transient: transients[i],
                skipped: skipped[i],
                content_seq: content_seqs[i].map(Seq),
            });
        }
    }
    let running = row
        .get::<_, Option<Vec<String>>>(14)
        .unwrap_or_default()
        .into_iter()
        .map(|name| ComponentName::new(name).map_err(|e| corrupt("run", e)))
        .collect::<Result<_, _>>()?;
    let state = SummaryState { last_event_at: Timestamp(row.get(7)), effective, running };
    Ok(state.summary(header))
}

/// Runs as `jsonb_agg(to_jsonb(r))` writes them.
fn runs_from_json(text: Option<&str>) -> Result<Vec<Run>, Failure> {
    let Some(text) = text else { return Ok(Vec::new()) };
    serde_json::from_str::<Vec<RunRow>>(text)
        .map_err(|e| corrupt("run", e))?
        .into_iter()
        .map(RunRow::into_run)
        .collect()
}

/// Events as `jsonb_agg(to_jsonb(e))` writes them.
fn events_from_json(text: Option<&str>) -> Result<Vec<Event>, Failure> {
    let Some(text) = text else { return Ok(Vec::new()) };
    let rows: Vec<EventRow> = serde_json::from_str(text).map_err(|e| corrupt("event", e))?;
    rows.into_iter().map(EventRow::into_event).collect()
}

/// A row of `events` as `to_jsonb` writes it.
#[derive(Deserialize)]
struct EventRow {
    seq: i64,
    batch_id: String,
    #[serde(rename = "type")]
    event_type: String,
    outcome: String,
    agent: String,
    at: i64,
    details: Value,
    run_component: Option<String>,
    run_generation: Option<i64>,
    resets: Option<Vec<String>>,
}

/// A row of `runs` as `to_jsonb` writes it.
#[derive(Deserialize)]
struct RunRow {
    batch_id: String,
    component: String,
    generation: i64,
    agent: String,
    host: String,
    pid: i64,
    started_at: i64,
    claim_seq: i64,
    state: String,
    ended_at: Option<i64>,
    transient: bool,
    claim_key: Option<String>,
}

/// A component as `autocomp_component` writes it: its `components` row and its hosts.
#[derive(Deserialize)]
struct ComponentRow {
    descriptor: Value,
    registered_at: i64,
    changed_at: i64,
    retired_at: Option<i64>,
    retired_by: Option<String>,
    retired_reason: Option<String>,
    hosts: Vec<HostRow>,
    #[serde(default)]
    work_totals: Vec<WorkRow>,
    #[serde(default)]
    work_last_hour: Vec<WorkRow>,
}

/// A row of `component_work_totals` or `component_work_minutes` as `to_jsonb` writes it.
#[derive(Deserialize)]
struct WorkRow {
    result: String,
    results: i64,
    duration_ms_sum: i64,
    buckets: Vec<i64>,
}

impl WorkRow {
    fn add_to(self, tallies: &mut WorkTallies) -> Result<(), Failure> {
        let result = WorkResult::parse(&self.result).map_err(|e| corrupt("component work", e))?;
        let count = |n: i64| n.max(0) as u64;
        tallies.get_mut(result).add(&WorkTally {
            results: count(self.results),
            duration_ms_sum: count(self.duration_ms_sum),
            buckets: self.buckets.into_iter().map(count).collect(),
        });
        Ok(())
    }
}

/// A row of `component_hosts` as `to_jsonb` writes it.
#[derive(Deserialize)]
struct HostRow {
    host: String,
    version: String,
    last_seen: i64,
    pass_started_at: Option<i64>,
    pass_ended_at: Option<i64>,
    pass_outcome: Option<String>,
    pass_summary: String,
    pass_duration_ms: Option<i64>,
}

/// Stored values were validated on the way in; failing now means someone edited the
/// database behind the store's back.
pub(super) fn corrupt(what: &str, error: impl std::fmt::Display) -> Failure {
    Failure::Final(StoreError::Unavailable(format!("the PostgreSQL store holds an invalid {what}: {error}")))
}

impl EventRow {
    fn into_event(self) -> Result<Event, Failure> {
        let run = match (self.run_component, self.run_generation) {
            (Some(component), Some(generation)) => {
                Some(RunRef { component: ComponentName::new(component).map_err(|e| corrupt("event", e))?, generation })
            }
            _ => None,
        };
        Ok(Event {
            seq: Seq(self.seq),
            batch_id: BatchId::new(self.batch_id).map_err(|e| corrupt("event", e))?,
            event_type: EventType::new(self.event_type).map_err(|e| corrupt("event", e))?,
            outcome: Outcome::parse(&self.outcome).map_err(|e| corrupt("event", e))?,
            agent: Agent::new(self.agent).map_err(|e| corrupt("event", e))?,
            at: Timestamp(self.at),
            details: unjsoned(self.details),
            run,
            resets: self
                .resets
                .unwrap_or_default()
                .into_iter()
                .map(EventType::new)
                .collect::<Result<_, _>>()
                .map_err(|e| corrupt("event", e))?,
        })
    }
}

impl RunRow {
    fn into_run(self) -> Result<Run, Failure> {
        Ok(Run {
            batch_id: BatchId::new(self.batch_id).map_err(|e| corrupt("run", e))?,
            component: ComponentName::new(self.component).map_err(|e| corrupt("run", e))?,
            generation: self.generation,
            holder: RunHolder {
                agent: Agent::new(self.agent).map_err(|e| corrupt("run", e))?,
                host: self.host,
                pid: u32::try_from(self.pid).map_err(|e| corrupt("run", e))?,
                claim_key: self.claim_key.map(IdempotencyKey::new).transpose().map_err(|e| corrupt("run", e))?,
            },
            started_at: Timestamp(self.started_at),
            claim_seq: Seq(self.claim_seq),
            state: RunState::parse(&self.state).map_err(|e| corrupt("run", e))?,
            ended_at: self.ended_at.map(Timestamp),
            transient: self.transient,
        })
    }
}

fn run_from_json(text: &str) -> Result<Run, Failure> {
    serde_json::from_str::<RunRow>(text).map_err(|e| corrupt("run", e))?.into_run()
}

/// What `autocomp_claim` answered, as `claim` answers it: a new run, or for a claim key
/// already used, that run again while it is still the open current one, else a `Conflict`.
/// The outer error is a corrupt answer.
fn claim_answer(
    kind: &str,
    run: &str,
    abandoned: Option<&str>,
    current: i64,
    batch: &BatchId,
    component: &ComponentName,
    holder: &RunHolder,
) -> Result<StoreResult<Claim>, Failure> {
    let run = run_from_json(run)?;
    if kind == "retry" {
        return Ok(write_rules::retried_claim(run, current, batch, component, holder));
    }
    let abandoned = abandoned.map(run_from_json).transpose()?;
    Ok(Ok(Claim { run, abandoned }))
}

fn run_from_value(value: Value) -> Result<Run, Failure> {
    serde_json::from_value::<RunRow>(value).map_err(|e| corrupt("run", e))?.into_run()
}

/// A pass's tallies as `autocomp_record_pass` takes them.
fn work_json(tallies: &WorkTallies) -> Value {
    let rows: Vec<Value> = tallies
        .non_empty()
        .map(|(result, tally)| {
            serde_json::json!({
                "result": result.as_str(),
                "results": tally.results,
                "duration_ms_sum": tally.duration_ms_sum,
                "buckets": tally.buckets,
            })
        })
        .collect();
    Value::Array(rows)
}

fn component_from_json(text: &str) -> Result<RegisteredComponent, Failure> {
    let row: ComponentRow = serde_json::from_str(text).map_err(|e| corrupt("component", e))?;
    let descriptor: ComponentDescriptor =
        serde_json::from_value(unjsoned(row.descriptor)).map_err(|e| corrupt("component descriptor", e))?;
    let retired = match (row.retired_at, row.retired_by) {
        (Some(at), Some(by)) => Some(Retirement {
            at: Timestamp(at),
            by: Agent::new(by).map_err(|e| corrupt("component", e))?,
            reason: row.retired_reason.map(untext).unwrap_or_default(),
        }),
        _ => None,
    };
    let hosts = row
        .hosts
        .into_iter()
        .map(|host| {
            Ok(HostRecord {
                host: host.host,
                version: host.version,
                last_seen: Timestamp(host.last_seen),
                pass_started_at: host.pass_started_at.map(Timestamp),
                pass_ended_at: host.pass_ended_at.map(Timestamp),
                outcome: host
                    .pass_outcome
                    .map(|text| PassOutcome::parse(&text))
                    .transpose()
                    .map_err(|e| corrupt("component host", e))?,
                summary: untext(host.pass_summary),
                duration_ms: host.pass_duration_ms.map(|ms| ms.max(0) as u64),
            })
        })
        .collect::<Result<_, Failure>>()?;
    let mut work = WorkHistory::default();
    for total in row.work_totals {
        total.add_to(&mut work.total)?;
    }
    for minute in row.work_last_hour {
        minute.add_to(&mut work.last_hour)?;
    }
    Ok(RegisteredComponent {
        descriptor,
        registered_at: Timestamp(row.registered_at),
        changed_at: Timestamp(row.changed_at),
        hosts,
        retired,
        work,
    })
}

fn batch_from_row(row: &tokio_postgres::Row) -> Result<Batch, Failure> {
    let id = BatchId::new(row.get::<_, String>(0)).map_err(|e| corrupt("batch", e))?;
    let metadata: &str = row.get(3);
    let metadata = match serde_json::from_str(metadata).map(unjsoned).map_err(|e| corrupt("batch", e))? {
        Value::Object(map) => map,
        _ => Map::new(),
    };
    let seqs: Vec<i64> = row.get::<_, Option<Vec<i64>>>(9).unwrap_or_default();
    let mut events = Vec::with_capacity(seqs.len());
    if !seqs.is_empty() {
        let types: Vec<&str> = row.get(10);
        let outcomes: Vec<&str> = row.get(11);
        let agents: Vec<&str> = row.get(12);
        let ats: Vec<i64> = row.get(13);
        let details: Vec<&str> = row.get(14);
        let run_components: Vec<Option<&str>> = row.get(15);
        let run_generations: Vec<Option<i64>> = row.get(16);
        let resets: Vec<Option<&str>> = row.get(17);
        for (i, seq) in seqs.into_iter().enumerate() {
            let run = match (run_components[i], run_generations[i]) {
                (Some(component), Some(generation)) => Some(RunRef {
                    component: ComponentName::new(component).map_err(|e| corrupt("event", e))?,
                    generation,
                }),
                _ => None,
            };
            let resets: Vec<EventType> = match resets[i] {
                Some(text) => serde_json::from_str(text).map_err(|e| corrupt("event", e))?,
                None => Vec::new(),
            };
            events.push(Event {
                seq: Seq(seq),
                batch_id: id.clone(),
                event_type: EventType::new(types[i]).map_err(|e| corrupt("event", e))?,
                outcome: Outcome::parse(outcomes[i]).map_err(|e| corrupt("event", e))?,
                agent: Agent::new(agents[i]).map_err(|e| corrupt("event", e))?,
                at: Timestamp(ats[i]),
                details: serde_json::from_str(details[i]).map(unjsoned).map_err(|e| corrupt("event", e))?,
                run,
                resets,
            });
        }
    }
    let open_runs = match row.get::<_, Option<&str>>(18) {
        Some(runs) => serde_json::from_str::<Vec<RunRow>>(runs)
            .map_err(|e| corrupt("run", e))?
            .into_iter()
            .map(RunRow::into_run)
            .collect::<Result<_, _>>()?,
        None => Vec::new(),
    };
    Ok(Batch {
        id,
        batch_type: BatchType::new(row.get::<_, String>(1)).map_err(|e| corrupt("batch", e))?,
        priority: row.get(2),
        metadata,
        created_seq: Seq(row.get(4)),
        modified_seq: Seq(row.get(5)),
        changed_seq: Seq(row.get(6)),
        created_at: Timestamp(row.get(7)),
        modified_at: Timestamp(row.get(8)),
        events,
        open_runs,
        as_of: Timestamp(row.get(19)),
    })
}

/// What a fenced or batch-scoped write was about, to turn the server's refusals into errors.
struct Scope<'a> {
    batch: &'a BatchId,
    run: Option<(&'a ComponentName, i64)>,
}

impl PgStore {
    /// `log_page`, with details over `details_up_to` bytes (as JSON text) left in the
    /// database: the page's events leave the server without them.
    async fn log_page_sized(
        &self,
        id: &BatchId,
        cursor: LogCursor,
        limit: usize,
        details_up_to: Option<u64>,
    ) -> StoreResult<LogPage> {
        check_log_limit(limit)?;
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
    fn failure(&self, error: tokio_postgres::Error, scope: &Scope<'_>) -> Failure {
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
    fn cap(&self) -> i64 {
        i64::try_from(self.inner.options.max_batch_bytes).unwrap_or(i64::MAX)
    }

    /// A write refused by the cap; `sizes` is what the store function said: the bytes the
    /// batch stores and would store.
    fn over_cap(&self, batch: &BatchId, sizes: &str, what: &str) -> StoreError {
        let mut numbers = sizes.split(' ').map(|n| n.parse::<u64>().unwrap_or_default());
        let (holds, would) = (numbers.next().unwrap_or_default(), numbers.next().unwrap_or_default());
        write_rules::over_batch_cap(batch, what, holds, would, self.inner.options.max_batch_bytes)
    }

    pub(super) fn read_failure(&self, error: tokio_postgres::Error) -> Failure {
        classify(&self.inner.options, &error, false)
    }

    /// One page of an id-ordered listing: `sql` takes the id to start after (`$1`, "" for the
    /// first page) and the page size (`$2`); each row is read by `from_row`.
    async fn list_page<T: Send>(
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

    async fn load_batches(&self, ids: Vec<String>) -> StoreResult<HashMap<String, Batch>> {
        self.run("get_batches", Retry::Safe, move |client, _| {
            let ids = ids.clone();
            Box::pin(async move {
                let statement = prepare(client, &format!("{BATCH_SELECT} WHERE b.id = ANY($1)")).await?;
                let rows = client.query(&statement, &[&ids]).await.map_err(|e| self.read_failure(e))?;
                rows.iter().map(|row| batch_from_row(row).map(|batch| (batch.id.as_str().to_string(), batch))).collect()
            })
        })
        .await
    }

    /// The horizon of the change feed: every seq up to it is committed or gone for good.
    async fn horizon(&self) -> StoreResult<Seq> {
        self.read_number("head", "SELECT autocomp_horizon()").await.map(Seq)
    }

    /// The newest seq handed out, committed or not: a cheap "has anything happened?".
    async fn latest_seq_taken(&self) -> StoreResult<Seq> {
        self.read_number("head", "SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM store_seq").await.map(Seq)
    }

    /// A statement without parameters that answers one number.
    async fn read_number(&self, operation: &str, sql: &'static str) -> StoreResult<i64> {
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

fn optional_json(values: &[EventType]) -> Option<Value> {
    (!values.is_empty()).then(|| Value::Array(values.iter().map(|t| Value::String(t.as_str().into())).collect()))
}

#[async_trait]
impl BatchStore for PgStore {
    async fn create_batch(&self, batch: NewBatch) -> StoreResult<CreateOutcome> {
        batch.validate()?;
        let metadata = text::json(&batch.metadata);
        let created = self
            .run("create_batch", Retry::Safe, |client, _| {
                let (batch, metadata) = (&batch, &*metadata);
                Box::pin(async move {
                    let statement = prepare(client, "SELECT * FROM autocomp_create_batch($1, $2, $3, $4)").await?;
                    let row = client
                        .query_one(
                            &statement,
                            &[&batch.id.as_str(), &batch.batch_type.as_str(), &batch.priority, metadata],
                        )
                        .await
                        .map_err(|e| self.failure(e, &Scope { batch: &batch.id, run: None }))?;
                    let created: bool = row.get(0);
                    Ok(created.then(|| (Seq(row.get(1)), Timestamp(row.get(2)))))
                })
            })
            .await?;
        match created {
            Some((seq, at)) => Ok(CreateOutcome::Created(Batch {
                id: batch.id.clone(),
                batch_type: batch.batch_type.clone(),
                priority: batch.priority,
                metadata: batch.metadata.as_object().cloned().unwrap_or_default(),
                created_seq: seq,
                modified_seq: seq,
                changed_seq: seq,
                created_at: at,
                modified_at: at,
                events: Vec::new(),
                open_runs: Vec::new(),
                as_of: at,
            })),
            None => {
                let existing = self.get_batch(&batch.id).await?;
                write_rules::existing_batch(&batch, existing).map(CreateOutcome::AlreadyExists)
            }
        }
    }

    async fn get_batch(&self, id: &BatchId) -> StoreResult<Batch> {
        let mut found = self.load_batches(vec![id.as_str().to_string()]).await?;
        found.remove(id.as_str()).ok_or_else(|| StoreError::NotFound(id.clone()))
    }

    async fn get_batches(&self, ids: &[BatchId]) -> StoreResult<Vec<Batch>> {
        if ids.len() > MAX_BATCH_PAGE {
            return Err(page_too_large("ids", ids.len(), MAX_BATCH_PAGE));
        }
        let mut found = self.load_batches(ids.iter().map(|id| id.as_str().to_string()).collect()).await?;
        Ok(ids.iter().filter_map(|id| found.remove(id.as_str())).collect())
    }

    async fn list_batches(&self, after: Option<&BatchId>, limit: usize) -> StoreResult<Vec<Batch>> {
        if limit > MAX_BATCH_PAGE {
            return Err(page_too_large("limit", limit, MAX_BATCH_PAGE));
        }
        let sql = format!("{BATCH_SELECT} WHERE b.id > $1 ORDER BY b.id LIMIT $2");
        self.list_page("list_batches", &sql, after, limit, batch_from_row).await
    }

    async fn get_summaries(&self, ids: &[BatchId]) -> StoreResult<Vec<BatchSummary>> {
        if ids.len() > MAX_BATCH_PAGE {
            return Err(page_too_large("ids", ids.len(), MAX_BATCH_PAGE));
        }
        let asked: Vec<&str> = ids.iter().map(BatchId::as_str).collect();
        let asked = &asked;
        let mut found: HashMap<String, BatchSummary> = self
            .run("get_summaries", Retry::Safe, |client, _| {
                Box::pin(async move {
                    let sql = format!("SELECT {SUMMARY_COLUMNS} {SUMMARY_FROM} WHERE b.id = ANY($1)");
                    let statement = prepare(client, &sql).await?;
                    let rows = client.query(&statement, &[asked]).await.map_err(|e| self.read_failure(e))?;
                    rows.iter()
                        .map(|row| summary_from_row(row).map(|summary| (summary.id.as_str().to_string(), summary)))
                        .collect()
                })
            })
            .await?;
        // As `get_batches` answers: an id asked twice is answered once.
        Ok(ids.iter().filter_map(|id| found.remove(id.as_str())).collect())
    }

    async fn list_summaries(&self, after: Option<&BatchId>, limit: usize) -> StoreResult<Vec<BatchSummary>> {
        if limit > MAX_BATCH_PAGE {
            return Err(page_too_large("limit", limit, MAX_BATCH_PAGE));
        }
        let sql = format!("SELECT {SUMMARY_COLUMNS} {SUMMARY_FROM} WHERE b.id > $1 ORDER BY b.id LIMIT $2");
        self.list_page("list_summaries", &sql, after, limit, summary_from_row).await
    }

    /// One statement, so one snapshot: the summary, the batch row's own columns, its open
    /// runs, its effective events joined by seq, and the newest Reset of each type through
    /// the index of Reset markers.
    async fn batch_head(&self, id: &BatchId) -> StoreResult<BatchHead> {
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
                let metadata = match serde_json::from_str(row.get::<_, &str>(15)).map(unjsoned) {
                    Ok(Value::Object(map)) => map,
                    Ok(_) => Map::new(),
                    Err(e) => return Err(corrupt("batch", e)),
                };
                let open_runs = runs_from_json(row.get(19))?;
                let last_resets = match row.get::<_, Option<&str>>(21) {
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
                    created_at: Timestamp(row.get(16)),
                    open_runs,
                    effective: events_from_json(row.get(20))?,
                    last_resets,
                    event_count: row.get::<_, i64>(17).max(0) as u64,
                    stored_bytes: row.get::<_, i64>(18).max(0) as u64,
                    as_of: Timestamp(row.get(22)),
                })
            })
        })
        .await
    }

    /// One statement: the page through the log's (batch, seq) index, the log's first and
    /// last seq (index ends) and its length (the batch row's count).
    async fn log_page(&self, id: &BatchId, cursor: LogCursor, limit: usize) -> StoreResult<LogPage> {
        self.log_page_sized(id, cursor, limit, None).await
    }

    async fn log_page_within(
        &self,
        id: &BatchId,
        cursor: LogCursor,
        limit: usize,
        details_up_to: u64,
    ) -> StoreResult<LogPage> {
        self.log_page_sized(id, cursor, limit, Some(details_up_to)).await
    }

    async fn run_state(&self, batch: &BatchId, component: &ComponentName) -> StoreResult<Option<Run>> {
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

    async fn get_listings(&self, ids: &[BatchId]) -> StoreResult<Vec<BatchListing>> {
        if ids.len() > MAX_BATCH_PAGE {
            return Err(page_too_large("ids", ids.len(), MAX_BATCH_PAGE));
        }
        let asked: Vec<&str> = ids.iter().map(BatchId::as_str).collect();
        let asked = &asked;
        let mut found: HashMap<String, BatchListing> = self
            .run("get_listings", Retry::Safe, |client, _| {
                Box::pin(async move {
                    let sql = format!(
                        "SELECT {SUMMARY_COLUMNS}, b.created_at,
                            (SELECT jsonb_agg(to_jsonb(r) ORDER BY r.component, r.generation)::text
                               FROM runs r WHERE r.batch_id = b.id AND r.state = 'open')
                         {SUMMARY_FROM} WHERE b.id = ANY($1)"
                    );
                    let statement = prepare(client, &sql).await?;
                    let rows = client.query(&statement, &[asked]).await.map_err(|e| self.read_failure(e))?;
                    rows.iter()
                        .map(|row| {
                            let listing = BatchListing {
                                summary: summary_from_row(row)?,
                                created_at: Timestamp(row.get(15)),
                                open_runs: runs_from_json(row.get(16))?,
                            };
                            Ok((listing.summary.id.as_str().to_string(), listing))
                        })
                        .collect()
                })
            })
            .await?;
        Ok(ids.iter().filter_map(|id| found.remove(id.as_str())).collect())
    }

    async fn set_priority(&self, id: &BatchId, priority: i32) -> StoreResult<Seq> {
        self.run("set_priority", Retry::Safe, |client, _| {
            Box::pin(async move {
                let statement = prepare(client, "SELECT autocomp_set_priority($1, $2)").await?;
                let row = client
                    .query_one(&statement, &[&id.as_str(), &priority])
                    .await
                    .map_err(|e| self.failure(e, &Scope { batch: id, run: None }))?;
                Ok(Seq(row.get(0)))
            })
        })
        .await
    }

    async fn record_content_change(&self, id: &BatchId, metadata_patch: Map<String, Value>) -> StoreResult<Seq> {
        // Merging the same patch twice leaves the same metadata, so a retry is harmless.
        self.run("record_content_change", Retry::Safe, |client, _| {
            let patch = &metadata_patch;
            Box::pin(async move {
                let read = prepare(client, "SELECT metadata::text, modified_seq FROM batches WHERE id = $1").await?;
                let write = prepare(client, "SELECT autocomp_replace_metadata($1, $2, $3, $4)").await?;
                let scope = Scope { batch: id, run: None };
                for _ in 0..CONDITIONAL_ROUNDS {
                    let row = client.query_opt(&read, &[&id.as_str()]).await.map_err(|e| self.read_failure(e))?;
                    let row = row.ok_or_else(|| Failure::Final(StoreError::NotFound(id.clone())))?;
                    let metadata: Value =
                        serde_json::from_str(row.get::<_, &str>(0)).map(unjsoned).map_err(|e| corrupt("batch", e))?;
                    let expected: i64 = row.get(1);
                    let merged = write_rules::merge_metadata(metadata, patch.clone()).map_err(Failure::Final)?;
                    let row = client
                        .query_one(&write, &[&id.as_str(), &expected, &*text::json(&merged), &self.cap()])
                        .await
                        .map_err(|e| self.failure(e, &scope))?;
                    if let Some(seq) = row.get::<_, Option<i64>>(0) {
                        return Ok(Seq(seq));
                    }
                }
                Err(Failure::Final(busy(id)))
            })
        })
        .await
    }

    /// Group commit: appends through this handle queue, and up to `APPEND_LANES` background
    /// tasks send what is queued as one call of `autocomp_append_group` (one transaction,
    /// one commit flush), each append answered on its own.
    async fn append_event(&self, batch: &BatchId, mut event: NewEvent) -> StoreResult<Event> {
        event.validate()?;
        // With a key a retry after a lost answer returns the first event instead of a second.
        if event.idempotency_key.is_none() {
            event.idempotency_key = Some(self.fresh_key());
        }
        let (reply, answer) = tokio::sync::oneshot::channel();
        let lead = {
            let mut queue = self.inner.appends.lock().unwrap_or_else(|p| p.into_inner());
            queue.pending.push(PendingAppend { batch: batch.clone(), event, reply });
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

    async fn claim(&self, batch: &BatchId, component: &ComponentName, holder: &RunHolder) -> StoreResult<Claim> {
        holder.validate()?;
        // With a claim key a retry returns the run the first attempt opened, instead of
        // abandoning a run we never heard of.
        let holder = holder.keyed(|| self.fresh_key());
        let holder = &holder;
        self.run("claim", Retry::Safe, |client, _| {
            Box::pin(async move {
                let statement = prepare(
                    client,
                    "SELECT r_kind, r_run::text, r_abandoned::text, r_current FROM autocomp_claim($1, $2, $3, $4, $5, $6)",
                )
                .await?;
                let row = client
                    .query_one(
                        &statement,
                        &[
                            &batch.as_str(),
                            &component.as_str(),
                            &holder.agent.as_str(),
                            &holder.host,
                            &i64::from(holder.pid),
                            &holder.claim_key.as_ref().map(IdempotencyKey::as_str),
                        ],
                    )
                    .await
                    .map_err(|e| self.failure(e, &Scope { batch, run: None }))?;
                claim_answer(row.get(0), row.get(1), row.get(2), row.get(3), batch, component, holder)?
                    .map_err(Failure::Final)
            })
        })
        .await
    }

    /// One call of `autocomp_claim_many`: one transaction, one commit flush for the pass.
    async fn claim_many(
        &self,
        batches: &[BatchId],
        component: &ComponentName,
        holder: &RunHolder,
    ) -> StoreResult<Vec<StoreResult<Claim>>> {
        holder.validate()?;
        if batches.len() > MAX_BATCH_PAGE {
            return Err(page_too_large("batches", batches.len(), MAX_BATCH_PAGE));
        }
        let Some(first) = batches.first() else { return Ok(Vec::new()) };
        // One key for the whole pass (keys are per batch and component): a retry after a lost
        // answer returns the runs the first attempt opened, as for `claim`.
        let holder = holder.keyed(|| self.fresh_key());
        let holder = &holder;
        let ids: Vec<&str> = batches.iter().map(BatchId::as_str).collect();
        let ids = &ids;
        self.run("claim_many", Retry::Safe, |client, _| {
            Box::pin(async move {
                // The claims commit without waiting for their WAL flush (`synchronous_commit`
                // off for this transaction alone): they survive the client at once and the
                // server's crash with the next synchronous commit, the work's result, which
                // flushes the WAL up to itself, claims included. Lost with the server before
                // then, they leave batches that are simply ready again.
                let statement = prepare(
                    client,
                    "SELECT r_index, r_kind, r_run::text, r_abandoned::text, r_current
                     FROM (SELECT set_config('synchronous_commit', 'off', true)) AS relaxed,
                          autocomp_claim_many($1, $2, $3, $4, $5, $6)",
                )
                .await?;
                let rows = client
                    .query(
                        &statement,
                        &[
                            ids,
                            &component.as_str(),
                            &holder.agent.as_str(),
                            &holder.host,
                            &i64::from(holder.pid),
                            &holder.claim_key.as_ref().map(IdempotencyKey::as_str),
                        ],
                    )
                    .await
                    .map_err(|e| self.failure(e, &Scope { batch: first, run: None }))?;
                if rows.len() != batches.len() {
                    return Err(corrupt("answer", format!("{} answers for {} batches", rows.len(), batches.len())));
                }
                let mut answers = Vec::with_capacity(batches.len());
                for (row, batch) in rows.iter().zip(batches) {
                    if usize::try_from(row.get::<_, i32>(0)).ok() != Some(answers.len() + 1) {
                        return Err(corrupt("answer", "claims answered out of order"));
                    }
                    answers.push(match row.get::<_, &str>(1) {
                        "missing" => Err(StoreError::NotFound(batch.clone())),
                        kind => claim_answer(kind, row.get(2), row.get(3), row.get(4), batch, component, holder)?,
                    });
                }
                Ok(answers)
            })
        })
        .await
    }

    async fn release(&self, batch: &BatchId, component: &ComponentName, generation: i64) -> StoreResult<()> {
        self.run("release", Retry::Safe, |client, _| {
            Box::pin(async move {
                let statement = prepare(client, "SELECT autocomp_release($1, $2, $3)").await?;
                client
                    .execute(&statement, &[&batch.as_str(), &component.as_str(), &generation])
                    .await
                    .map_err(|e| self.failure(e, &Scope { batch, run: Some((component, generation)) }))?;
                Ok(())
            })
        })
        .await
    }

    async fn save_checkpoint(
        &self,
        batch: &BatchId,
        component: &ComponentName,
        generation: i64,
        data: Value,
    ) -> StoreResult<()> {
        autocomp_model::check_object("checkpoint", &data)?;
        let data = &*text::json(&data);
        self.run("save_checkpoint", Retry::Safe, |client, _| {
            Box::pin(async move {
                let statement = prepare(client, "SELECT autocomp_save_checkpoint($1, $2, $3, $4)").await?;
                client
                    .execute(&statement, &[&batch.as_str(), &component.as_str(), &generation, data])
                    .await
                    .map_err(|e| self.failure(e, &Scope { batch, run: Some((component, generation)) }))?;
                Ok(())
            })
        })
        .await
    }

    async fn load_checkpoint(&self, batch: &BatchId, component: &ComponentName) -> StoreResult<Option<Value>> {
        self.run("load_checkpoint", Retry::Safe, |client, _| {
            Box::pin(async move {
                let statement = prepare(
                    client,
                    "SELECT EXISTS (SELECT 1 FROM batches WHERE id = $1),
                            (SELECT data::text FROM checkpoints WHERE batch_id = $1 AND component = $2)",
                )
                .await?;
                let row = client
                    .query_one(&statement, &[&batch.as_str(), &component.as_str()])
                    .await
                    .map_err(|e| self.read_failure(e))?;
                if !row.get::<_, bool>(0) {
                    return Err(Failure::Final(StoreError::NotFound(batch.clone())));
                }
                row.get::<_, Option<&str>>(1)
                    .map(|stored| serde_json::from_str(stored).map(unjsoned).map_err(|e| corrupt("checkpoint", e)))
                    .transpose()
            })
        })
        .await
    }

    async fn open_runs(&self, component: Option<&ComponentName>) -> StoreResult<Vec<Run>> {
        let component = component.map(ComponentName::as_str);
        self.run("open_runs", Retry::Safe, |client, _| {
            Box::pin(async move {
                let statement = prepare(
                    client,
                    "SELECT to_jsonb(r)::text FROM runs r WHERE state = 'open' AND ($1::text IS NULL OR component = $1)
                     ORDER BY batch_id, component, generation",
                )
                .await?;
                let rows = client.query(&statement, &[&component]).await.map_err(|e| self.read_failure(e))?;
                rows.iter().map(|row| run_from_json(row.get(0))).collect()
            })
        })
        .await
    }

    async fn failed_attempts(&self, batch: &BatchId, component: &ComponentName, since: Seq) -> StoreResult<u32> {
        self.run("failed_attempts", Retry::Safe, |client, _| {
            Box::pin(async move {
                let statement = prepare(
                    client,
                    "SELECT COUNT(*) FROM runs WHERE batch_id = $1 AND component = $2 AND claim_seq > $3
                       AND (state = 'abandoned' OR transient)",
                )
                .await?;
                let row = client
                    .query_one(&statement, &[&batch.as_str(), &component.as_str(), &since.0])
                    .await
                    .map_err(|e| self.read_failure(e))?;
                Ok(u32::try_from(row.get::<_, i64>(0)).unwrap_or(u32::MAX))
            })
        })
        .await
    }

    async fn changes(&self, since: Seq, limit: usize) -> StoreResult<ChangePage> {
        if limit > MAX_CHANGE_PAGE {
            return Err(page_too_large("limit", limit, MAX_CHANGE_PAGE));
        }
        // Only up to the horizon: a seq above it may belong to a transaction that has not
        // committed yet and would be skipped if the cursor passed it.
        let head = self.horizon().await?;
        let changes: Vec<(Seq, BatchId)> = self
            .run("changes", Retry::Safe, |client, _| {
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
            .await?;
        let next = match changes.last() {
            Some((seq, _)) if changes.len() == limit => *seq,
            _ => head.max(since),
        };
        Ok(ChangePage { changes, next, head })
    }

    async fn head(&self) -> StoreResult<Seq> {
        self.horizon().await
    }

    /// The server's clock is `autocomp_now()`, what stamps passes and the work series.
    async fn about(&self) -> StoreResult<StoreAbout> {
        let clock = self.read_number("about", "SELECT autocomp_now()").await?;
        let schema_version = self.schema_version().await?;
        Ok(StoreAbout {
            backend: "postgres".into(),
            schema_version: schema_version.into(),
            schema_wanted: super::LATEST_VERSION.into(),
            clock: Timestamp(clock),
        })
    }

    /// Sleeps until the server notifies a commit (`listen=on`, the default), or polls the
    /// sequence every 25 ms while not listening (one cheap read, no lock); only when a seq
    /// past `since` was taken does it wait for the horizon. While listening it still looks
    /// every `LISTENING_POLL`, in case the notifications cannot reach it (a PgBouncer in
    /// transaction mode should say `listen=off`).
    async fn wait_for_change(&self, since: Seq, timeout: Duration) -> StoreResult<Seq> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut wakes = self.inner.listener.wakes(&self.inner.options);
        loop {
            // Before the read: a commit after it wakes the wait below.
            let listening = wakes.as_mut().is_some_and(|wakes| wakes.listening());
            if self.latest_seq_taken().await? > since {
                let head = self.horizon().await?;
                if head > since {
                    return Ok(head);
                }
            }
            if tokio::time::Instant::now() >= deadline {
                return self.horizon().await;
            }
            let poll = if listening { LISTENING_POLL } else { Duration::from_millis(25) };
            let woken = async {
                match wakes.as_mut() {
                    Some(wakes) => wakes.changed().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = woken => {}
                _ = tokio::time::sleep_until((tokio::time::Instant::now() + poll).min(deadline)) => {}
            }
        }
    }

    async fn cancel_run(
        &self,
        batch: &BatchId,
        component: &ComponentName,
        event: NewEvent,
    ) -> StoreResult<Cancellation> {
        event.validate()?;
        write_rules::check_cancellation(&event)?;
        let event = &event;
        self.run("cancel_run", Retry::OnlyUnsent, |client, _| {
            Box::pin(async move {
                let read = prepare(
                    client,
                    "SELECT EXISTS (SELECT 1 FROM batches WHERE id = $1),
                            (SELECT to_jsonb(r) FROM runs r WHERE batch_id = $1 AND component = $2 AND state = 'open')",
                )
                .await?;
                let write =
                    prepare(client, "SELECT * FROM autocomp_cancel_run($1, $2, $3, $4, $5, $6, $7, $8)").await?;
                for _ in 0..CONDITIONAL_ROUNDS {
                    let row = client
                        .query_one(&read, &[&batch.as_str(), &component.as_str()])
                        .await
                        .map_err(|e| self.read_failure(e))?;
                    if !row.get::<_, bool>(0) {
                        return Err(Failure::Final(StoreError::NotFound(batch.clone())));
                    }
                    let open = row.get::<_, Option<Value>>(1).map(run_from_value).transpose()?;
                    let mut new = event.clone();
                    if let Some(run) = &open {
                        write_rules::describe_cancelled_run(&mut new.details, run);
                    }
                    autocomp_model::check_object("details", &new.details).map_err(|e| Failure::Final(e.into()))?;
                    let row = client
                        .query_one(
                            &write,
                            &[
                                &batch.as_str(),
                                &component.as_str(),
                                &open.as_ref().map(|run| run.generation),
                                &new.event_type.as_str(),
                                &new.outcome.as_str(),
                                &new.agent.as_str(),
                                &*text::json(&new.details),
                                &self.cap(),
                            ],
                        )
                        .await
                        .map_err(|e| self.failure(e, &Scope { batch, run: None }))?;
                    let Some(seq) = row.get::<_, Option<i64>>(0) else { continue };
                    let at = Timestamp(row.get(1));
                    let run = open.map(|mut run| {
                        run.state = RunState::Cancelled;
                        run.ended_at = Some(at);
                        run
                    });
                    return Ok(Cancellation { event: new.recorded(batch, Seq(seq), at), run });
                }
                Err(Failure::Final(busy(batch)))
            })
        })
        .await
    }

    async fn prioritize(&self, id: &BatchId, priority: i32, event: NewEvent) -> StoreResult<Event> {
        event.validate()?;
        write_rules::check_operator_event(&event, "prioritize")?;
        let event = &event;
        self.run("prioritize", Retry::OnlyUnsent, |client, _| {
            Box::pin(async move {
                let read = prepare(client, "SELECT priority FROM batches WHERE id = $1").await?;
                let write =
                    prepare(client, "SELECT * FROM autocomp_prioritize($1, $2, $3, $4, $5, $6, $7, $8)").await?;
                for _ in 0..CONDITIONAL_ROUNDS {
                    let row = client.query_opt(&read, &[&id.as_str()]).await.map_err(|e| self.read_failure(e))?;
                    let previous: i32 = row.ok_or_else(|| Failure::Final(StoreError::NotFound(id.clone())))?.get(0);
                    let mut new = event.clone();
                    write_rules::describe_priority_change(&mut new.details, priority, previous);
                    autocomp_model::check_object("details", &new.details).map_err(|e| Failure::Final(e.into()))?;
                    let row = client
                        .query_one(
                            &write,
                            &[
                                &id.as_str(),
                                &priority,
                                &previous,
                                &new.event_type.as_str(),
                                &new.outcome.as_str(),
                                &new.agent.as_str(),
                                &*text::json(&new.details),
                                &self.cap(),
                            ],
                        )
                        .await
                        .map_err(|e| self.failure(e, &Scope { batch: id, run: None }))?;
                    let Some(seq) = row.get::<_, Option<i64>>(0) else { continue };
                    return Ok(new.recorded(id, Seq(seq), Timestamp(row.get(1))));
                }
                Err(Failure::Final(busy(id)))
            })
        })
        .await
    }

    async fn count_batches(&self) -> StoreResult<u64> {
        let count = self.read_number("count_batches", "SELECT COUNT(*) FROM batches").await?;
        Ok(count.max(0) as u64)
    }
}

#[async_trait]
impl RegistryStore for PgStore {
    /// One call, one round trip: this runs at every cron start of every component. Repeating
    /// it only moves the host's `last_seen` again, so it is retried like a read.
    async fn record_pass(&self, pass: PassRecord) -> StoreResult<()> {
        pass.validate()?;
        let descriptor = serde_json::to_value(&pass.descriptor).expect("descriptors always serialize");
        let descriptor = text::json(&descriptor).into_owned();
        let (ended, outcome, summary, duration_ms, work) = match &pass.phase {
            PassPhase::Started => (false, None, None, None, None),
            PassPhase::Ended { outcome, summary, duration_ms, work } => (
                true,
                Some(outcome.as_str()),
                Some(text::text(summary)),
                Some(i64::try_from(*duration_ms).unwrap_or(i64::MAX)),
                (!work.is_empty()).then(|| work_json(&WorkTallies::of(work))),
            ),
        };
        // Repeating a pass that carries work would count its results twice.
        let retry = if pass.carries_work() { Retry::OnlyUnsent } else { Retry::Safe };
        let summary = summary.as_deref();
        let (pass, descriptor, work) = (&pass, &descriptor, &work);
        let (name, event_type) = (pass.descriptor.name.as_str(), pass.descriptor.event_type.as_str());
        let other = self
            .run("record_pass", retry, |client, _| {
                Box::pin(async move {
                    let statement =
                        prepare(client, "SELECT autocomp_record_pass($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)").await?;
                    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 10] = [
                        &name,
                        &event_type,
                        descriptor,
                        &pass.host,
                        &pass.descriptor.version,
                        &ended,
                        &outcome,
                        &summary,
                        &duration_ms,
                        work,
                    ];
                    match client.query_one(&statement, &params).await {
                        Ok(row) => Ok(row.get::<_, Option<String>>(0)),
                        // Another component took the event type between the function's check
                        // and its insert, and has committed since: name it, as the check would.
                        Err(error) if error.code() == Some(&tokio_postgres::error::SqlState::UNIQUE_VIOLATION) => {
                            let clash = prepare(
                                client,
                                "SELECT name FROM components WHERE event_type = $1 AND retired_at IS NULL AND name <> $2",
                            )
                            .await?;
                            match client.query_opt(&clash, &[&event_type, &name]).await {
                                Ok(Some(row)) => Ok(Some(row.get(0))),
                                Ok(None) => Err(Failure::Unsent(super::describe_error(&error))),
                                Err(error) => Err(classify(&self.inner.options, &error, false)),
                            }
                        }
                        Err(error) => Err(classify(&self.inner.options, &error, false)),
                    }
                })
            })
            .await?;
        match other {
            Some(other) => Err(write_rules::event_type_taken(&pass.descriptor.event_type, &other)),
            None => Ok(()),
        }
    }

    async fn components(&self) -> StoreResult<Vec<RegisteredComponent>> {
        self.run("components", Retry::Safe, |client, _| {
            Box::pin(async move {
                let statement =
                    prepare(client, "SELECT autocomp_component(name)::text FROM components ORDER BY name").await?;
                let rows = client.query(&statement, &[]).await.map_err(|e| self.read_failure(e))?;
                rows.iter().map(|row| component_from_json(row.get(0))).collect()
            })
        })
        .await
    }

    async fn retire_component(
        &self,
        name: &ComponentName,
        by: &Agent,
        reason: &str,
    ) -> StoreResult<RegisteredComponent> {
        let reason = write_rules::retirement_reason(reason)?;
        let reason = text::text(&reason);
        let reason = &&*reason;
        let (outcome, answer) = self
            .run("retire_component", Retry::OnlyUnsent, |client, _| {
                Box::pin(async move {
                    let statement = prepare(
                        client,
                        "SELECT r_outcome, r_component::text FROM autocomp_retire_component($1, $2, $3)",
                    )
                    .await?;
                    let row = client
                        .query_one(&statement, &[&name.as_str(), &by.as_str(), reason])
                        .await
                        .map_err(|e| classify(&self.inner.options, &e, false))?;
                    let outcome: String = row.get(0);
                    let answer: String =
                        row.get::<_, Option<String>>(1).ok_or_else(|| corrupt("answer", "no component"))?;
                    Ok((outcome, answer))
                })
            })
            .await?;
        match outcome.as_str() {
            "unknown" => {
                let known: Vec<String> =
                    serde_json::from_str(&answer).map_err(|e| corrupt("answer", e).into_error())?;
                Err(write_rules::unknown_component(name, &known))
            }
            "already" => {
                let component = component_from_json(&answer).map_err(Failure::into_error)?;
                let retirement = component.retired.ok_or_else(|| corrupt("answer", "not retired").into_error())?;
                Err(write_rules::retired_already(name, &retirement))
            }
            _ => component_from_json(&answer).map_err(Failure::into_error),
        }
    }
}

#[async_trait]
impl SteeringStore for PgStore {
    async fn steering(&self) -> StoreResult<Steering> {
        self.pg_steering().await
    }

    async fn steer(&self, request: SteeringRequest) -> StoreResult<Steered> {
        self.pg_steer(request).await
    }

    async fn steering_log(&self, limit: usize) -> StoreResult<Vec<SteeringEntry>> {
        self.pg_steering_log(limit).await
    }
}

#[async_trait]
impl OutboxStore for PgStore {
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

#[async_trait]
impl SeriesStore for PgStore {
    async fn work_series(
        &self,
        step: SeriesStep,
        since: Timestamp,
        component: Option<&ComponentName>,
    ) -> StoreResult<Vec<WorkPoint>> {
        self.pg_work_series(step, since, component).await
    }

    async fn record_backlog(&self, samples: Vec<BacklogSample>) -> StoreResult<()> {
        self.pg_record_backlog(samples).await
    }
}

/// Most appends one group carries: enough to share a commit among a busy host's writers.
const MAX_GROUP: usize = 64;
/// Groups in flight at once per handle: one commits while the next fills.
const APPEND_LANES: usize = 2;

/// Appends waiting for a group, and how many tasks are sending groups.
#[derive(Default)]
pub(crate) struct AppendQueue {
    pending: Vec<PendingAppend>,
    leaders: usize,
}

pub(crate) struct PendingAppend {
    batch: BatchId,
    event: NewEvent,
    reply: tokio::sync::oneshot::Sender<StoreResult<Event>>,
}

impl PgStore {
    /// Sends queued appends as groups until the queue is empty.
    async fn lead_appends(self) {
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
                    Recorded::New(seq, at) => Ok(pending.event.clone().recorded(&pending.batch, seq, at)),
                    Recorded::Earlier(earlier) => write_rules::earlier_append(&pending.batch, &pending.event, earlier),
                });
                let _ = pending.reply.send(answer); // the caller may have gone; the event stands regardless
            }
        }
    }

    /// One group, one call. When PostgreSQL refuses the data of one of its appends (a
    /// data exception fails the whole call), each append is sent again alone, so only the
    /// one at fault is refused.
    async fn append_group(&self, group: &[PendingAppend]) -> Vec<StoreResult<Recorded>> {
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
    async fn send_group(&self, group: &[PendingAppend]) -> Vec<StoreResult<Recorded>> {
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
        let cap = self.cap();
        let answered = self
            .run("append_event", Retry::Safe, |client, _| {
                let params: [&(dyn tokio_postgres::types::ToSql + Sync); 10] =
                    [&batches, &types, &outcomes, &agents, &details, &components, &generations, &resets, &keys, &cap];
                Box::pin(async move {
                    let statement = prepare(
                        client,
                        "SELECT r_index, r_seq, r_at, r_earlier::text, r_refused, r_reason
                         FROM autocomp_append_group($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
                    )
                    .await?;
                    let rows = client
                        .query(&statement, &params)
                        .await
                        .map_err(|e| self.failure(e, &Scope { batch: &group[0].batch, run: None }))?;
                    let mut answers: Vec<Option<StoreResult<Recorded>>> = group.iter().map(|_| None).collect();
                    for row in &rows {
                        let index = usize::try_from(row.get::<_, i32>(0) - 1).map_err(|e| corrupt("answer", e))?;
                        let pending = group.get(index).ok_or_else(|| corrupt("answer", index))?;
                        let answer = match (row.get::<_, Option<&str>>(4), row.get::<_, Option<&str>>(3)) {
                            (Some("AC404"), _) => Err(StoreError::NotFound(pending.batch.clone())),
                            (Some("AC413"), _) => {
                                let sizes = row.get::<_, Option<String>>(5).unwrap_or_default();
                                Err(self.over_cap(&pending.batch, &sizes, "this event"))
                            }
                            (Some(_), _) => {
                                let run =
                                    pending.event.run.as_ref().ok_or_else(|| corrupt("answer", "fenced, no run"))?;
                                Err(StoreError::Fenced {
                                    batch: pending.batch.clone(),
                                    component: run.component.clone(),
                                    generation: run.generation,
                                    reason: row.get::<_, Option<String>>(5).unwrap_or_default(),
                                })
                            }
                            (None, Some(earlier)) => {
                                let earlier: EventRow =
                                    serde_json::from_str(earlier).map_err(|e| corrupt("event", e))?;
                                Ok(Recorded::Earlier(earlier.into_event()?))
                            }
                            (None, None) => Ok(Recorded::New(Seq(row.get(1)), Timestamp(row.get(2)))),
                        };
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

/// What an append's group recorded for it.
enum Recorded {
    New(Seq, Timestamp),
    /// Its idempotency key had recorded this event before; nothing new was written.
    Earlier(Event),
}

fn busy(id: &BatchId) -> StoreError {
    StoreError::Unavailable(format!(
        "batch {id} kept changing while this write was prepared ({CONDITIONAL_ROUNDS} rounds); nothing was written"
    ))
}
