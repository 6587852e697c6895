//! `autocomp doctor` as an operator runs it on a host: against a healthy pipeline (embedded,
//! PostgreSQL, ZooKeeper with an identity) every check passes and it exits 0; each broken
//! setup (a config key mistyped, a store behind this release or unreachable, a clock off,
//! an index behind, a wrong or missing ZooKeeper identity, a secret others can read or too
//! short, a certificate expired or expiring, a component silent or with its circuit open)
//! fails its own line with the fix, exits 1, and changes nothing.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use autocomp_e2e::zk::ZooKeeper;
use autocomp_e2e::{Finished, Pipeline, binary, finish, wait_until, without_pipeline_env};
use autocomp_model::{BatchId, ComponentName, SteeringChange};
use serde_json::Value;

const PROBE: &str = env!("CARGO_BIN_EXE_probe-component");

/// `autocomp doctor --config-dir <pipeline> args...`, none of the environment that would
/// change what it checks; at most 60 s.
fn doctor_with(pipeline: &Pipeline, args: &[&str], wrap: Option<&[&str]>) -> Finished {
    doctor_env(pipeline, args, wrap, &[])
}

fn doctor_env(pipeline: &Pipeline, args: &[&str], wrap: Option<&[&str]>, env: &[(&str, &Path)]) -> Finished {
    let autocomp = binary("autocomp");
    let mut command = match wrap {
        Some(wrapper) => {
            let mut command = Command::new(wrapper[0]);
            command.args(&wrapper[1..]).arg(&autocomp);
            command
        }
        None => Command::new(&autocomp),
    };
    command.arg("doctor").arg("--config-dir").arg(pipeline.config_dir()).args(args);
    without_pipeline_env(&mut command);
    command.envs(env.iter().copied());
    command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    finish(command.spawn().expect("autocomp starts"), Duration::from_secs(60))
}

fn doctor(pipeline: &Pipeline, args: &[&str]) -> Finished {
    doctor_with(pipeline, args, None)
}

/// The line of the check named exactly `check` (the text report pads the name).
fn line<'a>(finished: &'a Finished, check: &str) -> &'a str {
    finished
        .stdout
        .lines()
        .find(|line| line.get(6..).is_some_and(|rest| rest.starts_with(check) && rest[check.len()..].starts_with("  ")))
        .unwrap_or_else(|| panic!("no `{check}` line:\n{}", finished.show()))
}

fn assert_verdict(finished: &Finished, check: &str, verdict: &str) -> String {
    let found = line(finished, check);
    assert!(found.starts_with(verdict), "`{check}` should be {verdict}:\n{}", finished.show());
    found.to_owned()
}

/// A pipeline whose probe has run one pass (so it is registered and the index exists).
fn worked_pipeline(configure: &str) -> Pipeline {
    let pipeline = Pipeline::new(PROBE);
    pipeline.configure(configure);
    pipeline.register(2);
    let pass = pipeline.run(&[]);
    assert_eq!(pass.code, Some(0), "{}", pass.show());
    pipeline
}

#[test]
fn a_healthy_embedded_host_passes_every_check_changes_nothing_and_says_so_in_json_too() {
    let pipeline = worked_pipeline("");
    let head = pipeline.head();
    let text = doctor(&pipeline, &[]);
    assert_eq!(text.code, Some(0), "{}", text.show());
    for check in ["config autocomp.toml", "config probe.toml", "store", "clock", "index", "locks", "component probe"] {
        assert_verdict(&text, check, "ok");
    }
    assert!(line(&text, "store").contains("(current)"), "{}", text.show());
    assert!(text.stdout.lines().any(|l| l.starts_with("ok    disk ")), "{}", text.show());
    assert!(text.stdout.trim_end().ends_with("checks passed"), "{}", text.show());
    assert!(text.stderr.is_empty(), "quiet on stderr when all is well: {}", text.show());

    let json = doctor(&pipeline, &["--format", "json"]);
    assert_eq!(json.code, Some(0), "{}", json.show());
    let report: Value = serde_json::from_str(&json.stdout).expect("the report is JSON");
    assert_eq!(report["passed"], true);
    let checks = report["checks"].as_array().expect("a list of checks");
    assert!(checks.len() >= 8, "{report}");
    assert!(checks.iter().all(|c| c["verdict"] == "ok"), "{report}");
    assert!(checks.iter().any(|c| c["check"] == "component probe"), "{report}");
    assert_eq!(pipeline.head(), head, "the doctor wrote nothing to the store");
}

