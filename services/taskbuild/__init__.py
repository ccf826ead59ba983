"""SWE-style tasks built from PyPI libraries (``rollout tasks build``)."""
