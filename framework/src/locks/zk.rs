//! ZooKeeper locks, selected by `zk://host:port[,host:port...]/chroot` (or `zks://` for TLS):
//! the URL's syntax, the pipeline's ZooKeeper identity and the ACL of every node we create.
//!
//! A lock is ONE ephemeral node at `<chroot>/poll/<component>`,
//! `<chroot>/batch/<component>/<batch-id>` or `<chroot>/slot/<pool>/<index>` (a resource
//! pool's slot) whose data is the JSON `LockHolder` plus the session id that created it. Its
//! parents are container nodes, created on demand (another process creating them first, or
//! the server removing an emptied one meanwhile, is expected), which the server deletes once
//! empty; the chroot itself (and any ancestor we create) is a
//! persistent node, so once made it cannot be taken over by whoever re-creates it first.
//! Try-lock is one create: NodeExists means busy, unless the node is not one a lock service
//! made (persistent, foreign data, or a record naming another session than its owner): that is
//! `LockError::Foreign`, an alarm, never "busy". Waiting is a data watch on the node until the
//! deadline. Release checks the node is still ours, then deletes it. A lock cycle is so two
//! ZooKeeper writes (create + delete), on a fresh path too, plus one container create for each
//! missing parent.
//!
//! Identity and ACLs: with `auth_file=` (or `$AUTOCOMP_ZK_AUTH`) the session adds one digest
//! identity per `user:password` line, and every node we create carries `auth` (each of those
//! identities) with all rights plus `world:anyone` read, so only the pipeline's identities can
//! create, change or delete under the chroot (ZooKeeper checks a delete against the parent's
//! ACL: the containers' ACL is what protects a lock). At connect the chroot, `poll`, `batch`,
//! `slot`, each `batch/<component>` and each `slot/<pool>` are brought to that ACL (our
//! identities added, the world left read only), and a persistent child, `<chroot>/anchor`, is
//! kept under the chroot: never empty, the chroot cannot be deleted (and made again by someone
//! else as theirs) even where its parent lets the world delete children, and only our
//! identities may delete the anchor. A chroot whose parent lets anyone without an identity
//! create or delete children (`world:anyone` or an `ip:` entry with c or d, as `/` is by
//! ZooKeeper's default) is refused as a configuration error naming the two ways out: a chroot
//! one level down, whose parent we make with our ACL, or `setAcl` on the parent. Without an
//! identity nodes stay open to anyone, as before, with one warning.
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
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use async_trait::async_trait;
use autocomp_toolkit::redact::display_url;
use autocomp_model::InvalidInput;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{debug, error, info, warn};
use zookeeper_client as zk;

pub use super::zk_tls::ZkTls;
use super::{HeldLock, Lock, LockError, LockHolder, LockPath, LockService, SessionState};

/// The session timeout when the URL does not say `?session_timeout=...`.
pub const DEFAULT_SESSION_TIMEOUT: Duration = Duration::from_secs(10);

/// Where the pipeline's ZooKeeper identity comes from when the URL names no `auth_file`:
/// `user:password` (several identities one per line, as in the file).
pub const AUTH_ENV: &str = "AUTOCOMP_ZK_AUTH";

/// Said once per process: without an identity anyone can delete or fake our locks.
static WARNED_UNPROTECTED: AtomicBool = AtomicBool::new(false);

/// How often one request is re-sent after connection trouble before giving up.
const MAX_RETRIES: u32 = 50;
/// Pause before re-sending after connection trouble (the session state may lag the error).
const RETRY_PAUSE: Duration = Duration::from_millis(10);
/// Re-check interval while another task of this process holds or is taking the same path.
const IN_PROCESS_PAUSE: Duration = Duration::from_millis(10);
/// How long `close` waits for each deletion and for the server to end the session.
const CLOSE_WAIT: Duration = Duration::from_secs(3);

/// The persistent child that keeps the chroot from ever being empty, so ZooKeeper refuses to
/// delete it (NotEmpty) whatever its parent's ACL, and only the pipeline's identities (the
/// chroot's ACL) may delete the child. Not `poll`, `batch` or `slot`: no lock lives under it.
pub(super) const ANCHOR: &str = "anchor";
/// What the anchor holds, for whoever lists the tree with zkCli.
const ANCHOR_DATA: &[u8] = b"autocomp: keeps this lock tree from being deleted or taken over; leave it";

/// A parsed `zk://` or `zks://` locks URL. It never holds a secret: the identity is read
/// from `auth_file` (or `$AUTOCOMP_ZK_AUTH`) at connect, so the URL can be shown as is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZkUrl {
    /// `host:port[,host:port...]`, as the client connects.
    pub hosts: String,
    /// The chroot every lock node lives under, e.g. `/autocomp` (no trailing slash).
    pub root: String,
    /// The session timeout asked for (the server clamps it to its own min/max).
    pub session_timeout: Duration,
    /// `zks://`: every server over TLS, with these files.
    pub tls: Option<ZkTls>,
    /// `auth_file=`: a file of `user:password` lines, the pipeline's digest identities.
    pub auth_file: Option<PathBuf>,
}

