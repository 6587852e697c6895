//! A server whose certificate fails verification is a configuration error, not an outage:
//! a pass against an impostor (a real server presenting a certificate of another CA than the
//! one this host trusts) exits 2 within a couple of seconds, naming the reason, and retries
//! nothing. For each of the three TLS clients: ZooKeeper over `zks://`, the store service over
//! `https://` and PostgreSQL with `sslmode=verify-full`.

use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use autocomp_e2e::zk::ZooKeeper;
use autocomp_e2e::{Finished, Pipeline, binary, finish, wait_until};
use autocomp_framework::exit;
use autocomp_test_servers::postgres::{Options, Postgres};

const PROBE: &str = env!("CARGO_BIN_EXE_probe-component");
/// Refused at once: well under a session timeout (10 s) or a retry_for (30 s).
const AT_ONCE: Duration = Duration::from_secs(5);

/// One pass of the probe trusting `ca_file` (`$AUTOCOMP_CA_FILE`) when given.
fn pass(pipeline: &Pipeline, ca_file: Option<&Path>) -> Finished {
    let mut command = pipeline.command(&[]);
    command.env_remove(autocomp_framework::locks::AUTH_ENV).env_remove("AUTOCOMP_CA_FILE");
    if let Some(ca) = ca_file {
        command.env("AUTOCOMP_CA_FILE", ca);
    }
    finish(command.spawn().expect("the probe starts"), Duration::from_secs(60))
}

/// Refused as configuration (exit 2) at once, saying why, and no retry logged.
fn assert_refused_at_once(finished: &Finished, reason: &str) {
    assert_eq!(finished.code, Some(i32::from(exit::USAGE)), "{}", finished.show());
    assert!(finished.elapsed < AT_ONCE, "not at once: {}", finished.show());
    assert!(finished.stderr.contains(reason), "the reason `{reason}` is named: {}", finished.show());
    assert!(!finished.stderr.contains("retrying"), "retried: {}", finished.show());
    println!("refused (exit 2) after {:?}: {}", finished.elapsed, finished.stderr.trim());
}

#[test]
fn a_zookeeper_whose_certificate_another_ca_signed_is_a_configuration_error() {
    let zookeeper = ZooKeeper::start(ZooKeeper::standalone_options().secured());
    let pipeline = Pipeline::new(PROBE);
    pipeline.register(1);
    let [ca, ..] = zookeeper.tls_files();
    let impostor = zookeeper
        .secure_url("autocomp", "10s")
        .replace(&format!("ca_file={}", ca.display()), &format!("ca_file={}", zookeeper.other_ca().display()));
    pipeline.use_locks(&impostor);
    let refused = pass(&pipeline, None);
    assert_refused_at_once(&refused, "the server's certificate is not trusted: ");
    assert!(refused.stderr.contains("UnknownIssuer"), "{}", refused.show());
    assert!(refused.stderr.contains(&zookeeper.other_ca().display().to_string()), "{}", refused.show());

    // The same server, trusted: the pass works.
    pipeline.use_locks(&zookeeper.secure_url("autocomp", "10s"));
    let worked = pass(&pipeline, None);
    assert_eq!(worked.code, Some(0), "{}", worked.show());
}

/// `autocomp-store serve` over HTTPS with `cert` and `key`, on a free loopback port; killed
/// when dropped.
struct HttpsStore(Child, u16);

impl HttpsStore {
    fn start(dir: &Path, cert: &Path, key: &Path) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let db = format!("sqlite://{}", dir.join("served.db").display());
        let mut command = Command::new(binary("autocomp-store"));
        command.args(["serve", "--db", &db, "--listen", &format!("127.0.0.1:{port}")]);
        command.arg("--tls-cert").arg(cert).arg("--tls-key").arg(key);
        command.env("AUTOCOMP_TOKEN", autocomp_e2e::services::TOKEN).env_remove("AUTOCOMP_TOKEN_FILE");
        let log = std::fs::File::create(dir.join("served.log")).unwrap();
        let mut child =
            command.stdin(Stdio::null()).stdout(Stdio::null()).stderr(log).spawn().expect("the store service");
        let listening = wait_until(Instant::now() + Duration::from_secs(30), || {
            child.try_wait().ok().flatten().is_some() || TcpStream::connect(("127.0.0.1", port)).is_ok()
        }) && child.try_wait().ok().flatten().is_none();
        assert!(listening, "the store service does not listen: {:?}", std::fs::read_to_string(dir.join("served.log")));
        Self(child, port)
    }
}

impl Drop for HttpsStore {
    fn drop(&mut self) {
        self.0.kill().ok();
        self.0.wait().ok();
    }
}

#[test]
fn a_store_service_whose_certificate_another_ca_signed_is_a_configuration_error() {
    // The PostgreSQL harness's certificates (a server certificate for `localhost` and two
    // CAs); the database itself is not used.
    let postgres = Postgres::start_with(Options::default().with_tls());
    let tls = postgres.tls();
    let pipeline = Pipeline::new(PROBE);
    let served = HttpsStore::start(&pipeline.path(""), &tls.certificate, &tls.key);
    pipeline.use_backend("store", &format!("https://localhost:{}", served.1));
    let refused = pass(&pipeline, Some(&tls.other_ca));
    assert_refused_at_once(&refused, "the server's certificate is not trusted: UnknownIssuer");
    assert!(refused.stderr.contains(&tls.other_ca.display().to_string()), "{}", refused.show());
}

#[test]
fn a_postgresql_whose_certificate_another_ca_signed_is_a_configuration_error() {
    let postgres = Postgres::start_with(Options::default().with_tls());
    let tls = postgres.tls();
    postgres.create_database("impostor");
    let pipeline = Pipeline::new(PROBE);
    let url = format!(
        "postgres://autocomp@localhost:{}/impostor?sslmode=verify-full&sslrootcert={}",
        postgres.port(),
        tls.other_ca.display()
    );
    pipeline.use_backend("store", &url);
    let refused = pass(&pipeline, None);
    assert_refused_at_once(&refused, "is refused under sslmode=verify-full");
    assert!(refused.stderr.contains("not signed by a CA in sslrootcert"), "{}", refused.show());
}
