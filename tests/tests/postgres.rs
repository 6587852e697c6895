//! The PostgreSQL store under faults, end to end: real PostgreSQL servers (the
//! `autocomp-test-servers` harness), real component processes (the probe component, two
//! processes at once as two hosts' crons would start them), real `autocomp` and
//! `autocomp-store` binaries.
//!
//! - the server crashes (every server process SIGKILLed, no shutdown checkpoint) while passes
//!   work and comes back on the same port;
//! - the primary crashes under a synchronous standby, which is promoted; the components hold
//!   a URL naming both hosts with `target_session_attrs=read-write`;
//! - an unreachable server, refused credentials, a missing database;
//! - `autocomp-store serve` over PostgreSQL, for hosts without database access.
//!
//! After every fault: each result a pass acknowledged (its stdout line) is in the store, no
//! (batch, component) has two results, and a few more passes leave no batch unfinished and no
//! run open.

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use autocomp_e2e::services::{Service, TOKEN};
use autocomp_e2e::{Finished, PROBED, Pipeline, binary, finish, wait_until, without_pipeline_env};
use autocomp_model::{
    Agent, BatchId, BatchType, ComponentName, EventType, IdempotencyKey, NewBatch, NewEvent, Outcome, RunHolder,
};
use autocomp_store::prelude::*;
use autocomp_store::{HttpStore, StoreError, open_store};
use autocomp_test_servers::postgres::{self, Postgres};

const PROBE: &str = env!("CARGO_BIN_EXE_probe-component");
/// At most this long for one pass (a pass riding out an outage retries for up to `retry_for`).
const PASS_LIMIT: Duration = Duration::from_secs(90);
/// How long the components retry after their store went away; longer than any outage here.
const RETRY_FOR: &str = "30s";

/// The probe's config: `event_type` and trigger spelled out (so `autocomp` knows the
/// pipeline), two work threads, every ready batch claimed in one pass (skipping at once what
/// the other pass has locked), a ledger.
fn configure_probe(pipeline: &Pipeline, work_time: &str) {
    let ledger = pipeline.path("ledger.txt");
    pipeline.configure(&format!(
        "event_type = \"{PROBED}\"\nmax_threads = 2\nqueue_size = 200\nbatch_lock_timeout = \"20ms\"\n\n\
         [trigger]\nrequires = [\"Data_Received\"]\nblocked_by = [\"{PROBED}\"]\n\n\
         [settings]\nwork_time = \"{work_time}\"\nledger = \"{}\"\n",
        ledger.display()
    ));
}

/// `autocomp --config-dir <pipeline> ARGS`, with none of the environment that would change
/// what it does.
fn autocomp(pipeline: &Pipeline, args: &[&str]) -> Finished {
    let mut command = Command::new(binary("autocomp"));
    command.arg("--config-dir").arg(pipeline.config_dir()).args(args);
    without_pipeline_env(&mut command).env("AUTOCOMP_TOKEN", TOKEN);
    command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    finish(command.spawn().expect("autocomp starts"), Duration::from_secs(30))
}

/// Waits until the ledger has at least `lines` lines; fails (killing the passes) if every
/// pass exits or 30 s go by first.
fn wait_for_ledger(pipeline: &Pipeline, passes: &mut Vec<Child>, lines: usize, what: &str) {
    let reached = wait_until(Instant::now() + Duration::from_secs(30), || {
        pipeline.ledger().len() >= lines || passes.iter_mut().all(|child| child.try_wait().ok().flatten().is_some())
    });
    if !(reached && pipeline.ledger().len() >= lines) {
        let shown: Vec<String> = passes.drain(..).map(stop).collect();
        panic!("{what}: the ledger has {} lines, not {lines}\n{}", pipeline.ledger().len(), shown.join("\n"));
    }
}

/// Kills a pass (if it still runs) and shows how it ended, for a failure message.
fn stop(mut child: Child) -> String {
    child.kill().ok();
    finish(child, Duration::from_secs(10)).show()
}

