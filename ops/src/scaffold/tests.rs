//! The scaffolder's unit tests: the manifest edit on the layouts it must keep, the generated
//! texts against rustfmt and their own tests, and the inputs it refuses.

use std::path::Path;

use autocomp_model::EventType;

use super::NewArgs;
use super::manifest::{MemberEdit, add_member};
use super::names::{crate_name, python_module, requires};
use super::plan::plan;
use super::texts::{RUSTFMT_TOML, Texts};
use super::workspace::pattern_covers;
use crate::operator::OperatorError;

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
    let expected = "[workspace]\nmembers = [\n  \"store\",\n  \"framework\", # the framework\n  \"components/x\",\n]\n";
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
        assert!(shown.contains("--requires Data_Received,Pages_Counted --result-schema "), "{shown}");
        assert!(shown.contains(".reads.Pages_Counted.json --config-dir CONFIG_DIR -- "), "{shown}");
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
    assert_eq!(
        files("python"),
        [
            "README.md",
            "page-counter.toml",
            "page_counter.py",
            "page_counter.reads.Data_Received.json",
            "page_counter.reads.Pages_Counted.json",
            "page_counter.result.json",
            "test_page_counter.py"
        ]
    );
    assert_eq!(
        files("shell"),
        [
            "README.md",
            "page-counter.reads.Data_Received.json",
            "page-counter.reads.Pages_Counted.json",
            "page-counter.result.json",
            "page-counter.sh",
            "page-counter.toml",
            "test_page-counter.sh"
        ]
    );
    // The contract's files are JSON Schemas, and the command lines carry them.
    for name in ["page_counter.result.json", "page_counter.reads.Pages_Counted.json"] {
        let text = std::fs::read_to_string(outside.path().join("python/page-counter").join(name)).unwrap();
        let schema: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(schema["type"], "object", "{name}: {schema}");
    }
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
