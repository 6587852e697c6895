//! Each structure rule violated once, on bags made by the Library of Congress `bagit` tool,
//! through the checks `structure-checker` runs: exactly that violation is reported, naming
//! the path. A bag that keeps every rule passes. `binary.rs` runs the component itself.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use autocomp_bagit::structure::{StructureRules, check};
use autocomp_bagit::testing::bagit_tool;
use autocomp_bagit::{Collected, Kind};

/// The rules of a newspaper-scanning line: a METS file, TIFF pages, portable names.
fn rules() -> StructureRules {
    serde_json::from_value(serde_json::json!({
        "required_bag_info": ["Source-Organization"],
        "required_files": ["data/*-mets.xml"],
        "allowed_payload_names": ["*.tif", "*.xml"],
        "payload_name_characters": "A-Za-z0-9._-",
    }))
    .expect("rules parse")
}

/// A bag keeping every rule, made by `bagit --md5 --sha256`; `extra` are bagit's options.
fn bag_with(parent: &Path, extra: &[&str]) -> PathBuf {
    let bag = parent.join("B400022028241-RT1");
    fs::create_dir_all(bag.join("pages")).unwrap();
    fs::write(bag.join("B400022028241-mets.xml"), "<mets/>\n").unwrap();
    fs::write(bag.join("pages/0001.tif"), "II*\0page one").unwrap();
    fs::write(bag.join("pages/0002.tif"), "II*\0page two").unwrap();
    bagit_tool().make_bag(&bag, extra);
    // A symlink that stays inside the batch is fine.
    symlink("0002.tif", bag.join("data/pages/latest.tif")).unwrap();
    bag
}

fn bag(parent: &Path) -> PathBuf {
    bag_with(parent, &["--source-organization", "Royal Danish Library"])
}

/// Applies `break_it` to a fresh good bag and expects exactly `expected` (kind, path) problems.
fn violated(expected: &[(Kind, &str)], break_it: impl FnOnce(&Path)) {
    let dir = tempfile::tempdir().unwrap();
    let bag = bag(dir.path());
    break_it(&bag);
    let mut sink = Collected::default();
    check(&bag, &rules(), &mut sink).expect("the batch can be checked");
    let mut found: Vec<(Kind, &str)> = sink.problems.iter().map(|p| (p.kind, p.path.as_str())).collect();
    found.sort();
    let mut expected = expected.to_vec();
    expected.sort();
    assert_eq!(found, expected, "{:#?}", sink.problems);
}

#[test]
fn a_bag_keeping_every_rule_passes() {
    let dir = tempfile::tempdir().unwrap();
    let bag = bag(dir.path());
    let mut sink = Collected::default();
    let totals = check(&bag, &rules(), &mut sink).unwrap();
    assert!(sink.problems.is_empty(), "{:#?}", sink.problems);
    // bagit.txt, bag-info.txt, 2 manifests, 2 tag manifests, mets, 2 pages, the link.
    assert_eq!((totals.files, totals.directories), (10, 2));
    assert_eq!(
        totals.summary(),
        "checked 10 files and 2 directories: BagIt 0.97, 1 bag-info field, 1 required file, name patterns, \
         name characters, no empty files, no escaping symlinks"
    );
}

#[test]
fn a_missing_declaration_is_reported() {
    violated(&[(Kind::Missing, "bagit.txt")], |bag| fs::remove_file(bag.join("bagit.txt")).unwrap());
}

#[test]
fn a_declaration_without_its_encoding_is_malformed() {
    violated(&[(Kind::Malformed, "bagit.txt")], |bag| {
        fs::write(bag.join("bagit.txt"), "BagIt-Version: 1.0\n").unwrap()
    });
}

#[test]
fn a_declaration_in_the_wrong_order_is_malformed() {
    violated(&[(Kind::Malformed, "bagit.txt")], |bag| {
        fs::write(bag.join("bagit.txt"), "Tag-File-Character-Encoding: UTF-8\nBagIt-Version: 1.0\n").unwrap()
    });
}

