"""compressed-tensors' target rule — a module's name, ``re:`` and a regex matched from the name's start, or a class
name — in time linear in the name, whatever the regex.

A target is a checkpoint's data, and Python's backtracking ``re`` can take for ever on one (``re:(.|.)*Z``). The
regex is parsed by ``re``'s own parser (the syntax is exactly Python's) and run as an automaton: Thompson's
construction, its deterministic states built as names meet them. What an automaton cannot run, or a target has no
use for — back references, lookarounds, word boundaries, atomic groups, possessive repeats, flags — is refused.

>>> targets = Targets(["lm_head", "re:.*self_attn\\\\.(q|k|v)_proj$"])
>>> [targets.matches(n, None) for n in ("model.layers.0.self_attn.k_proj", "model.layers.0.mlp.up_proj", "lm_head")]
[True, False, True]
>>> Targets(["re:(.|.)*Z"]).matches("a" * 10_000, None)
False
"""

from __future__ import annotations

import re
from collections.abc import Callable
from re import _constants as sre, _parser  # re's own parser: the syntax is Python's exactly

import torch.nn as nn

MAX_LENGTH = 1000  # characters of a regex
MAX_STATES = 20_000  # automaton states of a regex: a counted repeat is unrolled (a{1000}{1000} is refused)
MAX_CACHED = 4096  # deterministic states kept; past this the cache restarts (each step stays linear)
_ALLOWED_FLAGS = sre.SRE_FLAG_UNICODE | sre.SRE_FLAG_VERBOSE  # the default, and one that only changes parsing
_CATEGORIES: dict[object, Callable[[str], bool]] = {
    sre.CATEGORY_DIGIT: str.isdecimal, sre.CATEGORY_NOT_DIGIT: lambda c: not c.isdecimal(),
    sre.CATEGORY_SPACE: str.isspace, sre.CATEGORY_NOT_SPACE: lambda c: not c.isspace(),
    sre.CATEGORY_WORD: lambda c: c.isalnum() or c == "_", sre.CATEGORY_NOT_WORD: lambda c: not (c.isalnum() or c == "_"),
}
_START, _END, _END_OR_NEWLINE = "start", "end", "end or a final newline"  # anchors: ^ and \A, \Z, $
_REFUSED = {sre.GROUPREF: "a back reference", sre.GROUPREF_EXISTS: "a conditional group", sre.ASSERT: "a lookaround",
            sre.ASSERT_NOT: "a lookaround", sre.ATOMIC_GROUP: "an atomic group", sre.POSSESSIVE_REPEAT: "a possessive repeat",
            sre.AT: "a word boundary"}  # opcodes (their values overlap the anchors')
_ANCHORS = {sre.AT_BEGINNING: _START, sre.AT_BEGINNING_STRING: _START, sre.AT_END_STRING: _END,
            sre.AT_END: _END_OR_NEWLINE}


class TargetError(ValueError):
    """A target that is not a string, or a regex that does not parse or uses what is refused: the reason, and
    ``index``, the target's place in its list."""

    def __init__(self, reason: str, index: int = 0):
        super().__init__(reason)
        self.index = index


class Targets:
    """A config group's ``targets`` (or the ``ignore`` list): names and class names, looked up at once, and regexes
    of ``max_states`` automaton states in all (the states they have: ``states``)."""

    def __init__(self, targets: list[object], max_states: int = MAX_STATES):
        self.names: set[str] = set()
        self.regexes: list[_Automaton] = []
        self.states = 0
        for index, target in enumerate(targets):
            if not isinstance(target, str):
                raise TargetError("not a string", index)
            if not target.startswith("re:"):
                self.names.add(target)
                continue
            try:
                regex = _Automaton(target.removeprefix("re:"), min(MAX_STATES, max_states - self.states))
            except TargetError as err:
                raise TargetError(str(err), index) from None
            self.regexes.append(regex)
            self.states += len(regex.moves)

    def matches(self, name: str, module: nn.Module | None) -> bool:
        """Whether the module ``name`` (of class ``module``'s) is one of these targets, as compressed-tensors
        decides: its name, the name of its class or of a base class, or a regex matching the name's start."""
        return (name in self.names or any(cls.__name__ in self.names for cls in type(module).__mro__)
                or any(regex.match(name) for regex in self.regexes))


