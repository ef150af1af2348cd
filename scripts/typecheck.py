"""Runs mypy over the library with the settings of pyproject.toml's [tool.mypy] (``files``: dstreams, api,
recovery) and exits non-zero on any error. Extra arguments go to mypy (file or folder names replace ``files``).

``api/`` and ``recovery/`` install as ``dstreams.api`` and ``dstreams.recovery`` (pyproject.toml's
``[tool.setuptools.package-dir]``), which a plain ``mypy api recovery`` would check as top-level packages named
``api`` and ``recovery``, leaving every ``from dstreams.api...`` / ``from dstreams.recovery...`` import
unresolved. This script gives mypy each file under its installed module name, so the layers are checked against
each other.
"""

from __future__ import annotations

import sys

from mypy import build
from mypy.errors import CompileError
from mypy.main import process_options

# top-level folder -> the package it installs as (pyproject.toml, [tool.setuptools.package-dir])
INSTALLED_AS = {"api": "dstreams.api", "recovery": "dstreams.recovery"}


def main(argv: list[str]) -> int:
    sources, options = process_options(argv)
    for source in sources:
        top, _, rest = (source.module or "").partition(".")
        if top in INSTALLED_AS:
            source.module = INSTALLED_AS[top] + ("." + rest if rest else "")
            source.base_dir = None
    try:
        messages = build.build(sources, options).errors
    except CompileError as exc:
        messages = exc.messages
    for line in messages:
        print(line)
    errors = sum(1 for line in messages if ": error:" in line)
    print(f"mypy: {errors} error(s) in {len(sources)} source files" if errors
          else f"mypy: no errors in {len(sources)} source files")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
