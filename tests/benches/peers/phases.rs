//! Where an autocomp stage's time goes in the trickle (`AUTOCOMP_BENCH_PHASES=1`): each
//! watcher logs its passes' phases and its idle wake-ups on the `autocomp::phases` target
//! (debug), the bench reads the lines its workers wrote during the trickle and prints, per
//! stage, p50 / p90 / p99 of each phase of a pass, and the idle wake-ups per batch worked.

use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use autocomp_e2e::percentile;

/// The phases of a pass line, in the order a pass goes through them, then its wall time.
const PHASES: [&str; 12] = [
    "woken",
    "index",
    "poll_lock",
    "steering",
    "batch_locks",
    "recheck",
    "claim",
    "work",
    "append",
    "release",
    "other",
    "pass",
];

/// The phases a pass line sums over its batches, shown per batch.
const PER_BATCH: [&str; 3] = ["work", "append", "release"];

/// Whether the bench asks for the breakdown.
pub fn wanted() -> bool {
    std::env::var_os("AUTOCOMP_BENCH_PHASES").is_some_and(|v| v == "1")
}

/// Makes a worker write its phase lines to its log: the default level (warn) and the phases
/// target at debug. A worker already logging at debug (`-vv`) writes them anyway.
pub fn configure(command: &mut Command, at_debug: bool) {
    if wanted() && !at_debug {
        command.env("RUST_LOG", "warn,autocomp::phases=debug");
    }
}

/// The workers' logs from a point on (the trickle's start): each stage's log and its length then.
pub struct Window {
    logs: Vec<(String, PathBuf, u64)>,
}

impl Window {
    /// From now on, in each of `logs` (stage, log file); `None` unless the breakdown is wanted.
    pub fn open(logs: Vec<(String, PathBuf)>) -> Option<Window> {
        if !wanted() || logs.is_empty() {
            return None;
        }
        let logs = logs
            .into_iter()
            .map(|(stage, log)| {
                let len = std::fs::metadata(&log).map_or(0, |meta| meta.len());
                (stage, log, len)
            })
            .collect();
        Some(Window { logs })
    }

    /// Prints the breakdown of what the workers logged since `open`.
    pub fn close(self, system: &str) {
        let stages: Vec<(String, Stage)> =
            self.logs.iter().map(|(stage, log, from)| (stage.clone(), Stage::read(log, *from))).collect();
        println!(
            "phases of {system}'s passes that took up work in the trickle, p50 / p90 / p99 ms per pass \
             (work, append and release per batch: a pass's batches run in parallel):"
        );
        let mut header = format!("  {:<14}", "phase");
        for (stage, _) in &stages {
            header.push_str(&format!(" {stage:>24}"));
        }
        println!("{header}");
        for phase in PHASES {
            let mut row = format!("  {phase:<14}");
            for (_, stage) in &stages {
                let mut took: Vec<Duration> = stage.passes.iter().filter_map(|pass| pass.get(phase)).copied().collect();
                took.sort();
                let cell = match took.is_empty() {
                    true => "-".to_owned(),
                    false => format!(
                        "{:.2} / {:.2} / {:.2}",
                        ms(percentile(&took, 0.5)),
                        ms(percentile(&took, 0.9)),
                        ms(percentile(&took, 0.99))
                    ),
                };
                row.push_str(&format!(" {cell:>24}"));
            }
            println!("{row}");
        }
        let rows: [(&str, StageCell); 3] = [
            ("passes", |stage| format!("{} ({} batches)", stage.passes.len(), stage.batches)),
            ("idle wake-ups", |stage| stage.idle_wakes.to_string()),
            ("idle / batch", |stage| format!("{:.2}", stage.idle_wakes as f64 / stage.batches.max(1) as f64)),
        ];
        for (what, cell) in rows {
            let mut row = format!("  {what:<14}");
            for (_, stage) in &stages {
                row.push_str(&format!(" {:>24}", cell(stage)));
            }
            println!("{row}");
        }
    }
}

/// One cell of a stage's column, worked out from what its watcher logged.
type StageCell = fn(&Stage) -> String;

/// What one stage's watcher logged in the window: each pass's phases, the batches its
/// passes took up, and its idle wake-ups.
#[derive(Default)]
struct Stage {
    passes: Vec<BTreeMap<&'static str, Duration>>,
    batches: u64,
    idle_wakes: u64,
}

impl Stage {
    fn read(log: &PathBuf, from: u64) -> Stage {
        let mut text = String::new();
        if let Ok(mut file) = std::fs::File::open(log) {
            file.seek(SeekFrom::Start(from)).ok();
            file.read_to_string(&mut text).ok();
        }
        let mut stage = Stage::default();
        for line in text.lines() {
            let Some((_, logged)) = line.split_once("autocomp::phases: ") else { continue };
            let fields: BTreeMap<&str, u64> = logged
                .split_whitespace()
                .filter_map(|field| field.split_once('='))
                .filter_map(|(key, value)| Some((key, value.parse().ok()?)))
                .collect();
            if logged.starts_with("pass phases") {
                let batches = fields.get("batches").copied().unwrap_or(0);
                stage.batches += batches;
                let took = |phase: &str| {
                    let us = *fields.get(&*format!("{phase}_us"))?;
                    Some(if PER_BATCH.contains(&phase) { us / batches.max(1) } else { us })
                };
                let pass =
                    PHASES.iter().filter_map(|phase| Some((*phase, Duration::from_micros(took(phase)?)))).collect();
                stage.passes.push(pass);
            } else if logged.starts_with("idle wake") {
                stage.idle_wakes += 1;
            }
        }
        stage
    }
}

fn ms(took: Duration) -> f64 {
    took.as_secs_f64() * 1000.0
}
