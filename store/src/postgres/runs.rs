//! PostgreSQL's claims (one, a pass's in one transaction, or a claim round with its re-check,
//! attempts and checkpoints) and checkpoint reads.

use std::collections::HashMap;
use std::sync::LazyLock;

use serde_json::Value;
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

use super::calls::{CONDITIONAL_ROUNDS, Scope, prepare};
use super::rows::{BATCH_SELECT, HELD, batch_from_row, claim_answer, corrupt, run_from_json};
use super::text::unjsoned;
use super::{Failure, PgBackend, Retry};
use crate::port::ready_claims::{self, ReadyAnswer, ReadyClaimRequest, ReadyClaims, Takeover};
use crate::port::{Claim, StoreError, StoreResult};
use autocomp_model::{Batch, BatchId, ComponentName, IdempotencyKey, Run, RunHolder, Steering};

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
        let claimer = &ClaimerArgs::new(component, holder);
        self.run("claim", Retry::Safe, |client, _| {
            Box::pin(async move {
                let statement = prepare(
                    client,
                    "SELECT r_kind, r_run::text, r_abandoned::text, r_current
                     FROM autocomp_claim($1, $2, $3, $4, $5, $6, $7, NULL, NULL)",
                )
                .await?;
                let row = client
                    .query_one(&statement, &claimer.after(&[&batch.as_str()]))
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
        let claimer = &ClaimerArgs::new(component, holder);
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
                          autocomp_claim_many($1, $2, $3, $4, $5, $6, $7)",
                )
                .await?;
                let rows = client
                    .query(&statement, &claimer.after(&[ids]))
                    .await
                    .map_err(|e| self.failure(e, &Scope { batch: first, run: None }))?;
                check_claim_rows(&rows, batches.len())?;
                let mut answers = Vec::with_capacity(batches.len());
                for (row, batch) in rows.iter().zip(batches) {
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
                checkpoint_from_text(row.get(1))
            })
        })
        .await
    }
}

/// What `claim_ready`'s read found of one batch asked, and how it was judged.
enum Judged {
    Missing,
    NotReady(Batch),
    /// Ready, but an exclusive claim's: another claim's open run keeps it (`holding_run`).
    Held(Batch, Run),
    Ready(Batch),
}

/// What one call of `autocomp_claim_ready` did: claimed (a row per ready batch, in order), or
/// nothing because a batch or the steering moved since the read.
pub(super) enum Claimed {
    Rows(Vec<ClaimRow>),
    Moved,
}

/// One claimed batch's row of `autocomp_claim_ready`: its claim, or the open run that is its
/// lock (`held`: the database refused what the read judged claimable; nothing written).
pub(super) struct ClaimRow {
    pub(super) claim: StoreResult<Claim>,
    pub(super) held: Option<Run>,
    pub(super) failed_attempts: u32,
    pub(super) checkpoint: Option<Value>,
}

impl PgBackend {
    /// `claim_ready`: one statement reading the steering and the batches, their readiness
    /// judged here by the rules every backend shares, then one call of `autocomp_claim_ready`
    /// claiming the ready ones in one transaction, only if nothing judged on moved meanwhile
    /// (its commit not waiting for its flush, as `claim_many`'s, unless exclusive); if
    /// something did, both are read again, up to `CONDITIONAL_ROUNDS` times. Two round trips
    /// when something is ready, one when nothing is. A round answers a batch held by an open
    /// run (`ready_claims::holding_run`) as its read found it, and sends no claim for it (a
    /// refusal writes nothing, so its moment is the read's); a batch it claims, taken over or
    /// not, is claimed only while unmoved since that read, so while its open run is the one
    /// judged (and the database abandons a run that is its batch's lock only when the claim
    /// names the takeover the round judged).
    pub(super) async fn pg_claim_ready(&self, request: &ReadyClaimRequest) -> StoreResult<ReadyClaims> {
        self.claim_ready_after(request, None).await
    }

