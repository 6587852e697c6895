//! Retention benchmark (issue #43): `autocomp prune` (`Operator::prune`) over a store of
//! 1,000,000 finished batches of 10 events each, on SQLite (opened with the default
//! settings: every commit synced) and on PostgreSQL (Debian's, started by `autocomp-test-servers` under /var/tmp,
//! `fsync=on`) in the same run, one after the other, while a pass loop claims and records on
//! other batches of the same store. Everything shares the machine's cores: server, operator,
//! pass loop and this bench.
//!
//!     CARGO_INCREMENTAL=0 cargo bench -p autocomp-e2e --bench prune
//!
//! `AUTOCOMP_BENCH_SCALE` (a float, default 1) multiplies every count (`=0.01` for a look at
//! 10,000 batches); `AUTOCOMP_BENCH_PG_SCALE`, if set, is PostgreSQL's instead: its store takes
//! about 7 kB of disk per batch with its WAL and export, SQLite's about 4 kB, and a backend
//! refuses to start unless that leaves 1.5 GB of /var/tmp's disk free. The run recorded in
//! BENCHMARKS.md (8.3 GB free at its start, 1.2 GB at its lowest) was
//!
//!     CARGO_INCREMENTAL=0 AUTOCOMP_BENCH_PG_SCALE=0.5 cargo bench -p autocomp-e2e --bench prune
//!
//! Without the `--bench` argument that `cargo bench` passes (under `cargo test --all-targets`)
//! it only does a smoke run of 200 batches on each backend.
//!
//! The store is filled by SQL, not through the port (1M batches x 10 events would take hours),
//! with the rows the store's own writes leave: SQLite through rusqlite in one transaction (the
//! batch's compact summary, `stored_bytes`, `event_count`, `store_head`), PostgreSQL by
//! `INSERT ... SELECT generate_series` through psql (`batches` with its sizes, `events`,
//! `batch_effective`, the `store_seq` sequence past every seq). A filled store is checked
//! before anything is timed: `get_summaries` of a few batches of each kind equals
//! `BatchSummary::of(get_batch)`, and their sizes are recounted from their rows.
//!
//! Three kinds of batches, each created at one seq and its events spread over the log as in a
//! pipeline with 1,000 batches in flight (a block of 1,000 batches has its first steps, then
//! its second steps, ...):
//! - `Archive` (the 1M, in the policy): 10 events outside runs and without idempotency keys (as
//!   the PostgreSQL bench fills them; the disk here has no room for 10M keys more):
//!   `Data_Received`; `Checksums_Verified` failed then succeeded; `Structure_Checked` failed
//!   then succeeded; `Metadata_Extracted` twice; `Data_Archived` failed, succeeded, succeeded.
//!   Five effective successes and five superseded events: a prune removes five and adds its
//!   `History_Pruned` marker. Each event's details are a small report (~200 bytes of JSON)
//!   with a sha256 digest in it, so the export compresses as real checksums would (7.6x).
//! - `Sample` (10,000, the same events, in a second policy): pruned after the measured prune,
//!   and its export imported again: the import rate.
//! - `Live` (100,000 + 2,000 for the baseline, in no policy): `Data_Received` and `Checked`, ready for the pass loop's
//!   component (`requires Checked`, `blocked_by Archived`).
//!
//! What it measures, per backend (one table at the end, each figure with its goal):
//! - the selection alone: `prune --dry-run` (every batch's summary read, the policy applied);
//! - the prune of the 1M: the whole call's wall time and batches/s, and its phases timed from
//!   outside by watching the export directory: selection (until the `.partial` file appears),
//!   export (until the file's last write, its mtime), verify (sync + read back, until the file
//!   has its own name), prune (after the manifest appears, `prune_histories` in transactions of
//!   500, until the call returns);
//! - a pass loop on the same store (its own connection, as a component's process): every 20 ms
//!   `claim_ready` of one `Live` batch, then its `Archived` result appended in that run; each
//!   iteration's latency, while the prune runs and before it (baseline);
//! - the export's compressed bytes per batch and `Operator::import` of the sample's export.
//!
//! PostgreSQL runs with `pg_stat_statements` (`track=all`) loaded: the statements that took
//! the prune's server time are printed after the table.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

use autocomp_e2e::percentile;
use autocomp_framework::config::Backends;
use autocomp_model::{
    Agent, BatchId, BatchSummary, ComponentDescriptor, ComponentName, EventType, NewEvent, Outcome, RunHolder, Seq,
    SummaryState, Timestamp,
};
use autocomp_ops::operator::{Operator, PruneView};
use autocomp_store::prelude::*;
use autocomp_store::{PgStore, ReadyClaimRequest, SqliteStore};
use autocomp_test_servers::bench::{disk_temp_dir, load_average, proc_stat, server_cpu, thousands};
use autocomp_test_servers::{Options, Postgres};
use serde_json::{Value, json};

/// Sizes at scale 1; every count is multiplied by the scale.
const ARCHIVE_BATCHES: f64 = 1_000_000.0;
const SAMPLE_BATCHES: f64 = 10_000.0;
const LIVE_BATCHES: f64 = 100_000.0;
const BASELINE_PASSES: f64 = 2_000.0;
/// The scale of a smoke run: 200 batches to prune.
const SMOKE_SCALE: f64 = 0.0002;

/// Goals of the whole `prune` call, batches pruned per second.
const GOAL_SQLITE: f64 = 2_000.0;
const GOAL_POSTGRES: f64 = 1_000.0;

/// How often the pass loop starts an iteration (a component's pass claiming its backlog one
/// batch at a time, paced so the loop itself does not take a core from the prune).
const PASS_INTERVAL: Duration = Duration::from_millis(20);
/// Batches in flight in the filled log (see the module).
const IN_FLIGHT: usize = 1_000;
/// Batches per psql transaction of the PostgreSQL fill.
const PG_FILL_CHUNK: usize = 100_000;
/// Disk a backend takes per batch of the fixture, with its export (and for PostgreSQL its
/// WAL), as measured (SQLite 3.5 kB as filled, PostgreSQL 5.0 kB as filled and 6.4 kB after
/// the prune, the export 0.5 kB, PostgreSQL's WAL up to 1 GB) with some room: what a run
/// checks it has.
const SQLITE_BYTES_PER_BATCH: u64 = 5_000;
const POSTGRES_BYTES_PER_BATCH: u64 = 7_000;
/// The agent of every filled event.
const FILLER: &str = "bench-filler/0.1.0@bench#1";
/// How often the export directory is looked at for the phases.
const WATCH_EVERY: Duration = Duration::from_millis(5);

struct Config {
    scale: f64,
    /// PostgreSQL's scale, when `AUTOCOMP_BENCH_PG_SCALE` gives one of its own (its store
    /// takes about twice SQLite's disk).
    pg_scale: f64,
    smoke: bool,
}

impl Config {
    fn from_env() -> Self {
        let autocomp_test_servers::bench::BenchScale { scale, smoke } =
            autocomp_test_servers::bench::BenchScale::from_env(SMOKE_SCALE);
        let pg_scale = match std::env::var("AUTOCOMP_BENCH_PG_SCALE") {
            Ok(text) if !smoke => text
                .trim()
                .parse::<f64>()
                .ok()
                .filter(|scale| scale.is_finite() && *scale > 0.0)
                .unwrap_or_else(|| panic!("AUTOCOMP_BENCH_PG_SCALE={text:?} is not a positive number")),
            _ => scale,
        };
        Self { scale, pg_scale, smoke }
    }
}

