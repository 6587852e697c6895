//! `autocomp-exec`: any command as an autonomous component. Owns the command line (name,
//! event type, trigger, result schema and reads, the command), its `[settings]`, the
//! `{batch_id}`/`{batch_dir}` substitution and the mapping of exit statuses and result files
//! onto outcomes; `child` owns running and killing the command, `protocol` the files a
//! command reads and writes (docs/command-protocol.md).

mod child;
mod outcome;
mod protocol;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Duration;

use autocomp_framework::EventType;
use autocomp_framework::RunnerArgs;
use autocomp_framework::exit::EXIT_CODES_HELP;
use autocomp_framework::prelude::*;
// Not re-exported by the framework: the validated component name and the duration format
// of config files.
use autocomp_framework::ResultRead;
use autocomp_framework::{ComponentName, duration_text};
use clap::Parser;
use serde_json::Map;

use outcome::{Ended, Said, keep_output};
use protocol::{BatchFile, ResultFile, RunFiles};

const AFTER_HELP: &str = "The command runs once per ready batch, in its own process group, with \
{batch_id} and {batch_dir} replaced in every word. autocomp-exec's own flags go before `--`: one \
no command takes (--event-type, --requires, --blocked-by, --result-schema, --reads, --step-version, \
--config-dir), or --dry-run, --watch and --schedule (which change what the pass does: a dry run meant \
must never run for real), after it is refused (exit 2), since it would be the command's argument; a \
command that takes such a flag itself goes after a second `--` (`-- -- CMD ...`). It speaks the command protocol, version 1 \
(docs/command-protocol.md): besides AUTOCOMP_PROTOCOL=1, AUTOCOMP_BATCH_ID and AUTOCOMP_BATCH_DIR \
(inside `sh -c` scripts use the variables: a substituted path would be parsed as shell code), it \
gets AUTOCOMP_BATCH_FILE (JSON: the batch, its effective events with their structured results, \
the checkpoint), AUTOCOMP_SETTINGS_FILE (JSON: the config's [settings] but kill_grace and \
settings_schema) and AUTOCOMP_RESULT_FILE, a path where it may write a JSON object with any of \
protocol, result, summary, failures, transient, checkpoint (nothing else; at most 1 MiB). The \
files live in a private directory removed after the run. Its exit status: 0 success (a failure \
when the result file gives failures, transient when it says \"transient\": true); 75 \
(EX_TEMPFAIL) a transient failure, retried after retry_backoff; anything else, or a signal, a \
failure (type exit_status or signal, with the last line of its stderr) unless the result file \
gives the failures. A malformed result file is a failure of type result_file saying what is \
wrong; a result not fitting --result-schema a failure of type result_schema naming the path, and \
a result this step reads (--reads) that does not fit what it declares a failure of type read_schema \
naming the field and `autocomp restart ID --from TYPE`, before the command runs. \
Its stdout and stderr are the run's output, kept with its result (the first and the last bytes \
of each, `max_output` in the config file, default 64KiB for both together: half each when both \
are long): `autocomp logs ID` prints them, the monitor's batch page shows them. With \
settings_schema = \"FILE\" in [settings] (a JSON Schema, relative to the config file's \
directory) the other settings are checked at every pass start: a mismatch ends the pass with exit \
2 before any batch is touched. On timeout or cancellation the whole group gets SIGTERM, then \
SIGKILL after `kill_grace` ([settings], default 5s).\n\n";

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
    /// A JSON Schema of the `result` the command writes: published in the component registry
    /// for the steps that read it, and a result not matching it is a failure (result_schema).
    #[arg(long, value_name = "FILE")]
    result_schema: Option<PathBuf>,
    /// The command reads TYPE's structured result (in AUTOCOMP_BATCH_FILE) expecting the JSON
    /// Schema in FILE: a pass refuses to start when TYPE's producer does not publish what it
    /// expects. Repeatable.
    #[arg(long, value_name = "TYPE=FILE", value_parser = read_arg)]
    reads: Vec<(EventType, PathBuf)>,
    /// The step's version, as the registry and the runs' agent name it [default: a Python
    /// step file's `__version__ = "..."`, else autocomp-exec's own].
    #[arg(long, value_name = "VERSION")]
    step_version: Option<String>,
    #[command(flatten)]
    runner: RunnerArgs,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    command: Vec<String>,
}

