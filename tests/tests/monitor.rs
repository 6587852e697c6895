//! The web monitor (`autocomp-monitor`) as an operator meets it: the real binary as a child
//! process on a free loopback port, serving the pipeline `autocomp demo` left behind, driven by
//! a real headless Chromium. What the pages show is checked against what the `autocomp` CLI
//! says (`status` and `show --format json`); what the actions write is checked in the store.
//!
//! - the overview's component x state counts, and the failed count's link to exactly the
//!   failed batches;
//! - a failed batch's page naming the file its checksum report names;
//! - signing in with an account of the users file (hashes made by `autocomp-monitor
//!   hash-password`), then a rerun previewed and confirmed, its Reset in the log as the
//!   account, and the state after the component's next pass;
//! - a bulk rerun over a filter: previewed, confirmed, one Reset on exactly those batches;
//!   Back to its preview says on how many batches it was done;
//! - confirms that act once, on what was previewed: two tabs preview the cancel of one run
//!   and only the first confirm acts (the second is shown the batch afresh); a double click
//!   on Confirm and a double submit each record one event, the repeat saying "already
//!   done"; Back to a confirmed preview (a GET the browser asks for again) says it is done,
//!   with no Confirm, and writes nothing;
//! - a viewer shown no actions and refused a POST; forged, signed-out and expired sessions
//!   refused; writes from another site refused; nothing written by any of them;
//! - an admin pausing a component with the overview's buttons (previewed, confirmed, the
//!   hold in the store), which an operator then sees without buttons; the operator finding a
//!   batch on the list of those waiting for a person at a human step (`autocomp step add`)
//!   and approving it beside its evidence, the approval in the store;
//! - the pipeline graph's nodes and counts equal `autocomp status`;
//! - every page fitting a 400 px screen in light and dark, and the alerts page;
//! - the pictures (overview, graph, charts, a failed batch's page and its timeline) at 1400
//!   and 400 px in light and dark, with a failing command's reason in the list and its
//!   stderr on its batch page, and its failures in the charts' numbers;
//! - no serious or critical axe-core finding on the pages.
//!
//! Screenshots go to `target/test-screenshots/monitor/`. Each test has its own demo dir and
//! monitor, so none sees another's writes.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use autocomp_e2e::{Finished, binary, finish};
use autocomp_model::{Agent, BatchId, ComponentName, OutputStream, RunHolder, RunOutput};
use autocomp_store::SqliteStore;
use autocomp_store::prelude::*;
use autocomp_test_servers::chromium::{self, Browser, axe_violations, serious_or_critical};
use autocomp_test_servers::wait_until_async;
use fantoccini::actions::{InputSource as _, MOUSE_BUTTON_LEFT, MouseActions, PointerAction};
use fantoccini::{Client, Locator};
use reqwest::StatusCode;
use serde_json::Value;

/// The demo's step whose broken bags fail.
const COMPONENT: &str = "checksum-verifier";
const EVENT_TYPE: &str = "Checksums_Verified";
/// The states `autocomp status` reports; the overview adds `overdue`.
const STATES: [&str; 10] =
    ["ready", "person", "waiting", "working", "retrying", "failed", "acknowledged", "stale", "skipped", "success"];
const OPERATOR: &str = "alice";
/// An account that may read but not act.
const VIEWER: &str = "vera";
/// An account that may also steer the whole pipeline (only where a test asks for it).
const ADMIN: &str = "ada";
const REASON: &str = "the manifest was fixed upstream";
/// The limit on anything the tests wait for: the monitor coming up, a page showing something.
const LIMIT: Duration = Duration::from_secs(30);

/// `autocomp status --format json` as batch -> component -> state.
type States = BTreeMap<String, BTreeMap<String, String>>;

/// `autocomp demo` run to completion in a temp dir.
struct Demo {
    dir: tempfile::TempDir,
}

impl Demo {
    fn run() -> Demo {
        let dir = tempfile::tempdir().expect("a temp dir");
        let mut command = command("autocomp");
        command.args(["demo", "--dir"]).arg(dir.path());
        let done = run(command, Duration::from_secs(120));
        assert_eq!(done.code, Some(0), "autocomp demo\n{}", done.show());
        Demo { dir }
    }

    fn config_dir(&self) -> PathBuf {
        self.dir.path().join("config")
    }

    /// `autocomp ARGS` with `AUTOCOMP_CONFIG_DIR` set to the demo's config.
    fn cli(&self, args: &[&str]) -> Finished {
        let mut command = command("autocomp");
        command.args(args).env("AUTOCOMP_CONFIG_DIR", self.config_dir());
        let done = run(command, Duration::from_secs(60));
        assert_eq!(done.code, Some(0), "autocomp {args:?}\n{}", done.show());
        done
    }

    fn status(&self) -> States {
        json(&self.cli(&["status", "--format", "json"]))
            .as_array()
            .expect("status is an array")
            .iter()
            .map(|row| {
                let components = row["components"].as_object().expect("components").iter();
                let states = components.map(|(c, s)| (c.clone(), s.as_str().expect("a state").to_owned())).collect();
                (row["id"].as_str().expect("an id").to_owned(), states)
            })
            .collect()
    }

    fn show(&self, id: &str) -> Value {
        json(&self.cli(&["show", id, "--format", "json"]))
    }

    /// Every batch's log, from `show`.
    fn logs(&self, ids: impl IntoIterator<Item = String>) -> BTreeMap<String, Vec<Value>> {
        ids.into_iter().map(|id| (id.clone(), events(&self.show(&id)))).collect()
    }

    /// One pass of a component, as the demo (and cron) runs it; exit 0 or 1 (a batch failed).
    fn pass(&self, component: &str) -> Finished {
        let mut command = command(component);
        command.arg("--config-dir").arg(self.config_dir());
        let done = run(command, Duration::from_secs(60));
        assert!(matches!(done.code, Some(0 | 1)), "{component} pass\n{}", done.show());
        done
    }

    /// The store's head: every write moves it.
    async fn head(&self) -> i64 {
        self.store().await.head().await.expect("the head is readable").0
    }

    async fn store(&self) -> SqliteStore {
        SqliteStore::open(self.dir.path().join("store.db")).await.expect("the demo's store opens")
    }

    /// A run of `component` on batch `id`, as a worker's claim opens it (no worker behind it).
    async fn claim(&self, id: &str, component: &str) -> i64 {
        let holder = RunHolder {
            agent: Agent::new(format!("{component}/test@host1#4242")).expect("an agent"),
            host: "host1".into(),
            pid: 4242,
            claim_key: None,
            liveness: None,
        };
        let (batch, component) = (BatchId::new(id).expect("an id"), ComponentName::new(component).expect("a name"));
        self.store().await.claim(&batch, &component, &holder).await.expect("claimed").generation()
    }
}

/// The batches of `states` in `state` for `component`.
fn in_state(states: &States, component: &str, state: &str) -> BTreeSet<String> {
    states.iter().filter(|(_, row)| row.get(component).is_some_and(|s| s == state)).map(|(id, _)| id.clone()).collect()
}

/// The batches failed at `COMPONENT`: the demo always fails some there.
fn failed_at_the_component(states: &States) -> BTreeSet<String> {
    let failed = in_state(states, COMPONENT, "failed");
    assert!(!failed.is_empty(), "the demo fails some batches at {COMPONENT}");
    failed
}

/// The demo's monitor, and a browser to look at it with.
async fn monitor_in_a_browser(demo: &Demo) -> (Monitor, Browser) {
    let monitor = Monitor::start(demo).await;
    (monitor, Browser::start().await)
}

/// A workspace binary, without the environment that would change what it does.
fn command(name: &str) -> Command {
    let mut command = Command::new(binary(name));
    clean(&mut command);
    command
}

/// Runs `command` to its end, at most `limit`.
fn run(mut command: Command, limit: Duration) -> Finished {
    command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    finish(command.spawn().expect("the binary starts"), limit)
}

fn clean(command: &mut Command) {
    for var in [
        "AUTOCOMP_STORE",
        "AUTOCOMP_INDEX",
        "AUTOCOMP_LOCKS",
        "AUTOCOMP_CONFIG_DIR",
        "AUTOCOMP_MONITOR_TOKEN_FILE",
        "AUTOCOMP_MONITOR_USERS",
        "RUST_LOG",
    ] {
        command.env_remove(var);
    }
}

fn json(done: &Finished) -> Value {
    serde_json::from_str(&done.stdout).unwrap_or_else(|e| panic!("not JSON ({e}):\n{}", done.show()))
}

fn events(show: &Value) -> Vec<Value> {
    show["events"].as_array().expect("events").clone()
}

/// The file names (`reference`s) of the failures in the batch's effective `EVENT_TYPE` result.
fn failing_files(show: &Value) -> Vec<String> {
    let seq = &show["effective"][EVENT_TYPE]["seq"];
    let event = events(show)
        .into_iter()
        .find(|e| e["type"] == EVENT_TYPE && &e["seq"] == seq)
        .unwrap_or_else(|| panic!("no effective {EVENT_TYPE} in {show:#}"));
    assert_eq!(event["outcome"], "failure", "{event:#}");
    let failures = event["details"]["failures"].as_array().expect("failures").iter();
    failures.filter_map(|f| f["reference"].as_str()).filter(|r| !r.is_empty()).map(str::to_owned).collect()
}

/// Asserts `event` is the Reset of `EVENT_TYPE` by `operator:OPERATOR` with `REASON`.
fn assert_reset(event: &Value) {
    assert_eq!(event["type"], "Reset", "{event:#}");
    assert_eq!(event["agent"], format!("operator:{OPERATOR}"), "{event:#}");
    assert_eq!(event["resets"], serde_json::json!([EVENT_TYPE]), "{event:#}");
    assert_eq!(event["details"]["reason"], REASON, "{event:#}");
}

/// A loopback port that was free a moment ago.
fn free_port() -> u16 {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("a loopback port");
    listener.local_addr().expect("its address").port()
}

/// A users-file line made by `autocomp-monitor hash-password`, the password on its stdin.
fn users_line(name: &str, role: &str, password: &str) -> String {
    let mut command = command("autocomp-monitor");
    command.args(["hash-password", "--user", name, "--role", role]);
    command.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = command.spawn().expect("autocomp-monitor hash-password starts");
    use std::io::Write as _;
    child.stdin.take().expect("stdin").write_all(format!("{password}\n").as_bytes()).expect("the password written");
    let done = finish(child, Duration::from_secs(60));
    assert_eq!(done.code, Some(0), "hash-password\n{}", done.show());
    let line = done.stdout.trim().to_owned();
    assert!(line.starts_with(&format!("{name} {role} $argon2id$")) && !line.contains(password), "{line}");
    line
}

/// `autocomp-monitor` serving the demo's pipeline, with an operator's and a viewer's
/// account; killed on drop.
struct Monitor {
    child: Child,
    base: String,
    /// Both accounts' password.
    password: String,
    log: PathBuf,
}

