//! Output of runs without a result on PostgreSQL (`RunOutputStore`): one row per run,
//! replaced while the run is open or cancelled, removed once its result carries the output.
//! Each write is one statement; none moves a seq or wakes a listener.

use autocomp_model::{BatchId, ComponentName, RunOutput, RunState, Timestamp};

use super::calls::{Scope, prepare};
use super::rows::corrupt;
use super::text::{json, unjsoned};
use super::{Failure, PgBackend, Retry};
use crate::port::run_outputs::check_keeps_output;
use crate::port::{MAX_RUN_OUTPUTS, RunOutputStore, SavedRunOutput, StoreError, StoreResult};

#[async_trait::async_trait]
impl RunOutputStore for PgBackend {
    async fn set_run_output(
        &self,
        batch: &BatchId,
        component: &ComponentName,
        generation: i64,
        output: Option<RunOutput>,
        whole: bool,
    ) -> StoreResult<()> {
        let output = output.map(|output| serde_json::to_value(output).expect("output serializes"));
        let output = &output.as_ref().map(|output| json(output).into_owned());
        // Replacing what was saved is idempotent: a retry writes the same row again.
        self.run("set_run_output", Retry::Safe, |client, _| {
            Box::pin(async move {
                let statement = prepare(
                    client,
                    "WITH run AS (
                         -- Shared with this statement's end: a cancel (which updates the run) waits
                         -- for it or comes first, so a snapshot never lands after a whole output.
                         SELECT state FROM runs WHERE batch_id = $1 AND component = $2 AND generation = $3
                         FOR SHARE
                     ), saved AS (
                         INSERT INTO run_outputs (batch_id, component, generation, output, whole, saved_at)
                         SELECT $1, $2, $3, $4, $5, (extract(epoch FROM clock_timestamp()) * 1000)::bigint
                         FROM run WHERE $4::jsonb IS NOT NULL AND (state = 'open' OR (state = 'cancelled' AND $5))
                         ON CONFLICT (batch_id, component, generation)
                         DO UPDATE SET output = excluded.output, whole = excluded.whole, saved_at = excluded.saved_at
                         RETURNING 1
                     ), removed AS (
                         DELETE FROM run_outputs
                         WHERE $4::jsonb IS NULL AND batch_id = $1 AND component = $2 AND generation = $3
                         RETURNING 1
                     )
                     SELECT EXISTS (SELECT 1 FROM batches WHERE id = $1), (SELECT state FROM run),
                            (SELECT count(*) FROM saved) + (SELECT count(*) FROM removed)",
                )
                .await?;
                let scope = Scope { batch, run: Some((component, generation)) };
                let row = client
                    .query_one(&statement, &[&batch.as_str(), &component.as_str(), &generation, output, &whole])
                    .await
                    .map_err(|e| self.failure(e, &scope))?;
                if !row.get::<_, bool>(0) {
                    return Err(Failure::Final(StoreError::NotFound(batch.clone())));
                }
                if output.is_none() {
                    return Ok(());
                }
                let state = row.get::<_, Option<String>>(1).map(|state| RunState::parse(&state)).transpose();
                let state = state.map_err(|e| corrupt("run state", e))?;
                check_keeps_output(batch, component, generation, state, whole).map_err(Failure::Final)
            })
        })
        .await
    }

    async fn run_outputs(&self, batch: &BatchId) -> StoreResult<Vec<SavedRunOutput>> {
        self.run("run_outputs", Retry::Safe, |client, _| {
            Box::pin(async move {
                let statement = prepare(
                    client,
                    "SELECT o.component, o.generation, r.state, o.saved_at, o.output::text, o.whole
                     FROM run_outputs o JOIN runs r USING (batch_id, component, generation)
                     WHERE o.batch_id = $1 ORDER BY o.saved_at DESC, o.component DESC, o.generation DESC LIMIT $2",
                )
                .await?;
                let rows = client
                    .query(&statement, &[&batch.as_str(), &(MAX_RUN_OUTPUTS as i64)])
                    .await
                    .map_err(|e| self.read_failure(e))?;
                if rows.is_empty() {
                    let exists = prepare(client, "SELECT EXISTS (SELECT 1 FROM batches WHERE id = $1)").await?;
                    let row = client.query_one(&exists, &[&batch.as_str()]).await.map_err(|e| self.read_failure(e))?;
                    if !row.get::<_, bool>(0) {
                        return Err(Failure::Final(StoreError::NotFound(batch.clone())));
                    }
                }
                let mut saved = Vec::with_capacity(rows.len());
                for row in rows.iter().rev() {
                    let output: serde_json::Value =
                        serde_json::from_str(row.get(4)).map_err(|e| corrupt("saved run output", e))?;
                    saved.push(SavedRunOutput {
                        component: ComponentName::new(row.get::<_, &str>(0)).map_err(|e| corrupt("component", e))?,
                        generation: row.get(1),
                        state: RunState::parse(row.get(2)).map_err(|e| corrupt("run state", e))?,
                        saved_at: Timestamp(row.get(3)),
                        whole: row.get(5),
                        output: serde_json::from_value(unjsoned(output)).map_err(|e| corrupt("saved run output", e))?,
                    });
                }
                Ok(saved)
            })
        })
        .await
    }
}
