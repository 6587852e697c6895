//! The change feed's horizon as one handle reads it: one read at a time, its answer shared by
//! every caller that asked before the read began. Each horizon read takes the feed lock
//! exclusively, which waits for every writer in flight and holds back every writer after it,
//! and horizon reads wait for each other: at 2,000 workers on 32 shared connections about 20
//! of them queued on the server at any moment, with the appends behind them
//! (docs/capacity.md). A read that began after a caller asked waited for every write
//! committed before the caller asked, so its answer serves that caller as one of its own
//! would; a handle's callers then send at most one horizon at a time.

use tokio::sync::{Mutex, MutexGuard};
use tokio::time::Instant;

use autocomp_model::Seq;

/// The last horizon this handle read, and when its read began.
#[derive(Default)]
pub(super) struct SharedHorizon {
    last: Mutex<Option<(Instant, Seq)>>,
}

/// A caller's horizon: read by a read that began after it asked, or its own to read.
pub(super) enum Horizon<'a> {
    Shared(Seq),
    /// No read that began after the caller asked has answered: the caller reads it (callers
    /// that ask meanwhile wait for its answer) and publishes what it read.
    ToRead(HorizonRead<'a>),
}

/// The one horizon read of the handle in progress.
pub(super) struct HorizonRead<'a> {
    last: MutexGuard<'a, Option<(Instant, Seq)>>,
    began: Instant,
}

impl SharedHorizon {
    /// The horizon for a caller that asked at `asked`.
    pub(super) async fn after(&self, asked: Instant) -> Horizon<'_> {
        let last = self.last.lock().await;
        match *last {
            Some((began, head)) if began > asked => Horizon::Shared(head),
            _ => Horizon::ToRead(HorizonRead { last, began: Instant::now() }),
        }
    }
}

impl HorizonRead<'_> {
    /// The horizon read: callers waiting for it take it, and later callers read again.
    pub(super) fn publish(mut self, head: Seq) {
        *self.last = Some((self.began, head));
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_read_serves_the_callers_that_asked_before_it_began_and_no_later_one() {
        let shared = SharedHorizon::default();
        let early = Instant::now();
        tokio::time::sleep(Duration::from_millis(2)).await;
        let Horizon::ToRead(read) = shared.after(early).await else { panic!("nothing was read yet") };
        tokio::time::sleep(Duration::from_millis(2)).await;
        let meanwhile = Instant::now();
        // A caller that asks while the read runs waits for its answer.
        let waited = tokio::time::timeout(Duration::from_millis(20), shared.after(meanwhile)).await;
        assert!(waited.is_err(), "waits while the read runs");
        read.publish(Seq(7));
        assert!(matches!(shared.after(early).await, Horizon::Shared(Seq(7))), "asked before the read began");
        let Horizon::ToRead(again) = shared.after(meanwhile).await else {
            panic!("asked after the read began: it must read again")
        };
        again.publish(Seq(9));
        assert!(matches!(shared.after(meanwhile).await, Horizon::Shared(Seq(9))));
    }
}
