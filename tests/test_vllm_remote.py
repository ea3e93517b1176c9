"""Remote vLLM servers behind the planner: two real `vllm serve` processes (vllm_servers fixture,
shared by the session) in one engine pool.

- segmented serving through the servers is token-identical to unsegmented greedy generation;
- resumes are served from the server's prefix cache (its own /metrics counters);
- killing one server mid-run moves its generations to the other; every request ends, and the
  outputs are still those of unsegmented generation;
- faults: a server down at start, a different model or tokenizer behind a URL, garbage or silence
  from a server (a tiny fake HTTP server, only for what a real vLLM cannot be made to send)
  -> a clear error, or a re-route with nothing lost.

Expected outputs are never hard-coded: references are unsegmented greedy runs on a real server.
The server-kill test runs last in this module (it kills the session's second server).
"""

from __future__ import annotations

import http.server
import json
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from test_vllm_planner import (IDENTITY_CASES, ROBOTS, RecordingDispatcher, drive, lrtrace_request,
                               make_planner, prompt_builder, reference_generation)
from timelyllm_ros.core.engine import EngineError
from timelyllm_ros.core.types import GenState
from timelyllm_ros.engines.openai_remote import RemoteServerError, RemoteVllmEngine, parse_chunk, parse_metrics
from timelyllm_ros.engines.pool import EnginePool
from timelyllm_ros.engines.tiny_model import build_random_llama
from vllm_server_fixtures import free_port

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def remotes(vllm_servers) -> Iterator[list[RemoteVllmEngine]]:
    engines = [RemoteVllmEngine({"url": s.url}) for s in vllm_servers]
    try:
        yield engines
    finally:
        for e in engines:
            e.shutdown()


def serve_on_pool(pool: EnginePool, rids: list[str], kill_after=None) -> Any:
    prompts = prompt_builder(pool)
    disp = RecordingDispatcher(value=True)
    planner = make_planner(pool, disp, prompts)
    for rid in rids:
        t, s = rid.split("-")[1:]
        assert planner.submit(lrtrace_request(t, int(s), rid)).accepted
    if kill_after is not None:
        end = time.monotonic() + 60
        while not kill_after(planner):
            planner.step()
            assert time.monotonic() < end
    drive(planner, timeout_s=180)
    return planner, disp


def references(engine: Any, rids: list[str]) -> dict[str, Any]:
    prompts = prompt_builder(engine)
    out = {}
    for rid in rids:
        t, s = rid.split("-")[1:]
        r = lrtrace_request(t, int(s), rid)
        out[rid] = reference_generation(engine, prompts, ROBOTS[r.robot_type], r)
    return out


def assert_same_as_reference(planner, disp, refs) -> None:
    for rid, ref in refs.items():
        g = planner.generations[rid]
        assert g.state.terminal
        assert g.output_ids == ref.ids, rid
        assert g.text == ref.text, rid
        if ref.valid:
            assert g.state is GenState.FINISHED, g.reason
            assert disp.texts(rid) == [c.text for c in ref.cuts]


RIDS = [f"rm-{t}-{s}" for t, s in IDENTITY_CASES]


def test_pool_of_two_servers_serves_segmented_equal_to_unsegmented(remotes):
    a, b = remotes
    pool = EnginePool({"a": a, "b": b})
    planner, disp = serve_on_pool(pool, RIDS)
    assert pool.counters.added > len(RIDS)  # resumes happened
    assert pool.counters.served["a"] > 0 and pool.counters.served["b"] > 0  # placement by load
    assert pool.counters.lost == 0 and not pool.down
    assert_same_as_reference(planner, disp, references(a, RIDS))


