//! The PostgreSQL lock service on its own (the contract every backend keeps is
//! tests/tests/lock_contract.rs): the lease rule on real servers and processes.
//!
//! - a holder that stops renewing (SIGSTOPped) is taken over only once the taker has itself
//!   seen its beat unchanged for a full lease, and a live one never is; its liveness record is
//!   judged dead by the same rule, and that verdict takes it over (final: its locks go too);
//! - the server's clock decides nothing: with `now()` and its kin made to answer a day ahead,
//!   a live holder keeps its locks;
//! - a holder whose database goes away is `Suspended` at 0.3 of its lease and `Lost` at 0.5,
//!   on its own clock, and its locks are taken by no one before a full lease;
//! - a row no lock service wrote is `Foreign`, never busy;
//! - a worker holding nothing renews every fifth of its lease, one holding a lock or a
//!   claim naming its liveness record (a pass working a claimed batch) every tenth, one that
//!   has held nothing for a lease not at all (dormant): a take that finds the lock busy
//!   leaves it so, a lock taken or a claim is renewed for first, and a dormant worker whose
//!   row was taken over takes nothing;
//! - a service reads no other worker's row until it finds a lock busy, then only its holder's
//!   until the holder lets it go; many locks are taken in one statement and released in one;
//! - a deferring watcher reads the lock row and its holder's beat, not the store, and takes a
//!   dead holder's turn over once it has seen the beat unchanged for a lease;
//! - `autocomp doctor`'s look: tables absent, present, or not makeable by this role;
//! - a component end to end with `store` and `locks` both `postgres://`.

use std::time::{Duration, Instant};

use autocomp_e2e::{PROBED, Pipeline, finish};
use autocomp_framework::locks::{
    Liveness, LockError, LockHolder, LockPath, LockService, SessionState, inspect_locks, open_locks,
};
use autocomp_model::{ComponentName, Timestamp};
use autocomp_test_servers::postgres::{self, NamedDatabase, Options, Postgres};

use crate::lock_contract::HolderProcess;

const PROBE: &str = env!("CARGO_BIN_EXE_probe-component");
/// The holders' lease here: short, so a takeover comes soon.
const LEASE: Duration = Duration::from_secs(2);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("a runtime")
}

fn holder(agent: &str) -> LockHolder {
    LockHolder { agent: agent.into(), host: "testhost".into(), pid: 4242, since: Timestamp::now() }
}

fn poll_probe() -> LockPath {
    LockPath::Poll(ComponentName::new("probe").unwrap())
}

fn with_lease(url: &str) -> String {
    format!("{url}?lease={}s", LEASE.as_secs())
}

