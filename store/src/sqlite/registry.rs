//! The component registry on the embedded file: a pass's record (the descriptor only when it
//! changed, the host's record always), the registry read whole, and retirement. Its writes
//! change no batch and take no seq.

use rusqlite::{Connection, OptionalExtension, Row, params};

use crate::port::{StoreError, StoreResult};
use crate::write_rules::{self};
use autocomp_model::{
    Agent, ComponentName, HostRecord, PassOutcome, PassPhase, PassRecord, RegisteredComponent, Retirement, Timestamp,
    WorkTallies,
};

use super::SqliteBackend;
use super::history::{add_work, load_work};
use super::rows::stored;
use super::statements::Prepared;
use super::tx::{read_tx, write_tx};
use super::unavailable;
use crate::port::RegistryStore;
use async_trait::async_trait;

/// `ObjectStore::record_pass`: one short write per cron start. The descriptor row is
/// rewritten only when the descriptor differs (or the component was retired), so a steady
/// pipeline only moves its hosts' `last_seen`.
pub fn record_pass(conn: &mut Connection, pass: &PassRecord) -> StoreResult<()> {
    let descriptor = &pass.descriptor;
    let text = serde_json::to_string(descriptor).expect("descriptors always serialize");
    let (name, event_type) = (descriptor.name.as_str(), descriptor.event_type.as_str());
    let tx = write_tx(conn)?;
    let now = Timestamp::now();
    let other: Option<String> = tx
        .prepare_cached("SELECT name FROM components WHERE event_type = ?1 AND retired_at IS NULL AND name <> ?2")
        .and_then(|mut statement| statement.query_row(params![event_type, name], |row| row.get(0)).optional())
        .map_err(unavailable)?;
    if let Some(other) = other {
        return Err(write_rules::event_type_taken(&descriptor.event_type, &other));
    }
    tx.prepare_cached(
        "INSERT INTO components (name, event_type, descriptor, registered_at, changed_at) VALUES (?1, ?2, ?3, ?4, ?4)
         ON CONFLICT (name) DO UPDATE SET
             event_type = excluded.event_type,
             descriptor = excluded.descriptor,
             changed_at = CASE WHEN descriptor = excluded.descriptor THEN changed_at ELSE excluded.changed_at END,
             retired_at = NULL, retired_by = NULL, retired_reason = NULL
         WHERE descriptor <> excluded.descriptor OR retired_at IS NOT NULL",
    )
    .and_then(|mut statement| statement.execute(params![name, event_type, text, now.millis()]))
    .map_err(|error| match error.sqlite_error_code() {
        // The pre-check above makes this unreachable; kept so the index's refusal still reads as one.
        Some(rusqlite::ErrorCode::ConstraintViolation) => StoreError::Conflict(format!(
            "event type {event_type} is already recorded by another component in the pipeline ({error})"
        )),
        _ => unavailable(error),
    })?;
    // A start keeps the previous end (and its outcome) so a running pass still shows how the
    // last one went; an end dates its start back by the duration the component measured.
    let (started_at, ended_at, outcome, summary, duration_ms) = match &pass.phase {
        PassPhase::Started => (now.millis(), None, None, None, None),
        PassPhase::Ended { outcome, summary, duration_ms, .. } => {
            let duration = i64::try_from(*duration_ms).unwrap_or(i64::MAX);
            (
                now.millis().saturating_sub(duration),
                Some(now.millis()),
                Some(outcome.as_str()),
                Some(summary),
                Some(duration),
            )
        }
    };
    tx.prepare_cached(
        "INSERT INTO component_hosts (component, host, version, last_seen, pass_started_at, pass_ended_at,
             pass_outcome, pass_summary, pass_duration_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, COALESCE(?8, ''), ?9)
         ON CONFLICT (component, host) DO UPDATE SET
             version = excluded.version,
             last_seen = excluded.last_seen,
             pass_started_at = excluded.pass_started_at,
             pass_ended_at = COALESCE(?6, pass_ended_at),
             pass_outcome = COALESCE(?7, pass_outcome),
             pass_summary = COALESCE(?8, pass_summary),
             pass_duration_ms = COALESCE(?9, pass_duration_ms)",
    )
    .and_then(|mut statement| {
        statement.execute(params![
            name,
            pass.host,
            descriptor.version,
            now.millis(),
            started_at,
            ended_at,
            outcome,
            summary,
            duration_ms
        ])
    })
    .map_err(unavailable)?;
    if let PassPhase::Ended { work, .. } = &pass.phase
        && !work.is_empty()
    {
        add_work(&tx, name, now, &WorkTallies::of(work))?;
    }
    tx.commit().map_err(unavailable)
}

/// `ObjectStore::components`: the registry, one consistent snapshot.
pub fn components(conn: &mut Connection) -> StoreResult<Vec<RegisteredComponent>> {
    let tx = read_tx(conn)?;
    load_components(&tx, None)
}