#[test]
fn a_missing_payload_directory_is_reported() {
    // Without data/ the required METS file is gone too.
    violated(&[(Kind::Missing, "data/"), (Kind::Missing, "data/*-mets.xml")], |bag| {
        fs::rename(bag.join("data"), bag.join("payload")).unwrap()
    });
}

#[test]
fn a_bag_without_a_payload_manifest_is_reported() {
    violated(&[(Kind::Missing, "manifest-<algorithm>.txt")], |bag| {
        fs::remove_file(bag.join("manifest-md5.txt")).unwrap();
        fs::remove_file(bag.join("manifest-sha256.txt")).unwrap();
    });
}

#[test]
fn a_missing_required_bag_info_field_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let bag = bag_with(dir.path(), &[]);
    let mut sink = Collected::default();
    check(&bag, &rules(), &mut sink).unwrap();
    assert_eq!(sink.paths_of(Kind::MissingField), ["bag-info.txt"]);
    assert_eq!(sink.problems.len(), 1, "{:#?}", sink.problems);
    assert!(sink.problems[0].description.contains("Source-Organization"), "{:?}", sink.problems[0]);
}

#[test]
fn a_missing_required_file_is_reported_by_its_pattern() {
    violated(&[(Kind::Missing, "data/*-mets.xml")], |bag| {
        fs::remove_file(bag.join("data/B400022028241-mets.xml")).unwrap()
    });
}

#[test]
fn a_payload_name_outside_the_patterns_is_reported() {
    violated(&[(Kind::Name, "data/pages/notes.doc")], |bag| fs::write(bag.join("data/pages/notes.doc"), "x").unwrap());
}

#[test]
fn a_payload_name_with_a_forbidden_character_is_reported() {
    violated(&[(Kind::Name, "data/pages/page 3.tif")], |bag| {
        fs::write(bag.join("data/pages/page 3.tif"), "II*\0").unwrap()
    });
}

#[test]
fn an_empty_file_is_reported() {
    violated(&[(Kind::Empty, "data/pages/0003.tif")], |bag| fs::write(bag.join("data/pages/0003.tif"), "").unwrap());
}

#[test]
fn a_symlink_leaving_the_batch_is_reported() {
    violated(&[(Kind::SymlinkEscape, "data/pages/0003.tif")], |bag| {
        let outside = bag.parent().unwrap().join("elsewhere.tif");
        fs::write(&outside, "II*\0").unwrap();
        symlink("../../../elsewhere.tif", bag.join("data/pages/0003.tif")).unwrap();
    });
}

#[test]
fn a_dangling_symlink_is_reported() {
    violated(&[(Kind::BrokenSymlink, "data/pages/0003.tif")], |bag| {
        symlink("0009.tif", bag.join("data/pages/0003.tif")).unwrap()
    });
}

#[test]
fn rules_that_are_switched_off_are_not_applied() {
    let dir = tempfile::tempdir().unwrap();
    let delivery = dir.path().join("plain");
    fs::create_dir(&delivery).unwrap();
    fs::write(delivery.join("empty.txt"), "").unwrap();
    symlink("/etc/hostname", delivery.join("escape")).unwrap();
    fs::write(delivery.join("bad name!.txt"), "x").unwrap();
    let rules: StructureRules = serde_json::from_value(serde_json::json!({
        "bagit": false,
        "no_empty_files": false,
        "no_escaping_symlinks": false,
        "payload_name_characters": "a-z.",
    }))
    .unwrap();
    let mut sink = Collected::default();
    check(&delivery, &rules, &mut sink).unwrap();
    // Without BagIt every file is payload for the name rules; nothing else is checked.
    assert_eq!(sink.paths_of(Kind::Name), ["bad name!.txt"]);
    assert_eq!(sink.problems.len(), 1, "{:#?}", sink.problems);
}
