//! The Debian packages (`scripts/package`, `packaging/`), built from the workspace's debug
//! binaries as a user would build them: what they install, that it runs from an unpacked root
//! (the demo to its end), that every unit passes `systemd-analyze verify`, and lintian.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use autocomp_e2e::{Finished, binary, finish};

/// What each package installs in /usr/bin.
const AUTOCOMP_BINARIES: [&str; 6] =
    ["autocomp", "batch-trigger", "checksum-verifier", "structure-checker", "archiver", "autocomp-exec"];
const SERVER_BINARIES: [&str; 3] = ["autocomp-store", "sboi", "autocomp-monitor"];
/// The binaries the autocomp-watch@ and autocomp-pass@ templates take as their instance.
const COMPONENTS: [&str; 5] = ["batch-trigger", "checksum-verifier", "structure-checker", "archiver", "autocomp-exec"];
const AUTOCOMP_UNITS: [&str; 9] = [
    "autocomp-watch@.service",
    "autocomp-pass@.service",
    "autocomp-pass@.timer",
    "autocomp-alerts.service",
    "autocomp-alerts.timer",
    "autocomp-notify.service",
    "autocomp-notify.timer",
    "autocomp-prune.service",
    "autocomp-prune.timer",
];
const SERVER_UNITS: [&str; 3] = ["autocomp-store.service", "autocomp-sboi.service", "autocomp-monitor.service"];

/// The two .deb files, built once per test process.
struct Packages {
    autocomp: PathBuf,
    server: PathBuf,
    version: String,
    arch: String,
}

impl Packages {
    fn both(&self) -> [(&'static str, &Path); 2] {
        [("autocomp", &self.autocomp), ("autocomp-server", &self.server)]
    }
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ is in the repo").to_path_buf()
}

/// A tool the packages need: a missing one fails the test, naming the Debian package.
fn require(tool: &str, package: &str) {
    let found = std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).any(|dir| dir.join(tool).is_file()))
        .unwrap_or(false);
    assert!(found, "{tool} is not installed: apt-get install {package} (scripts/test installs it)");
}

/// Runs `command` to its end, at most `limit`, output captured.
fn run(command: &mut Command, limit: Duration) -> Finished {
    let child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {command:?}: {e}"));
    finish(child, limit)
}

/// `command`, which must exit 0; its output.
fn succeed(command: &mut Command, limit: Duration) -> Finished {
    let shown = format!("{command:?}");
    let done = run(command, limit);
    assert_eq!(done.code, Some(0), "{shown}\n{}", done.show());
    done
}

fn packages() -> &'static Packages {
    static BUILT: OnceLock<Packages> = OnceLock::new();
    BUILT.get_or_init(|| {
        require("dpkg-deb", "dpkg");
        require("strip", "binutils");
        let binaries = binary("autocomp").parent().expect("the binaries' dir").to_path_buf();
        // Under target/, made afresh: a failed run leaves its packages there to look at.
        let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("packages");
        std::fs::remove_dir_all(&out).ok();
        // --fast: xz -1. Stripped debug binaries come to some 400 MB, which xz -6 takes a minute
        // and a half over on 2 cores (xz -1: seconds); what is packed is the same.
        succeed(
            Command::new(repo().join("scripts/package"))
                .arg("--binaries")
                .arg(&binaries)
                .arg("--out")
                .arg(&out)
                .arg("--fast"),
            Duration::from_secs(600),
        );
        let cargo_toml: toml::Table =
            toml::from_str(&std::fs::read_to_string(repo().join("Cargo.toml")).unwrap()).expect("Cargo.toml parses");
        let version = cargo_toml["workspace"]["package"]["version"].as_str().expect("the workspace version").to_owned();
        let arch =
            succeed(Command::new("dpkg").arg("--print-architecture"), Duration::from_secs(30)).stdout.trim().to_owned();
        let deb = |name: &str| {
            let path = out.join(format!("{name}_{version}_{arch}.deb"));
            assert!(path.is_file(), "scripts/package made no {}", path.display());
            path
        };
        Packages { autocomp: deb("autocomp"), server: deb("autocomp-server"), version, arch }
    })
}

