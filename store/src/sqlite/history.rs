//! The registry's history of each component's work on SQLite: result tallies in total, per
//! minute (two hours) and per hour (31 days), and the backlog samples the monitor records,
//! per minute and per hour; old steps are dropped as new ones are written.

use std::collections::HashMap;

use rusqlite::{Connection, OptionalExtension, Row, Transaction, params};

use super::{SqliteBackend, unavailable};
use crate::port::SeriesStore;
use crate::port::StoreResult;
use async_trait::async_trait;
use autocomp_model::{
    BacklogSample, ComponentName, SeriesStep, Timestamp, WORK_MINUTES_IN_HOUR, WorkHistory, WorkPoint, WorkResult,
    WorkTallies, WorkTally,
};

/// Adds a pass's results to the component's totals and to the current minute's and hour's
/// tallies, and drops steps older than the registry keeps.
pub(super) fn add_work(tx: &Transaction, component: &str, now: Timestamp, tallies: &WorkTallies) -> StoreResult<()> {
    for (result, tally) in tallies.non_empty() {
        let key = (component, result.as_str());
        let total: Option<WorkTally> = tx
            .prepare_cached(
                "SELECT results, duration_ms_sum, buckets FROM component_work_totals WHERE component = ?1 AND result = ?2",
            )
            .and_then(|mut statement| statement.query_row(params![key.0, key.1], |row| tally_at(row, 0)).optional())
            .map_err(unavailable)?;
        let total = merged(total, tally);
        tx.prepare_cached(
            "INSERT OR REPLACE INTO component_work_totals (component, result, results, duration_ms_sum, buckets)
             VALUES (?1, ?2, ?3, ?4, ?5)",
        )
        .and_then(|mut statement| {
            statement.execute(params![
                key.0,
                key.1,
                stored_count(total.results),
                stored_count(total.duration_ms_sum),
                buckets_text(&total)
            ])
        })
        .map_err(unavailable)?;
        for step in [SeriesStep::Minute, SeriesStep::Hour] {
            add_to_step(tx, step, component, step.index_of(now), result, tally)?;
        }
    }
    for step in [SeriesStep::Minute, SeriesStep::Hour] {
        let (table, column) = step_table(step);
        tx.prepare_cached(&format!("DELETE FROM {table} WHERE component = ?1 AND {column} < ?2"))
            .and_then(|mut statement| statement.execute(params![component, step.index_of(now) - step.kept()]))
            .map_err(unavailable)?;
    }
    Ok(())
}

/// The table and step column a step's tallies are kept in.
fn step_table(step: SeriesStep) -> (&'static str, &'static str) {
    match step {
        SeriesStep::Minute => ("component_work_minutes", "minute"),
        SeriesStep::Hour => ("component_work_hours", "hour"),
    }
}

fn add_to_step(
    tx: &Transaction,
    step: SeriesStep,
    component: &str,
    index: i64,
    result: WorkResult,
    tally: &WorkTally,
) -> StoreResult<()> {
    let (table, column) = step_table(step);
    let current: Option<WorkTally> = tx
        .prepare_cached(&format!(
            "SELECT results, duration_ms_sum, buckets FROM {table} WHERE component = ?1 AND {column} = ?2 AND result = ?3"
        ))
        .and_then(|mut statement| {
            statement.query_row(params![component, index, result.as_str()], |row| tally_at(row, 0)).optional()
        })
        .map_err(unavailable)?;
    let current = merged(current, tally);
    tx.prepare_cached(&format!(
        "INSERT OR REPLACE INTO {table} (component, {column}, result, results, duration_ms_sum, buckets)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)"
    ))
    .and_then(|mut statement| {
        statement.execute(params![
            component,
            index,
            result.as_str(),
            stored_count(current.results),
            stored_count(current.duration_ms_sum),
            buckets_text(&current)
        ])
    })
    .map_err(unavailable)?;
    Ok(())
}

