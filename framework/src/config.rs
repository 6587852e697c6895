//! Configuration: one TOML file per component plus a shared `autocomp.toml` for
//! the backends, in one config directory. Unknown keys are errors naming the key; durations
//! read as `90s`, `5m`, `2h`. Backend URLs are overridden by env and command-line flags.

use std::path::{Path, PathBuf};
use std::time::Duration;

use autocomp_model::{
    ComponentDescriptor, ComponentName, DEFAULT_OUTPUT_BYTES, EventType, MAX_OUTPUT_BYTES, PoolName, Schedule, Trigger,
    duration_text,
};
use serde::Deserialize;

/// Where configs live unless `--config` / `--config-dir` / `AUTOCOMP_CONFIG_DIR` say otherwise.
pub const DEFAULT_CONFIG_DIR: &str = "/etc/autocomp";
/// The shared file in the config directory naming the backends.
pub const SHARED_FILE: &str = "autocomp.toml";
/// The shortest `watch_heartbeat`.
pub const MIN_WATCH_HEARTBEAT: Duration = Duration::from_secs(1);

/// A config file that cannot be read or used, and why: shown as `<file>: <message>`.
#[derive(Debug, thiserror::Error)]
#[error("{}: {message}", file.display())]
pub struct ConfigError {
    /// The file at fault (or the one that should have said it).
    pub file: PathBuf,
    /// What is wrong, naming the key where there is one.
    pub message: String,
}

impl ConfigError {
    /// An error about `file`.
    pub fn new(file: impl Into<PathBuf>, message: impl Into<String>) -> Self {
        Self { file: file.into(), message: message.into() }
    }
}

/// The shared `autocomp.toml`: which store, index and lock service the pipeline uses.
#[derive(Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Backends {
    /// `sqlite:///path/store.db`, `postgres://user@host/database` or `http://host:7070`
    pub store: Option<String>,
    /// `local:/path/index`
    pub index: Option<String>,
    /// `local:/path/locks`
    pub locks: Option<String>,
}

/// Shows the URLs as `display_url` does: a `{:?}` in a log or a panic never prints a
/// password.
impl std::fmt::Debug for Backends {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shown = |url: &Option<String>| url.as_deref().map(autocomp_toolkit::display_url);
        f.debug_struct("Backends")
            .field("store", &shown(&self.store))
            .field("index", &shown(&self.index))
            .field("locks", &shown(&self.locks))
            .finish()
    }
}

impl Backends {
    /// Later sources win: file < environment < command line.
    pub fn overridden_by(self, other: Backends) -> Backends {
        Backends {
            store: other.store.or(self.store),
            index: other.index.or(self.index),
            locks: other.locks.or(self.locks),
        }
    }

    /// What `AUTOCOMP_STORE`, `AUTOCOMP_INDEX` and `AUTOCOMP_LOCKS` say (empty means unset).
    pub fn from_env() -> Backends {
        let var = |name| std::env::var(name).ok().filter(|v: &String| !v.is_empty());
        Backends { store: var("AUTOCOMP_STORE"), index: var("AUTOCOMP_INDEX"), locks: var("AUTOCOMP_LOCKS") }
    }

    /// The three URLs, or an error naming the missing one and where to set it.
    pub fn require(&self, shared_file: &Path) -> Result<(String, String, String), ConfigError> {
        Ok((
            required(&self.store, "store", "AUTOCOMP_STORE", shared_file)?,
            required(&self.index, "index", "AUTOCOMP_INDEX", shared_file)?,
            required(&self.locks, "locks", "AUTOCOMP_LOCKS", shared_file)?,
        ))
    }

    /// The store URL alone (a source, which never asks the index; its dry run takes no lock).
    pub fn require_store(&self, shared_file: &Path) -> Result<String, ConfigError> {
        required(&self.store, "store", "AUTOCOMP_STORE", shared_file)
    }

    /// The lock service URL alone.
    pub fn require_locks(&self, shared_file: &Path) -> Result<String, ConfigError> {
        required(&self.locks, "locks", "AUTOCOMP_LOCKS", shared_file)
    }
}

fn required(value: &Option<String>, key: &str, env: &str, shared_file: &Path) -> Result<String, ConfigError> {
    value.clone().ok_or_else(|| {
        ConfigError::new(
            shared_file,
            format!("no {key} backend configured: set `{key} = \"...\"` here, ${env}, or --{key}"),
        )
    })
}

