//! The ZooKeeper session a process's locks share: connecting (over TLS, with the pipeline's
//! identities), publishing its state for the runner (a disconnection that outlasts a deadline
//! below the session timeout is a loss), and requests that survive connection trouble.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use autocomp_model::InvalidInput;
use autocomp_toolkit::redact::display_url;
use tokio::sync::{mpsc, oneshot, watch};
use tracing::{debug, error, info, warn};
use zookeeper_client as zk;

use super::identity::{Identities, digest_id, pipeline_acl};
use super::tls::{self, tls_options};
use super::url::ZkUrl;
use super::{AUTH_ENV, MAX_RETRIES, RETRY_PAUSE};
use crate::locks::{LockError, SessionState};

/// Said once per process: without an identity anyone can delete or fake our locks.
static WARNED_UNPROTECTED: AtomicBool = AtomicBool::new(false);

pub(super) struct Shared {
    /// The locks URL as messages show it.
    pub(super) url: String,
    pub(super) root: String,
    pub(super) session_id: i64,
    /// As negotiated with the server: it expires the session this long after it last heard
    /// from us.
    pub(super) session_timeout: Duration,
    /// The ACL of every node we create: all rights for each of the pipeline's digest
    /// identities, read for anyone (so `autocomp locks` needs no secret); all rights for
    /// anyone when no identity is configured. The identities are named, not `auth`: that
    /// would also give all rights to the TLS client certificate's `x509` identity.
    pub(super) acls: Vec<zk::Acl>,
    /// Where the identity came from (`auth_file=/path`, `$AUTOCOMP_ZK_AUTH`), for messages.
    pub(super) identity: Option<String>,
    /// Our identities as digest ACLs name them (`user:base64(sha1(user:password))`).
    pub(super) digests: Vec<String>,
    /// `None` once closed.
    pub(super) client: Mutex<Option<zk::Client>>,
    pub(super) state: watch::Sender<SessionState>,
    pub(super) closing: AtomicBool,
    /// Nodes this process holds or is taking right now: one task per path at a time (the
    /// session is shared, so an owner check alone cannot tell our tasks apart), and what
    /// `close` deletes.
    pub(super) reserved: Mutex<HashSet<String>>,
    /// Where releases are queued, so those asked for while one is on its way are deleted
    /// together in the next `multi` (set once at connect, with the task serving it).
    pub(super) releases: OnceLock<mpsc::UnboundedSender<Release>>,
}

/// Nodes to delete if still ours, and where to answer once they are gone.
pub(super) struct Release {
    pub(super) nodes: Vec<String>,
    pub(super) answer: oneshot::Sender<Result<(), LockError>>,
}

impl Shared {
    /// Connects and opens the session (over TLS for `zks://`, authenticated with the
    /// identities of `auth_file` or `$AUTOCOMP_ZK_AUTH` if either is set), and starts
    /// publishing its state; fails (naming the servers) if no session comes within the
    /// session timeout.
    pub(super) async fn connect(url: &str) -> Result<Arc<Self>, LockError> {
        let target = ZkUrl::parse(url)?;
        let shown = display_url(url);
        let identities = Identities::load(&target)?;
        let client = open_session(&target, &shown, identities.as_ref()).await?;
        announce(&client, &target, identities.as_ref(), &shown);
        let watcher = client.state_watcher();
        let initial = state_of(client.state());
        let digests: Vec<String> =
            identities.iter().flat_map(|ids| ids.credentials.iter().map(|c| digest_id(c))).collect();
        let acls = match identities {
            Some(_) => pipeline_acl(&digests),
            None => vec![zk::Acl::new(zk::Permission::ALL, zk::AuthId::anyone())],
        };
        let shared = Arc::new(Shared {
            url: shown,
            root: target.root,
            session_id: client.session_id().0,
            session_timeout: client.session_timeout(),
            acls,
            identity: identities.as_ref().map(|ids| ids.source.clone()),
            digests,
            client: Mutex::new(Some(client)),
            state: watch::Sender::new(initial),
            closing: AtomicBool::new(false),
            reserved: Mutex::new(HashSet::new()),
            releases: OnceLock::new(),
        });
        watch_session(Arc::downgrade(&shared), watcher);
        Ok(shared)
    }

