//! What one pass sends PostgreSQL: a one-batch pass of the probe component (and a watcher's
//! claim of a batch its look judged ready) against a server that logs every statement it
//! executes (`log_statement = all`), counted from the server's log. The claim round is `claim_ready`: one read (steering and batch) and one call claiming
//! what was ready with its attempts and checkpoint, instead of a steering read per round, a
//! re-check, an attempt count, a checkpoint read and the claim.

use std::time::{Duration, Instant};

use autocomp_e2e::{PROBED, Pipeline, finish, wait_until};
use autocomp_test_servers::postgres::{self, Options, Postgres};

const PROBE: &str = env!("CARGO_BIN_EXE_probe-component");

/// The statements the server executed since `from` bytes into its log, in order, each on
/// one line (a statement's later lines are the log's tab-indented ones).
fn executed(server: &Postgres, from: u64) -> Vec<String> {
    executed_by_backend(server, from).into_iter().map(|(_, sql)| sql).collect()
}

/// `executed`, each statement with the server process that ran it (the log line's `[pid]`).
fn executed_by_backend(server: &Postgres, from: u64) -> Vec<(String, String)> {
    let log = std::fs::read(server.log_path()).unwrap();
    let log = String::from_utf8_lossy(&log[from as usize..]).into_owned();
    let mut statements: Vec<(String, String)> = Vec::new();
    let mut in_statement = false;
    for line in log.lines() {
        if let Some(more) = line.strip_prefix('\t') {
            if in_statement {
                statements.last_mut().expect("in a statement").1.extend([" ", more.trim()]);
            }
            continue;
        }
        let started = line.split_once("LOG:  execute ").or_else(|| line.split_once("LOG:  statement: "));
        in_statement = started.is_some();
        if let Some((prefix, statement)) = started {
            let backend = prefix.rsplit_once('[').and_then(|(_, pid)| pid.split_once(']')).map_or("", |(pid, _)| pid);
            let sql = statement.split_once(": ").map_or(statement, |(_, sql)| sql);
            statements.push((backend.to_owned(), sql.split_whitespace().collect::<Vec<_>>().join(" ")));
        }
    }
    statements
}

/// A one-batch pass, from the process's start to its exit, claims in two statements (one
/// read of the steering and the batch, one call claiming it with its attempts and
/// checkpoint), reads the steering once, and sends no separate re-check, attempt count or
/// checkpoint read. The rest (opening the store, the index catching up with the change
/// feed, the registry's reports, the result) is printed, not counted here.
#[test]
fn a_one_batch_pass_claims_in_two_statements_and_reads_the_steering_once() {
    postgres::require_installed();
    let server = Postgres::start_with(Options::default().setting("log_statement", "all"));
    let pipeline = Pipeline::with_store(PROBE, &server.unique_database());
    let batch = pipeline.register_one("RT-1", true);
    let from = std::fs::metadata(server.log_path()).unwrap().len();

    let pass = pipeline.run(&[]);
    let statements = executed(&server, from);
    assert_eq!(pass.code, Some(0), "{}", pass.show());
    assert_eq!(pipeline.events(&batch, autocomp_e2e::PROBED).len(), 1, "the pass recorded its result");
    let shown: Vec<String> = statements.iter().map(|s| s.chars().take(110).collect()).collect();
    println!("{} statements:\n{}", statements.len(), shown.join("\n"));
    let count = |pattern: &str| statements.iter().filter(|s| s.contains(pattern)).count();
    let claim = (count("FROM steering s LEFT JOIN LATERAL"), count("autocomp_claim_ready("));
    assert_eq!(claim, (1, 1), "one read, one claim: {shown:#?}");
    assert_eq!(count("FROM steering WHERE id = 1"), 1, "the steering read once: {shown:#?}");
    for separate in ["autocomp_claim_many(", "FROM checkpoints WHERE", "AND claim_seq > $3"] {
        assert_eq!(count(separate), 0, "{separate} sent: {shown:#?}");
    }
}

