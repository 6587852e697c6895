//! The notifier's config file parsed as written: every key and its default, the servers and
//! their security, the keys and values refused, and no error showing a secret.

use super::*;

fn parse(text: &str) -> Result<NotifyConfig, String> {
    NotifyConfig::parse(text, Path::new("/etc/autocomp/notify.toml"), Path::new("/etc/autocomp"))
        .map_err(|e| e.to_string())
}

const MAIL: &str = "[notify.mail]\nserver = \"smtp://127.0.0.1:2525\"\nfrom = \"autocomp@example.org\"\n\
                    to = [\"ops@example.org\", \"Ann <ann@example.org>\"]\n";

#[test]
fn defaults_and_every_key() {
    let config = parse(MAIL).unwrap();
    assert_eq!(config.events, EventKind::defaults());
    assert!(!config.wants(EventKind::Success));
    assert_eq!(config.digest_at, DigestAt { hour: 7, minute: 0 });
    assert_eq!(config.channels(), ["mail"]);
    let mail = config.mail.unwrap();
    assert_eq!((mail.server.host.as_str(), mail.server.port), ("127.0.0.1", 2525));
    assert_eq!(mail.to.len(), 2);

    let text = format!(
        "[notify]\nevents = [\"failure\", \"success\"]\npaused_too_long = \"2h\"\noverdue_after = 600\n\
         digest_at = \"18:30\"\nretry_after = \"10s\"\nretry_max = \"5m\"\n\n{MAIL}username = \"bot\"\n\
         password_file = \"smtp-password\"\ntimeout = \"5s\"\n\n[notify.webhook]\n\
         url = \"https://hooks.example.org/x\"\nsecret_file = \"/run/secret\"\n"
    );
    let config = parse(&text).unwrap();
    assert_eq!(config.events, [EventKind::Failure, EventKind::Success].into());
    assert_eq!(config.paused_too_long, Duration::from_secs(7200));
    assert_eq!(config.overdue_after, Duration::from_secs(600));
    assert_eq!(config.digest_at.to_string(), "18:30");
    assert_eq!(config.channels(), ["mail", "webhook"]);
    assert_eq!(config.mail.as_ref().unwrap().password_file.as_deref(), Some(Path::new("/etc/autocomp/smtp-password")));
    assert_eq!(config.webhook.as_ref().unwrap().secret_file, Path::new("/run/secret"));
    let waits: Vec<u64> = (1..=7).map(|n| config.retry_in(n).as_secs()).collect();
    assert_eq!(waits, [10, 20, 40, 80, 160, 300, 300]);
}

#[test]
fn unknown_keys_and_bad_values_name_the_key_and_value() {
    let cases = [
        ("[notify]\nevnts = []\n", "unknown key `notify.evnts`"),
        ("[notfy]\n", "unknown key `notfy`"),
        ("[notify]\nevents = [\"failure\", \"fire\"]\n", "`notify.events` = \"fire\": not a kind of news"),
        ("[notify]\ndigest_at = \"7am\"\n", "`notify.digest_at` = \"7am\": expected a time of day"),
        ("[notify]\npaused_too_long = \"soon\"\n", "`notify.paused_too_long` = \"soon\""),
        ("[notify]\npaused_too_long = \"0s\"\n", "must be more than zero"),
        ("[notify]\n", "no channel"),
        ("[notify]\nretry_max = \"30d\"\n", "`notify.retry_max` = \"30days\": must be at most 7days"),
    ];
    for (text, expected) in cases {
        let with_mail = if expected == "no channel" { text.to_owned() } else { format!("{text}{MAIL}") };
        let message = parse(&with_mail).unwrap_err();
        assert!(message.contains(expected), "{text:?}: {message}");
        assert!(message.starts_with("/etc/autocomp/notify.toml: "), "{message}");
    }
    let message = parse(&MAIL.replace("to = ", "bcc = ")).unwrap_err();
    assert!(message.contains("unknown key `notify.mail.bcc`"), "{message}");
    let message = parse(&MAIL.replace("ops@example.org", "not an address")).unwrap_err();
    assert!(message.contains("`notify.mail.to` = \"not an address\": not a mail address"), "{message}");
    let message = parse(&MAIL.replace("smtp://127.0.0.1:2525", "imap://x")).unwrap_err();
    assert!(message.contains("`notify.mail.server` = \"imap://x\": the scheme must be smtp"), "{message}");
    let message = parse(&MAIL.replace("smtp://127.0.0.1:2525", "smtp://x:587?tls=maybe")).unwrap_err();
    assert!(message.contains("tls= must be starttls"), "{message}");
    let message = parse(&format!("{MAIL}timeout = \"1h\"\n")).unwrap_err();
    assert!(message.contains("`notify.mail.timeout` = \"1h\": must be at most 5m"), "{message}");
    let hook = "[notify.webhook]\nurl = \"https://h/x\"\n";
    let message = parse(hook).unwrap_err();
    assert!(message.contains("`notify.webhook.secret_file` is missing"), "{message}");
}

#[test]
fn no_error_shows_a_secret() {
    let leaks = [
        format!("{MAIL}password = \"hunter2-secret\"\n"),
        MAIL.replace("smtp://127.0.0.1:2525", "smtp://bot:hunter2-secret@mail.example.org:587"),
        concat!(
            "[notify.webhook]\nurl = \"https://bot:hunter2-secret@h/x?token=hunter2-secret\"\n",
            "secret = \"hunter2-secret\"\n"
        )
        .to_owned(),
        format!("{MAIL}password = \"hunter2-secret\n"),
        format!("{MAIL}username = \"bot\"\npassword_file = \"p\"\n")
            .replace("smtp://127.0.0.1:2525", "smtp://mail.example.org:25?password=hunter2-secret"),
    ];
    for text in leaks {
        let message = parse(&text).unwrap_err();
        assert!(!message.contains("hunter2"), "{message}");
    }
    let message = parse(&format!("{MAIL}password = \"x\"\n")).unwrap_err();
    assert!(message.contains("never goes in this file"), "{message}");
}

#[test]
fn servers_and_their_security() {
    let server = |url: &str| smtp_server(&Value::String(url.into()), "notify.mail.server");
    let plain = server("smtp://mail.example.org").unwrap();
    assert_eq!((plain.port, plain.security), (25, SmtpSecurity::Plain));
    let tls = server("smtps://mail.example.org").unwrap();
    assert_eq!((tls.port, tls.security), (465, SmtpSecurity::Tls));
    let starttls = server("smtp://mail.example.org:587?tls=starttls").unwrap();
    assert_eq!((starttls.port, starttls.security), (587, SmtpSecurity::StartTls));
    let v6 = server("smtp://[::1]:2525").unwrap();
    assert_eq!((v6.host.as_str(), v6.port), ("::1", 2525));
    assert!(v6.is_loopback());
    assert!(server("smtps://h?tls=starttls").is_err());
    // AUTH in clear only to a loopback relay.
    let auth = |url: &str| {
        parse(&format!("{MAIL}username = \"bot\"\npassword_file = \"p\"\n").replace("smtp://127.0.0.1:2525", url))
    };
    assert!(auth("smtp://127.0.0.1:25").is_ok());
    assert!(auth("smtp://mail.example.org:587?tls=starttls").is_ok());
    let message = auth("smtp://mail.example.org:25").unwrap_err();
    assert!(message.contains("in clear"), "{message}");
}
