"""Build ``docs/idioms.md`` from ``docs/idioms_template.md``, quoting the project's own source.

    python tools/build_idioms.py           # regenerate docs/idioms.md
    python tools/build_idioms.py --check   # exit 1 if docs/idioms.md is out of date, naming what drifted

The template is Markdown with three kinds of placeholder:

``{{snippet: PATH::QUALNAME [OPTIONS]}}``
    The source of a module-level function or class, a method (``Class.method``), a nested
    class, or a module-level assignment (``path::CONSTANT``, with the comment lines right
    above it), found by parsing PATH (relative to the repository root) with ``ast``. It is
    written as a fenced code block captioned with PATH and QUALNAME (no line numbers: they
    drift). Options, applied in this order:

    - ``nodoc``: leave out the docstring;
    - ``lines=A-B[,C-D...]``: keep those lines, counted from 1 at the object's first line
      (its first decorator, if it has one); a gap between ranges is shown as ``...``;
    - ``from="TEXT"`` / ``to="TEXT"``: keep the lines from the first one containing the
      ``from`` text through the first one after it containing the ``to`` text (either may
      be given alone; docstring lines are never anchors). Prefer these to ``lines=``: they
      survive edits above the excerpt;
    - ``skip="TEXT"`` (may be repeated): leave out each line containing TEXT together with the
      lines below it indented deeper (its block, or the rest of its statement), shown as one
      ``# ...`` line: production-only branches (error handling, dtype plumbing, sharding)
      that do not teach the idiom.

``{{toc}}``
    A table of contents of the ``##`` and ``###`` headings that follow it.

A fenced block opened with ```` ```python example=NAME ````
    Code that is run when the guide is built (in a fresh namespace, stdout captured, with
    ``jax_numpy_rank_promotion='raise'``, standard dtype promotion, the highest matmul
    precision, and torch's global
    RNG state restored afterwards). It is written as a Python block followed by its output.
    Its ``assert`` statements are the claims the guide makes; a failing one stops the build.
    Print only what does not depend on global settings (the tests change some).

Every generated snippet's caption ends with a ``<!-- snippet: SPEC -->`` comment, and every
example starts with ``<!-- example: NAME -->`` (invisible when rendered), so ``--check`` can name
the blocks that differ from what the source says today.
"""

import argparse
import ast
import contextlib
import difflib
import io
import re
import shlex
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The checkout this script is in, first: its examples and quotes are of this tree's code, not
# of whatever checkout the environment installed (a second worktree, an editable install).
sys.path.insert(0, str(ROOT))
TEMPLATE = ROOT / "docs" / "idioms_template.md"
OUTPUT = ROOT / "docs" / "idioms.md"
REGENERATE = "python tools/build_idioms.py"

PLACEHOLDER = re.compile(r"\{\{snippet:\s*(?P<spec>.*?)\s*\}\}")
TOC = "{{toc}}"
EXAMPLE = re.compile(r"^```python example=(?P<name>[\w-]+)[ \t]*\n(?P<code>.*?)^```[ \t]*$", re.M | re.S)
# A generated block: a snippet (caption, marker, code) or an example (marker, code, output).
BLOCK = re.compile(
    r"^[^\n]* <!-- (?P<kind>snippet): (?P<key>.*?) -->\n```python\n.*?^```$"
    r"|^<!-- (?P<kind2>example): (?P<key2>.*?) -->\n```python\n.*?^```$(?:\nOutput:\n```text\n.*?^```$)?",
    re.M | re.S,
)
HEADING = re.compile(r"^(?P<level>#{2,3}) (?P<title>.+?)\s*$", re.M)
_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


class SnippetError(ValueError):
    """A placeholder that does not resolve: no such file, qualname, or excerpt text."""


# ----------------------------------------------------------------------------- snippets


