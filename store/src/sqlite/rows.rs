//! Batches, events and runs read back out of rows: the columns each read selects, the
//! conversions that turn stored text into validated names (cached per read, as one page
//! repeats the same few), and whole batches loaded a page at a time. Shared by the
//! operations and by the summary reads, which both load batches.

use std::collections::HashMap;

use rusqlite::{Connection, OptionalExtension, Row};
use serde_json::{Map, Value};

use crate::port::{StoreError, StoreResult};
use autocomp_model::{
    Agent, Batch, BatchId, BatchType, ComponentName, Event, EventType, InvalidInput, Outcome, Run, RunHolder, RunRef,
    RunState, Seq, Timestamp,
};

use super::unavailable;

pub(super) fn stored<T: TryFrom<String, Error = InvalidInput>>(text: String) -> rusqlite::Result<T> {
    T::try_from(text)
        .map_err(|e| rusqlite::Error::FromSqlConversionFailure(0, rusqlite::types::Type::Text, Box::new(e)))
}

pub(super) fn stored_json(text: String) -> rusqlite::Result<Value> {
    serde_json::from_str(&text)
        .map_err(|e| rusqlite::Error::FromSqlConversionFailure(0, rusqlite::types::Type::Text, Box::new(e)))
}

pub(super) const EVENT_COLUMNS: &str =
    "seq, batch_id, type, outcome, agent, at, details, run_component, run_generation, resets";

pub(super) fn event_from_row(row: &Row) -> rusqlite::Result<Event> {
    let run = match (row.get::<_, Option<String>>(7)?, row.get::<_, Option<i64>>(8)?) {
        (Some(component), Some(generation)) => Some(RunRef { component: stored(component)?, generation }),
        _ => None,
    };
    let resets = match row.get::<_, Option<String>>(9)? {
        Some(text) => serde_json::from_value(stored_json(text)?)
            .map_err(|e| rusqlite::Error::FromSqlConversionFailure(9, rusqlite::types::Type::Text, Box::new(e)))?,
        None => Vec::new(),
    };
    let outcome: String = row.get(3)?;
    Ok(Event {
        seq: Seq(row.get(0)?),
        batch_id: stored(row.get(1)?)?,
        event_type: stored::<EventType>(row.get(2)?)?,
        outcome: Outcome::parse(&outcome)
            .map_err(|e| rusqlite::Error::FromSqlConversionFailure(3, rusqlite::types::Type::Text, Box::new(e)))?,
        agent: stored::<Agent>(row.get(4)?)?,
        at: Timestamp(row.get(5)?),
        details: stored_json(row.get(6)?)?,
        run,
        resets,
    })
}

pub(super) const RUN_COLUMNS: &str = "batch_id, component, generation, agent, host, pid, started_at, claim_seq, state, ended_at, transient, claim_key, liveness";

pub(super) fn run_from_row(row: &Row) -> rusqlite::Result<Run> {
    let state: String = row.get(8)?;
    Ok(Run {
        batch_id: stored(row.get(0)?)?,
        component: stored(row.get(1)?)?,
        generation: row.get(2)?,
        holder: RunHolder {
            agent: stored(row.get(3)?)?,
            host: row.get(4)?,
            pid: row.get(5)?,
            claim_key: row.get::<_, Option<String>>(11)?.map(stored).transpose()?,
            liveness: row.get(12)?,
        },
        started_at: Timestamp(row.get(6)?),
        claim_seq: Seq(row.get(7)?),
        state: RunState::parse(&state)
            .map_err(|e| rusqlite::Error::FromSqlConversionFailure(8, rusqlite::types::Type::Text, Box::new(e)))?,
        ended_at: row.get::<_, Option<i64>>(9)?.map(Timestamp),
        transient: row.get(10)?,
    })
}

pub(super) fn query_runs(tx: &Connection, filter: &str, params: impl rusqlite::Params) -> StoreResult<Vec<Run>> {
    let mut statement = tx
        .prepare_cached(&format!("SELECT {RUN_COLUMNS} FROM runs {filter} ORDER BY batch_id, component, generation"))
        .map_err(unavailable)?;
    statement
        .query_map(params, run_from_row)
        .and_then(|rows| rows.collect::<rusqlite::Result<_>>())
        .map_err(unavailable)
}

