//! Leases on the lock service's own monotonic clock: this process's (renewed, and judged by
//! the age of its last renewal) and the other workers' (watched for a beat that stops).
//!
//! The rule, all of it measured on monotonic clocks, never on the database's:
//! - a holder renews every tenth of its lease (`UPDATE ... SET beat = beat + 1`) while it
//!   holds anything on it (a lock row, a claim naming its liveness record) and after a failed
//!   renewal, every fifth while it holds nothing, and not at all once it has held nothing
//!   for a whole lease (dormant, see `holds`: renewed once before it holds anything again);
//!   it counts a renewal from the moment it SENT it; awake, with none for 0.3 of the lease
//!   it is `Suspended`
//!   (start nothing new, hold commits), at 0.5 `Lost` (its locks may be taken soon; cancelled
//!   work gets [`LOST_GRACE_SHARE`] more);
//! - a taker takes a worker's locks over only once it has itself seen that worker's beat
//!   unchanged for a full lease, counted from when the read showing it was ANSWERED, and only if
//!   the beat is still that value when the takeover runs.
//!
//! Why a holder is gone before its locks are taken: the renewal that set the beat the taker
//! saw was sent before the taker's read was answered, and no later renewal ran before the
//! takeover (the beat did not change; one running after it finds the worker row gone). So
//! the holder's last success was sent at least a lease before the takeover: it was `Lost` half
//! a lease before, and its cancelled work past its grace 0.3 of a lease before. That margin
//! covers its watchdog's scheduling and any difference in the two clocks' rates.
//!
//! The cadence is not part of that argument (it holds however seldom a holder renews): it
//! only sets how many tries a holder has before it suspends itself. A process holding nothing
//! has nobody waiting on its beat, so it renews less often, and after a lease not at all: at
//! 2,000 workers the renewals every tenth were a third of the server's statement time, most
//! of them from idle workers (docs/capacity.md).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{error, info, warn};

use super::holds::Holds;
use crate::locks::SessionState;

/// How often a holder renews, as a share of its lease: three tries before it is suspended.
pub const RENEW_SHARE: f64 = 0.1;
/// How often a process holding nothing on its lease renews: a tenth below
/// `SUSPENDED_SHARE`, so a renewal answered within a tenth of the lease keeps it connected.
pub const IDLE_RENEW_SHARE: f64 = 0.2;
/// How long one renewal may take before it is given up (and its connection with it), as a
/// share of the lease.
pub const RENEWAL_LIMIT_SHARE: f64 = 0.25;
/// ... and an idle one: until a tenth before `LOST_SHARE`, so a second try, on a new
/// connection, still has that tenth (a quarter from a fifth would run to the end of the lease).
pub const IDLE_RENEWAL_LIMIT_SHARE: f64 = LOST_SHARE - IDLE_RENEW_SHARE - RENEW_SHARE;
/// No renewal for this share of the lease: `Suspended`.
pub const SUSPENDED_SHARE: f64 = 0.3;
/// No renewal for this share of the lease: `Lost`.
pub const LOST_SHARE: f64 = 0.5;
/// How long cancelled work may run once the lease is lost, as a share of the lease: gone by
/// 0.7 of it after the last renewal, while no taker acts before 1.0.
pub const LOST_GRACE_SHARE: f64 = 0.2;
/// How long a lease with nothing held on it is renewed before it goes dormant, as a share of
/// the lease: a worker back from a pass renews a few times more, one that passes seldom (most
/// of 2,000 deferring watchers) stops.
pub const DORMANT_AFTER_SHARE: f64 = 1.0;

/// What a lease's age means for its holder.
pub fn judge(age: Duration, lease: Duration) -> SessionState {
    if age >= lease.mul_f64(LOST_SHARE) {
        SessionState::Lost
    } else if age >= lease.mul_f64(SUSPENDED_SHARE) {
        SessionState::Suspended
    } else {
        SessionState::Connected
    }
}

