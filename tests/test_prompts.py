"""PromptBuilder (shared per-type prefix, result annotations) and the bundled tiny planner model."""

from __future__ import annotations

import json

import pytest

from timelyllm_ros.core.robots import load_robots
from timelyllm_ros.core.tuf import TUF
from timelyllm_ros.core.types import PlanRequest, Segment, SkillCall
from timelyllm_ros.workloads.catalog import check_plan, load_tasks
from timelyllm_ros.prompts import (ANSWER_CUE, DEFAULT_MODEL_DIR, PromptBuilder, PromptError, request_text,
                                   result_text, skill_line)

tokenizers = pytest.importorskip("tokenizers")
from timelyllm_ros.prompts import TokenizerFile, default_prompt_builder  # noqa: E402

ROBOTS = load_robots()
TASKS = load_tasks(robots=ROBOTS)


def req(tid: str, scene_idx: int = 0, rid: str = "r1") -> PlanRequest:
    t = TASKS[tid]
    return PlanRequest(request_id=rid, robot_id="bot0", robot_type=t.robot_type, task=t.task,
                       scene=t.scenes[scene_idx].scene, tuf=TUF(ert=1.0, alpha=-2.0, beta=1.0), arrival=0.0,
                       task_type=tid, category=t.category)


def seg(text: str, blocking: bool) -> Segment:
    return Segment(index=0, text=text, calls=(SkillCall("scan", "s", ("cat",)),), blocking=blocking,
                   token_count=5, gen_start=0.0, gen_end=0.1, est_exec_s=1.0)


@pytest.fixture(scope="module")
def pb() -> PromptBuilder:
    return default_prompt_builder(ROBOTS)


def test_prefix_is_a_token_prefix_of_every_request(pb):
    for rt in ("tello", "arm", "chat"):
        prefix = pb.prefix_ids(rt)
        assert prefix[0] == pb.bos_id
        assert len(prefix) >= 3 * 32  # several full 32-token KV blocks can be shared
        reqs = [req(tid, i, f"r{tid}{i}") for tid, t in TASKS.items() if t.robot_type == rt for i in range(5)]
        ids = [pb.prompt_ids(r) for r in reqs]
        assert all(x[: len(prefix)] == prefix for x in ids)
        assert len({tuple(x[len(prefix):]) for x in ids}) == len(ids)  # the rest differs per request
        # the per-request part is exactly the encoded task + scene + answer cue
        assert ids[0][len(prefix):] == pb.tokenizer.encode(request_text(reqs[0].task, reqs[0].scene))
    assert pb.prefix_ids("tello") != pb.prefix_ids("arm")


def test_prefix_lists_every_skill_in_typefly_format(pb):
    text = pb.prefix_text("tello")
    for name in ROBOTS["tello"].skills:
        assert skill_line(ROBOTS["tello"], name) in text
    assert "abbr:mf,name:move_forward,args:[distance:int(20..500)],description:" in text
    assert "abbr:s,name:scan,args:[object:str],returns:bool," in text
    assert text.endswith("\n") and ANSWER_CUE not in text.splitlines()[-1]
    # prefix text is stable (built once) and the returned ids are a copy
    ids = pb.prefix_ids("arm")
    ids.append(-1)
    assert pb.prefix_ids("arm")[-1] != -1


def test_unknown_robot_type_and_missing_tokenizer():
    pb = PromptBuilder(ROBOTS, None)
    with pytest.raises(PromptError, match="unknown robot type 'boat'"):
        pb.prefix_text("boat")
    with pytest.raises(PromptError, match="no tokenizer"):
        pb.prefix_ids("tello")


def test_result_annotation(pb):
    r = req("T1", 3)
    assert pb.tokenizer.decode(pb.result_ids(r, seg("s('cat');", True), True)) == "#True\n"
    assert pb.tokenizer.decode(pb.result_ids(r, seg("s('cat');", True), False)) == "#False\n"
    assert pb.result_ids(r, seg("mf(50);", False), None) == []
    assert pb.result_ids(req("C1"), seg("It is sunny.", True), True) == []
    assert result_text(0.4567) == "#0.46\n"
    assert result_text(float("nan")) == "#None\n"
    assert result_text("a red\ncat # here") == "#a red cat here\n"
    assert len(result_text("x" * 500)) == 62


def test_tokenizer_files_are_plain_fast_tokenizer_files():
    cfg = json.loads((DEFAULT_MODEL_DIR / "tokenizer_config.json").read_text())
    assert cfg["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert json.loads((DEFAULT_MODEL_DIR / "special_tokens_map.json").read_text())["eos_token"] == "</s>"
    tok = TokenizerFile()
    plan = "hm;dt('green box');pk('green box');pl('red box');mt(-30,55,10);hm;"
    assert tok.decode(tok.encode(plan)) == plan
    # statements end on token boundaries: encoding them one by one equals encoding the plan
    parts = ["hm;", "dt('green box');", "pk('green box');", "pl('red box');", "mt(-30,55,10);", "hm;"]
    assert sum((tok.encode(p) for p in parts), []) == tok.encode(plan)


def test_model_directory_is_small_and_complete():
    files = {p.name: p.stat().st_size for p in DEFAULT_MODEL_DIR.iterdir()}
    for f in ("config.json", "model.safetensors", "generation_config.json", "tokenizer.json"):
        assert f in files
    assert sum(files.values()) <= 20 * 1024 * 1024
    cfg = json.loads((DEFAULT_MODEL_DIR / "config.json").read_text())
    assert cfg["hidden_size"] // cfg["num_attention_heads"] >= 64  # vLLM CPU attention
    assert cfg["max_position_embeddings"] >= 1024


def test_committed_model_writes_valid_plans(pb):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.set_num_threads(2)
    model = transformers.LlamaForCausalLM.from_pretrained(DEFAULT_MODEL_DIR, dtype=torch.bfloat16).eval()
    eos = pb.tokenizer.eos_token_id
    for tid, idx in (("T1", 3), ("T6", 0), ("T11", 0)):
        r = req(tid, idx)
        ids = torch.tensor([pb.prompt_ids(r)])
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=160, do_sample=False, eos_token_id=eos,
                                 pad_token_id=pb.tokenizer.eos_token_id)
        new = out[0, ids.shape[1]:].tolist()
        assert new[-1] == eos, f"{tid}: no EOS"
        plan = pb.tokenizer.decode(new)
        check_plan(plan, ROBOTS[r.robot_type])  # raises PlanError if invalid
        assert plan.startswith(("s(", "g(", "mb(", "mf(", "ml(", "mr(", "hm;"))
