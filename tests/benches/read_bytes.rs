//! Reads bounded by bytes (issue 38, Deliver 2): the attacks of the hostile review, in the
//! default setup (reads open on loopback, no token), against release binaries as separate
//! processes, each process's memory read from /proc/<pid>/status:
//!
//! 1. `autocomp-store serve` holding one 63 MB batch (63 events of 1 MB): two concurrent
//!    `get_batches` naming it eight times each, three rounds (it answered 536 MB each and
//!    took the service from 810 MB to 2.3 GB).
//! 2. The same service: 200 tokenless read bodies left stalled, half declaring 4 MiB (refused
//!    from the head), half sending 60 KiB chunked and then nothing (they cost +815 MiB).
//! 3. `autocomp-monitor` on a demo pipeline whose batch has 50 events of 1 MB: four viewers
//!    loading its page five times each (a 50 MB page; 737 MB with four viewers).
//!
//! Each row: the process's VmRSS before, the highest VmRSS sampled every 5 ms during, and
//! VmRSS one second after; goal: the highest within +64 MiB of before.
//!
//!     cargo bench -p autocomp-e2e --bench read_bytes
//!
//! Without the `--bench` argument that `cargo bench` passes (under `cargo test --all-targets`)
//! it only does a smoke run with small numbers. The services are started here, not with
//! `autocomp_e2e::services`, because those ask for the token on every read: this measures
//! the default, where anyone on the host may read.

use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use autocomp_e2e::binary;
use autocomp_e2e::services::{http_get, http_request};
use autocomp_model::{Agent, BatchId, BatchType, EventType, NewBatch, NewEvent, Outcome, Timestamp};
use autocomp_store::{HttpStore, ObjectStore, SqliteStore};
use autocomp_test_servers::wait_until;

const GOAL_MIB: f64 = 64.0;
const TOKEN: &str = "read-bytes-bench-token";

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    println!("# autocomp reads bounded by bytes ({})", if full { "full" } else { "smoke run" });
    println!(
        "machine: {} cores, {}",
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        Timestamp::now()
    );
    let events = if full { 63 } else { 4 };
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut rows = Vec::new();
    {
        let service = Process::store(&dir.path().join("store.db"), dir.path());
        runtime.block_on(big_batch_through(&service.url(), events));
        rows.push(service.measure("store: 2 x get_batches of 8 copies of a 63 MB batch, x3", || {
            for _ in 0..3 {
                let ids: Vec<&str> = vec!["BIG"; 8];
                let body = serde_json::json!({ "ids": ids }).to_string();
                let url = format!("{}/v1/get_batches", service.url());
                let readers: Vec<_> = (0..2)
                    .map(|_| {
                        let (url, body) = (url.clone(), body.clone());
                        std::thread::spawn(move || {
                            http_request("POST", &url, &body).map(|(status, body)| (status, body.len()))
                        })
                    })
                    .collect();
                for reader in readers {
                    let (status, bytes) = reader.join().unwrap().expect("the service answers");
                    assert_eq!(status, 200);
                    assert!(bytes < (events + 1) * 1_000_200, "one copy answered: {bytes} bytes");
                }
            }
        }));
        rows.push(service.measure(
            "store: 200 stalled tokenless read bodies (4 MiB declared / 60 KiB chunked)",
            || {
                let stalled = stall_bodies(&service.url(), if full { 200 } else { 20 });
                std::thread::sleep(Duration::from_secs(2));
                drop(stalled);
            },
        ));
    }
    {
        let demo = dir.path().join("demo");
        let made = Command::new(binary("autocomp")).args(["demo", "--dir"]).arg(&demo).output().unwrap();
        assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
        runtime.block_on(fifty_large_events(&demo.join("store.db"), if full { 50 } else { 5 }));
        let monitor = Process::monitor(&demo.join("config"), dir.path());
        rows.push(monitor.measure("monitor: 4 viewers x 5 loads of a page of 50 events of 1 MB", || {
            let url = format!("{}/batches/BIG", monitor.url());
            let viewers: Vec<_> = (0..4)
                .map(|_| {
                    let url = url.clone();
                    std::thread::spawn(move || {
                        for _ in 0..5 {
                            let (status, page) = http_get(&url).expect("the monitor answers");
                            assert_eq!(status, 200, "{page}");
                            assert!(page.len() < 4_000_000, "a page by size: {} bytes", page.len());
                        }
                    })
                })
                .collect();
            viewers.into_iter().for_each(|viewer| viewer.join().unwrap());
        }));
    }
    println!("\n| attack | before (MiB) | highest during (MiB) | after (MiB) | highest - before | goal |");
    println!("|---|---:|---:|---:|---:|---|");
    let mut met = true;
    for row in &rows {
        let grew = row.highest - row.before;
        met &= grew <= GOAL_MIB;
        let verdict = if grew <= GOAL_MIB { "met" } else { "MISSED" };
        println!(
            "| {} | {:.0} | {:.0} | {:.0} | +{grew:.0} | +{GOAL_MIB:.0} MiB: {verdict} |",
            row.what, row.before, row.highest, row.after
        );
    }
    if full && !met {
        std::process::exit(1);
    }
}

/// One batch, `BIG`, of `events` events of 1 MB each, written through the service.
async fn big_batch_through(url: &str, events: usize) {
    let store = HttpStore::with_token(url, Some(TOKEN.into())).unwrap();
    fill(&store, events).await;
}

