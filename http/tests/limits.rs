//! What a client that does not play by the rules gets from a service's connection loop:
//! refused from its request's head alone (no token, a body declared too long) without the
//! service waiting for the body, closed when its head or body is too slow; over the
//! connection caps, all of loopback one client, slow heads and idle connections closed for a
//! newcomer, a connection that showed its token kept. A real router served on loopback,
//! spoken to over raw TCP from several 127.0.0.x addresses.

use crate::support;

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use autocomp_test_servers::wait_for_async;

use autocomp_http::serve::Limits;
use autocomp_http::service::MAX_BODY_BYTES;
use support::{TOKEN, connect_from, exchange, head, loopback, read_until_closed, serve, status};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Long enough that a service waiting for it would be seen waiting.
const PATIENT: Limits = Limits {
    max_connections: 512,
    max_connections_per_ip: 64,
    header_timeout: Duration::from_secs(30),
    body_timeout: Duration::from_secs(30),
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tokenless_upload_is_refused_from_its_head_without_waiting_for_the_body() {
    let served = serve(PATIENT, None).await;
    let mut stream = connect_from(loopback(1), served.addr).await;
    let started = Instant::now();
    // A 4 MiB upload announced, not one byte of it sent.
    stream.write_all(head("echo", None, MAX_BODY_BYTES).as_bytes()).await.unwrap();
    let answer = read_until_closed(&mut stream, Duration::from_secs(10))
        .await
        .expect("the service answers and closes without waiting for the body");
    assert_eq!(status(&answer), Some(401), "{}", String::from_utf8_lossy(&answer));
    assert!(started.elapsed() < Duration::from_secs(5), "answered in {:?}", started.elapsed());

    // A wrong token too.
    let mut stream = connect_from(loopback(1), served.addr).await;
    stream.write_all(head("echo", Some("wrong"), MAX_BODY_BYTES).as_bytes()).await.unwrap();
    let answer = read_until_closed(&mut stream, Duration::from_secs(10)).await.expect("closed");
    assert_eq!(status(&answer), Some(401));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_declared_over_the_limit_is_refused_with_413_without_reading_it() {
    let served = serve(PATIENT, None).await;
    let mut stream = connect_from(loopback(1), served.addr).await;
    stream.write_all(head("echo", Some(TOKEN), MAX_BODY_BYTES + 1).as_bytes()).await.unwrap();
    let answer = read_until_closed(&mut stream, Duration::from_secs(10)).await.expect("answered and closed at once");
    assert_eq!(status(&answer), Some(413), "{}", String::from_utf8_lossy(&answer));
    assert!(String::from_utf8_lossy(&answer).contains("too_large"));

    // A chunked body that passes the limit is cut off there.
    let mut stream = connect_from(loopback(1), served.addr).await;
    let chunked = format!(
        "POST /v1/echo HTTP/1.1\r\nHost: test\r\nAuthorization: Bearer {TOKEN}\r\nTransfer-Encoding: chunked\r\n\r\n"
    );
    stream.write_all(chunked.as_bytes()).await.unwrap();
    let chunk = vec![b' '; 64 << 10];
    let writer = async {
        for _ in 0..(MAX_BODY_BYTES / chunk.len() + 2) {
            let frame = [format!("{:x}\r\n", chunk.len()).into_bytes(), chunk.clone(), b"\r\n".to_vec()].concat();
            if stream.write_all(&frame).await.is_err() {
                break;
            }
        }
    };
    writer.await;
    let answer = read_until_closed(&mut stream, Duration::from_secs(10)).await.expect("answered");
    assert_eq!(status(&answer), Some(413), "{}", String::from_utf8_lossy(&answer));

    // The service still answers a request within the limits.
    assert_eq!(exchange(loopback(1), served.addr, "echo", r#"{"text": "hi"}"#).await, Some(200));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_head_is_closed_after_the_header_timeout_and_a_trickled_body_gets_408() {
    let limits =
        Limits { header_timeout: Duration::from_millis(500), body_timeout: Duration::from_millis(700), ..PATIENT };
    let served = serve(limits, None).await;

    // Half a head, then nothing.
    let mut stalled = connect_from(loopback(1), served.addr).await;
    let started = Instant::now();
    stalled.write_all(b"POST /v1/echo HTTP/1.1\r\nHost: te").await.unwrap();
    read_until_closed(&mut stalled, Duration::from_secs(10)).await.expect("the service closes a stalled head");
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(400) && waited < Duration::from_secs(5), "closed after {waited:?}");

    // Connected, nothing sent at all.
    let mut silent = connect_from(loopback(1), served.addr).await;
    read_until_closed(&mut silent, Duration::from_secs(10)).await.expect("the service closes a silent connection");

    // A head in time, then a body that stops arriving.
    let mut trickle = connect_from(loopback(1), served.addr).await;
    trickle.write_all(head("echo", Some(TOKEN), 100).as_bytes()).await.unwrap();
    trickle.write_all(br#"{"text": "#).await.unwrap();
    let answer = read_until_closed(&mut trickle, Duration::from_secs(10)).await.expect("closed after the body time");
    assert_eq!(status(&answer), Some(408), "{}", String::from_utf8_lossy(&answer));
}

/// Connections from `from` that send a few bytes of a head, then nothing.
async fn slow_heads(count: usize, from: impl Fn(usize) -> IpAddr, addr: SocketAddr) -> Vec<TcpStream> {
    let mut heads = Vec::new();
    for i in 0..count {
        let mut stream = connect_from(from(i), addr).await;
        stream.write_all(b"GET /hea").await.unwrap();
        heads.push(stream);
    }
    heads
}

/// Whether the service closes `stream` within the second an evicted slow head is held
/// (and a margin); it is not read again after.
async fn closed(stream: &mut TcpStream) -> bool {
    read_until_closed(stream, Duration::from_millis(1_500)).await.is_some()
}

/// How many of `streams` the service keeps open (`closed`, all at once); the streams back.
async fn still_open(streams: Vec<TcpStream>) -> (Vec<TcpStream>, Vec<usize>) {
    let tasks: Vec<_> = streams
        .into_iter()
        .map(|mut stream| {
            tokio::spawn(async move {
                let closed = closed(&mut stream).await;
                (stream, closed)
            })
        })
        .collect();
    let (mut streams, mut open) = (Vec::new(), Vec::new());
    for (i, task) in tasks.into_iter().enumerate() {
        let (stream, closed) = task.await.unwrap();
        if !closed {
            open.push(i);
        }
        streams.push(stream);
    }
    (streams, open)
}

/// One answer on a connection kept open: its status (the body read whole, by its length).
async fn answer_on(stream: &mut TcpStream) -> Option<u16> {
    let mut answer = Vec::new();
    let mut buffer = [0u8; 4096];
    loop {
        if let Some(end) = answer.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&answer[..end]).to_ascii_lowercase();
            let length: usize = head.lines().find_map(|l| l.strip_prefix("content-length:")?.trim().parse().ok())?;
            if answer.len() >= end + 4 + length {
                return status(&answer);
            }
        }
        match tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buffer)).await.ok()? {
            Ok(0) | Err(_) => return None,
            Ok(n) => answer.extend_from_slice(&buffer[..n]),
        }
    }
}