    pub(super) fn node_of(&self, relative: &str) -> String {
        format!("{}/{relative}", self.root)
    }

    pub(super) fn client(&self) -> Result<zk::Client, LockError> {
        let client = self.client.lock().expect("the client mutex is never poisoned").clone();
        client.ok_or_else(|| LockError::Unavailable(format!("the ZooKeeper lock service ({}) is closed", self.url)))
    }

    pub(super) fn is_lost(&self) -> bool {
        *self.state.borrow() == SessionState::Lost
    }

    pub(super) fn lost(&self) -> LockError {
        LockError::Unavailable(format!(
            "the ZooKeeper session {:#x} ({}) was lost: every lock it held is gone",
            self.session_id, self.url
        ))
    }

    pub(super) fn failed(&self, what: &str, node: &str, e: zk::Error) -> LockError {
        let hint = match e {
            zk::Error::NoAuth => {
                "; the node's ACL does not let this process's ZooKeeper identity do it: check ?auth_file= \
                 or $AUTOCOMP_ZK_AUTH against the identity that created the lock tree"
            }
            _ => "",
        };
        LockError::Unavailable(format!("ZooKeeper {what} of {node} failed ({}): {e}{hint}", self.url))
    }

    /// How a node we create is made, with our ACL.
    pub(super) fn options(&self, mode: zk::CreateMode) -> zk::CreateOptions<'_> {
        mode.with_acls(zk::Acls::new(&self.acls))
    }

    /// The chroot and its ancestors are persistent: a container would go once empty, and
    /// whoever re-created it first would own the lock tree. So is `live`: made once, a
    /// process start costs the one write of its liveness node, not a container's too.
    pub(super) fn mode_of_parent(&self, dir: &str) -> zk::CreateMode {
        let live = dir.strip_prefix(self.root.as_str()).is_some_and(|rest| rest == format!("/{}", super::LIVE));
        if self.root.starts_with(dir) || live { zk::CreateMode::Persistent } else { zk::CreateMode::Container }
    }

    pub(super) fn reserve(&self, node: &str) -> bool {
        self.reserved.lock().expect("never poisoned").insert(node.to_owned())
    }

    pub(super) fn unreserve(&self, node: &str) {
        self.reserved.lock().expect("never poisoned").remove(node);
    }

    /// Waits while the session is suspended; `Err` once it is lost.
    pub(super) async fn reconnected(&self) -> Result<(), LockError> {
        let mut state = self.state.subscribe();
        let connected =
            matches!(state.wait_for(|s| *s != SessionState::Suspended).await, Ok(s) if *s == SessionState::Connected);
        if connected { Ok(()) } else { Err(self.lost()) }
    }

    /// Sends one request. Connection trouble waits for the session to come back and says
    /// so (`Interrupted`); a lost session is an error.
    pub(super) async fn send<T, F: Future<Output = Result<T, zk::Error>>>(
        &self,
        request: impl FnOnce(zk::Client) -> F,
    ) -> Result<Sent<T>, LockError> {
        match request(self.client()?).await {
            Err(e) if session_gone(&e) => {
                // The state watcher says so too, a moment later; nothing comes after a loss.
                self.state.send_replace(SessionState::Lost);
                Err(self.lost())
            }
            Err(e) if connection_trouble(&e) => {
                debug!("ZooKeeper request interrupted: {e}");
                self.reconnected().await?;
                tokio::time::sleep(RETRY_PAUSE).await;
                Ok(Sent::Interrupted)
            }
            answered => Ok(Sent::Answered(answered)),
        }
    }

    /// Sends a request until it is answered; `true` if it had to be re-sent (so an earlier
    /// copy may have been applied).
    pub(super) async fn call<T, F: Future<Output = Result<T, zk::Error>>>(
        &self,
        request: impl Fn(zk::Client) -> F,
    ) -> Result<(Result<T, zk::Error>, bool), LockError> {
        for attempt in 0..MAX_RETRIES {
            if let Sent::Answered(answer) = self.send(&request).await? {
                return Ok((answer, attempt > 0));
            }
        }
        Err(LockError::Unavailable(format!("ZooKeeper ({}) keeps dropping requests", self.url)))
    }
}

