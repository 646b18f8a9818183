"""`modular run` progress: a bar on a terminal, a line per job step now and then elsewhere, nothing with --quiet."""

import io
import os
import subprocess
import sys

from modular.batch.step_lines import StepLines
from modular.cli.main import main


class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_lines_come_each_tenth_of_the_steps_and_at_the_end():
    """28 steps give a line every 3 steps (a tenth, rounded up) and one at step 28, each a whole line."""
    out = io.StringIO()
    with StepLines(total=28, desc="job 1/3 tiny-flux-dev: step", file=out, clock=_Clock()) as bar:
        for _ in range(28):
            bar.update()
    lines = out.getvalue().splitlines()
    assert lines == [f"job 1/3 tiny-flux-dev: step {n}/28" for n in (3, 6, 9, 12, 15, 18, 21, 24, 27, 28)]
    assert "\r" not in out.getvalue()


def test_a_slow_step_writes_a_line_after_the_interval():
    """When less than a tenth is done but `interval` seconds passed since the last line, a line is written."""
    out, clock = io.StringIO(), _Clock()
    bar = StepLines(total=100, desc="step", file=out, interval=30.0, clock=clock)
    bar.update()
    assert out.getvalue() == ""
    clock.now = 31.0
    bar.update()
    assert out.getvalue() == "step 2/100\n"


def test_an_iterated_count_names_the_item_just_done():
    """Iterating counts one per item; the postfix set in the body is shown in brackets on that item's line."""
    out = io.StringIO()
    bar = StepLines(["vae", "unet"], desc="job 1/1 tiny: loaded", file=out, clock=_Clock())
    for name in bar:
        bar.set_postfix_str(name)
    assert out.getvalue() == "job 1/1 tiny: loaded 1/2 (vae)\njob 1/1 tiny: loaded 2/2 (unet)\n"


def test_run_with_stderr_a_pipe_prints_a_line_per_job_step(tmp_path):
    """`python -m modular run` whose stderr is a pipe writes "job 1/1 tiny-repo: step k/N" lines at most
    about ten times a job, no carriage-return bar; stdout keeps the report."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "modular",
            "run",
            "--out",
            str(tmp_path / "out"),
            "--steps",
            "20",
            "--no-table",
        ],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert done.returncode == 0, done.stderr
    steps = [line for line in done.stderr.splitlines() if line.startswith("job 1/1 tiny-repo: step ")]
    assert steps == [f"job 1/1 tiny-repo: step {n}/20" for n in range(2, 21, 2)]
    assert "job 1/1 tiny-repo: loaded 5/5 (scheduler)" in done.stderr.splitlines()
    assert "\r" not in done.stderr
    assert "saved " in done.stdout


def test_quiet_prints_no_progress_lines(tmp_path, capsys):
    """--quiet hides the lines as it hides the bar."""
    assert main(["run", "--out", str(tmp_path / "out"), "--quiet", "--steps", "2", "--no-table"]) == 0
    assert "tiny-repo: " not in capsys.readouterr().err


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_a_terminal_keeps_the_bar(tmp_path, monkeypatch):
    """On a terminal the steps show as tqdm's redrawn bar, not as lines."""
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert main(["run", "--out", str(tmp_path / "out"), "--steps", "2", "--no-table"]) == 0
    written = terminal.getvalue()
    assert "tiny-repo: denoising" in written and "\r" in written
    assert "tiny-repo: step" not in written