fn count(scale: f64, base: f64, min: usize) -> usize {
    ((base * scale).round() as usize).max(min)
}

/// A progress line on stderr with the seconds since the bench began.
macro_rules! progress {
    ($start:expr, $($arg:tt)*) => {
        eprintln!("[{:7.1} s] {}", $start.elapsed().as_secs_f64(), format!($($arg)*))
    };
}

// ---------------------------------------------------------------------------------------------
// The fixture's layout

/// One event of a batch's log, in order.
struct Step {
    event_type: &'static str,
    success: bool,
}

const fn ok(event_type: &'static str) -> Step {
    Step { event_type, success: true }
}

const fn failed(event_type: &'static str) -> Step {
    Step { event_type, success: false }
}

/// A finished batch: five types, each ending in a success; five events superseded.
const FINISHED: [Step; 10] = [
    ok("Data_Received"),
    failed("Checksums_Verified"),
    ok("Checksums_Verified"),
    failed("Structure_Checked"),
    ok("Structure_Checked"),
    ok("Metadata_Extracted"),
    ok("Metadata_Extracted"),
    failed("Data_Archived"),
    ok("Data_Archived"),
    ok("Data_Archived"),
];

/// A batch the pass loop's component is ready for.
const LIVE: [Step; 2] = [ok("Data_Received"), ok("Checked")];

/// Batches of one type, filled at seqs `base + 1 ..= end()`.
struct Group {
    prefix: &'static str,
    batch_type: &'static str,
    count: usize,
    steps: &'static [Step],
    base: i64,
}

impl Group {
    /// The id of the `g`-th batch (from 0).
    fn id(&self, g: usize) -> String {
        format!("{}{:09}-RT1", self.prefix, g + 1)
    }

    fn batch_id(&self, g: usize) -> BatchId {
        BatchId::new(self.id(g)).expect("a valid batch id")
    }

    fn events(&self) -> usize {
        self.steps.len()
    }

    /// Seqs a batch takes: its creation and its events.
    fn span(&self) -> i64 {
        self.steps.len() as i64 + 1
    }

    /// The `g`-th batch's block: its first seq less one, its batches, and `g`'s place in it.
    fn block(&self, g: usize) -> (i64, i64, i64) {
        let first = g / IN_FLIGHT * IN_FLIGHT;
        let width = IN_FLIGHT.min(self.count - first);
        (self.base + first as i64 * self.span(), width as i64, (g - first) as i64)
    }

    fn created_seq(&self, g: usize) -> i64 {
        let (base, _, j) = self.block(g);
        base + j + 1
    }

    /// The seq of the `g`-th batch's `k`-th event (from 1): the block's batches are created,
    /// then each has its first event, then each its second...
    fn event_seq(&self, g: usize, k: usize) -> i64 {
        let (base, width, j) = self.block(g);
        base + k as i64 * width + j + 1
    }

    fn end(&self) -> i64 {
        self.base + self.count as i64 * self.span()
    }

    /// The steps (from 1) whose events are effective, ordered by event type as a summary
    /// orders them.
    fn effective(&self) -> Vec<usize> {
        let mut last = BTreeMap::new();
        for (k, step) in self.steps.iter().enumerate() {
            last.insert(step.event_type, k + 1);
        }
        last.into_values().collect()
    }

    fn superseded(&self) -> usize {
        self.steps.len() - self.effective().len()
    }

    /// A few batches to check: the first, one in the middle, the last.
    fn checked(&self) -> Vec<usize> {
        let mut picked = vec![0, self.count / 2, self.count - 1];
        picked.dedup();
        picked
    }
}

/// The whole store: the batches to prune, the sample to import, the pass loop's.
struct Fixture {
    archive: Group,
    sample: Group,
    live: Group,
    /// Of the live batches, how many the pass loop takes before the prune (the rest during).
    baseline: usize,
    /// When the batches were created (store clock, ms); event `k` is `k` seconds after.
    t0: i64,
}

impl Fixture {
    fn new(scale: f64, t0: i64) -> Self {
        let archive = Group {
            prefix: "A",
            batch_type: "Archive",
            count: count(scale, ARCHIVE_BATCHES, 200),
            steps: &FINISHED,
            base: 0,
        };
        let sample = Group {
            prefix: "S",
            batch_type: "Sample",
            count: count(scale, SAMPLE_BATCHES, 20),
            steps: &FINISHED,
            base: archive.end(),
        };
        let baseline = count(scale, BASELINE_PASSES, 50);
        let live = Group {
            prefix: "L",
            batch_type: "Live",
            count: count(scale, LIVE_BATCHES, 200) + baseline,
            steps: &LIVE,
            base: sample.end(),
        };
        Self { archive, sample, live, baseline, t0 }
    }

    fn groups(&self) -> [&Group; 3] {
        [&self.archive, &self.sample, &self.live]
    }

    fn batches(&self) -> usize {
        self.groups().iter().map(|group| group.count).sum()
    }

    fn events(&self) -> usize {
        self.groups().iter().map(|group| group.count * group.events()).sum()
    }

    fn head(&self) -> i64 {
        self.live.end()
    }

    fn describe(&self) -> String {
        format!(
            "{} Archive batches to prune + {} Sample + {} Live = {} batches, {} events",
            thousands(self.archive.count as f64),
            thousands(self.sample.count as f64),
            thousands(self.live.count as f64),
            thousands(self.batches() as f64),
            thousands(self.events() as f64)
        )
    }
}

/// The details of the `g`-th batch's `k`-th event: a small report, as a step records one,
/// with a digest of what it checked (incompressible, as real checksums are).
fn details(g: usize, k: usize, success: bool) -> Value {
    use sha2::Digest;
    json!({
        "outcome": if success { "success" } else { "failure" },
        "digest": format!("sha256:{}", hex::encode(sha2::Sha256::digest(format!("{g}.{k}").as_bytes()))),
        "duration_ms": 1200 + (g * 7 + k) % 800,
        "failures": if success { json!([]) } else { json!(["file_0001.tif: checksum mismatch"]) },
        "summary": format!("verified {} files", 10 + g % 90),
        "transient": false,
    })
}

/// The same in SQL, `g` and `k` the columns of the fill.
fn details_sql(group: &Group) -> String {
    format!(
        "jsonb_build_object('outcome', ({outcomes})[k],
             'digest', 'sha256:' || encode(sha256(convert_to(g || '.' || k, 'UTF8')), 'hex'),
             'duration_ms', 1200 + (g * 7 + k) % 800,
             'failures', CASE WHEN ({outcomes})[k] = 'failure'
                              THEN jsonb_build_array('file_0001.tif: checksum mismatch') ELSE '[]'::jsonb END,
             'summary', 'verified ' || (10 + g % 90) || ' files', 'transient', false)",
        outcomes = outcomes_sql(group)
    )
}

fn metadata(id: &str) -> Value {
    json!({ "location": format!("/data/incoming/{id}") })
}

fn types_sql(group: &Group) -> String {
    let types: Vec<String> = group.steps.iter().map(|step| format!("'{}'", step.event_type)).collect();
    format!("ARRAY[{}]", types.join(", "))
}

fn outcomes_sql(group: &Group) -> String {
    let outcomes: Vec<&str> =
        group.steps.iter().map(|step| if step.success { "'success'" } else { "'failure'" }).collect();
    format!("ARRAY[{}]", outcomes.join(", "))
}

