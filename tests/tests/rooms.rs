//! No decision in product code reads an error's text: a caller matches the error's kind
//! (`StoreError::SchemaNewer`, `OperatorError::AlreadyInState`, an input's field, ...), since
//! the words are for people and change with them. This greps every crate's `src/` (not the
//! tests crate, not `#[cfg(test)]` modules, not `*_tests.rs` files) for a message tested with
//! `contains`, `starts_with` or `ends_with`, and fails naming file:line.

use std::path::{Path, PathBuf};

/// Names a message or an error goes by; `x.contains(...)` on one of them is a decision on text.
const MESSAGE_NAMES: &[&str] =
    &["message", "msg", "error", "err", "e", "described", "description", "reason", "refusal", "words", "why"];

/// The string tests a decision on text uses.
const TESTS: &[&str] = &["contains(", "starts_with(", "ends_with("];

/// Decisions on text that are allowed, each with its reason: (where: a file or the directory
/// it is in, the code on the line, why).
const ALLOWED: &[(&str, &str, &str)] = &[
    (
        "store/src/postgres/",
        "described.starts_with(\"invalid configuration\")",
        "tokio-postgres 0.7 says a configuration error (a password the server asks for and the URL does not \
         give) only in its Display: its Kind::Config has no accessor",
    ),
    (
        "framework/src/config.rs",
        "message.starts_with(\"invalid type: \")",
        "toml gives a setting's type or value error (serde's invalid_type/invalid_value) only as text, with the \
         value quoted: the text decides only what of it is shown (the value, maybe a secret, is not), never an \
         outcome",
    ),
];

/// A line of product code that tests a message's text.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Finding {
    file: String,
    line: usize,
    code: String,
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}: {}", self.file, self.line, self.code.trim())
    }
}

#[test]
fn no_decision_in_product_code_reads_an_errors_text() {
    let root = match std::env::var_os("AUTOCOMP_ROOMS_ROOT") {
        // To show what this finds in another checkout (an older commit, say).
        Some(root) => PathBuf::from(root),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace root").to_path_buf(),
    };
    let mut files = Vec::new();
    for crate_dir in product_crates(&root) {
        rust_files(&crate_dir.join("src"), &mut files);
    }
    assert!(files.len() > 100, "found only {} product files under {}", files.len(), root.display());
    let mut found = Vec::new();
    for file in &files {
        let relative = file.strip_prefix(&root).unwrap().to_string_lossy().into_owned();
        let text = std::fs::read_to_string(file).unwrap();
        found.extend(decisions_on_text(&relative, &text));
    }
    // An allowance that no longer matches anything goes, so the list says only what is true.
    for (file, code, _why) in ALLOWED {
        assert!(
            found.iter().any(|f| f.file.starts_with(file) && f.code.contains(code)),
            "ALLOWED {file}: {code}: gone"
        );
    }
    found.retain(|f| !allowed(f));
    let listed: Vec<String> = found.iter().map(ToString::to_string).collect();
    assert!(
        found.is_empty(),
        "decisions on an error's text (match on the error's kind instead; or, if the text is all a \
         foreign crate gives, add it to ALLOWED with the reason):\n{}",
        listed.join("\n")
    );
}

#[test]
fn the_grep_finds_what_the_code_did_before_and_not_what_it_does_now() {
    let before = r#"
fn store_fix(message: &str) -> &'static str {
    if message.contains("schema version") {
        "migrate it"
    } else if e.message.starts_with("no store file") {
        "check the path"
    }
}
fn migrate() {
    match run() {
        Err(error) if error.to_string().contains("newer than this release") => fail(2),
        Err(OperatorError::Refused(message)) if wait && message.contains("already") => ok(),
        Err(StoreError::Conflict(message)) if message.contains(&format!("changed {}", "since")) => ok(),
    }
}
"#;
    let lines: Vec<usize> = decisions_on_text("x.rs", before).iter().map(|f| f.line).collect();
    assert_eq!(lines, [3, 5, 11, 12, 13]);

    let now = r##"
//! A comment may say message.contains("x").
fn store_fix(error: &StoreError) -> &'static str {
    let url_ok = url.starts_with("https://") || text.ends_with('\n');
    let quoted = "message.contains(\"x\") in a string, { unbalanced";
    let raw = r#"error.contains("y")"#;
    let c = '{';
    /* error.contains("z") */
    if reason.chars().count() > 2 { return "long" }
    match error { StoreError::NoStoreFile(_) => "check the path", _ => "outage" }
}
#[cfg(test)]
mod tests {
    fn check(message: &str) { assert!(message.contains("schema version")); }
}
#[cfg(test)]
mod more_tests;
fn after_the_tests(message: &str) -> bool { message.ends_with("!") }
"##;
    let found = decisions_on_text("x.rs", now);
    assert_eq!(found.iter().map(|f| f.line).collect::<Vec<_>>(), [18], "{found:?}");
}

fn allowed(finding: &Finding) -> bool {
    ALLOWED.iter().any(|(file, code, _why)| finding.file.starts_with(file) && finding.code.contains(code))
}

/// Every workspace member's directory but the tests crate's (and its test servers').
pub(crate) fn product_crates(root: &Path) -> Vec<PathBuf> {
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    let workspace: toml::Table = toml::from_str(&manifest).unwrap();
    let mut crates = Vec::new();
    for member in workspace["workspace"]["members"].as_array().unwrap() {
        let member = member.as_str().unwrap();
        if member == "tests" || member.starts_with("tests/") {
            continue;
        }
        match member.strip_suffix("/*") {
            Some(dir) => {
                for entry in std::fs::read_dir(root.join(dir)).unwrap() {
                    let dir = entry.unwrap().path();
                    if dir.join("Cargo.toml").is_file() {
                        crates.push(dir);
                    }
                }
            }
            None => crates.push(root.join(member)),
        }
    }
    crates
}

