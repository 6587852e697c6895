//! Manifest lines: BagIt's `checksum  path` (RFC 8493 §2.1.3, read as bagit-python reads them)
//! and the plain output of `md5sum`/`sha256sum` (`<hex>  <path>`, `<hex> *<path>`, and GNU's
//! backslash-escaped form for names with a newline or backslash).

use crate::tagfile::lines;

/// One entry as written: the path is still percent-encoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    /// 1-based line number in the manifest, for messages.
    pub number: usize,
    pub checksum: String,
    pub raw_path: String,
}

/// A BagIt manifest's entries, and the numbers of lines it could not read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Manifest {
    pub lines: Vec<Line>,
    /// bagit-python logs and skips a line without both a checksum and a path; so do we (it
    /// does not make the bag invalid), and the summary says how many.
    pub ignored: Vec<usize>,
}

/// Parses a BagIt manifest (text already decoded, byte-order mark removed). Lines are trimmed;
/// blank lines and `#` comments are skipped; the checksum ends at the first whitespace and the
/// path is the rest, minus any leading `*` (a binary marker some tools write).
pub fn parse_bagit(text: &str) -> Manifest {
    let mut manifest = Manifest::default();
    for (index, line) in lines(text).enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some(split) = line.find(char::is_whitespace) else {
            manifest.ignored.push(index + 1);
            continue;
        };
        let path = line[split..].trim_start().trim_start_matches('*');
        manifest.lines.push(Line { number: index + 1, checksum: line[..split].to_owned(), raw_path: path.to_owned() });
    }
    manifest
}

/// One line of `md5sum`-style output, path unescaped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlainLine {
    pub checksum: String,
    pub path: String,
}

/// Parses one line of `md5sum`/`sha*sum` output. `Ok(None)` for a blank line.
pub fn parse_plain_line(line: &str) -> Result<Option<PlainLine>, String> {
    let line = line.strip_suffix('\r').unwrap_or(line);
    if line.trim().is_empty() {
        return Ok(None);
    }
    // GNU coreutils starts a line with `\` when the name holds a backslash or newline, and
    // then escapes those as `\\` and `\n`.
    let (escaped, line) = match line.strip_prefix('\\') {
        Some(rest) => (true, rest),
        None => (false, line),
    };
    let hex_end = line.find(|c: char| !c.is_ascii_hexdigit()).unwrap_or(line.len());
    if hex_end == 0 {
        return Err("does not start with a hexadecimal checksum".into());
    }
    let rest = line[hex_end..].strip_prefix(' ').ok_or("has no space after the checksum")?;
    // The mode character: ` ` for text, `*` for binary. Tolerate its absence (`<hex> <path>`).
    let path = rest.strip_prefix([' ', '*']).unwrap_or(rest);
    if path.is_empty() {
        return Err("has a checksum but no file name".into());
    }
    let path = if escaped { unescape_gnu(path)? } else { path.to_owned() };
    Ok(Some(PlainLine { checksum: line[..hex_end].to_owned(), path }))
}

fn unescape_gnu(path: &str) -> Result<String, String> {
    let mut out = String::with_capacity(path.len());
    let mut chars = path.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('\\') => out.push('\\'),
            Some('n') => out.push('\n'),
            Some('r') => out.push('\r'),
            other => return Err(format!("has an unknown escape \\{}", other.map(String::from).unwrap_or_default())),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bagit_lines_split_at_the_first_whitespace() {
        let text = "\
d41d8cd98f00b204e9800998ecf8427e  data/a file with  spaces.txt
D41D8CD98F00B204E9800998ECF8427E\tdata/tabbed.txt

# a comment
0cc175b9c0f1b6a831c399e269772661 *data/binary.bin
not-a-line
0cc175b9c0f1b6a831c399e269772661  data/line%0Abreak.txt   \r
";
        let manifest = parse_bagit(text);
        let paths: Vec<&str> = manifest.lines.iter().map(|l| l.raw_path.as_str()).collect();
        assert_eq!(
            paths,
            ["data/a file with  spaces.txt", "data/tabbed.txt", "data/binary.bin", "data/line%0Abreak.txt"]
        );
        assert_eq!(manifest.lines[1].checksum, "D41D8CD98F00B204E9800998ECF8427E");
        assert_eq!(manifest.lines[2].number, 5);
        assert_eq!(manifest.ignored, [6]);
    }

    #[test]
    fn plain_lines_in_text_binary_and_escaped_form() {
        let parse = |l: &str| parse_plain_line(l).unwrap().unwrap();
        assert_eq!(parse("abc123  a b.txt").path, "a b.txt");
        assert_eq!(parse("abc123 *bin/x.tif").path, "bin/x.tif");
        assert_eq!(parse("abc123   leading space").path, " leading space");
        assert_eq!(parse("abc123 lenient.txt").path, "lenient.txt");
        assert_eq!(parse("\\abc123  new\\nline\\\\back").path, "new\nline\\back");
        assert_eq!(parse("ABC123  x\r").checksum, "ABC123");
        assert_eq!(parse_plain_line("   ").unwrap(), None);
        assert!(parse_plain_line("xyz  a").unwrap_err().contains("hexadecimal"));
        assert!(parse_plain_line("abc123").unwrap_err().contains("space"));
        assert!(parse_plain_line("\\abc  bad\\q").unwrap_err().contains("escape"));
    }
}
