//! Real PostgreSQL servers for the tests.
//!
//! Each [`Postgres`] is its own cluster in a fresh temp dir under `/var/tmp` (a real disk, so
//! `fsync` means something): a copy of a template that `initdb` made once per test process,
//! then the postmaster on a free loopback port with the Unix socket in that same dir. Authentication is `trust` and the superuser is
//! `autocomp`, so `postgres://autocomp@127.0.0.1:PORT/DB` ([`Postgres::url`]) needs no
//! password. The binaries are the highest `/usr/lib/postgresql/*/bin` (Debian's layout);
//! Debian's own cluster service is never touched. With [`Options::network`] the server (and
//! the harness's `psql`) runs in a test's network namespace instead, on its host's address,
//! trusting that subnet. With [`Options::tls`] it serves TLS (`ssl=on`) with a certificate
//! for `localhost` signed by a test CA of its own ([`Postgres::tls`] names the files).
//!
//! PostgreSQL refuses to run as root. When the tests run as root, the server's dirs are given
//! to the `postgres` user (every parent must be traversable by it: the temp dir is made 0755)
//! and `postgres`, `initdb`, `pg_basebackup` and `pg_ctl` run as that user (`setuid` in the
//! child, as `runuser -u postgres` would); otherwise they run as the test's own user. `psql`
//! always runs as the test's user, over TCP.
//!
//! The postmaster is the test process's own child, not `pg_ctl`'s: `pg_ctl start` orphans it,
//! and where pid 1 is slow to reap orphans (this machine's is), a SIGKILLed postmaster stays
//! a zombie whose pid in the left-behind `postmaster.pid` makes the restart refuse ("lock
//! file already exists"). As our child it is reaped at once. It runs in its own session (as
//! `pg_ctl` would put it), so a Ctrl-C meant for the test does not reach it.
//!
//! Lifetimes: [`Postgres`]'s `Drop` stops the server (SIGQUIT, then SIGKILL) and removes the
//! dir. For what `Drop` cannot cover (the never-dropped [`shared`] server, a test process
//! killed by a signal), each server has a detached watchdog shell that waits for the test
//! process to go and then stops the server and removes its dir.
//!
//! Waits poll a condition with a deadline (60 s for anything a server does); on a failure
//! the panic message carries the tail of the server log.

use std::io::Write;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use crate::{wait_for, wait_until};

mod certificates;
mod process;

use certificates::{make_certificates, tls_files};
pub use process::percent_encode;
use process::{
    alive, clear_pg_environment, enter_network, free_port, kill_server, own_session, read_from, reap,
    remove_stale_segment, run, server_command, server_command_in, server_dir, server_status, tail, template,
};

/// Where Debian's `postgresql-NN` packages put the server binaries, one dir per major.
pub const DEBIAN_ROOT: &str = "/usr/lib/postgresql";
/// The cluster's bootstrap superuser; `trust` authentication, no password.
pub const USER: &str = "autocomp";
/// The Unix user that owns the clusters when the tests run as root.
const SERVER_USER: &str = "postgres";
/// Where the servers' temp dirs go: a real disk (not tmpfs), so fsync means something.
const PARENT_DIR: &str = "/var/tmp";
/// The limit on starting, stopping, promoting, replicating, and on any one command.
const LIMIT: Duration = Duration::from_secs(60);
/// How long `Drop` waits for the SIGQUIT-ed postmaster before it SIGKILLs it.
const QUIT_LIMIT: Duration = Duration::from_secs(10);
/// Start attempts on fresh ports when another process took the chosen one meanwhile.
const PORT_ATTEMPTS: usize = 5;

/// Fails the calling test unless a PostgreSQL server is installed (never a skip).
pub fn require_installed() {
    bin_dir();
}

