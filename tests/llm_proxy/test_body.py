"""Request bodies: ``input_ids`` counted and spliced back without being decoded, the result always
equal to decoding the whole body."""

from __future__ import annotations

import orjson
import pytest

from services.llm_proxy.body import parse_body
from services.llm_proxy.guard import ContextGuard
from services.protocol import ErrorCode, PlatformError


@pytest.mark.parametrize(
    "raw",
    [
        b'{"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 4}}',
        b'{"sampling_params":{},"input_ids":[ 7 ,8 ],"stream":false}',
        b'{"input_ids":[]}',
        b'{"input_ids": [5]}',
        b'{"text": "say \\"input_ids\\": [1]", "input_ids": [9, 9]}',
    ],
)
def test_flat_ids_are_counted_and_spliced_back(raw: bytes) -> None:
    parsed = parse_body(raw)
    whole = orjson.loads(raw)
    assert parsed.ids is not None and "input_ids" not in parsed.doc
    assert parsed.prompt_len == len(whole["input_ids"])
    parsed.doc["rid"] = "r1"
    assert orjson.loads(parsed.encode()) == {**whole, "rid": "r1"}


@pytest.mark.parametrize(
    "raw",
    [
        b'{"input_ids": [[1, 2], [3]]}',  # a batch: nested arrays
        b'{"input_ids": ["a", "b"]}',  # not numbers
        b'{"meta": {"input_ids": [1, 2]}, "text": "x"}',  # not top-level
        b'{"meta": {"input_ids": [1]}, "input_ids": [1, 2, 3]}',  # a nested one first
        b'{"text": "hello"}',
    ],
)
def test_anything_unusual_is_decoded_whole(raw: bytes) -> None:
    parsed = parse_body(raw)
    whole = orjson.loads(raw)
    assert parsed.ids is None and parsed.doc == whole
    ids = whole.get("input_ids")
    assert parsed.prompt_len == (len(ids) if isinstance(ids, list) else None)
    assert orjson.loads(parsed.encode()) == whole


def test_a_64k_prompt_is_not_decoded() -> None:
    ids = list(range(65_536))
    raw = orjson.dumps({"input_ids": ids, "sampling_params": {"max_new_tokens": 1}})
    parsed = parse_body(raw)
    assert parsed.prompt_len == 65_536 and parsed.doc == {"sampling_params": {"max_new_tokens": 1}}
    assert orjson.loads(parsed.encode())["input_ids"] == ids


@pytest.mark.parametrize("raw", [b"[1, 2]", b"not json", b'{"input_ids": [1, 2}'])
def test_bad_bodies_raise(raw: bytes) -> None:
    with pytest.raises((orjson.JSONDecodeError, TypeError)):
        parse_body(raw)


@pytest.mark.parametrize(
    "raw",
    [b'{"input_ids":[]}', b'{"input_ids":[7]}', b'{"input_ids": [ 1 , 2 ,3 ]}', b'{"input_ids":[123456,7,8,9]}'],
)
def test_the_uncounted_bound_is_never_below_the_count(raw: bytes) -> None:
    parsed = parse_body(raw)
    bound = parsed.prompt_len_at_most
    assert bound is not None and parsed.prompt_len is not None and bound >= parsed.prompt_len
    assert parsed.prompt_len == len(orjson.loads(raw)["input_ids"])


@pytest.mark.parametrize("prompt", [0, 1, 30, 39, 40, 41, 60, 79, 80, 99, 100])
@pytest.mark.parametrize("requested", [None, 0, 5, 20, 50])
def test_the_guard_clamps_the_same_with_or_without_counting(prompt: int, requested: int | None) -> None:
    guard = ContextGuard(context_cap=100, max_new_tokens_cap=20)
    sampling = {} if requested is None else {"max_new_tokens": requested}
    raw = orjson.dumps({"input_ids": [1] * prompt, "sampling_params": sampling})
    fast, exact = parse_body(raw), parse_body(raw, whole=True)
    outcomes = []
    for parsed, guarded in ((fast, guard.guard_parsed), (exact, lambda p: guard.guard_generate(p.doc))):
        try:
            guarded(parsed)
            outcomes.append(parsed.doc["sampling_params"]["max_new_tokens"])
        except PlatformError as exc:
            outcomes.append(exc.code)
    assert outcomes[0] == outcomes[1]
    assert outcomes[0] == ErrorCode.CONTEXT_LENGTH_EXCEEDED or outcomes[0] <= min(20, 100 - prompt - 1)
