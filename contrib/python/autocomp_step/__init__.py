"""Write an autocomp step in Python: a function taking the batch and the settings.

A step is a function ``work(batch, settings)`` that returns its structured result (any JSON
value, or a :class:`Result` with a summary and failures), or raises
:class:`TransientFailure` (retried later) or :class:`PermanentFailure`. ``run(work)`` speaks
the command protocol of ``autocomp-exec`` (protocol 1): it reads the batch and the settings
from the files ``AUTOCOMP_BATCH_FILE`` and ``AUTOCOMP_SETTINGS_FILE`` name, calls ``work``,
writes ``AUTOCOMP_RESULT_FILE`` and exits 0 (success), 75 (transient failure) or 1
(failure)::

    from autocomp_step import Batch, PermanentFailure, run

    def work(batch: Batch, settings: dict) -> dict:
        pages = batch.result("Pages_Counted")
        if pages is None:
            raise PermanentFailure("no Pages_Counted result")
        return {"pages": pages["pages"]}

    if __name__ == "__main__":
        run(work)

Run it with ``autocomp-exec --name N --event-type T --requires Pages_Counted -- python3 step.py``.
Standard library only; Python 3.9 or newer.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from dataclasses import InitVar, dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, NoReturn, Optional, Sequence

__all__ = [
    "Batch",
    "Event",
    "Failure",
    "PermanentFailure",
    "Result",
    "StepFailure",
    "TransientFailure",
    "check_result",
    "execute",
    "run",
    "EXIT_SUCCESS",
    "EXIT_FAILURE",
    "EXIT_USAGE",
    "EXIT_TRANSIENT",
    "PROTOCOL",
]

__version__ = "0.1.0"

#: The version of the command protocol this module speaks.
PROTOCOL = 1

EXIT_SUCCESS = 0
#: A failure: the batch waits for an operator's rerun.
EXIT_FAILURE = 1
#: Not started by autocomp-exec, or the protocol files are unreadable.
EXIT_USAGE = 2
#: EX_TEMPFAIL from sysexits.h: a transient failure, retried after ``retry_backoff``.
EXIT_TRANSIENT = 75

#: Larger result files are refused by autocomp-exec.
MAX_RESULT_FILE_BYTES = 1024 * 1024

_UNSET: Any = object()


@dataclass(frozen=True)
class Failure:
    """One thing that failed: ``reference`` names it in the batch (a file path, or ``""`` for
    the batch as a whole), ``type`` is a short machine-readable kind (``"virus"``), and
    ``details`` any JSON value."""

    reference: str
    type: str
    description: str
    details: Any = None

    def to_json(self) -> Dict[str, Any]:
        data: Dict[str, Any] = {
            "reference": str(self.reference),
            "type": str(self.type),
            "description": str(self.description),
        }
        if self.details is not None:
            data["details"] = self.details
        return data


@dataclass(frozen=True)
class Result:
    """What a step may return instead of the bare result: the structured ``result`` (any JSON
    value), a ``summary`` line, and ``failures``. With failures the batch fails (permanently)
    and the result is recorded with them."""

    result: Any = None
    summary: Optional[str] = None
    failures: Sequence[Failure] = ()


class StepFailure(Exception):
    """Base of the failures a step raises; its message is the run's summary."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class TransientFailure(StepFailure):
    """The batch is fine but something it needs is not (a share offline, a service down): the
    run is retried after ``retry_backoff``. ``checkpoint`` (any JSON value) is handed back to
    the next attempt as ``batch.checkpoint``."""

    def __init__(self, message: str, checkpoint: Any = _UNSET) -> None:
        super().__init__(message)
        self.checkpoint = checkpoint


class PermanentFailure(StepFailure):
    """Retrying gives the same answer: the batch fails and waits for an operator. ``failures``
    name what failed; ``result`` (optional) is recorded with them."""

    def __init__(self, message: str, failures: Sequence[Failure] = (), result: Any = None) -> None:
        super().__init__(message)
        self.failures = list(failures)
        self.result = result


@dataclass(frozen=True)
class Event:
    """A batch's effective event of one type, as the batch file gives it."""

    type: str
    outcome: str
    result: Any = None
    summary: Optional[str] = None
    seq: Optional[int] = None
    at: Optional[str] = None
    agent: Optional[str] = None

    @property
    def succeeded(self) -> bool:
        return self.outcome == "success"

    @classmethod
    def from_json(cls, event_type: str, data: Mapping[str, Any]) -> "Event":
        return cls(
            type=event_type,
            outcome=str(data.get("outcome", "")),
            result=data.get("result"),
            summary=data.get("summary"),
            seq=data.get("seq"),
            at=data.get("at"),
            agent=data.get("agent"),
        )


