//! The crates' dependencies point one way: each crate may depend only on the crates below it
//! (model <- toolkit <- http <- store <- sboi <- framework <- ops <- monitor; components on
//! the SDK alone; the SDK on nothing of HTTP serving). Read from the manifests, so a new arrow pointing back up fails here, not in review.

use std::collections::BTreeMap;
use std::path::Path;

/// Our crates from the bottom up: a crate may depend (normally) on those before it only.
const LAYERS: &[&str] = &[
    "autocomp-model",
    "autocomp-toolkit",
    "autocomp-http",
    "autocomp-store",
    "autocomp-sboi",
    "autocomp-framework",
    "autocomp-ops",
    "autocomp-monitor",
];

/// The workspace's packages: name -> the names of our crates it depends on, normally and
/// for its tests.
fn our_dependencies() -> BTreeMap<String, (Vec<String>, Vec<String>)> {
    let ours = |table: Option<&toml::Value>| -> Vec<String> {
        let mut names: Vec<String> = table
            .and_then(toml::Value::as_table)
            .map(|deps| deps.keys().filter(|name| name.starts_with("autocomp-")).cloned().collect())
            .unwrap_or_default();
        names.sort();
        names
    };
    manifests()
        .into_iter()
        .map(|manifest| {
            let text = std::fs::read_to_string(&manifest).unwrap();
            let package: toml::Table = toml::from_str(&text).unwrap();
            let name = package["package"]["name"].as_str().unwrap().to_owned();
            (name, (ours(package.get("dependencies")), ours(package.get("dev-dependencies"))))
        })
        .collect()
}

/// Every workspace member's Cargo.toml.
fn manifests() -> Vec<std::path::PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace root");
    let workspace: toml::Table = toml::from_str(&std::fs::read_to_string(root.join("Cargo.toml")).unwrap()).unwrap();
    let mut manifests = Vec::new();
    for member in workspace["workspace"]["members"].as_array().unwrap() {
        let member = member.as_str().unwrap();
        match member.strip_suffix("/*") {
            Some(dir) => {
                for entry in std::fs::read_dir(root.join(dir)).unwrap() {
                    let manifest = entry.unwrap().path().join("Cargo.toml");
                    if manifest.is_file() {
                        manifests.push(manifest);
                    }
                }
            }
            None => manifests.push(root.join(member).join("Cargo.toml")),
        }
    }
    manifests
}

#[test]
fn every_crate_depends_only_on_the_crates_below_it() {
    let packages = our_dependencies();
    for (position, layer) in LAYERS.iter().enumerate() {
        let (normal, _) = packages.get(*layer).unwrap_or_else(|| panic!("{layer} is not a workspace member"));
        for dependency in normal {
            let below = LAYERS[..position].contains(&dependency.as_str());
            assert!(below, "{layer} depends on {dependency}, which is not below it in {LAYERS:?}");
        }
    }
}

#[test]
fn the_sdk_takes_what_binaries_share_from_the_toolkit_and_nothing_of_http_serving() {
    let packages = our_dependencies();
    let (sdk, _) = &packages["autocomp-framework"];
    assert!(sdk.contains(&"autocomp-toolkit".to_owned()), "the SDK uses the toolkit: {sdk:?}");
    assert!(!sdk.contains(&"autocomp-http".to_owned()), "the SDK depends on the HTTP service toolkit: {sdk:?}");
}

#[test]
fn a_component_links_the_sdk_and_nothing_of_the_operator_application() {
    let packages = our_dependencies();
    let components = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().join("components");
    let mut checked = 0;
    for manifest in manifests().into_iter().filter(|m| m.starts_with(&components)) {
        let package: toml::Table = toml::from_str(&std::fs::read_to_string(&manifest).unwrap()).unwrap();
        let name = package["package"]["name"].as_str().unwrap();
        // The BagIt parsing library is a helper crate beside the components, not one of them.
        if name == "autocomp-bagit" {
            continue;
        }
        checked += 1;
        let (normal, _) = &packages[name];
        for dependency in normal {
            let allowed = ["autocomp-framework", "autocomp-bagit"].contains(&dependency.as_str());
            assert!(allowed, "component {name} depends on {dependency}: a component links the SDK alone");
        }
        assert!(normal.contains(&"autocomp-framework".to_owned()), "component {name} does not use the SDK");
    }
    assert!(checked >= 5, "found only {checked} components");
}

#[test]
fn the_sdks_test_helpers_are_a_dev_only_feature() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let sdk: toml::Table =
        toml::from_str(&std::fs::read_to_string(root.join("framework/Cargo.toml")).unwrap()).unwrap();
    assert!(sdk["features"]["testing"].is_array(), "autocomp-framework has a `testing` feature");
    let tempfile = &sdk["dependencies"]["tempfile"];
    assert_eq!(
        tempfile.get("optional").and_then(toml::Value::as_bool),
        Some(true),
        "tempfile ships only with `testing`"
    );
    for manifest in manifests() {
        let package: toml::Table = toml::from_str(&std::fs::read_to_string(&manifest).unwrap()).unwrap();
        let features = package
            .get("dependencies")
            .and_then(|deps| deps.get("autocomp-framework"))
            .and_then(|sdk| sdk.get("features"))
            .and_then(toml::Value::as_array);
        let ships_testing = features.is_some_and(|f| f.iter().any(|f| f.as_str() == Some("testing")));
        assert!(!ships_testing, "{} takes the SDK's `testing` feature outside [dev-dependencies]", manifest.display());
    }
}
