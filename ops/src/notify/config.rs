//! `notify.toml`: which news goes out, to whom, and how. Read key by key (not through serde),
//! so an unknown key is an error naming it, a bad value names its key and value, and neither
//! ever quotes a line of the file (a misplaced password would be on it). URLs are shown
//! through `display_url`; secrets live in files named here and are read at send time.

use std::collections::BTreeSet;
use std::fmt;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use autocomp_framework::config::ConfigError;
use autocomp_store::pipeline_state::MAX_NOTICE_RETRY;
use autocomp_toolkit::display_url;
use lettre::message::Mailbox;
use toml::{Table, Value};

/// The file in the config directory that holds the `[notify]` table.
pub const NOTIFY_FILE: &str = "notify.toml";

/// A kind of news the notifier sends (`events = [...]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum EventKind {
    /// A permanent failure (not transient, not an operator's cancel), from the change feed.
    Failure,
    /// A component's circuit breaker opened, from the steering log.
    Circuit,
    /// A component (or the whole pipeline) paused or draining longer than `paused_too_long`.
    PausedTooLong,
    /// A batch ready longer than its component's `overdue_after`, or a run past its
    /// `max_runtime` (the rules of `autocomp alerts`).
    Overdue,
    /// A batch waiting for a person at a human step.
    WaitingForPerson,
    /// The success of a last step (a component no other component requires): a batch done.
    Success,
    /// One message a day with the counts.
    Digest,
}

impl EventKind {
    pub const ALL: [EventKind; 7] = [
        EventKind::Failure,
        EventKind::Circuit,
        EventKind::PausedTooLong,
        EventKind::Overdue,
        EventKind::WaitingForPerson,
        EventKind::Success,
        EventKind::Digest,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Failure => "failure",
            EventKind::Circuit => "circuit",
            EventKind::PausedTooLong => "paused_too_long",
            EventKind::Overdue => "overdue",
            EventKind::WaitingForPerson => "waiting_for_person",
            EventKind::Success => "success",
            EventKind::Digest => "digest",
        }
    }

    fn parse(text: &str) -> Option<Self> {
        EventKind::ALL.into_iter().find(|kind| kind.as_str() == text)
    }

    /// What `events` holds when the file does not say: everything but `success`.
    pub fn defaults() -> BTreeSet<EventKind> {
        EventKind::ALL.into_iter().filter(|kind| *kind != EventKind::Success).collect()
    }
}

impl fmt::Display for EventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The time of day the digest is made, in UTC (every host agrees on the date in its key).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct DigestAt {
    pub hour: u32,
    pub minute: u32,
}

impl fmt::Display for DigestAt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:02}:{:02}", self.hour, self.minute)
    }
}

/// The `[notify]` table.
#[derive(Debug, Clone)]
pub struct NotifyConfig {
    /// The file it was read from (errors name it).
    pub file: PathBuf,
    /// Relative `password_file` and `secret_file` paths are taken from here.
    pub dir: PathBuf,
    pub events: BTreeSet<EventKind>,
    /// A pause or drain older than this is news (`4h`).
    pub paused_too_long: Duration,
    /// Ready longer than this is overdue, for components whose own `overdue_after` is unset
    /// (`1h`, as `autocomp alerts`).
    pub overdue_after: Duration,
    /// When the day's digest is made (UTC, `07:00`).
    pub digest_at: DigestAt,
    /// The wait before the first retry of a failed delivery (`1m`); it doubles per attempt,
    /// up to `retry_max` (`1h`).
    pub retry_after: Duration,
    pub retry_max: Duration,
    pub mail: Option<MailConfig>,
    pub webhook: Option<WebhookConfig>,
}

/// `[notify.mail]`.
#[derive(Clone)]
pub struct MailConfig {
    pub server: SmtpServer,
    pub from: Mailbox,
    pub to: Vec<Mailbox>,
    /// AUTH as this user, with the password in `password_file`.
    pub username: Option<String>,
    pub password_file: Option<PathBuf>,
    /// Connecting and each SMTP command (`30s`).
    pub timeout: Duration,
}

