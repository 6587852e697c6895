//! `autocomp new` end to end: the real binary writes a component crate outside the workspace,
//! cargo builds and tests it (sharing the workspace's lock file and target dir, offline), and
//! its binary runs one pass in a temporary pipeline; bad input writes nothing.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Instant;

use autocomp_e2e::binary;
use autocomp_framework::Outcome;
use autocomp_framework::testing::TempPipeline;
use serde_json::json;

/// Unique to this test: the binary lands in the shared target dir next to the workspace's.
const NAME: &str = "scaffold-e2e-counter";
const EVENT_TYPE: &str = "Files_Counted";

fn autocomp_new(cwd: &Path, args: &[&str]) -> Output {
    Command::new(binary("autocomp"))
        .arg("new")
        .args(args)
        .current_dir(cwd)
        .env_remove("AUTOCOMP_CONFIG_DIR")
        .output()
        .expect("autocomp runs")
}

fn show(output: &Output) -> String {
    format!(
        "{}\n--- stdout\n{}--- stderr\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// `target/` of the workspace build this test belongs to, and whether it is a release one:
/// the test executable is `<target>/<profile>/deps/<test>`.
fn target_dir() -> (PathBuf, bool) {
    let exe = std::env::current_exe().expect("test executable path");
    let profile = exe.parent().and_then(Path::parent).expect("<target>/<profile>/deps/<test>");
    let target = profile.parent().expect("<target>/<profile>").to_path_buf();
    (target, profile.ends_with("release"))
}

/// `cargo <command> --offline` in `dir`, building into the workspace's target dir, so the
/// framework and its dependencies (same versions: the workspace's lock file) are not built again.
fn cargo(dir: &Path, command: &str) -> Output {
    let (target, release) = target_dir();
    let mut cargo = autocomp_e2e::cargo();
    cargo.arg(command).arg("--offline").current_dir(dir).env("CARGO_TARGET_DIR", &target);
    if release {
        cargo.arg("--release");
    }
    cargo.output().expect("cargo runs")
}

fn entries(dir: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir).expect("readable").map(|e| e.unwrap().path()).collect();
    found.sort();
    found
}

#[test]
fn a_new_component_builds_passes_its_tests_and_records_its_result_in_a_pass() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace holds tests/");
    let outside = tempfile::tempdir().expect("temp dir");
    assert!(!outside.path().starts_with(workspace), "the temp dir must be outside the workspace");
    let crate_dir = outside.path().join(NAME);
    let dir_arg = crate_dir.to_str().unwrap();

    let output = autocomp_new(
        outside.path(),
        &[NAME, "--event-type", EVENT_TYPE, "--requires", "Data_Received", "--dir", dir_arg],
    );
    assert!(output.status.success(), "{}", show(&output));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let config = crate_dir.join(format!("{NAME}.toml"));
    for file in
        [crate_dir.join("Cargo.toml"), crate_dir.join("src/main.rs"), crate_dir.join("src/tests.rs"), config.clone()]
    {
        assert!(file.is_file(), "{} not written", file.display());
        assert!(stdout.lines().any(|line| line == file.to_str().unwrap()), "{} not listed:\n{stdout}", file.display());
    }
    assert!(stdout.contains("cargo build") && stdout.contains("--dry-run"), "no next steps:\n{stdout}");
    let main_rs = std::fs::read_to_string(crate_dir.join("src/main.rs")).unwrap();
    assert!(main_rs.lines().count() <= 40, "main.rs has {} lines:\n{main_rs}", main_rs.lines().count());
    let manifest = std::fs::read_to_string(crate_dir.join("Cargo.toml")).unwrap();
    let framework = workspace.join("framework");
    assert!(manifest.contains(&format!("path = \"{}\"", framework.display())), "{manifest}");

    std::fs::copy(workspace.join("Cargo.lock"), crate_dir.join("Cargo.lock")).expect("Cargo.lock copied");
    let started = Instant::now();
    let build = cargo(&crate_dir, "build");
    eprintln!("cargo build of the generated crate: {:.1?}", started.elapsed());
    assert!(build.status.success(), "cargo build failed: {}", show(&build));
    let started = Instant::now();
    let test = cargo(&crate_dir, "test");
    eprintln!("cargo test of the generated crate: {:.1?}", started.elapsed());
    assert!(test.status.success(), "cargo test failed: {}", show(&test));
    assert!(String::from_utf8_lossy(&test.stdout).contains("test result: ok. 3 passed"), "{}", show(&test));

    let (target, release) = target_dir();
    let component = target.join(if release { "release" } else { "debug" }).join(NAME);
    let pipeline = TempPipeline::new();
    let generated = std::fs::read_to_string(&config).unwrap();
    assert!(generated.contains(&format!("event_type = \"{EVENT_TYPE}\"")), "{generated}");
    // The generated file as it is (it must parse), with its commented settings switched on.
    pipeline.configure(NAME, &format!("{generated}\n[settings]\nmin_files = 1\n"));
    let delivered = pipeline.root().join("deliveries/B1");
    std::fs::create_dir_all(delivered.join("data")).unwrap();
    for file in ["bagit.txt", "manifest-md5.txt", "data/page-1.txt"] {
        std::fs::write(delivered.join(file), file).unwrap();
    }
    let empty = pipeline.root().join("deliveries/B2");
    std::fs::create_dir_all(&empty).unwrap();
    pipeline.add_batch("B1", &delivered);
    pipeline.add_batch("B2", &empty);

    let pass = pipeline.run(&component, &[]);

    assert_eq!(pass.status.code(), Some(1), "one batch failed: {}", show(&pass));
    let counted = pipeline.event("B1", EVENT_TYPE).expect("B1 has its event");
    assert_eq!(counted.outcome, Outcome::Success, "{counted:?}");
    // Files directly in the batch's directory: the `data` directory is not one.
    assert_eq!(counted.details["result"], json!({"files": 2}), "{counted:?}");
    let refused = pipeline.event("B2", EVENT_TYPE).expect("B2 has its event");
    assert_eq!(refused.outcome, Outcome::Failure, "{refused:?}");
    assert_eq!(refused.details["result"], json!({"files": 0}), "{refused:?}");
    assert_eq!(refused.details["failures"][0]["type"], "too_few_files", "{refused:?}");
}