// ---------------------------------------------------------------------------------------------
// SQLite fill

/// A summary as `store/src/sqlite/summary.rs` stores it: `[stamp, last_event_at, [[type,
/// "s"|"f", seq, flags, content_seq]], [running]]`.
type StoredSummary<'a> = (i64, i64, Vec<(&'a str, &'a str, i64, u8, i64)>, Vec<&'a str>);

fn encode_summary(stamp: i64, state: &SummaryState) -> String {
    let effective = state
        .effective
        .iter()
        .map(|event| {
            let outcome = if event.outcome == Outcome::Success { "s" } else { "f" };
            let flags =
                u8::from(event.transient) | (u8::from(event.skipped) << 1) | (u8::from(event.acknowledged) << 2);
            (event.event_type.as_str(), outcome, event.seq.0, flags, event.content_seq.map_or(0, |seq| seq.0))
        })
        .collect();
    let running = state.running.iter().map(ComponentName::as_str).collect();
    let stored: StoredSummary = (stamp, state.last_event_at.millis(), effective, running);
    serde_json::to_string(&stored).expect("a summary serializes")
}

/// Fills the store file (its schema made by `SqliteStore::open`) in one transaction. The
/// insert triggers that count `stored_bytes` and `event_count` are dropped for the fill and
/// made again from their own SQL; the rows carry the counts.
fn fill_sqlite(path: &Path, fixture: &Fixture) {
    let mut conn = rusqlite::Connection::open(path).expect("the store file");
    // One pass of writes: no journal (a fixture), no syncs; the store's WAL mode after.
    let mode: String = conn.query_row("PRAGMA journal_mode = OFF", [], |row| row.get(0)).expect("journal_mode");
    assert_eq!(mode, "off");
    conn.execute_batch("PRAGMA synchronous = OFF; PRAGMA cache_size = -1000000;").expect("pragmas");
    let tx = conn.transaction().expect("a transaction");
    let triggers: Vec<(String, String)> = tx
        .prepare(
            "SELECT name, sql FROM sqlite_master WHERE type = 'trigger'
             AND name IN ('batches_stored_bytes_on_create', 'batches_stored_bytes_on_event')",
        )
        .and_then(|mut statement| {
            statement.query_map([], |row| Ok((row.get(0)?, row.get(1)?)))?.collect::<rusqlite::Result<Vec<_>>>()
        })
        .expect("the triggers");
    assert_eq!(triggers.len(), 2, "the schema's insert triggers: {triggers:?}");
    for (name, _) in &triggers {
        tx.execute_batch(&format!("DROP TRIGGER {name}")).expect("drop trigger");
    }
    {
        let mut insert_batch = tx
            .prepare(
                "INSERT INTO batches (id, type, priority, metadata, created_seq, modified_seq, changed_seq, created_at,
                     modified_at, summary, stored_bytes, event_count)
                 VALUES (?1, ?2, 0, ?3, ?4, ?4, ?5, ?6, ?6, ?7, ?8, ?9)",
            )
            .expect("insert batch");
        let mut insert_event = tx
            .prepare(
                "INSERT INTO events (seq, batch_id, type, outcome, agent, at, details)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            )
            .expect("insert event");
        let t0 = fixture.t0;
        for group in fixture.groups() {
            let events = group.events();
            let effective = group.effective();
            for g in 0..group.count {
                let id = group.id(g);
                let metadata = metadata(&id).to_string();
                let details_bytes: usize = group
                    .steps
                    .iter()
                    .enumerate()
                    .map(|(i, step)| details(g, i + 1, step.success).to_string().len())
                    .sum();
                let changed = group.event_seq(g, events);
                let summary: StoredSummary = (
                    changed,
                    t0 + events as i64 * 1000,
                    effective
                        .iter()
                        .map(|&k| {
                            let step = &group.steps[k - 1];
                            (step.event_type, if step.success { "s" } else { "f" }, group.event_seq(g, k), 0, 0)
                        })
                        .collect(),
                    Vec::new(),
                );
                insert_batch
                    .execute(rusqlite::params![
                        id,
                        group.batch_type,
                        metadata,
                        group.created_seq(g),
                        changed,
                        t0,
                        serde_json::to_string(&summary).expect("a summary"),
                        (metadata.len() + details_bytes) as i64,
                        events as i64,
                    ])
                    .expect("a batch");
            }
            // In seq order: block by block, step by step.
            for first in (0..group.count).step_by(IN_FLIGHT) {
                let last = (first + IN_FLIGHT).min(group.count);
                for (i, step) in group.steps.iter().enumerate() {
                    let k = i + 1;
                    for g in first..last {
                        let id = group.id(g);
                        insert_event
                            .execute(rusqlite::params![
                                group.event_seq(g, k),
                                id,
                                step.event_type,
                                if step.success { "success" } else { "failure" },
                                FILLER,
                                t0 + k as i64 * 1000,
                                details(g, k, step.success).to_string(),
                            ])
                            .expect("an event");
                    }
                }
            }
        }
    }
    tx.execute("UPDATE store_head SET seq = ?1 WHERE id = 1", [fixture.head()]).expect("store_head");
    for (_, sql) in &triggers {
        tx.execute_batch(sql).expect("the trigger again");
    }
    tx.commit().expect("commit the fill");
    let mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0)).expect("journal_mode");
    assert_eq!(mode, "wal");
    conn.execute_batch("ANALYZE").expect("analyze");
}

/// The filled rows of a few batches against what the store reads of them: the stored summary
/// is the one the store would write for the batch it reads, and the sizes are its rows'.
fn check_sqlite_rows(path: &Path, batches: &[autocomp_model::Batch]) {
    let conn = rusqlite::Connection::open(path).expect("the store file");
    for batch in batches {
        let (summary, stored_bytes, event_count, counted_bytes, counted_events): (String, i64, i64, i64, i64) = conn
            .query_row(
                "SELECT summary, stored_bytes, event_count,
                        length(CAST(metadata AS BLOB))
                          + (SELECT sum(length(CAST(details AS BLOB))) FROM events WHERE batch_id = b.id),
                        (SELECT count(*) FROM events WHERE batch_id = b.id)
                 FROM batches b WHERE id = ?1",
                [batch.id.as_str()],
                |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?, row.get(4)?)),
            )
            .expect("a filled batch");
        assert_eq!(summary, encode_summary(batch.changed_seq.0, &SummaryState::of(batch)), "{}'s summary", batch.id);
        assert_eq!((stored_bytes, event_count), (counted_bytes, counted_events), "{}'s sizes", batch.id);
    }
}

fn sqlite_size(path: &Path) -> u64 {
    let wal = PathBuf::from(format!("{}-wal", path.display()));
    [path, wal.as_path()].iter().map(|file| std::fs::metadata(file).map_or(0, |m| m.len())).sum()
}

// ---------------------------------------------------------------------------------------------
// PostgreSQL fill

