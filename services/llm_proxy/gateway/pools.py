"""Per-pool gateway configuration: the chat template (tokenizer) that renders the pool's prompts,
its tool-call parser, and whether it returns routed experts (and their shape)."""

from __future__ import annotations

import logging
from pathlib import Path

from services.llm_proxy.fleet import FleetView
from services.llm_proxy.gateway.delta import is_local
from services.llm_proxy.gateway.parsers import PARSERS
from services.llm_proxy.settings import ProxySettings
from services.runtime.chat import ChatTemplate, bundled_chat_template, has_tokenizer

log = logging.getLogger(__name__)


class PoolConfigs:
    def __init__(self, settings: ProxySettings, view: FleetView) -> None:
        self.view = view
        self.tokenizers = settings.gateway_map("gateway_tokenizers")
        self.parsers = settings.gateway_map("gateway_tool_parsers")
        for pool, name in self.parsers.items():
            if name not in PARSERS:
                raise ValueError(f"gateway_tool_parsers: {pool}={name} is not one of {', '.join(PARSERS)}")
        self.experts = {p: _shape(v) for p, v in settings.gateway_map("gateway_routed_experts").items()}
        self._loaded: dict[str, ChatTemplate] = {}
        self._has_tokenizer: dict[str, bool] = {}  # weights directory -> it holds a tokenizer (a stat, once)
        self._local: dict[int, bool] = {}  # id(template) -> delta rendering is exact for it

    def template(self, pool: str) -> ChatTemplate:
        """The configured tokenizer directory, else the pool's current weights directory when it has a
        tokenizer, else the bundled one (logged)."""
        directory = self.tokenizers.get(pool)
        if directory is None:
            record = self.view.pool(pool)
            location = record.location if record else None
            if location and self._tokenizer_in(location):
                directory = location
        key = directory or ""
        found = self._loaded.get(key)
        if found is None:
            if directory:
                found = ChatTemplate.from_dir(Path(directory))
            else:
                log.warning("pool %s has no tokenizer configured: the gateway renders with the bundled one", pool)
                found = bundled_chat_template()
            self._loaded[key] = found
        return found

    def _tokenizer_in(self, location: str) -> bool:
        found = self._has_tokenizer.get(location)
        if found is None:
            found = self._has_tokenizer[location] = has_tokenizer(Path(location))
        return found

    def local(self, pool: str) -> bool:
        """Whether the pool's template may render only new messages (``delta.is_local``, checked once)."""
        chat = self.template(pool)
        found = self._local.get(id(chat))
        if found is None:
            found = self._local[id(chat)] = is_local(chat)
            log.info("pool %s: chat template is %s", pool, "local: new messages rendered alone" if found else
                     "not local: every call renders the whole conversation")  # fmt: skip
        return found

    def parser(self, pool: str) -> str:
        return self.parsers.get(pool, "hermes")

    def routed_experts(self, pool: str) -> tuple[int, int] | None:
        return self.experts.get(pool)


def _shape(value: str) -> tuple[int, int]:
    layers, _, topk = value.lower().partition("x")
    if not layers.strip().isdigit() or not topk.strip().isdigit():
        raise ValueError(f"gateway_routed_experts: {value!r} is not LAYERSxTOPK")
    return int(layers), int(topk)
