//! `autocomp new`: writes a new component crate (its `main.rs`, a unit test on the test
//! helpers) and its config file; inside the autocomp workspace it also adds the member.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::{Component as PathPart, Path, PathBuf};

use autocomp_model::{ComponentName, EventType, InvalidInput};

use crate::operator::OperatorError;

/// The type a new component requires when `--requires` names none: what a source records.
const DEFAULT_REQUIRES: &str = "Data_Received";

/// `autocomp new NAME --event-type T [--requires A,B] [--dir DIR]`.
#[derive(Debug, Clone, clap::Args)]
#[command(after_help = "Writes DIR/Cargo.toml, DIR/src/main.rs (a component that records the number of files in \
                        the batch's directory as its result, failing below the setting min_files), \
                        DIR/src/tests.rs (its unit tests) and DIR/NAME.toml, the config file: copy it into the \
                        config dir (the one holding autocomp.toml, /etc/autocomp by default). Inside the autocomp \
                        workspace the crate uses the workspace's dependencies and is added to its members \
                        (unless a pattern there covers it already); elsewhere it depends on the framework \
                        sources this autocomp was built from. Nothing is written when any input is invalid \
                        or DIR exists.")]
pub struct NewArgs {
    /// The component's name (also its crate and binary name), e.g. page-counter.
    pub name: String,
    /// The event type it records, e.g. Pages_Counted.
    #[arg(long, value_name = "TYPE")]
    pub event_type: String,
    /// Event types that must have succeeded first (comma-separated) [default: Data_Received].
    #[arg(long, value_name = "A,B", value_delimiter = ',')]
    pub requires: Vec<String>,
    /// Where to write the crate (must not exist) [default: components/NAME in the autocomp
    /// workspace holding the current directory, else ./NAME].
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

/// Writes the crate and its config; returns what was written, for the terminal.
pub fn run(args: &NewArgs) -> Result<String, OperatorError> {
    let cwd = std::env::current_dir().map_err(|e| refused(format!("cannot read the current directory: {e}")))?;
    let plan = plan(args, &cwd)?;
    plan.write()
}

/// Everything `run` will write, decided (and every input checked) before anything is.
#[derive(Debug)]
struct Plan {
    target: PathBuf,
    name: String,
    /// Path in the crate, text.
    files: Vec<(String, String)>,
    /// The workspace manifest and its new text; `None` outside the workspace, or when a
    /// members pattern covers the crate already.
    manifest: Option<(PathBuf, String)>,
    /// What the output says about the workspace (the member added, or the pattern covering it).
    membership: Option<String>,
    workspace: Option<PathBuf>,
}

fn plan(args: &NewArgs, cwd: &Path) -> Result<Plan, OperatorError> {
    let name = crate_name(&args.name)?;
    let event_type = EventType::new(args.event_type.as_str())?;
    let requires = requires(&args.requires, &event_type)?;

    let target = match &args.dir {
        Some(dir) => absolute(cwd, dir),
        None => match find_workspace(cwd) {
            Some(Workspace::Autocomp(root)) => root.join("components").join(name.as_str()),
            _ => cwd.join(name.as_str()),
        },
    };
    if target.symlink_metadata().is_ok() {
        let shown = target.display().to_string();
        return Err(
            InvalidInput::new("directory", shown, "already exists; autocomp new writes only a new directory").into()
        );
    }
    let parent = target.parent().ok_or_else(|| {
        InvalidInput::new("directory", target.display().to_string(), "has no parent directory to write it in")
    })?;
    let workspace = match find_workspace(parent) {
        Some(Workspace::Autocomp(root)) => Some(root),
        _ => None,
    };

    // Names cargo would refuse for the crate: its own dependencies and the framework's path
    // dependencies (two path packages of one name collide in the lock file), and inside the
    // workspace its fellow members' packages and binaries.
    let mut taken: BTreeSet<String> = [
        "autocomp-framework",
        "autocomp-model",
        "autocomp-http",
        "autocomp-store",
        "autocomp-sboi",
        "serde",
        "tempfile",
    ]
    .map(String::from)
    .into();
    if let Some(root) = &workspace {
        taken.extend(workspace_names(root));
    }
    if taken.contains(name.as_str()) {
        let reason = "is already a package, binary or dependency in the autocomp workspace; choose another name";
        return Err(InvalidInput::new("component", name.as_str(), reason).into());
    }

    let text = Texts { name: name.as_str(), event_type: event_type.as_str(), requires: &requires };
    let (cargo_toml, manifest, membership) = match &workspace {
        Some(root) => {
            let member = relative_member(root, &target)?;
            let manifest_path = root.join("Cargo.toml");
            let current = std::fs::read_to_string(&manifest_path)
                .map_err(|e| refused(format!("cannot read {}: {e}", manifest_path.display())))?;
            let edit = add_member(&current, &member)
                .map_err(|reason| refused(format!("{}: {reason}; nothing was written", manifest_path.display())))?;
            match edit {
                MemberEdit::Added(new_text) => {
                    let said = format!("(added \"{member}\" to the workspace members)");
                    (text.cargo_toml_in_workspace(), Some((manifest_path, new_text)), Some(said))
                }
                MemberEdit::Covered(pattern) => {
                    let said =
                        format!("{} already has the crate as a member through \"{pattern}\"", manifest_path.display());
                    (text.cargo_toml_in_workspace(), None, Some(said))
                }
            }
        }
        None => {
            // The SDK crate beside this one in the workspace this autocomp was built from.
            let framework = Path::new(env!("CARGO_MANIFEST_DIR")).with_file_name("framework");
            if !framework.join("Cargo.toml").is_file() {
                return Err(refused(format!(
                    "the framework sources this autocomp was built from are not at {} any more; run autocomp new \
                     inside the autocomp workspace (or with --dir inside it)",
                    framework.display()
                )));
            }
            let framework = framework.to_str().ok_or_else(|| {
                refused(format!(
                    "the framework's path {} is not UTF-8, so Cargo.toml cannot name it",
                    framework.display()
                ))
            })?;
            (text.cargo_toml_standalone(framework), None, None)
        }
    };

    let mut files = vec![
        ("Cargo.toml".to_owned(), cargo_toml),
        ("src/main.rs".to_owned(), text.main_rs()),
        ("src/tests.rs".to_owned(), text.tests_rs()),
        (format!("{}.toml", name.as_str()), text.config_toml()),
    ];
    if workspace.is_none() {
        // The layout main.rs is written in (the workspace's), so `cargo fmt` leaves it as it is.
        files.push(("rustfmt.toml".to_owned(), RUSTFMT_TOML.to_owned()));
    }
    Ok(Plan { target, name: name.as_str().to_owned(), files, manifest, membership, workspace })
}

/// A component name that is also a good crate and binary name.
fn crate_name(name: &str) -> Result<ComponentName, InvalidInput> {
    let valid = ComponentName::new(name)?;
    let refuse = |reason: &str| Err(InvalidInput::new("component", name, reason));
    if !name.starts_with(|c: char| c.is_ascii_lowercase()) {
        return refuse("must start with a lower-case letter: it is also the crate's name");
    }
    if name.contains('.') {
        return refuse("must not contain '.': it is also the crate's name (letters, digits, '-' and '_')");
    }
    if name.chars().any(|c| c.is_ascii_uppercase()) {
        return refuse("must be lower-case: it is also the crate's name, which the compiler wants in snake case");
    }
    if RESERVED.split_whitespace().any(|word| word == name.replace('-', "_")) {
        return refuse("is a Rust keyword or a name cargo reserves; choose another name");
    }
    Ok(valid)
}

/// Rust keywords and the names cargo refuses for a package or keeps for itself.
const RESERVED: &str = "abstract alloc as async await become box break build const continue core crate deps do \
    dyn else enum examples extern false final fn for gen if impl in incremental let loop macro match mod move mut \
    override priv proc_macro pub ref return self static std struct super test trait true try type typeof unsafe \
    unsized use virtual where while yield";

fn requires(given: &[String], own: &EventType) -> Result<Vec<String>, InvalidInput> {
    if given.is_empty() {
        return Ok(vec![DEFAULT_REQUIRES.to_owned()]);
    }
    let mut requires = Vec::new();
    for value in given {
        let event_type =
            EventType::new(value.as_str()).map_err(|e| InvalidInput::new("required event type", value, e.reason))?;
        if event_type == *own {
            let reason = "is the event type the component records; a batch could never be ready for it";
            return Err(InvalidInput::new("required event type", value, reason));
        }
        if requires.contains(value) {
            return Err(InvalidInput::new("required event type", value, "is named twice"));
        }
        requires.push(value.clone());
    }
    Ok(requires)
}

fn refused(message: String) -> OperatorError {
    OperatorError::Refused(message)
}

fn absolute(cwd: &Path, dir: &Path) -> PathBuf {
    let mut path = PathBuf::new();
    for part in cwd.join(dir).components() {
        match part {
            PathPart::CurDir => {}
            PathPart::ParentDir => {
                path.pop();
            }
            other => path.push(other),
        }
    }
    path
}

/// The nearest directory at or above `from` that exists, resolved (symlinks followed), with
/// the part of `from` that does not exist yet.
fn existing_ancestor(from: &Path) -> Option<(PathBuf, PathBuf)> {
    let mut rest = Vec::new();
    let mut dir = from;
    loop {
        if let Ok(resolved) = dir.canonicalize() {
            let missing: PathBuf = rest.iter().rev().collect();
            return Some((resolved, missing));
        }
        rest.push(dir.file_name()?.to_owned());
        dir = dir.parent()?;
    }
}

enum Workspace {
    /// The autocomp workspace's root directory.
    Autocomp(PathBuf),
    /// Another cargo workspace, which would claim a crate written below it.
    Other,
}

/// The cargo workspace a crate written in `dir` would belong to: the first `Cargo.toml` with a
/// `[workspace]` table at or above it, as cargo looks for one. It is the autocomp workspace if
/// its members include "framework".
fn find_workspace(dir: &Path) -> Option<Workspace> {
    let (start, _) = existing_ancestor(dir)?;
    for dir in start.ancestors() {
        let Ok(text) = std::fs::read_to_string(dir.join("Cargo.toml")) else { continue };
        let Ok(manifest) = text.parse::<toml::Table>() else { continue };
        let Some(workspace) = manifest.get("workspace") else { continue };
        let members = workspace.get("members").and_then(toml::Value::as_array);
        let autocomp = members.is_some_and(|m| m.iter().any(|m| m.as_str() == Some("framework")));
        return Some(if autocomp { Workspace::Autocomp(dir.to_path_buf()) } else { Workspace::Other });
    }
    None
}

/// `target`'s path below `root` as a members entry ("components/page-counter").
fn relative_member(root: &Path, target: &Path) -> Result<String, OperatorError> {
    let (resolved, missing) =
        existing_ancestor(target).ok_or_else(|| refused(format!("{} has no parent", target.display())))?;
    let relative = resolved.join(missing);
    let relative = relative
        .strip_prefix(root)
        .map_err(|_| refused(format!("{} is not below the workspace root {}", target.display(), root.display())))?;
    let parts: Option<Vec<&str>> = relative.components().map(|p| p.as_os_str().to_str()).collect();
    parts.map(|parts| parts.join("/")).ok_or_else(|| refused(format!("{} is not UTF-8", relative.display())))
}

/// Package and binary names of the workspace at `root` (its members' `Cargo.toml`s).
fn workspace_names(root: &Path) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let Ok(text) = std::fs::read_to_string(root.join("Cargo.toml")) else { return names };
    let Ok(manifest) = text.parse::<toml::Table>() else { return names };
    let members = manifest.get("workspace").and_then(|w| w.get("members")).and_then(toml::Value::as_array);
    for pattern in members.into_iter().flatten().filter_map(toml::Value::as_str) {
        for dir in expand(root, pattern) {
            let Ok(text) = std::fs::read_to_string(dir.join("Cargo.toml")) else { continue };
            let Ok(member) = text.parse::<toml::Table>() else { continue };
            let package = member.get("package").and_then(|p| p.get("name")).and_then(toml::Value::as_str);
            names.extend(package.map(str::to_owned));
            let bins = member.get("bin").and_then(toml::Value::as_array).into_iter().flatten();
            names.extend(bins.filter_map(|b| b.get("name")?.as_str().map(str::to_owned)));
            if let Ok(entries) = std::fs::read_dir(dir.join("src/bin")) {
                let stems = entries.flatten().filter_map(|e| Some(e.path().file_stem()?.to_str()?.to_owned()));
                names.extend(stems);
            }
        }
    }
    names
}

