//! `autocomp doctor`: checks one host end to end, one line per check with its verdict and,
//! for a failure, the fix. It reads and connects but changes nothing: the store is opened
//! without migrating, the lock tree's ACLs are read and not set, no event is written (an
//! embedded index may catch up with the store, as any pass's query lets it).
//!
//! The checks, in order: the config files parse; the store answers with these credentials
//! at this release's schema; the host's clock against the store's; the index answers and how
//! far it lags; the lock service answers, authenticated, with the ACLs the framework sets;
//! free space where the store, index and locks live; every secret and key file it is told
//! of is readable, not by others, and strong enough; every certificate is valid for longer
//! than `expires_within`; the components are registered and neither silent nor held.

mod backends;
mod files;

use backends::{index_check, locks_check, sqlite_file, store_checks};

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use autocomp_framework::config::{Backends, SHARED_FILE};
use autocomp_model::{HoldKind, Timestamp};
use autocomp_store::ObjectStore;
use serde::Serialize;

use crate::operator::{AlertDefaults, Format, held_too_long};
use crate::operator::{SilenceRule, last_seen};

pub use files::FileKind;

/// What a check found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Ok,
    Fail,
    /// Not run: what it needs failed (and says so in its own line) or is not configured.
    Skipped,
}

impl Verdict {
    fn label(self) -> &'static str {
        match self {
            Verdict::Ok => "ok",
            Verdict::Fail => "FAIL",
            Verdict::Skipped => "skip",
        }
    }
}

/// One line of the report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    /// What was checked: `store`, `clock`, `config autocomp.toml`, `certificate /path`, ...
    pub check: String,
    pub verdict: Verdict,
    /// What was found (never a secret: URLs as `display_url` shows them).
    pub detail: String,
    /// For a failure: what to do about it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

impl Check {
    fn ok(check: impl Into<String>, detail: impl Into<String>) -> Self {
        Check { check: check.into(), verdict: Verdict::Ok, detail: one_line(&detail.into()), fix: None }
    }

    fn fail(check: impl Into<String>, detail: impl Into<String>, fix: impl Into<String>) -> Self {
        let detail = one_line(&detail.into());
        Check { check: check.into(), verdict: Verdict::Fail, detail, fix: Some(fix.into()) }
    }

    fn skipped(check: impl Into<String>, detail: impl Into<String>) -> Self {
        Check { check: check.into(), verdict: Verdict::Skipped, detail: one_line(&detail.into()), fix: None }
    }
}

/// An error's text on one line: a parser's picture of the offending line (`  |`, `1 | ...`,
/// `  ^^^`) is left out, the other lines joined, so each check stays one line.
fn one_line(text: &str) -> String {
    let pictured = |line: &str| {
        let rest = line.trim_start_matches(|c: char| c.is_ascii_digit() || c == ' ');
        rest.starts_with('|') || rest.starts_with('^')
    };
    let parts: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.is_empty() && !pictured(l)).collect();
    parts.join(": ")
}

/// What `autocomp doctor` was asked to check, and against which thresholds.
#[derive(Debug, Clone)]
pub struct DoctorOptions {
    pub config_dir: PathBuf,
    /// The backends from the environment and the command line (they win over autocomp.toml).
    pub overrides: Backends,
    /// Less free space than this where the store, index or locks live fails.
    pub min_free: u64,
    /// More store changes than this not yet in the index fails.
    pub index_lag: u64,
    /// A clock further than this from the store's fails.
    pub max_clock_skew: Duration,
    /// A certificate that expires sooner than this fails.
    pub expires_within: Duration,
    /// How long the store, the index and the lock service each get to answer.
    pub timeout: Duration,
    /// Files besides those the configuration names (a service's `--token-file`,
    /// `--tls-cert`, `--tls-key`, the monitor's users file).
    pub extra_files: Vec<(FileKind, PathBuf)>,
}

impl DoctorOptions {
    pub fn new(config_dir: &Path, overrides: Backends) -> Self {
        DoctorOptions {
            config_dir: config_dir.to_path_buf(),
            overrides,
            min_free: 1 << 30,
            index_lag: AlertDefaults::default().index_lag,
            max_clock_skew: Duration::from_secs(1),
            expires_within: Duration::from_secs(30 * 24 * 3600),
            timeout: Duration::from_secs(15),
            extra_files: Vec::new(),
        }
    }
}

