"""The ``mase-lite`` command line.

Examples::

    mase-lite run pipelines/quickstart.json
    mase-lite draw -o bert.svg                      # the default bert-tiny-shaped model
    mase-lite draw --model model.json -o model.svg  # a `model` section as in pipeline specs
    mase-lite draw runs/q/checkpoint --depth 3 --fold-repeats --color-by format -o q.svg
    mase-lite passes
    mase-lite schema pipeline
    mase-lite search pipelines/search.json          # resumable; run it on several machines at once
    mase-lite export runs/llm_gptq --format compressed-tensors -o llama-w4   # transformers, vLLM
"""

from __future__ import annotations

import argparse
import atexit
import json
import logging
import os
import re
import sys
import threading
from pathlib import Path
from typing import NoReturn

from mase_lite import __version__
from mase_lite.infra import progress
from mase_lite.infra.cores import choose_threads
from mase_lite.infra.errors import UserError, describe, shown_paths
from mase_lite.infra.faults import as_fault
from mase_lite.infra.jsonio import read_json
from mase_lite.pipeline.plugins import import_plugins
from mase_lite.infra.trust import set_trust_code


def _check_spec(args: argparse.Namespace) -> None:
    """A missing or malformed spec, named before torch and transformers load."""
    read_json(args.spec)


def _cmd_run(args: argparse.Namespace) -> int:
    from mase_lite.pipeline.runner import run_pipeline

    result = run_pipeline(args.spec, output_dir=args.output_dir)
    print(f"{result.report['name']}: {result.report['status']}; report: {result.output_dir / 'report.json'}")
    for label, metrics in result.report["metrics"].items():
        print(f"  {label}: {json.dumps(metrics)}")
    return 0


def _cmd_search(args: argparse.Namespace) -> int:
    from mase_lite.search.engine import run_search

    result = run_search(args.spec, output_dir=args.output_dir)
    for study in result.report["studies"]:
        states = ", ".join(f"{n} {s.lower()}" for s, n in study["states"].items())
        print(f"{study['name']}: {states}")
        best = [study["best"]] if "best" in study else study["pareto_front"]
        for trial in [b for b in best if b]:
            print(f"  trial {trial['number']}: {json.dumps(trial['values'])} params {json.dumps(trial['params'])}")
    print(f"report: {result.output_dir / 'search_report.json'}")
    return 0


def _cmd_draw(args: argparse.Namespace) -> int:
    from mase_lite.viz.draw import options, render
    from mase_lite.ir.graph import MaseGraph
    from mase_lite.infra.jsonio import read_json
    from mase_lite.workloads.models import ModelSpec, build_model
    from mase_lite.workloads.validation import validate_section

    opts = options(args.output, depth=args.depth, fold_repeats=args.fold_repeats, color_by=args.color_by)
    if args.graph is not None:
        if args.model:
            raise UserError("draw: give a saved graph directory or --model, not both")
        from mase_lite.passes.replay import load_graph

        mg = load_graph(args.graph)
    else:
        spec = validate_section(ModelSpec, read_json(args.model) if args.model else None, "model")
        mg = MaseGraph(build_model(spec), hf_input_names=args.inputs)
    path, drawing = render(mg, opts)
    shown = f"{drawing.boxes} boxes" if drawing is not None else f"{len(mg.nodes)} nodes"
    print(f"wrote {path} ({shown})" + (f"; {drawing.note}" if drawing is not None and drawing.note else ""))
    return 0


def _export_targets() -> list[str]:
    """The built-in export targets and those installed as entry points, without importing torch at start-up (one
    registered by a plug-in is checked when the export runs)."""
    from importlib.metadata import entry_points

    installed = [ep.name for ep in entry_points(group="mase_lite.export_targets")]
    return list(dict.fromkeys(["compressed-tensors", "gguf", "onnx", "pt2", *installed]))


def _check_export(args: argparse.Namespace) -> None:
    """The source and a new destination, checked before torch and transformers load (a path that exists is checked
    against its target's marker when the export runs)."""
    from mase_lite.deploy.destination import check_destination
    from mase_lite.deploy.sources import checkpoint_of

    checkpoint = checkpoint_of(args.source)
    if not os.path.lexists(args.output):
        check_destination(args.output, args.format, lambda path: False, overwrite=args.overwrite, field="-o",
                          sources=[checkpoint])


