"""A stand-in for the ``sglang`` package in the launcher test (SGLang needs a GPU)."""
