//! Benchmark of the batch index (issue #3): an index of 1,000,000 batches with ~10 events each.
//!
//! Run with `cargo bench -p autocomp-sboi --bench index`. `AUTOCOMP_BENCH_BATCHES` sets the
//! number of batches (default 1,000,000). Without the `--bench` argument that `cargo bench`
//! passes (e.g. under `cargo test --all-targets`) the binary does a tiny smoke run in a
//! temporary directory instead. Other arguments are ignored.
//!
//! 1. The store is written through the `ObjectStore` port (`SqliteStore`, `Synchronous::Normal`)
//!    with a pipeline mix: every batch has `Data_Received`, most run a 10-step pipeline with
//!    5% failures (most reset by an operator and re-run), some content changes, resets,
//!    priorities and open runs; the newest 5% are still in progress (the backlog). It is cached
//!    in `target/bench-data/sboi-store-<batches>.db`, complete once its `.done` marker exists.
//! 2. A child process (this binary, re-run with `AUTOCOMP_BENCH_CHILD=feed`) reads the whole
//!    change feed as the engine does, without indexing: the store's share of a catch-up. It also
//!    warms the page cache, so the catch-up does not measure a cold disk.
//! 3. Another child (`AUTOCOMP_BENCH_CHILD=catch-up`) catches a fresh index up from empty with
//!    `EngineOptions::default()` (or as tuned by the env, see `engine_options`); its peak RSS
//!    (VmHWM) is the catch-up's alone. Store time inside the catch-up is measured by wrapping
//!    the store in a timing `ObjectStore`.
//! 4. The parent queries the index with a typical and a selective trigger, then builds what a
//!    user would otherwise maintain, a materialized effective-state table in SQLite with the
//!    best indexes we could design, checks that both answer what `Trigger::select` answers,
//!    and times the same triggers as SQL.
//!
//! `AUTOCOMP_BENCH_CHILD=generate` only writes (or finds) the cached store and prints its path:
//! the monitor's benchmark measures its pages on the same data set.
//!
//! 5. Profiles: the store's per-batch SQL as it runs it and with SQLITE_DBCONFIG_ENABLE_QPSG,
//!    and the typical query taken apart (tantivy search, then the id lookups of its hits).

use std::cmp::Reverse;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use autocomp_model::{
    Agent, Batch, BatchId, BatchSummary, BatchType, ComponentName, Event, EventType, NewBatch, NewEvent, Outcome, Run,
    RunHolder, Seq, Timestamp, Trigger, order_key,
};
use autocomp_sboi::{BlockedBy, CatchUp, EngineOptions, IndexEngine};
use autocomp_store::{
    BatchStore, ChangePage, Claim, CreateOutcome, ObjectStore, OutboxStore, RegistryStore, SeriesStore, SqliteOptions,
    SqliteStore, SteeringStore, StoreResult, Synchronous,
};
use rusqlite::Connection;
use serde_json::{Map, Value, json};

#[path = "index/children.rs"]
mod children;
#[path = "index/data.rs"]
mod data;
#[path = "index/profiles.rs"]
mod profiles;
#[path = "index/queries.rs"]
mod queries;
#[path = "index/sql.rs"]
mod sql;
use children::*;
use data::*;
use profiles::*;
use queries::*;
use sql::*;

const CATCH_UP_GOAL: f64 = 100_000.0;
const P99_GOAL_MS: f64 = 10.0;
/// Issue #16's goal for the typical trigger (`blocked_by` answered by `absent` terms).
const TYPICAL_P99_GOAL_MS: f64 = 1.0;
const RSS_GOAL_BYTES: u64 = 1 << 30;