/// The directories a members pattern names ('*' and '?' within one path segment).
fn expand(root: &Path, pattern: &str) -> Vec<PathBuf> {
    let mut dirs = vec![root.to_path_buf()];
    for segment in pattern.split('/').filter(|s| !s.is_empty() && *s != ".") {
        let mut next = Vec::new();
        for dir in dirs {
            if !segment.contains(['*', '?']) {
                next.push(dir.join(segment));
                continue;
            }
            let Ok(entries) = std::fs::read_dir(&dir) else { continue };
            for entry in entries.flatten() {
                let matched = entry.file_name().to_str().is_some_and(|name| segment_matches(segment, name));
                if matched && entry.path().is_dir() {
                    next.push(entry.path());
                }
            }
        }
        dirs = next;
    }
    dirs
}

/// Whether a members pattern (glob: '*', '?', "**" for any number of segments) covers `path`.
fn pattern_covers(pattern: &str, path: &str) -> bool {
    fn parts(text: &str) -> Vec<&str> {
        text.split('/').filter(|s| !s.is_empty() && *s != ".").collect()
    }
    fn matches(pattern: &[&str], path: &[&str]) -> bool {
        match (pattern.split_first(), path.split_first()) {
            (None, None) => true,
            (Some((&"**", rest)), _) => matches(rest, path) || (!path.is_empty() && matches(pattern, &path[1..])),
            (Some((segment, rest)), Some((name, names))) => segment_matches(segment, name) && matches(rest, names),
            _ => false,
        }
    }
    matches(&parts(pattern), &parts(path))
}