/// The paths a .deb installs (`/usr/bin/autocomp`, ...) with their sizes.
fn contents(deb: &Path) -> Vec<(String, u64)> {
    let listing = succeed(Command::new("dpkg-deb").arg("--contents").arg(deb), Duration::from_secs(60));
    listing
        .stdout
        .lines()
        .map(|line| {
            // -rwxr-xr-x root/root 45177288 2025-11-27 08:00 ./usr/bin/archiver
            let fields: Vec<&str> = line.split_whitespace().collect();
            assert!(fields.len() >= 6, "a dpkg-deb --contents line: {line}");
            assert_eq!(fields[1], "root/root", "{line}");
            let path = fields[5].trim_start_matches('.').to_owned();
            (path, fields[2].parse().unwrap_or_else(|e| panic!("size of {line}: {e}")))
        })
        .collect()
}

/// Both packages unpacked into one root, as `apt install` would lay them out.
fn unpacked() -> tempfile::TempDir {
    let root = tempfile::tempdir().unwrap();
    for (_, deb) in packages().both() {
        succeed(Command::new("dpkg-deb").arg("-x").arg(deb).arg(root.path()), Duration::from_secs(120));
    }
    root
}

#[test]
fn the_packages_build_from_the_debug_binaries_and_list_what_they_install() {
    let packages = packages();
    let version = &packages.version;
    for (name, deb) in packages.both() {
        let info = succeed(Command::new("dpkg-deb").arg("--info").arg(deb), Duration::from_secs(60)).stdout;
        for field in
            [format!("Package: {name}"), format!("Version: {version}"), format!("Architecture: {}", packages.arch)]
        {
            assert!(info.contains(&field), "{name}: no {field:?} in\n{info}");
        }
        assert!(info.contains("libc6 (>= "), "{name} depends on the C library it links:\n{info}");
    }
    let server_info = succeed(Command::new("dpkg-deb").arg("--info").arg(&packages.server), Duration::from_secs(60));
    assert!(
        server_info.stdout.contains(&format!("Depends: autocomp (= {version})")),
        "autocomp-server needs the autocomp of its release (the user, directories, config):\n{}",
        server_info.stdout
    );

    let debug_size = |name: &str| std::fs::metadata(binary(name)).unwrap().len();
    let expectations: [(&Path, &[&str], &[&str]); 2] = [
        (&packages.autocomp, &AUTOCOMP_BINARIES, &AUTOCOMP_UNITS),
        (&packages.server, &SERVER_BINARIES, &SERVER_UNITS),
    ];
    for (deb, binaries, units) in expectations {
        let listed = contents(deb);
        let has = |path: &str| listed.iter().any(|(p, _)| p == path);
        for name in binaries {
            let (_, size) = listed
                .iter()
                .find(|(path, _)| *path == format!("/usr/bin/{name}"))
                .unwrap_or_else(|| panic!("{} has no /usr/bin/{name}: {listed:?}", deb.display()));
            assert!(
                *size < debug_size(name),
                "/usr/bin/{name} is stripped: {size} bytes, as built {}",
                debug_size(name)
            );
            assert!(has(&format!("/usr/share/man/man1/{name}.1.gz")), "{name} has a manual page: {listed:?}");
        }
        for unit in units {
            assert!(
                has(&format!("/usr/lib/systemd/system/{unit}")),
                "{} has no unit {unit}: {listed:?}",
                deb.display()
            );
        }
        // The workspace's test binaries are never shipped.
        assert!(!listed.iter().any(|(path, _)| path.contains("probe-component")), "{listed:?}");

        // Everything under /etc is a conffile, so an admin's edits survive an upgrade.
        let etc: BTreeSet<&str> = listed
            .iter()
            .filter(|(p, _)| p.starts_with("/etc/") && !p.ends_with('/'))
            .map(|(p, _)| p.as_str())
            .collect();
        let conffiles =
            succeed(Command::new("dpkg-deb").arg("--info").arg(deb).arg("conffiles"), Duration::from_secs(60)).stdout;
        assert_eq!(conffiles.lines().collect::<BTreeSet<_>>(), etc, "{}: conffiles", deb.display());
    }
    let autocomp = contents(&packages.autocomp);
    for path in [
        "/usr/lib/sysusers.d/autocomp.conf",
        "/usr/lib/tmpfiles.d/autocomp.conf",
        "/etc/autocomp/autocomp.toml",
        "/etc/autocomp/checksum-verifier.toml",
        "/etc/default/autocomp",
        "/etc/logrotate.d/autocomp",
        "/usr/share/doc/autocomp/copyright",
        "/usr/share/doc/autocomp/changelog.gz",
        "/usr/share/doc/autocomp/packages.md",
        "/usr/share/doc/autocomp/README.md.gz",
        "/usr/share/doc/autocomp/examples/crontab.example",
    ] {
        assert!(autocomp.iter().any(|(p, _)| p == path), "autocomp has no {path}: {autocomp:?}");
    }
    let server = contents(&packages.server);
    for path in [
        "/usr/lib/tmpfiles.d/autocomp-server.conf",
        "/etc/default/autocomp-store",
        "/etc/default/autocomp-sboi",
        "/etc/default/autocomp-monitor",
        "/usr/share/doc/autocomp-server/copyright",
    ] {
        assert!(server.iter().any(|(p, _)| p == path), "autocomp-server has no {path}: {server:?}");
    }
}