const DEFAULT_BATCHES: usize = 1_000_000;
const SMOKE_BATCHES: usize = 1_000;
const QUERY_ITERATIONS: usize = 1_000;
const WARM_UP: usize = 50;
/// SQL variants are timed until this budget is spent (at least `MIN_SQL_RUNS` runs each).
const SQL_BUDGET: Duration = Duration::from_secs(60);
const MIN_SQL_RUNS: usize = 20;
/// Batches written per round-robin chunk during generation: their events interleave in the log.
const CHUNK: usize = 2_000;
/// Batches per `list_batches` page when materializing the SQL tables.
const LIST_PAGE: usize = 5_000;

const CHILD_MODE: &str = "AUTOCOMP_BENCH_CHILD";
const CHILD_STORE: &str = "AUTOCOMP_BENCH_STORE";
const CHILD_INDEX: &str = "AUTOCOMP_BENCH_INDEX";
const RESULT_PREFIX: &str = "BENCH-RESULT ";
/// Bumped whenever `script` changes, so a cached store of an older mix is regenerated.
const GENERATOR_VERSION: u32 = 1;

/// The pipeline steps in order, with the component that records each; then the rare manual step.
const STEPS: [(&str, &str); 11] = [
    ("Data_Received", "receiver"),
    ("Checksums_Verified", "checksum-verifier"),
    ("Structure_Checked", "structure-checker"),
    ("Metadata_Extracted", "metadata-extractor"),
    ("Data_Archived", "archiver"),
    ("Access_Copy_Created", "access-copier"),
    ("Thumbnails_Generated", "thumbnailer"),
    ("Quality_Checked", "quality-checker"),
    ("Catalog_Published", "catalog-publisher"),
    ("Notified", "notifier"),
    ("Manual_Review", "reviewer"),
];
const PIPELINE: usize = 10;
const METADATA: usize = 3;
/// Recorded by the runner: claim, then an append fenced by the claim's generation.
const ARCHIVE: usize = 4;
const PUBLISHED: usize = 8;
const MANUAL: usize = 10;
const MAIN_TYPE: &str = "RoundTrip";
const RARE_TYPE: &str = "Film";

fn main() {
    match std::env::var(CHILD_MODE).as_deref() {
        Ok("catch-up") => child(ChildMode::CatchUp),
        Ok("feed") => child(ChildMode::Feed),
        // Only the data set (cached in target/bench-data): the monitor's benchmark uses it too.
        Ok("generate") => {
            let config = Config::from_env();
            let (generated, reused) = runtime().block_on(ensure_store(&config));
            println!(
                "{RESULT_PREFIX}{}",
                serde_json::json!({"store": config.store_path(), "reused": reused, "head": generated.head})
            );
        }
        Ok(other) => panic!("unknown {CHILD_MODE}={other}"),
        Err(_) => parent(),
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime")
}

fn store_options() -> SqliteOptions {
    SqliteOptions { synchronous: Synchronous::Normal, ..SqliteOptions::default() }
}

// ---------------------------------------------------------------------------------------------
// Configuration

struct Config {
    batches: usize,
    smoke: bool,
    data_dir: PathBuf,
    iterations: usize,
    _temp: Option<tempfile::TempDir>,
}

impl Config {
    fn from_env() -> Self {
        let bench = std::env::args().skip(1).any(|arg| arg == "--bench");
        if !bench {
            let temp = tempfile::tempdir().expect("temporary directory");
            return Self {
                batches: SMOKE_BATCHES,
                smoke: true,
                data_dir: temp.path().to_path_buf(),
                iterations: 20,
                _temp: Some(temp),
            };
        }
        let batches = match std::env::var("AUTOCOMP_BENCH_BATCHES") {
            Ok(text) => match text.trim().replace('_', "").parse::<usize>() {
                Ok(n) if n >= 100 => n,
                _ => {
                    eprintln!("AUTOCOMP_BENCH_BATCHES={text:?} is not a number >= 100; using {DEFAULT_BATCHES}");
                    DEFAULT_BATCHES
                }
            },
            Err(_) => DEFAULT_BATCHES,
        };
        let target = std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| {
            let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
            manifest.parent().unwrap_or(manifest).join("target")
        });
        let data_dir = target.join("bench-data");
        std::fs::create_dir_all(&data_dir).expect("create target/bench-data");
        Self { batches, smoke: false, data_dir, iterations: QUERY_ITERATIONS, _temp: None }
    }

    fn store_path(&self) -> PathBuf {
        self.data_dir.join(format!("sboi-store-{}.db", self.batches))
    }

    fn marker_path(&self) -> PathBuf {
        self.data_dir.join(format!("sboi-store-{}.done", self.batches))
    }

    fn index_dir(&self) -> PathBuf {
        self.data_dir.join(format!("sboi-index-{}", self.batches))
    }

    fn sql_path(&self) -> PathBuf {
        self.data_dir.join(format!("sboi-sql-{}.db", self.batches))
    }
}

