//! `--watch`: a component that stays up and starts a pass as soon as the index offers it a
//! batch, sleeping in the store's change feed (a long poll) in between; while the component
//! is held (paused, draining, circuit open) it asks nothing and sleeps until the steering
//! moves the store. Each pass is exactly a cron pass (poll lock, claims, fencing, results,
//! registry); a heartbeat pass keeps the registry fresh and catches readiness that only time
//! brings.

use std::sync::Arc;
use std::time::Duration;

use autocomp_sboi::BatchIndex;
use autocomp_store::ObjectStore;
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{debug, info};

use crate::component::Component;
use crate::exit::{self, RunError};
use crate::runner::{Runner, Selection, stop_requested};
use crate::verdict::{PassEnd, pass, pass_verdict};

/// The longest single wait in the change feed. The store service caps its long polls
/// anyway; a bound here keeps a hung connection from outliving a heartbeat by much.
const LONGEST_WAIT: Duration = Duration::from_secs(30);
/// How long a wake waits for another process to finish writing an embedded index.
const INDEX_WAIT: Duration = Duration::from_secs(2);
/// After a pass whose batches waited for a full pool, the next look comes this soon, then
/// twice as late each time they still wait, up to `POOL_RETRY_MAX`: a slot frees without
/// the store moving (its holder records its result just before releasing it, or dies).
const POOL_RETRY_FIRST: Duration = Duration::from_millis(500);
const POOL_RETRY_MAX: Duration = Duration::from_secs(10);

/// What wakes a watcher and what it asks.
pub struct Watched {
    /// Its change feed is what the watcher sleeps in.
    pub store: Arc<dyn ObjectStore>,
    /// Asked whether it has caught up with the store before the candidates are counted.
    pub index: Arc<dyn BatchIndex>,
}

/// Watches until shutdown, the loss of the lock service or a timed-out batch; returns the
/// exit code a cron pass would have (1 once any pass failed a batch, else 0), or the error
/// that ended it (the store or index unreachable: exit 5, as for a cron pass).
pub async fn run_watching<C: Component>(
    runner: &Arc<Runner<C>>,
    watched: Watched,
    heartbeat: Duration,
    mut shutdown: watch::Receiver<bool>,
) -> Result<u8, RunError> {
    let Watched { store, index } = watched;
    runner.coalesce_reports();
    let watched = watch_loop(runner, &store, &index, heartbeat, &mut shutdown).await;
    // Whatever the registry has not heard yet, however the watch ended.
    let flushed = runner.flush_reports(true).await;
    let code = watched?;
    flushed?;
    Ok(code)
}

async fn watch_loop<C: Component>(
    runner: &Arc<Runner<C>>,
    store: &Arc<dyn ObjectStore>,
    index: &Arc<dyn BatchIndex>,
    heartbeat: Duration,
    shutdown: &mut watch::Receiver<bool>,
) -> Result<u8, RunError> {
    let mut worst = exit::OK;
    // The first pass runs at once, as a cron start would: it registers the component and
    // takes whatever is ready already.
    let mut last_pass: Option<Instant> = None;
    let mut pool_retry: Option<Duration> = None;
    loop {
        if *shutdown.borrow() {
            return Ok(worst);
        }
        // Read before asking the index: a change after this point wakes the wait below,
        // so readiness between the question and the wait is never slept through.
        let seen = store.head().await?;
        let heartbeat_due = last_pass.is_none_or(|at| at.elapsed() >= heartbeat);
        let held = if heartbeat_due { None } else { runner.held().await? };
        let (offered, covered) = if let Some(held) = held {
            // Held: no pass (it would claim nothing) until the steering changes, which moves
            // the head and wakes the wait below, or the heartbeat (which reports the hold).
            debug!("held, not looking for work: {held}");
            (Vec::new(), true)
        } else {
            // Every watcher woke on the same change; with an embedded index another process
            // may be writing it. Past the bound the pass's store re-check is the safety net,
            // and the index is asked again (below) rather than slept on: nothing else might
            // move the store, and the work it holds back would wait for a heartbeat.
            let asked = Instant::now();
            let covered = index.covers(seen, INDEX_WAIT).await?;
            let covered_in = asked.elapsed();
            if !covered {
                debug!(?seen, "the index did not reach the store's head in time; asking it as it is");
            }
            let offered = if heartbeat_due { Vec::new() } else { runner.candidates().await? };
            debug!(covered_in = ?covered_in, asked_in = ?asked.elapsed(), "asked the index");
            (offered, covered)
        };
        let (sleep_from, go_again) = if heartbeat_due || !offered.is_empty() {
            debug!(offered = offered.len(), heartbeat_due, "starting a pass");
            last_pass = Some(Instant::now());
            // A heartbeat asks the index itself; otherwise the pass takes what it was offered.
            let selection = if heartbeat_due { Selection::Ready } else { Selection::Offered(offered) };
            let (handled, waiting) = match pass_verdict(pass(runner, &selection).await, &mut worst) {
                PassEnd::Stop(code) => return Ok(code),
                PassEnd::Error(e) => return Err(e),
                PassEnd::Continue { handled, waiting } => (handled, waiting),
            };
            if heartbeat_due {
                runner.flush_reports(true).await?;
            }
            pool_retry = match (waiting, pool_retry) {
                (0, _) => None,
                (_, None) => Some(POOL_RETRY_FIRST),
                (_, Some(retry)) => Some((retry * 2).min(POOL_RETRY_MAX)),
            };
            if *shutdown.borrow() {
                return Ok(worst);
            }
            // A pass that worked on anything goes again at once: a full queue leaves more
            // behind, and whatever arrived while it worked is already in the store. One that
            // claimed nothing although the index offered batches (another worker has them,
            // or the store's re-check refused them) wrote nothing that moves the head, so it
            // sleeps from the head read before it: a change made while it ran wakes it at
            // once, and a batch held elsewhere costs one pass per store change, no loop.
            if handled > 0 {
                debug!(handled, "pass worked; looking again");
            }
            (seen, handled > 0 || !covered)
        } else {
            // Nothing offered (or held): nothing waits for a pool slot either.
            pool_retry = None;
            (seen, !covered)
        };
        if go_again {
            continue;
        }
        // About to sleep: results already recorded go to the registry once a second's worth
        // has passed since its last write, and the sleep ends by then.
        runner.flush_reports(false).await?;
        let results_due = runner.results_due_in();
        let until_heartbeat = heartbeat.saturating_sub(last_pass.map_or(Duration::ZERO, |at| at.elapsed()));
        let wait = until_heartbeat
            .min(LONGEST_WAIT)
            .min(pool_retry.unwrap_or(LONGEST_WAIT))
            .min(results_due.unwrap_or(LONGEST_WAIT));
        tokio::select! {
            head = store.wait_for_change(sleep_from, wait) => {
                let head = head?;
                if head > sleep_from {
                    debug!(?head, "the store moved");
                }
            }
            _ = stop_requested(shutdown) => {
                info!("stopping: no pass running");
                return Ok(worst);
            }
        }
    }
}