#[test]
fn a_mistyped_config_key_fails_naming_the_file_and_the_key() {
    let pipeline = worked_pipeline("");
    pipeline.configure("max_thredas = 2\n");
    let finished = doctor(&pipeline, &[]);
    assert_eq!(finished.code, Some(1), "{}", finished.show());
    let found = assert_verdict(&finished, "config probe.toml", "FAIL");
    assert!(found.contains("max_thredas") && found.contains("probe.toml") && found.contains("fix:"), "{found}");
    assert_verdict(&finished, "store", "ok");

    std::fs::write(pipeline.config_dir().join("autocomp.toml"), "stor = \"sqlite:///x\"\n").unwrap();
    let finished = doctor(&pipeline, &[]);
    assert_eq!(finished.code, Some(1), "{}", finished.show());
    let found = assert_verdict(&finished, "config autocomp.toml", "FAIL");
    assert!(found.contains("stor"), "{found}");
    // Each file fails its own line: the component file still says its own mistake, and the
    // backends autocomp.toml would name are not called missing.
    assert!(line(&finished, "config probe.toml").contains("max_thredas"), "{}", finished.show());
    assert!(line(&finished, "store").contains("autocomp.toml does not parse"), "{}", finished.show());
    assert_verdict(&finished, "store", "skip");
}

#[test]
fn a_store_file_behind_this_release_fails_with_the_fix_and_stays_as_it_was() {
    let pipeline = Pipeline::new(PROBE);
    let old = pipeline.path("old.db");
    autocomp_store::SqliteStore::create_at_schema_version(&old, 6).unwrap();
    pipeline.use_backend("store", &format!("sqlite://{}", old.display()));
    let finished = doctor(&pipeline, &[]);
    assert_eq!(finished.code, Some(1), "{}", finished.show());
    let found = assert_verdict(&finished, "store", "FAIL");
    assert!(found.contains("schema version 6") && found.contains("migrate"), "{found}");
    assert_verdict(&finished, "clock", "skip");
    let again = pipeline.block_on(autocomp_store::open_store(&format!("sqlite://{}?migrate=false", old.display())));
    let error = again.err().expect("still behind").to_string();
    assert!(error.contains("schema version 6"), "the doctor migrated it: {error}");

    let missing = pipeline.path("typo.db");
    pipeline.use_backend("store", &format!("sqlite://{}", missing.display()));
    let finished = doctor(&pipeline, &[]);
    let found = assert_verdict(&finished, "store", "FAIL");
    assert!(found.contains("no store file"), "{found}");
    assert!(!missing.exists(), "the doctor made a store file for a mistyped path");
}

#[test]
fn an_unreachable_postgresql_fails_the_store_and_skips_what_needs_it() {
    let pipeline = Pipeline::new(PROBE);
    // Bound but never listening, for the whole test: connections are refused, and no server
    // another test starts meanwhile can take the port.
    let reserved = tokio::net::TcpSocket::new_v4().unwrap();
    reserved.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let port = reserved.local_addr().unwrap().port();
    pipeline.use_backend("store", &format!("postgres://autocomp:secret@127.0.0.1:{port}/nowhere?retry_for=0s"));
    // The workspace's binaries are built at their first use: not on the doctor's clock.
    binary("autocomp");
    let started = Instant::now();
    let finished = doctor(&pipeline, &[]);
    assert_eq!(finished.code, Some(1), "{}", finished.show());
    let found = assert_verdict(&finished, "store", "FAIL");
    assert!(found.contains(&port.to_string()) && !found.contains("secret"), "{found}");
    assert!(found.contains("fix: check that the store's server runs"), "{found}");
    for check in ["clock", "index", "components"] {
        assert_verdict(&finished, check, "skip");
    }
    assert!(started.elapsed() < Duration::from_secs(30), "took {:?}", started.elapsed());
}

