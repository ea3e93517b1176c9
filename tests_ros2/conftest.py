"""ROS 2 tests: real rclpy over Fast DDS, nodes in separate processes.

Isolation: each test session picks its own ROS_DOMAIN_ID (from its pid) and keeps discovery on
this host (ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST), so parallel `make test` runs on one machine
do not see each other's nodes; every subprocess a test starts inherits both.  Set
TIMELYLLM_TEST_ROS_DOMAIN_ID to force a domain.
"""

from __future__ import annotations

import os

# before anything imports rclpy: the domain is read when the context is initialised
# 1..100: DDS ports of domains above 101 can fall into Linux's ephemeral port range (ROS docs)
os.environ["ROS_DOMAIN_ID"] = os.environ.get("TIMELYLLM_TEST_ROS_DOMAIN_ID") or str(1 + os.getpid() % 100)
os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"
os.environ.pop("ROS_STATIC_PEERS", None)
os.environ.pop("ROS_LOCALHOST_ONLY", None)  # deprecated in Jazzy; the range above replaces it
