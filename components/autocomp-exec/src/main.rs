//! `autocomp-exec`: any command as an autonomous component. Owns the command line (name,
//! event type, trigger, the command), the `{batch_id}`/`{batch_dir}` substitution and the
//! mapping of exit statuses onto outcomes; `child` owns running and killing the command.

mod child;

use std::path::Path;
use std::process::{Command, ExitCode};
use std::time::Duration;

use autocomp_framework::EventType;
use autocomp_framework::RunnerArgs;
use autocomp_framework::exit::EXIT_CODES_HELP;
use autocomp_framework::prelude::*;
// Not re-exported by the framework: the validated component name and the duration format
// of config files.
use autocomp_framework::{ComponentName, duration_text};
use clap::Parser;
use serde_json::json;

/// EX_TEMPFAIL from sysexits.h: "try again later".
const EXIT_TRANSIENT: i32 = 75;

const AFTER_HELP: &str = "The command runs once per ready batch, in its own process group, with \
{batch_id} and {batch_dir} replaced in every word and AUTOCOMP_BATCH_ID / AUTOCOMP_BATCH_DIR set \
(inside `sh -c` scripts use the variables: a substituted path would be parsed as shell code). \
Its exit status: 0 success; 75 (EX_TEMPFAIL) a transient failure, retried after retry_backoff; \
anything else a failure, with the last line of its stderr in the report. Its stdout and stderr \
are kept with the run's result (the first and the last bytes of each, `max_output` in the config \
file, default 64KiB for both together: half each when both are long): `autocomp logs ID` prints them, the monitor's \
batch page shows them. On timeout or cancellation the whole group gets SIGTERM, then SIGKILL \
after `kill_grace` ([settings], default 5s).\n\n";

#[derive(Debug, Parser)]
#[command(
    name = "autocomp-exec",
    version,
    about = "Runs any command as an autonomous component, recording its outcome as an event.",
    after_help = format!("{AFTER_HELP}{EXIT_CODES_HELP}")
)]
struct ExecCli {
    /// Component name: names its config file (<config-dir>/<name>.toml), locks and claims.
    #[arg(long, value_parser = component_name)]
    name: ComponentName,
    /// The event type its results are recorded as.
    #[arg(long, value_parser = event_type)]
    event_type: EventType,
    /// Event types that must have succeeded first (comma-separated or repeated).
    #[arg(long, value_delimiter = ',', value_parser = event_type, value_name = "TYPES")]
    requires: Vec<EventType>,
    /// Event types whose presence blocks it, besides its own event type.
    #[arg(long, value_delimiter = ',', value_parser = event_type, value_name = "TYPES")]
    blocked_by: Vec<EventType>,
    #[command(flatten)]
    runner: RunnerArgs,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    command: Vec<String>,
}

fn component_name(text: &str) -> Result<ComponentName, String> {
    ComponentName::new(text).map_err(|e| e.to_string())
}

fn event_type(text: &str) -> Result<EventType, String> {
    EventType::new(text).map_err(|e| e.to_string())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct Settings {
    /// Between SIGTERM and SIGKILL when the run is cancelled.
    #[serde(with = "duration_text")]
    kill_grace: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Self { kill_grace: Duration::from_secs(5) }
    }
}

struct Exec {
    name: ComponentName,
    event_type: EventType,
    trigger: Trigger,
    command: Vec<String>,
}

impl Exec {
    fn new(cli: &ExecCli) -> Self {
        // Blocked by its own type, so it runs once per batch until an operator reruns it.
        let mut blocked_by = vec![cli.event_type.clone()];
        for extra in &cli.blocked_by {
            if !blocked_by.contains(extra) {
                blocked_by.push(extra.clone());
            }
        }
        // The names were validated when the command line was parsed, so `build` cannot fail.
        let requires: Vec<&str> = cli.requires.iter().map(EventType::as_str).collect();
        let blocked_by: Vec<&str> = blocked_by.iter().map(EventType::as_str).collect();
        let trigger = Trigger::builder().requires(&requires[..]).blocked_by(&blocked_by[..]).build();
        Self { name: cli.name.clone(), event_type: cli.event_type.clone(), trigger, command: cli.command.clone() }
    }
}

impl Component for Exec {
    type Settings = Settings;

    fn name(&self) -> &str {
        self.name.as_str()
    }
    fn version(&self) -> &str {
        env!("CARGO_PKG_VERSION")
    }
    fn event_type(&self) -> &str {
        self.event_type.as_str()
    }
    fn trigger(&self) -> Trigger {
        self.trigger.clone()
    }

