//! What a PostgreSQL lock service and its locks share: the connection pools, the lease, and
//! the statements as sent (each one statement, its own transaction, retried through
//! connection trouble while the lease lasts), including the renewal and the watch of the
//! workers holding locks we found busy, for those that stopped renewing.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use autocomp_model::InvalidInput;
use deadpool_postgres::{Object, Pool, PoolError};
use tokio::time::Instant;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{ToSql, Type};
use tracing::{debug, warn};

use super::holds::Hold;
use super::lease::{DORMANT_AFTER_SHARE, Lease, Observations, next_renewal, renewal_limit};
use super::sql;
use crate::locks::LockError;

/// Why a renewal that found no worker row to renew loses the lease.
const ROW_GONE: &str = "its worker row is gone: another process took its locks over after seeing no renewal for a \
                        lease (or someone deleted the row)";

/// Pause between tries of a statement after connection trouble.
const RETRY_PAUSE: Duration = Duration::from_millis(100);

pub struct Shared {
    /// Lock operations and the watch of other workers.
    pub pool: Pool,
    /// The renewal's own connection: never queued behind lock operations.
    pub beat_pool: Pool,
    pub lease: Lease,
    /// The user PostgreSQL was asked to connect as, for messages.
    pub user: String,
    pub observations: Mutex<Observations>,
    /// The beats of the workers whose liveness records we were asked to judge (`liveness`).
    pub judged: Mutex<super::judged::Judged>,
    pub closed: AtomicBool,
}

/// A lock row as read with its worker's row (`HOLDER_OF`, `TAKE_MANY`).
pub struct HolderRow {
    pub worker: String,
    pub claim: i64,
    /// The holder's record as stored.
    pub holder: String,
    /// The worker's beat and lease; `None` if its row is gone (only if someone dropped the
    /// foreign key).
    pub beat: Option<i64>,
    pub lease_ms: Option<i64>,
}

impl HolderRow {
    /// A row of `HOLDER_OF` (worker, claim, holder, beat, lease).
    pub fn of(row: &tokio_postgres::Row) -> Self {
        HolderRow { worker: row.get(0), claim: row.get(1), holder: row.get(2), beat: row.get(3), lease_ms: row.get(4) }
    }
}

/// What a busy path's row says, as [`Shared::meet_holder`] judged it.
pub enum Met {
    /// Ours, of this very claim: taken by an earlier send whose answer was lost.
    Ours,
    /// Held by someone else (another task of ours included).
    Busy,
    /// Held by a worker whose beat we have seen unchanged for its whole lease.
    Stalled { worker: String, beat: i64, lease: Duration },
}

/// Why a stored holder is not one a lock service wrote, if it is not.
pub fn foreign_reason(holder: &str) -> Option<String> {
    match crate::locks::LockHolder::from_record(holder.as_bytes()) {
        Ok(_) => None,
        Err(e) => Some(format!("holds no holder record autocomp writes ({e})")),
    }
}

/// Why one try of a statement failed.
enum Failure {
    /// No connection, or it broke: the statement may be tried again.
    Connection(String),
    /// The server's answer (a constraint, a privilege, a missing table).
    Refused(tokio_postgres::Error),
}

impl Shared {
    /// `Unavailable` unless the service is open and its lease held.
    pub fn usable(&self) -> Result<(), LockError> {
        if self.closed.load(Ordering::Relaxed) {
            return Err(LockError::Unavailable(format!(
                "the PostgreSQL lock service ({}) is closed",
                self.lease.target
            )));
        }
        if self.lease.is_lost() {
            return Err(self.lost());
        }
        Ok(())
    }

    pub fn lost(&self) -> LockError {
        LockError::Unavailable(format!(
            "the lock lease {} at {} was lost: every lock it held may be taken by another host",
            self.lease.worker, self.lease.target
        ))
    }

