//! The change feed's horizon as one handle reads it when the read waits for the writers in
//! flight (a head a waiter compares with; a watcher's look while the handle listens takes the
//! last confirmed horizon instead, which never waits: `reads.rs`): one read at a time, its
//! answer shared by every caller that asked before the read began. Horizon reads that wait
//! go one at a time on the server (schema 19): at 2,000 workers on 32 shared connections
//! about 20 of them queued there at any moment (docs/capacity.md). A read that began after a
//! caller asked waited for every write committed before the caller asked, so its answer
//! serves that caller as one of its own would; a handle's callers then send at most one
//! horizon at a time. A read's answer is given at its first attempt's end, so no caller waits
//! through a feed page sent with it or through a failing read's retries: the callers that
//! waited for a read that failed read their own, at once and side by side, as every caller
//! did before.

use tokio::sync::{Mutex, MutexGuard};
use tokio::time::Instant;

use autocomp_model::Seq;

/// How the last read ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    Answered(Seq),
    Failed,
}

/// The last horizon read of this handle, and when it began.
#[derive(Default)]
pub(super) struct SharedHorizon {
    last: Mutex<Option<(Instant, Ended)>>,
}

/// A caller's horizon: read by a read that began after it asked, or its own to read.
pub(super) enum Horizon<'a> {
    Shared(Seq),
    /// The caller reads the horizon, and tells its first attempt's end to `ToRead`'s slot.
    ToRead(HorizonSlot<'a>),
}

/// The handle's one horizon read, while a caller's read is it (callers that ask meanwhile
/// wait for it), until its first attempt ends; empty for a caller that reads on its own.
pub(super) struct HorizonSlot<'a>(std::sync::Mutex<Option<HorizonRead<'a>>>);

struct HorizonRead<'a> {
    last: MutexGuard<'a, Option<(Instant, Ended)>>,
    began: Instant,
}

impl SharedHorizon {
    /// The horizon for a caller that asked at `asked`.
    pub(super) async fn after(&self, asked: Instant) -> Horizon<'_> {
        let last = self.last.lock().await;
        let read = match *last {
            Some((began, Ended::Answered(head))) if began > asked => return Horizon::Shared(head),
            // The read this caller waited for failed: it reads its own, holding no one back.
            Some((began, Ended::Failed)) if began > asked => None,
            _ => Some(HorizonRead { last, began: Instant::now() }),
        };
        Horizon::ToRead(HorizonSlot(std::sync::Mutex::new(read)))
    }
}

impl HorizonSlot<'_> {
    /// How an attempt at the read ended (an error: it failed). The first one answers the
    /// callers waiting for the read; later ones (a retry) tell no one.
    pub(super) fn ended<E>(&self, read: &Result<Seq, E>) {
        let read = read.as_ref().ok().copied();
        let taken = self.0.lock().map(|mut slot| slot.take()).unwrap_or(None);
        if let Some(mut taken) = taken {
            *taken.last = Some((taken.began, read.map_or(Ended::Failed, Ended::Answered)));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    async fn to_read(shared: &SharedHorizon, asked: Instant) -> HorizonSlot<'_> {
        match shared.after(asked).await {
            Horizon::ToRead(slot) => slot,
            Horizon::Shared(head) => panic!("shared {head:?}: expected to read"),
        }
    }

    #[tokio::test]
    async fn a_read_serves_the_callers_that_asked_before_it_began_and_no_later_one() {
        let shared = SharedHorizon::default();
        let early = Instant::now();
        tokio::time::sleep(Duration::from_millis(2)).await;
        let read = to_read(&shared, early).await;
        tokio::time::sleep(Duration::from_millis(2)).await;
        let meanwhile = Instant::now();
        // A caller that asks while the read runs waits for its answer.
        let waited = tokio::time::timeout(Duration::from_millis(20), shared.after(meanwhile)).await;
        assert!(waited.is_err(), "waits while the read runs");
        read.ended::<()>(&Ok(Seq(7)));
        read.ended::<()>(&Ok(Seq(8)));
        assert!(matches!(shared.after(early).await, Horizon::Shared(Seq(7))), "asked before the read began");
        // Asked after the read began: reads again.
        to_read(&shared, meanwhile).await.ended::<()>(&Ok(Seq(9)));
        assert!(matches!(shared.after(meanwhile).await, Horizon::Shared(Seq(9))));
    }

    #[tokio::test]
    async fn the_callers_that_waited_for_a_read_that_failed_read_their_own_side_by_side() {
        let shared = SharedHorizon::default();
        let early = Instant::now();
        tokio::time::sleep(Duration::from_millis(2)).await;
        to_read(&shared, Instant::now()).await.ended(&Err(()));
        // Both read at once: neither holds the other back.
        let first = to_read(&shared, early).await;
        let second = tokio::time::timeout(Duration::from_millis(20), shared.after(early)).await;
        assert!(matches!(second, Ok(Horizon::ToRead(_))), "a second caller is not held back");
        first.ended::<()>(&Ok(Seq(3)));
        // A caller that asked after the failed read began reads and answers the others again.
        let later = Instant::now();
        tokio::time::sleep(Duration::from_millis(2)).await;
        let read = to_read(&shared, later).await;
        assert!(tokio::time::timeout(Duration::from_millis(20), shared.after(later)).await.is_err());
        read.ended::<()>(&Ok(Seq(4)));
        assert!(matches!(shared.after(later).await, Horizon::Shared(Seq(4))));
    }
}
