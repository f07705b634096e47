"""Shared test helpers: run the installed zplan CLI in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import planner

# The directory holding the `planner` package the tests imported: the installed wheel in CI,
# the checkout when run from source. The CLI subprocess uses the same one.
PACKAGE_PARENT = Path(planner.__file__).resolve().parent.parent


# The installed console script next to this interpreter (the venv's `zplan`), as users run it;
# `python -m planner` (the same entry point) where no script is installed.
INSTALLED = Path(sys.executable).with_name("zplan")
COMMAND = [str(INSTALLED)] if INSTALLED.is_file() else [sys.executable, "-m", "planner"]


def run_zplan(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None,
              **kwargs: object) -> subprocess.CompletedProcess[str]:
    """Run the installed `zplan ARGS` and capture output (text); `env` adds variables."""
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = str(PACKAGE_PARENT)
    full_env["COLUMNS"] = "160"
    full_env.pop("ZPLAN_DEBUG", None)
    full_env.update(env or {})
    return subprocess.run(
        [*COMMAND, *args], capture_output=True, text=True, cwd=cwd, env=full_env, timeout=300,
        **kwargs,  # type: ignore[arg-type]
    )


@pytest.fixture
def zplan(tmp_path: Path):
    """Call as `zplan("fit", "--model", ...)`; runs from an empty directory."""

    def _run(*args: str) -> subprocess.CompletedProcess[str]:
        return run_zplan(*args, cwd=tmp_path)

    return _run