@dataclass
class Batch:
    """The batch a run works on. ``location`` is its directory (or ``None``); ``events`` its
    effective events by type; ``checkpoint`` what the previous attempt saved (or ``None``).

    In a unit test, make one directly: ``Batch("B1", location=tmp, results={"A": {...}})``
    (``results`` becomes successful events)."""

    id: str
    type: str = "RoundTrip"
    priority: int = 0
    metadata: Dict[str, Any] = field(default_factory=dict)
    location: Optional[Path] = None
    events: Dict[str, Event] = field(default_factory=dict)
    checkpoint: Any = None
    #: The component running (its ``--name``); empty outside autocomp.
    component: str = ""
    results: InitVar[Optional[Mapping[str, Any]]] = None

    def __post_init__(self, results: Optional[Mapping[str, Any]]) -> None:
        if self.location is not None and not isinstance(self.location, Path):
            self.location = Path(self.location)
        for event_type, result in dict(results or {}).items():
            self.events[event_type] = Event(type=event_type, outcome="success", result=result)

    def result(self, event_type: str) -> Any:
        """The structured result ``event_type``'s effective event recorded, or ``None`` when the
        batch has no such event or it recorded none."""
        event = self.events.get(event_type)
        return None if event is None else event.result

    @classmethod
    def from_json(cls, document: Mapping[str, Any]) -> "Batch":
        """A batch from the batch file's JSON (the whole document)."""
        if not isinstance(document, Mapping):
            raise ValueError("the batch file does not hold a JSON object")
        protocol = document.get("protocol")
        if protocol != PROTOCOL:
            raise ValueError(f"the batch file is protocol {protocol!r}; this module speaks protocol {PROTOCOL}")
        batch = document.get("batch")
        if not isinstance(batch, Mapping) or not isinstance(batch.get("id"), str):
            raise ValueError('the batch file has no "batch" object with an "id"')
        events = batch.get("events") or {}
        location = batch.get("location")
        return cls(
            id=batch["id"],
            type=str(batch.get("type", "")),
            priority=int(batch.get("priority") or 0),
            metadata=dict(batch.get("metadata") or {}),
            location=Path(location) if location else None,
            events={str(t): Event.from_json(str(t), e or {}) for t, e in events.items()},
            checkpoint=document.get("checkpoint"),
            component=str(document.get("component") or ""),
        )


Work = Callable[[Batch, Dict[str, Any]], Any]


def _encode(document: Mapping[str, Any]) -> str:
    return json.dumps(document, ensure_ascii=False, allow_nan=False)


def _result_document(returned: Any) -> Dict[str, Any]:
    """The result file for what ``work`` returned."""
    document: Dict[str, Any] = {"protocol": PROTOCOL}
    if isinstance(returned, Result):
        if returned.result is not None:
            document["result"] = returned.result
        if returned.summary is not None:
            document["summary"] = str(returned.summary)
        if returned.failures:
            document["failures"] = [f.to_json() for f in returned.failures]
    elif returned is not None:
        document["result"] = returned
    return document


def _failure_document(error: StepFailure) -> Dict[str, Any]:
    document: Dict[str, Any] = {"protocol": PROTOCOL, "summary": error.message}
    if isinstance(error, TransientFailure):
        document["transient"] = True
        if error.checkpoint is not _UNSET:
            document["checkpoint"] = error.checkpoint
    elif isinstance(error, PermanentFailure):
        if error.failures:
            document["failures"] = [f.to_json() for f in error.failures]
        if error.result is not None:
            document["result"] = error.result
    return document


def _exception_document(error: BaseException) -> Dict[str, Any]:
    last_line = traceback.format_exception_only(type(error), error)[-1].strip()
    module = type(error).__module__
    name = type(error).__qualname__ if module == "builtins" else f"{module}.{type(error).__qualname__}"
    failure = Failure("", "exception", last_line, {"exception": name})
    return {"protocol": PROTOCOL, "summary": last_line, "failures": [failure.to_json()]}


def _read_json(path: str, what: str) -> Any:
    try:
        with open(path, encoding="utf-8") as file:
            return json.load(file)
    except (OSError, ValueError) as error:
        raise _UsageError(f"cannot read the {what} {path}: {error}") from error


class _UsageError(Exception):
    pass


