//! A hostile-client benchmark of the two services as built: it starts `autocomp-store serve`
//! (over a SQLite file) and `sboi serve` (following it), then against each measures the RSS
//! that 200 concurrent tokenless 4 MiB uploads cost, and what 200 stalled connections do to
//! a valid request's latency. Loopback only; it stops the services it started.
//!
//! ```text
//! cargo build --release -p autocomp-store -p autocomp-sboi --bins
//! cargo run --release -p autocomp-http --example flood -- target/release/autocomp-store target/release/sboi
//! ```

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

const UPLOADS: usize = 200;
const UPLOAD_BYTES: usize = 4 << 20;
const STALLED: usize = 200;
/// Clients spread over this many loopback addresses, 50 each. Since the slots count all of
/// loopback as one client (64 slots), newcomers take the slots of stalled connections.
const ADDRESSES: usize = 4;
const PROBES: usize = 20;

struct Service {
    name: &'static str,
    child: Child,
    addr: SocketAddr,
    /// A write operation: refused without the token.
    write_path: &'static str,
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [store_bin, sboi_bin] = args.as_slice() else {
        eprintln!("usage: flood PATH/TO/autocomp-store PATH/TO/sboi (release builds)");
        std::process::exit(2);
    };
    let dir = tempfile::tempdir().expect("a temporary directory");
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "flood-benchmark-token\n").unwrap();
    let token = token_file.to_str().unwrap();

    let store_addr = free_port();
    let db = format!("sqlite://{}", dir.path().join("store.db").display());
    let store = Service {
        name: "autocomp-store serve --db sqlite:...",
        child: spawn(store_bin, &["serve", "--db", &db, "--listen", &store_addr.to_string(), "--token-file", token]),
        addr: store_addr,
        write_path: "/v1/create_batch",
    };
    wait_healthy(store.addr).await;
    let sboi_addr = free_port();
    let index = dir.path().join("index");
    let sboi = Service {
        name: "sboi serve --store http://...",
        child: spawn(
            sboi_bin,
            &[
                "serve",
                "--store",
                &format!("http://{store_addr}"),
                "--index-dir",
                index.to_str().unwrap(),
                "--listen",
                &sboi_addr.to_string(),
                "--token-file",
                token,
            ],
        ),
        addr: sboi_addr,
        write_path: "/v1/rebuild",
    };
    wait_healthy(sboi.addr).await;

    for service in [&store, &sboi] {
        println!("== {} (pid {})", service.name, service.child.id());
        uploads(service).await;
        stalls(service).await;
    }
}

fn spawn(bin: &str, args: &[&str]) -> Child {
    Command::new(bin)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {bin}: {e}"))
}

fn free_port() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap()
}

fn rss_mb(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kb: f64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kb| kb.parse().ok())
        .unwrap_or(0.0);
    kb / 1024.0
}

fn client_address(i: usize, base: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, base + (i % ADDRESSES) as u8))
}

async fn connect_from(from: IpAddr, addr: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(from, 0))?;
    socket.connect(addr).await
}

