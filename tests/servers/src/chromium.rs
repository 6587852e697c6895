//! A real headless Chromium for the browser tests, driven over WebDriver: [`Browser`] owns one
//! ChromeDriver on a free loopback port, the Chromium it starts and a temp dir for both, and
//! ends them all when dropped. [`screenshot`] and [`axe_violations`] work on its client.
//!
//! The binaries are Debian's, at fixed paths ([`CHROMIUM`], [`CHROMEDRIVER`]: packages
//! `chromium` and `chromium-driver`); without them [`Browser::start`] fails the calling test
//! with the install command, never a skip. The client is [`fantoccini`], so the tests run on a
//! tokio runtime (`#[tokio::test]`). Accessibility checks use the axe-core vendored in
//! `tests/assets/axe-core`, compiled in: nothing is downloaded at test time.
//!
//! Chromium runs with the flags this machine needs (headless, no sandbox as root, no GPU) and
//! with everything that would reach out to the network off, since only loopback is reachable
//! and each refused connection costs time. Its profile, its crash database (it puts that under
//! `$XDG_CONFIG_HOME`, not the profile) and its caches all live in the Browser's temp dir, so
//! no run leaves anything in the real home.
//!
//! Lifetimes: Chromium's crash handlers detach into sessions of their own and its other
//! processes outlive a killed ChromeDriver, so neither the ChromeDriver process group nor the
//! process tree finds them all. What does is the temp dir: every one of them names a path in it
//! on its command line. `Drop` SIGKILLs ChromeDriver's group and then every process naming the
//! dir until none is left, then removes the dir. For a test process killed by a signal, where
//! no `Drop` runs, a detached watchdog shell does the same when the test process goes: it
//! blocks reading a pipe whose only writer is the test process, so it needs no polling.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::wait_until;

/// Debian's Chromium (a wrapper script that sets its flags from `/etc/chromium.d`).
pub const CHROMIUM: &str = "/usr/bin/chromium";
/// Debian's ChromeDriver, of the same version as [`CHROMIUM`].
pub const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
/// What puts both on a Debian machine.
pub const INSTALL: &str = "apt-get install -y chromium chromium-driver";
/// Chromium's command-line flags, besides `--user-data-dir`. Headless with no sandbox (the
/// tests run as root) and no GPU (there is none); the rest keep it off the network, where
/// every connection attempt is refused and Google's hosts fail to resolve.
pub const ARGS: &[&str] = &[
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1280,900",
];
/// The limit on ChromeDriver getting ready, on the session (Chromium) starting, and on any one
/// script or page load in the session.
const LIMIT: Duration = Duration::from_secs(60);
/// How long `Drop` keeps SIGKILLing before it gives up and says which processes are left.
const KILL_LIMIT: Duration = Duration::from_secs(10);
/// Start attempts on fresh ports when another process took the chosen one meanwhile.
const PORT_ATTEMPTS: usize = 5;
/// axe-core, vendored (see the README beside it for the version and how to update it).
const AXE_SOURCE: &str = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../assets/axe-core/axe.min.js"));

/// Fails the calling test unless Chromium and ChromeDriver are installed (never a skip).
pub fn require_installed() {
    let missing: Vec<&str> = [CHROMIUM, CHROMEDRIVER].into_iter().filter(|path| !Path::new(path).is_file()).collect();
    assert!(
        missing.is_empty(),
        "{} not found: the browser tests need Debian's Chromium and ChromeDriver; install them with \
         `{INSTALL}` (scripts/test does, when run as root)",
        missing.join(" and ")
    );
}

/// One headless Chromium under its own ChromeDriver; everything it started ends when it drops.
///
/// Fields drop in order: the client first (its session task may still try to end the session,
/// harmlessly), then the processes.
pub struct Browser {
    client: Client,
    processes: Processes,
}

impl std::fmt::Debug for Browser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Browser").field("port", &self.processes.port).field("dir", &self.dir()).finish_non_exhaustive()
    }
}