/// A watcher claims a batch its look found ready on the change feed's summaries by the stamp
/// it judged it at (`claim_ready_judged`): one transaction sent whole, in which the server
/// runs the read (with the component's failed attempts, planned once per connection, not
/// again at every claim) and `autocomp_claim_judged` (planned as the server is configured),
/// and no separate read-then-claim round (`autocomp_claim_ready` called on its own).
#[test]
fn a_watcher_claims_a_batch_its_look_judged_in_one_transaction() {
    postgres::require_installed();
    let server = Postgres::start_with(Options::default().setting("log_statement", "all"));
    let pipeline = Pipeline::with_store(PROBE, &server.unique_database());
    pipeline.configure("watch_heartbeat = \"10m\"\n");
    let mut command = pipeline.command(&["--watch"]);
    command.stderr(std::fs::File::create(pipeline.path("watcher.log")).unwrap());
    let watcher = command.spawn().expect("the probe starts");
    let registered = wait_until(Instant::now() + Duration::from_secs(30), || {
        !pipeline.block_on(pipeline.any_store().components()).expect("registry readable").is_empty()
    });
    assert!(registered, "the watcher's first pass never registered the probe");
    let from = std::fs::metadata(server.log_path()).unwrap().len();

    let batch = pipeline.register_one("RT-W1", true);
    let worked = wait_until(Instant::now() + Duration::from_secs(30), || pipeline.events(&batch, PROBED).len() == 1);
    let by_backend = executed_by_backend(&server, from);
    let statements: Vec<&str> = by_backend.iter().map(|(_, sql)| sql.as_str()).collect();
    // SAFETY: kill(2) on the pid of a child we spawned and have not reaped yet.
    assert_eq!(unsafe { libc::kill(watcher.id() as libc::pid_t, libc::SIGTERM) }, 0);
    let stopped = finish(watcher, Duration::from_secs(30));
    assert!(worked, "the watcher did not work the batch: {}", stopped.show());
    let shown: Vec<String> = statements.iter().map(|s| s.chars().take(110).collect()).collect();
    let count = |pattern: &str| statements.iter().filter(|s| s.contains(pattern)).count();
    assert_eq!(count("autocomp_claim_judged("), 1, "claimed by the stamp it judged: {shown:#?}");
    assert_eq!(count("autocomp_claim_ready("), 0, "no read-then-claim round: {shown:#?}");
    assert_eq!(count("FROM steering s LEFT JOIN LATERAL"), 1, "one read, in the claim's transaction: {shown:#?}");
    let claimer = &by_backend.iter().find(|(_, sql)| sql.contains("autocomp_claim_judged(")).expect("claimed").0;
    let on_claimer: Vec<&str> =
        by_backend.iter().filter(|(backend, _)| backend == claimer).map(|(_, sql)| sql.as_str()).collect();
    let at = on_claimer.iter().position(|sql| sql.contains("autocomp_claim_judged(")).unwrap();
    let transaction: Vec<String> = on_claimer[at.saturating_sub(3)..(at + 2).min(on_claimer.len())]
        .iter()
        .map(|sql| sql.chars().take(120).collect())
        .collect();
    let expected = [
        "BEGIN; SET LOCAL plan_cache_mode = force_generic_plan; SET LOCAL enable_seqscan = off; SET LOCAL jit = off",
        "SELECT x.*, s.state, s.version",
        "SET LOCAL plan_cache_mode TO DEFAULT; SET LOCAL enable_seqscan TO DEFAULT; SET LOCAL jit TO DEFAULT",
        "SELECT r_index, r_kind",
        "COMMIT",
    ];
    let matches =
        transaction.len() == expected.len() && transaction.iter().zip(expected).all(|(sql, e)| sql.starts_with(e));
    assert!(matches, "one transaction, its read planned once and by index: {transaction:#?}");
}

