//! Many locks in one statement: a claim round's batch locks are taken by one `INSERT ...
//! SELECT FROM unnest(...) ON CONFLICT DO NOTHING` that also reads the holder of each busy
//! one, and released by one `DELETE` of their (path, claim) pairs. Each is its own
//! transaction, unprepared, in one round trip, as every statement of the service.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use tokio::time::Instant;
use tokio_postgres::types::Type;
use tracing::warn;

use super::shared::{HolderRow, Met, Shared};
use super::sql;
use crate::locks::LockError;

/// How many statements one `take_many` sends at most: the first, and more only for paths
/// freed meanwhile (released, or their stalled holder taken over by this call).
const MAX_ROUNDS: usize = 3;

/// What one round said of a path asked.
enum Answer {
    Taken,
    Busy,
    /// Free again (released, or not shown to the statement's snapshot): ask once more.
    Again,
    /// Held by a worker seen stalled for its whole lease.
    Stalled(String, i64, Duration),
    /// Not a lock a lock service made.
    Foreign(LockError),
}

impl Shared {
    /// Takes each of `paths` that is free, at once, `paths[i]` with claim `first_claim + i`:
    /// `true` for each one taken. A path asked twice is taken once (later copies are busy,
    /// held by the first). A row no lock service wrote is `Foreign` for the whole call, and
    /// any error leaves nothing of this call taken.
    pub async fn take_many(&self, paths: &[String], first_claim: i64, record: &str) -> Result<Vec<bool>, LockError> {
        let mut taken = vec![false; paths.len()];
        let mut first_asked = HashSet::new();
        let mut pending: Vec<usize> = (0..paths.len()).filter(|&i| first_asked.insert(&paths[i])).collect();
        for _ in 0..MAX_ROUNDS {
            if pending.is_empty() {
                break;
            }
            let answers = match self.take_round(paths, first_claim, &pending, record).await {
                Ok(answers) => answers,
                Err(e) => {
                    self.give_back(paths, first_claim, &taken).await;
                    return Err(e);
                }
            };
            let mut again = Vec::new();
            let mut stalled: HashMap<(String, i64, Duration), Vec<usize>> = HashMap::new();
            let mut foreign = None;
            for (&i, answer) in pending.iter().zip(answers) {
                match answer {
                    Answer::Taken => taken[i] = true,
                    Answer::Busy => {}
                    Answer::Again => again.push(i),
                    Answer::Stalled(worker, beat, lease) => stalled.entry((worker, beat, lease)).or_default().push(i),
                    Answer::Foreign(e) => foreign = foreign.or(Some(e)),
                }
            }
            if let Some(e) = foreign {
                self.give_back(paths, first_claim, &taken).await;
                return Err(e);
            }
            for ((worker, beat, lease), held) in stalled {
                match self.take_over(&worker, beat, lease).await {
                    Ok(true) => again.extend(held),
                    Ok(false) => {} // it renewed: busy
                    Err(e) => {
                        self.give_back(paths, first_claim, &taken).await;
                        return Err(e);
                    }
                }
            }
            again.sort_unstable();
            pending = again;
        }
        Ok(taken)
    }

    /// One statement taking the `pending` of `paths`: an answer for each, in order (a foreign
    /// row among them is an answer too, so that what the statement took is known and given
    /// back).
    async fn take_round(
        &self,
        paths: &[String],
        first_claim: i64,
        pending: &[usize],
        record: &str,
    ) -> Result<Vec<Answer>, LockError> {
        let asked: Vec<&str> = pending.iter().map(|&i| paths[i].as_str()).collect();
        let claims: Vec<i64> = pending.iter().map(|&i| first_claim + i as i64).collect();
        let me = &self.lease.worker;
        let params = [
            (&asked as _, Type::TEXT_ARRAY),
            (&claims as _, Type::INT8_ARRAY),
            (me as _, Type::TEXT),
            (&record as _, Type::TEXT),
        ];
        let rows = self.run("take locks", sql::TAKE_MANY, &params).await?;
        let answered = Instant::now();
        let mut answers = Vec::with_capacity(rows.len());
        for ((path, claim), row) in asked.iter().zip(&claims).zip(&rows) {
            if row.get::<_, bool>(0) {
                self.took(path);
                answers.push(Answer::Taken);
                continue;
            }
            let Some(worker) = row.get::<_, Option<String>>(1) else {
                answers.push(Answer::Again);
                continue;
            };
            let holder =
                HolderRow { worker, claim: row.get(2), holder: row.get(3), beat: row.get(4), lease_ms: row.get(5) };
            answers.push(match self.meet_holder(path, *claim, holder, answered) {
                Ok(Met::Ours) => Answer::Taken,
                Ok(Met::Busy) => Answer::Busy,
                Ok(Met::Stalled { worker, beat, lease }) => Answer::Stalled(worker, beat, lease),
                Err(e) => Answer::Foreign(e),
            });
        }
        Ok(answers)
    }

    /// Releases what a failing `take_many` took (best effort: the error is what the caller
    /// needs to hear, and a lock left behind goes with the lease: at close, or taken over
    /// once its beat stays unchanged for a lease, as a dormant lease's does).
    async fn give_back(&self, paths: &[String], first_claim: i64, taken: &[bool]) {
        let claims = taken_claims(paths, first_claim, taken);
        if let Err(e) = self.release_claims(&claims).await {
            warn!("cannot give back {} locks taken by a failed try: {e}", claims.len());
        }
    }

    /// Releases the locks of these (path, claim) pairs, ours, in one statement. Released by
    /// `close` or gone with a lost lease: nothing to do.
    pub async fn release_claims(&self, claims: &[(String, i64)]) -> Result<(), LockError> {
        if claims.is_empty() || self.closed.load(std::sync::atomic::Ordering::Relaxed) {
            return Ok(());
        }
        let paths: Vec<&str> = claims.iter().map(|(path, _)| path.as_str()).collect();
        let numbers: Vec<i64> = claims.iter().map(|(_, claim)| *claim).collect();
        let me = &self.lease.worker;
        let params = [(&paths as _, Type::TEXT_ARRAY), (&numbers as _, Type::INT8_ARRAY), (me as _, Type::TEXT)];
        match self.run("release locks", sql::RELEASE_MANY, &params).await {
            Ok(_) => Ok(()),
            Err(_) if self.lease.is_lost() => Ok(()), // gone with the lease
            Err(e) => Err(e),
        }
    }
}

/// The (path, claim number) of each path `take_many` took, `paths[i]` with claim
/// `first_claim + i`.
pub fn taken_claims(paths: &[String], first_claim: i64, taken: &[bool]) -> Vec<(String, i64)> {
    (0..paths.len()).filter(|&i| taken[i]).map(|i| (paths[i].clone(), first_claim + i as i64)).collect()
}
