//! The key a store handle's takers are announced their handed runs with. Any role that may
//! connect to the database may `NOTIFY` on any channel, so a carried answer is taken only
//! when it is sealed with HMAC-SHA256 under a key only the handle and the `takers` table hold
//! (the pipeline's roles read it; nothing else does): a forged or altered announcement is
//! read as one that carried nothing (the taker reads its handed runs, as for `h:`).
//!
//! The table holds the key's two padded blocks (RFC 2104's K XOR ipad and K XOR opad), so
//! `autocomp_announce_handed` computes the HMAC with the server's `sha256` alone (no
//! pgcrypto): `sha256(outer || sha256(inner || message))`.

use hmac::{Hmac, KeyInit as _, Mac as _};
use sha2::Sha256;

/// SHA-256's block: an HMAC key is padded to it.
const BLOCK: usize = 64;

/// A handle's key: 32 random bytes, new with every handle, never sent but in its offers.
pub(super) struct AnnouncementKey([u8; 32]);

impl AnnouncementKey {
    /// A fresh key from the operating system's random source.
    pub(super) fn random() -> Self {
        let mut key = [0u8; 32];
        getrandom::fill(&mut key).expect("the operating system's random source answers");
        Self(key)
    }

    /// What an offer writes into `takers.announcement_key`: K XOR ipad, then K XOR opad.
    pub(super) fn padded_blocks(&self) -> Vec<u8> {
        let mut padded = [0u8; BLOCK];
        padded[..self.0.len()].copy_from_slice(&self.0);
        let inner = padded.iter().map(|byte| byte ^ 0x36);
        let outer = padded.iter().map(|byte| byte ^ 0x5c);
        inner.chain(outer).collect()
    }

    /// Whether `seal` (hex) is this key's HMAC of the announcement's message, the
    /// concatenation of `parts` (`<component> <liveness> <answer>`, as
    /// `autocomp_announce_handed` seals it); compared in constant time.
    pub(super) fn sealed(&self, parts: &[&str], seal: &str) -> bool {
        let Ok(seal) = hex::decode(seal) else { return false };
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes a key of any length");
        for part in parts {
            mac.update(part.as_bytes());
        }
        mac.verify_slice(&seal).is_ok()
    }

    #[cfg(test)]
    fn seal(&self, message: &str) -> String {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes a key of any length");
        mac.update(message.as_bytes());
        hex::encode(mac.finalize().into_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::Digest as _;

    /// The server's construction over the padded blocks is HMAC-SHA256 as the crate computes
    /// it, so what `autocomp_announce_handed` seals the taker verifies.
    #[test]
    fn the_padded_blocks_give_the_hmac_the_taker_verifies() {
        let key = AnnouncementKey::random();
        let message = "Ingest local:h:1:abc [[\"B1\"]]";
        let blocks = key.padded_blocks();
        let (inner, outer) = blocks.split_at(BLOCK);
        let inner_hash = Sha256::new().chain_update(inner).chain_update(message).finalize();
        let server = hex::encode(Sha256::new().chain_update(outer).chain_update(inner_hash).finalize());
        assert_eq!(server, key.seal(message));
        assert!(key.sealed(&["Ingest", " ", "local:h:1:abc", " ", "[[\"B1\"]]"], &server));
        assert!(!key.sealed(&["Ingest local:h:1:abc [[\"B2\"]]"], &server), "another message");
        assert!(!AnnouncementKey::random().sealed(&[message], &server), "another handle's key");
        assert!(!key.sealed(&[message], "not hex"));
        assert!(!key.sealed(&[message], &server[..62]), "a shortened seal");
    }
}