def parse_spec(spec):
    """``'path::Qual.name from="x" nodoc'`` -> (path, qualname, {option: value})."""
    try:
        words = shlex.split(spec)
    except ValueError as e:
        raise SnippetError(f"{{{{snippet: {spec}}}}}: cannot parse ({e})") from None
    if not words or "::" not in words[0]:
        raise SnippetError(f"{{{{snippet: {spec}}}}}: expected PATH::QUALNAME first")
    path, _, qualname = words[0].partition("::")
    options = {}
    for word in words[1:]:
        key, eq, value = word.partition("=")
        if key not in ("nodoc", "lines", "from", "to", "skip") or (key == "nodoc") == bool(eq):
            raise SnippetError(f"{{{{snippet: {spec}}}}}: unknown option {word!r} (nodoc, lines=, from=, to=, skip=)")
        if key == "skip":
            options.setdefault("skip", []).append(value)
        else:
            options[key] = value if eq else True
    return path, qualname, options


def _member(body, name):
    """The last top-level definition or assignment of ``name`` in ``body`` (as Python binds it)."""
    found = None
    for node in body:
        if isinstance(node, _DEFS) and node.name == name:
            found = node
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            found = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
            found = node
    return found


def find_node(tree, qualname):
    node, body = None, tree.body
    for part in qualname.split("."):
        node = _member(body, part)
        if node is None:
            return None
        body = node.body if isinstance(node, _DEFS) else []
    return node


def _docstring_lines(node, first):
    """Line numbers (relative to ``first``) of ``node``'s docstring, if it has one."""
    if isinstance(node, _DEFS) and node.body and isinstance(node.body[0], ast.Expr):
        value = node.body[0].value
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            return set(range(node.body[0].lineno - first + 1, node.body[0].end_lineno - first + 2))
    return set()


def _ranges(text, spec):
    out = []
    for part in text.split(","):
        a, dash, b = part.strip().partition("-")
        try:
            lo, hi = int(a), int(b) if dash else int(a)
        except ValueError:
            raise SnippetError(f"{{{{snippet: {spec}}}}}: lines={text!r} is not like 3-10,12-14") from None
        if not 1 <= lo <= hi:
            raise SnippetError(f"{{{{snippet: {spec}}}}}: bad line range {part!r}")
        out.append((lo, hi))
    return out


def _indent(text):
    return len(text) - len(text.lstrip())


