"""timelyllm: segmented LLM serving for time-sensitive robots (TimelyLLM) on vLLM and ROS 2."""

__version__ = "0.1.0"
