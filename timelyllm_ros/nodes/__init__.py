"""Nodes: thin shells over the transport port (executor node, planner node)."""
