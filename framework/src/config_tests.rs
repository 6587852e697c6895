//! Config files read as a component reads them: durations, sizes and unknown keys refused
//! by name, triggers, backends that never print a password, files others can change.
//! Apart so the loader reads without its tests.

use autocomp_model::EventType;

use super::*;

#[test]
fn durations_that_mean_nothing_at_zero_are_refused_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    for key in ["max_runtime", "overdue_after", "silent_after"] {
        std::fs::write(dir.path().join("probe.toml"), format!("{key} = \"0s\"\n")).unwrap();
        let error = load("probe", None, dir.path()).unwrap_err().to_string();
        assert!(error.contains(&format!("{key} = \"0s\": must be more than 0")), "{error}");
    }
    std::fs::write(dir.path().join("probe.toml"), "batch_lock_timeout = \"0s\"\nretry_backoff = \"0s\"\n").unwrap();
    assert!(load("probe", None, dir.path()).is_ok(), "a zero wait means do not wait");
}

#[test]
fn durations_and_unknown_keys() {
    let config: ComponentConfig = toml::from_str("max_runtime = \"90s\"\nretry_backoff = 120").unwrap();
    assert_eq!(config.max_runtime, Duration::from_secs(90));
    assert_eq!(config.retry_backoff, Duration::from_secs(120));
    let err = toml::from_str::<ComponentConfig>("max_threadz = 3").unwrap_err().to_string();
    assert!(err.contains("max_threadz"), "{err}");
    let err = toml::from_str::<ComponentConfig>("max_runtime = \"soon\"").unwrap_err().to_string();
    assert!(err.contains("soon"), "{err}");
}

#[test]
fn max_output_reads_sizes_and_refuses_too_much_naming_key_and_value() {
    assert_eq!(ComponentConfig::default().max_output, DEFAULT_OUTPUT_BYTES);
    for (text, bytes) in [("\"64KiB\"", 65536), ("\"1 MiB\"", 1 << 20), ("1000", 1000), ("\"100B\"", 100), ("0", 0)] {
        let config: ComponentConfig = toml::from_str(&format!("max_output = {text}")).unwrap();
        assert_eq!(config.max_output, bytes, "{text}");
    }
    for bad in ["\"lots\"", "\"64KB\"", "-1", "\"1.5MiB\""] {
        let err = toml::from_str::<ComponentConfig>(&format!("max_output = {bad}")).unwrap_err().to_string();
        assert!(err.contains("max_output"), "{bad}: {err}");
    }
    let err = toml::from_str::<ComponentConfig>("max_output = \"lots\"").unwrap_err().to_string();
    assert!(err.contains("invalid size \"lots\""), "{err}");
    let config: ComponentConfig = toml::from_str("max_output = \"1MiB\"").unwrap();
    let err = config.check(Path::new("x.toml")).unwrap_err().to_string();
    assert!(err.contains("x.toml") && err.contains("max_output = 1048576 bytes") && err.contains("at most"), "{err}");
    let config: ComponentConfig = toml::from_str("max_output = \"512KiB\"").unwrap();
    config.check(Path::new("x.toml")).unwrap();
}

#[test]
fn a_watch_heartbeat_under_a_second_is_refused_naming_key_and_value() {
    let config: ComponentConfig = toml::from_str("watch_heartbeat = \"200ms\"").unwrap();
    let err = config.check(Path::new("x.toml")).unwrap_err().to_string();
    assert!(err.contains("x.toml") && err.contains("watch_heartbeat") && err.contains("200ms"), "{err}");
    let config: ComponentConfig = toml::from_str("watch_heartbeat = \"5s\"").unwrap();
    config.check(Path::new("x.toml")).unwrap();
    assert_eq!(config.watch_heartbeat, Duration::from_secs(5));
}

#[test]
fn a_component_without_settings_accepts_an_empty_table_and_refuses_keys() {
    settings::<()>(&toml::Table::new(), Path::new("x.toml")).unwrap();
    let table: toml::Table = toml::from_str("a = 1").unwrap();
    let err = settings::<()>(&table, Path::new("x.toml")).unwrap_err().to_string();
    assert!(err.contains("x.toml") && err.contains("[settings]"), "{err}");
}

#[test]
fn trigger_clauses_replace_the_defaults() {
    let default = Trigger {
        requires: vec![EventType::new("A").unwrap()],
        blocked_by: vec![EventType::new("B").unwrap()],
        ..Trigger::default()
    };
    let config: ComponentConfig = toml::from_str("[trigger]\nrequires = [\"C\"]\nsettled_for = \"2m\"").unwrap();
    let trigger = config.trigger(&default, Path::new("x.toml")).unwrap();
    assert_eq!(trigger.requires, vec![EventType::new("C").unwrap()]);
    assert_eq!(trigger.blocked_by, default.blocked_by);
    assert_eq!(trigger.settled_for, Some(Duration::from_secs(120)));
    let bad: ComponentConfig = toml::from_str("[trigger]\nrequirez = [\"C\"]").unwrap();
    let err = bad.trigger(&default, Path::new("x.toml")).unwrap_err().to_string();
    assert!(err.contains("requirez") && err.contains("x.toml"), "{err}");
}

