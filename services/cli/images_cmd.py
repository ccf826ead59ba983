"""``rollout images import|list|rm``: the local backend's image store (shared with the brokers of
this host through ``--state-dir``). A template then names an image by its store name.
``rollout images build``: a new image from a base and a Dockerfile-like recipe (services/taskbuild/imagebuild.py)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from services.sandbox_broker.images.store import ImageStore


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("images", help="the local backend's task images (import, list, rm, build)")
    p.add_argument("--state-dir", type=Path, default=None, help="the broker's state dir (default: its setting)")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    imp = actions.add_parser("import", help="name an image (OCI layout, docker save / OCI tar, root dir); unpack it")
    imp.add_argument("source", type=Path)
    imp.add_argument("--name", required=True, help="the store name templates use as their image")
    imp.add_argument("--no-unpack", action="store_true", help="unpack at the first lease instead of now")
    imp.set_defaults(handler=import_image)
    ls = actions.add_parser("list", help="named images and unpacked trees")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(handler=list_images)
    rm = actions.add_parser("rm", help="forget a name (its tree goes when the store needs room)")
    rm.add_argument("name")
    rm.set_defaults(handler=remove_image)
    _register_build(actions)


def _register_build(actions: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    build = actions.add_parser("build", help="a new image: a base plus COPY/RUN/ENV/WORKDIR/USER steps, in a sandbox")
    build.add_argument("-f", "--file", type=Path, default=None, help="the recipe (FROM, COPY, RUN, ENV, WORKDIR, USER)")
    build.add_argument("context", type=Path, nargs="?", default=None, help="COPY sources (default: the recipe's dir)")
    build.add_argument("--from", dest="base", default=None, help="base image without a recipe file: a path, a "
                       "store name or 'mmdebstrap'")  # fmt: skip
    build.add_argument("--copy", action="append", default=[], help="SRC:DEST (repeatable)")
    build.add_argument("--env", action="append", default=[], help="KEY=VALUE (repeatable)")
    build.add_argument("--workdir", default=None)
    build.add_argument("--run", action="append", default=[], help="a shell command (repeatable, in order)")
    build.add_argument("--user", default=None, help="the image's User")
    build.add_argument("--out", type=Path, required=True, help="OCI layout dir, or a docker save tar (*.tar)")
    build.add_argument("--tag", default="rollout/built:latest", help="the tar's RepoTags (docker load)")
    build.add_argument("--name", default=None, help="also import it into the image store under this name")
    build.add_argument("--network", action="store_true", help="RUN commands reach the network (e.g. pip install)")
    build.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "rollout" / "tasks",
                       help="where the mmdebstrap base is cached")  # fmt: skip
    build.set_defaults(handler=build_image)


def _store(args: argparse.Namespace) -> ImageStore:
    from services.sandbox_broker.images.store import ImageStore
    from services.sandbox_broker.settings import BrokerSettings

    settings = BrokerSettings(**({"state_dir": args.state_dir} if args.state_dir else {}))
    return ImageStore(settings.state_dir.resolve() / "images", settings.sandbox_uid, settings.image_store_mb * 2**20)


def import_image(args: argparse.Namespace) -> int:
    from services.sandbox_broker.images.sources import ImageError

    store = _store(args)
    try:
        source = store.tag(args.name, args.source)
        prepared = None if args.no_unpack else store.prepare(args.name)
    except ImageError as exc:
        print(f"error: {exc}")
        return 2
    took = f", unpacked in {prepared.prepare_s:.1f}s" if prepared else ""
    print(f"{args.name}: {source.kind} {source.digest}{took}")
    return 0


def list_images(args: argparse.Namespace) -> int:
    images = _store(args).list()
    if args.json:
        print(json.dumps([vars_of(i) for i in images], indent=1))
        return 0
    print(f"{'NAME':<32} {'DIGEST':<20} {'SIZE_MB':>8} {'LAST_USED':<20} SOURCE")
    for i in images:
        used = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(i.last_used)) if i.last_used else "-"
        digest = (i.digest or "(not unpacked)")[:19]
        print(f"{i.name or '-':<32} {digest:<20} {i.size / 2**20:>8.1f} {used:<20} {i.source}")
    return 0


def vars_of(image: object) -> dict[str, object]:
    return {k: getattr(image, k) for k in ("name", "source", "digest", "size", "last_used")}


def remove_image(args: argparse.Namespace) -> int:
    if not _store(args).untag(args.name):
        print(f"error: no image named {args.name!r}")
        return 1
    return 0


def build_image(args: argparse.Namespace) -> int:
    from services.sandbox_broker.images.sources import ImageError
    from services.taskbuild import imagerecipe
    from services.taskbuild.imagebuild import BuildOptions, build_image, context_of

    try:
        if args.file:
            recipe = imagerecipe.parse(args.file.read_text())
        elif args.base:
            recipe = imagerecipe.from_flags(args.base, args.copy, args.run, args.env, args.workdir, args.user)
        else:
            print("error: give a recipe (-f FILE) or a base (--from IMAGE)")
            return 2
        store = _store(args)
        names = {name: entry["source"] for name, entry in store.refs().items()}
        options = BuildOptions(context_of(args.file, args.context), args.out.resolve(), args.cache, args.tag,
                               args.network, resolve_base=names)  # fmt: skip
        digest = build_image(recipe, options)
        if args.name:
            store.tag(args.name, options.out)
    except (imagerecipe.RecipeError, ImageError, OSError) as exc:
        print(f"error: {exc}")
        return 2
    print(f"{options.out}: {digest}" + (f" (imported as {args.name})" if args.name else ""))
    return 0
