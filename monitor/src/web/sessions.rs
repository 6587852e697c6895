//! Server-side sign-in sessions: a random 256-bit id (from the OS) in the browser's cookie,
//! the account behind it in memory with an idle and an absolute expiry, and a bounded count.
//! Signing out deletes the session here, so a copied cookie dies with it; a restart of the
//! monitor signs everyone out. The cookie that carries the id, and reading a cookie, are
//! here too.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use argon2::password_hash::rand_core::{OsRng, RngCore};
use axum::http::{HeaderMap, header};
use sha2::{Digest, Sha256};

/// How long sessions live and how many there may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionLimits {
    /// A session unused this long is gone.
    pub idle: Duration,
    /// A session this old is gone, however busy.
    pub absolute: Duration,
    /// At most this many at once; a new one beyond it ends the longest unused.
    pub max: usize,
}

impl Default for SessionLimits {
    fn default() -> Self {
        SessionLimits { idle: Duration::from_secs(30 * 60), absolute: Duration::from_secs(12 * 3600), max: 10_000 }
    }
}

/// Who a session is, as of its sign-in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    pub account: String,
    /// The account's hash when it signed in: a changed password ends the session.
    pub credential: String,
}

struct Session {
    holder: Holder,
    created: Instant,
    seen: Instant,
}

/// The sessions, keyed by a digest of their id (what the map holds is not a cookie).
pub struct Sessions {
    limits: SessionLimits,
    map: Mutex<HashMap<[u8; 32], Session>>,
}

fn key(id: &str) -> [u8; 32] {
    Sha256::digest(id.as_bytes()).into()
}

impl Sessions {
    pub fn new(limits: SessionLimits) -> Sessions {
        Sessions { limits, map: Mutex::new(HashMap::new()) }
    }

    pub fn limits(&self) -> SessionLimits {
        self.limits
    }

    /// Opens a session for `holder`; the id for the cookie (64 hex digits).
    pub fn create(&self, holder: Holder) -> String {
        self.create_at(holder, Instant::now())
    }

    fn create_at(&self, holder: Holder, now: Instant) -> String {
        let mut random = [0u8; 32];
        OsRng.fill_bytes(&mut random);
        let id = hex::encode(random);
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        if map.len() >= self.limits.max {
            map.retain(|_, s| self.alive(s, now));
        }
        if map.len() >= self.limits.max
            && let Some(stalest) = map.iter().min_by_key(|(_, s)| s.seen).map(|(k, _)| *k)
        {
            map.remove(&stalest);
        }
        map.insert(key(&id), Session { holder, created: now, seen: now });
        id
    }

    fn alive(&self, session: &Session, now: Instant) -> bool {
        now.saturating_duration_since(session.seen) < self.limits.idle
            && now.saturating_duration_since(session.created) < self.limits.absolute
    }

    /// The holder of a live session, which this use keeps alive; `None` for an id never
    /// issued, signed out, or expired (and then forgotten).
    pub fn get(&self, id: &str) -> Option<Holder> {
        self.get_at(id, Instant::now())
    }

    fn get_at(&self, id: &str, now: Instant) -> Option<Holder> {
        // Ours are 64 hex digits; anything else is not worth hashing.
        if id.len() != 64 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        let key = key(id);
        let session = map.get_mut(&key)?;
        if !self.alive(session, now) {
            map.remove(&key);
            return None;
        }
        session.seen = now;
        Some(session.holder.clone())
    }

    /// Ends a session (signing out); unknown ids are ignored.
    pub fn remove(&self, id: &str) {
        self.map.lock().unwrap_or_else(|e| e.into_inner()).remove(&key(id));
    }

    /// Live sessions (expired ones still held are not counted).
    pub fn len(&self) -> usize {
        let now = Instant::now();
        self.map.lock().unwrap_or_else(|e| e.into_inner()).values().filter(|s| self.alive(s, now)).count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The cookie that carries a session id.
pub const SESSION_COOKIE: &str = "autocomp_session";

/// A cookie's raw value from the request.
pub fn cookie<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holder(name: &str) -> Holder {
        Holder { account: name.into(), credential: "h".into() }
    }

    #[test]
    fn sessions_end_when_idle_too_long_when_too_old_and_when_signed_out() {
        let limits = SessionLimits { idle: Duration::from_secs(60), absolute: Duration::from_secs(300), max: 10 };
        let sessions = Sessions::new(limits);
        let t0 = Instant::now();
        let id = sessions.create_at(holder("alice"), t0);
        assert_eq!(id.len(), 64);
        assert_eq!(sessions.get_at(&id, t0 + Duration::from_secs(59)), Some(holder("alice")));
        // Used at 59 s, so alive at 118 s; the idle clock restarts with each use.
        assert!(sessions.get_at(&id, t0 + Duration::from_secs(118)).is_some());
        assert_eq!(sessions.get_at(&id, t0 + Duration::from_secs(179)), None, "idle 61 s");
        assert_eq!(sessions.get_at(&id, t0 + Duration::from_secs(100)), None, "forgotten once expired");

        let busy = sessions.create_at(holder("bob"), t0);
        for minute in 1..5 {
            assert!(sessions.get_at(&busy, t0 + Duration::from_secs(minute * 59)).is_some());
        }
        assert_eq!(sessions.get_at(&busy, t0 + Duration::from_secs(300)), None, "absolute limit");

        let out = sessions.create_at(holder("carol"), t0);
        sessions.remove(&out);
        assert_eq!(sessions.get_at(&out, t0), None);
        for forged in ["", "0", &"0".repeat(64), &"zz".repeat(32), &format!("{out}0")] {
            assert_eq!(sessions.get_at(forged, t0), None, "{forged:?}");
        }
    }

    #[test]
    fn the_count_is_bounded_by_ending_the_longest_unused() {
        let limits = SessionLimits { max: 3, ..SessionLimits::default() };
        let sessions = Sessions::new(limits);
        let t0 = Instant::now();
        let ids: Vec<String> =
            (0..3).map(|i| sessions.create_at(holder(&format!("u{i}")), t0 + Duration::from_secs(i))).collect();
        assert!(sessions.get_at(&ids[0], t0 + Duration::from_secs(5)).is_some());
        let fourth = sessions.create_at(holder("u3"), t0 + Duration::from_secs(6));
        assert_eq!(sessions.map.lock().unwrap().len(), 3);
        assert!(sessions.get_at(&ids[1], t0 + Duration::from_secs(7)).is_none(), "the stalest went");
        for id in [&ids[0], &ids[2], &fourth] {
            assert!(sessions.get_at(id, t0 + Duration::from_secs(7)).is_some());
        }
    }
}