#[test]
fn backends_never_print_a_password() {
    let backends = Backends {
        store: Some("postgres://autocomp:s3/cr@t@db/autocomp".into()),
        index: Some("local:/var/lib/index".into()),
        locks: None,
    };
    let shown = format!("{backends:?}");
    assert!(!shown.contains("s3/cr") && shown.contains("postgres://autocomp:***@db/autocomp"), "{shown}");

    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(SHARED_FILE), "store = \"postgres://u:s3/cr@t@db/x\" oops\n").unwrap();
    let error = load("c", None, dir.path()).unwrap_err().to_string();
    assert!(error.contains("line 1, column") && !error.contains("s3/cr"), "{error}");
}

#[test]
fn a_toml_error_quotes_its_line_only_when_the_line_holds_no_secret() {
    let file = Path::new("/etc/autocomp/autocomp.toml");
    for (text, secret) in [
        ("store = \"postgres://u:p w\\\"@h/db\" oops\n", "p w"),
        ("store = \"postgres://u:p'x y@h/db\" oops\n", "p'x"),
        ("index = \"local:/i\"\nstore = \"postgres://h/db?sslmode=require&password=a b\" c\n", "a b"),
        ("store = \"http://h:7070/?token=T0k en\" x\n", "T0k"),
        ("[settings]\napi_key = 'K3y oops\n", "K3y"),
        ("password = \"Pw d\" extra\n", "Pw d"),
        // A URL split over the lines of a multi-line string (a review's find).
        ("store = \"\"\"postgres://u:\nSECRETZ@h/db\u{1}\"\"\"\n", "SECRETZ"),
        ("store = '''postgres://u:\nSECRETZ@h/db\u{7f}'''\n", "SECRETZ"),
    ] {
        let error = toml::from_str::<toml::Table>(text).unwrap_err();
        let shown = toml_error(file, text, &error).to_string();
        assert!(!shown.contains(secret), "{text:?} shows the secret: {shown}");
        assert!(shown.starts_with("/etc/autocomp/autocomp.toml: not valid TOML at line "), "{shown}");
        assert!(shown.contains("is not shown: it may hold a secret"), "{shown}");
    }
    let text = "index = \"local:/i\"\nstore = \"sqlite:///s.db\" oops\n";
    let error = toml::from_str::<toml::Table>(text).unwrap_err();
    let shown = toml_error(file, text, &error).to_string();
    assert!(shown.contains("line 2, column 26") && shown.contains("store = \"sqlite:///s.db\" oops"), "{shown}");
    let text = "password_file = \"/run/pw\" x\n";
    let error = toml::from_str::<toml::Table>(text).unwrap_err();
    assert!(toml_error(file, text, &error).to_string().contains("/run/pw"), "a file name is no secret");
}

#[test]
fn a_config_file_others_can_change_is_refused_naming_mode_and_fix() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let shared = dir.path().join(SHARED_FILE);
    std::fs::write(&shared, "store = \"sqlite:///s.db\"\n").unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o666)).unwrap();
    let error = load("c", None, dir.path()).unwrap_err().to_string();
    assert!(error.contains("autocomp.toml: mode 666") && error.contains("chmod o-w"), "{error}");
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::write(dir.path().join("c.toml"), "").unwrap();
    std::fs::set_permissions(dir.path().join("c.toml"), std::fs::Permissions::from_mode(0o622)).unwrap();
    let error = load("c", None, dir.path()).unwrap_err().to_string();
    assert!(error.contains("c.toml: mode 622"), "{error}");
}

/// A setting may be a secret: its value is never quoted back, its key is.
#[test]
fn a_settings_error_names_the_key_and_never_the_value() {
    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Settings {
        replace: bool,
    }
    let table: toml::Table = toml::from_str("replace = \"https://admin:hunter2@vault.example/x\"").unwrap();
    let error = settings::<Settings>(&table, Path::new("archiver.toml")).unwrap_err();
    assert!(!error.message.contains("hunter2"), "{}", error.message);
    assert!(error.message.contains("invalid type: string \"…\", expected a boolean"), "{}", error.message);
    let table: toml::Table = toml::from_str("replac = true").unwrap();
    let error = settings::<Settings>(&table, Path::new("archiver.toml")).unwrap_err();
    assert!(error.message.contains("unknown field `replac`"), "{}", error.message);
}

/// A misspelt key is valid TOML: the message says the key is unknown and suggests the one meant.
#[test]
fn a_misspelt_key_is_named_unknown_with_the_key_meant() {
    let error = parse_component_file("max_thread = 2\n", Path::new("c.toml")).unwrap_err();
    assert!(
        error.message.starts_with("an unknown key at line 1, column 1: unknown field `max_thread`"),
        "{}",
        error.message
    );
    assert!(error.message.contains("(did you mean `max_threads`?)"), "{}", error.message);
    let far = parse_component_file("colour = 2\n", Path::new("c.toml")).unwrap_err();
    assert!(!far.message.contains("did you mean"), "{}", far.message);
    let syntax = parse_component_file("max_threads = \n", Path::new("c.toml")).unwrap_err();
    assert!(syntax.message.starts_with("not valid TOML at line 1"), "{}", syntax.message);
}
