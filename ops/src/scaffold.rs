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
                        or DIR exists.\n\n\
                        With --lang python it writes DIR/NAME.py (a step for autocomp-exec: a work function on \
                        the autocomp_step module of contrib/python), DIR/test_NAME.py (its unittest), DIR/NAME.toml \
                        and DIR/README.md (the autocomp-exec command and crontab line), with '-' in NAME as '_' \
                        in the Python file names; with --lang shell DIR/NAME.sh, DIR/test_NAME.sh, DIR/NAME.toml \
                        and DIR/README.md. DIR defaults to ./NAME for both.")]
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
    /// workspace holding the current directory, else ./NAME; ./NAME for python and shell].
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// rust (a component crate), python (a step for autocomp-exec on the autocomp_step
    /// module, contrib/python) or shell (an sh script for autocomp-exec).
    #[arg(long, value_name = "LANG", default_value = "rust")]
    pub lang: String,
}

/// The language `autocomp new` writes the step in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lang {
    Rust,
    Python,
    Shell,
}

impl Lang {
    fn parse(text: &str) -> Result<Self, InvalidInput> {
        match text {
            "rust" => Ok(Lang::Rust),
            "python" => Ok(Lang::Python),
            "shell" => Ok(Lang::Shell),
            _ => Err(InvalidInput::new("--lang", text, "must be rust, python or shell")),
        }
    }
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
    /// For a Python or shell step: what its next steps say.
    script: Option<ScriptNext>,
}

fn plan(args: &NewArgs, cwd: &Path) -> Result<Plan, OperatorError> {
    let lang = Lang::parse(&args.lang)?;
    if lang != Lang::Rust {
        return plan_script(args, cwd, lang);
    }
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
    Ok(Plan { target, name: name.as_str().to_owned(), files, manifest, membership, workspace, script: None })
}

/// A Python or shell step for `autocomp-exec`: no crate, nothing added to a workspace.
fn plan_script(args: &NewArgs, cwd: &Path, lang: Lang) -> Result<Plan, OperatorError> {
    let name = ComponentName::new(args.name.as_str())?;
    let event_type = EventType::new(args.event_type.as_str())?;
    let requires = requires(&args.requires, &event_type)?;
    let stem = match lang {
        Lang::Python => python_module(name.as_str())?,
        _ => name.as_str().to_owned(),
    };
    let target = match &args.dir {
        Some(dir) => absolute(cwd, dir),
        None => cwd.join(name.as_str()),
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
    // A directory a members pattern covers (components/*) without a Cargo.toml would break
    // every cargo command in the workspace.
    if let Some(Workspace::Autocomp(root)) = find_workspace(parent) {
        let member = relative_member(&root, &target)?;
        if let Some(pattern) = workspace_patterns(&root).into_iter().find(|p| pattern_covers(p, &member)) {
            let reason = format!(
                "is covered by the workspace members pattern \"{pattern}\" of {}, and a directory there must be a \
                 crate; choose another --dir",
                root.join("Cargo.toml").display()
            );
            return Err(InvalidInput::new("directory", target.display().to_string(), reason).into());
        }
    }
    let text = Texts { name: name.as_str(), event_type: event_type.as_str(), requires: &requires };
    let script = ScriptNext {
        lang,
        stem: stem.clone(),
        event_type: event_type.as_str().to_owned(),
        requires: requires.join(","),
        python_path: python_path(),
    };
    let files = match lang {
        Lang::Python => vec![
            (format!("{stem}.py"), text.python_step()),
            (format!("test_{stem}.py"), text.python_test(&stem)),
            (format!("{}.toml", name.as_str()), text.script_config_toml()),
            ("README.md".to_owned(), text.script_readme(&script, &target)),
        ],
        _ => vec![
            (format!("{stem}.sh"), text.shell_step()),
            (format!("test_{stem}.sh"), text.shell_test(&stem)),
            (format!("{}.toml", name.as_str()), text.script_config_toml()),
            ("README.md".to_owned(), text.script_readme(&script, &target)),
        ],
    };
    Ok(Plan {
        target,
        name: name.as_str().to_owned(),
        files,
        manifest: None,
        membership: None,
        workspace: None,
        script: Some(script),
    })
}

/// What the output and the README of a Python or shell step say.
#[derive(Debug)]
struct ScriptNext {
    lang: Lang,
    /// The file name stem: `NAME` ('-' as '_' for Python, an importable module name).
    stem: String,
    event_type: String,
    /// The required types, comma-separated, for `--requires`.
    requires: String,
    /// `contrib/python` of the sources this autocomp was built from, when it is still there.
    python_path: Option<String>,
}

impl ScriptNext {
    fn file(&self, dir: &Path) -> PathBuf {
        dir.join(match self.lang {
            Lang::Python => format!("{}.py", self.stem),
            _ => format!("{}.sh", self.stem),
        })
    }

    /// `PYTHONPATH=... ` when the module is not installed (the sources' contrib/python).
    fn env(&self) -> String {
        match (&self.python_path, self.lang) {
            (Some(path), Lang::Python) => format!("PYTHONPATH={path} "),
            _ => String::new(),
        }
    }

    fn exec(&self, name: &str, dir: &Path, extra: &str) -> String {
        let interpreter = if self.lang == Lang::Python { "python3" } else { "sh" };
        format!(
            "{}autocomp-exec --name {name} --event-type {} --requires {}{extra} -- {interpreter} {}",
            self.env(),
            self.event_type,
            self.requires,
            self.file(dir).display()
        )
    }

    fn test(&self, dir: &Path) -> String {
        match self.lang {
            Lang::Python => format!("cd {} && {}python3 -m unittest test_{}", dir.display(), self.env(), self.stem),
            _ => format!("cd {} && sh test_{}.sh", dir.display(), self.stem),
        }
    }
}

/// Where the autocomp_step module is in the sources this autocomp was built from.
fn python_path() -> Option<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).with_file_name("contrib").join("python");
    path.join("autocomp_step/__init__.py").is_file().then(|| path.to_str().map(str::to_owned)).flatten()
}

