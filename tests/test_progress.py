"""Progress output (dclens/common/progress.py): a bar on a terminal, plain periodic lines
elsewhere (a log file, a pipe), and a whole run's stderr without carriage returns."""

from __future__ import annotations

import io

import pytest
from conftest import load_script

from dclens.common.progress import PlainProgress, progress_bar


class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_plain_lines_at_the_start_every_interval_and_at_the_end():
    stream, clock = io.StringIO(), _Clock()
    bar = PlainProgress(10, unit="step", desc="DataLens", stream=stream, every_seconds=30,
                        clock=clock)
    for second in range(10):
        clock.now = 10.0 * (second + 1)
        bar.set_postfix({"eps": f"{0.1 * (second + 1):.4f}"})
        bar.update(1)
    bar.close()
    lines = stream.getvalue().splitlines()
    # the first update, then every 30 s (steps 4 and 7 at 40 s and 70 s), and the end
    assert [line.split()[1] for line in lines] == ["1/10", "4/10", "7/10", "10/10"]
    assert lines[0] == "DataLens: 1/10 step (0.1 step/s) eps=0.1000"
    assert lines[-1] == "DataLens: 10/10 step (0.1 step/s) eps=1.0000"
    assert "\r" not in stream.getvalue()


def test_a_resumed_runs_bar_starts_at_its_step_and_rates_only_this_sessions_steps(
        monkeypatch):
    # A run resumed at step 80 of 200 once printed "81/200 (4e+07 step/s)": the 80 steps
    # of earlier sessions were counted as done in this one's first instant.
    from dclens.datalens.step_log import new_progress_bar

    stream, clock = io.StringIO(), _Clock()
    monkeypatch.setattr("sys.stderr", stream)
    bar = new_progress_bar(200, True, initial=80)
    bar.clock, bar.started = clock, 0.0
    assert stream.getvalue() == ""                       # nothing claimed before a step
    clock.now = 20.0
    bar.update(1)
    assert stream.getvalue().splitlines() == ["DataLens: 81/200 step (0.05 step/s)"]
    assert new_progress_bar(200, False, initial=80) is None


def test_a_stopped_loop_prints_where_it_stopped_once():
    stream, clock = io.StringIO(), _Clock()
    bar = PlainProgress(100, initial=40, stream=stream, every_seconds=1e9, clock=clock)
    clock.now = 5.0
    bar.update(2)
    clock.now = 10.0
    bar.update(3)
    bar.close()
    bar.close()
    lines = stream.getvalue().splitlines()
    assert lines == ["progress: 42/100 step (0.4 step/s)", "progress: 45/100 step (0.5 step/s)"]


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_a_terminal_gets_a_bar_and_anything_else_plain_lines():
    import tqdm

    assert isinstance(progress_bar(5, stream=_Terminal()), tqdm.tqdm)
    assert isinstance(progress_bar(5, stream=io.StringIO()), PlainProgress)


@pytest.mark.parametrize("quiet", [False, True])
def test_a_run_writing_to_a_file_gets_lines_not_carriage_returns(tiny_fmnist_dir, tmp_path,
                                                                 capsys, quiet):
    """main.py with stderr not a terminal: plain progress lines (it used to be one line of
    carriage returns); --quiet keeps only the final summary."""
    cli = load_script("main")
    argv = ["--train", "--dataset", "fashion_mnist", "--data_dir", str(tiny_fmnist_dir),
            "--checkpoint_dir", str(tmp_path / "run"), "--batch_teachers", "4",
            "--batch_size", "5", "--topk", "20", "--sigma", "20", "--thresh", "0.25",
            "--max_eps", "50", "--z_dim", "8", "--pretrain_teacher", "1",
            "--num_samples", "20", "--seed", "1", "--conversion", "classic"]
    assert cli.main(argv + (["--quiet"] if quiet else [])) == 0
    captured = capsys.readouterr()
    assert "\r" not in captured.err
    progress = [line for line in captured.err.splitlines() if line.startswith("DataLens: ")]
    if quiet:
        assert not progress
    else:
        done, total = progress[-1].split()[1].split("/")
        assert done == total and len(progress) >= 2           # the first line and the end
        assert all("eps=" in line and "step/s" in line for line in progress)
    assert "done: " in captured.out + captured.err
