"""What a ``.pt2`` archive may hold before torch reads it: the parts of a ``torch.export`` program that are data.

``torch.export.load`` unpickles sample inputs and pickled constants (falling back to ``weights_only=False``),
evaluates the program's symbolic shapes with ``sympy.sympify`` (Python's ``eval``), resolves each node's target
as any attribute under ``torch`` (``torch.os.system`` among them), runs guard code with ``exec`` and loads
AOTInductor shared libraries. So an archive someone else made is checked first, and refused naming the member
and the field at fault unless every part is one of:

- the members :func:`torch.export.save` writes for one program (format, version, byte order, the program's JSON,
  its weights and constants as raw tensor bytes, its sample inputs, ``extra/`` text files), all stored
  uncompressed;
- tensors stored raw (no pickled payload, no custom or opaque objects); sample inputs that load with
  ``torch.load(weights_only=True)`` as tensors in tuples and dicts;
- node targets that are operator overloads of the ``aten``, ``prims`` and ``mase_lite`` namespaces, or Python's
  ``operator.getitem`` and arithmetic;
- symbolic expressions made only of sympy's and torch's shape functions, integer symbols and literals;
- names that are dotted identifiers; guard code (which torch runs as Python) that only relates the inputs'
  sizes (``L['input_ids'].size()[1] == L['attention_mask'].size()[1]``): torch writes such guards for a model of
  several inputs.

>>> expression("Mul(Integer(64), Symbol('s50', positive=True, integer=True))", "x")
>>> expression("eval('1')", "x")
Traceback (most recent call last):
...
mase_lite.infra.errors.UserError: x: "eval('1')" calls something other than a symbolic-shape function
"""

from __future__ import annotations

import ast
import io
import json
import re
import zipfile
from typing import Any

from mase_lite.infra.errors import UserError, short

MEMBERS = re.compile(
    r"(archive_format|archive_version|byteorder|\.data/version|\.data/serialization_id|models/model\.json"
    r"|data/sample_inputs/model\.pt|data/(weights/model_weights|constants/model_constants)_config\.json"
    r"|data/weights/weight_\d+|data/constants/tensor_\d+|extra/[\w.-]+)")
NAMESPACES = ("aten", "prims", "mase_lite")
OPERATORS = {"getitem", "add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "neg", "pos", "eq", "ne", "lt",
             "le", "gt", "ge", "and_", "or_", "not_", "abs"}
IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*")
SYMBOL = re.compile(r"[a-z]+\d+")
SYMPY_NAMES = {"Symbol", "Integer", "Rational", "Float", "Add", "Mul", "Pow", "Max", "Min", "Abs", "Mod", "Eq", "Ne",
               "Lt", "Le", "Gt", "Ge", "StrictLessThan", "StrictGreaterThan", "LessThan", "GreaterThan", "Equality",
               "Unequality", "And", "Or", "Not", "true", "false", "True", "False", "oo", "zoo", "nan", "Piecewise",
               "floor", "ceiling", "sqrt", "log", "exp", "FloorDiv", "ModularIndexing", "Where", "PythonMod",
               "CleanDiv", "CeilToInt", "FloorToInt", "CeilDiv", "LShift", "RShift", "PowByNatural", "FloatPow",
               "FloatTrueDiv", "IntTrueDiv", "IsNonOverlappingAndDenseIndicator", "TruncToFloat", "TruncToInt",
               "RoundToInt", "RoundDecimal", "ToFloat", "OpaqueUnaryFn_sqrt", "BitwiseFn_bitwise_and",
               "BitwiseFn_bitwise_or", "Identity"}
SYNTAX = (ast.Expression, ast.Call, ast.Name, ast.Load, ast.Constant, ast.keyword, ast.BinOp, ast.UnaryOp,
          ast.Compare, ast.BoolOp, ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.USub,
          ast.UAdd, ast.Not, ast.And, ast.Or, ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.Tuple)
COMPARISONS = (ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE)
MAX_EXPRESSION = 4096  # characters: torch writes a few dozen


