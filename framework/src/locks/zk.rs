//! ZooKeeper locks, selected by `zk://host:port[,host:port...]/chroot`.
//!
//! A lock is ONE ephemeral node at `<chroot>/poll/<component>` or
//! `<chroot>/batch/<component>/<batch-id>` whose data is the JSON `LockHolder`. Its parents are
//! container nodes, created on demand (another process creating them first, or the server
//! removing an emptied one meanwhile, is expected), which the server deletes once empty.
//! Try-lock is one create: NodeExists means busy; waiting is an exists watch on the node until
//! the deadline. Release checks the node is still ours, then deletes it. A lock cycle is so
//! two ZooKeeper writes (create + delete), on a fresh path too, plus one container create for
//! each missing parent.
//!
//! A create or delete whose reply is lost with the connection may or may not have happened.
//! A create is retried once the session is back, and a NodeExists after such a retry is
//! resolved by the node's `ephemeral_owner`: our session id means we hold it. A delete is never
//! retried blindly: ownership is read again first, so we can never delete another's lock.
//!
//! The session state is published for the runner: Disconnected => Suspended,
//! SyncConnected => Connected, Expired / Closed / AuthFailed => Lost (every lock is gone),
//! and Suspended for longer than a client-side deadline below the session timeout => Lost.
//! `close` deletes whatever is still held and closes the session, so nothing lingers after
//! the process exits.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use async_trait::async_trait;
use autocomp_model::InvalidInput;
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{debug, error, info, warn};
use zookeeper_client as zk;

use super::{HeldLock, Lock, LockError, LockHolder, LockPath, LockService, SessionState};

/// The session timeout when the URL does not say `?session_timeout=...`.
pub const DEFAULT_SESSION_TIMEOUT: Duration = Duration::from_secs(10);

const EPHEMERAL: zk::CreateOptions<'static> = zk::CreateMode::Ephemeral.with_acls(zk::Acls::anyone_all());
const CONTAINER: zk::CreateOptions<'static> = zk::CreateMode::Container.with_acls(zk::Acls::anyone_all());

/// How often one request is re-sent after connection trouble before giving up.
const MAX_RETRIES: u32 = 50;
/// Pause before re-sending after connection trouble (the session state may lag the error).
const RETRY_PAUSE: Duration = Duration::from_millis(10);
/// Re-check interval while another task of this process holds or is taking the same path.
const IN_PROCESS_PAUSE: Duration = Duration::from_millis(10);
/// How long `close` waits for each deletion and for the server to end the session.
const CLOSE_WAIT: Duration = Duration::from_secs(3);

/// A parsed `zk://` locks URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZkUrl {
    /// `host:port[,host:port...]`, as the client connects.
    pub hosts: String,
    /// The chroot every lock node lives under, e.g. `/autocomp` (no trailing slash).
    pub root: String,
    /// The session timeout asked for (the server clamps it to its own min/max).
    pub session_timeout: Duration,
}

impl ZkUrl {
    /// `zk://host:port[,host:port...]/chroot[?session_timeout=10s]`.
    pub fn parse(url: &str) -> Result<Self, InvalidInput> {
        let invalid = |reason: String| InvalidInput::new("locks url", url, reason);
        let shape = "write zk://host:port[,host:port...]/chroot, e.g. zk://127.0.0.1:2181/autocomp";
        let rest = url.strip_prefix("zk://").ok_or_else(|| invalid(format!("not a zk:// URL; {shape}")))?;
        let (rest, query) = rest.split_once('?').map_or((rest, None), |(rest, query)| (rest, Some(query)));
        let Some((hosts, chroot)) = rest.split_once('/') else {
            return Err(invalid(format!("names no chroot; {shape}")));
        };
        if hosts.is_empty() {
            return Err(invalid(format!("names no host; {shape}")));
        }
        for host in hosts.split(',') {
            let port_ok = match host.rsplit_once(':') {
                Some((name, port)) => !name.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0),
                None => !host.is_empty(),
            };
            if !port_ok {
                return Err(invalid(format!("{host:?} is not a host:port; {shape}")));
            }
        }
        let chroot = chroot.trim_end_matches('/');
        if chroot.is_empty() {
            return Err(invalid(format!("names no chroot; {shape}")));
        }
        if chroot.split('/').any(|s| s.is_empty() || s == "." || s == "..") {
            return Err(invalid(format!("the chroot /{chroot} has an empty, `.` or `..` part")));
        }
        if chroot.split('/').next() == Some("zookeeper") {
            return Err(invalid("/zookeeper belongs to ZooKeeper itself; choose another chroot".into()));
        }
        let mut session_timeout = DEFAULT_SESSION_TIMEOUT;
        for option in query.unwrap_or_default().split('&').filter(|o| !o.is_empty()) {
            match option.split_once('=') {
                Some(("session_timeout", value)) => {
                    session_timeout = humantime::parse_duration(value)
                        .ok()
                        .filter(|d| !d.is_zero())
                        .ok_or_else(|| invalid(format!("session_timeout={value} is not a duration like 10s")))?;
                }
                _ => {
                    return Err(invalid(format!(
                        "unknown option {option:?}; the only one is session_timeout (e.g. ?session_timeout=10s)"
                    )));
                }
            }
        }
        Ok(Self { hosts: hosts.to_owned(), root: format!("/{chroot}"), session_timeout })
    }
}

