//! `autocomp-monitor`: serves the web monitor, and `hash-password` makes a users file's
//! hash. Argument parsing, logging, startup checks and the users file's reloading only; the
//! pages are `autocomp_monitor::web`.

use std::io::{BufRead, IsTerminal};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use autocomp_framework::config::{Backends, DEFAULT_CONFIG_DIR};
use autocomp_framework::exit::USAGE;
use autocomp_http::launch::{Launch, exit_code, fail};
use autocomp_monitor::data::{Monitor, Settings};
use autocomp_monitor::web::accounts::{Accounts, Role, account_name, hash_password};
use autocomp_monitor::web::limits::SignInLimit;
use autocomp_monitor::web::sessions::SessionLimits;
use autocomp_monitor::web::{self, WebOptions};
use autocomp_ops::operator::Operator;
use autocomp_toolkit::logging::LogFormat;
use clap::{Parser, Subcommand};

const EXIT_CODES: &str = "Exit codes: 0 stopped by SIGTERM/SIGINT (requests in flight finish), 2 usage or \
                          configuration error (bad flags or autocomp.toml, an unreadable or invalid --users \
                          file, address in use), 5 serving failed. A store or index that does not answer yet is waited \
                          for (a log line per try; /health says so meanwhile), not an exit.";

/// The autocomp web monitor: the pipeline at a glance (component x state counts), the
/// batch x component matrix with filters in the URL, each batch's log and explanations, CSV
/// and NDJSON export, and the operator's actions (rerun, restart, cancel, skip, prioritize)
/// previewed before they are written, each recorded as the signed-in account. Without
/// --users it is read only.
#[derive(Parser)]
#[command(name = "autocomp-monitor", version, after_help = EXIT_CODES)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// Address to listen on. Loopback by default: other hosts need an explicit address, and
    /// then TLS (--tls-cert, or a TLS reverse proxy in front) and --users (reads need sign-in).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:7072")]
    listen: SocketAddr,
    /// Directory holding autocomp.toml (the backends; optional when they come from the
    /// environment or flags) [default: /etc/autocomp]
    #[arg(long, value_name = "DIR", env = "AUTOCOMP_CONFIG_DIR")]
    config_dir: Option<PathBuf>,
    /// Store URL: sqlite:///var/lib/autocomp/store.db, postgres://user@db1,db2/autocomp or
    /// http://host:7070 (overrides autocomp.toml).
    #[arg(long, env = "AUTOCOMP_STORE", hide_env_values = true, value_name = "URL")]
    store: Option<String>,
    /// Batch index URL, e.g. local:/var/lib/autocomp/index or http://host:7071.
    #[arg(long, env = "AUTOCOMP_INDEX", hide_env_values = true, value_name = "URL")]
    index: Option<String>,
    /// Lock service URL, e.g. local:/var/lib/autocomp/locks or zk://zk1:2181/autocomp (the
    /// batch page shows lock holders).
    #[arg(long, env = "AUTOCOMP_LOCKS", hide_env_values = true, value_name = "URL")]
    locks: Option<String>,
    /// The accounts: a file of `name role hash` lines (role viewer, operator or admin; the
    /// hash from `autocomp-monitor hash-password`, or `-` for an account that signs in only
    /// through --trusted-user-header). Re-read when it changes and on SIGHUP. Without it the
    /// monitor is read only.
    #[arg(long, value_name = "FILE", env = "AUTOCOMP_MONITOR_USERS")]
    users: Option<PathBuf>,
    /// Pages, exports and metrics need sign-in (the default when --listen is not a loopback
    /// address). /health never does.
    #[arg(long, conflicts_with = "public_reads")]
    reads_need_sign_in: bool,
    /// Anyone who reaches the monitor may read it (the default on a loopback address).
    #[arg(long)]
    public_reads: bool,
    /// A name browsers reach the monitor by (`monitor.example.org`, optionally with
    /// :PORT); every request's `Host` must be one of them (else 421: DNS rebinding). Repeat
    /// for more. Default: the --listen address, and localhost, 127.0.0.1 and [::1] on
    /// loopback.
    #[arg(long = "host-name", value_name = "NAME")]
    host_names: Vec<String>,
    /// A signed-in session unused this long ends.
    #[arg(long, value_name = "DURATION", default_value = "30m", value_parser = humantime::parse_duration)]
    session_idle: Duration,
    /// A signed-in session this old ends, however busy.
    #[arg(long, value_name = "DURATION", default_value = "12h", value_parser = humantime::parse_duration)]
    session_max_age: Duration,
    /// Failed sign-ins allowed per client address within --sign-in-window; beyond them
    /// sign-in from that address answers 429 with Retry-After. Each failure of one name
    /// from one address makes that address's next try at it wait longer (window/60,
    /// doubling, at most a quarter of the window); nothing is counted per account alone.
    #[arg(long, value_name = "N", default_value_t = 5)]
    sign_in_failures: u32,
    /// The window --sign-in-failures counts in.
    #[arg(long, value_name = "DURATION", default_value = "1m", value_parser = humantime::parse_duration)]
    sign_in_window: Duration,
    /// Mark cookies Secure although the monitor serves plain HTTP: a TLS proxy is in front
    /// (not needed with --tls-cert, or with a --trusted-proxy sending X-Forwarded-Proto).
    #[arg(long)]
    secure_cookies: bool,
    /// Removed: the shared write token gave nobody an identity. Use --users.
    #[arg(long, value_name = "FILE", env = "AUTOCOMP_MONITOR_TOKEN_FILE", hide = true)]
    token_file: Option<PathBuf>,
    /// A request header a reverse proxy sets to the authenticated account's name (e.g.
    /// X-Remote-User): believed only on requests from a --trusted-proxy address, ignored
    /// with a warning from anyone else. The account must be in --users, which gives its role.
    #[arg(long, value_name = "NAME", requires = "trusted_proxies")]
    trusted_user_header: Option<String>,
    /// The address of a reverse proxy whose --trusted-user-header, X-Forwarded-For and
    /// X-Forwarded-Proto are believed. Repeat for more.
    #[arg(long = "trusted-proxy", value_name = "IP")]
    trusted_proxies: Vec<IpAddr>,
    /// A batch ready for a component longer than this is overdue (working longer than the
    /// component's max_runtime is overdue too).
    #[arg(long, value_name = "DURATION", default_value = "1h", value_parser = humantime::parse_duration)]
    ready_overdue_after: Duration,
    /// Run the notifier (`autocomp notify`, as notify.toml in the config dir says) every
    /// DURATION inside the monitor, instead of from cron. Several monitors, or monitors and
    /// cron notifiers together, still send each item once.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    notify_every: Option<Duration>,
    /// Sample each component's backlog (batches ready for it, counted by the index) every
    /// DURATION and record it in the store's registry for the /charts page, which keeps a
    /// sample per minute for 2 hours and per hour for 31 days. 0 turns sampling off (another
    /// monitor may sample: several sampling the same minute keep the newest).
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = humantime::parse_duration)]
    sample_every: Duration,
    /// More logging (-v debug for autocomp: a line per request; -vv debug for everything;
    /// -vvv trace); RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count)]
    verbose: u8,
    /// Log lines on stderr as text (coloured only on a terminal) or as JSON objects.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(flatten)]
    serving: autocomp_http::serve::ListenArgs,
}

