"""Simulation: virtual-time robots and prompts for the simulated engine (its tokeniser: core/tokenizer.py)."""
