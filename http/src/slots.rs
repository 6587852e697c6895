//! Who holds a service's connection slots, and who gives one up when they run short.
//!
//! A client is a `Peer`: one IPv4 address, one IPv6 /64 (what one host usually holds), and
//! all of loopback (127/8 and ::1: every local user has all of it) as one. Each peer holds
//! at most `--max-connections-per-ip` slots, all peers `--max-connections`, and connections
//! that have not presented a valid token or session at most three quarters of those: the
//! rest is kept for clients that have.
//!
//! When a newcomer finds no free slot, the connection that has been *evictable* longest is
//! closed for it (the newcomer's own peer's first, when it is the peer that is full). A
//! connection is evictable while it has sent no whole request head yet, while it waits for a
//! request's body, and while it sits idle between requests; it is not while a request is
//! being answered, nor ever once it has presented a valid token or session (the router says
//! so with `mark_authenticated`). A crowd of slow heads therefore only ever evicts itself,
//! and a client that sends its request at once is served. Only when every slot is in use
//! by a request being answered or by an authenticated client is a newcomer closed at once.
//!
//! Each accept costs O(log n) under one mutex; memory is bounded by the caps.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

/// A client as the caps count it: an IPv4 address, an IPv6 /64, or this host (loopback).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Peer {
    /// 127/8 and ::1: every local user can use any of it.
    Loopback,
    V4(Ipv4Addr),
    /// The first 64 bits of an IPv6 address.
    V6(u64),
}

impl Peer {
    /// The peer `ip` belongs to (an IPv4-mapped IPv6 address is its IPv4 address).
    pub fn of(ip: IpAddr) -> Peer {
        match ip.to_canonical() {
            ip if ip.is_loopback() => Peer::Loopback,
            IpAddr::V4(v4) => Peer::V4(v4),
            IpAddr::V6(v6) => Peer::V6((v6.to_bits() >> 64) as u64),
        }
    }
}

impl std::fmt::Display for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Peer::Loopback => f.write_str("loopback"),
            Peer::V4(v4) => write!(f, "{v4}"),
            Peer::V6(prefix) => {
                let s = [prefix >> 48, prefix >> 32, prefix >> 16, *prefix].map(|part| part as u16);
                write!(f, "{:x}:{:x}:{:x}:{:x}::/64", s[0], s[1], s[2], s[3])
            }
        }
    }
}

/// Why a newcomer was closed at once, or which cap made room for it by evicting another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cap {
    PerPeer,
    Total,
}

impl Cap {
    pub(crate) fn flag(self) -> &'static str {
        match self {
            Cap::PerPeer => "--max-connections-per-ip",
            Cap::Total => "--max-connections",
        }
    }
}

/// What `Slots::take` did besides admitting, for the log.
#[derive(Debug, Default)]
pub(crate) struct Taken {
    /// Connections closed to make room, and the cap that was full.
    pub evicted: Vec<(Peer, Cap)>,
}

/// The slots of one listener.
pub(crate) struct Slots {
    max_total: u32,
    max_per_peer: u32,
    max_unauthenticated: u32,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    total: u32,
    unauthenticated: u32,
    peers: HashMap<Peer, PeerSlots>,
    connections: HashMap<u64, Held>,
    /// Evictable connections by when they became so (oldest first): `since` -> id.
    evictable: BTreeMap<u64, u64>,
    /// Ids and `since` stamps, from one counter.
    next: u64,
}

#[derive(Default)]
struct PeerSlots {
    held: u32,
    /// `since` stamps of this peer's evictable connections.
    evictable: BTreeSet<u64>,
}

struct Held {
    peer: Peer,
    authenticated: bool,
    /// Set while evictable.
    since: Option<u64>,
    close: Arc<Notify>,
}