    fn work(&self, batch: &Batch, settings: &Settings, context: &mut WorkContext) -> Result<(), WorkError> {
        let dir = context.location().ok().map(Path::to_path_buf);
        let words = substitute(&self.command, batch.id.as_str(), dir.as_deref())?;
        let program = words[0].clone();
        let mut command = Command::new(&program);
        command.args(&words[1..]).env("AUTOCOMP_BATCH_ID", batch.id.as_str());
        match &dir {
            Some(dir) => command.env("AUTOCOMP_BATCH_DIR", dir),
            // Never let a value inherited from our own environment pose as this batch's.
            None => command.env_remove("AUTOCOMP_BATCH_DIR"),
        };
        // Each stream is captured within the whole budget; the runner then fits both into
        // it: half each when both are long, and a quiet stream leaves its share to the other.
        let limit = context.output_budget();
        let cancelled = || context.is_cancelled();
        let outcome = child::run(&mut command, settings.kill_grace, limit, cancelled).with_path(&program)?;
        let finished = match outcome {
            child::Outcome::Cancelled { printed } => {
                let said = printed.stderr.last_line().map(|l| format!(" (last stderr: {l})")).unwrap_or_default();
                keep_output(context, printed);
                return Err(WorkError::permanent(format!("cancelled: killed the process group of `{program}`{said}")));
            }
            child::Outcome::Finished(finished) => finished,
        };
        let printed = finished.printed;
        // The whole output (head and tail) is the run's output; the failure keeps the ends
        // of both streams too, as it always has, for whatever reads the failure alone.
        let details = json!({
            "command": words,
            "exit_code": finished.status.code(),
            "stderr_tail": tail_text(&printed.stderr.text()),
            "stdout_tail": tail_text(&printed.stdout.text()),
        });
        let stderr_line = printed.stderr.last_line().unwrap_or("no output on stderr").to_owned();
        let stdout_line = printed.stdout.last_line().map(str::to_owned);
        keep_output(context, printed);
        match finished.status.code() {
            Some(0) => {
                let said = stdout_line.map(|l| format!(": {l}")).unwrap_or_default();
                context.set_summary(format!("`{program}` exited 0{said}"));
                Ok(())
            }
            Some(EXIT_TRANSIENT) => {
                context.add_failure(&program, "exit_status", stderr_line, details);
                Err(WorkError::transient(format!("`{program}` exited {EXIT_TRANSIENT} (temporary failure)")))
            }
            Some(code) => {
                context.add_failure(&program, "exit_status", stderr_line, details);
                context.set_summary(format!("`{program}` exited with status {code}"));
                Ok(())
            }
            None => {
                use std::os::unix::process::ExitStatusExt;
                let signal = finished.status.signal().unwrap_or_default();
                context.add_failure(&program, "signal", stderr_line, details);
                context.set_summary(format!("`{program}` was killed by signal {signal}"));
                Ok(())
            }
        }
    }
}

/// Replaces `{batch_id}` and `{batch_dir}` in every word. The batch id is a validated name;
/// the words go to the program as separate arguments, never through a shell.
fn substitute(command: &[String], batch_id: &str, dir: Option<&Path>) -> Result<Vec<String>, WorkError> {
    command
        .iter()
        .map(|word| {
            let word = word.replace("{batch_id}", batch_id);
            if !word.contains("{batch_dir}") {
                return Ok(word);
            }
            let dir = dir.ok_or_else(|| {
                WorkError::permanent("the command uses {batch_dir} but the batch has no `location` in its metadata")
            })?;
            let dir = dir.to_str().ok_or_else(|| {
                WorkError::permanent(format!(
                    "the batch location {} is not UTF-8; use $AUTOCOMP_BATCH_DIR",
                    dir.display()
                ))
            })?;
            Ok(word.replace("{batch_dir}", dir))
        })
        .collect()
}

/// How much of each stream a failure's details keep (the end is what explains a failure).
const TAIL_BYTES: usize = 2048;

/// The last `TAIL_BYTES` of `text`, cut at a character boundary, marked when cut.
fn tail_text(text: &str) -> String {
    if text.len() <= TAIL_BYTES {
        return text.to_owned();
    }
    let mut start = text.len() - TAIL_BYTES;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    format!("...{}", &text[start..])
}

/// Both streams go with the run's result (the runner drops one that printed nothing).
fn keep_output(context: &mut WorkContext, printed: child::Printed) {
    if context.output_budget() > 0 {
        context.set_output(printed.stdout);
        context.set_output(printed.stderr);
    }
}

fn main() -> ExitCode {
    let cli = ExecCli::parse();
    let component = Exec::new(&cli);
    autocomp_framework::run(component, cli.runner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tails_keep_the_end_and_cut_at_a_character() {
        assert_eq!(tail_text("short"), "short");
        let long = "é".repeat(TAIL_BYTES) + "the end";
        let tail = tail_text(&long);
        assert!(tail.starts_with("...é") && tail.ends_with("the end"), "{tail}");
        assert!(tail.len() <= TAIL_BYTES + 3);
    }

    #[test]
    fn placeholders_are_replaced_in_every_word() {
        let command = ["{batch_dir}/run", "--id={batch_id}", "x"].map(String::from);
        let words = substitute(&command, "B1-RT1", Some(Path::new("/in/B1-RT1"))).unwrap();
        assert_eq!(words, ["/in/B1-RT1/run", "--id=B1-RT1", "x"]);
        let err = substitute(&command, "B1-RT1", None).unwrap_err();
        assert!(err.to_string().contains("location"), "{err}");
    }

    #[test]
    fn the_trigger_blocks_on_its_own_type_once() {
        let cli = ExecCli::try_parse_from([
            "autocomp-exec",
            "--name",
            "ocr",
            "--event-type",
            "Ocr_Done",
            "--requires",
            "A,B",
            "--blocked-by",
            "Ocr_Done,C",
            "--",
            "true",
        ])
        .unwrap();
        let trigger = Exec::new(&cli).trigger;
        let names = |types: &[EventType]| types.iter().map(|t| t.to_string()).collect::<Vec<_>>();
        assert_eq!(names(&trigger.requires), ["A", "B"]);
        assert_eq!(names(&trigger.blocked_by), ["Ocr_Done", "C"]);
    }
}
