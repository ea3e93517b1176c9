"""The model a vLLM engine serves when none is named: the bundled tiny planner
(`models/tiny-planner`), `$TIMELYLLM_TEST_MODEL` instead when set, and a random-init tiny Llama
built on the spot when the bundled model is absent (so the adapter still runs against real vLLM).

Used by `timelyllm profile fit` (no `--model`), benchmarks/bench_vllm_engine.py and the tests'
session engine (tests/vllm_fixtures.py), with `tiny_engine_config`: the small, reproducible
engine settings the adapter's tests and benchmark run (float32, eager, seed 0).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from ..prompts import DEFAULT_MODEL_DIR as TINY_PLANNER

# A small corpus for the throwaway tokenizer: MiniSpec-like plans and plain English, so both
# statement boundaries (';') and ordinary words tokenize into a handful of ids.
_CORPUS = [
    "mf(50);tc(90);?iv('cat')==True{g('cat');}",
    "s('keys');_1=iv('wallet');?_1==True{g('wallet');tp();}",
    "Look for the cat in the living room and check the book on the cabinet.",
    "Find a toy under the bed; find a tool for cutting paper; avoid the human.",
    "pick('red_block');place('blue_block');stack();clean('desk');",
    "The robot moves forward, turns left, scans the room and reports what it sees.",
]


def build_random_llama(out_dir: Path, *, head_dim: int = 64, heads: int = 4, layers: int = 2,
                       vocab: int = 512, seed: int = 0) -> Path:
    """Write a random-init LlamaForCausalLM + byte-level BPE tokenizer in HF format.

    Used only when the trained tiny planner is absent, and (with head_dim 16) to check that the
    adapter rejects models the CPU attention backend cannot run.
    """
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out_dir.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_CORPUS * 20, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(out_dir)

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=tok.get_vocab_size(), hidden_size=heads * head_dim,
                      intermediate_size=2 * heads * head_dim, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=heads,
                      max_position_embeddings=4096, bos_token_id=0, eos_token_id=1,
                      tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():  # larger-than-default weights: sharper logits, fewer greedy near-ties
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.2)
    model.save_pretrained(out_dir, safe_serialization=True)
    return out_dir


def tiny_model() -> tuple[Path, str]:
    """(model dir, which): $TIMELYLLM_TEST_MODEL if set, else the bundled tiny planner if
    present, else a freshly built random one."""
    env = os.environ.get("TIMELYLLM_TEST_MODEL")
    if env:
        return Path(env), f"$TIMELYLLM_TEST_MODEL={env}"
    if (TINY_PLANNER / "config.json").is_file():
        return TINY_PLANNER, "models/tiny-planner"
    tmp = Path(tempfile.mkdtemp(prefix="timelyllm-random-llama-"))
    return build_random_llama(tmp / "model"), "random-init tiny Llama (models/tiny-planner absent)"


def tiny_engine_config(model: Path, **extra: object) -> dict[str, object]:
    """VllmEngine settings of the adapter's tests and benchmark (float32, eager, seed 0), `extra` on top."""
    cfg: dict[str, object] = {
        "model": str(model), "dtype": "float32", "max_num_seqs": 8, "block_size": 32,
        "kv_cache_space_gib": 1, "enforce_eager": True, "seed": 0,
    }
    cfg.update(extra)
    return cfg