def check_archive(data: bytes, where: str) -> None:
    """Refuse (a ``UserError`` naming ``where``, the member and the field) an archive holding anything but data."""
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
        infos = archive.infolist()
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as err:
        raise UserError(f"{where}: not a torch.export archive ({err})") from None
    if not infos:
        raise UserError(f"{where}: an empty archive")
    root = infos[0].filename.split("/", 1)[0]
    members = {}
    for info in infos:
        head, _, name = info.filename.partition("/")
        if head != root or not MEMBERS.fullmatch(name):
            raise UserError(f"{where}: member {short(info.filename)} is not part of a torch.export program "
                            "(a program's JSON, raw tensors, sample inputs, extra text), so the archive is not read")
        if info.compress_type != zipfile.ZIP_STORED or info.file_size != info.compress_size or name in members:
            raise UserError(f"{where}: member {info.filename!r} is compressed or repeated; torch.export stores each once, "
                            "uncompressed")
        members[name] = info
    for needed in ("archive_format", "models/model.json", "data/sample_inputs/model.pt"):
        if needed not in members:
            raise UserError(f"{where}: member {root}/{needed} is missing")

    def read(name: str) -> bytes:
        try:
            return archive.read(members[name])
        except (zipfile.BadZipFile, OSError, EOFError, ValueError) as err:  # a damaged member: its CRC, its header
            raise UserError(f"{where}: member {root}/{name} is damaged ({err})") from None

    for config in ("data/weights/model_weights_config.json", "data/constants/model_constants_config.json"):
        if config in members:
            _payloads(_json(read(config), f"{where}: {root}/{config}"), f"{where}: {root}/{config}")
    _sample_inputs(read("data/sample_inputs/model.pt"), f"{where}: {root}/data/sample_inputs/model.pt")
    program(_json(read("models/model.json"), f"{where}: {root}/models/model.json"), f"{where}: {root}/models/model.json")


def _json(data: bytes, where: str) -> Any:
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as err:
        raise UserError(f"{where}: not readable JSON ({type(err).__name__}: {str(err)[:200]})") from None


def _payloads(config: Any, where: str) -> None:
    """Every weight or constant a raw tensor under a dotted name (no pickle, no custom or opaque object)."""
    entries = config.get("config") if isinstance(config, dict) else None
    if not isinstance(entries, dict):
        raise UserError(f"{where}: expected {{'config': {{name: payload}}}}")
    for name, payload in entries.items():
        if not _dotted(name):
            raise UserError(f"{where}: config.{short(name)} is not a dotted name")
        if not isinstance(payload, dict) or payload.get("use_pickle") is not False:
            raise UserError(f"{where}: config.{name} is a pickled object, which is not loaded from a file someone "
                            "else may have made")
        path = payload.get("path_name")
        if not isinstance(path, str) or not re.fullmatch(r"(weight|tensor)_\d+", path):
            raise UserError(f"{where}: config.{name}.path_name = {short(path)} is not a raw tensor of the archive")


def _sample_inputs(data: bytes, where: str) -> None:
    """Sample inputs that ``torch.load`` reads with ``weights_only=True`` (torch falls back to full unpickling
    when that fails): tensors in tuples and dicts."""
    import torch

    try:
        value = torch.load(io.BytesIO(data), weights_only=True)
    except Exception as err:  # the restricted unpickler's refusal, whatever it is
        raise UserError(f"{where}: not plain tensors ({type(err).__name__}: {str(err).splitlines()[0][:200]}); "
                        "it is not unpickled") from None

    def plain(v: Any) -> bool:
        if isinstance(v, (tuple, list)):
            return all(plain(x) for x in v)
        if isinstance(v, dict):
            return all(isinstance(k, str) and plain(x) for k, x in v.items())
        return isinstance(v, (torch.Tensor, int, float, bool, type(None)))

    if not plain(value):
        raise UserError(f"{where}: not plain tensors in tuples and dicts")


def program(model: Any, where: str) -> None:
    """Refuse a program JSON whose node targets, symbolic expressions, names or guards are more than data."""
    if not isinstance(model, dict) or not isinstance(model.get("graph_module"), dict):
        raise UserError(f"{where}: not a torch.export program (no graph_module)")
    guards(model.get("guards_code") or [], f"{where}: guards_code")
    graph = model["graph_module"].get("graph")
    nodes = graph.get("nodes") if isinstance(graph, dict) else None
    if not isinstance(nodes, list):
        raise UserError(f"{where}: graph_module.graph.nodes is not a list")
    for i, node in enumerate(nodes):
        field = f"graph_module.graph.nodes.{i}"
        if not isinstance(node, dict):
            raise UserError(f"{where}: {field} is not a node")
        target(node.get("target"), f"{where}: {field}.target")
        if not _dotted(node.get("name", "")):
            raise UserError(f"{where}: {field}.name = {short(node.get('name'))} is not an identifier")
    for key in model.get("range_constraints") or {}:
        if not SYMBOL.fullmatch(str(key)):
            raise UserError(f"{where}: range_constraints.{short(key)} is not a shape symbol")
    for field, text in _expressions(model):
        expression(text, f"{where}: {field}")