impl ZkUrl {
    /// `zk[s]://host:port[,host:port...]/chroot[?option=value&...]`; options: `session_timeout`
    /// (e.g. `10s`), `auth_file`, and with `zks://` `ca_file` (required), `cert_file` and
    /// `key_file` (together).
    pub fn parse(url: &str) -> Result<Self, InvalidInput> {
        let invalid = |reason: String| InvalidInput::new("locks url", display_url(url), reason);
        let shape = "write zk[s]://host:port[,host:port...]/chroot, e.g. zk://127.0.0.1:2181/autocomp";
        let (secure, rest) = match (url.strip_prefix("zk://"), url.strip_prefix("zks://")) {
            (Some(rest), _) => (false, rest),
            (_, Some(rest)) => (true, rest),
            _ => return Err(invalid(format!("not a zk:// or zks:// URL; {shape}"))),
        };
        let (rest, query) = rest.split_once('?').map_or((rest, None), |(rest, query)| (rest, Some(query)));
        let Some((hosts, chroot)) = rest.split_once('/') else {
            return Err(invalid(format!("names no chroot; {shape}")));
        };
        if hosts.contains('@') {
            return Err(invalid(format!(
                "carries credentials; a locks URL must not hold a secret: put `user:password` in a file \
                 named by ?auth_file=/path, or in ${AUTH_ENV}"
            )));
        }
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
        let (mut auth_file, mut ca_file, mut cert_file, mut key_file) = (None, None, None, None);
        let file = |option: &str, value: &str| {
            if value.is_empty() {
                Err(invalid(format!("{option}= names no file")))
            } else {
                Ok(Some(PathBuf::from(value)))
            }
        };
        for option in query.unwrap_or_default().split('&').filter(|o| !o.is_empty()) {
            match option.split_once('=') {
                Some(("session_timeout", value)) => {
                    session_timeout = humantime::parse_duration(value)
                        .ok()
                        .filter(|d| !d.is_zero())
                        .ok_or_else(|| invalid(format!("session_timeout={value} is not a duration like 10s")))?;
                }
                Some(("auth_file", value)) => auth_file = file("auth_file", value)?,
                Some((name @ ("ca_file" | "cert_file" | "key_file"), _)) if !secure => {
                    return Err(invalid(format!("{name} is a TLS option: write zks:// to connect over TLS")));
                }
                Some(("ca_file", value)) => ca_file = file("ca_file", value)?,
                Some(("cert_file", value)) => cert_file = file("cert_file", value)?,
                Some(("key_file", value)) => key_file = file("key_file", value)?,
                _ => {
                    return Err(invalid(format!(
                        "unknown option {option:?}; the options are session_timeout (e.g. ?session_timeout=10s), \
                         auth_file, and with zks:// ca_file, cert_file and key_file"
                    )));
                }
            }
        }
        let tls = match (secure, ca_file, cert_file, key_file) {
            (false, ..) => None,
            (true, None, ..) => {
                return Err(invalid(
                    "zks:// needs ca_file=/path/to/ca.pem, the CA of the servers' certificates".into(),
                ));
            }
            (true, Some(ca_file), Some(cert), Some(key)) => Some(ZkTls { ca_file, client: Some((cert, key)) }),
            (true, Some(ca_file), None, None) => Some(ZkTls { ca_file, client: None }),
            (true, Some(_), ..) => {
                return Err(invalid("cert_file and key_file go together: name both or neither".into()));
            }
        };
        Ok(Self { hosts: hosts.to_owned(), root: format!("/{chroot}"), session_timeout, tls, auth_file })
    }
}

/// The pipeline's ZooKeeper identities, as read from the auth file or the environment: each
/// a `user:password` sent with the digest scheme.
struct Identities {
    /// `auth_file=/path` or `$AUTOCOMP_ZK_AUTH`, for messages (never the secret).
    source: String,
    credentials: Vec<String>,
}

impl Identities {
    /// Reads the identities the URL or the environment names; `None` if neither does.
    fn load(target: &ZkUrl) -> Result<Option<Self>, LockError> {
        let (source, text) = match &target.auth_file {
            Some(path) => {
                let source = format!("auth_file={}", path.display());
                let text = std::fs::read_to_string(path)
                    .map_err(|e| invalid_auth(&source, &format!("cannot be read: {e}")))?;
                autocomp_toolkit::file_modes::warn_if_exposed(path, "the ZooKeeper auth file");
                (source, text)
            }
            None => match std::env::var(AUTH_ENV) {
                Ok(text) if !text.trim().is_empty() => (format!("${AUTH_ENV}"), text),
                _ => return Ok(None),
            },
        };
        let credentials: Vec<String> =
            text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).map(str::to_owned).collect();
        if credentials.is_empty() {
            return Err(invalid_auth(&source, "holds no user:password line"));
        }
        for (n, line) in credentials.iter().enumerate() {
            let well_formed =
                line.split_once(':').is_some_and(|(user, password)| !user.is_empty() && !password.is_empty());
            if !well_formed {
                // Never the line itself: it is a secret, or most of one.
                return Err(invalid_auth(&source, &format!("line {} is not user:password", n + 1)));
            }
        }
        Ok(Some(Self { source, credentials }))
    }

    /// The users, for logs (the passwords never leave this struct except to the server).
    fn users(&self) -> Vec<&str> {
        self.credentials.iter().filter_map(|c| c.split_once(':').map(|(user, _)| user)).collect()
    }
}