/// The highest `/usr/lib/postgresql/<major>/bin` holding an `initdb`; fails the calling test
/// when there is none, saying how to install one.
pub fn bin_dir() -> PathBuf {
    static BIN: OnceLock<Option<PathBuf>> = OnceLock::new();
    let found = BIN.get_or_init(|| {
        let mut majors: Vec<(Vec<u32>, PathBuf)> = std::fs::read_dir(DEBIAN_ROOT)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|entry| {
                let name = entry.file_name().into_string().ok()?;
                let version = name.split('.').map(|part| part.parse().ok()).collect::<Option<Vec<u32>>>()?;
                let bin = entry.path().join("bin");
                bin.join("initdb").is_file().then_some((version, bin))
            })
            .collect();
        majors.sort();
        majors.pop().map(|(_, bin)| bin)
    });
    found.clone().unwrap_or_else(|| {
        panic!(
            "PostgreSQL is not installed (no {DEBIAN_ROOT}/*/bin/initdb): these tests need a real server. \
             Install it with `apt-get update && apt-get install -y postgresql` (.ci/run does this)."
        )
    })
}

/// How to start a server.
#[derive(Debug, Clone)]
pub struct Options {
    /// Extra server settings (`-c name=value`), after and so over the defaults:
    /// `listen_addresses=127.0.0.1`, `unix_socket_directories=<its temp dir>`,
    /// `max_connections=200`, `shared_buffers=64MB`, `log_min_messages=warning`. Settings
    /// given on the command line win over `ALTER SYSTEM`.
    pub settings: Vec<(String, String)>,
    /// `false` starts the server with `fsync=off`: fast, and no durability across crashes.
    pub fsync: bool,
    /// Run the server (and the harness's psql) in this network namespace (its name under
    /// `/var/run/netns`, as `ip netns` makes them), listening on this address instead of
    /// 127.0.0.1: a test's host of its own.
    pub network: Option<(String, Ipv4Addr)>,
    /// Serve TLS (`ssl=on`): a test CA and a server certificate it signed, whose only name is
    /// `localhost` (DNS), are made in the server's dir at start. So a client verifying the
    /// certificate connects to `localhost`, and connecting by address (`127.0.0.1`) is a
    /// host-name mismatch; [`TlsFiles::other_ca`] signed nothing of this server.
    pub tls: bool,
    /// Environment variables of the postmaster (and so of every server process), e.g.
    /// libfaketime's `LD_PRELOAD` ([`Options::with_clock_file`]).
    pub environment: Vec<(String, String)>,
}

impl Default for Options {
    fn default() -> Self {
        Self { settings: Vec::new(), fsync: true, network: None, tls: false, environment: Vec::new() }
    }
}

/// libfaketime as Debian's `faketime` package installs it.
pub const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

/// The PEM files of a server started with [`Options::tls`].
#[derive(Debug, Clone)]
pub struct TlsFiles {
    /// The CA that signed the server's certificate (a client's `sslrootcert`).
    pub ca: PathBuf,
    /// Another CA, which signed nothing the server presents (a wrong `sslrootcert`).
    pub other_ca: PathBuf,
    /// The server's certificate (names `localhost` only) and key.
    pub certificate: PathBuf,
    pub key: PathBuf,
}

impl Options {
    /// Serve TLS with a certificate of a test CA: see [`Options::tls`].
    pub fn with_tls(mut self) -> Self {
        self.tls = true;
        self
    }

    /// Runs the server under libfaketime with its wall clock offset by what `file` says (e.g.
    /// `+0`, then `+1h`: read again at every clock call, so a write steps the server's clock
    /// at once). Its monotonic clock stays real, as a stepped host clock leaves it. Fails the
    /// calling test when libfaketime is not installed, saying how to install it.
    pub fn with_clock_file(mut self, file: &Path) -> Self {
        assert!(
            Path::new(LIBFAKETIME).is_file(),
            "libfaketime is not installed (no {LIBFAKETIME}): `apt-get install -y faketime` (scripts/test does)"
        );
        for (name, value) in [
            ("LD_PRELOAD", LIBFAKETIME),
            ("FAKETIME_TIMESTAMP_FILE", &file.display().to_string()),
            ("FAKETIME_NO_CACHE", "1"),
            ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
        ] {
            self.environment.push((name.to_owned(), value.to_owned()));
        }
        self
    }

