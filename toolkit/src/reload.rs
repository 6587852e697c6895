//! Secrets and certificates a running service reads again, so each can be rotated without a
//! restart: a value made from files, swapped when the files change (looked at every 2 s) or
//! on SIGHUP. Files that do not make a value (a key written after its certificate, a typo)
//! leave the one in use, with a warning, and are read again at their next change.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime};

/// How often the files are looked at for a change.
pub const WATCH_EVERY: Duration = Duration::from_secs(2);

/// What the files looked like when last read: a replaced or rewritten file differs.
type Stamp = Vec<Option<(SystemTime, u64, u64)>>;

type Load<T> = Box<dyn Fn() -> Result<T, String> + Send + Sync>;

/// The value `load` makes from `paths`, as of their last usable version.
pub struct Reloaded<T> {
    what: &'static str,
    paths: Vec<PathBuf>,
    load: Load<T>,
    current: RwLock<Arc<T>>,
    seen: Mutex<Stamp>,
}

impl<T: Send + Sync + 'static> Reloaded<T> {
    /// Makes the value once; `load`'s error (exit 2 at start) names the flag and the path.
    /// `what` names it in the log ("the TLS certificate").
    pub fn new(
        what: &'static str,
        paths: Vec<PathBuf>,
        load: impl Fn() -> Result<T, String> + Send + Sync + 'static,
    ) -> Result<Arc<Self>, String> {
        let seen = stamp(&paths);
        let value = load()?;
        Ok(Arc::new(Self {
            what,
            paths,
            load: Box::new(load),
            current: RwLock::new(Arc::new(value)),
            seen: Mutex::new(seen),
        }))
    }

    /// The value now.
    pub fn current(&self) -> Arc<T> {
        Arc::clone(&self.current.read().unwrap_or_else(|p| p.into_inner()))
    }

    /// Reads the files again if they changed since last read (or always, when `forced`);
    /// whether the value was replaced.
    pub fn reload(&self, forced: bool) -> bool {
        let now = stamp(&self.paths);
        {
            let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
            if !forced && *seen == now {
                return false;
            }
            *seen = now;
        }
        match (self.load)() {
            Ok(value) => {
                *self.current.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(value);
                tracing::info!("{} read again", self.what);
                true
            }
            Err(error) => {
                tracing::warn!(
                    "{} changed but cannot be used, so the one read before stays in force: {error}",
                    self.what
                );
                false
            }
        }
    }

    /// Reloads on a change of the files and on SIGHUP, for as long as the process runs.
    /// SIGHUP is taken from the moment this returns (by default it would stop the process).
    /// Call within a tokio runtime.
    pub fn watch(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        use tokio::signal::unix::{SignalKind, signal};
        let reloaded = Arc::clone(self);
        let mut hangup = signal(SignalKind::hangup()).ok();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(WATCH_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                let forced = tokio::select! {
                    _ = tick.tick() => false,
                    Some(()) = hung_up(&mut hangup) => true,
                };
                if forced {
                    tracing::info!("SIGHUP: reading {} again", reloaded.what);
                }
                reloaded.reload(forced);
            }
        })
    }
}

fn stamp(paths: &[PathBuf]) -> Stamp {
    use std::os::unix::fs::MetadataExt;
    paths
        .iter()
        .map(|path| {
            std::fs::metadata(path).ok().map(|m| (m.modified().unwrap_or(SystemTime::UNIX_EPOCH), m.len(), m.ino()))
        })
        .collect()
}

async fn hung_up(hangup: &mut Option<tokio::signal::unix::Signal>) -> Option<()> {
    match hangup {
        Some(hangup) => hangup.recv().await,
        // No handler could be installed: the files are still watched.
        None => std::future::pending().await,
    }
}