/// The Python module name of a component name ('-' as '_'), refused when Python could not
/// import it or it would shadow a module the step or its test imports.
fn python_module(name: &str) -> Result<String, InvalidInput> {
    let module = name.replace('-', "_");
    let refuse = |reason: &str| Err(InvalidInput::new("component", name, reason));
    if !module.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_') || module.contains('.') {
        return refuse("must start with a letter and hold no '.': it is also the step's Python module name");
    }
    if PYTHON_RESERVED.split_whitespace().any(|word| word == module) {
        return refuse(
            "is a Python keyword or a module the step imports (its file would shadow it); choose another name",
        );
    }
    Ok(module)
}

/// Python keywords and the modules a generated step, its test and autocomp_step import.
const PYTHON_RESERVED: &str = "False None True and as assert async await break class continue def del elif else \
    except finally for from global if import in is lambda nonlocal not or pass raise return try while with yield \
    autocomp_step autocomp_step_build contextlib dataclasses io json os pathlib subprocess sys tempfile test \
    tests textwrap traceback typing unittest";

/// The `members` patterns of the workspace at `root`.
fn workspace_patterns(root: &Path) -> Vec<String> {
    let Ok(text) = std::fs::read_to_string(root.join("Cargo.toml")) else { return Vec::new() };
    let Ok(manifest) = text.parse::<toml::Table>() else { return Vec::new() };
    let members = manifest.get("workspace").and_then(|w| w.get("members")).and_then(toml::Value::as_array);
    members.into_iter().flatten().filter_map(toml::Value::as_str).map(str::to_owned).collect()
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
        if let Some(script) = &self.script {
            out.push_str("\nNext:\n");
            writeln!(out, "  {}   # its tests, no autocomp needed", script.test(&self.target)).ok();
            let what = if script.lang == Lang::Python { "work() in the .py file" } else { "the .sh script" };
            writeln!(out, "  make {what} the real step, and the test_ file its tests").ok();
            writeln!(
                out,
                "  cp {} CONFIG_DIR/{name}.toml   # CONFIG_DIR holds autocomp.toml (/etc/autocomp by default)",
                config.display()
            )
            .ok();
            let dry_run = script.exec(name, &self.target, " --config-dir CONFIG_DIR --dry-run");
            writeln!(out, "  {dry_run}   # what one pass would claim").ok();
            writeln!(
                out,
                "  {}   # one pass, as cron starts it",
                script.exec(name, &self.target, " --config-dir CONFIG_DIR")
            )
            .ok();
            writeln!(out, "  (the crontab line: {})", self.target.join("README.md").display()).ok();
            return out;
        }
        match (&self.manifest, &self.membership) {
            (Some((manifest, _)), Some(said)) => writeln!(out, "{} {said}", manifest.display()).ok(),
            (None, Some(said)) => writeln!(out, "({said})").ok(),
            _ => None,
        };
        out.push_str("\nNext:\n");
        let binary = match &self.workspace {
            Some(root) => {
                // `--workspace` resolves the dependencies' features as the workspace build did
                // (`-p NAME` alone unifies fewer, and rebuilds some eighty dependency crates);
                // `--bin` builds and tests this crate alone.
                writeln!(
                    out,
                    "  cd {} && cargo build --workspace --bin {name} && cargo test --workspace --bin {name}",
                    root.display()
                )
                .ok();
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

    /// The required types as a Python list or TOML array: `"A", "B"`.
    fn quoted_requires(&self) -> String {
        let quoted: Vec<String> = self.requires.iter().map(|t| format!("\"{t}\"")).collect();
        quoted.join(", ")
    }

    fn first_required(&self) -> &str {
        self.requires.first().map_or(DEFAULT_REQUIRES, String::as_str)
    }

    fn script(&self, template: &str, stem: &str) -> String {
        template
            .replace("@NAME@", self.name)
            .replace("@TYPE@", self.event_type)
            .replace("@REQUIRES@", &self.quoted_requires())
            .replace("@REQUIRES_WORDS@", &self.requires.join(" "))
            .replace("@FIRST@", self.first_required())
            .replace("@STEM@", stem)
    }

    fn python_step(&self) -> String {
        self.script(PYTHON_STEP, "")
    }

    fn python_test(&self, stem: &str) -> String {
        self.script(PYTHON_TEST, stem)
    }

    fn shell_step(&self) -> String {
        self.script(SHELL_STEP, "")
    }

    fn shell_test(&self, stem: &str) -> String {
        self.script(SHELL_TEST, stem)
    }

    fn script_config_toml(&self) -> String {
        self.script(SCRIPT_CONFIG_TOML, "")
    }

    fn script_readme(&self, script: &ScriptNext, dir: &Path) -> String {
        let what = if script.lang == Lang::Python { "Python" } else { "shell" };
        let docs = if script.lang == Lang::Python { "docs/python-steps.md" } else { "docs/command-protocol.md" };
        format!(
            "# {name}\n\n\
             A {what} step for `autocomp-exec`: records `{event_type}` with the number of files in the batch's \
             directory, after `{requires}` (whose results it reads). Written by `autocomp new`; the guide is \
             {docs} in the autocomp repository.\n\n\
             Its tests, without autocomp:\n\n    {test}\n\n\
             Copy `{name}.toml` into the config dir (the one holding autocomp.toml, /etc/autocomp by default), \
             then one pass:\n\n    {exec}\n\n\
             Under cron (`crontab -e`; stderr appended to a log, stdout mailed: one line per batch):\n\n    \
             */10 * * * *  {exec} 2>>/var/log/autocomp/{name}.log\n",
            name = self.name,
            event_type = self.event_type,
            requires = self.requires.join("`, `"),
            test = script.test(dir),
            exec = script.exec(self.name, dir, ""),
        )
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

// The generated Python step: a work function on autocomp_step, reading the required steps'
// results and returning its own.
const PYTHON_STEP: &str = r##""""@NAME@: records @TYPE@ with the number of files in the batch's directory.

A step for autocomp-exec (README.md): work() gets the batch and the [settings] of @NAME@.toml,
and returns the structured result, or raises TransientFailure (retried later) or
PermanentFailure.
"""

from typing import Any, Dict

from autocomp_step import Batch, Failure, PermanentFailure, Result, TransientFailure, run

#: The event types this step requires (autocomp-exec --requires); work() reads their results.
REQUIRES = [@REQUIRES@]


def work(batch: Batch, settings: Dict[str, Any]) -> Result:
    if batch.location is None:
        raise PermanentFailure("the batch has no location")
    try:
        files = sum(1 for entry in batch.location.iterdir() if entry.is_file())
    except (FileNotFoundError, NotADirectoryError, PermissionError) as error:
        raise PermanentFailure(f"{batch.location}: {error.strerror}") from None
    except OSError as error:  # a share offline, a stale mount: try again later
        raise TransientFailure(f"{batch.location}: {error.strerror}") from None
    # What the earlier steps recorded as their results (None for one that recorded none).
    earlier = {event_type: batch.result(event_type) for event_type in REQUIRES}
    result = {"files": files, "earlier": earlier}
    min_files = int(settings.get("min_files", 0))
    if files < min_files:
        failure = Failure("", "too_few_files", f"{files} files, fewer than min_files = {min_files}")
        return Result(result, summary=failure.description, failures=[failure])
    return Result(result, summary=f"{files} files")


if __name__ == "__main__":
    run(work)
"##;

const PYTHON_TEST: &str = r##""""Tests of @NAME@'s work() on real directories, without autocomp:

    python3 -m unittest test_@STEM@

(with autocomp_step installed, or PYTHONPATH naming contrib/python of the autocomp sources).
"""

import tempfile
import unittest
from pathlib import Path

from autocomp_step import Batch, PermanentFailure

from @STEM@ import work


class WorkTest(unittest.TestCase):
    def setUp(self) -> None:
        temp = tempfile.TemporaryDirectory()
        self.addCleanup(temp.cleanup)
        self.dir = Path(temp.name)

    def test_records_the_number_of_files_and_reads_the_earlier_result(self) -> None:
        (self.dir / "page-1.txt").write_text("one")
        (self.dir / "page-2.txt").write_text("two")
        (self.dir / "not-a-file").mkdir()
        batch = Batch("B1", location=self.dir, results={"@FIRST@": {"pages": 2}})

        returned = work(batch, {})

        self.assertEqual(list(returned.failures), [])
        self.assertEqual(returned.result["files"], 2)
        self.assertEqual(returned.result["earlier"]["@FIRST@"], {"pages": 2})

    def test_fewer_files_than_min_files_fail_the_batch_with_the_count(self) -> None:
        (self.dir / "page-1.txt").write_text("one")

        returned = work(Batch("B1", location=self.dir), {"min_files": 2})

        self.assertEqual([failure.type for failure in returned.failures], ["too_few_files"])
        self.assertEqual(returned.result["files"], 1)

    def test_a_missing_directory_is_a_permanent_failure_naming_it(self) -> None:
        with self.assertRaises(PermanentFailure) as raised:
            work(Batch("B1", location=self.dir / "not-delivered"), {})
        self.assertIn("not-delivered", str(raised.exception))


if __name__ == "__main__":
    unittest.main()
"##;

// The generated shell step: sh, with python3 -c for the JSON it reads.
const SHELL_STEP: &str = r##"#!/bin/sh
# @NAME@: records @TYPE@ with the number of files in the batch's directory. A step for
# autocomp-exec (README.md): exit 0 success, 75 retry later, anything else a failure; the
# JSON it reads (settings, the earlier steps' results) through python3 -c.
set -eu
dir=${AUTOCOMP_BATCH_DIR:?is not set: run this under autocomp-exec (README.md)}
if [ ! -d "$dir" ]; then
    echo "$dir: no such directory" >&2
    exit 1
fi
files=$(find "$dir" -mindepth 1 -maxdepth 1 -type f | wc -l | tr -d ' ')
min_files=$(python3 -c 'import json, os
print(int(json.load(open(os.environ["AUTOCOMP_SETTINGS_FILE"])).get("min_files", 0)))')
# The earlier steps' results, by event type (null for one that recorded none).
earlier=$(python3 -c 'import json, os, sys
events = json.load(open(os.environ["AUTOCOMP_BATCH_FILE"]))["batch"]["events"]
print(json.dumps({t: (events.get(t) or {}).get("result") for t in sys.argv[1:]}))' @REQUIRES_WORDS@)
failures=
if [ "$files" -lt "$min_files" ]; then
    failures=", \"failures\": [{\"reference\": \"\", \"type\": \"too_few_files\", \"description\": \"$files files, fewer than min_files = $min_files\"}]"
fi
printf '{"protocol": 1, "result": {"files": %s, "earlier": %s}%s}\n' "$files" "$earlier" "$failures" \
    >"$AUTOCOMP_RESULT_FILE"
"##;

const SHELL_TEST: &str = r##"#!/bin/sh
# Tests of @STEM@.sh without autocomp: the files autocomp-exec would hand it, in a temp dir.
#     sh test_@STEM@.sh
set -eu
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/B1/not-a-file"
echo one >"$tmp/B1/page-1.txt"
echo two >"$tmp/B1/page-2.txt"
printf '{"protocol": 1, "component": "@NAME@", "batch": {"id": "B1", "type": "RoundTrip", "priority": 0, "metadata": {}, "location": "%s", "events": {"@FIRST@": {"outcome": "success", "result": {"pages": 2}}}}, "checkpoint": null}\n' \
    "$tmp/B1" >"$tmp/batch.json"

# Runs the step with the settings $1; fails the test unless it exits 0.
step() {
    printf '%s\n' "$1" >"$tmp/settings.json"
    rm -f "$tmp/result.json"
    AUTOCOMP_PROTOCOL=1 AUTOCOMP_BATCH_ID=B1 AUTOCOMP_BATCH_DIR="$tmp/B1" AUTOCOMP_BATCH_FILE="$tmp/batch.json" \
        AUTOCOMP_SETTINGS_FILE="$tmp/settings.json" AUTOCOMP_RESULT_FILE="$tmp/result.json" \
        sh "$here/@STEM@.sh" || { echo "FAIL: the step exited $? with settings $1" >&2; exit 1; }
}
# Checks the Python expression $1 on the result file `r`; $2 says what it tests.
expect() {
    python3 -c 'import json, sys; r = json.load(open(sys.argv[1])); sys.exit(0 if eval(sys.argv[2]) else 1)' \
        "$tmp/result.json" "$1" || { echo "FAIL: $2: $(cat "$tmp/result.json")" >&2; exit 1; }
}

step '{}'
expect 'r["result"]["files"] == 2 and "failures" not in r' "records the number of files"
expect 'r["result"]["earlier"]["@FIRST@"] == {"pages": 2}' "reads the earlier result"
step '{"min_files": 3}'
expect 'r["failures"][0]["type"] == "too_few_files" and r["result"]["files"] == 2' "too few files fail the batch"
echo "ok: 3 tests passed"
"##;

const SCRIPT_CONFIG_TOML: &str = r#"# @NAME@'s config: copy it into the config dir, next to autocomp.toml
# (/etc/autocomp by default); autocomp-exec --name @NAME@ reads it.
event_type = "@TYPE@"

# [trigger]                  # replaces the command line's --requires and --blocked-by, clause by clause
# requires = [@REQUIRES@]
# blocked_by = ["@TYPE@"]

# [settings]                 # the step's settings (autocomp-exec's own: kill_grace, settings_schema)
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

    fn script_args(name: &str, lang: &str, dir: &Path) -> NewArgs {
        NewArgs {
            name: name.into(),
            event_type: "Files_Counted".into(),
            requires: vec!["Data_Received".into(), "Pages_Counted".into()],
            dir: Some(dir.to_path_buf()),
            lang: lang.into(),
        }
    }

    /// The generated Python step passes its own unittest (real python3, the module from
    /// contrib/python), and the shell step its test script.
    #[test]
    fn the_generated_python_and_shell_steps_pass_their_own_tests() {
        let contrib = Path::new(env!("CARGO_MANIFEST_DIR")).with_file_name("contrib").join("python");
        let outside = tempfile::tempdir().unwrap();
        for (lang, test) in [
            ("python", vec!["python3", "-m", "unittest", "test_page_counter"]),
            ("shell", vec!["sh", "test_page-counter.sh"]),
        ] {
            let dir = outside.path().join(lang).join("page-counter");
            let plan = plan(&script_args("page-counter", lang, &dir), outside.path()).unwrap();
            assert!(plan.manifest.is_none() && plan.workspace.is_none(), "{plan:?}");
            let shown = plan.write().unwrap();
            assert!(shown.contains("autocomp-exec --name page-counter --event-type Files_Counted"), "{shown}");
            assert!(shown.contains("--requires Data_Received,Pages_Counted"), "{shown}");
            let config = std::fs::read_to_string(dir.join("page-counter.toml")).unwrap();
            assert!(config.parse::<toml::Table>().is_ok() && config.contains("event_type = \"Files_Counted\""));
            let readme = std::fs::read_to_string(dir.join("README.md")).unwrap();
            assert!(readme.contains("*/10 * * * *  ") && readme.contains("2>>/var/log/autocomp/page-counter.log"));
            let run = std::process::Command::new(test[0])
                .args(&test[1..])
                .current_dir(&dir)
                .env("PYTHONPATH", &contrib)
                .env("PYTHONDONTWRITEBYTECODE", "1")
                .output()
                .expect("python3 and sh run");
            let said = format!("{}{}", String::from_utf8_lossy(&run.stdout), String::from_utf8_lossy(&run.stderr));
            assert!(run.status.success(), "{lang}: {said}");
            assert!(said.contains("Ran 3 tests") || said.contains("ok: 3 tests passed"), "{lang}: {said}");
        }
        let files = |dir: &str| -> Vec<String> {
            let mut names: Vec<String> = std::fs::read_dir(outside.path().join(dir).join("page-counter"))
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .filter(|n| !n.starts_with("__pycache__"))
                .collect();
            names.sort();
            names
        };
        assert_eq!(files("python"), ["README.md", "page-counter.toml", "page_counter.py", "test_page_counter.py"]);
        assert_eq!(files("shell"), ["README.md", "page-counter.sh", "page-counter.toml", "test_page-counter.sh"]);
    }

    #[test]
    fn a_bad_lang_or_python_name_is_refused_naming_the_field_and_value() {
        let outside = tempfile::tempdir().unwrap();
        let dir = outside.path().join("x");
        let Err(OperatorError::Input(e)) = plan(&script_args("x", "perl", &dir), outside.path()) else {
            panic!("perl accepted")
        };
        assert_eq!((e.field.as_str(), e.value.as_str()), ("--lang", "perl"));
        for bad in ["json", "import", "9lives", "a.b"] {
            let Err(OperatorError::Input(e)) = plan(&script_args(bad, "python", &dir), outside.path()) else {
                panic!("{bad} accepted")
            };
            assert_eq!((e.field.as_str(), e.value.as_str()), ("component", bad));
        }
        assert_eq!(python_module("page-counter").unwrap(), "page_counter");
        assert!(!dir.exists());
    }

    #[test]
    fn a_script_step_under_a_members_pattern_is_refused() {
        let root = tempfile::tempdir().unwrap();
        std::fs::write(root.path().join("Cargo.toml"), "[workspace]\nmembers = [\"framework\", \"components/*\"]\n")
            .unwrap();
        std::fs::create_dir(root.path().join("components")).unwrap();
        let dir = root.path().join("components/ocr");
        let Err(OperatorError::Input(e)) = plan(&script_args("ocr", "shell", &dir), root.path()) else {
            panic!("written under components/*")
        };
        assert_eq!(e.field, "directory");
        assert!(e.reason.contains("components/*"), "{e}");
        let beside = root.path().join("steps/ocr");
        assert!(plan(&script_args("ocr", "shell", &beside), root.path()).is_ok());
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
