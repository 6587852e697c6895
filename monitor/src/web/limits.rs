//! The sign-in rate limit, which slows a guesser down without locking anyone else out:
//! failed sign-ins are counted per client address and per (account, address) in a sliding
//! window. An address past its limit is answered 429 with Retry-After before any password
//! is hashed, whatever name it tries; an account's failures from one address make that
//! address's next tries at that name wait longer each time (`pair_delay`), and nothing is
//! counted per account alone, so nobody's guesses delay or refuse the right password from
//! an address with no failures of its own. Memory is bounded: a fixed number of keys, each
//! holding at most its limit's worth of timestamps. Warnings any client can cause go through
//! `autocomp_http::quiet` (one line per client every 10 s, with the count).

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How many failed sign-ins an address may have in a window.
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

/// Failures per key (`addr:...`, or `pair:<address>:<account name>`).
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

fn pair_key(address: &str, name: &str) -> String {
    format!("pair:{address}:{name}")
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

    /// How long a try at `name` from `address` waits first: nothing after no failure of
    /// that pair in the window, then `window / 60` (1 s for a minute), doubling with each
    /// further failure, at most a quarter of the window. Known and unknown names alike.
    pub fn pair_delay(&self, address: &str, name: &str) -> Duration {
        self.pair_delay_at(&pair_key(address, name), Instant::now())
    }

    fn pair_delay_at(&self, key: &str, now: Instant) -> Duration {
        let mut map = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        let Some(times) = map.get_mut(key) else { return Duration::ZERO };
        while times.front().is_some_and(|t| now.saturating_duration_since(*t) >= self.limit.window) {
            times.pop_front();
        }
        let failures = times.len() as u32;
        if failures == 0 {
            map.remove(key);
            return Duration::ZERO;
        }
        let base = self.limit.window / 60;
        base.saturating_mul(1 << (failures - 1).min(20)).min(self.limit.window / 4)
    }

    /// Counts a failed sign-in at `name` from `address`.
    pub fn fail_pair(&self, address: &str, name: &str) {
        self.fail(address);
        self.fail(&pair_key(address, name));
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
    fn a_pairs_failures_slow_its_next_tries_down_and_no_one_elses() {
        let limiter = Limiter::new(SignInLimit::default());
        let t0 = Instant::now();
        let pair = pair_key("addr:10.0.0.1", "admin");
        assert_eq!(limiter.pair_delay_at(&pair, t0), Duration::ZERO);
        let mut delays = Vec::new();
        for i in 0..5 {
            limiter.fail_at(&pair, t0 + Duration::from_secs(i));
            delays.push(limiter.pair_delay_at(&pair, t0 + Duration::from_secs(i)).as_secs());
        }
        assert_eq!(delays, [1, 2, 4, 8, 15], "doubling, at most a quarter of the window");
        let other = pair_key("addr:10.0.0.2", "admin");
        assert_eq!(limiter.pair_delay_at(&other, t0 + Duration::from_secs(5)), Duration::ZERO);
        assert_eq!(limiter.pair_delay_at(&pair, t0 + Duration::from_secs(64)), Duration::ZERO, "all left the window");
    }

    #[test]
    fn an_ipv6_client_is_limited_by_its_64() {
        let a: IpAddr = "2001:db8:1:2::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:ffff::9".parse().unwrap();
        assert_eq!(address_key(Some(a)), address_key(Some(b)));
        assert_eq!(address_key(Some("::ffff:10.1.2.3".parse().unwrap())), "addr:10.1.2.3");
    }
}