/// When the renewal after one sent at `sent` is due: a tenth of the lease later while
/// anything is held on the lease or after a renewal that failed (`busy`), a fifth while
/// nothing is.
pub fn next_renewal(sent: Instant, lease: Duration, busy: bool) -> Instant {
    sent + lease.mul_f64(if busy { RENEW_SHARE } else { IDLE_RENEW_SHARE })
}

/// How long a renewal sent on that cadence may take before it is given up.
pub fn renewal_limit(lease: Duration, busy: bool) -> Duration {
    lease.mul_f64(if busy { RENEWAL_LIMIT_SHARE } else { IDLE_RENEWAL_LIMIT_SHARE })
}

/// This process's lease: its worker row, when it was last renewed, and the state published
/// for the runner.
pub struct Lease {
    /// Our row in `autocomp_lock_workers`.
    pub worker: String,
    pub ttl: Duration,
    /// `user@host:port/database`, for messages (never a password).
    pub target: String,
    /// When the last successful renewal (or the registration) was sent.
    renewed: Mutex<Instant>,
    state: watch::Sender<SessionState>,
    /// Set by `close`: the end of the lease is ours, not news.
    closing: AtomicBool,
    /// What is held on it: the renewal's cadence.
    pub holds: Arc<Holds>,
}

impl Lease {
    /// A lease just registered by a statement sent at `sent`.
    pub fn new(worker: String, ttl: Duration, target: String, sent: Instant) -> Self {
        Self {
            worker,
            ttl,
            target,
            renewed: Mutex::new(sent),
            state: watch::Sender::new(SessionState::Connected),
            closing: AtomicBool::new(false),
            holds: Arc::default(),
        }
    }

    pub fn subscribe(&self) -> watch::Receiver<SessionState> {
        self.state.subscribe()
    }

    pub fn is_lost(&self) -> bool {
        *self.state.borrow() == SessionState::Lost
    }

    /// When the last successful renewal (or the registration) was sent.
    pub fn last_renewed(&self) -> Instant {
        *self.renewed.lock().expect("never poisoned")
    }

    /// A renewal sent at `sent` succeeded.
    pub fn renewed(&self, sent: Instant) {
        self.record_renewal(sent);
        self.judge_now();
    }

    fn record_renewal(&self, sent: Instant) {
        let mut renewed = self.renewed.lock().expect("never poisoned");
        *renewed = (*renewed).max(sent);
    }

    /// A dormant lease renewed by a renewal sent at `sent`: awake, and judged at once (a wake
    /// that took long may have woken a lease already suspended, or lost).
    pub fn woke(&self, sent: Instant) {
        // Renewed before it is awake: the watch never judges it by the renewal before it dozed.
        self.record_renewal(sent);
        self.holds.woke();
        self.judge_now();
    }

    /// Publishes what the lease's age means now (a dormant lease holds nothing its age could
    /// endanger: `Connected`); `Lost` is final.
    fn judge_now(&self) -> SessionState {
        let judged = if self.holds.is_dormant() {
            SessionState::Connected
        } else {
            judge(self.last_renewed().elapsed(), self.ttl)
        };
        let mut before = SessionState::Connected;
        let changed = self.state.send_if_modified(|state| {
            before = *state;
            if *state == SessionState::Lost || *state == judged {
                return false;
            }
            *state = judged;
            true
        });
        if changed {
            let shown = humantime::format_duration(self.ttl);
            match judged {
                SessionState::Connected => {
                    info!(worker = %self.worker, "renewed the lock lease at {} again", self.target)
                }
                SessionState::Suspended => warn!(
                    worker = %self.worker,
                    "no lock lease renewal at {} for {:.0}% of the {shown} lease; holding commits until one succeeds",
                    self.target,
                    SUSPENDED_SHARE * 100.0
                ),
                SessionState::Lost => error!(
                    worker = %self.worker,
                    "no lock lease renewal at {} for half the {shown} lease: another host may take every lock \
                     this process holds once the lease is over; cancelling all work",
                    self.target
                ),
            }
        }
        if before == SessionState::Lost { SessionState::Lost } else { judged }
    }

