"""The docs site's wiring: what `mkdocs build --strict` (run by `make test`) checks depends on it.

The README is the site's home page and the runbook one of its pages, so the strict build checks their links too;
the examples of every page run through sybil (conftest.py at the top of the repository).
"""

from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def _nav_pages(nav: list[Any]) -> set[str]:
    pages: set[str] = set()
    for entry in nav:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        pages |= _nav_pages(value) if isinstance(value, list) else {value}
    return pages


def test_the_home_page_is_the_readme_and_the_runbook_page_is_rules_runbook() -> None:
    assert 'include-markdown "../README.md"' in (DOCS / "index.md").read_text()
    assert 'include-markdown "../../rules/RUNBOOK.md"' in (DOCS / "sre" / "runbook.md").read_text()


def test_the_readme_is_a_front_door() -> None:
    readme = (ROOT / "README.md").read_text().splitlines()
    assert len(readme) <= 250
    first_block = readme[readme.index("```bash") + 1:readme.index("```", readme.index("```bash") + 1)]
    assert [line.split()[:2] for line in first_block] == [["make", "demo"], ["make", "test"]]


def test_every_page_is_in_the_nav_and_the_strict_build_fails_on_a_broken_link_or_anchor() -> None:
    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=yaml.BaseLoader)  # BaseLoader: !!python tags
    assert {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")} == _nav_pages(config["nav"])
    assert config["strict"] == "true"
    assert {config["validation"][key] for key in ("omitted_files", "unrecognized_links", "anchors")} == {"warn"}


def test_make_test_builds_the_docs_strictly_before_the_suite() -> None:
    makefile = (ROOT / "Makefile").read_text()
    recipe = makefile[makefile.index("\ntest:"):].split("\n\n")[0]
    assert "mkdocs build --strict" in recipe and recipe.index("mkdocs build") < recipe.index("pytest")
    assert (ROOT / ".ci" / "run").read_text().strip().endswith("make test")