impl Browser {
    /// Starts ChromeDriver on a free loopback port and opens a session, which starts Chromium
    /// with [`ARGS`] and a fresh profile. Fails the calling test, with ChromeDriver's log, when
    /// either does not come up within 60 s.
    pub async fn start() -> Browser {
        require_installed();
        let dir = tempfile::Builder::new()
            .prefix("autocomp-browser-")
            .tempdir()
            .unwrap_or_else(|e| panic!("cannot make the browser's temp dir: {e}"));
        for sub in ["profile", "home", "config", "cache"] {
            std::fs::create_dir(dir.path().join(sub)).expect("the browser's temp dir is writable");
        }
        let watchdog = spawn_watchdog(dir.path());
        let mut processes = Processes { dir, watchdog: Some(watchdog), driver: None, port: 0 };
        processes.start_driver();

        let mut capabilities = serde_json::Map::new();
        capabilities.insert("browserName".into(), json!("chrome"));
        let profile = format!("--user-data-dir={}", processes.dir.path().join("profile").display());
        let args: Vec<&str> = ARGS.iter().copied().chain([profile.as_str()]).collect();
        capabilities.insert("goog:chromeOptions".into(), json!({ "binary": CHROMIUM, "args": args }));
        let limit_ms = LIMIT.as_millis() as u64;
        capabilities.insert("timeouts".into(), json!({ "script": limit_ms, "pageLoad": limit_ms, "implicit": 0 }));
        let mut builder = ClientBuilder::new(HttpConnector::new());
        builder.capabilities(capabilities);
        let url = processes.url();
        let client = match tokio::time::timeout(LIMIT, builder.connect(&url)).await {
            Ok(Ok(client)) => client,
            Ok(Err(e)) => panic!("cannot open a WebDriver session at {url}: {e}\n{}", processes.log_tail()),
            Err(_) => panic!("no WebDriver session at {url} within {LIMIT:?}\n{}", processes.log_tail()),
        };
        Browser { client, processes }
    }

    /// The WebDriver client of this browser's session.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// ChromeDriver's address, `http://127.0.0.1:PORT`.
    pub fn webdriver_url(&self) -> String {
        self.processes.url()
    }

    /// The temp dir holding the profile and ChromeDriver's log; removed on drop. Every process
    /// of this browser names a path in it ([`processes_in`]).
    pub fn dir(&self) -> &Path {
        self.processes.dir.path()
    }

    /// Ends the session (Chromium quits on its own) and then ChromeDriver; fails the calling
    /// test if the session did not end cleanly, after everything is gone all the same.
    pub async fn close(self) {
        let Browser { client, processes } = self;
        let closed = client.close().await;
        drop(processes);
        if let Err(e) = closed {
            panic!("the WebDriver session did not end cleanly: {e}");
        }
    }
}

/// The processes of one [`Browser`] and its temp dir: built before anything starts, so that a
/// start failing halfway is cleaned up like a dropped Browser.
struct Processes {
    dir: tempfile::TempDir,
    watchdog: Option<Child>,
    driver: Option<Child>,
    port: u16,
}

impl Processes {
    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Starts ChromeDriver and waits for its `/status` to say ready. A port taken between our
    /// probe and ChromeDriver's bind makes it exit; then it gets another port.
    fn start_driver(&mut self) {
        for _ in 0..PORT_ATTEMPTS {
            self.port = free_port();
            let mut command = Command::new(CHROMEDRIVER);
            let out = std::fs::File::create(self.dir.path().join("chromedriver.out")).expect("temp dir is writable");
            command
                .arg(format!("--port={}", self.port))
                // Also puts the dir on ChromeDriver's command line, which is how the cleanup finds it.
                .arg(format!("--log-path={}", self.dir.path().join("chromedriver.log").display()))
                .env("HOME", self.dir.path().join("home"))
                .env("XDG_CONFIG_HOME", self.dir.path().join("config"))
                .env("XDG_CACHE_HOME", self.dir.path().join("cache"))
                .stdin(Stdio::null())
                .stdout(out.try_clone().expect("dup of a file handle"))
                .stderr(out)
                // Its own group, for one kill to reach what stays in it, and so that a Ctrl-C
                // meant for the test does not reach it before Drop does.
                .process_group(0);
            let child = command.spawn().unwrap_or_else(|e| panic!("cannot run {CHROMEDRIVER}: {e}"));
            let driver = self.driver.insert(child);
            let mut exited = None;
            let port = self.port;
            let ready = wait_until(Instant::now() + LIMIT, || {
                exited = driver.try_wait().expect("try_wait on chromedriver");
                exited.is_some() || driver_ready(port)
            });
            match exited {
                None if ready => return,
                None => panic!("chromedriver on port {port} not ready within {LIMIT:?}\n{}", self.log_tail()),
                // Reaped: its pid is no longer ours to signal.
                Some(_) => self.driver = None,
            }
        }
        panic!("chromedriver exited at start on {PORT_ATTEMPTS} ports in a row\n{}", self.log_tail());
    }

