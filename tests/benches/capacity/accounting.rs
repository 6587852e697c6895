//! The capacity bench's backend accounting: CPU per process from /proc, PostgreSQL's
//! counters through psql (transactions, tuples per table, function calls, connections,
//! time per statement) and ZooKeeper's four-letter words (zxid, `mntr`).

use autocomp_test_servers::bench::proc_stat;
use std::collections::BTreeMap;

use autocomp_e2e::zk::{self, ZooKeeper};
use autocomp_test_servers::Postgres;

fn pids() -> impl Iterator<Item = String> {
    std::fs::read_dir("/proc").into_iter().flatten().flatten().filter_map(|entry| {
        let name = entry.file_name().to_str()?.to_owned();
        name.bytes().all(|b| b.is_ascii_digit()).then_some(name)
    })
}

fn cmdline(pid: &str) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|bytes| bytes.split(|b| *b == 0).map(|a| String::from_utf8_lossy(a).into_owned()).collect())
        .unwrap_or_default()
}

/// The pid of the process whose command line has an argument equal to `arg` and one
/// containing `also` (the services are our children, but `Service` keeps its `Child` private).
pub fn pid_with_args(arg: &str, also: &str) -> Option<String> {
    pids().find(|pid| {
        let args = cmdline(pid);
        args.iter().any(|a| a == arg) && args.iter().any(|a| a.contains(also))
    })
}

/// CPU seconds of a process and of its live children (PostgreSQL's backends).
pub fn tree_cpu(pid: &str) -> f64 {
    let own = pid.parse::<u32>().ok();
    let mut total = proc_stat(pid).map_or(0.0, |(_, cpu, reaped)| cpu + reaped);
    for child in pids() {
        if let Some((parent, cpu, _)) = proc_stat(&child)
            && Some(parent) == own
        {
            total += cpu;
        }
    }
    total
}

pub fn own_cpu() -> f64 {
    proc_stat("self").map_or(0.0, |(_, cpu, _)| cpu)
}

/// A ZooKeeper node's java process and its `zoo.cfg`, found by its client port.
pub fn zk_node(port: u16) -> Option<(String, String)> {
    pids().find_map(|pid| {
        let args = cmdline(&pid);
        if !args.iter().any(|a| a.contains("QuorumPeerMain")) {
            return None;
        }
        let config = args.iter().find(|a| a.ends_with("zoo.cfg"))?.clone();
        let text = std::fs::read_to_string(&config).ok()?;
        text.lines().any(|line| line == format!("clientPort={port}")).then_some((pid, config))
    })
}

/// `mntr` of one node as name -> value.
pub fn mntr(port: u16) -> BTreeMap<String, String> {
    zk::four_letter(port, "mntr")
        .unwrap_or_default()
        .lines()
        .filter_map(|line| line.split_once('\t'))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect()
}

pub fn mntr_number(m: &BTreeMap<String, String>, key: &str) -> f64 {
    m.get(key).and_then(|v| v.parse().ok()).unwrap_or(0.0)
}

/// The ensemble's last zxid (the leader's): every write moves it by one.
pub fn zxid(zookeeper: &ZooKeeper) -> i64 {
    (0..3).map(|n| zookeeper.zxid(n)).max().unwrap_or(0)
}

/// `pg_stat_database` for the run's database: commits + rollbacks, and tuples written.
pub fn pg_database_stats(pg: &Postgres, database: &str) -> [f64; 4] {
    let out = pg.psql(
        "postgres",
        &format!(
            "SELECT xact_commit, xact_rollback, tup_inserted + tup_updated + tup_deleted, tup_fetched \
             FROM pg_stat_database WHERE datname = '{database}'"
        ),
    );
    let mut numbers = out.trim().split('|').map(|n| n.trim().parse::<f64>().unwrap_or(0.0));
    [(); 4].map(|_| numbers.next().unwrap_or(0.0))
}

/// Calls of each of the store's server-side functions (`track_functions=all`).
pub fn pg_function_calls(pg: &Postgres, database: &str) -> BTreeMap<String, f64> {
    pg.psql(database, "SELECT funcname, calls FROM pg_stat_user_functions")
        .lines()
        .filter_map(|line| line.split_once('|'))
        .map(|(name, calls)| (name.trim().to_owned(), calls.trim().parse().unwrap_or(0.0)))
        .collect()
}

/// One statement's totals in `pg_stat_statements` (top-level statements only, so a
/// function's own statements count in the call that ran them).
#[derive(Clone, Default)]
pub struct Statement {
    pub calls: f64,
    /// Time executing, in milliseconds: elapsed, so waits for locks count too.
    pub exec_ms: f64,
    pub rows: f64,
    /// The statement's first characters, on one line.
    pub text: String,
}

/// The run's database's statements by query id (`pg_stat_statements`, which the bench's
/// server preloads).
pub fn pg_statements(pg: &Postgres, database: &str) -> BTreeMap<String, Statement> {
    pg.psql(
        "postgres",
        &format!(
            "SELECT s.queryid, s.calls, s.total_exec_time, s.rows, \
             translate(left(regexp_replace(s.query, '\\s+', ' ', 'g'), 90), '|', '/') \
             FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = '{database}'"
        ),
    )
    .lines()
    .filter_map(|line| {
        let mut fields = line.splitn(5, '|');
        let id = fields.next()?.to_owned();
        let mut number = || fields.next().and_then(|n| n.trim().parse::<f64>().ok()).unwrap_or(0.0);
        let (calls, exec_ms, rows) = (number(), number(), number());
        let text = fields.next().unwrap_or_default().to_owned();
        Some((id, Statement { calls, exec_ms, rows, text }))
    })
    .collect()
}

/// Connections to the run's database: (all, active).
pub fn pg_connections(pg: &Postgres, database: &str) -> (f64, f64) {
    let out = pg.psql(
        "postgres",
        &format!(
            "SELECT count(*), count(*) FILTER (WHERE state = 'active') FROM pg_stat_activity \
             WHERE datname = '{database}'"
        ),
    );
    let mut numbers = out.trim().split('|').map(|n| n.trim().parse::<f64>().unwrap_or(0.0));
    (numbers.next().unwrap_or(0.0), numbers.next().unwrap_or(0.0))
}

/// Per table of the run's database: rows written (inserted, updated, deleted) and rows read
/// (sequential + index fetches), `pg_stat_user_tables`.
pub fn pg_table_stats(pg: &Postgres, database: &str) -> BTreeMap<String, [f64; 4]> {
    pg.psql(
        database,
        "SELECT relname, n_tup_ins, n_tup_upd, n_tup_del, coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0) \
         FROM pg_stat_user_tables",
    )
    .lines()
    .filter_map(|line| {
        let mut fields = line.split('|').map(str::trim);
        let name = fields.next()?.to_owned();
        let mut numbers = fields.map(|n| n.parse::<f64>().unwrap_or(0.0));
        Some((name, [(); 4].map(|_| numbers.next().unwrap_or(0.0))))
    })
    .collect()
}

/// What the sampler saw while measuring.
#[derive(Default, Clone)]
pub struct Sampled {
    pub samples: usize,
    pub pg_connections_max: f64,
    pub pg_active_sum: f64,
    pub pg_active_max: f64,
    pub zk_outstanding_max: f64,
    pub zk_connections_max: f64,
}