/// Every check's line, in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DoctorReport {
    pub checks: Vec<Check>,
}

impl DoctorReport {
    /// Whether no check failed (exit 0).
    pub fn passed(&self) -> bool {
        self.checks.iter().all(|check| check.verdict != Verdict::Fail)
    }

    pub fn render(&self, format: Format) -> String {
        match format {
            Format::Text => {
                let width = self.checks.iter().map(|c| c.check.chars().count()).max().unwrap_or(0);
                let mut out = String::new();
                for check in &self.checks {
                    let fix = check.fix.as_deref().map(|fix| format!(" -- fix: {fix}")).unwrap_or_default();
                    out.push_str(&format!(
                        "{:<4}  {:<width$}  {}{fix}\n",
                        check.verdict.label(),
                        check.check,
                        check.detail
                    ));
                }
                let failed = self.checks.iter().filter(|c| c.verdict == Verdict::Fail).count();
                out.push_str(&match failed {
                    0 => format!("all {} checks passed\n", self.checks.len()),
                    1 => "1 check failed\n".to_owned(),
                    n => format!("{n} checks failed\n"),
                });
                out
            }
            Format::Json => {
                let document = ReportJson { checks: &self.checks, passed: self.passed() };
                serde_json::to_string_pretty(&document).expect("a report always serializes") + "\n"
            }
        }
    }
}

/// `doctor --format json`: every check, and whether all passed.
#[derive(Serialize)]
struct ReportJson<'r> {
    checks: &'r [Check],
    passed: bool,
}

/// Runs every check. Never fails as a whole: what cannot be reached is a failed check.
pub async fn run(options: &DoctorOptions) -> DoctorReport {
    let mut report = DoctorReport::default();
    let mut backends = config_checks(options, &mut report.checks);
    // As root, opening the embedded store or index would leave files root owns (SQLite's
    // -shm, a catch-up's index files) that the pipeline's user then cannot write.
    let dirs = local_dirs(&backends);
    // The config dir too: as root over the pipeline user's files, its config is refused as
    // another user's, and the fix is to run as that user.
    let local: Vec<&Path> =
        dirs.iter().map(PathBuf::as_path).chain(std::iter::once(options.config_dir.as_path())).collect();
    // SAFETY: geteuid has no preconditions.
    let as_root = unsafe { libc::geteuid() } == 0;
    if as_root && let Some((uid, path)) = files::owned_by_another(&local) {
        report.checks.push(Check::fail(
            "user",
            format!("running as root, but {} belongs to uid {uid}", path.display()),
            "run it as the pipeline's user, `sudo -u autocomp autocomp doctor`: as root it would leave files \
             the pipeline cannot write, so the embedded store and index are not opened",
        ));
        for (key, url) in [("store", &mut backends.store), ("index", &mut backends.index)] {
            if url.as_deref().is_some_and(|u| u.starts_with("sqlite://") || u.starts_with("local:")) {
                *url = None;
                report.checks.push(Check::skipped(key, "not opened as root"));
            }
        }
    }
    let store = store_checks(options, &backends, &mut report.checks).await;
    index_check(options, &backends, store.as_ref(), &mut report.checks).await;
    locks_check(options, &backends, &mut report.checks).await;
    report.checks.extend(files::free_space(&dirs, options.min_free));
    for (kind, path) in named_files(options, &backends) {
        report.checks.push(files::check_file(kind, &path, options.expires_within));
    }
    component_checks(store.as_ref(), &mut report.checks).await;
    report
}

