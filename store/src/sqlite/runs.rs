//! The embedded file's runs: claims (a pass's claims in one transaction, each in a savepoint;
//! a claim round with its re-check, attempts and checkpoints in one),
//! releases, checkpoints, and the reads of open and failed runs.

use rusqlite::{Connection, OptionalExtension, params};
use serde_json::Value;

use std::collections::HashMap;

use crate::port::ready_claims::{self, ReadyClaimRequest, ReadyClaims, Takeover};
use crate::port::{Claim, StoreError, StoreResult};
use crate::write_rules::{self};
use autocomp_model::{Batch, BatchId, ComponentName, Run, RunHolder, RunState, Seq, Timestamp};

use super::rows::{load_batches, query_runs, stored_json};
use super::statements::Prepared;
use super::tx::{check_run_is_current_and_open, next_seq, read_tx, require_batch, write_tx};
use super::{summary, unavailable};

pub fn claim(
    conn: &mut Connection,
    batch: &BatchId,
    component: &ComponentName,
    holder: &RunHolder,
) -> StoreResult<Claim> {
    let tx = write_tx(conn)?;
    let claim = claim_in(&tx, batch, component, holder, None)?;
    tx.commit().map_err(unavailable)?;
    Ok(claim)
}

/// `ObjectStore::claim_many`: every claim in one IMMEDIATE transaction (one commit, one
/// fsync), each in a savepoint of its own so a refused claim (unknown batch, a claim key
/// already used) changes nothing and the others still commit. If the commit fails nothing
/// was claimed and that is the outer error. Not synced, unless served to other hosts from a
/// file read before its syncs (`Commit::of_claims`).
pub fn claim_many(
    conn: &mut Connection,
    batches: &[BatchId],
    component: &ComponentName,
    holder: &RunHolder,
    served: Served,
) -> StoreResult<Vec<StoreResult<Claim>>> {
    with_synchronous(conn, Commit::of_claims(false, served), served.base(), |conn| {
        claim_each(conn, batches, component, holder)
    })
}

/// How a claim's commit reaches the disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Commit {
    /// `synchronous` at most NORMAL: the commit is not synced. A pass's claims survive its
    /// process at once (the commit is in the WAL file) and a power loss with the next synced
    /// commit (under the default `synchronous=full`, the result of their work, which syncs
    /// the whole WAL, claims included). Lost with the machine before then, they leave
    /// batches that are simply ready again, as if never claimed: their holders, all on this
    /// machine for an in-process file (an exclusive claim through the store service is
    /// `Synced`), are gone with it. Sparing the claim its fsync halves the syncs per batch
    /// and stage.
    Unsynced,
    /// `synchronous` at least FULL, even on a file opened with `synchronous=normal`: the
    /// commit's WAL is synced before it answers. An exclusive claim is its batches' lock,
    /// synced where the file is served to holders on other hosts, which a power loss of this
    /// one does not stop (`SqliteOptions::claims_from_other_hosts`). So is every claim served
    /// from a file whose writes this host's processes may read before their sync
    /// (`announced_first`): syncing the claim makes what its holder read durable before it
    /// works.
    Synced,
}

/// Whether a claim's holder may be on another host, and whether the file it claims from
/// syncs its commits (`synchronous` other than `normal`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Served {
    pub(super) to_other_hosts: bool,
    pub(super) synced_file: bool,
}

impl Served {
    /// The file's own `synchronous` (as `SqliteBackend::open_with` sets it): FULL where it
    /// syncs its commits, NORMAL where it does not.
    pub(super) fn base(self) -> i64 {
        match self.synced_file {
            true => SYNCHRONOUS_FULL,
            false => SYNCHRONOUS_NORMAL,
        }
    }
}

