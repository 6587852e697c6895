//! A careless setup named before it leaks, and secrets kept out of messages, with the real
//! `autocomp`, a real component pass and a real store service on real files: a TOML error on
//! a line holding a password never shows it; a config file others can change (or a symlink
//! into a directory anyone can write) is refused with exit 2 naming mode and fix; a token
//! file others can read is warned about once and failed by `doctor`; a token over plain
//! `http://` off this host is warned about before connecting; under umask 022 the embedded
//! store and index are still private.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use autocomp_e2e::services::{Service, TOKEN};
use autocomp_e2e::{Finished, Pipeline, binary, finish, without_pipeline_env};

const PROBE: &str = env!("CARGO_BIN_EXE_probe-component");

/// Every password written here starts with this, so "no part of it shows" is checkable.
const MARK: &str = "Zq9";

/// `autocomp --config-dir <pipeline> args...` with `env` and none of the environment that
/// would change what it reads; at most 60 s.
fn autocomp(pipeline: &Pipeline, args: &[&str], env: &[(&str, &str)]) -> Finished {
    let mut command = Command::new(binary("autocomp"));
    command.arg("--config-dir").arg(pipeline.config_dir()).args(["--as", "ann"]).args(args);
    without_pipeline_env(&mut command);
    command.envs(env.iter().copied());
    command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    finish(command.spawn().expect("autocomp starts"), Duration::from_secs(60))
}

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