#[test]
fn over_postgresql_a_clock_off_by_minutes_fails_and_the_true_clock_passes() {
    let url = autocomp_test_servers::postgres::shared().unique_database();
    let pipeline = Pipeline::with_store(PROBE, &url);
    pipeline.register(1);
    assert_eq!(pipeline.run(&[]).code, Some(0));
    let finished = doctor(&pipeline, &[]);
    assert_eq!(finished.code, Some(0), "{}", finished.show());
    assert!(assert_verdict(&finished, "store", "ok").contains("postgres at schema version"), "{}", finished.show());
    assert!(assert_verdict(&finished, "clock", "ok").contains("the store's clock (postgres)"));

    let faketime = Path::new("/usr/bin/faketime");
    assert!(faketime.exists(), "faketime is not installed: apt-get install -y faketime (scripts/test does)");
    // libfaketime moves this process's wall clock only; its monotonic clock (timers) is real.
    let shifted = ["/usr/bin/env", "FAKETIME_DONT_FAKE_MONOTONIC=1", "/usr/bin/faketime", "-f", "+5m"];
    let finished = doctor_with(&pipeline, &[], Some(&shifted));
    assert_eq!(finished.code, Some(1), "{}", finished.show());
    let found = assert_verdict(&finished, "clock", "FAIL");
    assert!(found.contains("ahead of the store's clock") && found.contains("chrony"), "{found}");
}

#[test]
fn an_index_that_cannot_catch_up_fails_saying_how_far_behind_it_is() {
    let pipeline = worked_pipeline("");
    // Another process's writer on the embedded index: nothing can commit the new changes.
    let index = tantivy::Index::open_in_dir(pipeline.path("index")).expect("the pass made the index");
    let writer: tantivy::IndexWriter = index.writer(15_000_000).expect("nobody holds the writer between passes");
    for n in 10..40 {
        pipeline.register_one(&format!("C{n:04}"), true);
    }
    let finished = doctor(&pipeline, &["--index-lag", "10"]);
    drop(writer);
    assert_eq!(finished.code, Some(1), "{}", finished.show());
    let found = assert_verdict(&finished, "index", "FAIL");
    assert!(found.contains("changes behind") && found.contains("more than 10"), "{found}");
    let finished = doctor(&pipeline, &["--index-lag", "10"]);
    assert_verdict(&finished, "index", "ok");
}

#[test]
fn zookeeper_with_the_pipelines_identity_passes_and_a_wrong_or_missing_identity_fails() {
    let zk = ZooKeeper::start(ZooKeeper::standalone_options().secured());
    let pipeline = Pipeline::new(PROBE);
    pipeline.use_locks(&zk.auth_url("doctor", "4s"));
    pipeline.register(1);
    let pass = pipeline.run(&[]);
    assert_eq!(pass.code, Some(0), "{}", pass.show());
    let acl_of_the_tree = || zk.with_client(|client| async move { client.get_acl("/doctor").await.unwrap().0 });
    let before = (zk.tree("/doctor"), acl_of_the_tree());

    let finished = doctor(&pipeline, &[]);
    assert_eq!(finished.code, Some(0), "{}", finished.show());
    assert!(assert_verdict(&finished, "locks", "ok").contains("as autocomp sets them"), "{}", finished.show());
    let identity = format!("ZooKeeper identity file {}", zk.auth_file().display());
    assert_verdict(&finished, &identity, "ok");

    // Another password for the same user: ZooKeeper accepts the session, the ACLs do not.
    let wrong = pipeline.path("wrong-auth");
    let user = std::fs::read_to_string(zk.auth_file()).unwrap().split(':').next().unwrap().to_owned();
    std::fs::write(&wrong, format!("{user}:not-the-pipelines-password\n")).unwrap();
    std::fs::set_permissions(&wrong, std::fs::Permissions::from_mode(0o600)).unwrap();
    pipeline.use_locks(&format!("{}&auth_file={}", zk.url("doctor", "4s"), wrong.display()));
    let finished = doctor(&pipeline, &[]);
    assert_eq!(finished.code, Some(1), "{}", finished.show());
    let found = assert_verdict(&finished, "locks", "FAIL");
    assert!(found.contains("this identity is not in it"), "{found}");

    pipeline.use_locks(&zk.url("doctor", "4s"));
    let finished = doctor(&pipeline, &[]);
    let found = assert_verdict(&finished, "locks", "FAIL");
    assert!(found.contains("no ZooKeeper identity is configured"), "{found}");
    // ZooKeeper itself may have reaped empty containers meanwhile: nothing new, no ACL changed.
    let paths = |tree: Vec<autocomp_e2e::zk::Znode>| tree.into_iter().map(|n| n.path).collect::<Vec<_>>();
    let (made_before, acl_before) = (paths(before.0), before.1);
    assert!(paths(zk.tree("/doctor")).iter().all(|p| made_before.contains(p)), "the doctor made lock nodes");
    assert_eq!(acl_of_the_tree(), acl_before, "the doctor changed the lock tree's ACL");

    // Over TLS: the test CA's certificates last two days, well inside the 30-day warning.
    pipeline.use_locks(&zk.secure_url("doctor", "4s"));
    let finished = doctor(&pipeline, &[]);
    assert_eq!(finished.code, Some(1), "{}", finished.show());
    assert_verdict(&finished, "locks", "ok");
    let [ca, _, key] = zk.tls_files();
    let found = assert_verdict(&finished, &format!("certificate {}", ca.display()), "FAIL");
    assert!(found.contains("within 30 days") && found.contains("renew"), "{found}");
    assert_verdict(&finished, &format!("private key {}", key.display()), "ok");
    let finished = doctor(&pipeline, &["--expires-within", "1h"]);
    assert_eq!(finished.code, Some(0), "{}", finished.show());
}

