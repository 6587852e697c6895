//! PgOptions::parse on URLs as written: what each option sets, what it refuses, and how
//! errors name the server (one line, no password).

use super::*;

/// A line feed in the URL (raw or %0A) cannot make a forged line of every message that
/// names the server.
#[test]
fn the_described_target_is_one_line() {
    for url in ["postgres://u@h/db\nok    store   forged", "postgres://u@h/db%0Aok"] {
        let options = PgOptions::parse(url).unwrap();
        assert!(!options.target.contains('\n'), "{:?}", options.target);
        assert!(options.target.contains("\\u000a"), "{:?}", options.target);
    }
}

#[test]
fn several_hosts_and_own_options() {
    let options = PgOptions::parse(
        "postgres://autocomp@db1,db2:5433/autocomp?target_session_attrs=read-write&pool_size=4&retry_for=10s&sslmode=disable",
    )
    .unwrap();
    assert_eq!(options.target, "autocomp@db1:5432,db2:5433/autocomp");
    assert_eq!(options.pool_size, 4);
    assert_eq!(options.retry_for, Duration::from_secs(10));
    assert_eq!(options.tls, TlsMode::Disable);
    assert!(options.listen, "listening is the default");
    assert!(!PgOptions::parse("postgres://u@h/db?listen=off").unwrap().listen);
}

#[test]
fn a_password_may_hold_any_character_raw_or_percent_encoded() {
    for url in [
        "postgres://u:p/a?s@s#w:d%@h1:5433,h2/db?sslmode=disable",
        "postgres://u:p%2Fa%3Fs%40s%23w%3Ad%25@h1:5433,h2/db?sslmode=disable",
    ] {
        let options = PgOptions::parse(url).unwrap();
        assert_eq!(options.config.get_password(), Some(&b"p/a?s@s#w:d%"[..]), "{url}");
        assert_eq!(options.target, "u@h1:5433,h2:5432/db");
        assert_eq!(options.config.get_dbname(), Some("db"));
    }
}

#[test]
fn an_at_in_a_query_value_stays_there_when_the_url_has_no_password() {
    let options = PgOptions::parse("postgres://u@h:5433/db?application_name=me@host").unwrap();
    assert_eq!(options.target, "u@h:5433/db");
    assert_eq!(options.config.get_application_name(), Some("me@host"));
}

#[test]
fn each_sslmode_is_its_own_and_sslrootcert_needs_a_verifying_one() {
    for (mode, expected) in [
        ("disable", TlsMode::Disable),
        ("prefer", TlsMode::Prefer),
        ("require", TlsMode::Require),
        ("verify-ca", TlsMode::VerifyCa),
        ("verify-full", TlsMode::VerifyFull),
    ] {
        let options = PgOptions::parse(&format!("postgres://u@h/db?sslmode={mode}")).unwrap();
        assert_eq!(options.tls, expected);
        assert_eq!(options.tls.as_str(), mode);
    }
    assert_eq!(PgOptions::parse("postgres://u@h/db").unwrap().tls, TlsMode::Prefer, "libpq's default");
    let error = PgOptions::parse("postgres://u@h/db?sslrootcert=/ca.pem").err().unwrap().to_string();
    assert!(error.contains("verify-ca or verify-full"), "{error}");
}

#[test]
fn a_password_comes_from_one_place() {
    let error = PgOptions::parse("postgres://u:hunter2@h/db?password_file=/run/pw").err().unwrap().to_string();
    assert!(error.contains("password_file") && !error.contains("hunter2"), "{error}");
    let error = PgOptions::parse("postgres://u@h/db?password=hunter2").err().unwrap().to_string();
    assert!(error.contains("password_file") && !error.contains("hunter2"), "{error}");
}

#[test]
fn errors_name_the_option_and_never_the_password() {
    for (url, expected) in [
        ("postgres://u:hunter2@h/db?pool_size=0", "pool_size"),
        // libpq's "no limit": here every attempt is bounded, and 0 would fail every one.
        ("postgres://u:hunter2@h/db?connect_timeout=0", "connect_timeout=\"0\": must be more than 0"),
        ("postgres://u:hunter2@h/db?connect_timeout=0s", "connect_timeout"),
        ("postgres://u:hunter2@h/db?sslmode=sometimes", "sslmode"),
        ("postgres://u:hunter2@h/db?colour=blue", "colour"),
        ("postgres://u:hunter2@h/db?migrate=maybe", "migrate"),
        ("postgres://u:hunter2@h/db?listen=sometimes", "listen"),
        ("postgres://u:hunter2@h", "database"),
        ("postgres://u:hun/ter2@h/db?pool_size=0", "pool_size"),
        ("postgres://u:hun@ter2@h/db?colour=blue", "colour"),
        ("postgresql://u:hunter2@/db", "host"),
    ] {
        let error = PgOptions::parse(url).err().unwrap().to_string();
        assert!(error.contains(expected), "{url}: {error}");
        assert!(!error.contains("hunter2") && !error.contains("ter2"), "{url}: {error}");
    }
}

/// A connection the network cut off fails within seconds rather than the kernel's ~15
/// minutes, unless the URL sets libpq's own limits, which are kept.
#[test]
fn silent_connections_are_bounded_unless_the_url_says_otherwise() {
    let options = PgOptions::parse("postgres://u@h/db").unwrap();
    assert_eq!(options.config.get_tcp_user_timeout(), Some(&Duration::from_secs(30)), "as long as retry_for");
    let short = PgOptions::parse("postgres://u@h/db?retry_for=2s").unwrap();
    assert_eq!(short.config.get_tcp_user_timeout(), Some(&SILENT_CONNECTION_LIMIT), "never shorter than 10 s");
    assert!(options.config.get_keepalives());
    assert_eq!(options.config.get_keepalives_idle(), KEEPALIVES_IDLE);
    assert_eq!(options.config.get_keepalives_interval(), Some(KEEPALIVES_INTERVAL));
    assert_eq!(options.config.get_keepalives_retries(), Some(KEEPALIVES_RETRIES));

    let own = PgOptions::parse(
        "postgres://u@h/db?tcp_user_timeout=60&keepalives_idle=120&keepalives_interval=30&keepalives_retries=9",
    )
    .unwrap();
    assert_eq!(own.config.get_tcp_user_timeout(), Some(&Duration::from_secs(60)));
    assert_eq!(own.config.get_keepalives_idle(), Duration::from_secs(120));
    assert_eq!(own.config.get_keepalives_interval(), Some(Duration::from_secs(30)));
    assert_eq!(own.config.get_keepalives_retries(), Some(9));
}
