//! What one pass sends PostgreSQL: a one-batch pass of the probe component against a server
//! that logs every statement it executes (`log_statement = all`), counted from the server's
//! log. The claim round is `claim_ready`: one read (steering and batch) and one call claiming
//! what was ready with its attempts and checkpoint, instead of a steering read per round, a
//! re-check, an attempt count, a checkpoint read and the claim.

use autocomp_e2e::Pipeline;
use autocomp_test_servers::postgres::{self, Options, Postgres};

const PROBE: &str = env!("CARGO_BIN_EXE_probe-component");

/// The statements the server executed since `from` bytes into its log, in order, each on
/// one line (a statement's later lines are the log's tab-indented ones).
fn executed(server: &Postgres, from: u64) -> Vec<String> {
    let log = std::fs::read(server.log_path()).unwrap();
    let log = String::from_utf8_lossy(&log[from as usize..]).into_owned();
    let mut statements: Vec<String> = Vec::new();
    let mut in_statement = false;
    for line in log.lines() {
        if let Some(more) = line.strip_prefix('\t') {
            if in_statement {
                statements.last_mut().expect("in a statement").extend([" ", more.trim()]);
            }
            continue;
        }
        let started = line.split_once("LOG:  execute ").or_else(|| line.split_once("LOG:  statement: "));
        in_statement = started.is_some();
        if let Some((_, statement)) = started {
            let sql = statement.split_once(": ").map_or(statement, |(_, sql)| sql);
            statements.push(sql.split_whitespace().collect::<Vec<_>>().join(" "));
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
