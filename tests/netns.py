"""The private network namespace helper lives in `timelyllm_ros/netns.py` (the ROS-graph demo uses
it too); the tests import it from here."""
from timelyllm_ros.netns import NamespaceUnavailable, port_holder, private_network  # noqa: F401
