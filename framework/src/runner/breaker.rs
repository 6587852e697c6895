//! The circuit breaker within a pass: once a result of this pass opens the component's
//! circuit (or finds it open), the batches the pass claimed and has not started are handed
//! back unworked (released: ready again once resumed, not counted as attempts), so
//! `break_after = N` records at most N failures plus those already running at that moment.
//! Counts what was running and what was handed back, for the lines that say so.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// One pass's view of the breaker (reset when a pass starts its work).
#[derive(Default)]
pub(super) struct PassBreaker {
    open: AtomicBool,
    /// Batches in flight now: working, or recording their results.
    working: AtomicUsize,
    /// Claimed batches handed back unworked since the circuit opened.
    handed_back: AtomicUsize,
}

/// Counts a batch's work as running while it lives.
pub(super) struct Working<'a>(&'a PassBreaker);

impl Drop for Working<'_> {
    fn drop(&mut self) {
        self.0.working.fetch_sub(1, Ordering::SeqCst);
    }
}

impl PassBreaker {
    /// A pass starts its work: nothing open, running or handed back yet.
    pub(super) fn start_pass(&self) {
        self.open.store(false, Ordering::SeqCst);
        self.handed_back.store(0, Ordering::SeqCst);
    }

    /// The circuit is open: start nothing more in this pass. How many other batches are in
    /// flight at this moment (working or recording; the caller's own result is being
    /// recorded): their results are recorded after it.
    pub(super) fn open(&self) -> usize {
        self.open.store(true, Ordering::SeqCst);
        self.working.load(Ordering::SeqCst).saturating_sub(1)
    }

    pub(super) fn is_open(&self) -> bool {
        self.open.load(Ordering::SeqCst)
    }

    /// A batch's work starts (counted until the guard drops).
    pub(super) fn working(&self) -> Working<'_> {
        self.working.fetch_add(1, Ordering::SeqCst);
        Working(self)
    }

    /// A claimed batch was handed back unworked.
    pub(super) fn handed_back(&self) {
        self.handed_back.fetch_add(1, Ordering::SeqCst);
    }

    /// Claimed batches handed back unworked in this pass.
    pub(super) fn handed_back_count(&self) -> usize {
        self.handed_back.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_open_circuit_counts_the_others_running_and_what_was_handed_back() {
        let breaker = PassBreaker::default();
        let (first, second) = (breaker.working(), breaker.working());
        assert_eq!(breaker.open(), 1, "the one recording its result is not another running");
        assert!(breaker.is_open());
        drop((first, second));
        breaker.handed_back();
        breaker.handed_back();
        assert_eq!(breaker.handed_back_count(), 2);
        breaker.start_pass();
        assert!(!breaker.is_open());
        assert_eq!((breaker.handed_back_count(), breaker.open()), (0, 0));
    }
}
