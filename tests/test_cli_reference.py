"""The command reference page (:mod:`oomlab.site.cli_reference`) against the real ``oomlab`` app.

The tree is walked here on its own (click's ``list_commands``/``get_command``), so a command,
option or help text the generator drops, or one it shows though hidden, fails a test. No GPU,
no subprocess: the page is built once, in this process.
"""

from __future__ import annotations

import html
import inspect
import re

import pytest
import typer
from rich.text import Text

from oomlab import __version__
from oomlab.cli import app
from oomlab.site.cli_reference import cli_reference

HEADING = re.compile(r"^#{2,3} (oomlab\b[^{\n]*?) \{#([\w-]+)\}$", re.M)
MARKUP = re.compile(r"\[/?(?:bold|italic|dim|underline|red|green|yellow|blue|cyan|magenta|white|link)\b[^\]]*\]|\[/\]")


def visible_commands() -> list[tuple[object, object]]:
    """``(command, context)`` for ``oomlab`` and every command below it that ``--help`` lists."""
    root = typer.main.get_command(app)
    found = []

    def walk(command, ctx):
        found.append((command, ctx))
        if hasattr(command, "list_commands"):
            for name in command.list_commands(ctx):
                sub = command.get_command(ctx, name)
                if sub is not None and not sub.hidden:
                    walk(sub, sub.context_class(sub, info_name=name, parent=ctx, **sub.context_settings))

    walk(root, root.context_class(root, info_name="oomlab"))
    return found


def sections(page: str) -> dict[str, str]:
    """Each command's part of the page, from its heading to the next one, by command path."""
    marks = list(HEADING.finditer(page))
    ends = [m.start() for m in marks[1:]] + [len(page)]
    return {m.group(1): page[m.start() : end] for m, end in zip(marks, ends, strict=True)}


def normal(text: str) -> str:
    """Words as a reader sees them: no Markdown escapes or entities, whitespace collapsed."""
    return " ".join(html.unescape(re.sub(r"\\(.)", r"\1", text)).split())


def plain_paragraphs(command) -> list[str]:
    """The command's help as the terminal shows it, paragraph by paragraph."""
    text = Text.from_markup(inspect.cleandoc(command.help or "").partition("\f")[0]).plain
    return [" ".join(p.split()) for p in text.split("\n\n") if p.strip()]


def shown_params(command, ctx) -> list:
    helps = set(command.get_help_option_names(ctx))
    return [p for p in command.get_params(ctx) if not p.hidden and not (p.opts and set(p.opts) <= helps)]


@pytest.fixture(scope="module")
def page() -> str:
    return cli_reference()


@pytest.fixture(scope="module")
def tree() -> list:
    found = visible_commands()
    assert len(found) > 10 and any(ctx.parent is not None and ctx.parent.parent is not None for _, ctx in found)
    return found


def test_every_visible_command_has_a_heading_and_its_usage(page, tree):
    parts = sections(page)
    assert set(parts) == {ctx.command_path for _, ctx in tree}  # none missing, none hidden or invented
    for command, ctx in tree:
        usage = " ".join([ctx.command_path, *command.collect_usage_pieces(ctx)])
        assert f"```text\n{usage}\n```" in parts[ctx.command_path], ctx.command_path
    assert __version__ in page.split("\n## ")[0]


def test_every_option_and_argument_is_in_its_commands_section(page, tree):
    parts = sections(page)
    checked = 0
    for command, ctx in tree:
        part = parts[ctx.command_path]
        for param in shown_params(command, ctx):
            names = [*param.opts, *param.secondary_opts] if param.param_type_name == "option" else [param.metavar]
            for name in names:
                assert f"`{name}`" in part, f"{name} missing from {ctx.command_path}"
                checked += 1
        for param in command.get_params(ctx):
            if param.hidden:  # `oomlab watch --max-checks`, for the tests' own use
                assert all(f"`{name}`" not in part for name in param.opts), f"hidden {param.opts} shown"
    assert checked > 30


def test_defaults_and_flag_pairs_are_shown(page, tree):
    parts = sections(page)
    rows = 0
    for command, ctx in tree:
        for param in shown_params(command, ctx):
            if param.param_type_name != "option":
                continue
            row = next(line for line in parts[ctx.command_path].splitlines() if line.startswith(f"| `{param.opts[0]}`"))
            cells = [cell.strip() for cell in row.strip("|").split(" | ")]
            assert len(cells) == 4, row
            if param.secondary_opts:
                assert cells[0] == f"`{param.opts[0]}` / `{param.secondary_opts[0]}`"
                assert cells[2] == f"`{(param.opts if param.default else param.secondary_opts)[0]}`"
            elif param.default is not None and param.default is not False and not callable(param.default):
                assert cells[2] == f"`{param.default}`", row
            elif param.required:  # `oomlab dev viewer-shots --memory-viz`
                assert cells[2] == "required", row
            else:
                assert cells[2] == "", row
            if not param.is_flag and param.metavar:
                assert cells[1].startswith(f"`{param.metavar}`"), row
            rows += 1
    assert rows > 20


