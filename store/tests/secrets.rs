//! The PostgreSQL password stays secret: it never shows in a description of the URL, in the
//! error of a refused or unreachable server, or on a command line (`password_file=` in the
//! URL, `--db-file` for the services), and no log level prints SQL parameters (the data the
//! store holds). Real servers, real processes.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use autocomp_model::*;
use autocomp_store::*;
use autocomp_test_servers::http1::get;
use autocomp_test_servers::postgres::{Postgres, percent_encode};
use autocomp_test_servers::{wait_for, wait_until_async};
use autocomp_toolkit::display_url;
use proptest::prelude::*;
use serde_json::json;

/// Every password starts with this, so "no part of it shows" is checkable.
const MARK: &str = "Zq9";

/// What must never show: the password, raw or percent-encoded, or its distinctive start.
fn assert_hidden(text: &str, password: &str) {
    assert!(!text.contains(MARK), "the password {password:?} shows in {text:?}");
    assert!(!text.contains(password), "the password {password:?} shows in {text:?}");
    assert!(!text.contains(&percent_encode(password)), "the password {password:?} shows in {text:?}");
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn passwords() -> impl Strategy<Value = String> {
    "[/?@#:%a-zé中 ]{0,16}".prop_map(|tail| format!("{MARK}{tail}"))
}

/// Passwords as an operator may write them raw in a URL or a config line: `? # " '` and
/// spaces among the rest.
fn raw_passwords() -> impl Strategy<Value = String> {
    "[/?@#:%a-zé中 \"']{0,16}".prop_map(|tail| format!("{MARK}{tail}"))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// A secret query option (`?password=`, `?token=`, `&sslpassword=`, in the fragment too)
    /// is hidden up to the next `&key=`, whatever its value holds, and the options after it
    /// still show.
    #[test]
    fn display_url_never_shows_a_secret_option(password in raw_passwords(), key in "password|token|sslpassword|PassWord") {
        for written in [password.clone(), percent_encode(&password)] {
            assert_hidden(&display_url(&format!("postgres://u:{written}@db1/x?{key}={written}")), &password);
            // Not a character of the value shows, and the options after it still do.
            for (url, shown) in [
                (
                    format!("postgres://db1/x?sslmode=require&{key}={written}&application_name=a"),
                    format!("postgres://db1/x?sslmode=require&{key}=***&application_name=a"),
                ),
                (format!("http://store:7070/?{key}={written}#{key}={written}"), format!("http://store:7070/?{key}=***")),
                (format!("http://store:7070/#{key}={written}"), format!("http://store:7070/#{key}=***")),
            ] {
                // A raw `@` after a `:` reads as a userinfo's end: more is hidden, never less.
                if written.contains('@') {
                    assert_hidden(&display_url(&url), &password);
                } else {
                    prop_assert_eq!(display_url(&url), shown);
                }
            }
        }
    }

    /// Raw or percent-encoded, with any query after it, the password is replaced.
    #[test]
    fn display_url_never_shows_a_password(password in raw_passwords(), query in "(\\?sslmode=disable(&password_file=/p)?)?") {
        for userinfo in [format!("u:{password}"), format!("u:{}", percent_encode(&password))] {
            let url = format!("postgres://{userinfo}@db1:5432,db2/autocomp{query}");
            let shown = display_url(&url);
            assert_hidden(&shown, &password);
            prop_assert!(shown.starts_with("postgres://u:***@db1:5432,db2/autocomp"), "{}", shown);
            let conninfo = format!("host=db1 password='{}' dbname=x", password.replace('\'', "\\'"));
            assert_hidden(&display_url(&conninfo), &password);
            assert_hidden(&display_url(&format!("postgres://db1/x?sslpassword={password}&password={password}")), &password);
        }
    }

    /// The error of a server that cannot be reached (nothing listens on the port) names
    /// user, host and database, never the password, raw or percent-encoded in the URL.
    #[test]
    fn an_unreachable_server_never_shows_the_password(password in passwords()) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let port = free_port();
        for written in [password.clone(), percent_encode(&password)] {
            let url = format!("postgres://someone:{written}@127.0.0.1:{port}/autocomp?connect_timeout=2&sslmode=disable");
            let error = runtime.block_on(PgStore::open(&url)).err().expect("nothing listens there");
            let text = format!("{error} {error:?}");
            assert_hidden(&text, &password);
            prop_assert!(text.contains(&format!("someone@127.0.0.1:{port}/autocomp")), "{}", text);
        }
    }
}