/// psql without the harness's one-minute limit (a fill or a VACUUM of 10M rows takes longer).
fn psql_long(pg: &Postgres, database: &str, sql: &str) -> String {
    let mut command = Command::new(autocomp_test_servers::postgres::bin_dir().join("psql"));
    command
        .args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-f", "-", "--dbname"])
        .arg(pg.url(database))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for var in ["PGHOST", "PGPORT", "PGUSER", "PGDATABASE", "PGSERVICE", "PGOPTIONS", "PGSSLMODE"] {
        command.env_remove(var);
    }
    let mut child = command.spawn().expect("psql runs");
    let mut stdin = child.stdin.take().expect("psql's stdin");
    let script = sql.to_owned();
    let writer = std::thread::spawn(move || stdin.write_all(script.as_bytes()));
    let output = child.wait_with_output().expect("psql finishes");
    writer.join().expect("the writer").expect("the script written");
    assert!(output.status.success(), "psql failed: {}\n--- sql:\n{sql}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The rows of the group's batches `from..to` (a whole number of blocks), in one transaction,
/// as `autocomp_create_batch` and `autocomp_insert_event` leave them (foreign keys not checked
/// row by row: `session_replication_role = replica` for the fill, which turns the triggers off
/// too, so the summary each batch row keeps is set by the triggers' own function after; the
/// rows are consistent by construction and checked after).
fn pg_fill_sql(group: &Group, from: usize, to: usize, t0: i64) -> String {
    let effective: Vec<String> = group.effective().iter().map(usize::to_string).collect();
    format!(
        "BEGIN;
SET LOCAL session_replication_role = replica;
CREATE TEMP TABLE fill ON COMMIT DROP AS
SELECT g, '{prefix}' || lpad((g + 1)::text, 9, '0') || '-RT1' AS id,
       {base}::bigint + (g / {w})::bigint * {w} * {span} AS block_base,
       (g % {w})::bigint AS j,
       LEAST({w}, {count} - (g / {w}) * {w})::bigint AS width
FROM generate_series({from}, {last}) g;
INSERT INTO batches (id, type, priority, metadata, created_seq, modified_seq, changed_seq, created_at, modified_at,
                     stored_bytes, event_count, last_event_at)
SELECT id, '{batch_type}', 0, jsonb_build_object('location', '/data/incoming/' || id),
       block_base + j + 1, block_base + j + 1, block_base + {events} * width + j + 1, {t0}, {t0},
       octet_length(jsonb_build_object('location', '/data/incoming/' || id)::text)
         + (SELECT sum(octet_length(({details})::text)) FROM generate_series(1, {events}) k)::bigint,
       {events}, {t0}::bigint + {events} * 1000
FROM fill ORDER BY g;
INSERT INTO events (seq, batch_id, type, outcome, agent, at, details)
SELECT block_base + k * width + j + 1, id, ({types})[k], ({outcomes})[k], '{FILLER}', {t0}::bigint + k * 1000,
       {details}
FROM fill, generate_series(1, {events}) k ORDER BY 1;
INSERT INTO batch_effective (batch_id, type, seq, outcome, transient, skipped, acknowledged, content_seq)
SELECT id, ({types})[k], block_base + k * width + j + 1, ({outcomes})[k], false, false, false, NULL
FROM fill, unnest(ARRAY[{effective}]) k;
DO $fill$ BEGIN PERFORM autocomp_keep_summary_part('effective', id) FROM fill; END $fill$;
COMMIT;
",
        prefix = group.prefix,
        base = group.base,
        w = IN_FLIGHT,
        span = group.span(),
        count = group.count,
        last = to - 1,
        batch_type = group.batch_type,
        events = group.events(),
        details = details_sql(group),
        types = types_sql(group),
        outcomes = outcomes_sql(group),
        effective = effective.join(", "),
    )
}

fn fill_postgres(pg: &Postgres, database: &str, fixture: &Fixture, started: Instant) {
    for group in fixture.groups() {
        for from in (0..group.count).step_by(PG_FILL_CHUNK) {
            let to = (from + PG_FILL_CHUNK).min(group.count);
            progress!(started, "  {} batches {}..{}", group.batch_type, from, to);
            psql_long(pg, database, &pg_fill_sql(group, from, to, fixture.t0));
        }
    }
    psql_long(pg, database, &format!("SELECT setval('store_seq', {});", fixture.head()));
    progress!(started, "  VACUUM ANALYZE");
    psql_long(pg, database, "VACUUM ANALYZE batches; VACUUM ANALYZE events; VACUUM ANALYZE batch_effective;");
}

/// The sizes of a few batches recounted from their rows.
fn check_postgres_rows(pg: &Postgres, database: &str, batches: &[autocomp_model::Batch]) {
    let ids: Vec<String> = batches.iter().map(|batch| format!("'{}'", batch.id)).collect();
    let wrong = psql_long(
        pg,
        database,
        &format!(
            "SELECT count(*) FROM batches b WHERE id IN ({}) AND (
                 stored_bytes <> octet_length(metadata::text)
                     + (SELECT sum(octet_length(details::text)) FROM events WHERE batch_id = b.id)
                 OR event_count <> (SELECT count(*) FROM events WHERE batch_id = b.id)
                 OR last_event_at <> (SELECT max(at) FROM events WHERE batch_id = b.id))",
            ids.join(", ")
        ),
    );
    assert_eq!(wrong.trim(), "0", "filled sizes match the rows");
}

/// The tables' sizes with their indexes, and the WAL's.
fn postgres_sizes(pg: &Postgres, database: &str) -> String {
    psql_long(
        pg,
        database,
        "SELECT string_agg(t || ' ' || pg_size_pretty(pg_total_relation_size(t::regclass)), ', ')
                || ', pg_wal ' || (SELECT pg_size_pretty(sum(size)) FROM pg_ls_waldir())
         FROM unnest(ARRAY['events', 'batches', 'batch_effective', 'runs', 'claims']) t",
    )
    .trim()
    .to_owned()
}

fn postgres_size(pg: &Postgres, database: &str) -> u64 {
    psql_long(pg, database, "SELECT pg_database_size(current_database())").trim().parse().expect("a size")
}

// ---------------------------------------------------------------------------------------------
// Checks

/// The filled store as the store reads it: the batch count and head, and a few batches of each
/// kind with their events at their seqs and their summaries equal to what their logs give.
async fn check_fixture(store: &dyn ObjectStore, fixture: &Fixture) -> Vec<autocomp_model::Batch> {
    assert_eq!(store.count_batches().await.expect("count"), fixture.batches() as u64);
    assert_eq!(store.head().await.expect("head"), Seq(fixture.head()), "the head is past every seq");
    let mut checked = Vec::new();
    for group in fixture.groups() {
        for g in group.checked() {
            let id = group.batch_id(g);
            let batch = store.get_batch(&id).await.expect("a filled batch");
            let seqs: Vec<i64> = batch.events.iter().map(|event| event.seq.0).collect();
            let wanted: Vec<i64> = (1..=group.events()).map(|k| group.event_seq(g, k)).collect();
            assert_eq!(seqs, wanted, "{id}'s events");
            assert_eq!(batch.created_seq.0, group.created_seq(g));
            assert_eq!(batch.changed_seq.0, group.event_seq(g, group.events()));
            assert_eq!(batch.effective().len(), group.effective().len(), "{id}'s effective events");
            let summaries = store.get_summaries(std::slice::from_ref(&id)).await.expect("summaries");
            assert_eq!(summaries, vec![BatchSummary::of(&batch)], "{id}'s summary as its log gives it");
            checked.push(batch);
        }
    }
    checked
}

/// A pruned batch keeps its effective events and the marker; its summary still agrees.
async fn check_pruned(store: &dyn ObjectStore, group: &Group, g: usize) {
    let id = group.batch_id(g);
    let batch = store.get_batch(&id).await.expect("a pruned batch");
    assert_eq!(batch.events.len(), group.effective().len() + 1, "{id}: effective events and the marker");
    assert!(batch.events.iter().any(|event| event.event_type == EventType::history_pruned()));
    let summaries = store.get_summaries(std::slice::from_ref(&id)).await.expect("summaries");
    assert_eq!(summaries, vec![BatchSummary::of(&batch)], "{id}'s summary after the prune");
}

/// An imported batch has its whole log again, without the marker.
async fn check_restored(store: &dyn ObjectStore, group: &Group, g: usize) {
    let id = group.batch_id(g);
    let batch = store.get_batch(&id).await.expect("a restored batch");
    let seqs: Vec<i64> = batch.events.iter().map(|event| event.seq.0).collect();
    let wanted: Vec<i64> = (1..=group.events()).map(|k| group.event_seq(g, k)).collect();
    assert_eq!(seqs, wanted, "{id}'s whole log again");
    let summaries = store.get_summaries(std::slice::from_ref(&id)).await.expect("summaries");
    assert_eq!(summaries, vec![BatchSummary::of(&batch)], "{id}'s summary after the import");
}

// ---------------------------------------------------------------------------------------------
// The pass loop

fn pass_agent() -> Agent {
    Agent::new(format!("bench-archiver/1.0@bench#{}", std::process::id())).expect("an agent")
}

/// The pass loop's component: ready once `Checked` succeeded, until it `Archived`.
fn archiver() -> ComponentDescriptor {
    serde_json::from_value(json!({
        "name": "bench-archiver", "version": "1.0", "event_type": "Archived",
        "trigger": {"requires": ["Checked"], "blocked_by": ["Archived"]},
        "max_attempts": 3, "retry_backoff": "90s", "queue_size": 5, "max_runtime": "2h",
    }))
    .expect("a descriptor")
}

/// One iteration of the loop: when it started (since `reference`) and how long it took.
#[derive(Clone)]
struct Pass {
    at: Duration,
    latency: Duration,
    /// Why it failed, if the store gave up.
    failed: Option<String>,
}

struct PassLoop {
    passes: Vec<Pass>,
    /// It ran out of batches before it was stopped.
    exhausted: bool,
}

/// Every `PASS_INTERVAL`, `claim_ready` of the next batch and its result appended in that run,
/// until `stop` is set or the batches run out.
async fn pass_loop(
    store: Arc<dyn ObjectStore>,
    ids: Vec<BatchId>,
    stop: Arc<AtomicBool>,
    reference: Instant,
) -> PassLoop {
    let descriptor = archiver();
    let component = descriptor.name.clone();
    let holder = RunHolder {
        agent: pass_agent(),
        host: "bench".into(),
        pid: std::process::id(),
        claim_key: None,
        liveness: None,
    };
    let archived = EventType::new("Archived").expect("an event type");
    let mut tick = tokio::time::interval(PASS_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut passes = Vec::with_capacity(ids.len());
    for (n, id) in ids.iter().enumerate() {
        tick.tick().await;
        if stop.load(Ordering::Relaxed) {
            return PassLoop { passes, exhausted: false };
        }
        let sent = Instant::now();
        let request = ReadyClaimRequest {
            batches: vec![id.clone()],
            descriptor: descriptor.clone(),
            holder: holder.clone(),
            force: false,
            known_steering: None,
            exclusive: false,
            takeovers: Vec::new(),
        };
        let pass = async {
            let claims = store.claim_ready(&request).await.map_err(|e| format!("claim_ready: {e}"))?;
            assert!(!claims.held, "nothing holds the component");
            let answer = claims.answers.into_iter().next().expect("one answer").expect("the batch");
            let claim = answer.claim.unwrap_or_else(|| panic!("{id} is ready for the archiver"));
            let result = NewEvent::new(archived.clone(), Outcome::Success, pass_agent())
                .with_details(json!({"outcome": "success", "duration_ms": 900 + n % 200, "summary": "archived"}))
                .in_run(component.clone(), claim.generation());
            store.append_event(id, result).await.map_err(|e| format!("append_event: {e}"))?;
            Ok::<(), String>(())
        };
        // A store that gives up (SQLite's busy timeout) is a pass that failed: counted, the
        // loop goes on with the next batch.
        let failed = pass.await.err();
        passes.push(Pass { at: sent.duration_since(reference), latency: sent.elapsed(), failed });
    }
    PassLoop { passes, exhausted: true }
}

/// ", N failed" when some passes failed.
fn failures(passes: &[Pass]) -> String {
    match passes.iter().filter(|pass| pass.failed.is_some()).count() {
        0 => String::new(),
        n => format!(", {n} failed"),
    }
}

fn latencies(passes: &[Pass]) -> Vec<Duration> {
    let mut sorted: Vec<Duration> = passes.iter().map(|pass| pass.latency).collect();
    sorted.sort_unstable();
    sorted
}

// ---------------------------------------------------------------------------------------------
// The export directory, watched for the phases

#[derive(Default, Debug)]
struct Sightings {
    /// The first `.partial` file: the selection is done and the export writes.
    partial: Option<SystemTime>,
    /// The first file under its own name: read back and checked.
    named: Option<SystemTime>,
    /// The manifest: the prune transactions begin.
    manifest: Option<SystemTime>,
    /// The earliest last write (mtime) of the named files: the export's writes ended.
    written: Option<SystemTime>,
}

fn watch(dir: PathBuf, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<Sightings> {
    std::thread::spawn(move || {
        let mut seen = Sightings::default();
        let mut named = Vec::new();
        loop {
            let stopping = stop.load(Ordering::Relaxed);
            let now = SystemTime::now();
            for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                if name.ends_with(".partial") {
                    seen.partial.get_or_insert(now);
                } else if name.starts_with("history-") && name.ends_with(".jsonl.zst") {
                    seen.named.get_or_insert(now);
                    if !named.contains(&entry.path()) {
                        named.push(entry.path());
                    }
                } else if name.starts_with("manifest-") {
                    seen.manifest.get_or_insert(now);
                }
            }
            if stopping {
                break;
            }
            std::thread::sleep(WATCH_EVERY);
        }
        seen.written = named.iter().filter_map(|path| std::fs::metadata(path).and_then(|m| m.modified()).ok()).min();
        seen
    })
}

/// The prune's phases as seen from outside, each `(name, from, to)` in time since its start.
fn phases(seen: &Sightings, start: SystemTime, end: SystemTime) -> Vec<(&'static str, Option<(Duration, Duration)>)> {
    let since = |at: Option<SystemTime>| at.map(|at| at.duration_since(start).unwrap_or_default());
    let (partial, written, named, manifest) =
        (since(seen.partial), since(seen.written), since(seen.named), since(seen.manifest));
    let end = since(Some(end));
    let span = |from: Option<Duration>, to: Option<Duration>| from.zip(to).filter(|(from, to)| to >= from);
    vec![
        ("selection", span(Some(Duration::ZERO), partial)),
        ("export", span(partial, written)),
        ("verify", span(written, named)),
        ("manifest", span(named, manifest)),
        ("prune", span(manifest, end)),
    ]
}

// ---------------------------------------------------------------------------------------------
// CPU accounting from /proc

fn own_cpu() -> f64 {
    proc_stat("self").map_or(0.0, |(_, own, _)| own)
}

// ---------------------------------------------------------------------------------------------
// One backend

/// What differs between the backends.
struct Target<'a> {
    name: &'static str,
    url: String,
    goal: f64,
    /// The pass loop's store and the checks': a connection of its own.
    store: Arc<dyn ObjectStore>,
    sqlite: Option<PathBuf>,
    pg: Option<(&'a Postgres, &'static str)>,
}

impl Target<'_> {
    fn size(&self) -> u64 {
        match (&self.sqlite, self.pg) {
            (Some(path), _) => sqlite_size(path),
            (None, Some((pg, database))) => postgres_size(pg, database),
            (None, None) => 0,
        }
    }

    fn server_cpu(&self) -> f64 {
        self.pg.map_or(0.0, |(pg, _)| server_cpu(pg.pid()))
    }
}