    /// `pg_claim_ready`, its first round judged on `read` when the caller has just read the
    /// steering and the batches (a judged round that found them moved: its read is as good a
    /// snapshot as a fresh one, and its claim is conditional on it all the same).
    pub(super) async fn claim_ready_after(
        &self,
        request: &ReadyClaimRequest,
        mut read: Option<(Steering, HashMap<BatchId, Batch>)>,
    ) -> StoreResult<ReadyClaims> {
        // One key for the whole round, as `claim_many`: a call sent again after a lost answer,
        // and a read again after it, find the runs the first call opened.
        let request = &ReadyClaimRequest { holder: request.holder.keyed(|| self.fresh_key()), ..request.clone() };
        for _ in 0..CONDITIONAL_ROUNDS {
            let (steering, mut found) = match read.take() {
                Some(read) => read,
                None => self.read_for_claims(&request.batches).await?,
            };
            let steered = ready_claims::steered(request, &steering, found.values());
            if steered == ready_claims::Steered::Refused {
                return Ok(ready_claims::refused(steering, request.known_steering));
            }
            let judged: Vec<Judged> = request
                .batches
                .iter()
                .map(|id| match found.remove(id) {
                    None => Judged::Missing,
                    Some(batch) => judge(request, batch, steered),
                })
                .collect();
            let rows = match self.claim_judged(request, &judged, steering.version).await? {
                Claimed::Moved => continue,
                Claimed::Rows(rows) => rows,
            };
            let mut rows = rows.into_iter();
            let answers = request
                .batches
                .iter()
                .zip(judged)
                .map(|(id, judged)| match judged {
                    Judged::Missing => Err(StoreError::NotFound(id.clone())),
                    Judged::NotReady(batch) => Ok(ready_claims::answer(request, batch, None, 0, None)),
                    Judged::Held(batch, holding) => Ok(ready_claims::refusal(batch, holding)),
                    Judged::Ready(batch) => {
                        let row = rows.next().expect("claim_judged answers a row per ready batch");
                        claimed_answer(request, batch, row)
                    }
                })
                .collect();
            let steering = ready_claims::moved(steering, request.known_steering);
            return Ok(ReadyClaims { steering, held: false, answers });
        }
        Err(StoreError::Unavailable(format!(
            "the batches kept changing while they were claimed ({CONDITIONAL_ROUNDS} rounds); nothing was claimed"
        )))
    }

    /// The steering (with its version) and the batches that exist among `ids`, whole, in one
    /// statement: one snapshot.
    async fn read_for_claims(&self, ids: &[BatchId]) -> StoreResult<(Steering, HashMap<BatchId, Batch>)> {
        let ids: Vec<&str> = ids.iter().map(BatchId::as_str).collect();
        let ids = &ids;
        self.run("claim_ready", Retry::Safe, |client, _| {
            Box::pin(async move {
                let statement = prepare(client, &READ_FOR_CLAIMS).await?;
                let rows = client.query(&statement, &[ids]).await.map_err(|e| self.read_failure(e))?;
                steering_and_batches(&rows)
            })
        })
        .await
    }

    /// One call of `autocomp_claim_ready` for the ready batches of `judged` (none: no call).
    async fn claim_judged(
        &self,
        request: &ReadyClaimRequest,
        judged: &[Judged],
        steering_version: u64,
    ) -> StoreResult<Claimed> {
        let ready: Vec<&Batch> = judged
            .iter()
            .filter_map(|judged| match judged {
                Judged::Ready(batch) => Some(batch),
                _ => None,
            })
            .collect();
        let Some(first) = ready.first() else { return Ok(Claimed::Rows(Vec::new())) };
        let ids: Vec<&str> = ready.iter().map(|batch| batch.id.as_str()).collect();
        let stamps: Vec<i64> = ready.iter().map(|batch| batch.changed_seq.0).collect();
        let since: Vec<i64> = ready.iter().map(|batch| ready_claims::attempts_since(request, batch).0).collect();
        let (taken_generations, taken_liveness) = takeover_args(request, &ready);
        let (ids, stamps, since, version, ready) = (&ids, &stamps, &since, &(steering_version as i64), &ready);
        let (taken_generations, taken_liveness) = (&taken_generations, &taken_liveness);
        let (component, holder) = (request.component(), &request.holder);
        let claimer = &ClaimerArgs::new(component, holder);
        let sql = if ready_claims::durable(request) { CLAIM_READY_FLUSHED } else { CLAIM_READY_UNFLUSHED };
        self.run("claim_ready", Retry::Safe, |client, _| {
            Box::pin(async move {
                let statement = prepare(client, sql).await?;
                let rows = client
                    .query(
                        &statement,
                        &claimer.after(&[ids, stamps, since, version, taken_generations, taken_liveness]),
                    )
                    .await
                    .map_err(|e| self.failure(e, &Scope { batch: &first.id, run: None }))?;
                let ids: Vec<&BatchId> = ready.iter().map(|batch| &batch.id).collect();
                claimed_rows(&rows, &ids, component, holder)
            })
        })
        .await
    }
}