impl Commit {
    /// How claims commit: synced only if their holder may be on another host and either the
    /// claims must be durable (exclusive: a lock) or the file syncs its commits (its writes
    /// may then have been read before their sync: `announced_first`).
    fn of_claims(durable: bool, served: Served) -> Self {
        match served.to_other_hosts && (durable || served.synced_file) {
            true => Commit::Synced,
            false => Commit::Unsynced,
        }
    }
}

/// `work` with the connection's `synchronous` as `commit` needs it, then set back to
/// `base`, the handle's own setting (`Served::base`), also when `work` panics (the connection
/// outlives a panic: left at NORMAL, every later commit through it would go unsynced).
/// Set from `base`, not from what the connection holds, so a setting a call before could
/// not set back is made good by the next call (a claim round, `claim_many` or `claim_ready`,
/// or an announced-first stage write). A commit that may go unsynced and cannot change the
/// setting commits as the connection holds it; one that must be synced is refused before it
/// writes. Not setting it back is logged, and `work`'s answer stands: its own commit went as
/// `commit` asked; what it leaves is the commits through the connection until that next
/// call. SQLite refuses the `PRAGMA` inside a transaction, which no write leaves open (its
/// `Transaction` rolls back when dropped, also in a panic's unwinding), and fails it when it
/// must read a schema another process changed and the file stays busy past its timeout.
pub(super) fn with_synchronous<T>(
    conn: &mut Connection,
    commit: Commit,
    base: i64,
    work: impl FnOnce(&mut Connection) -> StoreResult<T>,
) -> StoreResult<T> {
    let wanted = match commit {
        Commit::Unsynced => base.min(SYNCHRONOUS_NORMAL),
        Commit::Synced => base.max(SYNCHRONOUS_FULL),
    };
    match (conn.pragma_update(None, "synchronous", wanted), commit) {
        (Ok(()), _) => {}
        (Err(error), Commit::Unsynced) => {
            tracing::debug!(
                "synchronous={wanted} could not be set for an unsynced commit ({error}); it commits as set"
            );
        }
        (Err(error), Commit::Synced) => return Err(unavailable(error)),
    }
    let done = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| work(&mut *conn)));
    if wanted != base
        && let Err(error) = conn.pragma_update(None, "synchronous", base)
    {
        tracing::error!(
            "the store connection's synchronous could not be set back to {base} ({error}); \
             its commits may go unsynced until the next claim or stage write sets it"
        );
    }
    done.unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

/// `ObjectStore::claim_ready`: the steering, the batches, each ready one's attempts and
/// checkpoint and its claim (in a savepoint, as `claim_many`'s), all in one IMMEDIATE
/// transaction, so no other writer moves a batch between its re-check and its claim, nor
/// between an exclusive claim's look at its open run and its claim. Not synced, as
/// `claim_many`'s commit, unless served to other hosts (`Commit::of_claims`).
pub fn claim_ready(conn: &mut Connection, request: &ReadyClaimRequest, served: Served) -> StoreResult<ReadyClaims> {
    let commit = Commit::of_claims(ready_claims::durable(request), served);
    with_synchronous(conn, commit, served.base(), |conn| claim_ready_in(conn, request))
}

