"""The docs site's reference pages, generated from the code: passes, number formats, export targets, tasks, CLI.

``python -m mase_lite.reference docs/reference`` writes them; :func:`pages` returns them (file name -> Markdown).
Each fact is read where the code keeps it: the pass registry, the format registry and its target mappings, the
export targets, the task and dataset registries, and ``mase_lite.cli.build_parser()``. What a plug-in registers in
the generating process is listed too, so ``tests/test_docs_site.py`` runs this in a fresh one.

>>> text("``a|b`` or *c* :func:`~x.y`", table=True)
'<code>a&#124;b</code> or \\\\*c\\\\* `y`'
"""

from __future__ import annotations

import argparse
import html
import inspect
import json
import re
import sys
import types
import typing
from pathlib import Path

from pydantic import BaseModel
from pydantic_core import to_jsonable_python

_ROLE = re.compile(r":[\w:]+:`(~?)([^`]+)`")  # :func:`~a.b`: the last part (``b``) with ~, else all
_CODE = re.compile(r"``(.+?)``|`([^`]+)`")


def code(value: str) -> str:
    """``value`` as inline code; as HTML where it holds a pipe or a backtick, which a table cell would split on."""
    if "|" in value or "`" in value:
        return f"<code>{html.escape(value, quote=False).replace('|', '&#124;').replace('`', '&#96;')}</code>"
    return f"`{value}`"


def _plain(value: str, table: bool) -> str:
    value = html.escape(value, quote=False).replace("\\", "\\\\").replace("*", "\\*").replace("[", "\\[")
    value = re.sub(r"(?<!\w)_|_(?!\w)", r"\\_", value)  # an underscore inside a word is no emphasis
    return value.replace("|", "\\|") if table else value


def text(doc: str, table: bool = False) -> str:
    """Docstring or help text (reStructuredText's roles and literals) as one line of Markdown."""
    doc = _ROLE.sub(lambda m: f"``{m[2].rsplit('.', 1)[-1] if m[1] else m[2]}``", " ".join(doc.split()))
    out, at = [], 0
    for m in _CODE.finditer(doc):
        out += [_plain(doc[at:m.start()], table), code(m[1] or m[2])]
        at = m.end()
    return "".join(out + [_plain(doc[at:], table)])


def paragraph(doc: str | None) -> str:
    """The first paragraph of a docstring, as Markdown."""
    first = inspect.cleandoc(doc or "").split("\n\n")[0]
    return text(first.rstrip(":") + "." if first.endswith(":") else first)  # what introduced an example


def type_name(annotation: object) -> str:
    """A field's type as Python writes it: ``int | None``, ``Literal['a', 'b']``, ``list[Rule]``."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return type_name(args[0])
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(a) for a in args)
    if origin is typing.Literal:
        return f"Literal[{', '.join(map(repr, args))}]"
    if annotation is type(None):
        return "None"
    if origin is not None:
        return f"{getattr(origin, '__name__', str(origin))}[{', '.join(type_name(a) for a in args)}]"
    return getattr(annotation, "__name__", re.sub(r"\b(?:typing|\w+(?:\.\w+)+)\.(\w+)", r"\1", str(annotation)))


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    """A Markdown table of cells already in Markdown."""
    lines = [header, ["---"] * len(header), *rows]
    return [f"| {' | '.join(cells)} |" for cells in lines] + [""]


def params_table(model: type[BaseModel]) -> list[str]:
    """Name (as a spec writes it), type, default and description of each field of ``model``."""
    rows = []
    for name, field in model.model_fields.items():
        default = "required" if field.is_required() else code(json.dumps(
            to_jsonable_python(field.get_default(call_default_factory=True)), sort_keys=True))
        rows.append([code(field.alias or name), code(type_name(field.annotation)), default,
                     text(field.description or "", table=True)])
    return table(["Parameter", "Type", "Default", "Description"], rows) if rows else ["No parameters.", ""]


def _facts(names: tuple[str, ...]) -> str:
    return ", ".join(map(code, names)) or "none"


def passes_page() -> str:
    from mase_lite.passes import all_passes

    lines = ["# Passes", "", "Every registered pass, by kind, with its params (a pipeline step's `params`).", ""]
    for kind in ("analysis", "transform"):
        lines += [f"## {kind.capitalize()} passes", ""]
        for name, info in all_passes().items():
            if info.kind != kind:
                continue
            facts = [f"requires {_facts(info.requires)}" + (" and more by params" if info.requires_for else ""),
                     f"provides {_facts(info.provides)}",
                     "also module mode" if not info.needs_graph else "needs a graph"]
            lines += [f"### {name}", "", paragraph(info.doc), "", f"*{'; '.join(facts)}.*", "",
                      *params_table(info.params)]
    return "\n".join(lines)


def _mapping_columns() -> list[tuple[str, str]]:
    """(header, mapping target) for each export target's weights and activations that some format maps."""
    from mase_lite.deploy import target_names
    from mase_lite.numerics.registry import mapped_formats

    columns = [(f"{t}{' activations' if sub else ''}", f"{t}{sub}") for t in target_names() for sub in ("", "/input")]
    return [(header, target) for header, target in columns if mapped_formats(target)]


