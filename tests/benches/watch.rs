//! Watch-mode benchmark (issue #16, item 5), release binaries as separate processes: the
//! demo pipeline's `checksum-verifier`, `structure-checker` and `archiver` each run
//! `--watch`; sample BagIt deliveries (the ones `autocomp demo` writes) arrive one at a
//! time and `batch-trigger` registers each. Latency of a batch = the store timestamp of its
//! `Data_Archived` minus that of its `Data_Received`. Then the watchers' CPU time while
//! idle (from /proc/<pid>/stat). Twice: embedded (sqlite:// store, local: index, local:
//! locks) and over the services (`autocomp-store serve`, `sboi serve`, ZooKeeper).
//!
//!     cargo bench -p autocomp-e2e --bench watch
//!
//! `AUTOCOMP_BENCH_BATCHES` (default 50) and `AUTOCOMP_BENCH_IDLE_SECS` (default 30) size
//! it; `AUTOCOMP_BENCH_ONLY` (`embedded`, `services`) runs one setup. Without the `--bench`
//! argument that `cargo bench` passes it does a smoke run with small numbers.

use autocomp_test_servers::bench::load_average;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use autocomp_e2e::services::{Service, TOKEN};
use autocomp_e2e::zk::ZooKeeper;
use autocomp_e2e::{binary, copy_tree, percentile, wait_until};
use autocomp_model::{BatchId, Timestamp};
use autocomp_store::prelude::*;
use autocomp_store::{HttpStore, ObjectStore, SqliteStore};

const GOAL_P50: Duration = Duration::from_secs(1);
const WATCHERS: [&str; 3] = ["checksum-verifier", "structure-checker", "archiver"];
/// Longer than the run: every pass measured here is woken by the change feed.
const HEARTBEAT: &str = "60s";

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let env_number =
        |name: &str, default: u64| std::env::var(name).ok().and_then(|s| s.parse().ok()).unwrap_or(default);
    let batches = if full { env_number("AUTOCOMP_BENCH_BATCHES", 50) as usize } else { 3 };
    let idle = Duration::from_secs(if full { env_number("AUTOCOMP_BENCH_IDLE_SECS", 30) } else { 2 });
    println!("# autocomp watch-mode benchmark ({})", if full { "full" } else { "smoke run" });
    println!(
        "machine: {} cores, {}, load average {}",
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        Timestamp::now(),
        load_average()
    );
    let samples = tempfile::tempdir().unwrap();
    let bags = sample_bags(samples.path());
    let only = std::env::var("AUTOCOMP_BENCH_ONLY").unwrap_or_default();
    let wanted = |setup: &str| only.is_empty() || only.split(',').any(|s| s == setup);
    if wanted("embedded") {
        let dir = tempfile::tempdir().unwrap();
        let backends = Backends::embedded(dir.path());
        run(&backends, dir.path(), &bags, batches, idle);
    }
    if wanted("services") {
        let dir = tempfile::tempdir().unwrap();
        let backends = Backends::services(dir.path());
        run(&backends, dir.path(), &bags, batches, idle);
    }
}

/// The good deliveries of `autocomp demo` (it writes 20, 4 deliberately broken), run once
/// through its own cron-style rounds in `dir`; the bags stay in its `incoming`.
fn sample_bags(dir: &Path) -> Vec<PathBuf> {
    let status = Command::new(binary("autocomp"))
        .args(["demo", "--dir"])
        .arg(dir)
        .args(["--batches", "20"])
        .env_remove("AUTOCOMP_CONFIG_DIR")
        .stdout(Stdio::null())
        .status()
        .expect("autocomp demo runs");
    assert!(status.success(), "autocomp demo failed");
    let store = dir.join("store.db");
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let store = runtime.block_on(SqliteStore::open(store)).unwrap();
    let mut good: Vec<PathBuf> = std::fs::read_dir(dir.join("incoming"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|bag| {
            let id = BatchId::new(bag.file_name().unwrap().to_string_lossy().as_ref()).unwrap();
            let batch = runtime.block_on(store.get_batch(&id)).unwrap();
            batch.effective().iter().any(|e| e.event_type.as_str() == "Data_Archived")
        })
        .collect();
    good.sort();
    assert!(good.len() >= 10, "autocomp demo archived only {} bags", good.len());
    good
}

/// Where the pipeline keeps its state, and what the bench needs to run next to it.
struct Backends {
    store: String,
    index: String,
    locks: String,
    /// Kept running for the setup's life; dropped (killed) after.
    services: Vec<Service>,
    _zookeeper: Option<ZooKeeper>,
}

impl Backends {
    fn embedded(dir: &Path) -> Backends {
        Backends {
            store: format!("sqlite://{}", dir.join("store.db").display()),
            index: format!("local:{}", dir.join("index").display()),
            locks: format!("local:{}", dir.join("locks").display()),
            services: Vec::new(),
            _zookeeper: None,
        }
    }

    fn services(dir: &Path) -> Backends {
        let logs = dir.join("logs");
        std::fs::create_dir_all(&logs).unwrap();
        let store = Service::store(&dir.join("store.db"), &logs);
        let index = Service::index(&store.url(), &dir.join("index"), &logs);
        let zookeeper = ZooKeeper::standalone();
        Backends {
            store: store.url(),
            index: index.url(),
            locks: zookeeper.url("autocomp", "10s"),
            services: vec![store, index],
            _zookeeper: Some(zookeeper),
        }
    }

    fn name(&self) -> &'static str {
        if self.services.is_empty() { "embedded" } else { "services" }
    }

    fn open_store(&self, runtime: &tokio::runtime::Runtime) -> Arc<dyn ObjectStore> {
        match self.store.strip_prefix("sqlite://") {
            Some(path) => Arc::new(runtime.block_on(SqliteStore::open(path)).unwrap()),
            None => Arc::new(HttpStore::with_token(&self.store, Some(TOKEN.into())).unwrap()),
        }
    }
}

