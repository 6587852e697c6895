//! Checksum algorithms: their BagIt names, recognising a plain manifest's algorithm by digest
//! length, and `Hashers`, which feeds one read of a file to every algorithm it needs through a
//! fixed buffer (constant memory however large the file).

use std::fs::File;
use std::io::Read;

use md5::Digest;
use serde::Deserialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize)]
#[serde(try_from = "String")]
pub enum Algorithm {
    Md5,
    Sha1,
    Sha224,
    Sha256,
    Sha384,
    Sha512,
}

/// Algorithms bagit-python accepts in manifest names (Python's `hashlib.algorithms_guaranteed`)
/// that this tool cannot compute: such manifests are read for completeness and reported as
/// unsupported rather than silently ignored.
pub const RECOGNISED_UNSUPPORTED: &[&str] =
    &["sha3_224", "sha3_256", "sha3_384", "sha3_512", "blake2b", "blake2s", "shake_128", "shake_256"];

impl Algorithm {
    pub const ALL: [Algorithm; 6] =
        [Algorithm::Md5, Algorithm::Sha1, Algorithm::Sha224, Algorithm::Sha256, Algorithm::Sha384, Algorithm::Sha512];

    /// The name in `manifest-<name>.txt`.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Md5 => "md5",
            Algorithm::Sha1 => "sha1",
            Algorithm::Sha224 => "sha224",
            Algorithm::Sha256 => "sha256",
            Algorithm::Sha384 => "sha384",
            Algorithm::Sha512 => "sha512",
        }
    }

    pub fn from_name(name: &str) -> Option<Algorithm> {
        Algorithm::ALL.into_iter().find(|a| a.name() == name)
    }

    /// Hex digits in a digest.
    pub fn hex_len(self) -> usize {
        match self {
            Algorithm::Md5 => 32,
            Algorithm::Sha1 => 40,
            Algorithm::Sha224 => 56,
            Algorithm::Sha256 => 64,
            Algorithm::Sha384 => 96,
            Algorithm::Sha512 => 128,
        }
    }

    /// The algorithm whose digests have this many hex digits (each length is unique).
    pub fn from_hex_len(len: usize) -> Option<Algorithm> {
        Algorithm::ALL.into_iter().find(|a| a.hex_len() == len)
    }
}

impl std::fmt::Display for Algorithm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl TryFrom<String> for Algorithm {
    type Error = String;

    fn try_from(name: String) -> Result<Self, Self::Error> {
        let lower = name.to_ascii_lowercase().replace('-', "");
        Algorithm::from_name(&lower).ok_or_else(|| {
            let known: Vec<&str> = Algorithm::ALL.iter().map(|a| a.name()).collect();
            format!("unknown checksum algorithm {name:?}; known: {}", known.join(", "))
        })
    }
}

enum State {
    Md5(md5::Md5),
    Sha1(sha1::Sha1),
    Sha224(sha2::Sha224),
    Sha256(sha2::Sha256),
    Sha384(sha2::Sha384),
    Sha512(sha2::Sha512),
}

impl State {
    fn new(algorithm: Algorithm) -> Self {
        match algorithm {
            Algorithm::Md5 => State::Md5(md5::Md5::new()),
            Algorithm::Sha1 => State::Sha1(sha1::Sha1::new()),
            Algorithm::Sha224 => State::Sha224(sha2::Sha224::new()),
            Algorithm::Sha256 => State::Sha256(sha2::Sha256::new()),
            Algorithm::Sha384 => State::Sha384(sha2::Sha384::new()),
            Algorithm::Sha512 => State::Sha512(sha2::Sha512::new()),
        }
    }

    fn update(&mut self, data: &[u8]) {
        match self {
            State::Md5(h) => h.update(data),
            State::Sha1(h) => h.update(data),
            State::Sha224(h) => h.update(data),
            State::Sha256(h) => h.update(data),
            State::Sha384(h) => h.update(data),
            State::Sha512(h) => h.update(data),
        }
    }

    fn finish(self) -> String {
        match self {
            State::Md5(h) => hex::encode(h.finalize()),
            State::Sha1(h) => hex::encode(h.finalize()),
            State::Sha224(h) => hex::encode(h.finalize()),
            State::Sha256(h) => hex::encode(h.finalize()),
            State::Sha384(h) => hex::encode(h.finalize()),
            State::Sha512(h) => hex::encode(h.finalize()),
        }
    }
}

/// Read size per step; one buffer is reused for every file of a check.
pub const BUFFER_SIZE: usize = 1 << 20;

/// How often (in bytes read) a long file checks for cancellation.
const CANCEL_CHECK_BYTES: u64 = 64 << 20;

/// The digests of one file, lowercase hex, with the bytes read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Digests {
    pub bytes: u64,
    pub hex: Vec<(Algorithm, String)>,
}

impl Digests {
    pub fn get(&self, algorithm: Algorithm) -> Option<&str> {
        self.hex.iter().find(|(a, _)| *a == algorithm).map(|(_, h)| h.as_str())
    }
}

/// Reads `file` once through `buffer`, feeding every algorithm; `None` if `cancelled` said stop.
pub fn hash_file(
    file: &mut File,
    algorithms: &[Algorithm],
    buffer: &mut [u8],
    cancelled: &dyn Fn() -> bool,
) -> std::io::Result<Option<Digests>> {
    let mut states: Vec<(Algorithm, State)> = algorithms.iter().map(|&a| (a, State::new(a))).collect();
    let mut bytes = 0u64;
    let mut next_check = CANCEL_CHECK_BYTES;
    loop {
        let n = match file.read(buffer) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        for (_, state) in &mut states {
            state.update(&buffer[..n]);
        }
        bytes += n as u64;
        if bytes >= next_check {
            if cancelled() {
                return Ok(None);
            }
            next_check += CANCEL_CHECK_BYTES;
        }
    }
    Ok(Some(Digests { bytes, hex: states.into_iter().map(|(a, s)| (a, s.finish())).collect() }))
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    #[test]
    fn one_read_gives_every_digest() {
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(b"hello\n").unwrap();
        std::io::Seek::rewind(&mut file).unwrap();
        let mut buffer = vec![0; 4]; // smaller than the file: several reads
        let digests = hash_file(&mut file, &Algorithm::ALL, &mut buffer, &|| false).unwrap().unwrap();
        assert_eq!(digests.bytes, 6);
        assert_eq!(digests.get(Algorithm::Md5), Some("b1946ac92492d2347c6235b4d2611184"));
        assert_eq!(digests.get(Algorithm::Sha1), Some("f572d396fae9206628714fb2ce00f72e94f2258f"));
        assert_eq!(
            digests.get(Algorithm::Sha256),
            Some("5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03")
        );
        for algorithm in Algorithm::ALL {
            assert_eq!(digests.get(algorithm).unwrap().len(), algorithm.hex_len(), "{algorithm}");
        }
    }

    #[test]
    fn names_and_lengths_identify_algorithms() {
        assert_eq!(Algorithm::from_hex_len(32), Some(Algorithm::Md5));
        assert_eq!(Algorithm::from_hex_len(128), Some(Algorithm::Sha512));
        assert_eq!(Algorithm::from_hex_len(33), None);
        assert_eq!(Algorithm::try_from("SHA-256".to_owned()), Ok(Algorithm::Sha256));
        let err = Algorithm::try_from("crc32".to_owned()).unwrap_err();
        assert!(err.contains("crc32") && err.contains("sha512"), "{err}");
    }
}