/// `autocomp.toml`, every component's file and `notify.toml` parse; the backends they name
/// (the environment's and the command line's winning). Each file is read on its own, so one
/// that does not parse fails its own line only.
fn config_checks(options: &DoctorOptions, checks: &mut Vec<Check>) -> Backends {
    let dir = &options.config_dir;
    let shared_file = dir.join(SHARED_FILE);
    let (from_file, shared_parses) = if dir.is_dir() {
        let read = shared_config(&shared_file, checks);
        component_files(dir, checks);
        read
    } else {
        let detail = format!("{} is not a directory", dir.display());
        if options.overrides.store.is_none() {
            let fix = "point --config-dir or $AUTOCOMP_CONFIG_DIR at the directory holding autocomp.toml";
            checks.push(Check::fail("config", detail, fix));
        } else {
            checks.push(Check::skipped("config", detail + "; the backends come from the environment or flags"));
        }
        (Backends::default(), true)
    };
    let backends = from_file.overridden_by(options.overrides.clone());
    for (key, value) in [("store", &backends.store), ("index", &backends.index), ("locks", &backends.locks)] {
        if value.is_some() {
            continue;
        }
        checks.push(if shared_parses {
            let env = format!("AUTOCOMP_{}", key.to_uppercase());
            let fix = format!("set `{key} = \"...\"` in {}, ${env}, or --{key}", shared_file.display());
            Check::fail(key, format!("no {key} backend is configured"), fix)
        } else {
            Check::skipped(key, format!("{SHARED_FILE} does not parse"))
        });
    }
    backends
}

/// What to do about a config file others can change (the pipeline refuses it).
const UNTRUSTED_CONFIG_FIX: &str = "let only root or the pipeline's user own and write it (chmod o-w, chown), in a \
                                    directory only they write; as root over the pipeline's files, run as its user";

/// The backends `autocomp.toml` names, and whether it parses (absent counts as parsing).
fn shared_config(shared_file: &Path, checks: &mut Vec<Check>) -> (Backends, bool) {
    let check = format!("config {SHARED_FILE}");
    if let Some(reason) = autocomp_toolkit::file_modes::untrusted_config(shared_file) {
        checks.push(Check::fail(check, format!("{}: {reason}", shared_file.display()), UNTRUSTED_CONFIG_FIX));
        return (Backends::default(), false);
    }
    match std::fs::read_to_string(shared_file) {
        Ok(text) => match autocomp_framework::config::parse_shared_file(&text, shared_file) {
            Ok(backends) => {
                checks.push(Check::ok(check, format!("{} parses", shared_file.display())));
                (backends, true)
            }
            Err(e) => {
                let detail = e.to_string();
                checks.push(Check::fail(check, detail, "keep only store, index and locks in it, each a URL string"));
                (Backends::default(), false)
            }
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let detail = format!("{} absent: the backends come from the environment or flags", shared_file.display());
            checks.push(Check::ok(check, detail));
            (Backends::default(), true)
        }
        Err(e) => {
            let detail = format!("cannot read {}: {e}", shared_file.display());
            checks.push(Check::fail(check, detail, "let the pipeline's user read it (chmod 640, group autocomp)"));
            (Backends::default(), false)
        }
    }
}

/// Every other `*.toml` of the config dir: `notify.toml`, and each component's file (the
/// framework's keys; a component checks its own `[settings]` when it starts).
fn component_files(dir: &Path, checks: &mut Vec<Check>) {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|entries| entries.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    files.sort();
    for file in files.iter().filter(|p| p.extension().is_some_and(|e| e == "toml")) {
        let name = file.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        if name == "autocomp" {
            continue;
        }
        let check = format!("config {name}.toml");
        if let Some(reason) = autocomp_toolkit::file_modes::untrusted_config(file) {
            checks.push(Check::fail(check, format!("{}: {reason}", file.display()), UNTRUSTED_CONFIG_FIX));
            continue;
        }
        let parsed = if name == "notify" {
            crate::notify::NotifyConfig::load(dir).map(|_| ())
        } else {
            autocomp_framework::config::read_config_file(file).and_then(|text| {
                autocomp_framework::config::parse_component_file(&text.unwrap_or_default(), file).map(|_| ())
            })
        };
        let fix = if name == "notify" {
            "see the README's `autocomp notify` for its keys"
        } else {
            "see the README's component settings for the keys"
        };
        checks.push(match parsed {
            Ok(()) => Check::ok(check, format!("{} parses", file.display())),
            Err(e) => Check::fail(check, e.to_string(), fix),
        });
    }
}

/// The directories on this host that hold the store, index or locks.
fn local_dirs(backends: &Backends) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(file) = backends.store.as_deref().and_then(sqlite_file) {
        dirs.extend(file.parent().map(Path::to_path_buf));
    }
    for url in [&backends.index, &backends.locks].into_iter().flatten() {
        if let Some(path) = url.strip_prefix("local:").filter(|p| !p.is_empty()) {
            dirs.push(PathBuf::from(path));
        }
    }
    dirs.dedup();
    dirs
}