    /// The lease is gone for a reason other than its age (the worker row was taken over).
    pub fn lose(&self, why: &str) {
        if self.state.send_replace(SessionState::Lost) != SessionState::Lost && !self.closing.load(Ordering::Relaxed) {
            error!(worker = %self.worker, "the lock lease at {} is lost: {why}; cancelling all work", self.target);
        }
    }

    /// `close` ends the lease: published as `Lost`, quietly.
    pub fn end(&self) {
        self.closing.store(true, Ordering::Relaxed);
        self.state.send_replace(SessionState::Lost);
    }

    /// Judges the lease at each threshold of its age until it is lost: the runner learns of
    /// a stalled renewal on time even while the renewal itself hangs. A dormant lease is not
    /// judged until it wakes.
    pub async fn watch(&self) {
        let mut dormancy = self.holds.dormancy();
        loop {
            let dormant = *dormancy.borrow_and_update();
            let next = match self.judge_now() {
                SessionState::Lost => return,
                _ if dormant => None,
                SessionState::Connected => Some(self.last_renewed() + self.ttl.mul_f64(SUSPENDED_SHARE)),
                SessionState::Suspended => Some(self.last_renewed() + self.ttl.mul_f64(LOST_SHARE)),
            };
            let mut state = self.subscribe();
            tokio::select! {
                _ = sleep_until_if(next) => {}
                // Dozed off or woke: judged again.
                _ = dormancy.changed() => {}
                // Lost for another reason (taken over, closed).
                _ = state.wait_for(|s| *s == SessionState::Lost) => return,
            }
        }
    }
}

