"""Executor backends (simulated robots, djitellopy Tello) and the Tello UDP emulator."""
