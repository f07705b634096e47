"""planner.search.heap: the glibc malloc settings sweep() applies once per process.

Run in fresh interpreters (the settings are per process). On glibc Linux they must take effect
(mallopt returns 1 for both), the second call must not apply them again (same answer); with
ZPLAN_NO_MALLOPT set they must not be applied."""

import os
import platform
import subprocess
import sys

import pytest

CODE = "from planner.search import heap; print(heap.retain_freed_memory(), heap.retain_freed_memory())"


def _run(env_extra: dict[str, str]) -> str:
    env = {k: v for k, v in os.environ.items() if k != "ZPLAN_NO_MALLOPT"} | env_extra
    proc = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, env=env,
                          check=True)
    return proc.stdout.strip()


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt settings are glibc's")
def test_applied_on_glibc_once_per_process():
    assert _run({}) == "True True"


def test_opt_out():
    assert _run({"ZPLAN_NO_MALLOPT": "1"}) == "False False"