fn claim_ready_in(conn: &mut Connection, request: &ReadyClaimRequest) -> StoreResult<ReadyClaims> {
    let mut tx = write_tx(conn)?;
    let steering = super::steering::load(&tx)?;
    let component = request.component();
    let read = load_batches(&tx, &request.batches, Timestamp::now())?;
    let mut found: HashMap<BatchId, Batch> = read.into_iter().map(|batch| (batch.id.clone(), batch)).collect();
    let steered = ready_claims::steered(request, &steering, found.values());
    if steered == ready_claims::Steered::Refused {
        // Dropped: rolled back, nothing was written.
        return Ok(ready_claims::refused(steering, request.known_steering));
    }
    let mut answers = Vec::with_capacity(request.batches.len());
    for id in &request.batches {
        let Some(batch) = found.remove(id) else {
            answers.push(Err(StoreError::NotFound(id.clone())));
            continue;
        };
        if !ready_claims::wanted_when(request, &batch, steered) {
            answers.push(Ok(ready_claims::answer(request, batch, None, 0, None)));
            continue;
        }
        if let Some(holding) = ready_claims::holding_run(request, &batch).cloned() {
            answers.push(Ok(ready_claims::refusal(batch, holding)));
            continue;
        }
        let failed = failed_attempts_in(&tx, id, component, ready_claims::attempts_since(request, &batch))?;
        let checkpoint = checkpoint_in(&tx, id, component)?;
        let takeover = batch.open_run(component).and_then(|open| ready_claims::takeover_naming(request, open));
        let savepoint = tx.savepoint().map_err(unavailable)?;
        match claim_in(&savepoint, id, component, &request.holder, takeover) {
            Ok(claim) => {
                savepoint.commit().map_err(unavailable)?;
                answers.push(Ok(ready_claims::answer(request, batch, Some(claim), failed, checkpoint)));
            }
            // An outage is no answer about this batch: give up on all of them.
            Err(StoreError::Unavailable(message)) => return Err(StoreError::Unavailable(message)),
            Err(refused) => answers.push(Err(refused)), // dropped: rolled back to before this claim
        }
    }
    tx.commit().map_err(unavailable)?;
    Ok(ReadyClaims { steering: ready_claims::moved(steering, request.known_steering), held: false, answers })
}

/// SQLite's `synchronous` NORMAL and FULL, as `PRAGMA synchronous` reads them.
const SYNCHRONOUS_NORMAL: i64 = 1;
pub(super) const SYNCHRONOUS_FULL: i64 = 2;

fn claim_each(
    conn: &mut Connection,
    batches: &[BatchId],
    component: &ComponentName,
    holder: &RunHolder,
) -> StoreResult<Vec<StoreResult<Claim>>> {
    let mut tx = write_tx(conn)?;
    let mut answers = Vec::with_capacity(batches.len());
    for batch in batches {
        let savepoint = tx.savepoint().map_err(unavailable)?;
        let answer = claim_in(&savepoint, batch, component, holder, None);
        match answer {
            Ok(_) => savepoint.commit().map_err(unavailable)?,
            // An outage is no answer about this batch: give up on all of them.
            Err(StoreError::Unavailable(message)) => return Err(StoreError::Unavailable(message)),
            Err(_) => {} // dropped: rolled back to before this claim
        }
        answers.push(answer);
    }
    tx.commit().map_err(unavailable)?;
    Ok(answers)
}

