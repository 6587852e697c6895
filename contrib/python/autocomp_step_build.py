"""The PEP 517 build backend of autocomp-step, in the tree and standard library only, so that
``pip install ./contrib/python`` needs no network: pip's isolated build environment gets
nothing to download (``requires = []`` in pyproject.toml). It builds a pure-Python wheel of
the ``autocomp_step`` package, an sdist, and an editable wheel (a ``.pth`` file naming this
directory) for ``pip install -e``.
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import tarfile
import zipfile
from pathlib import Path
from typing import Dict, List, Optional, Tuple

HERE = Path(__file__).resolve().parent
NAME = "autocomp_step"
DIST = "autocomp-step"


def _version() -> str:
    for line in (HERE / NAME / "__init__.py").read_text(encoding="utf-8").splitlines():
        if line.startswith("__version__"):
            return line.split("=", 1)[1].strip().strip("\"'")
    raise RuntimeError("no __version__ in autocomp_step/__init__.py")


def _metadata() -> str:
    readme = (HERE / "README.md").read_text(encoding="utf-8")
    return (
        "Metadata-Version: 2.1\n"
        f"Name: {DIST}\n"
        f"Version: {_version()}\n"
        "Summary: Write an autocomp step in Python: a function taking the batch and its settings, "
        "run by autocomp-exec.\n"
        "License: Apache-2.0\n"
        "Requires-Python: >=3.9\n"
        "Classifier: Programming Language :: Python :: 3\n"
        "Classifier: Typing :: Typed\n"
        "Description-Content-Type: text/markdown\n"
        "\n"
        f"{readme}"
    )


WHEEL = "Wheel-Version: 1.0\nGenerator: autocomp_step_build\nRoot-Is-Purelib: true\nTag: py3-none-any\n"


def _dist_info() -> str:
    return f"{NAME}-{_version()}.dist-info"


def _package_files() -> List[Tuple[str, bytes]]:
    files = []
    for path in sorted((HERE / NAME).rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
            files.append((path.relative_to(HERE).as_posix(), path.read_bytes()))
    return files


def _write_wheel(wheel_directory: str, files: List[Tuple[str, bytes]]) -> str:
    dist_info = _dist_info()
    files = files + [
        (f"{dist_info}/METADATA", _metadata().encode("utf-8")),
        (f"{dist_info}/WHEEL", WHEEL.encode("utf-8")),
    ]
    record = []
    for name, data in files:
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode("ascii")
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append(f"{dist_info}/RECORD,,")
    wheel_name = f"{NAME}-{_version()}-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(wheel_directory, wheel_name), "w", zipfile.ZIP_DEFLATED) as wheel:
        for name, data in files:
            wheel.writestr(name, data)
        wheel.writestr(f"{dist_info}/RECORD", "\n".join(record) + "\n")
    return wheel_name


def get_requires_for_build_wheel(config_settings: Optional[Dict[str, str]] = None) -> List[str]:
    return []


def get_requires_for_build_sdist(config_settings: Optional[Dict[str, str]] = None) -> List[str]:
    return []


def get_requires_for_build_editable(config_settings: Optional[Dict[str, str]] = None) -> List[str]:
    return []


def build_wheel(
    wheel_directory: str,
    config_settings: Optional[Dict[str, str]] = None,
    metadata_directory: Optional[str] = None,
) -> str:
    return _write_wheel(wheel_directory, _package_files())


def build_editable(
    wheel_directory: str,
    config_settings: Optional[Dict[str, str]] = None,
    metadata_directory: Optional[str] = None,
) -> str:
    return _write_wheel(wheel_directory, [(f"{NAME}.pth", f"{HERE}\n".encode("utf-8"))])


def build_sdist(sdist_directory: str, config_settings: Optional[Dict[str, str]] = None) -> str:
    base = f"{NAME}-{_version()}"
    members = [(name, data) for name, data in _package_files()]
    for extra in ("pyproject.toml", "README.md", "autocomp_step_build.py"):
        members.append((extra, (HERE / extra).read_bytes()))
    for path in sorted((HERE / "tests").glob("*.py")):
        members.append((path.relative_to(HERE).as_posix(), path.read_bytes()))
    members.append(("PKG-INFO", _metadata().encode("utf-8")))
    sdist_name = f"{base}.tar.gz"
    with tarfile.open(os.path.join(sdist_directory, sdist_name), "w:gz", format=tarfile.PAX_FORMAT) as sdist:
        for name, data in members:
            info = tarfile.TarInfo(f"{base}/{name}")
            info.size = len(data)
            info.mode = 0o644
            sdist.addfile(info, io.BytesIO(data))
    return sdist_name
