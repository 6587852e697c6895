//! What a PostgreSQL lock service and its locks share: the connection pools, the lease, and
//! the statements as sent (each one statement, its own transaction, retried through
//! connection trouble while the lease lasts), including the renewal and the watch for
//! workers that stopped renewing.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use autocomp_model::InvalidInput;
use deadpool_postgres::{Object, Pool, PoolError};
use tokio::time::Instant;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{ToSql, Type};
use tracing::{debug, warn};

use super::lease::{Lease, Observations, RENEW_SHARE};
use super::sql;
use crate::locks::LockError;

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
    pub closed: AtomicBool,
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
            let attempt = tokio::time::timeout(self.lease.ttl / 4, send(&self.pool, statement, params));
            let failure = match attempt.await {
                Ok(Ok(rows)) => return Ok(rows),
                Ok(Err(failure)) => failure,
                Err(_) => Failure::Connection(format!("no answer within {:?}", self.lease.ttl / 4)),
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

    /// Renews the lease every tenth of it until it is lost or the service closed; a renewal
    /// that finds the worker row gone (taken over) loses the lease at once.
    pub async fn renew(&self) {
        let every = self.lease.ttl.mul_f64(RENEW_SHARE);
        let mut connection: Option<Object> = None;
        let mut next = Instant::now() + every;
        loop {
            tokio::time::sleep_until(next).await;
            if self.lease.is_lost() || self.closed.load(Ordering::Relaxed) {
                return;
            }
            let sent = Instant::now();
            next = sent + every;
            let attempt = renew_once(&self.beat_pool, &mut connection, &self.lease.worker);
            let outcome = tokio::time::timeout(self.lease.ttl / 4, attempt).await;
            let answered = matches!(outcome, Ok(Ok(_)));
            match outcome {
                Ok(Ok(true)) => self.lease.renewed(sent),
                Ok(Ok(false)) => {
                    return self.lease.lose(
                        "its worker row is gone: another process took its locks over after seeing no renewal for a \
                         lease (or someone deleted the row)",
                    );
                }
                Ok(Err(why)) => debug!(worker = %self.lease.worker, "lock lease renewal failed: {why}"),
                Err(_) => debug!(worker = %self.lease.worker, "lock lease renewal not answered in time"),
            }
            if !answered {
                // A connection that failed or hangs is not reused: the next renewal opens another.
                if let Some(broken) = connection.take() {
                    drop(Object::take(broken));
                }
            }
        }
    }

    /// Watches the other workers every third of our lease, taking over those seen stalled.
    pub async fn watch_others(&self) {
        let every = self.lease.ttl / 3;
        loop {
            tokio::time::sleep(every).await;
            if self.lease.is_lost() || self.closed.load(Ordering::Relaxed) {
                return;
            }
            if let Err(e) = self.take_over_stalled().await {
                debug!("watching the other lock workers failed: {e}");
            }
        }
    }

    /// Reads every worker's beat and takes over each whose beat we have seen unchanged for its
    /// whole lease.
    pub async fn take_over_stalled(&self) -> Result<(), LockError> {
        let rows = self.run("read the workers", sql::WORKERS, &[]).await?;
        let answered = Instant::now();
        let workers: Vec<(String, i64, i64)> = rows.iter().map(|r| (r.get(0), r.get(1), r.get(2))).collect();
        let stalled: Vec<(String, i64, Duration)> = {
            let mut seen = self.observations.lock().expect("never poisoned");
            seen.keep_only(workers.iter().map(|(id, _, _)| id.as_str()));
            workers
                .into_iter()
                .filter(|(id, _, _)| *id != self.lease.worker)
                .filter_map(|(id, beat, lease_ms)| {
                    let lease = Duration::from_millis(lease_ms.max(0) as u64);
                    let since = seen.saw(&id, beat, answered);
                    (since.elapsed() >= lease).then_some((id, beat, lease))
                })
                .collect()
        };
        for (worker, beat, lease) in stalled {
            self.take_over(&worker, beat, lease).await?;
        }
        Ok(())
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

/// One try of a statement on a pooled connection; a connection that failed is discarded.
async fn send(
    pool: &Pool,
    statement: &str,
    params: &[(&(dyn ToSql + Sync), Type)],
) -> Result<Vec<tokio_postgres::Row>, Failure> {
    let client = pool.get().await.map_err(|e| Failure::Connection(describe_pool_error(&e)))?;
    // Unprepared, in one round trip: nothing outlives the statement's own transaction.
    match client.query_typed(statement, params).await {
        Ok(rows) => Ok(rows),
        Err(e) if is_connection_trouble(&e) => {
            drop(Object::take(client));
            Err(Failure::Connection(autocomp_store::postgres::describe_error(&e)))
        }
        Err(e) => Err(Failure::Refused(e)),
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
