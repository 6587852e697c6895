//! What the client says of an answer that is not the service's: a reverse proxy's HTML page
//! in front of a service that is down, or a success whose body is not the operation's.

use autocomp_http::client::{CallError, ClientOptions, HttpClient, Retry};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::support::{Echo, op};

/// A peer on a free loopback port that answers every request with `status` and an HTML
/// `body`, and closes; served until the test ends.
async fn answering(status: &'static str, body: &'static str) -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("a free loopback port");
    let addr = listener.local_addr().unwrap();
    let answer: &'static str = Box::leak(
        format!(
            "HTTP/1.1 {status}\r\nContent-Type: text/html\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .into_boxed_str(),
    );
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut head = vec![0u8; 8192];
                let _ = stream.read(&mut head).await;
                let _ = stream.write_all(answer.as_bytes()).await;
                let _ = stream.shutdown().await;
            });
        }
    });
    addr
}

async fn error_through(addr: std::net::SocketAddr) -> String {
    let url = format!("http://alice:S3cr3t@127.0.0.1:{}?retry_for=0s", addr.port());
    let client = HttpClient::new(ClientOptions::parse(&url, "store url").unwrap(), "store service", None).unwrap();
    let echo = Echo { text: "hello".into(), sleep_ms: 0 };
    match client.call::<op::Peek>(&echo, Retry::Safe, None).await {
        Err(CallError::Unreachable(message)) => message,
        other => panic!("an answer that is not the service's is Unreachable, got {:?}", other.map(|_| ())),
    }
}

#[tokio::test]
async fn a_password_in_the_url_is_not_in_what_a_proxys_error_page_or_a_foreign_success_makes_the_client_say() {
    let proxy = answering("502 Bad Gateway", "<html>502 Bad Gateway</html>").await;
    let message = error_through(proxy).await;
    assert!(message.contains("HTTP 502") && message.contains("alice:***@127.0.0.1"), "{message}");
    assert!(!message.contains("S3cr3t"), "{message}");

    let foreign = answering("200 OK", "<html>hi</html>").await;
    let message = error_through(foreign).await;
    assert!(message.contains("with something else") && message.contains("alice:***@127.0.0.1"), "{message}");
    assert!(!message.contains("S3cr3t"), "{message}");
}
