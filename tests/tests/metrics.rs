//! Pipeline metrics as Prometheus would read them: `autocomp metrics` on the demo's pipeline
//! parses with a real `promtool` and carries the counts `autocomp status` gives, and the
//! alert rules in contrib/prometheus pass `promtool check rules` and their unit tests
//! (`promtool test rules`: which alert fires on which series).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use autocomp_e2e::binary;
use serde_json::Value;

const PROMTOOL: &str = "/usr/bin/promtool";

fn promtool() -> Command {
    assert!(
        Path::new(PROMTOOL).exists(),
        "{PROMTOOL} is missing: apt-get install -y prometheus (scripts/test installs it)"
    );
    Command::new(PROMTOOL)
}

fn autocomp(config_dir: &Path, args: &[&str]) -> String {
    let output = Command::new(binary("autocomp"))
        .arg("--config-dir")
        .arg(config_dir)
        .args(args)
        .env_remove("AUTOCOMP_STORE")
        .env_remove("AUTOCOMP_INDEX")
        .env_remove("AUTOCOMP_LOCKS")
        .output()
        .unwrap();
    assert!(output.status.success(), "autocomp {args:?}: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout).unwrap()
}

#[test]
fn metrics_of_the_demo_parse_with_promtool_and_count_what_status_counts() {
    let dir = tempfile::tempdir().unwrap();
    let demo = Command::new(binary("autocomp")).args(["demo", "--batches", "12", "--dir"]).arg(dir.path()).output();
    assert!(demo.unwrap().status.success());
    let config = dir.path().join("config");
    let text = autocomp(&config, &["metrics"]);

    let mut check = promtool().args(["check", "metrics"]).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    check.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let checked = check.wait_with_output().unwrap();
    assert!(checked.status.success(), "promtool check metrics: {}\n{text}", String::from_utf8_lossy(&checked.stdout));

    let mut expected: BTreeMap<(String, String), u64> = BTreeMap::new();
    let status: Value = serde_json::from_str(&autocomp(&config, &["status", "--format", "json"])).unwrap();
    for row in status.as_array().unwrap() {
        for (component, state) in row["components"].as_object().unwrap() {
            *expected.entry((component.clone(), state.as_str().unwrap().to_owned())).or_default() += 1;
        }
    }
    let reported = samples(&text, "autocomp_batches", "state");
    assert_eq!(reported, expected, "autocomp_batches equals autocomp status, state by state\n{text}");

    // The demo reruns nothing: each component recorded one result per batch it settled, so
    // its results (in total, and all within the last hour) are its settled batches.
    let settled: BTreeMap<(String, String), u64> = expected
        .iter()
        .filter_map(|((component, state), n)| match state.as_str() {
            "success" => Some(((component.clone(), "success".to_owned()), *n)),
            "failed" => Some(((component.clone(), "failure".to_owned()), *n)),
            _ => None,
        })
        .filter(|((component, _), _)| component != "batch-trigger")
        .collect();
    assert_eq!(samples(&text, "autocomp_results_total", "outcome"), settled, "results per outcome\n{text}");
    assert_eq!(samples(&text, "autocomp_results_last_hour", "outcome"), settled, "all in the last hour\n{text}");
    for (component, results) in settled.iter().fold(BTreeMap::<&str, u64>::new(), |mut sum, ((c, _), n)| {
        *sum.entry(c.as_str()).or_default() += n;
        sum
    }) {
        let count = format!("autocomp_work_duration_seconds_count{{component=\"{component}\"}} {results}\n");
        assert!(text.contains(&count), "every result has a duration: {count}\n{text}");
        for quantile in ["0.5", "0.95"] {
            let series = format!(
                "autocomp_work_duration_last_hour_seconds{{component=\"{component}\",quantile=\"{quantile}\"}} "
            );
            assert!(text.contains(&series), "{series} missing\n{text}");
        }
    }
    for family in [
        "autocomp_batches_overdue{",
        "autocomp_oldest_ready_age_seconds{",
        "autocomp_oldest_working_age_seconds{",
        "autocomp_last_pass_age_seconds{",
        "autocomp_silent_after_seconds{component=\"archiver\"} 3600",
        "autocomp_index_lag_changes 0",
    ] {
        assert!(text.contains(family), "{family} missing:\n{text}");
    }
}

#[test]
fn the_alert_rules_pass_promtool() {
    let rules = Path::new(env!("CARGO_MANIFEST_DIR")).join("../contrib/prometheus/autocomp-rules.yml");
    let output = promtool().args(["check", "rules"]).arg(&rules).output().unwrap();
    let said = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "promtool check rules: {said}{}", String::from_utf8_lossy(&output.stderr));
    assert!(said.contains("SUCCESS: 7 rules found"), "{said}");

    let tests = rules.with_file_name("autocomp-rules.test.yml");
    let output = promtool().args(["test", "rules"]).arg(&tests).output().unwrap();
    let said = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "promtool test rules: {said}{}", String::from_utf8_lossy(&output.stderr));
}

/// The non-zero samples of a family keyed by component and one other label.
fn samples(text: &str, family: &str, key: &str) -> BTreeMap<(String, String), u64> {
    let mut found = BTreeMap::new();
    for line in text.lines().filter(|l| l.starts_with(&format!("{family}{{"))) {
        let (labels, value) = line.rsplit_once(' ').unwrap();
        let label =
            |name: &str| labels.split(&format!("{name}=\"")).nth(1).unwrap().split('"').next().unwrap().to_owned();
        let count: u64 = value.parse().unwrap();
        if count > 0 {
            found.insert((label("component"), label(key)), count);
        }
    }
    found
}
