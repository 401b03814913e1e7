"""examples/stage_server.py runs (its demo: server, producer process, client)."""
import os
import subprocess
import sys

from test_stage import YAML

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "examples", "stage_server.py")


def test_stage_server_demo(tmp_path, ns):
    cfg = tmp_path / "stages.yaml"
    cfg.write_text(YAML)
    r = subprocess.run([sys.executable, EXAMPLE, str(cfg), "demo"], capture_output=True,
                       text=True, timeout=60, env=dict(os.environ, FERRY_NS=ns))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "req1: 5 chunks, 5000 bytes", (r.stdout, r.stderr)


def test_executor_example():
    ex = os.path.join(os.path.dirname(__file__), "..", "examples", "executor.py")
    r = subprocess.run([sys.executable, ex, "3"], capture_output=True, text=True, timeout=90,
                       env=dict(os.environ))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["rank: [(0, 0), (1, 1), (2, 2)]",
                                     "square(7): [(0, 49), (1, 49), (2, 49)]"], r.stdout
