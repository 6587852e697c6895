//! The texts `autocomp new` fills in, with `@NAME@`-style holes: the crate's manifests,
//! `main.rs` and its tests, the config files, and the Python and shell steps with theirs.
//! Apart from the code that fills them, as they are long and read as the files they become.

pub(super) const CARGO_TOML_IN_WORKSPACE: &str = r#"[package]
name = "@NAME@"
description = "@DESCRIPTION@"
version.workspace = true
edition.workspace = true
license.workspace = true
rust-version.workspace = true
publish = false

[dependencies]
autocomp-framework.workspace = true
serde.workspace = true

[dev-dependencies]
autocomp-framework = { workspace = true, features = ["testing"] }
tempfile.workspace = true
"#;

pub(super) const CARGO_TOML_STANDALONE: &str = r#"[package]
name = "@NAME@"
description = "@DESCRIPTION@"
version = "0.1.0"
edition = "2024"
publish = false

[dependencies]
# The framework sources the `autocomp` that wrote this crate was built from.
autocomp-framework = { path = @FRAMEWORK@ }
serde = { version = "1", features = ["derive"] }

[dev-dependencies]
autocomp-framework = { path = @FRAMEWORK@, features = ["testing"] }
tempfile = "3"

# Its own workspace: one in a directory above must not claim it.
[workspace]
"#;

// The generated component: at most 40 lines, so that a reader sees all of it at once.
// `dir` borrows the context only until the files are counted, so `context.fail` may follow.
pub(super) const MAIN_RS: &str = r#"//! `@NAME@`: records `@TYPE@` with the number of files in the batch's directory.
use autocomp_framework::prelude::*;
#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct Settings {
    min_files: usize,
}
#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct Counted {
    files: usize,
}
struct @STRUCT@;
impl Component for @STRUCT@ {
    type Settings = Settings;
    fn name(&self) -> &str {
        "@NAME@"
    }
    fn version(&self) -> &str {
        env!("CARGO_PKG_VERSION")
    }
    fn event_type(&self) -> &str {
        "@TYPE@"
    }
    fn trigger(&self) -> Trigger {
@TRIGGER@
    }
    fn work(&self, _batch: &Batch, settings: &Settings, context: &mut WorkContext) -> Result<(), WorkError> {
        let dir = context.location()?;
        let entries = std::fs::read_dir(dir).and_then(|d| d.collect::<Result<Vec<_>, _>>()).with_path(dir)?;
        let files = entries.iter().filter(|entry| entry.path().is_file()).count();
        if files < settings.min_files {
            context.fail("too_few_files", format!("{files} files, fewer than min_files = {}", settings.min_files));
        }
        context.set_result(&Counted { files })
    }
}
fn main() -> std::process::ExitCode {
    autocomp_framework::main(@STRUCT@)
}
mod tests;
"#;

pub(super) const TESTS_RS: &str = r#"//! `work` on real directories, recorded the way the runner would record it. Compiled for
//! tests only (the attribute below), so that `main.rs` needs no more than `mod tests;`.
#![cfg(test)]

use autocomp_framework::testing::{run_work_on, settings};

use super::*;

#[test]
fn records_the_number_of_files_as_its_result() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("page-1.txt"), "one").unwrap();
    std::fs::write(dir.path().join("page-2.txt"), "two").unwrap();
    std::fs::create_dir(dir.path().join("not-a-file")).unwrap();

    let run = run_work_on(&@STRUCT@, &settings(""), dir.path());

    assert!(run.succeeded(), "{:?}", run.report);
    assert_eq!(run.result::<Counted>(), Some(Counted { files: 2 }));
}

#[test]
fn fewer_files_than_min_files_fail_the_batch_with_the_count() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("page-1.txt"), "one").unwrap();

    let run = run_work_on(&@STRUCT@, &settings("min_files = 2"), dir.path());

    assert!(!run.succeeded() && !run.is_transient(), "{:?}", run.report);
    assert_eq!(run.report.failures[0].kind, "too_few_files");
    assert_eq!(run.result::<Counted>(), Some(Counted { files: 1 }));
}

#[test]
fn a_missing_directory_is_a_permanent_failure_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("not-delivered");

    let run = run_work_on(&@STRUCT@, &settings(""), &missing);

    let Err(WorkError::Permanent(message)) = &run.returned else { panic!("{:?}", run.returned) };
    assert!(message.contains("not-delivered"), "{message}");
}
"#;

pub(super) const CONFIG_TOML: &str = r#"# @NAME@'s config: copy it into the config dir, next to autocomp.toml
# (/etc/autocomp by default).
event_type = "@TYPE@"

# [trigger]                  # replaces the component's default clauses, clause by clause
# requires = [@REQUIRES@]
# blocked_by = ["@TYPE@"]

# [settings]                 # the defaults
# min_files = 0              # fewer files in the batch's directory fail the batch
"#;

