//! `claim_ready_judged` over PostgreSQL: a claim round for batches the caller already found
//! ready on their summaries, in one round trip instead of two. The read that `claim_ready`
//! judges readiness on, and the call of `autocomp_claim_ready` that claims, are sent together
//! on one connection (pipelined; the server runs them in the order sent): the call goes by
//! the caller's stamps (each batch's `changed_seq` when it was judged) and steering version,
//! so it claims only what is still exactly as judged, and the read gives the answers their
//! batches. Anything moved since: nothing written, and the round is done as `claim_ready`
//! does it (read, judge, claim).

use super::calls::{Scope, prepare};
use super::runs::{
    CLAIM_READY_FLUSHED, CLAIM_READY_UNFLUSHED, Claimed, ClaimerArgs, claimed_rows, read_for_claims_sql,
    steering_and_batches,
};
use super::{PgBackend, Retry};
use crate::port::ready_claims::{self, ReadyClaimRequest, ReadyClaims};
use crate::port::{StoreError, StoreResult};
use autocomp_model::{Batch, BatchId, Seq};

impl PgBackend {
    /// `claim_ready_judged`: one round trip when nothing moved since the caller judged;
    /// otherwise (or when the request is one the caller cannot have judged on summaries:
    /// forced, with takeovers, without a known steering) `claim_ready`, with the same claim
    /// key, so a call sent again finds the runs the first one opened.
    pub(super) async fn pg_claim_ready_judged(
        &self,
        request: &ReadyClaimRequest,
        judged: &[Seq],
    ) -> StoreResult<ReadyClaims> {
        let request = &ReadyClaimRequest { holder: request.holder.keyed(|| self.fresh_key()), ..request.clone() };
        let judgeable = !request.force && request.takeovers.is_empty() && judged.len() == request.batches.len();
        if let (true, Some(version)) = (judgeable && !request.batches.is_empty(), request.known_steering)
            && let Some(claims) = self.claim_unread(request, judged, version).await?
        {
            return Ok(claims);
        }
        self.pg_claim_ready(request).await
    }

    /// The read and the conditional claim, pipelined. `None`: something moved since it was
    /// judged (a batch's stamp or the steering's version; a batch gone), nothing written.
    async fn claim_unread(
        &self,
        request: &ReadyClaimRequest,
        judged: &[Seq],
        version: u64,
    ) -> StoreResult<Option<ReadyClaims>> {
        let ids: Vec<&str> = request.batches.iter().map(BatchId::as_str).collect();
        let stamps: Vec<i64> = judged.iter().map(|seq| seq.0).collect();
        // Counted from the start: a batch whose history resets the component's event type is
        // counted again below, from its newest `Reset`, once the read has shown it.
        let since = vec![0i64; ids.len()];
        let none_taken: (Vec<Option<i64>>, Vec<Option<&str>>) = (vec![None; ids.len()], vec![None; ids.len()]);
        let (ids, stamps, since, version) = (&ids, &stamps, &since, &(version as i64));
        let (taken_generations, taken_liveness) = (&none_taken.0, &none_taken.1);
        let (component, holder) = (request.component(), &request.holder);
        let claimer = &ClaimerArgs::new(component, holder);
        let asked: Vec<&BatchId> = request.batches.iter().collect();
        let asked = &asked;
        let sql = if ready_claims::durable(request) { CLAIM_READY_FLUSHED } else { CLAIM_READY_UNFLUSHED };
        let (steering, mut found, claimed) = self
            .run("claim_ready", Retry::Safe, |client, _| {
                Box::pin(async move {
                    let read = prepare(client, &read_for_claims_sql()).await?;
                    let claim = prepare(client, sql).await?;
                    let args = claimer.after(&[ids, stamps, since, version, taken_generations, taken_liveness]);
                    let scope = Scope { batch: asked[0], run: None };
                    let (read, claimed) = tokio::try_join!(
                        async { client.query(&read, &[ids]).await.map_err(|e| self.read_failure(e)) },
                        async { client.query(&claim, &args).await.map_err(|e| self.failure(e, &scope)) },
                    )?;
                    let (steering, found) = steering_and_batches(&read)?;
                    Ok((steering, found, claimed_rows(&claimed, asked, component, holder)?))
                })
            })
            .await?;
        let Claimed::Rows(rows) = claimed else { return Ok(None) };
        let mut answers = Vec::with_capacity(rows.len());
        for (id, row) in request.batches.iter().zip(rows) {
            // Claimed unmoved since the read: the read found it, as it was judged.
            let batch = found.remove(id).ok_or_else(|| corrupt_answer(id))?;
            if let Some(holding) = row.held {
                answers.push(Ok(ready_claims::refusal(batch, holding)));
                continue;
            }
            let claim = match row.claim {
                Ok(claim) => claim,
                Err(refused) => {
                    answers.push(Err(refused));
                    continue;
                }
            };
            let failed_attempts = self.failed_attempts(request, &batch, row.failed_attempts).await?;
            answers.push(Ok(ready_claims::answer(request, batch, Some(claim), failed_attempts, row.checkpoint)));
        }
        Ok(Some(ReadyClaims { steering: ready_claims::moved(steering, request.known_steering), held: false, answers }))
    }

    /// The failed attempts to answer for a batch claimed by `claim_unread`, which counted
    /// them from the start (`counted`): counted again from its newest `Reset` of the
    /// component's event type when it has one (one more read, for such batches alone).
    async fn failed_attempts(&self, request: &ReadyClaimRequest, batch: &Batch, counted: u32) -> StoreResult<u32> {
        let since = ready_claims::attempts_since(request, batch);
        if since == Seq::ZERO {
            return Ok(counted);
        }
        let (id, component, since) = (batch.id.as_str(), request.component().as_str(), &since.0);
        let failed = self
            .run("claim_ready", Retry::Safe, |client, _| {
                Box::pin(async move {
                    let statement = prepare(
                        client,
                        "SELECT COUNT(*) FROM runs WHERE batch_id = $1 AND component = $2 AND claim_seq > $3
                           AND (state = 'abandoned' OR transient)",
                    )
                    .await?;
                    let row = client
                        .query_one(&statement, &[&id, &component, since])
                        .await
                        .map_err(|e| self.read_failure(e))?;
                    Ok(row.get::<_, i64>(0))
                })
            })
            .await?;
        Ok(u32::try_from(failed).unwrap_or(u32::MAX))
    }
}

/// A batch the claim found unmoved, yet the read before it did not: not a state the database
/// can be in.
fn corrupt_answer(id: &BatchId) -> StoreError {
    StoreError::Unavailable(format!(
        "store answer is corrupt: batch {id} was claimed unmoved since it was judged, but the read before the claim did not find it"
    ))
}
