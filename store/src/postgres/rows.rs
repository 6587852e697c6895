//! How the PostgreSQL backend reads its rows: the selects of a batch and of its summary, and the
//! decoding of batches, events, runs, components and work tallies out of them (arrays of columns
//! and JSON text), a corrupt value being `Unavailable`.

use serde::Deserialize;
use serde_json::{Map, Value};

use super::Failure;
use super::text::{unjsoned, untext};
use crate::port::ready_claims;
use crate::port::{Claim, StoreError, StoreResult};
use crate::write_rules::{self};
use autocomp_model::{
    Agent, Batch, BatchId, BatchSummary, BatchType, ComponentDescriptor, ComponentName, Event, EventSummary, EventType,
    HostRecord, IdempotencyKey, Outcome, PassOutcome, RegisteredComponent, Retirement, Run, RunHolder, RunRef,
    RunState, Seq, SummaryHeader, SummaryState, Timestamp, WorkHistory, WorkResult, WorkTallies, WorkTally,
};

/// A batch with its log (as arrays of columns: no JSON is built on the server) and open runs.
pub(super) const BATCH_SELECT: &str =
    "SELECT b.id, b.type, b.priority, b.metadata::text, b.created_seq, b.modified_seq,
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

/// A batch's summary (`BatchSummary`), all of it kept on the batch's row (schema 18: its
/// effective events and its components with an open run are kept there by triggers on
/// `batch_effective` and `runs`): columns 0 to 15 of every read that summarizes.
pub(super) const SUMMARY_COLUMNS: &str =
    "b.id, b.type, b.priority, b.created_seq, b.modified_seq, b.changed_seq, b.modified_at,
        b.last_event_at, b.effective_types, b.effective_outcomes, b.effective_seqs, b.effective_transients,
        b.effective_skipped, b.effective_content_seqs, b.open_components, b.effective_acknowledged";
pub(super) const SUMMARY_FROM: &str = "FROM batches b";

/// How many columns `SUMMARY_COLUMNS` are: a read that selects more numbers them from here.
pub(super) const SUMMARY_WIDTH: usize = 16;

