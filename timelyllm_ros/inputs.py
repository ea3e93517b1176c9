"""What a user hands a command, checked before anything expensive starts.

Every entry point — `timelyllm bench`, `timelyllm demo` (whatever its mode), the ROS planner
node's parameters (`nodes/wiring.py`) — checks its inputs through these functions, so a bad input
gets the same one-line message everywhere: an ``InputError`` naming the argument, or the file and
line.  The CLI prints it on stderr and exits 2; the ROS node logs it and exits 2.
"""

from __future__ import annotations

import inspect
import re
import tempfile
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from .core.robots import ROBOTS_DIR, RobotSpec, RobotSpecError, load_robots


class InputError(ValueError):
    """Bad user input: printed as one line, exit code 2."""

    def __init__(self, message: str) -> None:
        super().__init__(one_line(message))


def one_line(text: str) -> str:
    """Collapse a message onto one line (PyYAML and friends write several)."""
    return " ".join(str(text).split())


# ------------------------------------------------------------------------------------- policies

def check_policies(names: Sequence[str], *, arg: str = "--policy") -> None:
    """Every name is a registered policy, none twice."""
    from .core.policies import policy_names

    known = policy_names()
    for n in names:
        if n not in known:
            raise InputError(f"{arg}: unknown policy {n!r}; choose from {', '.join(known)}")
    dup = sorted({n for n in names if list(names).count(n) > 1})
    if dup:
        raise InputError(f"{arg}: policy {dup[0]!r} given twice")


def policy_param_names(name: str) -> list[str] | None:
    """The keyword parameters the policy's factory takes, or None when it takes any (``**kw``)."""
    from .core.policies import policy_factory

    try:
        sig = inspect.signature(policy_factory(name))
    except (TypeError, ValueError):
        return None
    params = [p for p in sig.parameters.values() if not p.name.startswith("_")]
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    return [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


_EXP_FLOAT = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)[eE][+-]?\d+")  # 1e9, 2E-3, .5e1: floats YAML 1.1 misses


def parse_policy_param(s: str) -> tuple[str | None, str, Any]:
    """``[policy:]name=value`` with a YAML value (numbers, booleans, strings; ``inf`` / ``-inf``
    as YAML's ``.inf`` / ``-.inf``, the "no limit" several parameters document); without a policy
    the parameter goes to every policy it is given to (`params_for`).  InputError if malformed."""
    import yaml

    if "=" not in s:
        raise InputError(f"expected [policy:]name=value, got {s!r}")
    k, v = s.split("=", 1)
    policy, _, k = k.rpartition(":")
    if not k.strip() or (_ and not policy.strip()):
        raise InputError(f"expected [policy:]name=value, got {s!r}")
    try:
        value = yaml.safe_load(v)
    except yaml.YAMLError as e:
        raise InputError(f"bad value in {s!r}: {one_line(str(e))}") from None
    if isinstance(value, str) and (value.strip().lower().lstrip("+-") in ("inf", "infinity")
                                   or _EXP_FLOAT.fullmatch(value.strip())):
        value = float(value)  # (YAML 1.1 reads a float only with a dot: "1e9" would stay a string)
    return policy.strip() or None, k.strip(), value


def params_for(policy: str, params: Sequence[tuple[str | None, str, Any]]) -> dict[str, Any]:
    """The parsed policy parameters that reach one policy (its own and the unscoped ones)."""
    return {k: v for pol, k, v in params if pol in (None, policy)}


def check_policy_param_names(name: str, params: Iterable[str], *, arg: str = "--param") -> None:
    """Every name is a parameter of the policy (by its factory's signature; nothing is built)."""
    known = policy_param_names(name)
    unknown = sorted(set(params) - set(known)) if known is not None else []
    if unknown:
        listed = ", ".join(known) if known else "none"
        raise InputError(f"{arg}: bad parameters for policy {name!r}: unknown parameter {unknown[0]!r} "
                         f"(its parameters: {listed})")


def check_policy_params(name: str, params: Mapping[str, Any], *, arg: str = "--param") -> None:
    """The parameters are the policy's own (by name) and it accepts their values: the policy is
    built once with them (cheap: policies hold no engine state)."""
    from .core.policies import make_policy

    check_policy_param_names(name, params, arg=arg)
    try:
        make_policy(name, **dict(params))
    except ValueError as e:
        m = re.search(r"unexpected keyword argument '(\w+)'", str(e))
        if m:
            raise InputError(f"{arg}: bad parameters for policy {name!r}: unknown parameter {m.group(1)!r}") from None
        raise InputError(f"{arg}: {e}" if "policy" in str(e) else f"{arg}: policy {name!r}: {e}") from None
    except Exception as e:  # noqa: BLE001 - a value of the wrong type fails inside the policy
        raise InputError(f"{arg}: bad value for policy {name!r}: {type(e).__name__}: {e}") from None


def check_run_params(policies: Sequence[str], params: Sequence[tuple[str | None, str, Any]], *,
                     arg: str = "--param") -> None:
    """Parsed ``--param`` values of a run of `policies`: a scoped one names a policy of the run,
    and every policy accepts the names and values that reach it (`check_policy_params`)."""
    stray = sorted({pol for pol, _, _ in params if pol is not None} - set(policies))
    if stray:
        raise InputError(f"{arg} names policies not in this run: {stray}; run: {list(policies)}")
    for name in policies:
        check_policy_params(name, params_for(name, params), arg=arg)


# ------------------------------------------------------------------------- robots and workloads