/// A server asking `secret_user` for a password (scram-sha-256), trusting every other role.
async fn server_with_a_password(password: &str) -> (Postgres, String) {
    let server = Postgres::start();
    let url = server.create_database("secrets");
    server.psql("secrets", &format!("CREATE ROLE secret_user LOGIN PASSWORD '{}'", password.replace('\'', "''")));
    server.psql("postgres", "ALTER DATABASE secrets OWNER TO secret_user");
    let hba = server.data_dir().join("pg_hba.conf");
    let rules = std::fs::read_to_string(&hba).unwrap();
    std::fs::write(&hba, format!("host all secret_user 127.0.0.1/32 scram-sha-256\n{rules}")).unwrap();
    server.psql("postgres", "SELECT pg_reload_conf()");
    // The reload is asynchronous: wait until a connection without the password is refused.
    let trusting = format!("postgres://secret_user@{}/secrets?sslmode=disable", server.host_port());
    let refused =
        wait_until_async(Instant::now() + Duration::from_secs(20), async || PgStore::open(&trusting).await.is_err())
            .await;
    assert!(refused, "the reloaded pg_hba.conf never applied\n{}", server.log_tail());
    (server, url)
}

/// A password with every character a URL gives a meaning to.
const HARD_PASSWORD: &str = "Zq9/p?a@s#s:w%2Fo rd中";

#[tokio::test]
async fn a_refused_password_never_shows_and_the_right_one_works_however_it_is_written() {
    let (server, _) = server_with_a_password(HARD_PASSWORD).await;
    let host = server.host_port();
    let url = |password: &str| format!("postgres://secret_user:{password}@{host}/secrets?sslmode=disable");

    let wrong = format!("{HARD_PASSWORD}-wrong");
    for written in [wrong.clone(), percent_encode(&wrong)] {
        let error = PgStore::open(&url(&written)).await.err().expect("a wrong password is refused");
        assert!(matches!(error, StoreError::Invalid(_)), "credentials are configuration: {error}");
        let text = format!("{error} {error:?}");
        assert!(text.contains("secret_user") && text.contains(&host), "{text}");
        assert_hidden(&text, &wrong);
    }

    // Percent-encoded, the password reaches the server as it is.
    let store = PgStore::open(&url(&percent_encode(HARD_PASSWORD))).await.unwrap();
    assert_eq!(store.count_batches().await.unwrap(), 0);
    assert_hidden(store.target(), HARD_PASSWORD);
}

#[tokio::test]
async fn password_file_keeps_the_password_off_the_url_and_is_read_again_for_new_connections() {
    let (server, _) = server_with_a_password(HARD_PASSWORD).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pgpass");
    std::fs::write(&file, format!("{HARD_PASSWORD}\n")).unwrap();
    let url = format!(
        "postgres://secret_user@{}/secrets?sslmode=disable&pool_size=1&password_file={}",
        server.host_port(),
        file.display()
    );
    let store = PgStore::open(&url).await.unwrap();
    store.create_batch(NewBatch::new("B1".parse().unwrap(), "Delivery".parse().unwrap())).await.unwrap();

    // Rotation: the role's password changes, the file follows, the open connection ends
    // (as a restart or an idle timeout would end it): the next one uses the new password,
    // with no restart of this process.
    let rotated = "Zq9-rotated/@#";
    server.psql("postgres", &format!("ALTER ROLE secret_user PASSWORD '{rotated}'"));
    std::fs::write(&file, rotated).unwrap();
    server.psql("postgres", "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = 'secret_user'");
    assert_eq!(store.count_batches().await.unwrap(), 1);

    // A missing or empty file is a configuration error naming the file, not its content.
    for content in [None, Some("")] {
        let missing = dir.path().join("other");
        if let Some(content) = content {
            std::fs::write(&missing, content).unwrap();
        }
        let url = format!("postgres://secret_user@{}/secrets?password_file={}", server.host_port(), missing.display());
        let error = PgStore::open(&url).await.err().expect("no password");
        assert!(matches!(&error, StoreError::Invalid(e) if e.field == "password_file"), "{error}");
    }
    // The URL's password and a file: which one is meant is unclear, so neither.
    let both = format!("postgres://secret_user:x@{}/secrets?password_file={}", server.host_port(), file.display());
    let error = PgStore::open(&both).await.err().expect("two passwords");
    assert!(error.to_string().contains("password_file"), "{error}");
}