/// A version as the registry takes it: 1 to 64 printable ASCII characters, no space.
fn step_version(flag: &str, version: &str) -> Result<String, String> {
    let fits = (1..=64).contains(&version.len()) && version.bytes().all(|b| b.is_ascii_graphic());
    match fits {
        true => Ok(version.to_owned()),
        false => Err(format!(
            "{flag} {:?}: a version is 1 to 64 printable ASCII characters without spaces",
            autocomp_framework::for_terminal(version)
        )),
    }
}

/// The `__version__ = "..."` a Python step file declares (the script `python3` runs), if
/// one does in its first 200 lines and it is a valid version.
fn python_version(command: &[String]) -> Option<String> {
    let script = command.get(1).filter(|word| word.ends_with(".py"))?;
    let text = std::fs::read_to_string(script).ok()?;
    text.lines().take(200).find_map(|line| {
        // `__version__ = "1.0.0"`, `__version__: str = '1.0.0'  # a comment`
        let (_, value) = line.strip_prefix("__version__")?.split_once('=')?;
        let value = value.trim_start();
        let quote = value.chars().next().filter(|c| *c == '"' || *c == '\'')?;
        let (version, _) = value[1..].split_once(quote)?;
        step_version("__version__", version).ok()
    })
}

/// autocomp-exec's flags no command of its own takes, and those that change what the pass
/// does (`--dry-run`, `--watch`, `--schedule`: `-- python3 step.py --dry-run` ran a real pass
/// where a dry one was meant): found after `--`, they were meant for autocomp-exec. Its other
/// generic ones (`--name`, `--config`, `--force`, `--batch`, `-v`) are words many tools take
/// (`gpg --batch`): those pass to the command.
const MISPLACED_FLAGS: &[&str] = &[
    "--event-type",
    "--requires",
    "--blocked-by",
    "--result-schema",
    "--reads",
    "--step-version",
    "--config-dir",
    "--dry-run-limit",
    "--dry-run",
    "--watch",
    "--schedule",
];

/// The command's words, refusing one of autocomp-exec's own flags that no command takes
/// (`MISPLACED_FLAGS`: `--requires`, `--reads=...`): placed after `--` by mistake it would
/// silently become the command's argument, and the step run without it. A command that takes such a flag itself is written
/// after a second `--` (`-- -- CMD ...`), whose words are taken as they are.
fn command_words(command: &[String]) -> Result<Vec<String>, String> {
    if let Some(("--", literal)) = command.split_first().map(|(first, rest)| (first.as_str(), rest)) {
        if literal.is_empty() {
            return Err("no command after `-- --`".into());
        }
        return Ok(literal.to_vec());
    }
    let misplaced = command.iter().find(|word| {
        let flag = word.split_once('=').map_or(word.as_str(), |(flag, _)| flag);
        MISPLACED_FLAGS.contains(&flag)
    });
    match misplaced {
        None => Ok(command.to_vec()),
        Some(word) => Err(format!(
            "`{}` comes after `--`, so it would be passed to the command `{}` instead of read by autocomp-exec: put \
             autocomp-exec's flags before `--` (if the command itself takes it, write `-- -- {} ...`)",
            autocomp_framework::for_terminal(word),
            autocomp_framework::for_terminal(&command[0]),
            autocomp_framework::for_terminal(&command[0])
        )),
    }
}

fn component_name(text: &str) -> Result<ComponentName, String> {
    ComponentName::new(text).map_err(|e| e.to_string())
}

fn event_type(text: &str) -> Result<EventType, String> {
    EventType::new(text).map_err(|e| e.to_string())
}

fn read_arg(text: &str) -> Result<(EventType, PathBuf), String> {
    let (kind, file) = text.split_once('=').ok_or_else(|| format!("expected TYPE=FILE, got {text:?}"))?;
    if file.is_empty() {
        return Err(format!("expected TYPE=FILE, got {text:?}: no file"));
    }
    Ok((event_type(kind)?, PathBuf::from(file)))
}

