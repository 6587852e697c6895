//! What a service answers when it refuses: the JSON error body every service shares
//! (`{"error": {kind, message, field, value, ...}}`), `ApiError` with its status, and the
//! strict parsing of request bodies that names the field that was wrong and never panics.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use autocomp_model::InvalidInput;

/// The body of every error response: `{"error": {...}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[schemars(rename = "Error")]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ErrorDetail {
    /// `invalid`, `not_found`, `conflict`, `fenced`, `unavailable`, `unauthorized`,
    /// `too_large`, `unknown_operation`.
    #[schemars(extend("enum" = [
        "invalid", "not_found", "conflict", "fenced", "unavailable", "unauthorized", "too_large", "unknown_operation"
    ]))]
    pub kind: String,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// For `fenced`: which run was refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub component: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
}

impl ErrorDetail {
    fn new(kind: &str, message: impl Into<String>) -> Self {
        Self {
            kind: kind.into(),
            message: message.into(),
            field: None,
            value: None,
            reason: None,
            batch: None,
            component: None,
            generation: None,
        }
    }
}

/// An error a handler returns: a status and a JSON body.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    /// Boxed: handlers return `Result<_, ApiError>` everywhere and the Ok side is small.
    pub detail: Box<ErrorDetail>,
}

impl ApiError {
    pub fn new(status: StatusCode, kind: &str, message: impl Into<String>) -> Self {
        Self { status, detail: Box::new(ErrorDetail::new(kind, message)) }
    }

    pub fn invalid(input: InvalidInput) -> Self {
        let mut error = Self::new(StatusCode::BAD_REQUEST, "invalid", input.to_string());
        error.detail.field = Some(input.field);
        error.detail.value = Some(input.value);
        error.detail.reason = Some(input.reason);
        error
    }

    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "unauthorized", message)
    }

    pub fn unknown_operation(operation: &str) -> Self {
        Self::new(StatusCode::NOT_FOUND, "unknown_operation", format!("no operation named {operation:?}"))
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, axum::Json(ErrorBody { error: *self.detail })).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(header::WWW_AUTHENTICATE, header::HeaderValue::from_static("Bearer"));
        }
        response
    }
}

/// Parses a request body strictly: unknown fields, wrong types and invalid names become a
/// 400 naming what was wrong; an over-long body a 413. Never a panic, never a 500.
pub fn parse_body<T: DeserializeOwned>(body: Result<Bytes, BytesRejection>) -> Result<T, ApiError> {
    let bytes = body.map_err(|rejection| {
        let status = rejection.status();
        let kind = if status == StatusCode::PAYLOAD_TOO_LARGE { "too_large" } else { "invalid" };
        ApiError::new(status, kind, format!("request body: {}", rejection.body_text()))
    })?;
    let bytes: &[u8] = if bytes.is_empty() { b"{}" } else { &bytes };
    let preview = || String::from_utf8_lossy(&bytes[..bytes.len().min(120)]).into_owned();
    // Every body is an object; serde would also read a struct from an array of its fields
    // in order (`["B1"]` as `{"id": "B1"}`), hiding a client's mistake.
    if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(ApiError::invalid(InvalidInput::new("request body", preview(), "must be a JSON object")));
    }
    let mut reader = serde_json::Deserializer::from_slice(bytes);
    let parsed: T = serde_path_to_error::deserialize(&mut reader).map_err(|e| {
        // Name the field that was wrong (`limit`, `selections[0].priority.min`), not just
        // the body; the root itself (a missing or unknown field) is the body.
        let field = match e.path().to_string() {
            path if path == "." => "request body".to_owned(),
            path => path,
        };
        ApiError::invalid(InvalidInput::new(field, preview(), e.into_inner().to_string()))
    })?;
    reader.end().map_err(|e| ApiError::invalid(InvalidInput::new("request body", preview(), e.to_string())))?;
    Ok(parsed)
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    use super::*;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)] // read only to be refused
    struct Body {
        limit: usize,
        inner: Vec<Inner>,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Inner {
        min: Option<i32>,
    }

    fn refused(body: &str) -> (String, String) {
        let error = parse_body::<Body>(Ok(Bytes::from(body.to_owned()))).unwrap_err();
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let bytes = runtime.block_on(axum::body::to_bytes(error.into_response().into_body(), 1 << 20)).unwrap();
        let value: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        let field = value["error"]["field"].as_str().unwrap_or_default().to_owned();
        (field, value["error"]["message"].as_str().unwrap_or_default().to_owned())
    }

    #[test]
    fn a_refused_body_names_the_field_that_was_wrong() {
        assert_eq!(refused(r#"{"limit": "ten", "inner": []}"#).0, "limit");
        assert_eq!(refused(r#"{"limit": 1, "inner": [{"min": "high"}]}"#).0, "inner[0].min");
        assert_eq!(refused(r#"{"limit": 1, "inner": [], "extra": 1}"#).0, "extra");
        assert_eq!(refused(r#"[1, []]"#).0, "request body");
        assert_eq!(refused(r#"{"limit": 1, "inner": []} trailing"#).0, "request body");
    }
}
