//! A small service on the shared routes (`service::router`), served by the real connection
//! loop on a free loopback port, and a raw TCP peer that sends exactly the bytes a test
//! wants (a head without its body, half a head) from a chosen loopback address.
#![allow(dead_code)] // each test file uses its own part

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use autocomp_http::api::{Answered, ApiDoc};
use autocomp_http::error::ApiError;
use autocomp_http::serve::{Limits, serve_until};
use autocomp_http::service::{Access, Metrics, Rpc, router};
use autocomp_toolkit::tls::ServerTls;
use axum::response::{IntoResponse, Response};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

pub const TOKEN: &str = "s3cret-token";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Echo {
    pub text: String,
    /// How long the service takes to answer: a request kept in flight.
    #[serde(default)]
    pub sleep_ms: u64,
}

autocomp_http::operations! {
    pub enum TestRequest in mod op {
        /// Answers its body (a write: it needs the token).
        write echo: Echo(Echo) -> Echo;
        /// Answers its body (a read).
        read peek: Peek(Echo) -> Echo;
    }
}

pub struct TestService {
    access: Access,
    metrics: Metrics,
    /// Requests whose answer is being made now: a test waits on it instead of sleeping.
    answering: Arc<AtomicUsize>,
}

#[async_trait::async_trait]
impl Rpc for TestService {
    const WHAT: &'static str = "test service";
    const API: ApiDoc = ApiDoc {
        title: "test",
        description: "test",
        server: "http://127.0.0.1:0",
        errors: &[],
        health: "up",
        health_answer: |generator| generator.subschema_for::<String>(),
        health_unavailable: "never",
        metrics: "metrics",
    };
    type Request = TestRequest;

    fn access(&self) -> &Access {
        &self.access
    }

    fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    async fn answer(&self, request: TestRequest) -> Result<Answered, ApiError> {
        let (echo, reply) = match request {
            TestRequest::Echo(echo, reply) | TestRequest::Peek(echo, reply) => (echo, reply),
        };
        self.answering.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(echo.sleep_ms)).await;
        self.answering.fetch_sub(1, Ordering::SeqCst);
        Ok(reply.send(echo))
    }

    async fn health(&self) -> Response {
        "ok".into_response()
    }

    async fn gauges(&self) -> Vec<(&'static str, &'static str, f64)> {
        Vec::new()
    }
}

/// The test service served on a free loopback port until dropped.
pub struct Served {
    pub addr: SocketAddr,
    answering: Arc<AtomicUsize>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Served {
    /// How many requests the service is answering now (their heads and bodies are in).
    pub fn answering(&self) -> usize {
        self.answering.load(Ordering::SeqCst)
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

pub async fn serve(limits: Limits, tls: Option<Arc<ServerTls>>) -> Served {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("a free loopback port");
    let addr = listener.local_addr().unwrap();
    let answering = Arc::new(AtomicUsize::new(0));
    let service = Arc::new(TestService {
        access: Access::new(TOKEN),
        metrics: Metrics::new("test"),
        answering: Arc::clone(&answering),
    });
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(serve_until(listener, router(service), limits, tls, async {
        let _ = stopped.await;
    }));
    Served { addr, answering, stop: Some(stop) }
}

pub fn loopback(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, last))
}

/// A connection to `addr` from the loopback address `from` (all of 127/8 is this host).
pub async fn connect_from(from: IpAddr, addr: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::new(from, 0)).unwrap();
    socket.connect(addr).await.expect("the service accepts the TCP connection")
}

/// What the service sent until it closed the connection, or None if it kept it open
/// longer than `within`.
pub async fn read_until_closed(stream: &mut TcpStream, within: Duration) -> Option<Vec<u8>> {
    let mut answer = Vec::new();
    let read = async {
        let mut buffer = [0u8; 4096];
        loop {
            match stream.read(&mut buffer).await {
                // A reset after an answer (our unsent body) also ends it.
                Ok(0) | Err(_) => break,
                Ok(n) => answer.extend_from_slice(&buffer[..n]),
            }
        }
    };
    tokio::time::timeout(within, read).await.ok()?;
    Some(answer)
}

/// The status of a raw HTTP/1.1 answer.
pub fn status(answer: &[u8]) -> Option<u16> {
    std::str::from_utf8(answer.get(9..12)?).ok()?.parse().ok()
}

/// The head of a POST to `/v1/<operation>`, declaring `length` bytes of body.
pub fn head(operation: &str, token: Option<&str>, length: usize) -> String {
    let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    format!(
        "POST /v1/{operation} HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n{auth}\
         Content-Length: {length}\r\n\r\n"
    )
}

/// One whole request from `from`: the status, or None if the connection was closed first.
pub async fn exchange(from: IpAddr, addr: SocketAddr, operation: &str, body: &str) -> Option<u16> {
    let mut stream = connect_from(from, addr).await;
    let mut request = head(operation, Some(TOKEN), body.len()).replace("\r\n\r\n", "\r\nConnection: close\r\n\r\n");
    request.push_str(body);
    stream.write_all(request.as_bytes()).await.ok()?;
    status(&read_until_closed(&mut stream, Duration::from_secs(10)).await?)
}
