"""timelyllm: segmented LLM serving for time-sensitive robots (TimelyLLM) on vLLM and ROS 2."""

__version__ = "0.1.0"

PACKAGE = "timelyllm"  # the ROS 2 package: its interfaces (timelyllm/msg/...), share/timelyllm, lib/timelyllm