#[test]
fn the_installed_binaries_run_and_the_demo_archives_the_good_batches_from_there() {
    let root = unpacked();
    let usr_bin = root.path().join("usr/bin");
    for name in AUTOCOMP_BINARIES.iter().chain(&SERVER_BINARIES) {
        let help = succeed(Command::new(usr_bin.join(name)).arg("--help"), Duration::from_secs(60));
        assert!(help.stdout.contains("Usage:"), "{name} --help:\n{}", help.show());
    }

    // The demo finds its components beside the installed autocomp.
    let demo = tempfile::tempdir().unwrap();
    let done = succeed(
        Command::new(usr_bin.join("autocomp"))
            .args(["demo", "--dir"])
            .arg(demo.path())
            .env_remove("AUTOCOMP_CONFIG_DIR"),
        Duration::from_secs(600),
    );
    let good = "B400022028241-RT1";
    let row = done
        .stdout
        .lines()
        .find(|line| line.starts_with(good))
        .unwrap_or_else(|| panic!("no row for {good}:\n{}", done.show()));
    let states: Vec<&str> = row.split_whitespace().skip(1).collect();
    assert!(states.len() >= 4 && states.iter().all(|state| *state == "success"), "{row}\n{}", done.show());
    assert!(demo.path().join("archive").join(good).join("bagit.txt").is_file(), "{good} is archived:\n{}", done.show());
    assert_eq!(std::fs::read_dir(demo.path().join("archive")).unwrap().count(), 16, "every good batch is archived");
    assert!(done.stdout.contains(&usr_bin.join("checksum-verifier").display().to_string()), "{}", done.show());

    // The shipped /etc/autocomp parses: autocomp.toml and the example component file, here
    // with the demo's backends in place of /var/lib/autocomp.
    let backend = |name: &str| demo.path().join(name).display().to_string();
    let dry_run = succeed(
        Command::new(usr_bin.join("checksum-verifier"))
            .arg("--config-dir")
            .arg(root.path().join("etc/autocomp"))
            .args(["--store", &format!("sqlite://{}", backend("store.db"))])
            .args(["--index", &format!("local:{}", backend("index"))])
            .args(["--locks", &format!("local:{}", backend("locks"))])
            .arg("--dry-run"),
        Duration::from_secs(60),
    );
    assert!(dry_run.stderr.is_empty(), "the shipped config is read without a word:\n{}", dry_run.show());
}