impl fmt::Debug for MailConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MailConfig")
            .field("server", &self.server)
            .field("from", &self.from.to_string())
            .field("to", &self.to.iter().map(ToString::to_string).collect::<Vec<_>>())
            .field("username", &self.username)
            .field("password_file", &self.password_file)
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// How the mail server is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SmtpSecurity {
    /// `smtp://`: no TLS (loopback relays; credentials refused elsewhere).
    Plain,
    /// `smtp://...?tls=starttls`: STARTTLS, required.
    StartTls,
    /// `smtps://`: TLS from the first byte.
    Tls,
}

/// `server = "smtp://host:25"`, `"smtps://host:465"`, `"smtp://host:587?tls=starttls"`.
#[derive(Clone, PartialEq, Eq)]
pub struct SmtpServer {
    pub url: String,
    pub host: String,
    pub port: u16,
    pub security: SmtpSecurity,
}

impl fmt::Debug for SmtpServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&display_url(&self.url))
    }
}

impl SmtpServer {
    fn is_loopback(&self) -> bool {
        self.host == "localhost" || self.host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
    }
}

/// `[notify.webhook]`.
#[derive(Clone)]
pub struct WebhookConfig {
    pub url: String,
    /// The HMAC-SHA256 key (the file's content, surrounding whitespace removed).
    pub secret_file: PathBuf,
    /// The whole request, connecting included (`10s`).
    pub timeout: Duration,
}

impl fmt::Debug for WebhookConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WebhookConfig")
            .field("url", &display_url(&self.url))
            .field("secret_file", &self.secret_file)
            .field("timeout", &self.timeout)
            .finish()
    }
}

const TOP_KEYS: &[&str] =
    &["events", "paused_too_long", "overdue_after", "digest_at", "retry_after", "retry_max", "mail", "webhook"];
const MAIL_KEYS: &[&str] = &["server", "from", "to", "username", "password_file", "timeout"];
const WEBHOOK_KEYS: &[&str] = &["url", "secret_file", "timeout"];

impl NotifyConfig {
    /// Reads `<config_dir>/notify.toml`; a missing file is an error saying what to write.
    pub fn load(config_dir: &Path) -> Result<Self, ConfigError> {
        let file = config_dir.join(NOTIFY_FILE);
        Self::load_if_present(config_dir)?.ok_or_else(|| {
            ConfigError::new(
                &file,
                "not found: notifications are configured in this file, a [notify] table with [notify.mail] \
                 and/or [notify.webhook] (see the README's `autocomp notify`)",
            )
        })
    }

    /// `load`, or `None` when the config directory has no `notify.toml` (notifications off).
    pub fn load_if_present(config_dir: &Path) -> Result<Option<Self>, ConfigError> {
        let file = config_dir.join(NOTIFY_FILE);
        match autocomp_framework::config::read_config_file(&file)? {
            Some(text) => Self::parse(&text, &file, config_dir).map(Some),
            None => Ok(None),
        }
    }