impl Monitor {
    async fn start(demo: &Demo) -> Monitor {
        Monitor::start_with(demo, &[]).await
    }

    /// With more flags. Every monitor of one demo has the same accounts.
    async fn start_with(demo: &Demo, flags: &[&str]) -> Monitor {
        Monitor::start_with_accounts(demo, &[(OPERATOR, "operator"), (VIEWER, "viewer")], flags).await
    }

    /// With these accounts (name, role), if the demo's monitors have none yet.
    async fn start_with_accounts(demo: &Demo, accounts: &[(&str, &str)], flags: &[&str]) -> Monitor {
        let users_file = demo.dir.path().join("monitor.users");
        let password_file = demo.dir.path().join("monitor.password");
        if !users_file.exists() {
            let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
            let password = format!("monitor-e2e-{}-{nanos}", std::process::id());
            let lines: Vec<String> = accounts.iter().map(|(name, role)| users_line(name, role, &password)).collect();
            std::fs::write(&users_file, format!("{}\n", lines.join("\n"))).expect("users file");
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(&users_file, std::fs::Permissions::from_mode(0o600)).expect("chmod 600");
            std::fs::write(&password_file, &password).expect("password file");
        }
        let password = std::fs::read_to_string(&password_file).expect("the password");
        Monitor::spawn(demo, &users_file, password, flags).await
    }

    async fn spawn(demo: &Demo, users_file: &Path, password: String, flags: &[&str]) -> Monitor {
        // Another process may take the port between our probe and the monitor's bind; then
        // the monitor exits and gets another port.
        for attempt in 1..=5 {
            let port = free_port();
            let log = demo.dir.path().join(format!("monitor-{attempt}.log"));
            let mut command = command("autocomp-monitor");
            command
                .arg("--listen")
                .arg(format!("127.0.0.1:{port}"))
                .arg("--config-dir")
                .arg(demo.config_dir())
                .arg("--users")
                .arg(users_file)
                .args(flags);
            let stderr = std::fs::File::create(&log).expect("monitor log");
            command.stdin(Stdio::null()).stdout(Stdio::null()).stderr(stderr);
            let child = command.spawn().expect("autocomp-monitor starts");
            let mut monitor =
                Monitor { child, base: format!("http://127.0.0.1:{port}"), password: password.clone(), log };
            if monitor.wait_up().await {
                return monitor;
            }
        }
        panic!("autocomp-monitor found its port taken 5 times in a row");
    }

    /// Waits for the monitor to say it listens on its port and answer `/health`; false if it
    /// exited because the port was taken (and then `/health` may be someone else's).
    async fn wait_up(&mut self) -> bool {
        let http = http();
        let up_line = format!("monitor up: {}/", self.base);
        // Some(up) once it listens and answers, or exited; None while it starts.
        let mut up = None;
        let deadline = Instant::now() + LIMIT;
        wait_until_async(deadline, async || {
            if let Some(status) = self.child.try_wait().expect("try_wait on the monitor") {
                let log = self.log_text();
                assert!(log.contains("cannot listen"), "autocomp-monitor exited with {status}:\n{log}");
                up = Some(false);
            } else if self.log_text().contains(&up_line) {
                let health = http.get(format!("{}/health", self.base)).send().await;
                if let Ok(response) = health
                    && response.status() == StatusCode::OK
                {
                    assert_eq!(response.text().await.unwrap_or_default(), "ok");
                    up = Some(true);
                }
            }
            up.is_some()
        })
        .await;
        up.unwrap_or_else(|| panic!("autocomp-monitor not up within {LIMIT:?}:\n{}", self.log_text()))
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        self.child.kill().ok();
        self.child.wait().ok();
        if std::thread::panicking() {
            eprintln!("--- autocomp-monitor's log ({}) ---\n{}", self.log.display(), self.log_text());
        }
    }
}

/// A plain HTTP client that shows redirects rather than following them.
fn http() -> reqwest::Client {
    reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().expect("an HTTP client")
}

/// Where screenshots go: `target/test-screenshots/monitor`, beside cargo's own dirs.
fn screenshot_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).parent().expect("the target dir").join("test-screenshots/monitor")
}

/// Polls `attempt` until it gives a value, at most `LIMIT`; panics with `what` and the last
/// reason it gave.
async fn poll<T>(what: &str, mut attempt: impl AsyncFnMut() -> Result<T, String>) -> T {
    let mut last = Err(String::new());
    wait_until_async(Instant::now() + LIMIT, async || {
        last = attempt().await;
        last.is_ok()
    })
    .await;
    last.unwrap_or_else(|why| panic!("timed out after {LIMIT:?} waiting for {what}: {why}"))
}

/// `application/x-www-form-urlencoded` decoding: `+` is a space, `%XX` a byte.
fn form_decode(text: &str) -> String {
    let mut bytes = Vec::new();
    let mut rest = text.bytes();
    while let Some(byte) = rest.next() {
        match byte {
            b'+' => bytes.push(b' '),
            b'%' => {
                let hex: Vec<u8> = rest.by_ref().take(2).collect();
                let hex = std::str::from_utf8(&hex).unwrap_or_default();
                bytes.push(u8::from_str_radix(hex, 16).unwrap_or_else(|_| panic!("bad escape %{hex} in {text}")));
            }
            other => bytes.push(other),
        }
    }
    String::from_utf8(bytes).expect("UTF-8")
}

/// The hidden fields of the confirm form of a preview page, as a browser posts them.
fn confirm_fields(page: &str) -> Vec<(String, String)> {
    let form = page
        .split("<form method=\"post\"")
        .find(|form| form.contains("name=\"confirm\""))
        .unwrap_or_else(|| panic!("no confirm form in {page}"));
    let form = &form[..form.find("</form>").expect("the form's end")];
    let attribute = |input: &str, name: &str| {
        let start = input.find(&format!("{name}=\"")).expect("the attribute") + name.len() + 2;
        unescape(&input[start..start + input[start..].find('"').expect("its end")])
    };
    form.split("<input type=\"hidden\" ")
        .skip(1)
        .map(|input| (attribute(input, "name"), attribute(input, "value")))
        .collect()
}

/// An attribute's text as the browser reads it (the references the monitor writes).
fn unescape(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find('&') {
        out.push_str(&rest[..at]);
        let end = rest[at..].find(';').expect("a reference's end") + at;
        out.push(match &rest[at + 1..end] {
            "amp" => '&',
            "lt" => '<',
            "gt" => '>',
            "quot" => '"',
            "#39" => '\'',
            other => {
                let hex = other.strip_prefix("#x").unwrap_or_else(|| panic!("a reference &{other};"));
                char::from_u32(u32::from_str_radix(hex, 16).expect("hex")).expect("a character")
            }
        });
        rest = &rest[end + 1..];
    }
    out.push_str(rest);
    out
}

/// The `q` of a `/batches?...` link as `component` and `state` (None when it is not one).
fn count_link(href: &str) -> Option<(String, String)> {
    let query = href.strip_prefix("/batches?")?;
    let q = query.split('&').find_map(|pair| pair.strip_prefix("q=")).map(form_decode)?;
    let (mut component, mut state) = (None, None);
    for term in q.split_whitespace() {
        match term.split_once(':') {
            Some(("component", c)) => component = Some(c.to_owned()),
            Some(("state", s)) => state = Some(s.to_owned()),
            _ => return None,
        }
    }
    Some((component?, state?))
}

/// The browser on the monitor's pages. Pages are read with scripts (one consistent snapshot)
/// and elements are found afresh for every action, since the monitor's live updates may
/// replace the page's content at any moment.
struct Ui<'a> {
    client: &'a Client,
    base: &'a str,
}