#[test]
fn a_toml_error_on_a_line_holding_a_password_never_shows_it() {
    let pipeline = Pipeline::new(PROBE);
    let shared = pipeline.config_dir().join("autocomp.toml");
    let index = pipeline.path("index");
    for line in [
        format!(r#"store = "postgres://u:{MARK}p w\"@h/db" oops"#),
        format!(r#"store = "postgres://u:{MARK}p'w@h/db"x"#),
        format!(r#"store = "postgres://h/db?sslmode=require&password={MARK}a b#c" oops"#),
        format!(r#"store = "http://h:7070/?token={MARK}t?k" junk"#),
    ] {
        std::fs::write(&shared, format!("index = \"local:{}\"\n{line}\n", index.display())).unwrap();
        for (what, run) in [
            ("autocomp status", autocomp(&pipeline, &["status"], &[])),
            ("a component pass", pipeline.run(&[])),
            ("autocomp doctor", autocomp(&pipeline, &["doctor"], &[])),
        ] {
            let all = format!("{}{}", run.stdout, run.stderr);
            assert!(!all.contains(MARK), "{what} shows the password of {line:?}:\n{}", run.show());
            assert!(all.contains("autocomp.toml") && all.contains("line 2, column"), "{what}:\n{}", run.show());
            let expected = if what == "autocomp doctor" { 1 } else { 2 };
            assert_eq!(run.code, Some(expected), "{what}:\n{}", run.show());
        }
    }
}

#[test]
fn a_config_file_others_can_change_is_refused_naming_mode_and_fix() {
    let pipeline = Pipeline::new(PROBE);
    let shared = pipeline.config_dir().join("autocomp.toml");
    chmod(&shared, 0o666);
    for (what, run) in [("autocomp status", autocomp(&pipeline, &["status"], &[])), ("a pass", pipeline.run(&[]))] {
        assert_eq!(run.code, Some(2), "{what}:\n{}", run.show());
        for needed in ["autocomp.toml", "mode 666", "chmod o-w"] {
            assert!(run.stderr.contains(needed), "{what} does not say {needed:?}:\n{}", run.show());
        }
    }
    let doctor = autocomp(&pipeline, &["doctor"], &[]);
    let line = doctor.stdout.lines().find(|l| l.contains("config autocomp.toml")).unwrap_or_default();
    assert!(line.starts_with("FAIL") && line.contains("mode 666"), "{}", doctor.show());
    chmod(&shared, 0o644);

    // A component's own file too.
    let own = pipeline.config_dir().join("probe.toml");
    std::fs::write(&own, "").unwrap();
    chmod(&own, 0o646);
    let run = pipeline.run(&[]);
    assert_eq!(run.code, Some(2), "{}", run.show());
    assert!(run.stderr.contains("probe.toml") && run.stderr.contains("mode 646"), "{}", run.show());
    chmod(&own, 0o644);

    // A symlink to a file in a directory anyone can write (no sticky bit): anyone can
    // replace the file it points at.
    let open = pipeline.path("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::rename(&shared, open.join("autocomp.toml")).unwrap();
    std::os::unix::fs::symlink(open.join("autocomp.toml"), &shared).unwrap();
    chmod(&open, 0o777);
    let refused = autocomp(&pipeline, &["status"], &[]);
    assert_eq!(refused.code, Some(2), "{}", refused.show());
    assert!(refused.stderr.contains("mode 777") && refused.stderr.contains("a symlink to"), "{}", refused.show());
    // With the sticky bit only the file's owner may replace it: trusted.
    chmod(&open, 0o1777);
    let fine = autocomp(&pipeline, &["status"], &[]);
    assert_eq!(fine.code, Some(0), "{}", fine.show());
    chmod(&open, 0o755);
}

#[test]
fn a_token_file_others_can_read_is_warned_about_once_and_failed_by_doctor() {
    let pipeline = Pipeline::new(PROBE);
    let service = Service::store(&pipeline.path("service.db"), &pipeline.path(""));
    let token_file = pipeline.path("token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    chmod(&token_file, 0o644);
    let url = service.url();
    let env = [("AUTOCOMP_TOKEN_FILE", token_file.to_str().unwrap())];
    let status = autocomp(&pipeline, &["--store", &url, "status"], &env);
    assert_eq!(status.code, Some(0), "the token still works: {}", status.show());
    let warnings: Vec<&str> = status.stderr.lines().filter(|l| l.contains("is not private")).collect();
    assert_eq!(warnings.len(), 1, "one warning per file per process:\n{}", status.show());
    assert!(warnings[0].contains(token_file.to_str().unwrap()) && warnings[0].contains("mode 644"), "{warnings:?}");
    assert!(warnings[0].contains("chmod o-rwx"), "{warnings:?}");

    let doctor = autocomp(&pipeline, &["--store", &url, "doctor"], &env);
    let line = doctor.stdout.lines().find(|l| l.contains("token file")).unwrap_or_default();
    assert!(line.starts_with("FAIL") && line.contains("mode 644"), "{}", doctor.show());

    chmod(&token_file, 0o600);
    let private = autocomp(&pipeline, &["--store", &url, "status"], &env);
    assert_eq!(private.code, Some(0), "{}", private.show());
    assert!(!private.stderr.contains("is not private"), "{}", private.show());
}

#[test]
fn a_token_over_plain_http_to_another_host_warns_before_connecting_and_loopback_does_not() {
    let pipeline = Pipeline::new(PROBE);
    let token = [("AUTOCOMP_TOKEN", TOKEN)];
    // TEST-NET-1: no traffic leaves this host (the connection fails); the warning comes first.
    let off_host = autocomp(&pipeline, &["--store", "http://192.0.2.1:7070?retry_for=1s", "status"], &token);
    assert_ne!(off_host.code, Some(0), "{}", off_host.show());
    let warned = off_host.stderr.find("in the clear").unwrap_or_else(|| panic!("no warning:\n{}", off_host.show()));
    assert!(off_host.stderr[warned..].contains("192.0.2.1"), "{}", off_host.show());
    assert_eq!(off_host.stderr.matches("in the clear").count(), 1, "once per process:\n{}", off_host.show());
    let first_line = off_host.stderr.lines().find(|l| !l.trim().is_empty()).unwrap_or_default();
    assert!(first_line.contains("in the clear"), "warned before anything else:\n{}", off_host.show());

    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    for base in [format!("http://127.0.0.2:{port}"), format!("http://localhost:{port}"), format!("http://[::1]:{port}")]
    {
        let url = format!("{base}?retry_for=1s");
        let local = autocomp(&pipeline, &["--store", &url, "status"], &token);
        assert!(!local.stderr.contains("in the clear"), "{base}:\n{}", local.show());
    }
    let without_token = autocomp(&pipeline, &["--store", "http://192.0.2.1:7070?retry_for=1s", "status"], &[]);
    assert!(!without_token.stderr.contains("in the clear"), "{}", without_token.show());
}

#[test]
fn under_umask_022_a_fresh_pass_leaves_the_store_0600_and_the_index_0700() {
    let pipeline = Pipeline::new(PROBE);
    let fresh = pipeline.path("fresh");
    std::fs::create_dir(&fresh).unwrap();
    chmod(&fresh, 0o755);
    let store = fresh.join("store.db");
    pipeline.use_backend("store", &format!("sqlite://{}", store.display()));
    pipeline.use_backend("index", &format!("local:{}", fresh.join("index").display()));
    let mut command = Command::new("sh");
    command.args(["-c", "umask 022 && exec \"$0\" \"$@\""]).arg(PROBE).arg("--config-dir").arg(pipeline.config_dir());
    without_pipeline_env(&mut command);
    command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let pass = finish(command.spawn().expect("the probe starts"), Duration::from_secs(30));
    assert_eq!(pass.code, Some(0), "{}", pass.show());
    assert_eq!(mode(&store), 0o600, "store.db");
    for beside in ["store.db-wal", "store.db-shm", "store.db-wake"] {
        let path = fresh.join(beside);
        if path.exists() {
            assert_eq!(mode(&path), 0o600, "{beside}");
        }
    }
    assert_eq!(mode(&fresh.join("index")), 0o700, "the index directory");
}
