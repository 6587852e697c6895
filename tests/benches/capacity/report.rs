//! The capacity bench's report of one run (markdown tables: sessions and throughput, the
//! runner's pass phases, the lock and index calls, ZooKeeper, PostgreSQL, sboi) and the
//! headline figures the slope table compares.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use autocomp_e2e::percentile;
use autocomp_test_servers::bench::load_average;

use crate::LockBackend;
use crate::run::{Measured, STORE_POOL, STORES};

/// The headline figures of one run, for the slope table at the end.
pub struct Summary {
    pub workers: usize,
    pub backend: LockBackend,
    pub ramp_secs: f64,
    pub results_per_sec: f64,
    pub passes_per_sec: f64,
    pub lock_writes_per_sec: f64,
    pub lock_writes_per_result: f64,
    pub pg_xact_per_sec: f64,
    pub pg_xact_per_result: f64,
    pub queries_per_sec: f64,
    pub idle_wakes_per_sec: f64,
    pub bench_cores: f64,
    pub pg_cores: f64,
    pub e2e: String,
}

fn short(d: Duration) -> String {
    let us = d.as_secs_f64() * 1e6;
    if us >= 1_000_000.0 {
        format!("{:.2} s", us / 1e6)
    } else if us >= 1_000.0 {
        format!("{:.2} ms", us / 1000.0)
    } else {
        format!("{us:.0} µs")
    }
}

fn p50_p99(samples: &mut [Duration]) -> String {
    samples.sort();
    format!("{} / {}", short(percentile(samples, 0.5)), short(percentile(samples, 0.99)))
}

pub fn table(header: &[&str], rows: &[Vec<String>]) {
    println!("| {} |", header.join(" | "));
    println!("|{}|", header.iter().map(|_| "---").collect::<Vec<_>>().join("|"));
    for row in rows {
        println!("| {} |", row.join(" | "));
    }
    println!();
}

/// Writes per table of the run's database (inserted + updated + deleted), delta.
fn table_writes(m: &Measured, table: &str) -> (f64, f64, f64) {
    let get = |s: &crate::run::Snapshot| s.tables.get(table).copied().unwrap_or_default();
    let (a, b) = (get(&m.after), get(&m.before));
    (a[0] - b[0], a[1] - b[1], a[2] - b[2])
}

