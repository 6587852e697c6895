//! The one edit `autocomp new` makes to a file it did not write: the new crate added to the
//! `members` of the workspace's `Cargo.toml`, in the user's text as it is (comments, layout
//! and line ends kept). toml_edit's parser finds the array; the entry goes in as text, since
//! printing a document back would write its line ends as `\n`.

use std::path::Path;

use super::workspace::pattern_covers;

#[derive(Debug, PartialEq)]
pub(super) enum MemberEdit {
    /// The manifest's new text, with `member` appended to `members`.
    Added(String),
    /// A members entry (e.g. "components/*") that already covers `member`.
    Covered(String),
}

/// Adds `member` to the `members` array of the `[workspace]` table in a manifest's text,
/// touching nothing else: the entry goes after the last one, on its own line with the same
/// indentation when the array has one entry a line, else on the same line.
pub(super) fn add_member(manifest: &str, member: &str) -> Result<MemberEdit, String> {
    let parsed: toml::Table = manifest.parse().map_err(|e| format!("not valid TOML: {e}"))?;
    let members = parsed
        .get("workspace")
        .and_then(|w| w.get("members"))
        .and_then(toml::Value::as_array)
        .ok_or("no [workspace] members array")?;
    if let Some(pattern) = members.iter().filter_map(toml::Value::as_str).find(|p| pattern_covers(p, member)) {
        return Ok(MemberEdit::Covered(pattern.to_owned()));
    }
    let array = members_array(manifest).ok_or("cannot find the members array in the text")?;
    let entry = toml::Value::String(member.to_owned()).to_string();
    let mut text = manifest.to_owned();
    let Some(last) = array.last_value_end else {
        // An empty array: the entry between the brackets.
        text.insert_str(array.open + 1, &entry);
        return Ok(MemberEdit::Added(text));
    };
    let line_start = |at: usize| manifest[..at].rfind('\n').map_or(0, |n| n + 1);
    // The end of a line, before its "\r\n" or "\n"; new lines end as the file's do.
    let line_end = |at: usize| {
        let end = manifest[at..].find('\n').map_or(manifest.len(), |n| at + n);
        if manifest[..end].ends_with('\r') { end - 1 } else { end }
    };
    let newline = if manifest.contains("\r\n") { "\r\n" } else { "\n" };
    let close_on_own_line = manifest[line_start(array.close)..array.close].trim().is_empty();
    let last_line = line_start(last);
    if !close_on_own_line || line_start(array.close) == last_line || last_line <= array.open {
        text.insert_str(last, &format!(", {entry}"));
        return Ok(MemberEdit::Added(text));
    }
    // One entry a line: a new line after the last entry's (and its comment), indented alike.
    let indent: String = manifest[last_line..].chars().take_while(|c| *c == ' ' || *c == '\t').collect();
    let trailing_comma = if array.trailing_comma { "," } else { "" };
    text.insert_str(line_end(last), &format!("{newline}{indent}{entry}{trailing_comma}"));
    if !array.trailing_comma {
        text.insert(last, ',');
    }
    Ok(MemberEdit::Added(text))
}

/// Byte offsets of the `members` array of the `[workspace]` table in a manifest's text.
#[derive(Debug)]
struct ArraySpan {
    /// The opening `[`.
    open: usize,
    /// The closing `]`.
    close: usize,
    /// Just after the last value (before a comma or comment); `None` when empty.
    last_value_end: Option<usize>,
    /// Whether a comma follows the last value.
    trailing_comma: bool,
}

/// Finds `members = [...]` in `[workspace]` (or `workspace.members` at the top level) where
/// toml_edit's parser found it: the spans of the array and of its last value.
fn members_array(text: &str) -> Option<ArraySpan> {
    let document = toml_edit::Document::parse(text).ok()?;
    let array = document.get("workspace")?.get("members")?.as_array()?;
    let span = array.span()?;
    let last_value_end = match array.iter().last() {
        Some(value) => Some(value.span()?.end),
        None => None,
    };
    Some(ArraySpan { open: span.start, close: span.end - 1, last_value_end, trailing_comma: array.trailing_comma() })
}

/// Replaces a file's text by renaming a sibling over it (its permissions kept), so a
/// failure leaves the old text whole.
pub(super) fn replace_file(path: &Path, text: &str) -> Result<(), String> {
    let fail = |e: std::io::Error| format!("cannot update {}: {e}", path.display());
    let real = path.canonicalize().map_err(fail)?;
    let dir = real.parent().ok_or_else(|| format!("{} has no directory", real.display()))?;
    let mut file = tempfile::Builder::new().prefix(".Cargo.toml.").tempfile_in(dir).map_err(fail)?;
    std::io::Write::write_all(&mut file, text.as_bytes()).map_err(fail)?;
    let permissions = std::fs::metadata(&real).map_err(fail)?.permissions();
    std::fs::set_permissions(file.path(), permissions).map_err(fail)?;
    file.persist(&real).map_err(|e| fail(e.error))?;
    Ok(())
}