def execute(work: Work, environ: Optional[Mapping[str, str]] = None) -> int:
    """One run of ``work`` under the protocol: reads the files ``environ`` names, writes the
    result file, and returns the exit status (what :func:`run` exits with)."""
    env = os.environ if environ is None else environ
    try:
        batch_file = env.get("AUTOCOMP_BATCH_FILE")
        result_file = env.get("AUTOCOMP_RESULT_FILE")
        if not batch_file or not result_file:
            raise _UsageError(
                "AUTOCOMP_BATCH_FILE and AUTOCOMP_RESULT_FILE are not set: this step runs under autocomp-exec "
                "(autocomp-exec --name NAME --event-type TYPE -- python3 step.py); call work() directly to try it"
            )
        protocol = env.get("AUTOCOMP_PROTOCOL")
        if protocol is not None and protocol != str(PROTOCOL):
            raise _UsageError(f"AUTOCOMP_PROTOCOL is {protocol!r}; this module speaks protocol {PROTOCOL}")
        try:
            batch = Batch.from_json(_read_json(batch_file, "batch file"))
        except ValueError as error:
            raise _UsageError(f"{batch_file}: {error}") from error
        settings_file = env.get("AUTOCOMP_SETTINGS_FILE")
        settings = _read_json(settings_file, "settings file") if settings_file else {}
        if not isinstance(settings, dict):
            raise _UsageError(f"the settings file {settings_file} does not hold a JSON object")
    except _UsageError as error:
        print(f"autocomp_step: {error}", file=sys.stderr)
        return EXIT_USAGE

    code = EXIT_SUCCESS
    try:
        document = _result_document(work(batch, settings))
        # With failures the run is a failure all the same (exit 0 keeps the result with them).
    except TransientFailure as error:
        document, code = _failure_document(error), EXIT_TRANSIENT
    except PermanentFailure as error:
        document, code = _failure_document(error), EXIT_FAILURE
    except Exception as error:  # noqa: BLE001 - any other exception is the step's failure
        traceback.print_exc(file=sys.stderr)
        document, code = _exception_document(error), EXIT_FAILURE
    if code != EXIT_SUCCESS and "summary" in document:
        # The last line of stderr: what a reader of the output sees first.
        print(document["summary"], file=sys.stderr)

    try:
        text = _encode(document)
    except (TypeError, ValueError) as error:
        message = f"the result cannot be recorded as JSON: {error}"
        print(message, file=sys.stderr)
        text = _encode(
            {"protocol": PROTOCOL, "summary": message, "failures": [Failure("", "result", message).to_json()]}
        )
        code = EXIT_FAILURE
    if len(text.encode("utf-8")) > MAX_RESULT_FILE_BYTES:
        message = f"the result file would be {len(text.encode('utf-8'))} bytes, over {MAX_RESULT_FILE_BYTES}"
        print(message, file=sys.stderr)
        text = _encode(
            {"protocol": PROTOCOL, "summary": message, "failures": [Failure("", "result", message).to_json()]}
        )
        code = EXIT_FAILURE
    try:
        with open(result_file, "w", encoding="utf-8") as file:
            file.write(text)
    except OSError as error:
        print(f"autocomp_step: cannot write the result file {result_file}: {error}", file=sys.stderr)
        return EXIT_FAILURE if code == EXIT_SUCCESS else code
    return code


_JSON_TYPES = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}


def check_result(result: Any, schema: Mapping[str, Any]) -> List[str]:
    """What in ``result`` does not fit the JSON Schema ``schema`` (the one the step publishes
    with ``--result-schema``, or the one a reader declares with ``--reads``), each problem
    naming its place in the words autocomp-exec's own check uses (``at `/pages`: "12" is not
    of type "integer"``, ``at the result itself: "bytes" is a required property``); empty
    when it fits. Offline:
    a unit test checks what ``work`` returns before autocomp-exec does (it refuses a result
    that does not fit the published schema, as a failure of type ``result_schema``).

    Checks the keywords a result's schema is made of: ``type``, ``properties``,
    ``required``, ``additionalProperties``, ``items``, ``enum``, ``const``, ``minimum``,
    ``maximum``, ``minLength``, ``maxLength``, ``minItems``, ``maxItems``, ``anyOf``,
    ``oneOf``, ``allOf`` and ``$ref`` into the schema's own ``$defs``/``definitions``; others
    (``format``, ``pattern``, ...) are not checked here (autocomp-exec checks them all)."""
    problems: List[str] = []
    _check(result, schema, schema, "", problems)
    return problems


def _resolve(node: Mapping[str, Any], root: Mapping[str, Any]) -> Mapping[str, Any]:
    ref = node.get("$ref")
    for _ in range(32):  # a chain of $refs, bounded
        if not isinstance(ref, str) or not ref.startswith("#/"):
            return node
        target: Any = root
        for part in ref[2:].split("/"):
            target = target.get(part.replace("~1", "/").replace("~0", "~"), {}) if isinstance(target, dict) else {}
        node, ref = target, target.get("$ref") if isinstance(target, dict) else None
    return node


