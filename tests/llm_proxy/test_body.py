"""Request bodies: ``input_ids`` counted and spliced back without being decoded, the result always
equal to decoding the whole body."""

from __future__ import annotations

import orjson
import pytest

from services.llm_proxy.body import parse_body


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
