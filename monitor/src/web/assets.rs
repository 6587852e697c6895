//! The monitor's stylesheet and script, compiled into the binary (no CDN, nothing fetched
//! from elsewhere) and served under `/assets/` with a year-long cache; pages link them
//! with a content hash in the query, so a new release is fetched at once.

use std::sync::LazyLock;

use axum::http::header;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};

pub struct Asset {
    path: &'static str,
    content_type: &'static str,
    text: &'static str,
    /// `path?v=<hash of the text>`.
    url: LazyLock<String>,
}

impl Asset {
    pub fn url(&self) -> &str {
        &self.url
    }

    fn serve(&self) -> Response {
        (
            [
                (header::CONTENT_TYPE, self.content_type),
                // The URL changes with the content, so a cached copy never goes stale.
                (header::CACHE_CONTROL, "public, max-age=31536000, immutable"),
            ],
            self.text,
        )
            .into_response()
    }
}

/// First 12 hex digits of the text's SHA-256.
fn versioned(path: &str, text: &str) -> String {
    let digest = Sha256::digest(text.as_bytes());
    format!("{path}?v={}", &hex::encode(digest)[..12])
}

pub static CSS: Asset = Asset {
    path: "/assets/monitor.css",
    content_type: "text/css; charset=utf-8",
    text: include_str!("../../assets/monitor.css"),
    url: LazyLock::new(|| versioned(CSS.path, CSS.text)),
};

pub static JS: Asset = Asset {
    path: "/assets/monitor.js",
    content_type: "text/javascript; charset=utf-8",
    text: include_str!("../../assets/monitor.js"),
    url: LazyLock::new(|| versioned(JS.path, JS.text)),
};

/// Both assets' versions: part of every page's ETag, so a new release's pages are new.
pub fn version() -> String {
    format!("{}{}", CSS.url(), JS.url())
}

pub async fn css() -> Response {
    CSS.serve()
}

pub async fn js() -> Response {
    JS.serve()
}