// ---------------------------------------------------------------------------------------------
// The run

struct CaseResult {
    name: &'static str,
    description: &'static str,
    ready: usize,
    returned: usize,
    index: Latencies,
    /// The same trigger with `blocked_by` as schema version 1 asked it (`MustNot present`
    /// under `AllQuery`), on the same index: the before of issue #16's before/after.
    index_must_not: Latencies,
    sql: Latencies,
    sql_form: SqlForm,
    other_form: (SqlForm, f64),
    plan: Vec<String>,
}

fn parent() {
    let config = Config::from_env();
    if config.smoke {
        eprintln!(
            "smoke run ({} batches); `cargo bench -p autocomp-sboi --bench index` runs the benchmark",
            config.batches
        );
    }
    let rt = runtime();
    let (generated, reused) = rt.block_on(ensure_store(&config));
    let index_dir = config.index_dir();
    if index_dir.exists() {
        std::fs::remove_dir_all(&index_dir).expect("remove the previous index");
    }

    eprintln!("reading the whole change feed (store share of a catch-up, warms the page cache) ...");
    let feed = run_child("feed", &config);
    eprintln!("  {} batches in {:.1} s", feed.batches, feed.seconds);
    eprintln!("catching up a fresh index in a child process ...");
    let catch_up = run_child("catch-up", &config);
    eprintln!("  {} batches in {:.1} s", catch_up.batches, catch_up.seconds);
    assert_eq!(catch_up.batches, config.batches, "every batch is in the feed once");
    assert_eq!(catch_up.docs as usize, config.batches, "one document per batch");

    let engine = IndexEngine::open_with(&index_dir, EngineOptions::default()).expect("open the index");
    let cases = cases();
    eprintln!("materializing the SQL alternative ...");
    let store = rt.block_on(SqliteStore::open_with(config.store_path(), store_options())).expect("open the store");
    let (materialize_secs, mut references, sql_bytes) = rt.block_on(materialize(&store, &config.sql_path(), &cases));
    let conn = Connection::open(config.sql_path()).expect("open the SQL file");

    let mut results = Vec::new();
    for (case, reference) in cases.iter().zip(&mut references) {
        let limit = case.trigger.limit.unwrap_or(usize::MAX);
        let expected = reference.answer(limit);
        let from_index = engine.query_at(&case.trigger, Timestamp::now()).expect("query");
        assert_eq!(from_index, expected, "{}: the index differs from Trigger::select", case.name);
        eprintln!("timing {} on the index ...", case.name);
        let index = Latencies::measure(config.iterations, WARM_UP.min(config.iterations), None, || {
            engine.query_at(&case.trigger, Timestamp::now()).expect("query")
        });
        let must_not = |now| engine.query_with(&case.trigger, now, BlockedBy::MustNotPresent).expect("query");
        assert_eq!(
            must_not(Timestamp::now()),
            expected,
            "{}: the MustNot form differs from Trigger::select",
            case.name
        );
        eprintln!("timing {} on the index, MustNot present form ...", case.name);
        let index_must_not =
            Latencies::measure(config.iterations, WARM_UP.min(config.iterations), None, || must_not(Timestamp::now()));
        let mut timed_forms = Vec::new();
        for form in [SqlForm::Exists, SqlForm::In] {
            let sql = trigger_sql(&case.trigger, form);
            assert_eq!(run_sql(&conn, &sql), expected, "{}: SQL ({form:?}) differs from Trigger::select", case.name);
            eprintln!("timing {} as SQL ({form:?}) ...", case.name);
            let latencies = Latencies::measure(config.iterations, 3, Some(SQL_BUDGET / 2), || run_sql(&conn, &sql));
            timed_forms.push((form, latencies, query_plan(&conn, &sql)));
        }
        timed_forms.sort_by(|a, b| a.1.p50().total_cmp(&b.1.p50()));
        let (other_form, other, _) = timed_forms.pop().expect("two forms");
        let (sql_form, sql, plan) = timed_forms.pop().expect("two forms");
        results.push(CaseResult {
            name: case.name,
            description: case.description,
            ready: reference.matches.len(),
            returned: expected.len(),
            index,
            index_must_not,
            sql,
            sql_form,
            other_form: (other_form, other.p50()),
            plan,
        });
    }

    eprintln!("profiling the store's batch loads and the typical query ...");
    let profiles = Profiles {
        load_as_store: profile_batch_load(&config.store_path(), false),
        load_qpsg: profile_batch_load(&config.store_path(), true),
        query: profile_query(&index_dir, &cases[0].trigger, config.iterations),
    };

    report(&config, &generated, reused, &feed, &catch_up, materialize_secs, sql_bytes, &results, &profiles);
}

