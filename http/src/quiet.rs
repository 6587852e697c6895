//! Warnings any client can cause at will (a refused request, a closed connection, a
//! cross-site form), summarized so that nobody can fill the disk with them: the first from
//! a client (`slots::Peer`) is logged as it happens, the rest of its 10 seconds are counted,
//! and one line says how many there were when the 10 seconds are over. A flood is one line
//! per client every 10 s, with the count. Memory is bounded: at most `MAX_PEERS` clients are
//! told apart per call site; more are counted together as "other clients".

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::slots::Peer;

/// How long a client's warnings are counted before the count is logged.
pub const INTERVAL: Duration = Duration::from_secs(10);

/// Clients told apart per call site.
const MAX_PEERS: usize = 1024;

/// One call site's warnings: `static REFUSED: Quiet = Quiet::new("request refused");`.
pub struct Quiet {
    what: &'static str,
    registered: AtomicBool,
    /// Per client (None: the ones past `MAX_PEERS`, or of no known address).
    counts: Mutex<Option<HashMap<Option<Peer>, Counted>>>,
}

struct Counted {
    started: Instant,
    left_out: u64,
}

impl Quiet {
    /// `what` names the warning in the summary line ("request refused").
    pub const fn new(what: &'static str) -> Quiet {
        Quiet { what, registered: AtomicBool::new(false), counts: Mutex::new(None) }
    }

    /// Whether to log this warning from `client` now: true for its first in an interval;
    /// the others are counted and summarized at the interval's end.
    pub fn allow(&'static self, client: Option<IpAddr>) -> bool {
        self.allow_peer(client.map(Peer::of))
    }

    /// `allow` for a client known as its `Peer` already.
    pub fn allow_peer(&'static self, peer: Option<Peer>) -> bool {
        if !self.registered.swap(true, Ordering::Relaxed) {
            register(self);
        }
        self.allow_at(peer, Instant::now())
    }

    fn allow_at(&self, peer: Option<Peer>, now: Instant) -> bool {
        let mut counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        let counts = counts.get_or_insert_with(HashMap::new);
        let key = if counts.len() >= MAX_PEERS && !counts.contains_key(&peer) { None } else { peer };
        match counts.get_mut(&key) {
            Some(counted) => {
                counted.left_out += 1;
                false
            }
            None => {
                counts.insert(key, Counted { started: now, left_out: 0 });
                true
            }
        }
    }

    /// The summaries of the intervals over at `now`: (client, how many were left out).
    /// A client whose interval was quiet is forgotten; one still busy starts a new interval
    /// in which every warning is counted, so a flood gives one line per interval.
    fn over_at(&self, now: Instant) -> Vec<(Option<Peer>, u64)> {
        let mut counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        let Some(counts) = counts.as_mut() else { return Vec::new() };
        let mut over = Vec::new();
        counts.retain(|peer, counted| {
            if now.saturating_duration_since(counted.started) < INTERVAL {
                return true;
            }
            if counted.left_out == 0 {
                return false;
            }
            over.push((*peer, std::mem::take(&mut counted.left_out)));
            counted.started = now;
            true
        });
        over
    }

    fn flush(&self) {
        for (peer, left_out) in self.over_at(Instant::now()) {
            let client = peer.map_or_else(|| "other clients".to_string(), |peer| peer.to_string());
            tracing::warn!(
                client,
                left_out,
                "{}: {left_out} more from {client} in the last {} s (one line per client every {} s)",
                self.what,
                INTERVAL.as_secs(),
                INTERVAL.as_secs()
            );
        }
    }
}

/// Every call site in use, flushed once a second by one thread.
fn register(quiet: &'static Quiet) {
    static SITES: OnceLock<Mutex<Vec<&'static Quiet>>> = OnceLock::new();
    let sites = SITES.get_or_init(|| {
        let spawned = std::thread::Builder::new().name("autocomp-quiet".into()).spawn(|| {
            loop {
                std::thread::sleep(Duration::from_secs(1));
                let sites = SITES.get().map(|s| s.lock().unwrap_or_else(|p| p.into_inner()).clone());
                for site in sites.unwrap_or_default() {
                    site.flush();
                }
            }
        });
        if let Err(error) = spawned {
            // Then the counts are only never summarized; the warnings stay bounded.
            tracing::warn!("cannot start the thread that summarizes repeated warnings: {error}");
        }
        Mutex::new(Vec::new())
    });
    sites.lock().unwrap_or_else(|p| p.into_inner()).push(quiet);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_is_one_line_per_client_per_interval_with_the_count() {
        let quiet = Quiet::new("request refused");
        let t0 = Instant::now();
        let one = Some(Peer::of("127.0.0.2".parse().unwrap()));
        let same = Some(Peer::of("127.0.0.3".parse().unwrap()));
        let other = Some(Peer::of("10.0.0.1".parse().unwrap()));
        assert!(quiet.allow_at(one, t0));
        assert!(quiet.allow_at(other, t0), "each client its own line");
        for _ in 0..10_000 {
            assert!(!quiet.allow_at(same, t0 + Duration::from_secs(1)), "all of loopback is one client");
        }
        assert!(quiet.over_at(t0 + Duration::from_secs(9)).is_empty());
        assert_eq!(quiet.over_at(t0 + INTERVAL), vec![(one, 10_000)], "the quiet one is forgotten");
        // Still flooding: counted, no line of its own, the count at the next interval's end.
        assert!(!quiet.allow_at(one, t0 + Duration::from_secs(11)));
        assert_eq!(quiet.over_at(t0 + INTERVAL * 2), vec![(one, 1)]);
        assert!(quiet.over_at(t0 + INTERVAL * 3).is_empty());
        assert!(quiet.allow_at(one, t0 + INTERVAL * 3), "quiet for an interval: logged at once again");
    }

    #[test]
    fn memory_is_bounded_by_counting_the_rest_together() {
        let quiet = Quiet::new("request refused");
        let t0 = Instant::now();
        let lines = (0..5000u32)
            .filter(|i| quiet.allow_at(Some(Peer::of(std::net::Ipv4Addr::from(0x0a00_0000 + i).into())), t0))
            .count();
        assert_eq!(lines, MAX_PEERS + 1);
        assert_eq!(quiet.counts.lock().unwrap().as_ref().unwrap().len(), MAX_PEERS + 1);
        assert_eq!(quiet.over_at(t0 + INTERVAL), vec![(None, 5000 - MAX_PEERS as u64 - 1)]);
    }
}
