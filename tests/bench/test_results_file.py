"""benchmarks/RESULTS.md holds one current section per benchmark script, and each script's ``--record`` rewrites
its own section (``benchmarks/record.py``) and nothing else."""

import ast
import re
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
RESULTS = BENCHMARKS / "RESULTS.md"
sys.path.insert(0, str(BENCHMARKS))  # record imports figures from beside it, as the scripts do
try:
    import record
finally:
    sys.path.remove(str(BENCHMARKS))



def runnable(path: Path) -> bool:
    """Whether the module at ``path`` is a script: it has an ``if __name__ == "__main__":`` block."""
    return any(isinstance(node, ast.If) and "__name__" in ast.unparse(node.test) for node in ast.parse(path.read_text()).body)


SCRIPTS = sorted(p.stem for p in BENCHMARKS.glob("*.py") if runnable(p))


def sections(text: str) -> dict[str, str]:
    """Each ``## title`` of ``text`` and its section, from the title up to the next one."""
    parts = re.split(r"^(?=## )", text, flags=re.M)[1:]
    return {part.split("\n", 1)[0][3:]: part for part in parts}


def calls(path: Path, name: str) -> list[list]:
    """The constant arguments of every call to ``name`` in the script at ``path``."""
    return [[a.value if isinstance(a, ast.Constant) else ast.dump(a) for a in node.args]
            for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name) and node.func.id == name]


def test_the_file_is_short():
    assert len(RESULTS.read_text().splitlines()) <= 400


def test_one_section_per_script_in_order_each_headed_by_its_command_cpu_threads_load_and_date():
    found = sections(RESULTS.read_text())
    assert len(SCRIPTS) >= 30 and list(found) == SCRIPTS
    for name, section in found.items():
        header = section.split("\n")[2]
        assert re.match(rf"Command: `[^`]*\bpython benchmarks/{name}\.py[^`]*`", header), name
        assert re.search(r"CPU: .+; threads: .+; load: .+; date: .+\.$", header), name


@pytest.mark.parametrize("name", SCRIPTS)
def test_each_script_takes_record_and_runs_under_recording_by_its_own_name(name):
    path = BENCHMARKS / f"{name}.py"
    assert calls(path, "add_record_flag") == [["Name(id='parser', ctx=Load())"]]
    assert calls(path, "recording") == [[name]]


@pytest.fixture
def results(tmp_path) -> Path:
    copy = tmp_path / "RESULTS.md"
    copy.write_bytes(RESULTS.read_bytes())
    return copy


def test_record_rewrites_its_own_section_only_and_leaves_no_temporary_file(results):
    before = sections(results.read_text())
    record.record("decode", "# part\n| a |\n|---|\n| 1 |\n", command="python benchmarks/decode.py --rounds 2", threads=2,
                  load=(0.5, 1.25), path=results)
    after = sections(results.read_text())
    assert list(after) == list(before)
    assert {k: v for k, v in after.items() if k != "decode"} == {k: v for k, v in before.items() if k != "decode"}
    title, blank, header, blank2, *body = after["decode"].split("\n")
    assert (title, blank, blank2, body) == ("## decode", "", "", ["### part", "| a |", "|---|", "| 1 |", "", ""])
    assert header.startswith("Command: `python benchmarks/decode.py --rounds 2`. CPU: ")
    assert "; threads: 2; load: 0.50 → 1.25; date: " in header and header.endswith(" UTC.")
    assert list(results.parent.iterdir()) == [results]


def test_a_missing_section_goes_in_alphabetical_place(results):
    old = results.read_text()
    record.record("e_new", "figures", command="python benchmarks/e_new.py", threads=1, path=results)
    new = results.read_text()
    titles = list(sections(new))
    assert titles.index("e_new") == titles.index("draw") + 1 and titles == sorted(titles)
    assert new.replace(sections(new)["e_new"], "") == old
    record.record("zz_last", "figures", command="python benchmarks/zz_last.py", threads=1, path=results)
    assert list(sections(results.read_text()))[-1] == "zz_last" and results.read_text().endswith("figures\n")


def test_a_failed_write_leaves_the_file_as_it_was_and_no_temporary_file(results, monkeypatch):
    old = results.read_bytes()

    def fail(*_):
        raise OSError("disk full")

    monkeypatch.setattr(record.os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        record.record("decode", "x", command="c", threads=1, path=results)
    assert results.read_bytes() == old and list(results.parent.iterdir()) == [results]


def test_recording_keeps_printing_and_records_only_with_the_flag_and_only_a_run_that_ends_well(results, monkeypatch,
                                                                                              capsys):
    old = results.read_text()
    monkeypatch.setattr(sys, "argv", [str(BENCHMARKS / "draw.py"), "--repeats", "1"])
    with record.recording("draw", path=results):
        print("| view |\n|---|\n| full |")
    assert results.read_text() == old  # no --record: nothing written
    monkeypatch.setattr(sys, "argv", [str(BENCHMARKS / "draw.py"), "--record"])
    for error in (RuntimeError("failed"), SystemExit(2)):
        with pytest.raises(type(error)), record.recording("draw", path=results):
            print("partial")
            raise error
    assert results.read_text() == old
    with record.recording("draw", threads=3, path=results):
        print("| view |\n|---|\n| full |")
        sys.exit(0)
    assert capsys.readouterr().out.endswith("| view |\n|---|\n| full |\n")
    section = sections(results.read_text())["draw"]
    assert section.split("\n")[2].startswith("Command: `python benchmarks/draw.py --record`. CPU: ")
    assert "; threads: 3; " in section and section.endswith("\n\n| view |\n|---|\n| full |\n\n")


def test_the_recorded_command_hides_where_outside_files_lie(monkeypatch):
    monkeypatch.setattr(sys, "argv", [str(BENCHMARKS / "decode.py"), "--model", "/home/me/models/small.gguf",
                                      "--out", str(BENCHMARKS / "runs"), "--rounds", "3"])
    assert record.command_line() == "python benchmarks/decode.py --model .../small.gguf --out benchmarks/runs --rounds 3"
