//! Upgrading under running processes, with the previous release's own binaries
//! (`scripts/previous-release` builds them from the commit in tests/data/previous-release):
//! that release makes the store and its watcher works on it; this release then opens the
//! file (migrating its schema) and prunes, while that watcher goes on working new batches,
//! each once; a process of that release started after the migration stops at once, naming
//! both schema versions, and writes nothing. The migrations that release shipped are this
//! tree's, byte for byte.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use autocomp_e2e::{Finished, binary, finish, previous_release_binary, wait_until};

/// `program` with the pipeline's config dir and none of the environment that would change it.
fn run(program: &Path, dir: &Path, args: &[&str]) -> Finished {
    let mut command = Command::new(program);
    command.args(args).env("AUTOCOMP_CONFIG_DIR", dir.join("config"));
    for var in ["AUTOCOMP_STORE", "AUTOCOMP_INDEX", "AUTOCOMP_LOCKS", "RUST_LOG"] {
        command.env_remove(var);
    }
    command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    finish(command.spawn().expect("it starts"), Duration::from_secs(60))
}

/// Registers a delivery with the given release's `autocomp`: the batch and its `Data_Received`.
fn deliver(autocomp: &Path, dir: &Path, id: &str) {
    let added = run(autocomp, dir, &["add", id, "--type", "RoundTrip", "--reason", "drill"]);
    assert_eq!(added.code, Some(0), "{}", added.show());
    let received =
        run(autocomp, dir, &["event", id, "--type", "Data_Received", "--outcome", "success", "--reason", "drill"]);
    assert_eq!(received.code, Some(0), "{}", received.show());
}

/// Whether `id` shows a `Probed` success, asked with the given release's `autocomp`.
fn probed(autocomp: &Path, dir: &Path, id: &str) -> bool {
    let shown = run(autocomp, dir, &["show", id, "--format", "json"]);
    let shown: serde_json::Value = serde_json::from_str(&shown.stdout).unwrap_or_default();
    shown["effective"]["Probed"]["outcome"] == "success"
}

fn schema_version(dir: &Path) -> i64 {
    let sqlite = Command::new("python3")
        .args(["-c", "import sqlite3,sys; print(sqlite3.connect(sys.argv[1]).execute('select max(version) from schema_version').fetchone()[0])"])
        .arg(dir.join("store.db"))
        .output()
        .expect("python3");
    String::from_utf8_lossy(&sqlite.stdout).trim().parse().expect("a schema version")
}

