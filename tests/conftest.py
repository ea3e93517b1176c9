"""Shared fixtures.  The real-vLLM engine fixture lives in vllm_fixtures.py and is registered here
once, so every test module shares ONE engine per session (do not import it in test modules)."""

from vllm_fixtures import *  # noqa: F401,F403
from vllm_server_fixtures import *  # noqa: F401,F403,E402  (two `vllm serve` processes, session-wide)
