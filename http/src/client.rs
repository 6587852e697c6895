//! The HTTP client side shared by `HttpStore` and sboi's `HttpIndex`: one POST per
//! operation (typed by its declaration, `api::Operation`), the bearer token, error bodies
//! mapped back to typed errors, retries that ride out a service restart without ever
//! repeating a write that is not safe to repeat, failover between several instances of a
//! service (`http://a:7071,http://b:7071`), `https://` trusting a private CA
//! (`tls::ClientTls`), and inside a trace a client span whose `traceparent` each attempt
//! carries (`telemetry`).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use reqwest::StatusCode;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::api::Operation;
use super::error::ErrorBody;
use super::protocol::{Handshake, Offered, PROTOCOL, PROTOCOL_HEADER};
use autocomp_model::InvalidInput;
use autocomp_toolkit::error_chain::error_chain;
use autocomp_toolkit::tls::ClientTls;

/// Whether an operation may be sent again when its first attempt may have been applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// Reads, and writes whose repetition changes nothing (idempotency key, same value).
    Safe,
    /// Retried only when the request surely never reached the service (connection refused).
    OnlyUnsent,
}

/// Why a call failed.
#[derive(Debug)]
pub enum CallError {
    /// The service answered with an error body.
    Api { status: StatusCode, body: ErrorBody },
    /// No usable answer: unreachable, timed out, or an answer that is not ours.
    Unreachable(String),
    /// The service's certificate failed verification (unknown CA, wrong host name, expired):
    /// a configuration error of this host, never retried (no wait makes it pass).
    Untrusted(InvalidInput),
    /// The service is of an older release that does not offer the operation; nothing was
    /// sent. The message names both releases and the upgrade order.
    Older(String),
}

/// A JSON-over-HTTP client for one autocomp service, at one or several addresses.
pub struct HttpClient {
    bases: Vec<String>,
    /// The address that answered last: calls go there first.
    current: AtomicUsize,
    what: &'static str,
    http: reqwest::Client,
    token: Option<String>,
    retry_for: Duration,
    /// Until the service has answered once, a refused connection fails at once: a cron
    /// start against a service that is down should exit 5 now, not in `retry_for`.
    reached: AtomicBool,
    /// `$AUTOCOMP_CA_FILE` as read, for the message when a certificate is not trusted.
    ca_file: Option<std::path::PathBuf>,
    /// What the service offers, read once (`offered`): `None` when it could not be read.
    handshake: tokio::sync::OnceCell<Option<Handshake>>,
}

/// The knobs of an `http://` backend URL: `http://host:port[?retry_for=30s]`, or several
/// instances of one service, `http://a:7071,http://b:7071[?retry_for=30s]`.
pub struct ClientOptions {
    pub bases: Vec<String>,
    pub retry_for: Duration,
}

impl ClientOptions {
    pub fn parse(url: &str, field: &str) -> Result<Self, InvalidInput> {
        let (list, query) = url.split_once('?').unwrap_or((url, ""));
        let mut bases = Vec::new();
        for base in list.split(',').map(|b| b.trim().trim_end_matches('/')) {
            let authority = base.strip_prefix("http://").or_else(|| base.strip_prefix("https://")).unwrap_or("");
            if authority.is_empty() || authority.contains('/') {
                let expected = "expected http://host:port, or several separated by commas";
                return Err(InvalidInput::new(
                    field,
                    autocomp_toolkit::display_url(url),
                    format!("{:?}: {expected}", autocomp_toolkit::display_url(base)),
                ));
            }
            if !bases.iter().any(|known| known == base) {
                bases.push(base.to_string());
            }
        }
        let mut options = Self { bases, retry_for: Duration::from_secs(30) };
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            match pair.split_once('=') {
                Some(("retry_for", value)) => {
                    options.retry_for = humantime::parse_duration(value).map_err(|e| {
                        InvalidInput::new(field, autocomp_toolkit::display_url(url), format!("retry_for={value}: {e}"))
                    })?;
                }
                _ => {
                    return Err(InvalidInput::new(
                        field,
                        autocomp_toolkit::display_url(url),
                        // The name only: an unknown parameter's value may be a secret.
                        format!("unknown parameter {:?}; known: retry_for", pair.split('=').next().unwrap_or(pair)),
                    ));
                }
            }
        }
        Ok(options)
    }
}

