//! The embedded file's hand-ons (`HandOnStore`): takers' offers, the runs an append opens for
//! them inside its own transaction (`hand_on_in`, called by `writes::append_in`), and a
//! taker's read of the runs handed to it.

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, params};

use crate::port::hand_on::{HandOn, handed_answer};
use crate::port::ready_claims::{self, ReadyAnswer};
use crate::port::{
    AnnouncementMark, HandOnNotice, HandOnStore, HandedOn, RegisteredHandingOn, StoreError, StoreResult, TakerOffer,
};
use std::time::Duration;

use autocomp_model::{
    BatchId, ChangeInterest, ComponentDescriptor, ComponentName, Event, NewBatch, NewEvent, Run, RunHolder, Seq,
    Timestamp,
};

use super::rows::{load_batches, query_runs};
use super::runs::{checkpoint_in, claim_in, failed_attempts_in};
use super::statements::Prepared;
use super::tx::{read_tx, write_tx};
use super::{SqliteBackend, unavailable};

#[async_trait]
impl HandOnStore for SqliteBackend {
    async fn offer_to_take(&self, offer: TakerOffer) -> StoreResult<bool> {
        let liveness = offer.holder.liveness.clone().expect("checked: a taker names its liveness");
        self.wakes.expect_hand_ons(&offer.descriptor.name, &liveness);
        self.with_connection(move |conn| offer_in(conn, &offer)).await
    }

    async fn withdraw_offer(&self, component: &ComponentName, liveness: &str) -> StoreResult<()> {
        let (component, liveness) = (component.clone(), liveness.to_owned());
        self.with_connection(move |conn| {
            let tx = write_tx(conn)?;
            tx.execute_prepared(
                "DELETE FROM takers WHERE component = ?1 AND liveness = ?2",
                params![component.as_str(), liveness],
            )
            .map_err(unavailable)?;
            tx.commit().map_err(unavailable)
        })
        .await
    }

    async fn takers(&self) -> StoreResult<Vec<ComponentDescriptor>> {
        self.with_connection(|conn| {
            let tx = read_tx(conn)?;
            takers_in(&tx)
        })
        .await
    }

    async fn append_handing_on(
        &self,
        batch: &BatchId,
        event: NewEvent,
        hand_on: &[ComponentName],
    ) -> StoreResult<HandedOn> {
        self.append_queued(batch, event, hand_on.to_vec()).await
    }

    async fn register_handing_on(
        &self,
        batch: NewBatch,
        first: NewEvent,
        hand_on: &[ComponentName],
    ) -> StoreResult<RegisteredHandingOn> {
        self.register_with_hand_ons(batch, first, hand_on).await
    }

    async fn hand_on_notice(
        &self,
        component: &ComponentDescriptor,
        liveness: &str,
        since: Option<AnnouncementMark>,
    ) -> HandOnNotice {
        self.wakes.hand_on_notice(&component.name, liveness, since)
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
        self.wait_as(since, read_after, interest, Some((component, liveness)), timeout).await
    }

    async fn handed_runs(&self, component: &ComponentDescriptor, liveness: &str) -> StoreResult<Vec<ReadyAnswer>> {
        let (component, liveness) = (component.clone(), liveness.to_owned());
        self.with_connection(move |conn| handed_runs_in(conn, &component, &liveness)).await
    }
}

/// Keeps the offer, the newest of its component and liveness.
fn offer_in(conn: &mut Connection, offer: &TakerOffer) -> StoreResult<bool> {
    let liveness = offer.holder.liveness.as_deref().expect("checked: a taker names its liveness");
    let holder = serde_json::to_string(&offer.holder).expect("a holder always serializes");
    let descriptor = serde_json::to_string(&offer.descriptor).expect("a descriptor always serializes");
    let tx = write_tx(conn)?;
    tx.execute_prepared(
        "INSERT INTO takers (component, liveness, holder, descriptor, offered_at) VALUES (?1, ?2, ?3, ?4, ?5)
         ON CONFLICT (component, liveness) DO UPDATE
         SET holder = excluded.holder, descriptor = excluded.descriptor, offered_at = excluded.offered_at",
        params![offer.descriptor.name.as_str(), liveness, holder, descriptor, Timestamp::now().millis()],
    )
    .map_err(unavailable)?;
    tx.commit().map_err(unavailable)?;
    Ok(true)
}

/// Each component with an offer standing, by its newest offer's descriptor, in name order.
fn takers_in(tx: &Connection) -> StoreResult<Vec<ComponentDescriptor>> {
    let mut statement = tx
        .prepare_cached("SELECT component, descriptor FROM takers ORDER BY component, offered_at DESC")
        .map_err(unavailable)?;
    let rows = statement
        .query_map([], |row| Ok((row.get::<_, String>(0)?, row.get::<_, String>(1)?)))
        .map_err(unavailable)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(unavailable)?;
    let mut takers: Vec<ComponentDescriptor> = Vec::new();
    for (component, descriptor) in rows {
        if takers.last().is_some_and(|last| last.name.as_str() == component) {
            continue;
        }
        takers.push(stored(&descriptor)?);
    }
    Ok(takers)
}

/// The batch's `changed_seq` before an append that may hand it on: what `hand_on_in` checks
/// the appending run's claim against.
pub(super) fn changed_seq(tx: &Connection, batch: &BatchId) -> StoreResult<Option<Seq>> {
    tx.query_row_prepared("SELECT changed_seq FROM batches WHERE id = ?1", [batch.as_str()], |row| row.get(0))
        .optional()
        .map(|seq| seq.map(Seq))
        .map_err(unavailable)
}

