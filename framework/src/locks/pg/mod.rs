//! PostgreSQL locks, selected by `postgres://user@host[:port][,host2...]/database[?...]` (or
//! `postgresql://`): the store's URL syntax (TLS, `password_file`, several hosts, ...) plus
//! `lease=<duration>` (default 10 s), so a site running PostgreSQL needs no ZooKeeper.
//!
//! Each lock service (process) is a worker: one row of `autocomp_lock_workers` with a
//! `beat` counter it renews every tenth of its lease while it holds a lock or a claim
//! naming its liveness record, every fifth while it holds nothing (`lease`), and not at all
//! once it has held nothing for a lease: dormant, it is renewed once before a lock it took
//! is handed out or a claim naming it is written (`holds`). A lock is one
//! row of `autocomp_locks` (`path` primary key, the worker, a claim number unique to the
//! `try_lock` that took it, the holder's JSON as stored). Try-lock is one `INSERT ... ON
//! CONFLICT DO NOTHING`; a busy path's row is read to tell busy from foreign (a holder that
//! is not a record we write) and to watch its worker's beat: a worker seen with the same
//! beat for its whole lease, on this process's monotonic clock, is taken over by deleting
//! its row if the beat is still that value, which deletes every lock it held (foreign key,
//! `ON DELETE CASCADE`). Waiting polls until the deadline. Release deletes the row of that
//! very claim. `close` deletes our worker row and so every lock still held. `try_lock_many`
//! and `release_many` are one statement each, however many paths (`many`).
//!
//! A service watches only the workers whose locks it found busy: every third of its lease it
//! reads just their rows, with which of the paths it wants each still holds, and forgets a
//! worker once it holds none of them. A service that met no busy lock reads no other worker's
//! row, so the cost of watching grows with contention, not with the number of workers.
//! `held` (what `autocomp locks` shows) looks at the beats of every holder it lists.
//!
//! Liveness never uses the database's clock (see `lease` for the rule and why it is safe):
//! with no successful renewal for 0.3 of its lease a holder is `Suspended`, at 0.5 `Lost`;
//! a taker acts after a full lease of its own observation.
//!
//! Every statement is its own transaction, unprepared, in one round trip, with no session
//! state (no advisory locks, LISTEN or temporary tables): it works behind a PgBouncer in
//! transaction mode. The renewal has a connection of its own, never queued behind lock
//! operations.
//!
//! Liveness: a process's record is `pg:<worker id>`, its worker row, made durable at connect
//! (a plain INSERT, acknowledged as `synchronous_commit` says: the doctor flags `off` and
//! `local`); judging it costs a read, and a takeover once it is proven dead (`liveness`). No
//! write per claim; `held` lists lock rows only, never worker rows.
//!
//! The rooms, each using only the ones before it: `url` (the URL and `lease=`), `sql` (the
//! tables and statements), `holds` (what is held on the lease, and its dormancy), `lease`
//! (the lease rule on our clock, and whom we watch), `shared`
//! (the pools, the statements as sent, renewing and watching the others), `liveness` (judging
//! a worker's liveness record), `many` (many locks in one statement), `tables` (made on first
//! use, and what the doctor says). This file holds the lock service itself.

mod holds;
mod judged;
mod lease;
mod liveness;
mod many;
mod shared;
mod sql;
mod tables;
mod url;

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use futures_util::future::join_all;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_postgres::types::Type;
use tracing::{info, warn};

use super::{
    HeldLock, Liveness, LivenessHold, Lock, LockError, LockHolder, LockInspection, LockPath, LockService, SessionState,
};
use holds::Hold;
use lease::{LOST_GRACE_SHARE, Lease};
use shared::{HolderRow, Met, Shared, foreign_reason};
pub use url::{DEFAULT_LEASE, PgLocksUrl};

/// The first pause of a waiting `try_lock`, doubled up to `MAX_WAIT_PAUSE`.
const FIRST_WAIT_PAUSE: Duration = Duration::from_millis(20);
const MAX_WAIT_PAUSE: Duration = Duration::from_millis(100);
/// How long `close` waits for the server to delete our row.
const CLOSE_WAIT: Duration = Duration::from_secs(3);
/// The place of the lease's own watch in `PgLocks::tasks`: after the renewal and the watch of
/// the others.
const LEASE_WATCH: usize = 2;