/// The statement reading the steering (with its version) and the batches of `$1` whole: one
/// snapshot, which `steering_and_batches` reads.
static READ_FOR_CLAIMS: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT x.*, s.state, s.version FROM steering s
         LEFT JOIN LATERAL ({BATCH_SELECT} WHERE b.id = ANY($1)) x ON true WHERE s.id = 1"
    )
});

/// The answer for a batch a round called its claim function for: refused (`held`: the open
/// run that is its lock, nothing written), the claim's own refusal, or claimed.
pub(super) fn claimed_answer(request: &ReadyClaimRequest, batch: Batch, row: ClaimRow) -> StoreResult<ReadyAnswer> {
    if let Some(holding) = row.held {
        return Ok(ready_claims::refusal(batch, holding));
    }
    let claim = row.claim?;
    Ok(ready_claims::answer(request, batch, Some(claim), row.failed_attempts, row.checkpoint))
}

/// What `read_for_claims_sql` answered: the steering and the batches found, by id.
pub(super) fn steering_and_batches(rows: &[Row]) -> Result<(Steering, HashMap<BatchId, Batch>), Failure> {
    let first = rows.first().ok_or_else(|| corrupt("steering record", "no row"))?;
    let mut steering: Steering =
        serde_json::from_value(unjsoned(first.get(STEERING_COLUMN))).map_err(|e| corrupt("steering record", e))?;
    steering.version = first.get::<_, i64>(STEERING_COLUMN + 1) as u64;
    let mut found = HashMap::with_capacity(rows.len());
    for row in rows.iter().filter(|row| row.get::<_, Option<&str>>(0).is_some()) {
        let batch = batch_from_row(row)?;
        found.insert(batch.id.clone(), batch);
    }
    Ok((steering, found))
}

/// What a call of `autocomp_claim_ready` for `ids` answered: `Moved` when a batch or the
/// steering moved since the stamps and version it was given (nothing written), else a row
/// per batch, in order.
pub(super) fn claimed_rows(
    rows: &[Row],
    ids: &[&BatchId],
    component: &ComponentName,
    holder: &RunHolder,
) -> Result<Claimed, Failure> {
    if rows.first().is_some_and(|row| matches!(row.get::<_, &str>(1), "moved" | "steering_moved")) {
        return Ok(Claimed::Moved);
    }
    check_claim_rows(rows, ids.len())?;
    let mut claimed = Vec::with_capacity(rows.len());
    for (row, id) in rows.iter().zip(ids) {
        let (kind, run, abandoned, current) = (row.get(1), row.get(2), row.get(3), row.get(4));
        let held = if kind == HELD { Some(run_from_json(run)?) } else { None };
        let claim = claim_answer(kind, run, abandoned, current, id, component, holder)?;
        let checkpoint = checkpoint_from_text(row.get(6))?;
        let failed_attempts = u32::try_from(row.get::<_, i64>(5)).unwrap_or(u32::MAX);
        claimed.push(ClaimRow { claim, held, failed_attempts, checkpoint });
    }
    Ok(Claimed::Rows(claimed))
}

/// A claim-round function's call (`$call`, a literal) as a statement answering its rows,
/// its transaction's commit waiting for its flush or not. `unflushed`: not waiting
/// (`synchronous_commit` off for its transaction alone), as `pg_claim_many`'s. `flushed`: an
/// exclusive round is its batches' lock, so it answers only once its commit is flushed;
/// `synchronous_commit` is at least `on` for its transaction (a server or role set to `off`
/// is overruled; `remote_write` or `remote_apply`, a synchronous standby's, stay: the claim
/// then also survives a failover to it).
macro_rules! claim_round {
    (unflushed, $call:literal) => {
        concat!(
            "SELECT r_index, r_kind, r_run::text, r_abandoned::text, r_current, r_failed, r_checkpoint::text
             FROM (SELECT set_config('synchronous_commit', 'off', true)) AS relaxed, ",
            $call
        )
    };
    (flushed, $call:literal) => {
        concat!(
            "SELECT r_index, r_kind, r_run::text, r_abandoned::text, r_current, r_failed, r_checkpoint::text
             FROM (SELECT set_config('synchronous_commit', CASE current_setting('synchronous_commit')
                                 WHEN 'off' THEN 'on' ELSE current_setting('synchronous_commit') END, true))
                      AS flushed, ",
            $call
        )
    };
}

const CLAIM_READY_UNFLUSHED: &str =
    claim_round!(unflushed, "autocomp_claim_ready($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)");