// The generated Python step: a work function on autocomp_step, reading the required steps'
// results and returning its own.
pub(super) const PYTHON_STEP: &str = r##""""@NAME@: records @TYPE@ with the number of files in the batch's directory.

A step for autocomp-exec (README.md): work() gets the batch and the [settings] of @NAME@.toml,
and returns the structured result, or raises TransientFailure (retried later) or
PermanentFailure.
"""

from typing import Any, Dict

from autocomp_step import Batch, Failure, PermanentFailure, Result, TransientFailure, run

#: The step's version: autocomp-exec reads it, and the registry and the runs' agent name it (raise it
#: when the result schema changes, so the contract messages tell the versions apart).
__version__ = "1.0.0"

#: The event types this step requires (autocomp-exec --requires); work() reads their results.
REQUIRES = [@REQUIRES@]


def work(batch: Batch, settings: Dict[str, Any]) -> Result:
    if batch.location is None:
        raise PermanentFailure("the batch has no location")
    try:
        files = sum(1 for entry in batch.location.iterdir() if entry.is_file())
    except (FileNotFoundError, NotADirectoryError, PermissionError) as error:
        raise PermanentFailure(f"{batch.location}: {error.strerror}") from None
    except OSError as error:  # a share offline, a stale mount: try again later
        raise TransientFailure(f"{batch.location}: {error.strerror}") from None
    # What the earlier steps recorded as their results (None for one that recorded none).
    earlier = {event_type: batch.result(event_type) for event_type in REQUIRES}
    result = {"files": files, "earlier": earlier}
    min_files = int(settings.get("min_files", 0))
    if files < min_files:
        failure = Failure("", "too_few_files", f"{files} files, fewer than min_files = {min_files}")
        return Result(result, summary=failure.description, failures=[failure])
    return Result(result, summary=f"{files} files")


if __name__ == "__main__":
    run(work)
"##;

pub(super) const PYTHON_TEST: &str = r##""""Tests of @NAME@'s work() on real directories, without autocomp:

    python3 -m unittest test_@STEM@

