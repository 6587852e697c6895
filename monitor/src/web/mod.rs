//! The monitor over HTTP: server-rendered HTML pages (overview, batch matrix, batch page with
//! its timeline, the pipeline graph, the batches waiting for a person, the alerts), the
//! operator's actions (and an admin's steering of the
//! whole pipeline) as preview-then-confirm forms, CSV/NDJSON export, and what every response
//! shares (security headers, the Host check, who is asking, the cross-site write guard, error
//! pages).
//!
//! `pages` renders what `data` reads; `actions` goes through the operator module's own
//! `preview`/`perform`, and `steering` through its `preview_steer`/`steer`, so a write from
//! the browser is exactly a write from the CLI, recorded as the signed-in account
//! (`accounts`, `sessions`, `gate`).

pub mod access;
pub mod accounts;
mod actions;
mod alerts;
mod assets;
pub mod auth;
mod charts;
mod contracts;
mod export;
pub mod gate;
mod graph;
pub mod html;
pub mod limits;
mod needs;
mod output;
mod pages;
pub mod sessions;
mod steering;
mod svg;
mod timeline;

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use autocomp_framework::exit::UNREACHABLE;
use autocomp_model::InvalidInput;
use autocomp_ops::operator::OperatorError;
use axum::extract::{DefaultBodyLimit, Request};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use self::gate::Caller;
use self::html::{Nav, Page, code_spans, esc, w};
use crate::data::Monitor;

/// How the web monitor is run.
#[derive(Clone, Default)]
pub struct WebOptions {
    /// Who may sign in, and as what; without accounts the monitor is read only.
    pub accounts: Option<Arc<accounts::Accounts>>,
    /// A header a trusted reverse proxy sets to the signed-in account's name (e.g.
    /// `X-Remote-User`): believed only on requests from `trusted_proxies`, ignored (with a
    /// warning) from anywhere else. The account's role comes from `accounts`.
    pub trusted_user_header: Option<HeaderName>,
    /// The reverse proxies' addresses: their user header and `X-Forwarded-For` /
    /// `X-Forwarded-Proto` are believed.
    pub trusted_proxies: Vec<IpAddr>,
    /// Every page, export and metric needs sign-in (`/health`, the sign-in form and the
    /// assets excepted).
    pub reads_need_sign_in: bool,
    /// The names the monitor answers to (`host`, `host:port`, `[v6]`); any other `Host`
    /// gets 421. Empty: any name (the binary always fills it).
    pub host_names: Vec<String>,
    pub sessions: sessions::SessionLimits,
    pub sign_in_limit: limits::SignInLimit,
    /// Served over TLS: cookies get `Secure`.
    pub secure_cookies: bool,
}

/// Everything a handler needs.
pub struct App {
    pub monitor: Monitor,
    pub options: WebOptions,
    sessions: sessions::Sessions,
    limiter: limits::Limiter,
    /// What an unknown account's password is checked against (see `accounts::decoy_hash`).
    decoy: String,
    /// Password checks running at once.
    hashing: tokio::sync::Semaphore,
}