impl Ui<'_> {
    async fn goto(&self, path: &str) {
        let url = format!("{}{path}", self.base);
        self.client.goto(&url).await.unwrap_or_else(|e| panic!("cannot load {url}: {e}"));
    }

    async fn script(&self, script: &str) -> Value {
        self.client.execute(script, vec![]).await.unwrap_or_else(|e| panic!("script failed: {e}\n{script}"))
    }

    /// The page's rendered text.
    async fn text(&self) -> String {
        self.script("return document.body ? document.body.innerText : '';").await.as_str().unwrap_or("").to_owned()
    }

    /// The current path and query, e.g. `/batches?q=...`.
    async fn location(&self) -> String {
        let url = self.client.current_url().await.expect("the current URL");
        match url.query() {
            Some(query) => format!("{}?{query}", url.path()),
            None => url.path().to_owned(),
        }
    }

    /// Waits until the page at a location `at` accepts shows `needle`; returns its text.
    async fn wait_for(&self, at: impl Fn(&str) -> bool, needle: &str) -> String {
        poll(&format!("a page showing {needle:?}"), async || {
            let (location, text) = (self.location().await, self.text().await);
            if at(&location) && text.contains(needle) { Ok(text) } else { Err(format!("at {location}:\n{text}")) }
        })
        .await
    }

    /// Clicks the element `locator` finds (found afresh until the click lands).
    async fn click(&self, what: &str, locator: Locator<'_>) {
        poll(&format!("a click on {what}"), async || {
            let element = self.client.find(locator).await.map_err(|e| e.to_string())?;
            element.click().await.map_err(|e| e.to_string())
        })
        .await
    }

    async fn type_into(&self, what: &str, locator: Locator<'_>, text: &str) {
        poll(&format!("typing into {what}"), async || {
            let element = self.client.find(locator).await.map_err(|e| e.to_string())?;
            element.clear().await.map_err(|e| e.to_string())?;
            element.send_keys(text).await.map_err(|e| e.to_string())
        })
        .await
    }

    async fn select(&self, what: &str, locator: Locator<'_>, value: &str) {
        poll(&format!("choosing {value} in {what}"), async || {
            let element = self.client.find(locator).await.map_err(|e| e.to_string())?;
            element.select_by_value(value).await.map_err(|e| e.to_string())
        })
        .await
    }

    /// The elements that stick out past the page's width (outside a scrolling region), to
    /// say what to fix when a page is too wide.
    async fn sticking_out(&self) -> Value {
        self.script(
            "return Array.from(document.querySelectorAll('body *')).filter(e => \
             e.getBoundingClientRect().right > document.documentElement.clientWidth + 0.5 && \
             !e.closest('.scroll')).slice(0, 10).map(e => e.tagName + '.' + e.className + ' ' + \
             Math.round(e.getBoundingClientRect().right));",
        )
        .await
    }

    async fn screenshot(&self, name: &str) {
        let path = chromium::screenshot(self.client, screenshot_dir().join(name)).await;
        eprintln!("screenshot: {}", path.display());
    }

    /// Every `(href, text)` of the overview grid's count links.
    async fn count_links(&self) -> Vec<(String, String)> {
        let links = self
            .script(
                "return Array.from(document.querySelectorAll('table tbody td a[href]'))\
                 .map(a => [a.getAttribute('href'), a.innerText.trim()]);",
            )
            .await;
        serde_json::from_value(links).expect("pairs of strings")
    }

    /// The matrix: its column headers after the batch column and, per row, the batch id and
    /// its cells under those headers (a failed cell's state, without its failure's summary).
    async fn matrix(&self) -> (Vec<String>, Vec<(String, Vec<String>)>) {
        let value = self
            .script(
                "const table = Array.from(document.querySelectorAll('table'))\
                   .find(t => t.querySelector('tbody th a[href^=\"/batches/\"]'));\
                 if (!table) return [[], []];\
                 const head = Array.from(table.querySelectorAll('thead th')).map(th => th.innerText.trim());\
                 const rows = Array.from(table.querySelectorAll('tbody tr')).map(tr => [\
                   tr.querySelector('th').innerText.trim(),\
                   Array.from(tr.querySelectorAll('td')).map(td => {\
                     const failure = td.querySelector('.failure-summary');\
                     const text = td.innerText;\
                     return (failure ? text.slice(0, text.lastIndexOf(failure.innerText)) : text).trim();\
                   })]);\
                 return [head, rows];",
            )
            .await;
        let (head, rows): (Vec<String>, Vec<(String, Vec<String>)>) =
            serde_json::from_value(value).expect("the matrix as arrays");
        // The header's first column is the row's header (the batch); the cells follow the rest.
        (head.into_iter().skip(1).collect(), rows)
    }

    /// The batch page's state of each component: the rows that name a component and show a
    /// state.
    async fn batch_states(&self) -> BTreeMap<String, String> {
        let value = self
            .script(
                "const out = {};\
                 for (const tr of document.querySelectorAll('tr')) {\
                   const th = tr.querySelector('th'); const state = tr.querySelector('.state');\
                   if (th && state) out[th.innerText.trim()] = state.innerText.trim();\
                 }\
                 return out;",
            )
            .await;
        let states: BTreeMap<String, String> = serde_json::from_value(value).expect("an object of strings");
        states.into_iter().map(|(c, s)| (c, last_word(&s))).collect()
    }

    /// Every table row's cells' text (header cells included).
    async fn rows(&self) -> Vec<Vec<String>> {
        let value = self
            .script(
                "return Array.from(document.querySelectorAll('tbody tr'))\
                 .map(tr => Array.from(tr.children).map(c => c.innerText.trim()));",
            )
            .await;
        serde_json::from_value(value).expect("rows of strings")
    }

    /// Signs in as `name` through the login form (from the page's own "Sign in" link) and
    /// waits to be back where it started, signed in.
    async fn sign_in_as(&self, name: &str, password: &str) {
        let back = self.location().await;
        self.click("the Sign in link", Locator::XPath("//a[starts-with(@href, '/login')]")).await;
        self.wait_for(|at| at.starts_with("/login"), "Password").await;
        self.type_into("the name field", Locator::Css("form[action='/login'] input[name='name']"), name).await;
        self.type_into("the password field", Locator::Css("form[action='/login'] input[name='password']"), password)
            .await;
        self.click("Sign in", Locator::Css("form[action='/login'] button[type='submit']")).await;
        self.wait_for(|at| at == back, &format!("Signed in as {name}")).await;
    }

    async fn sign_in(&self, password: &str) {
        self.sign_in_as(OPERATOR, password).await;
    }

    /// The browser's session cookie (HttpOnly: no script sees it, WebDriver does).
    async fn session_cookie(&self) -> String {
        let cookies = self.client.get_all_cookies().await.expect("the browser's cookies");
        let session = cookies.iter().find(|c| c.name() == "autocomp_session").expect("a session cookie");
        assert!(session.http_only().unwrap_or(false), "{session:?}");
        assert_eq!(format!("{:?}", session.same_site()), "Some(Strict)", "{session:?}");
        format!("autocomp_session={}", session.value())
    }

    /// Fills the batch page's `action` form (`fields`: a select or an input by name, and
    /// its value), clicks its Preview and waits for the preview page.
    async fn preview(&self, page: &str, action: &str, fields: &[(&str, &str)]) -> String {
        for (name, value) in fields {
            let what = format!("the {action} form's {name}");
            if *name == "component" || *name == "from" {
                self.select(&what, Locator::XPath(&action_form(action, &format!("//select[@name='{name}']"))), value)
                    .await;
            } else {
                self.type_into(&what, Locator::XPath(&action_form(action, &format!("//input[@name='{name}']"))), value)
                    .await;
            }
        }
        self.click(&format!("Preview {action}"), Locator::XPath(&action_form(action, "//button[@type='submit']")))
            .await;
        self.wait_for(|at| at.starts_with(&format!("{page}/act?")), "Nothing has been written yet").await
    }

    /// Clicks the preview's Confirm button.
    async fn confirm(&self) {
        self.click("Confirm", Locator::XPath(CONFIRM)).await;
    }

    /// How many action forms the page offers.
    async fn action_forms(&self) -> u64 {
        self.script("return document.querySelectorAll('form input[name=\"action\"]').length;")
            .await
            .as_u64()
            .unwrap_or(0)
    }

    async fn assert_accessible(&self, page: &str) {
        let violations = axe_violations(self.client).await;
        let serious = serious_or_critical(&violations);
        let all: Vec<String> = violations.iter().map(ToString::to_string).collect();
        assert!(
            serious.is_empty(),
            "axe-core: {} serious or critical violations on the {page} ({}):\n{}",
            serious.len(),
            self.location().await,
            all.join("\n")
        );
        if !all.is_empty() {
            eprintln!("axe-core on the {page}, minor or moderate:\n{}", all.join("\n"));
        }
    }
}

fn last_word(text: &str) -> String {
    text.split_whitespace().last().unwrap_or_default().to_owned()
}

/// The Confirm button of a preview.
const CONFIRM: &str = "//form[.//input[@name='confirm']]//button[@type='submit']";

/// A form of the page, by the `action` field it posts (the batch page's and the matrix's
/// action forms all carry one).
fn action_form(action: &str, field: &str) -> String {
    format!("//form[.//input[@name='action' and @value='{action}']]{field}")
}