async fn fifty_large_events(db: &Path, events: usize) {
    let store = SqliteStore::open(db).await.unwrap();
    fill(&store, events).await;
}

async fn fill(store: &dyn ObjectStore, events: usize) {
    let id = BatchId::new("BIG").unwrap();
    store.create_batch(NewBatch::new(id.clone(), BatchType::new("RoundTrip").unwrap())).await.unwrap();
    let blob = "x".repeat(1_000_000);
    for n in 0..events {
        let event = NewEvent::new(EventType::new("Dump_Made").unwrap(), Outcome::Success, Agent::new("bench").unwrap())
            .with_details(serde_json::json!({"n": n, "dump": blob}));
        store.append_event(&id, event).await.unwrap();
    }
}

/// `count` connections that each send a read's head and then stall: half declare a 4 MiB
/// body and send none of it, half send 60 KiB of a chunked body and then nothing.
fn stall_bodies(url: &str, count: usize) -> Vec<TcpStream> {
    let authority = url.trim_start_matches("http://").to_string();
    let chunk = vec![b' '; 60 << 10];
    let mut open = Vec::new();
    for n in 0..count {
        let Ok(mut stream) = TcpStream::connect(&authority) else { continue };
        let framing =
            if n % 2 == 0 { "Content-Length: 4194304".to_string() } else { "Transfer-Encoding: chunked".into() };
        let head = format!(
            "POST /v1/get_batches HTTP/1.1\r\nHost: {authority}\r\nContent-Type: application/json\r\n{framing}\r\n\r\n"
        );
        if stream.write_all(head.as_bytes()).is_err() {
            continue;
        }
        if n % 2 == 1 {
            let frame = [format!("{:x}\r\n", chunk.len()).into_bytes(), chunk.clone(), b"\r\n".to_vec()].concat();
            let _ = stream.write_all(&frame);
        }
        open.push(stream);
    }
    open
}

/// A service process of this bench, killed on drop.
struct Process {
    child: Child,
    port: u16,
}

struct Row {
    what: &'static str,
    before: f64,
    highest: f64,
    after: f64,
}

impl Process {
    fn store(db: &Path, log_dir: &Path) -> Process {
        let mut command = Command::new(binary("autocomp-store"));
        command.args(["serve", "--db", &format!("sqlite://{}?synchronous=normal", db.display())]);
        command.env("AUTOCOMP_TOKEN", TOKEN);
        Process::start(command, &log_dir.join("store.log"))
    }

    fn monitor(config_dir: &Path, log_dir: &Path) -> Process {
        let mut command = Command::new(binary("autocomp-monitor"));
        command.arg("--config-dir").arg(config_dir);
        Process::start(command, &log_dir.join("monitor.log"))
    }

    fn start(mut command: Command, log: &Path) -> Process {
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        command.args(["--listen", &format!("127.0.0.1:{port}")]);
        for var in ["RUST_LOG", "AUTOCOMP_CONFIG_DIR", "AUTOCOMP_STORE", "AUTOCOMP_TOKEN_FILE"] {
            command.env_remove(var);
        }
        let log = std::fs::File::create(log).unwrap();
        let child = command.stdin(Stdio::null()).stdout(Stdio::null()).stderr(log).spawn().unwrap();
        let process = Process { child, port };
        let up = wait_until(Instant::now() + Duration::from_secs(30), || {
            http_get(&format!("{}/health", process.url())).is_some_and(|(status, _)| status == 200)
        });
        assert!(up, "not healthy in 30 s");
        process
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The process's VmRSS in MiB.
    fn rss(&self) -> f64 {
        Process::rss_of(self.child.id())()
    }

    /// VmRSS before, its highest sampled every 5 ms while `attack` runs, and one second after.
    fn measure(&self, what: &'static str, attack: impl FnOnce()) -> Row {
        let before = self.rss();
        let (done, highest) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
        let pid = self.child.id();
        let sampler = {
            let (done, highest) = (Arc::clone(&done), Arc::clone(&highest));
            std::thread::spawn(move || {
                let probe = Process::rss_of(pid);
                while !done.load(Ordering::Relaxed) {
                    highest.fetch_max(probe().to_bits(), Ordering::Relaxed);
                    std::thread::sleep(Duration::from_millis(5));
                }
            })
        };
        let started = Instant::now();
        attack();
        let took = started.elapsed();
        done.store(true, Ordering::Relaxed);
        sampler.join().unwrap();
        std::thread::sleep(Duration::from_secs(1));
        let row = Row {
            what,
            before,
            highest: f64::from_bits(highest.load(Ordering::Relaxed)).max(before),
            after: self.rss(),
        };
        println!(
            "{what}: {:.0} -> {:.0} MiB at most -> {:.0} after, in {took:.1?}",
            row.before, row.highest, row.after
        );
        row
    }

    /// Reads VmRSS (MiB) of `pid`; 0 once it is gone.
    fn rss_of(pid: u32) -> impl Fn() -> f64 {
        move || {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
            status
                .lines()
                .find_map(|line| line.strip_prefix("VmRSS:"))
                .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
                .map_or(0.0, |kib| kib / 1024.0)
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.child.kill().ok();
        self.child.wait().ok();
    }
}
