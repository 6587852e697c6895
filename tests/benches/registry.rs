//! Idle cron start with the component registry in place, side by side with the release
//! before it, in one run: the release `probe-component` of this tree and of a baseline
//! commit, each on its own SQLite store (default settings), a local index, and
//! ZooKeeper locks on one real standalone server. Starts alternate between the two binaries,
//! so both see the same machine load.
//!
//!     cargo bench -p autocomp-e2e --bench registry
//!
//! The baseline is built from `AUTOCOMP_BENCH_BASELINE_REV` (default `ac00e02`, the last
//! commit before the registry) in a git worktree under `target/bench-baseline` (once; later
//! runs reuse it). `AUTOCOMP_BENCH_IDLE` (default 60) sets the idle starts per binary.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use autocomp_e2e::zk::ZooKeeper;
use autocomp_e2e::{binary, percentile};

const DEFAULT_BASELINE: &str = "ac00e02";

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace root").to_path_buf()
}

/// The baseline's release `probe-component`, built in a worktree of `rev` if not yet there.
fn baseline_probe(rev: &str) -> PathBuf {
    let root = workspace();
    let tree = root.join("target/bench-baseline").join(rev);
    let probe = tree.join("target/release/probe-component");
    if probe.exists() {
        return probe;
    }
    if !tree.exists() {
        let added = Command::new("git")
            .arg("-C")
            .arg(&root)
            .args(["worktree", "add", "--detach"])
            .arg(&tree)
            .arg(rev)
            .status()
            .expect("git runs");
        assert!(added.success(), "git worktree add {} {rev} failed", tree.display());
    }
    eprintln!("building the baseline probe-component at {rev} (release; once)...");
    let built = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .current_dir(&tree)
        .args(["build", "--release", "--offline", "-p", "autocomp-e2e", "--bin", "probe-component"])
        .status()
        .expect("cargo runs");
    assert!(built.success(), "building the baseline failed");
    probe
}

/// A config dir for one binary: its own store file and index, ZooKeeper locks under `chroot`.
fn config(dir: &Path, name: &str, locks: &str) -> PathBuf {
    let config = dir.join(name);
    std::fs::create_dir_all(&config).unwrap();
    let shared = format!(
        "store = \"sqlite://{}\"\nindex = \"local:{}\"\nlocks = \"{locks}\"\n",
        config.join("store.db").display(),
        config.join("index").display(),
    );
    std::fs::write(config.join("autocomp.toml"), shared).unwrap();
    config
}

fn idle_start(probe: &Path, config: &Path) -> Duration {
    let started = Instant::now();
    let output = Command::new(probe)
        .arg("--config-dir")
        .arg(config)
        .env_remove("AUTOCOMP_STORE")
        .env_remove("AUTOCOMP_INDEX")
        .env_remove("AUTOCOMP_LOCKS")
        .env_remove("AUTOCOMP_CONFIG_DIR")
        .output()
        .expect("the probe runs");
    let elapsed = started.elapsed();
    assert!(output.status.success(), "probe failed: {}", String::from_utf8_lossy(&output.stderr));
    assert!(output.stdout.is_empty(), "an idle start processes nothing");
    elapsed
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn main() {
    let rev = std::env::var("AUTOCOMP_BENCH_BASELINE_REV").unwrap_or_else(|_| DEFAULT_BASELINE.into());
    let starts: usize = std::env::var("AUTOCOMP_BENCH_IDLE").ok().and_then(|v| v.parse().ok()).unwrap_or(60);
    let baseline = baseline_probe(&rev);
    let current = binary("probe-component");
    let zk = ZooKeeper::standalone();
    let dir = tempfile::tempdir().unwrap();
    let configs = [
        (format!("baseline {rev}"), baseline, config(dir.path(), "baseline", &zk.url("baseline", "10s"))),
        ("this tree (registry)".to_owned(), current, config(dir.path(), "current", &zk.url("current", "10s"))),
    ];
    // First starts create the store files and index directories: not what cron repeats.
    for (_, probe, config) in &configs {
        idle_start(probe, config);
    }
    let mut samples = [Vec::with_capacity(starts), Vec::with_capacity(starts)];
    for _ in 0..starts {
        for (i, (_, probe, config)) in configs.iter().enumerate() {
            samples[i].push(idle_start(probe, config));
        }
    }
    println!("idle cron start, SQLite FULL store, local index, ZooKeeper locks; {starts} starts each, alternating");
    println!("| binary | p50 | p95 | goal | met |");
    println!("|---|---|---|---|---|");
    for ((name, _, _), times) in configs.iter().zip(samples.iter_mut()) {
        times.sort_unstable();
        let (p50, p95) = (percentile(times, 0.5), percentile(times, 0.95));
        let met = if ms(p50) <= 20.0 { "yes" } else { "no" };
        println!("| {name} | {:.1} ms | {:.1} ms | ≤ 20 ms p50 | {met} |", ms(p50), ms(p95));
    }
}