/// `ObjectStore::retire_component`, with `reason` already checked and trimmed.
pub fn retire_component(
    conn: &mut Connection,
    name: &ComponentName,
    by: &Agent,
    reason: &str,
) -> StoreResult<RegisteredComponent> {
    let tx = write_tx(conn)?;
    let Some(component) = load_components(&tx, Some(name))?.pop() else {
        let known: Vec<String> = tx
            .prepare_cached("SELECT name FROM components ORDER BY name")
            .and_then(|mut statement| statement.query_map([], |row| row.get(0))?.collect())
            .map_err(unavailable)?;
        return Err(write_rules::unknown_component(name, &known));
    };
    if let Some(retirement) = &component.retired {
        return Err(write_rules::retired_already(name, retirement));
    }
    let at = Timestamp::now();
    tx.execute_prepared(
        "UPDATE components SET retired_at = ?2, retired_by = ?3, retired_reason = ?4 WHERE name = ?1",
        params![name.as_str(), at.millis(), by.as_str(), reason],
    )
    .map_err(unavailable)?;
    tx.commit().map_err(unavailable)?;
    Ok(RegisteredComponent {
        retired: Some(Retirement { at, by: by.clone(), reason: reason.to_string() }),
        ..component
    })
}

/// The registry's components (or the one named), by name, each with its hosts by name.
fn load_components(tx: &Connection, only: Option<&ComponentName>) -> StoreResult<Vec<RegisteredComponent>> {
    let only = only.map(ComponentName::as_str);
    let mut hosts: std::collections::HashMap<String, Vec<HostRecord>> = std::collections::HashMap::new();
    {
        let mut statement = tx
            .prepare_cached(
                "SELECT component, host, version, last_seen, pass_started_at, pass_ended_at, pass_outcome,
                        pass_summary, pass_duration_ms
                 FROM component_hosts WHERE ?1 IS NULL OR component = ?1 ORDER BY component, host",
            )
            .map_err(unavailable)?;
        let rows = statement
            .query_map([only], |row| Ok((row.get::<_, String>(0)?, host_from_row(row)?)))
            .map_err(unavailable)?;
        for row in rows {
            let (component, host) = row.map_err(unavailable)?;
            hosts.entry(component).or_default().push(host);
        }
    }
    let mut work = load_work(tx, only)?;
    let mut statement = tx
        .prepare_cached(
            "SELECT name, descriptor, registered_at, changed_at, retired_at, retired_by, retired_reason
             FROM components WHERE ?1 IS NULL OR name = ?1 ORDER BY name",
        )
        .map_err(unavailable)?;
    statement
        .query_map([only], |row| {
            let name: String = row.get(0)?;
            let descriptor = serde_json::from_str(&row.get::<_, String>(1)?)
                .map_err(|e| rusqlite::Error::FromSqlConversionFailure(1, rusqlite::types::Type::Text, Box::new(e)))?;
            let retired = match (row.get::<_, Option<i64>>(4)?, row.get::<_, Option<String>>(5)?) {
                (Some(at), Some(by)) => Some(Retirement {
                    at: Timestamp(at),
                    by: stored(by)?,
                    reason: row.get::<_, Option<String>>(6)?.unwrap_or_default(),
                }),
                _ => None,
            };
            Ok(RegisteredComponent {
                descriptor,
                registered_at: Timestamp(row.get(2)?),
                changed_at: Timestamp(row.get(3)?),
                hosts: hosts.remove(&name).unwrap_or_default(),
                retired,
                work: work.remove(&name).unwrap_or_default(),
            })
        })
        .and_then(|rows| rows.collect::<rusqlite::Result<_>>())
        .map_err(unavailable)
}

fn host_from_row(row: &Row) -> rusqlite::Result<HostRecord> {
    let outcome = row
        .get::<_, Option<String>>(6)?
        .map(|text| PassOutcome::parse(&text))
        .transpose()
        .map_err(|e| rusqlite::Error::FromSqlConversionFailure(6, rusqlite::types::Type::Text, Box::new(e)))?;
    Ok(HostRecord {
        host: row.get(1)?,
        version: row.get(2)?,
        last_seen: Timestamp(row.get(3)?),
        pass_started_at: row.get::<_, Option<i64>>(4)?.map(Timestamp),
        pass_ended_at: row.get::<_, Option<i64>>(5)?.map(Timestamp),
        outcome,
        summary: row.get(7)?,
        duration_ms: row.get::<_, Option<i64>>(8)?.map(|ms| ms.max(0) as u64),
    })
}

#[async_trait]
impl RegistryStore for SqliteBackend {
    async fn record_pass(&self, pass: PassRecord) -> StoreResult<()> {
        self.with_connection(move |conn| record_pass(conn, &pass)).await
    }

    async fn components(&self) -> StoreResult<Vec<RegisteredComponent>> {
        self.with_connection(components).await
    }

    async fn retire_component(
        &self,
        name: &ComponentName,
        by: &Agent,
        reason: &str,
    ) -> StoreResult<RegisteredComponent> {
        let (name, by, reason) = (name.clone(), by.clone(), reason.to_owned());
        self.with_connection(move |conn| retire_component(conn, &name, &by, &reason)).await
    }
}
