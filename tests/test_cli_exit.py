"""The ``mase-lite`` process exits without tearing the interpreter down, yet loses nothing on its way out:
printed lines, exit handlers, threads still running, exit codes."""

import json
import subprocess
import sys
import textwrap

PLUGIN = '''
import atexit, pathlib, threading, time

def _last_words():
    pathlib.Path({marker!r}).write_text("exit handler ran")

atexit.register(_last_words)

def _slow():
    time.sleep(0.5)
    pathlib.Path({thread_marker!r}).write_text("thread finished")

if {start_thread}:
    threading.Thread(target=_slow).start()
'''


def _run(tmp_path, *args, start_thread=False):
    plugin = tmp_path / "last_words.py"
    plugin.write_text(textwrap.dedent(PLUGIN.format(marker=str(tmp_path / "atexit.txt"),
                                                    thread_marker=str(tmp_path / "thread.txt"),
                                                    start_thread=start_thread)))
    return subprocess.run([sys.executable, "-m", "mase_lite.cli", "--plugin", str(plugin), *args],
                          capture_output=True, text=True)


def test_a_finished_command_prints_everything_and_runs_its_exit_handlers(tmp_path):
    proc = _run(tmp_path, "passes", "--json")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.endswith("}\n") and "quantize" in json.loads(proc.stdout)  # all of it reached the pipe
    assert (tmp_path / "atexit.txt").read_text() == "exit handler ran"


def test_an_error_exits_2_with_its_message_after_the_exit_handlers(tmp_path):
    (tmp_path / "spec.json").write_text(json.dumps({"stpes": []}))  # read, then refused after the plug-in loaded
    proc = _run(tmp_path, "run", str(tmp_path / "spec.json"))
    assert proc.returncode == 2
    assert proc.stderr.startswith("mase-lite: error:") and "stpes" in proc.stderr
    assert (tmp_path / "atexit.txt").read_text() == "exit handler ran"


def test_a_running_thread_is_waited_for(tmp_path):
    proc = _run(tmp_path, "passes", "--json", start_thread=True)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "thread.txt").read_text() == "thread finished"
    assert (tmp_path / "atexit.txt").read_text() == "exit handler ran"
