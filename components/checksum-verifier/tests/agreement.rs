//! `checksum-verifier`'s verdict on BagIt bags equals the Library of Congress `bagit
//! --validate`'s: bags made by that tool (md5 + sha256, nested directories, names with spaces,
//! a `%`, a newline and an accent), then corrupted one way each. Also plain `md5sum` deliveries.
//! The verdict comes from the verification the component runs; `binary.rs` runs the component.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use autocomp_bagit::testing::{BagitTool, bagit_tool};
use autocomp_bagit::verify::{VerifySettings, verify};
use autocomp_bagit::{Collected, Kind};

const PAGE_2: &str = "data/sub dir/page 2.txt";
const SCAN_3: &str = "data/sub dir/deeper/scan 3.tif";

/// A delivery turned into a bag by `bagit --md5 --sha256`.
fn sample_bag(tool: &BagitTool, parent: &Path) -> PathBuf {
    let bag = parent.join("B400022028241-RT1");
    fs::create_dir_all(bag.join("sub dir/deeper")).unwrap();
    fs::write(bag.join("page 1.txt"), "first page\n").unwrap();
    fs::write(bag.join("sub dir/page 2.txt"), "second page\n").unwrap();
    let scan: Vec<u8> = (0..70_000u32).map(|i| (i * 7 % 251) as u8).collect();
    fs::write(bag.join("sub dir/deeper/scan 3.tif"), scan).unwrap();
    // bagit writes `%` as is and a newline as `%0A`; an accented name is NFC here.
    fs::write(bag.join("100% done.txt"), "percent\n").unwrap();
    fs::write(bag.join("line\nbreak.txt"), "newline\n").unwrap();
    fs::write(bag.join("caf\u{e9}.txt"), "accent\n").unwrap();
    tool.make_bag(&bag, &[]);
    bag
}

/// Corrupts a fresh sample bag, then compares the two verdicts; `expected` problems (kind and
/// path) must be among ours.
fn agree(valid: bool, expected: &[(Kind, &str)], corrupt: impl FnOnce(&BagitTool, &Path)) {
    let tool = bagit_tool();
    let dir = tempfile::tempdir().unwrap();
    let bag = sample_bag(&tool, dir.path());
    corrupt(&tool, &bag);

    let reference = tool.validate(&bag);
    let mut ours = Collected::default();
    let totals = verify(&bag, &VerifySettings::default(), &mut ours).expect("the bag can be checked");
    assert_eq!(
        ours.problems.is_empty(),
        reference.valid,
        "verdicts differ. bagit --validate:\n{}\nchecksum-verifier: {:#?}",
        reference.log,
        ours.problems
    );
    assert_eq!(reference.valid, valid, "bagit's verdict is not the one this case expects:\n{}", reference.log);
    for (kind, path) in expected {
        assert!(
            ours.problems.iter().any(|p| p.kind == *kind && p.path == *path),
            "no {kind} problem naming {path:?} among {:#?}",
            ours.problems
        );
    }
    if valid {
        // Every payload file and every listed tag file was read, for both algorithms.
        assert_eq!(totals.files, 6 + 4, "{totals:?}");
        assert_eq!(totals.summary(0).split(" (").next().unwrap(), "verified 10 files");
        assert!(totals.summary(0).contains("against md5+sha256"), "{}", totals.summary(0));
    }
}

fn remove_line(file: &Path, containing: &str) {
    let text = fs::read_to_string(file).unwrap();
    let kept: Vec<&str> = text.lines().filter(|l| !l.contains(containing)).collect();
    assert_eq!(kept.len() + 1, text.lines().count(), "exactly one line of {} names {containing}", file.display());
    fs::write(file, kept.join("\n") + "\n").unwrap();
}

#[test]
fn a_bag_as_made_is_valid() {
    agree(true, &[], |_, _| {});
}

#[test]
fn a_flipped_payload_byte_is_a_mismatch_of_that_file() {
    agree(false, &[(Kind::Mismatch, SCAN_3)], |_, bag| {
        let path = bag.join(SCAN_3);
        let mut bytes = fs::read(&path).unwrap();
        bytes[40_000] ^= 0x01;
        fs::write(&path, bytes).unwrap();
    });
}

