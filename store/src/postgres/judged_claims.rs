//! `claim_ready_judged` over PostgreSQL: a claim round for batches the caller already found
//! ready on their summaries, in one round trip instead of two. One transaction is sent whole
//! on one connection (pipelined; the server runs its statements in the order sent; its read
//! planned once per connection, `calls::BEGIN_PLANNED_ONCE`): the read
//! of the steering and the batches that `claim_ready` would judge them on, then
//! `autocomp_claim_judged` (schema 16; one flat function since 23), which claims only what is
//! still exactly as judged (each batch's `changed_seq` the caller's stamp, no open run of the
//! component, the steering at the caller's version and holding neither the component nor the
//! pipeline), then the commit. A statement that fails aborts the whole transaction, so
//! nothing is claimed unless the answer comes back whole. Anything moved since: nothing
//! written, and the round is done as `claim_ready` does it, judged first on what that read
//! found (one round trip more).

use std::collections::HashMap;
use std::sync::LazyLock;

use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

use super::calls::{BEGIN_PLANNED_ONCE, PLANNED_AS_CONFIGURED, Scope, prepare};
use super::rows::{BATCH_SELECT, corrupt};
use super::runs::Claimed::{Moved, Rows};
use super::runs::{
    CLAIM_JUDGED_FLUSHED, CLAIM_JUDGED_UNFLUSHED, ClaimRow, ClaimerArgs, STEERING_COLUMN, claimed_answer, claimed_rows,
    steering_and_batches,
};
use super::{Failure, PgBackend, Retry};
use crate::port::ready_claims::{self, ReadyClaimRequest, ReadyClaims};
use crate::port::{BatchStore, StoreResult};
use autocomp_model::{Batch, BatchId, Seq, Steering};

/// `READ_FOR_CLAIMS` with each batch's failed attempts of the component (`$2`): the
/// `claim_seq` of each run abandoned or ended by a transient failure, counted from the batch's
/// newest `Reset` once its events are read (the column after the steering's version).
static READ_FOR_JUDGED_CLAIMS: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT x.*, s.state, s.version,
                (SELECT array_agg(r.claim_seq) FROM runs r WHERE r.batch_id = x.id AND r.component = $2
                   AND (r.state = 'abandoned' OR r.transient))
         FROM steering s LEFT JOIN LATERAL ({BATCH_SELECT} WHERE b.id = ANY($1)) x ON true WHERE s.id = 1"
    )
});

impl PgBackend {
    /// `claim_ready_judged`: one round trip when nothing moved since the caller judged;
    /// otherwise (or for a request the caller cannot have judged on summaries: forced, with
    /// takeovers, without a known steering) `claim_ready`, with the same claim key, so a call
    /// sent again finds the runs the first one opened.
    pub(super) async fn pg_claim_ready_judged(
        &self,
        request: &ReadyClaimRequest,
        judged: &[Seq],
    ) -> StoreResult<ReadyClaims> {
        let request = &ReadyClaimRequest { holder: request.holder.keyed(|| self.fresh_key()), ..request.clone() };
        let judgeable = !request.force && request.takeovers.is_empty() && !request.batches.is_empty();
        let Some(version) = request.known_steering.filter(|_| judgeable) else {
            return self.pg_claim_ready(request).await;
        };
        match self.claim_unread(request, judged, version).await? {
            JudgedRound::Claimed(claims) => Ok(claims),
            JudgedRound::Moved(read) => self.claim_ready_after(request, Some(read)).await,
        }
    }