    /// The ends of ChromeDriver's output and log, for failure messages.
    fn log_tail(&self) -> String {
        let mut tail = String::new();
        for name in ["chromedriver.out", "chromedriver.log"] {
            let text = std::fs::read_to_string(self.dir.path().join(name)).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let last = &lines[lines.len().saturating_sub(30)..];
            tail.push_str(&format!("--- last {} lines of {name} ---\n{}\n", last.len(), last.join("\n")));
        }
        tail
    }
}

impl Drop for Processes {
    fn drop(&mut self) {
        if let Some(driver) = &mut self.driver
            && matches!(driver.try_wait(), Ok(None))
        {
            // SAFETY: kill has no memory effects; the group is ChromeDriver's own (unreaped, so
            // its pid, the group's id, cannot have been reused).
            unsafe { libc::kill(-(driver.id() as libc::pid_t), libc::SIGKILL) };
        }
        // Killing repeatedly: a zygote may fork once more between two scans.
        let mut left = Vec::new();
        let gone = wait_until(Instant::now() + KILL_LIMIT, || {
            left = processes_in(self.dir.path());
            for &pid in &left {
                // SAFETY: as above; every pid is a live process naming our temp dir.
                unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
            }
            left.is_empty()
        });
        if let Some(mut driver) = self.driver.take() {
            driver.kill().ok();
            driver.wait().ok();
        }
        // Its job is done; left running, it would race the temp dir's removal.
        if let Some(mut watchdog) = self.watchdog.take() {
            watchdog.kill().ok();
            watchdog.wait().ok();
        }
        if !gone {
            // Not a panic: this may run while a test is already panicking.
            eprintln!("browser processes still alive after {KILL_LIMIT:?} of SIGKILL: {left:?}");
        }
    }
}

/// A loopback port that was free a moment ago.
fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .unwrap_or_else(|e| panic!("cannot bind a loopback port: {e}"))
}

/// Whether ChromeDriver on `port` answers `/status` with `"ready": true`. Plain blocking HTTP:
/// one loopback round trip, at start only, before there is a session to serve.
fn driver_ready(port: u16) -> bool {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_secs(1)) else { return false };
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok();
    let request = format!("GET /status HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n");
    if stream.write_all(request.as_bytes()).is_err() {
        return false;
    }
    // ChromeDriver answers "Connection: close" but keeps the connection open, so the body
    // ends where Content-Length says, not at EOF.
    let mut response = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(body) = http_body(&response) {
            return serde_json::from_slice::<Value>(body).is_ok_and(|status| status["value"]["ready"] == json!(true));
        }
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => return false,
            Ok(n) => response.extend_from_slice(&chunk[..n]),
        }
    }
}

/// The body of an HTTP response with a Content-Length, once all of it is in `response`.
fn http_body(response: &[u8]) -> Option<&[u8]> {
    let end = response.windows(4).position(|window| window == b"\r\n\r\n")? + 4;
    let head = std::str::from_utf8(&response[..end]).ok()?;
    let length: usize = head.lines().find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.trim().eq_ignore_ascii_case("content-length").then(|| value.trim().parse().ok())?
    })?;
    response.get(end..end + length)
}

/// Live processes other than this one whose command line names a path in `dir` (zombies have
/// an empty command line, so a killed but not yet reaped process does not count).
pub fn processes_in(dir: &Path) -> Vec<u32> {
    let needle = format!("{}/", dir.display()).into_bytes();
    let own = std::process::id();
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != own)
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|cmdline| cmdline.windows(needle.len()).any(|window| window == needle))
        })
        .collect()
}

