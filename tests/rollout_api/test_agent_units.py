"""The agent's plain parts: tokenizing deltas, parsing actions, observations, rewards, figures,
the SWE-bench adapter."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import orjson
import pytest
from aiohttp import web

from services.protocol import ErrorBody, ErrorCode, InfraStage, RewardSpec
from services.protocol.agents import BASH_OBSERVATION_TEMPLATE, BashAgent
from services.protocol.llm import HEADER_JOB
from services.protocol.sandboxes import ExecResult
from services.protocol.swebench import SweBenchRolloutRequest, SweInstance
from services.rollout_api.figures import percentile, rate_per_hour, tail_share
from services.rollout_api.swebench import HIDE_HISTORY, image_for, instance_task, patched_files, template_for
from services.rollout_api.worker.broker_client import BrokerClient
from services.rollout_api.worker.clients import InfraError
from services.rollout_api.worker.conversation import (
    SUBMIT_COMMAND,
    format_error,
    observation,
    parse_action,
    render,
    truncate_middle,
)
from services.rollout_api.worker.proxy_client import ProxyClient, parse_generation
from services.rollout_api.worker.reward import parse_reward, score
from services.rollout_api.worker.tokenization import ChatTokenizer
from services.rollout_api.worker.tokens import TokenBuffer
from services.runtime.tokenizer import write_tokenizer_dir
from tests.support.http import serving
from tests.support.tokenizers import write_metaspace_dir


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> ChatTokenizer:
    return ChatTokenizer.from_dir(write_tokenizer_dir(tmp_path_factory.mktemp("tok")))


def test_deltas_equal_the_whole_conversation_tokenized(tokenizer: ChatTokenizer) -> None:
    """prompt + (reply tokens + eos + observation delta)* == the template rendered over everything."""
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": "task ü"}]
    ids = tokenizer.prompt_ids(messages)
    for reply, obs in [("thought\n```bash\nls\n```", "<returncode>0</returncode>"), ("again", "fix format")]:
        ids += [*tokenizer.encode(reply), tokenizer.eos_id]
        messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": obs}]
        ids += tokenizer.message_ids(messages[-1], reply_ended_with_eos=True)
    assert ids == tokenizer.encode(tokenizer.render(messages, True))
    assert tokenizer.eos_id == 258


def test_deltas_match_the_full_render_with_a_tokenizer_that_marks_an_inputs_start(tmp_path: Path) -> None:
    """Metaspace with ``prepend_scheme: first`` puts a word boundary at the start of an input: a
    delta encoded alone would get one, where the full render has none after the end of turn."""
    chat = ChatTokenizer.from_dir(write_metaspace_dir(tmp_path))
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": "task"}]
    ids = chat.prompt_ids(messages)
    for reply, obs in [("run\n```bash\nls\n```", "out 0"), ("done", "out 1")]:
        messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": obs}]
        full = chat.encode(chat.render(messages[:-1], False))
        ids = full[: full.index(chat.eos_id, len(ids)) + 1]  # the reply as the full render has it, then eos
        ids += chat.message_ids(messages[-1], reply_ended_with_eos=True)
    assert ids == chat.encode(chat.render(messages, True))


def test_delta_after_a_reply_without_eos(tokenizer: ChatTokenizer) -> None:
    ids = tokenizer.message_ids({"role": "user", "content": "x"}, reply_ended_with_eos=False)
    assert ids[0] == tokenizer.eos_id


def test_parse_action() -> None:
    one = parse_action("THOUGHT: look\n\n```bash\nls -la\n```\n")
    assert (one.command, one.blocks, one.submits) == ("ls -la", 1, False)
    assert parse_action("no block").command is None
    two = parse_action("```bash\nls\n```\n```bash\npwd\n```")
    assert (two.command, two.blocks) == (None, 2)
    assert parse_action(f"done\n```bash\n{SUBMIT_COMMAND}\n```").submits


def test_a_sampled_nul_byte_is_the_models_format_error_not_a_crash() -> None:
    """A policy sampled ``\\x00`` inside its command; building the exec request crashed the attempt."""
    action = parse_action("THOUGHT: x\n\n```bash\ncat a\x00b > out\n```\n")
    assert (action.command, action.blocks) == (None, 1)
    assert "NUL byte" in format_error(action)
    assert "NUL byte" not in format_error(parse_action("no block"))


def test_observation_keeps_head_and_tail() -> None:
    text = "HEAD" + "x" * 5000 + "TAIL"
    cut = truncate_middle(text, 1000)
    assert cut.startswith("HEAD") and cut.endswith("TAIL") and len(cut.encode()) <= 1000
    result = ExecResult(exit_code=2, stdout="out", stderr="err", duration_s=0.1)
    assert observation(result, 1000) == "<returncode>2</returncode>\n<output>\nout\nerr\n</output>"


@pytest.mark.parametrize("stdout", ["", "plain", "{{ output.returncode }} {% raw %}", " \n tail \n\n", "é\u00001 <b>&"])
def test_the_default_observation_is_the_template_rendered(stdout: str) -> None:
    """The default observation template is written without Jinja (every turn uses it): the same text."""
    result = ExecResult(exit_code=137, stdout=stdout, stderr="E", duration_s=0.1)
    out = {
        "returncode": 137,
        "output": truncate_middle(stdout + ("\n" if stdout else "") + "E", 1000),
        "exception_info": "",
    }
    assert observation(result, 1000) == render(BASH_OBSERVATION_TEMPLATE, output=out)
    custom = BashAgent(observation_template=BASH_OBSERVATION_TEMPLATE + " ")  # through Jinja, as before
    assert observation(result, 1000, custom) == observation(result, 1000) + " "


def test_parse_reward() -> None:
    assert parse_reward("running\n0.75\n") == 0.75
    assert parse_reward("no number") is None
    assert parse_reward("") is None


def test_figures() -> None:
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([], 99) is None
    assert tail_share(0.0, 60.0, 100.0) == 0.4
    assert tail_share(0.0, None, 100.0) is None
    assert rate_per_hour([0.0, 1.0, 2.0]) == 3600.0


def test_swebench_adapter() -> None:
    patch = "diff --git a/t/test_x.py b/t/test_x.py\n--- a/t/test_x.py\n+++ b/t/test_x.py\n"
    instance = SweInstance(
        instance_id="o__r-1", repo="o/r", base_commit="abc", problem_statement="bug",
        FAIL_TO_PASS=["t/test_x.py::test_a"], PASS_TO_PASS=["u/test_y.py::test_b"], image_name="reg/sweb.eval.o-r:v1",
        test_patch=patch, env={"A": "1"},
    )  # fmt: skip
    request = SweBenchRolloutRequest(job="j", instances=[instance], env={"A": "0", "B": "2"})
    task = instance_task(instance, request)
    assert task.sandbox.template == "sweb.eval.o-r-v1" == template_for("reg/sweb.eval.o-r:v1")
    assert task.sandbox.workdir == "/testbed" and task.sandbox.env == {"A": "1", "B": "2"}
    assert patched_files(patch) == ["t/test_x.py"]
    assert task.reward.files == {"/tmp/rollout_test.patch": patch}
    assert task.reward.command == "python -m pytest -rA t/test_x.py"  # the test_patch's files, as the harness
    assert task.reward.restore == ["t/test_x.py", "u/test_y.py"]  # put back before the test patch is applied
    assert task.reward.setup and "git apply" in task.reward.setup[0]
    assert task.reward.tests is not None and task.reward.tests.fail_to_pass == ["t/test_x.py::test_a"]
    assert task.sandbox.setup == [HIDE_HISTORY]  # the image is the repository at its base commit; no later history
    assert task.reward.grade_in == "fresh"

    django = SweInstance(instance_id="django__django-11099", repo="django/django", base_commit="b",
                         problem_statement="p", FAIL_TO_PASS=["test_a (auth_tests.test_validators.T)"])  # fmt: skip
    dj_request = SweBenchRolloutRequest(job="j", instances=[django], test_command="./tests/runtests.py {ids}")
    dj_task = instance_task(django, dj_request)
    assert dj_task.metadata["image"] == "swebench/sweb.eval.x86_64.django_1776_django-11099:latest"
    assert dj_task.sandbox.template == "sweb.eval.x86_64.django_1776_django-11099-latest"
    assert dj_task.reward.command == "./tests/runtests.py 'test_a (auth_tests.test_validators.T)'"
    assert image_for(django, "sweb.eval.x86_64.{instance_id}:latest") == "sweb.eval.x86_64.django__django-11099:latest"


def test_tokenizer_dir_without_eos_is_refused(tmp_path: Path) -> None:
    directory = write_tokenizer_dir(tmp_path / "tok")
    config = directory / "tokenizer_config.json"
    config.write_text(config.read_text().replace('"eos_token": "<|im_end|>"', '"eos_token": "<nope>"'))
    with pytest.raises(ValueError, match="eos_token"):
        ChatTokenizer.from_dir(directory)


def test_parse_generation_reads_sglang_answers() -> None:
    body = {
        "output_ids": [5, 6, 258],
        "meta_info": {
            "finish_reason": {"type": "stop", "matched": 258},
            "output_token_logprobs": [[-0.5, 5, None], [-0.25, 6, None], [-0.125, 258, None]],
            "weight_version": "v3", "engine_id": "e1", "prompt_tokens": 10, "cached_tokens": 4,
        },
    }  # fmt: skip
    generation = parse_generation(body, {})
    assert (generation.output_ids, generation.logprobs) == ([5, 6, 258], [-0.5, -0.25, -0.125])
    assert (generation.finish_reason, generation.weight_version, generation.engine_id) == ("stop", "v3", "e1")
    assert generation.cached_tokens == 4
    bare = parse_generation({"output_ids": [1, 2], "meta_info": {"finish_reason": "length"}}, {"X-Engine-Id": "e2"})
    assert (bare.logprobs, bare.finish_reason, bare.engine_id) == ([0.0, 0.0], "length", "e2")


def test_the_context_json_grows_with_the_buffer() -> None:
    buffer = TokenBuffer()
    assert orjson.loads(buffer.context_json()) == []
    buffer.set_prompt([1, 2, 3])
    buffer.add_generated([4, 5], [-0.1, -0.2])
    buffer.add_observation([])
    buffer.add_observation([6])
    buffer.add_generated([], [])
    assert orjson.loads(buffer.context_json()) == buffer.context() == [1, 2, 3, 4, 5, 6]


async def test_reward_keeps_whether_a_broker_refusal_is_retryable() -> None:
    """A broker 422 (a request error, not the platform's) rewrapped at stage ``reward`` stays
    non-retryable: the runner gives the trajectory up instead of spending its attempts."""

    async def refuse(_: web.Request) -> web.Response:
        body = ErrorBody.of(ErrorCode.VALIDATION_ERROR, "bad path").model_dump(mode="json")
        return web.json_response(body, status=422)

    spec = RewardSpec(command="true", files={"/tmp/t.py": "x"})
    async with serving(web.put("/leases/{lease}/files", refuse)) as url, aiohttp.ClientSession() as session:
        broker = BrokerClient(session, url, overhead_s=5)
        with pytest.raises(InfraError) as raised:
            await score(broker, "lease-1", spec)
    assert raised.value.stage is InfraStage.REWARD and raised.value.code is ErrorCode.VALIDATION_ERROR
    assert not raised.value.retryable


async def test_the_worker_waits_out_the_proxys_retry_after_and_sends_again() -> None:
    """A full proxy queue answers 503 ``capacity_exhausted`` with ``Retry-After``: the call waits and is
    sent again (generating has no side effect) instead of failing the attempt; a refusal with no
    ``Retry-After`` or past the call's timeout is still an infra error."""
    answers: list[int] = []

    async def generate(request: web.Request) -> web.Response:
        answers.append(len(answers))
        case = request.headers.get(HEADER_JOB)  # which case the call plays
        if case or len(answers) <= 2:
            body = ErrorBody.of(ErrorCode.CAPACITY_EXHAUSTED, "queue full").model_dump(mode="json")
            retry = {} if case == "bare" else {"Retry-After": "0.05"}
            return web.json_response(body, status=503, headers=retry)
        return web.json_response(
            {"output_ids": [7], "meta_info": {"finish_reason": {"type": "stop"}, "output_token_logprobs": [[-0.5, 7]]}}
        )

    waits: list[float] = []
    async with serving(web.post("/generate", generate)) as url:
        for case in ("", "bare", "never"):
            async with aiohttp.ClientSession() as session:
                proxy = ProxyClient(session, url, timeout_s=1.0, on_wait=waits.append)
                call = proxy.generate([1, 2], {"temperature": 1.0}, 4, pool="default", session_id="s", job=case)
                if not case:
                    assert (await call).output_ids == [7] and len(answers) == 3 and waits == [0.05, 0.05]
                    continue
                with pytest.raises(InfraError) as raised:
                    await call
                assert raised.value.code is ErrorCode.CAPACITY_EXHAUSTED
                assert proxy.capacity_waits == (0 if case == "bare" else len(answers) - 5)  # 3 + 1 answers before