#[test]
fn the_previous_releases_watcher_keeps_working_through_this_releases_migration_and_prune() {
    let (old_autocomp, old_probe) = (previous_release_binary("autocomp"), previous_release_binary("probe-component"));
    let autocomp = binary("autocomp");
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    std::fs::create_dir_all(dir.join("config")).unwrap();
    let shared = format!(
        "store = \"sqlite://{0}/store.db\"\nindex = \"local:{0}/index\"\nlocks = \"local:{0}/locks\"\n",
        dir.display()
    );
    std::fs::write(dir.join("config/autocomp.toml"), shared).unwrap();
    let ledger = dir.join("ledger.txt");
    let probe = format!(
        "max_threads = 2\nwatch_heartbeat = \"1s\"\n\n[settings]\nwork_time = \"100ms\"\nledger = \"{}\"\n",
        ledger.display()
    );
    std::fs::write(dir.join("config/probe.toml"), probe).unwrap();

    // The previous release makes the store and works on it.
    let added = run(&old_autocomp, dir, &["add", "B1", "--type", "RoundTrip", "--reason", "drill"]);
    assert_eq!(added.code, Some(0), "{}", added.show());
    let mut watcher = Command::new(&old_probe)
        .args(["--watch"])
        .env("AUTOCOMP_CONFIG_DIR", dir.join("config"))
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let registered = wait_until(Instant::now() + Duration::from_secs(30), || {
        run(&old_autocomp, dir, &["pipeline"]).stdout.contains("probe")
    });
    assert!(registered, "the previous release's watcher registered");
    let received =
        run(&old_autocomp, dir, &["event", "B1", "--type", "Data_Received", "--outcome", "success", "--reason", "d"]);
    assert_eq!(received.code, Some(0), "{}", received.show());
    assert!(wait_until(Instant::now() + Duration::from_secs(30), || probed(&old_autocomp, dir, "B1")));
    let before = schema_version(dir);

    // This release opens the file: the schema moves on under the running watcher.
    let opened = run(&autocomp, dir, &["pipeline"]);
    assert_eq!(opened.code, Some(0), "{}", opened.show());
    assert!(schema_version(dir) > before, "this release migrated the file from {before}");
    deliver(&autocomp, dir, "B2");
    assert!(wait_until(Instant::now() + Duration::from_secs(30), || probed(&autocomp, dir, "B2")), "worked on");

    // A process of the previous release started now stops, naming both versions, and writes nothing.
    let late = run(&old_probe, dir, &[]);
    assert_eq!(late.code, Some(5), "{}", late.show());
    assert!(late.stderr.contains(&format!("newer than this release knows ({before})")), "{}", late.show());

    // This release prunes what is done; the watcher goes on with a new batch, each once.
    let policy = dir.join("retention.toml");
    let text = format!(
        "export_dir = \"{}/history\"\n[types.RoundTrip]\nafter = \"0s\"\nrequire = [\"Probed\"]\n",
        dir.display()
    );
    std::fs::write(&policy, text).unwrap();
    let pruned = run(&autocomp, dir, &["prune", "--policy", policy.to_str().unwrap(), "--format", "json"]);
    assert_eq!(pruned.code, Some(0), "{}", pruned.show());
    let pruned: serde_json::Value = serde_json::from_str(&pruned.stdout).unwrap();
    assert_eq!(pruned["pruned"], 2, "{pruned}");
    deliver(&autocomp, dir, "B3");
    assert!(wait_until(Instant::now() + Duration::from_secs(30), || probed(&autocomp, dir, "B3")), "worked on");
    Command::new("kill").args(["-TERM", &watcher.id().to_string()]).status().unwrap();
    let stopped = watcher.wait().unwrap();
    assert!(stopped.success(), "the watcher stopped cleanly: {stopped:?}");
    let worked: Vec<String> = std::fs::read_to_string(&ledger)
        .unwrap()
        .lines()
        .map(|line| line.split(' ').nth(1).unwrap().to_owned())
        .collect();
    assert_eq!(worked, ["B1", "B2", "B3"], "each batch once, by the watcher of the previous release");
}

/// A store the previous release migrated is the store this release would have made: a
/// migration a release shipped is never edited afterwards (a change is a new migration), as
/// nothing in a store records which text made it. Each migration file at the previous
/// release's commit, byte for byte against this tree's.
#[test]
fn the_previous_releases_migrations_ship_unchanged() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace");
    let commit = std::fs::read_to_string(root.join("tests/data/previous-release")).expect("the release's commit");
    let git = |args: &[&str]| {
        let out = Command::new("git").current_dir(root).args(args).output().expect("git runs");
        assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        out.stdout
    };
    for dir in ["store/migrations/postgres", "store/migrations/sqlite"] {
        let listed = String::from_utf8(git(&["ls-tree", "--name-only", &format!("{}:{dir}", commit.trim())])).unwrap();
        assert!(listed.lines().count() >= 10, "{dir} at the previous release: {listed}");
        for name in listed.lines() {
            let shipped = git(&["show", &format!("{}:{dir}/{name}", commit.trim())]);
            let now = std::fs::read(root.join(dir).join(name))
                .unwrap_or_else(|e| panic!("{dir}/{name}, which the previous release shipped, is gone: {e}"));
            assert!(shipped == now, "{dir}/{name} was edited after the previous release shipped it");
        }
    }
}
