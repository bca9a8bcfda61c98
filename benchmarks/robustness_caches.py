"""The ``caches`` part of the reliability probe (benchmarks/robustness.py): what a run or a search finds on disk
and trusts too much — a run's tokenized-data cache, a search's prefix-cache entry and journal — damaged at the
byte level and rewritten to lie consistently, and reports made by someone else that name the user's files.

Each case runs the real CLI in a forked process, then checks what the outcome must be besides "no traceback":
a run on a damaged data cache gives the metrics of the undamaged run; a search on a damaged cache entry or
journal keeps its finished trial and gives the new trial the metrics of an undamaged search (or refuses and
leaves the journal as it was); a foreign report writes nothing into the folder it names, runs no code it names.
"""

from __future__ import annotations

import copy
import json
import random
import shutil
import sys
from pathlib import Path
from typing import Any, Callable

from robustness_data import BYTE_DAMAGE

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.search.conftest import TINY_PIPELINE, WIDTH  # noqa: E402  the suite's tiny pipeline

Verify = Callable[[int | None], str | None]


def _main(argv: list[str]) -> Callable[[], int]:
    def call() -> int:
        from mase_lite.cli import main

        return main(argv)

    return call


def _files(directory: Path) -> dict[str, bytes]:
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def _timeless(metrics: Any) -> Any:
    """Metrics without durations (the one thing two equal runs differ in)."""
    if isinstance(metrics, dict):
        return {k: _timeless(v) for k, v in metrics.items() if "seconds" not in k}
    return metrics


def _metrics(run: Path) -> dict[str, Any] | None:
    path = run / "report.json"
    return _timeless(json.loads(path.read_text()).get("metrics")) if path.is_file() else None


def _retensor(change: Callable[[dict], dict]) -> Callable[[Path, random.Random], None]:
    """A damage that rewrites a safetensors file consistently (it stays readable; what it holds lies)."""
    def damage(path: Path, rng: random.Random) -> None:
        from safetensors.torch import load_file, save_file

        save_file(change(load_file(str(path))), str(path))

    return damage


def _flip_labels(tensors: dict) -> dict:
    return {k: (1 - v) if k.endswith("labels") else v for k, v in tensors.items()}