/// Waits until some pass finishes another batch's work (so its append meets whatever the
/// store is now), at most 30 s.
fn wait_for_more_work(pipeline: &Pipeline, passes: &mut Vec<Child>, what: &str) {
    let done = pipeline.ledger().len();
    wait_for_ledger(pipeline, passes, done + 1, what);
}

/// Runs passes (one at a time) until every batch has its result, at most `limit` of them;
/// returns them for the acknowledgement check.
fn finish_the_work(pipeline: &Pipeline, ids: &[BatchId], limit: usize) -> Vec<Finished> {
    let mut runs = Vec::new();
    for _ in 0..limit {
        if ids.iter().all(|id| !pipeline.events(id, PROBED).is_empty()) {
            break;
        }
        let run = finish(pipeline.spawn(&[]), PASS_LIMIT);
        assert!(matches!(run.code, Some(0)), "a pass after the fault: {}", run.show());
        runs.push(run);
    }
    runs
}

/// The fault-tolerance contract, from outside the processes: every result a pass printed
/// (acknowledged) is in the store as printed, every batch has exactly one result (a success),
/// and no run is left open.
fn assert_exactly_once(pipeline: &Pipeline, ids: &[BatchId], runs: &[Finished]) {
    let mut results: BTreeMap<&BatchId, Outcome> = BTreeMap::new();
    let mut twice = Vec::new();
    for id in ids {
        let events = pipeline.events(id, PROBED);
        match events.as_slice() {
            [one] => {
                results.insert(id, one.outcome);
            }
            [] => panic!("{id} has no {PROBED} result: stuck"),
            more => twice.push(format!("{id}: {more:?}")),
        }
    }
    assert!(twice.is_empty(), "recorded more than once:\n{}", twice.join("\n"));
    // A result committed just before a fault may have reached no pass (it gave up, exit 5):
    // then nobody printed it, which is fine; printing one the store lacks is not.
    for run in runs {
        for line in run.stdout.lines().filter(|line| !line.trim().is_empty()) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            assert!(fields.len() >= 3 && fields[1] == PROBED, "an unexpected result line {line:?}\n{}", run.show());
            let id = BatchId::new(fields[0]).expect("a batch id");
            let stored = results.get(&id).unwrap_or_else(|| panic!("acknowledged {line:?} for an unknown batch"));
            assert_eq!(stored.as_str(), fields[2], "acknowledged {line:?}, the store holds {stored:?}");
        }
    }
    assert!(results.values().all(|outcome| *outcome == Outcome::Success), "{results:?}");
    let open = pipeline.open_runs();
    assert!(open.is_empty(), "runs left open: {open:?}");
}

/// Waits for the passes that were running when the store went away: each rode it out (0) or
/// gave up on the store (5), anything else is a bug; and they did meet the fault (retried).
fn ride_out(passes: Vec<Child>, fault: &str) -> Vec<Finished> {
    let runs: Vec<Finished> = passes.into_iter().map(|child| finish(child, PASS_LIMIT)).collect();
    let shown = || runs.iter().map(Finished::show).collect::<Vec<_>>().join("\n");
    for run in &runs {
        assert!(matches!(run.code, Some(0 | 5)), "a pass during the {fault}: {}", run.show());
    }
    let retries: usize = runs.iter().map(|run| run.stderr.matches("retrying").count()).sum();
    assert!(retries > 0, "the passes met the {fault}: {}", shown());
    eprintln!(
        "during the {fault}: exits {:?}, {retries} retries, {} results",
        runs.iter().map(|run| run.code).collect::<Vec<_>>(),
        runs.iter().map(|run| run.stdout.lines().count()).sum::<usize>()
    );
    runs
}