    /// Sends one statement, again after connection trouble (every statement here is safe to
    /// repeat: a take is recognised by its claim, the rest are conditional deletes and reads)
    /// until half a lease has passed: by then the lease itself is lost.
    pub async fn run(
        &self,
        what: &str,
        statement: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<Vec<tokio_postgres::Row>, LockError> {
        let give_up = Instant::now() + self.lease.ttl / 2;
        loop {
            let failure = match send(&self.pool, statement, params, self.lease.ttl / 4).await {
                Ok(rows) => return Ok(rows),
                Err(failure) => failure,
            };
            match failure {
                Failure::Refused(e) => return Err(self.refused(what, &e)),
                Failure::Connection(why) if Instant::now() + RETRY_PAUSE >= give_up || self.lease.is_lost() => {
                    return Err(LockError::Unavailable(format!(
                        "PostgreSQL lock service at {}: {what} failed: {why}",
                        self.lease.target
                    )));
                }
                Failure::Connection(why) => {
                    debug!(what, "PostgreSQL lock statement failed, trying again: {why}");
                    tokio::time::sleep(RETRY_PAUSE).await;
                }
            }
        }
    }

    fn refused(&self, what: &str, e: &tokio_postgres::Error) -> LockError {
        let message = autocomp_store::postgres::describe_error(e);
        if e.code() == Some(&SqlState::FOREIGN_KEY_VIOLATION) {
            // Only a lock row names a worker: ours is gone, taken over.
            self.lease.lose(&format!("{what}: its worker row is gone (taken over after a lease without renewal)"));
            return self.lost();
        }
        if e.code() == Some(&SqlState::INSUFFICIENT_PRIVILEGE) {
            let reason = format!(
                "{what}: PostgreSQL user {} may not use the lock tables: {message}; GRANT SELECT, INSERT, UPDATE, \
                 DELETE ON autocomp_lock_workers, autocomp_locks TO it",
                self.user
            );
            return InvalidInput::new("locks url", self.lease.target.as_str(), reason).into();
        }
        LockError::Unavailable(format!("PostgreSQL lock service at {}: {what} failed: {message}", self.lease.target))
    }

    /// Renews the lease (every tenth of it while anything is held on it or after a failed
    /// renewal, every fifth while nothing is: `lease::next_renewal`; with nothing held for a
    /// whole lease, not at all until [`Shared::hold`] wakes it) until it is lost or the
    /// service closed; a renewal that finds the worker row gone (taken over) loses the lease
    /// at once. `connection` is the renewal's own, opened before the lease began.
    pub async fn renew(&self, connection: Object) {
        let (ttl, holds) = (self.lease.ttl, &self.lease.holds);
        let mut connection = Some(connection);
        // Counted from the registration's send, as the lease is.
        let (mut sent, mut failed) = (self.lease.last_renewed(), false);
        loop {
            let busy = failed || holds.any();
            tokio::select! {
                _ = tokio::time::sleep_until(next_renewal(sent, ttl, busy)) => {}
                // Something is held now, or the lease woke: the next renewal may be due sooner.
                _ = holds.began() => {
                    sent = sent.max(self.lease.last_renewed());
                    continue;
                }
            }
            if self.lease.is_lost() || self.closed.load(Ordering::Relaxed) {
                return;
            }
            if !failed && holds.doze_if_idle(ttl.mul_f64(DORMANT_AFTER_SHARE)) {
                debug!(worker = %self.lease.worker, "nothing held for a lease: the lease goes dormant");
                // Until a hold wakes it (renewed by `wake`, counted from that renewal's send).
                while holds.is_dormant() {
                    holds.began().await;
                }
                sent = self.lease.last_renewed();
                continue;
            }
            sent = Instant::now();
            let attempt = renew_once(&self.beat_pool, &mut connection, &self.lease.worker);
            // Busy again if something was taken while it slept (its wake-up is still pending).
            let outcome = tokio::time::timeout(renewal_limit(ttl, busy || holds.any()), attempt).await;
            failed = !matches!(outcome, Ok(Ok(_)));
            match outcome {
                Ok(Ok(true)) => self.lease.renewed(sent),
                Ok(Ok(false)) => return self.lease.lose(ROW_GONE),
                Ok(Err(why)) => debug!(worker = %self.lease.worker, "lock lease renewal failed: {why}"),
                Err(_) => debug!(worker = %self.lease.worker, "lock lease renewal not answered in time"),
            }
            if failed {
                // A connection that failed or hangs is not reused: the next renewal opens another.
                if let Some(broken) = connection.take() {
                    drop(Object::take(broken));
                }
            }
        }
    }

    /// A hold on the lease, for a claim about to be written naming this worker: a dormant
    /// lease is renewed first (one statement; its row found gone, the lease is lost and
    /// nothing is held).
    pub async fn hold(&self) -> Result<Hold, LockError> {
        // A lease woken dozes off again only after holding nothing for a whole lease: the
        // second look finds it awake.
        for _ in 0..3 {
            self.usable()?;
            if let Some(hold) = self.lease.holds.try_hold() {
                return Ok(hold);
            }
            if let Err(e) = self.wake().await {
                // Another task's wake may have answered meanwhile; a service closed or a lease
                // lost meanwhile hands out nothing, as at the top of the loop.
                return self.lease.holds.try_hold().filter(|_| self.usable().is_ok()).ok_or(e);
            }
        }
        Err(LockError::Unavailable(format!(
            "the lock lease {} at {} went dormant again at once after each renewal",
            self.lease.worker, self.lease.target
        )))
    }

    /// The hold of lock rows just taken (`claims`, path and claim number): a lease that was
    /// dormant meanwhile is renewed first, so a lock is handed out only on an awake lease.
    /// The rows were written before: takes that find a lock busy (most of a crowd's) then
    /// cost a dormant lease nothing. Safe because a taker needs a whole lease of unchanged
    /// beat: the wake moves it, or finds the row gone, and the rows with it (`ON DELETE
    /// CASCADE`); a wake that cannot answer gives them back.
    pub async fn keep_taken(&self, claims: &[(String, i64)]) -> Result<Hold, LockError> {
        match self.hold().await {
            Ok(hold) => Ok(hold),
            Err(e) => {
                if let Err(release) = self.release_claims(claims).await {
                    warn!(
                        "cannot give back {} locks taken while the lease could not be renewed: {release}",
                        claims.len()
                    );
                }
                Err(e)
            }
        }
    }

    /// Renews a dormant lease now.
    async fn wake(&self) -> Result<(), LockError> {
        let sent = Instant::now();
        let worker = &self.lease.worker;
        if self.run("renew the dormant lock lease", sql::RENEW, &[(worker, Type::TEXT)]).await?.is_empty() {
            self.lease.lose(ROW_GONE);
            return Err(self.lost());
        }
        debug!(worker = %worker, "woke the dormant lock lease");
        self.lease.woke(sent);
        Ok(())
    }

    /// Every third of our lease, reads the beats of the workers we watch (the holders of
    /// locks we found busy), taking over those seen stalled; watching nobody, it sends nothing.
    pub async fn watch_others(&self) {
        let every = self.lease.ttl / 3;
        loop {
            tokio::time::sleep(every).await;
            if self.lease.is_lost() || self.closed.load(Ordering::Relaxed) {
                return;
            }
            if let Err(e) = self.watch_once().await {
                debug!("watching the other lock workers failed: {e}");
            }
        }
    }

    /// Reads the rows of the workers we watch, and which of the paths we want each still
    /// holds: one that holds none of them any more (or whose row is gone) is forgotten, one
    /// whose beat we have seen unchanged for its whole lease is taken over.
    pub async fn watch_once(&self) -> Result<(), LockError> {
        let (workers, paths) = self.observations.lock().expect("never poisoned").watched();
        if workers.is_empty() {
            return Ok(());
        }
        let asked = [(&workers as _, Type::TEXT_ARRAY), (&paths as _, Type::TEXT_ARRAY)];
        let rows = self.run("read the watched lock workers", sql::WATCHED, &asked).await?;
        let answered = Instant::now();
        let stalled: Vec<(String, i64, Duration)> = {
            let mut seen = self.observations.lock().expect("never poisoned");
            let mut listed = std::collections::HashSet::new();
            let mut stalled = Vec::new();
            for row in &rows {
                let (id, beat, lease_ms, held): (String, i64, i64, Vec<String>) =
                    (row.get(0), row.get(1), row.get(2), row.get(3));
                listed.insert(id.clone());
                if !seen.settle(&id, &paths, Some(&held)) {
                    continue;
                }
                let lease = Duration::from_millis(lease_ms.max(0) as u64);
                if seen.saw(&id, beat, answered).elapsed() >= lease {
                    stalled.push((id, beat, lease));
                }
            }
            // Gone: closed, or taken over by someone else.
            for gone in workers.iter().filter(|w| !listed.contains(*w)) {
                seen.settle(gone, &paths, None);
            }
            stalled
        };
        self.take_over_all(stalled).await?;
        Ok(())
    }

    /// The holders `held` listed (`(worker, beat, lease)`, ours left out): their beats are
    /// observed (a look at who holds what is also a look at whose lease ran out) and each
    /// seen unchanged for its whole lease is taken over. The workers taken over.
    pub async fn observe_holders(
        &self,
        holders: Vec<(String, i64, Duration)>,
    ) -> Result<std::collections::HashSet<String>, LockError> {
        let answered = Instant::now();
        let stalled = {
            let mut seen = self.observations.lock().expect("never poisoned");
            seen.keep_only(holders.iter().map(|(id, _, _)| id.as_str()));
            holders.into_iter().filter(|(id, beat, lease)| seen.saw(id, *beat, answered).elapsed() >= *lease).collect()
        };
        self.take_over_all(stalled).await
    }

    /// Takes over each of `stalled`; those it did.
    async fn take_over_all(
        &self,
        stalled: Vec<(String, i64, Duration)>,
    ) -> Result<std::collections::HashSet<String>, LockError> {
        let mut taken = std::collections::HashSet::new();
        for (worker, beat, lease) in stalled {
            if self.take_over(&worker, beat, lease).await? {
                taken.insert(worker);
            }
        }
        Ok(taken)
    }

    /// What the row of a path we did not take says (read with the holder's beat, at
    /// `answered`): ours (this claim's, an earlier send of it), busy, or its holder stalled
    /// (seen with that beat for a full lease). A busy path's holder is watched from now on,
    /// until it lets the path go; a row no lock service wrote is `Foreign`.
    pub fn meet_holder(&self, path: &str, claim: i64, row: HolderRow, answered: Instant) -> Result<Met, LockError> {
        let HolderRow { worker, claim: row_claim, holder, beat, lease_ms } = row;
        let mut seen = self.observations.lock().expect("never poisoned");
        if worker == self.lease.worker {
            seen.unwant(path);
            return Ok(if row_claim == claim { Met::Ours } else { Met::Busy });
        }
        let foreign = match (foreign_reason(&holder), beat) {
            (Some(reason), _) => Some(reason),
            (None, None) => Some(format!("names worker {worker}, which has no row in autocomp_lock_workers")),
            (None, Some(_)) => None,
        };
        if let Some(reason) = foreign {
            return Err(LockError::Foreign {
                path: path.to_owned(),
                reason: format!("its row in autocomp_locks {reason}"),
            });
        }
        let (beat, lease) =
            (beat.unwrap_or_default(), Duration::from_millis(lease_ms.unwrap_or_default().max(0) as u64));
        seen.wants(path, &worker);
        if seen.saw(&worker, beat, answered).elapsed() >= lease {
            return Ok(Met::Stalled { worker, beat, lease });
        }
        Ok(Met::Busy)
    }

    /// `path` is ours now: no other worker is watched for it.
    pub fn took(&self, path: &str) {
        self.observations.lock().expect("never poisoned").unwant(path);
    }

    /// Takes `worker`'s locks if it still has `beat`, which we saw for at least `lease`: its
    /// row goes, and every lock it held with it. `true` if it did.
    pub async fn take_over(&self, worker: &str, beat: i64, lease: Duration) -> Result<bool, LockError> {
        let rows = self
            .run("take over a stalled worker", sql::TAKE_OVER, &[(&worker, Type::TEXT), (&beat, Type::INT8)])
            .await?;
        if rows.is_empty() {
            return Ok(false); // it renewed, or someone else took it over first
        }
        self.observations.lock().expect("never poisoned").forget(worker);
        warn!(
            taken_over = worker,
            by = %self.lease.worker,
            "took over lock worker {worker} at {}: its beat stayed {beat} for {} as this process saw it \
             (its lease); every lock it held is free",
            self.lease.target,
            humantime::format_duration(lease)
        );
        Ok(true)
    }
}

/// One try of a statement on a pooled connection, answered within `limit`; a connection that
/// failed or did not answer in time is discarded (the pool hands out the connection used last,
/// so one left with its statement in flight would take the next try too).
async fn send(
    pool: &Pool,
    statement: &str,
    params: &[(&(dyn ToSql + Sync), Type)],
    limit: Duration,
) -> Result<Vec<tokio_postgres::Row>, Failure> {
    let deadline = tokio::time::Instant::now() + limit;
    let late = || Failure::Connection(format!("no answer within {limit:?}"));
    let client = match tokio::time::timeout_at(deadline, pool.get()).await {
        Ok(got) => got.map_err(|e| Failure::Connection(describe_pool_error(&e)))?,
        Err(_) => return Err(late()),
    };
    // Unprepared, in one round trip: nothing outlives the statement's own transaction.
    match tokio::time::timeout_at(deadline, client.query_typed(statement, params)).await {
        Ok(Ok(rows)) => Ok(rows),
        Ok(Err(e)) if is_connection_trouble(&e) => {
            drop(Object::take(client));
            Err(Failure::Connection(autocomp_store::postgres::describe_error(&e)))
        }
        Ok(Err(e)) => Err(Failure::Refused(e)),
        Err(_) => {
            drop(Object::take(client));
            Err(late())
        }
    }
}

/// One renewal on the renewal's connection (opened if there is none): `true` if our row was
/// there to renew.
async fn renew_once(pool: &Pool, connection: &mut Option<Object>, worker: &str) -> Result<bool, String> {
    if connection.is_none() {
        *connection = Some(pool.get().await.map_err(|e| describe_pool_error(&e))?);
    }
    let client = connection.as_ref().expect("just set");
    let renewed = client.query_typed_opt(sql::RENEW, &[(&worker, Type::TEXT)]).await;
    renewed.map(|row| row.is_some()).map_err(|e| autocomp_store::postgres::describe_error(&e))
}

/// The connection broke, or the server is going away or not taking connections: another try
/// (on another connection) may work.
fn is_connection_trouble(e: &tokio_postgres::Error) -> bool {
    let Some(code) = e.code() else { return true };
    code.code().starts_with("08")
        || [
            SqlState::ADMIN_SHUTDOWN,
            SqlState::CRASH_SHUTDOWN,
            SqlState::CANNOT_CONNECT_NOW,
            SqlState::TOO_MANY_CONNECTIONS,
            SqlState::T_R_SERIALIZATION_FAILURE,
            SqlState::T_R_DEADLOCK_DETECTED,
            SqlState::READ_ONLY_SQL_TRANSACTION,
        ]
        .contains(code)
}

pub fn describe_pool_error(e: &PoolError) -> String {
    match e {
        PoolError::Backend(e) => autocomp_store::postgres::describe_error(e),
        other => other.to_string(),
    }
}
