//! Tag files: `bagit.txt` (the declaration: version and tag file encoding) and `bag-info.txt`
//! (`Label: value` lines, continuation lines folded), read as bagit-python reads them, plus the
//! tag file character encodings this tool can decode.

use crate::problem::Kind;

/// A tag file's text encoding, as declared by `Tag-File-Character-Encoding`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    Utf8,
    Latin1,
    Ascii,
}

impl Encoding {
    /// Accepts the spellings Python's codec registry accepts for these three.
    pub fn from_label(label: &str) -> Option<Encoding> {
        let key: String = label.trim().to_ascii_lowercase().chars().filter(|c| !matches!(c, '-' | '_' | ' ')).collect();
        match key.as_str() {
            "utf8" | "u8" | "utf" | "cp65001" => Some(Encoding::Utf8),
            "latin1" | "latin" | "l1" | "iso88591" | "iso885911987" | "8859" | "cp819" => Some(Encoding::Latin1),
            "ascii" | "usascii" | "646" | "us" => Some(Encoding::Ascii),
            _ => None,
        }
    }

    /// Decodes a whole tag file, dropping a leading UTF-8 byte-order mark.
    pub fn decode(self, bytes: &[u8]) -> Result<String, String> {
        match self {
            Encoding::Utf8 => {
                let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
                String::from_utf8(bytes.to_vec()).map_err(|e| format!("is not valid UTF-8 ({e})"))
            }
            Encoding::Latin1 => Ok(bytes.iter().map(|&b| b as char).collect()),
            Encoding::Ascii => match bytes.iter().position(|b| !b.is_ascii()) {
                None => Ok(String::from_utf8(bytes.to_vec()).expect("ASCII is UTF-8")),
                Some(at) => Err(format!("is not ASCII (byte {at})")),
            },
        }
    }
}

/// Splits text into lines at LF, CRLF or a lone CR (Python's universal newlines).
pub fn lines(text: &str) -> impl Iterator<Item = &str> {
    let mut rest = text;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let end = rest.find(['\n', '\r']).unwrap_or(rest.len());
        let line = &rest[..end];
        let skip = if rest[end..].starts_with("\r\n") {
            2
        } else if end < rest.len() {
            1
        } else {
            0
        };
        rest = &rest[end + skip..];
        Some(line)
    })
}

/// The labels and values of a tag file, in order (labels may repeat).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TagFile {
    pub tags: Vec<(String, String)>,
}

impl TagFile {
    /// Parses `Label: value` lines; a line starting with whitespace continues the previous
    /// value; blank lines are skipped. A line without `:` is an error naming its number.
    pub fn parse(text: &str) -> Result<TagFile, String> {
        let mut tags: Vec<(String, String)> = Vec::new();
        for (number, line) in lines(text).enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            if line.starts_with([' ', '\t'])
                && let Some((_, value)) = tags.last_mut()
            {
                value.push_str(line);
                continue;
            }
            let Some((label, value)) = line.split_once(':') else {
                return Err(format!("line {} is not `Label: value`: {:?}", number + 1, line.trim()));
            };
            tags.push((label.trim().to_owned(), value.to_owned()));
        }
        for (_, value) in &mut tags {
            *value = value.trim().to_owned();
        }
        Ok(TagFile { tags })
    }

    /// The first value of a label (bagit-python uses the first of repeated labels).
    pub fn get(&self, label: &str) -> Option<&str> {
        self.tags.iter().find(|(l, _)| l == label).map(|(_, v)| v.as_str())
    }
}

/// A `BagIt-Version` value: `MAJOR.MINOR`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version(pub u32, pub u32);

impl Version {
    /// Parses `M.N` (or a bare `M`, which bagit-python also accepts).
    pub fn parse(text: &str) -> Option<Version> {
        let (major, minor) = text.trim().split_once('.').unwrap_or((text.trim(), "0"));
        let number =
            |s: &str| (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())).then(|| s.parse().ok()).flatten();
        Some(Version(number(major)?, number(minor)?))
    }

    /// The versions bagit-python reads: 0.93 to 0.95 (with `package-info.txt`) and 0.96 up to 2.
    pub fn is_supported(self) -> bool {
        (Version(0, 93)..Version(2, 0)).contains(&self)
    }

    /// Where this version keeps its bag metadata.
    pub fn info_file(self) -> &'static str {
        if self < Version(0, 96) { "package-info.txt" } else { "bag-info.txt" }
    }

    /// Tag manifests are part of validation from 0.97 on.
    pub fn has_tag_manifests(self) -> bool {
        self >= Version(0, 97)
    }
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.0, self.1)
    }
}

