//! The component's turn (its poll lock) as a watcher keeps it between passes. Where claims
//! are the batches' locks the turn guards no batch: it only keeps the component's passes
//! from looking and claiming over each other. Taking it and giving it back were the lock
//! service's two writes on every stage's path (over ZooKeeper 2.2 + 1.7 ms of a 9.6 ms pass,
//! BENCHMARKS.md), so a watcher whose pass found work and left none behind (it claimed some,
//! and less than it had room for) keeps the turn for its next pass, and gives it back once it has been idle for
//! `KEPT_IDLE` or held for `KEPT_AT_MOST`, between passes or beside a pass's work (slow work
//! does not hold it): off every batch's path. A pass that fills its room gives the turn back
//! at once, so under a backlog the component's other processes take turns as before; after
//! `KEPT_AT_MOST` the watcher keeps no turn for `RESTS_FOR` where waiters poll (flock,
//! PostgreSQL), its passes taking and giving back the lock around their claims as a cron pass
//! does, so another process's pass (a manual run, a cron pass) that polls for the lock finds
//! it free: it waits about `KEPT_AT_MOST`. A ZooKeeper waiter is told at the release, and
//! takes the lock before the watcher's next pass: no rest there.

use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::locks::{Lock, SessionState};

/// A kept turn idle this long is given back: the trickle between batches is shorter, a
/// quiet component's turn is free for the others.
pub(super) const KEPT_IDLE: Duration = Duration::from_millis(500);
/// A turn is given back after this long however busy its holder is, so a manual pass or
/// another process's pass waits for it about this long at most.
pub(super) const KEPT_AT_MOST: Duration = Duration::from_secs(2);
/// After a turn held `KEPT_AT_MOST`, no turn is kept for this long where waiters poll: the
/// lock is free but for the claims, so a waiter that polls for it (flock every 20 ms, a
/// PostgreSQL lock every 20-100 ms) gets it rather than losing every race to the watcher's
/// next pass: three of the slowest waiter's tries. While resting, each pass
/// takes and gives back the lock, two lock-service writes on its path; a second's rest in
/// every three put a third of a trickle's passes there (BENCHMARKS.md).
pub(super) const RESTS_FOR: Duration = Duration::from_millis(300);

/// How long a pass waits for the turn its watcher is giving back beside the work (a release
/// over a connected ZooKeeper takes a few milliseconds) before it asks for the turn anyway.
pub(super) const GIVEN_BACK_WITHIN: Duration = Duration::from_secs(1);

/// The component's poll lock as a pass holds it, and since when it was taken.
pub(super) struct TurnLock {
    pub(super) lock: Box<dyn Lock>,
    taken: Instant,
}

impl TurnLock {
    /// A poll lock just taken.
    pub(super) fn taken_now(lock: Box<dyn Lock>) -> Self {
        Self { lock, taken: Instant::now() }
    }
}

/// A kept turn taken out for a pass.
pub(super) enum Taken {
    /// The session holds it: the pass has its turn.
    Reuse(TurnLock),
    /// The session is suspended: released, and the pass asks for the turn as usual.
    Release(TurnLock),
}

/// The turn a watcher keeps between passes (none for a cron pass, which exits).
#[derive(Default)]
pub(super) struct KeptTurn {
    /// Set once the runner serves a watcher (turns are kept from then on): how long no turn
    /// is kept after one held `KEPT_AT_MOST`, `RESTS_FOR` or nothing where waiters are told
    /// at the release.
    rests_for: OnceLock<Duration>,
    kept: Mutex<Option<Kept>>,
    /// Until when no turn is kept, after one held `KEPT_AT_MOST`.
    resting_until: Mutex<Option<Instant>>,
    /// The release of a turn given back beside a pass's work (a task of its own), until the
    /// next pass has waited for it.
    giving_back: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

struct Kept {
    turn: TurnLock,
    /// When the pass that kept it ended its claims.
    used: Instant,
}

impl KeptTurn {
    /// From now on a pass that left nothing behind keeps the turn; after one held
    /// `KEPT_AT_MOST`, none is kept for `RESTS_FOR`, unless the lock service's waiters are
    /// told at the release (`LockService::waiters_told_at_release`).
    pub(super) fn enable(&self, waiters_told_at_release: bool) {
        let _ = self.rests_for.set(if waiters_told_at_release { Duration::ZERO } else { RESTS_FOR });
    }

    /// Whether this runner serves a watcher (`enable` was called): its passes never queue for
    /// the turn, since the watcher retries while it defers.
    pub(super) fn serves_a_watcher(&self) -> bool {
        self.rests_for.get().is_some()
    }

