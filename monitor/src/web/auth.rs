//! Who may act: the write token (a sign-in form setting an HttpOnly, SameSite=Strict
//! cookie), or a trusted reverse proxy's user header; the refusal of cross-site writes
//! before anything else; and the one-time result message carried across a redirect.
//!
//! The cookie holds a digest of the token, not the token: the same token may open the
//! store and index services, and a cookie is easier to leak than a file.

use std::sync::Arc;

use autocomp_model::InvalidInput;
use axum::extract::rejection::FormRejection;
use axum::extract::{FromRequestParts, Query, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use axum::{Form, http};
use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::access::Access;
use super::html::{Nav, Page, esc, w};
use super::{App, WebError};
use crate::filter::encode;

pub const TOKEN_COOKIE: &str = "autocomp_token";
pub const NAME_COOKIE: &str = "autocomp_operator";
pub const FLASH_COOKIE: &str = "autocomp_flash";

/// Longest flash message kept (the cookie, percent-encoded, must stay under 4 KiB).
const MAX_FLASH_CHARS: usize = 1_000;

/// Deciding a request's access belongs here, with the token and the proxy header.
impl Access {
    pub fn of(app: &App, headers: &HeaderMap) -> Access {
        let Some(session) = &app.session else { return Access::ReadOnly };
        if let Some(header) = &app.options.trusted_user_header
            && let Some(value) = headers.get(header)
        {
            match value.to_str().ok().filter(|name| valid_name(name)) {
                Some(name) => return Access::SignedIn { name: name.to_owned(), via_proxy: true },
                None => tracing::warn!(header = %header, "ignoring a trusted user header that is not a valid name"),
            }
        }
        let name = cookie(headers, NAME_COOKIE).and_then(decode).filter(|name| valid_name(name));
        let presented = cookie(headers, TOKEN_COOKIE).unwrap_or_default();
        match name {
            Some(name) if constant_time_eq(presented.as_bytes(), session.as_bytes()) => {
                Access::SignedIn { name, via_proxy: false }
            }
            _ => Access::SignedOut,
        }
    }

    /// The name to act as, or why this request may not write (403 read only, 401 not
    /// signed in).
    pub fn writer(&self) -> Result<&str, WebError> {
        match self {
            Access::SignedIn { name, .. } => Ok(name),
            Access::ReadOnly => Err(read_only()),
            Access::SignedOut => Err(WebError::new(
                StatusCode::UNAUTHORIZED,
                "Not signed in",
                "acting on batches needs the write token: sign in first; nothing was changed",
            )
            .with_link("/login", "Sign in")),
        }
    }
}

impl FromRequestParts<Arc<App>> for Access {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, app: &Arc<App>) -> Result<Self, Self::Rejection> {
        Ok(Access::of(app, &parts.headers))
    }
}

/// 403: no write token was configured, so no POST is accepted.
fn read_only() -> WebError {
    WebError::new(
        StatusCode::FORBIDDEN,
        "Read only",
        "this monitor is read only: it was started without a write token (--token-file or \
         $AUTOCOMP_MONITOR_TOKEN_FILE); nothing was changed",
    )
}

/// An operator name as `Operator` accepts it for `operator:<name>`.
pub fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len()) && name.chars().all(|c| c.is_ascii_graphic())
}

/// What the token cookie holds for `token`.
pub fn session_value(token: &str) -> String {
    let mut hasher = Sha256::new();
    hasher.update(b"autocomp-monitor session v1\0");
    hasher.update(token.as_bytes());
    hex::encode(hasher.finalize())
}

pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A cookie's raw value from the request.
pub fn cookie<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value)
}

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

/// `Set-Cookie` for one of the monitor's cookies; `None` clears it.
fn set_cookie(headers: &HeaderMap, name: &str, value: Option<&str>, max_age: Option<u32>) -> HeaderValue {
    let mut text = format!("{name}={}; Path=/; HttpOnly; SameSite=Strict", value.unwrap_or(""));
    match (value, max_age) {
        (None, _) => text.push_str("; Max-Age=0"),
        (Some(_), Some(seconds)) => w!(text, "; Max-Age={seconds}"),
        (Some(_), None) => {}
    }
    // Behind a TLS proxy the browser should never send it in the clear.
    if headers.get("x-forwarded-proto").is_some_and(|proto| proto == "https") {
        text.push_str("; Secure");
    }
    HeaderValue::from_str(&text).expect("cookie values are percent-encoded or hex")
}

/// A one-time message for the page a redirect leads to.
pub fn flash_cookie(headers: &HeaderMap, message: &str) -> HeaderValue {
    let mut kept: String = message.chars().take(MAX_FLASH_CHARS).collect();
    if kept.len() < message.len() {
        kept.push('…');
    }
    set_cookie(headers, FLASH_COOKIE, Some(&encode(&kept)), Some(120))
}