def _check(value: Any, node: Any, root: Mapping[str, Any], at: str, problems: List[str]) -> None:
    if node is True or not isinstance(node, dict):
        return
    node = _resolve(node, root)
    where = f"at `{at}`" if at else "at the result itself"
    shown = _shown(value)
    kinds = node.get("type")
    if kinds is not None:
        kinds = [kinds] if isinstance(kinds, str) else list(kinds)
        if not any(_JSON_TYPES.get(kind, lambda v: True)(value) for kind in kinds):
            if len(kinds) == 1:
                problems.append(f'{where}: {shown} is not of type "{kinds[0]}"')
            else:
                problems.append(f"{where}: {shown} is not of types " + ", ".join(f'"{k}"' for k in kinds))
            return
    if "enum" in node and value not in node["enum"]:
        options = [_shown(option) for option in node["enum"]]
        if len(options) <= 1:
            listed = options[0] if options else "[]"
        else:
            listed = ", ".join(options[:-1]) + " or " + options[-1]
        problems.append(f"{where}: {shown} is not one of {listed}")
    if "const" in node and value != node["const"]:
        problems.append(f"{where}: {_shown(node['const'])} was expected")
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if number and "minimum" in node and value < node["minimum"]:
        problems.append(f"{where}: {shown} is less than the minimum of {node['minimum']}")
    if number and "maximum" in node and value > node["maximum"]:
        problems.append(f"{where}: {shown} is greater than the maximum of {node['maximum']}")
    if isinstance(value, str):
        if len(value) > node.get("maxLength", len(value)):
            problems.append(f"{where}: {shown} is longer than {_count(node['maxLength'], 'character')}")
        if len(value) < node.get("minLength", 0):
            problems.append(f"{where}: {shown} is shorter than {_count(node['minLength'], 'character')}")
    if isinstance(value, list):
        if len(value) > node.get("maxItems", len(value)):
            problems.append(f"{where}: {shown} has more than {_count(node['maxItems'], 'item')}")
        if len(value) < node.get("minItems", 0):
            problems.append(f"{where}: {shown} has less than {_count(node['minItems'], 'item')}")
        items = node.get("items")
        if isinstance(items, dict):
            for i, item in enumerate(value):
                _check(item, items, root, f"{at}/{i}", problems)
    if isinstance(value, dict):
        _check_object(value, node, root, at, problems)
    for combined in ("allOf", "anyOf", "oneOf"):
        if combined not in node:
            continue
        fits = [not _problems(value, option, root, at) for option in node[combined]]
        if combined == "allOf":
            for option in node[combined]:
                _check(value, option, root, at, problems)
        elif combined == "anyOf" and not any(fits):
            problems.append(f"{where}: {shown} is not valid under any of the schemas listed in the 'anyOf' keyword")
        elif combined == "oneOf" and not any(fits):
            problems.append(f"{where}: {shown} is not valid under any of the schemas listed in the 'oneOf' keyword")
        elif combined == "oneOf" and fits.count(True) > 1:
            problems.append(
                f"{where}: {shown} is valid under more than one of the schemas listed in the 'oneOf' keyword"
            )


def _shown(value: Any) -> str:
    """A value as the check names it: compact JSON, cut at 80 characters."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return text if len(text) <= 80 else text[:79] + "…"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _problems(value: Any, node: Any, root: Mapping[str, Any], at: str) -> List[str]:
    found: List[str] = []
    _check(value, node, root, at, found)
    return found


def _check_object(value: Dict[str, Any], node: Mapping[str, Any], root: Mapping[str, Any], at: str, problems: List[str]) -> None:
    properties = node.get("properties", {})
    where = f"at `{at}`" if at else "at the result itself"
    for name in node.get("required", []):
        if name not in value:
            problems.append(f"{where}: {_shown(name)} is a required property")
    extra = node.get("additionalProperties", True)
    for name, item in value.items():
        place = f"{at}/{name}"
        if name in properties:
            _check(item, properties[name], root, place, problems)
        elif extra is False:
            problems.append(f"{where}: Additional properties are not allowed ({name!r} was unexpected)")
        elif isinstance(extra, dict):
            _check(item, extra, root, place, problems)


def run(work: Work) -> NoReturn:
    """Runs ``work`` once under autocomp-exec and exits with its status: 0 success, 75 a
    transient failure, 1 a failure, 2 when not started by autocomp-exec."""
    sys.stdout.flush()
    code = execute(work)
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(code)