fn mib(bytes: u64) -> String {
    format!("{:.0} MiB", bytes as f64 / (1 << 20) as f64)
}

fn met(ok: bool) -> &'static str {
    if ok { "yes" } else { "**no**" }
}

fn thousands(n: u64) -> String {
    let text = n.to_string();
    let mut out = String::new();
    for (i, c) in text.chars().enumerate() {
        if i > 0 && (text.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[allow(clippy::too_many_arguments)]
fn report(
    config: &Config,
    generated: &Generated,
    reused: bool,
    feed: &ChildReport,
    catch_up: &ChildReport,
    materialize_secs: f64,
    sql_bytes: u64,
    results: &[CaseResult],
    profiles: &Profiles,
) {
    let n = config.batches as u64;
    let rate = catch_up.batches as f64 / catch_up.seconds;
    let feed_rate = feed.batches as f64 / feed.seconds;
    let mut rows: Vec<[String; 4]> = Vec::new();
    let mut row = |metric: String, figure: String, goal: &str, ok: Option<bool>| {
        rows.push([metric, figure, goal.to_owned(), ok.map(met).unwrap_or("").to_owned()]);
    };
    row(
        format!("catch-up rate, fresh index, {} batches", thousands(n)),
        format!("{} batches/s ({:.1} s)", thousands(rate as u64), catch_up.seconds),
        ">= 100,000 batches/s",
        Some(rate >= CATCH_UP_GOAL),
    );
    row(
        "... of which inside store reads (changes + get_summaries)".into(),
        format!("{:.1} s ({:.0}%)", catch_up.store_seconds, 100.0 * catch_up.store_seconds / catch_up.seconds),
        "",
        None,
    );
    row(
        "... CPU time of the catch-up process (user + sys)".into(),
        format!("{:.1} s ({:.2} cores busy)", catch_up.cpu_seconds, catch_up.cpu_seconds / catch_up.seconds),
        "",
        None,
    );
    row(
        "store feed read alone (same pages, no indexing)".into(),
        format!("{} batches/s ({:.1} s, {:.1} s CPU)", thousands(feed_rate as u64), feed.seconds, feed.cpu_seconds),
        "",
        None,
    );
    row("index size on disk".into(), mib(catch_up.index_bytes), "", None);
    row(
        "peak RSS of the catch-up process (VmHWM)".into(),
        mib(catch_up.peak_rss_bytes),
        "<= 1 GiB",
        Some(catch_up.peak_rss_bytes <= RSS_GOAL_BYTES),
    );
    for result in results {
        let ready = format!("{} of {} ready", result.returned, thousands(result.ready as u64));
        let goal_ms = if result.name == "typical" { TYPICAL_P99_GOAL_MS } else { P99_GOAL_MS };
        row(
            format!("{} trigger, index: p50 / p99 / max", result.name),
            format!("{} ({ready})", result.index.describe()),
            &format!("p99 <= {goal_ms} ms"),
            Some(result.index.p99() <= goal_ms),
        );
        row(
            format!("{} trigger, index, blocked_by as MustNot present (before #16): p50 / p99 / max", result.name),
            format!("{} (same ids)", result.index_must_not.describe()),
            "",
            None,
        );
        row(
            format!("{} trigger, SQLite ({:?} form): p50 / p99 / max", result.name, result.sql_form),
            format!("{} (same ids)", result.sql.describe()),
            "",
            None,
        );
        row(
            format!("{} trigger, ratio SQLite / index", result.name),
            format!(
                "p50 {:.1}x, p99 {:.1}x",
                result.sql.p50() / result.index.p50(),
                result.sql.p99() / result.index.p99()
            ),
            "",
            None,
        );
    }
    for (what, load) in [("as the store runs them", &profiles.load_as_store), ("with QPSG", &profiles.load_qpsg)] {
        row(
            format!("profile: SQL of one batch load (load_batch's 3 statements), {what}"),
            format!("{:.1} µs/batch, {:.0}% of executions re-prepared", load.micros_per_batch, 100.0 * load.reprepared),
            "",
            None,
        );
    }
    let query = &profiles.query;
    for (what, latencies) in [
        ("tantivy search alone (MustNot present form, ordered top 100)", &query.search),
        ("its 100 ids via the id fast column (as ids_of)", &query.ids_fast_column),
        ("its 100 ids via the stored documents", &query.ids_stored),
    ] {
        row(format!("profile: typical, {what}"), latencies.describe(), "", None);
    }

    println!();
    println!("## Batch index benchmark ({} batches)", thousands(n));
    println!();
    println!(
        "data set: {} batches, {} events ({:.1} per batch), {} store transactions, store file {}, head seq {}",
        thousands(n),
        thousands(generated.events),
        generated.events as f64 / n as f64,
        thousands(generated.transactions),
        mib(generated.store_bytes),
        thousands(generated.head as u64),
    );
    println!(
        "generation through the ObjectStore port: {:.0} s ({:.0} transactions/s){}",
        generated.seconds,
        generated.transactions as f64 / generated.seconds,
        if reused { ", cached from an earlier run" } else { "" }
    );
    println!("engine options: {}", catch_up.options);
    println!(
        "SQL alternative: materialized from the store in {materialize_secs:.0} s ({} batches/s incl. indexes and ANALYZE), file {}",
        thousands((n as f64 / materialize_secs) as u64),
        mib(sql_bytes)
    );
    println!();
    println!("| metric | figure | goal | met |");
    println!("|---|---|---|---|");
    for [metric, figure, goal, ok] in &rows {
        println!("| {metric} | {figure} | {goal} | {ok} |");
    }
    println!();
    for result in results {
        println!("{} trigger: {}, limit 100", result.name, result.description);
        println!(
            "  SQL form used: {:?}; the {:?} form had p50 {} ms",
            result.sql_form,
            result.other_form.0,
            fmt_ms(result.other_form.1)
        );
        println!("  SQLite plan:");
        for line in &result.plan {
            println!("    {line}");
        }
        println!(
            "  SQL: {}",
            trigger_sql(&cases().iter().find(|c| c.name == result.name).unwrap().trigger, result.sql_form)
        );
    }
}