/// The batch with its log and open runs, or `None` if it does not exist: the per-batch
/// reads `load_batches` replaced (see `get_batches_one_by_one`).
pub(super) fn load_batch(tx: &Connection, id: &BatchId, as_of: Timestamp) -> StoreResult<Option<Batch>> {
    let row = tx
        .prepare_cached(
            "SELECT type, priority, metadata, created_seq, modified_seq, changed_seq, created_at, modified_at
             FROM batches WHERE id = ?1",
        )
        .and_then(|mut statement| {
            statement
                .query_row([id.as_str()], |row| {
                    let metadata = match stored_json(row.get(2)?)? {
                        Value::Object(map) => map,
                        _ => Map::new(),
                    };
                    Ok((
                        stored::<BatchType>(row.get(0)?)?,
                        row.get::<_, i32>(1)?,
                        metadata,
                        [Seq(row.get(3)?), Seq(row.get(4)?), Seq(row.get(5)?)],
                        [Timestamp(row.get(6)?), Timestamp(row.get(7)?)],
                    ))
                })
                .optional()
        })
        .map_err(unavailable)?;
    let Some((batch_type, priority, metadata, [created_seq, modified_seq, changed_seq], [created_at, modified_at])) =
        row
    else {
        return Ok(None);
    };
    let events = {
        let mut statement = tx
            .prepare_cached(&format!("SELECT {EVENT_COLUMNS} FROM events WHERE batch_id = ?1 ORDER BY seq"))
            .map_err(unavailable)?;
        statement
            .query_map([id.as_str()], event_from_row)
            .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>())
            .map_err(unavailable)?
    };
    let open_runs = query_runs(tx, "WHERE batch_id = ?1 AND state = 'open'", [id.as_str()])?;
    Ok(Some(Batch {
        id: id.clone(),
        batch_type,
        priority,
        metadata,
        created_seq,
        modified_seq,
        changed_seq,
        created_at,
        modified_at,
        events,
        open_runs,
        as_of,
    }))
}

/// The named batches with their logs and open runs, in the order asked (unknown ids left
/// out), in three statements whatever their number: the batch rows, all their events in
/// (batch, seq) order, all their open runs. The ids are bound as one `rarray`.
pub(super) fn load_batches(tx: &Connection, ids: &[BatchId], as_of: Timestamp) -> StoreResult<Vec<Batch>> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let asked: rusqlite::vtab::array::Array =
        std::rc::Rc::new(ids.iter().map(|id| rusqlite::types::Value::Text(id.as_str().to_owned())).collect());
    // Slots in the order the batch rows come; `slot_of` finds a batch's slot by its id.
    let mut slots: Vec<Batch> = Vec::with_capacity(ids.len());
    {
        let mut statement = tx
            .prepare_cached(
                "SELECT id, type, priority, metadata, created_seq, modified_seq, changed_seq, created_at, modified_at
                 FROM batches WHERE id IN rarray(?1)",
            )
            .map_err(unavailable)?;
        let mut rows = statement.query([&asked]).map_err(unavailable)?;
        while let Some(row) = rows.next().map_err(unavailable)? {
            slots.push(batch_from_row(row, as_of).map_err(unavailable)?);
        }
    }
    // Keyed by the asked ids (borrowed from `ids`, not from the batches handed out below).
    let mut slot_of: HashMap<&str, Option<usize>> = ids.iter().map(|id| (id.as_str(), None)).collect();
    for (slot, batch) in slots.iter().enumerate() {
        if let Some(entry) = slot_of.get_mut(batch.id.as_str()) {
            *entry = Some(slot);
        }
    }
    let slot_of = |id: &str| slot_of.get(id).copied().flatten();
    let mut events: Vec<Vec<Event>> = vec![Vec::new(); slots.len()];
    {
        let mut statement = tx
            .prepare_cached(&format!(
                "SELECT {EVENT_COLUMNS} FROM events WHERE batch_id IN rarray(?1) ORDER BY batch_id, seq"
            ))
            .map_err(unavailable)?;
        let mut rows = statement.query([&asked]).map_err(unavailable)?;
        let mut names = NameCache::default();
        // Rows come grouped by batch: look the slot up once per batch, not per event.
        let mut current: Option<(String, usize)> = None;
        while let Some(row) = rows.next().map_err(unavailable)? {
            let batch_id = row.get_ref(1).and_then(|v| Ok(v.as_str()?)).map_err(unavailable)?;
            let slot = match &current {
                Some((id, slot)) if id == batch_id => *slot,
                _ => {
                    let slot = slot_of(batch_id).ok_or_else(|| corrupt_row("events", batch_id))?;
                    current = Some((batch_id.to_owned(), slot));
                    slot
                }
            };
            let event = event_from_row_of(row, &slots[slot].id, &mut names).map_err(unavailable)?;
            events[slot].push(event);
        }
    }
    let mut open_runs: Vec<Vec<Run>> = vec![Vec::new(); slots.len()];
    {
        let mut statement = tx
            .prepare_cached(&format!(
                "SELECT {RUN_COLUMNS} FROM runs WHERE batch_id IN rarray(?1) AND state = 'open'
                 ORDER BY batch_id, component, generation"
            ))
            .map_err(unavailable)?;
        let mut rows = statement.query([&asked]).map_err(unavailable)?;
        while let Some(row) = rows.next().map_err(unavailable)? {
            let run = run_from_row(row).map_err(unavailable)?;
            let slot = slot_of(run.batch_id.as_str()).ok_or_else(|| corrupt_row("runs", run.batch_id.as_str()))?;
            open_runs[slot].push(run);
        }
    }
    let batches: Vec<Batch> = slots
        .into_iter()
        .zip(events.into_iter().zip(open_runs))
        .map(|(mut batch, (events, open_runs))| {
            batch.events = events;
            batch.open_runs = open_runs;
            batch
        })
        .collect();
    Ok(in_asked_order(ids, batches, |batch| &batch.id))
}

