//! The connection loop every service serves its router with: caps on connections (total and
//! per peer; who gives up a slot when they run short is `slots`'s) applied at accept, before
//! a byte is read; TLS (`tls`) under HTTP/1.1;
//! a time limit on a request's head and one on its body; graceful shutdown on SIGTERM, after
//! which the service's last spans are exported (`telemetry`). The flags that set them
//! (`ListenArgs`) are shared by every service binary.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::ConnectInfo;
use hyper::body::{Frame, Incoming, SizeHint};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tower::ServiceExt as _;

use crate::quiet::Quiet;
use crate::slots::{ConnectionHandle, Slot, Slots};
use autocomp_toolkit::tls::{ServerTls, ServerTlsFiles};

pub use crate::slots::mark_authenticated;

/// How a service listens: TLS, and the limits that keep a slow or hostile client from
/// holding its memory or its connections. Flatten into a binary's clap command.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "TLS and connection limits")]
pub struct ListenArgs {
    /// Serve HTTPS with this certificate chain (PEM). It is read again when the file
    /// changes (looked at every 2 s) or on SIGHUP; connections in flight keep theirs.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM: PKCS#8, PKCS#1 or SEC1).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Accept only clients presenting a certificate signed by this CA (PEM bundle): mutual
    /// TLS. Needs --tls-cert.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,
    /// Connections served at once. When they are all held, a newcomer takes the slot of the
    /// one that has waited longest without a request in progress (a head not yet sent, or
    /// idle between requests); a quarter is kept for clients that presented a valid token
    /// or session, which are never evicted. Only when none can go is a newcomer closed as
    /// soon as it is accepted.
    #[arg(long, value_name = "N", default_value_t = Limits::default().max_connections, value_parser = at_least_one)]
    pub max_connections: u32,
    /// Connections served at once from one client: an IPv4 address, an IPv6 /64, or this
    /// host (all of 127/8 and ::1). A client at its cap gives up its own longest-waiting
    /// connection for a new one. A reverse proxy in front is one client: raise this for it.
    #[arg(long, value_name = "N", value_parser = at_least_one,
          default_value_t = Limits::default().max_connections_per_ip)]
    pub max_connections_per_ip: u32,
    /// Time a client has to send a request's head (its TLS handshake included), also
    /// between two requests on one connection; then the connection is closed.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = positive_duration)]
    pub header_timeout: Duration,
    /// Time a client has to send a request's body once its head arrived; then 408.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = positive_duration)]
    pub body_timeout: Duration,
}

fn at_least_one(text: &str) -> Result<u32, String> {
    match text.trim().parse::<u32>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(format!("{e} (a number of connections, e.g. 64)")),
    }
}

fn positive_duration(text: &str) -> Result<Duration, String> {
    match humantime::parse_duration(text) {
        Ok(duration) if !duration.is_zero() => Ok(duration),
        Ok(_) => Err("must be more than 0 (write e.g. 10s, 1m)".into()),
        Err(e) => Err(format!("{e} (write e.g. 10s, 1m)")),
    }
}

impl Default for ListenArgs {
    fn default() -> Self {
        let limits = Limits::default();
        Self {
            tls_cert: None,
            tls_key: None,
            tls_client_ca: None,
            max_connections: limits.max_connections,
            max_connections_per_ip: limits.max_connections_per_ip,
            header_timeout: limits.header_timeout,
            body_timeout: limits.body_timeout,
        }
    }
}

impl ListenArgs {
    pub fn limits(&self) -> Limits {
        Limits {
            max_connections: self.max_connections,
            max_connections_per_ip: self.max_connections_per_ip,
            header_timeout: self.header_timeout,
            body_timeout: self.body_timeout,
        }
    }

    /// The TLS files the flags name, if any.
    pub fn tls_files(&self) -> Option<ServerTlsFiles> {
        Some(ServerTlsFiles {
            cert: self.tls_cert.clone()?,
            key: self.tls_key.clone()?,
            client_ca: self.tls_client_ca.clone(),
        })
    }

    /// TLS as configured (read now: an error names the flag and the path), or None.
    pub fn tls(&self) -> Result<Option<Arc<ServerTls>>, String> {
        self.tls_files().map(ServerTls::load).transpose()
    }
}

/// The limits of the connection loop.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_connections: u32,
    pub max_connections_per_ip: u32,
    pub header_timeout: Duration,
    pub body_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: 512,
            max_connections_per_ip: 64,
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
        }
    }
}

/// Serves `router` on `listener` (over TLS when `tls`) until SIGTERM or SIGINT, then lets
/// requests in flight finish.
pub async fn serve_with(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    tls: Option<Arc<ServerTls>>,
) -> std::io::Result<()> {
    serve_until(listener, router, limits, tls, shutdown_signal()).await
}

