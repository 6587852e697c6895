//! `autocomp locks`: every lock held now with its holder and age, `--stale` only the old
//! ones; foreign nodes (not locks autocomp made) always, with why. Also how a lock reads in
//! words and in JSON (`LockJson`), which `explain` shows for a batch's locks.

use std::fmt::Write as _;
use std::time::Duration;

use autocomp_framework::locks::HeldLock;
use autocomp_model::Timestamp;
use serde::Serialize;

use super::columns::table;
use super::views::{Format, age, json_document};
use super::{Operator, OperatorError};

/// A held lock as `autocomp locks` lists it.
#[derive(Debug, Clone)]
pub struct LockView {
    pub lock: HeldLock,
    /// Since the holder took it (by the holder's clock; for display only).
    pub age: Option<Duration>,
}

#[derive(Debug, Clone)]
pub struct LocksView {
    pub locks: Vec<LockView>,
    /// `--stale`: only locks older than this are listed.
    pub stale: Option<Duration>,
}

/// A lock in JSON: its path, its holder when readable (`agent` null when not), and why it is
/// not a lock autocomp made (`foreign`, null for a real one).
#[derive(Serialize)]
pub struct LockJson<'a> {
    pub path: &'a str,
    /// Null when the holder cannot be read.
    pub agent: Option<&'a str>,
    #[serde(flatten)]
    pub holder: Option<HolderJson<'a>>,
    pub foreign: Option<&'a str>,
}

/// Who holds a lock, where, since when and for how long (by the holder's clock).
#[derive(Serialize)]
pub struct HolderJson<'a> {
    pub host: &'a str,
    pub pid: u32,
    pub since: Timestamp,
    pub age_seconds: u64,
}

impl<'a> LockJson<'a> {
    /// `now`: the clock ages are counted at.
    pub fn of(lock: &'a HeldLock, now: Timestamp) -> Self {
        let holder = lock.holder.as_ref();
        LockJson {
            path: &lock.path,
            agent: holder.map(|h| h.agent.as_str()),
            holder: holder.map(|h| HolderJson {
                host: &h.host,
                pid: h.pid,
                since: h.since,
                age_seconds: now.since(h.since).as_secs(),
            }),
            foreign: lock.foreign.as_deref(),
        }
    }
}

/// Who holds a lock, in words: `free`, `FOREIGN node (<why>)`, or `held by <agent> on <host>
/// pid <pid> since <time> (<age>)`.
pub fn describe_lock(lock: Option<&HeldLock>, now: Timestamp) -> String {
    match lock {
        None => "free".into(),
        Some(HeldLock { foreign: Some(why), .. }) => format!("FOREIGN node, not a lock autocomp made ({why})"),
        Some(HeldLock { holder: None, .. }) => "held (holder not readable)".into(),
        Some(HeldLock { holder: Some(h), .. }) => {
            format!("held by {} on {} pid {} since {} ({})", h.agent, h.host, h.pid, h.since, age(now.since(h.since)))
        }
    }
}

impl LocksView {
    /// Every held lock with its holder and age; with `stale`, only those held longer than
    /// that (locks whose holder cannot be read are left out then, foreign nodes never: they
    /// need a person whatever their age).
    pub async fn read(operator: &Operator, stale: Option<Duration>) -> Result<LocksView, OperatorError> {
        let held = operator.held_locks().await?;
        let now = Timestamp::now();
        let locks = held
            .into_iter()
            .map(|lock| {
                let age = lock.holder.as_ref().map(|h| now.since(h.since));
                LockView { lock, age }
            })
            .filter(|view| {
                view.lock.foreign.is_some() || stale.is_none_or(|limit| view.age.is_some_and(|age| age > limit))
            })
            .collect();
        Ok(LocksView { locks, stale })
    }

    pub fn render(&self, format: Format) -> String {
        let now = Timestamp::now();
        match format {
            Format::Json => {
                let locks: Vec<LockJson> = self.locks.iter().map(|l| LockJson::of(&l.lock, now)).collect();
                json_document(&locks)
            }
            // Quiet when `--stale` finds nothing, so cron mails only trouble.
            Format::Text if self.locks.is_empty() && self.stale.is_some() => String::new(),
            Format::Text if self.locks.is_empty() => "no locks held\n".into(),
            Format::Text => self.to_text(),
        }
    }

    fn to_text(&self) -> String {
        let rows: Vec<Vec<String>> = self
            .locks
            .iter()
            .map(|view| match (&view.lock.foreign, &view.lock.holder) {
                (Some(_), _) => vec![view.lock.path.clone(), "FOREIGN (see below)".into()],
                (None, Some(h)) => vec![
                    view.lock.path.clone(),
                    h.agent.clone(),
                    h.host.clone(),
                    h.pid.to_string(),
                    h.since.to_string(),
                    view.age.map(age).unwrap_or_default(),
                ],
                (None, None) => vec![view.lock.path.clone(), "(holder not readable)".into()],
            })
            .collect();
        let mut out = table(&["lock", "holder", "host", "pid", "since", "age"], &rows);
        // The reasons are long; one line each under the table, where a person reads them.
        for view in &self.locks {
            if let Some(why) = &view.lock.foreign {
                let path = &view.lock.path;
                writeln!(out, "FOREIGN {path}: not a lock autocomp made: {why}; no pass takes it while it is there")
                    .ok();
            }
        }
        out
    }
}

impl Operator {
    /// `autocomp locks`: see `LocksView::read`.
    pub async fn locks_held(&self, stale: Option<Duration>) -> Result<LocksView, OperatorError> {
        LocksView::read(self, stale).await
    }
}