/// The PostgreSQL lock service: one worker (lease) per process.
pub struct PgLocks {
    shared: Arc<Shared>,
    /// Renewal, watch of the others, and the lease's own watch: stopped at close (the first
    /// two also when the service is dropped, so its lease runs out).
    tasks: Mutex<Vec<JoinHandle<()>>>,
    next_claim: AtomicI64,
}

impl PgLocks {
    /// Connects, makes the lock tables if they do not exist, and registers this process's
    /// worker. An unreachable server is `Unavailable`; refused credentials, a missing
    /// database or tables this user may not make are `Invalid`.
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        let shown = autocomp_toolkit::display_url(url);
        let parsed = PgLocksUrl::parse(url)?;
        let options = &parsed.options;
        let pool_of = |size| {
            autocomp_store::postgres::connection_pool(options, size).map_err(|e| LockError::Unavailable(e.to_string()))
        };
        let (pool, beat_pool) = (pool_of(options.pool_size)?, pool_of(1)?);
        let client = tables::connect(&pool, &parsed, &shown).await?;
        tables::ensure(&client, &parsed).await?;
        // The renewal's connection is opened before the lease starts, not by its first
        // renewal: on a loaded server an opening took up to 2.5 s (2,000 workers starting),
        // and a fifth's wait plus that would use up the lease of a worker holding nothing.
        let beat_connection = beat_pool.get().await.map_err(|e| {
            LockError::Unavailable(format!(
                "PostgreSQL lock service at {}: opening the lease renewal's connection failed: {}",
                options.target,
                shared::describe_pool_error(&e)
            ))
        })?;
        let worker = new_worker_id();
        let lease_ms = i64::try_from(parsed.lease.as_millis()).expect("at most 10 minutes");
        let sent = Instant::now();
        let registered = client.query_typed(sql::REGISTER, &[(&worker, Type::TEXT), (&lease_ms, Type::INT8)]).await;
        registered.map_err(|e| {
            let message = autocomp_store::postgres::describe_error(&e);
            LockError::Unavailable(format!(
                "PostgreSQL lock service at {}: registering failed: {message}",
                options.target
            ))
        })?;
        drop(client);
        info!(worker, lease = ?parsed.lease, "PostgreSQL lock service at {}", options.target);
        let shared = Arc::new(Shared {
            pool,
            beat_pool,
            lease: Lease::new(worker, parsed.lease, options.target.clone(), sent),
            user: options.user.clone(),
            observations: Default::default(),
            judged: Default::default(),
            closed: AtomicBool::new(false),
        });
        let tasks = vec![
            tokio::spawn({
                let shared = Arc::clone(&shared);
                async move { shared.renew(beat_connection).await }
            }),
            tokio::spawn({
                let shared = Arc::clone(&shared);
                async move { shared.watch_others().await }
            }),
            tokio::spawn({
                let shared = Arc::clone(&shared);
                async move { shared.lease.watch().await }
            }),
        ];
        Ok(Self { shared, tasks: Mutex::new(tasks), next_claim: AtomicI64::new(1) })
    }

    /// What `autocomp doctor` says of the service a URL names (changes nothing).
    pub async fn inspect(url: &str) -> Result<LockInspection, LockError> {
        tables::inspect(url).await
    }

    /// This process's worker id (its row in `autocomp_lock_workers`).
    pub fn worker_id(&self) -> &str {
        &self.shared.lease.worker
    }

    /// One try: the path is ours (taken now, or by an earlier send of this very claim, whose
    /// answer was lost), busy, or free again (released meanwhile, or its holder taken over
    /// because we have seen its beat unchanged for its whole lease).
    async fn try_once(&self, relative: &str, claim: i64, record: &str) -> Result<TryOutcome, LockError> {
        let shared = &self.shared;
        let me = &shared.lease.worker;
        let take = [
            (&relative as _, Type::TEXT),
            (me as _, Type::TEXT),
            (&claim as _, Type::INT8),
            (&record as _, Type::TEXT),
        ];
        if !shared.run("take a lock", sql::TAKE, &take).await?.is_empty() {
            shared.took(relative);
            return Ok(TryOutcome::Taken(shared.keep_taken(&[(relative.to_owned(), claim)]).await?));
        }
        let rows = shared.run("read a lock's holder", sql::HOLDER_OF, &[(&relative, Type::TEXT)]).await?;
        let answered = Instant::now();
        let Some(row) = rows.first() else { return Ok(TryOutcome::ReleasedMeanwhile) };
        let row = HolderRow::of(row);
        match shared.meet_holder(relative, claim, row, answered)? {
            Met::Ours => Ok(TryOutcome::Taken(shared.keep_taken(&[(relative.to_owned(), claim)]).await?)),
            Met::Busy => Ok(TryOutcome::Busy),
            Met::Stalled { worker, beat, lease } if shared.take_over(&worker, beat, lease).await? => {
                Ok(TryOutcome::ReleasedMeanwhile)
            }
            Met::Stalled { .. } => Ok(TryOutcome::Busy),
        }
    }

    /// Stops renewing and watching the others; with `lease_watch_too` (closing) also the
    /// lease's own watch, which otherwise goes on judging the locks still out there.
    fn stop_tasks(&self, lease_watch_too: bool) {
        let tasks = self.tasks.lock().expect("never poisoned");
        for (n, task) in tasks.iter().enumerate() {
            if n < LEASE_WATCH || lease_watch_too {
                task.abort();
            }
        }
    }
}

