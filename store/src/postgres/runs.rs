//! PostgreSQL's claims (one, or a pass's in one transaction) and checkpoint reads.

use serde_json::Value;

use super::calls::{Scope, prepare};
use super::rows::{claim_answer, corrupt};
use super::text::unjsoned;
use super::{Failure, PgBackend, Retry};
use crate::port::{Claim, StoreError, StoreResult};
use autocomp_model::{BatchId, ComponentName, IdempotencyKey, RunHolder};

impl PgBackend {
    pub(super) async fn pg_claim(
        &self,
        batch: &BatchId,
        component: &ComponentName,
        holder: &RunHolder,
    ) -> StoreResult<Claim> {
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
    pub(super) async fn pg_claim_many(
        &self,
        batches: &[BatchId],
        component: &ComponentName,
        holder: &RunHolder,
    ) -> StoreResult<Vec<StoreResult<Claim>>> {
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

    pub(super) async fn pg_load_checkpoint(
        &self,
        batch: &BatchId,
        component: &ComponentName,
    ) -> StoreResult<Option<Value>> {
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
}