/// Inside the append of `event` (a result), which found the batch at `changed_before`: a run
/// of each component of `hand_on` for its longest-waiting idle taker, where `HandOn::rule`
/// allows. The runs opened, each as a claim opens it (`claim_in`: the next generation, the
/// taker's holder).
pub(super) fn hand_on_in(
    tx: &Connection,
    batch: &BatchId,
    event: &Event,
    changed_before: Seq,
    hand_on: &[ComponentName],
) -> StoreResult<Vec<Run>> {
    let Some(appending) = event.run.as_ref().filter(|_| !hand_on.is_empty()) else {
        return Ok(Vec::new());
    };
    let mut handed = Vec::new();
    // Read once, when an idle taker is found first (a busy taker, the common case under a
    // backlog, costs the append one indexed read).
    let mut claimed_at_and_steering = None;
    for component in hand_on {
        let Some(holder) = idle_taker(tx, component)? else { continue };
        if claimed_at_and_steering.is_none() {
            let claim_seq: Option<i64> = tx
                .query_row_prepared(
                    "SELECT claim_seq FROM runs WHERE batch_id = ?1 AND component = ?2 AND generation = ?3",
                    params![batch.as_str(), appending.component.as_str(), appending.generation],
                    |row| row.get(0),
                )
                .optional()
                .map_err(unavailable)?;
            let Some(claim_seq) = claim_seq else { return Ok(handed) };
            claimed_at_and_steering = Some((Seq(claim_seq), super::steering::load(tx)?));
        }
        let (claim_seq, steering) = claimed_at_and_steering.as_ref().expect("read above");
        let open = query_runs(
            tx,
            "WHERE batch_id = ?1 AND component = ?2 AND state = 'open'",
            params![batch.as_str(), component.as_str()],
        )?;
        let rule = HandOn {
            claim_seq: *claim_seq,
            changed_seq: changed_before,
            held: ready_claims::holds(steering, component),
            open: &open,
        };
        if rule.rule() {
            handed.push(open_for_taker(tx, batch, component, &holder)?);
        }
    }
    Ok(handed)
}

/// Inside the registration of `batch` (created by this transaction): a run of each component
/// of `hand_on` for its longest-waiting idle taker, where the steering holds neither it nor
/// the pipeline (nothing else can have touched the batch, and nobody works it yet).
pub(super) fn hand_on_registered_in(
    tx: &Connection,
    batch: &BatchId,
    hand_on: &[ComponentName],
) -> StoreResult<Vec<Run>> {
    let mut handed = Vec::new();
    let mut steering = None;
    for component in hand_on {
        let Some(holder) = idle_taker(tx, component)? else { continue };
        let steering = match &mut steering {
            Some(steering) => steering,
            None => steering.insert(super::steering::load(tx)?),
        };
        if !ready_claims::holds(steering, component) {
            handed.push(open_for_taker(tx, batch, component, &holder)?);
        }
    }
    Ok(handed)
}

/// The component's run on `batch` for the taker `holder`, opened as a claim opens it
/// (`claim_in`: the next generation, the taker's holder), and announced to the taker after
/// the commit.
fn open_for_taker(tx: &Connection, batch: &BatchId, component: &ComponentName, holder: &RunHolder) -> StoreResult<Run> {
    let run = claim_in(tx, batch, component, holder, None)?.run;
    let liveness = holder.liveness.as_deref().expect("checked: a taker names its liveness");
    super::wakes::announce_hand_on(tx, component, liveness).map_err(unavailable)?;
    Ok(run)
}

/// The component's taker that offered first among those holding no open run of it.
fn idle_taker(tx: &Connection, component: &ComponentName) -> StoreResult<Option<RunHolder>> {
    let holder: Option<String> = tx
        .query_row_prepared(
            "SELECT holder FROM takers t WHERE component = ?1
               AND NOT EXISTS (SELECT 1 FROM runs r
                               WHERE r.component = t.component AND r.state = 'open' AND r.liveness = t.liveness)
             ORDER BY offered_at LIMIT 1",
            [component.as_str()],
            |row| row.get(0),
        )
        .optional()
        .map_err(unavailable)?;
    holder.as_deref().map(stored).transpose()
}

/// A taker's stored holder or descriptor: written by `offer_in` from a checked value, so one
/// that does not read back was changed behind the store's back.
fn stored<T: serde::de::DeserializeOwned>(text: &str) -> StoreResult<T> {
    serde_json::from_str(text)
        .map_err(|e| StoreError::Unavailable(format!("the takers table holds an unreadable row: {e}")))
}

/// The component's open runs naming `liveness`, each answered as a claim round answers a
/// claimed batch, all read in one snapshot.
fn handed_runs_in(
    conn: &mut Connection,
    component: &ComponentDescriptor,
    liveness: &str,
) -> StoreResult<Vec<ReadyAnswer>> {
    let tx = read_tx(conn)?;
    let runs = query_runs(
        &tx,
        "WHERE state = 'open' AND component = ?1 AND liveness = ?2",
        params![component.name.as_str(), liveness],
    )?;
    let ids: Vec<BatchId> = runs.iter().map(|run| run.batch_id.clone()).collect();
    let mut batches = load_batches(&tx, &ids, Timestamp::now())?;
    let mut answers = Vec::with_capacity(runs.len());
    for run in runs {
        let Some(at) = batches.iter().position(|batch| batch.id == run.batch_id) else { continue };
        let batch = batches.swap_remove(at);
        let since = batch.last_reset_of(&component.event_type);
        let failed_attempts = failed_attempts_in(&tx, &batch.id, &component.name, since)?;
        let checkpoint = checkpoint_in(&tx, &batch.id, &component.name)?;
        answers.push(handed_answer(run, batch, failed_attempts, checkpoint));
    }
    Ok(answers)
}