TENSOR_LIES = {
    "labels flipped": _flip_labels,
    "token ids shifted": lambda t: {k: (v + 1) if k.endswith("input_ids") else v for k, v in t.items()},
    "a tensor dropped": lambda t: dict(list(t.items())[1:]),
    "rows halved": lambda t: {k: v[: max(len(v) // 2, 1)] for k, v in t.items()},
    "floats instead of ints": lambda t: {k: v.float() for k, v in t.items()},
    "an extra tensor": lambda t: {**t, "train.extra": next(iter(t.values())).clone()},
}


def _bytes(change: Callable[[bytes, random.Random], bytes]) -> Callable[[Path, random.Random], None]:
    return lambda path, rng: path.write_bytes(change(path.read_bytes(), rng))


def data_cache_cases(work: Path, rng: random.Random, per_damage: int) -> list[tuple[str, str, Path, Callable, Verify]]:
    """A run again on its own output directory, its tokenized data damaged: the undamaged run's metrics, or a refusal."""
    from mase_lite.cli import main

    base = work / "base-run"
    spec = dict(copy.deepcopy(TINY_PIPELINE), output_dir=str(base))
    (work / "base.json").write_text(json.dumps(spec))
    assert main(["run", str(work / "base.json")]) == 0
    expected = _metrics(base)
    damages = [(name, _bytes(change)) for name, change in BYTE_DAMAGE.items() for _ in range(per_damage)]
    damages += [(name, _retensor(change)) for name, change in TENSOR_LIES.items()]
    cases = []
    for k, (name, damage) in enumerate(damages):
        case_dir = work / f"data-cache-{k}"
        run = case_dir / "run"
        shutil.copytree(base, run)
        (entry,) = (run / "data_cache").iterdir()
        damage(entry, rng)
        (case_dir / "spec.json").write_text(json.dumps(dict(spec, output_dir=str(run))))

        def verify(code: int | None, run: Path = run) -> str | None:
            if code == 0 and _metrics(run) != expected:
                return f"the damaged data cache changed the metrics: {_metrics(run)} instead of {expected}"
            return None

        cases.append(("data cache", name, case_dir, _main(["run", str(case_dir / "spec.json")]), verify))
    return cases


def _state_lie(change: Callable[[dict], None]) -> Callable[[Path, random.Random], None]:
    """Rewrite an entry's state.json and its checksums so they agree: a lie the checksums cannot see."""
    def damage(entry: Path, rng: random.Random) -> None:
        from mase_lite.search.cache import _checksums

        state = json.loads((entry / "state.json").read_text())
        change(state)
        (entry / "state.json").write_text(json.dumps(state))
        (entry / "checksums.json").write_text(json.dumps(_checksums(entry)))

    return damage


def _search_damages(rng: random.Random, per_damage: int) -> list[tuple[str, str, Callable[[Path, random.Random], None]]]:
    """(what is damaged, how, damage(search_dir, rng))."""
    damages = []
    for name, change in BYTE_DAMAGE.items():
        for _ in range(per_damage):
            damages.append(("journal", name, lambda d, r, c=change: _bytes(c)(d / "study.journal", r)))
            damages.append(("cache entry", name, lambda d, r, c=change: _entry_file(d, r).write_bytes(
                c(_entry_file(d, r).read_bytes(), r))))
    damages += [
        ("journal", "a garbage line appended", lambda d, r: (d / "study.journal").open("a").write("{not json\n")),
        ("journal", "its last line cut", lambda d, r: _bytes(lambda b, _: b[: b.rstrip(b"\n").rfind(b"\n") + 1])(d / "study.journal", r)),
        ("journal", "every line twice", lambda d, r: _bytes(lambda b, _: b + b)(d / "study.journal", r)),
        ("journal", "a directory", lambda d, r: ((d / "study.journal").unlink(), (d / "study.journal").mkdir())),
        ("cache entry", "state on the meta device", _entry_state(lambda s: s.update(device="meta"))),
        ("cache entry", "state of another step count", _entry_state(lambda s: s.update(steps=s.get("steps", 1) + 5))),
        ("cache entry", "state emptied", _entry_state(lambda s: s.clear())),
        ("cache entry", "an extra file in it", lambda d, r: shutil.copy(_entry(d) / "rng.safetensors", _entry(d) / "x.bin")),
        ("cache entry", "checksums removed", lambda d, r: (_entry(d) / "checksums.json").unlink()),
        ("cache entry", "the entry a file", lambda d, r: (shutil.rmtree(_entry(d)), (d / "cache" / "x").write_text("x"))),
    ]
    return damages


def _entry(search: Path) -> Path:
    (entry,) = (p for p in (search / "cache").iterdir() if p.is_dir())
    return entry


def _entry_file(search: Path, rng: random.Random) -> Path:
    files = sorted(p for p in _entry(search).rglob("*") if p.is_file())
    return files[rng.randrange(len(files))]


def _entry_state(change: Callable[[dict], None]) -> Callable[[Path, random.Random], None]:
    return lambda search, rng: _state_lie(change)(_entry(search), rng)


def _complete(search: Path) -> dict[int, Any]:
    path = search / "search_report.json"
    if not path.is_file():
        return {}
    trials = json.loads(path.read_text())["studies"][0]["trials"]
    return {t["params"][WIDTH]: _timeless(t["metrics"]) for t in trials if t["state"] == "COMPLETE"}


def search_cases(work: Path, rng: random.Random, per_damage: int) -> list[tuple[str, str, Path, Callable, Verify]]:
    """A search asked for one more trial, its journal or prefix-cache entry damaged: the first trial kept and the new
    one's metrics those of an undamaged search, or a refusal that leaves the journal as it was."""
    from mase_lite.cli import main

    def spec(out: Path, trials: int) -> dict:
        return {"pipeline": TINY_PIPELINE, "space": [{"path": WIDTH, "type": "choice", "values": [4, 8]}],
                "objectives": [{"metric": "ptq.loss", "direction": "minimize"}], "sampler": {"name": "grid", "seed": 0},
                "n_trials": trials, "output_dir": str(out)}

    base, reference = work / "base-search", work / "reference-search"
    (work / "base.json").write_text(json.dumps(spec(base, 1)))
    assert main(["search", str(work / "base.json")]) == 0
    shutil.copytree(base, reference)
    (work / "reference.json").write_text(json.dumps(spec(reference, 2)))
    assert main(["search", str(work / "reference.json")]) == 0
    expected = _complete(reference)
    cases = []
    for k, (what, name, damage) in enumerate(_search_damages(rng, per_damage)):
        case_dir = work / f"search-{k}"
        search = case_dir / "search"
        shutil.copytree(base, search)
        damage(search, rng)
        journal = (search / "study.journal").read_bytes() if (search / "study.journal").is_file() else None
        (case_dir / "spec.json").write_text(json.dumps(spec(search, 2)))

        def verify(code: int | None, search: Path = search, journal: bytes | None = journal) -> str | None:
            if code == 0:
                found = _complete(search)
                return None if found == expected else f"trials {found} instead of {expected}"
            path = search / "study.journal"
            if code == 2 and journal is not None and (not path.is_file() or path.read_bytes()[: len(journal)] != journal):
                return "the refused search changed its journal"
            return None

        cases.append((what, name, case_dir, _main(["search", str(case_dir / "spec.json")]), verify))
    return cases


def report_cases(work: Path, canary: Path) -> list[tuple[str, str, Path, Callable, Verify]]:
    """Someone else's report.json or search_report.json naming the user's folder, files or code."""
    from mase_lite.cli import main

    run = work / "someone-run"
    (work / "run.json").write_text(json.dumps(dict(copy.deepcopy(TINY_PIPELINE), output_dir=str(run))))
    assert main(["run", str(work / "run.json")]) == 0
    report = json.loads((run / "report.json").read_text())
    plugin = work / "plugin.py"
    plugin.write_text(f"open({str(canary)!r}, 'w').write('ran')\n")
    cases = []

    def add(name: str, change: Callable[[dict, Path], None], command: str = "run") -> None:
        case_dir = work / f"report-{len(cases)}"
        victim = case_dir / "users-run"
        (victim / "checkpoint").mkdir(parents=True)
        (victim / "checkpoint" / "model.safetensors").write_bytes(b"the user's weights")
        (victim / "report.json").write_text('{"mine": true}')
        before = _files(victim)
        foreign = copy.deepcopy(report)
        change(foreign["spec"], victim)
        (case_dir / "report.json").write_text(json.dumps(foreign))

        def verify(code: int | None, victim: Path = victim, before: dict = before) -> str | None:
            if canary.exists():
                return "code named by the report ran"
            return None if _files(victim) == before else "the report's run wrote into the folder it named"

        cases.append(("foreign report", name, case_dir, _main([command, str(case_dir / "report.json")]), verify))

    add("output_dir: the user's run", lambda s, v: s.update(output_dir=str(v)))
    add("output_dir: inside the user's run", lambda s, v: s.update(output_dir=str(v / "checkpoint")))
    add("output_dir: the user's run by ..", lambda s, v: s.update(output_dir=f"{v}/../{v.name}"))
    add("output_dir: relative, up", lambda s, v: s.update(output_dir="../" + v.parent.name + "/users-run"))
    add("a plug-in file", lambda s, v: s.update(plugins=[str(plugin)], output_dir=str(v)))
    add("a factory naming code", lambda s, v: s.update(model={"factory": "os:system", "kwargs": {"command": f"touch {canary}"}},
                                                        output_dir=str(v)))
    add("a save step into the user's run", lambda s, v: s["steps"].append({"pass": "save", "params": {"path": str(v / "checkpoint")}}))
    return cases


def cache_cases(seed: int, work: Path, canary: Path, per_damage: int = 3) -> list[tuple[str, str, Path, Callable, Verify]]:
    """Every case of the part: ``(what, damage, directory, call, verify)``."""
    rng = random.Random(seed)
    work.mkdir(parents=True, exist_ok=True)
    return (data_cache_cases(work, rng, per_damage) + search_cases(work, rng, per_damage) + report_cases(work, canary))
