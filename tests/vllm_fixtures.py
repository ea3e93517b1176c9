"""Session-scoped real vLLM engine for the tests (register with `pytest_plugins`).

One engine per test session: vLLM-cpu takes ~20 s to start, so every vLLM test shares it and the
fixture shuts it down at the end (keeps vLLM's exit-time logging quiet).  The engine serves the
bundled tiny planner model (`models/tiny-planner`) when it exists; otherwise a random-init tiny
Llama built once per session, so the adapter is still exercised against real vLLM (the package's
`timelyllm_ros.engines.tiny_model`, which `timelyllm profile fit` and the benchmarks use too).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterator

import pytest

from timelyllm_ros.engines.tiny_model import tiny_engine_config, tiny_model


@pytest.fixture(scope="session")
def vllm_engine() -> Iterator["object"]:
    """A real VllmEngine over vLLM(-cpu), shared by the session and shut down at its end."""
    pytest.importorskip("vllm", reason="vLLM is not installed in this interpreter")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from timelyllm_ros.engines.vllm_engine import VllmEngine

    model, which = tiny_model()
    print(f"\n[vllm_fixtures] serving {which}: {model}")
    eng = VllmEngine(tiny_engine_config(model))
    eng.model_label = which  # type: ignore[attr-defined]
    try:
        yield eng
    finally:
        eng.shutdown()


def write_config_only(dst: Path, src: Path, **overrides: object) -> None:
    """Copy a model's config.json with overrides (for the adapter's pre-flight checks)."""
    dst.mkdir(parents=True, exist_ok=True)
    cfg = json.loads((src / "config.json").read_text())
    cfg.update(overrides)
    (dst / "config.json").write_text(json.dumps(cfg))
