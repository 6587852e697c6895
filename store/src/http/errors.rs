//! Where the store's errors meet HTTP: each `StoreError` as the JSON error body and status
//! the service answers, and that body turned back into the same `StoreError` by the client,
//! so a caller of `HttpStore` sees what a caller of the embedded store would.

use autocomp_http::client::CallError;
use autocomp_http::error::ApiError;
use autocomp_model::{BatchId, ComponentName, InvalidInput};
use axum::http::StatusCode;

use crate::port::StoreError;

impl From<StoreError> for ApiError {
    fn from(error: StoreError) -> Self {
        let message = error.to_string();
        match error {
            StoreError::Invalid(input) => ApiError::invalid(input),
            StoreError::NotFound(id) => {
                let mut e = ApiError::new(StatusCode::NOT_FOUND, "not_found", message);
                e.detail.batch = Some(id.to_string());
                e
            }
            StoreError::Conflict(_) => ApiError::new(StatusCode::CONFLICT, "conflict", message),
            StoreError::Fenced { batch, component, generation, reason } => {
                let mut e = ApiError::new(StatusCode::CONFLICT, "fenced", message);
                e.detail.batch = Some(batch.to_string());
                e.detail.component = Some(component.to_string());
                e.detail.generation = Some(generation);
                e.detail.reason = Some(reason);
                e
            }
            StoreError::Unavailable(_) => ApiError::unavailable(message),
        }
    }
}

impl From<CallError> for StoreError {
    /// The store's own error, as the embedded adapter would have returned it.
    fn from(error: CallError) -> Self {
        match error {
            CallError::Unreachable(message) => StoreError::Unavailable(message),
            // A certificate that fails verification: this host's configuration, exit 2.
            CallError::Untrusted(e) => StoreError::Invalid(e),
            CallError::Api { status, body } => {
                let e = body.error;
                let batch = || e.batch.as_deref().and_then(|b| BatchId::new(b).ok());
                match e.kind.as_str() {
                    "invalid" => StoreError::Invalid(InvalidInput::new(
                        e.field.unwrap_or_default(),
                        e.value.unwrap_or_default(),
                        e.reason.unwrap_or(e.message),
                    )),
                    "not_found" if batch().is_some() => StoreError::NotFound(batch().expect("checked")),
                    "conflict" => StoreError::Conflict(e.message.trim_start_matches("conflict: ").to_string()),
                    "fenced" => match (batch(), e.component.as_deref().and_then(|c| ComponentName::new(c).ok())) {
                        (Some(batch), Some(component)) => StoreError::Fenced {
                            batch,
                            component,
                            generation: e.generation.unwrap_or_default(),
                            reason: e.reason.unwrap_or_default(),
                        },
                        _ => StoreError::Conflict(e.message),
                    },
                    "unavailable" => StoreError::Unavailable(e.message),
                    // A configuration error of this host, not an outage: exit 2, not 5.
                    "unauthorized" => StoreError::Invalid(InvalidInput::new(
                        "token",
                        "$AUTOCOMP_TOKEN or $AUTOCOMP_TOKEN_FILE",
                        e.message,
                    )),
                    // A service of an older release than this client: it cannot be waited out,
                    // and a pass must not go on without what it asked (a pause it cannot read).
                    "unknown_operation" => StoreError::Unavailable(format!(
                        "the store service does not have this operation ({}): it runs an older release than this \
                         host; upgrade the store service first",
                        e.message
                    )),
                    _ => StoreError::Unavailable(format!("HTTP {status}: {}", e.message)),
                }
            }
        }
    }
}

/// Whether opening the store at `url` failed for good: bad input, a local SQLite file that
/// cannot be opened (it opens now or never), or a schema newer than this release (it will
/// not get older by waiting). Anything else is an upstream not answering yet.
pub fn store_error_is_permanent(url: &str, error: &StoreError) -> bool {
    match error {
        StoreError::Invalid(_) => true,
        StoreError::Unavailable(message) => url.starts_with("sqlite://") || message.contains("newer than this release"),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_operation_the_service_does_not_know_says_the_service_is_older() {
        let body: autocomp_http::error::ErrorBody = serde_json::from_value(serde_json::json!({
            "error": {"kind": "unknown_operation", "message": "no operation named \"steering\""}
        }))
        .unwrap();
        let error = StoreError::from(CallError::Api { status: StatusCode::NOT_FOUND, body });
        let StoreError::Unavailable(message) = error else { panic!("{error:?}") };
        assert!(message.contains("older release than this host; upgrade the store service first"), "{message}");
        assert!(message.contains("\"steering\""), "{message}");
    }
}
