//! `GET /metrics`: the pipeline's metrics in the Prometheus text format, the same as
//! `autocomp metrics`.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::app::App;

/// The pipeline's metrics in the Prometheus text format (the same as `autocomp metrics`).
pub(super) async fn metrics(State(app): State<Arc<App>>) -> Response {
    let defaults = autocomp_ops::operator::AlertDefaults {
        ready_after: app.monitor.settings().ready_overdue_after,
        ..Default::default()
    };
    match app.monitor.operator().metrics(&defaults).await {
        Ok(text) => ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response(),
        Err(error) => {
            tracing::warn!("metrics: {error}");
            (StatusCode::SERVICE_UNAVAILABLE, format!("metrics unavailable: {error}\n")).into_response()
        }
    }
}