/// The ZooKeeper lock service: one session per process.
pub struct ZkLocks {
    shared: Arc<Shared>,
}

struct Shared {
    url: String,
    root: String,
    session_id: i64,
    /// As negotiated with the server: it expires the session this long after it last heard
    /// from us.
    session_timeout: Duration,
    /// `None` once closed.
    client: Mutex<Option<zk::Client>>,
    state: watch::Sender<SessionState>,
    closing: AtomicBool,
    /// Nodes this process holds or is taking right now: one task per path at a time (the
    /// session is shared, so an owner check alone cannot tell our tasks apart), and what
    /// `close` deletes.
    reserved: Mutex<HashSet<String>>,
}

impl ZkLocks {
    /// Connects and opens the session; fails (naming the servers) if no session is
    /// established within the session timeout.
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        let target = ZkUrl::parse(url)?;
        let unreachable = |reason: String| {
            LockError::Unavailable(format!(
                "cannot reach ZooKeeper at {} (locks = {url}): no session within {}: {reason}",
                target.hosts,
                humantime::format_duration(target.session_timeout)
            ))
        };
        let connecting = zk::Client::connector().with_session_timeout(target.session_timeout).connect(&target.hosts);
        let client = match tokio::time::timeout(target.session_timeout * 2, connecting).await {
            Ok(Ok(client)) => client,
            Ok(Err(e)) => return Err(unreachable(e.to_string())),
            Err(_) => return Err(unreachable("no answer".into())),
        };
        let session_id = client.session_id().0;
        info!(
            session = %client.session_id(),
            timeout = ?client.session_timeout(),
            "connected to ZooKeeper at {}; locks under {}",
            target.hosts,
            target.root
        );
        let watcher = client.state_watcher();
        let initial = state_of(client.state());
        let shared = Arc::new(Shared {
            url: url.to_owned(),
            root: target.root,
            session_id,
            session_timeout: client.session_timeout(),
            client: Mutex::new(Some(client)),
            state: watch::Sender::new(initial),
            closing: AtomicBool::new(false),
            reserved: Mutex::new(HashSet::new()),
        });
        watch_session(Arc::downgrade(&shared), watcher);
        Ok(Self { shared })
    }

    /// Our session id (the `ephemeral_owner` of every node we hold).
    pub fn session_id(&self) -> i64 {
        self.shared.session_id
    }

    /// The absolute node path of a lock.
    pub fn node_of(&self, path: &LockPath) -> String {
        self.shared.node_of(&path.relative())
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
const LOST_SESSION_GRACE_SHARE: f64 = 0.1;

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
enum Sent<T> {
    Answered(Result<T, zk::Error>),
    /// The connection failed under the request (it may or may not have been applied) and
    /// the session is back now.
    Interrupted,
}

fn session_gone(e: &zk::Error) -> bool {
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

fn parent_of(node: &str) -> &str {
    match node.rfind('/') {
        Some(0) | None => "/",
        Some(i) => &node[..i],
    }
}

impl Shared {
    fn node_of(&self, relative: &str) -> String {
        format!("{}/{relative}", self.root)
    }

    fn client(&self) -> Result<zk::Client, LockError> {
        let client = self.client.lock().expect("the client mutex is never poisoned").clone();
        client.ok_or_else(|| LockError::Unavailable(format!("the ZooKeeper lock service ({}) is closed", self.url)))
    }

    fn is_lost(&self) -> bool {
        *self.state.borrow() == SessionState::Lost
    }

    fn lost(&self) -> LockError {
        LockError::Unavailable(format!(
            "the ZooKeeper session {:#x} ({}) was lost: every lock it held is gone",
            self.session_id, self.url
        ))
    }

    fn failed(&self, what: &str, node: &str, e: zk::Error) -> LockError {
        LockError::Unavailable(format!("ZooKeeper {what} of {node} failed ({}): {e}", self.url))
    }

    fn reserve(&self, node: &str) -> bool {
        self.reserved.lock().expect("never poisoned").insert(node.to_owned())
    }

    fn unreserve(&self, node: &str) {
        self.reserved.lock().expect("never poisoned").remove(node);
    }

    /// Waits while the session is suspended; `Err` once it is lost.
    async fn reconnected(&self) -> Result<(), LockError> {
        let mut state = self.state.subscribe();
        let connected =
            matches!(state.wait_for(|s| *s != SessionState::Suspended).await, Ok(s) if *s == SessionState::Connected);
        if connected { Ok(()) } else { Err(self.lost()) }
    }

    /// Sends one request. Connection trouble waits for the session to come back and says
    /// so (`Interrupted`); a lost session is an error.
    async fn send<T, F: Future<Output = Result<T, zk::Error>>>(
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
    async fn call<T, F: Future<Output = Result<T, zk::Error>>>(
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

    /// One ephemeral create at `node`: `true` if it is ours, `false` if someone else's.
    async fn create_lock(&self, node: &str, data: &[u8]) -> Result<bool, LockError> {
        let mut resent = false;
        for _ in 0..MAX_RETRIES {
            let (answer, retried) =
                self.call(|client| async move { client.create(node, data, &EPHEMERAL).await }).await?;
            resent |= retried;
            match answer {
                Ok(_) => return Ok(true),
                Err(zk::Error::NodeExists) if resent => {
                    // An earlier copy of our create may have been applied: the owner says.
                    let (stat, _) = self.call(|client| async move { client.check_stat(node).await }).await?;
                    match stat.map_err(|e| self.failed("read", node, e))? {
                        Some(stat) => return Ok(stat.ephemeral_owner == self.session_id),
                        None => continue,
                    }
                }
                Err(zk::Error::NodeExists) => return Ok(false),
                Err(zk::Error::NoNode) => self.create_parents(node).await?,
                Err(e) => return Err(self.failed("create", node, e)),
            }
        }
        Err(LockError::Unavailable(format!("cannot create {node} ({}): its parent keeps disappearing", self.url)))
    }

    /// Creates the missing container ancestors of `node`, the chroot included. Another
    /// process creating one first is fine; the server deleting an emptied one meanwhile makes
    /// us go up and create it again.
    async fn create_parents(&self, node: &str) -> Result<(), LockError> {
        let mut pending = vec![parent_of(node)];
        let mut created = 0;
        for _ in 0..MAX_RETRIES {
            let Some(&dir) = pending.last() else {
                debug!(node, created, "created the lock's container parents");
                return Ok(());
            };
            let (answer, _) = self.call(|client| async move { client.create(dir, &[], &CONTAINER).await }).await?;
            match answer {
                Ok(_) => {
                    created += 1;
                    pending.pop();
                }
                Err(zk::Error::NodeExists) => {
                    pending.pop();
                }
                Err(zk::Error::NoNode) if parent_of(dir) != "/" => pending.push(parent_of(dir)),
                Err(e) => return Err(self.failed("create", dir, e)),
            }
        }
        Err(LockError::Unavailable(format!("cannot create the parents of {node} ({})", self.url)))
    }

    /// The node's owner, or `None` if it does not exist.
    async fn owner_of(&self, node: &str) -> Result<Option<zk::Stat>, LockError> {
        let (stat, _) = self.call(|client| async move { client.check_stat(node).await }).await?;
        stat.map_err(|e| self.failed("read", node, e))
    }

    /// Deletes `node` if our session owns it. A delete interrupted by connection trouble is
    /// not re-sent as is: ownership is read again first (the node may be gone and re-created
    /// by another worker since).
    async fn delete_if_ours(&self, node: &str) -> Result<(), LockError> {
        if self.is_lost() {
            // Gone with the session, or going with it: asking a silent server only waits.
            return Ok(());
        }
        for _ in 0..MAX_RETRIES {
            let stat = match self.owner_of(node).await {
                Ok(Some(stat)) => stat,
                Ok(None) => return Ok(()),
                Err(_) if self.is_lost() => return Ok(()), // gone with the session
                Err(e) => return Err(e),
            };
            if stat.ephemeral_owner != self.session_id {
                warn!(
                    node,
                    owner = format!("{:#x}", stat.ephemeral_owner),
                    "the lock node is not ours any more; left alone"
                );
                return Ok(());
            }
            let version = Some(stat.version);
            match self.send(|client| async move { client.delete(node, version).await }).await {
                Ok(Sent::Answered(Ok(()) | Err(zk::Error::NoNode))) => return Ok(()),
                Ok(Sent::Answered(Err(zk::Error::BadVersion)) | Sent::Interrupted) => continue,
                Ok(Sent::Answered(Err(e))) => return Err(self.failed("delete", node, e)),
                Err(_) if self.is_lost() => return Ok(()),
                Err(e) => return Err(e),
            }
        }
        Err(LockError::Unavailable(format!("cannot delete {node} ({}): it keeps changing", self.url)))
    }

    /// Children of `<root>/<relative>`; none if it does not exist.
    async fn children(&self, relative: &str) -> Result<Vec<String>, LockError> {
        let node = self.node_of(relative);
        let node = node.as_str();
        let (children, _) = self.call(|client| async move { client.list_children(node).await }).await?;
        match children {
            Ok(children) => Ok(children),
            Err(zk::Error::NoNode) => Ok(Vec::new()),
            Err(e) => Err(self.failed("list", node, e)),
        }
    }

    /// Takes the lock at `node` for a task that reserved it, waiting until `deadline`.
    async fn take(&self, node: &str, data: &[u8], deadline: Instant, reserved: &mut bool) -> Result<bool, LockError> {
        loop {
            if self.is_lost() {
                return Err(self.lost());
            }
            if !*reserved {
                *reserved = self.reserve(node);
            }
            if *reserved && self.create_lock(node, data).await? {
                return Ok(true);
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(false);
            }
            // Busy: wait for the holder's node to go (or the deadline).
            let (watched, _) = self.call(|client| async move { client.check_and_watch_stat(node).await }).await?;
            let (stat, watcher) = watched.map_err(|e| self.failed("watch", node, e))?;
            match stat {
                None if *reserved => continue, // gone already: create again
                Some(stat) if *reserved && stat.ephemeral_owner == self.session_id => return Ok(true),
                _ => {
                    let mut state = self.state.subscribe();
                    tokio::select! {
                        _ = watcher.changed() => {}
                        _ = tokio::time::sleep_until(deadline) => {}
                        _ = state.wait_for(|s| *s == SessionState::Lost) => {}
                        // Another task of ours holds or is taking it: it may be gone without a
                        // node event (a reservation only), so look again soon.
                        _ = tokio::time::sleep(IN_PROCESS_PAUSE), if !*reserved => {}
                    }
                }
            }
        }
    }
}

#[async_trait]
impl LockService for ZkLocks {
    async fn try_lock(
        &self,
        path: &LockPath,
        holder: &LockHolder,
        wait: Duration,
    ) -> Result<Option<Box<dyn Lock>>, LockError> {
        let shared = &self.shared;
        let node = shared.node_of(&path.relative());
        let data = serde_json::to_vec(holder).expect("holders serialize");
        let mut reserved = false;
        let taken = shared.take(&node, &data, Instant::now() + wait, &mut reserved).await;
        match taken {
            Ok(true) => Ok(Some(Box::new(ZkLock { path: path.clone(), node, shared: Arc::clone(shared) }))),
            outcome => {
                if reserved {
                    shared.unreserve(&node);
                }
                outcome.map(|_| None)
            }
        }
    }

    async fn held(&self) -> Result<Vec<HeldLock>, LockError> {
        let shared = &self.shared;
        let mut paths: Vec<String> = shared.children("poll").await?.into_iter().map(|c| format!("poll/{c}")).collect();
        for component in shared.children("batch").await? {
            let under = format!("batch/{component}");
            paths.extend(shared.children(&under).await?.into_iter().map(|batch| format!("{under}/{batch}")));
        }
        // Every read is sent when its future is made: one round trip for all of them.
        let client = shared.client()?;
        let reads: Vec<_> = paths.iter().map(|path| client.get_data(&shared.node_of(path))).collect();
        let mut held = Vec::with_capacity(paths.len());
        for (path, read) in paths.into_iter().zip(reads) {
            match read.await {
                Ok((data, _)) => held.push(HeldLock { holder: serde_json::from_slice(&data).ok(), path }),
                Err(zk::Error::NoNode) => {} // released meanwhile
                Err(e) if session_gone(&e) => return Err(shared.lost()),
                Err(e) => return Err(shared.failed("read", &shared.node_of(&path), e)),
            }
        }
        held.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(held)
    }

    fn session(&self) -> watch::Receiver<SessionState> {
        self.shared.state.subscribe()
    }

    /// A session given up at 0.75 of its timeout leaves a quarter of it before the server
    /// expires it: cancelled work gets a tenth, not `cancel_grace`.
    fn lost_session_grace(&self) -> Option<Duration> {
        Some(self.shared.session_timeout.mul_f64(LOST_SESSION_GRACE_SHARE))
    }

    async fn close(&self) {
        let shared = &self.shared;
        if *shared.state.borrow() == SessionState::Lost {
            // Expired, or given up on because the server went silent: there is nothing to
            // delete or to wait for (the server drops our nodes with the session).
            shared.closing.store(true, Ordering::Relaxed);
            shared.client.lock().expect("never poisoned").take();
            return;
        }
        let nodes: Vec<String> = shared.reserved.lock().expect("never poisoned").drain().collect();
        for node in &nodes {
            match tokio::time::timeout(CLOSE_WAIT, shared.delete_if_ours(node)).await {
                Ok(Ok(())) => debug!(node, "deleted a lock still held at close"),
                Ok(Err(e)) => warn!(node, "cannot delete a lock at close: {e}"),
                Err(_) => warn!(node, "cannot delete a lock at close: no answer within {CLOSE_WAIT:?}"),
            }
        }
        shared.closing.store(true, Ordering::Relaxed);
        let Some(client) = shared.client.lock().expect("never poisoned").take() else { return };
        let mut watcher = client.state_watcher();
        // The session is closed when the last clone of the client is gone; wait for the
        // server's answer, so a process exiting right after leaves nothing behind.
        drop(client);
        if watcher.peek_state().is_terminated() {
            return;
        }
        let closed = async { while !watcher.changed().await.is_terminated() {} };
        if tokio::time::timeout(CLOSE_WAIT, closed).await.is_err() {
            warn!("the ZooKeeper session did not close within {CLOSE_WAIT:?}; its nodes go with its timeout");
        }
    }
}

struct ZkLock {
    path: LockPath,
    node: String,
    shared: Arc<Shared>,
}

#[async_trait]
impl Lock for ZkLock {
    fn path(&self) -> &LockPath {
        &self.path
    }

    /// The node exists and our session owns it.
    async fn still_held(&self) -> Result<bool, LockError> {
        if self.shared.is_lost() {
            return Ok(false);
        }
        match self.shared.owner_of(&self.node).await {
            Ok(stat) => Ok(stat.is_some_and(|stat| stat.ephemeral_owner == self.shared.session_id)),
            Err(_) if self.shared.is_lost() => Ok(false),
            Err(e) => Err(e),
        }
    }

    async fn release(self: Box<Self>) -> Result<(), LockError> {
        let deleted = self.shared.delete_if_ours(&self.node).await;
        self.shared.unreserve(&self.node);
        deleted
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_hosts_chroot_and_session_timeout() {
        let url = ZkUrl::parse("zk://10.0.0.1:2181,10.0.0.2:2182/apps/autocomp/?session_timeout=4s").unwrap();
        assert_eq!(url.hosts, "10.0.0.1:2181,10.0.0.2:2182");
        assert_eq!(url.root, "/apps/autocomp");
        assert_eq!(url.session_timeout, Duration::from_secs(4));
        let url = ZkUrl::parse("zk://zk.example:2181/autocomp").unwrap();
        assert_eq!((url.root.as_str(), url.session_timeout), ("/autocomp", DEFAULT_SESSION_TIMEOUT));
    }

    #[test]
    fn bad_urls_say_what_is_wrong() {
        for (url, expected) in [
            ("zk://127.0.0.1:2181", "names no chroot"),
            ("zk://127.0.0.1:2181/", "names no chroot"),
            ("zk:///autocomp", "names no host"),
            ("zk://127.0.0.1:port/autocomp", "not a host:port"),
            ("zk://127.0.0.1:2181,/autocomp", "not a host:port"),
            ("zk://127.0.0.1:2181/a//b", "empty, `.` or `..`"),
            ("zk://127.0.0.1:2181/a/../b", "empty, `.` or `..`"),
            ("zk://127.0.0.1:2181/zookeeper", "belongs to ZooKeeper"),
            ("zk://127.0.0.1:2181/a?session_timeout=soon", "session_timeout=soon"),
            ("zk://127.0.0.1:2181/a?session_timeout=0s", "session_timeout=0s"),
            ("zk://127.0.0.1:2181/a?timeout=4s", "unknown option \"timeout=4s\""),
        ] {
            let error = ZkUrl::parse(url).unwrap_err().to_string();
            assert!(error.contains(expected) && error.contains("locks url"), "{url}: {error}");
        }
    }

    #[test]
    fn parents_go_up_to_the_root() {
        assert_eq!(parent_of("/autocomp/batch/probe/B1"), "/autocomp/batch/probe");
        assert_eq!(parent_of("/autocomp"), "/");
    }
}
