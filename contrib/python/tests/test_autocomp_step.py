"""Unit tests of autocomp_step against the command protocol (version 1): the files a run of
autocomp-exec hands a step, the result file and the exit status the step gives back.

Run from the repository: python3 -m unittest discover contrib/python/tests
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from autocomp_step import (  # noqa: E402
    EXIT_FAILURE,
    EXIT_SUCCESS,
    EXIT_TRANSIENT,
    EXIT_USAGE,
    Batch,
    Event,
    Failure,
    PermanentFailure,
    Result,
    TransientFailure,
    check_result,
    execute,
)

BATCH_DOCUMENT: Dict[str, Any] = {
    "protocol": 1,
    "component": "page-doubler",
    "batch": {
        "id": "B1",
        "type": "RoundTrip",
        "priority": 3,
        "metadata": {"origin": "scanner-2"},
        "location": "/srv/in/B1",
        "events": {
            "Data_Received": {"outcome": "success", "seq": 2, "at": "2026-11-27T03:09:40.992Z", "result": None},
            "Pages_Counted": {
                "outcome": "success",
                "seq": 5,
                "at": "2026-11-27T03:09:41.000Z",
                "agent": "page-counter/0.1.0@h#1",
                "summary": "7 pages",
                "result": {"pages": 7},
            },
        },
    },
    "checkpoint": None,
}


class Run:
    """One execute() over temp protocol files: what it returned, wrote and printed."""

    def __init__(self, work: Any, document: Any = None, settings: Any = None, env: Optional[Dict[str, str]] = None):
        with tempfile.TemporaryDirectory() as dir_name:
            dir_path = Path(dir_name)
            batch_file = dir_path / "batch.json"
            settings_file = dir_path / "settings.json"
            result_file = dir_path / "result.json"
            batch_file.write_text(json.dumps(BATCH_DOCUMENT if document is None else document))
            settings_file.write_text(json.dumps({} if settings is None else settings))
            environ = {
                "AUTOCOMP_PROTOCOL": "1",
                "AUTOCOMP_BATCH_ID": "B1",
                "AUTOCOMP_BATCH_FILE": str(batch_file),
                "AUTOCOMP_SETTINGS_FILE": str(settings_file),
                "AUTOCOMP_RESULT_FILE": str(result_file),
            }
            environ.update(env or {})
            stderr = io.StringIO()
            with contextlib.redirect_stderr(stderr):
                self.code = execute(work, environ)
            self.stderr = stderr.getvalue()
            self.result: Optional[Dict[str, Any]] = (
                json.loads(result_file.read_text()) if result_file.exists() else None
            )


class BatchFileTest(unittest.TestCase):
    def test_the_batch_file_is_read_into_a_batch(self) -> None:
        seen: Dict[str, Any] = {}

        def work(batch: Batch, settings: Dict[str, Any]) -> None:
            seen["batch"], seen["settings"] = batch, settings

        run = Run(work, settings={"factor": 2})
        self.assertEqual(run.code, EXIT_SUCCESS, run.stderr)
        batch: Batch = seen["batch"]
        self.assertEqual((batch.id, batch.type, batch.priority, batch.component), ("B1", "RoundTrip", 3, "page-doubler"))
        self.assertEqual(batch.metadata, {"origin": "scanner-2"})
        self.assertEqual(batch.location, Path("/srv/in/B1"))
        self.assertEqual(batch.result("Pages_Counted"), {"pages": 7})
        self.assertIsNone(batch.result("Data_Received"))
        self.assertIsNone(batch.result("Never_Recorded"))
        counted = batch.events["Pages_Counted"]
        self.assertEqual((counted.outcome, counted.seq, counted.summary), ("success", 5, "7 pages"))
        self.assertTrue(counted.succeeded)
        self.assertIsNone(batch.checkpoint)
        self.assertEqual(seen["settings"], {"factor": 2})

    def test_a_batch_without_location_has_none(self) -> None:
        document = json.loads(json.dumps(BATCH_DOCUMENT))
        document["batch"]["location"] = None
        document["checkpoint"] = {"attempt": 1}
        batch = Batch.from_json(document)
        self.assertIsNone(batch.location)
        self.assertEqual(batch.checkpoint, {"attempt": 1})

    def test_a_fake_batch_for_unit_tests_takes_results(self) -> None:
        batch = Batch("B9", location="/tmp/x", results={"Pages_Counted": {"pages": 1}})
        self.assertEqual(batch.location, Path("/tmp/x"))
        self.assertEqual(batch.result("Pages_Counted"), {"pages": 1})
        self.assertEqual(batch.events["Pages_Counted"], Event("Pages_Counted", "success", {"pages": 1}))


class OutcomeTest(unittest.TestCase):
    def test_a_returned_value_is_the_structured_result(self) -> None:
        run = Run(lambda batch, settings: {"pages": batch.result("Pages_Counted")["pages"] * settings["factor"]},
                  settings={"factor": 2})
        self.assertEqual(run.code, EXIT_SUCCESS, run.stderr)
        self.assertEqual(run.result, {"protocol": 1, "result": {"pages": 14}})

    def test_none_records_no_result(self) -> None:
        run = Run(lambda batch, settings: None)
        self.assertEqual((run.code, run.result), (EXIT_SUCCESS, {"protocol": 1}))

    def test_a_result_object_carries_summary_and_failures(self) -> None:
        ok = Run(lambda b, s: Result(result=[1, 2], summary="two pages"))
        self.assertEqual(ok.code, EXIT_SUCCESS)
        self.assertEqual(ok.result, {"protocol": 1, "result": [1, 2], "summary": "two pages"})

        failed = Run(lambda b, s: Result({"files": 0}, "empty", [Failure("data", "empty", "no files", {"n": 0})]))
        # Exit 0 with failures: a failure, the result kept with them.
        self.assertEqual(failed.code, EXIT_SUCCESS)
        self.assertEqual(
            failed.result,
            {
                "protocol": 1,
                "result": {"files": 0},
                "summary": "empty",
                "failures": [{"reference": "data", "type": "empty", "description": "no files", "details": {"n": 0}}],
            },
        )

    def test_a_transient_failure_exits_75_with_its_checkpoint(self) -> None:
        def work(batch: Batch, settings: Dict[str, Any]) -> None:
            raise TransientFailure("share offline", checkpoint={"done": ["a.tif"]})

        run = Run(work)
        self.assertEqual(run.code, EXIT_TRANSIENT)
        self.assertEqual(
            run.result,
            {"protocol": 1, "summary": "share offline", "transient": True, "checkpoint": {"done": ["a.tif"]}},
        )
        self.assertEqual(run.stderr.splitlines()[-1], "share offline")

    def test_a_transient_failure_without_checkpoint_writes_none(self) -> None:
        def work(batch: Batch, settings: Dict[str, Any]) -> None:
            raise TransientFailure("later")

        run = Run(work)
        self.assertEqual(run.code, EXIT_TRANSIENT)
        self.assertNotIn("checkpoint", run.result or {})

    def test_a_permanent_failure_records_its_failures(self) -> None:
        def work(batch: Batch, settings: Dict[str, Any]) -> None:
            raise PermanentFailure("virus found", failures=[Failure("data/x.tif", "virus", "Eicar found")])

        run = Run(work)
        self.assertEqual(run.code, EXIT_FAILURE)
        self.assertEqual(
            run.result,
            {
                "protocol": 1,
                "summary": "virus found",
                "failures": [{"reference": "data/x.tif", "type": "virus", "description": "Eicar found"}],
            },
        )

    def test_any_other_exception_is_a_failure_described_by_the_tracebacks_last_line(self) -> None:
        def work(batch: Batch, settings: Dict[str, Any]) -> None:
            raise KeyError("min_pages")

        run = Run(work)
        self.assertEqual(run.code, EXIT_FAILURE)
        self.assertIn("Traceback (most recent call last)", run.stderr)
        self.assertEqual(run.stderr.splitlines()[-1], "KeyError: 'min_pages'")
        assert run.result is not None
        self.assertEqual(run.result["summary"], "KeyError: 'min_pages'")
        self.assertEqual(
            run.result["failures"],
            [{"reference": "", "type": "exception", "description": "KeyError: 'min_pages'",
              "details": {"exception": "KeyError"}}],
        )

    def test_a_result_that_is_not_json_is_a_failure_saying_so(self) -> None:
        run = Run(lambda b, s: {"when": object()})
        self.assertEqual(run.code, EXIT_FAILURE)
        assert run.result is not None
        self.assertIn("cannot be recorded as JSON", run.result["summary"])
        self.assertEqual(run.result["failures"][0]["type"], "result")
        nan = Run(lambda b, s: float("nan"))
        self.assertEqual(nan.code, EXIT_FAILURE)

    def test_a_result_over_one_mib_is_refused_here(self) -> None:
        run = Run(lambda b, s: "x" * (1024 * 1024))
        self.assertEqual(run.code, EXIT_FAILURE)
        assert run.result is not None
        self.assertIn("over 1048576", run.result["summary"])


class UsageTest(unittest.TestCase):
    def test_outside_autocomp_it_says_so_and_exits_2(self) -> None:
        stderr = io.StringIO()
        with contextlib.redirect_stderr(stderr):
            code = execute(lambda b, s: None, {})
        self.assertEqual(code, EXIT_USAGE)
        self.assertIn("runs under autocomp-exec", stderr.getvalue())

    def test_another_protocol_is_refused(self) -> None:
        document = dict(BATCH_DOCUMENT, protocol=2)
        run = Run(lambda b, s: None, document=document)
        self.assertEqual(run.code, EXIT_USAGE)
        self.assertIn("protocol 2", run.stderr)
        run = Run(lambda b, s: None, env={"AUTOCOMP_PROTOCOL": "2"})
        self.assertEqual(run.code, EXIT_USAGE)

    def test_unreadable_files_exit_2_naming_them(self) -> None:
        run = Run(lambda b, s: None, env={"AUTOCOMP_BATCH_FILE": "/no/such/batch.json"})
        self.assertEqual(run.code, EXIT_USAGE)
        self.assertIn("/no/such/batch.json", run.stderr)
        run = Run(lambda b, s: None, settings=[1, 2])
        self.assertEqual(run.code, EXIT_USAGE)
        self.assertIn("not hold a JSON object", run.stderr)


STEP = textwrap.dedent(
    """
    import sys
    from autocomp_step import TransientFailure, run

    def work(batch, settings):
        print("working on", batch.id)
        if settings.get("transient"):
            raise TransientFailure("later")
        return {"id": batch.id}

    if __name__ == "__main__":
        run(work)
    """
)


class ProcessTest(unittest.TestCase):
    """`run(work)` in a real python3 process: the exit status is the process's."""

    def spawn(self, env: Dict[str, str], settings: Any = None) -> Tuple[subprocess.CompletedProcess, Optional[Any]]:
        with tempfile.TemporaryDirectory() as dir_name:
            dir_path = Path(dir_name)
            (dir_path / "step.py").write_text(STEP)
            (dir_path / "batch.json").write_text(json.dumps(BATCH_DOCUMENT))
            (dir_path / "settings.json").write_text(json.dumps(settings or {}))
            full = {k: v for k, v in os.environ.items() if not k.startswith("AUTOCOMP_")}
            full["PYTHONPATH"] = str(HERE.parent)
            full["PYTHONDONTWRITEBYTECODE"] = "1"
            for key, value in env.items():
                full[key] = value.replace("@DIR@", dir_name)
            done = subprocess.run(
                [sys.executable, str(dir_path / "step.py")], env=full, capture_output=True, text=True, timeout=60
            )
            result_file = dir_path / "result.json"
            return done, json.loads(result_file.read_text()) if result_file.exists() else None

    PROTOCOL_ENV = {
        "AUTOCOMP_PROTOCOL": "1",
        "AUTOCOMP_BATCH_FILE": "@DIR@/batch.json",
        "AUTOCOMP_SETTINGS_FILE": "@DIR@/settings.json",
        "AUTOCOMP_RESULT_FILE": "@DIR@/result.json",
    }

    def test_a_step_exits_0_with_its_result_and_keeps_its_stdout(self) -> None:
        done, result = self.spawn(self.PROTOCOL_ENV)
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertEqual(done.stdout, "working on B1\n")
        self.assertEqual(result, {"protocol": 1, "result": {"id": "B1"}})

    def test_a_transient_step_exits_75(self) -> None:
        done, _ = self.spawn(self.PROTOCOL_ENV, settings={"transient": True})
        self.assertEqual(done.returncode, 75, done.stderr)

    def test_without_autocomp_the_step_exits_2(self) -> None:
        done, result = self.spawn({})
        self.assertEqual(done.returncode, 2)
        self.assertIn("autocomp-exec", done.stderr)
        self.assertIsNone(result)


