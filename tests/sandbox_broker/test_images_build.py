"""``rollout images build``: a recipe run in a local sandbox over a base image gives a new image
(base layers + one layer of the changes, deletions as whiteouts) that the image store reads."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from services.cli.main import main
from services.sandbox_broker.images.sources import open_source
from services.sandbox_broker.images.store import ImageStore
from services.sandbox_broker.images.unpack import unpack
from services.taskbuild.imagerecipe import RecipeError, Step, from_flags, parse
from tests.sandbox_broker.conftest import needs_bwrap
from tests.sandbox_broker.images_support import busybox_image

RECIPE = """# a comment
FROM img/busybox.tar
COPY repo /testbed/repo
ENV GREETING=hi \\
    OTHER=x
WORKDIR /testbed
RUN echo "$GREETING $(id -u)" > made.txt && rm a.txt && rm -r pkg && mkdir pkg && echo n > pkg/n.py
USER agent
"""


def test_recipes_parse_and_bad_ones_are_refused() -> None:
    recipe = parse(RECIPE)
    assert recipe.base == "img/busybox.tar" and [s.kind for s in recipe.steps] == ["copy", "env", "workdir", "run",
                                                                                  "user"]  # fmt: skip
    assert recipe.steps[1] == Step("env", ("GREETING=hi", "OTHER=x"))
    assert from_flags("b", ["r:/t"], ["make"], ["A=1"], "/t", None).steps[0] == Step("copy", ("r", "/t"))
    for bad in ("RUN x", "FROM a\nFROM b", "FROM a\nADD x y", "FROM a\nCOPY --chown=1 a b", "FROM a\nENV =x"):
        with pytest.raises(RecipeError):
            parse(bad)


@needs_bwrap
@pytest.mark.skipif(os.geteuid() != 0, reason="overlay mounts need root")
def test_build_runs_the_recipe_in_a_sandbox_and_the_store_imports_it() -> None:
    with tempfile.TemporaryDirectory(prefix="rollout-images-build-test-") as scratch:
        work = Path(scratch)
        work.chmod(0o755)
        busybox_image(work / "img", user="root")
        (work / "repo").mkdir()
        (work / "repo" / "setup.py").write_text("print('setup')\n")
        (work / "Recipe").write_text(RECIPE)
        state = work / "state"
        for out in ("built", "built.tar"):  # an OCI layout, a docker save tar
            argv = ["images", "--state-dir", str(state), "build", "-f", str(work / "Recipe"), "--out",
                    str(work / out), "--name", out]  # fmt: skip
            assert main(argv) == 0
            source = open_source(work / out)
            assert len(source.layers) == 3  # the base's two, and the recipe's changes
            assert source.config.workdir == "/testbed" and source.config.user == "agent"
            assert {"GREETING=hi", "OTHER=x", "FOO=from-image"} <= set(source.config.env)
            root = work / f"root-{out}"
            unpack(source, root)
            testbed = root / "testbed"
            assert sorted(p.name for p in testbed.iterdir()) == ["made.txt", "pkg", "repo"]  # a.txt deleted
            assert (testbed / "made.txt").read_text() == "hi 0\n"  # RUN ran as the base's user (root)
            assert sorted(p.name for p in (testbed / "pkg").iterdir()) == ["n.py"]  # new.py gone: opaque
            assert (testbed / "repo" / "setup.py").read_text() == "print('setup')\n"
            assert not (root / "etc" / "hosts").exists()  # the sandbox's, not the image's
            assert (testbed / "made.txt").stat().st_uid == 0
        store = ImageStore(state / "images", 65534, 1 << 30)
        assert set(store.refs()) == {"built", "built.tar"}