    /// The kept turn, taken out for the next pass (`Reuse`) if the lock session is connected;
    /// while it is suspended the turn is to be released (its node or row outlives the
    /// suspension, and only a release lets it go); a lost session held nothing any more (the
    /// server dropped it with the session).
    pub(super) fn take(&self, session: SessionState) -> Option<Taken> {
        let kept = self.kept.lock().expect("the kept turn's mutex").take()?;
        match session {
            SessionState::Connected => Some(Taken::Reuse(kept.turn)),
            SessionState::Suspended => Some(Taken::Release(kept.turn)),
            SessionState::Lost => None,
        }
    }

    /// After a pass's claims: keeps the turn if this runner keeps turns and the pass claimed
    /// less than it had room for (`caught_up`); else hands it back to be released.
    pub(super) fn keep_or_return(&self, turn: TurnLock, caught_up: bool) -> Option<TurnLock> {
        if self.rests_for.get().is_none() || !caught_up || self.resting() {
            return Some(turn);
        }
        let mut kept = self.kept.lock().expect("the kept turn's mutex");
        let earlier = kept.replace(Kept { turn, used: Instant::now() });
        earlier.map(|kept| kept.turn)
    }

    /// The kept turn, taken out to be released, if it has been idle for `KEPT_IDLE` or held
    /// for `KEPT_AT_MOST` (`all`: whatever its age, at the end of a watch).
    pub(super) fn expired(&self, all: bool) -> Option<TurnLock> {
        let mut kept = self.kept.lock().expect("the kept turn's mutex");
        let due = kept.as_ref().is_some_and(|kept| all || Self::left(kept).is_zero());
        if !due {
            return None;
        }
        let kept = kept.take()?;
        if kept.turn.taken.elapsed() >= KEPT_AT_MOST {
            let rests_for = self.rests_for.get().copied().unwrap_or(RESTS_FOR);
            *self.resting_until.lock().expect("the resting mutex") = Some(Instant::now() + rests_for);
        }
        Some(kept.turn)
    }

    /// The release of a turn given back beside the work, running in its own task.
    pub(super) fn giving_back(&self, release: tokio::task::JoinHandle<()>) {
        *self.giving_back.lock().expect("the giving-back mutex") = Some(release);
    }

    /// Waits, `within` at most, for the turn this watcher is giving back beside its work:
    /// until the release is done the lock service holds the turn for this watcher, and a pass
    /// that asked for it then found it held and deferred to itself (a quarter of a second and
    /// more; the p99 of a trickle over ZooKeeper, BENCHMARKS.md).
    pub(super) async fn given_back(&self, within: Duration) {
        let release = self.giving_back.lock().expect("the giving-back mutex").take();
        if let Some(release) = release {
            let _ = tokio::time::timeout(within, release).await;
        }
    }

    /// Whether turns are not kept now (`rests_for` after one held `KEPT_AT_MOST`).
    fn resting(&self) -> bool {
        self.resting_until.lock().expect("the resting mutex").is_some_and(|until| Instant::now() < until)
    }

    /// How long until the kept turn is due to be given back, if one is kept.
    pub(super) fn due_in(&self) -> Option<Duration> {
        self.kept.lock().expect("the kept turn's mutex").as_ref().map(Self::left)
    }

    fn left(kept: &Kept) -> Duration {
        let idle_left = KEPT_IDLE.saturating_sub(kept.used.elapsed());
        let age_left = KEPT_AT_MOST.saturating_sub(kept.turn.taken.elapsed());
        idle_left.min(age_left)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_pass_waits_for_the_turn_its_watcher_is_giving_back_and_no_longer_than_it_may() {
        let turn = KeptTurn::default();
        // Nothing given back: no wait.
        tokio::time::timeout(Duration::from_secs(5), turn.given_back(GIVEN_BACK_WITHIN)).await.unwrap();

        let (done, released) = tokio::sync::oneshot::channel::<()>();
        turn.giving_back(tokio::spawn(async move {
            let _ = released.await;
        }));
        let mut waiting = std::pin::pin!(turn.given_back(GIVEN_BACK_WITHIN));
        let early = tokio::time::timeout(Duration::from_millis(100), &mut waiting).await;
        assert!(early.is_err(), "the release is still under way: the pass waits");
        done.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(5), waiting).await.expect("waited for the release, then on");

        // A release that does not end (a silent lock service) holds the pass `within` only.
        turn.giving_back(tokio::spawn(std::future::pending::<()>()));
        let started = Instant::now();
        turn.given_back(Duration::from_millis(50)).await;
        assert!(started.elapsed() >= Duration::from_millis(50));
        tokio::time::timeout(Duration::from_secs(5), turn.given_back(GIVEN_BACK_WITHIN))
            .await
            .expect("waited once: the next pass does not wait again");
    }
}