def test_resumes_are_served_from_the_server_prefix_cache(remotes):
    a = remotes[0]
    bs = a.block_size
    pool = EnginePool({"a": a})
    before = a.server_metrics()
    planner, _ = serve_on_pool(pool, ["pc-T3-0"])
    after = a.server_metrics()
    g = planner.generations["pc-T3-0"]
    assert g.state is GenState.FINISHED, g.reason
    assert g.resumes >= 2
    # every (re)add's prompt is prompt + generated ids: all of it but the newest tokens was computed
    # by the previous add, so at least its full blocks (minus the last token, whose KV vLLM has
    # not computed) must come from the cache; the first add's prompt may be cached as well.
    computed_before_resume = [len(g.prompt_ids) + n for n in _resume_points(g)]
    floor = sum(((c - 1) // bs) * bs for c in computed_before_resume)
    cached = after.cached_prompt_tokens - before.cached_prompt_tokens
    total = after.prompt_tokens - before.prompt_tokens
    assert cached >= floor > 0, (cached, floor, total)
    print(f"\ncached prompt tokens {cached:.0f} of {total:.0f} ({cached / total:.0%}) over "
          f"{g.resumes + 1} adds; resumes alone guarantee >= {floor}")


def _resume_points(g) -> list[int]:
    """Output tokens already generated when each resume was added (segment ends, plus results)."""
    ends, n = [], 0
    for s in g.segments[:-1]:
        n += s.token_count
        ends.append(n)
    return ends[:g.resumes]


def test_server_down_at_start_is_a_clear_error():
    port = free_port()
    with pytest.raises(RemoteServerError, match=r"cannot reach vLLM server http://127.0.0.1:\d+/v1 .*running"):
        RemoteVllmEngine({"url": f"http://127.0.0.1:{port}/v1", "timeout_s": 2})


def test_wrong_model_behind_a_url_is_a_clear_error(vllm_servers):
    with pytest.raises(EngineError, match=r"serves \['.*'\], not the expected model 'llama-70b'"):
        RemoteVllmEngine({"url": vllm_servers[0].url, "model": "llama-70b"})


def test_different_tokenizer_behind_a_url_is_a_clear_error(vllm_servers, tmp_path):
    other = build_random_llama(tmp_path / "other", vocab=300, layers=1)  # another BPE vocabulary
    with pytest.raises(EngineError, match="tokenises differently"):
        RemoteVllmEngine({"url": vllm_servers[0].url, "tokenizer": str(other)})


def test_bad_config_is_a_clear_error():
    with pytest.raises(EngineError, match="unknown remote engine config keys"):
        RemoteVllmEngine({"url": "http://x/v1", "timeout": 3})
    with pytest.raises(EngineError, match="needs `url"):
        RemoteVllmEngine({"url": "gpu1:8000"})


def test_parsers_reject_garbage():
    with pytest.raises(ValueError, match="not JSON"):
        parse_chunk("{oops")
    with pytest.raises(ValueError, match="token_ids"):
        parse_chunk(json.dumps({"choices": [{"text": "x", "finish_reason": None}]}))
    assert parse_chunk(json.dumps({"choices": [{"token_ids": [5, 6], "finish_reason": "stop"}]})) == ((5, 6), "stop")
    m = parse_metrics('# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{engine="0"} 0.25\n')
    assert m.kv_usage == 0.25 and m.num_blocks is None


# ------------------------------------------------------------------ a fake server: garbage / silence

class _FakeVllm(http.server.BaseHTTPRequestHandler):
    """Answers the connect checks like the real server behind `real` (so the adapter accepts it)
    and then streams garbage (mode "garbage") or nothing (mode "stall") for completions."""

    real: RemoteVllmEngine
    mode = "garbage"

    def log_message(self, *a: Any) -> None:
        pass

    def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("content-type", ctype)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/v1/models":
            self._send(200, json.dumps({"data": [{"id": self.real.model, "root": str(self.real_root),
                                                  "max_model_len": 2048}]}).encode())
        elif self.path == "/metrics":
            self._send(200, self.real._http.get(f"{self.real.base}/metrics").content, "text/plain")
        else:
            self._send(404, b"{}")

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        if self.path == "/tokenize":
            tok = self.real.tokenizer
            ids = tok.encode_prompt(body["prompt"]) if body.get("add_special_tokens") else tok.encode(body["prompt"])
            self._send(200, json.dumps({"tokens": ids}).encode())
            return
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.end_headers()
        if self.mode == "garbage":
            self.wfile.write(b'data: {"choi\xff\xfe ces\n\n')
            self.wfile.flush()
        else:
            time.sleep(5)


@pytest.fixture()
def fake_server(remotes) -> Iterator[tuple[str, type]]:
    handler = type("H", (_FakeVllm,), {"real": remotes[0], "real_root": Path(remotes[0].model),
                                       "mode": "garbage"})
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    srv.daemon_threads = True
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}/v1", handler
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.mark.parametrize("mode", ["garbage", "stall"])
def test_garbage_or_silence_from_a_server_reroutes_to_the_other(remotes, fake_server, mode):
    url, handler = fake_server
    handler.mode = mode
    fake = RemoteVllmEngine({"url": url, "stall_timeout_s": 1.0})
    a = remotes[0]
    pool = EnginePool({"fake": fake, "a": a})
    rids = [f"fk-{t}-{s}" for t, s in IDENTITY_CASES[:3]]
    planner, disp = serve_on_pool(pool, rids)
    assert "fake" in pool.down
    assert ("malformed stream data" if mode == "garbage" else "slow: nothing streamed") in pool.down["fake"]
    assert pool.counters.lost >= 1
    assert sum(planner.generations[r].engine_lost for r in rids) >= 1
    assert_same_as_reference(planner, disp, references(a, rids))


def test_garbage_from_the_only_server_fails_requests_with_the_reason(fake_server):
    url, handler = fake_server
    handler.mode = "garbage"
    fake = RemoteVllmEngine({"url": url})
    disp = RecordingDispatcher()
    prompts = prompt_builder(fake)
    planner = make_planner(fake, disp, prompts)
    assert planner.submit(lrtrace_request("T1", 0, "only-1")).accepted
    drive(planner, timeout_s=30)
    g = planner.generations["only-1"]
    assert g.state is GenState.FAILED
    assert "malformed stream data" in g.reason and url in g.reason
    fake.shutdown()


# ------------------------------------------------------------------ configuration and the demo

def test_engines_from_config_build_a_pool_and_name_a_bad_entry(vllm_servers):
    from timelyllm_ros.engines.fleet_config import build_engine, parse_engines

    urls = [s.url for s in vllm_servers]
    pool = build_engine(parse_engines(f"[{{kind: openai, url: {urls[0]}}}, {{kind: openai, url: {urls[1]}}}]"))
    try:
        assert isinstance(pool, EnginePool) and pool.members() == urls
    finally:
        pool.shutdown()
    down = f"http://127.0.0.1:{free_port()}/v1"
    with pytest.raises(EngineError, match=rf"engine '{down}' \(openai\): cannot reach vLLM server"):
        build_engine(parse_engines([{"kind": "openai", "url": urls[0]}, {"kind": "openai", "url": down,
                                                                        "timeout_s": 2}]))


def test_demo_serves_on_running_servers(vllm_servers, tmp_path):
    import subprocess
    import sys

    out = tmp_path / "demo"
    cmd = [sys.executable, "-m", "timelyllm_ros.cli", "demo", "--duration", "4", "--out", str(out)]
    for s in vllm_servers:
        cmd += ["--engine-url", s.url]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    doc = json.loads((out / "results.json").read_text())
    states = doc["metrics"]["overall"]["states"]
    assert doc["engine_urls"] == [s.url for s in vllm_servers]
    assert sum(states.values()) >= 1 and set(states) == {"finished"}, states
    down = f"http://127.0.0.1:{free_port()}/v1"
    r = subprocess.run([sys.executable, "-m", "timelyllm_ros.cli", "demo", "--engine-url", down, "--out",
                        str(tmp_path / "down")], capture_output=True, text=True, timeout=120)
    err = [line for line in (r.stdout + r.stderr).splitlines() if "timelyllm demo:" in line]
    assert r.returncode == 1 and len(err) == 1 and f"cannot reach vLLM server {down}" in err[0], r.stdout


# ------------------------------------------------------------------ last: kill a server mid-run

def test_killing_one_server_mid_run_moves_its_generations_to_the_other(vllm_servers, remotes):
    a, b = remotes
    pool = EnginePool({"a": a, "b": b})
    rids = [f"kill-{t}-{s}" for t, s in IDENTITY_CASES]
    killed = []

    def kill_when_b_is_busy(planner) -> bool:
        on_b = [g for g in planner.live() if pool.member_of(g.gen_id) == "b" and g.output_ids]
        if on_b and not killed:
            vllm_servers[1].kill()
            killed.append([g.gen_id for g in on_b])
        return bool(killed)

    planner, disp = serve_on_pool(pool, rids, kill_after=kill_when_b_is_busy)
    assert not vllm_servers[1].alive
    assert "b" in pool.down and "b" not in pool.members()
    assert pool.counters.lost >= 1
    assert all(planner.generations[r].state.terminal for r in rids)
    moved = [r for r in killed[0] if planner.generations[r].engine_lost]
    assert moved, "no generation was running on the killed server"
    assert_same_as_reference(planner, disp, references(a, rids))