#[test]
fn a_crash_and_restart_of_postgres_under_running_passes_loses_no_acknowledged_result_and_doubles_none() {
    let server = Postgres::start();
    let url = server.create_database("crash");
    let mut pipeline = Pipeline::with_store(PROBE, &format!("{url}?retry_for={RETRY_FOR}&connect_timeout=2s"));
    let ids = pipeline.register(60);
    configure_probe(&pipeline, "100ms");

    let mut passes = vec![pipeline.spawn(&[]), pipeline.spawn(&[])];
    // Every server process SIGKILLed while work is under way (a pass claims all it takes
    // before working, so more work is pending); down until a batch's work has ended, so that
    // its append meets the dead server; then crash recovery on the same port.
    wait_for_ledger(&pipeline, &mut passes, 8, "work before the crash");
    server.crash();
    wait_for_more_work(&pipeline, &mut passes, "work while the server is down");
    server.restart();
    let first = ride_out(passes, "crash");

    pipeline.reconnect();
    let mut runs = first;
    runs.extend(finish_the_work(&pipeline, &ids, 3));
    assert_exactly_once(&pipeline, &ids, &runs);
}

#[test]
fn a_failover_to_a_promoted_synchronous_standby_loses_no_acknowledged_result_and_doubles_none() {
    let primary = Postgres::start();
    primary.create_database("failover");
    let standby = primary.standby(true);
    let url = format!(
        "postgres://{}@{},{}/failover?target_session_attrs=read-write&retry_for={RETRY_FOR}&connect_timeout=2s",
        postgres::USER,
        primary.host_port(),
        standby.host_port()
    );
    let mut pipeline = Pipeline::with_store(PROBE, &url);
    let ids = pipeline.register(60);
    configure_probe(&pipeline, "100ms");

    let mut passes = vec![pipeline.spawn(&[]), pipeline.spawn(&[])];
    wait_for_ledger(&pipeline, &mut passes, 8, "work before the failover");
    primary.crash();
    // No primary at all for a while (the standby is read-only, so target_session_attrs
    // refuses it), until a batch's work has ended and its append met that.
    wait_for_more_work(&pipeline, &mut passes, "work while there is no primary");
    standby.promote();
    let first = ride_out(passes, "failover");

    // The next passes start with the dead primary first in the URL: they go on to the new one.
    pipeline.reconnect();
    let mut runs = first;
    runs.extend(finish_the_work(&pipeline, &ids, 3));
    assert_exactly_once(&pipeline, &ids, &runs);
}

/// A loopback port nothing listens on.
fn dead_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

#[test]
fn an_unreachable_server_exits_5_naming_host_port_and_user_and_claims_nothing() {
    let pipeline = Pipeline::with_store(PROBE, &postgres::shared().unique_database());
    pipeline.register(3);
    configure_probe(&pipeline, "0s");
    let head = pipeline.head();

    let port = dead_port();
    let target = format!("{}@127.0.0.1:{port}", postgres::USER);
    pipeline.use_backend("store", &format!("postgres://{target}/autocomp?connect_timeout=2s"));
    let run = pipeline.run(&[]);
    assert_eq!(run.code, Some(5), "{}", run.show());
    assert!(run.stderr.contains(&target), "names user@host:port: {}", run.show());
    assert!(run.elapsed < Duration::from_secs(10), "a first contact fails at once: {:?}", run.elapsed);
    let status = autocomp(&pipeline, &["status"]);
    assert_eq!(status.code, Some(5), "{}", status.show());
    assert!(status.stderr.contains(&target), "names user@host:port: {}", status.show());

    // The service, which a boot may start before the database, waits for it instead: up at
    // once, /health says what it waits for, naming user@host:port; SIGTERM stops it cleanly.
    let listen = dead_port();
    let served = Command::new(binary("autocomp-store"))
        .args(["serve", "--listen", &format!("127.0.0.1:{listen}")])
        .args(["--db", &format!("postgres://{target}/autocomp?connect_timeout=2s")])
        .env("AUTOCOMP_TOKEN", TOKEN)
        .env_remove("AUTOCOMP_TOKEN_FILE")
        .env_remove("AUTOCOMP_STORE_DB")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let health = format!("http://127.0.0.1:{listen}/health");
    let mut answer = None;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    autocomp_e2e::wait_until(deadline, || {
        answer = autocomp_e2e::services::http_get(&health);
        answer.as_ref().is_some_and(|(status, body)| *status == 503 && !body.contains("\"attempts\":0"))
    });
    let (status, body) = answer.expect("the waiting service answers /health");
    assert_eq!(status, 503, "{body}");
    let health: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(health["status"], "starting", "{health}");
    assert!(health["waiting_for"].as_str().unwrap().contains(&target), "names user@host:port: {health}");
    assert!(health["last_error"].as_str().unwrap().contains(&target), "says why: {health}");
    // SAFETY: kill(2) on the pid of our own child, which has not been waited for.
    unsafe { libc::kill(served.id() as i32, libc::SIGTERM) };
    let served = finish(served, Duration::from_secs(30));
    assert_eq!(served.code, Some(0), "{}", served.show());
    assert!(served.stderr.contains("waiting for the database") && served.stderr.contains(&target), "{}", served.show());

    assert_eq!(pipeline.head(), head, "nothing claimed, nothing written");
    assert!(pipeline.open_runs().is_empty());
}

