"""Visor: a deterministic action boundary for MCP tool calls."""

__version__ = "0.1.0"
