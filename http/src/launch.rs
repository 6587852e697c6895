//! The life of a service binary around its own work, written once for the store service
//! and the index service: the flags every service takes, binding the address (loopback
//! unless told; TLS and connection limits as `serve::ListenArgs` says), serving the waiting
//! routes at once, waiting for the upstream, handing over to the real routes, and the exit
//! code when it stops.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use axum::Router;
use tokio::task::JoinHandle;

use crate::serve::{ListenArgs, serve_with};
use crate::service::{Access, ServiceToken};
use crate::startup::{Startup, stopped_before_ready};

/// The flags every service's `serve` takes besides its own (flatten into its clap command).
#[derive(Debug, Clone, clap::Args)]
pub struct ServiceArgs {
    /// File holding the bearer tokens writes need, one a line (else $AUTOCOMP_TOKEN): any
    /// is accepted, the first is shown to other services; read again when it changes or on
    /// SIGHUP, so a token is rotated by adding the new line, moving clients, removing the old.
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// Ask for the token on reads from loopback too (on a host other users share).
    #[arg(long)]
    pub reads_need_token: bool,
    /// More logging (-v debug, -vv trace); RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count)]
    pub verbose: u8,
    #[command(flatten)]
    pub listen: ListenArgs,
}

impl ServiceArgs {
    /// The service's bearer tokens; without one the service does not start (exit 2). A
    /// token file is watched from here on (call within the service's runtime).
    pub fn token(&self) -> Result<ServiceToken, ExitCode> {
        let token = ServiceToken::load(self.token_file.as_deref()).map_err(|message| fail(2, message))?;
        token.watch();
        Ok(token)
    }

    /// Who may call what, with `token`.
    pub fn access(&self, token: &ServiceToken) -> Access {
        let access = Access::with_tokens(token);
        if self.reads_need_token { access.reads_need_token() } else { access }
    }
}

/// Allocations of at least this many bytes get their own mapping (`return_large_allocations`).
const LARGE_ALLOCATION_BYTES: std::ffi::c_int = 256 << 10;

/// Makes the allocator give each allocation of `LARGE_ALLOCATION_BYTES` or more a mapping of
/// its own, returned to the system when it is freed. glibc's malloc raises that threshold
/// (up to 32 MiB) after the first such free, and from then on megabyte-sized buffers (an
/// event's details read to be summarized, a page of a streamed answer) come from the
/// per-thread arenas, which keep them once freed: four viewers loading a monitor page of 50
/// events of 1 MB left +88 MiB held, where at most +16 MiB was live at once. Call first in
/// a service's `main`. Elsewhere than glibc it does nothing.
pub fn return_large_allocations() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        unsafe extern "C" {
            fn mallopt(param: std::ffi::c_int, value: std::ffi::c_int) -> std::ffi::c_int;
        }
        /// glibc's malloc.h.
        const M_MMAP_THRESHOLD: std::ffi::c_int = -3;
        // SAFETY: mallopt only sets a tuning parameter of glibc's allocator, any time, from
        // any thread; a value it refuses is ignored (it answers 0).
        unsafe { mallopt(M_MMAP_THRESHOLD, LARGE_ALLOCATION_BYTES) };
    }
}

/// Logs `message` as the reason the service stops and returns `code`.
pub fn fail(code: u8, message: impl std::fmt::Display) -> ExitCode {
    tracing::error!("{message}");
    ExitCode::from(code)
}

/// A service that is listening: it answers from the moment it is bound, first with what it
/// waits for (`Startup`), then with its own routes.
pub struct Launch {
    startup: Arc<Startup>,
    serving: JoinHandle<std::io::Result<()>>,
    /// The address it listens on, as bound (the port filled in when 0 was asked).
    pub bound: String,
    /// `https` when it serves TLS, else `http`.
    pub scheme: &'static str,
}

impl Launch {
    /// Binds `listen` (exit 2 when it cannot: in use, not ours; or when the TLS files
    /// cannot be used) and serves the waiting routes at once, with TLS and the limits `args`
    /// sets. `upstream` names what the service waits for ("the database ...").
    pub async fn bind(listen: SocketAddr, upstream: impl Into<String>, args: &ListenArgs) -> Result<Self, ExitCode> {
        let tls = args.tls().map_err(|message| fail(2, message))?;
        let listener = match tokio::net::TcpListener::bind(listen).await {
            Ok(listener) => listener,
            Err(error) => return Err(fail(2, format!("cannot listen on {listen}: {error}"))),
        };
        let bound = listener.local_addr().map(|a| a.to_string()).unwrap_or_else(|_| listen.to_string());
        let scheme = if tls.is_some() { "https" } else { "http" };
        let startup = Startup::new(upstream);
        let serving = tokio::spawn(serve_with(listener, startup.router(), args.limits(), tls));
        Ok(Self { startup, serving, bound, scheme })
    }

    /// Waits for the upstream as `Startup::wait_for` does, unless the service is stopped
    /// (SIGTERM) or fails first: then the exit code it stopped with.
    pub async fn connect<T, E, F, Fut>(
        &mut self,
        connect: F,
        permanent: impl Fn(&E) -> bool,
    ) -> Result<Result<T, E>, ExitCode>
    where
        E: std::fmt::Display,
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        tokio::select! {
            connected = self.startup.wait_for(connect, permanent) => Ok(connected),
            stopped = &mut self.serving => Err(stopped_before_ready(stopped)),
        }
    }

    /// The upstream answered: from now on every request goes to `routes`.
    pub fn ready(&self, routes: Router) {
        self.startup.ready(routes);
    }

    /// Serves until SIGTERM/SIGINT; what serving ended with.
    pub async fn served(self) -> std::io::Result<()> {
        self.serving.await.unwrap_or_else(|panic| Err(std::io::Error::other(panic.to_string())))
    }
}

/// The exit code of a service that served: 0 when stopped, 5 when serving failed.
pub fn exit_code(served: std::io::Result<()>) -> ExitCode {
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => fail(5, format!("serving: {error}")),
    }
}