#[test]
fn refused_credentials_or_a_missing_database_exit_2_naming_the_user_never_the_password() {
    // A server of its own: its pg_hba.conf changes.
    let server = Postgres::start();
    const RIGHT: &str = "right-horse-battery";
    const WRONG: &str = "wrong-staple-7f3a";
    server.psql("postgres", &format!("CREATE ROLE alice LOGIN PASSWORD '{RIGHT}';"));
    server.create_database("creds");
    // alice owns the database (and so its public schema): she migrates and writes it.
    server.psql("postgres", "ALTER DATABASE creds OWNER TO alice;");
    // Password authentication for alice only (the first matching line wins); trust for the rest.
    let hba = server.data_dir().join("pg_hba.conf");
    let rules = std::fs::read_to_string(&hba).unwrap();
    std::fs::write(&hba, format!("host all alice 127.0.0.1/32 scram-sha-256\n{rules}")).unwrap();
    server.psql("postgres", "SELECT pg_reload_conf();");
    let alice = |password: Option<&str>| match password {
        Some(password) => format!("postgres://alice:{password}@{}/creds?connect_timeout=2s", server.host_port()),
        None => format!("postgres://alice@{}/creds?connect_timeout=2s", server.host_port()),
    };
    // The reload is asynchronous: wait until alice needs her password.
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let enforced =
        wait_until(Instant::now() + Duration::from_secs(20), || runtime.block_on(open_store(&alice(None))).is_err());
    assert!(enforced, "pg_hba.conf not in force after a reload\n{}", server.log_tail());

    let pipeline = Pipeline::with_store(PROBE, &alice(Some(RIGHT)));
    let ids = pipeline.register(3);
    configure_probe(&pipeline, "0s");
    let head = pipeline.head();

    let refused = [
        (alice(Some(WRONG)), "alice"),
        (format!("postgres://mallory:{WRONG}@{}/creds?connect_timeout=2s", server.host_port()), "mallory"),
        (format!("postgres://{}@{}/no_such_db?connect_timeout=2s", postgres::USER, server.host_port()), "no_such_db"),
    ];
    for (url, named) in &refused {
        pipeline.use_backend("store", url);
        let run = pipeline.run(&[]);
        let status = autocomp(&pipeline, &["status"]);
        for (what, finished) in [("a pass", &run), ("autocomp status", &status)] {
            assert_eq!(finished.code, Some(2), "{what} with {named}: {}", finished.show());
            assert!(finished.stderr.contains(named), "{what} names {named}: {}", finished.show());
            let printed = format!("{}{}", finished.stdout, finished.stderr);
            assert!(!printed.contains(WRONG) && !printed.contains(RIGHT), "{what} shows a password: {printed}");
        }
    }
    assert_eq!(pipeline.head(), head, "nothing claimed, nothing written");

    // With her password alice's pass does the work: the refusals were about credentials.
    pipeline.use_backend("store", &alice(Some(RIGHT)));
    let run = pipeline.run(&[]);
    assert_eq!(run.code, Some(0), "{}", run.show());
    assert_exactly_once(&pipeline, &ids, &[run]);
}