/// `autocomp new --lang python` and `--lang shell`: the step passes its own test, and a real
/// `autocomp-exec` pass runs it (the Python one on contrib/python through PYTHONPATH, no
/// install), recording its structured result, and a failure below `min_files`.
#[test]
fn a_new_python_or_shell_step_passes_its_own_test_and_records_its_result_in_a_pass() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace holds tests/");
    let python_path = workspace.join("contrib/python");
    for (lang, stem, file, test) in [
        ("python", "files_listed", "files_listed.py", &["python3", "-m", "unittest", "test_files_listed"][..]),
        ("shell", "files-listed", "files-listed.sh", &["sh", "test_files-listed.sh"][..]),
    ] {
        let outside = tempfile::tempdir().expect("temp dir");
        let dir = outside.path().join("files-listed");
        let dir_arg = dir.to_str().unwrap();
        let output = autocomp_new(
            outside.path(),
            &["files-listed", "--lang", lang, "--event-type", "Files_Listed", "--dir", dir_arg],
        );
        assert!(output.status.success(), "{lang}: {}", show(&output));
        let stdout = String::from_utf8_lossy(&output.stdout);
        let step = dir.join(file);
        let config = dir.join("files-listed.toml");
        // Its contract: the schema of its result, and what it expects of the one it reads.
        let result_schema = dir.join(format!("{stem}.result.json"));
        let reads = dir.join(format!("{stem}.reads.Data_Received.json"));
        for written in [&step, &config, &dir.join("README.md"), &result_schema, &reads] {
            assert!(written.is_file(), "{} not written", written.display());
            assert!(
                stdout.lines().any(|l| l == written.to_str().unwrap()),
                "{} not listed:\n{stdout}",
                written.display()
            );
        }
        let exec_line = format!(
            "autocomp-exec --name files-listed --event-type Files_Listed --requires Data_Received --result-schema {} \
             --reads Data_Received={}",
            result_schema.display(),
            reads.display()
        );
        let exec_line = exec_line.as_str();
        assert!(stdout.contains(exec_line) && stdout.contains("--dry-run"), "no next steps:\n{stdout}");
        let readme = std::fs::read_to_string(dir.join("README.md")).unwrap();
        assert!(readme.contains(exec_line) && readme.contains("2>>/var/log/autocomp/files-listed.log"), "{readme}");

        let tested = Command::new(test[0])
            .args(&test[1..])
            .current_dir(&dir)
            .env("PYTHONPATH", &python_path)
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .output()
            .expect("the step's test runs");
        assert!(tested.status.success(), "{lang}: its own test failed: {}", show(&tested));

        let pipeline = TempPipeline::new();
        let generated = std::fs::read_to_string(&config).unwrap();
        assert!(generated.contains("event_type = \"Files_Listed\""), "{generated}");
        pipeline.configure("files-listed", &format!("{generated}\n[settings]\nmin_files = 1\n"));
        let delivered = pipeline.root().join("deliveries/B1");
        std::fs::create_dir_all(delivered.join("data")).unwrap();
        for name in ["bagit.txt", "manifest-md5.txt", "data/page-1.txt"] {
            std::fs::write(delivered.join(name), name).unwrap();
        }
        let empty = pipeline.root().join("deliveries/B2");
        std::fs::create_dir_all(&empty).unwrap();
        pipeline.add_batch("B1", &delivered);
        pipeline.add_batch("B2", &empty);

        let interpreter = if lang == "python" { "python3" } else { "sh" };
        if lang == "python" {
            // The step's own version, from its file, is what the registry names.
            let text =
                std::fs::read_to_string(&step).unwrap().replace("__version__ = \"1.0.0\"", "__version__ = \"2.3.4\"");
            std::fs::write(&step, text).unwrap();
        }
        let read = format!("Data_Received={}", reads.display());
        let mut exec = pipeline.command(&binary("autocomp-exec"));
        exec.args(["--name", "files-listed", "--event-type", "Files_Listed", "--requires", "Data_Received"])
            .args(["--result-schema", result_schema.to_str().unwrap(), "--reads", &read, "--"])
            .args([interpreter, step.to_str().unwrap()])
            .env("PYTHONPATH", &python_path)
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let pass =
            autocomp_e2e::finish(exec.spawn().expect("autocomp-exec starts"), std::time::Duration::from_secs(60));

        assert_eq!(pass.code, Some(1), "{lang}: one batch failed: {}", pass.show());
        let listed = pipeline.event("B1", "Files_Listed").expect("B1 has its event");
        assert_eq!(listed.outcome, Outcome::Success, "{lang}: {listed:?}");
        // Files directly in the batch's directory, and the earlier step's result (none).
        assert_eq!(listed.details["result"], json!({"files": 2, "earlier": {"Data_Received": null}}), "{lang}");
        let refused = pipeline.event("B2", "Files_Listed").expect("B2 has its event");
        assert_eq!(refused.outcome, Outcome::Failure, "{lang}: {refused:?}");
        assert_eq!(refused.details["result"]["files"], 0, "{lang}: {refused:?}");
        assert_eq!(refused.details["failures"][0]["type"], "too_few_files", "{lang}: {refused:?}");
        let version = if lang == "python" { "2.3.4" } else { env!("CARGO_PKG_VERSION") };
        assert!(listed.agent.as_str().starts_with(&format!("files-listed/{version}@")), "{lang}: {listed:?}");
    }
}