/// Tries to take the holder process's poll lock at once, every 50 ms, until `deadline`; when
/// it was taken, if it was.
async fn taken_before(locks: &dyn LockService, deadline: Instant) -> Option<Instant> {
    loop {
        if let Some(lock) = locks.try_lock(&poll_probe(), &holder("taker"), Duration::ZERO).await.unwrap() {
            let taken = Instant::now();
            lock.release().await.unwrap();
            return Some(taken);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn signal(pid: u32, signal: libc::c_int) {
    // SAFETY: kill has no memory effects; the pid is our live (unreaped) child.
    assert_eq!(unsafe { libc::kill(pid as i32, signal) }, 0, "kill({pid}, {signal})");
}

#[test]
fn a_stalled_holder_is_taken_over_only_after_a_full_lease_as_the_taker_saw_it() {
    let url = postgres::shared().unique_database();
    runtime().block_on(async {
        let taker = open_locks(&url).await.unwrap();
        let mut holding = tokio::task::block_in_place(|| HolderProcess::start(&with_lease(&url)));

        // Alive and renewing: watched for twice its lease, never taken.
        let watched = Instant::now() + LEASE * 2;
        assert_eq!(taken_before(taker.as_ref(), watched).await, None, "a live holder's lock was taken");

        let pid = holding.child.id();
        signal(pid, libc::SIGSTOP);
        let stopped = Instant::now();
        let taken = taken_before(taker.as_ref(), stopped + LEASE * 10).await;
        let taken = taken.expect("the stalled holder's lock is taken over").duration_since(stopped);
        println!("a SIGSTOPped holder (lease {LEASE:?}) was taken over {taken:?} after it stopped");
        // The taker counts from the first answer showing the holder's last beat, which may
        // come up to a renewal interval (a tenth of the lease) before the stop.
        assert!(
            taken + LEASE / 10 >= LEASE,
            "taken over {taken:?} after the holder stopped: less than a lease after its last renewal"
        );
        assert!(taken < LEASE * 3, "taken over only {taken:?} after the holder stopped");
        assert!(taker.held().await.unwrap().is_empty(), "every lock of the stalled holder went with it");

        // Woken, it finds its lease gone and still closes and exits cleanly.
        signal(pid, libc::SIGCONT);
        tokio::task::block_in_place(|| holding.close_and_exit());
        taker.close().await;
    });
}

#[test]
fn a_stalled_holders_liveness_record_is_dead_only_after_a_full_lease_and_the_verdict_takes_it_over() {
    let url = postgres::shared().unique_database();
    runtime().block_on(async {
        let judge = open_locks(&url).await.unwrap();
        let mut holding = tokio::task::block_in_place(|| HolderProcess::start(&with_lease(&url)));
        let record = holding.liveness.clone().expect("a PostgreSQL worker's record");
        assert!(record.starts_with("pg:"), "{record}");

        // Renewing: a first look proves nothing, a later one sees the beat move; never dead.
        assert_eq!(judge.judge_liveness(&record).await.unwrap(), Liveness::Unproven, "a first look");
        let mut verdicts = Vec::new();
        let watched = Instant::now() + LEASE * 2;
        while Instant::now() < watched {
            verdicts.push(judge.judge_liveness(&record).await.unwrap());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(!verdicts.contains(&Liveness::Dead), "a renewing holder judged dead: {verdicts:?}");
        assert!(verdicts.contains(&Liveness::Alive), "a renewing holder never seen alive: {verdicts:?}");

        let pid = holding.child.id();
        signal(pid, libc::SIGSTOP);
        let stopped = Instant::now();
        let dead = loop {
            if judge.judge_liveness(&record).await.unwrap() == Liveness::Dead {
                break stopped.elapsed();
            }
            assert!(stopped.elapsed() < LEASE * 10, "a stalled holder is still not dead");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        println!("a SIGSTOPped holder (lease {LEASE:?}) was judged dead {dead:?} after it stopped");
        // Counted from the first answer showing its last beat: up to a tenth before the stop.
        assert!(dead + LEASE / 10 >= LEASE, "judged dead {dead:?} after it stopped, within a lease");
        // The verdict took the worker over: its locks are free, and it stays dead.
        assert!(judge.held().await.unwrap().is_empty(), "a dead worker's locks outlived the verdict");
        assert_eq!(judge.judge_liveness(&record).await.unwrap(), Liveness::Dead, "dead is final");

        // Woken, it finds its row gone (its lease lost) and still closes and exits cleanly.
        signal(pid, libc::SIGCONT);
        tokio::task::block_in_place(|| holding.close_and_exit());
        assert_eq!(judge.judge_liveness(&record).await.unwrap(), Liveness::Dead);
        judge.close().await;
    });
}

#[test]
fn a_server_clock_a_day_ahead_takes_no_live_holders_lock() {
    let server = postgres::shared();
    let NamedDatabase { name: database, url } = server.unique_named_database();
    // Every clock function a statement could name unqualified now answers a day ahead.
    let ahead = ["now", "clock_timestamp", "statement_timestamp", "transaction_timestamp"]
        .map(|f| {
            format!(
                "CREATE FUNCTION public.{f}() RETURNS timestamptz LANGUAGE sql AS \
                 $$ SELECT pg_catalog.{f}() + interval '1 day' $$;"
            )
        })
        .join("\n");
    server.psql(&database, &format!("{ahead}\nALTER DATABASE \"{database}\" SET search_path = public, pg_catalog;"));
    assert_eq!(server.psql(&database, "SELECT now() > pg_catalog.now() + interval '23 hours'").trim(), "t");
    runtime().block_on(async {
        let taker = open_locks(&with_lease(&url)).await.unwrap();
        let mut holding = tokio::task::block_in_place(|| HolderProcess::start(&with_lease(&url)));
        let watched = Instant::now() + LEASE * 2;
        assert_eq!(taken_before(taker.as_ref(), watched).await, None, "a live holder's lock was taken");
        assert_eq!(taker.held().await.unwrap().len(), 2);
        tokio::task::block_in_place(|| holding.close_and_exit());
        taker.close().await;
    });
}

#[test]
fn a_holder_that_loses_its_database_is_suspended_then_lost_on_its_own_clock_before_any_takeover() {
    let server = Postgres::start();
    let url = with_lease(&server.create_database("lease"));
    runtime().block_on(async {
        let locks = open_locks(&url).await.unwrap();
        let grace = locks.lost_session_grace().expect("a lease bounds the work after a loss");
        assert_eq!(grace, LEASE / 5);
        let lock = locks.try_lock(&poll_probe(), &holder("holder"), Duration::ZERO).await.unwrap().unwrap();
        let mut session = locks.session();
        assert_eq!(*session.borrow(), SessionState::Connected);

        // Counted from the shutdown's start: the sessions end at once, the postmaster later.
        let stopped = Instant::now();
        tokio::task::block_in_place(|| server.stop_fast());
        session.wait_for(|s| *s == SessionState::Suspended).await.unwrap();
        let suspended = stopped.elapsed();
        session.wait_for(|s| *s == SessionState::Lost).await.unwrap();
        let lost = stopped.elapsed();
        println!("database stopped: suspended after {suspended:?}, lost after {lost:?} (lease {LEASE:?})");
        // The last renewal was sent at most a tenth of the lease (plus a round trip) before.
        let renewal = LEASE / 10 + Duration::from_millis(100);
        assert!(suspended + renewal >= LEASE * 3 / 10, "suspended too early: {suspended:?}");
        assert!(suspended <= LEASE * 3 / 10 + Duration::from_secs(1), "suspended late: {suspended:?}");
        assert!(lost + renewal >= LEASE / 2, "lost too early: {lost:?}");
        assert!(lost <= LEASE / 2 + Duration::from_secs(1), "lost late: {lost:?}");
        // Work cancelled at the loss is gone before anyone may take the lock.
        assert!(LEASE / 2 + grace < LEASE);
        assert!(!lock.still_held().await.unwrap(), "a lost lease holds nothing");
        match locks.try_lock(&poll_probe(), &holder("again"), Duration::ZERO).await {
            Err(LockError::Unavailable(_)) => {}
            other => panic!("a lost lease took a lock: {:?}", other.map(|l| l.is_some())),
        }

        // Back: the lost holder's row is still there; a new service takes its lock only
        // after seeing it unrenewed for a full lease.
        tokio::task::block_in_place(|| server.restart());
        let next = open_locks(&url).await.unwrap();
        let first_look = Instant::now();
        let taken = taken_before(next.as_ref(), first_look + LEASE * 10).await.expect("taken over");
        let waited = taken.duration_since(first_look);
        assert!(waited >= LEASE, "the lost holder's lock was taken {waited:?} after the first look");
        println!("the lost holder's lock was taken over {waited:?} after the next service first looked");
        lock.release().await.unwrap();
        locks.close().await;
        next.close().await;
    });
}

#[test]
fn a_lock_row_no_lock_service_wrote_is_an_alarm_not_busy() {
    let server = postgres::shared();
    let NamedDatabase { name: database, url } = server.unique_named_database();
    runtime().block_on(async {
        let locks = open_locks(&url).await.unwrap();
        // A worker that beats (a long lease) and a lock row whose holder is not a record.
        server.psql(
            &database,
            "INSERT INTO autocomp_lock_workers (id, beat, lease_ms) VALUES ('by-hand', 0, 600000);
             INSERT INTO autocomp_locks (path, worker_id, claim, holder) VALUES ('poll/probe', 'by-hand', 1, 'junk');",
        );
        match locks.try_lock(&poll_probe(), &holder("taker"), Duration::ZERO).await {
            Err(LockError::Foreign { path, reason }) => {
                assert_eq!(path, "poll/probe");
                assert!(reason.contains("autocomp_locks"), "{reason}");
            }
            other => panic!("a foreign row answered {:?}", other.map(|l| l.is_some())),
        }
        // Among many paths, it is the alarm for the whole call, and nothing is taken.
        let free = LockPath::Poll(ComponentName::new("other").unwrap());
        match locks.try_lock_many(&[free.clone(), poll_probe()], &holder("taker")).await {
            Err(LockError::Foreign { path, .. }) => assert_eq!(path, "poll/probe"),
            other => panic!("a foreign row among many answered {:?}", other.map(|l| l.len())),
        }
        let held = locks.held().await.unwrap();
        assert_eq!(held.len(), 1, "{held:?}");
        assert!(held[0].holder.is_none() && held[0].foreign.is_some(), "{held:?}");
        locks.close().await;
    });
}

/// The calls of the statements `pg_stat_statements` saw whose text contains `text` and none
/// of `but_not` (never the renewals, nor the test's own reads of the statistics), and the
/// rows they returned.
fn statements_like(server: &Postgres, database: &str, text: &str, but_not: &[&str]) -> (i64, i64) {
    let excluded: String =
        ["SET beat", "pg_stat"].iter().chain(but_not).map(|not| format!(" AND query NOT LIKE '%{not}%'")).collect();
    let counted = server.psql(
        database,
        &format!(
            "SELECT coalesce(sum(calls), 0) || ' ' || coalesce(sum(rows), 0) FROM pg_stat_statements \
             WHERE query LIKE '%{text}%'{excluded}"
        ),
    );
    let mut numbers = counted.split_whitespace().map(|n| n.parse::<i64>().expect("a count"));
    (numbers.next().expect("calls"), numbers.next().expect("rows"))
}

/// The watch of the others' beats, as `pg_stat_statements` shows it.
const WATCH: &str = "w.id = ANY";
/// `try_lock_many`'s statement: it reads the worker row of each busy path's holder only.
const TAKE_MANY: &str = "WITH asked";

/// Polls (every third of the lease, the watch's period) until the watch's calls stay the same
/// for a whole lease; that count, or `None` if they never did by `deadline`.
fn watch_calls_once_quiet(server: &Postgres, database: &str, deadline: Instant) -> Option<i64> {
    let mut before = statements_like(server, database, WATCH, &[]).0;
    let mut quiet_since = Instant::now();
    while Instant::now() < deadline {
        std::thread::sleep(LEASE / 3);
        let now = statements_like(server, database, WATCH, &[]).0;
        if now != before {
            (before, quiet_since) = (now, Instant::now());
        } else if quiet_since.elapsed() >= LEASE {
            return Some(now);
        }
    }
    None
}

#[test]
fn a_service_watches_only_the_holders_of_locks_it_found_busy_and_takes_many_locks_in_one_statement() {
    let server = Postgres::start_with(Options::default().setting("shared_preload_libraries", "pg_stat_statements"));
    let url = with_lease(&server.create_database("counted"));
    server.psql("counted", "CREATE EXTENSION pg_stat_statements");
    let batch = |n: u32| LockPath::Batch(ComponentName::new("probe").unwrap(), format!("B{n:04}").parse().unwrap());
    runtime().block_on(async {
        // Three other workers, each holding a lock; and one that takes and releases free ones.
        let mut others = Vec::new();
        for n in 0..3 {
            let service = open_locks(&url).await.unwrap();
            let lock = service.try_lock(&batch(n), &holder("other"), Duration::ZERO).await.unwrap().unwrap();
            others.push((service, lock));
        }
        let quiet = open_locks(&url).await.unwrap();
        server.psql("counted", "SELECT pg_stat_statements_reset()");
        let lock = quiet.try_lock(&batch(10), &holder("quiet"), Duration::ZERO).await.unwrap().unwrap();
        lock.release().await.unwrap();
        let many = quiet.try_lock_many(&[batch(11), batch(12)], &holder("quiet")).await.unwrap();
        quiet.release_many(many.into_iter().flatten().collect()).await.unwrap();
        // Two leases: six periods of every worker's watch.
        tokio::time::sleep(LEASE * 2).await;
        // None busy: no lock's holder read (`try_lock_many`'s statement reads the worker row
        // of a busy path's holder only), and no watch.
        assert_eq!(
            statements_like(&server, "counted", "autocomp_lock_workers", &[TAKE_MANY]),
            (0, 0),
            "a worker that met no busy lock read another worker's row"
        );
        assert_eq!(statements_like(&server, "counted", TAKE_MANY, &[]), (1, 2), "one statement, two paths");

        // Busy: its holder (only it, one row a look) is watched until it lets the lock go.
        assert!(quiet.try_lock(&batch(0), &holder("quiet"), Duration::ZERO).await.unwrap().is_none());
        let watching = Instant::now() + LEASE * 5;
        while statements_like(&server, "counted", WATCH, &[]).0 < 2 {
            assert!(Instant::now() < watching, "the holder of a busy lock is not watched");
            tokio::time::sleep(LEASE / 10).await;
        }
        let (calls, rows) = statements_like(&server, "counted", WATCH, &[]);
        assert_eq!(rows, calls, "each look read one worker's row, the holder's: {calls} looks, {rows} rows");
        let (_, lock) = others.remove(0);
        lock.release().await.unwrap();
        let settled =
            tokio::task::block_in_place(|| watch_calls_once_quiet(&server, "counted", Instant::now() + LEASE * 10));
        assert!(settled.is_some(), "the holder is still watched after it let the lock go");

        // Many paths, some busy: one statement takes the free ones, one releases them.
        server.psql("counted", "SELECT pg_stat_statements_reset()");
        let paths: Vec<LockPath> = (0..20).map(batch).collect();
        let answers = quiet.try_lock_many(&paths, &holder("quiet")).await.unwrap();
        let taken: Vec<bool> = answers.iter().map(Option::is_some).collect();
        let expected: Vec<bool> = (0..20).map(|n| n == 0 || n > 2).collect();
        assert_eq!(taken, expected, "the free paths taken, the busy ones not");
        // Meeting busy paths, it may watch their holders meanwhile: those looks aside.
        let sent = || statements_like(&server, "counted", "", &[WATCH]).0;
        assert_eq!(sent(), 1, "18 locks taken (and 2 busy ones' holders read) in one statement");
        quiet.release_many(answers.into_iter().flatten().collect()).await.unwrap();
        assert_eq!(sent(), 2, "and released in one");
        assert_eq!(quiet.held().await.unwrap().len(), 2, "only the others' locks are left");
        for (service, lock) in others {
            lock.release().await.unwrap();
            service.close().await;
        }
        quiet.close().await;
    });
}

/// The beat of worker `worker`, read in `database`.
fn beat_of(server: &Postgres, database: &str, worker: &str) -> i64 {
    let read = server.psql(database, &format!("SELECT beat FROM autocomp_lock_workers WHERE id = '{worker}'"));
    read.trim().parse::<i64>().expect("the worker's beat")
}

/// How many times `worker` renewed its lease between two reads of its beat about `window`
/// apart, and how many renewals a tenth's and a fifth's cadence would have made in the time
/// between the reads (a window stretched by a slow read counts what it really spanned).
async fn renewals_over(server: &Postgres, database: &str, worker: &str, window: Duration) -> (i64, f64, f64) {
    let (before, started) = (tokio::task::block_in_place(|| beat_of(server, database, worker)), Instant::now());
    // The window is what is measured: its renewals are counted, nothing is waited for.
    tokio::time::sleep(window).await;
    let after = tokio::task::block_in_place(|| beat_of(server, database, worker));
    let spanned = started.elapsed().as_secs_f64() / LEASE.as_secs_f64();
    (after - before, spanned * 10.0, spanned * 5.0)
}

/// The worker id a service's liveness record names.
fn worker_of(locks: &dyn LockService) -> String {
    let record = locks.liveness().expect("a PostgreSQL worker's record");
    record.strip_prefix("pg:").expect("a pg: record").to_owned()
}

#[test]
fn a_worker_renews_every_tenth_of_its_lease_while_it_holds_a_lock_or_a_claim_every_fifth_after_and_not_at_all_once_idle_for_a_lease()
 {
    let server = postgres::shared();
    let database = "renewal_cadence";
    let url = with_lease(&server.create_database(database));
    let window = LEASE * 2;
    runtime().block_on(async {
        let locks = open_locks(&url).await.unwrap();
        let worker = worker_of(locks.as_ref());
        // Between the two cadences: more than a fifth's could make, well under a tenth's.
        let busy = |renewed: i64, tenth: f64, fifth: f64| renewed as f64 >= (tenth + fifth) / 2.0 + 1.0;
        let lock = locks.try_lock(&poll_probe(), &holder("cadence"), Duration::ZERO).await.unwrap().unwrap();
        let (holding, tenth, _) = renewals_over(server, database, &worker, window).await;
        assert!(
            busy(holding, tenth, tenth / 2.0),
            "holding a lock, it renewed only {holding} times (a tenth's: {tenth:.1})"
        );
        lock.release().await.unwrap();

        // Holding nothing, for the first lease: every fifth.
        let (idle, tenth_idle, fifth) = renewals_over(server, database, &worker, LEASE * 4 / 5).await;
        assert!(idle as f64 <= fifth + 1.0, "holding nothing, it renewed {idle} times (a fifth's cadence: {fifth:.1})");
        assert!(idle as f64 >= fifth / 2.0, "holding nothing, it renewed only {idle} times (a fifth's: {fifth:.1})");
        assert!(
            (idle as f64) < tenth_idle - 1.0,
            "holding nothing, it renewed {idle} times (a tenth's: {tenth_idle:.1})"
        );

        // Past a lease of holding nothing (and the renewal then due): dormant, not renewed at
        // all, and still connected.
        tokio::time::sleep(LEASE / 2).await;
        let (dormant, _, _) = renewals_over(server, database, &worker, window).await;
        assert_eq!(dormant, 0, "dormant, it renewed {dormant} times in {window:?}");
        assert_eq!(*locks.session().borrow(), SessionState::Connected, "a dormant lease holds nothing to suspend");

        // A take that finds the lock busy leaves it dormant; a lock taken is handed out only
        // after a renewal.
        let other = open_locks(&url).await.unwrap();
        let busy_lock = other.try_lock(&poll_probe(), &holder("other"), Duration::ZERO).await.unwrap().unwrap();
        let before = tokio::task::block_in_place(|| beat_of(server, database, &worker));
        assert!(locks.try_lock(&poll_probe(), &holder("cadence"), Duration::ZERO).await.unwrap().is_none());
        let after_busy = tokio::task::block_in_place(|| beat_of(server, database, &worker));
        assert_eq!(after_busy, before, "a take that found the lock busy renewed a dormant lease");
        busy_lock.release().await.unwrap();
        other.close().await;
        let lock = locks.try_lock(&poll_probe(), &holder("cadence"), Duration::ZERO).await.unwrap().unwrap();
        let woken = tokio::task::block_in_place(|| beat_of(server, database, &worker));
        assert!(woken > before, "a lock taken on a dormant lease was handed out unrenewed (beat {before})");
        lock.release().await.unwrap();

        // Dormant again after another lease; a claim (which names the liveness record and
        // takes no lock row) wakes it before it is made, and from then on every tenth.
        tokio::time::sleep(LEASE + LEASE / 2).await;
        let (dormant_again, _, _) = renewals_over(server, database, &worker, LEASE).await;
        assert_eq!(dormant_again, 0, "dormant again, it renewed {dormant_again} times in {LEASE:?}");
        let before = tokio::task::block_in_place(|| beat_of(server, database, &worker));
        let claim = locks.hold_liveness().await.unwrap().expect("PostgreSQL keeps claims' liveness fresh");
        let woken = tokio::task::block_in_place(|| beat_of(server, database, &worker));
        assert!(woken > before, "a hold on a dormant lease renewed it first (beat {before} -> {woken})");
        let (claiming, tenth_claimed, fifth_claimed) = renewals_over(server, database, &worker, window).await;
        assert!(busy(claiming, tenth_claimed, fifth_claimed), "holding a claim, it renewed only {claiming} times");
        drop(claim);
        println!(
            "renewals in about {window:?} (a tenth's / a fifth's cadence: {tenth:.1} / {:.1}): a lock {holding}, \
             then idle {idle} in {:?}, dormant {dormant}, a claim {claiming}",
            tenth / 2.0,
            LEASE * 4 / 5
        );
        locks.close().await;
    });
}

#[test]
fn a_dormant_worker_whose_row_was_taken_over_takes_nothing_and_reports_its_lease_lost() {
    let server = postgres::shared();
    let database = "dormant_taken_over";
    let url = with_lease(&server.create_database(database));
    runtime().block_on(async {
        let locks = open_locks(&url).await.unwrap();
        let worker = worker_of(locks.as_ref());
        // Dormant once it has held nothing for a lease (and the renewal then due has passed).
        let dormant_by = Instant::now() + LEASE * 2;
        loop {
            let before = tokio::task::block_in_place(|| beat_of(server, database, &worker));
            tokio::time::sleep(LEASE / 2).await;
            if tokio::task::block_in_place(|| beat_of(server, database, &worker)) == before {
                break;
            }
            assert!(Instant::now() < dormant_by, "still renewing two leases after it began, holding nothing");
        }
        // Another host's takeover, after seeing the beat unchanged for a lease.
        server.psql(database, &format!("DELETE FROM autocomp_lock_workers WHERE id = '{worker}'"));
        let taken = locks.try_lock(&poll_probe(), &holder("late"), Duration::ZERO).await;
        assert!(matches!(taken, Err(LockError::Unavailable(_))), "{:?}", taken.map(|lock| lock.is_some()));
        assert_eq!(server.psql(database, "SELECT count(*) FROM autocomp_locks").trim(), "0", "nothing written");
        assert_eq!(*locks.session().borrow(), SessionState::Lost);
        assert_eq!(locks.liveness(), None, "no claim may name it any more");
        assert!(locks.hold_liveness().await.is_err(), "nor hold one");
        locks.close().await;
    });
}

#[test]
fn a_pass_renews_every_tenth_of_its_lease_while_it_works_a_claimed_batch() {
    let (server, database, pipeline) = probe_in_postgres(with_lease);
    pipeline.register(1);
    pipeline.configure(&format!(
        "event_type = \"{PROBED}\"\n\n[trigger]\nrequires = [\"Data_Received\"]\nblocked_by = [\"{PROBED}\"]\n\n\
         [settings]\nwork_time = \"6s\"\n"
    ));
    let pass = pipeline.spawn(&[]);
    // The batch claimed: from then on only the claim (no lock row: the turn is given back
    // once the claims are made) is held on the pass's lease while it works.
    let claimed = Instant::now() + Duration::from_secs(30);
    let worker = loop {
        let made = "SELECT to_regclass('autocomp_lock_workers') IS NOT NULL AND to_regclass('runs') IS NOT NULL";
        let open = (server.psql(&database, made).trim() == "t").then(|| {
            server.psql(
                &database,
                "SELECT w.id FROM autocomp_lock_workers w WHERE EXISTS (SELECT 1 FROM runs WHERE state = 'open') \
             AND NOT EXISTS (SELECT 1 FROM autocomp_locks)",
            )
        });
        if let Some(worker) = open.as_deref().and_then(|open| open.lines().next()).filter(|id| !id.is_empty()) {
            break worker.to_owned();
        }
        assert!(Instant::now() < claimed, "the pass claimed nothing");
        std::thread::sleep(Duration::from_millis(20));
    };
    let (renewed, tenth, fifth) = runtime().block_on(renewals_over(server, &database, &worker, LEASE * 3 / 2));
    assert!(
        renewed as f64 >= (tenth + fifth) / 2.0 + 1.0,
        "working a claimed batch, the pass renewed {renewed} times (a tenth's cadence: {tenth:.1}, a fifth's: {fifth:.1})"
    );
    let run = finish(pass, Duration::from_secs(60));
    assert_eq!(run.code, Some(0), "{}", run.show());
}

#[test]
fn the_doctor_says_where_the_lock_tables_are_and_who_may_not_make_them() {
    let server = postgres::shared();
    let NamedDatabase { name: database, url } = server.unique_named_database();
    runtime().block_on(async {
        // The shared test server runs with synchronous_commit = off (for speed): a lock it
        // acknowledges could be lost in a crash, and the doctor says so.
        let careless = inspect_locks(&url).await.unwrap();
        assert!(
            careless
                .problems
                .iter()
                .any(|p| p.contains("synchronous_commit is off") && p.contains("SET synchronous_commit = on")),
            "{careless:?}"
        );
        server.psql(&database, &format!("ALTER DATABASE \"{database}\" SET synchronous_commit = on;"));
        let fresh = inspect_locks(&url).await.unwrap();
        assert!(fresh.description.contains("lock tables absent: the first lock service makes them"), "{fresh:?}");
        assert!(fresh.problems.is_empty(), "{fresh:?}");

        // A role that may not create in the schema (PostgreSQL 15's default for public).
        server.psql(&database, "CREATE ROLE locker LOGIN; REVOKE CREATE ON SCHEMA public FROM PUBLIC;");
        let as_locker = url.replacen(postgres::USER, "locker:s3cret", 1);
        let refused = inspect_locks(&as_locker).await.unwrap();
        assert!(refused.problems.iter().any(|p| p.contains("may not create them")), "{refused:?}");
        assert!(!format!("{refused:?}").contains("s3cret"), "{refused:?}");
        match open_locks(&as_locker).await {
            Err(LockError::Invalid(input)) => {
                assert!(input.reason.contains("CREATE TABLE IF NOT EXISTS autocomp_locks"), "{input}");
                assert!(!input.to_string().contains("s3cret"), "{input}");
            }
            other => panic!("the tables were made by a role without the right: {:?}", other.err()),
        }

        // Made by their owner and granted: the role works with row rights only.
        let owner = open_locks(&url).await.unwrap();
        server.psql(
            &database,
            "GRANT SELECT, INSERT, UPDATE, DELETE ON autocomp_lock_workers, autocomp_locks TO locker;",
        );
        let made = inspect_locks(&as_locker).await.unwrap();
        assert!(made.problems.is_empty(), "{made:?}");
        assert!(made.description.contains("lock tables present: 1 workers registered, 0 locks held"), "{made:?}");
        let locker = open_locks(&as_locker).await.unwrap();
        let lock = locker.try_lock(&poll_probe(), &holder("locker"), Duration::ZERO).await.unwrap().unwrap();
        assert_eq!(owner.held().await.unwrap()[0].holder.as_ref().unwrap().agent, "locker");
        lock.release().await.unwrap();
        locker.close().await;
        owner.close().await;
    });
}

#[test]
fn a_component_runs_with_its_store_and_its_locks_in_postgres() {
    let (server, database, pipeline) = probe_in_postgres(str::to_owned);
    let url = server.url(&database);
    let ids = pipeline.register(12);
    let ledger = pipeline.path("ledger.txt");
    pipeline.configure(&format!(
        "event_type = \"{PROBED}\"\nmax_threads = 2\nbatch_lock_timeout = \"20ms\"\n\n\
         [trigger]\nrequires = [\"Data_Received\"]\nblocked_by = [\"{PROBED}\"]\n\n\
         [settings]\nwork_time = \"50ms\"\nledger = \"{}\"\n",
        ledger.display()
    ));
    // Two passes at once, as two hosts' crons would start them: the locks keep them apart.
    let passes = [pipeline.spawn(&[]), pipeline.spawn(&[])];
    for pass in passes {
        let run = finish(pass, Duration::from_secs(60));
        assert_eq!(run.code, Some(0), "{}", run.show());
    }
    for id in &ids {
        assert_eq!(pipeline.events(id, PROBED).len(), 1, "{id}: one result");
    }
    assert_eq!(pipeline.ledger().len(), ids.len(), "each batch worked once");
    assert!(pipeline.lock_files().is_empty(), "no local lock file: the locks were PostgreSQL's");
    // The lock tables were used, and the passes left nothing in them.
    let left = server.psql(
        &database,
        "SELECT (SELECT count(*) FROM autocomp_lock_workers) || ' ' || (SELECT count(*) FROM autocomp_locks)",
    );
    assert_eq!(left.trim(), "0 0", "workers and locks left behind");
    let held = runtime().block_on(async {
        let locks = open_locks(&url).await.unwrap();
        let held = locks.held().await.unwrap();
        locks.close().await;
        held
    });
    assert!(held.is_empty(), "{held:?}");
}

/// A probe pipeline with its store in a new database of the shared server and its locks at
/// `locks_url` of that database's URL; the server and the database's name.
fn probe_in_postgres(locks_url: impl Fn(&str) -> String) -> (&'static Postgres, String, Pipeline) {
    let server = postgres::shared();
    let NamedDatabase { name: database, url } = server.unique_named_database();
    let pipeline = Pipeline::with_store(PROBE, &url);
    pipeline.use_locks(&locks_url(&url));
    (server, database, pipeline)
}

/// A probe watcher with its store and locks in one new PostgreSQL database and `config`,
/// logging at debug level to the file answered, once its first pass registered it.
fn logged_watcher(config: &str) -> (String, Pipeline, std::process::Child, std::path::PathBuf) {
    let url = postgres::shared().unique_database();
    let pipeline = Pipeline::with_store(PROBE, &url);
    pipeline.use_locks(&url);
    pipeline.configure(config);
    let log = pipeline.path("watcher.log");
    let mut command = pipeline.command(&["--watch", "-vv"]);
    command.stderr(std::fs::File::create(&log).unwrap());
    let watcher = command.spawn().expect("the probe starts");
    let registered = autocomp_e2e::wait_until(Instant::now() + Duration::from_secs(30), || {
        !pipeline.block_on(pipeline.any_store().components()).expect("registry readable").is_empty()
    });
    assert!(registered, "the watcher's first pass never registered the probe");
    (url, pipeline, watcher, log)
}

/// A watcher that finds its component's turn held over PostgreSQL locks defers, and its
/// retries read the lock row (and the holder's beat), not the store; once the holder stops
/// renewing (dead: its row stays, its beat frozen), the watcher's read sees the beat
/// unchanged for the holder's whole lease, looks, takes the turn over and works the batch.
#[test]
fn a_deferring_watcher_reads_the_lock_not_the_store_and_takes_a_dead_holders_turn_over() {
    let (url, pipeline, watcher, log) = logged_watcher("watch_heartbeat = \"10m\"\n");
    let log_text = || std::fs::read_to_string(&log).unwrap_or_default();
    let count = |what: &str| log_text().lines().filter(|line| line.contains(what)).count();
    // Another process holds the component's turn, with a 2 s lease (waiting out the
    // watcher's own kept turn, given back once idle).
    let rt = runtime();
    let other = rt.block_on(open_locks(&with_lease(&url))).unwrap();
    let held = rt.block_on(other.try_lock(&poll_probe(), &holder("other"), Duration::from_secs(10))).unwrap();
    let held = held.expect("the turn frees within 10 s");
    let id = pipeline.register_one("D0001", true);
    let deferred = autocomp_e2e::wait_until(Instant::now() + Duration::from_secs(15), || count("deferring to it") >= 4);
    assert!(deferred, "the watcher did not defer four times: {}", log_text());
    let text = log_text();
    let since_deferring = &text[text.find("deferring to it").expect("deferred")..];
    let looks = since_deferring.lines().filter(|line| line.contains("looked for work")).count();
    assert_eq!(looks, 0, "a deferring watcher read the store at its retries: {text}");
    assert!(pipeline.open_runs().is_empty(), "a batch was claimed while another held the turn");
    // The holder dies: it renews no more, and its row stays until someone takes it over.
    let died = Instant::now();
    std::mem::forget(held);
    drop(other);
    let worked =
        autocomp_e2e::wait_until(Instant::now() + Duration::from_secs(30), || pipeline.events(&id, PROBED).len() == 1);
    assert!(worked, "the batch was not worked within 30 s of the holder's death: {}", log_text());
    assert!(died.elapsed() >= LEASE, "worked {:?} after the holder's death, within its lease", died.elapsed());
    println!("worked {:?} after the holder's death", died.elapsed());
    // SAFETY: kill(2) on the pid of a child we spawned and have not reaped yet.
    assert_eq!(unsafe { libc::kill(watcher.id() as libc::pid_t, libc::SIGTERM) }, 0);
    let finished = finish(watcher, Duration::from_secs(30));
    assert_eq!(finished.code, Some(0), "{}", finished.show());
}

/// A watcher's heartbeat pass that finds its component's turn held defers as its other
/// passes do, however long `poll_lock_timeout` is: over PostgreSQL locks a waiting try polls
/// the lock row ten times a second, and 2,000 watchers' heartbeats waiting so were a herd of
/// a few hundred pollers, most of the server's statements (docs/capacity.md). Once the turn
/// frees, the watcher's retry takes it and works the batch.
#[test]
fn a_watchers_heartbeat_pass_defers_to_a_held_turn_instead_of_queueing_for_it() {
    let (url, pipeline, watcher, log) = logged_watcher("watch_heartbeat = \"1s\"\npoll_lock_timeout = \"10m\"\n");
    let log_text = || std::fs::read_to_string(&log).unwrap_or_default();
    let rt = runtime();
    // The default lease: a loaded machine's late renewal must not make the holder look dead.
    let other = rt.block_on(open_locks(&url)).unwrap();
    let held = rt.block_on(other.try_lock(&poll_probe(), &holder("other"), Duration::from_secs(10))).unwrap();
    let held = held.expect("the turn frees within 10 s");
    let id = pipeline.register_one("H0001", true);
    // The log from the hold on: heartbeat passes (every second), each followed by a deferral.
    let from = log_text().len();
    let heartbeats_deferred = || {
        let text = log_text();
        let since_hold = &text[from.min(text.len())..];
        let mut deferred = 0;
        let mut heartbeat_open = false;
        for line in since_hold.lines() {
            if line.contains("starting a pass") && line.contains("heartbeat_due=true") {
                heartbeat_open = true;
            } else if heartbeat_open && line.contains("deferring to it") {
                (deferred, heartbeat_open) = (deferred + 1, false);
            }
        }
        deferred
    };
    let deferred = autocomp_e2e::wait_until(Instant::now() + Duration::from_secs(15), || heartbeats_deferred() >= 2);
    assert!(deferred, "a heartbeat pass queued for the held turn instead of deferring: {}", log_text());
    assert!(pipeline.open_runs().is_empty(), "a batch was claimed while another held the turn");
    rt.block_on(held.release()).unwrap();
    let released = Instant::now();
    let worked =
        autocomp_e2e::wait_until(released + Duration::from_secs(15), || pipeline.events(&id, PROBED).len() == 1);
    assert!(worked, "the batch was not worked within 15 s of the turn freeing: {}", log_text());
    println!("worked {:?} after the turn freed", released.elapsed());
    rt.block_on(other.close());
    // SAFETY: kill(2) on the pid of a child we spawned and have not reaped yet.
    assert_eq!(unsafe { libc::kill(watcher.id() as libc::pid_t, libc::SIGTERM) }, 0);
    let finished = finish(watcher, Duration::from_secs(30));
    assert_eq!(finished.code, Some(0), "{}", finished.show());
}

/// A watcher started while another process holds its component's turn: its first pass (a
/// heartbeat's) defers, and still records an idle pass, so the registry lists this host.
/// Once the turn frees and nothing is ready, the watcher sleeps in the change feed again
/// instead of retrying until its next heartbeat (10 minutes here), and a new batch wakes it.
#[test]
fn a_watcher_that_started_behind_a_held_turn_is_registered_and_sleeps_in_the_feed_once_it_frees() {
    let url = postgres::shared().unique_database();
    let pipeline = Pipeline::with_store(PROBE, &url);
    pipeline.use_locks(&url);
    pipeline.configure("watch_heartbeat = \"10m\"\npoll_lock_timeout = \"10m\"\n");
    let rt = runtime();
    let other = rt.block_on(open_locks(&url)).unwrap();
    let held = rt.block_on(other.try_lock(&poll_probe(), &holder("other"), Duration::ZERO)).unwrap();
    let held = held.expect("nobody else holds the turn");
    let log = pipeline.path("watcher.log");
    let mut command = pipeline.command(&["--watch", "-vv"]);
    command.stderr(std::fs::File::create(&log).unwrap());
    let watcher = command.spawn().expect("the probe starts");
    let log_text = || std::fs::read_to_string(&log).unwrap_or_default();
    let registered = autocomp_e2e::wait_until(Instant::now() + Duration::from_secs(30), || {
        !pipeline.block_on(pipeline.any_store().components()).expect("registry readable").is_empty()
    });
    assert!(registered, "a watcher whose first pass deferred is not in the registry: {}", log_text());
    assert!(log_text().contains("deferring to it"), "the first pass did not defer: {}", log_text());
    rt.block_on(held.release()).unwrap();
    let from = log_text().len();
    // One retry finds the turn free and nothing to do; after it, no more deferrals.
    let asleep = autocomp_e2e::wait_until(Instant::now() + Duration::from_secs(10), || {
        log_text()[from..].lines().any(|line| line.contains("looked for work"))
    });
    assert!(asleep, "no retry looked once the turn freed: {}", log_text());
    let settled = log_text().len();
    std::thread::sleep(Duration::from_secs(4)); // an absence: retries would come every 0.5-2 s
    let deferrals = log_text()[settled..].lines().filter(|line| line.contains("deferring to it")).count();
    assert_eq!(deferrals, 0, "the watcher kept deferring to a free turn: {}", log_text());
    let id = pipeline.register_one("F0001", true);
    let worked =
        autocomp_e2e::wait_until(Instant::now() + Duration::from_secs(10), || pipeline.events(&id, PROBED).len() == 1);
    assert!(worked, "the batch was not worked within 10 s: {}", log_text());
    rt.block_on(other.close());
    // SAFETY: kill(2) on the pid of a child we spawned and have not reaped yet.
    assert_eq!(unsafe { libc::kill(watcher.id() as libc::pid_t, libc::SIGTERM) }, 0);
    let finished = finish(watcher, Duration::from_secs(30));
    assert_eq!(finished.code, Some(0), "{}", finished.show());
}