/// One component's `<name>.toml`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ComponentConfig {
    /// The event type the component records. Optional: the component knows it (and
    /// registers it in the store); when given, a mismatch is a config error, which catches a
    /// file copied to the wrong component.
    pub event_type: Option<String>,
    /// Batches worked on in parallel.
    pub max_threads: usize,
    /// Batches claimed per start.
    pub queue_size: usize,
    /// How far a pass's claims may grow under a backlog of quick work: a pass that filled
    /// its queue, with every batch's work under 100 ms on average, claims twice as many the
    /// next time, up to this; a pass that did not fill it (the backlog is gone) or whose work
    /// was slow goes back to `queue_size`. Set it to `queue_size` to keep passes one size.
    pub queue_grows_to: usize,
    /// Longest a batch's work may take before it is recorded as timed out.
    #[serde(with = "duration_text")]
    pub max_runtime: Duration,
    /// How long a pass waits for the poll lock before it leaves the pass to whoever holds it
    /// (exit 3). A watcher's passes (its heartbeat's too) do not wait: it defers and looks
    /// again.
    #[serde(with = "duration_text")]
    pub poll_lock_timeout: Duration,
    /// How long a pass waits for a batch's lock before it skips the batch as taken.
    #[serde(with = "duration_text")]
    pub batch_lock_timeout: Duration,
    /// Keep the poll lock while working (one worker per component at a time).
    pub hold_poll_lock: bool,
    /// Failed attempts (abandoned or transient) after which a batch gets a plain failure.
    pub max_attempts: u32,
    /// How long after a transient failure the batch is retried.
    #[serde(with = "duration_text")]
    pub retry_backoff: Duration,
    /// On SIGTERM/SIGINT, how long running work may finish before it is cancelled.
    #[serde(with = "duration_text")]
    pub shutdown_grace: Duration,
    /// After a timeout or shutdown cancels work, how long it may take to clean up (its
    /// result is discarded) before the process exits without it.
    #[serde(with = "duration_text")]
    pub cancel_grace: Duration,
    /// Failures kept in a report; the true count is always reported.
    pub max_reported_failures: usize,
    /// Bytes of a run's output kept with its result, all streams together (head and tail
    /// of each): `64KiB` (the default), `1MiB`, or a number of bytes; at most
    /// [`MAX_OUTPUT_BYTES`]; 0 keeps none.
    #[serde(deserialize_with = "size_text")]
    pub max_output: usize,
    /// A batch ready for this component longer than this needs a person: the monitor marks
    /// it overdue and `autocomp alerts` reports it (default: their `--ready-overdue-after`
    /// / `--ready-after`, 1h). Recorded in the registry, so readers on other hosts know it.
    #[serde(with = "duration_text::option")]
    pub overdue_after: Option<Duration>,
    /// No pass of this component on any host for this long needs a person: `autocomp
    /// alerts` reports it silent. Unset: silent after missing `--silent-periods` (3) passes
    /// of its `schedule`, or without a schedule after `--silent-after` (1h).
    #[serde(with = "duration_text::option")]
    pub silent_after: Option<Duration>,
    /// The crontab schedule cron runs this component on (its crontab line's first five
    /// fields), so readers know when a pass is missing; `--schedule` sets it too.
    pub schedule: Option<Schedule>,
    /// With `--watch`: the longest time between two passes when the store does not move.
    /// It keeps the registry's last pass fresh (so `autocomp alerts` does not call the
    /// watcher silent) and bounds how late readiness that only time brings (a transient
    /// retry's backoff, a trigger's `settled_for`) is noticed. At least 1s.
    #[serde(with = "duration_text")]
    pub watch_heartbeat: Duration,
    /// Resource pools (`autocomp pool set NAME SIZE`) each batch's work holds a slot of
    /// while it runs, across all hosts; a batch without a free slot waits for a later pass.
    pub pools: Vec<PoolName>,
    /// Pause this component after this many consecutive permanent failures on distinct
    /// batches (its circuit opens; `autocomp resume` closes it). Unset: never.
    pub break_after: Option<u32>,
    /// Trigger clauses replacing the component's defaults, clause by clause.
    pub trigger: toml::Table,
    /// Component-specific settings, checked by the component's `Settings` type.
    pub settings: toml::Table,
}