    /// The configuration `text` holds, as read from `file` (relative secret files are taken
    /// from `dir`).
    pub fn parse(text: &str, file: &Path, dir: &Path) -> Result<Self, ConfigError> {
        let error = |message: String| ConfigError::new(file, message);
        // toml's own rendering quotes the line, which may hold a secret: this one does not.
        let root: Table =
            text.parse().map_err(|e: toml::de::Error| autocomp_framework::config::toml_error(file, text, &e))?;
        let mut config = NotifyConfig {
            file: file.to_path_buf(),
            dir: dir.to_path_buf(),
            events: EventKind::defaults(),
            paused_too_long: Duration::from_secs(4 * 3600),
            overdue_after: Duration::from_secs(3600),
            digest_at: DigestAt { hour: 7, minute: 0 },
            retry_after: Duration::from_secs(60),
            retry_max: Duration::from_secs(3600),
            mail: None,
            webhook: None,
        };
        for key in root.keys() {
            if key != "notify" {
                return Err(error(format!("unknown key `{key}`: this file holds one [notify] table")));
            }
        }
        let Some(notify) = root.get("notify") else {
            return Err(error("no [notify] table".into()));
        };
        let notify = table(notify, "notify").map_err(error)?;
        for (key, value) in notify {
            let name = format!("notify.{key}");
            match key.as_str() {
                "events" => config.events = events(value, &name).map_err(error)?,
                "paused_too_long" => config.paused_too_long = duration(value, &name).map_err(error)?,
                "overdue_after" => config.overdue_after = duration(value, &name).map_err(error)?,
                "retry_after" => config.retry_after = duration(value, &name).map_err(error)?,
                "retry_max" => config.retry_max = duration(value, &name).map_err(error)?,
                "digest_at" => config.digest_at = digest_at(value, &name).map_err(error)?,
                "mail" => config.mail = Some(mail(value, dir).map_err(error)?),
                "webhook" => config.webhook = Some(webhook(value, dir).map_err(error)?),
                _ => return Err(error(unknown(&name, TOP_KEYS))),
            }
        }
        if config.retry_max > MAX_NOTICE_RETRY {
            return Err(error(format!(
                "`notify.retry_max` = {:?}: must be at most {} (the outbox's longest retry)",
                humantime::format_duration(config.retry_max).to_string(),
                humantime::format_duration(MAX_NOTICE_RETRY)
            )));
        }
        if config.retry_max < config.retry_after {
            return Err(error(format!(
                "`notify.retry_max` = {:?}: must not be shorter than notify.retry_after ({})",
                humantime::format_duration(config.retry_max).to_string(),
                humantime::format_duration(config.retry_after)
            )));
        }
        if config.mail.is_none() && config.webhook.is_none() {
            return Err(error("no channel: add a [notify.mail] or a [notify.webhook] table (or both)".into()));
        }
        Ok(config)
    }

    /// The channels configured, as notice channels name them (`mail`, `webhook`).
    pub fn channels(&self) -> Vec<&'static str> {
        let mut channels = Vec::new();
        if self.mail.is_some() {
            channels.push("mail");
        }
        if self.webhook.is_some() {
            channels.push("webhook");
        }
        channels
    }

    pub fn wants(&self, kind: EventKind) -> bool {
        self.events.contains(&kind)
    }

    /// The wait before delivering a notice again after its `attempts`-th failure (1: the
    /// first): `retry_after` doubled per earlier failure, at most `retry_max`.
    pub fn retry_in(&self, attempts: u32) -> Duration {
        let doublings = attempts.saturating_sub(1).min(30);
        self.retry_after.saturating_mul(1 << doublings).min(self.retry_max)
    }
}

fn unknown(name: &str, known: &[&str]) -> String {
    let hint = match name.rsplit('.').next() {
        Some("password") => " (a password never goes in this file: write it in a file named by password_file)".into(),
        Some("secret") => " (a secret never goes in this file: write it in a file named by secret_file)".into(),
        _ => String::new(),
    };
    let table = name.rsplit_once('.').map_or("", |(table, _)| table);
    format!("unknown key `{name}`{hint}; the keys of [{table}] are {}", known.join(", "))
}

/// A value as an error shows it: TOML's own spelling, cut short.
fn shown(value: &Value) -> String {
    let text = value.to_string();
    if text.chars().count() > 120 { format!("{}…", text.chars().take(120).collect::<String>()) } else { text }
}

fn bad(name: &str, value: &Value, reason: impl fmt::Display) -> String {
    format!("`{name}` = {}: {reason}", shown(value))
}

fn table<'a>(value: &'a Value, name: &str) -> Result<&'a Table, String> {
    value.as_table().ok_or_else(|| bad(name, value, format!("expected a table ([{name}])")))
}

fn string<'a>(value: &'a Value, name: &str) -> Result<&'a str, String> {
    value.as_str().filter(|s| !s.trim().is_empty()).ok_or_else(|| bad(name, value, "expected a non-empty string"))
}

fn duration(value: &Value, name: &str) -> Result<Duration, String> {
    let parsed = match value {
        Value::Integer(seconds) if *seconds > 0 => Ok(Duration::from_secs(*seconds as u64)),
        Value::String(text) => humantime::parse_duration(text.trim()).map_err(|e| e.to_string()),
        _ => Err("expected a duration such as \"90s\", \"5m\" or \"4h\"".into()),
    };
    match parsed {
        Ok(d) if !d.is_zero() => Ok(d),
        Ok(_) => Err(bad(name, value, "must be more than zero")),
        Err(e) => Err(bad(name, value, format!("{e} (write e.g. \"90s\", \"5m\", \"4h\")"))),
    }
}