class _Automaton:
    """A regex as a nondeterministic automaton: per state, character moves, empty moves and anchored moves."""

    def __init__(self, pattern: str, max_states: int = MAX_STATES):
        if len(pattern) > MAX_LENGTH:
            raise TargetError(f"a regex of {len(pattern)} characters (at most {MAX_LENGTH})")
        try:
            parsed = _parser.parse(pattern)
        except (re.error, RecursionError, OverflowError) as err:
            raise TargetError(f"not a regex: {err}") from None
        if parsed.state.flags & ~_ALLOWED_FLAGS:
            raise TargetError("inline flags such as (?i) are not supported in a target")
        self.moves: list[list[tuple[Callable[[str], bool], int]]] = []
        self.empty: list[list[int]] = []
        self.anchored: list[list[tuple[str, int]]] = []
        self.max_states = max_states
        try:
            self.start, self.accept = self._sequence(parsed)
        except RecursionError:
            raise TargetError("a regex nested too deeply") from None
        self._steps: dict[tuple[frozenset[int], str], frozenset[int]] = {}
        self._closures: dict[tuple[frozenset[int], tuple[bool, bool, bool]], frozenset[int]] = {}

    def _state(self) -> int:
        if len(self.moves) >= self.max_states:
            raise TargetError(f"a regex whose automaton needs more than {self.max_states} states (large counted "
                              "repeats, or the config's regexes together)")
        self.moves.append([])
        self.empty.append([])
        self.anchored.append([])
        return len(self.moves) - 1

    def _sequence(self, items) -> tuple[int, int]:
        start = end = self._state()
        for op, av in items:
            first, last = self._item(op, av)
            self.empty[end].append(first)
            end = last
        return start, end

    def _item(self, op, av) -> tuple[int, int]:
        if op in (sre.LITERAL, sre.NOT_LITERAL, sre.ANY, sre.IN):
            start, end = self._state(), self._state()
            self.moves[start].append((_character_test(op, av), end))
            return start, end
        if op is sre.SUBPATTERN:
            _, add_flags, del_flags, body = av
            if add_flags or del_flags:
                raise TargetError("inline flags such as (?i:...) are not supported in a target")
            return self._sequence(body)
        if op is sre.BRANCH:
            start, end = self._state(), self._state()
            for alternative in av[1]:
                first, last = self._sequence(alternative)
                self.empty[start].append(first)
                self.empty[last].append(end)
            return start, end
        if op in (sre.MAX_REPEAT, sre.MIN_REPEAT):  # lazy or greedy: the same names match
            return self._repeat(*av)
        if op is sre.AT and av in _ANCHORS:
            start, end = self._state(), self._state()
            self.anchored[start].append((_ANCHORS[av], end))
            return start, end
        raise TargetError(f"{_REFUSED.get(op, str(op).lower())} is not supported in a target")

    def _repeat(self, low: int, high: int, body) -> tuple[int, int]:
        start = end = self._state()
        for _ in range(low):
            first, last = self._sequence(body)
            self.empty[end].append(first)
            end = last
        done = self._state()
        self.empty[end].append(done)
        if high == sre.MAXREPEAT:  # any number more
            first, last = self._sequence(body)
            self.empty[end].append(first)
            self.empty[last] += [first, done]
            return start, done
        for _ in range(high - low):  # up to high - low more
            first, last = self._sequence(body)
            self.empty[end].append(first)
            self.empty[last].append(done)
            end = last
        return start, done

    def match(self, name: str) -> bool:
        """Whether the regex matches a prefix of ``name`` (``re.match``): one pass over it, states cached."""
        current = self._closure(frozenset([self.start]), _context(name, 0))
        for at, char in enumerate(name):
            if self.accept in current:
                return True
            key = (current, char)
            moved = self._steps.get(key)
            if moved is None:
                moved = frozenset(t for s in current for test, t in self.moves[s] if test(char))
                self._steps[key] = _bounded(self._steps, moved)
            current = self._closure(moved, _context(name, at + 1))
            if not current:
                return False
        return self.accept in current

    def _closure(self, states: frozenset[int], context: tuple[bool, bool, bool]) -> frozenset[int]:
        """``states`` and what empty moves, and the anchors ``context`` allows, reach from them."""
        key = (states, context)
        found = self._closures.get(key)
        if found is not None:
            return found
        allowed = {_START: context[0], _END: context[1], _END_OR_NEWLINE: context[1] or context[2]}
        seen, stack = set(states), list(states)
        while stack:
            state = stack.pop()
            for nxt in self.empty[state] + [t for anchor, t in self.anchored[state] if allowed[anchor]]:
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append(nxt)
        self._closures[key] = _bounded(self._closures, frozenset(seen))
        return self._closures[key]


def _bounded(cache: dict, value: frozenset[int]) -> frozenset[int]:
    if len(cache) >= MAX_CACHED:
        cache.clear()
    return value


def _context(name: str, at: int) -> tuple[bool, bool, bool]:
    """(at the start, at the end, before a final newline): what the anchors need to know of a position."""
    return at == 0, at == len(name), at == len(name) - 1 and name[at] == "\n"


def _character_test(op, av) -> Callable[[str], bool]:
    if op is sre.LITERAL:
        return chr(av).__eq__
    if op is sre.NOT_LITERAL:
        return chr(av).__ne__
    if op is sre.ANY:
        return "\n".__ne__
    negate = bool(av) and av[0][0] is sre.NEGATE
    chars, ranges, categories = set(), [], []
    for kind, value in av[negate:]:
        if kind is sre.LITERAL:
            chars.add(chr(value))
        elif kind is sre.RANGE:
            ranges.append(value)
        elif kind is sre.CATEGORY and value in _CATEGORIES:
            categories.append(_CATEGORIES[value])
        else:
            raise TargetError(f"{str(kind).lower()} in a character set is not supported in a target")
    return lambda c: (c in chars or any(lo <= ord(c) <= hi for lo, hi in ranges)
                      or any(test(c) for test in categories)) != negate