/// The token clients send: `$AUTOCOMP_TOKEN`, else the file `$AUTOCOMP_TOKEN_FILE` names.
pub fn client_token() -> Result<Option<String>, InvalidInput> {
    if let Some(token) = std::env::var("AUTOCOMP_TOKEN").ok().filter(|t| !t.trim().is_empty()) {
        return Ok(Some(token.trim().to_string()));
    }
    match std::env::var("AUTOCOMP_TOKEN_FILE").ok().filter(|p| !p.is_empty()) {
        None => Ok(None),
        // A service's token file may list a new token beside the old one; a client shows
        // the first.
        Some(path) => std::fs::read_to_string(&path)
            .inspect(|_| {
                autocomp_toolkit::file_modes::warn_if_exposed(
                    std::path::Path::new(&path),
                    "the token file $AUTOCOMP_TOKEN_FILE",
                )
            })
            .map_err(|e| e.to_string())
            .and_then(|text| crate::service::Tokens::parse(&text, "$AUTOCOMP_TOKEN_FILE"))
            .map(|tokens| Some(tokens.shown().to_string()))
            .map_err(|reason| InvalidInput::new("AUTOCOMP_TOKEN_FILE", path, reason)),
    }
}

/// Warns, once per process and before any connection, when a token would travel over plain
/// `http://` to a host that is not this one: anyone on the path reads it (as `zk://` and
/// `sslmode=prefer` warn).
fn warn_if_token_in_the_clear(bases: &[String]) {
    static WARNED: std::sync::Once = std::sync::Once::new();
    let off_host = bases.iter().find(|base| {
        base.strip_prefix("http://").is_some_and(|rest| {
            let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
            let host = authority.rsplit_once('@').map_or(authority, |(_, host)| host);
            let host = match host.strip_prefix('[') {
                Some(v6) => v6.split(']').next().unwrap_or(""),
                None => host.rsplit_once(':').map_or(host, |(name, _)| name),
            };
            !is_loopback(host)
        })
    });
    if let Some(base) = off_host {
        WARNED.call_once(|| {
            tracing::warn!(
                "the token goes in the clear to {} (plain http:// to another host): anyone on the network can read \
                 it; use https://",
                autocomp_toolkit::display_url(base)
            );
        });
    }
}