fn segment_matches(pattern: &str, name: &str) -> bool {
    fn go(pattern: &[char], name: &[char]) -> bool {
        match pattern.split_first() {
            None => name.is_empty(),
            Some(('*', rest)) => (0..=name.len()).any(|skip| go(rest, &name[skip..])),
            Some(('?', rest)) => !name.is_empty() && go(rest, &name[1..]),
            Some((c, rest)) => name.first() == Some(c) && go(rest, &name[1..]),
        }
    }
    let pattern: Vec<char> = pattern.chars().collect();
    let name: Vec<char> = name.chars().collect();
    go(&pattern, &name)
}

#[derive(Debug, PartialEq)]
enum MemberEdit {
    /// The manifest's new text, with `member` appended to `members`.
    Added(String),
    /// A members entry (e.g. "components/*") that already covers `member`.
    Covered(String),
}

/// Adds `member` to the `members` array of the `[workspace]` table in a manifest's text,
/// touching nothing else: the entry goes after the last one, on its own line with the same
/// indentation when the array has one entry a line, else on the same line.
fn add_member(manifest: &str, member: &str) -> Result<MemberEdit, String> {
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

/// Finds `members = [...]` in `[workspace]` (or `workspace.members` at the top level) with a
/// small TOML scanner: strings, comments, table headers and nested brackets, enough to find
/// where the array's entries end without reformatting anything.
fn members_array(text: &str) -> Option<ArraySpan> {
    let bytes = text.as_bytes();
    let mut table = String::new();
    let mut i = 0;
    while i < bytes.len() {
        // At the start of a line (after blanks): a header, a key, a comment or nothing.
        while i < bytes.len() && matches!(bytes[i], b' ' | b'\t' | b'\r' | b'\n') {
            i += 1;
        }
        if i >= bytes.len() {
            break;
        }
        match bytes[i] {
            b'#' => i = skip_comment(bytes, i),
            b'[' => {
                let end = text[i..].find(']').map(|n| i + n)?;
                table = text[i..end].trim_start_matches('[').trim().to_owned();
                i = skip_comment(bytes, end);
            }
            _ => {
                let equals = text[i..].find('=').map(|n| i + n)?;
                let key: String =
                    text[i..equals].split('.').map(|p| p.trim().trim_matches('"')).collect::<Vec<_>>().join(".");
                let mut at = equals + 1;
                while at < bytes.len() && matches!(bytes[at], b' ' | b'\t') {
                    at += 1;
                }
                let full_key = if table.is_empty() { key } else { format!("{table}.{key}") };
                if full_key == "workspace.members" {
                    return (bytes.get(at) == Some(&b'[')).then(|| scan_array(bytes, at)).flatten();
                }
                i = skip_value(bytes, at)?;
            }
        }
    }
    None
}

/// Past the end of the line (a comment runs to it).
fn skip_comment(bytes: &[u8], from: usize) -> usize {
    bytes[from..].iter().position(|b| *b == b'\n').map_or(bytes.len(), |n| from + n + 1)
}

/// Past a string starting at `from` (basic, literal, or either multi-line form).
fn skip_string(bytes: &[u8], from: usize) -> Option<usize> {
    let quote = bytes[from];
    let triple = bytes.get(from..from + 3) == Some(&[quote, quote, quote][..]);
    let mut i = from + if triple { 3 } else { 1 };
    while i < bytes.len() {
        match bytes[i] {
            b'\\' if quote == b'"' => i += 2,
            b if b == quote && !triple => return Some(i + 1),
            b if b == quote && bytes.get(i..i + 3) == Some(&[quote, quote, quote][..]) => {
                // A closing delimiter may carry up to two more quotes of content.
                let mut end = i + 3;
                while bytes.get(end) == Some(&quote) && end < i + 5 {
                    end += 1;
                }
                return Some(end);
            }
            _ => i += 1,
        }
    }
    None
}

/// Past a value starting at `from`: to the end of its line, or of its brackets or braces.
fn skip_value(bytes: &[u8], from: usize) -> Option<usize> {
    let mut depth = 0usize;
    let mut i = from;
    while i < bytes.len() {
        match bytes[i] {
            b'"' | b'\'' => i = skip_string(bytes, i)?,
            b'#' => {
                if depth == 0 {
                    return Some(skip_comment(bytes, i));
                }
                i = skip_comment(bytes, i);
            }
            b'[' | b'{' => {
                depth += 1;
                i += 1;
            }
            b']' | b'}' => {
                depth = depth.checked_sub(1)?;
                i += 1;
            }
            b'\n' if depth == 0 => return Some(i + 1),
            _ => i += 1,
        }
    }
    Some(i)
}

fn scan_array(bytes: &[u8], open: usize) -> Option<ArraySpan> {
    let mut depth = 0usize;
    let mut last_value_end = None;
    let mut trailing_comma = false;
    let mut i = open;
    while i < bytes.len() {
        match bytes[i] {
            b'"' | b'\'' => {
                i = skip_string(bytes, i)?;
                if depth == 1 {
                    (last_value_end, trailing_comma) = (Some(i), false);
                }
            }
            b'#' => i = skip_comment(bytes, i),
            b'[' | b'{' => {
                depth += 1;
                i += 1;
            }
            b']' | b'}' => {
                depth -= 1;
                i += 1;
                if depth == 0 {
                    return Some(ArraySpan { open, close: i - 1, last_value_end, trailing_comma });
                }
                if depth == 1 {
                    (last_value_end, trailing_comma) = (Some(i), false);
                }
            }
            b',' if depth == 1 => {
                trailing_comma = true;
                i += 1;
            }
            b' ' | b'\t' | b'\r' | b'\n' => i += 1,
            _ => {
                i += 1;
                if depth == 1 {
                    (last_value_end, trailing_comma) = (Some(i), false);
                }
            }
        }
    }
    None
}

impl Plan {
    fn write(&self) -> Result<String, OperatorError> {
        let parent = self.target.parent().expect("checked in plan");
        let created =
            create_parents(parent).map_err(|e| refused(format!("cannot create {}: {e}", parent.display())))?;
        // Nothing half-written: on an error the crate goes (if it was moved into place), and so
        // do the directories made for it.
        let undo = |e: String, crate_written: bool| {
            if crate_written {
                std::fs::remove_dir_all(&self.target).ok();
            }
            for dir in created.iter().rev() {
                std::fs::remove_dir(dir).ok();
            }
            refused(format!("{e}; nothing was written"))
        };
        let paths = self.write_crate(parent).map_err(|e| undo(e, false))?;
        if let Some((path, text)) = &self.manifest {
            replace_file(path, text).map_err(|e| undo(e, true))?;
        }
        Ok(self.render(&paths))
    }

    /// Writes the crate into a hidden directory next to the target and renames it into
    /// place, so the target appears complete or not at all.
    fn write_crate(&self, parent: &Path) -> Result<Vec<PathBuf>, String> {
        let staging = tempfile::Builder::new()
            .prefix(".autocomp-new-")
            .tempdir_in(parent)
            .map_err(|e| format!("cannot write in {}: {e}", parent.display()))?;
        let mut paths = Vec::new();
        for (file, text) in &self.files {
            let path = staging.path().join(file);
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
            }
            std::fs::write(&path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
            paths.push(self.target.join(file));
        }
        if self.target.symlink_metadata().is_ok() {
            return Err(format!("{} appeared while it was being written", self.target.display()));
        }
        std::fs::rename(staging.path(), &self.target)
            .map_err(|e| format!("cannot move the crate to {}: {e}", self.target.display()))?;
        Ok(paths)
    }

    fn render(&self, paths: &[PathBuf]) -> String {
        let mut out = String::new();
        for path in paths {
            writeln!(out, "{}", path.display()).ok();
        }
        let config = self.target.join(format!("{}.toml", self.name));
        let name = &self.name;
        match (&self.manifest, &self.membership) {
            (Some((manifest, _)), Some(said)) => writeln!(out, "{} {said}", manifest.display()).ok(),
            (None, Some(said)) => writeln!(out, "({said})").ok(),
            _ => None,
        };
        out.push_str("\nNext:\n");
        let binary = match &self.workspace {
            Some(root) => {
                writeln!(out, "  cd {} && cargo build -p {name} && cargo test -p {name}", root.display()).ok();
                root.join("target/debug").join(name)
            }
            None => {
                writeln!(out, "  cd {} && cargo build && cargo test", self.target.display()).ok();
                self.target.join("target/debug").join(name)
            }
        };
        writeln!(out, "  make work() in src/main.rs the real step, and src/tests.rs its tests").ok();
        writeln!(
            out,
            "  cp {} CONFIG_DIR/{name}.toml   # CONFIG_DIR holds autocomp.toml (/etc/autocomp by default)",
            config.display()
        )
        .ok();
        writeln!(out, "  {} --config-dir CONFIG_DIR --dry-run   # what one pass would claim", binary.display()).ok();
        writeln!(out, "  {} --config-dir CONFIG_DIR             # one pass, as cron starts it", binary.display()).ok();
        out
    }
}

/// Creates `dir` and its missing parents; returns those it created, outermost first.
fn create_parents(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let missing: Vec<PathBuf> = dir.ancestors().take_while(|d| !d.exists()).map(Path::to_path_buf).collect();
    std::fs::create_dir_all(dir)?;
    Ok(missing.into_iter().rev().collect())
}

/// Replaces a file's text by renaming a sibling over it (its permissions kept), so a
/// failure leaves the old text whole.
fn replace_file(path: &Path, text: &str) -> Result<(), String> {
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

/// The layout of the workspace's `rustfmt.toml`, for a crate written outside it.
const RUSTFMT_TOML: &str = "max_width = 120\nuse_small_heuristics = \"Max\"\n";

/// The generated files' texts.
struct Texts<'a> {
    name: &'a str,
    event_type: &'a str,
    requires: &'a [String],
}

impl Texts<'_> {
    /// The component's type name: the crate name in upper camel case, unless that would
    /// shadow a name `main.rs` uses.
    fn type_name(&self) -> String {
        let camel: String = self
            .name
            .split(['-', '_'])
            .filter(|part| !part.is_empty())
            .map(|part| {
                let mut chars = part.chars();
                chars.next().map(|c| c.to_ascii_uppercase()).into_iter().chain(chars).collect::<String>()
            })
            .collect();
        const USED: &str = "Settings Counted Component Batch Trigger WorkContext WorkError IoResultExt Outcome \
            Serialize Deserialize Default Debug PartialEq Result Ok Err Option Some None Vec String Box Iterator Fn \
            Send Sync Sized Copy Clone";
        if USED.split_whitespace().any(|word| word == camel) { format!("{camel}Component") } else { camel }
    }

    /// The `Trigger::builder()` chain, laid out as rustfmt (at the workspace's width) would:
    /// on one line when it fits, else one call a line.
    fn trigger(&self) -> String {
        let quoted: Vec<String> = self.requires.iter().map(|t| format!("\"{t}\"")).collect();
        let list = format!("[{}]", quoted.join(", "));
        let own = format!("\"{}\"", self.event_type);
        let line = format!("        Trigger::builder().requires({list}).blocked_by({own}).build()");
        if line.len() <= 120 {
            return line;
        }
        let mut chain = String::from("        Trigger::builder()\n");
        if 12 + ".requires()".len() + list.len() <= 120 {
            writeln!(chain, "            .requires({list})").ok();
        } else {
            for required in &quoted {
                writeln!(chain, "            .requires({required})").ok();
            }
        }
        write!(chain, "            .blocked_by({own})\n            .build()").ok();
        chain
    }

    fn main_rs(&self) -> String {
        MAIN_RS
            .replace("@NAME@", self.name)
            .replace("@TYPE@", self.event_type)
            .replace("@STRUCT@", &self.type_name())
            .replace("@TRIGGER@", &self.trigger())
    }

    fn tests_rs(&self) -> String {
        TESTS_RS.replace("@STRUCT@", &self.type_name())
    }

    fn config_toml(&self) -> String {
        let requires: Vec<String> = self.requires.iter().map(|t| format!("\"{t}\"")).collect();
        CONFIG_TOML
            .replace("@NAME@", self.name)
            .replace("@TYPE@", self.event_type)
            .replace("@REQUIRES@", &requires.join(", "))
    }

    fn description(&self) -> String {
        format!("Autonomous component: records {} with the number of files in the batch's directory.", self.event_type)
    }

    fn cargo_toml_in_workspace(&self) -> String {
        CARGO_TOML_IN_WORKSPACE.replace("@NAME@", self.name).replace("@DESCRIPTION@", &self.description())
    }

    fn cargo_toml_standalone(&self, framework: &str) -> String {
        let framework = toml::Value::String(framework.to_owned()).to_string();
        CARGO_TOML_STANDALONE
            .replace("@NAME@", self.name)
            .replace("@DESCRIPTION@", &self.description())
            .replace("@FRAMEWORK@", &framework)
    }
}