def formats_page() -> str:
    import mase_lite.numerics  # noqa: F401  (registers the formats and their mappings)
    from mase_lite.numerics.registry import format_names, get_format, target_mapping

    columns = _mapping_columns()
    lines = ["# Number formats", "",
             "Every registered number format (a format dict's `name`) with its parameters. *Stored as*: codes (a "
             "checkpoint keeps the integer codes and shared values) or float values; *packed*: "
             "`\"storage\": \"packed\"` packs it (some of its params) into a packed layer; *calibrated*: the "
             "parameter `\"auto\"` lets calibration choose.", "",
             "## Export mappings", "",
             "✓: the format declares how the target holds it (`register_mapping`); what a target does with the other "
             "formats is on [its entry](exports.md).", ""]
    lines += table(["Format", *[text(h, table=True) for h, _ in columns]],
                   [[f"[{text(n, table=True)}](#{n})", *["✓" if target_mapping(n, t) else "" for _, t in columns]]
                    for n in format_names()])
    for name in format_names():
        fmt = get_format(name)
        facts = [f"stored as {'codes' if fmt.codec else 'float values'}",
                 f"operands {_facts(tuple(sorted(fmt.operands)))}" if fmt.operands else "any operand",
                 *(["packed"] if target_mapping(name, "packed") else []),
                 *([f"calibrated {code(fmt.calibrated.key)}"] if fmt.calibrated else [])]
        lines += [f"## {name}", "", paragraph(fmt.doc), "", f"*{'; '.join(facts)}.*", "", *params_table(fmt.params)]
    return "\n".join(lines)


def exports_page() -> str:
    from mase_lite.deploy import target_module, target_names
    from mase_lite.numerics.registry import mapped_formats

    lines = ["# Export targets", "",
             "What `mase-lite export --format`, the `export` pass and `mase_lite.deploy.export` write.", ""]
    for name in target_names():
        module = target_module(name)
        options = [p for p in inspect.signature(module.write).parameters.values()
                   if p.name not in ("mg", "path", "tokenizer")]
        mapped = [(what, mapped_formats(target))
                  for what, target in (("weights", name), ("activations", f"{name}/input"))]
        lines += [f"## {name}", "", paragraph(module.__doc__), "",
                  f"`{module.__name__}.write`: {paragraph(module.write.__doc__)}", ""]
        lines += [f"- option {code(p.name)} (default {code(json.dumps(p.default))})" for p in options]
        lines += [f"- {what}: the formats it maps: {', '.join(f'[{text(f)}](formats.md#{f})' for f in formats)}"
                  for what, formats in mapped if formats]
        lines += [""]
    return "\n".join(lines)


def tasks_page() -> str:
    from mase_lite.workloads.datasets import dataset_names, get_dataset
    from mase_lite.workloads.tasks import get_task, task_names

    lines = ["# Tasks and datasets", "", "The values of a spec's `model.task` and `data.dataset` (or any hub dataset).",
             "", "## Tasks", ""]
    for name in task_names():
        task = get_task(name)
        rows = [["Head", code(task.auto_class)], ["Inputs", _facts(task.input_names)],
                ["Metrics", _facts(task.metrics)], ["Default dataset", code(task.default_dataset)],
                ["Default model", code(json.dumps(dict(task.default_hf_config), sort_keys=True))],
                ["Data fields", _facts(task.data_fields)]]
        lines += [f"### {name}", "", *table(["", ""], rows)]
    entries = [get_dataset(name) for name in dataset_names()]
    rows = [[code(e.name), _facts(e.tasks), "yes" if e.needs_path else "", text(e.description, table=True)]
            for e in entries]
    lines += ["## Datasets", "", *table(["Dataset", "Tasks", "Needs `data.path`", "Description"], rows)]
    return "\n".join(lines)


def _option_rows(parser: argparse.ArgumentParser) -> list[list[str]]:
    rows = []
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        value = action.metavar or ("{" + ",".join(action.choices) + "}" if action.choices else action.dest)
        if action.option_strings:
            value = "" if action.nargs == 0 else value.upper() if value == action.dest else value
            value += f" [{value} ...]" if action.nargs in ("+", "*") else ""
        invocation = f"{', '.join(action.option_strings)} {value}".strip()
        default = "" if action.default in (None, False, [], argparse.SUPPRESS) else code(json.dumps(action.default))
        rows.append([code(invocation), default, text(action.help or "", table=True)])
    return rows


def cli_page() -> str:
    from mase_lite.cli import build_parser

    parser = build_parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    helps = {a.dest: a.help for a in commands._choices_actions}
    lines = ["# Command line", "", f"`mase-lite`: {text(parser.description)} Options before the command:", "",
             *table(["Option", "Default", "Description"], _option_rows(parser))]
    for name, sub in commands.choices.items():
        lines += [f"## mase-lite {name}", "", text(helps[name][:1].upper() + helps[name][1:]) + ".", "",
                  *table(["Argument", "Default", "Description"], _option_rows(sub))]
    return "\n".join(lines)


def pages() -> dict[str, str]:
    """Every reference page: file name -> Markdown."""
    makers = {"passes.md": passes_page, "formats.md": formats_page, "exports.md": exports_page, "tasks.md": tasks_page,
              "cli.md": cli_page}
    return {name: make().rstrip("\n") + "\n" for name, make in makers.items()}


def write(directory: Path) -> None:
    """Write :func:`pages` into ``directory``, removing the Markdown files there that are no page any more."""
    directory.mkdir(parents=True, exist_ok=True)
    generated = pages()
    for stale in set(p.name for p in directory.glob("*.md")) - set(generated):
        (directory / stale).unlink()
    for name, page in generated.items():
        (directory / name).write_text(page, encoding="utf-8")


if __name__ == "__main__":
    write(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/reference"))
