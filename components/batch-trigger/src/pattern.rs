//! Name patterns for batch folders and completion markers, deliberately simpler than regular
//! expressions: literal text plus `<digits>`, `<letters>`, `<alnum>` (one or more of that
//! class) and `*` (any run of characters, possibly empty). A pattern matches a whole name.

use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Piece {
    Literal(char),
    /// One or more characters of a class.
    Class(Class),
    /// Zero or more characters of any kind.
    Any,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    Digits,
    Letters,
    Alnum,
}

impl Class {
    fn admits(self, c: char) -> bool {
        match self {
            Class::Digits => c.is_ascii_digit(),
            Class::Letters => c.is_ascii_alphabetic(),
            Class::Alnum => c.is_ascii_alphanumeric(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamePattern {
    text: String,
    pieces: Vec<Piece>,
}

impl NamePattern {
    pub fn parse(text: &str) -> Result<Self, String> {
        if text.is_empty() {
            return Err("an empty pattern matches nothing".into());
        }
        let mut pieces = Vec::new();
        let mut rest = text;
        while let Some(c) = rest.chars().next() {
            if c == '<' {
                let end = rest.find('>').ok_or_else(|| format!("{text:?}: `<` without a closing `>`"))?;
                let class = match &rest[1..end] {
                    "digits" => Class::Digits,
                    "letters" => Class::Letters,
                    "alnum" => Class::Alnum,
                    other => {
                        return Err(format!(
                            "{text:?}: unknown class <{other}>; use <digits>, <letters>, <alnum> or *"
                        ));
                    }
                };
                pieces.push(Piece::Class(class));
                rest = &rest[end + 1..];
            } else {
                pieces.push(if c == '*' { Piece::Any } else { Piece::Literal(c) });
                rest = &rest[c.len_utf8()..];
            }
        }
        Ok(Self { text: text.to_owned(), pieces })
    }

    /// Whether the whole of `name` matches. Linear in pattern x name (no backtracking blowup).
    pub fn matches(&self, name: &str) -> bool {
        let chars: Vec<char> = name.chars().collect();
        let n = chars.len();
        // next[j]: the pieces after the current one match chars[j..]. Filled back to front.
        let mut next: Vec<bool> = (0..=n).map(|j| j == n).collect();
        for piece in self.pieces.iter().rev() {
            let mut here = vec![false; n + 1];
            for j in (0..=n).rev() {
                here[j] = match *piece {
                    Piece::Literal(c) => j < n && chars[j] == c && next[j + 1],
                    // One of the class, then either the rest of the pattern or more of the class.
                    Piece::Class(class) => j < n && class.admits(chars[j]) && (next[j + 1] || here[j + 1]),
                    Piece::Any => next[j] || (j < n && here[j + 1]),
                };
            }
            next = here;
        }
        next[0]
    }
}

impl fmt::Display for NamePattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_batch_pattern() {
        let pattern = NamePattern::parse("B<digits>-RT<digits>").unwrap();
        for name in ["B400022028241-RT1", "B1-RT12"] {
            assert!(pattern.matches(name), "{name}");
        }
        for name in ["B-RT1", "B1-RT", "B1-RT1.tmp", "xB1-RT1", "B1x-RT1", ""] {
            assert!(!pattern.matches(name), "{name}");
        }
    }

    #[test]
    fn wildcards_and_classes() {
        let marker = NamePattern::parse("tagmanifest-*.txt").unwrap();
        assert!(marker.matches("tagmanifest-sha256.txt") && marker.matches("tagmanifest-.txt"));
        assert!(!marker.matches("manifest-sha256.txt") && !marker.matches("tagmanifest-md5.txt.part"));
        let any = NamePattern::parse("*").unwrap();
        assert!(any.matches("bad name!") && any.matches(""));
        let mixed = NamePattern::parse("<letters><alnum>_*").unwrap();
        assert!(mixed.matches("ab1_") && mixed.matches("a1_x") && !mixed.matches("1a_x"));
    }

    #[test]
    fn bad_patterns_are_explained() {
        assert!(NamePattern::parse("B<digit>").unwrap_err().contains("unknown class <digit>"));
        assert!(NamePattern::parse("B<digits").unwrap_err().contains("closing"));
        assert!(NamePattern::parse("").is_err());
    }
}