#[test]
fn the_user_and_directories_come_from_the_packaged_sysusers_and_tmpfiles_files() {
    require("systemd-sysusers", "systemd");
    require("systemd-tmpfiles", "systemd");
    let root = unpacked();
    // What postinst runs, into the unpacked root instead of the host.
    let root_arg = format!("--root={}", root.path().display());
    succeed(Command::new("systemd-sysusers").arg(&root_arg).arg("autocomp.conf"), Duration::from_secs(60));
    succeed(
        Command::new("systemd-tmpfiles").arg(&root_arg).args(["--create", "autocomp.conf", "autocomp-server.conf"]),
        Duration::from_secs(60),
    );
    let passwd = std::fs::read_to_string(root.path().join("etc/passwd")).unwrap();
    let user = passwd
        .lines()
        .find(|line| line.starts_with("autocomp:"))
        .unwrap_or_else(|| panic!("no autocomp user:\n{passwd}"));
    let fields: Vec<&str> = user.split(':').collect();
    assert_eq!(fields[5..], ["/var/lib/autocomp", "/usr/sbin/nologin"], "{user}");
    let uid: u32 = fields[2].parse().unwrap();
    use std::os::unix::fs::MetadataExt;
    for dir in ["var/lib/autocomp", "var/log/autocomp", "var/lib/autocomp/sboi-index"] {
        let meta = std::fs::metadata(root.path().join(dir)).unwrap_or_else(|e| panic!("/{dir}: {e}"));
        assert!(meta.is_dir(), "/{dir}");
        assert_eq!(
            (meta.uid(), meta.mode() & 0o7777),
            (uid, 0o750),
            "/{dir} belongs to autocomp, others cannot look in"
        );
    }
}

#[test]
fn every_unit_passes_systemd_analyze_verify() {
    require("systemd-analyze", "systemd");
    let root = unpacked();
    // `verify --root` resolves everything in the root: the units the packages' units order
    // themselves after (sysinit.target, network-online.target, ...) and the programs they
    // run. The host's systemd units come in beside the packages', and its kill (ExecReload=).
    let units = root.path().join("usr/lib/systemd/system");
    for host in ["/usr/lib/systemd/system", "/lib/systemd/system"] {
        let Ok(entries) = std::fs::read_dir(host) else { continue };
        for entry in entries {
            let entry = entry.unwrap();
            let target = units.join(entry.file_name());
            if entry.file_type().unwrap().is_file() && !target.exists() {
                std::fs::copy(entry.path(), target).unwrap();
            }
        }
    }
    assert!(units.join("sysinit.target").exists(), "the host's systemd units (apt-get install systemd)");
    std::os::unix::fs::symlink("usr/bin", root.path().join("bin")).unwrap();
    std::fs::copy("/usr/bin/kill", root.path().join("usr/bin/kill")).expect("/usr/bin/kill (apt-get install procps)");

    // Templates are verified as their instances: each component's binary must be there.
    let mut verified: Vec<String> = SERVER_UNITS.iter().map(|u| u.to_string()).collect();
    verified.extend(AUTOCOMP_UNITS.iter().filter(|u| !u.contains('@')).map(|u| u.to_string()));
    for component in COMPONENTS {
        verified.push(format!("autocomp-pass@{component}.service"));
        verified.push(format!("autocomp-pass@{component}.timer"));
        // batch-trigger refuses --watch (it scans a directory): its timer runs it.
        if component != "batch-trigger" {
            verified.push(format!("autocomp-watch@{component}.service"));
        }
    }
    let done = run(
        Command::new("systemd-analyze")
            .arg("verify")
            .arg("--man=no")
            .arg(format!("--root={}", root.path().display()))
            .args(&verified),
        Duration::from_secs(120),
    );
    // verify exits 0 on a mere unknown key: every line it prints is a finding.
    assert!(
        done.code == Some(0) && done.stdout.trim().is_empty() && done.stderr.trim().is_empty(),
        "{verified:?}\n{}",
        done.show()
    );

    // And it does find what is wrong: an instance whose binary is not installed.
    let wrong = run(
        Command::new("systemd-analyze")
            .arg("verify")
            .arg(format!("--root={}", root.path().display()))
            .arg("autocomp-watch@no-such-component.service"),
        Duration::from_secs(120),
    );
    assert!(wrong.stderr.contains("/usr/bin/no-such-component"), "{}", wrong.show());
}

#[test]
fn lintian_reports_no_error_on_either_package() {
    require("lintian", "lintian");
    for (name, deb) in packages().both() {
        let done = run(Command::new("lintian").arg(deb), Duration::from_secs(600));
        let errors: Vec<&str> =
            done.stdout.lines().chain(done.stderr.lines()).filter(|line| line.starts_with("E:")).collect();
        assert!(errors.is_empty(), "lintian finds errors in {name}:\n{}", done.show());
        // 0: nothing, 1: tags at or above --fail-on (errors by default), else lintian broke.
        assert_eq!(done.code, Some(0), "lintian on {name}:\n{}", done.show());
    }
}