#[test]
fn a_deleted_payload_file_is_missing() {
    agree(false, &[(Kind::Missing, PAGE_2), (Kind::PayloadOxum, "bag-info.txt")], |_, bag| {
        fs::remove_file(bag.join(PAGE_2)).unwrap();
    });
}

#[test]
fn an_extra_payload_file_is_extra() {
    agree(false, &[(Kind::Extra, "data/sub dir/stray file.txt")], |_, bag| {
        fs::write(bag.join("data/sub dir/stray file.txt"), "not in any manifest\n").unwrap();
    });
}

#[test]
fn an_edited_tag_file_fails_its_tag_manifest() {
    agree(false, &[(Kind::Mismatch, "bag-info.txt")], |_, bag| {
        let info = bag.join("bag-info.txt");
        let text = fs::read_to_string(&info).unwrap() + "Contact-Name: Someone Else\n";
        fs::write(info, text).unwrap();
    });
}

#[test]
fn a_removed_manifest_line_fails_the_tag_manifest() {
    agree(false, &[(Kind::Mismatch, "manifest-md5.txt")], |_, bag| {
        remove_line(&bag.join("manifest-md5.txt"), "data/page 1.txt");
    });
}

#[test]
fn a_line_removed_from_one_manifest_with_tag_manifests_redone_is_still_valid() {
    // The file is still listed in manifest-sha256.txt: bagit accepts that, and so do we.
    agree(true, &[], |tool, bag| {
        remove_line(&bag.join("manifest-md5.txt"), "data/page 1.txt");
        tool.resave(bag);
    });
}

#[test]
fn a_file_removed_from_every_manifest_is_extra() {
    agree(false, &[(Kind::Extra, "data/page 1.txt")], |tool, bag| {
        remove_line(&bag.join("manifest-md5.txt"), "data/page 1.txt");
        remove_line(&bag.join("manifest-sha256.txt"), "data/page 1.txt");
        tool.resave(bag);
    });
}

#[test]
fn a_wrong_payload_oxum_is_reported() {
    agree(false, &[(Kind::PayloadOxum, "bag-info.txt")], |tool, bag| {
        tool.set_bag_info(bag, "Payload-Oxum", "999.6");
    });
}

#[test]
fn a_manifest_path_escaping_the_bag_is_refused() {
    // (bagit refuses to even open such a bag, so its tag manifests cannot be redone.)
    agree(false, &[(Kind::UnsafePath, "data/../../outside.txt")], |_, bag| {
        let manifest = bag.join("manifest-md5.txt");
        let text =
            fs::read_to_string(&manifest).unwrap() + "d41d8cd98f00b204e9800998ecf8427e  data/../../outside.txt\n";
        fs::write(manifest, text).unwrap();
    });
}

#[test]
fn a_payload_symlink_leaving_the_bag_is_refused_even_with_the_right_content() {
    agree(false, &[(Kind::UnsafePath, "data/page 1.txt")], |_, bag| {
        let outside = bag.parent().unwrap().join("outside.txt");
        fs::write(&outside, "first page\n").unwrap();
        fs::remove_file(bag.join("data/page 1.txt")).unwrap();
        std::os::unix::fs::symlink(&outside, bag.join("data/page 1.txt")).unwrap();
    });
}

#[test]
fn a_name_renormalized_to_nfd_like_a_mac_volume_does_is_the_same_file() {
    agree(true, &[], |_, bag| {
        fs::rename(bag.join("data/caf\u{e9}.txt"), bag.join("data/cafe\u{301}.txt")).unwrap();
    });
}

#[test]
fn a_tag_file_in_no_tag_manifest_is_fine_but_a_listed_one_must_exist() {
    agree(true, &[], |_, bag| fs::write(bag.join("notes.txt"), "packed by hand\n").unwrap());
    agree(false, &[(Kind::Missing, "custom-tags.txt")], |_, bag| {
        let manifest = bag.join("tagmanifest-md5.txt");
        let text = fs::read_to_string(&manifest).unwrap() + "d41d8cd98f00b204e9800998ecf8427e custom-tags.txt\n";
        fs::write(manifest, text).unwrap();
    });
}

#[test]
fn comments_and_unparsable_manifest_lines_are_skipped_as_bagit_does() {
    agree(true, &[], |tool, bag| {
        let manifest = bag.join("manifest-md5.txt");
        let text = "# made by hand\n".to_owned() + &fs::read_to_string(&manifest).unwrap() + "garbage\n";
        fs::write(manifest, text).unwrap();
        tool.resave(bag);
    });
}