def resolve(spec, root=ROOT):
    """The source text a placeholder quotes (dedented) and whether it is an excerpt."""
    path, qualname, options = parse_spec(spec)
    file = root / path
    if not file.is_file():
        raise SnippetError(f"{{{{snippet: {spec}}}}}: no file {path}")
    source = file.read_text()
    node = find_node(ast.parse(source, filename=path), qualname)
    if node is None:
        raise SnippetError(f"{{{{snippet: {spec}}}}}: {path} has no {qualname}")
    lines = source.splitlines()
    first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    if isinstance(node, (ast.Assign, ast.AnnAssign)):  # a constant's explanation sits above it
        while first > 1 and lines[first - 2].lstrip().startswith("#"):
            first -= 1
    # (relative line number, text), numbered from 1 at the object's first line.
    kept = list(enumerate(lines[first - 1:node.end_lineno], start=1))
    gaps_shown = False
    doc = _docstring_lines(node, first)
    if options.get("nodoc"):
        if not doc:
            raise SnippetError(f"{{{{snippet: {spec}}}}}: nodoc, but {qualname} has no docstring")
        kept = [(n, t) for n, t in kept if n not in doc]
    if "lines" in options:
        ranges = _ranges(options["lines"], spec)
        last = kept[-1][0]
        if any(hi > last for _, hi in ranges):
            raise SnippetError(f"{{{{snippet: {spec}}}}}: {qualname} has only {last} lines")
        kept = [(n, t) for n, t in kept if any(lo <= n <= hi for lo, hi in ranges)]
        gaps_shown = True
    if "from" in options or "to" in options:
        # The docstring is prose: its lines are never anchors.
        texts = [None if n in doc else t for n, t in kept]
        start = 0
        if "from" in options:
            start = next((i for i, t in enumerate(texts) if t and options["from"] in t), None)
            if start is None:
                raise SnippetError(f"{{{{snippet: {spec}}}}}: no line of {qualname} contains {options['from']!r}")
        stop = len(texts) - 1
        if "to" in options:
            stop = next((i for i in range(start, len(texts)) if texts[i] and options["to"] in texts[i]), None)
            if stop is None:
                raise SnippetError(
                    f"{{{{snippet: {spec}}}}}: no line of {qualname} from the start of the excerpt "
                    f"contains {options['to']!r}"
                )
        kept = kept[start:stop + 1]
    elided = set()
    for marker in options.get("skip", []):
        hits = [i for i, (n, t) in enumerate(kept) if n not in doc and marker in t]
        if not hits:
            raise SnippetError(f"{{{{snippet: {spec}}}}}: skip={marker!r}, but no quoted line of {qualname} contains it")
        for i in hits:
            depth = _indent(kept[i][1])
            elided.add(i)
            j = i + 1  # the block or continuation below: deeper lines (and blank lines among them)
            while j < len(kept) and (not kept[j][1].strip() or _indent(kept[j][1]) > depth):
                j += 1
            while j > i + 1 and not kept[j - 1][1].strip():  # a trailing blank line stays
                j -= 1
            elided.update(range(i + 1, j))
    out = []
    for i, (n, text) in enumerate(kept):
        if i in elided:
            if i - 1 not in elided:
                out.append(" " * _indent(text) + "# ...")
            continue
        if gaps_shown and i and n != kept[i - 1][0] + 1:
            out.append(" " * _indent(text) + "...")
        out.append(text)
    excerpt = bool({"lines", "from", "to", "skip"} & set(options))
    return textwrap.dedent("\n".join(out)).strip("\n"), excerpt, bool(options.get("nodoc"))


def render_snippet(spec, root=ROOT):
    code, excerpt, nodoc = resolve(spec, root)
    path, qualname, _ = parse_spec(spec)
    notes = [n for n, on in (("excerpt", excerpt), ("docstring omitted", nodoc)) if on]
    caption = f"`{path}` · `{qualname}`" + (f" ({', '.join(notes)})" if notes else "")
    return f"{caption} <!-- snippet: {spec} -->\n```python\n{code}\n```"


# ----------------------------------------------------------------------------- examples


def run_example(name, code):
    """Run an example's code; its stdout. An exception (a failed assert) is a SnippetError."""
    import jax  # only when there are examples to run

    buffer = io.StringIO()
    namespace = {"__name__": f"idioms_example_{name.replace('-', '_')}"}
    try:
        with contextlib.ExitStack() as stack:
            stack.enter_context(contextlib.redirect_stdout(buffer))
            stack.enter_context(jax.numpy_rank_promotion("raise"))
            # JAX's default dtype promotion, as a user's script runs (optax's Adam mixes Python
            # floats with its int32 step count): the same output whether the tests (strict) or
            # the command line build the guide.
            stack.enter_context(jax.numpy_dtype_promotion("standard"))
            stack.enter_context(jax.default_matmul_precision("highest"))
            try:  # an example may seed or draw from torch's global generator: not the caller's
                import torch

                stack.enter_context(torch.random.fork_rng(devices=[]))
            except ImportError:
                pass
            exec(compile(code, f"<idioms example {name}>", "exec"), namespace)
    except Exception as e:  # noqa: BLE001 - reported with the example's name
        raise SnippetError(f"example {name!r} failed: {type(e).__name__}: {e}") from e
    return buffer.getvalue()


def render_example(name, code):
    output = run_example(name, code).rstrip("\n")
    shown = f"\nOutput:\n```text\n{output}\n```" if output else ""
    return f"<!-- example: {name} -->\n```python\n{code.rstrip()}\n```{shown}"


# ----------------------------------------------------------------------------- the document


