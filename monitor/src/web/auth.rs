//! Signing in and out: the sign-in form (an account's name and password, checked against
//! its argon2 hash off the async threads, limited per client address and slowed down per
//! account and address, the same for known and unknown names),
//! the session cookie (a random id, HttpOnly, SameSite=Strict, Secure over TLS), signing out
//! (the session deleted server-side); the refusal of cross-site writes before anything else;
//! and the one-time result message carried across a redirect.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::rejection::FormRejection;
use axum::extract::{Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use axum::{Form, http};
use serde::Deserialize;

use super::access::Access;
use super::accounts::{Account, MAX_NAME_CHARS, PROXY_ONLY, account_name, verify_password};
use super::app::App;
use super::error::WebError;
use super::gate::Caller;
use super::html::{Nav, Page, attr, esc, w};
use super::limits::address_key;
use super::sessions::Holder;
use super::sessions::{SESSION_COOKIE, cookie};
use crate::filter::encode;
use autocomp_http::quiet::Quiet;

pub const FLASH_COOKIE: &str = "autocomp_flash";

/// Longest flash message kept (the cookie, percent-encoded, must stay under 4 KiB).
const MAX_FLASH_CHARS: usize = 1_000;

/// Reverses `filter::encode`; `None` for malformed escapes or bytes that are not UTF-8.
pub fn decode(text: &str) -> Option<String> {
    let mut bytes = Vec::with_capacity(text.len());
    let mut rest = text.bytes();
    while let Some(byte) = rest.next() {
        match byte {
            b'+' => bytes.push(b' '),
            b'%' => {
                let hex = [rest.next()?, rest.next()?];
                bytes.push(u8::from_str_radix(std::str::from_utf8(&hex).ok()?, 16).ok()?);
            }
            other => bytes.push(other),
        }
    }
    String::from_utf8(bytes).ok()
}

/// `Set-Cookie` for one of the monitor's cookies; `None` clears it. `secure`: the client
/// reaches us over TLS, so the browser must never send it in the clear.
fn set_cookie(secure: bool, name: &str, value: Option<&str>, max_age: Option<u64>) -> HeaderValue {
    let mut text = format!("{name}={}; Path=/; HttpOnly; SameSite=Strict", value.unwrap_or(""));
    match (value, max_age) {
        (None, _) => text.push_str("; Max-Age=0"),
        (Some(_), Some(seconds)) => w!(text, "; Max-Age={seconds}"),
        (Some(_), None) => {}
    }
    if secure {
        text.push_str("; Secure");
    }
    HeaderValue::from_str(&text).expect("cookie values are percent-encoded or hex")
}

/// A one-time message for the page a redirect leads to.
pub fn flash_cookie(secure: bool, message: &str) -> HeaderValue {
    let mut kept: String = message.chars().take(MAX_FLASH_CHARS).collect();
    if kept.len() < message.len() {
        kept.push('…');
    }
    set_cookie(secure, FLASH_COOKIE, Some(&encode(&kept)), Some(120))
}

/// The flash message of the request, if any, and the header that clears it.
pub fn take_flash(headers: &HeaderMap, secure: bool) -> Option<(String, HeaderValue)> {
    let message = cookie(headers, FLASH_COOKIE).filter(|v| !v.is_empty()).and_then(decode)?;
    Some((message, set_cookie(secure, FLASH_COOKIE, None, None)))
}

/// Refuses a write another site's page could have sent (403), before anything else looks
/// at the request: `Sec-Fetch-Site` must be `same-origin` or absent (an old browser, a
/// script), and an `Origin`, if sent, must be this very host. The SameSite=Strict cookie is
/// the second line.
pub async fn refuse_cross_site(request: Request, next: Next) -> Response {
    if matches!(*request.method(), Method::GET | Method::HEAD) {
        return next.run(request).await;
    }
    match cross_site(request.headers()) {
        Some(why) => {
            static QUIET: Quiet = Quiet::new("refused a cross-site write");
            let peer = request.extensions().get::<axum::extract::ConnectInfo<std::net::SocketAddr>>();
            if QUIET.allow(peer.map(|peer| peer.0.ip())) {
                tracing::warn!(method = %request.method(), path = request.uri().path(), "refused a cross-site write: {why}");
            }
            WebError::new(StatusCode::FORBIDDEN, "Cross-site request refused", format!("{why}; nothing was changed"))
                .into_response()
        }
        None => next.run(request).await,
    }
}

fn cross_site(headers: &HeaderMap) -> Option<String> {
    if let Some(site) = headers.get("sec-fetch-site")
        && site != "same-origin"
    {
        return Some(format!(
            "this form was sent from another site (Sec-Fetch-Site: {})",
            String::from_utf8_lossy(site.as_bytes())
        ));
    }
    let origin = headers.get(header::ORIGIN)?;
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or_default();
    let same = [format!("http://{host}"), format!("https://{host}")].iter().any(|own| origin == own.as_str());
    (!same || host.is_empty()).then(|| {
        format!("this form was sent from {} (not this monitor's own pages)", String::from_utf8_lossy(origin.as_bytes()))
    })
}

#[derive(Deserialize, Default)]
pub struct NextParam {
    next: Option<String>,
}

/// Only a path of this site: never `//host` or `https://...` (an open redirect), and no
/// control character anywhere: browsers drop a TAB or a line feed from a URL, so `/\t/host`
/// is `//host` to them, and CR, LF, VT or DEL cannot go in a `Location` header at all.
fn local_path(next: Option<&str>) -> &str {
    match next {
        Some(path)
            if path.starts_with('/')
                && !path.starts_with("//")
                && !path.contains('\\')
                && !path.chars().any(is_control) =>
        {
            path
        }
        _ => "/",
    }
}

/// C0, DEL, C1, and the Unicode line and paragraph separators.
fn is_control(c: char) -> bool {
    c.is_control() || c == '\u{2028}' || c == '\u{2029}'
}

fn login_page(app: &App, access: &Access, next: &str, name: &str, problem: Option<&str>) -> String {
    let mut body = String::from("<h1>Sign in</h1>\n");
    if app.options.accounts.is_none() {
        body.push_str("<p>This monitor has no accounts (it was started without --users): nobody can sign in.</p>");
    } else {
        if let Some(problem) = problem {
            w!(body, "<p class=\"error\" role=\"alert\">{}</p>\n", esc(problem));
        }
        w!(
            body,
            "<p>Sign in with your own account. Every action is recorded as \
             <code>operator:&lt;your account&gt;</code>.</p>\n\
             <form method=\"post\" action=\"/login\" class=\"stack\">\
             <input type=\"hidden\" name=\"next\" value=\"{}\">\
             <p><label for=\"login-name\">Account</label>\
             <input id=\"login-name\" name=\"name\" value=\"{}\" required maxlength=\"{MAX_NAME_CHARS}\" \
             autocomplete=\"username\"></p>\
             <p><label for=\"login-password\">Password</label>\
             <input id=\"login-password\" name=\"password\" type=\"password\" required \
             autocomplete=\"current-password\"></p>\
             <p><button type=\"submit\">Sign in</button></p></form>\n",
            attr(next),
            attr(name)
        );
    }
    Page { title: "Sign in", nav: Nav::None, access: Some(access), flash: None, live: false, here: next }.render(&body)
}

pub async fn login_form(
    State(app): State<Arc<App>>,
    access: Access,
    query: Result<Query<NextParam>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let next = query.map(|q| q.0.next).unwrap_or_default();
    let next = local_path(next.as_deref());
    let name = access.name().unwrap_or_default().to_owned();
    super::html::html_response(StatusCode::OK, login_page(&app, &access, next, &name, None))
}

#[derive(Deserialize)]
pub struct LoginForm {
    #[serde(default)]
    name: String,
    #[serde(default)]
    password: String,
    #[serde(default)]
    next: Option<String>,
}

/// 429: too many failed sign-ins from this address (whatever the name: the answer says
/// nothing of which names exist).
fn too_many(wait: Duration) -> Response {
    let seconds = wait.as_secs().max(1);
    let mut response = WebError::new(
        StatusCode::TOO_MANY_REQUESTS,
        "Too many failed sign-ins",
        format!("too many failed sign-ins from your address: try again in {seconds} s; you are not signed in"),
    )
    .into_response();
    response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(seconds));
    response
}