const CARGO_TOML_IN_WORKSPACE: &str = r#"[package]
name = "@NAME@"
description = "@DESCRIPTION@"
version.workspace = true
edition.workspace = true
license.workspace = true
rust-version.workspace = true
publish = false

[dependencies]
autocomp-framework.workspace = true
serde.workspace = true

[dev-dependencies]
autocomp-framework = { workspace = true, features = ["testing"] }
tempfile.workspace = true
"#;

const CARGO_TOML_STANDALONE: &str = r#"[package]
name = "@NAME@"
description = "@DESCRIPTION@"
version = "0.1.0"
edition = "2024"
publish = false

[dependencies]
# The framework sources the `autocomp` that wrote this crate was built from.
autocomp-framework = { path = @FRAMEWORK@ }
serde = { version = "1", features = ["derive"] }

[dev-dependencies]
autocomp-framework = { path = @FRAMEWORK@, features = ["testing"] }
tempfile = "3"

# Its own workspace: one in a directory above must not claim it.
[workspace]
"#;

// The generated component: at most 40 lines, so that a reader sees all of it at once.
// `dir` borrows the context only until the files are counted, so `context.fail` may follow.
const MAIN_RS: &str = r#"//! `@NAME@`: records `@TYPE@` with the number of files in the batch's directory.
use autocomp_framework::prelude::*;
#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct Settings {
    min_files: usize,
}
#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct Counted {
    files: usize,
}
struct @STRUCT@;
impl Component for @STRUCT@ {
    type Settings = Settings;
    fn name(&self) -> &str {
        "@NAME@"
    }
    fn version(&self) -> &str {
        env!("CARGO_PKG_VERSION")
    }
    fn event_type(&self) -> &str {
        "@TYPE@"
    }
    fn trigger(&self) -> Trigger {
@TRIGGER@
    }
    fn work(&self, _batch: &Batch, settings: &Settings, context: &mut WorkContext) -> Result<(), WorkError> {
        let dir = context.location()?;
        let entries = std::fs::read_dir(dir).and_then(|d| d.collect::<Result<Vec<_>, _>>()).with_path(dir)?;
        let files = entries.iter().filter(|entry| entry.path().is_file()).count();
        if files < settings.min_files {
            context.fail("too_few_files", format!("{files} files, fewer than min_files = {}", settings.min_files));
        }
        context.set_result(&Counted { files })
    }
}
fn main() -> std::process::ExitCode {
    autocomp_framework::main(@STRUCT@)
}
mod tests;
"#;