/// The judged round itself, not the usual one it falls back to, answers a batch's failed
/// attempts from its newest `Reset` and a retry with its claim key with the run the first
/// call opened: the server runs `autocomp_claim_judged` for each and never
/// `autocomp_claim_ready` on its own.
#[test]
fn a_judged_round_counts_attempts_from_a_reset_and_answers_a_retry_without_falling_back() {
    use autocomp_e2e::{DATA_RECEIVED, PROBE_NAME};
    use autocomp_model::{Agent, ComponentName, EventType, NewEvent, RunHolder, Seq};
    use autocomp_store::ReadyClaimRequest;
    postgres::require_installed();
    let server = Postgres::start_with(Options::default().setting("log_statement", "all"));
    let pipeline = Pipeline::with_store(PROBE, &server.unique_database());
    let store = pipeline.any_store();
    let id = pipeline.register_one("RT-J1", true);
    let probe = ComponentName::new(PROBE_NAME).unwrap();
    let holder = |key: Option<&str>| RunHolder {
        agent: Agent::new("probe/1.0@host#1").unwrap(),
        host: "host".into(),
        pid: 1,
        claim_key: key.map(|key| autocomp_model::IdempotencyKey::new(key).unwrap()),
        liveness: None,
    };
    // Two attempts abandoned, a `Reset` of the probe's event type, one more abandoned, and
    // none open (the last one's successor released).
    let abandon = |times: usize| {
        for _ in 0..times {
            pipeline.block_on(store.claim(&id, &probe, &holder(None))).unwrap();
        }
        let last = pipeline.block_on(store.claim(&id, &probe, &holder(None))).unwrap();
        pipeline.block_on(store.release(&id, &probe, last.generation())).unwrap();
    };
    abandon(2);
    let reset = NewEvent::reset(
        vec![EventType::new(PROBED).unwrap()],
        Agent::new("operator:ann").unwrap(),
        serde_json::json!({}),
    );
    let reset = pipeline.block_on(store.append_event(&id, reset)).unwrap();
    abandon(1);
    let expected = pipeline.block_on(store.failed_attempts(&id, &probe, reset.seq)).unwrap();
    assert_eq!(expected, 1, "one attempt abandoned since the reset");
    let summary = pipeline.block_on(store.get_summaries(std::slice::from_ref(&id))).unwrap().remove(0);
    let descriptor = serde_json::from_value(serde_json::json!({
        "name": PROBE_NAME, "version": "1.0", "event_type": PROBED, "trigger": {"requires": [DATA_RECEIVED]},
        "max_attempts": 3, "retry_backoff": "90s", "queue_size": 5, "max_runtime": "2h",
    }))
    .unwrap();
    let version = pipeline.block_on(store.steering()).unwrap().version;
    let request = ReadyClaimRequest {
        batches: vec![id.clone()],
        descriptor,
        holder: holder(Some("judged-key-1")),
        force: false,
        known_steering: Some(version),
        exclusive: false,
        takeovers: Vec::new(),
    };
    let from = std::fs::metadata(server.log_path()).unwrap().len();
    let stamps: [Seq; 1] = [summary.changed_seq];
    let first = pipeline.block_on(store.claim_ready_judged(&request, &stamps)).unwrap().answers.remove(0).unwrap();
    let again = pipeline.block_on(store.claim_ready_judged(&request, &stamps)).unwrap().answers.remove(0).unwrap();
    let statements = executed(&server, from);
    let shown: Vec<String> = statements.iter().map(|s| s.chars().take(110).collect()).collect();
    let count = |pattern: &str| statements.iter().filter(|s| s.contains(pattern)).count();
    assert_eq!(first.failed_attempts, expected, "counted from the reset");
    let (first_run, again_run) = (first.claim.unwrap().run, again.claim.unwrap().run);
    assert_eq!(again_run, first_run, "the retry answers the run the first call opened");
    assert_eq!(count("autocomp_claim_judged("), 2, "both judged: {shown:#?}");
    assert_eq!(count("autocomp_claim_ready("), 0, "neither fell back: {shown:#?}");
}
