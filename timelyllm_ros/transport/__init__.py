"""Transport port (topics, actions, timers) and its implementations: in-process and rclpy."""
