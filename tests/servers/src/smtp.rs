//! A local SMTP sink: aiosmtpd (PyPI's `aiosmtpd`, run by `python3`) on a free loopback port,
//! with a small handler that writes each message it accepts as one JSON file (envelope, the
//! decoded subject, headers and plain-text body, and the raw message) in a temp dir. Tests
//! read back exactly what a mail client would have received. [`SmtpSink::refuse`] makes it
//! answer `451` to every message until [`SmtpSink::accept`], for retry tests;
//! [`SmtpSink::start_with`] serves STARTTLS or SMTPS with a given certificate.
//!
//! Without aiosmtpd the calling test fails, naming the install command; never a skip.

use std::io::{BufRead, BufReader};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde::Deserialize;

/// The aiosmtpd release `scripts/test` installs.
pub const AIOSMTPD: &str = "aiosmtpd==1.4.6";

/// The handler aiosmtpd loads (`-c autocomp_smtp_sink.Sink <dir>`).
const HANDLER: &str = r#"
import email, email.policy, json, os

class Sink:
    def __init__(self, directory):
        self.directory = directory
        self.count = 0

    @classmethod
    def from_cli(cls, parser, *args):
        if len(args) != 1:
            parser.error("Sink takes one argument: the directory to write messages to")
        return cls(args[0])

    async def handle_DATA(self, server, session, envelope):
        if os.path.exists(os.path.join(self.directory, "refuse")):
            return "451 4.3.0 refused for the test, try again later"
        raw = envelope.original_content or envelope.content
        message = email.message_from_bytes(raw, policy=email.policy.default)
        body = message.get_body(preferencelist=("plain",))
        record = {
            "mail_from": envelope.mail_from,
            "rcpt_tos": list(envelope.rcpt_tos),
            "subject": str(message["subject"] or ""),
            "headers": [[name, str(value)] for name, value in message.items()],
            "body": body.get_content().replace("\r\n", "\n") if body is not None else "",
            "raw": raw.decode("utf-8", "replace"),
        }
        self.count += 1
        name = "%06d" % self.count
        temporary = os.path.join(self.directory, name + ".tmp")
        with open(temporary, "w") as out:
            json.dump(record, out)
        os.rename(temporary, os.path.join(self.directory, name + ".json"))
        return "250 2.0.0 OK"
"#;

/// Whether (and how) the sink speaks TLS.
#[derive(Debug, Clone)]
pub enum SinkTls {
    None,
    /// STARTTLS, required before a message is accepted.
    StartTls {
        cert: PathBuf,
        key: PathBuf,
    },
    /// SMTPS: TLS from the first byte.
    Implicit {
        cert: PathBuf,
        key: PathBuf,
    },
}

impl SinkTls {
    fn args(&self) -> Vec<std::ffi::OsString> {
        let pair = |flag: &str, cert: &Path, key: &Path| {
            let key_flag = flag.replace("cert", "key");
            vec![flag.into(), cert.as_os_str().to_owned(), key_flag.into(), key.as_os_str().to_owned()]
        };
        match self {
            SinkTls::None => Vec::new(),
            SinkTls::StartTls { cert, key } => pair("--tlscert", cert, key),
            SinkTls::Implicit { cert, key } => pair("--smtpscert", cert, key),
        }
    }
}

/// One message the sink accepted.
#[derive(Debug, Clone, Deserialize)]
pub struct Received {
    /// The envelope's sender and recipients.
    pub mail_from: String,
    pub rcpt_tos: Vec<String>,
    /// The `Subject` header, decoded.
    pub subject: String,
    /// Every header, in order, decoded.
    pub headers: Vec<(String, String)>,
    /// The plain-text body, decoded (quoted-printable or base64 undone), lines ending in `\n`.
    pub body: String,
    /// The message as it came over the wire.
    pub raw: String,
}

impl Received {
    /// The named header's values (any case), in order.
    pub fn header(&self, name: &str) -> Vec<&str> {
        self.headers.iter().filter(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str()).collect()
    }
}

/// A running SMTP sink; stopped when dropped.
pub struct SmtpSink {
    child: Child,
    port: u16,
    messages: PathBuf,
    _dir: tempfile::TempDir,
}

impl SmtpSink {
    /// Starts aiosmtpd on a free loopback port and waits (at most 30 s) until it greets.
    /// Panics, naming the install command, when `python3` or aiosmtpd is missing.
    pub fn start() -> SmtpSink {
        Self::start_with(SinkTls::None)
    }