def _anchor(title):
    """GitHub's heading anchor: lower case, punctuation dropped, spaces to hyphens."""
    text = title.replace("`", "").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def render_toc(text):
    """A nested list of the ``##``/``###`` headings of ``text`` (code blocks skipped)."""
    prose = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    items = []
    for m in HEADING.finditer(prose):
        indent = "  " if m["level"] == "###" else ""
        items.append(f"{indent}- [{m['title']}](#{_anchor(m['title'])})")
    return "\n".join(items)


def placeholders(template):
    """Every snippet spec of ``template``, in order."""
    return [m["spec"] for m in PLACEHOLDER.finditer(template)]


def examples(template):
    """{name: code} of every example block of ``template``."""
    return {m["name"]: m["code"] for m in EXAMPLE.finditer(template)}


def build(template=None, root=ROOT):
    """The text of docs/idioms.md. Raises SnippetError naming every placeholder that fails."""
    template = TEMPLATE.read_text() if template is None else template
    errors = []

    def snippet(m):
        try:
            return render_snippet(m["spec"], root)
        except SnippetError as e:
            errors.append(str(e))
            return m[0]

    def example(m):
        try:
            return render_example(m["name"], m["code"])
        except SnippetError as e:
            errors.append(str(e))
            return m[0]

    names = [m["name"] for m in EXAMPLE.finditer(template)]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        errors.append(f"example names used twice: {', '.join(duplicates)}")
    # Examples first: their code is not searched for snippet placeholders.
    text = EXAMPLE.sub(example, template)
    text = PLACEHOLDER.sub(snippet, text)
    if TOC in text:
        head, tail = text.split(TOC, 1)
        text = head + render_toc(tail) + tail
    if errors:
        raise SnippetError("\n".join(errors))
    header = (
        "<!-- Generated by tools/build_idioms.py from docs/idioms_template.md: edit the template, "
        f"then run `{REGENERATE}`. -->\n"
    )
    return header + text


def blocks(text):
    """{key: body} of the generated blocks of a built document (key: 'snippet SPEC' / 'example NAME')."""
    return {f"{m['kind'] or m['kind2']} {m['key'] or m['key2']}": m[0] for m in BLOCK.finditer(text)}


def drifted(committed, expected):
    """What differs between the committed document and the one the source gives today:
    a list of lines naming the snippets and examples that changed (or the prose)."""
    if committed == expected:
        return []
    have, want = blocks(committed), blocks(expected)
    out = []
    for key, body in want.items():
        if key not in have:
            out.append(f"{key}: not in docs/idioms.md (new in the template)")
        elif have[key] != body:
            what = "no longer matches the code it quotes" if key.startswith("snippet") else "output or code changed"
            out.append(f"{key}: {what}")
    out += [f"{key}: in docs/idioms.md but no longer in the template" for key in have if key not in want]
    if not out:
        out.append("the prose differs (docs/idioms_template.md was edited, or docs/idioms.md by hand)")
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m tools.build_idioms", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/idioms.md differs from what would be generated")
    args = parser.parse_args(argv)
    try:
        expected = build()
    except SnippetError as e:
        print(f"cannot build docs/idioms.md:\n{e}", file=sys.stderr)
        return 1
    if not args.check:
        OUTPUT.write_text(expected)
        print(f"wrote {OUTPUT.relative_to(ROOT)} ({len(expected.splitlines())} lines)")
        return 0
    committed = OUTPUT.read_text() if OUTPUT.exists() else ""
    problems = drifted(committed, expected)
    if not problems:
        print("docs/idioms.md is up to date")
        return 0
    print(f"docs/idioms.md is out of date; run `{REGENERATE}`:", file=sys.stderr)
    for line in problems:
        print(f"  {line}", file=sys.stderr)
    diff = difflib.unified_diff(committed.splitlines(), expected.splitlines(), "docs/idioms.md", "generated", lineterm="", n=1)
    print("\n".join(list(diff)[:60]), file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