/// The `.rs` files under `dir`, but test modules kept in files of their own (`*_tests.rs`,
/// `tests.rs`).
fn rust_files(dir: &Path, files: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            rust_files(&path, files);
        } else if name.ends_with(".rs") && !name.ends_with("_tests.rs") && name != "tests.rs" {
            files.push(path);
        }
    }
}

/// The lines of `text` outside `#[cfg(test)]` items where a message is tested for words.
fn decisions_on_text(file: &str, text: &str) -> Vec<Finding> {
    let code = code_only(text);
    let originals: Vec<&str> = text.lines().collect();
    let mut found = Vec::new();
    let mut skipping: Option<i64> = None;
    let mut test_item_next = false;
    for (index, line) in code.iter().enumerate() {
        if let Some(depth) = skipping.as_mut() {
            *depth += braces(line);
            if *depth <= 0 && line.contains('}') {
                skipping = None;
            }
            continue;
        }
        let trimmed = line.trim();
        if trimmed.starts_with("#[cfg(test)]") {
            test_item_next = true;
            continue;
        }
        if test_item_next && !trimmed.is_empty() && !trimmed.starts_with("#[") {
            test_item_next = false;
            // `mod x;` is a file of its own (skipped if named as tests are); an item with a body
            // is skipped to its closing brace.
            if line.contains('{') {
                let depth = braces(line);
                if depth > 0 {
                    skipping = Some(depth);
                }
            }
            continue;
        }
        if tests_a_message(line) {
            let code = originals.get(index).copied().unwrap_or_default().to_owned();
            found.push(Finding { file: file.to_owned(), line: index + 1, code });
        }
    }
    found
}

fn braces(line: &str) -> i64 {
    line.chars().map(|c| i64::from(c == '{') - i64::from(c == '}')).sum()
}

/// Whether a line (comments and string contents blanked) tests a message's text: a
/// `to_string()` tested, or a string test on a variable (or field) named as messages are.
fn tests_a_message(line: &str) -> bool {
    for test in TESTS {
        for (at, _) in line.match_indices(test) {
            let Some(before) = line[..at].strip_suffix('.') else { continue };
            let before = before.trim_end();
            if before.ends_with("to_string()") {
                return true;
            }
            let name: String =
                before.chars().rev().take_while(|c| c.is_alphanumeric() || *c == '_').collect::<String>();
            let name: String = name.chars().rev().collect();
            let argument = line[at + test.len()..].trim_start();
            if MESSAGE_NAMES.contains(&name.as_str()) && !argument.starts_with('\'') {
                return true;
            }
        }
    }
    false
}

/// `text`'s lines with comments removed and the contents of string and char literals blanked
/// (their quotes kept), so neither a brace nor a pattern inside them counts.
fn code_only(text: &str) -> Vec<String> {
    #[derive(Clone, Copy, PartialEq)]
    enum State {
        Code,
        Str,
        Raw(usize),
        Block(usize),
    }
    let mut state = State::Code;
    let mut lines = Vec::new();
    for line in text.lines() {
        let chars: Vec<char> = line.chars().collect();
        let mut out = String::new();
        let mut i = 0;
        while i < chars.len() {
            let c = chars[i];
            let next = chars.get(i + 1).copied();
            match state {
                State::Code => {
                    if c == '/' && next == Some('/') {
                        break;
                    } else if c == '/' && next == Some('*') {
                        state = State::Block(1);
                        i += 1;
                    } else if c == '"' {
                        out.push('"');
                        state = State::Str;
                    } else if c == 'r' && (next == Some('"') || next == Some('#')) && !is_ident_end(&out) {
                        let hashes = chars[i + 1..].iter().take_while(|c| **c == '#').count();
                        if chars.get(i + 1 + hashes) == Some(&'"') {
                            out.push('"');
                            state = State::Raw(hashes);
                            i += 1 + hashes;
                        } else {
                            out.push(c);
                        }
                    } else if c == '\'' {
                        // A char literal ('x', '\n', '\u{7b}') or a lifetime ('a).
                        let end = if next == Some('\\') {
                            chars.get(i + 3..).and_then(|rest| rest.iter().position(|c| *c == '\'')).map(|p| i + 3 + p)
                        } else if chars.get(i + 2) == Some(&'\'') {
                            Some(i + 2)
                        } else {
                            None
                        };
                        out.push('\'');
                        if let Some(end) = end {
                            out.push('\'');
                            i = end;
                        }
                    } else {
                        out.push(c);
                    }
                }
                State::Str => {
                    if c == '\\' {
                        i += 1;
                    } else if c == '"' {
                        out.push('"');
                        state = State::Code;
                    }
                }
                State::Raw(hashes) => {
                    if c == '"' && chars[i + 1..].iter().take(hashes).filter(|c| **c == '#').count() == hashes {
                        out.push('"');
                        state = State::Code;
                        i += hashes;
                    }
                }
                State::Block(depth) => {
                    if c == '*' && next == Some('/') {
                        state = if depth == 1 { State::Code } else { State::Block(depth - 1) };
                        i += 1;
                    } else if c == '/' && next == Some('*') {
                        state = State::Block(depth + 1);
                        i += 1;
                    }
                }
            }
            i += 1;
        }
        lines.push(out);
    }
    lines
}

/// Whether `code` ends in an identifier character (so an `r` after it is part of a name).
fn is_ident_end(code: &str) -> bool {
    code.chars().last().is_some_and(|c| c.is_alphanumeric() || c == '_')
}