impl Default for ComponentConfig {
    fn default() -> Self {
        Self {
            event_type: None,
            max_threads: 2,
            queue_size: 10,
            queue_grows_to: 100,
            max_runtime: Duration::from_secs(3600),
            poll_lock_timeout: Duration::from_secs(10),
            batch_lock_timeout: Duration::from_millis(500),
            hold_poll_lock: false,
            max_attempts: 3,
            retry_backoff: Duration::from_secs(300),
            shutdown_grace: Duration::from_secs(30),
            cancel_grace: Duration::from_secs(10),
            max_reported_failures: 100,
            max_output: DEFAULT_OUTPUT_BYTES,
            overdue_after: None,
            silent_after: None,
            schedule: None,
            watch_heartbeat: Duration::from_secs(60),
            pools: Vec::new(),
            break_after: None,
            trigger: toml::Table::new(),
            settings: toml::Table::new(),
        }
    }
}

impl ComponentConfig {
    /// What the registry records of a component configured by this file: its readiness
    /// settings beside who it is. A source has a trigger of its own kind (none) and is never
    /// overdue, for nothing waits on it.
    pub fn descriptor(
        &self,
        name: ComponentName,
        version: &str,
        event_type: EventType,
        trigger: Trigger,
        source: bool,
    ) -> ComponentDescriptor {
        let mut pools = self.pools.clone();
        pools.sort();
        pools.dedup();
        let described = ComponentDescriptor::new(name, version, event_type, trigger).with_limits(
            self.max_attempts,
            self.retry_backoff,
            self.queue_size,
            self.max_runtime,
        );
        ComponentDescriptor {
            source,
            overdue_after: if source { None } else { self.overdue_after },
            silent_after: self.silent_after,
            schedule: self.schedule.clone(),
            pools,
            break_after: self.break_after,
            ..described
        }
    }

    /// The component's default trigger with this file's `[trigger]` clauses replacing its own.
    pub fn trigger(&self, default: &Trigger, file: &Path) -> Result<Trigger, ConfigError> {
        let mut merged = toml::Table::try_from(default)
            .map_err(|e| ConfigError::new(file, format!("cannot express the default trigger: {e}")))?;
        merged.extend(self.trigger.clone());
        toml::Value::Table(merged).try_into().map_err(|e| ConfigError::new(file, format!("[trigger]: {e}")))
    }

    fn check(&self, file: &Path) -> Result<(), ConfigError> {
        for (key, value) in [
            ("max_threads", self.max_threads),
            ("queue_size", self.queue_size),
            ("queue_grows_to", self.queue_grows_to),
        ] {
            if value == 0 {
                return Err(ConfigError::new(file, format!("{key} = 0: must be at least 1")));
            }
        }
        if self.max_attempts == 0 {
            return Err(ConfigError::new(file, "max_attempts = 0: must be at least 1"));
        }
        if self.break_after == Some(0) {
            return Err(ConfigError::new(file, "break_after = 0: must be at least 1 (leave it out to never break)"));
        }
        // Durations that cannot mean anything at zero (a zero wait or grace can: do not wait).
        let zeros = [
            ("max_runtime", Some(self.max_runtime), "every batch would time out as it starts"),
            ("overdue_after", self.overdue_after, "every ready batch would be overdue at once"),
            ("silent_after", self.silent_after, "the component would be silent between any two passes"),
        ];
        for (key, value, why) in zeros {
            if value == Some(Duration::ZERO) {
                return Err(ConfigError::new(file, format!("{key} = \"0s\": must be more than 0 ({why})")));
            }
        }
        if self.max_output > MAX_OUTPUT_BYTES {
            return Err(ConfigError::new(
                file,
                format!(
                    "max_output = {} bytes: must be at most {MAX_OUTPUT_BYTES} (512KiB: the output travels in the \
                     result event, which the store takes up to 1 MiB)",
                    self.max_output
                ),
            ));
        }
        if self.watch_heartbeat < MIN_WATCH_HEARTBEAT {
            return Err(ConfigError::new(
                file,
                format!(
                    "watch_heartbeat = {:?}: must be at least {:?} (a pass that often would be a busy loop)",
                    self.watch_heartbeat, MIN_WATCH_HEARTBEAT
                ),
            ));
        }
        Ok(())
    }
}

/// A size as config files write it: a number of bytes (`65536`, `"65536"`), or a number
/// with a unit (`"64KiB"`, `"1 MiB"`, `"100B"`; KiB and MiB are 1024 and 1024²).
fn size_text<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<usize, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Size {
        Bytes(u64),
        Text(String),
    }
    match Size::deserialize(deserializer)? {
        Size::Bytes(bytes) => usize::try_from(bytes).map_err(serde::de::Error::custom),
        Size::Text(text) => parse_size(&text).map_err(serde::de::Error::custom),
    }
}