/// The flash message of the request, if any, and the header that clears it.
pub fn take_flash(headers: &HeaderMap) -> Option<(String, HeaderValue)> {
    let message = cookie(headers, FLASH_COOKIE).filter(|v| !v.is_empty()).and_then(decode)?;
    Some((message, set_cookie(headers, FLASH_COOKIE, None, None)))
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
            tracing::warn!(method = %request.method(), path = request.uri().path(), "refused a cross-site write: {why}");
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

/// Only a path of this site: never `//host` or `https://...` (an open redirect).
fn local_path(next: Option<&str>) -> &str {
    match next {
        Some(path) if path.starts_with('/') && !path.starts_with("//") && !path.contains('\\') => path,
        _ => "/",
    }
}

fn login_page(app: &App, access: &Access, next: &str, name: &str, problem: Option<&str>) -> String {
    let mut body = String::from("<h1>Sign in</h1>\n");
    if app.session.is_none() {
        body.push_str("<p>This monitor is read only: it was started without a write token.</p>");
    } else {
        if let Some(problem) = problem {
            w!(body, "<p class=\"error\" role=\"alert\">{}</p>\n", esc(problem));
        }
        w!(
            body,
            "<p>Acting on batches needs the monitor's write token. Every action is recorded as \
             <code>operator:&lt;name&gt;</code>.</p>\n\
             <form method=\"post\" action=\"/login\" class=\"stack\">\
             <input type=\"hidden\" name=\"next\" value=\"{}\">\
             <p><label for=\"login-name\">Operator name</label>\
             <input id=\"login-name\" name=\"name\" value=\"{}\" required maxlength=\"64\" autocomplete=\"username\" \
             aria-describedby=\"login-name-help\"><span id=\"login-name-help\" class=\"help\">1-64 printable \
             characters, no spaces</span></p>\
             <p><label for=\"login-token\">Write token</label>\
             <input id=\"login-token\" name=\"token\" type=\"password\" required autocomplete=\"current-password\"></p>\
             <p><button type=\"submit\">Sign in</button></p></form>\n",
            esc(next),
            esc(name)
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
    super::html_response(StatusCode::OK, login_page(&app, &access, next, &name, None))
}

#[derive(Deserialize)]
pub struct LoginForm {
    #[serde(default)]
    name: String,
    #[serde(default)]
    token: String,
    #[serde(default)]
    next: Option<String>,
}

pub async fn login(
    State(app): State<Arc<App>>,
    access: Access,
    headers: HeaderMap,
    form: Result<Form<LoginForm>, FormRejection>,
) -> Result<Response, WebError> {
    let Some(session) = &app.session else {
        return Err(read_only());
    };
    let Form(form) = form.map_err(|e| WebError::invalid(InvalidInput::new("form", "", e.body_text())))?;
    let next = local_path(form.next.as_deref());
    if !valid_name(&form.name) {
        return Err(WebError::invalid(InvalidInput::new(
            "name",
            &form.name,
            "must be 1-64 printable ASCII characters without spaces",
        ))
        .with_link(&format!("/login?next={}", encode(next)), "Sign in again"));
    }
    let token = app.options.token.as_deref().unwrap_or_default();
    if !constant_time_eq(form.token.trim().as_bytes(), token.as_bytes()) {
        tracing::warn!(name = %form.name, "sign-in refused: wrong token");
        let page = login_page(&app, &access, next, &form.name, Some("The token is wrong; you are not signed in."));
        return Ok(super::html_response(StatusCode::UNAUTHORIZED, page));
    }
    tracing::info!(name = %form.name, "signed in");
    let mut response = Redirect::to(next).into_response();
    let cookies = response.headers_mut();
    cookies.append(header::SET_COOKIE, set_cookie(&headers, TOKEN_COOKIE, Some(session), None));
    cookies.append(header::SET_COOKIE, set_cookie(&headers, NAME_COOKIE, Some(&encode(&form.name)), None));
    Ok(response)
}

pub async fn logout_form(access: Access) -> Response {
    let body = "<h1>Sign out</h1>\n<form method=\"post\" action=\"/logout\"><p>\
                <button type=\"submit\">Sign out</button></p></form>\n";
    let page = Page { title: "Sign out", nav: Nav::None, access: Some(&access), flash: None, live: false, here: "/" };
    super::html_response(StatusCode::OK, page.render(body))
}

pub async fn logout(State(app): State<Arc<App>>, headers: HeaderMap) -> Response {
    // Read only, every POST is refused alike (and nobody can have signed in).
    if app.session.is_none() {
        return read_only().into_response();
    }
    let mut response = Redirect::to("/").into_response();
    for name in [TOKEN_COOKIE, NAME_COOKIE] {
        response.headers_mut().append(header::SET_COOKIE, set_cookie(&headers, name, None, None));
    }
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
        headers.insert(header::COOKIE, HeaderValue::from_static("a=1; autocomp_operator=ann%40x; b=2"));
        assert_eq!(cookie(&headers, NAME_COOKIE).and_then(decode).as_deref(), Some("ann@x"));
        assert_eq!(cookie(&headers, "c"), None);
        assert_eq!(decode("%zz"), None);
        assert_eq!(local_path(Some("//evil.example")), "/");
        assert_eq!(local_path(Some("https://evil.example")), "/");
        assert_eq!(local_path(Some("/batches?q=x")), "/batches?q=x");
        assert!(valid_name("ann") && !valid_name("a b") && !valid_name(""));
    }
}