pub fn print(m: &mut Measured) -> Summary {
    println!("## {} workers, {} locks\n", m.workers, m.backend.name());
    println!(
        "locks at `{}`; {STORES} `PgStore`s of pool_size={STORE_POOL}; sboi on ports {:?}. Load average before: {}.\n",
        m.locks_url, m.sboi_ports, m.load_before
    );
    let shared = std::sync::Arc::clone(&m.shared);
    let c = &shared.counters;
    let get = |counter: &AtomicU64| counter.load(Ordering::Relaxed) as f64;
    let elapsed = m.elapsed;
    let per_sec = |v: f64| v / elapsed;
    let results = get(&c.results);
    let worked = get(&c.passes_with_work);
    let mut e2e = std::mem::take(&mut *shared.end_to_end.lock().unwrap());
    let e2e_text = p50_p99(&mut e2e);
    let mut samples = std::mem::take(&mut *shared.samples.lock().unwrap());
    println!("### Sessions and throughput\n");
    table(
        &["figure", "value"],
        &[
            vec![
                "lock sessions established".into(),
                format!("{} of {} ({} failed)", m.established, m.workers, m.connect_errors),
            ],
            vec![
                "ramp-up (32 opening at a time)".into(),
                format!("{:.2} s (connect p50 / p99 {})", m.ramp.as_secs_f64(), p50_p99(&mut m.connect_times)),
            ],
            vec!["measured window".into(), format!("{elapsed:.1} s")],
            vec![
                "batches registered (feeder)".into(),
                format!(
                    "{:.0} ({:.1}/s; create_batch p50 / p99 {})",
                    get(&c.registered),
                    per_sec(get(&c.registered)),
                    p50_p99(&mut m.register_latencies)
                ),
            ],
            vec!["stage results (work calls)".into(), format!("{results:.0} ({:.1}/s)", per_sec(results))],
            vec![
                "passes that took up work (runner's phase lines)".into(),
                format!("{worked:.0} ({:.1}/s; {:.2} results each)", per_sec(worked), results / worked.max(1.0)),
            ],
            vec![
                "idle wake-ups (woke, looked, took nothing)".into(),
                format!("{:.0} ({:.1}/s)", get(&c.idle_wakes), per_sec(get(&c.idle_wakes))),
            ],
            vec![
                "batches through all stages".into(),
                format!("{:.0} ({:.1}/s)", get(&c.completed), per_sec(get(&c.completed))),
            ],
            vec!["end-to-end latency, registration to last stage's work, p50 / p99".into(), e2e_text.clone()],
            vec![
                "backlog at the end (registered, last stage not done)".into(),
                format!("{} of {} registered", m.backlog, m.fed),
            ],
            vec![
                "poll lock taken / busy (after waiting)".into(),
                format!(
                    "{:.0} / {:.0} ({:.1} busy/s)",
                    get(&c.poll_taken),
                    get(&c.poll_busy),
                    per_sec(get(&c.poll_busy))
                ),
            ],
            vec![
                "batch locks taken / busy / released; try_lock_many, release_many calls".into(),
                format!(
                    "{:.0} / {:.0} / {:.0}; {:.0}, {:.0}",
                    get(&c.batch_taken),
                    get(&c.batch_busy),
                    get(&c.released),
                    get(&c.lock_many_calls),
                    get(&c.release_many_calls)
                ),
            ],
            vec![
                "errors: watch ended / lock calls / feeder".into(),
                format!("{:.0} / {:.0} / {:.0}", get(&c.watch_errors), get(&c.lock_errors), get(&c.feed_errors)),
            ],
        ],
    );
    if let Some(first) = shared.first_error.lock().unwrap().as_ref() {
        println!("first error: {first}\n");
    }
    println!("### Pass phases (the runner's own phase lines; passes that took up work; µs per pass)\n");
    let mut rows = Vec::new();
    for (name, list) in &mut samples.phases {
        if !name.ends_with("_us") {
            continue;
        }
        list.sort();
        let sum: u64 = list.iter().sum();
        let at = |q: f64| list.get(((list.len().max(1) - 1) as f64 * q).round() as usize).copied().unwrap_or(0);
        rows.push(vec![
            name.trim_end_matches("_us").into(),
            format!("{:.0}", sum as f64 / list.len().max(1) as f64),
            format!("{} / {}", at(0.5), at(0.99)),
            format!("{:.2}", sum as f64 / 1e6 / elapsed),
        ]);
    }
    table(&["phase", "mean µs", "p50 / p99 µs", "busy (tasks x s / s)"], &rows);
    println!("### Lock and index calls (every call in the window)\n");
    let mut rows = Vec::new();
    for (call, list) in &mut samples.locks {
        let calls = list.len() as f64;
        rows.push(vec![
            (*call).into(),
            format!("{calls:.0}"),
            format!("{:.1}", per_sec(calls)),
            format!("{:.2}", calls / results.max(1.0)),
            p50_p99(list),
        ]);
    }
    table(&["call", "calls", "calls/s", "per result", "p50 / p99"], &rows);
    let lock_writes = print_locks(m, results);
    let (xacts, pg_cores) = print_postgres(m, results);
    print_sboi(m, &samples.locks);
    let bench_cpu = m.after.bench_cpu - m.before.bench_cpu;
    println!(
        "bench process CPU (workers' runners, clients, feeder): {bench_cpu:.1} s ({:.2} cores). Load average after: {}.\n",
        bench_cpu / elapsed,
        load_average()
    );
    let queries: usize = samples.locks.iter().filter(|(k, _)| k.ends_with("query")).map(|(_, v)| v.len()).sum();
    Summary {
        workers: m.workers,
        backend: m.backend,
        ramp_secs: m.ramp.as_secs_f64(),
        results_per_sec: per_sec(results),
        passes_per_sec: per_sec(worked),
        lock_writes_per_sec: per_sec(lock_writes),
        lock_writes_per_result: lock_writes / results.max(1.0),
        pg_xact_per_sec: per_sec(xacts),
        pg_xact_per_result: xacts / results.max(1.0),
        queries_per_sec: per_sec(queries as f64),
        idle_wakes_per_sec: per_sec(get(&c.idle_wakes)),
        bench_cores: bench_cpu / elapsed,
        pg_cores,
        e2e: e2e_text,
    }
}