/// One claim inside the caller's transaction (or savepoint), which commits it. The batch's
/// open run is abandoned only as `ready_claims::may_abandon` allows (`takeover`: the one an
/// exclusive claim round names it by); a run it may not abandon refuses the claim, nothing
/// written (`ready_claims::lock_conflict`).
pub(super) fn claim_in(
    tx: &Connection,
    batch: &BatchId,
    component: &ComponentName,
    holder: &RunHolder,
    takeover: Option<&Takeover>,
) -> StoreResult<Claim> {
    require_batch(tx, batch)?;
    if let Some(key) = &holder.claim_key {
        let earlier = query_runs(
            tx,
            "WHERE batch_id = ?1 AND component = ?2 AND claim_key = ?3",
            params![batch.as_str(), component.as_str(), key.as_str()],
        )?;
        if let Some(run) = earlier.into_iter().next() {
            // A retry of a claim that committed: the same run, if it is still the open one.
            let current: i64 = tx
                .query_row_prepared(
                    "SELECT generation FROM claims WHERE batch_id = ?1 AND component = ?2",
                    params![batch.as_str(), component.as_str()],
                    |row| row.get(0),
                )
                .map_err(unavailable)?;
            return write_rules::retried_claim(run, current, batch, component, holder)
                .map(|run| Claim { run, abandoned: None });
        }
    }
    let mut abandoned = query_runs(
        tx,
        "WHERE batch_id = ?1 AND component = ?2 AND state = 'open'",
        params![batch.as_str(), component.as_str()],
    )?;
    if let Some(lock) = abandoned.iter().find(|open| !ready_claims::may_abandon(open, takeover)) {
        return Err(ready_claims::lock_conflict(lock));
    }
    if let Some(dead) = takeover.and_then(|takeover| takeover.liveness.as_deref()) {
        // Proven dead: its offers to take hand-ons go with it, so no append hands it another.
        tx.execute_prepared("DELETE FROM takers WHERE liveness = ?1", [dead]).map_err(unavailable)?;
    }
    let seq = next_seq(tx)?;
    let now = Timestamp::now();
    let generation: i64 = tx
        .query_row_prepared(
            "INSERT INTO claims (batch_id, component, generation) VALUES (?1, ?2, 1)
             ON CONFLICT (batch_id, component) DO UPDATE SET generation = generation + 1
             RETURNING generation",
            params![batch.as_str(), component.as_str()],
            |row| row.get(0),
        )
        .map_err(unavailable)?;
    tx.execute_prepared(
        "UPDATE runs SET state = 'abandoned', ended_at = ?3 WHERE batch_id = ?1 AND component = ?2 AND state = 'open'",
        params![batch.as_str(), component.as_str(), now.millis()],
    )
    .map_err(unavailable)?;
    for run in &mut abandoned {
        run.state = RunState::Abandoned;
        run.ended_at = Some(now);
    }
    tx.execute_prepared(
        "INSERT INTO runs (batch_id, component, generation, agent, host, pid, started_at, claim_seq, state, claim_key,
                           liveness)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, 'open', ?9, ?10)",
        params![
            batch.as_str(),
            component.as_str(),
            generation,
            holder.agent.as_str(),
            holder.host,
            holder.pid,
            now.millis(),
            seq.0,
            holder.claim_key.as_ref().map(|k| k.as_str()),
            holder.liveness,
        ],
    )
    .map_err(unavailable)?;
    summary::touch(tx, batch, seq, |state| state.run_opened(component))?;
    let run = Run {
        batch_id: batch.clone(),
        component: component.clone(),
        generation,
        holder: holder.clone(),
        started_at: now,
        claim_seq: seq,
        state: RunState::Open,
        ended_at: None,
        transient: false,
    };
    // Generations are strictly increasing and every claim closes the previous open run, so
    // at most one can have been open.
    Ok(Claim { run, abandoned: abandoned.pop() })
}

pub fn release(conn: &mut Connection, batch: &BatchId, component: &ComponentName, generation: i64) -> StoreResult<()> {
    let tx = write_tx(conn)?;
    require_batch(&tx, batch)?;
    // Releasing twice is a no-op, so a client may retry a release whose answer it lost.
    let released_already: bool = tx
        .query_row_prepared(
            "SELECT 1 FROM runs JOIN claims USING (batch_id, component)
             WHERE batch_id = ?1 AND component = ?2 AND runs.generation = ?3
               AND claims.generation = ?3 AND runs.state = 'released'",
            params![batch.as_str(), component.as_str(), generation],
            |_| Ok(true),
        )
        .optional()
        .map_err(unavailable)?
        .unwrap_or(false);
    if released_already {
        return Ok(());
    }
    check_run_is_current_and_open(&tx, batch, component, generation)?;
    let seq = next_seq(&tx)?;
    tx.execute_prepared(
        "UPDATE runs SET state = 'released', ended_at = ?4 WHERE batch_id = ?1 AND component = ?2 AND generation = ?3",
        params![batch.as_str(), component.as_str(), generation, Timestamp::now().millis()],
    )
    .map_err(unavailable)?;
    summary::touch(&tx, batch, seq, |state| state.run_closed(component))?;
    tx.commit().map_err(unavailable)
}