/// Reads `file` as a JSON Schema (for `flag`): parsed and compiled, or what is wrong.
fn load_schema(flag: &str, file: &Path) -> Result<(Value, jsonschema::Validator), String> {
    let name = || format!("{flag} {}", file.display());
    let text = std::fs::read(file).map_err(|e| format!("{}: cannot read: {e}", name()))?;
    let schema: Value = serde_json::from_slice(&text).map_err(|e| format!("{}: not JSON: {e}", name()))?;
    let validator =
        jsonschema::validator_for(&schema).map_err(|e| format!("{}: not a valid JSON Schema: {e}", name()))?;
    Ok((schema, validator))
}

/// The `[settings]` table: exec's own keys, typed, and every other key, passed to the
/// command as JSON in AUTOCOMP_SETTINGS_FILE.
#[derive(Debug, Clone, PartialEq)]
struct Settings {
    /// Between SIGTERM and SIGKILL when the run is cancelled.
    kill_grace: Duration,
    /// A JSON Schema the command's settings are checked against at every pass start
    /// (relative to the config file's directory).
    settings_schema: Option<PathBuf>,
    /// The command's settings: every other key. A TOML value without a JSON form (a
    /// datetime, a float that is not a number) becomes its TOML text.
    command: Map<String, Value>,
}

const KILL_GRACE: &str = "kill_grace";
const SETTINGS_SCHEMA: &str = "settings_schema";

impl Default for Settings {
    fn default() -> Self {
        Self { kill_grace: Duration::from_secs(5), settings_schema: None, command: Map::new() }
    }
}

impl<'de> Deserialize<'de> for Settings {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let mut table = toml::Table::deserialize(deserializer)?;
        let mut settings = Settings::default();
        if let Some(value) = table.remove(KILL_GRACE) {
            settings.kill_grace =
                duration_text::deserialize(value).map_err(|e| D::Error::custom(format!("{KILL_GRACE}: {e}")))?;
        }
        match table.remove(SETTINGS_SCHEMA) {
            None => {}
            Some(toml::Value::String(file)) if !file.is_empty() => settings.settings_schema = Some(file.into()),
            Some(other) => {
                return Err(D::Error::custom(format!(
                    "{SETTINGS_SCHEMA}: expected the path of a JSON Schema file, got {other}"
                )));
            }
        }
        settings.command = table.into_iter().map(|(key, value)| (key, toml_to_json(value))).collect();
        Ok(settings)
    }
}

/// A TOML value as JSON; what JSON cannot hold (a datetime, nan, inf) becomes its TOML text.
fn toml_to_json(value: toml::Value) -> Value {
    match value {
        toml::Value::String(text) => Value::String(text),
        toml::Value::Integer(number) => Value::from(number),
        toml::Value::Float(number) => serde_json::Number::from_f64(number)
            .map_or_else(|| Value::String(toml::Value::Float(number).to_string()), Value::Number),
        toml::Value::Boolean(flag) => Value::Bool(flag),
        toml::Value::Datetime(datetime) => Value::String(datetime.to_string()),
        toml::Value::Array(items) => Value::Array(items.into_iter().map(toml_to_json).collect()),
        toml::Value::Table(table) => Value::Object(table.into_iter().map(|(k, v)| (k, toml_to_json(v))).collect()),
    }
}

/// `/limits/max_pages` as `limits.max_pages` (the way a TOML key is written).
fn dotted_key(pointer: &str) -> String {
    pointer.split('/').skip(1).map(|part| part.replace("~1", "/").replace("~0", "~")).collect::<Vec<_>>().join(".")
}

struct Exec {
    name: ComponentName,
    event_type: EventType,
    trigger: Trigger,
    command: Vec<String>,
    /// Where `settings_schema` is relative to: the config file's directory.
    config_dir: PathBuf,
    /// `--result-schema`: the schema, checked to compile when read.
    result_schema: Option<Value>,
    /// `--reads`.
    reads: Vec<ResultRead>,
    /// The version the registry and the agent name: `--step-version`, else the Python step
    /// file's `__version__`, else autocomp-exec's own.
    version: String,
}

