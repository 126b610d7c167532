"""tests/support is the one home of what tests share: no test folder imports another's
modules (bench/ counts as a test folder), and no two test modules share a name;
docs/development.md has a line for each test folder."""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHARED = "tests/support"
# In bench/ the benchmarks are test modules and their fixtures a conftest; every other module
# there is one of the benchmark's own tools, which tests import as they import the product.
BENCH_TESTS = re.compile(r"test_\w+|conftest")


def folders_of_tests(root: Path) -> list[Path]:
    """tests/ itself (its own files), each folder of tests/ (tests/support too), bench/."""
    tests = root / "tests"
    folders = [tests, *sorted(p for p in tests.iterdir() if (p / "__init__.py").is_file())]
    return [*folders, root / "bench"]


def folder_of(module: str, root: Path) -> str | None:
    """The test folder a dotted module name lies in, relative to ``root``, or None for a
    module outside them (the product, the benchmark's tools, a library)."""
    parts = module.split(".")
    if parts[0] == "bench":
        return "bench" if any(BENCH_TESTS.fullmatch(part) for part in parts) else None
    if parts[0] != "tests":
        return None
    if len(parts) > 1 and (root / "tests" / parts[1] / "__init__.py").is_file():
        return f"tests/{parts[1]}"
    return "tests"


def _is_module(module: str, root: Path) -> bool:
    path = root.joinpath(*module.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def imported(path: Path, root: Path) -> list[tuple[int, str]]:
    """The modules a file imports, with their lines: relative imports resolved, and
    ``from package import module`` read as that module."""
    package = path.relative_to(root).with_suffix("").parts[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = list(package[: len(package) - node.level + 1]) if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            for alias in node.names:
                inner = f"{module}.{alias.name}"
                found.append((node.lineno, inner if _is_module(inner, root) else module))
    return found


def crossing_imports(root: Path) -> list[str]:
    """Each import of one test folder's module from another folder, tests/support aside."""
    crossings = set()
    for folder in folders_of_tests(root):
        here = str(folder.relative_to(root))
        files = folder.glob("*.py") if folder.name == "tests" else folder.rglob("*.py")
        for path in files:
            for line, module in imported(path, root):
                if folder_of(module, root) not in (None, here, SHARED):
                    crossings.add(f"{path.relative_to(root)}:{line}: imports {module}")
    return sorted(crossings)


def test_no_test_folder_imports_another_s_modules() -> None:
    crossings = crossing_imports(ROOT)
    assert not crossings, "move what is shared into tests/support:\n" + "\n".join(crossings)


def test_no_two_test_modules_share_a_name() -> None:
    places = defaultdict(list)
    for folder in folders_of_tests(ROOT)[1:]:
        for path in folder.rglob("test_*.py"):
            places[path.name].append(str(path.relative_to(ROOT)))
    twins = {name: where for name, where in places.items() if len(where) > 1}
    assert not twins, f"name each by what it checks: {twins}"


def test_the_development_guide_lists_every_test_folder() -> None:
    text = (ROOT / "docs" / "development.md").read_text(encoding="utf-8")
    table = text.partition("| folder | what it holds |")[2].partition("\n\n")[0]
    listed = re.findall(r"^\| `([\w/]+?)/?` \|", table, flags=re.M)
    folders = [str(folder.relative_to(ROOT)) for folder in folders_of_tests(ROOT)[1:]]
    assert sorted(listed) == sorted(folders)


# -- the check itself ------------------------------------------------------------------------
def test_an_import_from_another_test_folder_is_found(tmp_path: Path) -> None:
    for folder in ("tests", "tests/support", "tests/a", "tests/b", "bench", "bench/peers"):
        (tmp_path / folder).mkdir(parents=True, exist_ok=True)
        (tmp_path / folder / "__init__.py").write_text("")
    for module in (
        "tests/b/helpers.py",
        "bench/test_drain.py",
        "bench/conftest.py",
        "bench/report.py",
        "bench/endurance.py",
    ):
        (tmp_path / module).write_text("X = 1\n")
    (tmp_path / "tests" / "a" / "test_one.py").write_text(
        "from tests.support import waiting\n"
        "from tests.a import local\n"
        "from relay.records import OutboxRow\n"
        "from tests.b.helpers import X\n"
        "from tests.b import helpers\n"
        "def late():\n"
        "    import tests.b.test_two\n"
        "from bench.peers import measure\n"
        "from bench import test_drain, report\n"
        "from bench.endurance import plan\n"
        "from bench.conftest import fresh_database\n"
    )
    (tmp_path / "tests" / "a" / "local.py").write_text(
        "from . import test_one\nfrom ..b import X\n"
    )
    (tmp_path / "bench" / "test_bench.py").write_text(
        "from bench.report import verdict\nfrom tests.conftest import plugin\n"
    )
    (tmp_path / "tests" / "support" / "rows.py").write_text("from tests.a.test_one import X\n")
    assert crossing_imports(tmp_path) == [
        "bench/test_bench.py:2: imports tests.conftest",
        "tests/a/local.py:2: imports tests.b",
        "tests/a/test_one.py:11: imports bench.conftest",
        "tests/a/test_one.py:4: imports tests.b.helpers",
        "tests/a/test_one.py:5: imports tests.b.helpers",
        "tests/a/test_one.py:7: imports tests.b.test_two",
        "tests/a/test_one.py:9: imports bench.test_drain",
        "tests/support/rows.py:1: imports tests.a.test_one",
    ]