/// Whether some line of `text` names `component` and then `from` and then `to`.
fn names_change(text: &str, component: &str, from: &str, to: &str) -> bool {
    text.lines().any(|line| {
        line.find(component)
            .map(|at| &line[at + component.len()..])
            .and_then(|rest| rest.find(from).map(|at| &rest[at + from.len()..]))
            .is_some_and(|rest| rest.contains(to))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_overview_shows_the_demos_counts_per_component_and_state() {
    let demo = Demo::run();
    let states = demo.status();
    let (monitor, browser) = monitor_in_a_browser(&demo).await;
    let ui = Ui { client: browser.client(), base: &monitor.base };

    ui.goto("/").await;
    let components: BTreeSet<String> = states.values().flat_map(|row| row.keys().cloned()).collect();
    assert!(components.contains(COMPONENT), "{states:?}");
    let expected: BTreeMap<(String, String), u64> = components
        .iter()
        .flat_map(|c| STATES.map(|s| ((c.clone(), s.to_owned()), in_state(&states, c, s).len() as u64)))
        .collect();
    // The counts come from the batch index, which the components commit to as they go.
    let grid = poll("the overview's counts to equal autocomp status", async || {
        let mut grid = BTreeMap::new();
        for (href, text) in ui.count_links().await {
            let Some(key) = count_link(&href) else { continue };
            let count = text.parse::<u64>().map_err(|_| format!("count {text:?} of {href}"))?;
            assert!(grid.insert(key, count).is_none(), "two links for {href}");
        }
        let shown: BTreeMap<_, _> =
            grid.iter().filter(|((_, s), _)| s != "overdue").map(|(k, v)| (k.clone(), *v)).collect();
        if shown == expected { Ok(grid) } else { Err(format!("grid {shown:?}\nstatus {expected:?}")) }
    })
    .await;
    // Nothing has been ready or working for an hour in a demo a few seconds old.
    for component in &components {
        assert_eq!(grid.get(&(component.clone(), "overdue".into())), Some(&0), "{component}: {grid:?}");
    }
    let failed = grid[&(COMPONENT.to_owned(), "failed".to_owned())];
    assert!(failed > 0, "the demo fails some batches at {COMPONENT}: {grid:?}");
    ui.screenshot("overview.png").await;
    browser.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_failed_count_links_to_exactly_the_failed_batches() {
    let demo = Demo::run();
    let failed = failed_at_the_component(&demo.status());
    let (monitor, browser) = monitor_in_a_browser(&demo).await;
    let ui = Ui { client: browser.client(), base: &monitor.base };

    ui.goto("/").await;
    let target = (COMPONENT.to_owned(), "failed".to_owned());
    let href = poll("the failed count's link", async || {
        let links = ui.count_links().await;
        let found = links.iter().find(|(href, _)| count_link(href).as_ref() == Some(&target));
        found.map(|(href, _)| href.clone()).ok_or_else(|| format!("links: {links:?}"))
    })
    .await;
    ui.click("the failed count of checksum-verifier", Locator::Css(&format!("a[href='{href}']"))).await;
    let text = ui.wait_for(|at| at == href, "batches match").await;
    assert!(text.contains(&format!("{} batches match", failed.len())), "{text}");

    let (columns, rows) = ui.matrix().await;
    let column = columns.iter().position(|c| c == COMPONENT).unwrap_or_else(|| panic!("columns {columns:?}"));
    let listed: BTreeSet<String> = rows.iter().map(|(id, _)| id.clone()).collect();
    assert_eq!(listed, failed, "the matrix lists exactly the batches autocomp status has failed at {COMPONENT}");
    for (id, cells) in &rows {
        let cell = cells.get(column).map(|c| last_word(c));
        assert_eq!(cell.as_deref(), Some("failed"), "{id}: {cells:?} under {columns:?}");
    }
    ui.screenshot("matrix.png").await;
    browser.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_batch_page_names_the_failing_file() {
    let demo = Demo::run();
    let failed = failed_at_the_component(&demo.status());
    let (monitor, browser) = monitor_in_a_browser(&demo).await;
    let ui = Ui { client: browser.client(), base: &monitor.base };

    for (i, id) in failed.iter().enumerate() {
        let files = failing_files(&demo.show(id));
        assert!(!files.is_empty(), "{id}: the checksum report names a file");
        ui.goto(&format!("/batches/{id}")).await;
        let text = ui.wait_for(|at| at == format!("/batches/{id}"), id).await;
        // The log line shows the first failure; the full report (collapsed) has them all.
        assert!(text.contains(&files[0]), "{id}: the page does not show {}:\n{text}", files[0]);
        let source = ui.client.source().await.expect("page source");
        for file in &files {
            assert!(source.contains(file.as_str()), "{id}: the page does not name {file}");
        }
        assert_eq!(ui.batch_states().await.get(COMPONENT).map(String::as_str), Some("failed"), "{id}:\n{text}");
        if i == 0 {
            // The log line with the file, in view.
            let line = format!("//td[contains(., '{}')]", files[0]);
            let cell = ui.client.find(Locator::XPath(&line)).await.expect("the log line naming the file");
            let cell = serde_json::to_value(cell).expect("an element reference");
            ui.client.execute("arguments[0].scrollIntoView({ block: 'center' });", vec![cell]).await.expect("scrolled");
            ui.screenshot("batch.png").await;
        }
    }
    browser.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signed_in_rerun_is_previewed_confirmed_logged_and_run_again() {
    let demo = Demo::run();
    let id = failed_at_the_component(&demo.status()).into_iter().next().expect("a failed batch");
    let (monitor, browser) = monitor_in_a_browser(&demo).await;
    let ui = Ui { client: browser.client(), base: &monitor.base };
    let page = format!("/batches/{id}");
    let on_page = |at: &str| at == page;

    ui.goto(&page).await;
    ui.wait_for(on_page, "Sign in").await;
    ui.sign_in(&monitor.password).await;

    let before = events(&demo.show(&id));
    ui.select(
        "the rerun form's component",
        Locator::XPath(&action_form("rerun", "//select[@name='component']")),
        COMPONENT,
    )
    .await;
    ui.type_into("the rerun form's reason", Locator::XPath(&action_form("rerun", "//input[@name='reason']")), REASON)
        .await;
    ui.click("Preview rerun", Locator::XPath(&action_form("rerun", "//button[@type='submit']"))).await;
    let preview = ui.wait_for(|at| at.starts_with(&format!("{page}/act?")), "Preview").await;
    assert!(
        preview.contains(&format!("Reset (success) superseding {EVENT_TYPE}")),
        "the preview names the Reset:\n{preview}"
    );
    assert!(names_change(&preview, COMPONENT, "failed", "ready"), "the preview names the state change:\n{preview}");
    assert!(preview.contains(REASON), "{preview}");
    assert_eq!(events(&demo.show(&id)), before, "a preview writes nothing");
    ui.screenshot("preview.png").await;

    ui.click("Confirm", Locator::XPath("//form[.//input[@name='confirm']]//button[@type='submit']")).await;
    let agent = format!("operator:{OPERATOR}");
    poll("the Reset in the batch page's log", async || {
        let at = ui.location().await;
        let rows = ui.rows().await;
        let logged = rows
            .iter()
            .any(|cells| cells.iter().any(|c| c.split_whitespace().next() == Some("Reset")) && cells.contains(&agent));
        if on_page(&at) && logged { Ok(()) } else { Err(format!("at {at}: rows {rows:?}")) }
    })
    .await;
    let after = events(&demo.show(&id));
    assert_eq!(after.len(), before.len() + 1, "one event written: {after:#?}");
    assert_eq!(&after[..before.len()], &before[..], "earlier events unchanged");
    assert_reset(&after[before.len()]);
    assert_eq!(demo.show(&id)["components"][COMPONENT], "ready");

    let pass = demo.pass(COMPONENT);
    assert!(pass.stdout.contains(&id), "the pass took the batch again:\n{}", pass.show());
    let show = demo.show(&id);
    let outcome = events(&show).last().cloned().expect("events");
    assert_eq!(outcome["type"], EVENT_TYPE, "{show:#}");
    let expected = show["components"][COMPONENT].as_str().expect("a state").to_owned();
    // The bag is still broken.
    assert_eq!(expected, "failed", "{show:#}");
    ui.client.refresh().await.expect("reload");
    let seq = outcome["seq"].to_string();
    poll("the batch page to show the new result", async || {
        let states = ui.batch_states().await;
        let rows = ui.rows().await;
        let logged =
            rows.iter().any(|cells| cells.first() == Some(&seq) && cells.iter().any(|c| c.contains(EVENT_TYPE)));
        if states.get(COMPONENT) == Some(&expected) && logged {
            Ok(())
        } else {
            Err(format!("states {states:?}, log rows {rows:?}"))
        }
    })
    .await;
    // The matrix cell says the same.
    ui.goto(&format!("/batches?q={id}")).await;
    let (columns, rows) = ui.matrix().await;
    let column = columns.iter().position(|c| c == COMPONENT).expect("the component's column");
    let cells = &rows.iter().find(|(row, _)| *row == id).unwrap_or_else(|| panic!("{id} in {rows:?}")).1;
    assert_eq!(cells.get(column).map(|c| last_word(c)), Some(expected), "{cells:?}");
    browser.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bulk_rerun_over_a_filter_resets_exactly_its_batches_once() {
    let demo = Demo::run();
    let states = demo.status();
    let failed = failed_at_the_component(&states);
    let before = demo.logs(states.keys().cloned());
    let (monitor, browser) = monitor_in_a_browser(&demo).await;
    let ui = Ui { client: browser.client(), base: &monitor.base };

    let list = format!("/batches?q=component%3A{COMPONENT}+state%3Afailed");
    ui.goto(&list).await;
    ui.wait_for(|at| at == list, "batches match").await;
    ui.sign_in(&monitor.password).await;
    ui.click("the bulk actions", Locator::XPath("//details[.//input[@name='action']]/summary")).await;
    let form = |field: &str| action_form("rerun", field);
    ui.select("the bulk rerun's component", Locator::XPath(&form("//select[@name='component']")), COMPONENT).await;
    ui.type_into("the bulk rerun's reason", Locator::XPath(&form("//input[@name='reason']")), REASON).await;
    ui.click("Preview rerun", Locator::XPath(&form("//button[@type='submit']"))).await;

    let preview = ui.wait_for(|at| at.starts_with("/bulk?"), "Preview").await;
    let address = ui.location().await;
    let heading = ui.script("return document.querySelector('h1').innerText;").await;
    assert!(
        heading.as_str().is_some_and(|h| h.contains(&format!("on {} batches", failed.len()))),
        "the preview counts the {} failed batches: {heading}\n{preview}",
        failed.len()
    );
    let sample: Vec<Vec<String>> =
        ui.rows().await.into_iter().filter(|cells| cells.first().is_some_and(|id| failed.contains(id))).collect();
    assert!(!sample.is_empty(), "the preview shows a sample of the batches:\n{preview}");
    for cells in &sample {
        let row = cells.join(" | ");
        assert!(row.contains(&format!("Reset (success) superseding {EVENT_TYPE}")), "{row}");
        assert!(names_change(&row, COMPONENT, "failed", "ready"), "{row}");
    }
    assert_eq!(demo.logs(states.keys().cloned()), before, "a preview writes nothing");
    ui.screenshot("bulk-preview.png").await;

    ui.click("Confirm", Locator::XPath("//form[.//input[@name='confirm']]//button[@type='submit']")).await;
    ui.wait_for(|at| at == list, &format!("{} performed", failed.len())).await;
    let after = demo.logs(states.keys().cloned());
    for (id, events) in &after {
        let earlier = &before[id];
        if failed.contains(id) {
            assert_eq!(events.len(), earlier.len() + 1, "{id}: one Reset: {events:#?}");
            assert_eq!(&events[..earlier.len()], &earlier[..], "{id}: earlier events unchanged");
            assert_reset(&events[earlier.len()]);
        } else {
            assert_eq!(events, earlier, "{id} is not in the filter: nothing written");
        }
    }
    let now = demo.status();
    assert_eq!(in_state(&now, COMPONENT, "ready"), failed, "the rerun batches are ready again");

    // Back to the preview: asked for again, it says on how many batches it was done (they
    // have left the filter since), and offers nothing to confirm.
    ui.client.back().await.expect("Back");
    let text = ui.wait_for(|at| at == address, "Done: ").await;
    assert!(text.contains(&format!("its confirm recorded rerun on {} batches", failed.len())), "{text}");
    assert!(ui.client.find(Locator::XPath(CONFIRM)).await.is_err(), "no Confirm button:\n{text}");
    ui.assert_accessible("bulk preview reached again after its confirm").await;
    assert_eq!(demo.logs(states.keys().cloned()), after, "Back wrote nothing");
    browser.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_without_an_operators_session_or_from_another_site_are_refused_and_change_nothing() {
    let demo = Demo::run();
    let states = demo.status();
    let id = failed_at_the_component(&states).into_iter().next().expect("a failed batch");
    let monitor = Monitor::start(&demo).await;
    let http = http();
    let act = monitor.url(&format!("/batches/{id}/act"));
    let bulk = monitor.url("/bulk");
    let one_form = [("action", "rerun"), ("component", COMPONENT), ("reason", REASON), ("confirm", "1")];
    let filter = format!("component:{COMPONENT} state:failed");
    let bulk_form =
        [("action", "rerun"), ("component", COMPONENT), ("reason", REASON), ("q", filter.as_str()), ("confirm", "1")];
    let head = demo.head().await;
    let logs = demo.logs(states.keys().cloned());
    let unchanged = async |what: &str| {
        assert_eq!(demo.head().await, head, "{what}: the store's head moved");
    };

    // Not signed in: no cookie, the old editable name cookie, a session id never issued.
    let forged = format!("autocomp_session={}", "5a".repeat(32));
    for cookie in [None, Some("autocomp_token=guess; autocomp_operator=the-director".to_owned()), Some(forged)] {
        for (url, form) in [(&act, &one_form[..]), (&bulk, &bulk_form[..])] {
            let mut request = http.post(url).form(form);
            if let Some(cookie) = &cookie {
                request = request.header("cookie", cookie);
            }
            let response = request.send().await.expect("the monitor answers");
            let status = response.status();
            let body = response.text().await.unwrap_or_default();
            assert_eq!(status, StatusCode::UNAUTHORIZED, "POST {url} with cookie {cookie:?}: {status}\n{body}");
            unchanged(&format!("POST {url} with cookie {cookie:?}")).await;
        }
    }
    // A wrong password does not sign in.
    let wrong = http
        .post(monitor.url("/login"))
        .form(&[("name", OPERATOR), ("password", "not-the-password"), ("next", "/")])
        .send();
    let wrong = wrong.await.expect("the monitor answers");
    assert_eq!(wrong.status(), StatusCode::UNAUTHORIZED);
    assert!(
        wrong.headers().get_all("set-cookie").iter().all(|c| !c.to_str().unwrap_or("").contains("autocomp_session="))
    );

    // Signed in: the cookie of a real sign-in.
    let login =
        http.post(monitor.url("/login")).form(&[("name", OPERATOR), ("password", &monitor.password), ("next", "/")]);
    let login = login.send().await.expect("the monitor answers");
    assert_eq!(login.status(), StatusCode::SEE_OTHER, "sign-in redirects");
    let cookies: Vec<String> = login
        .headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|c| c.to_str().ok()?.split(';').next().map(str::to_owned))
        .collect();
    assert!(cookies.iter().any(|c| c.starts_with("autocomp_session=")), "{cookies:?}");
    let cookie = cookies.join("; ");

    for (header, value) in [("origin", "http://evil.example"), ("sec-fetch-site", "cross-site")] {
        for (url, form) in [(&act, &one_form[..]), (&bulk, &bulk_form[..])] {
            let response =
                http.post(url).header("cookie", &cookie).header(header, value).form(form).send().await.expect("answer");
            let status = response.status();
            let body = response.text().await.unwrap_or_default();
            assert_eq!(status, StatusCode::FORBIDDEN, "POST {url} with {header}: {value}\n{body}");
            assert!(body.to_lowercase().contains("nothing was changed"), "{body}");
            unchanged(&format!("POST {url} with {header}: {value}")).await;
        }
    }
    // A page of another name for this address (DNS rebinding) reads nothing.
    let rebound = http.get(monitor.url("/batches.csv")).header("host", "evil.example").send().await.expect("answer");
    assert_eq!(rebound.status(), StatusCode::MISDIRECTED_REQUEST);
    assert_eq!(demo.logs(states.keys().cloned()), logs, "no batch's log changed");

    // The control: the same cookie from the monitor's own page is let through.
    let own = |form: &[(&str, &str)]| {
        http.post(&act)
            .header("cookie", &cookie)
            .header("origin", &monitor.base)
            .header("sec-fetch-site", "same-origin")
            .form(form)
            .send()
    };
    let asked = own(&one_form[..3]).await.expect("answer");
    assert_eq!(asked.status(), StatusCode::SEE_OTHER, "a preview is a redirect to its address");
    let address = asked.headers()["location"].to_str().expect("a location").to_owned();
    assert!(address.starts_with(&format!("/batches/{id}/act?")), "{address}");
    let preview = http
        .get(monitor.url(&address))
        .header("cookie", &cookie)
        .header("sec-fetch-site", "same-origin")
        .send()
        .await
        .expect("answer");
    assert_eq!(preview.status(), StatusCode::OK);
    assert_eq!(preview.headers()["cache-control"], "no-store");
    let fields = confirm_fields(&preview.text().await.expect("the preview"));
    // The preview's address, opened from another site's page: refused as its POST is.
    let elsewhere = http
        .get(monitor.url(&address))
        .header("cookie", &cookie)
        .header("sec-fetch-site", "cross-site")
        .send()
        .await
        .expect("answer");
    assert_eq!(elsewhere.status(), StatusCode::FORBIDDEN);
    unchanged("a preview").await;
    let fields: Vec<(&str, &str)> = fields.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
    let done = own(&fields).await.expect("answer");
    assert_eq!(done.status(), StatusCode::SEE_OTHER, "{}", done.text().await.unwrap_or_default());
    assert_eq!(demo.head().await, head + 1, "the confirmed rerun wrote one event");
    assert_reset(events(&demo.show(&id)).last().expect("events"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_viewer_cannot_act_and_forged_signed_out_or_expired_sessions_are_refused() {
    let demo = Demo::run();
    let states = demo.status();
    let id = failed_at_the_component(&states).into_iter().next().expect("a failed batch");
    let (monitor, browser) = monitor_in_a_browser(&demo).await;
    let ui = Ui { client: browser.client(), base: &monitor.base };
    let http = http();
    let page = format!("/batches/{id}");
    let act = monitor.url(&format!("{page}/act"));
    let form = [("action", "rerun"), ("component", COMPONENT), ("reason", REASON), ("confirm", "1")];
    let head = demo.head().await;
    let post = async |cookie: &str| {
        let response = http.post(&act).header("cookie", cookie).form(&form).send().await.expect("answer");
        let status = response.status();
        (status, response.text().await.unwrap_or_default())
    };

    // A viewer reads the batch and is offered nothing to do.
    ui.goto(&page).await;
    ui.wait_for(|at| at == page, "Sign in").await;
    ui.sign_in_as(VIEWER, &monitor.password).await;
    let text = ui.wait_for(|at| at == page, "may read but not act").await;
    assert!(text.contains(&format!("Signed in as {VIEWER} (viewer)")), "{text}");
    assert_eq!(ui.action_forms().await, 0, "no action forms for a viewer:\n{text}");
    ui.goto(&format!("/batches?q=component%3A{COMPONENT}+state%3Afailed")).await;
    ui.wait_for(|at| at.starts_with("/batches?"), "batches match").await;
    assert_eq!(ui.action_forms().await, 0, "no bulk action forms for a viewer");
    ui.screenshot("viewer.png").await;
    // Its session, posted anyway, is refused.
    let viewer = ui.session_cookie().await;
    let (status, body) = post(&viewer).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert!(body.contains("needs the operator role"), "{body}");
    assert_eq!(demo.head().await, head, "a viewer wrote nothing");

    // Signed out, the very same cookie is worthless: the session is gone server-side.
    ui.click("Sign out", Locator::Css("form[action='/logout'] button[type='submit']")).await;
    ui.wait_for(|at| at == "/", "Sign in").await;
    let (status, body) = post(&viewer).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "a signed-out session replayed: {body}");

    // A forged session cookie in the browser signs nobody in.
    // (Set by a script: the page's own cookie is gone since signing out.)
    let forged = "c0ffee".repeat(10) + "c0ff";
    let set = ui
        .script(&format!(
            "document.cookie = 'autocomp_session={forged}; path=/; SameSite=Strict'; return document.cookie;"
        ))
        .await;
    assert!(set.as_str().is_some_and(|cookies| cookies.contains(&forged)), "the browser holds it: {set}");
    ui.goto(&page).await;
    let text = ui.wait_for(|at| at == page, "Sign in").await;
    assert!(!text.contains("Signed in as"), "{text}");
    assert_eq!(ui.action_forms().await, 0);
    let (status, _) = post(&format!("autocomp_session={forged}")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    // An operator's session on a monitor whose sessions last 3 s: refused once it expired.
    let short = Monitor::start_with(&demo, &["--session-max-age", "3s"]).await;
    let ui = Ui { client: browser.client(), base: &short.base };
    ui.goto(&page).await;
    ui.wait_for(|at| at == page, "Sign in").await;
    ui.sign_in(&short.password).await;
    assert!(ui.action_forms().await > 0, "an operator is offered the actions");
    let operator = ui.session_cookie().await;
    poll("the session to expire", async || {
        ui.client.refresh().await.map_err(|e| e.to_string())?;
        let text = ui.text().await;
        if text.contains("Signed in as") { Err(text) } else { Ok(()) }
    })
    .await;
    let short_act = short.url(&format!("{page}/act"));
    let response = http.post(&short_act).header("cookie", &operator).form(&form).send().await.expect("answer");
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED, "an expired session");
    assert_eq!(demo.head().await, head, "nothing written by any refused request");
    browser.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn axe_finds_nothing_serious_on_the_pages() {
    let demo = Demo::run();
    let id = failed_at_the_component(&demo.status()).into_iter().next().expect("a failed batch");
    let (monitor, browser) = monitor_in_a_browser(&demo).await;
    let ui = Ui { client: browser.client(), base: &monitor.base };

    let list = format!("/batches?q=component%3A{COMPONENT}+state%3Afailed");
    let page = format!("/batches/{id}");
    for (name, path, needle) in
        [("overview", "/", "Overview"), ("matrix", list.as_str(), "batches match"), ("batch page", &page, "Log")]
    {
        ui.goto(path).await;
        ui.wait_for(|at| at == path, needle).await;
        ui.assert_accessible(name).await;
    }
    // Signed in, the pages carry the action forms.
    ui.sign_in(&monitor.password).await;
    ui.assert_accessible("batch page, signed in").await;
    ui.goto("/login").await;
    ui.wait_for(|at| at == "/login", "Password").await;
    ui.assert_accessible("sign-in form").await;
    ui.goto(&list).await;
    ui.wait_for(|at| at == list, "batches match").await;
    ui.click("the bulk actions", Locator::XPath("//details[.//input[@name='action']]/summary")).await;
    ui.assert_accessible("matrix, signed in, bulk actions open").await;
    browser.close().await;
}

/// Signs in over plain HTTP; the status.
async fn sign_in_status(monitor: &Monitor, name: &str, password: &str) -> StatusCode {
    let login = http().post(monitor.url("/login")).form(&[("name", name), ("password", password), ("next", "/")]);
    login.send().await.expect("the monitor answers").status()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accounts_are_added_rotated_and_removed_while_the_monitor_runs() {
    let demo = Demo::run();
    // The polls below fail sign-ins on purpose, more than the default limit allows.
    let monitor = Monitor::start_with(&demo, &["--sign-in-failures", "1000"]).await;
    let users_file = demo.dir.path().join("monitor.users");
    let before = std::fs::read_to_string(&users_file).expect("the users file");
    let replace = |text: &str| {
        // As an operator should: a new file renamed over the old one.
        let next = demo.dir.path().join("monitor.users.new");
        std::fs::write(&next, text).expect("the new users file");
        std::fs::rename(&next, &users_file).expect("renamed over");
    };
    let new_password = "a brand new passphrase";
    assert_eq!(sign_in_status(&monitor, "Jürgen", new_password).await, StatusCode::UNAUTHORIZED);
    let with_jurgen = format!("{before}{}\n", users_line("Jürgen", "viewer", new_password));
    replace(&with_jurgen);
    poll("the added account to sign in (file watched)", async || {
        match sign_in_status(&monitor, "Jürgen", new_password).await {
            StatusCode::SEE_OTHER => Ok(()),
            other => Err(format!("sign-in answers {other}")),
        }
    })
    .await;
    // Rotated: alice's line gets a new hash, and the monitor is told with SIGHUP.
    let login = http()
        .post(monitor.url("/login"))
        .form(&[("name", OPERATOR), ("password", &monitor.password), ("next", "/")])
        .send()
        .await
        .expect("answer");
    let session = login.headers()["set-cookie"].to_str().expect("a cookie").split(';').next().expect("").to_owned();
    let rotated = with_jurgen
        .lines()
        .map(|line| {
            if line.starts_with(&format!("{OPERATOR} ")) {
                users_line(OPERATOR, "operator", new_password)
            } else {
                line.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    replace(&format!("{rotated}\n"));
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(monitor.child.id() as i32, libc::SIGHUP) }, 0);
    poll("the new password to work and the old one not", async || {
        let new = sign_in_status(&monitor, OPERATOR, new_password).await;
        let old = sign_in_status(&monitor, OPERATOR, &monitor.password).await;
        if (new, old) == (StatusCode::SEE_OTHER, StatusCode::UNAUTHORIZED) {
            Ok(())
        } else {
            Err(format!("new {new}, old {old}"))
        }
    })
    .await;
    let page = http().get(monitor.url("/")).header("cookie", &session).send().await.expect("answer");
    let text = page.text().await.unwrap_or_default();
    assert!(!text.contains("Signed in as"), "the session of the old password ended:\n{text}");
    // Removed: Jürgen's line is gone (the others stay).
    let removed: Vec<&str> = rotated.lines().filter(|line| !line.starts_with("Jürgen ")).collect();
    replace(&format!("{}\n", removed.join("\n")));
    poll("the removed account to be refused", async || match sign_in_status(&monitor, "Jürgen", new_password).await {
        StatusCode::UNAUTHORIZED => Ok(()),
        other => Err(format!("sign-in answers {other}")),
    })
    .await;
    // A broken file keeps the accounts before it, and says so.
    replace("this is not a users file\n");
    poll("the broken file to be reported", async || {
        let log = monitor.log_text();
        if log.contains("the users file changed but cannot be used, so the one read before stays in force") {
            Ok(())
        } else {
            Err(log)
        }
    })
    .await;
    assert_eq!(sign_in_status(&monitor, VIEWER, &monitor.password).await, StatusCode::SEE_OTHER);
}

#[test]
fn the_binary_refuses_removed_or_unsafe_configurations_before_serving() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let users = dir.path().join("users");
    std::fs::write(&users, "mallory operator $2b$12$notargon2notargon2notar\n").expect("users file");
    let users = users.to_str().expect("a UTF-8 path");
    let cases: [(&[&str], &str); 5] = [
        (&["--token-file", "/dev/null"], "--token-file (or $AUTOCOMP_MONITOR_TOKEN_FILE) was removed"),
        (&["--users", users], "line 1: the hash of \"mallory\" is refused"),
        (&["--listen", "0.0.0.0:7072", "--public-reads"], "needs --host-name"),
        (&["--listen", "192.0.2.1:7072", "--host-name", "mon.example"], "reads need sign-in"),
        (&["--trusted-user-header", "X-Remote-User", "--trusted-proxy", "127.0.0.1"], "needs --users"),
    ];
    for (args, words) in cases {
        let mut command = command("autocomp-monitor");
        command.args(args).arg("--config-dir").arg(dir.path());
        let done = run(command, Duration::from_secs(30));
        assert_eq!(done.code, Some(2), "{args:?}\n{}", done.show());
        assert!(done.stderr.contains(words), "{args:?} should say {words:?}\n{}", done.show());
    }
    // A short password is never hashed, nor echoed.
    let mut short = command("autocomp-monitor");
    short.arg("hash-password").stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = short.spawn().expect("hash-password starts");
    use std::io::Write as _;
    child.stdin.take().expect("stdin").write_all(b"eleven-char\n").expect("written");
    let done = finish(child, Duration::from_secs(30));
    assert_eq!(done.code, Some(2), "{}", done.show());
    assert!(done.stderr.contains("at least 12") && !done.stderr.contains("eleven-char"), "{}", done.show());
    assert!(done.stdout.is_empty());
}

/// The events of the batch's log after the first `before`, from `show`.
fn new_events(demo: &Demo, id: &str, before: usize) -> Vec<Value> {
    events(&demo.show(id)).split_off(before)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tabs_preview_one_cancel_and_only_the_first_confirm_acts() {
    let demo = Demo::run();
    let id = failed_at_the_component(&demo.status()).into_iter().next().expect("a failed batch");
    let generation = demo.claim(&id, COMPONENT).await;
    let (monitor, browser) = monitor_in_a_browser(&demo).await;
    let ui = Ui { client: browser.client(), base: &monitor.base };
    let page = format!("/batches/{id}");
    ui.goto(&page).await;
    ui.wait_for(|at| at == page, "Sign in").await;
    ui.sign_in(&monitor.password).await;
    let cancel = [("component", COMPONENT), ("reason", REASON)];
    let planned = format!("cancelled run {generation} of {COMPONENT}");

    // Tab A previews the cancel; tab B (same session) previews it too.
    let tab_a = ui.client.window().await.expect("the first tab");
    let preview = ui.preview(&page, "cancel", &cancel).await;
    assert!(preview.contains(&planned), "{preview}");
    let tab_b = ui.client.new_window(true).await.expect("a second tab").handle;
    ui.client.switch_to_window(tab_b).await.expect("to the second tab");
    ui.goto(&page).await;
    ui.wait_for(|at| at == page, &format!("Signed in as {OPERATOR}")).await;
    let preview = ui.preview(&page, "cancel", &cancel).await;
    assert!(preview.contains(&planned), "{preview}");
    let (before, head) = (events(&demo.show(&id)).len(), demo.head().await);
    assert_eq!(demo.show(&id)["components"][COMPONENT], "working");

    // Tab B confirms: the run is cancelled, the batch page says what was recorded.
    ui.confirm().await;
    let text = ui.wait_for(|at| at == page, &planned).await;
    assert!(text.contains(&format!("recorded {EVENT_TYPE} (seq {}, failure, flagged cancelled)", head + 1)), "{text}");
    assert_eq!(demo.head().await, head + 1, "one event");

    // Tab A confirms what it previewed: the batch changed, nothing is done, and the preview
    // is shown again as the batch is now, where there is nothing to cancel.
    ui.client.switch_to_window(tab_a).await.expect("back to the first tab");
    ui.confirm().await;
    let text =
        ui.wait_for(|at| at.starts_with(&format!("{page}/act?")), "nothing was done; review and confirm again").await;
    assert!(text.contains("the batch changed since your preview (seq "), "{text}");
    assert!(text.contains(&format!("{COMPONENT} has no open run on {id}: nothing to cancel")), "{text}");
    assert!(ui.client.find(Locator::XPath(CONFIRM)).await.is_err(), "nothing to confirm:\n{text}");
    ui.screenshot("changed-since-preview.png").await;
    let written = new_events(&demo, &id, before);
    assert_eq!(written.len(), 1, "one event in all: {written:#?}");
    assert_eq!(
        (written[0]["type"].as_str(), written[0]["details"]["cancelled"].as_bool()),
        (Some(EVENT_TYPE), Some(true))
    );
    assert_eq!(demo.head().await, head + 1, "the second confirm wrote nothing");
    browser.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_confirm_records_once_double_clicked_or_resubmitted_and_back_shows_it_done() {
    let demo = Demo::run();
    let id = failed_at_the_component(&demo.status()).into_iter().next().expect("a failed batch");
    let (monitor, browser) = monitor_in_a_browser(&demo).await;
    let ui = Ui { client: browser.client(), base: &monitor.base };
    let page = format!("/batches/{id}");
    ui.goto(&page).await;
    ui.wait_for(|at| at == page, "Sign in").await;
    ui.sign_in(&monitor.password).await;

    // A double click on Confirm: two clicks as the mouse makes them.
    ui.preview(&page, "prioritize", &[("priority", "7"), ("reason", REASON)]).await;
    let (before, head) = (events(&demo.show(&id)).len(), demo.head().await);
    let button =
        poll("the Confirm button", async || ui.client.find(Locator::XPath(CONFIRM)).await.map_err(|e| e.to_string()))
            .await;
    let click = || [PointerAction::Down { button: MOUSE_BUTTON_LEFT }, PointerAction::Up { button: MOUSE_BUTTON_LEFT }];
    let mut mouse = MouseActions::new("mouse".into()).then(PointerAction::MoveToElement {
        element: button,
        duration: None,
        x: 0.0,
        y: 0.0,
    });
    for action in click().into_iter().chain(click()) {
        mouse = mouse.then(action);
    }
    ui.client.perform_actions(mouse).await.expect("the double click");
    let text = ui.wait_for(|at| at == page, "priority 0 -> 7").await;
    let written = new_events(&demo, &id, before);
    assert_eq!(written.len(), 1, "one event for a double click: {written:#?}\n{text}");
    let seq = written[0]["seq"].as_i64().expect("a seq");
    assert_eq!(written[0]["type"], "Prioritized");
    assert_eq!(demo.head().await, head + 1);

    // A double submit the browser surely sends twice: the same form posted twice at once.
    // (`form.action` would be the form's `action` field: the attribute is the URL.)
    ui.preview(&page, "prioritize", &[("priority", "8"), ("reason", REASON)]).await;
    let (before, head) = (events(&demo.show(&id)).len(), demo.head().await);
    let statuses = ui
        .script(
            "const form = document.evaluate(\"//form[.//input[@name='confirm']]\", document, null, \
               XPathResult.FIRST_ORDERED_NODE_TYPE, null).singleNodeValue;\
             const post = () => fetch(form.getAttribute('action'), \
               { method: 'POST', body: new URLSearchParams(new FormData(form)) }).then(r => r.status);\
             return Promise.all([post(), post()]);",
        )
        .await;
    assert_eq!(statuses, serde_json::json!([200, 200]), "both answered (after their redirect)");
    let written = new_events(&demo, &id, before);
    assert_eq!(written.len(), 1, "one event for a double submit: {written:#?}");
    assert_eq!(demo.head().await, head + 1);

    // Confirmed, then Back to the preview: the browser asks for the preview's address again
    // and the page says it is done, what was recorded, and offers no Confirm; nothing more
    // is written. Reloaded, and Forward then Back again, it says the same.
    ui.goto(&page).await;
    ui.wait_for(|at| at == page, "priority 7 -> 8").await;
    ui.preview(&page, "prioritize", &[("priority", "9"), ("reason", REASON)]).await;
    let address = ui.location().await;
    let before = events(&demo.show(&id)).len();
    ui.confirm().await;
    ui.wait_for(|at| at == page, "priority 8 -> 9").await;
    let written = new_events(&demo, &id, before);
    assert_eq!(written.len(), 1, "{written:#?}");
    let seq_9 = written[0]["seq"].as_i64().expect("a seq");
    assert!(seq_9 > seq);
    let at = written[0]["at"].as_str().expect("a time").to_owned();
    let head = demo.head().await;
    let done = format!("Done: Prioritized (success), seq {seq_9}, by operator:{OPERATOR} at {at}.");
    ui.client.back().await.expect("Back");
    let text = ui.wait_for(|at| at == address, "Done: ").await;
    assert!(text.contains(&done), "the preview reached with Back says it is done: {done:?}\n{text}");
    assert!(!text.contains("Nothing has been written yet"), "not the old preview:\n{text}");
    assert!(ui.client.find(Locator::XPath(CONFIRM)).await.is_err(), "no Confirm button:\n{text}");
    let forms = ui.script("return document.querySelectorAll('form input[name=\"confirm\"]').length;").await;
    assert_eq!(forms, serde_json::json!(0), "no confirm form:\n{text}");
    ui.screenshot("back-after-confirm.png").await;
    ui.client.refresh().await.expect("reload");
    let text = ui.wait_for(|at| at == address, "Done: ").await;
    assert!(text.contains(&done) && ui.client.find(Locator::XPath(CONFIRM)).await.is_err(), "{text}");
    ui.client.forward().await.expect("Forward");
    ui.wait_for(|at| at == page, "Log").await;
    ui.client.back().await.expect("Back again");
    let text = ui.wait_for(|at| at == address, "Done: ").await;
    assert!(text.contains(&done) && ui.client.find(Locator::XPath(CONFIRM)).await.is_err(), "{text}");
    assert_eq!(demo.head().await, head, "Back, reload and Forward wrote nothing");
    assert_eq!(new_events(&demo, &id, before).len(), 1);
    assert_eq!(demo.show(&id)["priority"], 9);
    browser.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_pauses_a_component_and_an_operator_approves_a_batch_at_a_human_step() {
    let demo = Demo::run();
    demo.cli(&[
        "step",
        "add",
        "review",
        "--event-type",
        "Reviewed",
        "--requires",
        "Data_Archived",
        "--reason",
        "a person looks at every archived bag",
    ]);
    let waiting = in_state(&demo.status(), "review", "person");
    assert!(!waiting.is_empty(), "the archived batches wait for a person at review: {:?}", demo.status());
    let accounts = [(OPERATOR, "operator"), (VIEWER, "viewer"), (ADMIN, "admin")];
    let monitor = Monitor::start_with_accounts(&demo, &accounts, &[]).await;
    let browser = Browser::start().await;
    let ui = Ui { client: browser.client(), base: &monitor.base };

    // The admin pauses the component with its row's Pause button.
    ui.goto("/").await;
    ui.wait_for(|at| at == "/", "Steering").await;
    ui.sign_in_as(ADMIN, &monitor.password).await;
    let row = |field: &str| format!("//form[.//input[@name='component' and @value='{COMPONENT}']]{field}");
    ui.type_into("the component's steering reason", Locator::XPath(&row("//input[@name='reason']")), REASON).await;
    ui.click("Pause", Locator::XPath(&row("//button[@value='pause']"))).await;
    let preview = ui.wait_for(|at| at.starts_with("/steer?"), "Nothing has been written yet").await;
    assert!(preview.contains(&format!("Will record: paused {COMPONENT}.")), "{preview}");
    assert!(preview.contains("steering version 0"), "{preview}");
    let steering = demo.store().await.steering().await.expect("the steering reads");
    assert_eq!(steering.version, 0, "a preview steers nothing");
    ui.screenshot("steer-preview.png").await;
    ui.confirm().await;
    let text = ui.wait_for(|at| at == "/", &format!("recorded at steering version 1: paused {COMPONENT}")).await;
    assert!(text.contains(&format!("operator:{ADMIN}")), "{text}");
    let steering = demo.store().await.steering().await.expect("the steering reads");
    let hold = steering.components.get(&ComponentName::new(COMPONENT).expect("a name")).expect("a hold");
    assert_eq!(format!("{:?}", hold.kind), "Pause");
    assert_eq!((hold.by.to_string(), hold.reason.as_str()), (format!("operator:{ADMIN}"), REASON));
    assert_eq!(steering.version, 1);
    ui.assert_accessible("overview, signed in as an admin").await;
    ui.screenshot("steered.png").await;
    // Back to the preview: done, nothing to confirm, nothing written.
    ui.client.back().await.expect("Back");
    let text = ui.wait_for(|at| at.starts_with("/steer?"), "Done: ").await;
    assert!(text.contains(&format!("Done: paused {COMPONENT}, steering version 1")), "{text}");
    assert!(ui.client.find(Locator::XPath(CONFIRM)).await.is_err(), "no Confirm button:\n{text}");
    assert_eq!(demo.store().await.steering().await.expect("the steering reads").version, 1);

    // An operator sees the hold and no steering buttons; approves a batch waiting at review.
    ui.goto("/").await;
    ui.wait_for(|at| at == "/", "Sign out").await;
    ui.click("Sign out", Locator::Css("form[action='/logout'] button[type='submit']")).await;
    ui.wait_for(|at| at == "/", "Sign in").await;
    ui.sign_in(&monitor.password).await;
    let text = ui.wait_for(|at| at == "/", "need the admin role").await;
    assert!(text.contains("paused"), "{text}");
    let steer_forms = ui.script("return document.querySelectorAll('form[action=\"/steer\"]').length;").await;
    assert_eq!(steer_forms, serde_json::json!(0), "no steering forms for an operator:\n{text}");
    ui.click("the waiting list", Locator::Css("main a[href='/waiting']")).await;
    let text = ui.wait_for(|at| at == "/waiting", "wait for a person at review").await;
    assert!(text.contains(&format!("{} batches wait for a person at review", waiting.len())), "{text}");
    let first = ui
        .script("return document.querySelector('main table tbody th a').innerText.trim();")
        .await
        .as_str()
        .expect("a batch link")
        .to_owned();
    assert!(waiting.contains(&first), "{first} is one of {waiting:?}");
    ui.assert_accessible("the waiting list").await;
    ui.click("the first waiting batch", Locator::Css("main table tbody th a")).await;
    let page = format!("/batches/{first}");
    let text = ui.wait_for(|at| at == page, "Waiting for a person at review").await;
    assert!(text.contains("Evidence for review") && text.contains("Data_Archived"), "{text}");
    ui.assert_accessible("batch page waiting for a person").await;
    ui.screenshot("decision.png").await;
    let before = events(&demo.show(&first));
    let preview = ui.preview(&page, "approve", &[("reason", REASON)]).await;
    assert!(preview.contains("Will record Reviewed (success)"), "{preview}");
    assert!(names_change(&preview, "review", "person", "success"), "{preview}");
    assert_eq!(events(&demo.show(&first)), before, "a preview writes nothing");
    ui.confirm().await;
    ui.wait_for(|at| at == page, "approved at review").await;
    let show = demo.show(&first);
    let after = events(&show);
    assert_eq!(after.len(), before.len() + 1, "one event: {after:#?}");
    let approval = &after[before.len()];
    assert_eq!((approval["type"].as_str(), approval["outcome"].as_str()), (Some("Reviewed"), Some("success")));
    assert_eq!(approval["agent"], format!("operator:{OPERATOR}"), "{approval:#}");
    assert_eq!(approval["details"]["reason"], REASON, "{approval:#}");
    assert_eq!(approval["details"]["approved"], true, "{approval:#}");
    assert_eq!(show["components"]["review"], "success", "{show:#}");
    let left = in_state(&demo.status(), "review", "person");
    assert_eq!(left.len(), waiting.len() - 1, "{left:?}");
    browser.close().await;
}

/// Sends a Chrome DevTools Protocol command to the browser's page through ChromeDriver's
/// `goog/cdp/execute` (what fantoccini has no call for: device metrics, emulated media).
async fn devtools(browser: &Browser, command: &str, params: Value) {
    let session = browser.client().session_id().await.expect("the session id").expect("a session");
    let url = format!("{}/session/{session}/goog/cdp/execute", browser.webdriver_url());
    let body = serde_json::json!({ "cmd": command, "params": params }).to_string();
    let response = http()
        .post(&url)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(body)
        .send()
        .await
        .unwrap_or_else(|e| panic!("{command}: {e}"));
    let status = response.status();
    let text = response.text().await.unwrap_or_default();
    assert_eq!(status, StatusCode::OK, "{command}: {text}");
}

/// A phone's width: every page fits 400 px (wide tables scroll inside their own region, never
/// the page), in the light and the dark theme, which `prefers-color-scheme` picks; the alerts
/// page passes axe in both. Screenshots of each page at 400 px, light and dark.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_page_fits_a_400_px_screen_in_light_and_dark_and_the_alerts_page_is_accessible() {
    let demo = Demo::run();
    let id = failed_at_the_component(&demo.status()).into_iter().next().expect("a failed batch");
    // A human step: the waiting list has a table, and with everything ready (or waiting for a
    // person) overdue at once, the alerts page has its batches to list.
    let step = ["step", "add", "review", "--event-type", "Reviewed", "--requires", "Data_Archived", "--reason", "look"];
    demo.cli(&step);
    assert!(!in_state(&demo.status(), "review", "person").is_empty(), "{:?}", demo.status());
    let monitor = Monitor::start_with(&demo, &["--ready-overdue-after", "0s"]).await;
    let browser = Browser::start().await;
    let ui = Ui { client: browser.client(), base: &monitor.base };
    let metrics = serde_json::json!({ "width": 400, "height": 860, "deviceScaleFactor": 1, "mobile": false });
    devtools(&browser, "Emulation.setDeviceMetricsOverride", metrics).await;

    let list = format!("/batches?q=component%3A{COMPONENT}+state%3Afailed");
    let page = format!("/batches/{id}");
    let pages = [
        ("overview", "/", "Overview"),
        ("graph", "/graph", "Pipeline graph"),
        ("matrix", list.as_str(), "batches match"),
        ("batch", page.as_str(), "Log"),
        ("waiting", "/waiting", "Waiting for a person"),
        ("alerts", "/alerts", "Alerts"),
        ("login", "/login", "Password"),
    ];
    // The page's width, and the width it has beside a vertical scrollbar (at most 400).
    const WIDTHS: &str = "return [window.innerWidth, document.documentElement.scrollWidth, \
                          window.matchMedia('(prefers-color-scheme: dark)').matches, \
                          getComputedStyle(document.body).backgroundColor, \
                          document.documentElement.clientWidth];";
    // Signed in, the pages carry the action forms too.
    for (theme, dark, signed_in) in [("light", false, false), ("dark", true, false), ("dark-signed-in", true, true)] {
        let value = if dark { "dark" } else { "light" };
        let media = serde_json::json!({ "features": [{ "name": "prefers-color-scheme", "value": value }] });
        devtools(&browser, "Emulation.setEmulatedMedia", media).await;
        if signed_in {
            ui.goto(&page).await;
            ui.sign_in(&monitor.password).await;
        }
        for (name, path, needle) in pages {
            if signed_in && path == "/login" {
                continue;
            }
            ui.goto(path).await;
            ui.wait_for(|at| at == path, needle).await;
            let widths = ui.script(WIDTHS).await;
            assert_eq!(widths[0], 400, "{name} ({theme}): the viewport is 400 px wide: {widths}");
            assert_eq!(widths[2], dark, "{name} ({theme}): the emulated colour scheme: {widths}");
            let background = if dark { "rgb(22, 24, 28)" } else { "rgb(255, 255, 255)" };
            assert_eq!(widths[3], background, "{name} ({theme}): the theme's background: {widths}");
            let (scroll, room) = (widths[1].as_u64().unwrap_or(u64::MAX), widths[4].as_u64().unwrap_or(0));
            if scroll > 400 || scroll > room {
                let wide = ui.sticking_out().await;
                panic!("{name} ({theme}): the page is {scroll} px wide, {room} px fit: {wide}");
            }
            ui.screenshot(&format!("narrow-{name}-{theme}.png")).await;
        }
        // The graph keeps its size (its text legible) and scrolls in its region.
        ui.goto("/graph").await;
        ui.wait_for(|at| at == "/graph", "Pipeline graph").await;
        let sizes = ui
            .script(
                "const svg = document.querySelector('#graph svg'); \
                 return [svg.getBoundingClientRect().width, svg.width.baseVal.value];",
            )
            .await;
        assert_eq!(sizes[0].as_f64(), sizes[1].as_f64(), "the graph ({theme}) is drawn at its own size: {sizes}");
        ui.goto("/alerts").await;
        ui.wait_for(|at| at == "/alerts", "batches ready for longer than 0s").await;
        let link = "a[href='/batches?q=component%3Areview+state%3Aperson']";
        let found = ui.script(&format!("return document.querySelectorAll(\"{link}\").length;")).await;
        assert_eq!(found, 1, "the alert links to the batches waiting at review");
        ui.assert_accessible(&format!("alerts page, 400 px, {theme}")).await;
        ui.goto("/").await;
        ui.wait_for(|at| at == "/", "Overview").await;
        // Every state column of the overview is there, in its scrolling region.
        let columns = ui
            .script("return Array.from(document.querySelectorAll('.scroll table.grid thead th')).map(th => th.textContent);")
            .await;
        for state in STATES {
            assert!(columns.as_array().is_some_and(|c| c.iter().any(|th| th == state)), "{state} in {columns}");
        }
    }
    browser.close().await;
}

/// The pipeline graph (`/graph`): a node per component of `autocomp status`, each non-zero
/// count of it a link whose text is the count status gives, nothing serious for axe-core.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_graph_shows_each_component_with_the_counts_of_autocomp_status() {
    let demo = Demo::run();
    let states = demo.status();
    let (monitor, browser) = monitor_in_a_browser(&demo).await;
    let ui = Ui { client: browser.client(), base: &monitor.base };

    ui.goto("/graph").await;
    ui.wait_for(|at| at == "/graph", "Pipeline graph").await;
    let components: BTreeSet<String> = states.values().flat_map(|row| row.keys().cloned()).collect();
    let expected: BTreeMap<(String, String), u64> = components
        .iter()
        .flat_map(|c| STATES.map(|s| ((c.clone(), s.to_owned()), in_state(&states, c, s).len() as u64)))
        .filter(|(_, n)| *n > 0)
        .collect();
    // The counts come from the batch index, which the components commit to as they go.
    poll("the graph's counts to equal autocomp status", async || {
        let nodes: BTreeSet<String> = serde_json::from_value(
            ui.script(
                "return Array.from(document.querySelectorAll('#graph svg [data-component]'))\
                 .map(g => g.getAttribute('data-component'));",
            )
            .await,
        )
        .expect("strings");
        let links: Vec<(String, String)> = serde_json::from_value(
            ui.script(
                "return Array.from(document.querySelectorAll('#graph svg a'))\
                 .map(a => [a.getAttribute('href'), a.textContent.trim()]);",
            )
            .await,
        )
        .expect("pairs of strings");
        let mut shown = BTreeMap::new();
        for (href, text) in links {
            let (component, state) = count_link(&href).ok_or_else(|| format!("not a count link: {href}"))?;
            let count = text.strip_suffix(&format!(" {state}")).and_then(|n| n.parse::<u64>().ok());
            let count = count.ok_or_else(|| format!("{href} says {text:?}"))?;
            if state != "overdue" {
                shown.insert((component, state), count);
            }
        }
        if nodes == components && shown == expected {
            Ok(())
        } else {
            Err(format!("nodes {nodes:?}\ngraph {shown:?}\nstatus {expected:?}"))
        }
    })
    .await;
    assert!(expected.contains_key(&(COMPONENT.to_owned(), "failed".to_owned())), "{expected:?}");
    ui.assert_accessible("pipeline graph").await;
    ui.screenshot("graph.png").await;
    // The overview carries the graph too, under its table.
    ui.goto("/").await;
    ui.wait_for(|at| at == "/", "Pipeline graph").await;
    ui.assert_accessible("overview with the graph").await;
    browser.close().await;
}

/// A command step after the archiver that fails on every batch, saying why on stderr; run
/// once over the demo's archived batches with `autocomp-exec`.
const SCANNER: &str = "virus-scan";
const SCANNER_STDERR: &str = "clamd: cannot connect to /run/clamav/clamd.ctl";

fn run_a_failing_command_step(demo: &Demo) {
    let script = format!("echo \"scanning $AUTOCOMP_BATCH_ID\"; echo '{SCANNER_STDERR}' >&2; exit 3");
    let mut command = command("autocomp-exec");
    command
        .args(["--name", SCANNER, "--event-type", "Virus_Scanned", "--requires", "Data_Archived", "--", "sh", "-c"])
        .arg(&script)
        .env("AUTOCOMP_CONFIG_DIR", demo.config_dir());
    let done = run(command, Duration::from_secs(120));
    // Exit 1: the pass recorded failures (the documented code for "some batches failed").
    assert!(matches!(done.code, Some(0 | 1)), "autocomp-exec\n{}", done.show());
    assert!(!in_state(&demo.status(), SCANNER, "failed").is_empty(), "{:?}", demo.status());
}

/// The pictures an operator looks at, saved as artefacts at 1400 and 400 px in light and
/// dark (overview, graph, charts, a failed batch's page with its timeline), and what a person
/// looks for in them: the failing reason in the list, the failing command's stderr on its
/// batch page, the failures in the charts' numbers; axe-core finds nothing serious on the
/// charts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn screenshots_show_the_failing_reason_in_the_list_and_the_commands_stderr_on_its_page() {
    let demo = Demo::run();
    run_a_failing_command_step(&demo);
    let failed = in_state(&demo.status(), SCANNER, "failed");
    let id = failed.iter().next().expect("a failed batch").clone();
    let (monitor, browser) = monitor_in_a_browser(&demo).await;
    let ui = Ui { client: browser.client(), base: &monitor.base };

    // The list of what failed at the step names the reason in each failed row.
    let list = format!("/batches?q=component%3A{SCANNER}+state%3Afailed");
    ui.goto(&list).await;
    let text = ui.wait_for(|at| at == list, "batches match").await;
    assert!(text.contains(SCANNER_STDERR), "the failing reason (its stderr's last line) in the list:\n{text}");
    // The batch page shows what the command printed on stderr, and its stdout.
    let page = format!("/batches/{id}");
    ui.goto(&page).await;
    let text = ui.wait_for(|at| at == page, SCANNER_STDERR).await;
    assert!(text.contains(&format!("scanning {id}")), "the command's stdout on the page:\n{text}");
    ui.assert_accessible("a failed command's batch page, with its output").await;
    // The charts count the step's failures in the table behind the results chart.
    let charts = format!("/charts?component={SCANNER}");
    ui.goto(&charts).await;
    ui.wait_for(|at| at == charts, SCANNER).await;
    let cells =
        ui.script("return Array.from(document.querySelectorAll('table td')).map(td => td.textContent.trim());").await;
    let shows_failures = cells.as_array().is_some_and(|cells| cells.iter().any(|c| c == &failed.len().to_string()));
    assert!(shows_failures, "{} failures in the charts' tables: {cells}", failed.len());
    ui.assert_accessible("charts of the failing step").await;

    let pages = [
        ("overview", "/".to_owned(), "Overview"),
        ("graph", "/graph".to_owned(), "Pipeline graph"),
        ("charts", charts.clone(), SCANNER),
        ("failed-batch", page.clone(), SCANNER_STDERR),
    ];
    for (width, height) in [(1400, 1000), (400, 860)] {
        let metrics = serde_json::json!({ "width": width, "height": height, "deviceScaleFactor": 1, "mobile": false });
        devtools(&browser, "Emulation.setDeviceMetricsOverride", metrics).await;
        for theme in ["light", "dark"] {
            let media = serde_json::json!({ "features": [{ "name": "prefers-color-scheme", "value": theme }] });
            devtools(&browser, "Emulation.setEmulatedMedia", media).await;
            for (name, path, needle) in &pages {
                ui.goto(path).await;
                ui.wait_for(|at| at == path.as_str(), needle).await;
                let overflow = ui
                    .script("return document.documentElement.scrollWidth - document.documentElement.clientWidth;")
                    .await;
                if overflow.as_i64().is_none_or(|o| o > 0) {
                    let wide = ui.sticking_out().await;
                    panic!("{name} at {width} px ({theme}) overflows by {overflow}: {wide}");
                }
                ui.screenshot(&format!("pictures-{name}-{width}-{theme}.png")).await;
            }
            // The timeline, on its own.
            ui.goto(&page).await;
            ui.wait_for(|at| at == page, "Timeline").await;
            ui.script("document.getElementById('timeline')?.scrollIntoView(); return null;").await;
            ui.screenshot(&format!("pictures-timeline-{width}-{theme}.png")).await;
        }
    }
    browser.close().await;
}

/// A going run's output appears on its open batch page as its runner saves it, without a
/// reload (the page refreshes itself, asked for whole while a run goes); once an operator
/// cancels the run, what it printed stays under "Run output".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_going_runs_output_appears_on_its_open_batch_page_and_stays_after_a_cancel() {
    let demo = Demo::run();
    let id = failed_at_the_component(&demo.status()).into_iter().next().expect("a failed batch");
    let generation = demo.claim(&id, COMPONENT).await;
    let (monitor, browser) = monitor_in_a_browser(&demo).await;
    let ui = Ui { client: browser.client(), base: &monitor.base };
    ui.goto(&format!("/batches/{id}")).await;
    let at_batch = |at: &str| at == format!("/batches/{id}");
    ui.wait_for(at_batch, "nothing saved yet").await;

    let (batch, component) = (BatchId::new(&id).expect("an id"), ComponentName::new(COMPONENT).expect("a name"));
    let store = demo.store().await;
    let printed = |text: &str| RunOutput {
        streams: vec![OutputStream { name: "stdout".into(), head: text.into(), ..Default::default() }],
    };
    store
        .set_run_output(&batch, &component, generation, Some(printed("verifying page 1\n")), false)
        .await
        .expect("saved");
    ui.wait_for(at_batch, "verifying page 1").await;
    let more = printed("verifying page 1\nverifying page 2\n");
    store.set_run_output(&batch, &component, generation, Some(more), false).await.expect("saved");
    let text = ui.wait_for(at_batch, "verifying page 2").await;
    assert!(text.contains("Output so far") && text.contains("its output so far"), "{text}");
    ui.script("document.getElementById('output-so-far').scrollIntoView();").await;
    ui.screenshot("output-so-far.png").await;

    let mut cancel = command("autocomp");
    cancel.args(["--as", OPERATOR, "cancel", &id, "--component", COMPONENT, "--reason", REASON]);
    cancel.env("AUTOCOMP_CONFIG_DIR", demo.config_dir());
    let done = run(cancel, Duration::from_secs(60));
    assert_eq!(done.code, Some(0), "{}", done.show());
    let last = printed("verifying page 1\nverifying page 2\nkilled on page 3\n");
    store
        .set_run_output(&batch, &component, generation, Some(last), true)
        .await
        .expect("a cancelled run saves its output");
    let text = ui.wait_for(at_batch, "cancelled by an operator; its output until it stopped").await;
    assert!(text.contains("killed on page 3") && !text.contains("Output so far"), "{text}");
    browser.close().await;
}