/// `POST /login`: the address's failure count first (429 before any hashing), then the
/// wait this address's failures at this name have earned, then the password against the
/// account's hash (an unknown name costs the same, and waits the same), then a new session
/// and its cookie.
pub async fn login(
    State(app): State<Arc<App>>,
    caller: Caller,
    form: Result<Form<LoginForm>, FormRejection>,
) -> Result<Response, WebError> {
    let access = &caller.access;
    let Some(accounts) = &app.options.accounts else {
        return Err(access.writer().err().unwrap_or_else(|| WebError::new(StatusCode::FORBIDDEN, "Read only", "")));
    };
    let Form(form) = form.map_err(|e| WebError::unreadable("form", e.status(), &e.body_text()))?;
    let next = local_path(form.next.as_deref()).to_owned();
    let address = address_key(caller.client);
    if let Some(refused) = address_limited(&app, &caller, &address) {
        return Ok(refused);
    }
    let name = account_name("name", &form.name)
        .map_err(|e| WebError::invalid(e).with_link(&format!("/login?next={}", encode(&next)), "Sign in again"))?;
    // Slower with each failure of this name from this address; other addresses' failures
    // count for nothing here, so a guesser cannot keep the account's owner out.
    let delay = app.limiter.pair_delay(&address, &name);
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    let users = accounts.current();
    let account = users.get(&name).cloned();
    // A proxy-only account is checked against the decoy too: its answer takes as long.
    let hash = match &account {
        Some(account) if account.hash != PROXY_ONLY => account.hash.clone(),
        _ => app.decoy.clone(),
    };
    let password = form.password;
    // Hashing is seconds of CPU at worst: a few at a time, never on the async threads.
    let permit =
        app.hashing.acquire().await.map_err(|_| {
            WebError::new(StatusCode::SERVICE_UNAVAILABLE, "Shutting down", "the monitor is shutting down")
        })?;
    // Again now that it is our turn: guesses sent all at once must not all pass the check
    // before the first failure is counted.
    if let Some(refused) = address_limited(&app, &caller, &address) {
        return Ok(refused);
    }
    let verified = tokio::task::spawn_blocking(move || verify_password(&hash, &password)).await.unwrap_or(false);
    drop(permit);
    let account = match account {
        Some(account) if verified => account,
        _ => {
            app.limiter.fail_pair(&address, &name);
            static QUIET: Quiet = Quiet::new("sign-in refused");
            if QUIET.allow(caller.client) {
                tracing::warn!(account = %name, client = %address, "sign-in refused: wrong name or password");
            }
            let page =
                login_page(&app, access, &next, &name, Some("Wrong account name or password; you are not signed in."));
            return Ok(super::html::html_response(StatusCode::UNAUTHORIZED, page));
        }
    };
    Ok(signed_in(&app, &caller, &account, &next))
}