/// Longest `timeout` a channel may have: a pass leases what it sends for a few of them.
const MAX_SEND_TIMEOUT: Duration = Duration::from_secs(300);

fn send_timeout(value: &Value, name: &str) -> Result<Duration, String> {
    let timeout = duration(value, name)?;
    if timeout > MAX_SEND_TIMEOUT {
        return Err(bad(name, value, "must be at most 5m"));
    }
    Ok(timeout)
}

fn events(value: &Value, name: &str) -> Result<BTreeSet<EventKind>, String> {
    let known = || EventKind::ALL.map(EventKind::as_str).join(", ");
    let Some(items) = value.as_array() else {
        return Err(bad(name, value, format!("expected a list of kinds ({})", known())));
    };
    let mut kinds = BTreeSet::new();
    for item in items {
        let kind = item.as_str().and_then(EventKind::parse);
        kinds.insert(kind.ok_or_else(|| bad(name, item, format!("not a kind of news; expected one of {}", known())))?);
    }
    Ok(kinds)
}

fn digest_at(value: &Value, name: &str) -> Result<DigestAt, String> {
    let parsed = value.as_str().and_then(|text| {
        let (hour, minute) = text.trim().split_once(':')?;
        let (hour, minute) = (hour.parse::<u32>().ok()?, minute.parse::<u32>().ok()?);
        (hour < 24 && minute < 60 && text.trim().len() == 5).then_some(DigestAt { hour, minute })
    });
    parsed.ok_or_else(|| bad(name, value, "expected a time of day \"HH:MM\" (24-hour, UTC), e.g. \"07:00\""))
}

fn file_path(value: &Value, name: &str, dir: &Path) -> Result<PathBuf, String> {
    let path = PathBuf::from(string(value, name)?);
    Ok(if path.is_absolute() { path } else { dir.join(path) })
}

fn mailbox(value: &Value, name: &str) -> Result<Mailbox, String> {
    let text = string(value, name)?;
    text.parse::<Mailbox>()
        .map_err(|e| bad(name, value, format!("not a mail address ({e}); write e.g. \"ops@example.org\"")))
}

fn mail(value: &Value, dir: &Path) -> Result<MailConfig, String> {
    let mail = table(value, "notify.mail")?;
    let (mut server, mut from, mut to) = (None, None, Vec::new());
    let (mut username, mut password_file, mut timeout) = (None, None, Duration::from_secs(30));
    for (key, value) in mail {
        let name = format!("notify.mail.{key}");
        match key.as_str() {
            "server" => server = Some(smtp_server(value, &name)?),
            "from" => from = Some(mailbox(value, &name)?),
            "to" => {
                let Some(items) = value.as_array().filter(|items| !items.is_empty()) else {
                    return Err(bad(&name, value, "expected a non-empty list of mail addresses"));
                };
                to = items.iter().map(|item| mailbox(item, &name)).collect::<Result<_, _>>()?;
            }
            "username" => username = Some(string(value, &name)?.to_owned()),
            "password_file" => password_file = Some(file_path(value, &name, dir)?),
            "timeout" => timeout = send_timeout(value, &name)?,
            _ => return Err(unknown(&name, MAIL_KEYS)),
        }
    }
    let missing = |key: &str, example: &str| format!("`notify.mail.{key}` is missing: write e.g. {key} = {example}");
    let server = server.ok_or_else(|| missing("server", "\"smtp://localhost:25\""))?;
    let from = from.ok_or_else(|| missing("from", "\"autocomp@example.org\""))?;
    if to.is_empty() {
        return Err(missing("to", "[\"ops@example.org\"]"));
    }
    match (&username, &password_file) {
        (Some(_), None) => return Err(missing("password_file", "\"smtp-password\" (a file holding the password)")),
        (None, Some(_)) => return Err(missing("username", "\"autocomp\" (password_file is for AUTH as a user)")),
        _ => {}
    }
    if username.is_some() && server.security == SmtpSecurity::Plain && !server.is_loopback() {
        return Err(format!(
            "`notify.mail.server` = \"{}\": the password would cross the network in clear; use smtps:// or \
             ?tls=starttls",
            display_url(&server.url)
        ));
    }
    Ok(MailConfig { server, from, to, username, password_file, timeout })
}