const TESTS_RS: &str = r#"//! `work` on real directories, recorded the way the runner would record it. Compiled for
//! tests only (the attribute below), so that `main.rs` needs no more than `mod tests;`.
#![cfg(test)]

use autocomp_framework::testing::{run_work_on, settings};

use super::*;

#[test]
fn records_the_number_of_files_as_its_result() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("page-1.txt"), "one").unwrap();
    std::fs::write(dir.path().join("page-2.txt"), "two").unwrap();
    std::fs::create_dir(dir.path().join("not-a-file")).unwrap();

    let run = run_work_on(&@STRUCT@, &settings(""), dir.path());

    assert!(run.succeeded(), "{:?}", run.report);
    assert_eq!(run.result::<Counted>(), Some(Counted { files: 2 }));
}

#[test]
fn fewer_files_than_min_files_fail_the_batch_with_the_count() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("page-1.txt"), "one").unwrap();

    let run = run_work_on(&@STRUCT@, &settings("min_files = 2"), dir.path());

    assert!(!run.succeeded() && !run.is_transient(), "{:?}", run.report);
    assert_eq!(run.report.failures[0].kind, "too_few_files");
    assert_eq!(run.result::<Counted>(), Some(Counted { files: 1 }));
}

#[test]
fn a_missing_directory_is_a_permanent_failure_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("not-delivered");

    let run = run_work_on(&@STRUCT@, &settings(""), &missing);

    let Err(WorkError::Permanent(message)) = &run.returned else { panic!("{:?}", run.returned) };
    assert!(message.contains("not-delivered"), "{message}");
}
"#;

