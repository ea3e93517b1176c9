"""Planner + executors, one namespace per robot.

    ros2 launch timelyllm planner.launch.py num_drones:=3 num_arms:=1
    ros2 launch timelyllm planner.launch.py engine:=vllm model:=/models/tiny-planner
    ros2 launch timelyllm planner.launch.py num_drones:=2 tello_hosts:=192.168.10.1,192.168.10.2

Robots are drone1..N (robot_type tello) and arm1..M (robot_type arm).  The first len(tello_hosts)
drones drive real Tellos through djitellopy; the others (and all arms) are simulated executors.
The planner runs in `namespace` (default timelyllm): requests go to /timelyllm/plan_requests,
status comes back on /timelyllm/request_status (`timelyllm request --planner-ns /timelyllm`).
Every node is a managed (lifecycle) node that configures and activates itself (`autostart`); with
autostart:=false a lifecycle manager drives them.  If the planner exits, the launch shuts down; if
it exited with an error, the launch fails with its exit code in the message.
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, OpaqueFunction, RegisterEventHandler, Shutdown
from launch.event_handlers import OnProcessExit
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import Node
from launch_ros.substitutions import FindPackageShare


def _nodes(context, *args, **kwargs):
    def arg(name):
        return LaunchConfiguration(name).perform(context)

    params_file = arg("params_file")
    robots_dir = arg("robots_config")
    autostart = arg("autostart").lower() in ("true", "1", "yes")
    planner_params = {
        "engine": arg("engine"),
        "model": arg("model"),
        "policy": arg("policy"),
        "robots_dir": robots_dir,
        "autostart": autostart,
    }
    planner = Node(package="timelyllm", executable="planner_node", name="planner", namespace=arg("namespace"),
                   output="screen", parameters=[params_file, planner_params])
    nodes = [planner, RegisterEventHandler(OnProcessExit(target_action=planner, on_exit=_planner_exited))]
    hosts = [h.strip() for h in arg("tello_hosts").split(",") if h.strip()]
    for i in range(int(arg("num_drones"))):
        p = {"robot_type": "tello", "robots_dir": robots_dir, "seed": i, "autostart": autostart}
        if i < len(hosts):
            p.update({"backend": "tello", "tello_host": hosts[i]})
        nodes.append(Node(package="timelyllm", executable="executor_node", name="executor",
                          namespace=f"drone{i + 1}", output="screen", parameters=[params_file, p]))
    for i in range(int(arg("num_arms"))):
        nodes.append(Node(package="timelyllm", executable="executor_node", name="executor",
                          namespace=f"arm{i + 1}", output="screen",
                          parameters=[params_file, {"robot_type": "arm", "robots_dir": robots_dir, "seed": 100 + i,
                                                    "autostart": autostart}]))
    return nodes


def _planner_exited(event, context):
    """Without the planner nothing is served: shut the launch down; an error exit fails it (launch
    turns an exception in a handler into a failed launch, exit code 1)."""
    if event.returncode != 0:
        raise RuntimeError(f"the planner exited with code {event.returncode} (its log says why)")
    return [Shutdown(reason="the planner exited")]


def generate_launch_description():
    share = FindPackageShare("timelyllm")
    return LaunchDescription([
        DeclareLaunchArgument("namespace", default_value="timelyllm",
                              description="the planner's namespace (its topics and services live there)"),
        DeclareLaunchArgument("autostart", default_value="true",
                              description="nodes configure and activate themselves (false: a lifecycle manager does)"),
        DeclareLaunchArgument("engine", default_value="simulated", description="simulated | vllm"),
        DeclareLaunchArgument("model", default_value="", description="vLLM model directory"),
        DeclareLaunchArgument("policy", default_value="default",
                              description="default | timelyllm | fcfs | edf | vllm | vllm-stream | lamps | ..."),
        DeclareLaunchArgument("robots_config", default_value=[share, "/robots"],
                              description="directory of robot YAML files"),
        DeclareLaunchArgument("params_file", default_value=[share, "/config/planner.yaml"],
                              description="ROS parameters for the planner and executors"),
        DeclareLaunchArgument("num_drones", default_value="2"),
        DeclareLaunchArgument("num_arms", default_value="1"),
        DeclareLaunchArgument("tello_hosts", default_value="",
                              description="comma-separated Tello IPs: drone1 uses the first, ..."),
        OpaqueFunction(function=_nodes),
    ])