impl Exec {
    /// The component the command line describes, its schema files read: an error names the
    /// flag and the file.
    fn from_cli(cli: &ExecCli) -> Result<Self, String> {
        let mut exec = Self::new(cli);
        exec.command = command_words(&cli.command)?;
        exec.version = match &cli.step_version {
            Some(version) => step_version("--step-version", version)?,
            None => python_version(&exec.command).unwrap_or_else(|| env!("CARGO_PKG_VERSION").to_owned()),
        };
        if let Some(file) = &cli.result_schema {
            let (schema, _) = load_schema("--result-schema", file)?;
            exec.result_schema = Some(schema);
        }
        for (event_type, file) in &cli.reads {
            let flag = format!("--reads {event_type}={}", file.display());
            let (schema, _) = load_schema(&flag, file)?;
            exec.reads.push(ResultRead { event_type: event_type.clone(), schema });
        }
        Ok(exec)
    }

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
        let config_dir = match &cli.runner.config {
            Some(file) => file.parent().map(Path::to_path_buf).unwrap_or_default(),
            None => cli.runner.config_dir.clone(),
        };
        Self {
            name: cli.name.clone(),
            event_type: cli.event_type.clone(),
            trigger,
            command: cli.command.clone(),
            config_dir,
            result_schema: None,
            reads: Vec::new(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
        }
    }

    /// Records the command's `result`; the runner checks it against `--result-schema` (the
    /// schema this step publishes) before recording it.
    fn record_result(&self, context: &mut WorkContext, result: Value) {
        if let Err(error) = context.set_result(&result) {
            context.add_failure("", "result_file", error.to_string(), Value::Null);
        }
    }
}

impl Component for Exec {
    type Settings = Settings;

    fn name(&self) -> &str {
        self.name.as_str()
    }
    fn version(&self) -> &str {
        &self.version
    }
    fn event_type(&self) -> &str {
        self.event_type.as_str()
    }
    fn trigger(&self) -> Trigger {
        self.trigger.clone()
    }
    fn result_schema(&self) -> Option<Value> {
        self.result_schema.clone()
    }
    fn reads(&self) -> Vec<ResultRead> {
        self.reads.clone()
    }

    fn check_settings(&self, settings: &Settings) -> Result<(), SettingError> {
        let Some(file) = &settings.settings_schema else {
            return Ok(());
        };
        let path = self.config_dir.join(file);
        let (_, validator) =
            load_schema(SETTINGS_SCHEMA, &path).map_err(|message| SettingError::new(SETTINGS_SCHEMA, message))?;
        let command = Value::Object(settings.command.clone());
        let Some(error) = validator.iter_errors(&command).next() else {
            return Ok(());
        };
        let pointer = error.instance_path().as_str();
        let key = if pointer.is_empty() { SETTINGS_SCHEMA.to_owned() } else { dotted_key(pointer) };
        Err(SettingError::new(key, format!("{error} (settings_schema {})", path.display())))
    }

    fn work(&self, batch: &Batch, settings: &Settings, context: &mut WorkContext) -> Result<(), WorkError> {
        let dir = context.location().ok().map(Path::to_path_buf);
        let words = substitute(&self.command, batch.id.as_str(), dir.as_deref())?;
        let program = words[0].clone();
        // The run's private directory goes when `files` is dropped: however the run ends.
        let batch_file = BatchFile::of(self.name.as_str(), batch, context.checkpoint());
        let files = RunFiles::create(&batch_file, &settings.command).with_path(std::env::temp_dir())?;
        let mut command = command_for(&words, batch, dir.as_deref(), &files);
        // Each stream is captured within the whole budget; the runner then fits both into
        // it: half each when both are long, and a quiet stream leaves its share to the other.
        // The runner saves what they hold while the command runs (`logs --follow`).
        let captures = child::Captures { stdout: context.capture("stdout"), stderr: context.capture("stderr") };
        let cancelled = || context.is_cancelled();
        let outcome = child::run(&mut command, settings.kill_grace, captures, cancelled).with_path(&program)?;
        let finished = match outcome {
            child::Outcome::Cancelled { printed } => {
                let said = printed.stderr.last_line().map(|l| format!(" (last stderr: {l})")).unwrap_or_default();
                keep_output(context, printed);
                return Err(WorkError::permanent(format!("cancelled: killed the process group of `{program}`{said}")));
            }
            child::Outcome::Finished(finished) => finished,
        };
        let written = protocol::read_result(&files.result_file());
        drop(files);
        let ended = Ended::of(words, finished, context);
        let said = self.take_result_file(context, written)?;
        ended.verdict(context, said)
    }
}

