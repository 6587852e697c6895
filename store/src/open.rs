//! Choosing a backend by URL: the one place that knows every adapter, so the port itself
//! names none of them (and no backend imports its siblings through it).

use std::sync::Arc;

use autocomp_model::InvalidInput;

use crate::port::{ObjectStore, StoreResult};

/// Opens the store a backend URL names, for this process's own use: `sqlite:///path/to/store.db[?synchronous=full]`,
/// PostgreSQL at `postgres://user@host1,host2/database[?target_session_attrs=read-write&...]`,
/// or the store service at `http://host:port[?retry_for=30s]`. A SQLite file opened here
/// is claimed only by processes on this host (`SqliteOptions::claims_from_other_hosts`).
pub async fn open_store(url: &str) -> StoreResult<Arc<dyn ObjectStore>> {
    open_store_for(url, false).await
}

/// `open_store` for the store service, which hands the file's claims to holders on other
/// hosts: a SQLite file's exclusive claims are synced before they answer.
pub async fn open_store_to_serve(url: &str) -> StoreResult<Arc<dyn ObjectStore>> {
    open_store_for(url, true).await
}

/// The most bytes one call may send to the store at `url`, where there is a most: the store
/// service takes request bodies of `MAX_BODY_BYTES` (with a token, as every write carries), an
/// embedded store a call of any size. A caller that sends pages (`autocomp import`) cuts them
/// to fit before sending rather than have the service refuse them.
pub fn max_request_bytes(url: &str) -> Option<usize> {
    is_store_service(url).then_some(autocomp_http::service::MAX_BODY_BYTES)
}

/// Whether `url` names the store service (rather than a database or a file).
fn is_store_service(url: &str) -> bool {
    url.starts_with("http://") || url.starts_with("https://")
}

async fn open_store_for(url: &str, claims_from_other_hosts: bool) -> StoreResult<Arc<dyn ObjectStore>> {
    // Errors name the URL as `display_url` shows it: a mistyped scheme may still carry a password.
    let shown = autocomp_toolkit::display_url(url);
    if let Some(rest) = url.strip_prefix("sqlite://") {
        let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
        if path.is_empty() {
            return Err(InvalidInput::new(
                "store url",
                shown.as_str(),
                "names no file; write sqlite:///path/to/store.db",
            )
            .into());
        }
        let mut options = crate::sqlite::SqliteOptions::from_query(query)
            .map_err(|reason| InvalidInput::new("store url", shown.as_str(), reason))?;
        options.claims_from_other_hosts = claims_from_other_hosts;
        let store = crate::sqlite::SqliteStore::open_with(path, options).await?;
        return Ok(Arc::new(store));
    }
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        return Ok(Arc::new(crate::postgres::PgStore::open(url).await?));
    }
    if is_store_service(url) {
        return Ok(Arc::new(crate::http::HttpStore::new(url)?));
    }
    let reason =
        "unknown scheme; expected sqlite:///path/to/store.db, postgres://user@host/database or http://host:port";
    Err(InvalidInput::new("store url", shown, reason).into())
}