impl Slots {
    pub(crate) fn new(max_total: u32, max_per_peer: u32) -> Self {
        // A quarter kept for authenticated clients, when there is room for one at all.
        let max_unauthenticated = if max_total >= 4 { max_total - max_total / 4 } else { max_total };
        Self { max_total, max_per_peer, max_unauthenticated, inner: Mutex::default() }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A slot for a newcomer from `ip`, evicting what must go for it; `Err(cap)` when
    /// nothing can (the newcomer is then closed at once).
    pub(crate) fn take(self: &Arc<Self>, ip: IpAddr) -> Result<(Slot, Taken), Cap> {
        let peer = Peer::of(ip);
        let mut inner = self.lock();
        let mut taken = Taken::default();
        let from_peer = inner.peers.get(&peer).map_or(0, |p| p.held);
        if from_peer >= self.max_per_peer {
            let oldest = inner.peers.get(&peer).and_then(|p| p.evictable.first().copied());
            let victim = oldest.and_then(|since| inner.evictable.get(&since).copied()).ok_or(Cap::PerPeer)?;
            taken.evicted.push((inner.evict(victim), Cap::PerPeer));
        }
        if inner.total >= self.max_total || inner.unauthenticated >= self.max_unauthenticated {
            let victim = inner.evictable.first_key_value().map(|(_, id)| *id).ok_or(Cap::Total)?;
            taken.evicted.push((inner.evict(victim), Cap::Total));
        }
        let id = inner.stamp();
        let since = inner.stamp();
        let close = Arc::new(Notify::new());
        inner.total += 1;
        inner.unauthenticated += 1;
        let slots = inner.peers.entry(peer).or_default();
        slots.held += 1;
        slots.evictable.insert(since);
        inner.evictable.insert(since, id);
        inner
            .connections
            .insert(id, Held { peer, authenticated: false, since: Some(since), close: Arc::clone(&close) });
        Ok((Slot { slots: Arc::clone(self), id, close }, taken))
    }

    /// A request's body has arrived (or it has none): it is being answered.
    pub(crate) fn busy(&self, id: u64) {
        let mut inner = self.lock();
        inner.unmark(id);
    }

    /// The connection waits for its next request.
    pub(crate) fn idle(&self, id: u64) {
        let mut inner = self.lock();
        let since = inner.stamp();
        let Some(held) = inner.connections.get_mut(&id) else { return };
        if held.authenticated || held.since.is_some() {
            return;
        }
        held.since = Some(since);
        let peer = held.peer;
        inner.evictable.insert(since, id);
        inner.peers.entry(peer).or_default().evictable.insert(since);
    }

    /// The connection presented a valid token or session: it is never evicted.
    pub(crate) fn authenticate(&self, id: u64) {
        let mut inner = self.lock();
        inner.unmark(id);
        if let Some(held) = inner.connections.get_mut(&id)
            && !held.authenticated
        {
            held.authenticated = true;
            inner.unauthenticated -= 1;
        }
    }

    /// Connections held: (in total, not authenticated, evictable); for tests.
    #[cfg(test)]
    fn counts(&self) -> (u32, u32, usize) {
        let inner = self.lock();
        (inner.total, inner.unauthenticated, inner.evictable.len())
    }
}

impl Inner {
    fn stamp(&mut self) -> u64 {
        self.next += 1;
        self.next
    }

    /// No longer evictable.
    fn unmark(&mut self, id: u64) {
        let Some(held) = self.connections.get_mut(&id) else { return };
        let Some(since) = held.since.take() else { return };
        let peer = held.peer;
        self.evictable.remove(&since);
        if let Some(slots) = self.peers.get_mut(&peer) {
            slots.evictable.remove(&since);
        }
    }

    /// Gives up `id`'s slot and tells its connection to close.
    fn evict(&mut self, id: u64) -> Peer {
        let held = self.release(id).expect("an evictable connection is held");
        held.close.notify_one();
        held.peer
    }

    /// Forgets `id` and frees its slot (nothing if it was evicted already).
    fn release(&mut self, id: u64) -> Option<Held> {
        self.unmark(id);
        let held = self.connections.remove(&id)?;
        self.total -= 1;
        if !held.authenticated {
            self.unauthenticated -= 1;
        }
        if let Some(slots) = self.peers.get_mut(&held.peer) {
            slots.held -= 1;
            if slots.held == 0 {
                self.peers.remove(&held.peer);
            }
        }
        Some(held)
    }
}

/// One connection's slot, freed when dropped.
pub(crate) struct Slot {
    slots: Arc<Slots>,
    id: u64,
    close: Arc<Notify>,
}

impl Slot {
    /// What the router and the connection loop tell the slots about this connection.
    pub(crate) fn handle(&self) -> ConnectionHandle {
        ConnectionHandle { slots: Arc::clone(&self.slots), id: self.id }
    }