    /// Adds a server setting, e.g. `Options::default().setting("wal_level", "logical")`.
    pub fn setting(mut self, name: &str, value: &str) -> Self {
        self.settings.push((name.to_owned(), value.to_owned()));
        self
    }
}

/// One running PostgreSQL server (cluster) in its own temp dir; stopped and removed on drop.
pub struct Postgres {
    bin: PathBuf,
    port: u16,
    options: Options,
    data: PathBuf,
    log: PathBuf,
    /// The postmaster, our child, until it is stopped (and reaped).
    postmaster: Mutex<Option<Child>>,
    /// The postmaster's pid of the latest start, kept after it stops.
    last_pid: AtomicU32,
    watchdog: Mutex<Option<Child>>,
    // Dropped last: removed once `Drop` has stopped the server.
    dir: tempfile::TempDir,
}

/// Why a start failed.
enum StartError {
    PortTaken(String),
    Failed(String),
}

/// A database of a test's own (`Postgres::unique_named_database`).
pub struct NamedDatabase {
    pub name: String,
    /// `postgres://autocomp@127.0.0.1:PORT/NAME`.
    pub url: String,
}

impl Postgres {
    /// A fresh server with the default [`Options`] (fsync on), ready for connections.
    pub fn start() -> Self {
        Self::start_with(Options::default())
    }

    /// A fresh server: a copy of this process's `initdb`-ed template cluster, started on a
    /// free loopback port, waited for until it answers queries. Fails the calling test (with
    /// the server log's tail) if it does not.
    pub fn start_with(options: Options) -> Self {
        let bin = bin_dir();
        let (dir, watchdog) = server_dir();
        let template = template(&bin);
        let copy = run(
            server_command(Path::new("cp"), dir.path()).arg("-a").arg(template).arg(dir.path().join("data")),
            None,
            "cp -a (the template cluster)",
        );
        assert!(copy.status.success(), "copying the template cluster failed: {}\n{}", copy.status, copy.stderr);
        if options.network.is_some() {
            // The template trusts loopback only; on a test network, trust its hosts too.
            let hba = dir.path().join("data/pg_hba.conf");
            let mut file = std::fs::OpenOptions::new().append(true).open(&hba).expect("pg_hba.conf");
            file.write_all(b"host all all samenet trust\n").expect("pg_hba.conf written");
        }
        let mut options = options;
        if options.tls {
            let files = make_certificates(dir.path());
            options.settings.push(("ssl".into(), "on".into()));
            options.settings.push(("ssl_cert_file".into(), files.certificate.display().to_string()));
            options.settings.push(("ssl_key_file".into(), files.key.display().to_string()));
        }
        Self::launch(bin, dir, watchdog, options)
    }

    /// Starts a server on an initialised data dir `<dir>/data`, retrying on other ports when
    /// the chosen one was taken meanwhile.
    fn launch(bin: PathBuf, dir: tempfile::TempDir, watchdog: Child, options: Options) -> Self {
        let data = dir.path().join("data");
        let log = dir.path().join("server.log");
        let mut server = Self {
            bin,
            port: 0,
            options,
            data,
            log,
            postmaster: Mutex::new(None),
            last_pid: AtomicU32::new(0),
            watchdog: Mutex::new(Some(watchdog)),
            dir,
        };
        for attempt in 1..=PORT_ATTEMPTS {
            server.port = free_port();
            match server.try_start() {
                Ok(()) => break,
                Err(StartError::PortTaken(_)) if attempt < PORT_ATTEMPTS => continue,
                Err(StartError::PortTaken(why) | StartError::Failed(why)) => panic!("{why}"),
            }
        }
        server
    }