    /// The transaction: begin (its read planned once), read, back to the server's planning,
    /// conditional claim, commit, sent together. `Moved`, with
    /// what the read found: something moved since it was judged (a batch's stamp, an open
    /// run, the steering; a batch gone), nothing written. The answer is read once the
    /// transaction is over: one that cannot be read (a steering or batch this release does
    /// not know) releases the runs the claim opened, so the call's error claimed nothing, as
    /// `claim_ready`, which reads before it claims.
    async fn claim_unread(
        &self,
        request: &ReadyClaimRequest,
        judged: &[Seq],
        version: u64,
    ) -> StoreResult<JudgedRound> {
        let ids: Vec<&str> = request.batches.iter().map(BatchId::as_str).collect();
        let stamps: Vec<i64> = judged.iter().map(|seq| seq.0).collect();
        let (ids, stamps, version) = (&ids, &stamps, &(version as i64));
        let (component, holder) = (request.component(), &request.holder);
        let (claimer, name) = (&ClaimerArgs::new(component, holder), &component.as_str());
        let asked: Vec<&BatchId> = request.batches.iter().collect();
        let asked = &asked;
        let sql = if ready_claims::durable(request) { CLAIM_JUDGED_FLUSHED } else { CLAIM_JUDGED_UNFLUSHED };
        let (read, claimed) = self
            .run("claim_ready", Retry::Safe, |client, _| {
                Box::pin(async move {
                    let read = prepare(client, &READ_FOR_JUDGED_CLAIMS).await?;
                    let claim = prepare(client, sql).await?;
                    let args = claimer.after(&[ids, stamps, version]);
                    let read_args: [&(dyn ToSql + Sync); 2] = [ids, name];
                    let scope = Scope { batch: asked[0], run: None };
                    // Sent in this order (`biased`: each is sent when first polled), every one
                    // awaited (none dropped while in flight): the connection is idle again,
                    // whichever failed, before it goes back to the pool.
                    let (begun, read, reset, claimed, committed) = tokio::join!(
                        biased;
                        client.batch_execute(BEGIN_PLANNED_ONCE),
                        client.query(&read, &read_args),
                        client.batch_execute(PLANNED_AS_CONFIGURED),
                        client.query(&claim, &args),
                        client.batch_execute("COMMIT"),
                    );
                    // Judged in the order sent: a statement that failed aborted the transaction,
                    // so the ones after it fail for that alone; the first failure is the cause.
                    begun.map_err(|e| self.failure(e, &scope))?;
                    let read = read.map_err(|e| self.read_failure(e))?;
                    reset.map_err(|e| self.failure(e, &scope))?;
                    let claimed = claimed.map_err(|e| self.failure(e, &scope))?;
                    // Committed only now: an error here may come after the commit (Retry::Safe
                    // sends it again with the same claim key, which answers the runs it opened).
                    committed.map_err(|e| self.failure(e, &scope))?;
                    Ok((read, claimed))
                })
            })
            .await?;
        let rows = match claimed_rows(&claimed, asked, component, holder).map_err(Failure::into_error)? {
            Moved => return steering_and_batches(&read).map(JudgedRound::Moved).map_err(Failure::into_error),
            Rows(rows) => rows,
        };
        let opened: Vec<(BatchId, i64)> = request
            .batches
            .iter()
            .zip(&rows)
            .filter_map(|(id, row)| {
                row.claim.as_ref().ok().filter(|_| row.held.is_none()).map(|c| (id.clone(), c.generation()))
            })
            .collect();
        match answers(request, &read, rows) {
            Ok(claims) => Ok(JudgedRound::Claimed(claims)),
            Err(unreadable) => {
                for (id, generation) in &opened {
                    if let Err(e) = BatchStore::release(self, id, component, *generation).await {
                        tracing::warn!(batch = %id, "could not release a claim whose answer was unreadable: {e}");
                    }
                }
                Err(unreadable.into_error())
            }
        }
    }
}

/// What a judged round did: claimed (the answers), or nothing because something moved since
/// it was judged (the steering and the batches as its read found them).
enum JudgedRound {
    Claimed(ReadyClaims),
    Moved((Steering, HashMap<BatchId, Batch>)),
}

/// The round's answers: each batch as the read before its claim found it (exactly as
/// judged, since the claim found it unmoved), its failed attempts counted from its newest
/// `Reset` of the component's event type.
fn answers(request: &ReadyClaimRequest, read: &[Row], rows: Vec<ClaimRow>) -> Result<ReadyClaims, Failure> {
    let (steering, mut found) = steering_and_batches(read)?;
    let mut failed_runs = HashMap::new();
    for row in read.iter().filter(|row| row.get::<_, Option<&str>>(0).is_some()) {
        failed_runs.insert(row.get::<_, String>(0), row.get::<_, Option<Vec<i64>>>(STEERING_COLUMN + 2));
    }
    let mut answers = Vec::with_capacity(rows.len());
    for (id, mut row) in request.batches.iter().zip(rows) {
        let batch: Batch = found.remove(id).ok_or_else(|| corrupt("answer", format!("batch {id} claimed unread")))?;
        let since = ready_claims::attempts_since(request, &batch);
        let failed = failed_runs.get(id.as_str()).and_then(Option::as_ref);
        let failed = failed.map_or(0, |seqs| seqs.iter().filter(|seq| **seq > since.0).count());
        row.failed_attempts = u32::try_from(failed).unwrap_or(u32::MAX);
        answers.push(claimed_answer(request, batch, row));
    }
    Ok(ReadyClaims { steering: ready_claims::moved(steering, request.known_steering), held: false, answers })
}
