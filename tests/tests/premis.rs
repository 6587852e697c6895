//! `autocomp export --format premis` on the demo's pipeline, as an archive would take it: the
//! document validates against the official PREMIS 3.0 schema (tests/data/premis) with
//! `xmllint`, and its objects, events and agents are the store's batches, events and agents,
//! field by field; text no XML may hold is written visibly; an unknown batch writes nothing.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use autocomp_e2e::binary;
use serde_json::Value;

const SCHEMA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/data/premis/premis-v3-0.xsd");

fn autocomp(config: &Path, args: &[&str]) -> Output {
    Command::new(binary("autocomp")).args(args).env("AUTOCOMP_CONFIG_DIR", config).output().expect("autocomp runs")
}

/// `xmllint`'s answer for an XPath expression over `file` (elements by local name: the
/// document's prefix is `premis:`).
fn xpath(file: &Path, expression: &str) -> String {
    let output = xmllint().args(["--xpath", expression]).arg(file).output().expect("xmllint runs");
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

fn xmllint() -> Command {
    assert!(
        Command::new("xmllint").arg("--version").output().is_ok(),
        "xmllint is missing: apt-get install libxml2-utils (scripts/test installs it)"
    );
    Command::new("xmllint")
}

/// `//premis:NAME` as XPath without a namespace binding.
fn el(name: &str) -> String {
    format!("*[local-name()='{name}']")
}

/// Validates `file` against the PREMIS 3.0 schema; the error output when it does not.
fn validate(file: &Path) {
    let checked = xmllint().args(["--noout", "--schema", SCHEMA]).arg(file).output().unwrap();
    assert!(
        checked.status.success(),
        "{} does not validate: {}",
        file.display(),
        String::from_utf8_lossy(&checked.stderr).chars().take(4000).collect::<String>()
    );
}

fn export(config: &Path, args: &[&str], into: &Path) -> String {
    let mut full = vec!["export", "--format", "premis"];
    full.extend_from_slice(args);
    let output = autocomp(config, &full);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    std::fs::write(into, &output.stdout).unwrap();
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn the_demos_provenance_exports_as_valid_premis_with_every_field_mapped() {
    let dir = tempfile::tempdir().unwrap();
    let demo =
        Command::new(binary("autocomp")).args(["demo", "--batches", "8", "--dir"]).arg(dir.path()).output().unwrap();
    assert!(demo.status.success(), "{}", String::from_utf8_lossy(&demo.stderr));
    let config = dir.path().join("config");
    let file: PathBuf = dir.path().join("provenance.xml");
    let said = export(&config, &["--all"], &file);
    validate(&file);

    // Every batch an object, every event an event, as the store holds them.
    let listed = autocomp(&config, &["status", "--format", "json"]);
    let batches: Vec<Value> = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(batches.len(), 8);
    assert_eq!(xpath(&file, &format!("count(/{}/{})", el("premis"), el("object"))), "8");
    let mut events = Vec::new();
    for batch in &batches {
        let id = batch["id"].as_str().unwrap();
        let shown = autocomp(&config, &["show", id, "--all", "--format", "json"]);
        let shown: Value = serde_json::from_slice(&shown.stdout).unwrap();
        let object = format!("//{}[{}/{}='{id}']", el("object"), el("objectIdentifier"), el("objectIdentifierValue"));
        assert_eq!(
            xpath(
                &file,
                &format!("string({object}/{}/{})", el("significantProperties"), el("significantPropertiesValue"))
            ),
            "RoundTrip"
        );
        let location = shown["location"].as_str().unwrap();
        assert_eq!(
            xpath(
                &file,
                &format!("string({object}/{}/{}/{})", el("storage"), el("contentLocation"), el("contentLocationValue"))
            ),
            location
        );
        events.extend(shown["events"].as_array().unwrap().iter().map(|event| (id.to_owned(), event.clone())));
    }
    assert_eq!(xpath(&file, &format!("count(/{}/{})", el("premis"), el("event"))), events.len().to_string());
    assert!(said.contains(&format!("exported 8 batches, {} events and ", events.len())), "{said}");

    // Field by field: a catalogued result, a checksum failure and the batch-trigger's event.
    let catalogued = events.iter().find(|(_, e)| e["type"] == "Catalogued").expect("a Catalogued event");
    let failed = events.iter().find(|(_, e)| e["outcome"] == "failure").expect("a failed event");
    for (batch, event) in [catalogued, failed] {
        let seq = event["seq"].as_i64().unwrap();
        let at = format!("//{}[{}/{}='{seq}']", el("event"), el("eventIdentifier"), el("eventIdentifierValue"));
        let field = |path: &str| xpath(&file, &format!("string({at}/{path})"));
        assert_eq!(field(&el("eventType")), event["type"].as_str().unwrap());
        assert_eq!(field(&el("eventDateTime")), event["at"].as_str().unwrap());
        assert_eq!(
            field(&format!("{}/{}", el("eventOutcomeInformation"), el("eventOutcome"))),
            event["outcome"].as_str().unwrap()
        );
        let agent = event["agent"].as_str().unwrap();
        let program = agent.split('@').next().unwrap();
        assert_eq!(field(&format!("{}/{}", el("linkingAgentIdentifier"), el("linkingAgentIdentifierValue"))), program);
        assert_eq!(field(&format!("{}/{}", el("linkingObjectIdentifier"), el("linkingObjectIdentifierValue"))), *batch);
        let detail = field(&format!("{}/{}", el("eventDetailInformation"), el("eventDetail")));
        if let Some(summary) = event["details"]["summary"].as_str() {
            assert!(detail.starts_with(summary), "{detail:?} starts with the summary {summary:?}");
        }
        if event["run"].is_object() {
            assert!(detail.contains(&format!("by {agent}")), "the run's host and process: {detail}");
        }
        // The outcome detail notes: one per failure, then the result as JSON.
        let note = |starting: &str| {
            let notes = format!(
                "{}/{}/{}",
                el("eventOutcomeInformation"),
                el("eventOutcomeDetail"),
                el("eventOutcomeDetailNote")
            );
            field(&format!("{notes}[starts-with(., '{starting}')]"))
        };
        if let Some(result) = event["details"].get("result") {
            assert_eq!(note("result: "), format!("result: {result}"));
        }
        if let Some(first) = event["details"]["failures"].get(0) {
            let reference = first["reference"].as_str().filter(|r| !r.is_empty()).unwrap_or("the batch");
            let expected =
                format!("{reference}: {}: {}", first["type"].as_str().unwrap(), first["description"].as_str().unwrap());
            assert_eq!(note(&format!("{reference}: ")), expected);
        }
        // Its agent: a component version, software, with its version.
        let agent_at =
            format!("//{}[{}/{}='{program}']", el("agent"), el("agentIdentifier"), el("agentIdentifierValue"));
        let (name, version) = program.split_once('/').unwrap();
        assert_eq!(xpath(&file, &format!("string({agent_at}/{})", el("agentName"))), name);
        assert_eq!(xpath(&file, &format!("string({agent_at}/{})", el("agentType"))), "software");
        assert_eq!(xpath(&file, &format!("string({agent_at}/{})", el("agentVersion"))), version);
    }

    // One batch alone; an unknown one is refused before anything is written.
    let first = batches[0]["id"].as_str().unwrap();
    let one = dir.path().join("one.xml");
    export(&config, &[first], &one);
    validate(&one);
    assert_eq!(xpath(&one, &format!("count(/{}/{})", el("premis"), el("object"))), "1");
    let unknown = autocomp(&config, &["export", "--format", "premis", first, "NO-SUCH-BATCH"]);
    assert_eq!(unknown.status.code(), Some(2), "{}", String::from_utf8_lossy(&unknown.stderr));
    assert!(unknown.stdout.is_empty(), "nothing written");
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("NO-SUCH-BATCH"));
}

/// A step's result may hold any text: what XML cannot hold (control characters) is written as
/// `\u{..}`, markup as text; the document still validates.
#[test]
fn text_no_xml_may_hold_is_written_visibly_and_the_document_stays_valid() {
    let pipeline = autocomp_framework::testing::TempPipeline::new();
    let dir = pipeline.root().join("b1");
    std::fs::create_dir_all(&dir).unwrap();
    pipeline.add_batch("B1", &dir);
    let details = serde_json::json!({
        "summary": "bell\u{7} and <b>bold</b> & \"quotes\" cr\r",
        "result": {"note": "esc\u{1b}[2J", "ok": true},
        "failures": [{"reference": "data/<x>.tif", "type": "checksum", "description": "nul\u{0} here"}],
        "failures_total": 1, "failures_cap": 10, "outcome": "failure", "duration_ms": 1
    });
    pipeline.record("B1", "Checksums_Verified", autocomp_model::Outcome::Failure, details);
    let file = pipeline.root().join("b1.xml");
    let output = pipeline.autocomp(&binary("autocomp"), &["export", "--format", "premis", "B1"]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    std::fs::write(&file, &output.stdout).unwrap();
    validate(&file);
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(text.contains("bell\\u{7} and &lt;b&gt;bold&lt;/b&gt; &amp;"), "{text}");
    // A carriage return survives parsing only as a character reference.
    assert!(text.contains("cr&#13;"), "{text}");
    let detail = xpath(&file, &format!("string(//{}[1])", el("eventDetail")));
    assert!(detail.contains("cr\r"), "parsed back with its carriage return: {detail:?}");

    // An id given twice is one object; a store without batches writes no document.
    let twice = pipeline.autocomp(&binary("autocomp"), &["export", "--format", "premis", "B1", "B1"]);
    std::fs::write(&file, &twice.stdout).unwrap();
    assert_eq!(xpath(&file, &format!("count(/{}/{})", el("premis"), el("object"))), "1");
    let empty = autocomp_framework::testing::TempPipeline::new();
    let none = empty.autocomp(&binary("autocomp"), &["export", "--format", "premis", "--all"]);
    assert_eq!(none.status.code(), Some(0));
    assert!(none.stdout.is_empty(), "no document: {}", String::from_utf8_lossy(&none.stdout));
    assert!(String::from_utf8_lossy(&none.stderr).contains("nothing to export"));
    assert!(text.contains("data/&lt;x&gt;.tif: checksum: nul\\u{0} here"), "{text}");
    // The result is JSON, whose own escape it keeps.
    assert!(text.contains("esc\\u001b[2J"), "{text}");
    assert!(!text.contains('\u{7}') && !text.contains('\u{1b}') && !text.contains('\u{0}'), "{text}");
}