/// Every secret, key and certificate file the backends, the environment, `notify.toml` and
/// the command line name, each once.
fn named_files(options: &DoctorOptions, backends: &Backends) -> Vec<(FileKind, PathBuf)> {
    let mut named = Vec::new();
    if let Some(url) = backends.store.as_deref()
        && (url.starts_with("postgres://") || url.starts_with("postgresql://"))
        && let Ok(pg) = autocomp_store::PgOptions::parse(url)
    {
        named.extend(pg.password_file.map(|path| (FileKind::Password, path)));
        named.extend(pg.root_certificates.map(|path| (FileKind::Certificate, PathBuf::from(path))));
    }
    if let Some(url) = backends.locks.as_deref()
        && let Ok(zk) = autocomp_framework::locks::ZkUrl::parse(url)
    {
        named.extend(zk.auth_file.map(|path| (FileKind::ZooKeeperIdentities, path)));
        if let Some(tls) = zk.tls {
            named.push((FileKind::Certificate, tls.ca_file));
            if let Some((cert, key)) = tls.client {
                named.push((FileKind::Certificate, cert));
                named.push((FileKind::PrivateKey, key));
            }
        }
    }
    let over_http = [&backends.store, &backends.index]
        .into_iter()
        .flatten()
        .any(|url| url.starts_with("http://") || url.starts_with("https://"));
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    if over_http {
        named.extend(var("AUTOCOMP_TOKEN_FILE").map(|path| (FileKind::Tokens, path)));
        named.extend(var("AUTOCOMP_CA_FILE").map(|path| (FileKind::Certificate, path)));
        named.extend(var("AUTOCOMP_CLIENT_CERT").map(|path| (FileKind::Certificate, path)));
        named.extend(var("AUTOCOMP_CLIENT_KEY").map(|path| (FileKind::PrivateKey, path)));
    }
    if let Ok(Some(notify)) = crate::notify::NotifyConfig::load_if_present(&options.config_dir) {
        let password = notify.mail.and_then(|mail| mail.password_file);
        named.extend(password.map(|path| (FileKind::Password, notify.dir.join(path))));
        named.extend(notify.webhook.map(|hook| (FileKind::Password, notify.dir.join(hook.secret_file))));
    }
    named.extend(options.extra_files.iter().cloned());
    let mut seen = std::collections::HashSet::new();
    named.retain(|(kind, path)| seen.insert((*kind, path.clone())));
    named
}

/// Every component in the registry: it runs (not silent by its own rule), and it is not
/// held by an open circuit or a pause older than the alerts' threshold.
async fn component_checks(store: Option<&Arc<dyn ObjectStore>>, checks: &mut Vec<Check>) {
    let Some(store) = store else {
        checks.push(Check::skipped("components", "needs the store"));
        return;
    };
    let defaults = AlertDefaults::default();
    let (components, steering) = match tokio::try_join!(store.components(), store.steering()) {
        Ok(read) => read,
        Err(e) => {
            checks.push(Check::fail("components", e.to_string(), "see the store check"));
            return;
        }
    };
    let now = Timestamp::now();
    if let Some(hold) = steering.holds().find_map(|(component, hold)| component.is_none().then_some(hold)) {
        let detail = format!("the whole pipeline is {}", hold_text(hold, now));
        checks.push(if held_too_long(hold, now, defaults.paused_after) {
            Check::fail("pipeline", detail, "`autocomp resume --all --reason ...` when the reason is gone")
        } else {
            Check::ok("pipeline", detail)
        });
    }
    let live: Vec<_> = components.iter().filter(|c| !c.is_retired()).collect();
    if live.is_empty() {
        checks.push(Check::fail(
            "components",
            "no component has run against this store",
            "start the components (their timers, cron lines or --watch units) with this configuration; if they \
             run, they use another store URL",
        ));
        return;
    }
    checks.extend(live.into_iter().map(|component| component_check(component, &steering, now, &defaults)));
}