class CheckResultTest(unittest.TestCase):
    """check_result: what a result's schema says of it, offline, each problem at its place."""

    SCHEMA = {
        "type": "object",
        "properties": {
            "pages": {"type": "integer", "minimum": 0},
            "largest_file": {"$ref": "#/$defs/File"},
            "bytes": {"type": "integer"},
            "kinds": {"type": "array", "items": {"enum": ["tif", "txt"]}},
        },
        "required": ["pages", "bytes"],
        "additionalProperties": False,
        "$defs": {"File": {"type": ["string", "null"], "maxLength": 64}},
    }

    def test_a_fitting_result_has_no_problem(self) -> None:
        result = {"pages": 3, "largest_file": "data/p1.tif", "bytes": 10, "kinds": ["tif"]}
        self.assertEqual(check_result(result, self.SCHEMA), [])
        self.assertEqual(check_result({"pages": 0, "largest_file": None, "bytes": 0}, self.SCHEMA), [])

    def test_each_problem_names_its_place(self) -> None:
        result = {"pages": "3", "largest_file": 7, "kinds": ["pdf"], "extra": 1}
        self.assertEqual(
            check_result(result, self.SCHEMA),
            [
                'at the result itself: "bytes" is a required property',
                'at `/pages`: "3" is not of type "integer"',
                'at `/largest_file`: 7 is not of types "string", "null"',
                'at `/kinds/0`: "pdf" is not one of "tif" or "txt"',
                "at the result itself: Additional properties are not allowed ('extra' was unexpected)",
            ],
        )
        self.assertEqual(check_result([], self.SCHEMA), ['at the result itself: [] is not of type "object"'])
        self.assertEqual(
            check_result({"pages": -1, "bytes": 0, "largest_file": "x" * 65}, self.SCHEMA),
            [
                "at `/pages`: -1 is less than the minimum of 0",
                f'at `/largest_file`: "{"x" * 65}" is longer than 64 characters',
            ],
        )

    def test_an_empty_enum_fits_nothing_and_says_so(self) -> None:
        self.assertEqual(check_result(1, {"enum": []}), ["at the result itself: 1 is not one of []"])

    def test_a_renamed_field_is_what_a_reader_would_miss(self) -> None:
        reads = {"type": "object", "properties": {"pages": {"type": "integer"}}, "required": ["pages"]}
        self.assertEqual(check_result({"page_count": 3}, reads), ['at the result itself: "pages" is a required property'])


class BuildBackendTest(unittest.TestCase):
    """The in-tree build backend pip uses (no network): the wheel holds the package, typed."""

    def test_the_wheel_holds_the_package_and_its_metadata(self) -> None:
        import zipfile

        import autocomp_step_build

        with tempfile.TemporaryDirectory() as out:
            name = autocomp_step_build.build_wheel(out)
            self.assertEqual(name, "autocomp_step-0.1.0-py3-none-any.whl")
            with zipfile.ZipFile(Path(out) / name) as wheel:
                names = set(wheel.namelist())
                metadata = wheel.read("autocomp_step-0.1.0.dist-info/METADATA").decode()
        self.assertLessEqual({"autocomp_step/__init__.py", "autocomp_step/py.typed"}, names)
        self.assertIn("autocomp_step-0.1.0.dist-info/RECORD", names)
        self.assertIn("Name: autocomp-step\nVersion: 0.1.0\n", metadata)


if __name__ == "__main__":
    unittest.main()
