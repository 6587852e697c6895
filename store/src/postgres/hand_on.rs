//! Hand-ons on PostgreSQL (`HandOnStore`): takers' offers in the `takers` table, the runs an
//! append opens for them in its own transaction (`autocomp_append_group` with hand-ons, which
//! opens each with `autocomp_open_handed_run` before it writes the batch's row; sent by
//! `appends`), and a taker's read of the runs handed to it, or of what the announcement of
//! one carried (`carried_answer`: the same answer, sent by `autocomp_announce_handed`).

use async_trait::async_trait;
use deadpool_postgres::ClientWrapper;
use tokio_postgres::Statement;

use super::calls::{prepare, prepare_if_defined};
use super::rows::{BATCH_SELECT, BatchColumns, RunRow, batch_from_row, corrupt, run_from_json};
use super::runs::checkpoint_from_text;
use super::{Failure, PgBackend, Retry};
use crate::port::hand_on::handed_answer;
use crate::port::ready_claims::{ReadyAnswer, ReadyClaimRequest, ReadyClaims};
use crate::port::{
    AnnouncementMark, HandOnNotice, HandOnStore, HandedOn, RegisteredHandingOn, StoreResult, TakerOffer,
};
use std::time::Duration;

use autocomp_model::{
    Batch, BatchId, ChangeInterest, ComponentDescriptor, ComponentName, EventType, NewBatch, NewEvent, Run, Seq,
    Timestamp,
};

#[async_trait]
impl HandOnStore for PgBackend {
    async fn offer_to_take(&self, offer: TakerOffer) -> StoreResult<bool> {
        let liveness = offer.holder.liveness.clone().expect("checked: a taker names its liveness");
        let holder = serde_json::to_value(&offer.holder).expect("a holder always serializes");
        let descriptor = serde_json::to_value(&offer.descriptor).expect("a descriptor always serializes");
        let component = offer.descriptor.name.as_str();
        let at = Timestamp::now().millis();
        let key = self.inner.listener.announcement_key_blocks();
        let (liveness, holder, descriptor, key) = (&liveness, &holder, &descriptor, &key);
        let kept = self
            .run("offer_to_take", Retry::Safe, |client, _| {
                Box::pin(async move {
                    // Whether the schema announces hand-ons to their takers (25) comes back with it.
                    let row = match prepare_on_takers(client, KEYED_OFFER).await? {
                        Some(statement) => {
                            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 6] =
                                [&component, liveness, holder, descriptor, &at, key];
                            client.query_one(&statement, &params).await.map_err(|e| self.read_failure(e))?
                        }
                        // Schema 24-25: no key (their announcements carry nothing to seal).
                        None => {
                            let Some(statement) = prepare_on_takers(client, UNKEYED_OFFER).await? else {
                                return Ok(None);
                            };
                            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 5] =
                                [&component, liveness, holder, descriptor, &at];
                            let row = client.query_one(&statement, &params).await.map_err(|e| self.read_failure(e))?;
                            if row.get::<_, Option<bool>>(1) == Some(true) {
                                // Migrated by a build before schema 26 took its final form: its
                                // announcements are on the channel every waiter hears.
                                tracing::warn!(component, "the store is at schema 26 but its takers keep no key: a database migrated by a build before schema 26 was released; create it again");
                            }
                            row
                        }
                    };
                    Ok(Some(row.get::<_, Option<bool>>(0).unwrap_or(false)))
                })
            })
            .await?;
        if kept == Some(true) {
            self.inner.listener.expect_hand_ons(&self.inner.options, &offer.descriptor.name, liveness);
        }
        Ok(kept.is_some())
    }

    async fn wait_as_taker(
        &self,
        since: Seq,
        read_after: Option<AnnouncementMark>,
        interest: &ChangeInterest,
        component: &ComponentName,
        liveness: &str,
        timeout: Duration,
    ) -> StoreResult<Option<Seq>> {
        self.pg_wait_for_concerning_change(since, read_after, interest, Some((component, liveness)), timeout).await
    }

    async fn register_handing_on(
        &self,
        batch: NewBatch,
        first: NewEvent,
        hand_on: &[ComponentName],
    ) -> StoreResult<RegisteredHandingOn> {
        self.pg_register(batch, first, hand_on).await
    }

    async fn hand_on_notice(
        &self,
        component: &ComponentDescriptor,
        liveness: &str,
        since: Option<AnnouncementMark>,
    ) -> HandOnNotice {
        self.inner.listener.hand_on_notice(component, liveness, since)
    }

    async fn withdraw_offer(&self, component: &ComponentName, liveness: &str) -> StoreResult<()> {
        let component = component.as_str();
        self.run("withdraw_offer", Retry::Safe, |client, _| {
            Box::pin(async move {
                let sql = "DELETE FROM takers WHERE component = $1 AND liveness = $2";
                let Some(statement) = prepare_on_takers(client, sql).await? else { return Ok(()) };
                client.execute(&statement, &[&component, &liveness]).await.map_err(|e| self.read_failure(e))?;
                Ok(())
            })
        })
        .await
    }

    async fn takers(&self) -> StoreResult<Vec<ComponentDescriptor>> {
        self.run("takers", Retry::Safe, |client, _| {
            Box::pin(async move {
                let sql =
                    "SELECT DISTINCT ON (component) descriptor::text FROM takers ORDER BY component, offered_at DESC";
                let Some(statement) = prepare_on_takers(client, sql).await? else { return Ok(Vec::new()) };
                let rows = client.query(&statement, &[]).await.map_err(|e| self.read_failure(e))?;
                rows.iter()
                    .map(|row| serde_json::from_str(row.get::<_, &str>(0)).map_err(|e| corrupt("taker", e)))
                    .collect()
            })
        })
        .await
    }

    async fn append_handing_on(
        &self,
        batch: &BatchId,
        event: NewEvent,
        hand_on: &[ComponentName],
    ) -> StoreResult<HandedOn> {
        self.pg_append(batch, event, hand_on.to_vec()).await
    }

    /// One statement: each open run of the component naming `liveness`, with its batch read
    /// as `get_batches` reads it, the claim seqs of the component's failed runs on it (counted
    /// from its type's newest `Reset`, as `failed_attempts` counts) and its checkpoint.
    async fn handed_runs(&self, component: &ComponentDescriptor, liveness: &str) -> StoreResult<Vec<ReadyAnswer>> {
        let (name, sql) = (component.name.as_str(), handed_runs_sql());
        self.run("handed_runs", Retry::Safe, |client, _| {
            Box::pin(async move {
                let statement = prepare(client, sql).await?;
                let rows = client.query(&statement, &[&name, &liveness]).await.map_err(|e| self.read_failure(e))?;
                rows.iter()
                    .map(|row| {
                        let failed: Option<Vec<i64>> = row.get(BATCH_COLUMNS + 1);
                        handed_from(
                            &component.event_type,
                            batch_from_row(row)?,
                            run_from_json(row.get(BATCH_COLUMNS))?,
                            failed.as_deref().unwrap_or_default(),
                            row.get(BATCH_COLUMNS + 2),
                        )
                    })
                    .collect()
            })
        })
        .await
    }
}

