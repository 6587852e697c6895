//! The sign-in rate limit: failed sign-ins counted per client address and per account in a
//! sliding window; past the limit, sign-in answers 429 with Retry-After before any password
//! is hashed. Memory is bounded: a fixed number of keys, each holding at most its limit's
//! worth of timestamps. Also `Quiet`: warnings any client can cause, at most one per 10 s.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A warning a client can trigger at will (a refused Host, a spoofed proxy header, a
/// cross-site form, a rate-limited sign-in), logged at most once per 10 s per call site so
/// that nobody can fill the disk with them; the next line says how many were left out.
pub struct Quiet {
    last: AtomicU64,
    left_out: AtomicU64,
}

impl Quiet {
    pub const fn new() -> Quiet {
        Quiet { last: AtomicU64::new(0), left_out: AtomicU64::new(0) }
    }

    /// `Some(left out since the last line)` when a line may be logged now.
    pub fn allow(&self) -> Option<u64> {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let last = self.last.load(Ordering::Relaxed);
        if now >= last + 10 && self.last.compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed).is_ok() {
            return Some(self.left_out.swap(0, Ordering::Relaxed));
        }
        self.left_out.fetch_add(1, Ordering::Relaxed);
        None
    }
}

impl Default for Quiet {
    fn default() -> Self {
        Quiet::new()
    }
}

/// How many failed sign-ins a key may have in a window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SignInLimit {
    pub failures: u32,
    pub window: Duration,
}

impl Default for SignInLimit {
    fn default() -> Self {
        SignInLimit { failures: 5, window: Duration::from_secs(60) }
    }
}

/// Most keys remembered; beyond it the one whose last failure is oldest is forgotten.
const MAX_KEYS: usize = 10_000;

/// Failures per key (`addr:...` or `account:...`).
pub struct Limiter {
    limit: SignInLimit,
    max_keys: usize,
    failures: Mutex<HashMap<String, VecDeque<Instant>>>,
}

/// The key of a client address: an IPv6 client is its /64, which one host usually holds
/// whole.
pub fn address_key(address: Option<IpAddr>) -> String {
    match address {
        Some(IpAddr::V4(v4)) => format!("addr:{v4}"),
        Some(IpAddr::V6(v6)) => match v6.to_ipv4_mapped() {
            Some(v4) => format!("addr:{v4}"),
            None => {
                let s = v6.segments();
                format!("addr:{:x}:{:x}:{:x}:{:x}::/64", s[0], s[1], s[2], s[3])
            }
        },
        None => "addr:unknown".into(),
    }
}

impl Limiter {
    pub fn new(limit: SignInLimit) -> Limiter {
        Limiter { limit, max_keys: MAX_KEYS, failures: Mutex::new(HashMap::new()) }
    }

    /// `Err(wait)` while `key` has used up its failures: how long until one more is
    /// allowed.
    pub fn check(&self, key: &str) -> Result<(), Duration> {
        self.check_at(key, Instant::now())
    }

    fn check_at(&self, key: &str, now: Instant) -> Result<(), Duration> {
        let mut map = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        let Some(times) = map.get_mut(key) else { return Ok(()) };
        while times.front().is_some_and(|t| now.saturating_duration_since(*t) >= self.limit.window) {
            times.pop_front();
        }
        if times.len() < self.limit.failures as usize {
            if times.is_empty() {
                map.remove(key);
            }
            return Ok(());
        }
        let oldest = *times.front().expect("at the limit, so not empty");
        // Whole seconds, rounded up: Retry-After has no fractions.
        let wait = (oldest + self.limit.window).saturating_duration_since(now);
        Err(Duration::from_secs(wait.as_secs() + u64::from(wait.subsec_nanos() > 0)).max(Duration::from_secs(1)))
    }

    /// Counts a failed sign-in against `key`.
    pub fn fail(&self, key: &str) {
        self.fail_at(key, Instant::now())
    }

    fn fail_at(&self, key: &str, now: Instant) {
        let mut map = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        if !map.contains_key(key) && map.len() >= self.max_keys {
            let window = self.limit.window;
            map.retain(|_, times| times.back().is_some_and(|t| now.saturating_duration_since(*t) < window));
            if map.len() >= self.max_keys
                && let Some(stalest) = map.iter().min_by_key(|(_, times)| times.back().copied()).map(|(k, _)| k.clone())
            {
                map.remove(&stalest);
            }
        }
        let times = map.entry(key.to_owned()).or_default();
        times.push_back(now);
        // Only the newest `failures` decide when the key is free again.
        while times.len() > self.limit.failures.max(1) as usize {
            times.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn five_failures_a_minute_then_a_wait_until_the_oldest_leaves_the_window() {
        let limiter = Limiter::new(SignInLimit::default());
        let t0 = Instant::now();
        for i in 0..5 {
            assert_eq!(limiter.check_at("addr:10.0.0.1", t0 + Duration::from_secs(i)), Ok(()));
            limiter.fail_at("addr:10.0.0.1", t0 + Duration::from_secs(i));
        }
        assert_eq!(limiter.check_at("addr:10.0.0.1", t0 + Duration::from_secs(5)), Err(Duration::from_secs(55)));
        assert_eq!(limiter.check_at("addr:10.0.0.2", t0 + Duration::from_secs(5)), Ok(()), "per key");
        assert_eq!(
            limiter.check_at("addr:10.0.0.1", t0 + Duration::from_millis(59_500)),
            Err(Duration::from_secs(1)),
            "rounded up"
        );
        assert_eq!(limiter.check_at("addr:10.0.0.1", t0 + Duration::from_secs(60)), Ok(()));
    }

    #[test]
    fn memory_stays_bounded_under_many_addresses() {
        let mut limiter = Limiter::new(SignInLimit::default());
        limiter.max_keys = 100;
        let t0 = Instant::now();
        for i in 0..10_000u32 {
            limiter.fail_at(&format!("addr:{i}"), t0 + Duration::from_millis(u64::from(i)));
        }
        assert!(limiter.failures.lock().unwrap().len() <= 100);
        for _ in 0..50 {
            limiter.fail_at("account:alice", t0);
        }
        assert_eq!(limiter.failures.lock().unwrap()["account:alice"].len(), 5);
    }

    #[test]
    fn a_warning_anyone_can_cause_is_logged_once_in_ten_seconds() {
        let quiet = Quiet::new();
        assert_eq!(quiet.allow(), Some(0));
        for _ in 0..1000 {
            assert_eq!(quiet.allow(), None);
        }
        quiet.last.store(0, Ordering::Relaxed);
        assert_eq!(quiet.allow(), Some(1000), "the next line counts what was left out");
    }

    #[test]
    fn an_ipv6_client_is_limited_by_its_64() {
        let a: IpAddr = "2001:db8:1:2::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:ffff::9".parse().unwrap();
        assert_eq!(address_key(Some(a)), address_key(Some(b)));
        assert_eq!(address_key(Some("::ffff:10.1.2.3".parse().unwrap())), "addr:10.1.2.3");
    }
}