fn parse_size(text: &str) -> Result<usize, String> {
    let trimmed = text.trim();
    let digits = trimmed.find(|c: char| !c.is_ascii_digit()).unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(digits);
    let factor = match unit.trim() {
        "" | "B" => Some(1),
        "KiB" => Some(1024),
        "MiB" => Some(1024 * 1024),
        _ => None,
    };
    let bytes = factor.zip(number.parse::<usize>().ok()).and_then(|(factor, n)| n.checked_mul(factor));
    bytes
        .ok_or_else(|| format!("invalid size {text:?}: write a number of bytes (65536) or one with KiB or MiB (64KiB)"))
}

/// Everything a component run needs from its configuration files.
#[derive(Debug, Clone)]
pub struct LoadedConfig {
    /// The component's own file (defaults when there is none).
    pub component: ComponentConfig,
    /// The backends the shared file names, before env and command-line overrides.
    pub backends: Backends,
    /// The component file (or where it would be), for messages.
    pub file: PathBuf,
    /// The shared `autocomp.toml` (or where it would be), for messages.
    pub shared_file: PathBuf,
}

/// Reads the component file (`explicit`, or `<config_dir>/<component>.toml`) and the
/// backends from `<config_dir>/autocomp.toml`, wherever the component file is. A missing
/// component file means defaults (unless named explicitly); a file that is present must
/// parse completely.
pub fn load(component: &str, explicit: Option<&Path>, config_dir: &Path) -> Result<LoadedConfig, ConfigError> {
    let file = explicit.map(Path::to_path_buf).unwrap_or_else(|| config_dir.join(format!("{component}.toml")));
    let component_config = match read_optional(&file, explicit.is_some())? {
        Some(text) => parse_component_file(&text, &file)?,
        None => ComponentConfig::default(),
    };
    let shared_file = config_dir.join(SHARED_FILE);
    let backends = match read_optional(&shared_file, false)? {
        Some(text) => parse_shared_file(&text, &shared_file)?,
        None => Backends::default(),
    };
    Ok(LoadedConfig { component: component_config, backends, file, shared_file })
}

/// A component file's text, parsed and checked as `load` does (the framework's keys and their
/// bounds; a component's own `[settings]` are its own to check): `autocomp doctor` reads
/// every component file this way.
pub fn parse_component_file(text: &str, file: &Path) -> Result<ComponentConfig, ConfigError> {
    let config: ComponentConfig = toml::from_str(text).map_err(|e| toml_error(file, text, &e))?;
    config.check(file)?;
    Ok(config)
}

/// The shared file's text, parsed: the backends it names.
pub fn parse_shared_file(text: &str, file: &Path) -> Result<Backends, ConfigError> {
    toml::from_str(text).map_err(|e| toml_error(file, text, &e))
}

/// A TOML error in `file` (whose text is `text`) as a message: the file, the line and column,
/// and what is wrong; the line itself only when it holds no secret (a URL with a password, a
/// secret option or key), since cron mails what a pass prints. toml's own rendering quotes
/// the line whatever it holds.
pub fn toml_error(file: &Path, text: &str, error: &toml::de::Error) -> ConfigError {
    let what = autocomp_toolkit::redact::redact_urls_in(error.message().trim());
    let Some(span) = error.span() else { return ConfigError::new(file, format!("not valid TOML: {what}")) };
    let at = span.start.min(text.len());
    let line_start = text[..at].rfind('\n').map_or(0, |i| i + 1);
    let line_number = text[..at].matches('\n').count() + 1;
    let column = text[line_start..at].chars().count() + 1;
    let line = text[line_start..].lines().next().unwrap_or("");
    // A multi-line string can split a URL over lines none of which looks like a secret on
    // its own: in a file that has one, no line is quoted.
    let multi_line_string = text.contains("\"\"\"") || text.contains("\'\'\'");
    let quoted = if holds_secret(line) || multi_line_string {
        " (the line is not shown: it may hold a secret)".to_owned()
    } else {
        // toml's gutter, which `autocomp doctor` leaves out of its one-line checks.
        format!("\n  | {}\n  | {}^", autocomp_toolkit::for_terminal(line), " ".repeat(column - 1))
    };
    // Valid TOML whose key the file's type does not know is not a syntax error.
    let (kind, hint) = match what.strip_prefix("unknown field `").and_then(|rest| rest.split_once('`')) {
        Some((unknown, rest)) => ("an unknown key", nearest_known(unknown, rest)),
        None => ("not valid TOML", String::new()),
    };
    ConfigError::new(file, format!("{kind} at line {line_number}, column {column}: {what}{hint}{quoted}"))
}