const CLAIM_READY_FLUSHED: &str =
    claim_round!(flushed, "autocomp_claim_ready($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)");
/// `autocomp_claim_judged`'s call, by the same rules (`judged_claims`).
pub(super) const CLAIM_JUDGED_UNFLUSHED: &str =
    claim_round!(unflushed, "autocomp_claim_judged($1, $2, $3, $4, $5, $6, $7, $8, $9)");
pub(super) const CLAIM_JUDGED_FLUSHED: &str =
    claim_round!(flushed, "autocomp_claim_judged($1, $2, $3, $4, $5, $6, $7, $8, $9)");

/// Each batch's takeover as `autocomp_claim_ready` takes them, in the order of `ready`: the
/// generation and liveness of the open run the request takes over (`None`: none), which the
/// database checks again before it abandons a run that is its batch's lock.
fn takeover_args<'a>(request: &'a ReadyClaimRequest, ready: &[&Batch]) -> (Vec<Option<i64>>, Vec<Option<&'a str>>) {
    let takeovers: Vec<Option<&Takeover>> = ready
        .iter()
        .map(|batch| batch.open_run(request.component()).and_then(|open| ready_claims::takeover_naming(request, open)))
        .collect();
    let generations = takeovers.iter().map(|takeover| takeover.map(|takeover| takeover.generation)).collect();
    let liveness =
        takeovers.iter().map(|takeover| takeover.and_then(|takeover| takeover.liveness.as_deref())).collect();
    (generations, liveness)
}

/// How `claim_ready` treats a batch it read: claimed if wanted and not held by an open run
/// (`holding_run`: exclusive, another claim's; else one that is its batch's lock), the rules
/// every backend shares.
fn judge(request: &ReadyClaimRequest, batch: Batch, steered: ready_claims::Steered) -> Judged {
    if !ready_claims::wanted_when(request, &batch, steered) {
        return Judged::NotReady(batch);
    }
    match ready_claims::holding_run(request, &batch).cloned() {
        Some(holding) => Judged::Held(batch, holding),
        None => Judged::Ready(batch),
    }
}

/// Where `read_for_claims`'s steering columns start: after `BATCH_SELECT`'s.
pub(super) const STEERING_COLUMN: usize = 20;

/// The claimer's arguments, which every claim function of the schema takes last and in this
/// order: the component, the holder's agent, host and pid, its claim key and its liveness.
pub(super) struct ClaimerArgs<'a> {
    component: &'a str,
    agent: &'a str,
    host: &'a str,
    pid: i64,
    claim_key: Option<&'a str>,
    liveness: Option<&'a str>,
}

impl<'a> ClaimerArgs<'a> {
    pub(super) fn new(component: &'a ComponentName, holder: &'a RunHolder) -> Self {
        Self {
            component: component.as_str(),
            agent: holder.agent.as_str(),
            host: &holder.host,
            pid: i64::from(holder.pid),
            claim_key: holder.claim_key.as_ref().map(IdempotencyKey::as_str),
            liveness: holder.liveness.as_deref(),
        }
    }

    /// The arguments of a call: the function's own (`leading`), then the claimer's.
    pub(super) fn after<'s>(&'s self, leading: &[&'s (dyn ToSql + Sync)]) -> Vec<&'s (dyn ToSql + Sync)> {
        let claimer: [&'s (dyn ToSql + Sync); 6] =
            [&self.component, &self.agent, &self.host, &self.pid, &self.claim_key, &self.liveness];
        leading.iter().copied().chain(claimer).collect()
    }
}

/// A claim function's rows (`r_index` first) are one per batch asked, numbered from 1 in the
/// order asked: the answers are zipped with the batches, so anything else is corrupt.
fn check_claim_rows(rows: &[Row], asked: usize) -> Result<(), Failure> {
    if rows.len() != asked {
        return Err(corrupt("answer", format!("{} answers for {asked} batches", rows.len())));
    }
    let numbered = rows.iter().enumerate().all(|(at, row)| usize::try_from(row.get::<_, i32>(0)).ok() == Some(at + 1));
    if !numbered {
        return Err(corrupt("answer", "claims answered out of order"));
    }
    Ok(())
}

/// A checkpoint as stored (JSON text, `None`: none saved).
pub(super) fn checkpoint_from_text(stored: Option<&str>) -> Result<Option<Value>, Failure> {
    stored.map(|stored| serde_json::from_str(stored).map(unjsoned).map_err(|e| corrupt("checkpoint", e))).transpose()
}
