//! Real servers for the workspace's tests, started and owned by the test process itself.
//!
//! [`postgres`]: PostgreSQL servers from the Debian `postgresql` package, each `initdb`-ed in
//! its own temp dir under `/var/tmp` and listening on a free loopback port: one per test for
//! crash, restart and failover tests ([`Postgres::start`], [`Postgres::standby`]), or one per
//! test process for suites that only need a fresh database each ([`shared`]).
//!
//! [`chromium`]: a headless Chromium from the Debian `chromium` and `chromium-driver` packages,
//! one per [`chromium::Browser`], each under its own ChromeDriver on a free loopback port with a
//! fresh profile in a temp dir, driven with the `fantoccini` WebDriver client; plus screenshots
//! ([`chromium::screenshot`]) and accessibility checks with a vendored axe-core
//! ([`chromium::axe_violations`]).
//!
//! [`bench`]: how a benchmark binary reads its scale (`AUTOCOMP_BENCH_SCALE`, smoke runs).
//!
//! [`http1`]: a bare HTTP/1.1 client for the services' tests, sending bytes exactly as given.
//!
//! [`receiver`]: an HTTP server with the routes a test wants (a webhook receiver, an OTLP
//! collector) on a free loopback port.
//!
//! Nothing here is ever a skip: without the server installed the calling test fails, naming
//! the install command (`.ci/run` installs it). This crate depends on no autocomp crate, so
//! any crate of the workspace can take it as a dev-dependency.

pub mod bench;
pub mod chromium;
pub mod http1;
pub mod postgres;
pub mod receiver;
pub mod recording;
pub mod smtp;

pub use postgres::{Options, Postgres, shared};

use std::time::{Duration, Instant};

/// A small deterministic generator (xorshift64) for tests that make up inputs: the same
/// seed gives the same sequence on every run, so a failing case is the same every time.
/// The seed must not be zero.
pub struct XorShift(pub u64);

impl XorShift {
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform enough in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }

    pub fn one_in(&mut self, n: usize) -> bool {
        self.below(n) == 0
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// How often the pollers ask, unless a test needs to see something briefly true.
const POLL: Duration = Duration::from_millis(20);

/// Polls `condition` every 20 ms until it holds (true) or `deadline` passes (false).
pub fn wait_until(deadline: Instant, condition: impl FnMut() -> bool) -> bool {
    wait_until_every(POLL, deadline, condition)
}

/// [`wait_until`] polling every `interval`: for a state that lasts only moments (a temp
/// name during a copy) or a delay measured to the millisecond.
pub fn wait_until_every(interval: Duration, deadline: Instant, mut condition: impl FnMut() -> bool) -> bool {
    loop {
        if condition() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(interval);
    }
}

/// [`wait_until`] for async conditions (a tokio test polling a service or the store): polls
/// every 20 ms until `condition` holds (true) or `deadline` passes (false).
pub async fn wait_until_async(deadline: Instant, condition: impl AsyncFnMut() -> bool) -> bool {
    wait_until_async_every(POLL, deadline, condition).await
}

/// [`wait_until_async`] polling every `interval`.
pub async fn wait_until_async_every(
    interval: Duration,
    deadline: Instant,
    mut condition: impl AsyncFnMut() -> bool,
) -> bool {
    loop {
        if condition().await {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(interval).await;
    }
}

/// [`wait_until_async`], panicking with "timed out waiting for {what}" when `deadline` passes.
pub async fn wait_for_async(deadline: Instant, what: &str, condition: impl AsyncFnMut() -> bool) {
    let started = Instant::now();
    let held = wait_until_async(deadline, condition).await;
    assert!(held, "timed out waiting for {what} (gave up after {:?})", started.elapsed());
}

/// [`wait_until`], panicking with "timed out waiting for {what}" when `deadline` passes.
pub fn wait_for(deadline: Instant, what: &str, condition: impl FnMut() -> bool) {
    let started = Instant::now();
    assert!(wait_until(deadline, condition), "timed out waiting for {what} (gave up after {:?})", started.elapsed());
}

/// Fails unless the file at `path` holds `generated`, saying how to regenerate it; writes it
/// instead when `AUTOCOMP_REGENERATE=1`. `command` is the test's own command line, which
/// is the command that regenerates the file with that variable set.
pub fn assert_generated(path: &str, generated: &str, command: &str) {
    if std::env::var_os("AUTOCOMP_REGENERATE").is_some_and(|v| v == "1") {
        std::fs::write(path, generated).unwrap_or_else(|e| panic!("cannot write {path}: {e}"));
        return;
    }
    let checked_in = std::fs::read_to_string(path).unwrap_or_default();
    if checked_in != generated {
        let line = checked_in.lines().zip(generated.lines()).position(|(a, b)| a != b);
        let first = line.map_or_else(|| "its length".to_owned(), |n| format!("line {}", n + 1));
        panic!(
            "{path} is not what its declarations generate (first difference: {first}); regenerate it with\n\n    \
             AUTOCOMP_REGENERATE=1 {command}\n"
        );
    }
}

/// The running test binary as a child process that runs only `$test`, a test of the calling
/// file, with its output unbuffered: how the process tests start their children. Each
/// crate's tests are one binary with every file a module, so `--exact` gets `module::test`.
#[macro_export]
macro_rules! this_binary_running {
    ($test:literal) => {
        $crate::test_binary_running(&format!(
            "{}::{}",
            module_path!().split_once("::").map_or(module_path!(), |(_, module)| module),
            $test
        ))
    };
}

/// [`this_binary_running!`]'s command for the test named `test` in full.
pub fn test_binary_running(test: &str) -> std::process::Command {
    let mut command = std::process::Command::new(std::env::current_exe().expect("the test binary's path"));
    command.args(["--exact", test, "--nocapture", "--test-threads=1", "-q"]);
    command
}
