"""Streamable HTTP: the event-stream reader, the body checks, and the upstream client.

Imported only by `visor run --url` (and, later, `visor serve`): a stdio session never pays for
the HTTP stack's import time.
"""
