"""`make eval`: an LLM-free replay of AgentDojo's workspace suite through a real `visor run`.

Nothing here is imported by Visor itself; the modules need the `eval` extra
(`pip install -e '.[eval]'`, which pins AgentDojo).
"""