fn state_of(state: zk::SessionState) -> SessionState {
    match state {
        zk::SessionState::SyncConnected => SessionState::Connected,
        zk::SessionState::Disconnected | zk::SessionState::ConnectedReadOnly => SessionState::Suspended,
        _ => SessionState::Lost,
    }
}

/// How long a disconnected session is held before we give it up ourselves, as a share of
/// the session timeout. The client notices silence after about 0.45 of the timeout (its
/// connection timeout, checked every twentieth); 0.3 more puts our deadline near 0.75 of
/// the timeout from the server's last word, while the server expires the session at 1.0
/// (and may hand our locks to another host then): our work stops before anyone else's
/// can start, even when a partition means we never hear of the expiry.
const DISCONNECTED_DEADLINE_SHARE: f64 = 0.3;

/// How long cancelled work may still run once the session is lost, as a share of the
/// session timeout: given up near 0.75 of it, the process is gone near 0.85.
pub(super) const LOST_SESSION_GRACE_SHARE: f64 = 0.1;

/// Publishes the client's session states until a terminal one (or until the service is
/// gone). A disconnection that outlasts the deadline is published as `Lost`: nothing this
/// process holds can be trusted after the server may have expired it.
fn watch_session(shared: Weak<Shared>, mut watcher: zk::StateWatcher) {
    tokio::spawn(async move {
        let mut suspended = false;
        loop {
            let deadline = shared.upgrade().map(|s| s.session_timeout.mul_f64(DISCONNECTED_DEADLINE_SHARE));
            let zk_state = match deadline {
                Some(deadline) if suspended => match tokio::time::timeout(deadline, watcher.changed()).await {
                    Ok(state) => state,
                    Err(_) => {
                        let Some(shared) = shared.upgrade() else { return };
                        error!(
                            "no word from ZooKeeper ({}) for {} after the connection dropped: the server may \
                             expire session {:#x} and give its locks away before we hear of it; giving up \
                             every lock and cancelling all work",
                            shared.url,
                            humantime::format_duration(deadline),
                            shared.session_id
                        );
                        shared.state.send_replace(SessionState::Lost);
                        return;
                    }
                },
                _ => watcher.changed().await,
            };
            let Some(shared) = shared.upgrade() else { return };
            let state = state_of(zk_state);
            suspended = state == SessionState::Suspended;
            match state {
                SessionState::Connected => info!("ZooKeeper session {:#x} connected again", shared.session_id),
                SessionState::Suspended => warn!(
                    "lost the connection to ZooKeeper ({}); holding commits until it is back (at most {})",
                    shared.url,
                    humantime::format_duration(shared.session_timeout.mul_f64(DISCONNECTED_DEADLINE_SHARE))
                ),
                SessionState::Lost if shared.closing.load(Ordering::Relaxed) => {
                    debug!("ZooKeeper session closed")
                }
                SessionState::Lost => error!(
                    "the ZooKeeper session {:#x} ({}) ended ({zk_state}): every lock it held is gone",
                    shared.session_id, shared.url
                ),
            }
            shared.state.send_replace(state);
            if zk_state.is_terminated() {
                return;
            }
        }
    });
}

/// How one request ended, connection trouble aside.
pub(super) enum Sent<T> {
    Answered(Result<T, zk::Error>),
    /// The connection failed under the request (it may or may not have been applied) and
    /// the session is back now.
    Interrupted,
}

