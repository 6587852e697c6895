//! A component for the end-to-end tests: its `[settings]` choose a behaviour (succeed,
//! fail, panic, hang, fail transiently N times, sleep) and it appends
//! `pid batch start_ns end_ns` to a ledger file, so tests can check exactly-once and
//! non-overlap from outside the processes; it can also mark when each batch's work begins
//! and hold work until a file appears, so tests can line processes up without sleeping.

use std::io::Write;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use autocomp_framework::{Component, IoResultExt, WorkContext, WorkError};
use autocomp_model::{Batch, EventType, Trigger};
use autocomp_test_servers::wait_until_every;
use serde::Deserialize;

/// Longest a batch's work waits for its `wait_for` gate (longer than any test that opens it).
const GATE_DEADLINE: Duration = Duration::from_secs(120);

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct Settings {
    /// succeed | fail | panic | hang | transient
    behaviour: String,
    /// For `transient`: this many transient failures per batch, then success.
    transient_failures: u32,
    /// Work time per batch.
    #[serde(with = "autocomp_model::duration_text")]
    work_time: Duration,
    /// Appended to after each batch's work.
    ledger: Option<std::path::PathBuf>,
    /// When set, `<started>/<batch id>` is written (holding the pid) as each batch's work begins.
    started: Option<std::path::PathBuf>,
    /// When set, work (and `work_time`) begins only once this file exists.
    wait_for: Option<std::path::PathBuf>,
    /// When set, the structured result `{"pages": N}` is recorded.
    pages: Option<u64>,
    /// When set, the `{"pages": N}` result of this event type is read, typed, and recorded
    /// as `{"pages_seen": N}`; a batch without it fails.
    read_pages_of: Option<String>,
    /// When set, a result of about this many bytes is recorded (`{"padding": "xx..."}`).
    result_bytes: Option<usize>,
}

#[derive(Debug, serde::Serialize, Deserialize)]
struct Pages {
    pages: u64,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            behaviour: "succeed".into(),
            transient_failures: 0,
            work_time: Duration::ZERO,
            ledger: None,
            started: None,
            wait_for: None,
            pages: None,
            read_pages_of: None,
            result_bytes: None,
        }
    }
}

struct Probe {
    name: String,
    event_type: String,
    requires: Vec<String>,
}

impl Component for Probe {
    type Settings = Settings;

    fn name(&self) -> &str {
        &self.name
    }
    fn version(&self) -> &str {
        env!("CARGO_PKG_VERSION")
    }
    fn event_type(&self) -> &str {
        &self.event_type
    }
    fn trigger(&self) -> Trigger {
        Trigger {
            requires: self.requires.iter().map(|t| EventType::new(t.as_str()).unwrap()).collect(),
            blocked_by: vec![EventType::new(self.event_type.as_str()).unwrap()],
            ..Trigger::default()
        }
    }

    fn work(&self, batch: &Batch, settings: &Settings, context: &mut WorkContext) -> Result<(), WorkError> {
        let start = now_ns();
        if let Some(dir) = &settings.started {
            let path = dir.join(batch.id.as_str());
            std::fs::write(&path, std::process::id().to_string()).with_path(&path)?;
        }
        if let Some(gate) = &settings.wait_for {
            // Bounded: a gate the test never opens fails the batch instead of holding it.
            let deadline = Instant::now() + GATE_DEADLINE;
            let opened =
                wait_until_every(Duration::from_millis(5), deadline, || gate.exists() || context.is_cancelled());
            if !opened {
                return Err(WorkError::permanent(format!(
                    "{} did not appear within {GATE_DEADLINE:?}",
                    gate.display()
                )));
            }
        }
        // The simulated work: `work_time`, or until cancelled.
        let deadline = Instant::now() + settings.work_time;
        wait_until_every(Duration::from_millis(5).min(settings.work_time), deadline, || context.is_cancelled());
        // Kept as the run's `log` output (what `autocomp logs` shows), whatever stderr logs.
        autocomp_framework::tracing::info!(behaviour = settings.behaviour.as_str(), "probe worked on {}", batch.id);
        let result = match settings.behaviour.as_str() {
            "succeed" => Ok(()),
            "fail" => {
                context.add_failure("data/page-1.tif", "probe", "deliberate failure", serde_json::Value::Null);
                Ok(())
            }
            "panic" => panic!("probe panicked on {}", batch.id),
            "hang" => loop {
                std::thread::sleep(Duration::from_secs(3600));
            },
            "transient" => {
                let attempt = context.checkpoint().and_then(|c| c["attempt"].as_u64()).unwrap_or(0) + 1;
                let failed_before = batch.events.iter().filter(|e| e.event_type == *self.event_type.as_str()).count();
                context.save_checkpoint(serde_json::json!({ "attempt": attempt }))?;
                if (failed_before as u32) < settings.transient_failures {
                    Err(WorkError::transient(format!("share offline (attempt {})", failed_before + 1)))
                } else {
                    Ok(())
                }
            }
            other => Err(WorkError::permanent(format!("unknown behaviour {other}"))),
        };
        if let Some(pages) = settings.pages {
            context.set_result(&Pages { pages })?;
        }
        if let Some(earlier) = &settings.read_pages_of {
            let Some(Pages { pages }) = batch.result::<Pages>(earlier)? else {
                return Err(WorkError::permanent(format!("no {earlier} result to read")));
            };
            context.set_result(&serde_json::json!({ "pages_seen": pages }))?;
        }
        if let Some(bytes) = settings.result_bytes {
            context.set_result(&serde_json::json!({ "padding": "x".repeat(bytes) }))?;
        }
        if let Some(ledger) = &settings.ledger {
            let line = format!("{} {} {} {}\n", std::process::id(), batch.id, start, now_ns());
            let mut file = std::fs::OpenOptions::new().create(true).append(true).open(ledger).with_path(ledger)?;
            file.write_all(line.as_bytes()).with_path(ledger)?;
        }
        result
    }
}

fn now_ns() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos()
}

fn main() -> std::process::ExitCode {
    // Name and event type come from the environment so one binary can play several roles.
    let name = std::env::var("PROBE_NAME").unwrap_or_else(|_| "probe".into());
    let event_type = std::env::var("PROBE_EVENT_TYPE").unwrap_or_else(|_| "Probed".into());
    let requires = std::env::var("PROBE_REQUIRES").unwrap_or_else(|_| "Data_Received".into());
    let requires = requires.split(',').filter(|s| !s.is_empty()).map(str::to_owned).collect();
    autocomp_framework::main(Probe { name, event_type, requires })
}
