//! The multi-host parts as real processes: the store service and the sboi service, each on
//! a loopback port of its own (or on a host of a test network, `Service::on`), killed when
//! dropped and restartable on the same address.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::netns::Host;
use crate::{binary, wait_until};

/// The bearer token the test services accept.
pub const TOKEN: &str = "e2e-test-token";

/// A service process; killed when dropped.
pub struct Service {
    child: Option<Child>,
    program: PathBuf,
    args: Vec<String>,
    pub port: u16,
    log: PathBuf,
    /// Where it runs when not on loopback.
    host: Option<Host>,
}

impl Service {
    /// `autocomp-store serve` on `db` (a SQLite file, `synchronous=normal`). The test
    /// services ask for the token on every read, so every client is seen to send it.
    pub fn store(db: &Path, log_dir: &Path) -> Service {
        Self::store_of(&format!("sqlite://{}?synchronous=normal", db.display()), log_dir)
    }

    /// `autocomp-store serve --db <db_url>`: any database URL the service takes, e.g. a
    /// `postgres://` one.
    pub fn store_of(db_url: &str, log_dir: &Path) -> Service {
        let mut service = Self::store_unstarted(db_url, log_dir);
        service.restart();
        service
    }

    /// The store service of [`Service::store_of`] with its port chosen but not started: start
    /// it with [`Service::restart`] (when a test starts the services in another order).
    pub fn store_unstarted(db_url: &str, log_dir: &Path) -> Service {
        let args = vec!["serve".into(), "--db".into(), db_url.into(), "--reads-need-token".into()];
        Self::unstarted(binary("autocomp-store"), args, log_dir.join("store.log"))
    }

    /// `sboi serve` following `store_url`, its index in `index_dir`.
    pub fn index(store_url: &str, index_dir: &Path, log_dir: &Path) -> Service {
        let mut service = Self::index_unstarted(store_url, index_dir, log_dir, "sboi");
        service.restart();
        service
    }

    /// `sboi serve` not started yet; `name` names its log (`<name>.log`), for a second one.
    pub fn index_unstarted(store_url: &str, index_dir: &Path, log_dir: &Path, name: &str) -> Service {
        let args = vec![
            "serve".into(),
            "--store".into(),
            store_url.into(),
            "--index-dir".into(),
            index_dir.display().to_string(),
            "--reads-need-token".into(),
        ];
        Self::unstarted(binary("sboi"), args, log_dir.join(format!("{name}.log")))
    }

    fn unstarted(program: PathBuf, mut args: Vec<String>, log: PathBuf) -> Service {
        // The token from a file, as in production: the service must pass it on itself
        // (sboi to the store service), nothing reads it from the environment.
        let token_file = log.with_extension("token");
        std::fs::write(&token_file, TOKEN).expect("token file");
        args.extend(["--token-file".into(), token_file.display().to_string()]);
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        Service { child: None, program, args, port, log, host: None }
    }

    /// The same service on `host` of a test network (its own port there), not yet started.
    pub fn on(mut self, host: &Host, port: u16) -> Service {
        self.host = Some(host.clone());
        self.port = port;
        self
    }

    pub fn url(&self) -> String {
        match &self.host {
            Some(host) => format!("http://{}:{}", host.addr, self.port),
            None => format!("http://127.0.0.1:{}", self.port),
        }
    }

    /// `GET path` from where the service can be reached (inside its host's namespace).
    fn get(&self, path: &str) -> Option<(u16, String)> {
        let url = format!("{}{path}", self.url());
        match &self.host {
            Some(host) => host.within(move || http_get(&url)),
            None => http_get(&url),
        }
    }

    /// Starts the process (again) on the same port and waits until `/health` answers 200.
    pub fn restart(&mut self) {
        self.launch();
        let deadline = Instant::now() + Duration::from_secs(30);
        let healthy =
            wait_until(deadline, || !self.is_running() || self.get("/health").map(|(status, _)| status) == Some(200));
        assert!(self.is_running(), "{} exited:\n{}", self.program.display(), self.logs());
        assert!(healthy, "{} not healthy in 30 s:\n{}", self.program.display(), self.logs());
    }

    /// Starts the process (again) on the same port without waiting for it to be healthy.
    pub fn launch(&mut self) {
        self.kill();
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&self.log).expect("service log");
        let listen = match &self.host {
            Some(host) => format!("{}:{}", host.addr, self.port),
            None => format!("127.0.0.1:{}", self.port),
        };
        let mut command = Command::new(&self.program);
        command.args(&self.args).args(["--listen", &listen]);
        let mut command = match &self.host {
            Some(host) => host.wrap(&command),
            None => command,
        };
        let child = command
            .env_remove("AUTOCOMP_TOKEN")
            .env_remove("AUTOCOMP_TOKEN_FILE")
            .env_remove("RUST_LOG")
            // What a postgres:// --db or --store falls back on: the URL says everything.
            .env_remove("PGUSER")
            .env_remove("PGPASSWORD")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", self.program.display()));
        self.child = Some(child);
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        self.child.as_mut().is_some_and(|child| child.try_wait().ok().flatten().is_none())
    }

    /// `GET /health`'s JSON.
    pub fn health(&self) -> serde_json::Value {
        let (_, body) = self.get("/health").expect("health answers");
        serde_json::from_str(&body).expect("health is JSON")
    }

    /// SIGKILL, as a crash would.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().ok();
            child.wait().ok();
        }
    }

    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// One unlabelled Prometheus sample of the service at `url`, e.g. `sboi_index_lag`.
pub fn metric(url: &str, name: &str) -> Option<f64> {
    let (_, text) = http_get(&format!("{url}/metrics"))?;
    text.lines().find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

impl Drop for Service {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A plain HTTP/1.1 GET on loopback: status and body, or None if nothing answers.
pub fn http_get(url: &str) -> Option<(u16, String)> {
    http_request("GET", url, "")
}

/// A plain HTTP/1.1 request with a JSON body (no token) on loopback: status and body, or
/// None if nothing answers.
pub fn http_request(method: &str, url: &str, body: &str) -> Option<(u16, String)> {
    let rest = url.strip_prefix("http://")?;
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let mut stream = TcpStream::connect(authority).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    let status = answer.get(9..12)?.parse().ok()?;
    let body = answer.split_once("\r\n\r\n").map(|(_, body)| body.to_string()).unwrap_or_default();
    Some((status, body))
}
