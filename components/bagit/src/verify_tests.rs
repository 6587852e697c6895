//! The verifier on bags written to disk: RFC 8493 and plain manifests, damage it reports,
//! cancellation and its summaries. Apart so the verifier reads without its tests.

use super::*;
use crate::problem::Collected;

#[test]
fn summaries_read_like_the_brief() {
    let mut totals = Totals::new(Against::Bag(Version(0, 97)));
    totals.files = 1234;
    totals.bytes = 5_600_000_000;
    totals.algorithms.extend([Algorithm::Sha256, Algorithm::Md5]);
    assert_eq!(totals.summary(0), "verified 1,234 files (5.6 GB) against md5+sha256 (BagIt 0.97)");
    assert_eq!(totals.summary(3), "checked 1,234 files (5.6 GB) against md5+sha256 (BagIt 0.97)");
    totals.ignored_lines = 1;
    assert!(totals.summary(0).ends_with("; 1 unparsable manifest line ignored, as bagit does"));
    assert_eq!(count(1, "file"), "1 file");
    assert_eq!(count(1_000_000, "file"), "1,000,000 files");
    assert_eq!(count(2, "directory"), "2 directories");
    assert_eq!(and_list(&BTreeSet::from(["b", "a", "c"])), "a, b and c");
    assert_eq!(human_bytes(999), "999 B");
    assert_eq!(human_bytes(1_500), "1.5 kB");
}

#[test]
fn fetch_urls_need_a_scheme_and_host() {
    assert!(usable_url("https://example.org/x"));
    assert!(usable_url("file:///tmp/x"));
    assert!(!usable_url("https:///x"));
    assert!(!usable_url("example.org/x"));
    assert!(!usable_url("1http://x"));
}

#[test]
fn a_missing_location_aborts_naming_it() {
    let err = verify(Path::new("/no/such/batch"), &VerifySettings::default(), &mut Collected::default());
    assert_eq!(err, Err(Abort::Location("batch location /no/such/batch does not exist".into())));
}

fn sha512(bytes: &[u8]) -> String {
    let mut file = tempfile::tempfile().unwrap();
    std::io::Write::write_all(&mut file, bytes).unwrap();
    std::io::Seek::rewind(&mut file).unwrap();
    let digests = algorithm::hash_file(&mut file, &[Algorithm::Sha512], &mut [0; 64], &|| false).unwrap().unwrap();
    digests.get(Algorithm::Sha512).unwrap().to_owned()
}

/// A BagIt 1.0 bag as RFC 8493 writes it, by hand: `%`, LF and a space in names.
fn rfc_bag(root: &Path) {
    fs::create_dir_all(root.join("data/sub dir")).unwrap();
    let files = [("data/100%.txt", "data/100%25.txt"), ("data/sub dir/a\nb.txt", "data/sub dir/a%0Ab.txt")];
    let mut manifest = String::new();
    for (name, encoded) in files {
        fs::write(root.join(name), name).unwrap();
        manifest += &format!("{}  {encoded}\n", sha512(name.as_bytes()));
    }
    fs::write(root.join("manifest-sha512.txt"), &manifest).unwrap();
    let declaration = "BagIt-Version: 1.0\nTag-File-Character-Encoding: UTF-8\n";
    fs::write(root.join("bagit.txt"), declaration).unwrap();
    let tags = format!(
        "{}  bagit.txt\n{}  manifest-sha512.txt\n",
        sha512(declaration.as_bytes()),
        sha512(manifest.as_bytes())
    );
    fs::write(root.join("tagmanifest-sha512.txt"), tags).unwrap();
}

#[test]
fn an_rfc_8493_bag_with_encoded_names_verifies() {
    let dir = tempfile::tempdir().unwrap();
    rfc_bag(dir.path());
    let mut sink = Collected::default();
    let totals = verify(dir.path(), &VerifySettings::default(), &mut sink).unwrap();
    assert!(sink.problems.is_empty(), "{:#?}", sink.problems);
    assert_eq!((totals.files, totals.against.clone()), (4, Against::Bag(Version(1, 0))));
}

#[test]
fn duplicates_unsupported_algorithms_and_byte_order_marks_are_reported() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    rfc_bag(root);
    let manifest = fs::read_to_string(root.join("manifest-sha512.txt")).unwrap();
    let first = manifest.lines().next().unwrap().to_owned();
    fs::write(root.join("manifest-sha512.txt"), format!("{manifest}{first}\n")).unwrap();
    fs::write(root.join("manifest-blake2b.txt"), "").unwrap();
    let declaration = fs::read(root.join("bagit.txt")).unwrap();
    fs::write(root.join("bagit.txt"), [b"\xEF\xBB\xBF".as_slice(), &declaration].concat()).unwrap();
    let mut sink = Collected::default();
    verify(root, &VerifySettings::default(), &mut sink).unwrap();
    // BagIt 1.0 forbids even an identical repeated line.
    assert_eq!(sink.paths_of(Kind::Duplicate), ["data/100%.txt"]);
    assert_eq!(sink.paths_of(Kind::Unsupported), ["manifest-blake2b.txt"]);
    assert!(sink.paths_of(Kind::Malformed).contains(&"bagit.txt"), "{:#?}", sink.problems);
    // The edits show in the tag manifest too.
    assert_eq!(sink.paths_of(Kind::Mismatch), ["bagit.txt", "manifest-sha512.txt"]);
}

#[test]
fn a_cancelled_check_stops_without_a_verdict() {
    struct Stop;
    impl Sink for Stop {
        fn add(&mut self, problem: Problem) {
            panic!("no verdict expected after cancellation: {problem:?}");
        }
        fn cancelled(&self) -> bool {
            true
        }
    }
    let dir = tempfile::tempdir().unwrap();
    rfc_bag(dir.path());
    assert_eq!(verify(dir.path(), &VerifySettings::default(), &mut Stop), Err(Abort::Cancelled));
}

#[test]
fn plain_manifests_are_verified_with_inferred_algorithms() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    fs::create_dir(root.join("sub")).unwrap();
    fs::write(root.join("sub/a b.txt"), "hello\n").unwrap();
    fs::write(root.join("c.txt"), "changed").unwrap();
    fs::write(root.join("unlisted.txt"), "x").unwrap();
    fs::write(
        root.join("SUMS"),
        "b1946ac92492d2347c6235b4d2611184  ./sub/a b.txt\n\
         5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03 *sub/a b.txt\n\
         b1946ac92492d2347c6235b4d2611184  c.txt\n\
         b1946ac92492d2347c6235b4d2611184  gone.txt\n\
         b1946ac92492d2347c6235b4d2611184  ../outside.txt\n",
    )
    .unwrap();
    let settings = VerifySettings { plain_manifest: Some("SUMS".to_owned().try_into().unwrap()), ..Default::default() };
    let mut sink = Collected::default();
    let totals = verify(root, &settings, &mut sink).unwrap();
    assert_eq!(sink.paths_of(Kind::Mismatch), ["c.txt"]);
    assert_eq!(sink.paths_of(Kind::Missing), ["gone.txt"]);
    assert_eq!(sink.paths_of(Kind::Extra), ["unlisted.txt"]);
    assert_eq!(sink.paths_of(Kind::UnsafePath), ["../outside.txt"]);
    assert_eq!(sink.problems.len(), 4, "{:#?}", sink.problems);
    assert_eq!(totals.files, 2);
    assert_eq!(totals.algorithms, BTreeSet::from([Algorithm::Md5, Algorithm::Sha256]));
    assert_eq!(totals.summary(4), "checked 2 files (13 B) against SUMS (md5+sha256)");
}