fn invalid_auth(source: &str, reason: &str) -> LockError {
    InvalidInput::new("ZooKeeper identity", source, reason.to_owned()).into()
}

/// The id ZooKeeper's digest provider gives `user:password`: `user:base64(sha1(user:password))`.
fn digest_id(credential: &str) -> String {
    use sha1::Digest as _;
    let user = credential.split_once(':').map_or(credential, |(user, _)| user);
    format!("{user}:{}", base64(&sha1::Sha1::digest(credential.as_bytes())))
}

/// Standard base64 with padding (a digest is all it encodes; not worth a dependency).
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[(n >> (18 - 6 * i) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// `zks://`'s client options from its files; a file that cannot be read or parsed is named.
fn tls_options(tls: &ZkTls) -> Result<zk::TlsOptions, LockError> {
    let read = |option: &str, path: &Path| {
        std::fs::read_to_string(path).map_err(|e| {
            LockError::from(InvalidInput::new(
                "locks url",
                format!("{option}={}", path.display()),
                format!("cannot be read: {e}"),
            ))
        })
    };
    let bad = |option: &str, path: &Path, e: zk::Error| {
        LockError::from(InvalidInput::new(
            "locks url",
            format!("{option}={}", path.display()),
            format!("not usable PEM: {e}"),
        ))
    };
    let ca = read("ca_file", &tls.ca_file)?;
    let mut options = zk::TlsOptions::new().with_pem_ca(&ca).map_err(|e| bad("ca_file", &tls.ca_file, e))?;
    if let Some((cert_file, key_file)) = &tls.client {
        let (cert, key) = (read("cert_file", cert_file)?, read("key_file", key_file)?);
        options = options.with_pem_identity(&cert, &key).map_err(|e| bad("cert_file", cert_file, e))?;
    }
    Ok(options)
}

/// What we store in a lock node: the holder, and the session that created the node (so a
/// copy of another lock's data under a node of some other session is told apart).
#[derive(Serialize, Deserialize)]
struct NodeData {
    #[serde(flatten)]
    holder: LockHolder,
    /// `0x...`; absent in nodes of releases that did not write it (then not checked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    session: Option<String>,
}

/// Why a node at a lock path is not a lock a lock service made, if it is not: such a node
/// is an alarm (someone or something else wrote there), not a busy lock.
fn foreign_reason(data: &[u8], stat: &zk::Stat) -> Option<String> {
    if stat.ephemeral_owner == 0 {
        return Some("a persistent node: no session owns it, so it never goes away by itself".into());
    }
    let Ok(record) = serde_json::from_slice::<NodeData>(data) else {
        return Some(format!("its data ({} bytes) is not a lock holder record", data.len()));
    };
    let owner = format!("{:#x}", stat.ephemeral_owner);
    match record.session {
        Some(session) if session != owner => {
            Some(format!("its record names session {session}, but session {owner} owns the node"))
        }
        _ => None,
    }
}

/// The ZooKeeper lock service: one session per process.
pub struct ZkLocks {
    shared: Arc<Shared>,
}

struct Shared {
    /// The locks URL as messages show it.
    url: String,
    root: String,
    session_id: i64,
    /// As negotiated with the server: it expires the session this long after it last heard
    /// from us.
    session_timeout: Duration,
    /// The ACL of every node we create: all rights for each of the pipeline's digest
    /// identities, read for anyone (so `autocomp locks` needs no secret); all rights for
    /// anyone when no identity is configured. The identities are named, not `auth`: that
    /// would also give all rights to the TLS client certificate's `x509` identity.
    acls: Vec<zk::Acl>,
    /// Where the identity came from (`auth_file=/path`, `$AUTOCOMP_ZK_AUTH`), for messages.
    identity: Option<String>,
    /// Our identities as digest ACLs name them (`user:base64(sha1(user:password))`).
    digests: Vec<String>,
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
    /// Connects and opens the session (over TLS for `zks://`, authenticated with the
    /// identities of `auth_file` or `$AUTOCOMP_ZK_AUTH` if either is set); fails (naming the
    /// servers) if no session is established within the session timeout. With an identity,
    /// also creates the chroot and brings the ACLs of the lock tree's directories to ours.
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        let locks = Self::connect_only(url).await?;
        if locks.shared.identity.is_some()
            && let Err(e) = locks.shared.protect_tree().await
        {
            locks.close().await;
            return Err(e);
        }
        Ok(locks)
    }

    /// Connects (and authenticates) as `connect` does, but changes nothing in the lock tree,
    /// then says how its directories' ACLs differ from what `connect` would set them to:
    /// what `autocomp doctor` reports. The session is closed before it answers.
    pub async fn inspect(url: &str) -> Result<super::LockInspection, LockError> {
        let locks = Self::connect_only(url).await?;
        let found = locks.shared.inspect_tree().await;
        locks.close().await;
        let problems = found?;
        let shared = &locks.shared;
        let identity = match &shared.identity {
            Some(source) => {
                let users: Vec<&str> =
                    shared.digests.iter().filter_map(|d| d.split_once(':').map(|(u, _)| u)).collect();
                format!("as {} ({source})", users.join(", "))
            }
            None => "with no identity".to_owned(),
        };
        Ok(super::LockInspection {
            description: format!("ZooKeeper {} answered {identity}; lock tree {}", shared.url, shared.root),
            problems,
        })
    }

    async fn connect_only(url: &str) -> Result<Self, LockError> {
        let target = ZkUrl::parse(url)?;
        let shown = display_url(url);
        let identities = Identities::load(&target)?;
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
            Some(tls) => {
                // The client retries a server whose certificate fails as if it were down:
                // without a session soon, see whether that is why (then a configuration error).
                let untrusted = async {
                    tokio::time::sleep(super::zk_tls::PROBE_AFTER).await;
                    super::zk_tls::untrusted(&target.hosts, tls).await
                };
                tokio::select! {
                    answer = connected => answer,
                    Some(reason) = untrusted => return Err(InvalidInput::new("locks url", shown, reason).into()),
                }
            }
            None => connected.await,
        };
        let client = match answer {
            Ok(Ok(client)) => client,
            Ok(Err(e)) => return Err(unreachable(e.to_string())),
            Err(_) => return Err(unreachable("no answer".into())),
        };
        let session_id = client.session_id().0;
        info!(
            session = %client.session_id(),
            timeout = ?client.session_timeout(),
            tls = target.tls.is_some(),
            users = ?identities.as_ref().map(Identities::users),
            "connected to ZooKeeper at {}; locks under {}",
            target.hosts,
            target.root
        );
        match &identities {
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
            session_id,
            session_timeout: client.session_timeout(),
            acls,
            identity: identities.as_ref().map(|ids| ids.source.clone()),
            digests,
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

/// `host:port[,...]` all on this machine (a password sent there in clear stays on it).
fn all_loopback(hosts: &str) -> bool {
    hosts.split(',').all(|host| {
        let name = host.rsplit_once(':').map_or(host, |(name, _)| name);
        name == "localhost" || name.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
    })
}

/// All rights for each of our digest ids, read for the world.
fn pipeline_acl(digests: &[String]) -> Vec<zk::Acl> {
    let ours = digests.iter().map(|id| zk::Acl::new(zk::Permission::ALL, zk::AuthId::new("digest", id)));
    ours.chain([zk::Acl::new(zk::Permission::READ, zk::AuthId::anyone())]).collect()
}

/// `acl` with every entry of `ours` (`pipeline_acl`) in and the world cut down to read; other
/// digest identities are kept (during a rotation the old one is still ours), others dropped.
fn wanted_acl(acl: &[zk::Acl], ours: &[zk::Acl]) -> Vec<zk::Acl> {
    let mut wanted: Vec<zk::Acl> = acl
        .iter()
        .filter(|entry| entry.scheme() == "digest" && !ours.iter().any(|our| our.auth_id() == entry.auth_id()))
        .cloned()
        .collect();
    wanted.extend(ours.iter().cloned());
    wanted
}

/// Whether the world may do more than read.
fn lets_the_world_write(acl: &[zk::Acl]) -> bool {
    acl.iter().any(|entry| entry.scheme() == "world" && entry.permission() != zk::Permission::READ)
}

/// Whether an ACL entry lets a client with no identity create or delete children: the world,
/// or an address (every local user of a host shares its address).
fn lets_strangers_add_or_remove(entry: &zk::Acl) -> bool {
    let changes_children =
        entry.permission().has(zk::Permission::CREATE) || entry.permission().has(zk::Permission::DELETE);
    changes_children && matches!(entry.scheme(), "world" | "ip")
}

fn same_entries(a: &[zk::Acl], b: &[zk::Acl]) -> bool {
    a.len() == b.len() && a.iter().all(|entry| b.contains(entry))
}

/// `digest:ops:…=ALL, world:anyone=READ` (ids are hashes, never passwords).
fn describe_acl(acl: &[zk::Acl]) -> String {
    let entries: Vec<String> =
        acl.iter().map(|entry| format!("{}:{}={}", entry.scheme(), entry.id(), entry.permission())).collect();
    entries.join(", ")
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
    fn options(&self, mode: zk::CreateMode) -> zk::CreateOptions<'_> {
        mode.with_acls(zk::Acls::new(&self.acls))
    }

    /// The chroot and its ancestors are persistent: a container would go once empty, and
    /// whoever re-created it first would own the lock tree.
    fn mode_of_parent(&self, dir: &str) -> zk::CreateMode {
        if self.root.starts_with(dir) { zk::CreateMode::Persistent } else { zk::CreateMode::Container }
    }

    /// With an identity: creates the chroot if missing, then brings the ACLs of the chroot,
    /// `poll`, `batch`, `slot`, every `batch/<component>` and every `slot/<pool>` to ours: each
    /// of our identities with all rights, the world with no more than read (other identities'
    /// entries are left: during a secret rotation both are ours). A directory whose ACL we
    /// cannot change while it lets others write (or keeps us out) is an alarm: locks under it
    /// cannot be trusted.
    async fn protect_tree(&self) -> Result<(), LockError> {
        if let Some(problem) = self.open_parent().await? {
            return Err(InvalidInput::new("locks url", self.url.clone(), problem).into());
        }
        let probe = format!("{}/poll", self.root);
        self.create_parents(&probe).await?;
        let ours = pipeline_acl(&self.digests);
        let client = self.client()?;
        let dirs = self.tree_acls().await?;
        let anchor = self.node_of(ANCHOR);
        // Made once: a create refused as NodeExists would cost a write at every pass.
        let anchored = dirs.iter().any(|(dir, ..)| *dir == anchor);
        for (dir, acl, stat) in dirs {
            let dir = &dir;
            let wanted = wanted_acl(&acl, &ours);
            if same_entries(&acl, &wanted) {
                continue;
            }
            match client.set_acl(dir, &wanted, Some(stat.aversion)).await {
                Ok(_) => info!(node = dir, "set the lock tree's ACL: {}", describe_acl(&wanted)),
                // Someone else (another host of the pipeline) changed it meanwhile.
                Err(zk::Error::BadVersion | zk::Error::NoNode) => {}
                Err(zk::Error::NoAuth) if !lets_the_world_write(&acl) => {
                    // Protected, by identities that are not ours: a wrong password, or a tree
                    // another pipeline's identity made. Configuration, not an intruder.
                    let source = self.identity.as_deref().unwrap_or("the configured identity");
                    let reason = format!(
                        "is not one the ACL of {dir} names ({}), so this process may not take locks there \
                         ({}): a wrong password, or a lock tree made with another identity",
                        describe_acl(&acl),
                        self.url
                    );
                    return Err(InvalidInput::new("ZooKeeper identity", source, reason).into());
                }
                Err(zk::Error::NoAuth) => {
                    let path = dir.strip_prefix(&self.root).unwrap_or(dir).trim_start_matches('/');
                    let path = if path.is_empty() { "(the chroot)".to_owned() } else { path.to_owned() };
                    return Err(LockError::Foreign {
                        path,
                        reason: format!(
                            "the lock tree's node {dir} has the ACL {} ({}), which this process's ZooKeeper \
                             identity may not change",
                            describe_acl(&acl),
                            self.url
                        ),
                    });
                }
                Err(e) => return Err(self.failed("ACL change", dir, e)),
            }
        }
        if anchored { Ok(()) } else { self.create_anchor().await }
    }

    /// Creates the chroot's anchor (`ANCHOR`) with our ACL if it is missing.
    async fn create_anchor(&self) -> Result<(), LockError> {
        let anchor = self.node_of(ANCHOR);
        let anchor = anchor.as_str();
        let (answer, _) = self
            .call(|client| async move {
                client.create(anchor, ANCHOR_DATA, &self.options(zk::CreateMode::Persistent)).await
            })
            .await?;
        match answer {
            Ok(_) => {
                info!(node = anchor, "made the lock tree's anchor: the chroot can no longer be deleted");
                Ok(())
            }
            Err(zk::Error::NodeExists) => Ok(()),
            Err(e) => Err(self.failed("create", anchor, e)),
        }
    }

    /// Why the chroot's parent lets someone without an identity take the lock tree (create
    /// or delete its children: the chroot itself), with the two ways out; `None` if it does
    /// not, or if it does not exist yet (then `create_parents` makes it, with our ACL, and a
    /// node of ours is under each ancestor it makes, so none of them can be deleted).
    async fn open_parent(&self) -> Result<Option<String>, LockError> {
        let parent = parent_of(&self.root);
        let (answer, _) = self.call(|client| async move { client.get_acl(parent).await }).await?;
        let acl = match answer {
            Ok((acl, _)) => acl,
            // Neither read nor admin for us: the world cannot read it either, closed enough
            // for us not to judge.
            Err(zk::Error::NoNode | zk::Error::NoAuth) => return Ok(None),
            Err(e) => return Err(self.failed("ACL read", parent, e)),
        };
        let open: Vec<zk::Acl> = acl.iter().filter(|entry| lets_strangers_add_or_remove(entry)).cloned().collect();
        if open.is_empty() {
            return Ok(None);
        }
        let root = &self.root;
        let deeper = format!("{root}/pipeline");
        Ok(Some(format!(
            "the lock tree {root} is a child of {parent}, whose ACL ({}) lets anyone who reaches ZooKeeper, \
             without an identity, create or delete its children: delete the lock tree or make it first as \
             theirs, and stop every pass. Either move the lock tree one level down, into a node autocomp \
             makes with the pipeline's ACL (chroot {deeper} instead of {root} in the locks URL), or take create \
             and delete on {parent} from the world: in zkCli, `addauth digest <user>:<password>` as the \
             pipeline (or an admin identity) then `setAcl {parent} world:anyone:r,auth::cdrwa` (keep \
             world:anyone:r: clients read {parent}, and /zookeeper below it)",
            describe_acl(&open)
        )))
    }

    /// What `protect_tree` would change, read and not changed: one line per directory whose
    /// ACL differs from ours (or lets anyone write), and one when no identity is configured.
    async fn inspect_tree(&self) -> Result<Vec<String>, LockError> {
        let mut problems = Vec::new();
        if self.identity.is_none() {
            problems.push(format!(
                "no ZooKeeper identity is configured (?auth_file= in the locks URL, or ${AUTH_ENV}): anyone who \
                 reaches {} can delete or fake the pipeline's locks; give every host the same identity file",
                self.url
            ));
        }
        if self.identity.is_some() {
            problems.extend(self.open_parent().await?);
            let anchor = self.node_of(ANCHOR);
            if self.owner_of(&self.root).await?.is_some() && self.owner_of(&anchor).await?.is_none() {
                problems.push(format!(
                    "{anchor} is missing, so {} can be deleted once empty: the next pass on a host with this \
                     identity makes it",
                    self.root
                ));
            }
        }
        let ours = pipeline_acl(&self.digests);
        for (dir, acl, _) in self.tree_acls().await? {
            let wanted = if self.identity.is_some() { wanted_acl(&acl, &ours) } else { ours.clone() };
            if self.identity.is_none() && !lets_the_world_write(&acl) && !same_entries(&acl, &wanted) {
                problems.push(format!(
                    "{dir} has the ACL {}: protected by an identity this host does not have; configure it \
                     (?auth_file=)",
                    describe_acl(&acl)
                ));
            } else if self.identity.is_some() && !same_entries(&acl, &wanted) {
                let fix = if lets_the_world_write(&acl) || self.holds_an_entry_of(&acl) {
                    "the next pass on a host with this identity sets it"
                } else {
                    "this identity is not in it (a wrong password, or a tree another pipeline made): check \
                     auth_file against the other hosts'"
                };
                problems.push(format!(
                    "{dir} has the ACL {}, not {}: {fix}",
                    describe_acl(&acl),
                    describe_acl(&wanted)
                ));
            }
        }
        Ok(problems)
    }

    /// The ACL of each directory of the lock tree that exists: the chroot, its anchor, `poll`,
    /// `batch`, `slot`, every `batch/<component>` and every `slot/<pool>`.
    async fn tree_acls(&self) -> Result<Vec<(String, Vec<zk::Acl>, zk::Stat)>, LockError> {
        let mut dirs = vec![self.root.clone(), self.node_of(ANCHOR)];
        dirs.extend(["poll", "batch", "slot"].map(|dir| self.node_of(dir)));
        for parent in ["batch", "slot"] {
            dirs.extend(self.children(parent).await?.into_iter().map(|c| self.node_of(&format!("{parent}/{c}"))));
        }
        let client = self.client()?;
        // Every read is sent when its future is made: one round trip for all of them.
        let reads: Vec<_> = dirs.iter().map(|dir| client.get_acl(dir)).collect();
        let mut found = Vec::with_capacity(dirs.len());
        for (dir, read) in dirs.iter().zip(reads) {
            match read.await {
                Ok((acl, stat)) => found.push((dir.clone(), acl, stat)),
                Err(zk::Error::NoNode) => {}
                Err(e) => return Err(self.failed("ACL read", dir, e)),
            }
        }
        Ok(found)
    }

    /// Whether one of our identities has rights on a node with this ACL.
    fn holds_an_entry_of(&self, acl: &[zk::Acl]) -> bool {
        acl.iter().any(|entry| entry.scheme() == "digest" && self.digests.iter().any(|d| d == entry.id()))
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
            let (answer, retried) = self
                .call(|client| async move { client.create(node, data, &self.options(zk::CreateMode::Ephemeral)).await })
                .await?;
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
            let (answer, _) = self
                .call(|client| async move { client.create(dir, &[], &self.options(self.mode_of_parent(dir))).await })
                .await?;
            match answer {
                Ok(_) => {
                    created += 1;
                    pending.pop();
                }
                Err(zk::Error::NodeExists) => {
                    pending.pop();
                }
                // ZooKeeper checks the parent's ACL before whether the node exists: under a
                // parent closed to us (`setAcl / world:anyone:r`) an existing chroot is NoAuth.
                Err(zk::Error::NoAuth) if self.owner_of(dir).await?.is_some() => {
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
            // Busy: unless the node is not a lock at all, wait for the holder's node to go (or
            // the deadline).
            let (watched, _) = self.call(|client| async move { client.get_and_watch_data(node).await }).await?;
            let watcher = match watched {
                Err(zk::Error::NoNode) if *reserved => continue, // gone already: create again
                Err(zk::Error::NoNode) => None,                  // another task of ours is taking it
                Err(e) => return Err(self.failed("watch", node, e)),
                Ok((data, stat, watcher)) => {
                    if let Some(reason) = foreign_reason(&data, &stat) {
                        return Err(self.foreign(node, reason));
                    }
                    if *reserved && stat.ephemeral_owner == self.session_id {
                        return Ok(true);
                    }
                    Some(watcher)
                }
            };
            let changed = async {
                match watcher {
                    Some(watcher) => drop(watcher.changed().await),
                    None => std::future::pending().await,
                }
            };
            let mut state = self.state.subscribe();
            tokio::select! {
                _ = changed => {}
                _ = tokio::time::sleep_until(deadline) => {}
                _ = state.wait_for(|s| *s == SessionState::Lost) => {}
                // Another task of ours holds or is taking it: it may be gone without a node
                // event (a reservation only), so look again soon.
                _ = tokio::time::sleep(IN_PROCESS_PAUSE), if !*reserved => {}
            }
        }
    }

    /// The alarm for a node at a lock path that is not a lock.
    fn foreign(&self, node: &str, reason: String) -> LockError {
        let path = node.strip_prefix(&self.root).unwrap_or(node).trim_start_matches('/').to_owned();
        error!(node, "{reason}: not a lock of autocomp's; it needs a person ({})", self.url);
        LockError::Foreign { path, reason: format!("{reason} ({node} on {})", self.url) }
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
        let record = NodeData { holder: holder.clone(), session: Some(format!("{:#x}", shared.session_id)) };
        let data = serde_json::to_vec(&record).expect("holders serialize");
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
        // Two levels under each: `batch/<component>/<batch-id>`, `slot/<pool>/<index>`.
        for parent in ["batch", "slot"] {
            for child in shared.children(parent).await? {
                let under = format!("{parent}/{child}");
                paths.extend(shared.children(&under).await?.into_iter().map(|leaf| format!("{under}/{leaf}")));
            }
        }
        // Every read is sent when its future is made: one round trip for all of them.
        let client = shared.client()?;
        let reads: Vec<_> = paths.iter().map(|path| client.get_data(&shared.node_of(path))).collect();
        let mut held = Vec::with_capacity(paths.len());
        for (path, read) in paths.into_iter().zip(reads) {
            match read.await {
                Ok((data, stat)) => held.push(HeldLock {
                    holder: serde_json::from_slice(&data).ok(),
                    foreign: foreign_reason(&data, &stat),
                    path,
                }),
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
            ("http://127.0.0.1:2181/a", "not a zk:// or zks:// URL"),
            ("zk://127.0.0.1:2181/a?auth_file=", "auth_file= names no file"),
            ("zk://127.0.0.1:2181/a?ca_file=/ca.pem", "ca_file is a TLS option: write zks://"),
            ("zks://127.0.0.1:2281/a", "zks:// needs ca_file="),
            ("zks://127.0.0.1:2281/a?ca_file=/ca.pem&cert_file=/c.pem", "cert_file and key_file go together"),
            ("zks://127.0.0.1:2281/a?ca_file=/ca.pem&key_file=/c.key", "cert_file and key_file go together"),
        ] {
            let error = ZkUrl::parse(url).unwrap_err().to_string();
            assert!(error.contains(expected) && error.contains("locks url"), "{url}: {error}");
        }
    }

    #[test]
    fn digest_ids_are_what_zookeepers_digest_provider_computes() {
        // As `printf %s super:secret | openssl dgst -sha1 -binary | openssl base64` says.
        assert_eq!(digest_id("super:secret"), "super:lK75jTNcA+U9vtVEw5vB51mj/w4=");
        assert_eq!(base64(b"ab"), "YWI=");
        assert_eq!(base64(b"abcd"), "YWJjZA==");
    }

    #[test]
    fn tls_and_identity_options_name_files_never_secrets() {
        let url = ZkUrl::parse(concat!(
            "zks://zk1:2281,zk2:2281/autocomp?auth_file=/etc/autocomp/zk-auth",
            "&ca_file=/ca.pem&cert_file=/c.pem&key_file=/c.key"
        ))
        .unwrap();
        assert_eq!(url.hosts, "zk1:2281,zk2:2281");
        assert_eq!(url.auth_file.as_deref(), Some(Path::new("/etc/autocomp/zk-auth")));
        let tls = url.tls.unwrap();
        assert_eq!(tls.ca_file, Path::new("/ca.pem"));
        assert_eq!(tls.client, Some((PathBuf::from("/c.pem"), PathBuf::from("/c.key"))));
        assert_eq!(ZkUrl::parse("zks://zk1:2281/a?ca_file=/ca.pem").unwrap().tls.unwrap().client, None);
        assert_eq!(ZkUrl::parse("zk://zk1:2181/a").unwrap().tls, None);

        // A password in the URL is refused, and the error does not repeat it.
        let error = ZkUrl::parse("zk://autocomp:hunter2@zk1:2181/autocomp").unwrap_err().to_string();
        assert!(error.contains("auth_file") && error.contains("AUTOCOMP_ZK_AUTH"), "{error}");
        assert!(!error.contains("hunter2"), "{error}");
    }

    #[test]
    fn identities_are_user_password_lines_and_errors_never_show_them() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("zk-auth");
        let url = |file: &Path| ZkUrl::parse(&format!("zk://zk1:2181/a?auth_file={}", file.display())).unwrap();
        std::fs::write(&file, "# rotation: new first\nautocomp:new-secret\n\nautocomp:old-secret\n").unwrap();
        let ids = Identities::load(&url(&file)).unwrap().unwrap();
        assert_eq!(ids.credentials, ["autocomp:new-secret", "autocomp:old-secret"]);
        assert_eq!(ids.users(), ["autocomp", "autocomp"]);
        for (text, expected) in [
            ("", "holds no user:password line"),
            ("autocomp\n", "line 1 is not user:password"),
            ("a:b\n:secret-only\n", "line 2 is not user:password"),
            ("user-only:\n", "line 1"),
        ] {
            std::fs::write(&file, text).unwrap();
            let error = Identities::load(&url(&file)).err().unwrap().to_string();
            assert!(error.contains(expected) && error.contains("auth_file="), "{text:?}: {error}");
            assert!(!error.contains("secret-only") && !error.contains("user-only"), "{error}");
        }
        let error = Identities::load(&url(&dir.path().join("missing"))).err().unwrap().to_string();
        assert!(error.contains("missing") && error.contains("cannot be read"), "{error}");
    }

    #[test]
    fn a_node_is_foreign_when_persistent_not_a_holder_record_or_another_sessions() {
        let stat = |owner: i64| zk::Stat {
            czxid: 1,
            mzxid: 1,
            pzxid: 1,
            ctime: 0,
            mtime: 0,
            version: 0,
            cversion: 0,
            aversion: 0,
            ephemeral_owner: owner,
            data_length: 0,
            num_children: 0,
        };
        let holder =
            LockHolder { agent: "probe/1@h#1".into(), host: "h".into(), pid: 1, since: autocomp_model::Timestamp(0) };
        let record = |session: Option<&str>| {
            serde_json::to_vec(&NodeData { holder: holder.clone(), session: session.map(str::to_owned) }).unwrap()
        };
        assert_eq!(foreign_reason(&record(Some("0x2a")), &stat(0x2a)), None);
        assert_eq!(foreign_reason(&record(None), &stat(0x2a)), None, "a node of an older release");
        assert!(foreign_reason(&record(Some("0x2a")), &stat(0)).unwrap().contains("persistent"));
        assert!(foreign_reason(b"junk", &stat(0x2a)).unwrap().contains("not a lock holder record"));
        assert!(foreign_reason(&record(Some("0x2a")), &stat(0x2b)).unwrap().contains("names session 0x2a"));
        // What an older release reads of ours: the holder, the session ignored.
        let read: LockHolder = serde_json::from_slice(&record(Some("0x2a"))).unwrap();
        assert_eq!(read, holder);
    }

    #[test]
    fn a_parent_is_open_when_the_world_or_an_address_may_create_or_delete_children() {
        let entry = |permission, scheme, id| zk::Acl::new(permission, zk::AuthId::new(scheme, id));
        let (all, read) = (zk::Permission::ALL, zk::Permission::READ);
        assert!(lets_strangers_add_or_remove(&entry(all, "world", "anyone")), "ZooKeeper's default for /");
        assert!(lets_strangers_add_or_remove(&entry(zk::Permission::CREATE, "world", "anyone")));
        assert!(lets_strangers_add_or_remove(&entry(read | zk::Permission::DELETE, "ip", "127.0.0.1")));
        assert!(!lets_strangers_add_or_remove(&entry(read, "world", "anyone")), "setAcl / world:anyone:r");
        assert!(!lets_strangers_add_or_remove(&entry(read | zk::Permission::ADMIN, "world", "anyone")));
        assert!(!lets_strangers_add_or_remove(&entry(all, "digest", "admin:x")), "an identity is not a stranger");
    }

    #[test]
    fn parents_go_up_to_the_root() {
        assert_eq!(parent_of("/autocomp/batch/probe/B1"), "/autocomp/batch/probe");
        assert_eq!(parent_of("/autocomp"), "/");
    }
}
