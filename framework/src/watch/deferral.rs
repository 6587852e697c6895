//! How long a watcher has deferred to another pass of its component, remembered across the
//! times it goes back to sleeping in the change feed. A watcher whose retry finds the turn
//! free and nothing to claim sleeps in the feed again (so a lone watcher whose heartbeat met a
//! cron pass is woken by the next change, and works it if the turn is free by then); the next
//! change wakes it, its pass meets the busy turn again, and it defers once more. Starting
//! that deferral at the shortest retry (0.5 s) had the component's many watchers at 2,000
//! workers retrying every second or two instead of every 10 s (docs/capacity.md). So the deferral goes on from how long the watcher had
//! deferred, and the watcher, back in the feed, reads whether the turn is held before it looks,
//! until a pass of its gets the turn.

use std::time::Duration;

use tokio::time::Instant;

use super::pool_retry_after;

#[derive(Debug, Default)]
pub(super) struct Deferral {
    /// Since when the watcher defers, counting the time it had deferred before it last went
    /// back to the feed, if it defers now.
    since: Option<Instant>,
    /// How long it had deferred when it last went back to the feed without a pass of its
    /// getting the turn.
    before: Duration,
}

impl Deferral {
    pub(super) fn is_deferring(&self) -> bool {
        self.since.is_some()
    }

    /// Deferring, or back in the feed from a deferral that no pass of its getting the turn
    /// has ended: such a watcher reads whether the turn is held before it looks.
    pub(super) fn has_deferred(&self) -> bool {
        self.since.is_some() || !self.before.is_zero()
    }

    /// A pass found the turn held elsewhere at `now`: deferring from then on, or still.
    pub(super) fn met_busy_turn(&mut self, now: Instant) {
        self.since.get_or_insert_with(|| now.checked_sub(self.before).unwrap_or(now));
    }

    /// A pass got the turn (or needed none): nothing deferred is remembered.
    pub(super) fn got_turn(&mut self) {
        *self = Self::default();
    }

    /// The retry found the turn free and nothing to claim: the watcher sleeps in the feed,
    /// remembering how long it had deferred.
    pub(super) fn back_to_feed(&mut self, now: Instant) {
        if let Some(since) = self.since.take() {
            self.before = now.saturating_duration_since(since);
        }
    }

    /// How soon after `now` to retry: within a quarter of the time deferred, between the
    /// bounds.
    pub(super) fn retry_after(&self, now: Instant) -> Duration {
        pool_retry_after(self.since.map_or(Duration::ZERO, |since| now.saturating_duration_since(since)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deferral_goes_on_from_the_time_deferred_before_the_watcher_went_back_to_the_feed() {
        let start = Instant::now();
        let at = |secs: u64| start + Duration::from_secs(secs);
        let mut deferral = Deferral::default();
        assert!(!deferral.is_deferring());
        deferral.met_busy_turn(at(0));
        assert_eq!(deferral.retry_after(at(0)), Duration::from_millis(500));
        deferral.met_busy_turn(at(8));
        assert_eq!(deferral.retry_after(at(8)), Duration::from_secs(2), "still deferring since the first busy turn");

        deferral.back_to_feed(at(8));
        assert!(!deferral.is_deferring());
        assert!(deferral.has_deferred(), "reads the turn before it looks");
        deferral.met_busy_turn(at(9));
        assert_eq!(
            deferral.retry_after(at(9)),
            Duration::from_secs(2),
            "goes on from the 8 s deferred, not from 0.5 s"
        );

        deferral.got_turn();
        assert!(!deferral.has_deferred());
        deferral.met_busy_turn(at(20));
        assert_eq!(deferral.retry_after(at(20)), Duration::from_millis(500), "a pass that got the turn forgets it");
    }
}