/// What one backend did.
struct Run {
    name: &'static str,
    goal: f64,
    fixture: String,
    fill: Duration,
    size_before: u64,
    size_after: u64,
    baseline: Vec<Duration>,
    dry: Duration,
    dry_view: PruneView,
    wall: Duration,
    view: PruneView,
    phases: Vec<(&'static str, Option<(Duration, Duration)>)>,
    during: PassLoop,
    import: Duration,
    imported: u64,
    import_events: u64,
    sample_bytes: u64,
    /// The sample's export decompressed: its JSON Lines.
    sample_raw: u64,
    notes: Vec<String>,
}

fn write_policy(path: &Path, export_dir: &Path, batch_type: &str) {
    std::fs::write(
        path,
        format!("export_dir = \"{}\"\n\n[types.{batch_type}]\nafter = \"0s\"\n", export_dir.display()),
    )
    .expect("a policy file");
}

async fn measure(target: Target<'_>, fixture: &Fixture, fill: Duration, dir: &Path, started: Instant) -> Run {
    let name = target.name;
    progress!(started, "{name}: checking the fixture");
    let checked = check_fixture(target.store.as_ref(), fixture).await;
    match (&target.sqlite, target.pg) {
        (Some(path), _) => check_sqlite_rows(path, &checked),
        (None, Some((pg, database))) => check_postgres_rows(pg, database, &checked),
        (None, None) => {}
    }
    let size_before = target.size();
    let mut notes = Vec::new();
    if let Some((pg, database)) = target.pg {
        notes.push(format!("{name}: as filled, {}", postgres_sizes(pg, database)));
    }

    let config_dir = dir.join("config");
    std::fs::create_dir_all(&config_dir).expect("a config dir");
    let backends = Backends { store: Some(target.url.clone()), index: None, locks: None };
    let operator = Operator::new(&config_dir, backends, Some("bench".into())).expect("an operator");
    let (main_policy, main_exports) = (dir.join("archive.toml"), dir.join("export-archive"));
    let (sample_policy, sample_exports) = (dir.join("sample.toml"), dir.join("export-sample"));
    write_policy(&main_policy, &main_exports, fixture.archive.batch_type);
    write_policy(&sample_policy, &sample_exports, fixture.sample.batch_type);

    // The pass loop's batches: the first for the baseline, the rest while the prune runs.
    let live: Vec<BatchId> = (0..fixture.live.count).map(|g| fixture.live.batch_id(g)).collect();
    let (baseline_ids, during_ids) = live.split_at(fixture.baseline);

    progress!(started, "{name}: pass loop without a prune, {} passes", baseline_ids.len());
    let baseline = pass_loop(Arc::clone(&target.store), baseline_ids.to_vec(), Arc::default(), Instant::now()).await;
    assert!(baseline.exhausted);
    assert!(baseline.passes.iter().all(|pass| pass.failed.is_none()), "no pass fails without a prune");

    progress!(started, "{name}: prune --dry-run");
    operator.store().await.expect("the operator's store"); // opened before anything is timed
    let sent = Instant::now();
    let dry_view = operator.prune(&main_policy, true).await.expect("the dry run");
    let dry = sent.elapsed();
    assert_eq!(dry_view.due, fixture.archive.count as u64, "every Archive batch is due, nothing else");

    if let Some((pg, database)) = target.pg {
        psql_long(pg, database, "SELECT pg_stat_statements_reset();");
    }
    progress!(started, "{name}: prune of {} batches, the pass loop beside it", fixture.archive.count);
    let stop_loop = Arc::new(AtomicBool::new(false));
    let stop_watch = Arc::new(AtomicBool::new(false));
    let watcher = watch(main_exports.clone(), Arc::clone(&stop_watch));
    let (cpu_bench, cpu_server) = (own_cpu(), target.server_cpu());
    let start_clock = SystemTime::now();
    let start = Instant::now();
    let passes = tokio::spawn(pass_loop(Arc::clone(&target.store), during_ids.to_vec(), Arc::clone(&stop_loop), start));
    let view = operator.prune(&main_policy, false).await.expect("the prune");
    let wall = start.elapsed();
    let end_clock = SystemTime::now();
    let (cpu_bench, cpu_server) = (own_cpu() - cpu_bench, target.server_cpu() - cpu_server);
    stop_loop.store(true, Ordering::Relaxed);
    stop_watch.store(true, Ordering::Relaxed);
    let during = passes.await.expect("the pass loop");
    let seen = watcher.join().expect("the watcher");
    let phases = phases(&seen, start_clock, end_clock);
    let removed = (fixture.archive.count * fixture.archive.superseded()) as u64;
    assert_eq!(
        (view.due, view.pruned, view.moved, view.events_removed, view.runs_removed),
        (fixture.archive.count as u64, fixture.archive.count as u64, 0, removed, 0),
        "every due batch pruned, its superseded events removed"
    );
    for g in fixture.archive.checked() {
        check_pruned(target.store.as_ref(), &fixture.archive, g).await;
    }
    let size_after = target.size();
    if let Some((pg, database)) = target.pg {
        notes.push(format!("{name}: after the prune, {}", postgres_sizes(pg, database)));
    }
    notes.push(format!(
        "{name}: CPU over the prune's {:.1} s: bench process (operator + pass loop) {:.1} s{}; load average at its end {}",
        wall.as_secs_f64(),
        cpu_bench,
        if target.pg.is_some() { format!(", PostgreSQL server {cpu_server:.1} s") } else { String::new() },
        load_average()
    ));
    if let Some(pass) = during.passes.iter().find(|pass| pass.failed.is_some()) {
        notes.push(format!(
            "{name}: first failed pass, {:.1} s into the prune after {}: {}",
            pass.at.as_secs_f64(),
            short(pass.latency),
            pass.failed.as_deref().unwrap_or_default()
        ));
    }
    for (phase, span) in &phases {
        if let Some((from, to)) = span {
            let inside: Vec<Pass> = during.passes.iter().filter(|p| p.at >= *from && p.at < *to).cloned().collect();
            let sorted = latencies(&inside);
            notes.push(format!(
                "{name}: phase {phase} {:.1}-{:.1} s: {} passes{} started in it, p50 {} / p99 {} / max {}",
                from.as_secs_f64(),
                to.as_secs_f64(),
                inside.len(),
                failures(&inside),
                short(percentile(&sorted, 0.5)),
                short(percentile(&sorted, 0.99)),
                short(sorted.last().copied().unwrap_or_default())
            ));
        }
    }
    if let Some((pg, database)) = target.pg {
        let top = psql_long(
            pg,
            database,
            "SELECT calls || ' calls, ' || round(total_exec_time::numeric / 1000, 1) || ' s total, '
                    || round(mean_exec_time::numeric, 3) || ' ms each: '
                    || regexp_replace(left(query, 140), '\\s+', ' ', 'g')
             FROM pg_stat_statements
             WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
             ORDER BY total_exec_time DESC LIMIT 12",
        );
        for line in top.lines().filter(|line| !line.trim().is_empty()) {
            notes.push(format!("{name}: pg_stat_statements during the prune: {}", line.trim()));
        }
    }

    progress!(started, "{name}: prune of the {} Sample batches, then their import", fixture.sample.count);
    let sample_view = operator.prune(&sample_policy, false).await.expect("the sample's prune");
    assert_eq!(sample_view.pruned, fixture.sample.count as u64);
    let files: Vec<PathBuf> = sample_view.files.iter().map(|file| sample_exports.join(&file.file)).collect();
    let sample_bytes = sample_view.files.iter().map(|file| file.bytes).sum();
    let sample_raw = files
        .iter()
        .map(|file| {
            let compressed = std::fs::File::open(file).expect("the sample's export");
            zstd::decode_all(compressed).expect("a zstd file").len() as u64
        })
        .sum();
    let sent = Instant::now();
    let imported = operator.import(&files).await.expect("the import");
    let import = sent.elapsed();
    assert_eq!(imported.restored, fixture.sample.count as u64, "every sample batch restored: {:?}", imported.other);
    assert_eq!(imported.events, (fixture.sample.count * fixture.sample.superseded()) as u64);
    for g in fixture.sample.checked() {
        check_restored(target.store.as_ref(), &fixture.sample, g).await;
    }

    Run {
        name,
        goal: target.goal,
        fixture: fixture.describe(),
        fill,
        size_before,
        size_after,
        baseline: latencies(&baseline.passes),
        dry,
        dry_view,
        wall,
        view,
        phases,
        during,
        import,
        imported: imported.restored,
        import_events: imported.events,
        sample_bytes,
        sample_raw,
        notes,
    }
}

// ---------------------------------------------------------------------------------------------
// Output

fn short(d: Duration) -> String {
    let us = d.as_secs_f64() * 1e6;
    if us >= 1_000_000.0 {
        format!("{:.2} s", us / 1e6)
    } else if us >= 1_000.0 {
        format!("{:.1} ms", us / 1000.0)
    } else {
        format!("{us:.0} µs")
    }
}

fn seconds(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

fn bytes(n: u64) -> String {
    let n = n as f64;
    if n >= 1e9 { format!("{:.2} GB", n / 1e9) } else { format!("{:.1} MB", n / 1e6) }
}

fn per_second(n: u64, d: Duration) -> f64 {
    n as f64 / d.as_secs_f64().max(1e-9)
}

/// One cell of a backend: the figure, its goal, whether it was met.
#[derive(Clone)]
struct Cell {
    figure: String,
    goal: String,
    met: String,
}

fn report(figure: impl Into<String>) -> Cell {
    Cell { figure: figure.into(), goal: "–".into(), met: "–".into() }
}

fn against(figure: impl Into<String>, goal: impl Into<String>, met: bool) -> Cell {
    Cell { figure: figure.into(), goal: goal.into(), met: if met { "yes" } else { "**no**" }.into() }
}

fn lat3(sorted: &[Duration]) -> String {
    format!(
        "{} / {} / {}",
        short(percentile(sorted, 0.5)),
        short(percentile(sorted, 0.99)),
        short(sorted.last().copied().unwrap_or_default())
    )
}

/// The rows of one backend, in the table's order.
fn cells(run: &Run) -> Vec<(String, Cell)> {
    let pruned = run.view.pruned;
    let rate = per_second(pruned, run.wall);
    let wall_goal = Duration::from_secs_f64(pruned as f64 / run.goal);
    let during = latencies(&run.during.passes);
    let export_bytes: u64 = run.view.files.iter().map(|file| file.bytes).sum();
    let mut rows = vec![
        ("store as filled".to_owned(), report(format!("{}, {}", bytes(run.size_before), seconds(run.fill)))),
        (
            "selection alone: `prune --dry-run` over every batch".to_owned(),
            report(format!(
                "{} ({} batches read/s)",
                seconds(run.dry),
                thousands(per_second(run.dry_view.batches, run.dry))
            )),
        ),
        (
            "batches pruned (Archive), of batches in the store".to_owned(),
            report(format!("{} of {}", thousands(pruned as f64), thousands(run.view.batches as f64))),
        ),
        (
            "prune: whole call, wall".to_owned(),
            against(seconds(run.wall), format!("≤ {}", seconds(wall_goal)), run.wall <= wall_goal),
        ),
        (
            "prune: whole call, batches/s".to_owned(),
            against(format!("{} /s", thousands(rate)), format!("≥ {} /s", thousands(run.goal)), rate >= run.goal),
        ),
    ];
    for (phase, span) in &run.phases {
        let cell = match span {
            Some((from, to)) => {
                let took = *to - *from;
                match *phase {
                    "export" | "prune" => {
                        report(format!("{} ({} batches/s)", seconds(took), thousands(per_second(pruned, took))))
                    }
                    _ => report(seconds(took)),
                }
            }
            None => report("not seen"),
        };
        let what = match *phase {
            "selection" => "phase: selection (summaries read, policy applied)",
            "export" => "phase: export (histories read, JSON, zstd written)",
            "verify" => "phase: verify (sync, read back, every line checked)",
            "manifest" => "phase: manifest written",
            _ => "phase: prune (`prune_histories`, 200 per transaction, 30 ms apart)",
        };
        rows.push((what.to_owned(), cell));
    }
    rows.push((
        "pass loop, no prune running: p50 / p99 / max".to_owned(),
        report(format!("{} (n={})", lat3(&run.baseline), run.baseline.len())),
    ));
    rows.push((
        "pass loop during the prune: p50 / p99 / max".to_owned(),
        report(format!(
            "{} (n={}{}{})",
            lat3(&during),
            during.len(),
            failures(&run.during.passes),
            if run.during.exhausted { ", ran out of batches" } else { "" }
        )),
    ));
    rows.push((
        "export: compressed bytes per batch".to_owned(),
        report(format!(
            "{:.0} B ({} in {} file(s))",
            export_bytes as f64 / pruned.max(1) as f64,
            bytes(export_bytes),
            run.view.files.len()
        )),
    ));
    rows.push((
        "export: JSON Lines per batch, uncompressed (the sample's)".to_owned(),
        report(format!(
            "{:.0} B (zstd {:.1}x)",
            run.sample_raw as f64 / run.imported.max(1) as f64,
            run.sample_raw as f64 / run.sample_bytes.max(1) as f64
        )),
    ));
    rows.push((
        format!("import of the sample's export ({} batches)", thousands(run.imported as f64)),
        report(format!(
            "{} batches/s ({}, {} events put back)",
            thousands(per_second(run.imported, run.import)),
            seconds(run.import),
            thousands(run.import_events as f64),
        )),
    ));
    rows.push(("store after the prune (space not given back)".to_owned(), report(bytes(run.size_after))));
    rows
}

fn print_table(runs: &[Run]) {
    let columns: Vec<Vec<(String, Cell)>> = runs.iter().map(cells).collect();
    let mut header = vec!["figure".to_owned()];
    for run in runs {
        header.extend([run.name.to_owned(), "goal".to_owned(), "met".to_owned()]);
    }
    let mut table = vec![header];
    for (i, (figure, _)) in columns[0].iter().enumerate() {
        let mut line = vec![figure.clone()];
        for column in &columns {
            let cell = &column[i].1;
            line.extend([cell.figure.clone(), cell.goal.clone(), cell.met.clone()]);
        }
        table.push(line);
    }
    let mut widths = vec![0; table[0].len()];
    for line in &table {
        for (width, cell) in widths.iter_mut().zip(line) {
            *width = (*width).max(cell.chars().count());
        }
    }
    for (n, line) in table.iter().enumerate() {
        let padded: Vec<String> = line
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(i, (cell, width))| {
                let pad = " ".repeat(width - cell.chars().count());
                if i == 0 { format!("{cell}{pad}") } else { format!("{pad}{cell}") }
            })
            .collect();
        println!("| {} |", padded.join(" | "));
        if n == 0 {
            let rule: Vec<String> = widths
                .iter()
                .enumerate()
                .map(|(i, w)| if i == 0 { "-".repeat(w + 2) } else { format!("{}:", "-".repeat(w + 1)) })
                .collect();
            println!("|{}|", rule.join("|"));
        }
    }
}

// ---------------------------------------------------------------------------------------------

/// Bytes free for an unprivileged user on the disk of /var/tmp.
fn free_disk() -> u64 {
    let mut stat = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: a NUL-terminated path and a buffer statvfs fills in.
    let done = unsafe { libc::statvfs(c"/var/tmp".as_ptr(), stat.as_mut_ptr()) };
    assert_eq!(done, 0, "statvfs /var/tmp: {}", std::io::Error::last_os_error());
    // SAFETY: statvfs succeeded, so it filled the buffer.
    let stat = unsafe { stat.assume_init() };
    // The fields' types differ by platform (u64 here).
    #[allow(clippy::unnecessary_cast)]
    let free = stat.f_bavail as u64 * stat.f_frsize as u64;
    free
}

/// Refuses to start a backend whose store would leave less than `MARGIN` of the shared disk.
fn check_room(what: &str, batches: usize, bytes_per_batch: u64) {
    const MARGIN: u64 = 1_500_000_000;
    let (free, needed) = (free_disk(), batches as u64 * bytes_per_batch);
    assert!(
        free >= needed + MARGIN,
        "{what} needs about {} under /var/tmp and {} stays free for the machine's other work; {} is free: \
         run at a smaller AUTOCOMP_BENCH_SCALE (or AUTOCOMP_BENCH_PG_SCALE)",
        bytes(needed),
        bytes(MARGIN),
        bytes(free)
    );
}

/// The least free disk seen while it runs, sampled every second.
struct DiskWatch {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<u64>,
}

impl DiskWatch {
    fn start() -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = std::thread::spawn({
            let stop = Arc::clone(&stop);
            move || {
                let mut least = free_disk();
                while !stop.load(Ordering::Relaxed) {
                    least = least.min(free_disk());
                    std::thread::sleep(Duration::from_secs(1));
                }
                least
            }
        });
        Self { stop, thread }
    }

