//! What every handler shares: the monitor's ports, how it was started (`WebOptions`) and the
//! sign-in state (sessions, the rate limiter, the decoy hash). Apart from the router so a
//! page can take `State<Arc<App>>` without importing the route table.

use std::net::IpAddr;
use std::sync::Arc;

use axum::http::HeaderName;

use super::{accounts, limits, sessions};
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
    pub(super) sessions: sessions::Sessions,
    pub(super) limiter: limits::Limiter,
    /// What an unknown account's password is checked against (see `accounts::decoy_hash`).
    pub(super) decoy: String,
    /// Password checks running at once.
    pub(super) hashing: tokio::sync::Semaphore,
}

impl App {
    pub(super) fn new(monitor: Monitor, options: WebOptions) -> App {
        let decoy = if options.accounts.is_some() { accounts::decoy_hash() } else { String::new() };
        App {
            monitor,
            sessions: sessions::Sessions::new(options.sessions),
            limiter: limits::Limiter::new(options.sign_in_limit),
            decoy,
            hashing: tokio::sync::Semaphore::new(2),
            options,
        }
    }
}
