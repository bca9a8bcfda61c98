"""The ``mase-lite`` command line.

Examples::

    mase-lite run pipelines/quickstart.json
    mase-lite draw -o bert.svg                      # the default bert-tiny-shaped model
    mase-lite draw --model model.json -o model.svg  # a `model` section as in pipeline specs
    mase-lite passes
    mase-lite schema pipeline
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys

from mase_lite import __version__
from mase_lite.errors import UserError


def _cmd_run(args: argparse.Namespace) -> int:
    from mase_lite.pipeline.runner import run_pipeline

    result = run_pipeline(args.spec, output_dir=args.output_dir)
    print(f"{result.report['name']}: {result.report['status']}; report: {result.output_dir / 'report.json'}")
    for label, metrics in result.report["metrics"].items():
        print(f"  {label}: {json.dumps(metrics)}")
    return 0


def _cmd_draw(args: argparse.Namespace) -> int:
    from mase_lite.ir.graph import MaseGraph
    from mase_lite.pipeline.spec import read_json
    from mase_lite.train.models import ModelSpec, build_model
    from mase_lite.train.validation import validate_section

    spec = validate_section(ModelSpec, read_json(args.model) if args.model else None, "model")
    model = build_model(spec)
    mg = MaseGraph(model, hf_input_names=args.inputs)
    path = mg.draw(args.output)
    print(f"wrote {path} ({len(mg.nodes)} nodes)")
    return 0


def _type_name(annotation) -> str:
    if isinstance(annotation, type):
        return annotation.__name__
    return re.sub(r"\b(?:typing|[\w]+(?:\.[\w]+)+)\.(\w+)", r"\1", str(annotation))


def _cmd_passes(args: argparse.Namespace) -> int:
    from mase_lite.passes import all_passes

    listing = {}
    for name, info in all_passes().items():
        fields = {
            key: {
                "type": _type_name(f.annotation),
                "required": f.is_required(),
                "default": None if f.is_required() else f.get_default(call_default_factory=True),
            }
            for key, f in info.params.model_fields.items()
        }
        listing[name] = {"kind": info.kind, "doc": info.summary, "params": fields}
    if args.json:
        print(json.dumps(listing, indent=2, default=str))
        return 0
    for name, entry in listing.items():
        print(f"{name} ({entry['kind']}): {entry['doc']}")
        for key, f in entry["params"].items():
            print(f"    {key}: {f['type']}" + (" (required)" if f["required"] else f" = {f['default']!r}"))
    return 0


def _cmd_schema(args: argparse.Namespace) -> int:
    from mase_lite.pipeline.spec import pipeline_schema

    schemas = {"pipeline": pipeline_schema}
    print(json.dumps(schemas[args.kind](), indent=2))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mase-lite", description="Capture, compress and explore PyTorch models.")
    parser.add_argument("--version", action="version", version=f"mase-lite {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run a pipeline spec")
    run.add_argument("spec", help="pipeline JSON (or a report.json to reproduce)")
    run.add_argument("--output-dir", help="override the spec's output_dir")
    run.set_defaults(fn=_cmd_run)

    draw = sub.add_parser("draw", help="capture a model and draw its graph")
    draw.add_argument("--model", help="JSON file with a `model` section (default: bert-tiny-shaped BERT)")
    draw.add_argument("--inputs", nargs="+", default=["input_ids", "attention_mask"], help="input names")
    draw.add_argument("-o", "--output", default="graph.svg", help="output file (.svg, .png, .pdf, .dot)")
    draw.set_defaults(fn=_cmd_draw)

    passes = sub.add_parser("passes", help="list every registered pass with its parameters")
    passes.add_argument("--json", action="store_true", help="print JSON")
    passes.set_defaults(fn=_cmd_passes)

    schema = sub.add_parser("schema", help="print the JSON Schema of a spec")
    schema.add_argument("kind", nargs="?", default="pipeline", choices=["pipeline"])
    schema.set_defaults(fn=_cmd_schema)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.fn(args)
    except UserError as err:
        print(f"mase-lite: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