    /// [`SmtpSink::start`] with TLS: STARTTLS (required before MAIL) or SMTPS, with the
    /// certificate and key (PEM files) given.
    pub fn start_with(tls: SinkTls) -> SmtpSink {
        let check = Command::new("python3").args(["-c", "import aiosmtpd"]).stdout(Stdio::null()).output();
        match check {
            Ok(out) if out.status.success() => {}
            Ok(out) => panic!(
                "the SMTP sink needs aiosmtpd: install it with `python3 -m pip install {AIOSMTPD}` (pip install \
                 aiosmtpd; scripts/test installs it). python3 cannot import it: {}",
                String::from_utf8_lossy(&out.stderr).trim().lines().last().unwrap_or_default()
            ),
            Err(e) => panic!(
                "the SMTP sink needs python3 with aiosmtpd ({e}); install python3, then `python3 -m pip install \
                 {AIOSMTPD}` (pip install aiosmtpd)"
            ),
        }
        let dir = tempfile::tempdir().expect("a temp dir for the SMTP sink");
        std::fs::write(dir.path().join("autocomp_smtp_sink.py"), HANDLER).expect("the sink's handler");
        let messages = dir.path().join("messages");
        std::fs::create_dir(&messages).expect("the sink's message dir");
        let port = free_port();
        let mut child = Command::new("python3")
            .args(["-m", "aiosmtpd", "-n", "-l", &format!("127.0.0.1:{port}")])
            .args(tls.args())
            .args(["-c", "autocomp_smtp_sink.Sink"])
            .arg(&messages)
            .env("PYTHONPATH", dir.path())
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            // A file, not a pipe: a pipe nobody reads would stall the server once full.
            .stderr(std::fs::File::create(dir.path().join("stderr.log")).expect("the sink's log"))
            .spawn()
            .expect("python3 -m aiosmtpd starts");
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut exited = None;
        let up = crate::wait_until(deadline, || {
            exited = child.try_wait().expect("try_wait on the SMTP sink");
            // An SMTPS server greets inside TLS: that it listens is enough.
            exited.is_some() || if matches!(tls, SinkTls::Implicit { .. }) { listens(port) } else { greets(port) }
        });
        if let Some(status) = exited {
            let stderr = std::fs::read_to_string(dir.path().join("stderr.log")).unwrap_or_default();
            panic!("the SMTP sink (aiosmtpd) exited {status} before it listened:\n{stderr}");
        }
        if !up {
            child.kill().ok();
            child.wait().ok();
            panic!("the SMTP sink (aiosmtpd) did not greet on 127.0.0.1:{port} within 30 s");
        }
        SmtpSink { child, port, messages, _dir: dir }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `smtp://127.0.0.1:<port>`: what a client's `server` setting names.
    pub fn url(&self) -> String {
        format!("smtp://127.0.0.1:{}", self.port)
    }

    /// Every message accepted so far, in the order accepted.
    pub fn messages(&self) -> Vec<Received> {
        read_messages(&self.messages)
    }

    /// Waits (at most until `deadline`) until at least `count` messages have come; returns
    /// them all, or panics saying how many came.
    pub fn wait_for(&self, count: usize, deadline: Instant) -> Vec<Received> {
        let mut received = Vec::new();
        let came = crate::wait_until(deadline, || {
            received = self.messages();
            received.len() >= count
        });
        assert!(came, "the SMTP sink received {} messages, expected {count}: {received:#?}", received.len());
        received
    }

    /// From now on every message is answered `451` (a temporary failure) and not kept.
    pub fn refuse(&self) {
        std::fs::write(self.messages.join("refuse"), "").expect("the sink's refuse flag");
    }

    /// Accepts messages again.
    pub fn accept(&self) {
        std::fs::remove_file(self.messages.join("refuse")).ok();
    }
}

impl Drop for SmtpSink {
    fn drop(&mut self) {
        self.child.kill().ok();
        self.child.wait().ok();
    }
}

fn read_messages(dir: &Path) -> Vec<Received> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|entries| {
            entries.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "json")).collect()
        })
        .unwrap_or_default();
    files.sort();
    files
        .iter()
        .map(|file| {
            let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: not a message record: {e}", file.display()))
        })
        .collect()
}

/// Whether an SMTP server on the port answers with its `220` greeting.
fn greets(port: u16) -> bool {
    let Ok(stream) = TcpStream::connect_timeout(&(Ipv4Addr::LOCALHOST, port).into(), Duration::from_secs(1)) else {
        return false;
    };
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok();
    let mut line = String::new();
    BufReader::new(stream).read_line(&mut line).is_ok() && line.starts_with("220")
}

fn listens(port: u16) -> bool {
    TcpStream::connect_timeout(&(Ipv4Addr::LOCALHOST, port).into(), Duration::from_secs(1)).is_ok()
}

fn free_port() -> u16 {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind a free loopback port");
    listener.local_addr().expect("the bound port").port()
}
