"""Engines from configuration: `engines: [{kind: vllm, model: ...}, {kind: openai, url: ...}]`.

One entry builds that engine; several build an `EnginePool` behind the one planner.  Every entry
is checked before anything starts (a typo must not cost a vLLM start), then the engines are built
in order; an engine that cannot start (a server that is down, a wrong model behind a URL) stops
the whole build with an error naming the entry, and the engines already built are shut down.
All engines must tokenise like the first one: the planner builds one prompt for all of them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml

from ..core.engine import Engine, EngineError

KINDS = ("vllm", "openai")


def parse_engines(value: Any, source: str = "engines") -> list[dict[str, Any]]:
    """The engine entries of `value`: a list of mappings, a YAML/JSON string of one, or the path
    of a YAML file holding one (or a mapping with an `engines:` key).  ValueError says what is
    wrong and where."""
    if isinstance(value, str):
        text = value.strip()
        if not text:
            raise ValueError(f"{source}: empty engine list")
        path = Path(text).expanduser()
        if not text.startswith(("[", "{", "-")) and path.suffix in (".yaml", ".yml", ".json"):
            try:
                text = path.read_text()
            except OSError as e:
                raise ValueError(f"{source}: cannot read {text}: {e.strerror or e}") from e
            source = str(path)
        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ValueError(f"{source}: not YAML: {e}") from e
    if isinstance(value, Mapping) and "engines" in value:
        value = value["engines"]
    if not isinstance(value, list) or not value:
        raise ValueError(f"{source}: expected a non-empty list of engines like "
                         f"[{{kind: openai, url: http://gpu1:8000/v1}}], got {str(value)[:80]!r}")
    out = []
    for i, entry in enumerate(value):
        where = f"{source}[{i}]"
        if not isinstance(entry, Mapping):
            raise ValueError(f"{where}: an engine is a mapping with `kind`, got {entry!r}")
        kind = entry.get("kind")
        if kind not in KINDS:
            raise ValueError(f"{where}: kind must be one of {list(KINDS)}, got {kind!r}")
        keys = set(entry) - {"kind", "name"}
        valid = set(_config_keys(kind))
        if keys - valid:
            raise ValueError(f"{where}: unknown {kind} engine keys {sorted(keys - valid)}; valid: {sorted(valid)}")
        if kind == "openai" and not entry.get("url"):
            raise ValueError(f"{where}: an openai engine needs `url: http://HOST:PORT/v1`")
        out.append(dict(entry))
    names = [engine_name(e, i) for i, e in enumerate(out)]
    if len(set(names)) != len(names):
        raise ValueError(f"{source}: engine names must be unique, got {names}")
    return out


def _config_keys(kind: str) -> Sequence[str]:
    if kind == "vllm":
        from .vllm_engine import CONFIG_KEYS
    else:
        from .openai_remote import CONFIG_KEYS
    return list(CONFIG_KEYS)


def engine_name(entry: Mapping[str, Any], i: int) -> str:
    return str(entry.get("name") or (entry["url"] if entry["kind"] == "openai" else f"vllm{i}"))


def with_scheduling(entries: Sequence[Mapping[str, Any]], scheduling: str) -> list[dict[str, Any]]:
    """The entries for a policy whose engines schedule by `scheduling` (`Policy.engine_scheduling`):
    "priority" (vllm-priority) starts local vLLM engines with scheduling_policy: priority and
    declares remote ones so (their server must run `--scheduling-policy priority`); an entry that names its own scheduling_policy keeps it
    (the planner then refuses a mismatch)."""
    if scheduling == "fcfs":
        return [dict(e) for e in entries]
    return [{**e, "scheduling_policy": e.get("scheduling_policy", scheduling)} for e in entries]


def build_engine(entries: Sequence[Mapping[str, Any]], *, vllm_defaults: Mapping[str, Any] | None = None) -> Engine:
    """One engine, or a pool of several, from parsed entries (see `parse_engines`)."""
    built: dict[str, Engine] = {}
    try:
        for i, entry in enumerate(entries):
            name = engine_name(entry, i)
            cfg = {k: v for k, v in entry.items() if k not in ("kind", "name")}
            try:
                if entry["kind"] == "vllm":
                    from .vllm_engine import VllmEngine
                    built[name] = VllmEngine({**(vllm_defaults or {}), **cfg})
                else:
                    from .openai_remote import RemoteVllmEngine
                    built[name] = RemoteVllmEngine(cfg)
            except EngineError as e:
                raise EngineError(f"engine {name!r} ({entry['kind']}): {e}") from e
        _check_same_tokenizer(built)
    except BaseException:
        for e in built.values():
            e.shutdown()
        raise
    if len(built) == 1:
        return next(iter(built.values()))
    from .pool import EnginePool
    return EnginePool(built)


PROBES = ("mf(50);tc(90);?iv('cat')==True{g('cat');}", "Look for the cat in the living room.")


def _check_same_tokenizer(engines: Mapping[str, Engine]) -> None:
    items = list(engines.items())
    first_name, first = items[0]
    for name, e in items[1:]:
        for p in PROBES:
            a, b = first.tokenizer.encode(p), e.tokenizer.encode(p)
            if a != b:
                raise EngineError(f"engines {first_name!r} and {name!r} tokenise differently ({p!r}: "
                                  f"{a[:8]} vs {b[:8]}): one planner needs one tokenizer; serve the same model")
