//! The embedded store's steering record and its log (`SteeringStore`): each change is one
//! immediate transaction, so concurrent processes on one file apply them one at a time.

use rusqlite::{Connection, TransactionBehavior, params};

use super::statements::Prepared;
use super::{SqliteBackend, unavailable};
use crate::pipeline_state::Steered;
use crate::port::SteeringStore;
use crate::port::{StoreError, StoreResult};
use crate::steering_rules;
use async_trait::async_trait;
use autocomp_model::{Steering, SteeringEntry, SteeringRequest, Timestamp};

pub(super) fn corrupt(what: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable(format!("the store file's {what} does not read: {e}"))
}

pub(super) fn load(conn: &Connection) -> StoreResult<Steering> {
    let text: String = conn
        .query_row_prepared("SELECT state FROM steering WHERE id = 1", [], |row| row.get(0))
        .map_err(unavailable)?;
    serde_json::from_str(&text).map_err(|e| corrupt("steering record", e))
}

pub fn steering(conn: &mut Connection) -> StoreResult<Steering> {
    load(conn)
}

pub fn steer(conn: &mut Connection, request: &SteeringRequest) -> StoreResult<Steered> {
    let request = &steering_rules::bounded(request.clone());
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(unavailable)?;
    let mut steering = load(&tx)?;
    let at = Timestamp::now();
    let applied = steering.apply(request, at).map_err(steering_rules::refused)?;
    if !applied.changed {
        // Nothing to write: the head stays, no watcher wakes.
        return Ok(Steered { steering, entry: None, circuit_opened: false });
    }
    let state = serde_json::to_string(&steering).map_err(|e| corrupt("steering record", e))?;
    tx.execute_prepared("UPDATE steering SET state = ?1 WHERE id = 1", [state]).map_err(unavailable)?;
    if let Some(entry) = &applied.entry {
        let text = serde_json::to_string(entry).map_err(|e| corrupt("steering log", e))?;
        tx.execute_prepared(
            "INSERT INTO steering_log (version, at, entry) VALUES (?1, ?2, ?3)",
            params![entry.version as i64, at.millis(), text],
        )
        .map_err(unavailable)?;
    }
    // The head moves, so watchers sleeping in the change feed wake and honour the change.
    tx.execute_prepared("UPDATE store_head SET seq = seq + 1 WHERE id = 1", []).map_err(unavailable)?;
    tx.commit().map_err(unavailable)?;
    Ok(Steered { steering, entry: applied.entry, circuit_opened: applied.circuit_opened })
}

pub fn steering_log(conn: &mut Connection, limit: usize) -> StoreResult<Vec<SteeringEntry>> {
    let mut statement =
        conn.prepare_cached("SELECT entry FROM steering_log ORDER BY version DESC LIMIT ?1").map_err(unavailable)?;
    let texts: Vec<String> =
        statement.query_map([limit as i64], |row| row.get(0)).and_then(Iterator::collect).map_err(unavailable)?;
    texts.iter().map(|text| serde_json::from_str(text).map_err(|e| corrupt("steering log", e))).collect()
}

#[async_trait]
impl SteeringStore for SqliteBackend {
    async fn steering(&self) -> StoreResult<Steering> {
        self.with_connection(steering).await
    }

    async fn steer(&self, request: SteeringRequest) -> StoreResult<Steered> {
        self.with_connection(move |conn| steer(conn, &request)).await
    }

    async fn steering_log(&self, limit: usize) -> StoreResult<Vec<SteeringEntry>> {
        self.with_connection(move |conn| steering_log(conn, limit)).await
    }
}