/// Sleeps until `at`, or for ever.
async fn sleep_until_if(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Other workers' beats as this process saw them, each with the moment the read that first
/// showed it was answered; and the workers it watches: the holders of the locks it found busy
/// (and wants), each until it holds none of them.
#[derive(Default)]
pub struct Observations {
    seen: HashMap<String, (i64, Instant)>,
    /// Each busy path we want, with the worker found holding it.
    wanted: HashMap<String, String>,
}

impl Observations {
    /// `worker` had `beat` in a read answered at `answered`: since when (on our clock) it has
    /// shown that beat, as far as we know.
    pub fn saw(&mut self, worker: &str, beat: i64, answered: Instant) -> Instant {
        match self.seen.get_mut(worker) {
            Some((seen_beat, since)) if *seen_beat == beat => *since,
            Some(entry) => {
                *entry = (beat, answered);
                answered
            }
            None => {
                self.seen.insert(worker.to_owned(), (beat, answered));
                answered
            }
        }
    }

    /// We want `path`, found held by `worker`: watched while it holds it.
    pub fn wants(&mut self, path: &str, worker: &str) {
        if self.wanted.get(path).is_none_or(|holder| holder != worker)
            && let Some(before) = self.wanted.insert(path.to_owned(), worker.to_owned())
        {
            self.forget_unwatched(&before);
        }
    }

    /// `path` is no other worker's to watch for us any more (we took it, or hold it).
    pub fn unwant(&mut self, path: &str) {
        if let Some(holder) = self.wanted.remove(path) {
            self.forget_unwatched(&holder);
        }
    }

    /// A worker no longer watched has its beat forgotten: a beat remembered from long ago
    /// would count as unchanged since then when next met, and a dormant worker's beat does
    /// stay unchanged (forgetting only starts a count again).
    fn forget_unwatched(&mut self, worker: &str) {
        if !self.wanted.values().any(|holder| holder == worker) {
            self.seen.remove(worker);
        }
    }

    /// The workers we watch, and every path we want of them.
    pub fn watched(&self) -> (Vec<String>, Vec<String>) {
        let workers: std::collections::BTreeSet<&String> = self.wanted.values().collect();
        (workers.into_iter().cloned().collect(), self.wanted.keys().cloned().collect())
    }

    /// A watch asked whether `worker` still holds `asked` (the paths we wanted of it then) and
    /// it holds `held` of them (`None`: its row is gone): those it let go are no longer wanted
    /// of it, and a worker holding none we want is forgotten. `true` if it is still watched.
    pub fn settle(&mut self, worker: &str, asked: &[String], held: Option<&[String]>) -> bool {
        for path in asked {
            let let_go = held.is_none_or(|held| !held.contains(path));
            if let_go && self.wanted.get(path).is_some_and(|holder| holder == worker) {
                self.wanted.remove(path);
            }
        }
        let watched = self.wanted.values().any(|holder| holder == worker);
        if !watched {
            self.seen.remove(worker);
        }
        watched
    }

    /// `worker` is gone (taken over): nothing of it is watched or remembered.
    pub fn forget(&mut self, worker: &str) {
        self.seen.remove(worker);
        self.wanted.retain(|_, holder| holder != worker);
    }

    /// Forgets the beats of the workers neither listed nor watched.
    pub fn keep_only<'a>(&mut self, listed: impl IntoIterator<Item = &'a str>) {
        let mut kept: std::collections::HashSet<&str> = listed.into_iter().collect();
        kept.extend(self.wanted.values().map(String::as_str));
        self.seen.retain(|worker, _| kept.contains(worker.as_str()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_is_suspended_at_three_tenths_and_lost_at_half_its_age() {
        let lease = Duration::from_secs(10);
        assert_eq!(judge(Duration::from_millis(2_999), lease), SessionState::Connected);
        assert_eq!(judge(Duration::from_secs(3), lease), SessionState::Suspended);
        assert_eq!(judge(Duration::from_millis(4_999), lease), SessionState::Suspended);
        assert_eq!(judge(Duration::from_secs(5), lease), SessionState::Lost);
        // A renewal every tenth: two may fail before the holder holds its commits.
        const { assert!(RENEW_SHARE * 3.0 <= SUSPENDED_SHARE + 1e-9) };
        // Holding nothing, a renewal answered within a tenth keeps it connected, and one that
        // hangs is given up with a tenth left for a second try.
        const { assert!(IDLE_RENEW_SHARE + RENEW_SHARE <= SUSPENDED_SHARE + 1e-9) };
        const { assert!(IDLE_RENEW_SHARE + IDLE_RENEWAL_LIMIT_SHARE + RENEW_SHARE <= LOST_SHARE + 1e-9) };
        const { assert!(RENEW_SHARE + RENEWAL_LIMIT_SHARE + RENEW_SHARE <= LOST_SHARE + 1e-9) };
        // Cancelled work is gone before any taker may act (at a full lease).
        const { assert!(LOST_SHARE + LOST_GRACE_SHARE < 1.0) };
    }

    #[test]
    fn a_lease_is_renewed_every_tenth_while_held_or_failing_and_every_fifth_while_idle() {
        let (sent, lease) = (Instant::now(), Duration::from_secs(10));
        assert_eq!(next_renewal(sent, lease, true), sent + Duration::from_secs(1));
        assert_eq!(next_renewal(sent, lease, false), sent + Duration::from_secs(2));
        assert_eq!(renewal_limit(lease, true), Duration::from_millis(2_500));
        assert_eq!(renewal_limit(lease, false), Duration::from_secs(2));
    }

    #[test]
    fn a_beat_counts_from_the_answer_that_first_showed_it_and_a_new_beat_starts_over() {
        let mut seen = Observations::default();
        let t0 = Instant::now();
        let later = t0 + Duration::from_secs(4);
        assert_eq!(seen.saw("w1", 7, t0), t0);
        assert_eq!(seen.saw("w1", 7, later), t0, "unchanged: still since the first answer");
        assert_eq!(seen.saw("w1", 8, later), later, "renewed: counted again from this answer");
        assert_eq!(seen.saw("w2", 8, later), later, "another worker has its own count");
        seen.keep_only(["w2"]);
        assert_eq!(seen.saw("w1", 8, later + Duration::from_secs(1)), later + Duration::from_secs(1), "forgotten");
    }

    #[test]
    fn a_worker_is_watched_while_it_holds_a_path_we_want_and_forgotten_after() {
        let mut seen = Observations::default();
        assert_eq!(seen.watched(), (vec![], vec![]), "nothing met busy: nobody watched");
        let t0 = Instant::now();
        seen.saw("w1", 3, t0);
        seen.wants("batch/a", "w1");
        seen.wants("batch/b", "w1");
        let (workers, mut paths) = seen.watched();
        paths.sort();
        assert_eq!((workers, paths.clone()), (vec!["w1".to_owned()], vec!["batch/a".to_owned(), "batch/b".to_owned()]));
        // Met busy meanwhile: wanted of it even though the watch did not ask.
        seen.wants("batch/c", "w1");
        assert!(seen.settle("w1", &paths, Some(&["batch/b".to_owned()])), "still holds one we want");
        assert!(seen.settle("w1", &["batch/b".to_owned()], Some(&[])), "batch/c is still wanted of it");
        seen.unwant("batch/c");
        assert!(!seen.settle("w1", &[], Some(&[])), "holds nothing we want");
        assert_eq!(seen.watched(), (vec![], vec![]));
        assert_eq!(seen.saw("w1", 3, t0 + Duration::from_secs(1)), t0 + Duration::from_secs(1), "its beat forgotten");

        // A path moves to another holder, or is taken by us: the holder no longer watched is
        // forgotten with its beat; a worker whose row is gone is forgotten.
        seen.saw("w1", 3, t0);
        seen.wants("poll/p", "w1");
        seen.wants("poll/p", "w2");
        assert_eq!(seen.watched().0, vec!["w2".to_owned()]);
        let later = t0 + Duration::from_secs(30);
        assert_eq!(seen.saw("w1", 3, later), later, "w1's beat forgotten once nothing was wanted of it");
        seen.saw("w2", 9, t0);
        seen.unwant("poll/p");
        assert_eq!(seen.saw("w2", 9, later), later, "w2's beat forgotten once we took the path");
        seen.wants("poll/p", "w2");
        assert!(!seen.settle("w2", &["poll/p".to_owned()], None));
        seen.wants("poll/q", "w3");
        seen.forget("w3");
        assert_eq!(seen.watched(), (vec![], vec![]));
    }

    #[tokio::test]
    async fn the_watch_publishes_suspended_then_lost_on_its_own_clock() {
        let lease = Duration::from_secs(1);
        let held = std::sync::Arc::new(Lease::new("w".into(), lease, "u@h/db".into(), Instant::now()));
        let mut state = held.subscribe();
        let start = Instant::now();
        let watching = tokio::spawn({
            let held = std::sync::Arc::clone(&held);
            async move { held.watch().await }
        });
        state.wait_for(|s| *s == SessionState::Suspended).await.unwrap();
        let suspended = start.elapsed();
        assert!(suspended >= Duration::from_millis(300) && suspended < Duration::from_secs(5), "{suspended:?}");
        let renewed = Instant::now();
        held.renewed(renewed);
        state.wait_for(|s| *s == SessionState::Connected).await.unwrap();
        state.wait_for(|s| *s == SessionState::Lost).await.unwrap();
        let lost = renewed.elapsed();
        assert!(lost >= Duration::from_millis(500) && lost < Duration::from_secs(5), "lost {lost:?} after a renewal");
        watching.await.unwrap();
        held.renewed(Instant::now());
        assert_eq!(*held.subscribe().borrow(), SessionState::Lost, "lost is final");
    }
}