fn stored_count(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn merged(stored: Option<WorkTally>, added: &WorkTally) -> WorkTally {
    let mut tally = stored.unwrap_or_default();
    tally.add(added);
    tally
}

fn buckets_text(tally: &WorkTally) -> String {
    serde_json::to_string(&tally.buckets).expect("counts always serialize")
}

/// A tally stored as `results, duration_ms_sum, buckets` from column `first` on.
fn tally_at(row: &Row, first: usize) -> rusqlite::Result<WorkTally> {
    let buckets: String = row.get(first + 2)?;
    Ok(WorkTally {
        results: row.get::<_, i64>(first)?.max(0) as u64,
        duration_ms_sum: row.get::<_, i64>(first + 1)?.max(0) as u64,
        buckets: serde_json::from_str(&buckets).map_err(|e| {
            rusqlite::Error::FromSqlConversionFailure(first + 2, rusqlite::types::Type::Text, Box::new(e))
        })?,
    })
}

fn result_at(row: &Row, column: usize) -> rusqlite::Result<WorkResult> {
    WorkResult::parse(&row.get::<_, String>(column)?)
        .map_err(|e| rusqlite::Error::FromSqlConversionFailure(column, rusqlite::types::Type::Text, Box::new(e)))
}

/// Each component's work history (or the one named): totals, and the last hour's minutes.
pub(super) fn load_work(tx: &Connection, only: Option<&str>) -> StoreResult<HashMap<String, WorkHistory>> {
    let mut histories: HashMap<String, WorkHistory> = HashMap::new();
    let since = SeriesStep::Minute.index_of(Timestamp::now()) - (WORK_MINUTES_IN_HOUR - 1);
    let queries = [
        "SELECT component, result, results, duration_ms_sum, buckets FROM component_work_totals
         WHERE ?1 IS NULL OR component = ?1",
        "SELECT component, result, results, duration_ms_sum, buckets FROM component_work_minutes
         WHERE (?1 IS NULL OR component = ?1) AND minute >= ?2",
    ];
    for (i, sql) in queries.into_iter().enumerate() {
        let mut statement = tx.prepare_cached(sql).map_err(unavailable)?;
        let read = |row: &Row| Ok((row.get::<_, String>(0)?, result_at(row, 1)?, tally_at(row, 2)?));
        let rows = if i == 0 {
            statement.query_map(params![only], read)
        } else {
            statement.query_map(params![only, since], read)
        }
        .map_err(unavailable)?;
        for row in rows {
            let (component, result, tally) = row.map_err(unavailable)?;
            let history = histories.entry(component).or_default();
            let tallies = if i == 0 { &mut history.total } else { &mut history.last_hour };
            tallies.get_mut(result).add(&tally);
        }
    }
    Ok(histories)
}

/// `ObjectStore::work_series`: the steps from the one holding `since`, with results or a
/// backlog sample, by component and time.
pub(super) fn work_series(
    conn: &mut Connection,
    step: SeriesStep,
    since: Timestamp,
    component: Option<&ComponentName>,
) -> StoreResult<Vec<WorkPoint>> {
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Deferred).map_err(unavailable)?;
    let (table, column) = step_table(step);
    let from = step.index_of(since);
    let only = component.map(ComponentName::as_str);
    let mut points = crate::series::Points::default();
    {
        let mut statement = tx
            .prepare_cached(&format!(
                "SELECT component, {column}, result, results, duration_ms_sum, buckets FROM {table}
                 WHERE (?1 IS NULL OR component = ?1) AND {column} >= ?2"
            ))
            .map_err(unavailable)?;
        let rows = statement
            .query_map(params![only, from], |row| {
                Ok((row.get::<_, String>(0)?, row.get::<_, i64>(1)?, result_at(row, 2)?, tally_at(row, 3)?))
            })
            .map_err(unavailable)?;
        for row in rows {
            let (name, index, result, tally) = row.map_err(unavailable)?;
            points.at(step, name, index)?.tallies.get_mut(result).add(&tally);
        }
    }
    let mut statement = tx
        .prepare_cached(
            "SELECT component, at, ready FROM component_backlog
             WHERE (?1 IS NULL OR component = ?1) AND step = ?2 AND at >= ?3",
        )
        .map_err(unavailable)?;
    let rows = statement
        .query_map(params![only, step.as_str(), from], |row| {
            Ok((row.get::<_, String>(0)?, row.get::<_, i64>(1)?, row.get::<_, i64>(2)?))
        })
        .map_err(unavailable)?;
    for row in rows {
        let (name, index, ready) = row.map_err(unavailable)?;
        points.at(step, name, index)?.backlog = Some(ready.max(0) as u64);
    }
    Ok(points.into_points())
}

/// `ObjectStore::record_backlog`: each sample as the newest of the current minute and hour,
/// in one transaction; older steps than kept are dropped.
pub(super) fn record_backlog(conn: &mut Connection, samples: &[BacklogSample]) -> StoreResult<()> {
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate).map_err(unavailable)?;
    let now = Timestamp::now();
    for step in [SeriesStep::Minute, SeriesStep::Hour] {
        let index = step.index_of(now);
        for sample in samples {
            tx.prepare_cached(
                "INSERT OR REPLACE INTO component_backlog (component, step, at, ready) VALUES (?1, ?2, ?3, ?4)",
            )
            .and_then(|mut statement| {
                statement.execute(params![sample.component.as_str(), step.as_str(), index, stored_count(sample.ready)])
            })
            .map_err(unavailable)?;
        }
        tx.prepare_cached("DELETE FROM component_backlog WHERE step = ?1 AND at < ?2")
            .and_then(|mut statement| statement.execute(params![step.as_str(), index - step.kept()]))
            .map_err(unavailable)?;
    }
    tx.commit().map_err(unavailable)
}

#[async_trait]
impl SeriesStore for SqliteBackend {
    async fn work_series(
        &self,
        step: SeriesStep,
        since: Timestamp,
        component: Option<&ComponentName>,
    ) -> StoreResult<Vec<WorkPoint>> {
        let component = component.cloned();
        self.with_connection(move |conn| work_series(conn, step, since, component.as_ref())).await
    }

    async fn record_backlog(&self, samples: Vec<BacklogSample>) -> StoreResult<()> {
        self.with_connection(move |conn| record_backlog(conn, &samples)).await
    }
}