#[test]
fn a_stopped_zookeeper_fails_the_locks_check_naming_the_servers() {
    let mut zk = ZooKeeper::standalone();
    let pipeline = worked_pipeline("");
    pipeline.use_locks(&zk.url("doctor", "2s"));
    let hosts = zk.hosts();
    zk.kill(0);
    let finished = doctor(&pipeline, &[]);
    assert_eq!(finished.code, Some(1), "{}", finished.show());
    let found = assert_verdict(&finished, "locks", "FAIL");
    assert!(found.contains(&hosts) && found.contains("fix: check that ZooKeeper runs"), "{found}");
}

fn write_private(path: &Path, text: &str, mode: u32) -> PathBuf {
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    path.to_path_buf()
}

#[test]
fn secret_files_others_can_read_or_too_short_fail_and_good_ones_pass() {
    let pipeline = worked_pipeline("");
    let good = write_private(&pipeline.path("good-token"), "0123456789abcdef0123456789abcdef\n", 0o640);
    let readable = write_private(&pipeline.path("readable-token"), "0123456789abcdef0123456789abcdef\n", 0o644);
    let short = write_private(&pipeline.path("short-token"), "abc123\n", 0o600);
    let users = write_private(&pipeline.path("users"), "", 0o600);
    let not_a_key = write_private(&pipeline.path("tls.key"), "hello\n", 0o600);
    let as_text = |p: &PathBuf| p.display().to_string();
    let args = [
        "--token-file",
        &as_text(&good),
        "--token-file",
        &as_text(&readable),
        "--token-file",
        &as_text(&short),
        "--secret-file",
        &as_text(&users),
        "--key",
        &as_text(&not_a_key),
        "--key",
        "/nonexistent/key.pem",
    ];
    let finished = doctor(&pipeline, &args);
    assert_eq!(finished.code, Some(1), "{}", finished.show());
    assert_verdict(&finished, &format!("token file {}", good.display()), "ok");
    let found = assert_verdict(&finished, &format!("token file {}", readable.display()), "FAIL");
    assert!(found.contains("mode 644") && found.contains("chmod o-rwx"), "{found}");
    let found = assert_verdict(&finished, &format!("token file {}", short.display()), "FAIL");
    assert!(found.contains("at least 12 characters"), "{found}");
    assert!(!finished.stdout.contains("abc123"), "a secret was printed: {}", finished.show());
    assert_verdict(&finished, &format!("secret file {}", users.display()), "FAIL");
    let found = assert_verdict(&finished, &format!("private key {}", not_a_key.display()), "FAIL");
    assert!(found.contains("no PEM private key"), "{found}");
    let found = assert_verdict(&finished, "private key /nonexistent/key.pem", "FAIL");
    assert!(found.contains("cannot read it"), "{found}");
}

