//! Choosing an index adapter by URL: the one place that knows every adapter, so the port
//! itself names none of them (and the HTTP adapter, which implements the port, is not
//! imported back by it).

use std::sync::Arc;

use autocomp_model::InvalidInput;
use autocomp_store::{ObjectStore, StoreError};

use crate::engine::{IndexEngine, IndexError, IndexResult};
use crate::http::HttpIndex;
use crate::local::LocalIndex;
use crate::port::BatchIndex;

/// Opens the index a backend URL names: `local:/var/lib/autocomp/index`, or the sboi
/// service at `http://host:port[?retry_for=30s]` (which follows the store itself, so
/// `store` is not used then).
pub fn open_index(url: &str, store: Arc<dyn ObjectStore>) -> IndexResult<Arc<dyn BatchIndex>> {
    if let Some(path) = url.strip_prefix("local:") {
        if path.is_empty() {
            return Err(invalid(url, "names no directory; write local:/path/to/index"));
        }
        return Ok(Arc::new(LocalIndex::new(IndexEngine::open(path)?, store)));
    }
    if url.starts_with("http://") || url.starts_with("https://") {
        return Ok(Arc::new(HttpIndex::new(url)?));
    }
    Err(invalid(url, "unknown scheme; expected local:/path/to/index or http://host:port"))
}

fn invalid(url: &str, reason: &str) -> IndexError {
    IndexError::Store(StoreError::Invalid(InvalidInput::new("index url", autocomp_toolkit::display_url(url), reason)))
}