def test_every_help_text_is_there_whole(page, tree):
    parts = sections(page)
    index = page.split("\n## ")[0]
    for command, ctx in tree:
        part = normal(parts[ctx.command_path])
        paragraphs = plain_paragraphs(command)
        assert paragraphs, f"{ctx.command_path} has no help"
        first_sentence = re.split(r"(?<=[.?!])\s", paragraphs[0])[0]
        assert first_sentence in part, ctx.command_path
        assert first_sentence in normal(index), ctx.command_path
        for paragraph in paragraphs:
            assert paragraph in part, paragraph
        for param in shown_params(command, ctx):
            if param.help:
                assert " ".join(param.help.split()) in part, param.help


def test_no_markup_and_no_none_defaults(page):
    assert not MARKUP.search(page), MARKUP.search(page)
    assert "`None`" not in page
    for row in re.findall(r"^\| .* \|$", page, re.M):
        assert "None" not in row.split(" | ")[2], row


def test_markup_and_markdown_characters_in_help_are_handled(monkeypatch):
    """Help texts written with rich markup or Markdown's own characters still read as meant."""
    real = typer.main.get_command

    def marked(typer_app):
        root = real(typer_app)
        command = next(c for c in root.commands.values() if not hasattr(c, "list_commands") and c.params)
        command.help = "[bold]Loud[/bold] start, a | pipe and *stars*.\n\n[red]Second[/red] paragraph <here>."
        command.params[0].help = "one [italic]cell[/italic] | with a pipe"
        return root

    monkeypatch.setattr(typer.main, "get_command", marked)
    page = cli_reference()
    assert not MARKUP.search(page)
    assert "Loud start, a \\| pipe and \\*stars\\*." in page
    markdown = pytest.importorskip("markdown")
    rendered = markdown.markdown(page, extensions=["tables", "attr_list", "toc"])
    assert "<td>one cell | with a pipe</td>" in rendered
    assert "<p>Loud start, a | pipe and *stars*.</p>" in rendered
    assert "<p>Second paragraph &lt;here&gt;.</p>" in rendered


def test_the_page_renders_and_every_index_link_lands(page, tree):
    markdown = pytest.importorskip("markdown")
    rendered = markdown.markdown(page, extensions=["tables", "attr_list", "toc"])
    ids = set(re.findall(r'\sid="([^"]+)"', rendered))
    index = page.split("\n## ")[0]
    links = re.findall(r"\]\(#([^)]+)\)", index)
    assert len(links) >= len(tree)
    assert not [link for link in links if link not in ids]
    for _, ctx in tree:  # each command's stable id, and an index line that links to it
        anchor = ctx.command_path.replace(" ", "-")
        assert anchor in ids
        assert f"[`{ctx.command_path}`](#{anchor})" in index or f"[**`{ctx.command_path}`**](#{anchor})" in index
    assert rendered.count("<table>") == page.count("| --- | --- | --- | --- |")
    assert "{#" not in re.sub(r"<code>.*?</code>|<pre>.*?</pre>", "", rendered, flags=re.S)  # every attr_list read


def test_every_option_of_every_command_is_read_by_the_command():
    """An option the command never reads is accepted and ignored: the user gets what they did not ask for.

    Read from the source: each parameter of a function that is a command (or the app's callback) appears in its
    body, unless the option acts through a callback of its own (``--version``).
    """
    import ast
    from pathlib import Path

    import oomlab.cli

    ignored = []
    for path in sorted(Path(oomlab.cli.__file__).parent.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.FunctionDef):
                continue
            if not any(re.search(r"\.(command|callback)\(", ast.unparse(d) + "(") for d in node.decorator_list):
                continue
            used = {n.id for stmt in node.body for n in ast.walk(stmt) if isinstance(n, ast.Name)}
            a = node.args
            with_defaults = a.args[len(a.args) - len(a.defaults) :]
            defaults = dict(zip([p.arg for p in with_defaults], a.defaults, strict=True))
            defaults |= dict(zip([p.arg for p in a.kwonlyargs], a.kw_defaults, strict=True))
            for arg in a.args + a.kwonlyargs:
                acts_itself = defaults.get(arg.arg) is not None and "callback=" in ast.unparse(defaults[arg.arg])
                if arg.arg not in used and not acts_itself:
                    ignored.append(f"{path.name}: {node.name}({arg.arg})")
    assert not ignored, f"options that no command reads: {ignored}"
