"""``rollout images build``: a new image from a base image and a recipe (imagerecipe.py), without a
registry or a daemon.

The base becomes the root of a local-backend sandbox (the broker's own code: the image unpacked,
an overlay with a private upper layer, bubblewrap with no capabilities, the image's user mapped
onto the sandbox uid). COPY puts files in, RUN runs commands in it; then the upper layer, which
holds exactly what the steps changed (deletions as overlayfs whiteouts), becomes one new layer on
top of the base's layers. The output is an OCI image layout (a directory) or, for a ``.tar`` path,
a ``docker save`` tar: the broker's image store imports either, ``docker load`` reads the tar.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import posixpath
import shutil
import tarfile
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

from services.protocol.sandboxes import ExecRequest, Resources, Template
from services.sandbox_broker.backends.base import SandboxSpec
from services.sandbox_broker.backends.imageroot import HOSTS
from services.sandbox_broker.backends.local import LocalBackend
from services.sandbox_broker.images.archive import layer_files, layer_from_upper, write_docker_archive, write_oci_layout
from services.sandbox_broker.images.sources import ImageConfig, ImageSource, open_source
from services.sandbox_broker.settings import BrokerSettings
from services.taskbuild.base import ensure_base
from services.taskbuild.imagerecipe import ImageRecipe, RecipeError, Step

log = logging.getLogger(__name__)

MMDEBSTRAP = "mmdebstrap"  # FROM mmdebstrap: the tasks' Debian base (services/taskbuild/base.py)


@dataclass(frozen=True, slots=True)
class BuildOptions:
    context: Path  # where COPY sources are read
    out: Path  # an OCI layout directory, or a docker save tar when it ends in .tar
    cache: Path  # the mmdebstrap base
    tag: str = "rollout/built:latest"  # the docker save tar's RepoTags
    network: bool = False  # RUN commands reach the network (an isolated namespace with NAT)
    resources: Resources = field(default_factory=lambda: Resources(cpus=2, memory_mb=4096, disk_mb=20_480))
    run_timeout_s: float = 3600.0
    resolve_base: dict[str, str] = field(default_factory=dict)  # store names -> source paths


@dataclass
class _State:
    config: ImageConfig
    workdir: str
    env: dict[str, str] = field(default_factory=dict)


def build_image(recipe: ImageRecipe, options: BuildOptions) -> str:
    """Build the image; return its config digest."""
    with tempfile.TemporaryDirectory(prefix="rollout-images-build-") as scratch:
        work = Path(scratch)
        work.chmod(0o755)  # the sandbox uid reaches its state below
        base = _base_source(recipe.base, options, work)
        layers = layer_files(base, work / "layers")
        top, config = asyncio.run(_run_steps(base, recipe.steps, options, work))
        options.out.parent.mkdir(parents=True, exist_ok=True)
        if options.out.suffix == ".tar":
            return write_docker_archive(options.out, [*layers, top], config, options.tag)
        shutil.rmtree(options.out, ignore_errors=True)
        return write_oci_layout(options.out, [*layers, top], config, options.out / "blobs" / "sha256")


def _base_source(base: str, options: BuildOptions, work: Path) -> ImageSource:
    if base == MMDEBSTRAP:
        layout = work / "base"
        write_oci_layout(layout, [ensure_base(options.cache)], ImageConfig(), layout / "blobs" / "sha256")
        return open_source(layout)
    path = Path(options.resolve_base.get(base, base))
    if not path.is_absolute():
        path = (options.context / path).resolve()
    return open_source(path)


async def _run_steps(
    base: ImageSource, steps: tuple[Step, ...], options: BuildOptions, work: Path
) -> tuple[Path, ImageConfig]:
    """Run the steps in a sandbox over ``base``; return the layer of its changes and the new config."""
    (work / "state").mkdir(mode=0o755)
    settings = BrokerSettings(state_dir=work / "state", image_store_mb=1 << 20)
    backend = LocalBackend(settings)
    await backend.start()
    if not backend.overlay:
        raise RuntimeError("images build needs overlayfs (root and a kernel overlay) to capture the changes")
    template = Template(name="build", image=str(base.path))
    spec = SandboxSpec(template, options.resources, "egress" if options.network else "none")
    sandbox = await backend.create(spec)
    try:
        state = _State(base.config, base.config.workdir or "/")
        for step in steps:
            await _apply(backend, sandbox.sandbox_id, step, state, options)
        upper = backend.root / sandbox.sandbox_id / "rw" / "upper"
        inside = state_identity(backend, sandbox.sandbox_id)
        top = layer_from_upper(upper, work / "top.tar", {settings.sandbox_uid: inside}, skip=_broker_files(upper))
    finally:
        await backend.destroy(sandbox.sandbox_id)
        await backend.close()
    env = {**state.config.env_map(), **state.env}
    config = replace(state.config, env=tuple(f"{k}={v}" for k, v in env.items()), workdir=state.workdir)
    return top, config


def state_identity(backend: LocalBackend, sandbox_id: str) -> int:
    """The uid the image's user has inside (what the sandbox uid's files belong to in the image)."""
    meta = json.loads((backend.root / sandbox_id / "meta.json").read_text())
    return int(meta["image"]["uid"])


def _broker_files(upper: Path) -> tuple[str, ...]:
    """What the broker itself wrote into the sandbox's root: its /etc/hosts (not the image's)."""
    hosts = upper / "etc" / "hosts"
    return ("etc/hosts",) if hosts.is_file() and hosts.read_text() == HOSTS else ()


async def _apply(backend: LocalBackend, sandbox_id: str, step: Step, state: _State, options: BuildOptions) -> None:
    if step.kind == "copy":
        src, dest = step.args
        target = posixpath.join(state.workdir, dest)
        directory, archive = _copy_archive(options.context, src, target)
        await backend.put_archive(sandbox_id, directory, archive)
    elif step.kind == "env":
        state.env.update(item.split("=", 1) for item in step.args)  # type: ignore[misc]
    elif step.kind == "workdir":
        state.workdir = posixpath.join(state.workdir, step.args[0])
        await _run(backend, sandbox_id, f"mkdir -p '{state.workdir}'", state, options, cwd="/")
    elif step.kind == "user":
        state.config = replace(state.config, user=step.args[0])
    else:
        await _run(backend, sandbox_id, step.args[0], state, options)


async def _run(
    backend: LocalBackend, sandbox_id: str, command: str, state: _State, options: BuildOptions, cwd: str = ""
) -> None:
    log.info("RUN %s", command)
    request = ExecRequest(shell=command, env=state.env, cwd=cwd or state.workdir, timeout_s=options.run_timeout_s,
                          max_output_bytes=1 << 20)  # fmt: skip
    result = await backend.exec(sandbox_id, request)
    for line in (result.stdout + result.stderr).splitlines()[-40:]:
        log.info("  %s", line)
    if result.exit_code != 0:
        raise RecipeError(f"RUN {command!r} exited {result.exit_code}: {result.stderr[-1000:]}")


def _copy_archive(context: Path, src: str, target: str) -> tuple[str, bytes]:
    """(directory, tar) that put ``src`` (a file or a directory's content) at ``target``."""
    host = (context / src).resolve()
    if not host.is_relative_to(context.resolve()) or not host.exists():
        raise RecipeError(f"COPY {src}: not found in the build context {context}")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        if host.is_dir():
            for entry in sorted(host.iterdir()):
                tar.add(entry, arcname=entry.name)
            return target, buffer.getvalue()
        is_dir_target = target.endswith("/")
        name = host.name if is_dir_target else posixpath.basename(target)
        tar.add(host, arcname=name)
    return (target if is_dir_target else posixpath.dirname(target) or "/"), buffer.getvalue()


def context_of(recipe_file: Path | None, context: Path | None) -> Path:
    return (context or (recipe_file.parent if recipe_file else Path(os.getcwd()))).resolve()