def _cmd_export(args: argparse.Namespace) -> int:
    from mase_lite.deploy import export
    from mase_lite.deploy.sources import checkpoint_of
    from mase_lite.passes.replay import load_graph
    from mase_lite.workloads.tokenizer import load_tokenizer

    checkpoint = checkpoint_of(args.source)
    mg = load_graph(checkpoint)
    tokenizer = load_tokenizer(checkpoint / "tokenizer", field="source") if (checkpoint / "tokenizer").is_dir() else None
    info = export(mg, args.format, args.output, tokenizer=tokenizer, overwrite=args.overwrite, sources=[checkpoint],
                  field="-o")
    print(f"wrote {info['path']} ({args.format}, {info['bytes']} bytes) from {checkpoint}")
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
        listing[name] = {"kind": info.kind, "module_mode": not info.needs_graph, "doc": info.summary, "params": fields}
    if args.json:
        print(json.dumps(listing, indent=2, default=str))
        return 0
    for name, entry in listing.items():
        print(f"{name} ({entry['kind']}{', also module mode' if entry['module_mode'] else ''}): {entry['doc']}")
        for key, f in entry["params"].items():
            print(f"    {key}: {f['type']}" + (" (required)" if f["required"] else f" = {f['default']!r}"))
    return 0


def _cmd_schema(args: argparse.Namespace) -> int:
    from mase_lite.pipeline.spec import pipeline_schema
    from mase_lite.search.spec import search_schema

    schemas = {"pipeline": pipeline_schema, "search": search_schema}
    print(json.dumps(schemas[args.kind](), indent=2))
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    from mase_lite.bench import PARTS, run_bench

    result = run_bench(args.parts or PARTS, device=args.device, quick=args.quick, output_dir=args.output_dir,
                       repeats=args.repeats)
    print((Path(args.output_dir) / "results.md").read_text(), end="")
    print(f"wrote results.md, results.json and {len(result['plots'])} plots to {args.output_dir}")
    return 0