    /// Spawns the postmaster on `self.port` and waits until `postmaster.pid` says `ready`
    /// (or `standby`) and `select 1` answers over TCP.
    fn try_start(&self) -> Result<(), StartError> {
        let mut postmaster = self.postmaster.lock().unwrap_or_else(PoisonError::into_inner);
        assert!(postmaster.is_none(), "PostgreSQL on port {} already runs", self.port);
        let log_start = std::fs::metadata(&self.log).map(|m| m.len()).unwrap_or(0);
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&self.log).expect("the server log");
        let netns = self.options.network.as_ref().map(|(netns, _)| netns.as_str());
        let mut command = server_command_in(&self.bin.join("postgres"), self.dir.path(), netns);
        command
            .arg("-D")
            .arg(&self.data)
            .args(self.server_arguments())
            .envs(self.options.environment.iter().map(|(name, value)| (name, value)))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("the server log"))
            .stderr(log);
        own_session(&mut command);
        let mut child = command.spawn().unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"));
        let pid = child.id();
        self.last_pid.store(pid, Ordering::Relaxed);
        let mut exited = None;
        let mut last_error = String::new();
        let ready = wait_until(Instant::now() + LIMIT, || {
            exited = child.try_wait().expect("try_wait on the postmaster");
            if exited.is_some() {
                return true;
            }
            if !matches!(server_status(&self.data, pid).as_deref(), Some("ready" | "standby")) {
                return false;
            }
            match self.try_psql("postgres", "select 1") {
                Ok(out) => out.trim() == "1",
                Err(error) => {
                    last_error = error;
                    false
                }
            }
        });
        if let Some(status) = exited {
            let log = read_from(&self.log, log_start);
            let why = format!(
                "PostgreSQL did not start on port {} (postmaster {pid} exited: {status})\n--- server log ({}):\n{}",
                self.port,
                self.log.display(),
                tail(&log, 40)
            );
            return Err(if log.contains("Address already in use") {
                StartError::PortTaken(why)
            } else {
                StartError::Failed(why)
            });
        }
        if !ready {
            kill_server(pid);
            reap(&mut child, LIMIT);
            return Err(StartError::Failed(format!(
                "PostgreSQL (pid {pid}, port {}) not ready after {LIMIT:?}; killed it. Last psql error: {last_error}\n{}",
                self.port,
                self.log_tail()
            )));
        }
        *postmaster = Some(child);
        Ok(())
    }

    /// The postmaster's arguments after `-D`.
    fn server_arguments(&self) -> Vec<String> {
        let listen = self.address().to_string();
        let mut settings: Vec<(String, String)> = [
            ("listen_addresses", listen.as_str()),
            ("unix_socket_directories", &self.dir.path().display().to_string()),
            ("max_connections", "200"),
            ("shared_buffers", "64MB"),
            ("log_min_messages", "warning"),
        ]
        .iter()
        .map(|(name, value)| (name.to_string(), value.to_string()))
        .collect();
        if !self.options.fsync {
            settings.push(("fsync".into(), "off".into()));
        }
        settings.extend(self.options.settings.iter().cloned());
        let mut arguments = vec!["-p".to_owned(), self.port.to_string()];
        for (name, value) in settings {
            arguments.push("-c".into());
            arguments.push(format!("{name}={value}"));
        }
        arguments
    }

    /// The certificate files of a server started with [`Options::tls`]; fails the calling
    /// test for one started without.
    pub fn tls(&self) -> TlsFiles {
        assert!(self.options.tls, "PostgreSQL on port {} was started without Options::tls", self.port);
        tls_files(self.dir.path())
    }

    /// The loopback port it listens on (the same across [`restart`](Self::restart)).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The postmaster's pid (also the first line of `postmaster.pid`) of the latest start;
    /// after [`crash`](Self::crash) or [`stop_fast`](Self::stop_fast), the pid it had.
    pub fn pid(&self) -> u32 {
        self.last_pid.load(Ordering::Relaxed)
    }

    /// `$PGDATA`.
    pub fn data_dir(&self) -> &Path {
        &self.data
    }

    /// The server log (the postmaster's stderr; appended across restarts).
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// The last lines of the server log, for assertion messages.
    pub fn log_tail(&self) -> String {
        format!("--- server log ({}):\n{}", self.log.display(), tail(&read_from(&self.log, 0), 40))
    }

    /// `postgres://autocomp@127.0.0.1:PORT/DATABASE`.
    pub fn url(&self, database: &str) -> String {
        format!("postgres://{USER}@{}/{}", self.host_port(), percent_encode(database))
    }

    /// `127.0.0.1:PORT` (or the address of its network).
    pub fn host_port(&self) -> String {
        format!("{}:{}", self.address(), self.port)
    }

    fn address(&self) -> Ipv4Addr {
        self.options.network.as_ref().map_or(Ipv4Addr::LOCALHOST, |(_, addr)| *addr)
    }

    /// Creates database `name` (quoted as an identifier, so any text) and returns its URL.
    pub fn create_database(&self, name: &str) -> String {
        self.psql("postgres", &format!("CREATE DATABASE \"{}\"", name.replace('"', "\"\"")));
        self.url(name)
    }

    /// Creates a database with a name unique in this server (`t_<test pid>_<counter>`) and
    /// returns its URL.
    pub fn unique_database(&self) -> String {
        self.unique_named_database().url
    }

    /// `unique_database`, with the name it was given too: what `psql` and the catalog's
    /// reads are told.
    pub fn unique_named_database(&self) -> NamedDatabase {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let name = format!("t_{}_{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
        let url = self.create_database(&name);
        NamedDatabase { name, url }
    }

    /// Runs `sql` as a `psql` script in `database` (each statement its own transaction
    /// unless the script says otherwise; stops at the first error) and returns what it
    /// printed: one line per row, columns separated by `|`, no headers, no command tags.
    /// Fails the calling test with psql's stderr if psql fails or takes over a minute
    /// (e.g. a commit waiting for a synchronous standby that is gone).
    pub fn psql(&self, database: &str, sql: &str) -> String {
        self.try_psql(database, sql).unwrap_or_else(|error| panic!("{error}"))
    }

    fn try_psql(&self, database: &str, sql: &str) -> Result<String, String> {
        let mut command = Command::new(self.bin.join("psql"));
        if let Some((netns, _)) = &self.options.network {
            enter_network(&mut command, netns, None);
        }
        let host = self.address().to_string();
        command
            .args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-h", &host, "-U", USER])
            .arg("-p")
            .arg(self.port.to_string())
            .arg("--dbname")
            .arg(database)
            .args(["-f", "-"]);
        clear_pg_environment(&mut command).env("PGCONNECT_TIMEOUT", "10");
        let ran = run(&mut command, Some(sql), "psql");
        if ran.status.success() {
            Ok(ran.stdout)
        } else {
            Err(format!(
                "psql on port {} database {database:?} failed ({}): {}\n--- sql:\n{sql}",
                self.port, ran.status, ran.stderr
            ))
        }
    }

    /// Whether the postmaster runs (it was started and has neither been stopped nor exited).
    pub fn is_running(&self) -> bool {
        let mut postmaster = self.postmaster.lock().unwrap_or_else(PoisonError::into_inner);
        let exited = match postmaster.as_mut() {
            None => return false,
            Some(child) => child.try_wait().expect("try_wait on the postmaster").is_some(),
        };
        if exited {
            *postmaster = None;
        }
        !exited
    }

    /// The running postmaster, taken out of `self` (it is being stopped).
    fn take_postmaster(&self) -> Child {
        let child = self.postmaster.lock().unwrap_or_else(PoisonError::into_inner).take();
        child.unwrap_or_else(|| panic!("PostgreSQL on port {} is not running", self.port))
    }

    /// A clean shutdown, what `pg_ctl stop -m fast` does: SIGINT to the postmaster, which
    /// ends the sessions, writes a shutdown checkpoint and exits; waits until it has.
    pub fn stop_fast(&self) {
        let mut child = self.take_postmaster();
        let pid = child.id();
        // SAFETY: kill has no memory effects; the child is not reaped yet, so pid is ours.
        unsafe { libc::kill(pid as i32, libc::SIGINT) };
        match reap(&mut child, LIMIT) {
            Some(status) => {
                assert!(status.success(), "postmaster {pid} exited {status} on a fast shutdown\n{}", self.log_tail())
            }
            None => {
                kill_server(pid);
                reap(&mut child, LIMIT);
                panic!("postmaster {pid} not stopped {LIMIT:?} after SIGINT; killed it\n{}", self.log_tail());
            }
        }
    }

    /// A crash: SIGKILL to the postmaster and all its processes at once (no shutdown
    /// checkpoint, nothing flushed that was not already; `postmaster.pid` stays behind), then
    /// waits until they are all gone. [`restart`](Self::restart) then runs crash recovery.
    pub fn crash(&self) {
        let mut child = self.take_postmaster();
        let pid = child.id();
        let killed = kill_server(pid);
        assert!(reap(&mut child, LIMIT).is_some(), "the killed postmaster {pid} has not exited after {LIMIT:?}");
        wait_for(Instant::now() + LIMIT, &format!("the processes of the killed postmaster {pid} to go"), || {
            killed.iter().all(|&p| !alive(p))
        });
    }

    /// Starts it again on the same port and data dir (after [`crash`](Self::crash): crash
    /// recovery) and waits until it answers queries. A running server is stopped first
    /// ([`stop_fast`](Self::stop_fast)).
    pub fn restart(&self) {
        if self.is_running() {
            self.stop_fast();
        }
        if let Err(StartError::PortTaken(why) | StartError::Failed(why)) = self.try_start() {
            panic!("restart: {why}");
        }
    }

    /// A streaming-replication standby of this server, in its own temp dir on a new port,
    /// with this server's [`Options`]: `pg_basebackup -R` (with a replication slot on this
    /// server), then started and waited for until this server's `pg_stat_replication` shows
    /// it `streaming`.
    ///
    /// `synchronous`: then sets `synchronous_standby_names = '*'` on this server (`ALTER
    /// SYSTEM`, reloaded) and waits until the standby's `sync_state` is `sync`: from then on
    /// a commit here returns only once the standby has flushed it (and hangs while no
    /// standby is connected). With `'*'`, only one of several standbys is `sync` at a time.
    /// The standby itself never inherits `synchronous_standby_names`, so once promoted it
    /// accepts writes alone.
    pub fn standby(&self, synchronous: bool) -> Postgres {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let name = format!("standby_{}_{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
        let (dir, watchdog) = server_dir();
        let data = dir.path().join("data");
        let backup = run(
            server_command(&self.bin.join("pg_basebackup"), dir.path())
                .args(["-h", "127.0.0.1", "-U", USER, "-p", &self.port.to_string()])
                .arg("-D")
                .arg(&data)
                .args(["-R", "-X", "stream", "--checkpoint=fast", "-C", "-S", &name])
                .args(["-d", &format!("application_name={name}")]),
            None,
            "pg_basebackup",
        );
        assert!(
            backup.status.success(),
            "pg_basebackup from port {} failed ({}): {}{}\n{}",
            self.port,
            backup.status,
            backup.stdout,
            backup.stderr,
            self.log_tail()
        );
        // ALTER SYSTEM settings travel with the backup: the standby must not wait for standbys.
        let auto_conf = data.join("postgresql.auto.conf");
        let conf = std::fs::read_to_string(&auto_conf).expect("the standby's postgresql.auto.conf");
        let conf: String = conf
            .lines()
            .filter(|line| !line.trim_start().starts_with("synchronous_standby_names"))
            .map(|line| format!("{line}\n"))
            .collect();
        std::fs::write(&auto_conf, conf).expect("rewrite the standby's postgresql.auto.conf");
        let options = self.options.clone().setting("cluster_name", &name);
        let standby = Self::launch(self.bin.clone(), dir, watchdog, options);
        if synchronous {
            self.psql("postgres", "ALTER SYSTEM SET synchronous_standby_names = '*';\nSELECT pg_reload_conf();");
        }
        let query = format!("select state, sync_state from pg_stat_replication where application_name = '{name}'");
        let wanted = if synchronous { "streaming|sync" } else { "streaming|" };
        let mut seen = String::new();
        let streaming = wait_until(Instant::now() + LIMIT, || {
            seen = self.psql("postgres", &query);
            seen.trim().starts_with(wanted)
        });
        assert!(
            streaming,
            "standby {name} (port {}) not {wanted} on the primary (port {}) after {LIMIT:?}: {seen:?}\n{}\n{}",
            standby.port,
            self.port,
            self.log_tail(),
            standby.log_tail()
        );
        standby
    }

    /// Promotes a standby (`pg_ctl promote -w`) and waits until `pg_is_in_recovery()` is
    /// false: it then accepts writes.
    pub fn promote(&self) {
        let promoted = run(
            server_command(&self.bin.join("pg_ctl"), self.dir.path()).arg("-D").arg(&self.data).args([
                "-w",
                "-t",
                &LIMIT.as_secs().to_string(),
                "promote",
            ]),
            None,
            "pg_ctl promote",
        );
        assert!(
            promoted.status.success(),
            "pg_ctl promote failed ({}): {}{}\n{}",
            promoted.status,
            promoted.stdout,
            promoted.stderr,
            self.log_tail()
        );
        let primary =
            wait_until(Instant::now() + LIMIT, || self.psql("postgres", "select pg_is_in_recovery()").trim() == "f");
        assert!(primary, "port {} still in recovery {LIMIT:?} after promote\n{}", self.port, self.log_tail());
    }
}

/// A directory the server user owns (tests run as root; PostgreSQL refuses to): for a base
/// backup, or the WAL a server's `archive_command` copies; removed when dropped, or by its
/// watchdog after the test process dies.
pub struct ServerScratch {
    dir: tempfile::TempDir,
    watchdog: Child,
}

impl ServerScratch {
    pub fn new() -> Self {
        let (dir, watchdog) = server_dir();
        ServerScratch { dir, watchdog }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Default for ServerScratch {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for ServerScratch {
    fn drop(&mut self) {
        self.watchdog.kill().ok();
        self.watchdog.wait().ok();
    }
}

/// A base backup of a server (`Postgres::base_backup`), for a point-in-time restore
/// (`Postgres::restore_from`); removed when dropped.
pub struct BaseBackup {
    dir: ServerScratch,
}

impl BaseBackup {
    /// The backup's data dir.
    pub fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }
}

impl Postgres {
    /// A base backup of this server while it serves (`pg_basebackup -X stream`, a fast
    /// checkpoint): with the WAL it archived since (`archive_mode=on`), a new server is
    /// recovered from it to a point in time by [`Postgres::restore_from`].
    pub fn base_backup(&self) -> BaseBackup {
        let dir = ServerScratch::new();
        let data = dir.path().join("data");
        let backup = run(
            server_command(&self.bin.join("pg_basebackup"), dir.path())
                .args(["-h", &self.address().to_string(), "-U", USER, "-p", &self.port.to_string()])
                .arg("-D")
                .arg(&data)
                .args(["-X", "stream", "--checkpoint=fast"]),
            None,
            "pg_basebackup",
        );
        assert!(
            backup.status.success(),
            "pg_basebackup failed: {}{}\n{}",
            backup.stdout,
            backup.stderr,
            self.log_tail()
        );
        BaseBackup { dir }
    }

    /// Makes a named restore point (`pg_create_restore_point`), then switches to a new WAL
    /// segment and waits until the one holding it is archived: a restore can then reach it.
    pub fn restore_point(&self, name: &str) {
        self.psql("postgres", &format!("select pg_create_restore_point('{name}')"));
        let segment = self.psql("postgres", "select pg_walfile_name(pg_switch_wal())");
        let segment = segment.trim().to_owned();
        let archived = wait_until(Instant::now() + LIMIT, || {
            let last = self.psql("postgres", "select coalesce(last_archived_wal, '') from pg_stat_archiver");
            last.trim() >= segment.as_str()
        });
        assert!(archived, "WAL segment {segment} not archived within {LIMIT:?}\n{}", self.log_tail());
    }

    /// A new server recovered from `backup` and the WAL in `archive` (where this test's
    /// primary's `archive_command` copied it) up to the restore point `name`, then promoted:
    /// returned once it accepts writes.
    pub fn restore_from(backup: &BaseBackup, archive: &Path, name: &str, options: Options) -> Postgres {
        let bin = bin_dir();
        let (dir, watchdog) = server_dir();
        let data = dir.path().join("data");
        let copy =
            run(server_command(Path::new("cp"), dir.path()).arg("-a").arg(backup.data()).arg(&data), None, "cp -a");
        assert!(copy.status.success(), "copying the base backup failed: {}", copy.stderr);
        std::fs::write(data.join("recovery.signal"), "").expect("recovery.signal");
        let mut auto_conf = std::fs::OpenOptions::new().append(true).open(data.join("postgresql.auto.conf")).unwrap();
        writeln!(
            auto_conf,
            "restore_command = 'cp \"{}/%f\" \"%p\"'\nrecovery_target_name = '{name}'\nrecovery_target_action = 'promote'",
            archive.display()
        )
        .expect("postgresql.auto.conf");
        let restored = Self::launch(bin, dir, watchdog, options);
        let promoted = wait_until(Instant::now() + LIMIT, || {
            restored.psql("postgres", "select pg_is_in_recovery()").trim() == "f"
        });
        assert!(promoted, "port {} still in recovery after {LIMIT:?}\n{}", restored.port, restored.log_tail());
        restored
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        if let Some(mut child) = self.postmaster.get_mut().unwrap_or_else(PoisonError::into_inner).take() {
            let pid = child.id();
            // SIGQUIT: an immediate shutdown; the postmaster takes its processes with it.
            // SAFETY: kill has no memory effects; the child is not reaped yet.
            unsafe { libc::kill(pid as i32, libc::SIGQUIT) };
            if reap(&mut child, QUIT_LIMIT).is_none() {
                let killed = kill_server(pid);
                reap(&mut child, QUIT_LIMIT);
                wait_until(Instant::now() + QUIT_LIMIT, || killed.iter().all(|&p| !alive(p)));
            }
        }
        if let Some(mut watchdog) = self.watchdog.get_mut().unwrap_or_else(PoisonError::into_inner).take() {
            watchdog.kill().ok();
            watchdog.wait().ok();
        }
        remove_stale_segment(&self.data);
        // `dir` drops after this and removes everything.
    }
}

/// One server per test process, for suites that only need a database each
/// (`shared().unique_database()`): `fsync=off` and `synchronous_commit=off` for speed, so
/// never for durability or crash tests (use [`Postgres::start`]).
///
/// Statics are never dropped: this server is stopped and its dir removed by its watchdog
/// (see [`Postgres`]), at most about a second after the test process exits.
pub fn shared() -> &'static Postgres {
    static SHARED: OnceLock<Postgres> = OnceLock::new();
    SHARED.get_or_init(|| {
        Postgres::start_with(Options { fsync: false, ..Options::default() }.setting("synchronous_commit", "off"))
    })
}