pub fn save_checkpoint(
    conn: &mut Connection,
    batch: &BatchId,
    component: &ComponentName,
    generation: i64,
    data: &Value,
) -> StoreResult<()> {
    let tx = write_tx(conn)?;
    require_batch(&tx, batch)?;
    check_run_is_current_and_open(&tx, batch, component, generation)?;
    tx.execute_prepared(
        "INSERT INTO checkpoints (batch_id, component, data, generation, saved_at) VALUES (?1, ?2, ?3, ?4, ?5)
         ON CONFLICT (batch_id, component) DO UPDATE
         SET data = excluded.data, generation = excluded.generation, saved_at = excluded.saved_at",
        params![batch.as_str(), component.as_str(), data.to_string(), generation, Timestamp::now().millis()],
    )
    .map_err(unavailable)?;
    tx.commit().map_err(unavailable)
}

pub fn load_checkpoint(
    conn: &mut Connection,
    batch: &BatchId,
    component: &ComponentName,
) -> StoreResult<Option<Value>> {
    let tx = read_tx(conn)?;
    require_batch(&tx, batch)?;
    checkpoint_in(&tx, batch, component)
}

pub(super) fn checkpoint_in(tx: &Connection, batch: &BatchId, component: &ComponentName) -> StoreResult<Option<Value>> {
    let data: Option<String> = tx
        .query_row_prepared(
            "SELECT data FROM checkpoints WHERE batch_id = ?1 AND component = ?2",
            params![batch.as_str(), component.as_str()],
            |row| row.get(0),
        )
        .optional()
        .map_err(unavailable)?;
    data.map(stored_json).transpose().map_err(unavailable)
}

pub fn open_runs(conn: &mut Connection, component: Option<&ComponentName>) -> StoreResult<Vec<Run>> {
    let tx = read_tx(conn)?;
    match component {
        Some(component) => query_runs(&tx, "WHERE state = 'open' AND component = ?1", [component.as_str()]),
        None => query_runs(&tx, "WHERE state = 'open'", []),
    }
}

pub fn failed_attempts(
    conn: &mut Connection,
    batch: &BatchId,
    component: &ComponentName,
    since: Seq,
) -> StoreResult<u32> {
    failed_attempts_in(conn, batch, component, since)
}

