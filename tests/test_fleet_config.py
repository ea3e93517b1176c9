"""Engine lists in configuration (engines/fleet_config.py): every mistake is a one-line error that
names the entry, found before any engine starts.  Building from real servers is tested in
test_vllm_remote.py."""

from __future__ import annotations

import pytest

from timelyllm_ros.engines.fleet_config import parse_engines
from timelyllm_ros.nodes.params import ConfigError
from timelyllm_ros.nodes.wiring import build_planner


def test_entries_parse_from_lists_yaml_text_and_files(tmp_path):
    entries = [{"kind": "openai", "url": "http://gpu1:8000/v1"}, {"kind": "vllm", "model": "m", "name": "local"}]
    assert parse_engines(entries) == entries
    assert parse_engines("[{kind: openai, url: http://gpu1:8000/v1}, {kind: vllm, model: m, name: local}]") == entries
    f = tmp_path / "fleet.yaml"
    f.write_text("engines:\n  - {kind: openai, url: http://gpu1:8000/v1}\n  - {kind: vllm, model: m, name: local}\n")
    assert parse_engines(str(f)) == entries


@pytest.mark.parametrize("value,message", [
    ("", "empty engine list"),
    ("[]", "non-empty list of engines"),
    ("{kind: openai}", "non-empty list of engines"),
    ("[{kind: tgi, url: http://x/v1}]", r"engines\[0\]: kind must be one of \['vllm', 'openai'\]"),
    ("[{kind: openai}]", r"engines\[0\]: an openai engine needs `url"),
    ("[{kind: openai, url: http://x/v1, timeout: 3}]", r"engines\[0\]: unknown openai engine keys \['timeout'\]"),
    ("[{kind: vllm, model: m, gpu: 1}]", r"engines\[0\]: unknown vllm engine keys \['gpu'\]"),
    ("[{kind: openai, url: http://x/v1}, {kind: openai, url: http://x/v1}]", "engine names must be unique"),
    ("[5]", r"engines\[0\]: an engine is a mapping"),
    ("[{kind: openai, url: [}", "not YAML"),
    ("missing.yaml", "cannot read missing.yaml"),
])
def test_bad_entries_are_clear_errors(value, message):
    with pytest.raises(ValueError, match=message):
        parse_engines(value)


def test_planner_parameters_validate_engines_before_starting_anything():
    with pytest.raises(ConfigError, match="engines is for engine: vllm"):
        build_planner({"engines": "[{kind: openai, url: http://x/v1}]"})
    with pytest.raises(ConfigError, match=r"engines\[0\]: kind must be one of"):
        build_planner({"engine": "vllm", "engines": "[{kind: nope}]"})