async fn wait_healthy(addr: SocketAddr) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while get_health(addr).await.is_none_or(|(status, _)| status != 200) {
        assert!(Instant::now() < deadline, "{addr} is not healthy after 60 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `GET /health` from 127.0.0.1: its status and how long the answer took.
async fn get_health(addr: SocketAddr) -> Option<(u16, Duration)> {
    let started = Instant::now();
    let mut stream = connect_from(IpAddr::V4(Ipv4Addr::LOCALHOST), addr).await.ok()?;
    stream.write_all(b"GET /health HTTP/1.1\r\nHost: flood\r\nConnection: close\r\n\r\n").await.ok()?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.ok()?;
    let status = std::str::from_utf8(answer.get(9..12)?).ok()?.parse().ok()?;
    Some((status, started.elapsed()))
}

/// 200 concurrent uploads of 4 MiB without a token, each sent whole as a client that does
/// not wait for an answer would; the service's RSS sampled throughout.
async fn uploads(service: &Service) {
    let pid = service.child.id();
    let idle = rss_mb(pid);
    let peak = Arc::new(AtomicU64::new(idle.to_bits()));
    let sampling = {
        let peak = Arc::clone(&peak);
        tokio::spawn(async move {
            loop {
                let now = rss_mb(pid);
                if now > f64::from_bits(peak.load(Ordering::Relaxed)) {
                    peak.store(now.to_bits(), Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };
    let body: Arc<[u8]> = vec![b' '; UPLOAD_BYTES].into();
    let started = Instant::now();
    let tasks: Vec<_> = (0..UPLOADS)
        .map(|i| {
            let (body, addr, path) = (Arc::clone(&body), service.addr, service.write_path);
            tokio::spawn(async move {
                let mut stream = connect_from(client_address(i, 11), addr).await.ok()?;
                let head = format!(
                    "POST {path} HTTP/1.1\r\nHost: flood\r\nContent-Type: application/json\r\n\
                     Content-Length: {UPLOAD_BYTES}\r\n\r\n"
                );
                let (mut reader, mut writer) = stream.split();
                let send = async {
                    if writer.write_all(head.as_bytes()).await.is_ok() {
                        // Refused early, the service closes: the rest is not sent.
                        let _ = writer.write_all(&body).await;
                    }
                };
                let mut answer = Vec::new();
                let receive = async {
                    let _ = reader.read_to_end(&mut answer).await;
                };
                tokio::join!(send, receive);
                std::str::from_utf8(answer.get(9..12)?).ok()?.parse::<u16>().ok()
            })
        })
        .collect();
    let mut statuses = std::collections::BTreeMap::<String, usize>::new();
    for task in tasks {
        let status = task.await.unwrap().map_or("no answer".to_string(), |s| s.to_string());
        *statuses.entry(status).or_default() += 1;
    }
    let took = started.elapsed();
    tokio::time::sleep(Duration::from_millis(500)).await; // settle
    sampling.abort();
    let (peak, after) = (f64::from_bits(peak.load(Ordering::Relaxed)), rss_mb(pid));
    println!(
        "{UPLOADS} tokenless {} MiB uploads in {took:.2?}: answers {statuses:?}; RSS idle {idle:.0} MB, \
         peak {peak:.0} MB (+{:.0}), after {after:.0} MB (+{:.0}): {}",
        UPLOAD_BYTES >> 20,
        peak - idle,
        after - idle,
        if peak - idle <= 50.0 { "within +50 MB" } else { "OVER +50 MB" }
    );
}

/// A valid request's latency alone, then with 200 connections that sent half a head and
/// stalled; then how long the service holds the stalled ones.
async fn stalls(service: &Service) {
    let baseline = probe(service.addr).await;
    let mut stalled = Vec::new();
    for i in 0..STALLED {
        let Ok(mut stream) = connect_from(client_address(i, 21), service.addr).await else { continue };
        let _ = stream.write_all(b"POST /v1/head HTTP/1.1\r\nHost: fl").await;
        stalled.push(stream);
    }
    let opened = Instant::now();
    let loaded = probe(service.addr).await;
    let delay = loaded.1.saturating_sub(baseline.0);
    println!(
        "valid GET /health: alone p50 {:.2?} max {:.2?}; with {} stalled connections p50 {:.2?} max {:.2?}: \
         delay at most {delay:.2?} ({})",
        baseline.0,
        baseline.1,
        stalled.len(),
        loaded.0,
        loaded.1,
        if delay <= Duration::from_millis(100) { "within 100 ms" } else { "OVER 100 ms" }
    );
    // How long the stalled connections are held: until the service closes each.
    let closes: Vec<_> = stalled
        .into_iter()
        .map(|mut stream| {
            tokio::spawn(async move {
                let mut sink = Vec::new();
                let _ = tokio::time::timeout(Duration::from_secs(120), stream.read_to_end(&mut sink)).await;
                opened.elapsed()
            })
        })
        .collect();
    let mut held = Vec::new();
    for close in closes {
        held.push(close.await.unwrap());
    }
    held.sort();
    println!(
        "stalled connections closed by the service after {:.1?} (first) to {:.1?} (last)",
        held.first().copied().unwrap_or_default(),
        held.last().copied().unwrap_or_default()
    );
}

/// `PROBES` sequential `GET /health`: the median and the slowest.
async fn probe(addr: SocketAddr) -> (Duration, Duration) {
    let mut times = Vec::new();
    for _ in 0..PROBES {
        let (status, took) = get_health(addr).await.expect("the service answers a valid request");
        assert_eq!(status, 200);
        times.push(took);
    }
    times.sort();
    (times[times.len() / 2], times[times.len() - 1])
}