#[derive(Subcommand)]
enum Command {
    /// Reads a password from standard input (asked twice, unechoed, on a terminal; else the
    /// first line) and prints its argon2id hash for the users file, or with --user and
    /// --role the whole line. The password is never an argument: arguments are visible to
    /// every user of the host. At least 12 characters.
    HashPassword {
        /// The account's name (any script; checked as sign-in checks it).
        #[arg(long, requires = "role")]
        user: Option<String>,
        /// viewer, operator or admin.
        #[arg(long, requires = "user")]
        role: Option<String>,
    },
}

fn init_logging(verbose: u8, format: LogFormat) {
    // -v is about the monitor and the pipeline's crates, not tantivy's file-by-file chatter.
    let level = match verbose {
        0 => "info",
        1 => "info,autocomp_monitor=debug,autocomp_framework=debug,autocomp_store=debug,autocomp_sboi=debug",
        2 => "debug",
        _ => "trace",
    };
    autocomp_toolkit::logging::init(level, format);
}

#[tokio::main]
async fn main() -> ExitCode {
    autocomp_http::launch::return_large_allocations();
    let cli = Cli::parse();
    if let Some(Command::HashPassword { user, role }) = &cli.command {
        return hash_password_command(user.as_deref(), role.as_deref());
    }
    init_logging(cli.verbose, cli.log_format);
    let options = match web_options(&cli) {
        Ok(options) => options,
        Err(code) => return code,
    };
    let overrides = Backends { store: cli.store.clone(), index: cli.index.clone(), locks: cli.locks.clone() };
    let config_dir = cli.config_dir.clone().unwrap_or_else(|| PathBuf::from(DEFAULT_CONFIG_DIR));
    let operator = match Operator::new(&config_dir, overrides, None) {
        Ok(operator) => operator,
        Err(error) => return fail(error.code(), error),
    };
    // Up at once, whatever started first: until the store and the index answer, /health
    // says what we wait for and pages answer 503.
    let mut launch = match Launch::bind(cli.listen, "the store and the index", &cli.serving).await {
        Ok(launch) => launch,
        Err(code) => return code,
    };
    let open = || async {
        let store = operator.store().await?;
        operator.index(&store)?;
        store.head().await.map_err(autocomp_ops::operator::OperatorError::from)
    };
    let head = match launch.connect(open, |error| error.code() == USAGE).await {
        Ok(Ok(head)) => head,
        Ok(Err(error)) => return fail(USAGE, error),
        Err(stopped) => return stopped,
    };
    if let Err(code) = spawn_background(&cli, &operator) {
        return code;
    }
    let settings = Settings { ready_overdue_after: cli.ready_overdue_after, ..Settings::default() };
    let monitor = Monitor::new(operator, settings);
    let (mode, reads) =
        (mode(&options), if options.reads_need_sign_in { "reads need sign-in" } else { "reads are open" });
    if let Some(accounts) = &options.accounts {
        accounts.watch();
    }
    let bound = &launch.bound;
    let scheme = if cli.serving.tls_cert.is_some() { "https" } else { "http" };
    tracing::info!(listen = %bound, store_head = %head, "monitor up: {scheme}://{bound}/; {mode}; {reads}");
    launch.ready(web::router(monitor, options));
    exit_code(launch.served().await)
}

