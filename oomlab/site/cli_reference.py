"""The site's "Command reference" page, generated from the ``oomlab`` command line itself.

:func:`cli_reference` walks the click command tree of :data:`oomlab.cli.app` (the app that
``oomlab.cli.main`` runs) and returns the page as Markdown: an index of every visible command
with its one-line summary, then per command its usage line, its whole help text and a table of
its arguments and options (names, value, default, help). Nothing here names a command or an
option, and nothing is copied by hand: a command, flag, default or docstring changed in
``oomlab/cli/`` changes the page with it, so the reference cannot drift from ``oomlab --help``.

Rich markup in help texts (``[bold]``...) is reduced to its plain text, as the terminal shows
it; backtick spans stay code, and every other character Markdown would read is escaped. Headings
carry stable ids (``{#oomlab-dev-verify}``), so the page needs ``attr_list`` (the site enables it).
No mkdocs import: a mkdocs hook writes the returned string as ``cli.md``.
"""

from __future__ import annotations

import enum
import inspect
import re

import typer
from rich.errors import MarkupError
from rich.text import Text

from oomlab import __version__

# The top-level commands are grouped by the module that defines them, in the order the app lists
# them; each command group (`oomlab dev`, `oomlab nbgrader`) is a section of its own.
SECTIONS = {"oomlab.cli.learner": "The learner's commands", "oomlab.cli.tools": "The tools"}
OTHERS = "Other commands"  # a module not named above
_SPECIAL = set("\\`*_{}[]#>|")  # what Markdown (with tables and attr_list) would read; `<` and `&` become entities


def cli_reference() -> str:
    """The Markdown of the page: an index, then one section per group of commands."""
    from oomlab.cli import app  # the commands register themselves when oomlab.cli loads

    root = typer.main.get_command(app)
    root_ctx = _context(root, "oomlab", None)  # the name `oomlab.cli.main` runs the app under
    sections: dict[object, list] = {}  # a module's name or a command group: its commands, in the app's order
    for command, ctx in _walk(root, root_ctx):
        top = ctx
        while top.parent is not None and top.parent is not root_ctx:
            top = top.parent
        key = top.command if top is not root_ctx and _is_group(top.command) else getattr(command.callback, "__module__", None)
        sections.setdefault(key, []).append((command, ctx))
    helps = " or ".join(f"`{name}`" for name in root_ctx.help_option_names)
    lines = [
        "# Command reference",
        "",
        f"Generated from the help of oomlab {__version__} itself (`oomlab {root_ctx.help_option_names[0]}`, "
        f"`oomlab COMMAND {root_ctx.help_option_names[0]}`) when this site was built. "
        f"Every command also takes {helps}, which prints its help in the terminal.",
        "",
    ]
    for key, commands in sections.items():  # the index: one line per command
        if _is_group(key):
            (group, ctx), commands = commands[0], commands[1:]
            lines += [f"[**`{ctx.command_path}`**](#{_anchor(ctx)}): {_inline(_summary(group), group)}", ""]
        else:
            lines += [f"[**{SECTIONS.get(key, OTHERS)}**](#{_slug(SECTIONS.get(key, OTHERS))})", ""]
        lines += [f"- [`{ctx.command_path}`](#{_anchor(ctx)}): {_inline(_summary(cmd), cmd)}" for cmd, ctx in commands]
        lines.append("")
    for key, commands in sections.items():
        if not _is_group(key):
            title = SECTIONS.get(key, OTHERS)
            lines += [f"## {title} {{#{_slug(title)}}}", ""]
        for command, ctx in commands:
            lines += _command_section(command, ctx, "##" if command is key else "###")
    return "\n".join(lines).rstrip("\n") + "\n"


def _context(command, name: str, parent):
    """A context for ``command`` as if it were invoked by ``name``, without parsing anything."""
    return command.context_class(command, info_name=name, parent=parent, resilient_parsing=True, **command.context_settings)


def _is_group(command) -> bool:
    return hasattr(command, "list_commands")


def _walk(command, ctx):
    """``(command, context)`` for the command and every visible one below it, in the order the app lists them."""
    yield command, ctx
    if _is_group(command):
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)  # PlainHelpGroup sets the metavars here, as `--help` shows them
            if sub is not None and not sub.hidden:
                yield from _walk(sub, _context(sub, name, ctx))


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower().replace("'", "")).strip("-")


def _anchor(ctx) -> str:
    """The heading's id: ``oomlab-dev-verify`` for ``oomlab dev verify``."""
    return _slug(ctx.command_path)


def _summary(command) -> str:
    """The help's first sentence, whole: click's short help with room for all of it."""
    return command.get_short_help_str(limit=max(len(command.help or ""), 45))


def _command_section(command, ctx, level: str) -> list[str]:
    """Heading, usage, help and the table of parameters of one command."""
    usage = " ".join([ctx.command_path, *command.collect_usage_pieces(ctx)])
    lines = [f"{level} {ctx.command_path} {{#{_anchor(ctx)}}}", "", "```text", usage, "```", ""]
    texts = [command.help or ""]
    doc = inspect.getdoc(command.callback) if command.callback is not None else None
    if getattr(command, "invoke_without_command", False) and doc and doc != command.help:
        texts.append(doc)  # what the group does when no command follows it
    for paragraph in (p for text in texts for p in _paragraphs(text, command)):
        lines += [paragraph, ""]
    rows = [_row(param, ctx, command) for param in command.get_params(ctx) if _shown(param, command, ctx)]
    if rows:
        lines += ["| Argument or option | Value | Default | Description |", "| --- | --- | --- | --- |", *rows, ""]
    return lines