enum TryOutcome {
    /// With the hold the lock keeps on the lease.
    Taken(Hold),
    Busy,
    /// Free now (released, or its stalled holder taken over): try again at once.
    ReleasedMeanwhile,
}

impl Drop for PgLocks {
    /// Dropped without `close`: no more renewals, so the lease (and every lock) runs out.
    fn drop(&mut self) {
        self.stop_tasks(false);
    }
}

/// Unique among every worker there ever was: the pid, the time and a random number.
fn new_worker_id() -> String {
    use std::hash::BuildHasher;
    static MADE: AtomicI64 = AtomicI64::new(0);
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let random = std::collections::hash_map::RandomState::new().hash_one((MADE.fetch_add(1, Ordering::Relaxed), now));
    format!("{}-{:x}-{random:016x}", std::process::id(), now.as_micros())
}

#[async_trait]
impl LockService for PgLocks {
    async fn try_lock(
        &self,
        path: &LockPath,
        holder: &LockHolder,
        wait: Duration,
    ) -> Result<Option<Box<dyn Lock>>, LockError> {
        let deadline = Instant::now() + wait;
        let relative = path.relative();
        let record = holder.record();
        let claim = self.next_claim.fetch_add(1, Ordering::Relaxed);
        let mut pause = FIRST_WAIT_PAUSE;
        // A path freed by this very try (its stalled holder taken over) is tried once more
        // whatever the wait, so a try without waiting takes what it freed.
        let mut freed_by_us = false;
        loop {
            self.shared.usable()?;
            let retry_at_once = match self.try_once(&relative, claim, &record).await? {
                TryOutcome::Taken(hold) => {
                    return Ok(Some(Box::new(PgLock::new(path.clone(), relative, claim, &self.shared, hold))));
                }
                TryOutcome::Busy => false,
                TryOutcome::ReleasedMeanwhile => true,
            };
            if retry_at_once && !freed_by_us {
                freed_by_us = true;
                continue;
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            if !retry_at_once {
                tokio::time::sleep(pause.min(deadline - now)).await;
                pause = (pause * 2).min(MAX_WAIT_PAUSE);
            }
        }
    }

    /// One read of the path's row and its holder's beat: held while the row is there and its
    /// holder's beat has not been seen unchanged for the holder's whole lease (on this
    /// process's clock, as a try judges it); free when there is no row, or when the holder
    /// is stalled (the deferring watcher then looks and tries, and its try takes the stalled
    /// holder over). The holder is watched from here on, as a try that found it busy does.
    /// A row no lock service wrote: `None`, so the try reports it.
    async fn is_held(&self, path: &LockPath) -> Result<Option<bool>, LockError> {
        let shared = &self.shared;
        shared.usable()?;
        let relative = path.relative();
        let rows = shared.run("read a lock's holder", sql::HOLDER_OF, &[(&relative, Type::TEXT)]).await?;
        let answered = Instant::now();
        let Some(row) = rows.first() else { return Ok(Some(false)) };
        let row = HolderRow::of(row);
        // No claim of ours is 0 (they start at 1): a row of ours reads busy, as a try's would.
        Ok(match shared.meet_holder(&relative, 0, row, answered) {
            Ok(Met::Ours | Met::Busy) => Some(true),
            Ok(Met::Stalled { .. }) => Some(false),
            Err(LockError::Foreign { .. }) => None,
            Err(other) => return Err(other),
        })
    }

    /// Many paths in one statement (and one more only for a path freed meanwhile: released,
    /// or its holder taken over now); one path as `try_lock` without waiting.
    async fn try_lock_many(
        &self,
        paths: &[LockPath],
        holder: &LockHolder,
    ) -> Result<Vec<Option<Box<dyn Lock>>>, LockError> {
        // One path (a trickle's round) as a single try: the plain INSERT is planned in about
        // half the time of the many-path statement, sent unprepared each time (0.5 ms a
        // stage in the trickle bench).
        if let [path] = paths {
            return Ok(vec![self.try_lock(path, holder, Duration::ZERO).await?]);
        }
        self.shared.usable()?;
        let relative: Vec<String> = paths.iter().map(LockPath::relative).collect();
        let record = holder.record();
        let count = i64::try_from(paths.len()).expect("fewer paths than i64::MAX");
        let first_claim = self.next_claim.fetch_add(count, Ordering::Relaxed);
        let taken = self.shared.take_many(&relative, first_claim, &record).await?;
        let claims = many::taken_claims(&relative, first_claim, &taken);
        if claims.is_empty() {
            return Ok(paths.iter().map(|_| None).collect());
        }
        // Kept only on an awake lease: a dormant one is renewed first.
        let hold = self.shared.keep_taken(&claims).await?;
        let answers = paths.iter().zip(relative).zip(taken).enumerate().map(|(i, ((path, relative), taken))| {
            taken.then(|| {
                let claim = first_claim + i as i64;
                Box::new(PgLock::new(path.clone(), relative, claim, &self.shared, hold.again())) as _
            })
        });
        Ok(answers.collect())
    }

    /// This service's own locks in one statement; any other lock by its own `release`.
    async fn release_many(&self, locks: Vec<Box<dyn Lock>>) -> Result<(), LockError> {
        let shared = &self.shared;
        let (ours, others): (Vec<_>, Vec<_>) =
            locks.into_iter().partition(|lock| pg_lock(lock.as_ref()).is_some_and(|l| Arc::ptr_eq(&l.shared, shared)));
        let claims: Vec<(String, i64)> =
            ours.iter().filter_map(|lock| pg_lock(lock.as_ref())).map(|l| (l.relative.clone(), l.claim)).collect();
        let (released, others) =
            tokio::join!(shared.release_claims(&claims), join_all(others.into_iter().map(|lock| lock.release())));
        released.and(others.into_iter().collect())
    }

    async fn held(&self) -> Result<Vec<HeldLock>, LockError> {
        let shared = &self.shared;
        shared.usable()?;
        let rows = shared.run("list the locks", sql::HELD, &[]).await?;
        // A look at who holds what is also a look at whose lease ran out.
        let me = &shared.lease.worker;
        let mut holders: Vec<(String, i64, Duration)> = rows
            .iter()
            .filter_map(|row| {
                let (worker, beat, lease_ms): (String, Option<i64>, Option<i64>) = (row.get(2), row.get(3), row.get(4));
                let lease = Duration::from_millis(lease_ms?.max(0) as u64);
                (worker != *me).then_some((worker, beat?, lease))
            })
            .collect();
        holders.sort();
        holders.dedup();
        let taken_over = shared.observe_holders(holders).await?;
        let mut held: Vec<HeldLock> = rows
            .iter()
            .filter(|row| !taken_over.contains(&row.get::<_, String>(2)))
            .map(|row| {
                let (path, holder): (String, String) = (row.get(0), row.get(1));
                HeldLock {
                    path,
                    holder: LockHolder::from_record(holder.as_bytes()).ok(),
                    foreign: foreign_reason(&holder),
                }
            })
            .collect();
        held.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(held)
    }

    fn session(&self) -> watch::Receiver<SessionState> {
        self.shared.lease.subscribe()
    }

    /// Lost at half the lease after the last renewal, no taker before a full lease: cancelled
    /// work gets a fifth of the lease, leaving the rest as margin.
    fn lost_session_grace(&self) -> Option<Duration> {
        Some(self.shared.lease.ttl.mul_f64(LOST_GRACE_SHARE))
    }

    fn keeps_liveness(&self) -> bool {
        true
    }

    /// A claim naming our record is held on the lease as a lock row is: renewed every tenth
    /// (and a dormant lease renewed before the claim is written).
    async fn hold_liveness(&self) -> Result<Option<LivenessHold>, LockError> {
        Ok(Some(LivenessHold::new(self.shared.hold().await?)))
    }

    /// `pg:<worker id>`: this process's row, renewed while it lives.
    fn liveness(&self) -> Option<String> {
        let shared = &self.shared;
        let usable = !shared.closed.load(Ordering::Relaxed) && !shared.lease.is_lost();
        usable.then(|| liveness::record_of(&shared.lease.worker))
    }

    /// Its row read: gone is dead, a new beat alive, a beat unchanged for its whole lease on
    /// our clock dead (taken over), anything else unproven; see `liveness`.
    async fn judge_liveness(&self, record: &str) -> Result<Liveness, LockError> {
        self.shared.judge_liveness(record).await
    }

    async fn close(&self) {
        let shared = &self.shared;
        if shared.closed.swap(true, Ordering::Relaxed) {
            return;
        }
        self.stop_tasks(true);
        let worker = &shared.lease.worker;
        let deleted = tokio::time::timeout(CLOSE_WAIT, shared.run("close", sql::CLOSE, &[(worker, Type::TEXT)])).await;
        match deleted {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => warn!(worker, "cannot delete the lock worker at close: {e}; its locks go with its lease"),
            Err(_) => warn!(
                worker,
                "cannot delete the lock worker at close within {CLOSE_WAIT:?}; its locks go with its lease"
            ),
        }
        shared.lease.end();
    }
}

struct PgLock {
    path: LockPath,
    relative: String,
    claim: i64,
    shared: Arc<Shared>,
    /// Held on the lease while the lock lives: renewed every tenth meanwhile.
    _hold: Hold,
}

impl PgLock {
    fn new(path: LockPath, relative: String, claim: i64, shared: &Arc<Shared>, _hold: Hold) -> Self {
        PgLock { path, relative, claim, shared: Arc::clone(shared), _hold }
    }
}

#[async_trait]
impl Lock for PgLock {
    fn path(&self) -> &LockPath {
        &self.path
    }