/// Runs `md5sum`/`sha256sum` in `dir` over `files`, writing their output to `dir/name`.
fn checksum_file(dir: &Path, program: &str, files: &[&str], name: &str) {
    let output = Command::new(program).args(files).current_dir(dir).output().expect("coreutils installed");
    assert!(output.status.success(), "{program}: {}", String::from_utf8_lossy(&output.stderr));
    fs::write(dir.join(name), output.stdout).unwrap();
}

fn plain_delivery(parent: &Path) -> PathBuf {
    let dir = parent.join("delivery");
    fs::create_dir_all(dir.join("sub dir")).unwrap();
    fs::write(dir.join("a b.txt"), "alpha\n").unwrap();
    fs::write(dir.join("sub dir/c.tif"), vec![7u8; 5000]).unwrap();
    // md5sum escapes a name with a newline or backslash (`\` line prefix, `\n`, `\\`).
    fs::write(dir.join("odd\nname\\.txt"), "odd\n").unwrap();
    dir
}

#[test]
fn a_plain_md5sum_manifest_verifies_and_names_a_corrupt_file() {
    let dir = tempfile::tempdir().unwrap();
    let delivery = plain_delivery(dir.path());
    checksum_file(&delivery, "md5sum", &["a b.txt", "sub dir/c.tif", "odd\nname\\.txt"], "MD5SUMS");
    let settings: VerifySettings =
        VerifySettings { plain_manifest: Some("MD5SUMS".to_owned().try_into().unwrap()), ..VerifySettings::default() };

    let mut sink = Collected::default();
    let totals = verify(&delivery, &settings, &mut sink).unwrap();
    assert!(sink.problems.is_empty(), "{:#?}", sink.problems);
    assert_eq!(totals.summary(0), "verified 3 files (5.0 kB) against MD5SUMS (md5)");

    fs::write(delivery.join("sub dir/c.tif"), vec![8u8; 5000]).unwrap();
    fs::write(delivery.join("late addition.txt"), "x").unwrap();
    let mut sink = Collected::default();
    verify(&delivery, &settings, &mut sink).unwrap();
    assert_eq!(sink.paths_of(Kind::Mismatch), ["sub dir/c.tif"]);
    assert_eq!(sink.paths_of(Kind::Extra), ["late addition.txt"]);
    assert_eq!(sink.problems.len(), 2, "{:#?}", sink.problems);
}

#[test]
fn a_plain_sha256sum_manifest_in_binary_mode_is_recognised_by_length() {
    let dir = tempfile::tempdir().unwrap();
    let delivery = plain_delivery(dir.path());
    let output =
        Command::new("sha256sum").args(["--binary", "a b.txt", "sub dir/c.tif"]).current_dir(&delivery).output();
    fs::write(delivery.join("SHA256SUMS"), output.unwrap().stdout).unwrap();
    let settings = VerifySettings {
        plain_manifest: Some("SHA256SUMS".to_owned().try_into().unwrap()),
        plain_allow_unlisted: true,
        ..VerifySettings::default()
    };
    let mut sink = Collected::default();
    let totals = verify(&delivery, &settings, &mut sink).unwrap();
    assert!(sink.problems.is_empty(), "{:#?}", sink.problems);
    assert_eq!(totals.files, 2);

    fs::remove_file(delivery.join("a b.txt")).unwrap();
    let mut sink = Collected::default();
    verify(&delivery, &settings, &mut sink).unwrap();
    assert_eq!(sink.paths_of(Kind::Missing), ["a b.txt"]);
}

#[test]
fn a_delivery_that_is_neither_a_bag_nor_has_the_plain_manifest_fails_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let delivery = plain_delivery(dir.path());
    let mut sink = Collected::default();
    let settings =
        VerifySettings { plain_manifest: Some("MD5SUMS".to_owned().try_into().unwrap()), ..Default::default() };
    verify(&delivery, &settings, &mut sink).unwrap();
    assert_eq!(sink.paths_of(Kind::Missing), ["bagit.txt"]);
    assert!(sink.problems[0].description.contains("MD5SUMS"), "{:?}", sink.problems[0]);
}