def _paragraphs(text: str, command) -> list[str]:
    """The help text as click keeps it (up to a form feed), paragraph by paragraph; ``\\b`` keeps a paragraph's lines."""
    text = _plain(inspect.cleandoc(text).partition("\f")[0], command)
    paragraphs = []
    for block in text.split("\n\n"):
        if block.lstrip("\n").startswith("\b"):
            lines = block.lstrip("\n")[1:].strip("\n").splitlines()
            paragraphs.append("  \n".join(_escape(line.strip(), start=True) for line in lines if line.strip()))
        elif block.strip():
            paragraphs.append(_escape(" ".join(block.split()), start=True))
    return paragraphs


def _shown(param, command, ctx) -> bool:
    """Not hidden, and not the help option (the intro names it once for every command)."""
    is_help = bool(param.opts) and not param.expose_value and set(param.opts) <= set(command.get_help_option_names(ctx))
    return not getattr(param, "hidden", False) and not is_help


def _row(param, ctx, command) -> str:
    """One table row: names (with the flag's opposite), value, default, help."""
    if param.param_type_name == "argument":
        names = _code(_metavar(param, ctx))
        value = ""
    else:
        names = ", ".join(_code(o) for o in param.opts)
        if param.secondary_opts:
            names += " / " + ", ".join(_code(o) for o in param.secondary_opts)
        flag = getattr(param, "is_flag", False) or getattr(param, "count", False)
        value = "" if flag else _code(_metavar(param, ctx))
        limits = param if hasattr(param, "min") else getattr(param, "type", None)  # typer 0.29, or click's IntRange
        low, high = getattr(limits, "min", None), getattr(limits, "max", None)
        bounds = ", ".join(text for text, bound in ((f"≥ {low}", low), (f"≤ {high}", high)) if bound is not None)
        if bounds and not flag:
            value += f" ({bounds})"
        if getattr(param, "multiple", False):
            value += ", repeatable"
    cells = [names, value, _default(param, ctx), _inline(getattr(param, "help", None) or "", command)]
    return "| " + " | ".join(cells) + " |"


def _metavar(param, ctx) -> str:
    """What the command reports as the value's placeholder (the project's ``plain_help`` sets it)."""
    if param.metavar:
        return param.metavar
    for make in (lambda: param.make_metavar(ctx), lambda: param.make_metavar()):
        try:
            return make()
        except (AttributeError, TypeError):
            continue
    return (param.name or "value").upper()


def _default(param, ctx) -> str:
    """``required``, or the default `--help` would show; nothing for None, an unset flag, or one computed at run time."""
    if param.required:
        return "required"
    show = getattr(param, "show_default", True)
    if show is False:
        return ""
    if isinstance(show, str):
        return _inline(show, None)
    value = param.get_default(ctx, call=False)
    sentinel = isinstance(value, enum.Enum) and type(value).__module__.startswith(("click", "typer"))  # click 8.3's UNSET
    if value is None or callable(value) or sentinel:  # no default, or one computed when the command runs
        return ""
    if getattr(param, "is_flag", False) and getattr(param, "secondary_opts", None):
        return _code((param.opts if value else param.secondary_opts)[0])
    if getattr(param, "is_flag", False) or getattr(param, "count", False):
        return "" if not value else _code(str(value))
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, (list, tuple)):
        return ", ".join(_code(str(v)) for v in value)
    return _code(str(value))


def _plain(text: str, command) -> str:
    """The text as the terminal shows it: rich markup (``[bold]``...) reduced to its words when typer reads it."""
    if getattr(command, "rich_markup_mode", None) != "rich":
        return text
    try:
        return Text.from_markup(text).plain
    except MarkupError:  # not valid markup: typer would print it as it is
        return text


def _inline(text: str, command) -> str:
    """A help text on one line (a table cell, an index entry), markup removed and Markdown escaped."""
    return _escape(" ".join(_plain(text, command).split()))


def _escape(text: str, start: bool = False) -> str:
    """Escape what Markdown would read, outside backtick spans (kept as code); ``start``: also a list or heading marker."""
    parts = text.split("`")
    if len(parts) % 2 == 0:  # an odd backtick: no code spans at all
        parts = [text]
    out = []
    for i, part in enumerate(parts):
        if i % 2:
            out.append(f"`{part}`")
        else:
            out.append("".join("\\" + c if c in _SPECIAL else c for c in part).replace("&", "&amp;").replace("<", "&lt;"))
    escaped = "".join(out)
    if start:
        escaped = re.sub(r"^([-+])", r"\\\1", escaped)
        escaped = re.sub(r"^(\d+)([.)])", r"\1\\\2", escaped)
    return escaped


def _code(text: str) -> str:
    """``text`` as inline code, whatever backticks it holds."""
    fence = "`" * (max((len(run) for run in re.findall("`+", text)), default=0) + 1)
    return f"{fence} {text} {fence}" if "`" in text else f"{fence}{text}{fence}"
