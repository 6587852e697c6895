//! BagIt's path rules: the percent-encoding of manifest paths (RFC 8493 §2.1.3), lexical
//! normalization that refuses absolute paths and `..` escapes, and the Unicode normalization
//! bagit-python compares names under.

use std::borrow::Cow;

use serde::Deserialize;
use unicode_normalization::UnicodeNormalization;

/// Decodes a manifest path as RFC 8493 writes it: `%0A`, `%0D` and `%25` (hex digits in either
/// case) become LF, CR and `%`; any other `%` sequence is left as it is.
pub fn percent_decode(path: &str) -> Cow<'_, str> {
    if !path.contains('%') {
        return Cow::Borrowed(path);
    }
    let mut out = String::with_capacity(path.len());
    let mut rest = path;
    while let Some(at) = rest.find('%') {
        out.push_str(&rest[..at]);
        let code = rest.get(at + 1..at + 3).map(str::to_ascii_uppercase);
        let decoded = match code.as_deref() {
            Some("0A") => Some('\n'),
            Some("0D") => Some('\r'),
            Some("25") => Some('%'),
            _ => None,
        };
        match decoded {
            Some(c) => {
                out.push(c);
                rest = &rest[at + 3..];
            }
            None => {
                out.push('%');
                rest = &rest[at + 1..];
            }
        }
    }
    out.push_str(rest);
    Cow::Owned(out)
}

/// Encodes a path for a manifest line: the inverse of `percent_decode`.
pub fn percent_encode(path: &str) -> String {
    path.replace('%', "%25").replace('\n', "%0A").replace('\r', "%0D")
}

/// The path as bagit-python reads it: it writes `%` unencoded and decodes only `%0D` and
/// `%0A` (upper case). Bags it made with a `%` in a name are resolved through this when the
/// RFC reading names no file.
pub fn bagit_python_decode(path: &str) -> Cow<'_, str> {
    if path.contains("%0D") || path.contains("%0A") {
        Cow::Owned(path.replace("%0D", "\r").replace("%0A", "\n"))
    } else {
        Cow::Borrowed(path)
    }
}

/// Why a path cannot be used inside a bag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UnsafePath {
    Absolute,
    Escapes,
    Empty,
}

impl std::fmt::Display for UnsafePath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            UnsafePath::Absolute => "is absolute",
            UnsafePath::Escapes => "leaves the bag through `..`",
            UnsafePath::Empty => "names no file",
        })
    }
}

/// Normalizes a `/`-separated relative path the way `os.path.normpath` does (empty and `.`
/// components dropped, `x/..` folded away) and refuses what would leave the root.
pub fn normalize_relative(path: &str) -> Result<String, UnsafePath> {
    if path.starts_with('/') {
        return Err(UnsafePath::Absolute);
    }
    let mut parts: Vec<&str> = Vec::new();
    for component in path.split('/') {
        match component {
            "" | "." => {}
            ".." => {
                if parts.pop().is_none() {
                    return Err(UnsafePath::Escapes);
                }
            }
            other => parts.push(other),
        }
    }
    if parts.is_empty() {
        return Err(UnsafePath::Empty);
    }
    Ok(parts.join("/"))
}

/// The form names are compared in, so NFC and NFD spellings of one name are the same file
/// (as bagit-python does; macOS volumes hand out NFD names).
pub fn comparable(path: &str) -> String {
    path.nfc().collect()
}

/// A relative path inside the batch given in configuration (e.g. the plain manifest's name);
/// refused at load time if absolute or escaping.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub struct RelativePath(String);

impl RelativePath {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for RelativePath {
    type Error = String;

    fn try_from(text: String) -> Result<Self, Self::Error> {
        normalize_relative(&text).map(RelativePath).map_err(|why| format!("path {text:?} {why}"))
    }
}

impl std::fmt::Display for RelativePath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_decoding_follows_rfc_8493() {
        assert_eq!(percent_decode("data/plain name.txt"), "data/plain name.txt");
        assert_eq!(percent_decode("data/line%0Abreak"), "data/line\nbreak");
        assert_eq!(percent_decode("data/cr%0dlf%0a"), "data/cr\rlf\n");
        assert_eq!(percent_decode("data/100%25.txt"), "data/100%.txt");
        // `%2525` is a literal `%25`: decoding happens once, left to right.
        assert_eq!(percent_decode("data/%2525"), "data/%25");
        // Only the three codes are special; anything else is left alone.
        assert_eq!(percent_decode("data/%20%41%"), "data/%20%41%");
        assert_eq!(percent_decode("data/a%2"), "data/a%2");
    }

    #[test]
    fn encoding_round_trips() {
        for name in ["data/a b", "data/50%", "data/x\ny\rz", "data/%0A literally", "data/%"] {
            assert_eq!(percent_decode(&percent_encode(name)), name, "{name:?}");
        }
        assert_eq!(percent_encode("data/50%\n"), "data/50%25%0A");
    }

    #[test]
    fn bagit_python_reading_keeps_percent_signs() {
        assert_eq!(bagit_python_decode("data/per%25cent"), "data/per%25cent");
        assert_eq!(bagit_python_decode("data/a%0Ab"), "data/a\nb");
        assert_eq!(bagit_python_decode("data/a%0ab"), "data/a%0ab");
    }

    #[test]
    fn normalization_refuses_escapes() {
        assert_eq!(normalize_relative("data/a b/c.txt").unwrap(), "data/a b/c.txt");
        assert_eq!(normalize_relative("./data//x/../y.txt").unwrap(), "data/y.txt");
        assert_eq!(normalize_relative("data/../bagit.txt").unwrap(), "bagit.txt");
        assert_eq!(normalize_relative("/etc/passwd"), Err(UnsafePath::Absolute));
        assert_eq!(normalize_relative("data/../../secret"), Err(UnsafePath::Escapes));
        assert_eq!(normalize_relative("../x"), Err(UnsafePath::Escapes));
        assert_eq!(normalize_relative("data/.."), Err(UnsafePath::Empty));
    }

    #[test]
    fn nfc_and_nfd_compare_equal() {
        assert_eq!(comparable("data/cafe\u{301}.txt"), comparable("data/caf\u{e9}.txt"));
    }

    #[test]
    fn configured_relative_paths_are_checked() {
        assert_eq!(RelativePath::try_from("./MD5SUMS".to_owned()).unwrap().as_str(), "MD5SUMS");
        assert!(RelativePath::try_from("../MD5SUMS".to_owned()).unwrap_err().contains("leaves"));
    }
}
