//! What a client that does not play by the rules gets from a service's connection loop:
//! refused from its request's head alone (no token, a body declared too long) without the
//! service waiting for the body, closed when its head or body is too slow, closed at once
//! over the connection caps. A real router served on loopback, spoken to over raw TCP.

use crate::support;

use std::time::{Duration, Instant};

use autocomp_test_servers::wait_for_async;

use autocomp_http::serve::Limits;
use autocomp_http::service::MAX_BODY_BYTES;
use support::{TOKEN, connect_from, exchange, head, loopback, read_until_closed, serve, status};
use tokio::io::AsyncWriteExt;

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_over_the_caps_are_closed_at_once_and_other_peers_are_still_served() {
    let limits = Limits { max_connections: 5, max_connections_per_ip: 2, ..PATIENT };
    let served = serve(limits, None).await;
    // Two idle connections from 127.0.0.1 fill its share.
    let mut held = vec![connect_from(loopback(1), served.addr).await, connect_from(loopback(1), served.addr).await];
    let mut third = connect_from(loopback(1), served.addr).await;
    let started = Instant::now();
    let answer = read_until_closed(&mut third, Duration::from_secs(5)).await.expect("closed at once");
    assert!(answer.is_empty(), "nothing is read or answered: {}", String::from_utf8_lossy(&answer));
    assert!(started.elapsed() < Duration::from_secs(2));

    // Another peer is served meanwhile.
    assert_eq!(exchange(loopback(2), served.addr, "echo", r#"{"text": "hi"}"#).await, Some(200));

    // The total cap (on a service of its own: the slot of an exchange just answered may
    // not be given back yet): 2 + 2 held from two peers, 1 more from a third; the next
    // connection, from a fourth, is closed at once.
    let total = serve(limits, None).await;
    let mut full = Vec::new();
    for last in [3, 3, 4, 4, 6] {
        full.push(connect_from(loopback(last), total.addr).await);
    }
    let mut over = connect_from(loopback(5), total.addr).await;
    assert_eq!(read_until_closed(&mut over, Duration::from_secs(5)).await.as_deref(), Some(&[][..]));

    // A connection closed gives its slot back.
    held.clear();
    let deadline = Instant::now() + Duration::from_secs(10);
    wait_for_async(deadline, "127.0.0.1 to be served again after its connections closed", async || {
        exchange(loopback(1), served.addr, "echo", r#"{"text": "again"}"#).await == Some(200)
    })
    .await;
}
