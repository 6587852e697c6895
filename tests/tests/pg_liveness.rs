//! PostgreSQL as the pipeline's only service (store and locks, `postgres://`) through faults
//! of the database server itself, with workers making pass after pass; after each, every
//! batch is finished once, the probe's ledger shows no two work intervals on one batch
//! overlapping, and none lost:
//!
//! - the primary SIGKILLed right after a claim and its synchronous standby promoted, the
//!   workers on a multi-host URL (`target_session_attrs=read-write`) finding the new primary
//!   themselves; claims acknowledged but not yet on the standby are lost with the primary,
//!   and their batches are simply ready again (the figure is printed);
//! - the database host's wall clock stepped an hour forward mid-run (the server under
//!   libfaketime): the leases live on the workers' monotonic clocks, so no lease ends early
//!   and no work is cut short.

use std::collections::{BTreeMap, BTreeSet};
use std::process::{Child, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use autocomp_e2e::{PROBED, Pipeline, disjoint_by_batch, wait_until};
use autocomp_model::Outcome;
use autocomp_test_servers::postgres::{Options, Postgres};

const PROBE: &str = env!("CARGO_BIN_EXE_probe-component");
const BATCHES: usize = 40;
/// The workers' lease.
const LEASE: Duration = Duration::from_secs(4);
/// The exit code of a process whose lease was lost (autocomp-framework's `LOCKS_LOST`).
const LOCKS_LOST: i32 = 4;

/// A worker host: runs `--watch` (one process making pass after pass, which also watches the
/// other workers' beats for takeovers), started again whenever it exits, until `stop`;
/// then SIGTERM. Returns how its processes ended, by exit code.
fn drive(pipeline: Arc<Pipeline>, name: String, stop: Arc<AtomicBool>) -> BTreeMap<i32, u32> {
    let mut codes = BTreeMap::new();
    let log_path = pipeline.path(&format!("{name}.log"));
    while !stop.load(Ordering::Relaxed) {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&log_path).expect("worker log");
        let mut child: Child =
            pipeline.command(&["--watch"]).stdout(Stdio::null()).stderr(log).spawn().expect("a worker starts");
        let mut status = None;
        wait_until(Instant::now() + Duration::from_secs(600), || {
            status = child.try_wait().unwrap();
            status.is_some() || stop.load(Ordering::Relaxed)
        });
        let status = match status {
            Some(status) => status,
            None => {
                // SAFETY: kill(2) on our unreaped child.
                unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
                child.wait().expect("reaped")
            }
        };
        use std::os::unix::process::ExitStatusExt;
        *codes.entry(status.code().unwrap_or_else(|| -status.signal().unwrap_or(0))).or_default() += 1;
        if !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(200)); // as a supervisor's restart delay
        }
    }
    codes
}

/// The pipeline's workers: two driver threads, stopped and joined by [`Workers::stop`] (or
/// when dropped, on a failed assertion).
struct Workers {
    stop: Arc<AtomicBool>,
    drivers: Vec<std::thread::JoinHandle<BTreeMap<i32, u32>>>,
}

impl Workers {
    fn start(pipeline: &Arc<Pipeline>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let drivers = ["worker-1", "worker-2"]
            .map(|name| {
                let (pipeline, stop) = (Arc::clone(pipeline), Arc::clone(&stop));
                std::thread::spawn(move || drive(pipeline, name.to_owned(), stop))
            })
            .into();
        Self { stop, drivers }
    }

