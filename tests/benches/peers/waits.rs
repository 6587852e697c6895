//! What PostgreSQL's sessions wait on in a window (`AUTOCOMP_BENCH_PHASES=1`): the server's
//! active sessions sampled every 10 ms from a connection of the sampler's own, counted by
//! wait event (`CPU`: active and waiting on nothing), autovacuum's workers apart. Where the
//! same statements take longer on the server in one system than in another, this says
//! whether they wait for locks, for the disk or for a core.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Samples of every session but the sampler's: the backend's kind and what it waits on.
const SAMPLE: &str = "SELECT CASE WHEN backend_type = 'client backend' THEN '' ELSE backend_type || ' ' END
        || coalesce(wait_event_type || ':' || wait_event, 'CPU'), count(*)
    FROM pg_stat_activity
    WHERE pid <> pg_backend_pid() AND state IS DISTINCT FROM 'idle'
      AND (backend_type = 'client backend' OR backend_type LIKE 'autovacuum%')
      AND NOT (backend_type = 'autovacuum launcher' AND wait_event = 'AutoVacuumMain')
    GROUP BY 1";
const EVERY: Duration = Duration::from_millis(10);
/// A window outlasting this is a bench gone wrong: the sampler stops by itself.
const LONGEST: Duration = Duration::from_secs(1_800);

pub(super) struct WaitSampler {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<(BTreeMap<String, u64>, u64)>,
}

/// Starts sampling the server at `url` (any of its databases: the view shows them all).
pub(super) fn start(url: String) -> WaitSampler {
    let stop = Arc::new(AtomicBool::new(false));
    let stopped = Arc::clone(&stop);
    let thread = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
        runtime.block_on(async move {
            let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.expect("connects");
            tokio::spawn(connection);
            let statement = client.prepare(SAMPLE).await.expect("prepares");
            let (mut counts, mut samples) = (BTreeMap::new(), 0u64);
            let until = Instant::now() + LONGEST;
            while !stopped.load(Ordering::Relaxed) && Instant::now() < until {
                for row in client.query(&statement, &[]).await.expect("samples") {
                    *counts.entry(row.get::<_, String>(0)).or_default() += row.get::<_, i64>(1) as u64;
                }
                samples += 1;
                tokio::time::sleep(EVERY).await;
            }
            (counts, samples)
        })
    });
    WaitSampler { stop, thread }
}

impl WaitSampler {
    /// Stops and prints the mean number of sessions in each state over `what`'s samples.
    pub(super) fn finish(self, what: &str) {
        self.stop.store(true, Ordering::Relaxed);
        let (counts, samples) = self.thread.join().expect("the sampler ends");
        let mut shares: Vec<(String, f64)> =
            counts.into_iter().map(|(state, n)| (state, n as f64 / samples.max(1) as f64)).collect();
        shares.sort_by(|a, b| b.1.total_cmp(&a.1));
        let shown: Vec<String> = shares.iter().map(|(state, mean)| format!("{state} {mean:.2}")).collect();
        println!("{what}: sessions by what they wait on, mean over {samples} samples: {}", shown.join(", "));
    }
}