#[test]
fn the_store_service_serves_postgres_to_hosts_without_database_access() {
    let url = postgres::shared().unique_database();
    let dir = tempfile::tempdir().unwrap();
    let service = Service::store_of(&url, dir.path());
    assert_eq!(service.health()["status"], "ok", "{}", service.health());

    // The port over HTTP, as a host without database access has it; the database agrees.
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let http = HttpStore::with_token(&service.url(), Some(TOKEN.into())).unwrap();
    let direct = runtime.block_on(open_store(&url)).unwrap();
    let id = BatchId::new("H0001").unwrap();
    runtime.block_on(http.create_batch(NewBatch::new(id.clone(), BatchType::new("RoundTrip").unwrap()))).unwrap();
    // Not Data_Received: the probe below leaves H0001 alone.
    let noted = NewEvent::new(EventType::new("Noted").unwrap(), Outcome::Success, Agent::new("t").unwrap())
        .with_idempotency_key(IdempotencyKey::new("h0001-noted").unwrap());
    let first = runtime.block_on(http.append_event(&id, noted.clone())).unwrap();
    let again = runtime.block_on(http.append_event(&id, noted)).unwrap();
    assert_eq!(first.seq, again.seq, "a repeated keyed append returns the first event");
    let component = ComponentName::new("checker").unwrap();
    let holder = RunHolder {
        agent: Agent::new("checker/t@h#1").unwrap(),
        host: "h".into(),
        pid: 1,
        claim_key: None,
        liveness: None,
    };
    let claim = runtime.block_on(http.claim(&id, &component, &holder)).unwrap();
    let stored = runtime.block_on(direct.get_batch(&id)).unwrap();
    assert_eq!(stored.events.len(), 1, "{stored:?}");
    assert_eq!(stored.events[0].seq, first.seq);
    assert_eq!(stored.open_runs.iter().map(|run| run.generation).collect::<Vec<_>>(), [claim.generation()]);
    runtime.block_on(http.release(&id, &component, claim.generation())).unwrap();
    assert_eq!(runtime.block_on(http.head()).unwrap(), runtime.block_on(direct.head()).unwrap());

    // A component whose host reaches only the service.
    let pipeline = Pipeline::with_store(PROBE, &url);
    let ids = pipeline.register(5);
    configure_probe(&pipeline, "0s");
    pipeline.use_backend("store", &service.url());
    let run = pipeline.run(&[]);
    assert_eq!(run.code, Some(0), "{}", run.show());
    assert_exactly_once(&pipeline, &ids, &[run]);
    let status = autocomp(&pipeline, &["status", "--format", "json"]);
    assert_eq!(status.code, Some(0), "{}", status.show());
    let rows: serde_json::Value = serde_json::from_str(&status.stdout).unwrap();
    assert_eq!(rows.as_array().map(Vec::len), Some(6), "the five and H0001: {rows:#}");
}

