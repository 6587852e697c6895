//! Who is asking and from where, decided once per request before any handler runs: the
//! `Host` check (DNS rebinding), the client's address (a configured proxy's
//! `X-Forwarded-For` believed, nobody else's), the proxy's user header (honoured only from a
//! configured proxy address), the session cookie, and the read gate that asks for sign-in
//! when reads are not public.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::extract::{ConnectInfo, FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};

use super::access::Access;
use super::accounts::account_name;
use super::app::App;
use super::error::WebError;
use super::sessions::{SESSION_COOKIE, cookie};
use crate::filter::encode;
use autocomp_http::quiet::Quiet;

/// What `identify` found out about a request, in its extensions.
#[derive(Debug, Clone)]
pub struct Caller {
    pub access: Access,
    /// The client's address: the peer's, or the one a trusted proxy forwarded.
    pub client: Option<IpAddr>,
    /// The session id the request presented, if it is a live session.
    pub session: Option<String>,
    /// Cookies set for this client get `Secure` (served over TLS, directly or by the proxy).
    pub secure: bool,
}

impl Caller {
    pub fn of(extensions: &axum::http::Extensions) -> Caller {
        extensions.get::<Caller>().cloned().unwrap_or(Caller {
            access: Access::SignedOut,
            client: None,
            session: None,
            secure: false,
        })
    }
}

impl FromRequestParts<Arc<App>> for Caller {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &Arc<App>) -> Result<Self, Self::Rejection> {
        Ok(Caller::of(&parts.extensions))
    }
}

impl FromRequestParts<Arc<App>> for Access {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &Arc<App>) -> Result<Self, Self::Rejection> {
        Ok(Caller::of(&parts.extensions).access)
    }
}

/// An IPv4 client seen over IPv6 is the IPv4 address.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// The address the proxy appended last to `X-Forwarded-For` (the ones before it are the
/// client's own claims).
fn forwarded_for(headers: &HeaderMap) -> Option<IpAddr> {
    let last = headers.get_all("x-forwarded-for").iter().next_back()?.to_str().ok()?;
    last.rsplit(',').next()?.trim().parse().ok().map(canonical)
}

/// Decides the request's `Caller` and hands it on.
pub async fn identify(State(app): State<Arc<App>>, mut request: Request, next: Next) -> Response {
    let peer = request.extensions().get::<ConnectInfo<SocketAddr>>().map(|c| canonical(c.0.ip()));
    let options = &app.options;
    let from_proxy = peer.is_some_and(|p| options.trusted_proxies.contains(&p));
    let headers = request.headers();
    let client = if from_proxy { forwarded_for(headers).or(peer) } else { peer };
    let secure = options.secure_cookies
        || (from_proxy && headers.get("x-forwarded-proto").is_some_and(|proto| proto == "https"));
    let (access, session) = app.access_of(headers, from_proxy, peer);
    if let Access::SignedIn { .. } = access {
        // Its connection keeps its slot when a crowd of slow clients comes.
        autocomp_http::serve::mark_authenticated(request.extensions());
    }
    request.extensions_mut().insert(Caller { access, client, session, secure });
    next.run(request).await
}

impl App {
    fn access_of(&self, headers: &HeaderMap, from_proxy: bool, peer: Option<IpAddr>) -> (Access, Option<String>) {
        let Some(accounts) = &self.options.accounts else { return (Access::ReadOnly, None) };
        let users = accounts.current();
        if let Some(name) = &self.options.trusted_user_header
            && let Some(value) = headers.get(name)
        {
            if !from_proxy {
                static QUIET: Quiet = Quiet::new("ignored the user header from an address that is not a proxy's");
                if QUIET.allow(peer) {
                    let peer = peer.map_or("an unknown address".into(), |p| p.to_string());
                    tracing::warn!(header = %name, %peer, "ignored the user header: {peer} is not a --trusted-proxy address");
                }
            } else {
                let text = String::from_utf8_lossy(value.as_bytes());
                let found = account_name(name.as_str(), &text).map(|n| users.get(&n).cloned());
                return match found {
                    Ok(Some(account)) => {
                        (Access::SignedIn { name: account.name, role: account.role, via_proxy: true }, None)
                    }
                    Ok(None) => {
                        static QUIET: Quiet = Quiet::new("the proxy named a user without an account");
                        if QUIET.allow(peer) {
                            tracing::warn!(
                                header = %name,
                                "the proxy named {text:?}, which has no account in the users file"
                            );
                        }
                        (Access::SignedOut, None)
                    }
                    Err(error) => {
                        static QUIET: Quiet = Quiet::new("the proxy's user header refused");
                        if QUIET.allow(peer) {
                            tracing::warn!("the proxy's user header is refused: {error}");
                        }
                        (Access::SignedOut, None)
                    }
                };
            }
        }
        let Some(id) = cookie(headers, SESSION_COOKIE).filter(|id| !id.is_empty()) else {
            return (Access::SignedOut, None);
        };
        let Some(holder) = self.sessions.get(id) else { return (Access::SignedOut, None) };
        match users.get(&holder.account) {
            Some(account) if account.hash == holder.credential => (
                Access::SignedIn { name: account.name.clone(), role: account.role, via_proxy: false },
                Some(id.to_owned()),
            ),
            // Removed, or its password changed, since it signed in.
            _ => {
                self.sessions.remove(id);
                (Access::SignedOut, None)
            }
        }
    }
}

