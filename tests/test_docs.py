"""The documentation keeps up with the code: the layout map in docs/development.md names every
module and top-level folder and nothing that is gone, README.md stays a short front page, and
every page of docs/ is reachable from mkdocs.yml's nav (mkdocs build --strict, in .ci/run,
checks the links)."""

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def layout_map() -> list[str]:
    """The paths in the first column of docs/development.md's layout table."""
    text = (DOCS / "development.md").read_text()
    return re.findall(r"^\| `([^`]+)` \|", text, flags=re.M)


def modules() -> set[str]:
    return {
        path.relative_to(ROOT).as_posix()
        for path in (ROOT / "dashboard").rglob("*.py")
        if path.name != "__init__.py" and "__pycache__" not in path.parts
    }


def top_level_folders() -> set[str]:
    """Folders holding a file git tracks or would track (ignored ones, such as .venv, are left out)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\0")
    return {f"{path.split('/')[0]}/" for path in listed if "/" in path and (ROOT / path).exists()}


def test_layout_map_names_every_module_and_folder():
    named = set(layout_map())
    assert modules() - named == set(), "modules missing from docs/development.md's layout"
    assert top_level_folders() - named == set(), "folders missing from docs/development.md's layout"


def test_layout_map_names_nothing_that_is_gone():
    gone = [path for path in layout_map() if not (ROOT / path).exists()]
    assert gone == [], "docs/development.md's layout names paths that no longer exist"


def test_readme_is_a_short_front_page():
    size = len((ROOT / "README.md").read_bytes())
    assert size <= 10 * 1024, f"README.md is {size} bytes: move detail into docs/"


def test_every_docs_page_is_in_the_nav():
    nav = (ROOT / "mkdocs.yml").read_text().split("\nnav:\n", 1)[1]
    in_nav = set(re.findall(r":\s*(\S+\.md)\s*$", nav, flags=re.M))
    pages = {path.relative_to(DOCS).as_posix() for path in DOCS.rglob("*.md")}
    assert pages - in_nav == set(), "pages of docs/ missing from mkdocs.yml's nav"
    assert in_nav - pages == set(), "mkdocs.yml's nav names pages that do not exist"


def ci_bench_loop() -> tuple[str, set[str]]:
    """.ci/run's loop over the benchmarks: its `for` line and the helper modules it skips."""
    text = (ROOT / ".ci" / "run").read_text()
    loop = re.search(r"^for (\w+) in (\S+); do$", text, flags=re.M)
    skipped = re.search(r"^\s+([\w| ]+)\) continue ;;", text, flags=re.M)
    assert loop and skipped, ".ci/run has no loop over bench/ that skips the helper modules"
    return loop[2], {name.strip() for name in skipped[1].split("|")}


def test_ci_runs_every_benchmark_in_quick_mode():
    """A benchmark takes its command line from bench/options.py, which gives it --quick; .ci/run
    runs every script in bench/ but the helper modules it names, so a new benchmark without a
    quick mode fails here."""
    pattern, helpers = ci_bench_loop()
    assert pattern == "bench/*.py", ".ci/run's benchmark loop must cover every script in bench/"
    scripts = {path.stem: path.read_text() for path in (ROOT / "bench").glob("*.py")}
    assert helpers <= set(scripts), ".ci/run skips bench modules that no longer exist"
    quick = {
        name
        for name, source in scripts.items()
        if re.search(r"^import options$", source, flags=re.M) and "options.Options(__doc__" in source
    }
    assert set(scripts) - helpers - quick == set(), "benchmarks without --quick (from options.Options)"
    assert helpers & quick == set(), ".ci/run skips benchmarks as if they were helper modules"