pub(super) fn session_gone(e: &zk::Error) -> bool {
    matches!(
        e,
        zk::Error::SessionExpired
            | zk::Error::SessionMoved
            | zk::Error::ClientClosed
            | zk::Error::AuthFailed
            | zk::Error::NoHosts
    )
}

fn connection_trouble(e: &zk::Error) -> bool {
    matches!(
        e,
        zk::Error::ConnectionLoss
            | zk::Error::Timeout
            | zk::Error::Throttled
            | zk::Error::Custom(_)
            | zk::Error::UnexpectedError(_)
            | zk::Error::RuntimeInconsistent
    )
}

/// `host:port[,...]` all on this machine (a password sent there in clear stays on it).
fn all_loopback(hosts: &str) -> bool {
    hosts.split(',').all(|host| {
        let name = host.rsplit_once(':').map_or(host, |(name, _)| name);
        name == "localhost" || name.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
    })
}

/// A session with the servers of `target`, within twice the session timeout; a `zks://`
/// server whose certificate is not trusted is a configuration error, said at once.
async fn open_session(target: &ZkUrl, shown: &str, identities: Option<&Identities>) -> Result<zk::Client, LockError> {
    let unreachable = |reason: String| {
        LockError::Unavailable(format!(
            "cannot reach ZooKeeper at {} (locks = {shown}): no session within {}: {reason}",
            target.hosts,
            humantime::format_duration(target.session_timeout)
        ))
    };
    let mut connector = zk::Client::connector().with_session_timeout(target.session_timeout);
    for credential in identities.iter().flat_map(|ids| &ids.credentials) {
        connector = connector.with_auth("digest", credential.as_bytes());
    }
    let connecting = match &target.tls {
        Some(tls) => {
            // The client builds its rustls config with the process default provider; two
            // are linked (ring, ours, and aws-lc-rs), so there is none unless one is set.
            let _ = rustls::crypto::ring::default_provider().install_default();
            futures_util::future::Either::Left(connector.with_tls(tls_options(tls)?).secure_connect(&target.hosts))
        }
        None => futures_util::future::Either::Right(connector.connect(&target.hosts)),
    };
    let connected = tokio::time::timeout(target.session_timeout * 2, connecting);
    let answer = match &target.tls {
        Some(files) => {
            // The client retries a server whose certificate fails as if it were down:
            // without a session soon, see whether that is why (then a configuration error).
            let untrusted = async {
                tokio::time::sleep(tls::PROBE_AFTER).await;
                tls::untrusted(&target.hosts, files).await
            };
            tokio::select! {
                answer = connected => answer,
                Some(reason) = untrusted => return Err(InvalidInput::new("locks url", shown, reason).into()),
            }
        }
        None => connected.await,
    };
    match answer {
        Ok(Ok(client)) => Ok(client),
        Ok(Err(e)) => Err(unreachable(e.to_string())),
        Err(_) => Err(unreachable("no answer".into())),
    }
}

/// Says where the session is, and warns (once per process) of locks open to anyone, or of
/// a password crossing the network in clear.
fn announce(client: &zk::Client, target: &ZkUrl, identities: Option<&Identities>, shown: &str) {
    info!(
        session = %client.session_id(),
        timeout = ?client.session_timeout(),
        tls = target.tls.is_some(),
        users = ?identities.map(Identities::users),
        "connected to ZooKeeper at {}; locks under {}",
        target.hosts,
        target.root
    );
    match identities {
        None if !WARNED_UNPROTECTED.swap(true, Ordering::Relaxed) => warn!(
            "no ZooKeeper identity configured (?auth_file= in the locks URL, or ${AUTH_ENV}): the lock \
             nodes this process creates are open to anyone who can reach ZooKeeper ({shown}), who can \
             delete or fake them"
        ),
        Some(ids) if target.tls.is_none() && !all_loopback(&target.hosts) => {
            warn!("the ZooKeeper password of {} crosses the network in clear over zk://; use zks://", ids.source)
        }
        _ => {}
    }
}
