//! The README's first command, run as a user would: `autocomp demo` on a fresh directory
//! starts the real component binaries (and a Python step through `autocomp-exec`) and ends
//! with every batch where it belongs.

use std::process::Command;

use autocomp_e2e::binary;

#[test]
fn the_demo_runs_the_pipeline_and_fails_each_broken_batch_at_the_right_step() {
    let dir = tempfile::tempdir().unwrap();
    let output =
        Command::new(binary("autocomp")).args(["demo", "--batches", "20", "--dir"]).arg(dir.path()).output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "demo failed: {stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    let row = |n: u64| {
        let id = format!("B{:012}-RT1", 400_022_028_241u64 + n);
        stdout.lines().find(|l| l.starts_with(&id)).unwrap_or_else(|| panic!("no row for {id}:\n{stdout}")).to_owned()
    };
    let states = |n| row(n).split_whitespace().skip(1).map(str::to_owned).collect::<Vec<_>>();
    // The Python step (catalogue) after the archiver: python3 is installed wherever the tests run.
    assert_eq!(states(0), ["success", "success", "success", "success", "success"], "{stdout}");
    // Bad checksum, missing file, extra file: the checksum step fails, archiving never happens.
    for broken in [3, 7, 11] {
        assert_eq!(states(broken)[1], "failed", "{stdout}");
        assert_eq!(states(broken)[3..], ["waiting", "waiting"], "{stdout}");
    }
    // An empty file: checksums agree, the structure check fails.
    assert_eq!(states(15)[1..], ["success", "failed", "waiting", "waiting"], "{stdout}");
    assert!(stdout.contains("Why the failed ones failed"), "{stdout}");
    assert!(stdout.contains("data/page-0001.txt"), "the missing file is named: {stdout}");
    assert!(stdout.contains("data/empty.txt"), "the empty file is named: {stdout}");
    let archived = std::fs::read_dir(dir.path().join("archive")).unwrap().count();
    assert_eq!(archived, 16, "every good batch is archived");
    assert!(dir.path().join("config/autocomp.toml").exists());
    // The Python step read the archiver's and the structure checker's results and recorded its
    // own, which any later step can read.
    let show = Command::new(binary("autocomp"))
        .args(["show", "B400022028241-RT1", "--format", "json"])
        .env("AUTOCOMP_CONFIG_DIR", dir.path().join("config"))
        .output()
        .unwrap();
    let show: serde_json::Value = serde_json::from_slice(&show.stdout).unwrap();
    let catalogued = show["events"].as_array().unwrap().iter().find(|e| e["type"] == "Catalogued").unwrap().clone();
    let result = &catalogued["details"]["result"];
    assert_eq!(result["identifier"], "B400022028241-RT1", "{catalogued}");
    assert!(result["archive_path"].as_str().unwrap().ends_with("archive/B400022028241-RT1"), "{catalogued}");
    assert_eq!(result["files"], 9, "{catalogued}");

    // Running it again continues: nothing is left to do, the table is the same.
    let again = Command::new(binary("autocomp")).args(["demo", "--dir"]).arg(dir.path()).output().unwrap();
    assert!(again.status.success());
    let again = String::from_utf8_lossy(&again.stdout);
    assert!(again.contains("continuing the demo"), "{again}");
    assert_eq!(std::fs::read_dir(dir.path().join("archive")).unwrap().count(), 16);
}

#[test]
fn bad_arguments_exit_2_with_a_usage_message() {
    let output = Command::new(binary("autocomp")).args(["demo", "--batches", "0"]).output().unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("--batches"));
}
