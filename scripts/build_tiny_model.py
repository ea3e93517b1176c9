#!/usr/bin/env python3
"""Build the bundled tiny planner model (tokenizer + LlamaForCausalLM) from synthetic LRTrace data.

No downloads: the tokenizer is a byte-level BPE trained here on the prompt text and synthetic
examples, and the model is trained from scratch on (shared prefix + task + scene) -> plan + EOS,
with the loss on the plan tokens only (result annotations `#True\\n`/`#False\\n` after blocking
calls are input, not targets).  Deterministic for a given seed and thread count, CPU only.

Every step trains one robot type: its fixed prefix is run once (no gradient through it), its KV
cache is repeated over the batch, and the batch's request + plan tokens attend to it — exactly the
prompt layout vLLM serves, at a fraction of the cost of repeating the prefix per example.

    .venv/bin/python scripts/build_tiny_model.py --out models/tiny-planner
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402

from timelyllm_ros.core.robots import load_robots  # noqa: E402
from timelyllm_ros.workloads.catalog import load_tasks  # noqa: E402
from timelyllm_ros.workloads.examples import RULES, generate, held_out, outcome_paths  # noqa: E402
from timelyllm_ros.prompts import PromptBuilder, request_text, result_text  # noqa: E402

SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]
# Pre-tokenisation: letters, digits, punctuation runs and whitespace are separate pieces.  Unlike
# GPT-2, a word never carries its leading space, so "cat" in the scene ("objects: sofa, cat") and
# in the plan ("g('cat');") is the same token and copying it is a plain induction step (a tiny
# model learns that far faster than a " cat" -> "cat" mapping per word).  No English contractions
# either ('s 't would split MiniSpec strings such as 'scissors').  Statements end on a piece
# boundary (";" is followed by a letter or the end), so encoding statements one by one equals
# encoding the plan.
SPLIT = r"\p{L}+|\p{N}+|[^\s\p{L}\p{N}]+|\s+"
# GPT-2 style (words carry their leading space); kept to reproduce earlier builds.
SPLIT_SPACE_WORDS = r" ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"


def make_tokenizer(corpus: list[str], vocab_size: int, split: str = SPLIT) -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(split), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus, trainer=trainer)
    return tok


class Enc:
    def __init__(self, tok: Tokenizer) -> None:
        self.tok = tok

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids


def example_ids(enc: Enc, ex, path, eos: int) -> tuple[list[int], list[int]]:
    """Request + plan ids and labels (-100 = no loss) for one example along one outcome path."""
    ids = enc.encode(request_text(ex.task, ex.scene))
    labels = [-100] * len(ids)
    if ex.reply:
        p = enc.encode(ex.reply)
        ids += p
        labels += p
    else:
        for stmt, result in path:
            s = enc.encode(stmt)
            ids += s
            labels += s
            if result is not None:
                r = enc.encode(result_text(result))
                ids += r
                labels += [-100] * len(r)
    ids.append(eos)
    labels.append(eos)
    return ids, labels


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ROOT / "models" / "tiny-planner"))
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--steps", type=int, default=1400)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--vocab", type=int, default=1536)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--short-frac", type=float, default=0.5, help="share of steps without the prefix")
    ap.add_argument("--pretok", default="plain", choices=["plain", "space-words"],
                    help="plain: words without leading spaces (default); space-words: GPT-2 style")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--time-budget-s", type=float, default=3600.0, help="stop training early past this")
    args = ap.parse_args()

    t0 = time.monotonic()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    robots = load_robots()
    tasks = load_tasks(robots=robots)
    excluded = {(i.task_id, i.scene) for i in held_out(tasks)}  # evaluation scenes: never trained on
    by_type: dict[str, list[str]] = {}
    for tid, rule in RULES.items():
        by_type.setdefault(rule.robot_type, []).append(tid)

    # ---- tokenizer ------------------------------------------------------------------------
    pb_text = PromptBuilder(robots, None)
    corpus = [pb_text.prefix_text(rt) for rt in by_type] * 4
    crng = random.Random(args.seed + 1)
    for _ in range(3000):
        tid = crng.choice(list(RULES))
        ex = generate(tid, crng)
        if (tid, ex.scene) in excluded:
            continue
        corpus.append(request_text(ex.task, ex.scene) + (ex.reply or "".join(
            s + (result_text(r) if r is not None else "") for s, r in outcome_paths(ex.steps, crng))))
    corpus += [result_text(v) for v in (True, False, None, 0.5)] * 50
    tok = make_tokenizer(corpus, args.vocab, SPLIT if args.pretok == "plain" else SPLIT_SPACE_WORDS)
    enc = Enc(tok)
    pad, bos, eos = (tok.token_to_id(t) for t in ("<pad>", "<s>", "</s>"))
    pb = PromptBuilder(robots, enc, bos_id=bos)
    prefix = {rt: pb.prefix_ids(rt) for rt in by_type}
    print(f"tokenizer: vocab {tok.get_vocab_size()}; prefix tokens "
          + ", ".join(f"{rt} {len(p)}" for rt, p in prefix.items()), flush=True)

    # ---- model ----------------------------------------------------------------------------
    heads = args.hidden // 64
    cfg = LlamaConfig(vocab_size=tok.get_vocab_size(), hidden_size=args.hidden,
                      intermediate_size=int(args.hidden * 2.6875), num_hidden_layers=args.layers,
                      num_attention_heads=heads, num_key_value_heads=heads, head_dim=64,
                      max_position_embeddings=2048, rms_norm_eps=1e-5, tie_word_embeddings=True,
                      bos_token_id=bos, eos_token_id=eos, pad_token_id=pad)
    model = LlamaForCausalLM(cfg)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params / 1e6:.2f} M parameters", flush=True)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.98), weight_decay=0.01)
    warm = max(1, args.steps // 20)

    def lr_at(step: int) -> float:
        if step < warm:
            return args.lr * (step + 1) / warm
        frac = (step - warm) / max(1, args.steps - warm)
        return args.lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * frac)))

    type_weights = {"tello": 0.45, "arm": 0.35, "chat": 0.2}
    types = [t for t in type_weights if t in by_type]
    model.train()
    t_train = time.monotonic()
    ema = None
    step = 0
    for step in range(args.steps):
        rt = rng.choices(types, weights=[type_weights[t] for t in types])[0]
        seqs = []
        while len(seqs) < args.batch:
            tid = rng.choice(by_type[rt])
            ex = generate(tid, rng)
            if (tid, ex.scene) in excluded:
                continue
            seqs.append(example_ids(enc, ex, outcome_paths(ex.steps, rng), eos))
        L = max(len(i) for i, _ in seqs)
        x = torch.full((args.batch, L), pad, dtype=torch.long)
        y = torch.full((args.batch, L), -100, dtype=torch.long)
        m = torch.zeros((args.batch, L), dtype=torch.long)
        for b, (ids, lab) in enumerate(seqs):
            x[b, : len(ids)] = torch.tensor(ids)
            y[b, : len(lab)] = torch.tensor(lab)
            m[b, : len(ids)] = 1
        if args.short_frac > 0 and rng.random() < args.short_frac:
            # Short context (<s> + request + plan): the model learns to read the scene without
            # ~500-900 prefix tokens diluting attention, then keeps that skill under the prefix.
            x = torch.cat([torch.full((args.batch, 1), bos, dtype=torch.long), x], dim=1)
            y = torch.cat([torch.full((args.batch, 1), -100, dtype=torch.long), y], dim=1)
            m = torch.cat([torch.ones((args.batch, 1), dtype=torch.long), m], dim=1)
            logits = model(input_ids=x, attention_mask=m).logits
        else:
            p = torch.tensor([prefix[rt]])
            with torch.no_grad():  # stop-gradient on the shared prefix (as Transformer-XL memory):
                cache = model(input_ids=p, use_cache=True).past_key_values  # its KV is input only
            cache.batch_repeat_interleave(args.batch)
            am = torch.cat([torch.ones((args.batch, p.shape[1]), dtype=torch.long), m], dim=1)
            logits = model(input_ids=x, attention_mask=am, past_key_values=cache, use_cache=True).logits
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                                 y[:, 1:].reshape(-1), ignore_index=-100)
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        ema = loss.item() if ema is None else 0.95 * ema + 0.05 * loss.item()
        if step % 25 == 0 or step == args.steps - 1:
            print(f"step {step:4d} {rt:5s} loss {loss.item():.4f} ema {ema:.4f} "
                  f"lr {lr_at(step):.2e} {time.monotonic() - t_train:6.1f}s", flush=True)
        if time.monotonic() - t0 > args.time_budget_s:
            print(f"time budget reached at step {step}", flush=True)
            break
    train_s = time.monotonic() - t_train

    # ---- save -----------------------------------------------------------------------------
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.eval()
    dtype = getattr(torch, args.dtype)
    model.to(dtype)
    model.generation_config.bos_token_id = bos
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = pad
    model.generation_config.do_sample = False
    model.save_pretrained(out_dir, safe_serialization=True)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>", unk_token="<unk>", model_max_length=2048)
    fast.save_pretrained(out_dir)
    # Plain PreTrainedTokenizerFast files, readable by older transformers / vLLM releases too.
    tc_path = out_dir / "tokenizer_config.json"
    tc = json.loads(tc_path.read_text())
    tc["tokenizer_class"] = "PreTrainedTokenizerFast"
    tc.pop("backend", None)
    tc.update(add_bos_token=False, add_eos_token=False, clean_up_tokenization_spaces=False)
    tc_path.write_text(json.dumps(tc, indent=2) + "\n")
    (out_dir / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>"}, indent=2) + "\n")
    meta = {"seed": args.seed, "steps": step + 1, "batch": args.batch, "lr": args.lr, "threads": args.threads,
            "short_frac": args.short_frac, "pretok": args.pretok,
            "train_s": round(train_s, 1), "total_s": round(time.monotonic() - t0, 1),
            "final_loss_ema": round(ema or 0.0, 4), "parameters": n_params, "dtype": args.dtype,
            "prefix_tokens": {rt: len(p) for rt, p in prefix.items()}, "torch": torch.__version__}
    (out_dir / "build_info.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(json.dumps(meta), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