/// The web options the flags ask for, or the usage error (exit 2) that refuses them, checked
/// before anything is opened.
fn web_options(cli: &Cli) -> Result<WebOptions, ExitCode> {
    if cli.token_file.is_some() {
        return Err(fail(
            USAGE,
            "--token-file (or $AUTOCOMP_MONITOR_TOKEN_FILE) was removed: the shared token gave nobody an identity. \
             Give each person an account in a --users file (`name role hash` lines, hashes from \
             `autocomp-monitor hash-password`)",
        ));
    }
    let accounts = match &cli.users {
        Some(path) => Some(Arc::new(Accounts::load(path).map_err(|message| fail(USAGE, message))?)),
        None => None,
    };
    let trusted_user_header = cli
        .trusted_user_header
        .as_deref()
        .map(web::auth::header_name)
        .transpose()
        .map_err(|message| fail(USAGE, message))?;
    if trusted_user_header.is_some() && accounts.is_none() {
        return Err(fail(
            USAGE,
            "--trusted-user-header needs --users FILE: the proxy names the account, the file its role",
        ));
    }
    let loopback = cli.listen.ip().is_loopback();
    let reads_need_sign_in = !cli.public_reads && (cli.reads_need_sign_in || !loopback);
    if reads_need_sign_in && accounts.is_none() {
        return Err(fail(
            USAGE,
            format!(
                "reads need sign-in on {} (not a loopback address, or --reads-need-sign-in), and there are no \
                 accounts: give --users FILE, or --public-reads to let anyone who reaches it read",
                cli.listen
            ),
        ));
    }
    let host_names = host_names(&cli.listen, &cli.host_names).map_err(|message| fail(USAGE, message))?;
    if cli.session_idle.is_zero() || cli.session_max_age.is_zero() || cli.sign_in_window.is_zero() {
        return Err(fail(USAGE, "--session-idle, --session-max-age and --sign-in-window must be longer than 0s"));
    }
    if cli.sign_in_failures == 0 {
        return Err(fail(USAGE, "--sign-in-failures 0: at least 1 failed sign-in must be allowed"));
    }
    Ok(WebOptions {
        accounts,
        trusted_user_header,
        trusted_proxies: cli.trusted_proxies.clone(),
        reads_need_sign_in,
        host_names,
        sessions: SessionLimits { idle: cli.session_idle, absolute: cli.session_max_age, ..SessionLimits::default() },
        sign_in_limit: SignInLimit { failures: cli.sign_in_failures, window: cli.sign_in_window },
        secure_cookies: cli.secure_cookies || cli.serving.tls_cert.is_some(),
    })
}

/// The notifier (`--notify-every`) and the sampler (`--sample-every`), running beside the
/// pages; a notify config that cannot be read is a usage error.
fn spawn_background(cli: &Cli, operator: &Operator) -> Result<(), ExitCode> {
    if let Some(every) = cli.notify_every {
        let config =
            autocomp_ops::notify::NotifyConfig::load(operator.config_dir()).map_err(|error| fail(USAGE, error))?;
        tokio::spawn(notify_every(operator.clone(), config, every.max(Duration::from_secs(1))));
    }
    if !cli.sample_every.is_zero() {
        tokio::spawn(autocomp_monitor::sampler::run(operator.clone(), cli.sample_every));
    }
    Ok(())
}

/// Who may sign in, and how, for the line that says the monitor is up.
fn mode(options: &WebOptions) -> String {
    match (&options.accounts, &options.trusted_user_header) {
        (None, _) => "read only (no --users)".to_owned(),
        (Some(accounts), None) => {
            format!("accounts sign in with their passwords ({} in --users)", accounts.current().len())
        }
        (Some(accounts), Some(header)) => format!(
            "accounts sign in with their passwords ({} in --users) or by the {header} header of {}",
            accounts.current().len(),
            options.trusted_proxies.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
        ),
    }
}

