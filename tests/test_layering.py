"""The layering rules, checked on the source:

- the contract (``services.protocol``) imports nothing else from the repository;
- services never import each other (they may use the contract and ``services.runtime``);
- the client of every trainer (``rollout_client``) imports only the contract from the repository,
  and the runtime modules that open its Redis client and create consumer groups like every service
  (``TRAINER_RUNTIME``: they import only pydantic-settings, redis, the standard library, the
  contract and each other);
- the platform's own trainer (``trainer_client``) imports the same, plus ``rollout_client``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SERVICES = ("rollout_api", "llm_proxy", "sandbox_broker", "engines")
INTERNAL = ("services", "trainer_client", "rollout_client")
TRAINER_RUNTIME = (
    "services.runtime.settings",
    "services.runtime.logs",
    "services.runtime.groups",
    "services.runtime.sync_redis",
)


def internal_imports(package_dir: Path) -> dict[str, set[str]]:
    """{file: {imported internal module, ...}} for every .py file under ``package_dir``."""
    found: dict[str, set[str]] = {}
    for path in package_dir.rglob("*.py"):
        tree = ast.parse(path.read_text(), filename=str(path))
        names: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module)
        found[str(path.relative_to(ROOT))] = {n for n in names if n.split(".")[0] in INTERNAL}
    return found


def violations(package_dir: Path, allowed: tuple[str, ...]) -> list[str]:
    bad = []
    for file, names in internal_imports(package_dir).items():
        for name in names:
            if not any(name == a or name.startswith(a + ".") for a in allowed):
                bad.append(f"{file} imports {name}")
    return bad


def test_contract_imports_nothing_internal() -> None:
    assert violations(ROOT / "services" / "protocol", ("services.protocol",)) == []


def test_runtime_imports_only_the_contract() -> None:
    assert violations(ROOT / "services" / "runtime", ("services.runtime", "services.protocol")) == []


@pytest.mark.parametrize("service", SERVICES)
def test_services_do_not_import_each_other(service: str) -> None:
    path = ROOT / "services" / service
    if not path.exists():
        pytest.skip(f"services/{service} has not landed yet")
    allowed = (f"services.{service}", "services.protocol", "services.runtime")
    assert violations(path, allowed) == []


def test_trainer_imports_only_the_contract() -> None:
    path = ROOT / "trainer_client"
    if not path.exists():
        pytest.skip("trainer_client has not landed yet")
    assert violations(path, ("trainer_client", "rollout_client", "services.protocol", *TRAINER_RUNTIME)) == []


def test_rollout_client_imports_only_the_contract() -> None:
    """Any trainer installs it: no service, and not the platform's own trainer."""
    assert violations(ROOT / "rollout_client", ("rollout_client", "services.protocol", *TRAINER_RUNTIME)) == []


def test_no_service_imports_a_client() -> None:
    """The clients sit on top of the platform: a service importing one would turn the layering upside down."""
    for service in SERVICES:
        path = ROOT / "services" / service
        if path.exists():
            assert [v for v in violations(path, ("services",)) if "_client" in v] == [], service


def test_the_trainers_runtime_modules_stay_light() -> None:
    """What the trainer may take from ``services.runtime`` imports nothing else from the repository."""
    for module in TRAINER_RUNTIME:
        path = ROOT / (module.replace(".", "/") + ".py")
        imported = internal_imports(path.parent)[str(path.relative_to(ROOT))]
        assert {n for n in imported if not n.startswith("services.protocol")} <= set(TRAINER_RUNTIME), module


def test_checker_catches_a_violation(tmp_path: Path) -> None:
    """The checker itself can fail: a file importing a sibling service is reported."""
    pkg = ROOT / "tests" / "_layering_probe"
    pkg.mkdir(exist_ok=True)
    try:
        (pkg / "bad.py").write_text("from services.llm_proxy import app\nimport os\n")
        assert violations(pkg, ("services.protocol",)) == ["tests/_layering_probe/bad.py imports services.llm_proxy"]
    finally:
        for f in pkg.iterdir():
            f.unlink()
        pkg.rmdir()
