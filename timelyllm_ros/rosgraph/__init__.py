"""The demo as a real ROS 2 graph: processes, topic monitor, bag recording."""