    /// Our row, of this very claim, is there, and the lease is not lost.
    async fn still_held(&self) -> Result<bool, LockError> {
        let shared = &self.shared;
        if shared.lease.is_lost() || shared.closed.load(Ordering::Relaxed) {
            return Ok(false);
        }
        let worker = &shared.lease.worker;
        let key = [(&self.relative as _, Type::TEXT), (worker as _, Type::TEXT), (&self.claim as _, Type::INT8)];
        match shared.run("check a lock", sql::STILL_HELD, &key).await {
            Ok(rows) => Ok(!rows.is_empty() && !shared.lease.is_lost()),
            Err(_) if shared.lease.is_lost() => Ok(false),
            Err(e) => Err(e),
        }
    }

    async fn release(self: Box<Self>) -> Result<(), LockError> {
        let shared = &self.shared;
        if shared.closed.load(Ordering::Relaxed) {
            return Ok(()); // closing deleted it
        }
        let worker = &shared.lease.worker;
        let key = [(&self.relative as _, Type::TEXT), (worker as _, Type::TEXT), (&self.claim as _, Type::INT8)];
        match shared.run("release a lock", sql::RELEASE, &key).await {
            Ok(_) => Ok(()),
            Err(_) if shared.lease.is_lost() => Ok(()), // gone with the lease
            Err(e) => Err(e),
        }
    }

    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }
}

/// The lock as one of PostgreSQL's, if it is one.
fn pg_lock(lock: &dyn Lock) -> Option<&PgLock> {
    lock.as_any().and_then(|any| any.downcast_ref::<PgLock>())
}