/// The lock service's table: ZooKeeper's writes and load, or the PostgreSQL lock tables'
/// writes (the lease renewals apart). Answers the lock service's writes in the window.
fn print_locks(m: &Measured, results: f64) -> f64 {
    let elapsed = m.elapsed;
    match m.backend {
        LockBackend::ZooKeeper => {
            println!("### ZooKeeper (3-node ensemble)\n");
            let writes = (m.after.zxid.unwrap_or(0) - m.before.zxid.unwrap_or(0)) as f64;
            let cpu = m.after.zk_cpu - m.before.zk_cpu;
            let mut rows = vec![
                vec![
                    "writes (zxid delta: creates, deletes, multis, sessions)".into(),
                    format!(
                        "{writes:.0} ({:.1}/s; {:.3} per stage result)",
                        writes / elapsed,
                        writes / results.max(1.0)
                    ),
                ],
                vec![
                    "sessions (alive connections, max sampled)".into(),
                    format!("{:.0}", m.sampled.zk_connections_max),
                ],
                vec![
                    "outstanding requests (max sampled, any node)".into(),
                    format!("{:.0}", m.sampled.zk_outstanding_max),
                ],
                vec!["ZooKeeper CPU (3 JVMs)".into(), format!("{cpu:.1} s ({:.2} cores)", cpu / elapsed)],
            ];
            for (n, mntr) in m.zk_mntr.iter().enumerate() {
                let get = |key: &str| mntr.get(key).map_or("?", |s| s.as_str()).to_owned();
                rows.push(vec![
                    format!("node {n} mntr ({})", get("zk_server_state")),
                    format!(
                        "znodes {}, ephemerals {}, watches {}, connections {}, latency avg/max {} / {} ms, packets in {}",
                        get("zk_znode_count"),
                        get("zk_ephemerals_count"),
                        get("zk_watch_count"),
                        get("zk_num_alive_connections"),
                        get("zk_avg_latency"),
                        get("zk_max_latency"),
                        get("zk_packets_received")
                    ),
                ]);
            }
            table(&["figure", "value"], &rows);
            writes
        }
        LockBackend::Postgres => {
            println!("### PostgreSQL locks (the store's server)\n");
            let (ins, upd, del) = table_writes(m, "autocomp_locks");
            let (w_ins, renewals, w_del) = table_writes(m, "autocomp_lock_workers");
            let read = |s: &crate::run::Snapshot| s.tables.get("autocomp_lock_workers").map_or(0.0, |t| t[3]);
            let worker_rows_read = read(&m.after) - read(&m.before);
            let lock_writes = ins + upd + del;
            let rows = vec![
                vec![
                    "lock rows written (autocomp_locks ins + upd + del)".into(),
                    format!(
                        "{lock_writes:.0} ({:.1}/s; {:.3} per stage result)",
                        lock_writes / elapsed,
                        lock_writes / results.max(1.0)
                    ),
                ],
                vec![
                    "lease renewals (autocomp_lock_workers updates)".into(),
                    format!(
                        "{renewals:.0} ({:.1}/s; {:.2} per worker per s)",
                        renewals / elapsed,
                        renewals / elapsed / m.established.max(1) as f64
                    ),
                ],
                vec!["workers registered / removed in the window".into(), format!("{w_ins:.0} / {w_del:.0}")],
                vec![
                    "worker rows read (the watch of busy locks' holders, and each renewal's own row)".into(),
                    format!("{worker_rows_read:.0} ({:.0}/s)", worker_rows_read / elapsed),
                ],
            ];
            table(&["figure", "value"], &rows);
            lock_writes + renewals
        }
    }
}