fn autocomp_store(arguments: &[&str]) -> (Option<i32>, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_autocomp-store"))
        .args(arguments)
        .env_remove("AUTOCOMP_STORE_DB")
        .env_remove("AUTOCOMP_STORE_DB_FILE")
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    (output.status.code(), text)
}

#[test]
fn db_file_keeps_the_url_off_the_command_line_and_excludes_db() {
    let server = autocomp_test_servers::postgres::shared();
    let url = server.unique_database();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("db-url");
    std::fs::write(&file, format!("{url}\n")).unwrap();
    let file = file.to_str().unwrap();

    let (code, text) = autocomp_store(&["migrate", "--db-file", file]);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("schema version"), "{text}");

    let (code, text) = autocomp_store(&["migrate", "--db", &url, "--db-file", file]);
    assert_eq!(code, Some(2), "{text}");
    assert!(text.contains("--db-file") && text.contains("--db "), "names both flags: {text}");
    let (code, text) = autocomp_store(&["serve", "--db", &url, "--db-file", file]);
    assert_eq!(code, Some(2), "{text}");
    assert!(text.contains("--db-file"), "{text}");
    let (code, text) = autocomp_store(&["migrate", "--db-file", "/nonexistent/db-url"]);
    assert_eq!(code, Some(2), "{text}");
    assert!(text.contains("--db-file /nonexistent/db-url"), "{text}");
    let (code, text) = autocomp_store(&["migrate"]);
    assert_eq!(code, Some(2), "{text}");
    assert!(text.contains("--db-file"), "{text}");

    // `--help` names the variable, not its value.
    for subcommand in ["serve", "migrate"] {
        let help = Command::new(env!("CARGO_BIN_EXE_autocomp-store"))
            .args([subcommand, "--help"])
            .env("AUTOCOMP_STORE_DB", format!("postgres://u:{MARK}-in-env@h/db"))
            .output()
            .unwrap();
        let help = String::from_utf8_lossy(&help.stdout);
        assert!(help.contains("AUTOCOMP_STORE_DB") && !help.contains(MARK), "{help}");
    }

    // The service too, from the file, and `ps` shows no URL.
    let port = free_port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_autocomp-store"))
        .args(["serve", "--db-file", file, "--listen", &format!("127.0.0.1:{port}")])
        .env_remove("AUTOCOMP_STORE_DB")
        .env("AUTOCOMP_TOKEN", "db-file-token")
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for(Instant::now() + Duration::from_secs(20), "the store service", || {
        get(&format!("http://127.0.0.1:{port}/health")).map(|(status, _)| status) == Some(200)
    });
    let command_line = std::fs::read(format!("/proc/{}/cmdline", child.id())).unwrap();
    assert!(!String::from_utf8_lossy(&command_line).contains("postgres://"), "the URL is not on the command line");
    child.kill().ok();
    child.wait().ok();
}