/// A handed run as `handed_runs` answers it, out of what was read of it: its batch, the run,
/// the claim seqs of the step's failed runs on the batch (those after the newest `Reset` of
/// `event_type` are its failed attempts) and its checkpoint as stored.
fn handed_from(
    event_type: &EventType,
    batch: Batch,
    run: Run,
    failed: &[i64],
    checkpoint: Option<&str>,
) -> Result<ReadyAnswer, Failure> {
    let since = batch.last_reset_of(event_type);
    let failed_attempts = failed.iter().filter(|claim_seq| Seq(**claim_seq) > since).count();
    let failed_attempts = u32::try_from(failed_attempts).unwrap_or(u32::MAX);
    Ok(handed_answer(run, batch, failed_attempts, checkpoint_from_text(checkpoint)?))
}

/// The answer a hand-on's announcement carried (`autocomp_announce_handed`, schema 26): what
/// `handed_runs` reads of the run, as one JSON array (the batch's columns in `BATCH_SELECT`'s
/// order, the run, the failed runs' claim seqs, the checkpoint). A run of another step or
/// another taker than the announcement named is refused (its seal covers both anyway).
pub(super) fn carried_answer(
    component: &ComponentDescriptor,
    liveness: &str,
    answer: &str,
) -> Result<ReadyAnswer, Failure> {
    type Carried = (BatchColumns<String>, RunRow, Option<Vec<i64>>, Option<String>);
    let (batch, run, failed, checkpoint): Carried =
        serde_json::from_str(answer).map_err(|e| corrupt("hand-on's announcement", e))?;
    let run = run.into_run()?;
    if run.component != component.name || run.holder.liveness.as_deref() != Some(liveness) {
        return Err(corrupt("hand-on's announcement", format!("a run of {} for another taker", run.component)));
    }
    let failed = failed.as_deref().unwrap_or_default();
    handed_from(&component.event_type, batch.into_batch()?, run, failed, checkpoint.as_deref())
}

