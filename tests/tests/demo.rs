//! The README's first command, run as a user would: `autocomp demo` on a fresh directory.

use std::process::Command;

use autocomp_e2e::binary;

#[test]
fn the_demo_runs_the_pipeline_on_the_embedded_store() {
    let dir = tempfile::tempdir().unwrap();
    let output =
        Command::new(binary("autocomp")).args(["demo", "--batches", "14", "--dir"]).arg(dir.path()).output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "demo failed: {stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.contains("registered 14 batches"), "{stdout}");
    assert!(stdout.contains("a stalled worker woke up and was refused: fenced"), "{stdout}");
    let rows: Vec<&str> = stdout.lines().filter(|l| l.starts_with('B')).collect();
    assert_eq!(rows.len(), 14, "{stdout}");
    assert_eq!(rows.iter().filter(|r| r.ends_with("failure")).count(), 2, "{stdout}");
    assert!(dir.path().join("store.db").exists());

    // Running it again changes nothing: the batches are registered and verified already.
    let again =
        Command::new(binary("autocomp")).args(["demo", "--batches", "14", "--dir"]).arg(dir.path()).output().unwrap();
    let again = String::from_utf8_lossy(&again.stdout);
    assert!(again.contains("0 batches are ready"), "{again}");
}

#[test]
fn bad_arguments_exit_2_with_a_usage_message() {
    let output = Command::new(binary("autocomp")).args(["demo", "--batches", "0"]).output().unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("--batches"));
}