/// A component binary of the demo with the bench's config dir and nothing from the
/// environment that would change what it does.
fn component(name: &str, config_dir: &Path, args: &[&str], log: &Path) -> Command {
    let mut command = Command::new(binary(name));
    command.arg("--config-dir").arg(config_dir).args(args);
    for var in
        ["AUTOCOMP_STORE", "AUTOCOMP_INDEX", "AUTOCOMP_LOCKS", "AUTOCOMP_CONFIG_DIR", "RUST_LOG", "AUTOCOMP_TOKEN_FILE"]
    {
        command.env_remove(var);
    }
    let log = std::fs::OpenOptions::new().create(true).append(true).open(log).unwrap();
    command.env("AUTOCOMP_TOKEN", TOKEN).stdin(Stdio::null()).stdout(Stdio::null()).stderr(log);
    command
}

fn write_config(backends: &Backends, dir: &Path) -> PathBuf {
    let config = dir.join("config");
    for sub in ["config", "incoming", "staging", "archive", "logs"] {
        std::fs::create_dir_all(dir.join(sub)).unwrap();
    }
    let shared =
        format!("store = \"{}\"\nindex = \"{}\"\nlocks = \"{}\"\n", backends.store, backends.index, backends.locks);
    std::fs::write(config.join("autocomp.toml"), shared).unwrap();
    let incoming = dir.join("incoming").display().to_string();
    std::fs::write(
        config.join("batch-trigger.toml"),
        format!("[settings]\nincoming = \"{incoming}\"\nsettle_for = \"0s\"\n"),
    )
    .unwrap();
    let heartbeat = format!("watch_heartbeat = \"{HEARTBEAT}\"\n");
    std::fs::write(config.join("checksum-verifier.toml"), &heartbeat).unwrap();
    std::fs::write(config.join("structure-checker.toml"), &heartbeat).unwrap();
    let archive = dir.join("archive").display().to_string();
    std::fs::write(config.join("archiver.toml"), format!("{heartbeat}[settings]\narchive_root = \"{archive}\"\n"))
        .unwrap();
    config
}

/// Clock ticks of user and system CPU time a process has used so far.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the command's closing parenthesis; utime and stime are the 14th and
    // 15th of the whole line, the 12th and 13th after it.
    let rest = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or_default();
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let tick = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok()).unwrap_or(0);
    tick(11) + tick(12)
}

fn ticks_to_ms(ticks: u64) -> f64 {
    // SAFETY: sysconf has no preconditions.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    ticks as f64 * 1000.0 / per_second
}

fn sigterm(child: &Child) {
    // SAFETY: kill(2) on the pid of a child we spawned and have not reaped yet.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
}