/// An offer, with the handle's key its announcements are sealed with (schema 26).
const KEYED_OFFER: &str = "INSERT INTO takers (component, liveness, holder, descriptor, offered_at, announcement_key)
     VALUES ($1, $2, $3, $4, $5, $6)
     ON CONFLICT (component, liveness) DO UPDATE
     SET holder = excluded.holder, descriptor = excluded.descriptor, offered_at = excluded.offered_at,
         announcement_key = excluded.announcement_key
     RETURNING (SELECT max(version) >= 25 FROM schema_version)";

/// An offer on schemas 24-25, whose takers hold no key.
const UNKEYED_OFFER: &str =
    "INSERT INTO takers (component, liveness, holder, descriptor, offered_at) VALUES ($1, $2, $3, $4, $5)
     ON CONFLICT (component, liveness) DO UPDATE
     SET holder = excluded.holder, descriptor = excluded.descriptor, offered_at = excluded.offered_at
     RETURNING (SELECT max(version) >= 25 FROM schema_version), (SELECT max(version) >= 26 FROM schema_version)";

/// How many columns `BATCH_SELECT` reads (`batch_from_row`): a read that selects more
/// numbers them from here.
const BATCH_COLUMNS: usize = 20;

/// `handed_runs`' statement: `BATCH_SELECT` with the run, the failed runs' claim seqs and the
/// checkpoint after its columns, for the batches of the handed runs only.
fn handed_runs_sql() -> &'static str {
    static SQL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SQL.get_or_init(|| {
        let (columns, from) = BATCH_SELECT.split_once("    FROM batches b").expect("BATCH_SELECT reads batches b");
        format!(
            "{columns}, h.run,
                (SELECT array_agg(f.claim_seq) FROM runs f WHERE f.batch_id = b.id AND f.component = $1
                   AND (f.state = 'abandoned' OR f.transient)),
                (SELECT c.data::text FROM checkpoints c WHERE c.batch_id = b.id AND c.component = $1)
            FROM batches b
            JOIN (SELECT r.batch_id, to_jsonb(r)::text AS run FROM runs r
                  WHERE r.state = 'open' AND r.component = $1 AND r.liveness = $2) h ON h.batch_id = b.id
            {from}
            ORDER BY b.id"
        )
    })
}

impl PgBackend {
    /// After a claim round with takeovers: the offers of the holders it proved dead and took
    /// runs over from go with them, so no append hands them another batch. A hint: a failure
    /// leaves the offer, whose next handed run is taken over (and the offer forgotten) again.
    pub(super) async fn forget_dead_takers(&self, request: &ReadyClaimRequest, claims: &ReadyClaims) {
        let dead: Vec<&str> = claims
            .answers
            .iter()
            .filter_map(|answer| answer.as_ref().ok()?.claim.as_ref()?.abandoned.as_ref()?.holder.liveness.as_deref())
            .filter(|liveness| request.takeovers.iter().any(|named| named.liveness.as_deref() == Some(*liveness)))
            .collect();
        if dead.is_empty() {
            return;
        }
        let dead = &dead;
        let _ = self
            .run("forget_takers", Retry::Safe, |client, _| {
                Box::pin(async move {
                    let statement = prepare(client, "SELECT autocomp_forget_takers($1)").await?;
                    client.execute(&statement, &[dead]).await.map_err(|e| self.read_failure(e))?;
                    Ok(())
                })
            })
            .await;
    }
}

/// `prepare` for a statement on the takers table: `None` where the schema is older than the
/// takers (schema 24). A release runs on schemas back to `schema::OLDEST_RUNNABLE` while a
/// migration waits, and there it keeps no takers: an offer is answered `false`, none are
/// listed, nothing is handed on.
async fn prepare_on_takers(client: &ClientWrapper, sql: &str) -> Result<Option<Statement>, Failure> {
    prepare_if_defined(client, sql).await
}