    /// Completes when the slot was given to a newcomer: the connection must close.
    pub(crate) async fn evicted(&self) {
        self.close.notified().await;
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.slots.lock().release(self.id);
    }
}

/// A connection's handle on its slot, in each of its requests' extensions.
#[derive(Clone)]
pub struct ConnectionHandle {
    slots: Arc<Slots>,
    id: u64,
}

impl ConnectionHandle {
    pub(crate) fn busy(&self) {
        self.slots.busy(self.id);
    }

    pub(crate) fn idle(&self) {
        self.slots.idle(self.id);
    }
}

/// Tells the connection loop that the request in `extensions` presented a valid token or
/// session: its connection keeps its slot when a crowd comes (nothing for a request that
/// did not come through the loop, e.g. a router called in a test).
pub fn mark_authenticated(extensions: &axum::http::Extensions) {
    if let Some(handle) = extensions.get::<ConnectionHandle>() {
        handle.slots.authenticate(handle.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn loopback_is_one_peer_and_ipv6_counts_by_its_64() {
        for local in ["127.0.0.1", "127.0.0.2", "127.255.0.11", "::1", "::ffff:127.0.0.9"] {
            assert_eq!(Peer::of(ip(local)), Peer::Loopback, "{local}");
        }
        assert_eq!(Peer::of(ip("2001:db8:1:2::1")), Peer::of(ip("2001:db8:1:2:ffff::9")));
        assert_ne!(Peer::of(ip("2001:db8:1:2::1")), Peer::of(ip("2001:db8:1:3::1")));
        assert_eq!(Peer::of(ip("::ffff:10.1.2.3")), Peer::V4(Ipv4Addr::new(10, 1, 2, 3)));
        assert_eq!(Peer::of(ip("2001:db8:1:2::1")).to_string(), "2001:db8:1:2::/64");
        assert_eq!(Peer::of(ip("10.1.2.3")).to_string(), "10.1.2.3");
    }

    #[test]
    fn a_full_peer_evicts_its_own_oldest_evictable_and_never_a_busy_or_authenticated_one() {
        let slots = Arc::new(Slots::new(100, 3));
        let (a, _) = slots.take(ip("127.0.0.2")).unwrap();
        let (b, _) = slots.take(ip("127.0.0.3")).unwrap();
        let (c, _) = slots.take(ip("127.0.0.4")).unwrap();
        slots.busy(a.id);
        slots.authenticate(b.id);
        // `c` is the only evictable one of the peer.
        let (d, taken) = slots.take(ip("127.0.0.5")).unwrap();
        assert_eq!(taken.evicted, vec![(Peer::Loopback, Cap::PerPeer)]);
        assert_eq!(slots.counts(), (3, 2, 1));
        drop(c); // its task ends after the eviction: nothing freed twice
        assert_eq!(slots.counts(), (3, 2, 1));
        slots.busy(d.id);
        assert_eq!(slots.take(ip("127.0.0.6")).err(), Some(Cap::PerPeer), "nothing evictable left");
        // Another peer is not counted with loopback.
        assert!(slots.take(ip("10.0.0.1")).is_ok());
        // Idle again after its request: evictable, and the newest of the peer.
        slots.idle(a.id);
        slots.idle(d.id);
        let (_e, taken) = slots.take(ip("127.0.0.7")).unwrap();
        assert_eq!(taken.evicted.len(), 1);
        assert!(slots.lock().connections.contains_key(&d.id), "the oldest idle (a) went first");
        assert!(!slots.lock().connections.contains_key(&a.id));
    }

    #[test]
    fn a_quarter_is_kept_for_authenticated_connections() {
        let slots = Arc::new(Slots::new(8, 8));
        let held: Vec<_> = (0..6).map(|i| slots.take(ip(&format!("10.0.0.{i}"))).unwrap().0).collect();
        for slot in &held {
            slots.busy(slot.id);
        }
        assert_eq!(slots.take(ip("10.0.1.1")).err(), Some(Cap::Total), "6 of 8 unauthenticated, all busy");
        slots.authenticate(held[0].id);
        let (_seventh, _) = slots.take(ip("10.0.1.1")).unwrap();
        drop(held);
        assert_eq!(slots.counts(), (1, 1, 1));
    }
}