/// The monitor's routes; tests serve them on `127.0.0.1:0` or call them directly.
pub fn router(monitor: Monitor, options: WebOptions) -> axum::Router {
    let decoy = if options.accounts.is_some() { accounts::decoy_hash() } else { String::new() };
    let app = Arc::new(App {
        monitor,
        sessions: sessions::Sessions::new(options.sessions),
        limiter: limits::Limiter::new(options.sign_in_limit),
        decoy,
        hashing: tokio::sync::Semaphore::new(2),
        options,
    });
    let pages = axum::Router::new()
        .route("/", get(pages::overview))
        .route("/batches", get(pages::batches))
        .route("/batches/{id}", get(pages::batch))
        .route("/waiting", get(pages::waiting))
        .route("/graph", get(graph::page))
        .route("/charts", get(charts::page))
        .route("/alerts", get(alerts::alerts))
        .route_layer(middleware::from_fn_with_state(Arc::clone(&app), pages::etag))
        .route_layer(middleware::from_fn_with_state(Arc::clone(&app), gate::reads));
    let reads = axum::Router::new()
        .route("/batches.csv", get(export::csv))
        .route("/batches.ndjson", get(export::ndjson))
        .route("/batches/{id}/events/{seq}", get(pages::event))
        .route("/metrics", get(metrics))
        .route_layer(middleware::from_fn_with_state(Arc::clone(&app), gate::reads));
    axum::Router::new()
        .merge(pages)
        .merge(reads)
        // A preview is asked for with a POST and answered 303 to its address, a GET (never
        // stored, so Back asks again and sees it done); the confirm is a POST (`actions`).
        .route("/batches/{id}/act", get(actions::one_preview).post(actions::one))
        .route("/bulk", get(actions::bulk_preview).post(actions::bulk))
        // The same for steering the whole pipeline (admins only).
        .route("/steer", get(steering::steer_preview).post(steering::steer))
        .route("/login", get(auth::login_form).post(auth::login))
        .route("/logout", get(auth::logout_form).post(auth::logout))
        .route("/assets/monitor.css", get(assets::css))
        .route("/assets/monitor.js", get(assets::js))
        .route("/health", get(|| async { "ok" }))
        .fallback(not_found)
        .method_not_allowed_fallback(wrong_method)
        // Forms only: a reason is at most 2000 characters.
        .layer(DefaultBodyLimit::max(64 << 10))
        .layer(middleware::from_fn_with_state(Arc::clone(&app), gate::identify))
        .layer(middleware::from_fn(auth::refuse_cross_site))
        .layer(middleware::from_fn_with_state(Arc::clone(&app), gate::check_host))
        .layer(middleware::from_fn(log_request))
        .layer(middleware::from_fn(security_headers))
        .with_state(app)
}

/// Serves the monitor on `listener` until SIGTERM or SIGINT, then finishes requests in
/// flight.
pub async fn serve(monitor: Monitor, options: WebOptions, listener: tokio::net::TcpListener) -> std::io::Result<()> {
    autocomp_http::serve::serve(listener, router(monitor, options)).await
}

/// The policy allows this origin's own stylesheet and script only: no inline code, no
/// other host, no framing.
const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                   form-action 'self'; frame-ancestors 'none'";