/// `--notify-every`: a notifier pass every `every`, for as long as the monitor serves. A pass
/// that fails (the store or index down) is logged and tried again at the next tick.
async fn notify_every(operator: Operator, config: autocomp_ops::notify::NotifyConfig, every: Duration) {
    let holder = format!("monitor@{}#{}", autocomp_framework::hostname(), std::process::id());
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let pass = async {
            let store = operator.store().await?;
            let index = operator.index(&store)?;
            autocomp_ops::notify::notify_once(store, index, &config, &holder).await
        };
        match pass.await {
            Ok(report) if report.failed > 0 => {
                tracing::warn!(sent = report.sent, failed = report.failed, "notify: some deliveries failed")
            }
            Ok(report) => tracing::debug!(found = report.found, sent = report.sent, "notify pass"),
            Err(error) => tracing::warn!("notify: the pass failed: {error}"),
        }
    }
}

/// The `Host` names to answer to: the ones given, else the listen address (and the
/// loopback names when it is loopback).
fn host_names(listen: &SocketAddr, given: &[String]) -> Result<Vec<String>, String> {
    if let Some(bad) = given.iter().find(|n| n.is_empty() || n.contains(['/', ' ', '@'])) {
        return Err(format!("--host-name {bad:?}: expected a host name, optionally with :PORT"));
    }
    if !given.is_empty() {
        return Ok(given.to_vec());
    }
    let ip = listen.ip();
    if ip.is_unspecified() {
        return Err(format!(
            "listening on {listen} (every address) needs --host-name NAME, the name browsers reach the monitor by \
             (repeatable): requests naming any other host are refused"
        ));
    }
    let mut names = vec![match ip {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => format!("[{v6}]"),
    }];
    if ip.is_loopback() {
        for name in ["localhost", "127.0.0.1", "[::1]"] {
            if !names.iter().any(|n| n == name) {
                names.push(name.to_owned());
            }
        }
    }
    Ok(names)
}

/// `autocomp-monitor hash-password`: the password from stdin, its hash (or the users-file
/// line) on stdout.
fn hash_password_command(user: Option<&str>, role: Option<&str>) -> ExitCode {
    let prefix = match (user, role) {
        (Some(user), Some(role)) => {
            let name = match account_name("--user", user) {
                Ok(name) => name,
                Err(error) => return usage(error),
            };
            match Role::parse(role) {
                Ok(role) => format!("{name} {role} "),
                Err(error) => return usage(format!("--{error}")),
            }
        }
        _ => String::new(),
    };
    let password = if std::io::stdin().is_terminal() {
        let (Ok(first), Ok(again)) = (read_unechoed("Password: "), read_unechoed("Again: ")) else {
            return usage("cannot read the password from the terminal");
        };
        if first != again {
            return usage("the two passwords differ");
        }
        first
    } else {
        let mut line = String::new();
        if let Err(error) = std::io::stdin().lock().read_line(&mut line) {
            return usage(format!("cannot read the password from standard input: {error}"));
        }
        let line = line.strip_suffix('\n').unwrap_or(&line);
        line.strip_suffix('\r').unwrap_or(line).to_owned()
    };
    match hash_password(&password) {
        Ok(hash) => {
            println!("{prefix}{hash}");
            ExitCode::SUCCESS
        }
        Err(error) => usage(error),
    }
}

fn usage(message: impl std::fmt::Display) -> ExitCode {
    eprintln!("autocomp-monitor hash-password: {message}");
    ExitCode::from(USAGE)
}

/// One line from the terminal with echo off (restored even when reading fails).
fn read_unechoed(prompt: &str) -> std::io::Result<String> {
    eprint!("{prompt}");
    // SAFETY: termios is plain data that tcgetattr fills, on stdin, a terminal (checked by
    // the caller).
    let mut term: libc::termios = unsafe { std::mem::zeroed() };
    if unsafe { libc::tcgetattr(libc::STDIN_FILENO, &mut term) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let saved = term;
    term.c_lflag &= !libc::ECHO;
    // SAFETY: as above; `term` came from tcgetattr.
    unsafe { libc::tcsetattr(libc::STDIN_FILENO, libc::TCSANOW, &term) };
    let mut line = String::new();
    let read = std::io::stdin().lock().read_line(&mut line);
    // SAFETY: as above; `saved` came from tcgetattr.
    unsafe { libc::tcsetattr(libc::STDIN_FILENO, libc::TCSANOW, &saved) };
    eprintln!();
    read?;
    Ok(line.trim_end_matches(['\n', '\r']).to_owned())
}