/// A readable `bagit.txt`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Declaration {
    pub version: Version,
    pub encoding: Encoding,
    /// The file started with a byte-order mark, which RFC 8493 forbids.
    pub has_bom: bool,
    pub tags: TagFile,
}

/// Reads `bagit.txt`'s bytes; the error is the kind of problem (`malformed`, or `unsupported`
/// for a version or encoding this tool does not read) and what is wrong.
pub fn parse_declaration(bytes: &[u8]) -> Result<Declaration, (Kind, String)> {
    let malformed = |why: String| (Kind::Malformed, why);
    let has_bom = bytes.starts_with(b"\xEF\xBB\xBF");
    let text = Encoding::Utf8.decode(bytes).map_err(malformed)?;
    let tags = TagFile::parse(&text).map_err(malformed)?;
    let missing: Vec<&str> =
        ["BagIt-Version", "Tag-File-Character-Encoding"].into_iter().filter(|l| tags.get(l).is_none()).collect();
    if !missing.is_empty() {
        return Err(malformed(format!("lacks the required {}", missing.join(" and "))));
    }
    let version_text = tags.get("BagIt-Version").unwrap_or_default();
    let version = Version::parse(version_text)
        .ok_or_else(|| malformed(format!("BagIt-Version {version_text:?} is not MAJOR.MINOR numbers")))?;
    if !version.is_supported() {
        return Err((Kind::Unsupported, format!("declares BagIt-Version {version}, which bagit tools do not read")));
    }
    let label = tags.get("Tag-File-Character-Encoding").unwrap_or_default();
    let encoding = Encoding::from_label(label).ok_or_else(|| {
        let why =
            format!("declares Tag-File-Character-Encoding {label:?}; this tool reads UTF-8, ISO-8859-1, US-ASCII");
        (Kind::Unsupported, why)
    })?;
    Ok(Declaration { version, encoding, has_bom, tags })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn declarations_parse() {
        let d = parse_declaration(b"BagIt-Version: 0.97\nTag-File-Character-Encoding: UTF-8\n").unwrap();
        assert_eq!((d.version, d.encoding, d.has_bom), (Version(0, 97), Encoding::Utf8, false));
        let d = parse_declaration(b"\xEF\xBB\xBFBagIt-Version: 1.0\r\nTag-File-Character-Encoding: utf8\r\n").unwrap();
        assert_eq!((d.version, d.has_bom), (Version(1, 0), true));
        let (kind, why) = parse_declaration(b"BagIt-Version: 1.0\n").unwrap_err();
        assert!(kind == Kind::Malformed && why.contains("Tag-File-Character-Encoding"), "{why}");
        let (_, why) = parse_declaration(b"BagIt-Version: one\nTag-File-Character-Encoding: UTF-8\n").unwrap_err();
        assert!(why.contains("MAJOR.MINOR"), "{why}");
        let (kind, _) = parse_declaration(b"BagIt-Version: 2.0\nTag-File-Character-Encoding: UTF-8\n").unwrap_err();
        assert_eq!(kind, Kind::Unsupported);
        let (kind, why) = parse_declaration(b"BagIt-Version: 1.0\nTag-File-Character-Encoding: EBCDIC\n").unwrap_err();
        assert!(kind == Kind::Unsupported && why.contains("EBCDIC"), "{why}");
    }

    #[test]
    fn tag_files_fold_continuations_and_keep_order() {
        let tags = TagFile::parse("Source-Organization: Royal\n  Library\n\nPayload-Oxum: 12.3\nX: 1\nX: 2\n").unwrap();
        // Unfolding removes the line break and keeps the whitespace (RFC 5322 §2.2.3).
        assert_eq!(tags.get("Source-Organization"), Some("Royal  Library"));
        assert_eq!(tags.get("Payload-Oxum"), Some("12.3"));
        assert_eq!(tags.get("X"), Some("1"));
        let err = TagFile::parse("Good: yes\nno colon here\n").unwrap_err();
        assert!(err.contains("line 2"), "{err}");
    }

    #[test]
    fn versions_compare_numerically() {
        assert!(Version::parse("0.97").unwrap() < Version::parse("1.0").unwrap());
        assert!(Version(0, 96).is_supported() && !Version(2, 0).is_supported());
        assert_eq!(Version(0, 95).info_file(), "package-info.txt");
        assert_eq!(Version::parse("1"), Some(Version(1, 0)));
        assert_eq!(Version::parse("1.x"), None);
    }

    #[test]
    fn lines_split_like_python() {
        assert_eq!(lines("a\nb\r\nc\rd").collect::<Vec<_>>(), ["a", "b", "c", "d"]);
        assert_eq!(lines("a\n\nb\n").collect::<Vec<_>>(), ["a", "", "b"]);
    }
}
