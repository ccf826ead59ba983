"""What a ``command`` agent running beside its sandbox uses to act in it: a small client for the
sandbox broker's exec/file API (``sandbox.py``) and a mini-swe-agent environment on top of it
(``mini_swe_agent.py``). Imports only the platform's contract."""