/// A config file others can change is what a local user edits to send the token to his own
/// listener: doctor fails it (the pipeline refuses it) with the mode and the fix, whether it
/// is the file itself or a symlink into a directory anyone can write.
#[test]
fn a_config_file_others_can_change_fails_and_so_does_a_symlink_into_an_open_directory() {
    let pipeline = worked_pipeline("");
    let own = write_private(&pipeline.config_dir().join("probe.toml"), "", 0o666);
    let finished = doctor(&pipeline, &[]);
    assert_eq!(finished.code, Some(1), "{}", finished.show());
    let found = assert_verdict(&finished, "config probe.toml", "FAIL");
    assert!(found.contains("mode 666") && found.contains("chmod o-w"), "{found}");
    assert_verdict(&finished, "config autocomp.toml", "ok");
    std::fs::set_permissions(&own, std::fs::Permissions::from_mode(0o644)).unwrap();

    let shared = pipeline.config_dir().join("autocomp.toml");
    let open = pipeline.path("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::rename(&shared, open.join("autocomp.toml")).unwrap();
    std::os::unix::fs::symlink(open.join("autocomp.toml"), &shared).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let finished = doctor(&pipeline, &[]);
    assert_eq!(finished.code, Some(1), "{}", finished.show());
    let found = assert_verdict(&finished, "config autocomp.toml", "FAIL");
    assert!(found.contains("mode 777") && found.contains("a symlink to"), "{found}");
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
    let finished = doctor(&pipeline, &[]);
    assert_verdict(&finished, "config autocomp.toml", "ok");
}

/// A self-signed certificate valid until `not_after` (year, month, day), PEM, in `path`.
fn certificate(path: &Path, not_after: (i32, u8, u8)) -> PathBuf {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(vec!["doctor.test".to_owned()]).unwrap();
    params.distinguished_name.push(rcgen::DnType::CommonName, "doctor.test");
    params.not_before = rcgen::date_time_ymd(2020, 1, 1);
    params.not_after = rcgen::date_time_ymd(not_after.0, not_after.1, not_after.2);
    std::fs::write(path, params.self_signed(&key).unwrap().pem()).unwrap();
    path.to_path_buf()
}

fn days_from_now(days: i64) -> (i32, u8, u8) {
    use chrono::Datelike;
    let day = chrono::Utc::now().date_naive() + chrono::Days::new(u64::try_from(days).unwrap());
    (day.year(), u8::try_from(day.month()).unwrap(), u8::try_from(day.day()).unwrap())
}

#[test]
fn certificates_expired_or_expiring_within_30_days_fail_and_a_lasting_one_passes() {
    let pipeline = worked_pipeline("");
    let expired = certificate(&pipeline.path("expired.pem"), (2021, 1, 1));
    let soon = certificate(&pipeline.path("soon.pem"), days_from_now(10));
    let lasting = certificate(&pipeline.path("lasting.pem"), days_from_now(120));
    let as_text = |p: &PathBuf| p.display().to_string();
    let args = ["--cert", &as_text(&expired), "--cert", &as_text(&soon), "--cert", &as_text(&lasting)];
    let finished = doctor(&pipeline, &args);
    assert_eq!(finished.code, Some(1), "{}", finished.show());
    let found = assert_verdict(&finished, &format!("certificate {}", expired.display()), "FAIL");
    assert!(found.contains("expired on 2021-01-01"), "{found}");
    let found = assert_verdict(&finished, &format!("certificate {}", soon.display()), "FAIL");
    assert!(found.contains("(in 9 days)") || found.contains("(in 10 days)"), "{found}");
    let found = assert_verdict(&finished, &format!("certificate {}", lasting.display()), "ok");
    assert!(found.contains("doctor.test"), "{found}");
}

#[test]
fn a_silent_component_or_one_whose_circuit_opened_fails_and_a_paused_one_is_only_reported() {
    let pipeline = worked_pipeline("silent_after = \"2s\"\n");
    let finished = doctor(&pipeline, &[]);
    assert_verdict(&finished, "component probe", "ok");
    let silent = wait_until(Instant::now() + Duration::from_secs(20), || {
        line(&doctor(&pipeline, &[]), "component probe").starts_with("FAIL")
    });
    assert!(silent, "the probe never became silent after 2s without a pass");
    let finished = doctor(&pipeline, &[]);
    assert_eq!(finished.code, Some(1), "{}", finished.show());
    assert!(line(&finished, "component probe").contains("silent (after 2s)"), "{}", finished.show());

    pipeline.configure("");
    assert_eq!(pipeline.run(&[]).code, Some(0));
    let probe = ComponentName::new("probe").unwrap();
    pipeline.steer(SteeringChange::Pause { component: Some(probe.clone()), drain: false });
    let finished = doctor(&pipeline, &[]);
    assert_eq!(finished.code, Some(0), "a fresh pause is an operator's choice: {}", finished.show());
    assert!(line(&finished, "component probe").contains("pause"), "{}", finished.show());

    pipeline.steer(SteeringChange::Resume { component: Some(probe.clone()) });
    pipeline.steer(SteeringChange::Outcome {
        component: probe,
        batch: BatchId::new("B0001").unwrap(),
        failed: true,
        break_after: 1,
        summary: "the tape library is offline".into(),
    });
    let finished = doctor(&pipeline, &[]);
    assert_eq!(finished.code, Some(1), "{}", finished.show());
    let found = assert_verdict(&finished, "component probe", "FAIL");
    assert!(found.contains("--rerun-failed"), "{found}");
}

#[test]
fn a_store_no_component_has_run_against_fails_and_a_full_disk_threshold_fails() {
    let pipeline = Pipeline::new(PROBE);
    pipeline.register(1);
    let finished = doctor(&pipeline, &["--min-free-mib", "1000000000"]);
    assert_eq!(finished.code, Some(1), "{}", finished.show());
    let found = assert_verdict(&finished, "components", "FAIL");
    assert!(found.contains("no component has run against this store"), "{found}");
    let disk = finished.stdout.lines().find(|l| l.contains(" disk ")).expect("a disk line");
    assert!(disk.starts_with("FAIL") && disk.contains("less than"), "{disk}");
}

#[test]
fn a_store_service_without_the_token_fails_naming_it_and_with_the_token_file_passes() {
    let pipeline = Pipeline::new(PROBE);
    let logs = pipeline.path("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let service = autocomp_e2e::services::Service::store(&pipeline.path("served.db"), &logs);
    pipeline.use_backend("store", &service.url());
    let finished = doctor(&pipeline, &[]);
    assert_eq!(finished.code, Some(1), "{}", finished.show());
    let found = assert_verdict(&finished, "store", "FAIL");
    assert!(found.contains("token") && found.contains("fix: check the credentials"), "{found}");

    let token = write_private(&pipeline.path("token"), &format!("{}\n", autocomp_e2e::services::TOKEN), 0o600);
    let finished = doctor_env(&pipeline, &[], None, &[("AUTOCOMP_TOKEN_FILE", &token)]);
    assert_verdict(&finished, "store", "ok");
    assert_verdict(&finished, &format!("token file {}", token.display()), "ok");
    assert!(!finished.stdout.contains("store writes"), "{}", finished.show());
}

/// Run as root over a pipeline its user owns, the doctor opens neither the embedded store
/// nor the index: it would leave files (SQLite's -shm, index files) only root can write.
#[test]
fn as_root_over_a_pipeline_another_user_owns_it_makes_no_file_there() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "this test runs as root, as CI runs the suite");
    let pipeline = worked_pipeline("");
    let chown = Command::new("chown").args(["-R", "65534:65534"]).arg(pipeline.path("")).status().unwrap();
    assert!(chown.success());
    let listing = || {
        let output = Command::new("find").arg(pipeline.path("")).args(["-printf", "%p %u %s\\n"]).output().unwrap();
        let mut lines: Vec<String> = String::from_utf8_lossy(&output.stdout).lines().map(str::to_owned).collect();
        lines.sort();
        lines
    };
    let before = listing();
    let finished = doctor(&pipeline, &[]);
    assert_eq!(finished.code, Some(1), "{}", finished.show());
    let found = assert_verdict(&finished, "user", "FAIL");
    assert!(found.contains("sudo -u autocomp"), "{found}");
    assert_verdict(&finished, "store", "skip");
    assert_verdict(&finished, "index", "skip");
    assert_eq!(listing(), before, "the doctor made or changed files in the pipeline's directories");
}
