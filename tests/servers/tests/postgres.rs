//! The PostgreSQL harness against real servers: start, databases and SQL, crash and restart
//! on the same port, a synchronous standby taking over, and the clean-up of a server the
//! test process never dropped.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use autocomp_test_servers::postgres::{self, Postgres};
use autocomp_test_servers::{shared, wait_until};

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next()))
        .is_some_and(|state| state != 'Z' && state != 'X')
}

#[test]
fn starts_a_server_creates_databases_and_runs_sql() {
    let pg = Postgres::start();
    assert!(pg.is_running());
    assert_eq!(pg.host_port(), format!("127.0.0.1:{}", pg.port()));
    let pid_file = std::fs::read_to_string(pg.data_dir().join("postmaster.pid")).unwrap();
    assert_eq!(pid_file.lines().next().unwrap().trim(), pg.pid().to_string());
    assert!(pg.psql("postgres", "show fsync").trim() == "on", "fsync is on by default");
    assert!(pg.psql("postgres", "select version()").starts_with("PostgreSQL "));

    let url = pg.create_database("alpha");
    assert_eq!(url, format!("postgres://autocomp@127.0.0.1:{}/alpha", pg.port()));
    let out = pg.psql(
        "alpha",
        "create table t (x int, y text);\ninsert into t values (1, 'a'), (2, 'b');\nselect * from t order by x;",
    );
    assert_eq!(out, "1|a\n2|b\n");

    let (one, two) = (pg.unique_database(), pg.unique_database());
    assert_ne!(one, two);
    let name = one.rsplit('/').next().unwrap();
    assert_eq!(pg.psql(name, "select current_database()").trim(), name);

    let failed = std::panic::catch_unwind(|| pg.psql("alpha", "select * from missing"));
    let message = *failed.expect_err("SQL errors fail").downcast::<String>().unwrap();
    assert!(message.contains("relation \"missing\" does not exist"), "{message}");

    let (pid, dir) = (pg.pid(), pg.data_dir().parent().unwrap().to_path_buf());
    drop(pg);
    assert!(!alive(pid), "the postmaster is gone after drop");
    assert!(!dir.exists(), "{} is removed after drop", dir.display());
}

#[test]
fn committed_data_survives_a_crash_and_a_restart_on_the_same_port() {
    let pg = Postgres::start();
    let port = pg.port();
    pg.psql("postgres", "create table t (x int);\ninsert into t select generate_series(1, 1000);");
    let before = pg.pid();

    pg.crash();
    assert!(!pg.is_running());
    assert!(!alive(before));
    assert!(pg.data_dir().join("postmaster.pid").exists(), "a crash leaves postmaster.pid behind");

    pg.restart();
    assert!(pg.is_running());
    assert_eq!(pg.port(), port);
    assert_ne!(pg.pid(), before);
    assert_eq!(pg.psql("postgres", "select count(*), sum(x) from t").trim(), "1000|500500");
    let log = std::fs::read_to_string(pg.log_path()).unwrap();
    assert!(log.contains("not properly shut down"), "the restart ran crash recovery:\n{log}");

    pg.psql("postgres", "insert into t values (1001)");
    pg.stop_fast();
    assert!(!pg.is_running());
    pg.restart();
    assert_eq!(pg.psql("postgres", "select count(*) from t").trim(), "1001");
}

#[test]
fn a_synchronous_standby_takes_over_after_the_primary_crashes() {
    let primary = Postgres::start();
    primary.psql("postgres", "create table t (x int primary key)");
    let standby = primary.standby(true);
    assert_ne!(standby.port(), primary.port());
    assert_eq!(primary.psql("postgres", "show synchronous_standby_names").trim(), "*");
    assert_eq!(standby.psql("postgres", "select pg_is_in_recovery()").trim(), "t");

    // Acknowledged only once the standby has flushed it; visible there once replayed.
    primary.psql("postgres", "insert into t values (1)");
    let replayed = wait_until(Instant::now() + Duration::from_secs(30), || {
        standby.psql("postgres", "select count(*) from t where x = 1").trim() == "1"
    });
    assert!(replayed, "the row reached the standby");

    primary.crash();
    standby.promote();
    standby.psql("postgres", "insert into t values (2)");
    assert_eq!(standby.psql("postgres", "select x from t order by x"), "1\n2\n");

    // The crashed primary's System V segment (line 7 of its stale postmaster.pid: key, id)
    // goes with it rather than piling up.
    let pid_file = std::fs::read_to_string(primary.data_dir().join("postmaster.pid")).unwrap();
    let id = pid_file.lines().nth(6).and_then(|line| line.split_whitespace().nth(1)).unwrap().to_owned();
    let segments = || String::from_utf8(Command::new("ipcs").arg("-m").output().unwrap().stdout).unwrap();
    let listed = |all: &str| all.lines().any(|line| line.split_whitespace().nth(1) == Some(id.as_str()));
    assert!(listed(&segments()), "segment {id} of the crashed primary exists:\n{}", segments());
    drop(primary);
    assert!(!listed(&segments()), "segment {id} is removed with the crashed primary:\n{}", segments());
}

#[test]
fn the_shared_server_gives_each_caller_its_own_database() {
    let (a, b) = (shared().unique_database(), shared().unique_database());
    assert_ne!(a, b);
    assert_eq!(shared().psql("postgres", "show fsync").trim(), "off");
    assert!(std::ptr::eq(shared(), shared()));
}

/// The child half of the next test: start the shared server, say where it is, exit without
/// dropping it.
#[test]
fn shared_server_child() {
    if std::env::var_os("AUTOCOMP_SHARED_CHILD").is_none() {
        return;
    }
    let pg = shared();
    println!("SHARED {} {}", pg.pid(), pg.data_dir().parent().unwrap().display());
}

#[test]
fn the_shared_server_goes_when_its_test_process_exits() {
    postgres::require_installed();
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "shared_server_child", "--nocapture", "--test-threads=1"])
        .env("AUTOCOMP_SHARED_CHILD", "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    let line = stdout
        .lines()
        .find_map(|l| l.split_once("SHARED ").map(|(_, rest)| rest))
        .unwrap_or_else(|| panic!("{stdout}"));
    let (pid, dir) = line.split_once(' ').unwrap();
    let (pid, dir): (u32, PathBuf) = (pid.parse().unwrap(), dir.into());
    let gone = wait_until(Instant::now() + Duration::from_secs(20), || !alive(pid) && !Path::new(&dir).exists());
    assert!(gone, "postmaster {pid} or {} still there after the test process exited", dir.display());
}
