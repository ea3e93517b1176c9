"""Simulation: virtual-time robots, prompts and tokeniser for the simulated engine."""
