//! TLS end to end with a private CA made here: the client trusts the service through
//! `$AUTOCOMP_CA_FILE`'s CA, a replaced certificate is served from the next connection
//! without dropping one in flight, and with a client CA (mTLS) only a client with a
//! certificate it signed gets an answer. Bad TLS files are bad input naming where they came from.

use crate::support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use autocomp_test_servers::wait_for_async;

use autocomp_http::client::{CallError, ClientOptions, HttpClient, Retry};
use autocomp_http::serve::{Limits, ListenArgs};
use autocomp_toolkit::tls::{ClientTls, ServerTls, ServerTlsFiles};
use rcgen::{
    BasicConstraints, Certificate, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose,
};
use support::{Echo, TOKEN, op, serve};

struct Ca {
    cert: Certificate,
    key: KeyPair,
}

impl Ca {
    fn new(name: &str) -> Self {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        Self { cert: params.self_signed(&key).unwrap(), key }
    }

    /// A leaf certificate and its key, PEM, for a server (127.0.0.1) or a client.
    fn issue(&self, usage: ExtendedKeyUsagePurpose) -> (String, String) {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()]).unwrap();
        params.distinguished_name.push(DnType::CommonName, "autocomp test");
        params.extended_key_usages = vec![usage];
        (params.signed_by(&key, &self.cert, &self.key).unwrap().pem(), key.serialize_pem())
    }

    fn write(&self, dir: &Path, name: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, self.cert.pem()).unwrap();
        path
    }
}

/// Writes `content` to `path` by renaming a new file over it, as a certificate renewal does.
fn replace(path: &Path, content: &str) {
    let next = path.with_extension("new");
    std::fs::write(&next, content).unwrap();
    std::fs::rename(&next, path).unwrap();
}

fn client(addr: std::net::SocketAddr, tls: &ClientTls) -> HttpClient {
    let options = ClientOptions::parse(&format!("https://127.0.0.1:{}?retry_for=0s", addr.port()), "url").unwrap();
    HttpClient::with_tls(options, "test service", Some(TOKEN.to_string()), tls).expect("a client")
}

async fn echo(client: &HttpClient, text: &str, sleep_ms: u64) -> Result<Echo, CallError> {
    client.call::<op::Echo>(&Echo { text: text.to_string(), sleep_ms }, Retry::Safe, None).await
}

/// The reason a certificate that fails verification gives: a configuration error, at once.
fn untrusted(result: Result<Echo, CallError>) -> String {
    match result {
        Err(CallError::Untrusted(invalid)) => invalid.to_string(),
        other => panic!("expected a certificate refused as untrusted, got {other:?}"),
    }
}

