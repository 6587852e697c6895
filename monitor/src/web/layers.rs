//! What every answer shares, outside any handler: the security headers (the content policy
//! allows this origin's own stylesheet and script only) and one debug line per request.

use std::time::Instant;

use axum::extract::Request;
use axum::http::{HeaderValue, header};
use axum::middleware::Next;
use axum::response::Response;

/// The policy allows this origin's own stylesheet and script only: no inline code, no
/// other host, no framing.
const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                   form-action 'self'; frame-ancestors 'none'";

pub(super) async fn security_headers(request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("same-origin"));
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    response
}

/// One debug line per request (never headers or bodies: they carry the session cookie and
/// passwords); server errors are already logged where they happen.
pub(super) async fn log_request(request: Request, next: Next) -> Response {
    let (method, path) = (request.method().clone(), request.uri().path().to_owned());
    let started = Instant::now();
    let response = next.run(request).await;
    tracing::debug!(%method, path, status = response.status().as_u16(), ms = started.elapsed().as_millis() as u64);
    response
}