def _threads_from_env() -> int | None:
    value = os.environ.get("MASE_LITE_THREADS")
    return int(value) if value and value.isdigit() and int(value) > 0 else None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mase-lite", description="Capture, compress and explore PyTorch models.")
    parser.add_argument("--version", action="version", version=f"mase-lite {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log what each step does")
    parser.add_argument("-q", "--quiet", action="store_true",
                        help="no progress (bars on a terminal, one line per step or trial elsewhere); "
                        "MASE_LITE_PROGRESS=0 says the same")
    parser.add_argument(
        "--plugin", action="append", default=[], metavar="MODULE_OR_FILE",
        help="import a module or .py file that registers passes (repeatable)",
    )
    parser.add_argument(
        "--threads", type=int, metavar="N", default=None,
        help="threads torch and the native kernels may use (default: $MASE_LITE_THREADS, else the cores this process may "
        "use less the processes running on them now, unless OMP_NUM_THREADS is set); the "
        "native kernels run each kind of call on one of them or all, whichever is faster, so a busy machine is not "
        "made slower by them",
    )
    parser.add_argument(
        "--trust-code", action="store_true",
        help="let checkpoints and reports name model factories, classes and plug-ins that are not registered, and "
        "lm-eval task files name Python code (they are imported and called: use only for files you trust)",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run a pipeline spec")
    run.add_argument("spec", help="pipeline JSON (or a report.json to reproduce)")
    run.add_argument("--output-dir", help="override the spec's output_dir (a reproduced run: default a new directory "
                     "beside the report, never the one it records)")
    run.set_defaults(fn=_cmd_run, check=_check_spec)

    search = sub.add_parser("search", help="run (or continue) a search spec; workers sharing its storage cooperate")
    search.add_argument("spec", help="search JSON (or a search_report.json to reproduce)")
    search.add_argument("--output-dir", help="override the spec's output_dir (a reproduced search: default a new "
                        "directory beside the report)")
    search.set_defaults(fn=_cmd_search, check=_check_spec)

    draw = sub.add_parser("draw", help="draw a saved graph, or capture a model and draw its graph")
    draw.add_argument("graph", nargs="?", help="a graph directory written by save or the checkpoint pass")
    draw.add_argument("--model", help="JSON file with a `model` section (default: bert-tiny-shaped BERT)")
    draw.add_argument("--inputs", nargs="+", default=["input_ids", "attention_mask"], help="input names")
    draw.add_argument("-o", "--output", default="graph.svg", help="output file (.svg, .png, .pdf, .dot, .graphml, .json)")
    draw.add_argument("--depth", type=int, help="draw modules this deep as one box each (1: the model's children)")
    draw.add_argument("--fold-repeats", action="store_true", help="draw runs of identical blocks once, labelled ×N")
    draw.add_argument("--color-by", default="type", help="type, format, sparsity or a profile statistic such as data_out.max")
    draw.set_defaults(fn=_cmd_draw)

    export = sub.add_parser("export", help="write a checkpoint for a runtime: compressed-tensors, gguf, onnx or pt2")
    export.add_argument("source", help="a checkpoint directory, or a run directory (or its report.json) that saved one")
    export.add_argument("--format", required=True, choices=_export_targets(),
                        help="compressed-tensors (transformers, vLLM, SGLang), gguf (llama.cpp), onnx (onnxruntime), "
                        "pt2 (torch.export)")
    export.add_argument("-o", "--output", required=True, help="directory (compressed-tensors) or file to write: a new path, "
                        "or a previous export of the same format with --overwrite (nothing else is replaced)")
    export.add_argument("--overwrite", action="store_true", help="replace a previous export of this format at the path")
    export.set_defaults(fn=_cmd_export, check=_check_export)

    passes = sub.add_parser("passes", help="list every registered pass with its parameters")
    passes.add_argument("--json", action="store_true", help="print JSON")
    passes.set_defaults(fn=_cmd_passes)

    schema = sub.add_parser("schema", help="print the JSON Schema of a spec")
    schema.add_argument("kind", nargs="?", default="pipeline", choices=["pipeline", "search"])
    schema.set_defaults(fn=_cmd_schema)

    bench = sub.add_parser("bench", help="the performance lab: torch.compile, fused attention, MXINT8, codegen")
    bench.add_argument("--parts", nargs="+", default=None,
                       help="which parts to run: compile, attention, mxint8, codegen, decode (default: all)")
    bench.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="where to run")
    bench.add_argument("--quick", action="store_true", help="small sizes, a few repeats: seconds, not minutes")
    bench.add_argument("--repeats", type=int, help="timed calls per measurement (default depends on the sizes)")
    bench.add_argument("-o", "--output-dir", default="bench", help="where results.md, results.json and plots go")
    bench.set_defaults(fn=_cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    set_trust_code(args.trust_code)
    progress.QUIET, progress.LINES = args.quiet or os.environ.get("MASE_LITE_PROGRESS") == "0", True
    try:
        if args.threads is not None and args.threads < 1:
            raise UserError(f"--threads {args.threads}: give a positive number of threads")
        getattr(args, "check", lambda args: None)(args)  # what the command line names, before torch loads
        requested = (args.threads, "--threads") if args.threads is not None else (_threads_from_env(), "MASE_LITE_THREADS")
        threads = choose_threads(*requested)
        if threads is not None:
            import torch

            torch.set_num_threads(threads)
        import_plugins(args.plugin)
        return args.fn(args)
    except UserError as err:
        print(f"mase-lite: error: {describe(err)}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `mase-lite schema | head`: the reader is gone, nothing to report
        sys.stderr.close()
        return 0
    except OSError as err:  # the tool's own writes: a full disk, a read-only or forbidden place
        fault = as_fault(err)
        if fault is None and not isinstance(err, PermissionError):
            raise
        print(f"mase-lite: error: {shown_paths(str(fault) if fault else f'{err.filename}: {err.strerror}', err)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def run() -> NoReturn:
    """The ``mase-lite`` command: :func:`main`, then exit without tearing the interpreter down.

    Freeing the modules of torch and transformers one by one takes about a second once a run has
    finished (benchmarks/RESULTS.md, quickstart). After ``main`` returns, the exit handlers run
    (``atexit``: temporary files, loggers, child processes), the standard streams are flushed and the
    process ends. While a thread that is not a daemon still runs, the exit is the ordinary one, which
    waits for it.
    """
    code = main()
    if any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        sys.exit(code)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed stream or a reader gone: nothing left to write
            pass
    os._exit(code)


if __name__ == "__main__":
    run()