fn unreachable(result: Result<Echo, CallError>) -> String {
    match result {
        Err(CallError::Unreachable(message)) => message,
        other => panic!("expected a refused connection, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_trusts_a_private_ca_and_a_replaced_certificate_is_served_without_dropping_requests() {
    let dir = tempfile::tempdir().unwrap();
    let (first, second) = (Ca::new("first CA"), Ca::new("second CA"));
    let (cert, key) = first.issue(ExtendedKeyUsagePurpose::ServerAuth);
    let files = ServerTlsFiles { cert: dir.path().join("cert.pem"), key: dir.path().join("key.pem"), client_ca: None };
    std::fs::write(&files.cert, cert).unwrap();
    std::fs::write(&files.key, key).unwrap();
    let served = serve(Limits::default(), Some(ServerTls::load(files.clone()).unwrap())).await;

    // Without the private CA the service's certificate is unknown.
    let message = untrusted(echo(&client(served.addr, &ClientTls::default()), "hi", 0).await);
    assert!(message.contains("not trusted: UnknownIssuer"), "{message}");

    let trusts_first = ClientTls { ca_file: Some(first.write(dir.path(), "first-ca.pem")), ..ClientTls::default() };
    let trusts_second = ClientTls { ca_file: Some(second.write(dir.path(), "second-ca.pem")), ..ClientTls::default() };
    let before = client(served.addr, &trusts_first);
    assert_eq!(echo(&before, "hi", 0).await.unwrap().text, "hi");

    // A request in flight, on the connection made with the first certificate, while the
    // certificate is replaced (the service looks at the files every 2 s).
    let in_flight = tokio::spawn(async move { echo(&before, "slow", 3000).await });
    let (cert, key) = second.issue(ExtendedKeyUsagePurpose::ServerAuth);
    replace(&files.key, &key);
    replace(&files.cert, &cert);
    let deadline = Instant::now() + Duration::from_secs(15);
    // A new client each time: a new connection, a new handshake.
    wait_for_async(deadline, "the new certificate to be served", async || {
        echo(&client(served.addr, &trusts_second), "renewed", 0).await.is_ok_and(|answer| answer.text == "renewed")
    })
    .await;
    assert_eq!(in_flight.await.unwrap().expect("the request in flight is answered").text, "slow");
    untrusted(echo(&client(served.addr, &trusts_first), "old", 0).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reads_the_files_again_when_their_change_cannot_be_seen() {
    // Rewritten in place to the same length with the old modification time put back: the
    // look every 2 s sees no change, only SIGHUP makes the service read them.
    let dir = tempfile::tempdir().unwrap();
    let (first, second) = (Ca::new("first CA"), Ca::new("second CA"));
    let padded = |pem: String| format!("{pem:\n<8192}");
    let (cert, key) = first.issue(ExtendedKeyUsagePurpose::ServerAuth);
    let files = ServerTlsFiles { cert: dir.path().join("cert.pem"), key: dir.path().join("key.pem"), client_ca: None };
    std::fs::write(&files.cert, padded(cert)).unwrap();
    std::fs::write(&files.key, padded(key)).unwrap();
    let served = serve(Limits::default(), Some(ServerTls::load(files.clone()).unwrap())).await;
    let trusts_first = ClientTls { ca_file: Some(first.write(dir.path(), "first-ca.pem")), ..ClientTls::default() };
    let trusts_second = ClientTls { ca_file: Some(second.write(dir.path(), "second-ca.pem")), ..ClientTls::default() };
    // Answered: the service is past installing its SIGHUP handler.
    echo(&client(served.addr, &trusts_first), "hi", 0).await.unwrap();

    let (cert, key) = second.issue(ExtendedKeyUsagePurpose::ServerAuth);
    for (path, pem) in [(&files.cert, cert), (&files.key, key)] {
        let modified = std::fs::metadata(path).unwrap().modified().unwrap();
        std::fs::write(path, padded(pem)).unwrap();
        std::fs::File::options().write(true).open(path).unwrap().set_modified(modified).unwrap();
    }
    // SAFETY: kill(2) on our own pid with a signal the service handles.
    assert_eq!(unsafe { libc::kill(libc::getpid(), libc::SIGHUP) }, 0);
    let deadline = Instant::now() + Duration::from_secs(15);
    wait_for_async(deadline, "SIGHUP to reload the certificate", async || {
        echo(&client(served.addr, &trusts_second), "renewed", 0).await.is_ok()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_client_ca_only_clients_with_a_certificate_it_signed_connect() {
    let dir = tempfile::tempdir().unwrap();
    let (servers, clients, stranger) = (Ca::new("server CA"), Ca::new("client CA"), Ca::new("stranger CA"));
    let (cert, key) = servers.issue(ExtendedKeyUsagePurpose::ServerAuth);
    let files = ServerTlsFiles {
        cert: dir.path().join("cert.pem"),
        key: dir.path().join("key.pem"),
        client_ca: Some(clients.write(dir.path(), "client-ca.pem")),
    };
    std::fs::write(&files.cert, cert).unwrap();
    std::fs::write(&files.key, key).unwrap();
    let served = serve(Limits::default(), Some(ServerTls::load(files).unwrap())).await;
    let ca_file = Some(servers.write(dir.path(), "server-ca.pem"));

    let anonymous = ClientTls { ca_file: ca_file.clone(), ..ClientTls::default() };
    unreachable(echo(&client(served.addr, &anonymous), "hi", 0).await);

    let identity = |ca: &Ca, name: &str| {
        let (cert, key) = ca.issue(ExtendedKeyUsagePurpose::ClientAuth);
        let (cert_path, key_path) = (dir.path().join(format!("{name}.pem")), dir.path().join(format!("{name}.key")));
        std::fs::write(&cert_path, cert).unwrap();
        std::fs::write(&key_path, key).unwrap();
        ClientTls { ca_file: ca_file.clone(), client_cert: Some(cert_path), client_key: Some(key_path) }
    };
    unreachable(echo(&client(served.addr, &identity(&stranger, "stranger")), "hi", 0).await);
    let signed = identity(&clients, "operator");
    assert_eq!(echo(&client(served.addr, &signed), "hi", 0).await.unwrap().text, "hi");
}

#[test]
fn unusable_tls_files_are_bad_input_naming_the_variable_or_flag_and_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let garbage = dir.path().join("garbage.pem");
    std::fs::write(&garbage, "not a certificate\n").unwrap();
    let missing = dir.path().join("missing.pem");
    let options = || ClientOptions::parse("https://127.0.0.1:1", "url").unwrap();

    for path in [&garbage, &missing] {
        let tls = ClientTls { ca_file: Some(path.clone()), ..ClientTls::default() };
        let Err(error) = HttpClient::with_tls(options(), "test service", None, &tls) else {
            panic!("a CA file {} is accepted", path.display());
        };
        assert_eq!(error.field, "AUTOCOMP_CA_FILE");
        assert_eq!(error.value, path.display().to_string());
    }
    let half = ClientTls { client_cert: Some(garbage.clone()), ..ClientTls::default() };
    let Err(error) = HttpClient::with_tls(options(), "test service", None, &half) else { panic!("accepted") };
    assert_eq!(error.field, "AUTOCOMP_CLIENT_KEY");
    // A plain-HTTP client never reads them.
    let plain = ClientOptions::parse("http://127.0.0.1:1", "url").unwrap();
    let tls = ClientTls { ca_file: Some(missing.clone()), ..ClientTls::default() };
    assert!(HttpClient::with_tls(plain, "test service", None, &tls).is_ok());

    let args = ListenArgs { tls_cert: Some(garbage.clone()), tls_key: Some(missing.clone()), ..ListenArgs::default() };
    let error = args.tls().err().expect("an unusable certificate is refused");
    assert!(error.contains("--tls-cert") && error.contains(&garbage.display().to_string()), "{error}");
}
