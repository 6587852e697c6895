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
        let reason = error.wire_reason().map(str::to_owned);
        match error {
            StoreError::Invalid(input) => ApiError::invalid(input),
            StoreError::NotFound(id) => {
                let mut e = ApiError::new(StatusCode::NOT_FOUND, "not_found", message);
                e.detail.batch = Some(id.to_string());
                e
            }
            StoreError::Conflict(_) => ApiError::new(StatusCode::CONFLICT, "conflict", message),
            StoreError::AlreadyInState(_) | StoreError::ChangedSincePreview(_) => {
                let mut e = ApiError::new(StatusCode::CONFLICT, "conflict", message);
                e.detail.reason = reason;
                e
            }
            StoreError::Fenced { batch, component, generation, reason } => {
                let mut e = ApiError::new(StatusCode::CONFLICT, "fenced", message);
                e.detail.batch = Some(batch.to_string());
                e.detail.component = Some(component.to_string());
                e.detail.generation = Some(generation);
                e.detail.reason = Some(reason);
                e
            }
            StoreError::Unavailable(_) => ApiError::unavailable(message),
            StoreError::SchemaNewer(_)
            | StoreError::SchemaOlder(_)
            | StoreError::NoStoreFile(_)
            | StoreError::ServiceOlder(_) => {
                let mut e = ApiError::unavailable(message);
                e.detail.reason = reason;
                e
            }
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
            CallError::Older(message) => StoreError::ServiceOlder(message),
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
                    "conflict" => StoreError::from_wire(
                        false,
                        e.reason.as_deref(),
                        e.message.trim_start_matches("conflict: ").to_string(),
                    ),
                    "fenced" => match (batch(), e.component.as_deref().and_then(|c| ComponentName::new(c).ok())) {
                        (Some(batch), Some(component)) => StoreError::Fenced {
                            batch,
                            component,
                            generation: e.generation.unwrap_or_default(),
                            reason: e.reason.unwrap_or_default(),
                        },
                        _ => StoreError::Conflict(e.message),
                    },
                    "unavailable" => StoreError::from_wire(true, e.reason.as_deref(), e.message),
                    // A configuration error of this host, not an outage: exit 2, not 5.
                    "unauthorized" => StoreError::Invalid(InvalidInput::new(
                        "token",
                        "$AUTOCOMP_TOKEN or $AUTOCOMP_TOKEN_FILE",
                        e.message,
                    )),
                    // A service of an older release than this client: it cannot be waited out,
                    // and a pass must not go on without what it asked (a pause it cannot read).
                    "unknown_operation" => StoreError::ServiceOlder(format!(
                        "the service does not have this operation ({}): it runs an older release than this host; {}",
                        e.message,
                        autocomp_http::protocol::UPGRADE_ORDER
                    )),
                    // A request body over the service's limit, or an answer of several batches
                    // over its cap (which `HttpStore` splits by itself before any caller sees
                    // it): the same request fails again however long one waits, so it is the
                    // request to change (exit 2), never an outage (exit 5).
                    "too_large" => StoreError::Invalid(InvalidInput::new(
                        e.field.unwrap_or_else(|| "request".to_owned()),
                        e.value.unwrap_or_else(|| status.to_string()),
                        e.reason.unwrap_or(e.message),
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
        StoreError::SchemaNewer(_) | StoreError::ServiceOlder(_) => true,
        error if error.is_unavailable() => url.starts_with("sqlite://"),
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
        let StoreError::ServiceOlder(message) = error else { panic!("{error:?}") };
        assert!(message.contains("older release than this host; upgrade the services first"), "{message}");
        assert!(message.contains("\"steering\""), "{message}");
    }

    /// The answer's JSON as the service sends it, read back by the client.
    fn over_the_wire(error: StoreError) -> (serde_json::Value, StoreError) {
        let api = ApiError::from(error);
        let status = api.status;
        let json = serde_json::to_value(autocomp_http::error::ErrorBody { error: *api.detail }).unwrap();
        let body = serde_json::from_value(json.clone()).unwrap();
        (json, StoreError::from(CallError::Api { status, body }))
    }

    #[test]
    fn a_conflicts_kind_crosses_the_wire_under_the_kind_every_release_knows() {
        let words = "the pipeline's steering changed since the preview (version 3, now 4): preview again";
        let (json, back) = over_the_wire(StoreError::ChangedSincePreview(words.into()));
        let expected = serde_json::json!({"error": {
            "kind": "conflict", "message": format!("conflict: {words}"), "reason": "changed_since_preview"
        }});
        assert_eq!(json, expected);
        assert!(matches!(&back, StoreError::ChangedSincePreview(m) if m == words), "{back:?}");

        let words = "the pipeline is paused already, by operator:ann since 2026-11-27T10:00:00Z: tape";
        let (json, back) = over_the_wire(StoreError::AlreadyInState(words.into()));
        assert_eq!(json["error"]["kind"], "conflict");
        assert_eq!(json["error"]["reason"], "already_in_state");
        assert_eq!(back.to_string(), format!("conflict: {words}"));
        assert!(matches!(back, StoreError::AlreadyInState(_)));

        let (json, back) = over_the_wire(StoreError::Conflict("checker is not paused".into()));
        assert_eq!(
            json,
            serde_json::json!({"error": {"kind": "conflict", "message": "conflict: checker is not paused"}})
        );
        assert!(matches!(back, StoreError::Conflict(m) if m == "checker is not paused"));
    }

    #[test]
    fn an_outages_kind_crosses_the_wire_under_the_kind_every_release_knows() {
        let kinds = [
            (StoreError::SchemaNewer("words".into()), "schema_newer"),
            (StoreError::SchemaOlder("words".into()), "schema_older"),
            (StoreError::NoStoreFile("words".into()), "no_store_file"),
        ];
        for (kind, reason) in kinds {
            let (json, back) = over_the_wire(kind);
            let expected = serde_json::json!({"error": {
                "kind": "unavailable", "message": "store unavailable: words", "reason": reason
            }});
            assert_eq!(json, expected);
            assert_eq!(back.to_string(), "store unavailable: store unavailable: words", "as an outage always read");
            assert_eq!(back.wire_reason(), Some(reason), "{back:?}");
        }
        // A service downstream of an older one (sboi following an older store service) passes
        // the refusal on as it was.
        let (json, back) = over_the_wire(StoreError::ServiceOlder("words".into()));
        assert_eq!(json["error"]["reason"], "service_older", "{json}");
        assert!(matches!(&back, StoreError::ServiceOlder(m) if m == "words"), "{back:?}");
        let (json, back) = over_the_wire(StoreError::Unavailable("disk I/O error".into()));
        assert_eq!(
            json,
            serde_json::json!({"error": {"kind": "unavailable", "message": "store unavailable: disk I/O error"}})
        );
        assert!(matches!(back, StoreError::Unavailable(_)));
    }

    #[test]
    fn a_request_too_large_for_the_service_is_bad_input_naming_the_body_never_an_outage() {
        let body: autocomp_http::error::ErrorBody = serde_json::from_value(serde_json::json!({"error": {
            "kind": "too_large", "message": "request body: 5000000 bytes declared; at most 4194304 bytes are accepted",
            "field": "request body", "value": "5000000 bytes declared", "reason": "at most 4194304 bytes are accepted"
        }}))
        .unwrap();
        let error = StoreError::from(CallError::Api { status: StatusCode::PAYLOAD_TOO_LARGE, body });
        assert!(!error.is_unavailable(), "{error:?}");
        let StoreError::Invalid(input) = error else { panic!("{error:?}") };
        assert_eq!(
            (input.field.as_str(), input.value.as_str(), input.reason.as_str()),
            ("request body", "5000000 bytes declared", "at most 4194304 bytes are accepted")
        );
        // A service that names no field (an answer over its cap) is still bad input.
        let body = serde_json::from_value(serde_json::json!({"error": {
            "kind": "too_large", "message": "the answer to histories would pass 67108864 bytes (64 MiB) at its 2 item"
        }}))
        .unwrap();
        let error = StoreError::from(CallError::Api { status: StatusCode::PAYLOAD_TOO_LARGE, body });
        assert!(matches!(&error, StoreError::Invalid(input) if input.field == "request"), "{error:?}");
    }

    #[test]
    fn a_schema_newer_than_this_release_is_permanent_and_an_outage_only_for_a_file() {
        let newer = StoreError::SchemaNewer("schema version 99".into());
        assert!(store_error_is_permanent("postgres://u@h/db", &newer));
        let older = StoreError::SchemaOlder("schema version 6".into());
        assert!(!store_error_is_permanent("postgres://u@h/db", &older));
        assert!(store_error_is_permanent("sqlite:///s.db", &older));
        let down = StoreError::Unavailable("connection refused".into());
        assert!(!store_error_is_permanent("postgres://u@h/db", &down));
        assert!(store_error_is_permanent("sqlite:///s.db", &down));
    }
}