    fn least(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("the disk watch")
    }
}

fn main() {
    let config = Config::from_env();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    runtime.block_on(bench(config));
}

async fn bench(config: Config) {
    let started = Instant::now();
    println!("# Retention benchmark ({})", if config.smoke { "smoke run" } else { "full" });
    println!(
        "machine: {} cores shared by server, operator, pass loop and bench; scale {} (PostgreSQL {}); {}",
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        config.scale,
        config.pg_scale,
        Timestamp::now()
    );
    println!("load average at the start: {}", load_average());
    let disk = DiskWatch::start();
    let mut runs = Vec::new();

    // --- SQLite: the schema by `SqliteStore::open`, the rows by rusqlite.
    {
        let dir = disk_temp_dir("autocomp-bench-prune-sqlite-");
        let path = dir.path().join("store.db");
        drop(SqliteStore::open(&path).await.expect("a new store file"));
        let fixture = Fixture::new(config.scale, Timestamp::now().millis() - 3_600_000);
        check_room("the SQLite store and its export", fixture.batches(), SQLITE_BYTES_PER_BATCH);
        progress!(started, "SQLite: filling {}", fixture.describe());
        let filling = Instant::now();
        fill_sqlite(&path, &fixture);
        let fill = filling.elapsed();
        let store: Arc<dyn ObjectStore> = Arc::new(SqliteStore::open(&path).await.expect("the filled store"));
        let target = Target {
            name: "SQLite",
            url: format!("sqlite://{}", path.display()),
            goal: GOAL_SQLITE,
            store,
            sqlite: Some(path.clone()),
            pg: None,
        };
        runs.push(measure(target, &fixture, fill, dir.path(), started).await);
        progress!(started, "SQLite: done, removing {}", dir.path().display());
    }

    // --- PostgreSQL: the schema by `PgStore::open`, the rows by psql.
    {
        check_room(
            "the PostgreSQL store, its WAL and its export",
            Fixture::new(config.pg_scale, 0).batches(),
            POSTGRES_BYTES_PER_BATCH,
        );
        let options = Options::default()
            .setting("shared_preload_libraries", "pg_stat_statements")
            .setting("pg_stat_statements.track", "all");
        let pg = Postgres::start_with(options);
        let server_version = pg.psql("postgres", "SHOW server_version").trim().to_owned();
        let settings = pg.psql(
            "postgres",
            "SELECT name || '=' || current_setting(name) FROM pg_settings
             WHERE name IN ('fsync', 'synchronous_commit', 'shared_buffers', 'max_wal_size') ORDER BY name",
        );
        println!(
            "PostgreSQL {server_version}: {}, data dir {}",
            settings.split_whitespace().collect::<Vec<_>>().join(", "),
            pg.data_dir().display()
        );
        let database = "prune";
        let url = pg.create_database(database);
        psql_long(&pg, database, "CREATE EXTENSION pg_stat_statements;");
        let store: Arc<dyn ObjectStore> =
            Arc::new(PgStore::open(&format!("{url}?pool_size=2")).await.expect("the store's schema"));
        let t0: i64 = pg.psql(database, "SELECT autocomp_now()").trim().parse().expect("the store clock");
        let fixture = Fixture::new(config.pg_scale, t0 - 3_600_000);
        progress!(started, "PostgreSQL: filling {}", fixture.describe());
        let filling = Instant::now();
        fill_postgres(&pg, database, &fixture, started);
        let fill = filling.elapsed();
        let dir = disk_temp_dir("autocomp-bench-prune-pg-");
        let target =
            Target { name: "PostgreSQL", url, goal: GOAL_POSTGRES, store, sqlite: None, pg: Some((&pg, database)) };
        runs.push(measure(target, &fixture, fill, dir.path(), started).await);
        progress!(started, "PostgreSQL: done, stopping the server and removing its data");
    }

    println!("load average at the end: {}", load_average());
    println!("least free disk under /var/tmp during the run: {}", bytes(disk.least()));
    println!();
    print_table(&runs);
    println!();
    println!("- fixture (each backend): {}", runs[0].fixture);
    println!(
        "- Archive batches: 10 events outside runs, without idempotency keys, each with a sha256 digest in its \
         details (71 incompressible bytes of ~200), 5 effective successes and 5 superseded \
         (2 failures and a success superseded by later ones); a prune removes the 5 and adds its History_Pruned \
         marker; no runs, so runs_removed is 0"
    );
    println!(
        "- pass loop: every {} ms `claim_ready` of one Live batch (type in no policy) for a component requiring \
         Checked, then its Archived result appended in that run; its own store connection; baseline before the \
         dry run, on the same filled store",
        PASS_INTERVAL.as_millis()
    );
    for run in &runs {
        for note in &run.notes {
            println!("- {note}");
        }
    }
}