/// `serve_with`, stopping when `stop` completes instead of on a signal.
pub async fn serve_until(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    tls: Option<Arc<ServerTls>>,
    stop: impl std::future::Future<Output = ()>,
) -> std::io::Result<()> {
    let watching = tls.as_ref().map(ServerTls::watch);
    let slots = Arc::new(Slots::new(limits.max_connections, limits.max_connections_per_ip));
    let lingering = Arc::new(AtomicU32::new(0));
    // Connections watch `stopping` to finish their request and close; each holds a clone
    // of `open` so that its closing is seen as the channel closing.
    let (stopping_tx, stopping) = watch::channel(false);
    let (open, mut all_closed) = mpsc::channel::<()>(1);
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(limits.header_timeout);
    let http = Arc::new(http);
    tokio::pin!(stop);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of descriptors or a connection reset while queued: the listener
                    // is fine; pause so an exhausted process does not spin.
                    tracing::warn!("accepting a connection: {error}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut stop => break,
        };
        // Under a flood of connections `accept` is always ready: let the connections just
        // spawned read their heads before more are admitted, or a newcomer could be evicted
        // for the next ones before it was ever read.
        tokio::task::yield_now().await;
        let Some(slot) = admit(&slots, peer) else {
            // Closed before a byte is read: a client over a cap costs an accept, nothing more.
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let connection = Connection {
            router: router.clone(),
            http: Arc::clone(&http),
            peer,
            limits,
            stopping: stopping.clone(),
            evicted: Arc::new(slot),
            requested: Arc::new(AtomicBool::new(false)),
            _open: open.clone(),
        };
        let acceptor = tls.as_ref().map(|tls| tls.acceptor());
        let lingering = Arc::clone(&lingering);
        tokio::spawn(async move {
            let (evicted, requested) = (Arc::clone(&connection.evicted), Arc::clone(&connection.requested));
            let run = connection.run(stream, acceptor);
            tokio::pin!(run);
            // Its slot went to a newcomer: dropping the connection closes its socket.
            tokio::select! {
                () = &mut run => {}
                () = evicted.evicted() => {
                    if !requested.load(Ordering::Relaxed) {
                        linger(&lingering, limits.max_connections, limits.header_timeout).await;
                    }
                }
            }
        });
    }
    drop(listener);
    if let Some(watching) = watching {
        watching.abort();
    }
    let _ = stopping_tx.send(true);
    drop(open);
    let _ = all_closed.recv().await;
    // A service's way out: the spans of the requests it answered go to the collector now,
    // bounded by the export timeout (off, this does nothing).
    if autocomp_toolkit::telemetry::enabled() {
        let _ = tokio::task::spawn_blocking(autocomp_toolkit::telemetry::shutdown).await;
    }
    Ok(())
}

/// How long an evicted connection that never sent a whole request is held, unread, before
/// it is closed: a client that opens a new connection whenever one is closed would
/// otherwise turn the accept queue over as fast as it can (filling it, so that a newcomer's
/// connection waits for a SYN retransmission), where now it waits this long for each.
const LINGER: Duration = Duration::from_secs(1);

/// Holds an evicted connection (the caller's, not polled meanwhile) for `LINGER` (at most
/// the header timeout), unless `max` are lingering already: their descriptors are bounded.
async fn linger(lingering: &AtomicU32, max: u32, header_timeout: Duration) {
    if lingering.fetch_add(1, Ordering::Relaxed) < max {
        tokio::time::sleep(LINGER.min(header_timeout)).await;
    }
    lingering.fetch_sub(1, Ordering::Relaxed);
}

/// A slot for a newcomer from `peer`, logging (summarized per client) what was evicted for
/// it, or that it is refused.
fn admit(slots: &Arc<Slots>, peer: SocketAddr) -> Option<Slot> {
    match slots.take(peer.ip()) {
        Ok((slot, taken)) => {
            for (evicted, cap) in taken.evicted {
                static EVICTED: Quiet = Quiet::new("connection closed for a newcomer");
                if EVICTED.allow_peer(Some(evicted)) {
                    tracing::warn!(
                        peer = %evicted,
                        "connection closed for a newcomer: {} reached; it had no request in progress",
                        cap.flag()
                    );
                }
            }
            Some(slot)
        }
        Err(cap) => {
            static REFUSED: Quiet = Quiet::new("connection closed at once");
            if REFUSED.allow(Some(peer.ip())) {
                tracing::warn!(
                    peer = %crate::slots::Peer::of(peer.ip()),
                    "connection closed at once: {} reached by requests in progress and signed-in clients",
                    cap.flag()
                );
            }
            None
        }
    }
}

/// One accepted connection, holding its slot under the caps until it closes.
struct Connection {
    router: Router,
    http: Arc<hyper::server::conn::http1::Builder>,
    peer: SocketAddr,
    limits: Limits,
    stopping: watch::Receiver<bool>,
    /// Its slot, also told when the slot is taken from it.
    evicted: Arc<Slot>,
    /// Whether a whole request head ever arrived.
    requested: Arc<AtomicBool>,
    _open: mpsc::Sender<()>,
}

