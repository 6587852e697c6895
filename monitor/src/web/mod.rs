//! The monitor over HTTP: the module list and the router, which says which handler answers
//! which address and which layers (sign-in, the Host check, the cross-site write guard,
//! security headers) wrap them.

pub mod access;
pub mod accounts;
mod action_forms;
mod action_input;
mod actions;
mod alerts;
mod app;
mod assets;
pub mod auth;
mod batch;
mod batches;
mod bulk;
mod chart_series;
mod charts;
mod charts_svg;
mod confirm;
mod contracts;
mod error;
mod error_page;
mod etag;
mod explain;
mod export;
pub mod gate;
mod graph;
mod graph_layout;
pub mod html;
mod layers;
pub mod limits;
mod list_query;
mod log;
mod metrics;
mod needs;
mod output;
mod overview;
mod respond;
pub mod sessions;
mod steer_input;
mod steering;
mod steering_section;
mod svg;
mod timeline;
mod waiting;

use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::middleware;
use axum::routing::get;

pub use self::app::{App, WebOptions};
pub use self::error::WebError;
use crate::data::Monitor;

/// The monitor's routes; tests serve them on `127.0.0.1:0` or call them directly.
pub fn router(monitor: Monitor, options: WebOptions) -> axum::Router {
    let app = Arc::new(App::new(monitor, options));
    let pages = axum::Router::new()
        .route("/", get(overview::overview))
        .route("/batches", get(batches::batches))
        .route("/batches/{id}", get(batch::batch))
        .route("/waiting", get(waiting::waiting))
        .route("/graph", get(graph::page))
        .route("/charts", get(charts::page))
        .route("/alerts", get(alerts::alerts))
        .route_layer(middleware::from_fn_with_state(Arc::clone(&app), etag::etag))
        .route_layer(middleware::from_fn_with_state(Arc::clone(&app), gate::reads));
    let reads = axum::Router::new()
        .route("/batches.csv", get(export::csv))
        .route("/batches.ndjson", get(export::ndjson))
        .route("/batches/{id}/events/{seq}", get(batch::event))
        .route("/metrics", get(metrics::metrics))
        .route_layer(middleware::from_fn_with_state(Arc::clone(&app), gate::reads));
    axum::Router::new()
        .merge(pages)
        .merge(reads)
        // A preview is asked for with a POST and answered 303 to its address, a GET (never
        // stored, so Back asks again and sees it done); the confirm is a POST (`actions`).
        .route("/batches/{id}/act", get(actions::one_preview).post(actions::one))
        .route("/bulk", get(bulk::bulk_preview).post(bulk::bulk))
        // The same for steering the whole pipeline (admins only).
        .route("/steer", get(steering::steer_preview).post(steering::steer))
        .route("/login", get(auth::login_form).post(auth::login))
        .route("/logout", get(auth::logout_form).post(auth::logout))
        .route("/assets/monitor.css", get(assets::css))
        .route("/assets/monitor.js", get(assets::js))
        .route("/health", get(|| async { "ok" }))
        .fallback(error_page::not_found)
        .method_not_allowed_fallback(error_page::wrong_method)
        // Forms only: a reason is at most 2000 characters.
        .layer(DefaultBodyLimit::max(error::BODY_LIMIT))
        .layer(middleware::from_fn_with_state(Arc::clone(&app), gate::identify))
        .layer(middleware::from_fn(auth::refuse_cross_site))
        .layer(middleware::from_fn_with_state(Arc::clone(&app), gate::check_host))
        .layer(middleware::from_fn(layers::log_request))
        .layer(middleware::from_fn(layers::security_headers))
        .with_state(app)
}