fn smtp_server(value: &Value, name: &str) -> Result<SmtpServer, String> {
    let url = string(value, name)?.trim().to_owned();
    let fail = |reason: &str| {
        format!(
            "`{name}` = \"{}\": {reason}; write e.g. \"smtp://localhost:25\", \"smtps://mail.example.org:465\" or \
             \"smtp://mail.example.org:587?tls=starttls\"",
            display_url(&url)
        )
    };
    let (scheme, rest) = url.split_once("://").ok_or_else(|| fail("not a URL"))?;
    let implicit = match scheme {
        "smtp" => false,
        "smtps" => true,
        _ => return Err(fail("the scheme must be smtp or smtps")),
    };
    let (authority, query) = rest.split_once('?').unwrap_or((rest, ""));
    let authority = authority.strip_suffix('/').unwrap_or(authority);
    if authority.contains('@') {
        return Err(fail("credentials do not go in the URL (use username and password_file)"));
    }
    if authority.contains(['/', '#']) {
        return Err(fail("expected only a host and a port"));
    }
    let (host, port) = match authority.strip_prefix('[') {
        Some(v6) => {
            let (host, after) = v6.split_once(']').ok_or_else(|| fail("an unclosed [ in the host"))?;
            (host, after.strip_prefix(':'))
        }
        None => match authority.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        },
    };
    if host.is_empty() {
        return Err(fail("no host"));
    }
    let port = match port {
        Some(port) => port.parse::<u16>().ok().filter(|p| *p > 0).ok_or_else(|| fail("the port must be 1-65535"))?,
        None if implicit => 465,
        None => 25,
    };
    let mut security = if implicit { SmtpSecurity::Tls } else { SmtpSecurity::Plain };
    for option in query.split('&').filter(|o| !o.is_empty()) {
        match option.split_once('=') {
            Some(("tls", "starttls")) if !implicit => security = SmtpSecurity::StartTls,
            Some(("tls", "none")) if !implicit => security = SmtpSecurity::Plain,
            Some(("tls", _)) if implicit => return Err(fail("smtps:// is TLS already; tls= is for smtp://")),
            Some(("tls", _)) => return Err(fail("tls= must be starttls or none")),
            _ => return Err(fail("the only option is tls=starttls")),
        }
    }
    Ok(SmtpServer { url: url.clone(), host: host.to_owned(), port, security })
}

fn webhook(value: &Value, dir: &Path) -> Result<WebhookConfig, String> {
    let webhook = table(value, "notify.webhook")?;
    let (mut url, mut secret_file, mut timeout) = (None, None, Duration::from_secs(10));
    for (key, value) in webhook {
        let name = format!("notify.webhook.{key}");
        match key.as_str() {
            "url" => {
                let text = string(value, &name)?.trim();
                let scheme_ok = text.starts_with("https://") || text.starts_with("http://");
                let host = text.split_once("://").map(|(_, rest)| rest).unwrap_or_default();
                if !scheme_ok || host.is_empty() || host.starts_with('/') {
                    return Err(format!("`{name}` = \"{}\": expected an http:// or https:// URL", display_url(text)));
                }
                url = Some(text.to_owned());
            }
            "secret_file" => secret_file = Some(file_path(value, &name, dir)?),
            "timeout" => timeout = send_timeout(value, &name)?,
            _ => return Err(unknown(&name, WEBHOOK_KEYS)),
        }
    }
    let url = url.ok_or("`notify.webhook.url` is missing: write e.g. url = \"https://hooks.example.org/autocomp\"")?;
    let secret_file = secret_file.ok_or(
        "`notify.webhook.secret_file` is missing: the file holding the HMAC-SHA256 key every request is signed \
         with (e.g. `head -c 32 /dev/urandom | base64 > webhook-secret`)",
    )?;
    Ok(WebhookConfig { url, secret_file, timeout })
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