impl Exec {
    /// What the command's result file says, taken into the run (its checkpoint saved, its
    /// result checked and kept, its failures added); a malformed one is a failure of its own.
    fn take_result_file(
        &self,
        context: &mut WorkContext,
        written: Result<Option<ResultFile>, String>,
    ) -> Result<Said, WorkError> {
        // A malformed result file is a permanent failure, whatever the exit status said.
        let (mut file, malformed) = match written {
            Ok(file) => (file.unwrap_or_default(), false),
            Err(problem) => {
                context.add_failure("", "result_file", problem, Value::Null);
                (ResultFile::default(), true)
            }
        };
        if let Some(checkpoint) = file.checkpoint.take() {
            context.save_checkpoint(checkpoint)?;
        }
        if let Some(result) = file.result.take() {
            self.record_result(context, result);
        }
        let gave_failures = !file.failures.is_empty();
        for failure in file.failures {
            context.add_failure(failure.reference, failure.kind, failure.description, failure.details);
        }
        let summary = file.summary.filter(|s| !s.is_empty());
        Ok(Said { summary, gave_failures, transient: file.transient, malformed })
    }
}

/// The command to run for a batch: its words, and the protocol's environment (the batch,
/// its directory when it has one, the run's files).
fn command_for(words: &[String], batch: &Batch, dir: Option<&Path>, files: &RunFiles) -> Command {
    let mut command = Command::new(&words[0]);
    command
        .args(&words[1..])
        .env("AUTOCOMP_BATCH_ID", batch.id.as_str())
        .env(protocol::ENV_PROTOCOL, protocol::PROTOCOL.to_string())
        .env(protocol::ENV_BATCH_FILE, files.batch_file())
        .env(protocol::ENV_SETTINGS_FILE, files.settings_file())
        .env(protocol::ENV_RESULT_FILE, files.result_file());
    match dir {
        Some(dir) => command.env("AUTOCOMP_BATCH_DIR", dir),
        // Never let a value inherited from our own environment pose as this batch's.
        None => command.env_remove("AUTOCOMP_BATCH_DIR"),
    };
    command
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

fn main() -> ExitCode {
    let cli = ExecCli::parse();
    let component = match Exec::from_cli(&cli) {
        Ok(component) => component,
        Err(message) => {
            eprintln!("autocomp-exec: {message}");
            return ExitCode::from(autocomp_framework::exit::USAGE);
        }
    };
    for warning in unpublished_contract(&cli) {
        eprintln!("autocomp-exec: warning: {}", autocomp_framework::for_terminal(&warning));
    }
    autocomp_framework::run(component, cli.runner)
}

/// The contract files `autocomp new --lang python` writes beside a step (`STEM.result.json`,
/// `STEM.reads.TYPE.json`) that the command line does not give: a pass without them
/// publishes no result schema and declares no reads, which withdraws what the registry
/// held (readers are then no longer checked against it), so it is said on every pass.
fn unpublished_contract(cli: &ExecCli) -> Vec<String> {
    let Some(script) = cli.command.iter().find(|word| word.ends_with(".py")).map(Path::new) else {
        return Vec::new();
    };
    let (Some(dir), Some(stem)) = (script.parent(), script.file_stem().and_then(|s| s.to_str())) else {
        return Vec::new();
    };
    let dir = if dir.as_os_str().is_empty() { Path::new(".") } else { dir };
    let mut warnings = Vec::new();
    let schema = dir.join(format!("{stem}.result.json"));
    if cli.result_schema.is_none() && schema.is_file() {
        warnings.push(format!(
            "{} is beside the step but --result-schema is not given: a pass without it publishes no result \
             schema, replacing the one the registry holds (the steps that read it are then no longer checked); \
             give `--result-schema {}` before `--`",
            schema.display(),
            schema.display()
        ));
    }
    let prefix = format!("{stem}.reads.");
    let declared = std::fs::read_dir(dir).into_iter().flatten().flatten().filter_map(|entry| {
        let name = entry.file_name().into_string().ok()?;
        let event_type = name.strip_prefix(&prefix)?.strip_suffix(".json")?.to_owned();
        Some((event_type, entry.path()))
    });
    for (event_type, file) in declared {
        if !cli.reads.iter().any(|(read, _)| read.as_str() == event_type) {
            warnings.push(format!(
                "{} is beside the step but --reads {event_type}=... is not given: this pass declares no read of \
                 {event_type}'s result, so nothing checks that its producer still gives what the step reads; give \
                 `--reads {event_type}={}` before `--`",
                file.display(),
                file.display()
            ));
        }
    }
    warnings.sort();
    warnings
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_python_step_files_version_is_the_components() {
        let dir = tempfile::tempdir().unwrap();
        let step = dir.path().join("ocr.py");
        std::fs::write(&step, "\"\"\"ocr\"\"\"\n\n__version__ = \"2.3.4\"\n").unwrap();
        let command = vec!["python3".to_owned(), step.display().to_string()];
        assert_eq!(python_version(&command).as_deref(), Some("2.3.4"));
        std::fs::write(&step, "__version__: str = '1.0.0'  # the step's\n").unwrap();
        assert_eq!(python_version(&command).as_deref(), Some("1.0.0"));
        std::fs::write(&step, "__version__ = 'has space'\n").unwrap();
        assert_eq!(python_version(&command), None, "not a version: autocomp-exec's own is used");
        assert!(step_version("--step-version", "").is_err() && step_version("--step-version", "1.0.0-rc1").is_ok());
    }

    #[test]
    fn an_own_flag_after_the_double_dash_is_refused_unless_after_a_second_one() {
        let words = |text: &str| text.split(' ').map(str::to_owned).collect::<Vec<_>>();
        assert_eq!(command_words(&words("python3 step.py --pages 3")).unwrap(), words("python3 step.py --pages 3"));
        for misplaced in
            ["python3 step.py --requires Data_Received", "--config-dir x", "sh -c x --result-schema=s.json"]
        {
            let refused = command_words(&words(misplaced)).unwrap_err();
            assert!(refused.contains("comes after `--`") && refused.contains("-- -- "), "{refused}");
        }
        let refused = command_words(&words("python3 step.py --reads A=a.json")).unwrap_err();
        assert!(
            refused.starts_with("`--reads` comes after `--`, so it would be passed to the command `python3`"),
            "{refused}"
        );
        // A tool's own generic flags pass; one named as autocomp-exec's own goes after a
        // second `--`.
        assert_eq!(command_words(&words("gpg --batch --config x")).unwrap(), words("gpg --batch --config x"));
        let refused = command_words(&words("python3 step.py --dry-run")).unwrap_err();
        assert!(refused.starts_with("`--dry-run` comes after `--`"), "{refused}");
        assert_eq!(command_words(&words("-- rsync --dry-run")).unwrap(), words("rsync --dry-run"));
        assert_eq!(command_words(&words("-- tool --requires x")).unwrap(), words("tool --requires x"));
        assert!(command_words(&words("--")).is_err());
    }

    #[test]
    fn contract_files_beside_a_step_but_not_given_are_warned_of() {
        let dir = tempfile::tempdir().unwrap();
        let step = dir.path().join("ocr.py");
        std::fs::write(&step, "").unwrap();
        let schema = dir.path().join("ocr.result.json");
        let reads = dir.path().join("ocr.reads.Data_Archived.json");
        std::fs::write(&schema, "{}").unwrap();
        std::fs::write(&reads, "{}").unwrap();
        let step = step.display().to_string();
        let parse = |flags: &[&str]| {
            let mut args = vec!["autocomp-exec", "--name", "ocr", "--event-type", "Ocr_Done"];
            args.extend_from_slice(flags);
            args.extend_from_slice(&["--", "python3", &step]);
            ExecCli::try_parse_from(args).unwrap()
        };
        let bare = unpublished_contract(&parse(&[]));
        assert_eq!(bare.len(), 2, "{bare:?}");
        assert!(bare[0].contains("--reads Data_Archived=... is not given"), "{bare:?}");
        assert!(
            bare[1].contains("--result-schema is not given: a pass without it publishes no result schema"),
            "{bare:?}"
        );
        let (schema, reads) = (schema.display().to_string(), format!("Data_Archived={}", reads.display()));
        let given = unpublished_contract(&parse(&["--result-schema", &schema, "--reads", &reads]));
        assert!(given.is_empty(), "{given:?}");
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

    #[test]
    fn settings_keep_kill_grace_typed_and_pass_the_rest_as_json() {
        use autocomp_framework::testing::settings;
        let parsed: Settings = settings(
            "kill_grace = \"2s\"\nsettings_schema = \"s.json\"\nlang = \"nl\"\nn = 3\nx = 0.5\nnan = nan\n\
             when = 1979-05-27T07:32:00Z\nday = 1979-05-27\nt = { a = [true, 1] }\n",
        );
        assert_eq!(parsed.kill_grace, Duration::from_secs(2));
        assert_eq!(parsed.settings_schema, Some(PathBuf::from("s.json")));
        let expected = json!({"lang": "nl", "n": 3, "x": 0.5, "nan": "nan", "when": "1979-05-27T07:32:00Z",
                              "day": "1979-05-27", "t": {"a": [true, 1]}});
        assert_eq!(Value::Object(parsed.command), expected);
        assert_eq!(settings::<Settings>(""), Settings::default());
        let table: toml::Table = "kill_grace = \"soon\"".parse().unwrap();
        let error = autocomp_framework::config::settings::<Settings>(&table, Path::new("x.toml")).unwrap_err();
        assert!(error.to_string().contains("kill_grace"), "{error}");
        let table: toml::Table = "settings_schema = 3".parse().unwrap();
        let error = autocomp_framework::config::settings::<Settings>(&table, Path::new("x.toml")).unwrap_err();
        assert!(error.to_string().contains("settings_schema: expected the path"), "{error}");
    }

    #[test]
    fn a_settings_schema_names_the_key_and_the_value() {
        let dir = tempfile::tempdir().unwrap();
        let schema = r#"{"type": "object", "required": ["lang"], "properties": {"lang": {"enum": ["nl"]},
            "limits": {"properties": {"max/pages": {"type": "integer"}}}}}"#;
        std::fs::write(dir.path().join("s.json"), schema).unwrap();
        let cli = ExecCli::try_parse_from(["autocomp-exec", "--name", "ocr", "--event-type", "Ocr_Done", "--", "true"])
            .unwrap();
        let mut exec = Exec::new(&cli);
        exec.config_dir = dir.path().to_path_buf();
        let check = |toml: &str| {
            let settings: Settings =
                autocomp_framework::testing::settings(&format!("settings_schema = \"s.json\"\n{toml}"));
            exec.check_settings(&settings).map_err(|e| (e.key, e.message))
        };
        assert!(check("lang = \"nl\"").is_ok());
        let (key, message) = check("lang = \"fr\"").unwrap_err();
        assert_eq!(key, "lang");
        assert!(message.contains("\"fr\"") && message.contains("s.json"), "{message}");
        let (key, message) = check("lang = \"nl\"\nlimits = { \"max/pages\" = \"x\" }").unwrap_err();
        assert_eq!((key.as_str(), message.contains("\"x\" is not of type \"integer\"")), ("limits.max/pages", true));
        let (key, message) = check("").unwrap_err();
        assert_eq!(key, "settings_schema");
        assert!(message.contains("\"lang\" is a required property"), "{message}");
        std::fs::write(dir.path().join("s.json"), "{").unwrap();
        let (key, message) = check("lang = \"nl\"").unwrap_err();
        assert_eq!(key, "settings_schema");
        assert!(message.contains("not JSON"), "{message}");
    }

    #[test]
    fn reads_name_a_type_and_a_file() {
        assert_eq!(read_arg("Pages_Counted=a=b.json").unwrap().1, PathBuf::from("a=b.json"));
        assert!(read_arg("Pages_Counted").unwrap_err().contains("TYPE=FILE"));
        assert!(read_arg("Pages_Counted=").is_err());
        assert!(read_arg("1st=x.json").is_err());
    }
}