/// `(did you mean `max_threads`?)` when one of the keys serde lists as expected (`expected
/// one of `a`, `b``) is within two edits of `unknown`.
fn nearest_known(unknown: &str, expected: &str) -> String {
    let known = expected.split('`').skip(1).step_by(2);
    let nearest = known.map(|key| (edits(unknown, key), key)).filter(|(d, _)| *d <= 2).min();
    nearest.map(|(_, key)| format!(" (did you mean `{key}`?)")).unwrap_or_default()
}

/// Levenshtein distance, by characters; long keys are not compared (bounded work).
fn edits(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    if a.len() > 64 || b.len() > 64 {
        return usize::MAX;
    }
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.iter().enumerate() {
        let mut previous = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let substitution = previous + usize::from(ca != cb);
            previous = row[j + 1];
            row[j + 1] = substitution.min(row[j] + 1).min(row[j + 1] + 1);
        }
    }
    row[b.len()]
}

/// Whether a configuration line holds a secret: a URL with a password in its userinfo, or a
/// key (`password = `, `?token=`) the redaction counts as secret.
fn holds_secret(line: &str) -> bool {
    let userinfo_password = line.match_indices("://").any(|(at, _)| {
        let rest = &line[at + 3..];
        autocomp_toolkit::redact::userinfo_end(rest).is_some_and(|end| rest[..end].contains(':'))
    });
    let secret_key = line.match_indices('=').any(|(at, _)| {
        let before = line[..at].trim_end().trim_end_matches(['"', '\'']);
        let key_start = before
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '%')))
            .map_or(0, |i| i + 1);
        autocomp_toolkit::redact::is_secret_key(&before[key_start..])
    });
    userinfo_password || secret_key || autocomp_toolkit::redact::redact_urls_in(line) != line
}

/// A config file's text, or `None` when it does not exist. One others can change is refused
/// (see `autocomp_toolkit::file_modes::untrusted_config`): it names where the token goes.
/// `autocomp`, the components and `autocomp doctor` read every config file this way.
pub fn read_config_file(file: &Path) -> Result<Option<String>, ConfigError> {
    if let Some(reason) = autocomp_toolkit::file_modes::untrusted_config(file) {
        return Err(ConfigError::new(file, reason));
    }
    match std::fs::read_to_string(file) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(ConfigError::new(file, format!("cannot read: {e}"))),
    }
}

fn read_optional(file: &Path, required: bool) -> Result<Option<String>, ConfigError> {
    match read_config_file(file)? {
        None if required => Err(ConfigError::new(file, "cannot read: no such file")),
        read => Ok(read),
    }
}

/// Parses a component's `[settings]` into its settings type, naming the file on error.
/// An absent or empty `[settings]` also fits `()`, a component without settings.
pub fn settings<T: serde::de::DeserializeOwned>(table: &toml::Table, file: &Path) -> Result<T, ConfigError> {
    let parsed: Result<T, toml::de::Error> = toml::Value::Table(table.clone()).try_into();
    match parsed {
        Ok(settings) => Ok(settings),
        Err(error) => {
            use serde::de::IntoDeserializer;
            let unit: Result<T, serde::de::value::Error> = T::deserialize(().into_deserializer());
            match unit {
                Ok(settings) if table.is_empty() => Ok(settings),
                _ => Err(ConfigError::new(file, format!("[settings]: {}", without_values(&error.to_string())))),
            }
        }
    }
}

/// A settings error without the value serde quotes when a setting has the wrong type or value
/// (`invalid type: string "https://u:pw@...", expected a boolean` becomes `invalid type:
/// string "…", expected a boolean`): a setting may be a secret, and the message goes to cron's
/// mail and, as a refused pass, the registry. Key names stay (serde quotes them with
/// backticks), and so does what a component's own check says (`pattern "/data" is absolute`),
/// any URL's password hidden.
fn without_values(message: &str) -> String {
    let message = autocomp_toolkit::redact::redact_urls_in(message);
    if !(message.starts_with("invalid type: ") || message.starts_with("invalid value: ")) {
        return message;
    }
    let mut out = String::with_capacity(message.len());
    let mut quoted = false;
    for c in message.chars() {
        match (c, quoted) {
            ('"', false) => {
                out.push_str("\"…\"");
                quoted = true;
            }
            ('"', true) => quoted = false,
            (_, true) => {}
            (c, false) => out.push(c),
        }
    }
    out
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