/// A new session for `account` (the caller's old one, if any, ended), its cookie, and off
/// to `next`.
fn signed_in(app: &App, caller: &Caller, account: &Account, next: &str) -> Response {
    if let Some(old) = &caller.session {
        app.sessions.remove(old);
    }
    let id = app.sessions.create(Holder { account: account.name.clone(), credential: account.hash.clone() });
    let address = address_key(caller.client);
    tracing::info!(account = %account.name, role = %account.role, client = %address, "signed in");
    let mut response = Redirect::to(next).into_response();
    let max_age = app.sessions.limits().absolute.as_secs();
    response
        .headers_mut()
        .append(header::SET_COOKIE, set_cookie(caller.secure, SESSION_COOKIE, Some(&id), Some(max_age)));
    response
}

/// 429 when `address` has used up its failures, whatever name it tries.
fn address_limited(app: &App, caller: &Caller, address: &str) -> Option<Response> {
    let wait = app.limiter.check(address).err()?;
    static QUIET: Quiet = Quiet::new("sign-in refused: too many failures from this address");
    if QUIET.allow(caller.client) {
        tracing::warn!(client = %address, "sign-in refused: too many failures from this address");
    }
    Some(too_many(wait))
}

pub async fn logout_form(access: Access) -> Response {
    let body = "<h1>Sign out</h1>\n<form method=\"post\" action=\"/logout\"><p>\
                <button type=\"submit\">Sign out</button></p></form>\n";
    let page = Page { title: "Sign out", nav: Nav::None, access: Some(&access), flash: None, live: false, here: "/" };
    super::html::html_response(StatusCode::OK, page.render(body))
}

