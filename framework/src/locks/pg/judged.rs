//! The beats of the workers this service was asked to judge (`liveness`), each with when the
//! read that first showed it was answered: at most [`JUDGED_MAX`] of them, the oldest
//! forgotten first, which only starts its count again (a later verdict, never an early one).
//! Apart so the service's shared state holds it without using `liveness` back.

use std::collections::HashMap;

use tokio::time::Instant;

/// How many workers' beats a service remembers for judging liveness.
pub const JUDGED_MAX: usize = 4096;

/// What one look at a worker's beat says, given the looks before it.
#[derive(Debug, PartialEq, Eq)]
pub enum Look {
    /// Never looked at (or forgotten): the count starts now.
    First,
    /// Another beat than the last look's: it renewed.
    Changed,
    /// The same beat, shown since this moment (the answer of the first read that showed it).
    Unchanged { since: Instant },
}

/// The beats of the workers this service was asked to judge, each with when the read that
/// first showed it was answered.
#[derive(Default)]
pub struct Judged {
    seen: HashMap<String, (i64, Instant)>,
}

impl Judged {
    /// `worker` had `beat` in a read answered at `answered`.
    pub fn saw(&mut self, worker: &str, beat: i64, answered: Instant) -> Look {
        match self.seen.get_mut(worker) {
            Some((seen_beat, since)) if *seen_beat == beat => Look::Unchanged { since: *since },
            Some(entry) => {
                *entry = (beat, answered);
                Look::Changed
            }
            None => {
                if self.seen.len() >= JUDGED_MAX
                    && let Some(oldest) = self.seen.iter().min_by_key(|(_, (_, since))| *since).map(|(w, _)| w.clone())
                {
                    self.seen.remove(&oldest);
                }
                self.seen.insert(worker.to_owned(), (beat, answered));
                Look::First
            }
        }
    }

    /// `worker` is gone: nothing of it is remembered.
    pub fn forget(&mut self, worker: &str) {
        self.seen.remove(worker);
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.seen.len()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_beat_is_first_then_unchanged_since_its_first_answer_then_changed_and_the_oldest_goes_first() {
        let mut judged = Judged::default();
        let t0 = Instant::now();
        assert_eq!(judged.saw("w1", 7, t0), Look::First);
        assert_eq!(judged.saw("w1", 7, t0 + Duration::from_secs(3)), Look::Unchanged { since: t0 });
        assert_eq!(judged.saw("w1", 8, t0 + Duration::from_secs(4)), Look::Changed);
        let t4 = t0 + Duration::from_secs(4);
        assert_eq!(judged.saw("w1", 8, t4 + Duration::from_secs(1)), Look::Unchanged { since: t4 });
        judged.forget("w1");
        assert_eq!(judged.saw("w1", 8, t4), Look::First, "forgotten: counted again");

        // Bounded: at the limit the oldest look goes, and only its count starts over.
        for n in 0..JUDGED_MAX {
            judged.saw(&format!("x{n}"), 1, t4 + Duration::from_millis(n as u64 + 1));
        }
        assert_eq!(judged.len(), JUDGED_MAX);
        assert_eq!(judged.saw("w1", 8, t4), Look::First, "the oldest (w1) was forgotten for the newest");
        assert_eq!(judged.len(), JUDGED_MAX);
    }
}
