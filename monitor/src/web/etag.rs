//! The ETag every read page carries: the store's head (which every write and every
//! steering change moves) plus what else the page depends on, so a poll of an unchanged
//! page costs one head read and answers 304.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};

use super::app::App;
use super::assets;
use super::auth;
use super::gate::Caller;

/// Marks a page that changes without the store's head moving (a batch page showing a going
/// run's output): it carries no tag, so the next refresh asks for it whole.
#[derive(Clone, Copy)]
pub struct Untagged;

/// Answers 304 when the browser's copy of the page is current, and tags fresh pages.
///
/// The tag covers the store's head (every write moves it), the path and query, who is
/// asking (the page shows their forms), the assets' version and the current minute: some of
/// what a page shows moves without a write (a batch becoming overdue, locks, ages), so an
/// idle page still refreshes once a minute. A page carrying a one-time message is never
/// tagged.
pub async fn etag(State(app): State<Arc<App>>, request: Request, next: Next) -> Response {
    if super::sessions::cookie(request.headers(), auth::FLASH_COOKIE).is_some_and(|v| !v.is_empty()) {
        return next.run(request).await;
    }
    let Ok(head) = app.monitor.head().await else {
        // The page itself reports the outage.
        return next.run(request).await;
    };
    let access = Caller::of(request.extensions()).access;
    let minute = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs() / 60);
    let mut hasher = Sha256::new();
    for part in [
        request.uri().path_and_query().map_or("", |pq| pq.as_str()),
        &access.key(),
        &assets::version(),
        &minute.to_string(),
    ] {
        hasher.update(part.as_bytes());
        hasher.update(b"\0");
    }
    let tag = format!("\"{head}-{}\"", &hex::encode(hasher.finalize())[..16]);
    let tag_value = HeaderValue::from_str(&tag).expect("digits, hex and quotes");
    let matches = request
        .headers()
        .get_all(header::IF_NONE_MATCH)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|candidate| {
            let candidate = candidate.trim();
            candidate == "*" || candidate.trim_start_matches("W/") == tag
        });
    if matches {
        return (
            StatusCode::NOT_MODIFIED,
            [(header::ETAG, tag_value), (header::CACHE_CONTROL, HeaderValue::from_static("no-cache, private"))],
        )
            .into_response();
    }
    let mut response = next.run(request).await;
    if response.status() == StatusCode::OK && response.extensions().get::<Untagged>().is_none() {
        response.headers_mut().insert(header::ETAG, tag_value);
    }
    response
}