/// `POST /logout`: the session is deleted here, so its cookie is worthless from now on
/// even if copied, and the browser's copy is cleared.
pub async fn logout(State(app): State<Arc<App>>, caller: Caller, headers: HeaderMap) -> Response {
    if let Some(id) = cookie(&headers, SESSION_COOKIE) {
        app.sessions.remove(id);
    }
    if let Some(name) = caller.access.name() {
        tracing::info!(account = %name, "signed out");
    }
    let mut response = Redirect::to("/").into_response();
    response.headers_mut().append(header::SET_COOKIE, set_cookie(caller.secure, SESSION_COOKIE, None, None));
    response
}

/// `http::HeaderName` parsed for `--trusted-user-header`.
pub fn header_name(text: &str) -> Result<http::HeaderName, String> {
    http::HeaderName::from_bytes(text.as_bytes())
        .map_err(|_| format!("--trusted-user-header {text:?}: not a header name"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_same_origin_writes_pass() {
        let headers = |pairs: &[(&'static str, &str)]| {
            let mut map = HeaderMap::new();
            for (name, value) in pairs {
                map.insert(*name, HeaderValue::from_str(value).unwrap());
            }
            map
        };
        assert_eq!(cross_site(&headers(&[("host", "mon:7072")])), None);
        assert_eq!(cross_site(&headers(&[("host", "mon:7072"), ("origin", "http://mon:7072")])), None);
        assert_eq!(cross_site(&headers(&[("host", "mon:7072"), ("origin", "https://mon:7072")])), None);
        assert_eq!(cross_site(&headers(&[("host", "mon:7072"), ("sec-fetch-site", "same-origin")])), None);
        for bad in [
            headers(&[("host", "mon:7072"), ("origin", "http://evil.example")]),
            headers(&[("host", "mon:7072"), ("origin", "null")]),
            headers(&[("host", "mon:7072"), ("origin", "http://mon:7072.evil.example")]),
            headers(&[("host", "mon:7072"), ("sec-fetch-site", "cross-site")]),
            headers(&[("host", "mon:7072"), ("sec-fetch-site", "same-site"), ("origin", "http://mon:7072")]),
            headers(&[("origin", "http://")]),
        ] {
            assert!(cross_site(&bad).is_some(), "{bad:?}");
        }
    }

    #[test]
    fn cookies_and_redirects_are_read_defensively() {
        let mut headers = HeaderMap::new();
        headers.insert(header::COOKIE, HeaderValue::from_static("a=1; autocomp_flash=ann%40x; b=2"));
        assert_eq!(cookie(&headers, FLASH_COOKIE).and_then(decode).as_deref(), Some("ann@x"));
        assert_eq!(cookie(&headers, "c"), None);
        assert_eq!(decode("%zz"), None);
        assert_eq!(local_path(Some("//evil.example")), "/");
        assert_eq!(local_path(Some("https://evil.example")), "/");
        assert_eq!(local_path(Some("/batches?q=x")), "/batches?q=x");
        for bad in ["/\t/evil.example", "/\u{b}x", "/\r\nSet-Cookie: a=b", "/\n", "/\u{7f}", "/\u{85}", "/\u{2028}"] {
            assert_eq!(local_path(Some(bad)), "/", "{bad:?}");
        }
    }
}
