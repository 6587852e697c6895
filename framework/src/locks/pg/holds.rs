//! What this process holds on its lease (lock rows, claims naming its liveness record), which
//! the renewal's cadence follows, and whether the lease is dormant.
//!
//! A lease with nothing held on it for a whole lease goes dormant: it stops renewing (at
//! 2,000 workers the idle renewals were most of the lock statements: docs/capacity.md). A
//! hold is taken only on an awake lease ([`Holds::try_hold`] answers `None` while dormant),
//! and the lease dozes off only with nothing held, under the same mutex, so no hold ever
//! lives on a dormant lease. A dormant lease is renewed once, waiting for the answer, before
//! a claim naming the worker is written, and before a lock row just written is handed out as
//! a lock (a take that finds the lock busy, most of a crowd's, costs it nothing).
//!
//! Why it is safe: a taker acts only on a worker whose beat it has seen unchanged for a whole
//! lease, and only if it is still that value. A dormant worker holds nothing (a lock row it
//! has just written is not held until the renewal has answered); its renewal
//! before the next hold either moves the beat (any taker's proof is void) or finds the row
//! gone (the lease is lost, a lock row just written is gone with the row, and nothing is
//! handed out or claimed under it).
//!
//! What it costs: a row naming the worker left behind while it is dormant (a release that
//! failed, a run whose result was not recorded) has a holder whose beat no longer moves, so
//! a taker wanting it takes the worker over after a lease, where before it waited for the
//! process to exit; the live process then finds its row gone at its next wake and loses its
//! lease (exit 4), as a frozen one does.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tokio::time::Instant;

/// How many things are held and since when nothing has been.
struct Count {
    held: usize,
    /// When the count last fell to zero, the lease last woke, or it began.
    idle_since: Instant,
}

pub struct Holds {
    count: Mutex<Count>,
    /// Told when the count leaves zero or the lease wakes: a renewal due a fifth after the
    /// last may now be due a tenth after it, or due at all.
    began: Notify,
    /// Whether the lease is dormant (not renewed, nothing held), for the lease's watch.
    dormant: watch::Sender<bool>,
}

impl Default for Holds {
    fn default() -> Self {
        Self {
            count: Mutex::new(Count { held: 0, idle_since: Instant::now() }),
            began: Notify::new(),
            dormant: watch::Sender::new(false),
        }
    }
}

/// One thing held on the lease, until dropped.
pub struct Hold(Arc<Holds>);

impl Holds {
    fn count(&self) -> std::sync::MutexGuard<'_, Count> {
        self.count.lock().expect("never poisoned")
    }

    /// A hold, unless the lease is dormant (then it must be renewed first, and `woke`).
    pub fn try_hold(self: &Arc<Self>) -> Option<Hold> {
        let mut count = self.count();
        if *self.dormant.borrow() {
            return None;
        }
        count.held += 1;
        if count.held == 1 {
            self.began.notify_one();
        }
        Some(Hold(Arc::clone(self)))
    }

    pub fn any(&self) -> bool {
        self.count().held > 0
    }

    /// Returns once something is held after nothing was, or the lease woke (or did, since
    /// the last call).
    pub async fn began(&self) {
        self.began.notified().await
    }

    /// The lease goes dormant if nothing has been held on it for `after`: `true` if it did
    /// (or was).
    pub fn doze_if_idle(&self, after: Duration) -> bool {
        let count = self.count();
        if count.held > 0 || count.idle_since.elapsed() < after {
            return false;
        }
        self.dormant.send_replace(true);
        true
    }

    /// The dormant lease was renewed: holds may be taken again, and the renewal's cadence
    /// starts over.
    pub fn woke(&self) {
        let mut count = self.count();
        count.idle_since = Instant::now();
        self.dormant.send_replace(false);
        self.began.notify_one();
    }

    pub fn is_dormant(&self) -> bool {
        *self.dormant.borrow()
    }

    pub fn dormancy(&self) -> watch::Receiver<bool> {
        self.dormant.subscribe()
    }
}

impl Hold {
    /// Another hold beside this one (the lease is awake while this one lives).
    pub fn again(&self) -> Hold {
        self.0.count().held += 1;
        Hold(Arc::clone(&self.0))
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        let mut count = self.0.count();
        count.held -= 1;
        if count.held == 0 {
            count.idle_since = Instant::now();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_are_counted_and_the_lease_dozes_only_after_holding_nothing_for_as_long_as_asked() {
        let holds = Arc::new(Holds::default());
        assert!(!holds.any());
        let a = holds.try_hold().expect("awake");
        let b = a.again();
        assert!(holds.any());
        assert!(!holds.doze_if_idle(Duration::ZERO), "never with something held");
        drop(a);
        assert!(holds.any(), "one still held");
        drop(b);
        assert!(!holds.any(), "nothing held");
        assert!(!holds.doze_if_idle(Duration::from_secs(3600)), "not idle for that long yet");
        assert!(!holds.is_dormant());
        assert!(holds.doze_if_idle(Duration::ZERO));
        assert!(holds.is_dormant());
        assert!(holds.try_hold().is_none(), "no hold on a dormant lease");
        holds.woke();
        assert!(!holds.is_dormant());
        assert!(!holds.doze_if_idle(Duration::from_secs(3600)), "woken: idle counted from the wake");
        let _held = holds.try_hold().expect("awake again");
    }

    #[tokio::test]
    async fn holding_after_holding_nothing_and_waking_are_told_to_the_renewal() {
        let holds = Arc::new(Holds::default());
        let told = tokio::spawn({
            let holds = Arc::clone(&holds);
            async move { holds.began().await }
        });
        let held = holds.try_hold().expect("awake");
        tokio::time::timeout(Duration::from_secs(10), told).await.expect("told").unwrap();
        drop(held);

        assert!(holds.doze_if_idle(Duration::ZERO));
        let told = tokio::spawn({
            let holds = Arc::clone(&holds);
            async move { holds.began().await }
        });
        holds.woke();
        tokio::time::timeout(Duration::from_secs(10), told).await.expect("told").unwrap();
    }
}
