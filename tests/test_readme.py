"""The README's two commands are the ones CI runs, so what a user reads is what is tested."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def readme_commands():
    return re.findall(r"```bash\n(.+?)\n```", (ROOT / "README.md").read_text())


def test_ci_runs_the_readme_commands_verbatim():
    setup, tests = readme_commands()[:2]
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert setup in ci and tests in ci


def test_readme_installs_the_cpu_build_of_torch():
    setup = readme_commands()[0]
    assert "pip install torch==2.13.0" in setup
    assert setup.index("torch==2.13.0") < setup.index('-e ".[dev]"')


def test_readme_tour_runs_and_gives_the_seed_output_shape():
    block = re.search(r"## A short tour\n\n```python\n(.+?)```", (ROOT / "README.md").read_text(), re.S).group(1)
    namespace = {}
    exec(block, namespace)  # the README's code, exactly as a reader would paste it
    assert namespace["logits"].shape == (2, 9, 8)
