//! The pipeline's steering as a runner last read it, kept across its passes (a watcher's): a
//! pass reads the store's steering only when it has none or the one it has holds the
//! component (a resume would not be seen otherwise), and every claim answers the steering
//! when its version moved (`claim_ready`'s `known_steering`), which refreshes it. A hold that
//! lands meanwhile is not missed: the claim refuses (claims nothing) while the component or
//! the pipeline is held, and answers the steering saying so.

use std::sync::Mutex;

use autocomp_model::Steering;

/// The newest steering this runner has seen, by version.
#[derive(Default)]
pub(super) struct SteeringCache {
    last: Mutex<Option<Steering>>,
}

impl SteeringCache {
    /// The steering last kept, if any.
    pub(super) fn get(&self) -> Option<Steering> {
        self.last.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Keeps `steering`, the store's as last read: whatever its version (a store restored
    /// from a backup may answer an older one, which is still the one in force).
    pub(super) fn keep(&self, steering: &Steering) {
        *self.last.lock().unwrap_or_else(|p| p.into_inner()) = Some(steering.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_steering_kept_is_the_one_answered() {
        let cache = SteeringCache::default();
        assert!(cache.get().is_none(), "nothing kept: the first pass reads the store");
        let at = |version| Steering { version, ..Steering::default() };
        cache.keep(&at(3));
        assert_eq!(cache.get().map(|steering| steering.version), Some(3));
        cache.keep(&at(2));
        assert_eq!(cache.get().map(|steering| steering.version), Some(2), "the store's answer, even an older one");
    }
}