def guards(code: Any, where: str) -> None:
    """Refuse guard code (torch's loader runs it as Python) that is more than relations of the inputs' sizes:
    integers, arithmetic, comparisons and ``L['<input>'].size()[<dim>]``."""
    if not isinstance(code, list):
        raise UserError(f"{where}: not a list of guards")
    for i, text in enumerate(code):
        try:
            ok = isinstance(text, str) and len(text) <= MAX_EXPRESSION
            ok = ok and _size_relation(ast.parse(text, mode="eval").body)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            ok = False
        if not ok:
            raise UserError(f"{where}.{i} = {short(text)} holds Python code other than a relation of the inputs' sizes, "
                            "which is not run from a file someone else may have made")


def _size_relation(node: ast.AST) -> bool:
    """Whether ``node`` is made only of integers, arithmetic, comparisons and ``L['<input>'].size()[<dim>]``."""
    match node:
        case ast.Constant(value=int()):
            return True
        case ast.UnaryOp(op=ast.USub() | ast.UAdd() | ast.Not(), operand=operand):
            return _size_relation(operand)
        case ast.BinOp(left=left, op=ast.Add() | ast.Sub() | ast.Mult() | ast.FloorDiv() | ast.Mod(), right=right):
            return _size_relation(left) and _size_relation(right)
        case ast.Compare(left=left, ops=ops, comparators=rest):
            return all(isinstance(op, COMPARISONS) for op in ops) and all(map(_size_relation, [left, *rest]))
        case ast.BoolOp(values=values):
            return all(map(_size_relation, values))
        case ast.Subscript(value=ast.Call(func=ast.Attribute(value=ast.Subscript(value=ast.Name(id="L"),
                                                                              slice=ast.Constant(value=str(name))),
                                                             attr="size"), args=[], keywords=[]),
                           slice=ast.Constant(value=int())):
            return IDENTIFIER.fullmatch(name) is not None
    return False


def target(name: Any, where: str) -> None:
    """Refuse a node target that is not an aten/prims/mase_lite operator overload or an arithmetic operator."""
    import torch

    if isinstance(name, str) and name.startswith("_operator.") and name.removeprefix("_operator.") in OPERATORS:
        return
    parts = name.split(".") if isinstance(name, str) else []
    if len(parts) == 5 and parts[:2] == ["torch", "ops"] and parts[2] in NAMESPACES:
        try:
            found = getattr(getattr(getattr(torch.ops, parts[2]), parts[3]), parts[4])
        except (AttributeError, RuntimeError):
            found = None
        if isinstance(found, torch._ops.OpOverload):
            return
    raise UserError(f"{where} = {short(name)} is not an operator of {', '.join(NAMESPACES)} or arithmetic, so it is "
                    "not called")


def expression(text: Any, where: str) -> None:
    """Refuse a symbolic-shape expression that is more than sympy's functions of symbols and literals (sympy
    evaluates the text as Python)."""
    if not isinstance(text, str) or len(text) > MAX_EXPRESSION:
        raise UserError(f"{where}: a symbolic expression of {len(text) if isinstance(text, str) else type(text).__name__} "
                        "is not evaluated")
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise UserError(f"{where}: {short(text)} is not a symbolic expression") from None
    for node in ast.walk(tree):
        if not isinstance(node, SYNTAX):
            raise UserError(f"{where}: {short(text)} holds {type(node).__name__}, which a symbolic expression has not")
        if isinstance(node, ast.Call) and not (isinstance(node.func, ast.Name) and node.func.id in SYMPY_NAMES):
            raise UserError(f"{where}: {short(text)} calls something other than a symbolic-shape function")
        if isinstance(node, ast.Name) and node.id not in SYMPY_NAMES and not SYMBOL.fullmatch(node.id):
            raise UserError(f"{where}: {node.id!r} is not a symbolic-shape function, so it is not evaluated")
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and not SYMBOL.fullmatch(node.value):
            raise UserError(f"{where}: {short(node.value)} is not a shape symbol")


def _expressions(node: Any, path: str = "") -> list[tuple[str, Any]]:
    """Every ``expr_str`` in the program, with where it is."""
    found, stack = [], [(node, path)]
    while stack:
        value, at = stack.pop()
        if isinstance(value, dict):
            for key, child in value.items():
                if key == "expr_str":
                    found.append((f"{at}.{key}".lstrip("."), child))
                else:
                    stack.append((child, f"{at}.{key}"))
        elif isinstance(value, list):
            stack.extend((child, f"{at}.{i}") for i, child in enumerate(value))
    return found


def _dotted(name: Any) -> bool:
    """A dotted name of identifiers, none of them a dunder (``__class__``)."""
    return (isinstance(name, str) and IDENTIFIER.fullmatch(name) is not None
            and not any(part.startswith("__") and part.endswith("__") for part in name.split(".")))


__all__ = ["check_archive", "expression", "guards", "program", "target"]