/// The store's server: transactions, tuples, connections, CPU, functions, writes per table.
/// Answers the transactions and the server's cores.
fn print_postgres(m: &Measured, results: f64) -> (f64, f64) {
    let elapsed = m.elapsed;
    println!("### PostgreSQL (database {})\n", m.database);
    let (a, b) = (&m.after, &m.before);
    let xacts = (a.db[0] - b.db[0]) + (a.db[1] - b.db[1]);
    let tuples = a.db[2] - b.db[2];
    let cpu = a.pg_cpu - b.pg_cpu;
    let s = &m.sampled;
    let mut rows = vec![
        vec![
            "transactions (commits + rollbacks)".into(),
            format!("{xacts:.0} ({:.0}/s; {:.2} per stage result)", xacts / elapsed, xacts / results.max(1.0)),
        ],
        vec![
            "tuples written (ins + upd + del)".into(),
            format!("{tuples:.0} ({:.1} per stage result)", tuples / results.max(1.0)),
        ],
        vec![
            "connections to the database (max sampled; active avg / max)".into(),
            format!(
                "{:.0}; active {:.1} / {:.0}",
                s.pg_connections_max,
                s.pg_active_sum / s.samples.max(1) as f64,
                s.pg_active_max
            ),
        ],
        vec![
            "server CPU (postmaster and backends)".into(),
            format!("{cpu:.1} s ({:.2} cores; {:.0} µs per stage result)", cpu / elapsed, cpu / results.max(1.0) * 1e6),
        ],
    ];
    for (name, calls) in &a.functions {
        let calls = calls - b.functions.get(name).copied().unwrap_or(0.0);
        if calls > 0.0 {
            rows.push(vec![
                format!("function {name}"),
                format!(
                    "{calls:.0} calls ({:.1}/s; {:.2} per stage result)",
                    calls / elapsed,
                    calls / results.max(1.0)
                ),
            ]);
        }
    }
    for table_name in a.tables.keys() {
        let (ins, upd, del) = table_writes(m, table_name);
        if ins + upd + del > 0.0 {
            rows.push(vec![
                format!("table {table_name}: ins / upd / del"),
                format!(
                    "{ins:.0} / {upd:.0} / {del:.0} ({:.2} rows per stage result)",
                    (ins + upd + del) / results.max(1.0)
                ),
            ]);
        }
    }
    table(&["figure", "value"], &rows);
    print_statements(m, results);
    (xacts, cpu / elapsed)
}

/// Most statements by time executing in the window: where the server's time goes.
fn print_statements(m: &Measured, results: f64) {
    const SHOWN: usize = 10;
    let (a, b) = (&m.after.statements, &m.before.statements);
    let mut spent: Vec<(f64, f64, f64, &str)> = a
        .iter()
        .map(|(id, after)| {
            let before = b.get(id).cloned().unwrap_or_default();
            (after.exec_ms - before.exec_ms, after.calls - before.calls, after.rows - before.rows, after.text.as_str())
        })
        .filter(|(_, calls, _, _)| *calls > 0.0)
        .collect();
    spent.sort_by(|x, y| y.0.total_cmp(&x.0));
    let total: f64 = spent.iter().map(|s| s.0).sum();
    println!("#### Time executing per statement (pg_stat_statements; {total:.0} ms in all, elapsed: waits count)\n");
    let rows: Vec<Vec<String>> = spent
        .iter()
        .take(SHOWN)
        .map(|(ms, calls, rows, text)| {
            vec![
                format!("{ms:.0} ms ({:.0}%)", ms / total.max(1e-9) * 100.0),
                format!("{calls:.0} ({:.1}/s; {:.2} per stage result)", calls / m.elapsed, calls / results.max(1.0)),
                format!("{:.2} ms", ms / calls),
                format!("{:.1}", rows / calls),
                format!("`{}`", text.replace('`', "'")),
            ]
        })
        .collect();
    table(&["time", "calls", "mean", "rows per call", "statement"], &rows);
}

fn print_sboi(m: &Measured, calls: &std::collections::BTreeMap<&'static str, Vec<Duration>>) {
    println!("### sboi (two services)\n");
    let mut rows = Vec::new();
    for (i, port) in m.sboi_ports.iter().enumerate() {
        let cpu = m.after.sboi_cpu[i] - m.before.sboi_cpu[i];
        let asked = |what: &str| calls.get(format!("sboi {i} {what}").as_str()).map_or(0, Vec::len) as f64;
        let (queries, covers) = (asked("query"), asked("covers"));
        rows.push(vec![
            format!("service {i} (port {port})"),
            format!("{queries:.0} queries ({:.0}/s), {covers:.0} covers", queries / m.elapsed),
            format!("{cpu:.1} s ({:.2} cores; {:.0} µs per query)", cpu / m.elapsed, cpu / queries.max(1.0) * 1e6),
        ]);
    }
    table(&["service", "calls", "CPU"], &rows);
}
