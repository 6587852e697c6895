//! Liveness records on PostgreSQL: a process's record is `pg:<its worker id>`, its row in
//! `autocomp_lock_workers` with the beat it renews (every tenth of its lease while it holds
//! anything on it, every fifth while it holds nothing, not at all once it has held nothing for
//! a lease: `holds`).
//!
//! Judging another's, on this process's monotonic clock only (the lease rule of `lease`):
//! - its row absent: `Dead` (a worker's row is deleted only by its own `close`, at exit, or
//!   by a taker that saw its beat unchanged for a whole lease);
//! - its beat seen to change since the last look: `Alive`;
//! - a first look, or a beat unchanged for less than its lease since the read that first
//!   showed it was answered: `Unproven`;
//! - unchanged for its whole lease: taken over as a lock taker takes a stalled worker over
//!   (its row deleted if its beat is still that value, its locks with it), then `Dead`. The
//!   deletion makes the verdict final: a holder that was only frozen finds its row gone at its
//!   next renewal and loses its lease, instead of renewing on as if nothing happened. A live
//!   process whose lease is dormant is judged so too if a run naming it was left open (its
//!   result not recorded): the run is taken over, and the process finds its row gone when it
//!   next wakes, and loses its lease then (exit 4), as a frozen one does.
//!
//! The looks are remembered per worker (`judged`).

use std::time::Duration;

use tokio::time::Instant;
use tokio_postgres::types::Type;

use super::judged::Look;
use super::shared::Shared;
use super::sql;
use crate::locks::{Liveness, LockError};

/// The prefix of a PostgreSQL liveness record.
const SCHEME: &str = "pg:";

/// The record of the worker `worker`.
pub fn record_of(worker: &str) -> String {
    format!("{SCHEME}{worker}")
}

/// The worker a `pg:` record names, if it is one `new_worker_id` could have made
/// (`<pid>-<hex>-<16 hex>`); `None` for anything else.
pub fn worker_of(record: &str) -> Option<&str> {
    let worker = record.strip_prefix(SCHEME)?;
    let parts: Vec<&str> = worker.split('-').collect();
    let hex = |part: &str| !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    let well_formed = matches!(parts.as_slice(),
        [pid, micros, random] if pid.parse::<u32>().is_ok_and(|n| n.to_string() == *pid)
            && hex(micros) && micros.len() <= 16 && random.len() == 16 && hex(random));
    well_formed.then_some(worker)
}

impl Shared {
    /// How the worker of `record` stands (see the module).
    pub async fn judge_liveness(&self, record: &str) -> Result<Liveness, LockError> {
        let Some(worker) = worker_of(record) else { return Ok(Liveness::Unproven) };
        self.usable()?;
        if worker == self.lease.worker {
            return Ok(Liveness::Alive);
        }
        let Some((beat, lease)) = self.beat_of(worker).await? else { return Ok(self.gone(worker)) };
        let look = self.judged.lock().expect("never poisoned").saw(worker, beat, Instant::now());
        match look {
            Look::First => Ok(Liveness::Unproven),
            Look::Changed => Ok(Liveness::Alive),
            Look::Unchanged { since } if since.elapsed() < lease => Ok(Liveness::Unproven),
            Look::Unchanged { .. } => {
                if self.take_over(worker, beat, lease).await? {
                    return Ok(self.gone(worker));
                }
                // Renewed meanwhile, or taken over by someone else first: look again.
                match self.beat_of(worker).await? {
                    None => Ok(self.gone(worker)),
                    Some((beat, _)) => {
                        let look = self.judged.lock().expect("never poisoned").saw(worker, beat, Instant::now());
                        Ok(if look == Look::Changed { Liveness::Alive } else { Liveness::Unproven })
                    }
                }
            }
        }
    }

    /// The worker's beat and lease, as a read answered now shows them; `None` if its row is
    /// gone.
    async fn beat_of(&self, worker: &str) -> Result<Option<(i64, Duration)>, LockError> {
        let rows = self.run("read a lock worker's beat", sql::BEAT_OF, &[(&worker, Type::TEXT)]).await?;
        Ok(rows.first().map(|row| {
            let (beat, lease_ms): (i64, i64) = (row.get(0), row.get(1));
            (beat, Duration::from_millis(lease_ms.max(0) as u64))
        }))
    }

    fn gone(&self, worker: &str) -> Liveness {
        self.judged.lock().expect("never poisoned").forget(worker);
        Liveness::Dead
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_names_a_worker_id_as_made_and_nothing_else_is_ours() {
        let worker = "4242-61f0a2b3c4d5e-0123456789abcdef";
        assert_eq!(worker_of(&record_of(worker)), Some(worker));
        for foreign in [
            "",
            "pg:",
            "zk:72ab",
            "local:h:1:0123456789abcdef",
            "pg:4242",
            "pg:4242-61f0-0123",
            "pg:04242-61f0-0123456789abcdef",
            "pg:4242-61F0-0123456789abcdef",
            "pg:4242-61f0-0123456789abcdef-x",
            "pg:4242-61f0-0123456789abcdeg",
        ] {
            assert_eq!(worker_of(foreign), None, "{foreign}");
        }
    }
}