/// A result the store cannot take because it stayed away past `retry_for` ends the pass with
/// exit 5 (store unreachable), not 4 (which means the lock service was lost), and the claims
/// it held are handed back at once, not one `retry_for` after another.
#[test]
fn a_pass_whose_store_stays_away_past_retry_for_exits_5_and_the_next_passes_finish_the_work() {
    let server = Postgres::start();
    let url = server.create_database("outlasted");
    let mut pipeline = Pipeline::with_store(PROBE, &format!("{url}?retry_for=1s&connect_timeout=1s"));
    let ids = pipeline.register(12);
    configure_probe(&pipeline, "100ms");
    let mut passes = vec![pipeline.spawn(&[])];
    wait_for_ledger(&pipeline, &mut passes, 2, "work before the crash");
    server.crash();
    let gave_up = finish(passes.pop().unwrap(), PASS_LIMIT);
    server.restart();
    assert_eq!(gave_up.code, Some(5), "the store is what went away: {}", gave_up.show());
    pipeline.reconnect();
    let mut runs = vec![gave_up];
    runs.extend(finish_the_work(&pipeline, &ids, 3));
    assert_exactly_once(&pipeline, &ids, &runs);
}

/// A statement first prepared on a pooled connection the server has ended (shutdown, crash,
/// failover: SQLSTATE 57P01/57P02) is prepared again on a fresh connection, not failed: a
/// Parse writes nothing. Deterministic here: the test's runtime does not poll the idle
/// connection, so the server's FATAL message is read by the next request, a Parse.
#[test]
fn a_statement_first_prepared_on_a_connection_the_server_ended_is_retried() {
    let server = Postgres::start();
    let url = server.create_database("prepare");
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    // One pooled connection, on which only `open` and `head` have prepared statements.
    let store = runtime.block_on(open_store(&format!("{url}?pool_size=1"))).unwrap();
    runtime.block_on(store.head()).unwrap();
    server.stop_fast();
    server.restart();
    let result = runtime.block_on(store.get_batch(&BatchId::new("B0001").unwrap()));
    assert!(matches!(result, Err(StoreError::NotFound(_))), "a retry on a fresh connection answers: {result:?}");
}

/// A command whose output holds what PostgreSQL's text refuses (NUL) and what would act on a
/// terminal: the result is recorded like any other (not an outage, no run left open), reads
/// back byte for byte, and `autocomp show` prints it with visible escapes.
#[test]
fn a_command_output_with_nul_and_terminal_escapes_is_recorded_and_shown_safely() {
    let url = postgres::shared().unique_database();
    let pipeline = Pipeline::with_store(binary("autocomp-exec"), &url);
    let id = pipeline.register(1).remove(0);
    std::fs::write(pipeline.config_dir().join("ocr.toml"), "").unwrap();
    let noise = r"printf 'bad\000byte\033]0;owned\007\033[31mred\342\200\256txt' >&2; exit 3";
    let args = ["--name", "ocr", "--event-type", "Ocr_Done", "--requires", "Data_Received", "--", "sh", "-c", noise];
    let run = finish(pipeline.command(&args).spawn().unwrap(), PASS_LIMIT);
    assert_eq!(run.code, Some(1), "the batch failed, the pass did not: {}", run.show());
    assert!(
        !run.stdout.chars().chain(run.stderr.chars()).any(autocomp_toolkit::terminal::is_concealing),
        "{}",
        run.show()
    );

    let batch = pipeline.block_on(pipeline.any_store().get_batch(&id)).unwrap();
    assert!(batch.open_runs.is_empty(), "no run left open: {:?}", batch.open_runs);
    let recorded = batch.events.iter().find(|event| event.event_type.as_str() == "Ocr_Done").expect("a result");
    assert_eq!(recorded.outcome, Outcome::Failure);
    let details = recorded.details.to_string();
    assert!(details.contains("bad\\u0000byte\\u001b]0;owned\\u0007\\u001b[31mred\u{202e}txt"), "{details}");

    let shown = autocomp(&pipeline, &["show", id.as_str()]);
    assert_eq!(shown.code, Some(0), "{}", shown.show());
    assert!(!shown.stdout.chars().any(autocomp_toolkit::terminal::is_concealing), "{}", shown.stdout);
    assert!(shown.stdout.contains(r"bad\u0000byte\u001b]0;owned\u0007\u001b[31mred\u202etxt"), "{}", shown.stdout);
}
