#!/usr/bin/env python3
"""Validity of the bundled tiny planner on held-out LRTrace scenes (prints figures, writes JSON).

For every task (T1-T11, C1-C3) it greedily generates plans for the scenes of the task file plus
fresh held-out draws (none of them seen in training), and reports

* valid: the plan parses and conforms to the robot schema (skills, arity, types, ranges;
  chat: 2-5 sentences),
* exact: the plan equals the reference plan of the rules,
* seg-true / seg-false (MiniSpec robots): generation statement by statement, as the planner runs it,
  with each blocking statement's result fed back through `PromptBuilder.result_ids` (all True; or
  the first one False) and resumed from prompt + generated ids; exact match against the expected
  path.

Engines: `vllm` (real vLLM LLM, CPU: VLLM_CPU_KVCACHE_SPACE=1, block_size 32, enforce_eager,
prefix caching on) or `hf` (transformers greedy generate); `auto` tries vLLM first.

    .venv/bin/python benchmarks/model_validity.py --engine vllm --json /tmp/validity.json
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections import defaultdict
from pathlib import Path
from typing import Callable, Sequence

from timelyllm_ros.core.robots import RobotSpec, load_robots  # noqa: E402
from timelyllm_ros.core.segmenter import Segmenter  # noqa: E402
from timelyllm_ros.workloads.catalog import PlanError, check_plan, count_sentences, load_tasks, split_statements  # noqa: E402
from timelyllm_ros.workloads.examples import EvalItem, held_out  # noqa: E402
from timelyllm_ros.prompts import DEFAULT_MODEL_DIR, PromptBuilder, TokenizerFile  # noqa: E402

MAX_TOKENS = {"tello": 64, "arm": 200, "chat": 96}


def plan_ok(text: str, robot: RobotSpec) -> tuple[bool, str]:
    """Valid = conforms to the robot schema; chat replies must also be 2-5 sentences."""
    try:
        check_plan(text, robot)
    except PlanError as e:
        return False, str(e)
    if robot.language == "sentence" and not 2 <= count_sentences(text) <= 5:
        return False, f"{count_sentences(text)} sentences"
    return True, ""


# A "generator" maps a list of (prompt ids, max_tokens, stop_at_statement) to generated ids.
Gen = Callable[[Sequence[list[int]], Sequence[int], bool], list[list[int]]]


def hf_generator(model_dir: Path, threads: int) -> tuple[Gen, str]:
    import torch
    from transformers import LlamaForCausalLM

    torch.set_num_threads(threads)
    model = LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).eval()
    tok = TokenizerFile(model_dir)
    eos = tok.eos_token_id

    @torch.no_grad()
    def run(prompts: Sequence[list[int]], max_tokens: Sequence[int], stop_at_statement: bool) -> list[list[int]]:
        outs = []
        for ids, mt in zip(prompts, max_tokens):
            x = torch.tensor([ids])
            out = model(input_ids=x, use_cache=True)
            cache, new = out.past_key_values, []
            for _ in range(mt):
                nxt = int(out.logits[0, -1].argmax())
                new.append(nxt)
                if nxt == eos or (stop_at_statement and tok.decode([nxt]).rstrip().endswith(";")):
                    break
                out = model(input_ids=torch.tensor([[nxt]]), past_key_values=cache, use_cache=True)
                cache = out.past_key_values
            outs.append(new)
        return outs

    return run, f"transformers {__import__('transformers').__version__} greedy (bf16, CPU)"


def vllm_generator(model_dir: Path, dtype: str | None = None) -> tuple[Gen, str, Callable[[], dict]]:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.platforms import current_platform

    from timelyllm_ros.engines.vllm_engine import cpu_dtype_default

    if dtype is None:  # what serving uses (VllmEngine): float32 on a CPU without bf16 units
        dtype = (cpu_dtype_default() if current_platform.is_cpu() else None) or "auto"
    llm = LLM(model=str(model_dir), enforce_eager=True, block_size=32, enable_prefix_caching=True,
              max_model_len=2048, max_num_seqs=32, seed=0, dtype=dtype)
    stats = {"prompt_tokens": 0, "cached_tokens": 0}

    def run(prompts: Sequence[list[int]], max_tokens: Sequence[int], stop_at_statement: bool) -> list[list[int]]:
        sps = [SamplingParams(temperature=0.0, max_tokens=mt, stop=[";"] if stop_at_statement else None,
                              include_stop_str_in_output=True, skip_special_tokens=True) for mt in max_tokens]
        res = llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], sps, use_tqdm=False)
        out = []
        for p, r in zip(prompts, res):
            stats["prompt_tokens"] += len(p)
            stats["cached_tokens"] += r.num_cached_tokens or 0
            o = r.outputs[0]
            ids = list(o.token_ids)
            if o.finish_reason == "stop" and o.stop_reason is None and (not ids or ids[-1] != llm_eos):
                ids.append(llm_eos)  # EOS is not part of token_ids in some versions
            out.append(ids)
        return out

    llm_eos = TokenizerFile(model_dir).eos_token_id
    import vllm

    return run, (f"vLLM {vllm.__version__} LLM (CPU, dtype {dtype}, block_size 32, enforce_eager, "
                 f"prefix caching)"), lambda: dict(stats)


def segmented(gen: Gen, pb: PromptBuilder, robots: dict[str, RobotSpec], items: Sequence[EvalItem],
              tok: TokenizerFile, first_false: bool) -> list[str]:
    """Generate statement by statement, feeding back blocking results (all True, or first False)."""
    eos = tok.eos_token_id
    states = []
    for it in items:
        prompt = pb.prefix_ids(it.robot_type) + pb.request_ids(it.task, it.scene)
        states.append({"prompt": prompt, "out": [], "text": "", "done": False, "falses": 0, "n": 0})
    for _round in range(40):
        live = [i for i, s in enumerate(states) if not s["done"]]
        if not live:
            break
        res = gen([states[i]["prompt"] + states[i]["out"] for i in live],
                  [min(48, MAX_TOKENS[items[i].robot_type]) for i in live], True)
        for i, new in zip(live, res):
            s, robot = states[i], robots[items[i].robot_type]
            finished = bool(new) and new[-1] == eos
            body = [t for t in new if t != eos]
            s["out"] += body
            piece = tok.decode(body)
            s["text"] += piece
            s["n"] += len(body)
            if finished or not body or s["n"] > MAX_TOKENS[items[i].robot_type]:
                s["done"] = True
                continue
            try:
                stmt = split_statements(piece)
            except PlanError:
                s["done"] = True
                continue
            abbr = stmt[-1].split("(")[0].rstrip(";") if stmt else ""
            skill = robot.by_abbr.get(abbr)
            if skill is not None and skill.blocking:
                value = not (first_false and s["falses"] == 0)
                s["falses"] += 0 if value else 1
                s["out"] += pb.annotation_ids(value)
    return [s["text"] for s in states]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(DEFAULT_MODEL_DIR))
    ap.add_argument("--engine", default="auto", choices=["auto", "vllm", "hf"])
    ap.add_argument("--n-generated", type=int, default=10, help="held-out draws per task (plus the file's)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", default=None, help="vLLM dtype (default: what serving uses here)")
    ap.add_argument("--no-segmented", action="store_true")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    model_dir = Path(args.model)

    robots = load_robots()
    tasks = load_tasks(robots=robots)
    items = held_out(tasks, args.n_generated)
    tok = TokenizerFile(model_dir)
    pb = PromptBuilder(robots, tok, bos_id=tok.bos_token_id)

    t_load = time.monotonic()
    engine_name, cache_stats = "", None
    gen: Gen
    if args.engine in ("auto", "vllm"):
        try:
            gen, engine_name, cache_stats = vllm_generator(model_dir, args.dtype)
        except Exception as e:  # noqa: BLE001 - report and fall back
            if args.engine == "vllm":
                raise
            print(f"vLLM unavailable ({type(e).__name__}: {e}); using transformers", flush=True)
    if not engine_name:
        gen, engine_name = hf_generator(model_dir, args.threads)
    load_s = time.monotonic() - t_load

    t0 = time.monotonic()
    prompts = [pb.prefix_ids(i.robot_type) + pb.request_ids(i.task, i.scene) for i in items]
    outs = gen(prompts, [MAX_TOKENS[i.robot_type] for i in items], False)
    texts = [tok.decode(o) for o in outs]
    whole_s = time.monotonic() - t0

    per: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    failures = []
    for it, text in zip(items, texts):
        ok, why = plan_ok(text, robots[it.robot_type])
        d = per[it.task_id]
        d["n"] += 1
        d["valid"] += ok
        d["exact"] += text == it.plan
        if not ok or text != it.plan:
            failures.append({"task": it.task_id, "scene": it.scene, "expected": it.plan, "got": text,
                             "valid": ok, "why": why})

    # What an unsegmented baseline's model (vllm / vllm-stream: never given a result) writes after a
    # blocking statement: a result of its own (`#...`), or the False path of the task rules (they
    # log `no ... found`), or neither (the all-True plan); the planner holds that continuation
    # until the robot answers (core/speculation.py).
    blind = {"blocking": 0, "written": 0, "false_path": 0}
    for it, text in zip(items, texts):
        robot = robots[it.robot_type]
        if robot.language != "minispec":
            continue
        seg = Segmenter(robot)
        cuts = list(seg.feed(text)) + list(seg.finish())
        if any(c.blocking for c in cuts):
            blind["blocking"] += 1
            blind["written"] += any(c.note for c in cuts)
            blind["false_path"] += "l('no " in text

    seg_s = 0.0
    if not args.no_segmented:
        t1 = time.monotonic()
        ms = [it for it in items if robots[it.robot_type].language == "minispec"]
        seg_true = segmented(gen, pb, robots, ms, tok, first_false=False)
        fs = [it for it in ms if it.false_plan]
        seg_false = segmented(gen, pb, robots, fs, tok, first_false=True)
        for it, text in zip(ms, seg_true):
            per[it.task_id]["seg_true_n"] += 1
            per[it.task_id]["seg_true_exact"] += text == it.plan
        for it, text in zip(fs, seg_false):
            per[it.task_id]["seg_false_n"] += 1
            per[it.task_id]["seg_false_exact"] += text == it.false_plan
            if text != it.false_plan:
                failures.append({"task": it.task_id, "scene": it.scene, "mode": "first blocking call False",
                                 "expected": it.false_plan, "got": text})
        seg_s = time.monotonic() - t1

    def pct(a: int, b: int) -> str:
        return f"{100.0 * a / b:5.1f}%" if b else "    -"

    print(f"engine: {engine_name} (load {load_s:.1f} s; whole plans {whole_s:.1f} s; segmented {seg_s:.1f} s)")
    print(f"{'task':5s} {'n':>3s} {'valid':>7s} {'exact':>7s} {'seg-true':>9s} {'seg-false':>10s}")
    tot: dict[str, int] = defaultdict(int)
    lr_tot: dict[str, int] = defaultdict(int)
    for tid, d in per.items():
        print(f"{tid:5s} {d['n']:3d} {pct(d['valid'], d['n']):>7s} {pct(d['exact'], d['n']):>7s} "
              f"{pct(d['seg_true_exact'], d['seg_true_n']):>9s} {pct(d['seg_false_exact'], d['seg_false_n']):>10s}")
        for k, v in d.items():
            tot[k] += v
            if tid.startswith("T"):
                lr_tot[k] += v
    for name, t in (("LRTrace T1-T11", lr_tot), ("all incl. chat", tot)):
        print(f"{name}: valid {pct(t['valid'], t['n'])} exact {pct(t['exact'], t['n'])} "
              f"seg-true {pct(t['seg_true_exact'], t['seg_true_n'])} seg-false {pct(t['seg_false_exact'], t['seg_false_n'])}"
              f" (n={t['n']})")
    print(f"blind continuations (whole plans, no result given): {blind['blocking']} with a blocking call; "
          f"{blind['written']} write a result (#...); {blind['false_path']} take a False path (l('no ...'))")
    cs = cache_stats() if cache_stats else None
    if cs:
        print(f"prefix cache: {cs['cached_tokens']} of {cs['prompt_tokens']} prompt tokens served from cache")
    for f in failures[:10]:
        print("FAIL", json.dumps(f))
    if args.json:
        Path(args.json).write_text(json.dumps({
            "engine": engine_name, "model": str(model_dir), "per_task": {k: dict(v) for k, v in per.items()},
            "lrtrace": dict(lr_tot), "all": dict(tot), "prefix_cache": cs, "failures": failures,
            "whole_s": whole_s, "segmented_s": seg_s, "blind_continuations": blind}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