/// One component: silent by its own rule, held by an open circuit, or paused too long; else ok.
fn component_check(
    component: &autocomp_model::RegisteredComponent,
    steering: &autocomp_model::Steering,
    now: Timestamp,
    defaults: &AlertDefaults,
) -> Check {
    let name = component.name();
    let check = format!("component {name}");
    let hosts: Vec<&str> = component.hosts.iter().map(|h| h.host.as_str()).collect();
    let seen = last_seen(component);
    let mut detail = format!("last pass {} ago on {}", ago(seen, now), hosts.join(", "));
    let hold = steering.holds().find_map(|(held, hold)| (held == Some(name)).then_some(hold));
    if let Some(hold) = hold {
        detail = format!("{detail}; {}", hold_text(hold, now));
    }
    if let Some(mixed) = component.mixed_versions() {
        detail = format!("{detail}; running mixed versions: {mixed}");
    }
    // A pass its configuration or a broken contract refused: the component does no work.
    let refused = component.hosts.iter().find_map(|h| Some((&h.host, h.refused()?)));
    let rule = SilenceRule::of(component, defaults);
    let silent = !component.descriptor.manual && rule.is_silent(seen, now);
    let circuit_open = hold.is_some_and(|hold| hold.kind == HoldKind::Circuit);
    let held_long = hold.is_some_and(|hold| held_too_long(hold, now, defaults.paused_after));
    if silent {
        Check::fail(
            check,
            format!("{detail}: silent (after {})", rule.describe()),
            format!("see why its timer, cron line or watch unit stopped (`journalctl -u 'autocomp-*@{name}*'`)"),
        )
    } else if let Some((host, why)) = refused {
        let why = autocomp_toolkit::terminal::one_line(why).into_owned();
        Check::fail(
            check,
            format!("{detail}; its last pass on {host} {}{why}", autocomp_model::NOT_STARTED),
            "`autocomp pipeline` says why; mend it and its next pass starts".to_string(),
        )
    } else if circuit_open {
        Check::fail(check, detail, format!("`autocomp resume {name} --rerun-failed --reason ...` once fixed"))
    } else if held_long {
        Check::fail(check, detail, format!("`autocomp resume {name} --reason ...` when the reason is gone"))
    } else {
        Check::ok(check, detail)
    }
}

/// How long ago `at` was, in whole seconds.
fn ago(at: Timestamp, now: Timestamp) -> String {
    humantime::format_duration(Duration::from_secs(now.since(at).as_secs())).to_string()
}

/// A hold in words: `paused for 2h by operator:ann: tape maintenance`.
fn hold_text(hold: &autocomp_model::Hold, now: Timestamp) -> String {
    format!("{} for {} by {}: {}", hold.kind.as_str(), ago(hold.since, now), hold.by, hold.reason)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_parsers_picture_of_the_line_is_dropped_and_the_rest_joined() {
        let toml_error = "TOML parse error at line 1, column 1\n  |\n1 | max_thredas = 2\n  | ^^^^^^^^^^^\n\
                          unknown field `max_thredas`, expected `max_threads`\n";
        assert_eq!(
            one_line(toml_error),
            "TOML parse error at line 1, column 1: unknown field `max_thredas`, expected `max_threads`"
        );
        assert_eq!(one_line("one line"), "one line");
    }

    #[test]
    fn the_text_report_is_a_line_per_check_and_a_failure_carries_its_fix() {
        let report = DoctorReport {
            checks: vec![
                Check::ok("store", "sqlite:///s.db: sqlite at schema version 10 (current)"),
                Check::fail("clock", "this host is 5m ahead", "synchronise the clocks"),
                Check::skipped("index", "needs the store"),
            ],
        };
        assert!(!report.passed());
        let text = report.render(Format::Text);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4, "{text}");
        assert!(lines[1].starts_with("FAIL  clock") && lines[1].ends_with("-- fix: synchronise the clocks"));
        assert!(lines[2].starts_with("skip  index"));
        assert_eq!(lines[3], "1 check failed");
        let json: serde_json::Value = serde_json::from_str(&report.render(Format::Json)).unwrap();
        assert_eq!(json["passed"], false);
        assert_eq!(json["checks"][1]["fix"], "synchronise the clocks");
        assert!(json["checks"][0].get("fix").is_none());
    }
}