    /// Stops them; how their processes ended, by exit code.
    fn stop(mut self) -> BTreeMap<i32, u32> {
        self.stop.store(true, Ordering::Relaxed);
        let mut codes = BTreeMap::new();
        for driver in self.drivers.drain(..) {
            for (code, n) in driver.join().expect("a driver") {
                *codes.entry(code).or_default() += n;
            }
        }
        codes
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// A pipeline whose store and locks are `url` (lease [`LEASE`]), with [`BATCHES`] batches
/// of `work_time` each, two at a time per worker.
fn pipeline(url: &str, work_time: &str) -> Arc<Pipeline> {
    let pipeline = Pipeline::with_store(PROBE, url);
    let separator = if url.contains('?') { '&' } else { '?' };
    pipeline.use_locks(&format!("{url}{separator}lease={}s", LEASE.as_secs()));
    pipeline.configure(&format!(
        "max_threads = 2\nqueue_size = 4\nmax_attempts = 1000\nwatch_heartbeat = \"1s\"\n\n[settings]\nwork_time = \
         \"{work_time}\"\nledger = \"{}\"\n",
        pipeline.path("ledger.txt").display()
    ));
    pipeline.register(BATCHES);
    Arc::new(pipeline)
}

/// How many batches have their result.
fn done(pipeline: &Pipeline) -> usize {
    pipeline.all_batches().iter().filter(|b| b.events.iter().any(|e| e.event_type.as_str() == PROBED)).count()
}

/// The ledger's verdict: every batch recorded once, successfully, worked on at least once
/// and never by two at once, no run left open. Returns the number of work intervals.
fn assert_clean_ledger(pipeline: &Pipeline) -> usize {
    let batches = pipeline.all_batches();
    assert_eq!(batches.len(), BATCHES);
    let mut twice = Vec::new();
    for batch in &batches {
        let results: Vec<_> = batch.events.iter().filter(|e| e.event_type.as_str() == PROBED).collect();
        assert!(results.iter().all(|e| e.outcome == Outcome::Success), "{}: {results:?}", batch.id);
        if results.len() != 1 {
            twice.push(batch.id.clone());
        }
    }
    let ledger = pipeline.ledger();
    let by_batch = disjoint_by_batch(&ledger);
    let lost: Vec<_> = batches.iter().filter(|b| !by_batch.contains_key(b.id.as_str())).map(|b| &b.id).collect();
    assert!(twice.is_empty() && lost.is_empty(), "recorded twice: {twice:?}; lost: {lost:?}");
    assert!(pipeline.open_runs().is_empty(), "runs left open: {:?}", pipeline.open_runs());
    ledger.len()
}

/// Waits until `count` batches are done (at most `limit` from now).
fn wait_done(pipeline: &Pipeline, count: usize, limit: Duration, what: &str) {
    let mut seen = 0;
    let reached = wait_until(Instant::now() + limit, || {
        seen = done(pipeline);
        seen >= count
    });
    assert!(reached, "{what}: {seen} of {BATCHES} batches done after {limit:?}");
}

/// `(batch, generation)` of every open run the store shows: claims committed.
fn open_claims(pipeline: &Pipeline) -> BTreeSet<(String, i64)> {
    pipeline.open_runs().into_iter().map(|run| (run.batch_id.as_str().to_owned(), run.generation)).collect()
}

#[test]
fn a_failover_to_a_synchronous_standby_mid_claim_loses_and_doubles_no_batch() {
    // The claims commit with `synchronous_commit` off (the store's choice: see its runs.rs):
    // acknowledged before their WAL is flushed, so before the standby has them. The WAL
    // writer flushes them within about 3 x `wal_writer_delay` (200 ms by default); 10 s here
    // keeps them unflushed until the next synchronous commit (a result), so that the kill
    // right after a claim loses it, as it can by default in a narrower window.
    let primary = Postgres::start_with(Options::default().setting("wal_writer_delay", "10s"));
    let database = "failover";
    primary.create_database(database);
    let standby = primary.standby(true);
    // Both hosts, the primary first; a store call retries for 30 s (the default) across the
    // failover, each attempt finding whichever host is the read-write one.
    let url = format!(
        "postgres://{}@{},{}/{database}?target_session_attrs=read-write",
        autocomp_test_servers::postgres::USER,
        primary.host_port(),
        standby.host_port()
    );
    let pipeline = pipeline(&url, "1s");
    let started = Instant::now();
    let workers = Workers::start(&pipeline);
    wait_done(&pipeline, BATCHES / 4, Duration::from_secs(60), "before the failover");

    // Mid-claim: as soon as the store shows a claim it did not show at the last look, the
    // primary dies and the standby takes over.
    let mut claimed = open_claims(&pipeline);
    let fresh = wait_until(Instant::now() + Duration::from_secs(30), || {
        let now = open_claims(&pipeline);
        let new = now.difference(&claimed).count() > 0;
        claimed = now;
        new
    });
    assert!(fresh, "no new claim within 30 s");
    let before = done(&pipeline);
    let killed = Instant::now();
    primary.crash();
    standby.promote();
    let promoted = killed.elapsed();
    let on_standby: BTreeSet<(String, i64)> = standby
        .psql(database, "SELECT batch_id || ' ' || generation FROM runs")
        .lines()
        .filter_map(|line| {
            line.split_once(' ').map(|(batch, generation)| (batch.to_owned(), generation.parse().unwrap()))
        })
        .collect();
    let lost_claims = claimed.difference(&on_standby).count();
    wait_done(&pipeline, BATCHES, Duration::from_secs(120), "after the failover");
    let elapsed = started.elapsed();
    let exits = workers.stop();
    let intervals = assert_clean_ledger(&pipeline);
    eprintln!(
        "failover: {BATCHES} batches in {:.1} s; primary killed right after a claim with {before} done and {} claims \
         open, standby promoted {promoted:?} later; {lost_claims} of those acknowledged claims were not on the \
         standby; worker processes by exit code {exits:?}; {} interrupted work intervals redone; 0 lost, 0 recorded \
         twice, 0 overlapping",
        elapsed.as_secs_f64(),
        claimed.len(),
        intervals - BATCHES,
    );
}

#[test]
fn a_forward_step_of_the_database_hosts_clock_ends_no_lease_early() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let clock = dir.path().join("clock");
    std::fs::write(&clock, "+0\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&clock, std::fs::Permissions::from_mode(0o644)).unwrap();
    let server = Postgres::start_with(Options::default().with_clock_file(&clock));
    let url = server.create_database("clock");
    let server_offset = || -> i64 {
        let said = server.psql("clock", "SELECT extract(epoch FROM clock_timestamp())::bigint");
        let real = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
        said.trim().parse::<i64>().expect("seconds") - real
    };
    assert!(server_offset().abs() < 5, "the server's clock before the step: {} s off", server_offset());

    // Work longer than the lease's renewals: a lease ending early would cut it short.
    let pipeline = pipeline(&url, "1500ms");
    let started = Instant::now();
    let workers = Workers::start(&pipeline);
    wait_done(&pipeline, BATCHES / 4, Duration::from_secs(60), "before the clock step");
    std::fs::write(&clock, "+1h\n").unwrap();
    let stepped = server_offset();
    assert!((3590..3610).contains(&stepped), "the server's clock after the step: {stepped} s ahead");
    // Held ahead for more than two leases while the workers renew and take locks.
    wait_done(&pipeline, BATCHES, Duration::from_secs(120), "after the clock step");
    let elapsed = started.elapsed();
    let still_ahead = server_offset();
    let exits = workers.stop();
    let intervals = assert_clean_ledger(&pipeline);
    eprintln!(
        "clock step: {BATCHES} batches in {:.1} s; the server's clock stepped {stepped} s ahead mid-run ({still_ahead} \
         s at the end); worker processes by exit code {exits:?}; {} interrupted work intervals",
        elapsed.as_secs_f64(),
        intervals - BATCHES,
    );
    assert!(!exits.contains_key(&LOCKS_LOST), "a lease was lost: exits {exits:?}");
    assert_eq!(intervals, BATCHES, "work was cut short and redone: no lease may end early");
}