async fn security_headers(request: Request, next: Next) -> Response {
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
async fn log_request(request: Request, next: Next) -> Response {
    let (method, path) = (request.method().clone(), request.uri().path().to_owned());
    let started = Instant::now();
    let response = next.run(request).await;
    tracing::debug!(%method, path, status = response.status().as_u16(), ms = started.elapsed().as_millis() as u64);
    response
}

/// A GET page: its layout, the one-time message if the request carries one (cleared by
/// the response), and the live region.
pub(crate) fn respond(headers: &HeaderMap, caller: &Caller, title: &str, nav: Nav, here: &str, body: &str) -> Response {
    respond_with(StatusCode::OK, headers, caller, title, nav, here, body)
}

pub(crate) fn respond_with(
    status: StatusCode,
    headers: &HeaderMap,
    caller: &Caller,
    title: &str,
    nav: Nav,
    here: &str,
    body: &str,
) -> Response {
    let access = &caller.access;
    let flash = auth::take_flash(headers, caller.secure);
    let page =
        Page { title, nav, access: Some(access), flash: flash.as_ref().map(|(m, _)| m.as_str()), live: true, here };
    let mut response = html_response(status, page.render(body));
    if let Some((_, clear)) = flash {
        response.headers_mut().append(header::SET_COOKIE, clear);
    }
    response
}

/// The page's own address, path and query, for the live region and sign-in's return.
pub(crate) fn here(uri: &axum::http::Uri) -> String {
    uri.path_and_query().map_or("/".into(), |pq| pq.as_str().to_owned())
}

pub(crate) fn html_response(status: StatusCode, page: String) -> Response {
    (status, [(header::CONTENT_TYPE, "text/html; charset=utf-8"), (header::CACHE_CONTROL, "no-cache, private")], page)
        .into_response()
}

/// A request the monitor cannot answer as asked: an HTML page with the status, in the
/// operator module's own words where it came from there. Nothing was changed.
#[derive(Debug)]
pub struct WebError(Box<ErrorPage>);

#[derive(Debug)]
struct ErrorPage {
    status: StatusCode,
    title: String,
    words: String,
    input: Option<InvalidInput>,
    link: Option<(String, String)>,
}

impl WebError {
    pub fn new(status: StatusCode, title: &str, words: impl Into<String>) -> Self {
        WebError(Box::new(ErrorPage { status, title: title.into(), words: words.into(), input: None, link: None }))
    }

    /// 400 naming the field and the value.
    pub fn invalid(input: InvalidInput) -> Self {
        let mut error = Self::new(StatusCode::BAD_REQUEST, "Bad input", input.to_string());
        error.0.input = Some(input);
        error
    }

    /// A way on from the error page.
    pub fn with_link(mut self, href: &str, label: &str) -> Self {
        self.0.link = Some((href.into(), label.into()));
        self
    }

    pub fn status(&self) -> StatusCode {
        self.0.status
    }
}

impl From<OperatorError> for WebError {
    fn from(error: OperatorError) -> Self {
        match error {
            OperatorError::Input(input) => WebError::invalid(input),
            OperatorError::Refused(words) | OperatorError::AlreadyInState(words) => {
                WebError::new(StatusCode::CONFLICT, "Refused", words)
            }
            OperatorError::Run(run) => {
                let status = if run.code() == UNREACHABLE {
                    StatusCode::SERVICE_UNAVAILABLE
                } else {
                    StatusCode::INTERNAL_SERVER_ERROR
                };
                let words = run.to_string();
                tracing::warn!(status = status.as_u16(), "{words}");
                WebError::new(status, "The pipeline cannot be read", words)
            }
            // An error this release of the operator does not have yet: the server's.
            other => WebError::new(StatusCode::INTERNAL_SERVER_ERROR, "The pipeline cannot be read", other.to_string()),
        }
    }
}

impl From<InvalidInput> for WebError {
    fn from(input: InvalidInput) -> Self {
        WebError::invalid(input)
    }
}

impl IntoResponse for WebError {
    fn into_response(self) -> Response {
        let error = *self.0;
        let mut body = String::new();
        w!(body, "<h1>{}</h1>\n<p class=\"error\">{}</p>\n", esc(&error.title), code_spans(&error.words));
        if let Some(input) = &error.input {
            w!(
                body,
                "<dl class=\"facts\"><dt>Field</dt><dd><code>{}</code></dd><dt>Value</dt><dd><code>{}</code></dd>\
                 <dt>Why</dt><dd>{}</dd></dl>\n",
                esc(&input.field),
                esc(&input.value),
                code_spans(&input.reason)
            );
        }
        if error.status.is_client_error() && error.status != StatusCode::NOT_FOUND {
            body.push_str("<p>Nothing was changed.</p>\n");
        }
        if let Some((href, label)) = &error.link {
            w!(body, "<p><a href=\"{}\">{}</a></p>\n", esc(href), esc(label));
        }
        body.push_str("<p><a href=\"/\">Back to the overview</a></p>\n");
        let page = Page { title: &error.title, nav: Nav::None, access: None, flash: None, live: false, here: "/" };
        html_response(error.status, page.render(&body))
    }
}

async fn not_found(uri: axum::http::Uri) -> WebError {
    WebError::new(StatusCode::NOT_FOUND, "Not found", format!("nothing here: {}", uri.path()))
}

async fn wrong_method(method: axum::http::Method, uri: axum::http::Uri) -> WebError {
    WebError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "Method not allowed",
        format!("{method} is not allowed on {}", uri.path()),
    )
}

/// The pipeline's metrics in the Prometheus text format (the same as `autocomp metrics`).
async fn metrics(axum::extract::State(app): axum::extract::State<Arc<App>>) -> Response {
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
