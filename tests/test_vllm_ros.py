"""The ROS planner node end to end on the real engine: plan requests published on the in-process
transport, the planner node generates with real vLLM(-cpu) (the session's shared `vllm_engine`,
injected through the node's `make_planner`), segments go out as ExecuteSegment goals to the
right robot's executor node, and the RequestStatus stream ends terminal.

Wiring copied (minimally) from tests/test_ros_planner_node.py, which runs the simulated engine.
"""

from __future__ import annotations

import threading
import time

import pytest

pytest.importorskip("rosbags")

from timelyllm_ros.core.clock import WallClock  # noqa: E402
from timelyllm_ros.core.exec_time import ExecTimeEstimator  # noqa: E402
from timelyllm_ros.core.planner import Planner, PlannerConfig  # noqa: E402
from timelyllm_ros.core.policies import make_policy  # noqa: E402
from timelyllm_ros.core.robots import load_robots  # noqa: E402
from timelyllm_ros.core.types import ResultCode  # noqa: E402
from timelyllm_ros.executors.base import ExecutorConfig, SegmentExecutor, SimulatedPerception  # noqa: E402
from timelyllm_ros.executors.simulated import SimulatedBackend  # noqa: E402
from timelyllm_ros.workloads.catalog import load_tasks  # noqa: E402
from timelyllm_ros.nodes.executor_node import ExecutorNode  # noqa: E402
from timelyllm_ros.nodes.dispatcher import DispatcherConfig  # noqa: E402
from timelyllm_ros.nodes.planner_node import PlannerNode, PlannerNodeConfig  # noqa: E402
from timelyllm_ros.prompts import PromptBuilder  # noqa: E402
from timelyllm_ros.ros import interfaces as ifc  # noqa: E402
from timelyllm_ros.transport.inprocess import InProcessBus, InProcessTransport  # noqa: E402

pytestmark = pytest.mark.vllm

ROBOTS = load_robots()
TASKS = load_tasks()


def test_plan_requests_reach_the_right_executors_on_real_vllm(vllm_engine):
    eng = vllm_engine
    clock = WallClock()
    prompts = PromptBuilder(ROBOTS, eng.tokenizer)

    def make_planner(dispatcher, listeners):
        p = Planner(clock=clock, engine=eng, dispatcher=dispatcher, robots=ROBOTS,
                    policy=make_policy("timelyllm"), estimator=ExecTimeEstimator(ROBOTS), prompts=prompts,
                    config=PlannerConfig(max_tokens=192), listeners=listeners)
        p.batcher = p.latency_guided(64)
        return p

    bus = InProcessBus()
    drone_task, arm_task = TASKS["T1"], TASKS["T9"]  # look for the cat (in view); stack boxes (detect)
    drone_scene, arm_scene = drone_task.scenes[0].scene, arm_task.scenes[0].scene
    visible = ["cat", "blue box", "red box", "purple box", "yellow box"]  # what the robots can see
    node = PlannerNode(InProcessTransport(bus, "timelyllm"), make_planner, clock=clock,
                       config=PlannerNodeConfig(status_period_s=0.05,
                                                dispatcher=DispatcherConfig(server_wait_s=2.0)))
    executors: dict[str, ExecutorNode] = {}
    client = InProcessTransport(bus, "drone_app")
    status: dict[str, list[dict]] = {}
    cv = threading.Condition()

    def on_status(m: dict) -> None:
        with cv:
            status.setdefault(m["request_id"], []).append(m)
            cv.notify_all()

    def final(rid: str, timeout: float = 60.0) -> dict:
        end = time.monotonic() + timeout
        with cv:
            while time.monotonic() < end:
                done = [m for m in status.get(rid, []) if m["terminal"]]
                if done:
                    return done[-1]
                cv.wait(0.05)
        raise AssertionError(f"no terminal status for {rid}: {status.get(rid)}")

    try:
        for rid, rtype in (("drone1", "tello"), ("arm1", "arm")):
            backend = SimulatedBackend(ROBOTS[rtype], seed=1, time_scale=0.01,
                                       perception=SimulatedPerception(visible))
            ex = SegmentExecutor(ROBOTS[rtype], backend, ExecutorConfig(timeout_s=30))
            executors[rid] = ExecutorNode(InProcessTransport(bus, rid), ex, robot_id=rid)
        node.start()
        client.subscribe("/timelyllm/request_status", ifc.REQUEST_STATUS, on_status, qos="reliable_deep")
        for rid, robot_id, task, scene in (("ros-drone", "drone1", drone_task, drone_scene),
                                           ("ros-arm", "arm1", arm_task, arm_scene)):
            client.publish("/timelyllm/plan_requests", ifc.PLAN_REQUEST, {
                "request_id": rid, "robot_id": robot_id, "robot_type": task.robot_type, "task": task.task,
                "scene": scene, "task_type": task.task_id, "category": task.category,
                "tuf_ert": 1.0, "tuf_alpha": -2.0, "tuf_beta": 1.0}, qos="reliable_deep")
        finals = {rid: final(rid) for rid in ("ros-drone", "ros-arm")}
    finally:
        node.close()  # joins the loop thread: nothing touches the shared engine after this
        for e in executors.values():
            e.close()
        client.close()

    planner = node.planner
    for rid, robot_id in (("ros-drone", "drone1"), ("ros-arm", "arm1")):
        g = planner.generations[rid]
        st = finals[rid]
        if st["state"] == "failed":  # the model's plan broke the schema: not the node's doing
            assert "invalid statement from the LLM" in st["reason"], (rid, st["reason"], g.text)
        else:
            assert st["state"] == "finished", (rid, st["reason"], g.text)
        assert st["segments_dispatched"] == st["segments_done"] == len(g.segments) >= 1
        assert [m["state"] for m in status[rid]][0] == "queued"
        assert g.text.strip(), "the real model generated the plan (no reference plan was sent)"
        # every segment went, as one goal, to this robot's executor and no other, in order
        reports = executors[robot_id].reports
        mine = [(i, r) for q, i, r in reports if q == rid]
        assert [i for i, _ in mine] == list(range(len(g.segments)))
        assert all(r.code == ResultCode.OK for _, r in mine)
        others = [q for other, node_ in executors.items() if other != robot_id for q, _, _ in node_.reports]
        assert rid not in others
        executed = [call.name for call, _ in executors[robot_id].executor.backend.calls]
        assert executed and set(executed) <= set(ROBOTS[g.request.robot_type].skills)
    assert any(m["state"] == "finished" for m in finals.values()), finals
    assert not eng.has_unfinished()