(with autocomp_step installed, or PYTHONPATH naming contrib/python of the autocomp sources).
"""

import json
import tempfile
import unittest
from pathlib import Path

from autocomp_step import Batch, PermanentFailure, check_result

from @STEM@ import work

#: The schema the step publishes (autocomp-exec --result-schema): what it returns must fit.
RESULT_SCHEMA = json.loads(Path(__file__).with_name("@STEM@.result.json").read_text())


class WorkTest(unittest.TestCase):
    def setUp(self) -> None:
        temp = tempfile.TemporaryDirectory()
        self.addCleanup(temp.cleanup)
        self.dir = Path(temp.name)

    def test_records_the_number_of_files_and_reads_the_earlier_result(self) -> None:
        (self.dir / "page-1.txt").write_text("one")
        (self.dir / "page-2.txt").write_text("two")
        (self.dir / "not-a-file").mkdir()
        batch = Batch("B1", location=self.dir, results={"@FIRST@": {"pages": 2}})

        returned = work(batch, {})

        self.assertEqual(list(returned.failures), [])
        self.assertEqual(returned.result["files"], 2)
        self.assertEqual(returned.result["earlier"]["@FIRST@"], {"pages": 2})
        # What autocomp-exec checks before recording it, and what readers are checked against.
        self.assertEqual(check_result(returned.result, RESULT_SCHEMA), [])

    def test_fewer_files_than_min_files_fail_the_batch_with_the_count(self) -> None:
        (self.dir / "page-1.txt").write_text("one")

        returned = work(Batch("B1", location=self.dir), {"min_files": 2})

        self.assertEqual([failure.type for failure in returned.failures], ["too_few_files"])
        self.assertEqual(returned.result["files"], 1)

    def test_a_missing_directory_is_a_permanent_failure_naming_it(self) -> None:
        with self.assertRaises(PermanentFailure) as raised:
            work(Batch("B1", location=self.dir / "not-delivered"), {})
        self.assertIn("not-delivered", str(raised.exception))


if __name__ == "__main__":
    unittest.main()
"##;

// The result schema a Python or shell step publishes (autocomp-exec --result-schema): what
// it records, checked before each result is recorded and against what readers expect.
pub(super) const RESULT_SCHEMA: &str = r#"{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "title": "@TYPE@",
  "description": "What @NAME@ records as its result. autocomp-exec --result-schema publishes it in the component registry, refuses a result that does not fit it (a failure of type result_schema naming the field), and the steps that read @TYPE@ are checked against it before their passes start.",
  "type": "object",
  "properties": {
    "files": {"type": "integer", "minimum": 0, "description": "The files in the batch's directory."},
    "earlier": {"type": "object", "description": "The results of the steps it requires, by event type (null for one that recorded none)."}
  },
  "required": ["files", "earlier"]
}
"#;

// What a Python or shell step expects of a required step's result (autocomp-exec --reads).
pub(super) const READS_SCHEMA: &str = r#"{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "$comment": "What @NAME@ needs of @READ@'s result (autocomp-exec --reads @READ@=this file): name each field it reads under properties and required, e.g. \"properties\": {\"pages\": {\"type\": \"integer\"}}, \"required\": [\"pages\"]. When the step recording @READ@ stops publishing one, every pass of @NAME@ stops before any work, and autocomp explain, ready, alerts and the monitor say so.",
  "type": "object"
}
"#;

// The generated shell step: sh, with python3 -c for the JSON it reads.
pub(super) const SHELL_STEP: &str = r##"#!/bin/sh
# @NAME@: records @TYPE@ with the number of files in the batch's directory. A step for
# autocomp-exec (README.md): exit 0 success, 75 retry later, anything else a failure; the
# JSON it reads (settings, the earlier steps' results) through python3 -c.
set -eu
dir=${AUTOCOMP_BATCH_DIR:?is not set: run this under autocomp-exec (README.md)}
if [ ! -d "$dir" ]; then
    echo "$dir: no such directory" >&2
    exit 1
fi
files=$(find "$dir" -mindepth 1 -maxdepth 1 -type f | wc -l | tr -d ' ')
min_files=$(python3 -c 'import json, os
print(int(json.load(open(os.environ["AUTOCOMP_SETTINGS_FILE"])).get("min_files", 0)))')
# The earlier steps' results, by event type (null for one that recorded none).
earlier=$(python3 -c 'import json, os, sys
events = json.load(open(os.environ["AUTOCOMP_BATCH_FILE"]))["batch"]["events"]
print(json.dumps({t: (events.get(t) or {}).get("result") for t in sys.argv[1:]}))' @REQUIRES_WORDS@)
failures=
if [ "$files" -lt "$min_files" ]; then
    failures=", \"failures\": [{\"reference\": \"\", \"type\": \"too_few_files\", \"description\": \"$files files, fewer than min_files = $min_files\"}]"
fi
printf '{"protocol": 1, "result": {"files": %s, "earlier": %s}%s}\n' "$files" "$earlier" "$failures" \
    >"$AUTOCOMP_RESULT_FILE"
"##;

pub(super) const SHELL_TEST: &str = r##"#!/bin/sh
# Tests of @STEM@.sh without autocomp: the files autocomp-exec would hand it, in a temp dir.
#     sh test_@STEM@.sh
set -eu
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/B1/not-a-file"
echo one >"$tmp/B1/page-1.txt"
echo two >"$tmp/B1/page-2.txt"
printf '{"protocol": 1, "component": "@NAME@", "batch": {"id": "B1", "type": "RoundTrip", "priority": 0, "metadata": {}, "location": "%s", "events": {"@FIRST@": {"outcome": "success", "result": {"pages": 2}}}}, "checkpoint": null}\n' \
    "$tmp/B1" >"$tmp/batch.json"

# Runs the step with the settings $1; fails the test unless it exits 0.
step() {
    printf '%s\n' "$1" >"$tmp/settings.json"
    rm -f "$tmp/result.json"
    AUTOCOMP_PROTOCOL=1 AUTOCOMP_BATCH_ID=B1 AUTOCOMP_BATCH_DIR="$tmp/B1" AUTOCOMP_BATCH_FILE="$tmp/batch.json" \
        AUTOCOMP_SETTINGS_FILE="$tmp/settings.json" AUTOCOMP_RESULT_FILE="$tmp/result.json" \
        sh "$here/@STEM@.sh" || { echo "FAIL: the step exited $? with settings $1" >&2; exit 1; }
}
# Checks the Python expression $1 on the result file `r`; $2 says what it tests.
expect() {
    python3 -c 'import json, sys; r = json.load(open(sys.argv[1])); sys.exit(0 if eval(sys.argv[2]) else 1)' \
        "$tmp/result.json" "$1" || { echo "FAIL: $2: $(cat "$tmp/result.json")" >&2; exit 1; }
}

step '{}'
expect 'r["result"]["files"] == 2 and "failures" not in r' "records the number of files"
expect 'r["result"]["earlier"]["@FIRST@"] == {"pages": 2}' "reads the earlier result"
step '{"min_files": 3}'
expect 'r["failures"][0]["type"] == "too_few_files" and r["result"]["files"] == 2' "too few files fail the batch"
echo "ok: 3 tests passed"
"##;

pub(super) const SCRIPT_CONFIG_TOML: &str = r#"# @NAME@'s config: copy it into the config dir, next to autocomp.toml
# (/etc/autocomp by default); autocomp-exec --name @NAME@ reads it.
event_type = "@TYPE@"

# [trigger]                  # replaces the command line's --requires and --blocked-by, clause by clause
# requires = [@REQUIRES@]
# blocked_by = ["@TYPE@"]

# [settings]                 # the step's settings (autocomp-exec's own: kill_grace, settings_schema)
# min_files = 0              # fewer files in the batch's directory fail the batch
"#;
