//! What every operation on the embedded file shares: its transactions (IMMEDIATE for writes, so
//! writers queue on the busy timeout; one read transaction per read, so a batch, its log and its
//! runs are one snapshot), the seq counter taken inside them, and the fence of a run's writes.

use rusqlite::{Connection, OptionalExtension, Transaction, TransactionBehavior, params};

use crate::port::{StoreError, StoreResult};
use crate::write_rules::{self};
use autocomp_model::{BatchId, ComponentName, RunState, Seq};

use super::statements::Prepared;
use super::unavailable;

pub(super) fn write_tx(conn: &mut Connection) -> StoreResult<Transaction<'_>> {
    conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(unavailable)
}

pub(super) fn read_tx(conn: &mut Connection) -> StoreResult<Transaction<'_>> {
    conn.transaction_with_behavior(TransactionBehavior::Deferred).map_err(unavailable)
}

pub(super) fn next_seq(tx: &Connection) -> StoreResult<Seq> {
    tx.query_row_prepared("UPDATE store_head SET seq = seq + 1 WHERE id = 1 RETURNING seq", [], |row| row.get(0))
        .map(Seq)
        .map_err(unavailable)
}

/// Stored text is validated on the way in; failing to parse it on the way out means the
/// file was edited behind the store's back.
pub(super) fn batch_exists(tx: &Connection, id: &BatchId) -> StoreResult<bool> {
    tx.query_row_prepared("SELECT 1 FROM batches WHERE id = ?1", [id.as_str()], |_| Ok(()))
        .optional()
        .map(|found| found.is_some())
        .map_err(unavailable)
}

pub(super) fn require_batch(tx: &Connection, id: &BatchId) -> StoreResult<()> {
    if batch_exists(tx, id)? { Ok(()) } else { Err(StoreError::NotFound(id.clone())) }
}

/// The bytes of details and metadata the batch stores (kept by the schema's triggers), or
/// `NotFound`.
pub(super) fn stored_bytes(tx: &Connection, id: &BatchId) -> StoreResult<u64> {
    tx.prepare_cached("SELECT stored_bytes FROM batches WHERE id = ?1")
        .and_then(|mut statement| statement.query_row([id.as_str()], |row| row.get::<_, i64>(0)).optional())
        .map_err(unavailable)?
        .map(|bytes| bytes.max(0) as u64)
        .ok_or_else(|| StoreError::NotFound(id.clone()))
}

/// Refuses an event whose details (`details`, the text to be stored) would take the batch
/// over `cap`; `NotFound` for an unknown batch.
pub(super) fn check_event_fits(tx: &Connection, batch: &BatchId, details: &str, cap: u64) -> StoreResult<()> {
    let holds = stored_bytes(tx, batch)?;
    write_rules::check_batch_bytes(batch, "this event", holds, 0, details.len() as u64, cap)
}

/// The fence: only the newest generation of (batch, component), and only while open.
pub(super) fn check_run_is_current_and_open(
    tx: &Connection,
    batch: &BatchId,
    component: &ComponentName,
    generation: i64,
) -> StoreResult<()> {
    let fenced =
        |reason: String| StoreError::Fenced { batch: batch.clone(), component: component.clone(), generation, reason };
    let current: Option<i64> = tx
        .query_row_prepared(
            "SELECT generation FROM claims WHERE batch_id = ?1 AND component = ?2",
            params![batch.as_str(), component.as_str()],
            |row| row.get(0),
        )
        .optional()
        .map_err(unavailable)?;
    match current {
        None => return Err(fenced("was never claimed".into())),
        Some(current) if current != generation => {
            return Err(fenced(format!("is not current: generation {current} has claimed the batch since")));
        }
        Some(_) => {}
    }
    let state: Option<String> = tx
        .query_row_prepared(
            "SELECT state FROM runs WHERE batch_id = ?1 AND component = ?2 AND generation = ?3",
            params![batch.as_str(), component.as_str(), generation],
            |row| row.get(0),
        )
        .optional()
        .map_err(unavailable)?;
    // A generation with no run: the one an operator's cancel moved to, claimed by nobody.
    let Some(state) = state else { return Err(fenced("was never claimed".into())) };
    match RunState::parse(&state)? {
        RunState::Open => Ok(()),
        closed => Err(fenced(format!("is already closed ({})", closed.as_str()))),
    }
}

pub(super) fn head_in(tx: &Connection) -> StoreResult<Seq> {
    tx.query_row_prepared("SELECT seq FROM store_head WHERE id = 1", [], |row| row.get(0)).map(Seq).map_err(unavailable)
}
