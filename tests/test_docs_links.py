"""The documentation's links within the repository lead somewhere: every relative link of the
README, docs/*.md and the raw folders' READMEs names a file or folder that exists."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "docs" / "benchmark_runs").rglob("*.md")])
# [text](target) or [text](target#anchor); a web address is not the repository's to check.
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def relative_links(page):
    return [t for t in LINK.findall(page.read_text()) if not re.match(r"[a-z]+:", t)]


def test_the_pages_have_relative_links_to_check():
    # A pattern that matched nothing would pass every page below.
    assert len(PAGES) > 10 and sum(len(relative_links(p)) for p in PAGES) > 50


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_names_a_path_that_exists(page):
    missing = [t for t in relative_links(page) if not (page.parent / t).exists()]
    assert not missing, f"{page.relative_to(ROOT)} links to paths that do not exist: {missing}"
