"""LLM engines behind one small protocol (simulated, vLLM)."""