pub(super) fn failed_attempts_in(
    conn: &Connection,
    batch: &BatchId,
    component: &ComponentName,
    since: Seq,
) -> StoreResult<u32> {
    conn.query_row_prepared(
        "SELECT COUNT(*) FROM runs WHERE batch_id = ?1 AND component = ?2 AND claim_seq > ?3
           AND (state = 'abandoned' OR transient = 1)",
        params![batch.as_str(), component.as_str(), since.0],
        |row| row.get(0),
    )
    .map_err(unavailable)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_claim_whose_holder_may_be_on_another_host_is_synced() {
        let served = |to_other_hosts, synced_file| Served { to_other_hosts, synced_file };
        // Exclusive: a lock, whatever the file's setting.
        assert_eq!(Commit::of_claims(true, served(true, false)), Commit::Synced);
        assert_eq!(Commit::of_claims(true, served(true, true)), Commit::Synced);
        // Not exclusive: synced where the file's writes may have been read before their sync.
        assert_eq!(Commit::of_claims(false, served(true, true)), Commit::Synced);
        assert_eq!(Commit::of_claims(false, served(true, false)), Commit::Unsynced);
        // In process: every holder ends with this host.
        for (durable, synced_file) in [(true, true), (true, false), (false, true), (false, false)] {
            assert_eq!(Commit::of_claims(durable, served(false, synced_file)), Commit::Unsynced);
        }
    }

    #[test]
    fn a_claim_that_panics_leaves_the_connections_synchronous_as_it_was() {
        let mut conn = Connection::open_in_memory().unwrap();
        conn.pragma_update(None, "synchronous", SYNCHRONOUS_FULL).unwrap();
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            with_synchronous(&mut conn, Commit::Unsynced, SYNCHRONOUS_FULL, |_| -> StoreResult<()> {
                panic!("a claim's bug")
            })
        }));
        assert!(panicked.is_err());
        let synchronous: i64 = conn.query_row("PRAGMA synchronous", [], |row| row.get(0)).unwrap();
        assert_eq!(synchronous, SYNCHRONOUS_FULL, "results through this connection would go unsynced");
    }

    fn synchronous(conn: &Connection) -> i64 {
        conn.query_row("PRAGMA synchronous", [], |row| row.get(0)).unwrap()
    }

    #[test]
    fn a_setting_left_unrestored_is_made_good_by_the_next_claim() {
        let mut conn = Connection::open_in_memory().unwrap();
        // As a call before left it: NORMAL on a handle whose own setting is FULL.
        conn.pragma_update(None, "synchronous", SYNCHRONOUS_NORMAL).unwrap();
        let inside = with_synchronous(&mut conn, Commit::Synced, SYNCHRONOUS_FULL, |conn| Ok(synchronous(conn)));
        assert_eq!(inside.unwrap(), SYNCHRONOUS_FULL, "a synced claim commits synced");
        assert_eq!(synchronous(&conn), SYNCHRONOUS_FULL);
        conn.pragma_update(None, "synchronous", SYNCHRONOUS_NORMAL).unwrap();
        let inside = with_synchronous(&mut conn, Commit::Unsynced, SYNCHRONOUS_FULL, |conn| Ok(synchronous(conn)));
        assert_eq!(inside.unwrap(), SYNCHRONOUS_NORMAL);
        assert_eq!(synchronous(&conn), SYNCHRONOUS_FULL, "set back to the handle's own, not to what it found");
    }

    #[test]
    fn a_setting_that_cannot_change_refuses_only_a_commit_that_must_be_synced() {
        let mut conn = Connection::open_in_memory().unwrap();
        conn.pragma_update(None, "synchronous", SYNCHRONOUS_FULL).unwrap();
        // SQLite refuses to change the setting inside a transaction.
        conn.execute_batch("BEGIN").unwrap();
        let mut worked = false;
        let synced = with_synchronous(&mut conn, Commit::Synced, SYNCHRONOUS_NORMAL, |_| {
            worked = true;
            Ok(())
        });
        assert!(matches!(synced, Err(StoreError::Unavailable(_))), "{synced:?}");
        assert!(!worked, "nothing written unsynced where a sync was owed");
        let unsynced = with_synchronous(&mut conn, Commit::Unsynced, SYNCHRONOUS_FULL, |conn| Ok(synchronous(conn)));
        assert_eq!(unsynced.unwrap(), SYNCHRONOUS_FULL, "committed as set: synced, never refused");
        conn.execute_batch("COMMIT").unwrap();
    }

    #[test]
    fn a_setting_not_set_back_leaves_the_writes_answer_as_it_was() {
        let mut conn = Connection::open_in_memory().unwrap();
        conn.pragma_update(None, "synchronous", SYNCHRONOUS_FULL).unwrap();
        // A write that leaves a transaction open: the setting cannot be set back after it.
        let answered = with_synchronous(&mut conn, Commit::Unsynced, SYNCHRONOUS_FULL, |conn| {
            conn.execute_batch("BEGIN").map_err(unavailable)?;
            Ok(7)
        });
        assert_eq!(answered.unwrap(), 7);
        assert_eq!(synchronous(&conn), SYNCHRONOUS_NORMAL, "not set back inside the transaction");
        conn.execute_batch("COMMIT").unwrap();
        with_synchronous(&mut conn, Commit::Unsynced, SYNCHRONOUS_FULL, |_| Ok(())).unwrap();
        assert_eq!(synchronous(&conn), SYNCHRONOUS_FULL, "made good by the next claim");
    }
}