/// A summary out of `SUMMARY_COLUMNS`.
pub(super) fn summary_from_row(row: &tokio_postgres::Row) -> Result<BatchSummary, Failure> {
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
        // Kept together by one statement (schema 18); a hand edit may have left them apart.
        let apart = || corrupt("effective event", "the kept summary's columns differ");
        let outcomes: Vec<String> = row.get::<_, Option<_>>(9).ok_or_else(apart)?;
        let seqs: Vec<i64> = row.get::<_, Option<_>>(10).ok_or_else(apart)?;
        let transients: Vec<bool> = row.get::<_, Option<_>>(11).ok_or_else(apart)?;
        let skipped: Vec<bool> = row.get::<_, Option<_>>(12).ok_or_else(apart)?;
        let content_seqs: Vec<Option<i64>> = row.get::<_, Option<_>>(13).ok_or_else(apart)?;
        let acknowledged: Vec<bool> = row.get::<_, Option<_>>(15).ok_or_else(apart)?;
        let lengths =
            [outcomes.len(), seqs.len(), transients.len(), skipped.len(), content_seqs.len(), acknowledged.len()];
        if lengths.iter().any(|length| *length != types.len()) {
            return Err(apart());
        }
        for (i, event_type) in types.into_iter().enumerate() {
            effective.push(EventSummary {
                event_type: EventType::new(event_type).map_err(|e| corrupt("effective event", e))?,
                outcome: Outcome::parse(&outcomes[i]).map_err(|e| corrupt("effective event", e))?,
                seq: Seq(seqs[i]),
                transient: transients[i],
                skipped: skipped[i],
                acknowledged: acknowledged[i],
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
pub(super) fn runs_from_json(text: Option<&str>) -> Result<Vec<Run>, Failure> {
    let Some(text) = text else { return Ok(Vec::new()) };
    serde_json::from_str::<Vec<RunRow>>(text)
        .map_err(|e| corrupt("run", e))?
        .into_iter()
        .map(RunRow::into_run)
        .collect()
}

/// Events as `jsonb_agg(to_jsonb(e))` writes them.
pub(super) fn events_from_json(text: Option<&str>) -> Result<Vec<Event>, Failure> {
    let Some(text) = text else { return Ok(Vec::new()) };
    let rows: Vec<EventRow> = serde_json::from_str(text).map_err(|e| corrupt("event", e))?;
    rows.into_iter().map(EventRow::into_event).collect()
}

/// A row of `events` as `to_jsonb` writes it.
#[derive(Deserialize)]
pub(super) struct EventRow {
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
pub(super) struct RunRow {
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
    /// The holder's liveness record (schema 11).
    liveness: Option<String>,
}

/// A component as `autocomp_component` writes it: its `components` row and its hosts.
#[derive(Deserialize)]
pub(super) struct ComponentRow {
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
pub(super) struct WorkRow {
    result: String,
    results: i64,
    duration_ms_sum: i64,
    buckets: Vec<i64>,
}

impl WorkRow {
    pub(super) fn add_to(self, tallies: &mut WorkTallies) -> Result<(), Failure> {
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
pub(super) struct HostRow {
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
    pub(super) fn into_event(self) -> Result<Event, Failure> {
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
    pub(super) fn into_run(self) -> Result<Run, Failure> {
        Ok(Run {
            batch_id: BatchId::new(self.batch_id).map_err(|e| corrupt("run", e))?,
            component: ComponentName::new(self.component).map_err(|e| corrupt("run", e))?,
            generation: self.generation,
            holder: RunHolder {
                agent: Agent::new(self.agent).map_err(|e| corrupt("run", e))?,
                host: self.host,
                pid: u32::try_from(self.pid).map_err(|e| corrupt("run", e))?,
                claim_key: self.claim_key.map(IdempotencyKey::new).transpose().map_err(|e| corrupt("run", e))?,
                liveness: self.liveness,
            },
            started_at: Timestamp(self.started_at),
            claim_seq: Seq(self.claim_seq),
            state: RunState::parse(&self.state).map_err(|e| corrupt("run", e))?,
            ended_at: self.ended_at.map(Timestamp),
            transient: self.transient,
        })
    }
}

pub(super) fn run_from_json(text: &str) -> Result<Run, Failure> {
    serde_json::from_str::<RunRow>(text).map_err(|e| corrupt("run", e))?.into_run()
}

/// What `autocomp_claim` answered, as `claim` answers it: a new run, or for a claim key
/// already used, that run again while it is still the open current one, else a `Conflict`;
/// for a batch whose open run is its lock (`held`, nothing written), that run's `Conflict`
/// (`ready_claims::lock_conflict`). The outer error is a corrupt answer.
pub(super) fn claim_answer(
    kind: &str,
    run: &str,
    abandoned: Option<&str>,
    current: i64,
    batch: &BatchId,
    component: &ComponentName,
    holder: &RunHolder,
) -> Result<StoreResult<Claim>, Failure> {
    let run = run_from_json(run)?;
    if kind == HELD {
        return Ok(Err(ready_claims::lock_conflict(&run)));
    }
    if kind == "retry" {
        return Ok(write_rules::retried_claim(run, current, batch, component, holder)
            .map(|run| Claim { run, abandoned: None }));
    }
    let abandoned = abandoned.map(run_from_json).transpose()?;
    Ok(Ok(Claim { run, abandoned }))
}

/// A claim function's answer for a batch whose open run is its lock: that run in `r_run`,
/// nothing written (the rule of `ready_claims::may_abandon`, kept inside the database).
pub(super) const HELD: &str = "held";

pub(super) fn run_from_value(value: Value) -> Result<Run, Failure> {
    serde_json::from_value::<RunRow>(value).map_err(|e| corrupt("run", e))?.into_run()
}

/// A pass's tallies as `autocomp_record_pass` takes them.
pub(super) fn work_json(tallies: &WorkTallies) -> Value {
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

pub(super) fn component_from_json(text: &str) -> Result<RegisteredComponent, Failure> {
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

pub(super) fn batch_from_row(row: &tokio_postgres::Row) -> Result<Batch, Failure> {
    BatchColumns::of_row(row).into_batch()
}

/// A batch's columns in `BATCH_SELECT`'s order: read from a row (`S` = `&str`), or out of the
/// JSON array a hand-on's announcement carries (`autocomp_announce_handed`, schema 26; `S` =
/// `String`), so both decode into a batch the same way.
#[derive(Deserialize)]
pub(super) struct BatchColumns<S> {
    id: S,
    batch_type: S,
    priority: i32,
    metadata: S,
    created_seq: i64,
    modified_seq: i64,
    changed_seq: i64,
    created_at: i64,
    modified_at: i64,
    seqs: Option<Vec<i64>>,
    types: Option<Vec<S>>,
    outcomes: Option<Vec<S>>,
    agents: Option<Vec<S>>,
    ats: Option<Vec<i64>>,
    details: Option<Vec<S>>,
    run_components: Option<Vec<Option<S>>>,
    run_generations: Option<Vec<Option<i64>>>,
    resets: Option<Vec<Option<S>>>,
    open_runs: Option<S>,
    as_of: i64,
}

impl<'a> BatchColumns<&'a str> {
    fn of_row(row: &'a tokio_postgres::Row) -> Self {
        Self {
            id: row.get(0),
            batch_type: row.get(1),
            priority: row.get(2),
            metadata: row.get(3),
            created_seq: row.get(4),
            modified_seq: row.get(5),
            changed_seq: row.get(6),
            created_at: row.get(7),
            modified_at: row.get(8),
            seqs: row.get(9),
            types: row.get(10),
            outcomes: row.get(11),
            agents: row.get(12),
            ats: row.get(13),
            details: row.get(14),
            run_components: row.get(15),
            run_generations: row.get(16),
            resets: row.get(17),
            open_runs: row.get(18),
            as_of: row.get(19),
        }
    }
}

impl<S: AsRef<str>> BatchColumns<S> {
    pub(super) fn into_batch(self) -> Result<Batch, Failure> {
        let id = BatchId::new(self.id.as_ref()).map_err(|e| corrupt("batch", e))?;
        let metadata =
            match serde_json::from_str(self.metadata.as_ref()).map(unjsoned).map_err(|e| corrupt("batch", e))? {
                Value::Object(map) => map,
                _ => Map::new(),
            };
        let events = self.events(&id)?;
        let open_runs = match &self.open_runs {
            Some(runs) => serde_json::from_str::<Vec<RunRow>>(runs.as_ref())
                .map_err(|e| corrupt("run", e))?
                .into_iter()
                .map(RunRow::into_run)
                .collect::<Result<_, _>>()?,
            None => Vec::new(),
        };
        Ok(Batch {
            id,
            batch_type: BatchType::new(self.batch_type.as_ref()).map_err(|e| corrupt("batch", e))?,
            priority: self.priority,
            metadata,
            created_seq: Seq(self.created_seq),
            modified_seq: Seq(self.modified_seq),
            changed_seq: Seq(self.changed_seq),
            created_at: Timestamp(self.created_at),
            modified_at: Timestamp(self.modified_at),
            events,
            open_runs,
            as_of: Timestamp(self.as_of),
        })
    }

    /// The log, out of its arrays of columns (all of one length, or all null: no events).
    fn events(&self, id: &BatchId) -> Result<Vec<Event>, Failure> {
        let seqs = self.seqs.as_deref().unwrap_or_default();
        let column = |name: &str, len: Option<usize>| match len == Some(seqs.len()) {
            true => Ok(()),
            false => Err(corrupt("event", format!("the log's {name} do not match its seqs"))),
        };
        if seqs.is_empty() {
            return Ok(Vec::new());
        }
        let (types, outcomes, agents) = (self.types.as_deref(), self.outcomes.as_deref(), self.agents.as_deref());
        let (ats, details, resets) = (self.ats.as_deref(), self.details.as_deref(), self.resets.as_deref());
        let (run_components, run_generations) = (self.run_components.as_deref(), self.run_generations.as_deref());
        column("types", types.map(<[S]>::len))?;
        column("outcomes", outcomes.map(<[S]>::len))?;
        column("agents", agents.map(<[S]>::len))?;
        column("times", ats.map(<[i64]>::len))?;
        column("details", details.map(<[S]>::len))?;
        column("runs", run_components.map(<[Option<S>]>::len))?;
        column("generations", run_generations.map(<[Option<i64>]>::len))?;
        column("resets", resets.map(<[Option<S>]>::len))?;
        let (types, outcomes, agents, ats, details) = (
            types.unwrap_or_default(),
            outcomes.unwrap_or_default(),
            agents.unwrap_or_default(),
            ats.unwrap_or_default(),
            details.unwrap_or_default(),
        );
        let (run_components, run_generations, resets) =
            (run_components.unwrap_or_default(), run_generations.unwrap_or_default(), resets.unwrap_or_default());
        let mut events = Vec::with_capacity(seqs.len());
        for (i, seq) in seqs.iter().enumerate() {
            let run = match (&run_components[i], run_generations[i]) {
                (Some(component), Some(generation)) => Some(RunRef {
                    component: ComponentName::new(component.as_ref()).map_err(|e| corrupt("event", e))?,
                    generation,
                }),
                _ => None,
            };
            let resets: Vec<EventType> = match &resets[i] {
                Some(text) => serde_json::from_str(text.as_ref()).map_err(|e| corrupt("event", e))?,
                None => Vec::new(),
            };
            events.push(Event {
                seq: Seq(*seq),
                batch_id: id.clone(),
                event_type: EventType::new(types[i].as_ref()).map_err(|e| corrupt("event", e))?,
                outcome: Outcome::parse(outcomes[i].as_ref()).map_err(|e| corrupt("event", e))?,
                agent: Agent::new(agents[i].as_ref()).map_err(|e| corrupt("event", e))?,
                at: Timestamp(ats[i]),
                details: serde_json::from_str(details[i].as_ref()).map(unjsoned).map_err(|e| corrupt("event", e))?,
                run,
                resets,
            });
        }
        Ok(events)
    }
}
