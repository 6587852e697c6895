//! A crowd of slow heads against the store service's connection slots (issue 38): 600
//! connections from 127.0.0.2-11 (60 from each) each send a few bytes of a request head and
//! then nothing; each one the service closes is opened again at once, as a hostile client
//! would. Meanwhile a plain `GET /health` from 127.0.0.50 asks once every ~10 ms (a fresh
//! connection each, on a runtime and thread of its own so the crowd's work does not delay
//! it here) for `AUTOCOMP_BENCH_SECS` (20). The goal: >= 99 % answered 200 within 100 ms.
//! The service runs with its defaults (`--max-connections 512`, `--max-connections-per-ip
//! 64`, `--header-timeout 10s`) as a release binary in its own process.
//!
//!     cargo bench -p autocomp-e2e --bench slots
//!
//! Without the `--bench` argument that `cargo bench` passes (e.g. under `cargo test
//! --all-targets`) it only does a smoke run: 60 heads for 2 s, no goal.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use autocomp_e2e::percentile;
use autocomp_e2e::services::Service;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

const GOAL_SHARE: f64 = 0.99;
const GOAL_WITHIN: Duration = Duration::from_millis(100);

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let secs = std::env::var("AUTOCOMP_BENCH_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(20);
    let (heads, length) = if full { (600, Duration::from_secs(secs)) } else { (60, Duration::from_secs(2)) };
    println!("# connection slots under a crowd of slow heads ({})", if full { "full" } else { "smoke run" });
    println!("machine: {} cores", std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0));
    let dir = tempfile::tempdir().unwrap();
    let service = Service::store(&dir.path().join("store.db"), dir.path());
    let addr: SocketAddr = format!("127.0.0.1:{}", service.port).parse().unwrap();

    let alone = probe(addr, Duration::from_secs(2));
    report("alone", &alone, None);

    let stop = Arc::new(AtomicBool::new(false));
    let opened = Arc::new(AtomicU64::new(0));
    let crowd = {
        let (stop, opened) = (Arc::clone(&stop), Arc::clone(&opened));
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
            runtime.block_on(async move {
                let tasks: Vec<_> = (0..heads)
                    .map(|i| {
                        let from = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2 + (i % 10) as u8));
                        tokio::spawn(slow_head(from, addr, Arc::clone(&stop), Arc::clone(&opened)))
                    })
                    .collect();
                for task in tasks {
                    let _ = task.await;
                }
            });
        })
    };
    // Until the crowd has opened all of its connections once.
    let deadline = Instant::now() + Duration::from_secs(30);
    while opened.load(Ordering::Relaxed) < heads as u64 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let before = opened.load(Ordering::Relaxed);
    let loaded = probe(addr, length);
    let reopened = opened.load(Ordering::Relaxed) - before;
    stop.store(true, Ordering::Relaxed);
    report(
        &format!("with {heads} slow heads from 127.0.0.2-11 ({reopened} connections opened by them meanwhile)"),
        &loaded,
        full.then_some(()),
    );
    drop(crowd); // its tasks end at their next close; the process exits anyway
}

/// One hostile client: a few bytes of a head, then silence until the service closes the
/// connection, then again.
async fn slow_head(from: IpAddr, addr: SocketAddr, stop: Arc<AtomicBool>, opened: Arc<AtomicU64>) {
    while !stop.load(Ordering::Relaxed) {
        let Ok(mut stream) = connect_from(from, addr).await else {
            tokio::time::sleep(Duration::from_millis(1)).await;
            continue;
        };
        opened.fetch_add(1, Ordering::Relaxed);
        if stream.write_all(b"GET /health HTTP/1.1\r\nHo").await.is_err() {
            continue;
        }
        let mut sink = [0u8; 256];
        while let Ok(n) = stream.read(&mut sink).await {
            if n == 0 || stop.load(Ordering::Relaxed) {
                break;
            }
        }
    }
}

async fn connect_from(from: IpAddr, addr: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(from, 0))?;
    socket.connect(addr).await
}

/// What one probe got: its latency when answered 200.
struct Probed {
    answered: Vec<Duration>,
    failed: usize,
}

/// `GET /health` from 127.0.0.50 once every ~10 ms for `length`, on a thread of its own.
fn probe(addr: SocketAddr, length: Duration) -> Probed {
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async move {
            let mut probed = Probed { answered: Vec::new(), failed: 0 };
            let mut tick = tokio::time::interval(Duration::from_millis(10));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let started = Instant::now();
            while started.elapsed() < length {
                tick.tick().await;
                let asked = Instant::now();
                match tokio::time::timeout(Duration::from_secs(5), health(addr)).await {
                    Ok(Some(200)) => probed.answered.push(asked.elapsed()),
                    _ => probed.failed += 1,
                }
            }
            probed
        })
    })
    .join()
    .unwrap()
}

async fn health(addr: SocketAddr) -> Option<u16> {
    let mut stream = connect_from(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 50)), addr).await.ok()?;
    stream.write_all(b"GET /health HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n").await.ok()?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.ok()?;
    std::str::from_utf8(answer.get(9..12)?).ok()?.parse().ok()
}

fn report(what: &str, probed: &Probed, goal: Option<()>) {
    let mut answered = probed.answered.clone();
    answered.sort();
    let asked = answered.len() + probed.failed;
    let within = answered.iter().filter(|d| **d <= GOAL_WITHIN).count();
    let share = within as f64 / asked.max(1) as f64;
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "{what}: {asked} probes, {within} answered within {} ms ({:.2} %), {} failed; p50 {:.1} ms, p99 {:.1} ms, max \
         {:.1} ms{}",
        GOAL_WITHIN.as_millis(),
        share * 100.0,
        probed.failed,
        ms(percentile(&answered, 0.5)),
        ms(percentile(&answered, 0.99)),
        ms(answered.last().copied().unwrap_or_default()),
        match goal {
            Some(()) if share >= GOAL_SHARE => " (goal >= 99 %: met)".to_string(),
            Some(()) => " (goal >= 99 %: MISSED)".to_string(),
            None => String::new(),
        }
    );
}