/// Refuses a request whose `Host` is not one of the monitor's names (421): a page of
/// another site whose name was re-pointed at this address (DNS rebinding) must not read
/// it. `/health` answers whatever the name, for load balancers and probes.
pub async fn check_host(State(app): State<Arc<App>>, request: Request, next: Next) -> Response {
    let names = &app.options.host_names;
    if names.is_empty() || request.uri().path() == "/health" {
        return next.run(request).await;
    }
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .map(str::to_owned)
        .or_else(|| request.uri().authority().map(|a| a.to_string()));
    let Some(host) = host else {
        return WebError::new(StatusCode::BAD_REQUEST, "No Host header", "the request names no host").into_response();
    };
    if names.iter().any(|name| host_matches(name, &host)) {
        return next.run(request).await;
    }
    static QUIET: Quiet = Quiet::new("refused a request for a host name that is not this monitor's");
    let peer = request.extensions().get::<ConnectInfo<SocketAddr>>().map(|peer| peer.0.ip());
    if QUIET.allow(peer) {
        tracing::warn!(host, "refused a request for a host name that is not this monitor's (see --host-name)");
    }
    WebError::new(
        StatusCode::MISDIRECTED_REQUEST,
        "Unknown host name",
        format!("this monitor does not answer to the host name {host:?}; it answers to: {}", names.join(", ")),
    )
    .into_response()
}

/// `host[:port]` or `[v6][:port]`, lower-cased.
fn split_host(text: &str) -> (String, Option<&str>) {
    let text = text.trim();
    if let Some(rest) = text.strip_prefix('[')
        && let Some((inner, after)) = rest.split_once(']')
    {
        return (format!("[{}]", inner.to_ascii_lowercase()), after.strip_prefix(':'));
    }
    match text.rsplit_once(':') {
        Some((host, port)) if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) => {
            (host.to_ascii_lowercase(), Some(port))
        }
        _ => (text.to_ascii_lowercase(), None),
    }
}

/// Whether the request's `host` is the configured `name` (any port unless it names one).
pub fn host_matches(name: &str, host: &str) -> bool {
    let (want, want_port) = split_host(name);
    let (got, got_port) = split_host(host);
    let got = got.strip_suffix('.').unwrap_or(&got);
    want == got && want_port.is_none_or(|p| Some(p) == got_port)
}

/// With reads needing sign-in, a request that is not signed in reads nothing: a browser is
/// sent to the sign-in form, anything else gets 401.
pub async fn reads(State(app): State<Arc<App>>, request: Request, next: Next) -> Response {
    if !app.options.reads_need_sign_in || Caller::of(request.extensions()).access.may_read() {
        return next.run(request).await;
    }
    let wants_html = request
        .headers()
        .get(header::ACCEPT)
        .and_then(|a| a.to_str().ok())
        .is_some_and(|accept| accept.contains("text/html"));
    if wants_html && request.method() == Method::GET {
        let here = request.uri().path_and_query().map_or("/", |pq| pq.as_str());
        return Redirect::to(&format!("/login?next={}", encode(here))).into_response();
    }
    WebError::new(StatusCode::UNAUTHORIZED, "Not signed in", "reading this monitor needs sign-in")
        .with_link("/login", "Sign in")
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_names_match_with_or_without_a_port() {
        assert!(host_matches("localhost", "localhost:7072"));
        assert!(host_matches("localhost", "LOCALHOST"));
        assert!(host_matches("monitor.example", "monitor.example.:443"));
        assert!(host_matches("127.0.0.1:7072", "127.0.0.1:7072"));
        assert!(!host_matches("127.0.0.1:7072", "127.0.0.1:8080"));
        assert!(host_matches("[::1]", "[::1]:7072"));
        for evil in ["evil.example", "localhost.evil.example", "evil.example:7072", "", "[::2]:7072"] {
            assert!(!host_matches("localhost", evil) && !host_matches("[::1]", evil), "{evil}");
        }
    }

    #[test]
    fn only_the_proxys_own_forwarded_address_counts() {
        let mut headers = HeaderMap::new();
        headers.append("x-forwarded-for", "6.6.6.6, 10.1.1.1".parse().unwrap());
        assert_eq!(forwarded_for(&headers), Some("10.1.1.1".parse().unwrap()));
        headers.append("x-forwarded-for", "::ffff:10.2.2.2".parse().unwrap());
        assert_eq!(forwarded_for(&headers), Some("10.2.2.2".parse().unwrap()));
    }
}
