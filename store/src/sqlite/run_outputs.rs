//! Output of runs without a result on SQLite (`RunOutputStore`): one row per run, replaced
//! while the run is open or cancelled, removed once its result carries the output.

use rusqlite::{Connection, OptionalExtension, params};

use super::rows::stored_json;
use super::statements::Prepared;
use super::tx::{read_tx, require_batch, write_tx};
use super::{SqliteBackend, unavailable};
use crate::port::run_outputs::check_keeps_output;
use crate::port::{MAX_RUN_OUTPUTS, RunOutputStore, SavedRunOutput, StoreError, StoreResult};
use async_trait::async_trait;
use autocomp_model::{BatchId, ComponentName, RunOutput, RunState, Timestamp};

fn set_run_output(
    conn: &mut Connection,
    batch: &BatchId,
    component: &ComponentName,
    generation: i64,
    output: Option<&RunOutput>,
    whole: bool,
) -> StoreResult<()> {
    let tx = write_tx(conn)?;
    require_batch(&tx, batch)?;
    let key = params![batch.as_str(), component.as_str(), generation];
    let Some(output) = output else {
        tx.execute_prepared("DELETE FROM run_outputs WHERE batch_id = ?1 AND component = ?2 AND generation = ?3", key)
            .map_err(unavailable)?;
        return tx.commit().map_err(unavailable);
    };
    let state: Option<String> = tx
        .query_row_prepared(
            "SELECT state FROM runs WHERE batch_id = ?1 AND component = ?2 AND generation = ?3",
            key,
            |row| row.get(0),
        )
        .optional()
        .map_err(unavailable)?;
    let state = state.map(|state| RunState::parse(&state)).transpose()?;
    check_keeps_output(batch, component, generation, state, whole)?;
    let text = serde_json::to_string(output).expect("output serializes");
    tx.execute_prepared(
        "INSERT INTO run_outputs (batch_id, component, generation, output, whole, saved_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)
         ON CONFLICT (batch_id, component, generation)
         DO UPDATE SET output = excluded.output, whole = excluded.whole, saved_at = excluded.saved_at",
        params![batch.as_str(), component.as_str(), generation, text, whole, Timestamp::now().millis()],
    )
    .map_err(unavailable)?;
    tx.commit().map_err(unavailable)
}

fn run_outputs(conn: &mut Connection, batch: &BatchId) -> StoreResult<Vec<SavedRunOutput>> {
    let tx = read_tx(conn)?;
    require_batch(&tx, batch)?;
    let mut statement = tx
        .prepare_cached(
            "SELECT o.component, o.generation, r.state, o.saved_at, o.output, o.whole
             FROM run_outputs o JOIN runs r USING (batch_id, component, generation)
             WHERE o.batch_id = ?1 ORDER BY o.saved_at DESC, o.component DESC, o.generation DESC LIMIT ?2",
        )
        .map_err(unavailable)?;
    let rows = statement
        .query_map(params![batch.as_str(), MAX_RUN_OUTPUTS as i64], |row| {
            Ok((
                row.get::<_, String>(0)?,
                row.get::<_, i64>(1)?,
                row.get::<_, String>(2)?,
                row.get::<_, i64>(3)?,
                stored_json(row.get(4)?)?,
                row.get::<_, bool>(5)?,
            ))
        })
        .map_err(unavailable)?;
    let mut saved = Vec::new();
    for row in rows {
        let (component, generation, state, saved_at, output, whole) = row.map_err(unavailable)?;
        saved.push(SavedRunOutput {
            component: ComponentName::new(&component)?,
            generation,
            state: RunState::parse(&state)?,
            saved_at: Timestamp(saved_at),
            whole,
            output: serde_json::from_value(output)
                .map_err(|e| StoreError::Unavailable(format!("a saved run output is unreadable: {e}")))?,
        });
    }
    saved.reverse();
    Ok(saved)
}

#[async_trait]
impl RunOutputStore for SqliteBackend {
    async fn set_run_output(
        &self,
        batch: &BatchId,
        component: &ComponentName,
        generation: i64,
        output: Option<RunOutput>,
        whole: bool,
    ) -> StoreResult<()> {
        let (batch, component) = (batch.clone(), component.clone());
        self.with_connection(move |conn| set_run_output(conn, &batch, &component, generation, output.as_ref(), whole))
            .await
    }

    async fn run_outputs(&self, batch: &BatchId) -> StoreResult<Vec<SavedRunOutput>> {
        let batch = batch.clone();
        self.with_connection(move |conn| run_outputs(conn, &batch)).await
    }
}
