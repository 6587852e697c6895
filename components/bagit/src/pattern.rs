//! The small pattern languages of the structure rules: glob-like file patterns (`*`, `?`,
//! `**`) and character sets for names (`A-Za-z0-9._-`). Both are checked when the config is
//! loaded, so a typo is a config error at startup rather than a failure on every batch.

use serde::Deserialize;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Literal(char),
    /// `?`: one character other than `/`.
    One,
    /// `*`: any run of characters other than `/`.
    Star,
    /// `**/`: zero or more whole directories.
    Dirs,
    /// `**` at the end: anything, `/` included.
    Rest,
}

/// A file pattern. `*` matches any run of characters within one path component, `?` one
/// character, `**/` any number of directories (none included) and a final `**` everything
/// below; all else is literal. A pattern without `/` is matched against a file's name, one
/// with `/` against its whole path relative to the batch root: `*.tif`, `data/*.xml`,
/// `data/**/*.jp2`, `MD5SUMS`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub struct Pattern {
    text: String,
    tokens: Vec<Token>,
    whole_path: bool,
}

impl Pattern {
    pub fn new(text: &str) -> Result<Pattern, String> {
        let refuse = |why: &str| Err(format!("pattern {text:?} {why}"));
        if text.is_empty() {
            return refuse("is empty");
        }
        if text.starts_with('/') {
            return refuse("is absolute; write paths relative to the batch root");
        }
        if text.ends_with('/') {
            return refuse("ends with `/`; patterns name files");
        }
        if text.split('/').any(|c| c == ".." || c == ".") {
            return refuse("contains `.` or `..`");
        }
        let chars: Vec<char> = text.chars().collect();
        let mut tokens = Vec::new();
        let mut i = 0;
        while i < chars.len() {
            match chars[i] {
                '*' if chars.get(i + 1) == Some(&'*') => {
                    let starts_component = i == 0 || chars[i - 1] == '/';
                    match chars.get(i + 2) {
                        Some('/') if starts_component => {
                            tokens.push(Token::Dirs);
                            i += 3;
                        }
                        None if starts_component => {
                            tokens.push(Token::Rest);
                            i += 2;
                        }
                        _ => return refuse("uses `**` inside a name; `**` must be a whole path component"),
                    }
                }
                '*' => {
                    tokens.push(Token::Star);
                    i += 1;
                }
                '?' => {
                    tokens.push(Token::One);
                    i += 1;
                }
                c => {
                    tokens.push(Token::Literal(c));
                    i += 1;
                }
            }
        }
        Ok(Pattern { text: text.to_owned(), tokens, whole_path: text.contains('/') })
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Whether the file at `path` (relative to the batch root, `/`-separated) matches.
    pub fn matches(&self, path: &str) -> bool {
        let subject = if self.whole_path { path } else { path.rsplit('/').next().unwrap_or(path) };
        let subject: Vec<char> = subject.chars().collect();
        match_tokens(&self.tokens, &subject)
    }
}

fn match_tokens(tokens: &[Token], s: &[char]) -> bool {
    let Some((first, rest)) = tokens.split_first() else { return s.is_empty() };
    match first {
        Token::Literal(c) => s.first() == Some(c) && match_tokens(rest, &s[1..]),
        Token::One => s.first().is_some_and(|&c| c != '/') && match_tokens(rest, &s[1..]),
        Token::Star => {
            let run = s.iter().position(|&c| c == '/').unwrap_or(s.len());
            (0..=run).any(|n| match_tokens(rest, &s[n..]))
        }
        Token::Dirs => {
            match_tokens(rest, s) || (0..s.len()).filter(|&i| s[i] == '/').any(|i| match_tokens(rest, &s[i + 1..]))
        }
        Token::Rest => true,
    }
}

impl TryFrom<String> for Pattern {
    type Error = String;

    fn try_from(text: String) -> Result<Self, Self::Error> {
        Pattern::new(&text)
    }
}

impl std::fmt::Display for Pattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

/// The characters allowed in names, written like a regular-expression class without the
/// brackets: single characters and `a-z` ranges, e.g. `A-Za-z0-9._-` (a `-` first or last is
/// literal).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub struct Charset {
    text: String,
    ranges: Vec<(char, char)>,
}

impl Charset {
    pub fn new(text: &str) -> Result<Charset, String> {
        let chars: Vec<char> = text.chars().collect();
        if chars.is_empty() {
            return Err("character set is empty".into());
        }
        let mut ranges = Vec::new();
        let mut i = 0;
        while i < chars.len() {
            if i + 2 < chars.len() && chars[i + 1] == '-' {
                let (low, high) = (chars[i], chars[i + 2]);
                if low > high {
                    return Err(format!("character set {text:?}: range {low}-{high} is backwards"));
                }
                ranges.push((low, high));
                i += 3;
            } else {
                ranges.push((chars[i], chars[i]));
                i += 1;
            }
        }
        Ok(Charset { text: text.to_owned(), ranges })
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The first character of `name` outside the set.
    pub fn first_outside(&self, name: &str) -> Option<char> {
        name.chars().find(|&c| !self.ranges.iter().any(|&(low, high)| (low..=high).contains(&c)))
    }
}

impl TryFrom<String> for Charset {
    type Error = String;

    fn try_from(text: String) -> Result<Self, Self::Error> {
        Charset::new(&text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matches(pattern: &str, path: &str) -> bool {
        Pattern::new(pattern).unwrap().matches(path)
    }

    #[test]
    fn names_and_paths() {
        assert!(matches("*.tif", "data/pages/0001.tif"));
        assert!(!matches("*.tif", "data/pages/0001.tiff"));
        assert!(matches("page-????.jp2", "data/page-0001.jp2"));
        assert!(matches("data/*.xml", "data/mets.xml"));
        assert!(!matches("data/*.xml", "data/sub/mets.xml"));
        assert!(matches("data/**/*.xml", "data/mets.xml"));
        assert!(matches("data/**/*.xml", "data/a/b/mets.xml"));
        assert!(matches("data/**", "data/a/b"));
        assert!(matches("MD5SUMS", "MD5SUMS"));
        assert!(matches("*", "anything at all"));
    }

    #[test]
    fn bad_patterns_are_refused() {
        for bad in ["", "/abs", "dir/", "data/../x", "a**b", "data/x**"] {
            assert!(Pattern::new(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn charsets() {
        let portable = Charset::new("A-Za-z0-9._-").unwrap();
        assert_eq!(portable.first_outside("B400-RT1_page.0001.tif"), None);
        assert_eq!(portable.first_outside("page 1.tif"), Some(' '));
        assert_eq!(portable.first_outside("café"), Some('é'));
        assert!(Charset::new("z-a").unwrap_err().contains("backwards"));
        assert!(Charset::new("").is_err());
    }
}
