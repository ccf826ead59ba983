"""Gateway session tokens as harnesses see them: a value on a command line and in a header."""

from __future__ import annotations

import argparse
import re

from services.protocol.gateway import new_session_token, token_digest


def test_no_session_token_reads_as_an_option_on_a_command_line() -> None:
    tokens = {new_session_token() for _ in range(2000)}  # unprefixed, about 31 of 2,000 would begin with "-"
    assert len(tokens) == 2000
    assert all(re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_-]{20,}", t) for t in tokens)
    parser = argparse.ArgumentParser(exit_on_error=False)  # how aider reads --openai-api-key
    parser.add_argument("--openai-api-key")
    for token in tokens:
        assert parser.parse_args(["--openai-api-key", token]).openai_api_key == token
    assert len({token_digest(t) for t in tokens}) == 2000
