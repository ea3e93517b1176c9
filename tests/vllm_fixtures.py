"""Session-scoped real vLLM engine for the tests (register with `pytest_plugins`).

One engine per test session: vLLM-cpu takes ~20 s to start, so every vLLM test shares it and the
fixture shuts it down at the end (keeps vLLM's exit-time logging quiet).  The engine serves the
bundled tiny planner model (`models/tiny-planner`) when it exists; otherwise the fixture builds a
random-init tiny Llama once per session so the adapter is still exercised against real vLLM.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

REPO = Path(__file__).resolve().parent.parent
TINY_PLANNER = REPO / "models" / "tiny-planner"

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


def model_for_tests() -> tuple[Path, str]:
    """(model dir, which): $TIMELYLLM_TEST_MODEL if set, else the bundled tiny planner if
    present, else a freshly built random one."""
    env = os.environ.get("TIMELYLLM_TEST_MODEL")
    if env:
        return Path(env), f"$TIMELYLLM_TEST_MODEL={env}"
    if (TINY_PLANNER / "config.json").is_file():
        return TINY_PLANNER, "models/tiny-planner"
    tmp = Path(tempfile.mkdtemp(prefix="timelyllm-random-llama-"))
    return build_random_llama(tmp / "model"), "random-init tiny Llama (models/tiny-planner absent)"


def engine_config(model: Path, **extra: object) -> dict[str, object]:
    cfg: dict[str, object] = {
        "model": str(model), "dtype": "float32", "max_num_seqs": 8, "block_size": 32,
        "kv_cache_space_gib": 1, "enforce_eager": True, "seed": 0,
    }
    cfg.update(extra)
    return cfg


@pytest.fixture(scope="session")
def vllm_engine() -> Iterator["object"]:
    """A real VllmEngine over vLLM(-cpu), shared by the session and shut down at its end."""
    pytest.importorskip("vllm", reason="vLLM is not installed in this interpreter")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from timelyllm_ros.engines.vllm_engine import VllmEngine

    model, which = model_for_tests()
    print(f"\n[vllm_fixtures] serving {which}: {model}")
    eng = VllmEngine(engine_config(model))
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