#[test]
fn bad_input_exits_2_naming_the_field_and_the_value_and_writes_nothing() {
    let outside = tempfile::tempdir().expect("temp dir");
    let cases: [(&[&str], &str, &str); 7] = [
        (&["good-name", "--event-type", "Done", "--lang", "perl"], "--lang", "\"perl\""),
        (&["json", "--event-type", "Done", "--lang", "python"], "component", "\"json\""),
        (&["Bad Name", "--event-type", "Done"], "component", "\"Bad Name\""),
        (&["9lives", "--event-type", "Done"], "component", "\"9lives\""),
        (&["good-name", "--event-type", "1Done"], "event type", "\"1Done\""),
        (
            &["good-name", "--event-type", "Done", "--requires", "Data_Received,not-a-type"],
            "required event type",
            "\"not-a-type\"",
        ),
        (&["good-name", "--event-type", "Done", "--requires", "Done"], "required event type", "\"Done\""),
    ];
    for (args, field, value) in cases {
        let output = autocomp_new(outside.path(), args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {}", show(&output));
        assert!(
            stderr.contains(&format!("invalid {field} {value}")),
            "{args:?} does not name {field} {value}: {stderr}"
        );
        assert_eq!(entries(outside.path()), Vec::<PathBuf>::new(), "{args:?} wrote something");
    }
}

#[test]
fn an_existing_directory_is_refused_by_name_and_left_alone() {
    let outside = tempfile::tempdir().expect("temp dir");
    let existing = outside.path().join("taken");
    std::fs::create_dir(&existing).unwrap();
    std::fs::write(existing.join("mine.txt"), "mine").unwrap();

    let output = autocomp_new(outside.path(), &["taken", "--event-type", "Done"]);

    assert_eq!(output.status.code(), Some(2), "{}", show(&output));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains(existing.to_str().unwrap()) && stderr.contains("already exists"), "{stderr}");
    assert_eq!(entries(outside.path()), std::slice::from_ref(&existing));
    assert_eq!(entries(&existing), [existing.join("mine.txt")]);
}

#[test]
fn outside_the_workspace_the_crate_goes_into_the_current_directory() {
    let outside = tempfile::tempdir().expect("temp dir");

    let output = autocomp_new(outside.path(), &["page-counter", "--event-type", "Pages_Counted"]);

    assert!(output.status.success(), "{}", show(&output));
    let crate_dir = outside.path().join("page-counter");
    assert_eq!(
        entries(outside.path()),
        std::slice::from_ref(&crate_dir),
        "nothing but the crate (no staging dir left)"
    );
    let main_rs = std::fs::read_to_string(crate_dir.join("src/main.rs")).unwrap();
    assert!(main_rs.contains("requires([\"Data_Received\"]).blocked_by(\"Pages_Counted\")"), "{main_rs}");
    let config = std::fs::read_to_string(crate_dir.join("page-counter.toml")).unwrap();
    assert!(config.contains("event_type = \"Pages_Counted\"") && config.contains("# min_files = 0"), "{config}");
}