/// At `-vv` with `RUST_LOG=trace`, with PostgreSQL behind it, the store service logs what
/// it does (trace lines) but never the values it stores: tokio-postgres would print every
/// statement's parameters at debug.
#[tokio::test]
async fn no_log_level_prints_the_data_the_store_holds() {
    let url = autocomp_test_servers::postgres::shared().unique_database();
    let marker = "LOGMARKER-7f3a";
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("stderr.log");
    let port = free_port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_autocomp-store"))
        .args(["serve", "-vv", "--db", &url, "--listen", &format!("127.0.0.1:{port}")])
        .env("RUST_LOG", "trace")
        .env("AUTOCOMP_TOKEN", "log-token-0123456789")
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let service = format!("http://127.0.0.1:{port}");
    wait_for(Instant::now() + Duration::from_secs(20), "the store service", || {
        get(&format!("{service}/health")).map(|(status, _)| status) == Some(200)
    });
    let store = HttpStore::with_token(&service, Some("log-token-0123456789".into())).unwrap();
    let batch: BatchId = "B-log".parse().unwrap();
    let new = NewBatch::new(batch.clone(), "Delivery".parse().unwrap()).with_location(format!("/in/{marker}"));
    store.create_batch(new).await.unwrap();
    let component: ComponentName = "reporter".parse().unwrap();
    let holder =
        RunHolder { agent: "t/1@h#1".parse().unwrap(), host: "h".into(), pid: 1, claim_key: None, liveness: None };
    let claim = store.claim(&batch, &component, &holder).await.unwrap();
    store.save_checkpoint(&batch, &component, claim.generation(), json!({ "at": marker })).await.unwrap();
    let report = json!({ "summary": marker, "failures": [{"message": marker}] });
    let event = NewEvent::new("Data_Reported".parse().unwrap(), Outcome::Failure, holder.agent.clone())
        .with_details(report)
        .in_run(component.clone(), claim.generation());
    store.append_event(&batch, event).await.unwrap();
    assert!(store.get_batch(&batch).await.unwrap().location().unwrap().contains(marker));
    child.kill().ok();
    child.wait().ok();

    let mut stderr = String::new();
    std::fs::File::open(&log).unwrap().read_to_string(&mut stderr).unwrap();
    assert!(stderr.contains("DEBUG"), "debug logging was on: {stderr}");
    assert!(!stderr.contains("tokio_postgres"), "no statement logs: {stderr}");
    assert!(!stderr.contains(marker), "the stored data shows in the log:\n{stderr}");
}

/// The service waiting for an unreachable PostgreSQL whose password holds `/ ? @ #`: its
/// open `/health`, the 503 of an operation and the warning of each retry name the database
/// without the password.
#[test]
fn a_waiting_service_never_shows_the_password_on_health_in_503s_or_retry_warnings() {
    let password = "Zq9/pa?ss@w#rd";
    let closed = free_port();
    let db = format!("postgres://someone:{password}@127.0.0.1:{closed}/autocomp?connect_timeout=1");
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("stderr.log");
    let port = free_port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_autocomp-store"))
        .args(["serve", "--db", &db, "--listen", &format!("127.0.0.1:{port}")])
        .env("AUTOCOMP_TOKEN", "waiting-token")
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let service = format!("http://127.0.0.1:{port}");
    let mut health = String::new();
    wait_for(Instant::now() + Duration::from_secs(20), "/health answering 503 while waiting", || {
        match get(&format!("{service}/health")) {
            Some((503, body)) => {
                health = String::from_utf8_lossy(&body).into_owned();
                true
            }
            _ => false,
        }
    });
    let (status, answer) = autocomp_test_servers::http1::post(&format!("{service}/v1/head"), None, b"{}");
    let stderr = || std::fs::read_to_string(&log).unwrap();
    wait_for(Instant::now() + Duration::from_secs(20), "a second connection attempt logged", || {
        stderr().matches("someone@127.0.0.1").count() >= 2
    });
    child.kill().ok();
    child.wait().ok();
    assert_eq!(status, 503, "{answer}");
    for (what, text) in [("/health", health), ("the 503", answer.to_string()), ("stderr", stderr())] {
        assert!(text.contains(&format!("127.0.0.1:{closed}")), "{what} names the database: {text}");
        assert_hidden(&text, password);
    }
}

/// The server refusing wrong passwords of every shape: the error names user and host,
/// never the password, raw or percent-encoded in the URL.
#[test]
fn a_refused_password_of_any_shape_never_shows() {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let (server, _) = runtime.block_on(server_with_a_password(HARD_PASSWORD));
    let host = server.host_port();
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig { cases: 24, ..ProptestConfig::default() });
    runner
        .run(&(passwords(), any::<bool>()), |(password, encoded)| {
            let written = if encoded { percent_encode(&password) } else { password.clone() };
            let url = format!("postgres://secret_user:{written}@{host}/secrets?sslmode=disable");
            let error = runtime.block_on(PgStore::open(&url)).err().expect("a wrong password is refused");
            let text = format!("{error} {error:?}");
            prop_assert!(matches!(error, StoreError::Invalid(_)), "{}", text);
            prop_assert!(text.contains("secret_user") && text.contains(&host), "{}", text);
            assert_hidden(&text, &password);
            Ok(())
        })
        .unwrap();
}
