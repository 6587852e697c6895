//! Support for the workspace's end-to-end tests: they run the real binaries as separate OS
//! processes, so this finds (building once if needed) the binaries of the workspace in the
//! same profile as the test itself.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

/// The path of a workspace binary, e.g. `binary("autocomp")`.
pub fn binary(name: &str) -> PathBuf {
    let dir = profile_dir();
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        // `cargo test` builds only this package's targets; the binaries of the other crates
        // must be built explicitly (cargo holds no lock while tests run).
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut build = Command::new(cargo);
        build.args(["build", "--workspace", "--bins", "--quiet"]);
        if dir.ends_with("release") {
            build.arg("--release");
        }
        let status = build.status().expect("cargo runs");
        assert!(status.success(), "building the workspace binaries failed");
    });
    let path = dir.join(name);
    assert!(path.exists(), "no binary {} after building the workspace", path.display());
    path
}

/// `target/<profile>`: the test executable lives in `target/<profile>/deps/`.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    exe.parent().and_then(|deps| deps.parent()).expect("target/<profile>/deps/<test>").to_path_buf()
}
