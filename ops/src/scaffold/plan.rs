//! What `autocomp new` will write, decided (and every input checked) before anything is: the
//! target directory, the files and their texts, and the workspace manifest's new text.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use autocomp_model::{ComponentName, EventType, InvalidInput};

use super::manifest::{MemberEdit, add_member};
use super::names::{crate_name, python_module, requires};
use super::texts::{RUSTFMT_TOML, ScriptNext, Texts, python_path};
use super::workspace::{
    Workspace, absolute, find_workspace, pattern_covers, relative_member, workspace_names, workspace_patterns,
};
use super::{Lang, NewArgs, refused};
use crate::operator::OperatorError;

/// Everything `run` will write, decided (and every input checked) before anything is.
#[derive(Debug)]
pub(super) struct Plan {
    pub(super) target: PathBuf,
    pub(super) name: String,
    /// Path in the crate, text.
    pub(super) files: Vec<(String, String)>,
    /// The workspace manifest and its new text; `None` outside the workspace, or when a
    /// members pattern covers the crate already.
    pub(super) manifest: Option<(PathBuf, String)>,
    /// What the output says about the workspace (the member added, or the pattern covering it).
    pub(super) membership: Option<String>,
    pub(super) workspace: Option<PathBuf>,
    /// For a Python or shell step: what its next steps say.
    pub(super) script: Option<ScriptNext>,
}

/// A component crate's `Cargo.toml`, the manifest's new text and what the output says of
/// the membership (see `Plan`).
type CrateManifests = (String, Option<(PathBuf, String)>, Option<String>);

pub(super) fn plan(args: &NewArgs, cwd: &Path) -> Result<Plan, OperatorError> {
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
    let parent = new_directory(&target)?;
    let workspace = match find_workspace(parent) {
        Some(Workspace::Autocomp(root)) => Some(root),
        _ => None,
    };
    check_name_free(&name, workspace.as_deref())?;

    let text = Texts { name: name.as_str(), event_type: event_type.as_str(), requires: &requires };
    let (cargo_toml, manifest, membership) = match &workspace {
        Some(root) => in_workspace(&text, root, &target)?,
        None => (standalone(&text)?, None, None),
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

/// The parent of `target`, which must not exist yet: `autocomp new` writes only a new directory.
fn new_directory(target: &Path) -> Result<&Path, InvalidInput> {
    if target.symlink_metadata().is_ok() {
        let shown = target.display().to_string();
        return Err(InvalidInput::new("directory", shown, "already exists; autocomp new writes only a new directory"));
    }
    target.parent().ok_or_else(|| {
        InvalidInput::new("directory", target.display().to_string(), "has no parent directory to write it in")
    })
}

/// Refuses names cargo would refuse for the crate: its own dependencies and the framework's
/// path dependencies (two path packages of one name collide in the lock file), and inside the
/// workspace its fellow members' packages and binaries.
fn check_name_free(name: &ComponentName, workspace: Option<&Path>) -> Result<(), InvalidInput> {
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
    if let Some(root) = workspace {
        taken.extend(workspace_names(root));
    }
    if taken.contains(name.as_str()) {
        let reason = "is already a package, binary or dependency in the autocomp workspace; choose another name";
        return Err(InvalidInput::new("component", name.as_str(), reason));
    }
    Ok(())
}

/// Inside the autocomp workspace: the crate uses the workspace's dependencies, and the
/// manifest gets the member unless a pattern covers it already.
fn in_workspace(text: &Texts, root: &Path, target: &Path) -> Result<CrateManifests, OperatorError> {
    let member = relative_member(root, target)?;
    let manifest_path = root.join("Cargo.toml");
    let current = std::fs::read_to_string(&manifest_path)
        .map_err(|e| refused(format!("cannot read {}: {e}", manifest_path.display())))?;
    let edit = add_member(&current, &member)
        .map_err(|reason| refused(format!("{}: {reason}; nothing was written", manifest_path.display())))?;
    Ok(match edit {
        MemberEdit::Added(new_text) => {
            let said = format!("(added \"{member}\" to the workspace members)");
            (text.cargo_toml_in_workspace(), Some((manifest_path, new_text)), Some(said))
        }
        MemberEdit::Covered(pattern) => {
            let said = format!("{} already has the crate as a member through \"{pattern}\"", manifest_path.display());
            (text.cargo_toml_in_workspace(), None, Some(said))
        }
    })
}

/// Outside the workspace: the crate depends on the framework sources this autocomp was built
/// from, the SDK crate beside this one.
fn standalone(text: &Texts) -> Result<String, OperatorError> {
    let framework = Path::new(env!("CARGO_MANIFEST_DIR")).with_file_name("framework");
    if !framework.join("Cargo.toml").is_file() {
        return Err(refused(format!(
            "the framework sources this autocomp was built from are not at {} any more; run autocomp new inside \
             the autocomp workspace (or with --dir inside it)",
            framework.display()
        )));
    }
    let framework = framework.to_str().ok_or_else(|| {
        refused(format!("the framework's path {} is not UTF-8, so Cargo.toml cannot name it", framework.display()))
    })?;
    Ok(text.cargo_toml_standalone(framework))
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
    let parent = new_directory(&target)?;
    check_not_covered(parent, &target)?;
    let text = Texts { name: name.as_str(), event_type: event_type.as_str(), requires: &requires };
    let script = ScriptNext {
        lang,
        stem: stem.clone(),
        event_type: event_type.as_str().to_owned(),
        requires: requires.join(","),
        python_path: python_path(),
    };
    let (step, test) = match lang {
        Lang::Python => {
            ((format!("{stem}.py"), text.python_step()), (format!("test_{stem}.py"), text.python_test(&stem)))
        }
        _ => ((format!("{stem}.sh"), text.shell_step()), (format!("test_{stem}.sh"), text.shell_test(&stem))),
    };
    let mut files = vec![
        step,
        test,
        (format!("{stem}.result.json"), text.result_schema()),
        (format!("{}.toml", name.as_str()), text.script_config_toml()),
        ("README.md".to_owned(), text.script_readme(&script, &target)),
    ];
    files.extend(text.reads_schemas(&stem));
    let name = name.as_str().to_owned();
    Ok(Plan { target, name, files, manifest: None, membership: None, workspace: None, script: Some(script) })
}

/// Refuses a step directory a members pattern (components/*) covers: without a Cargo.toml
/// it would break every cargo command in the workspace.
fn check_not_covered(parent: &Path, target: &Path) -> Result<(), OperatorError> {
    let Some(Workspace::Autocomp(root)) = find_workspace(parent) else { return Ok(()) };
    let member = relative_member(&root, target)?;
    if let Some(pattern) = workspace_patterns(&root).into_iter().find(|p| pattern_covers(p, &member)) {
        let reason = format!(
            "is covered by the workspace members pattern \"{pattern}\" of {}, and a directory there must be a \
             crate; choose another --dir",
            root.join("Cargo.toml").display()
        );
        return Err(InvalidInput::new("directory", target.display().to_string(), reason).into());
    }
    Ok(())
}
