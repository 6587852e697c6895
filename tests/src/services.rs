//! The multi-host parts as real processes on loopback: the store service and the sboi
//! service, each on a port of its own, killed when dropped and restartable on the same port.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

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
        Service { child: None, program, args, port, log }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Starts the process (again) on the same port and waits until `/health` answers 200.
    pub fn restart(&mut self) {
        self.launch();
        let health = format!("{}/health", self.url());
        let deadline = Instant::now() + Duration::from_secs(30);
        let healthy =
            wait_until(deadline, || !self.is_running() || http_get(&health).map(|(status, _)| status) == Some(200));
        assert!(self.is_running(), "{} exited:\n{}", self.program.display(), self.logs());
        assert!(healthy, "{} not healthy in 30 s:\n{}", self.program.display(), self.logs());
    }

    /// Starts the process (again) on the same port without waiting for it to be healthy.
    pub fn launch(&mut self) {
        self.kill();
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&self.log).expect("service log");
        let child = Command::new(&self.program)
            .args(&self.args)
            .args(["--listen", &format!("127.0.0.1:{}", self.port)])
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
        let (_, body) = http_get(&format!("{}/health", self.url())).expect("health answers");
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