fn run(backends: &Backends, dir: &Path, bags: &[PathBuf], batches: usize, idle: Duration) {
    println!("\n## {} (store {}, index {}, locks {})", backends.name(), backends.store, backends.index, backends.locks);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let store = backends.open_store(&runtime);
    let config = write_config(backends, dir);
    let logs = dir.join("logs");
    let mut watchers: Vec<(&str, Child)> = WATCHERS
        .iter()
        .map(|name| {
            let log = logs.join(format!("{name}.log"));
            (*name, component(name, &config, &["--watch"], &log).spawn().expect("a watcher starts"))
        })
        .collect();
    let show_logs = || {
        WATCHERS
            .iter()
            .map(|name| {
                format!("--- {name}\n{}", std::fs::read_to_string(logs.join(format!("{name}.log"))).unwrap_or_default())
            })
            .collect::<String>()
    };
    let registered = wait_until(Instant::now() + Duration::from_secs(60), || {
        runtime.block_on(store.components()).map(|c| c.len() >= WATCHERS.len()).unwrap_or(false)
    });
    assert!(registered, "the watchers never registered:\n{}", show_logs());

    let mut latencies = Vec::with_capacity(batches);
    let mut walls = Vec::with_capacity(batches);
    for n in 0..batches {
        let id = format!("B{:012}-RT1", 500_000_000_000u64 + n as u64);
        let staged = dir.join("staging").join(&id);
        copy_tree(&bags[n % bags.len()], &staged);
        std::fs::rename(&staged, dir.join("incoming").join(&id)).unwrap();
        let trigger_log = logs.join("batch-trigger.log");
        let status = component("batch-trigger", &config, &[], &trigger_log).status().unwrap();
        assert!(
            status.success(),
            "batch-trigger failed:\n{}",
            std::fs::read_to_string(trigger_log).unwrap_or_default()
        );
        let started = Instant::now();
        let id = BatchId::new(id).unwrap();
        let mut times = None;
        let archived = wait_until(Instant::now() + Duration::from_secs(30), || {
            let batch = runtime.block_on(store.get_batch(&id)).unwrap();
            let at = |kind: &str| batch.events.iter().find(|e| e.event_type.as_str() == kind).map(|e| e.at);
            times = at("Data_Received").zip(at("Data_Archived"));
            times.is_some()
        });
        if !archived {
            let batch = runtime.block_on(store.get_batch(&id)).unwrap();
            let events: Vec<String> = batch
                .events
                .iter()
                .map(|e| format!("{} {} {:?} {}", e.event_type, e.outcome.as_str(), e.agent, e.details))
                .collect();
            panic!("{id} was not archived within 30 s; its events:\n{}\n{}", events.join("\n"), show_logs());
        }
        walls.push(started.elapsed());
        let (received, archived) = times.unwrap();
        latencies.push(archived.since(received));
    }
    latencies.sort();
    walls.sort();
    let p50 = percentile(&latencies, 0.5);
    println!("Data_Received -> Data_Archived over {batches} batches, one at a time (store timestamps, ms resolution):");
    println!(
        "  p50 {:.0} ms (goal <= {:.0} ms: {}), p99 {:.0} ms, max {:.0} ms, min {:.0} ms",
        ms(p50),
        ms(GOAL_P50),
        if p50 <= GOAL_P50 { "met" } else { "NOT met" },
        ms(percentile(&latencies, 0.99)),
        ms(*latencies.last().unwrap()),
        ms(latencies[0]),
    );
    println!(
        "  (seen by the bench, batch-trigger's exit to archived: p50 {:.0} ms, p99 {:.0} ms)",
        ms(percentile(&walls, 0.5)),
        ms(percentile(&walls, 0.99))
    );

    // Idle: nothing ready, nothing arriving.
    let service_pids: Vec<(String, u32)> = backends
        .services
        .iter()
        .zip(["autocomp-store serve", "sboi serve"])
        .filter_map(|(service, name)| service_pid(service).map(|pid| (name.to_owned(), pid)))
        .collect();
    let before: Vec<u64> = watchers.iter().map(|(_, child)| cpu_ticks(child.id())).collect();
    let services_before: Vec<u64> = service_pids.iter().map(|(_, pid)| cpu_ticks(*pid)).collect();
    let idle_start = Instant::now();
    let still_running =
        wait_until(idle_start + idle, || watchers.iter_mut().any(|(_, child)| child.try_wait().unwrap().is_some()));
    assert!(!still_running, "a watcher exited while idle:\n{}", show_logs());
    let seconds = idle_start.elapsed().as_secs_f64();
    println!("idle CPU over {seconds:.0} s (user + system, /proc/<pid>/stat, 10 ms ticks):");
    for ((name, child), before) in watchers.iter().zip(&before) {
        let used = ticks_to_ms(cpu_ticks(child.id()) - before);
        println!("  {name} --watch: {used:.0} ms ({:.3}% of a core)", used / seconds / 10.0);
    }
    for ((name, pid), before) in service_pids.iter().zip(&services_before) {
        let used = ticks_to_ms(cpu_ticks(*pid) - before);
        println!("  {name}: {used:.0} ms ({:.3}% of a core)", used / seconds / 10.0);
    }

    for (_, child) in &watchers {
        sigterm(child);
    }
    for (name, mut child) in watchers {
        let stopped = wait_until(Instant::now() + Duration::from_secs(30), || child.try_wait().unwrap().is_some());
        assert!(stopped, "{name} did not stop on SIGTERM");
        let status = child.wait().unwrap();
        assert_eq!(status.code(), Some(0), "{name} exited {status} on SIGTERM:\n{}", show_logs());
    }
    let open = runtime.block_on(store.open_runs(None)).unwrap();
    assert!(open.is_empty(), "runs left open: {open:?}");
    println!("load average after: {}", load_average());
}

/// The pid of a service's process, found by its listening port in /proc (the harness does
/// not expose its child).
fn service_pid(service: &Service) -> Option<u32> {
    let port = format!("{}", service.port);
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline);
        if cmdline.contains("serve") && cmdline.contains(&format!(":{port}")) {
            return Some(pid);
        }
    }
    None
}