/// `found` (what a read of `ids` found, in any order) in the order `ids` asked for it:
/// unknown ids left out, an id asked twice answered once.
pub(super) fn in_asked_order<T>(ids: &[BatchId], found: Vec<T>, id_of: impl Fn(&T) -> &BatchId) -> Vec<T> {
    let mut first_asked: HashMap<&str, usize> = HashMap::with_capacity(ids.len());
    for (position, id) in ids.iter().enumerate() {
        first_asked.entry(id.as_str()).or_insert(position);
    }
    // Each batch once, at the place it was first asked: a repeated id costs nothing more
    // (eight copies of one large batch used to answer eight copies).
    let mut slots: Vec<Option<T>> = (0..ids.len()).map(|_| None).collect();
    for item in found {
        if let Some(&position) = first_asked.get(id_of(&item).as_str()) {
            slots[position] = Some(item);
        }
    }
    slots.into_iter().flatten().collect()
}

pub(super) fn corrupt_row(table: &str, batch_id: &str) -> StoreError {
    StoreError::Unavailable(format!("{table} row of batch {batch_id:?} that the same read did not find"))
}

/// A batch row without its log and runs.
pub(super) fn batch_from_row(row: &Row, as_of: Timestamp) -> rusqlite::Result<Batch> {
    let metadata = match stored_json(row.get(3)?)? {
        Value::Object(map) => map,
        _ => Map::new(),
    };
    Ok(Batch {
        id: stored(row.get(0)?)?,
        batch_type: stored::<BatchType>(row.get(1)?)?,
        priority: row.get(2)?,
        metadata,
        created_seq: Seq(row.get(4)?),
        modified_seq: Seq(row.get(5)?),
        changed_seq: Seq(row.get(6)?),
        created_at: Timestamp(row.get(7)?),
        modified_at: Timestamp(row.get(8)?),
        events: Vec::new(),
        open_runs: Vec::new(),
        as_of,
    })
}

/// The few distinct event types, agents and components of a page, each validated once.
#[derive(Default)]
pub(super) struct NameCache {
    pub(super) batch_types: Vec<BatchType>,
    pub(super) event_types: Vec<EventType>,
    agents: Vec<Agent>,
    pub(super) components: Vec<ComponentName>,
}

pub(super) fn cached<T: TryFrom<String, Error = InvalidInput> + AsRef<str> + Clone>(
    known: &mut Vec<T>,
    text: &str,
) -> rusqlite::Result<T> {
    // Most recently added first: a page's names cluster.
    if let Some(name) = known.iter().rev().find(|name| name.as_ref() == text) {
        return Ok(name.clone());
    }
    let name: T = stored(text.to_owned())?;
    if known.len() < 256 {
        known.push(name.clone());
    }
    Ok(name)
}

/// `event_from_row` for a row of a batch already read: its id is not read again.
pub(super) fn event_from_row_of(row: &Row, batch_id: &BatchId, names: &mut NameCache) -> rusqlite::Result<Event> {
    let text = |i: usize| -> rusqlite::Result<&str> { Ok(row.get_ref(i)?.as_str()?) };
    let optional_text = |i: usize| -> rusqlite::Result<Option<&str>> { Ok(row.get_ref(i)?.as_str_or_null()?) };
    let run = match (optional_text(7)?, row.get::<_, Option<i64>>(8)?) {
        (Some(component), Some(generation)) => {
            Some(RunRef { component: cached(&mut names.components, component)?, generation })
        }
        _ => None,
    };
    let resets = match optional_text(9)? {
        Some(text) => serde_json::from_str(text)
            .map_err(|e| rusqlite::Error::FromSqlConversionFailure(9, rusqlite::types::Type::Text, Box::new(e)))?,
        None => Vec::new(),
    };
    Ok(Event {
        seq: Seq(row.get(0)?),
        batch_id: batch_id.clone(),
        event_type: cached(&mut names.event_types, text(2)?)?,
        outcome: Outcome::parse(text(3)?)
            .map_err(|e| rusqlite::Error::FromSqlConversionFailure(3, rusqlite::types::Type::Text, Box::new(e)))?,
        agent: cached(&mut names.agents, text(4)?)?,
        at: Timestamp(row.get(5)?),
        details: serde_json::from_str(text(6)?)
            .map_err(|e| rusqlite::Error::FromSqlConversionFailure(6, rusqlite::types::Type::Text, Box::new(e)))?,
        run,
        resets,
    })
}