def robots_from_dirs(extra_dirs: Sequence[str | Path] = (), *, base: str | Path = ROBOTS_DIR) -> dict[str, RobotSpec]:
    """The bundled robots plus those in ``extra_dirs`` (``--robots-dir``)."""
    try:
        return load_robots(base, extra_dirs=extra_dirs)
    except RobotSpecError as e:
        raise InputError(str(e)) from None


def catalog_for(robots: Mapping[str, RobotSpec], files: Sequence[str | Path] | None = None) -> dict[str, Any]:
    from .workloads.format import WorkloadError, default_catalog

    try:
        return default_catalog(robots, files)
    except WorkloadError as e:
        raise InputError(str(e)) from None


def workload_arrivals(workload: str, robots: Mapping[str, RobotSpec], catalog: Mapping[str, Any], *,
                      seed: int | None = None, duration_s: float | None = None) -> tuple[Any, list[Any]]:
    """(workload, its arrivals up to ``duration_s``): the file parsed and expanded, so an unknown
    task or robot type is caught here with its line, not when the request arrives."""
    from .workloads.format import WorkloadError, expand, load_workload

    try:
        wl = load_workload(workload)
        arrivals = expand(wl, catalog, robots, seed=seed)
    except WorkloadError as e:
        raise InputError(str(e)) from None
    if duration_s is not None:
        arrivals = [a for a in arrivals if a.time <= duration_s]
    if not arrivals:
        raise InputError(f"--duration {duration_s:g}: no arrivals of {wl.name} in the first {duration_s:g} s")
    return wl, arrivals


# ------------------------------------------------------------------------------------- engine

# vLLM settings of the demo and the ROS node unless an engine config says otherwise
VLLM_DEFAULTS: dict[str, Any] = {"block_size": 32, "max_num_seqs": 32, "kv_cache_space_gib": 1,
                                 "enforce_eager": True, "max_model_len": 2048, "seed": 0}


def vllm_config(config_path: str | Path | None, model: str | Path | None, *, default_model: str | Path,
                config_arg: str = "--engine-config", model_arg: str = "--model") -> dict[str, Any]:
    """vLLM settings: ``VLLM_DEFAULTS``, then the YAML mapping at ``config_path``, then ``model``
    (else the config's, else ``default_model``); the keys and the model directory are checked
    here, since vLLM takes tens of seconds to start before it would fail on them."""
    import yaml

    from .core.robots import yaml_error_line
    from .engines.base import EngineError
    from .engines.vllm_engine import CONFIG_KEYS, check_model_dir

    cfg = dict(VLLM_DEFAULTS)
    if config_path:
        try:
            extra = yaml.safe_load(Path(config_path).read_text()) or {}
        except OSError as e:
            raise InputError(f"{config_arg} {str(config_path)!r}: {e.strerror or e}") from None
        except yaml.YAMLError as e:
            raise InputError(f"{config_arg} {config_path}{yaml_error_line(e)}") from None
        if not isinstance(extra, dict):
            raise InputError(f"{config_arg} {config_path}: must be a YAML mapping")
        unknown = sorted(set(extra) - set(CONFIG_KEYS))
        if unknown:
            raise InputError(f"{config_arg} {config_path}: unknown keys {unknown}; valid: {sorted(CONFIG_KEYS)}")
        cfg.update(extra)
    cfg["model"] = str(model or cfg.get("model") or default_model)
    try:
        check_model_dir(cfg["model"], allow_hub=bool(cfg.get("allow_hub", False)), cpu=False)
    except EngineError as e:
        raise InputError(f"{model_arg}: {e}") from None
    return cfg


# ------------------------------------------------------------------------------------- outputs

def _probe_dir(d: Path, arg: str, given: Path) -> None:
    """Create ``d`` and write a file in it (os.access says yes to root on read-only mounts)."""
    blocker = next((a for a in (d, *d.parents) if a.exists()), None)
    if blocker is not None and not blocker.is_dir():
        raise InputError(f"{arg} {str(given)!r}: {str(blocker)!r} is a file, not a folder")
    try:
        d.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=d, prefix=".write-test-"):
            pass
    except OSError as e:
        raise InputError(f"{arg} {str(given)!r}: cannot write in {str(d)!r}: {e.strerror or e}") from None


def check_out_dir(path: str | Path, *, arg: str = "--out") -> Path:
    """An output folder that exists (created now) and takes files."""
    d = Path(path)
    if d.exists() and not d.is_dir():
        raise InputError(f"{arg} {str(d)!r}: exists and is not a folder")
    _probe_dir(d, arg, d)
    return d


def check_journal_path(path: str | Path, *, arg: str = "journal_path", create_dir: bool = False) -> Path:
    """A request journal's path: not a folder, not under a file, and in a folder that exists
    (a mistyped folder is not created: an empty journal would recover nothing) unless
    `create_dir`.  The rule itself is `journal.journal_path_problem` (the Journal applies it too)."""
    from .journal import journal_path_problem

    problem = journal_path_problem(path, create_dir=create_dir)
    if problem:
        raise InputError(f"{arg} {str(path)!r}: {problem}")
    return Path(path)


def check_out_file(path: str | Path, *, arg: str = "--out") -> Path:
    """An output file whose folder exists (created now) and takes files."""
    f = Path(path)
    if f.is_dir():
        raise InputError(f"{arg} {str(f)!r}: is a folder, expected a file name")
    _probe_dir(f.parent, arg, f)
    return f


__all__ = ["InputError", "catalog_for", "check_journal_path", "check_out_dir", "check_out_file", "check_policies",
           "check_policy_param_names", "check_policy_params", "one_line", "params_for", "parse_policy_param", "policy_param_names",
           "robots_from_dirs", "vllm_config", "workload_arrivals"]
