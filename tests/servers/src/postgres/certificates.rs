//! The test CAs and the server certificate a TLS test server presents (`Options::tls`),
//! made with the `openssl` command.

use std::path::Path;
use std::process::Command;

use super::process::{is_root, run, server_user_ids};
use super::{SERVER_USER, TlsFiles};

pub(super) fn tls_files(dir: &Path) -> TlsFiles {
    TlsFiles {
        ca: dir.join("ca.crt"),
        other_ca: dir.join("other-ca.crt"),
        certificate: dir.join("server.crt"),
        key: dir.join("server.key"),
    }
}

/// Makes the test CAs and the server's certificate (P-256 keys: fast to make) in `dir` with
/// the `openssl` command, the key readable by the server user only, as PostgreSQL demands.
pub(super) fn make_certificates(dir: &Path) -> TlsFiles {
    let files = tls_files(dir);
    let openssl = |arguments: &[&str], what: &str| {
        let mut command = Command::new("openssl");
        command.args(arguments).current_dir(dir);
        let ran = run(&mut command, None, what);
        assert!(
            ran.status.success(),
            "{what} failed ({}): {}\n(the tests need the openssl command: `apt-get install -y openssl`)",
            ran.status,
            ran.stderr
        );
    };
    for (name, subject) in [("ca", "/CN=autocomp test CA"), ("other-ca", "/CN=autocomp other test CA")] {
        let (key, certificate) = (format!("{name}.key"), format!("{name}.crt"));
        openssl(
            &[
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-days",
                "2",
                "-subj",
                subject,
                "-keyout",
                &key,
                "-out",
                &certificate,
            ],
            "openssl req (a test CA)",
        );
    }
    openssl(
        &[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-subj",
            "/CN=localhost",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
        ],
        "openssl req (the server's key)",
    );
    std::fs::write(dir.join("san.ext"), "subjectAltName=DNS:localhost\n").expect("san.ext written");
    openssl(
        &[
            "x509",
            "-req",
            "-days",
            "2",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-extfile",
            "san.ext",
            "-out",
            "server.crt",
        ],
        "openssl x509 (the server's certificate)",
    );
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&files.key, std::fs::Permissions::from_mode(0o600)).expect("chmod 600 server.key");
    if is_root() {
        let owner = server_user_ids();
        for file in [&files.key, &files.certificate] {
            std::os::unix::fs::chown(file, Some(owner.0), Some(owner.1))
                .unwrap_or_else(|e| panic!("chown {SERVER_USER} {}: {e}", file.display()));
        }
    }
    files
}