/// A request on a connection kept open.
async fn ask_on(stream: &mut TcpStream, operation: &str, token: Option<&str>, body: &str) -> Option<u16> {
    stream.write_all(format!("{}{body}", head(operation, token, body.len())).as_bytes()).await.ok()?;
    answer_on(stream).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_of_loopback_is_one_peer_and_its_slow_heads_give_way_to_a_newcomer() {
    let limits = Limits { max_connections: 100, max_connections_per_ip: 4, ..PATIENT };
    let served = serve(limits, None).await;
    // A request in progress (a read: open from loopback, no token) is never evicted.
    let mut reading = connect_from(loopback(1), served.addr).await;
    let body = r#"{"text": "slow", "sleep_ms": 1500}"#;
    reading.write_all(format!("{}{body}", head("peek", None, body.len())).as_bytes()).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    // 10 slow heads from 127.0.0.2-11, one each: one peer with 4 slots, so each newcomer
    // closes the longest-waiting head, never the read in progress.
    wait_for_async(deadline, "the read to be in progress", async || served.answering() == 1).await;
    let heads = slow_heads(10, |i| loopback(2 + i as u8), served.addr).await;
    let (mut heads, open) = still_open(heads).await;
    assert_eq!(open, vec![7, 8, 9], "127.0.0.2..11 are one peer; the oldest heads went first");
    // A newcomer from yet another loopback address is answered: the oldest head gives way.
    assert_eq!(exchange(loopback(50), served.addr, "echo", r#"{"text": "hi"}"#).await, Some(200));
    assert!(closed(&mut heads[7]).await, "the oldest head left gave its slot to the newcomer");
    assert_eq!(answer_on(&mut reading).await, Some(200), "the read in progress was answered");
    assert!(Instant::now() < deadline);

    // A crowd of its own cannot fill the total either: 4 distinct... all loopback here, so
    // the total cap is tried with a peer cap above it.
    let total = serve(Limits { max_connections: 8, max_connections_per_ip: 64, ..PATIENT }, None).await;
    let crowd = slow_heads(30, |i| loopback(2 + (i % 10) as u8), total.addr).await;
    assert_eq!(exchange(loopback(50), total.addr, "echo", r#"{"text": "hi"}"#).await, Some(200));
    let (_crowd, open) = still_open(crowd).await;
    assert!(open.len() <= 6, "at most 3/4 of 8 slots for connections without a token: {open:?} still open");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keep_alive_connection_that_showed_its_token_survives_the_crowd() {
    let limits = Limits { max_connections: 100, max_connections_per_ip: 4, ..PATIENT };
    let served = serve(limits, None).await;
    let mut signed = connect_from(loopback(1), served.addr).await;
    assert_eq!(ask_on(&mut signed, "echo", Some(TOKEN), r#"{"text": "1"}"#).await, Some(200));
    // A keep-alive connection that read without a token (open on loopback): idle, evictable.
    let mut anonymous = connect_from(loopback(1), served.addr).await;
    assert_eq!(ask_on(&mut anonymous, "peek", None, r#"{"text": "1"}"#).await, Some(200));

    let crowd = slow_heads(40, |i| loopback(2 + (i % 10) as u8), served.addr).await;
    assert!(closed(&mut anonymous).await, "the idle connection without a token gave way");
    assert_eq!(
        ask_on(&mut signed, "echo", Some(TOKEN), r#"{"text": "2"}"#).await,
        Some(200),
        "the connection that showed the token kept its slot"
    );
    let (crowd, open) = still_open(crowd).await;
    assert_eq!(open.len(), 3, "the crowd shares what is left of its peer's 4 slots");

    // A connection closed gives its slot back: the token holder's is free again.
    drop(signed);
    let mut crowd: Vec<TcpStream> =
        crowd.into_iter().enumerate().filter(|(i, _)| open.contains(i)).map(|(_, s)| s).collect();
    let deadline = Instant::now() + Duration::from_secs(20);
    wait_for_async(deadline, "a fourth slow head to be held after the token holder left", async || {
        crowd.extend(slow_heads(1, |_| loopback(3), served.addr).await);
        let (kept, open) = still_open(std::mem::take(&mut crowd)).await;
        crowd = kept.into_iter().enumerate().filter(|(i, _)| open.contains(i)).map(|(_, s)| s).collect();
        crowd.len() == 4
    })
    .await;
}

/// The environment variable that makes `a_service_process_for_the_log_test` serve.
const LOG_CHILD: &str = "AUTOCOMP_TEST_SERVE_FOR_THE_LOG";

/// The service process of the log test below: this test binary again, logging as a service
/// binary does (to stderr), serving the test service until killed. Does nothing in a normal
/// run.
#[test]
fn a_service_process_for_the_log_test() {
    if std::env::var_os(LOG_CHILD).is_none() {
        return;
    }
    autocomp_toolkit::logging::init("info", autocomp_toolkit::logging::LogFormat::Text);
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(async {
        let served = serve(PATIENT, None).await;
        println!("listening on {}", served.addr);
        std::future::pending::<()>().await;
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_refused_requests_from_one_client_are_a_few_log_lines_with_the_count() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("stderr.log");
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "limits::a_service_process_for_the_log_test", "--nocapture", "--test-threads=1"])
        .env(LOG_CHILD, "1")
        .env_remove("RUST_LOG")
        .stdout(std::process::Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    struct Killed(std::process::Child);
    impl Drop for Killed {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let stdout = child.stdout.take().unwrap();
    let child = Killed(child);
    let addr: SocketAddr = tokio::task::spawn_blocking(move || {
        std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            // After libtest's "test ... " on the same line.
            .find_map(|line| line.split("listening on ").nth(1)?.trim().parse().ok())
            .expect("the service process says where it listens")
    })
    .await
    .unwrap();

    // 10,000 writes without a token, over 4 keep-alive connections from 127.0.0.2-5: one
    // client (all of loopback).
    let senders: Vec<_> = (0..4u8)
        .map(|i| {
            tokio::spawn(async move {
                let mut stream = connect_from(loopback(2 + i), addr).await;
                let mut refused = 0;
                for _ in 0..2_500 {
                    refused += usize::from(ask_on(&mut stream, "echo", None, "").await == Some(401));
                }
                refused
            })
        })
        .collect();
    let mut refused = 0;
    for sender in senders {
        refused += sender.await.unwrap();
    }
    assert_eq!(refused, 10_000);

    // The first is logged at once, the rest counted and summed up at the interval's end.
    let lines = || {
        let text = std::fs::read_to_string(&log).unwrap();
        text.lines().filter(|l| l.contains("request refused")).map(str::to_owned).collect::<Vec<_>>()
    };
    let counted = |lines: &[String]| -> u64 {
        let left_out = |l: &String| l.split("left_out=").nth(1)?.split_whitespace().next()?.parse::<u64>().ok();
        lines.iter().map(|l| left_out(l).unwrap_or(1)).sum()
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    wait_for_async(deadline, "the log to account for all 10,000 refusals", async || counted(&lines()) >= 10_000).await;
    let lines = lines();
    assert_eq!(counted(&lines), 10_000, "{lines:#?}");
    assert!(lines.len() <= 10, "a few lines, not one per request: {lines:#?}");
    assert!(lines.iter().any(|l| l.contains("more from loopback")), "{lines:#?}");
    drop(child);
}