/// `localhost`, or an address in 127/8 or `::1`: the connection never leaves this host.
fn is_loopback(host: &str) -> bool {
    host.eq_ignore_ascii_case("localhost") || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

impl HttpClient {
    /// A client for `options`' addresses; `https://` ones trust and show what
    /// `ClientTls::from_env` reads (bad input naming the variable and path when a file
    /// cannot be used).
    pub fn new(options: ClientOptions, what: &'static str, token: Option<String>) -> Result<Self, InvalidInput> {
        Self::with_tls(options, what, token, &ClientTls::from_env())
    }

    /// `new` with the TLS files given instead of read from the environment.
    pub fn with_tls(
        options: ClientOptions,
        what: &'static str,
        token: Option<String>,
        tls: &ClientTls,
    ) -> Result<Self, InvalidInput> {
        // Idle connections are dropped before a service's --header-timeout (10 s by default)
        // closes them, so a request is not sent on a connection being closed.
        let mut builder = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .pool_idle_timeout(Duration::from_secs(5));
        // Our own rustls configuration: ring named explicitly, the system store and
        // $AUTOCOMP_CA_FILE besides webpki's roots, and the client's certificate. Only read
        // when used, so a plain-HTTP client is not refused over TLS files it never needs.
        if options.bases.iter().any(|base| base.starts_with("https://")) {
            builder = builder.use_preconfigured_tls(tls.config()?);
        }
        let shown: Vec<String> = options.bases.iter().map(|base| autocomp_toolkit::display_url(base)).collect();
        if token.is_some() {
            warn_if_token_in_the_clear(&options.bases);
        }
        let http = builder.build().map_err(|e| InvalidInput::new(what, shown.join(","), shown_error(&e)))?;
        Ok(Self {
            bases: options.bases,
            current: AtomicUsize::new(0),
            what,
            http,
            token,
            retry_for: options.retry_for,
            reached: AtomicBool::new(false),
            ca_file: tls.ca_file.clone(),
            handshake: tokio::sync::OnceCell::new(),
        })
    }

    /// Sends `O`'s request and decodes its answer, retrying as `retry` allows for up to
    /// `retry_for`. `timeout` bounds each attempt (long polls need more).
    pub async fn call<O: Operation>(
        &self,
        request: &O::Request,
        retry: Retry,
        timeout: Option<Duration>,
    ) -> Result<O::Answer, CallError> {
        use tracing::Instrument;
        // Retries and failover included: the span is the caller's wait. Disabled (free)
        // when telemetry is off or the caller is in no trace.
        let span = autocomp_toolkit::telemetry::client_span(self.what, O::NAME);
        async {
            if let Some(handshake) = self.offered().await
                && handshake.offers(O::NAME) == Some(false)
            {
                return Err(CallError::Older(handshake.refusal(self.what, &self.shown_base(), O::NAME)));
            }
            self.post(O::NAME, request, retry, timeout).await
        }
        .instrument(span)
        .await
    }

    /// What the service offers, read once with `GET /protocol` (`protocol`): `None` when it
    /// could not be read then (unreachable, or an answer that is not an offer): calls go
    /// out, and an operation the service lacks is found out by its answer.
    pub async fn offered(&self) -> Option<&Handshake> {
        // Asked once whatever the answer: a service that does not answer it (or not in time)
        // costs the first call 2 s, not every call.
        self.handshake.get_or_init(|| async { self.handshake().await.ok() }).await.as_ref()
    }

    async fn handshake(&self) -> Result<Handshake, ()> {
        let index = self.current.load(Ordering::Relaxed) % self.bases.len();
        // Short: a service that does not answer is found out by the call that follows.
        let mut request = self.http.get(format!("{}/protocol", self.bases[index])).timeout(Duration::from_secs(2));
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        let response = request.header(PROTOCOL_HEADER, PROTOCOL).send().await.map_err(drop)?;
        match response.status() {
            // A release before protocol 2: no such path.
            StatusCode::NOT_FOUND => Ok(Handshake::BeforeProtocol),
            status if status.is_success() => response.json::<Offered>().await.map(Handshake::Listed).map_err(drop),
            _ => Err(()),
        }
    }

    /// The address calls go to, as `display_url` shows it.
    fn shown_base(&self) -> String {
        autocomp_toolkit::display_url(&self.bases[self.current.load(Ordering::Relaxed) % self.bases.len()])
    }

    /// POSTs `request` to `/v1/<operation>` and decodes the answer (see `call`).
    async fn post<Req: Serialize + ?Sized, Resp: DeserializeOwned>(
        &self,
        operation: &str,
        request: &Req,
        retry: Retry,
        timeout: Option<Duration>,
    ) -> Result<Resp, CallError> {
        // Shared, not copied, by each attempt.
        let body =
            Bytes::from(serde_json::to_vec(request).map_err(|e| CallError::Unreachable(format!("encoding: {e}")))?);
        let started = Instant::now();
        let mut pause = Duration::from_millis(50);
        // Addresses tried since the last pause: each gets one attempt before we wait.
        let mut tried = 0;
        loop {
            let index = self.current.load(Ordering::Relaxed) % self.bases.len();
            let base = &self.bases[index];
            let url = format!("{base}/v1/{operation}");
            let (error, may_repeat) = match self.attempt(&url, body.clone(), timeout).await {
                Ok(response) => match self.decode(base, operation, response).await {
                    Ok(decoded) => return Ok(decoded),
                    // The service was up but could not do it now (e.g. the database busy):
                    // nothing was committed, but only safe operations go round again.
                    Err(CallError::Api { status, body }) if status == StatusCode::SERVICE_UNAVAILABLE => {
                        (CallError::Api { status, body }, retry == Retry::Safe)
                    }
                    Err(other) => return Err(other),
                },
                Err(error) if let Some(reason) = untrusted_certificate(&error) => {
                    let trusted = self.ca_file.as_ref().map_or("the system's CAs and webpki's".into(), |ca| {
                        format!("$AUTOCOMP_CA_FILE={}", ca.display())
                    });
                    let reason = format!("the server's certificate is not trusted: {reason} (trusting {trusted})");
                    // Another instance may have a good one: failover, but never a wait.
                    (
                        CallError::Untrusted(InvalidInput::new(self.what, autocomp_toolkit::display_url(base), reason)),
                        true,
                    )
                }
                Err(error) => {
                    let unsent = error.is_connect();
                    let mut message = format!(
                        "{} at {} unreachable ({operation}): {}",
                        self.what,
                        autocomp_toolkit::display_url(base),
                        shown_error(&error)
                    );
                    if !unsent && retry == Retry::OnlyUnsent {
                        message
                            .push_str("; it may have been done before the connection broke: look before repeating it");
                    }
                    (CallError::Unreachable(message), unsent || retry == Retry::Safe)
                }
            };
            // Another instance of the service may answer at once: try it before waiting.
            tried += 1;
            if may_repeat && tried < self.bases.len() {
                let next = (index + 1) % self.bases.len();
                self.current.store(next, Ordering::Relaxed);
                let (shown, next) =
                    (autocomp_toolkit::display_url(base), autocomp_toolkit::display_url(&self.bases[next]));
                tracing::warn!(operation, "{} at {shown} not answering; trying {next}", self.what);
                continue;
            }
            tried = 0;
            if matches!(error, CallError::Untrusted(_)) {
                return Err(error);
            }
            // Until the service has answered once, a refused connection fails at once.
            let may_retry = may_repeat && self.reached.load(Ordering::Relaxed);
            if !may_retry || started.elapsed() + pause > self.retry_for {
                return Err(match error {
                    CallError::Unreachable(message) if may_retry => {
                        CallError::Unreachable(format!("{message}; gave up after {:?}", self.retry_for))
                    }
                    other => other,
                });
            }
            tracing::warn!(operation, retry_in = ?pause, "{} not answering; retrying", self.what);
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(1));
            if self.bases.len() > 1 {
                self.current.store((index + 1) % self.bases.len(), Ordering::Relaxed);
            }
        }
    }

    async fn attempt(
        &self,
        url: &str,
        body: Bytes,
        timeout: Option<Duration>,
    ) -> Result<reqwest::Response, reqwest::Error> {
        let mut request = self
            .http
            .post(url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header(PROTOCOL_HEADER, PROTOCOL)
            .timeout(timeout.unwrap_or(REQUEST_TIMEOUT))
            .body(body);
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        if autocomp_toolkit::telemetry::enabled() {
            let mut headers = reqwest::header::HeaderMap::new();
            autocomp_toolkit::telemetry::inject(&mut headers);
            request = request.headers(headers);
        }
        request.send().await
    }

    async fn decode<Resp: DeserializeOwned>(
        &self,
        base: &str,
        operation: &str,
        response: reqwest::Response,
    ) -> Result<Resp, CallError> {
        let status = response.status();
        let bytes = response.bytes().await.map_err(|e| {
            CallError::Unreachable(format!(
                "{} at {}: reading the answer to {operation}: {}",
                self.what,
                autocomp_toolkit::display_url(base),
                shown_error(&e)
            ))
        })?;
        self.reached.store(true, Ordering::Relaxed);
        if status.is_success() {
            return serde_json::from_slice(&bytes).map_err(|e| {
                CallError::Unreachable(format!(
                    "{} at {} answered {operation} with something else: {e}",
                    self.what,
                    autocomp_toolkit::display_url(base)
                ))
            });
        }
        match serde_json::from_slice::<ErrorBody>(&bytes) {
            Ok(mut body) => {
                if status == StatusCode::UNAUTHORIZED {
                    body.error.message = format!(
                        "the {} at {} refused {operation}: {}",
                        self.what,
                        autocomp_toolkit::display_url(base),
                        body.error.message
                    );
                }
                Err(CallError::Api { status, body })
            }
            Err(_) => Err(CallError::Unreachable(format!(
                "{} at {} answered {operation} with HTTP {status}: {}",
                self.what,
                autocomp_toolkit::display_url(base),
                String::from_utf8_lossy(&bytes[..bytes.len().min(200)])
            ))),
        }
    }
}

/// Why the server's certificate failed verification, if that is why `error` happened: a
/// `rustls::Error::InvalidCertificate` somewhere in its sources (an `io::Error` hides its
/// inner error from `source()`, and hyper wraps one `io::Error` in another: each is opened).
fn untrusted_certificate(error: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut next = Some(error);
    while let Some(error) = next {
        if let Some(rustls::Error::InvalidCertificate(reason)) = error.downcast_ref::<rustls::Error>() {
            return Some(reason.to_string());
        }
        next = match error.downcast_ref::<std::io::Error>() {
            Some(io) => io.get_ref().map(|inner| inner as &(dyn std::error::Error + 'static)),
            None => error.source(),
        };
    }
    None
}

/// A client error on one line, its sources included, with every URL in it (reqwest names the
/// request's, which may carry a user and password) shown as `display_url` shows it.
fn shown_error(error: &dyn std::error::Error) -> String {
    autocomp_toolkit::redact::redact_urls_in(&error_chain(error))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_password_in_a_service_url_is_never_in_an_error() {
        let Err(refused) = ClientOptions::parse("https://alice:S3cr3t@store:7070/extra", "store url") else {
            panic!("a base with a path is refused")
        };
        assert!(!refused.to_string().contains("S3cr3t") && refused.to_string().contains("alice:***"), "{refused}");
        let Err(refused) = ClientOptions::parse("https://store:7070?token=S3cr3t", "store url") else {
            panic!("an unknown parameter is refused")
        };
        assert!(!refused.to_string().contains("S3cr3t") && refused.to_string().contains("\"token\""), "{refused}");
        // reqwest names the request's URL in its errors.
        #[derive(Debug)]
        struct Sending;
        impl std::fmt::Display for Sending {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "error sending request for url (https://alice:S3cr3t@store:7070/v1/head)")
            }
        }
        impl std::error::Error for Sending {}
        let shown = shown_error(&Sending);
        assert!(!shown.contains("S3cr3t") && shown.contains("alice:***@store:7070"), "{shown}");
    }
}