/// A detached shell that, once the test process is gone, kills every process naming `dir` and
/// removes it. It learns that the test process is gone from EOF on its stdin, whose only
/// writer is this process (the write end is close-on-exec, so no other child holds it). The
/// dir goes in the environment, not the arguments, so that the shell does not name it itself.
fn spawn_watchdog(dir: &Path) -> Child {
    const SCRIPT: &str = r#"
while read -r _; do :; done
named() {
    for f in /proc/[0-9]*/cmdline; do
        pid=${f#/proc/}; pid=${pid%/cmdline}
        [ "$pid" = "$$" ] && continue
        case "$(tr '\0' ' ' < "$f" 2>/dev/null)" in *"$AUTOCOMP_BROWSER_DIR/"*) echo "$pid" ;; esac
    done
}
i=0
while pids=$(named) && [ -n "$pids" ] && [ "$i" -lt 100 ]; do
    kill -KILL $pids 2>/dev/null
    sleep 0.1
    i=$((i + 1))
done
rm -rf "$AUTOCOMP_BROWSER_DIR"
"#;
    let mut command = Command::new("sh");
    command
        .args(["-c", SCRIPT, "autocomp-browser-watchdog"])
        .env("AUTOCOMP_BROWSER_DIR", dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0);
    command.spawn().unwrap_or_else(|e| panic!("cannot run sh (the browser watchdog): {e}"))
}

/// Writes a PNG of the current viewport to `path`, creating its parent dirs.
pub async fn screenshot(client: &Client, path: impl AsRef<Path>) -> PathBuf {
    let path = path.as_ref();
    let png = client.screenshot().await.unwrap_or_else(|e| panic!("cannot take a screenshot: {e}"));
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).unwrap_or_else(|e| panic!("cannot create {}: {e}", parent.display()));
    }
    std::fs::write(path, png).unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
    path.to_path_buf()
}

/// One rule that axe-core found broken on the page.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct AxeViolation {
    /// The rule, e.g. `image-alt`.
    pub id: String,
    /// `minor`, `moderate`, `serious` or `critical` (axe gives none for some rules).
    pub impact: Option<String>,
    /// What the rule asks for, in one line.
    pub help: String,
    /// Deque's page on the rule.
    #[serde(rename = "helpUrl")]
    pub help_url: String,
    /// One CSS selector per offending element; levels of frames are joined by ` >> ` and of
    /// shadow roots by ` >>> `.
    pub targets: Vec<String>,
}

impl AxeViolation {
    /// Whether axe rates it `serious` or `critical`.
    pub fn is_serious_or_critical(&self) -> bool {
        matches!(self.impact.as_deref(), Some("serious" | "critical"))
    }
}

impl std::fmt::Display for AxeViolation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let impact = self.impact.as_deref().unwrap_or("no impact given");
        write!(f, "{} ({impact}): {} [{}] at {}", self.id, self.help, self.help_url, self.targets.join(", "))
    }
}

/// The violations of those given that axe rates `serious` or `critical`.
pub fn serious_or_critical(violations: &[AxeViolation]) -> Vec<&AxeViolation> {
    violations.iter().filter(|violation| violation.is_serious_or_critical()).collect()
}

/// Runs axe-core with its default rules on the current page (injecting it first if the page
/// has none) and returns the violations.
pub async fn axe_violations(client: &Client) -> Vec<AxeViolation> {
    const RUN: &str = r#"
const done = arguments[arguments.length - 1];
const selector = (part) => (Array.isArray(part) ? part.join(" >>> ") : String(part));
axe.run(document, { resultTypes: ["violations"] }).then(
    (results) => done({ violations: results.violations.map((v) => ({
        id: v.id, impact: v.impact, help: v.help, helpUrl: v.helpUrl,
        targets: v.nodes.map((node) => node.target.map(selector).join(" >> ")),
    })) }),
    (error) => done({ error: String((error && error.stack) || error) }),
);
"#;
    let present = "return typeof window.axe === 'object' && typeof window.axe.run === 'function';";
    let has_axe = |found: Value| found == json!(true);
    if !has_axe(client.execute(present, vec![]).await.unwrap_or_else(|e| panic!("cannot run a script: {e}"))) {
        client.execute(AXE_SOURCE, vec![]).await.unwrap_or_else(|e| panic!("cannot inject axe-core: {e}"));
        let injected = client.execute(present, vec![]).await.unwrap_or_else(|e| panic!("cannot run a script: {e}"));
        assert!(has_axe(injected), "axe-core was injected but window.axe.run is not there");
    }
    let mut outcome = client.execute_async(RUN, vec![]).await.unwrap_or_else(|e| panic!("axe.run failed: {e}"));
    if let Some(error) = outcome.get("error") {
        panic!("axe.run failed in the page: {error}");
    }
    serde_json::from_value(outcome["violations"].take())
        .unwrap_or_else(|e| panic!("unexpected axe.run result ({e}): {outcome}"))
}