const CONFIG_TOML: &str = r#"# @NAME@'s config: copy it into the config dir, next to autocomp.toml
# (/etc/autocomp by default).
event_type = "@TYPE@"

# [trigger]                  # replaces the component's default clauses, clause by clause
# requires = [@REQUIRES@]
# blocked_by = ["@TYPE@"]

# [settings]                 # the defaults
# min_files = 0              # fewer files in the batch's directory fail the batch
"#;

#[cfg(test)]
mod tests {
    use super::*;

    fn added(manifest: &str, member: &str) -> String {
        match add_member(manifest, member) {
            Ok(MemberEdit::Added(text)) => {
                let members = text.parse::<toml::Table>().unwrap()["workspace"]["members"].clone();
                assert!(members.as_array().unwrap().iter().any(|m| m.as_str() == Some(member)), "{text}");
                text
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_one_line_members_array_gets_the_entry_on_its_line() {
        let manifest = r#"[workspace]
resolver = "3"
members = ["store", "framework"] # ours

[workspace.dependencies]
serde = "1"
"#;
        let expected = r#"[workspace]
resolver = "3"
members = ["store", "framework", "components/x"] # ours

[workspace.dependencies]
serde = "1"
"#;
        assert_eq!(added(manifest, "components/x"), expected);
    }

    #[test]
    fn an_array_with_one_entry_a_line_gets_a_line_indented_alike() {
        let manifest = "[workspace]\nmembers = [\n  \"store\",\n  \"framework\", # the framework\n]\n";
        let expected =
            "[workspace]\nmembers = [\n  \"store\",\n  \"framework\", # the framework\n  \"components/x\",\n]\n";
        assert_eq!(added(manifest, "components/x"), expected);
        let windows = manifest.replace('\n', "\r\n");
        assert_eq!(added(&windows, "components/x"), expected.replace('\n', "\r\n"));
    }

    #[test]
    fn a_last_entry_without_comma_gets_one() {
        let manifest = "[workspace]\nmembers = [\n    \"framework\"  # last\n]\n";
        let expected = "[workspace]\nmembers = [\n    \"framework\",  # last\n    \"components/x\"\n]\n";
        assert_eq!(added(manifest, "components/x"), expected);
    }

    #[test]
    fn brackets_and_hashes_in_strings_and_comments_are_not_the_array() {
        let manifest = r#"# members = ["no"]
[package]
name = "a]#"
keys = ['[', "\"]", """
members = [
"""]

[workspace]
# [not a header]
members = ["framework", 'odd]#name' ] # ] here
exclude = ["x"]
"#;
        let expected = manifest.replace("'odd]#name' ]", "'odd]#name', \"components/x\" ]");
        assert_eq!(added(manifest, "components/x"), expected);
    }

    #[test]
    fn a_dotted_key_and_an_empty_array_are_found() {
        assert_eq!(added("workspace.members = []\n", "components/x"), "workspace.members = [\"components/x\"]\n");
        let manifest = "[workspace]\nmembers = [\n]\n";
        assert_eq!(added(manifest, "c/x"), "[workspace]\nmembers = [\"c/x\"\n]\n");
    }

    #[test]
    fn a_pattern_covering_the_member_leaves_the_text_alone() {
        let manifest = "[workspace]\nmembers = [\"framework\", \"components/*\"]\n";
        assert_eq!(add_member(manifest, "components/x"), Ok(MemberEdit::Covered("components/*".into())));
        assert_eq!(
            add_member(manifest, "other/x"),
            Ok(MemberEdit::Added("[workspace]\nmembers = [\"framework\", \"components/*\", \"other/x\"]\n".into()))
        );
        assert!(pattern_covers("tools/**", "tools/a/b") && pattern_covers("c?mp*/x", "comps/x"));
        assert!(!pattern_covers("components/*", "components/a/b") && !pattern_covers("framework", "frameworks"));
    }

    #[test]
    fn a_manifest_without_members_is_refused() {
        assert!(add_member("[package]\nname = \"a\"\n", "c/x").is_err());
        assert!(add_member("[workspace\n", "c/x").is_err());
    }

    #[test]
    fn the_generated_main_rs_fits_in_forty_lines() {
        let text = Texts { name: "page-counter", event_type: "Pages_Counted", requires: &["Data_Received".into()] };
        let main = text.main_rs();
        assert!(main.lines().count() <= 40, "{main}");
        assert!(main.contains("struct PageCounter;") && main.contains(".blocked_by(\"Pages_Counted\")"), "{main}");
        assert_eq!(Texts { name: "settings", ..text }.type_name(), "SettingsComponent");
    }

    /// Inside the workspace `cargo fmt --check` must stay clean after `autocomp new`: the
    /// texts are written in the layout rustfmt gives them, a long trigger included.
    #[test]
    fn the_generated_sources_are_laid_out_as_rustfmt_would() {
        let long = |c: &str, n: usize| c.repeat(n);
        let shapes = [
            ("short", long("A", 10), vec![long("R", 10)]),
            ("chain", long("A", 20), vec![long("R", 40), long("S", 40)]),
            ("one-a-line", long("A", 64), vec![long("R", 64), long("S", 64), long("T", 64)]),
        ];
        for (name, event_type, requires) in shapes {
            let text = Texts { name, event_type: &event_type, requires: &requires };
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(dir.path().join("rustfmt.toml"), RUSTFMT_TOML).unwrap();
            std::fs::write(dir.path().join("main.rs"), text.main_rs()).unwrap();
            std::fs::write(dir.path().join("tests.rs"), text.tests_rs()).unwrap();
            let check = std::process::Command::new("rustfmt")
                .args(["--edition", "2024", "--check", "main.rs"])
                .current_dir(dir.path())
                .output()
                .expect("rustfmt runs (rustup component add rustfmt)");
            let diff = String::from_utf8_lossy(&check.stdout);
            assert!(check.status.success(), "{name}: rustfmt would change it:\n{diff}{}", text.main_rs());
        }
    }

    #[test]
    fn bad_names_and_types_are_refused_naming_the_field_and_value() {
        for bad in ["9lives", "a.b", "Caps", "fn", "bad name", ""] {
            let e = crate_name(bad).unwrap_err();
            assert_eq!((e.field.as_str(), e.value.as_str()), ("component", bad));
        }
        let own = EventType::new("Counted").unwrap();
        for bad in [vec!["1x".to_owned()], vec!["Counted".to_owned()], vec!["A".to_owned(), "A".to_owned()]] {
            let e = requires(&bad, &own).unwrap_err();
            assert_eq!(e.field, "required event type");
        }
        assert_eq!(requires(&[], &own).unwrap(), ["Data_Received"]);
    }
}