impl Connection {
    /// Its TLS handshake, if any, then its requests.
    async fn run(self, stream: tokio::net::TcpStream, acceptor: Option<tokio_rustls::TlsAcceptor>) {
        let Some(acceptor) = acceptor else { return self.serve(stream).await };
        match tokio::time::timeout(self.limits.header_timeout, acceptor.accept(stream)).await {
            Ok(Ok(stream)) => self.serve(stream).await,
            Ok(Err(error)) => tracing::debug!(peer = %self.peer, "TLS handshake refused: {error}"),
            Err(_) => tracing::debug!(peer = %self.peer, "TLS handshake timed out"),
        }
    }

    async fn serve<I: AsyncRead + AsyncWrite + Unpin + Send + 'static>(mut self, io: I) {
        let (router, peer, body_timeout) = (self.router.clone(), self.peer, self.limits.body_timeout);
        let handle = self.evicted.handle();
        let requested = Arc::clone(&self.requested);
        let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
            // Evictable until its body has arrived; not while it is answered; again once the
            // answer is sent (the guard travels in the response body, dropped when written).
            let waiting = !hyper::body::Body::is_end_stream(request.body());
            if !waiting {
                handle.busy();
            }
            requested.store(true, Ordering::Relaxed);
            let guard = InProgress(handle.clone());
            let arrived = waiting.then(|| handle.clone());
            let mut request = request.map(|body| Body::new(TimedBody::new(body, body_timeout, arrived)));
            request.extensions_mut().insert(ConnectInfo(peer));
            request.extensions_mut().insert(handle.clone());
            let answer = router.clone().oneshot(request);
            async move {
                let response = answer.await?;
                Ok::<_, Infallible>(response.map(|body| Body::new(Answering { inner: body, _guard: guard })))
            }
        });
        let connection = self.http.serve_connection(TokioIo::new(io), service);
        tokio::pin!(connection);
        let result = tokio::select! {
            result = connection.as_mut() => result,
            () = stopped(&mut self.stopping) => {
                connection.as_mut().graceful_shutdown();
                connection.await
            }
        };
        if let Err(error) = result {
            // A client gone, or too slow with its head: its own business, not the service's.
            tracing::debug!(peer = %self.peer, "connection closed: {error}");
        }
    }
}

async fn stopped(stopping: &mut watch::Receiver<bool>) {
    // An error is the sender gone, which is the loop stopping too.
    let _ = stopping.wait_for(|stopping| *stopping).await;
}

/// A request in progress on a connection; when it is over (its answer written, or given
/// up), the connection is idle again.
struct InProgress(ConnectionHandle);

impl Drop for InProgress {
    fn drop(&mut self) {
        self.0.idle();
    }
}

/// A response body that holds its request's `InProgress` until hyper has written it.
struct Answering {
    inner: Body,
    _guard: InProgress,
}

impl hyper::body::Body for Answering {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The error a body read ends with when its time is up; the service answers it with 408.
#[derive(Debug)]
pub struct BodyTimedOut(pub Duration);

impl std::fmt::Display for BodyTimedOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the request body did not arrive within {}", humantime::format_duration(self.0))
    }
}

impl std::error::Error for BodyTimedOut {}

/// A request body that must arrive within its time, counted from the request's head; its
/// connection is told when it has arrived (`arrived`, taken then).
struct TimedBody {
    inner: Incoming,
    deadline: Pin<Box<tokio::time::Sleep>>,
    limit: Duration,
    arrived: Option<ConnectionHandle>,
}

impl TimedBody {
    fn new(inner: Incoming, limit: Duration, arrived: Option<ConnectionHandle>) -> Self {
        Self { inner, deadline: Box::pin(tokio::time::sleep(limit)), limit, arrived }
    }
}

impl hyper::body::Body for TimedBody {
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                if (frame.is_none() || this.inner.is_end_stream())
                    && let Some(handle) = this.arrived.take()
                {
                    handle.busy();
                }
                Poll::Ready(frame.map(|frame| frame.map_err(Into::into)))
            }
            Poll::Pending => match this.deadline.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Some(Err(Box::new(BodyTimedOut(this.limit))))),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Serves `router` on `listener`, plain HTTP with the default limits (`Limits`), until
/// SIGTERM or SIGINT, then finishes requests in flight. `serve_with` takes TLS and
/// other limits.
pub async fn serve(listener: tokio::net::TcpListener, router: axum::Router) -> std::io::Result<()> {
    serve_with(listener, router, Limits::default(), None).await
}

/// Waits for SIGTERM or SIGINT (forever, if no handler can be installed).
pub(crate) async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    tracing::info!("shutting down: finishing requests in flight");
}
