"""What a DataLens step shows: its TensorBoard scalars and sample grids, and the progress
bar's fields.

TensorBoard (``<run>/logs``) is the run owner's: it also gets the teachers' loss, a
noise-free function of the private records.  The progress bar and the terminal get released
or public quantities only (:func:`progress_fields`), because terminal output gets pasted into
issues and papers.
"""

from __future__ import annotations

from dclens.common.progress import progress_bar
from dclens.datalens.config import DataLensConfig
from dclens.datalens.outputs import class_grid


def new_progress_bar(total: int, enabled: bool, *, initial: int = 0):
    """The run's bar, starting at ``initial`` steps (a resumed run's), so that the rate it
    shows counts only this session's steps."""
    return (progress_bar(total, initial=initial, unit="step", desc="DataLens") if enabled
            else None)


def log_step(writer, record, lens, config: DataLensConfig, grid_every: int, bar) -> None:
    import tensorflow as tf

    with writer.get().as_default(step=record.step + 1):
        if record.epsilon is not None:
            tf.summary.scalar("privacy/epsilon", record.epsilon)
        if record.epsilon_data_dependent_analysis is not None:
            tf.summary.scalar("privacy/epsilon_data_dependent_analysis_not_spent",
                              record.epsilon_data_dependent_analysis)
        tf.summary.scalar("loss/teacher", record.teacher_loss)
        tf.summary.scalar("loss/student", record.student_loss)
        tf.summary.scalar("votes/pass_fraction", record.pass_fraction)
        tf.summary.scalar("time/seconds_per_step", record.seconds)
        if (record.step + 1) % grid_every == 0:
            tf.summary.image("samples/by_class", class_grid(
                lens.generate_released, lens.shape, config.train.z_dim, lens.seeds)[None])
    if bar is not None:
        bar.set_postfix(progress_fields(record))      # before update: a plain line shows it
        bar.update(1)


def progress_fields(record) -> dict[str, str]:
    """What the progress bar shows of a step: released or public quantities only.

    The epsilon spent, the student's loss and the share of coordinates that passed the
    threshold are functions of the noisy, thresholded votes (post-processing of the
    charged mechanism). The teachers' loss is computed on the private records with no
    noise, so it is left out here and goes only to the run's own TensorBoard
    (``loss/teacher``), as a private diagnostic: terminal output gets pasted into issues
    and papers.
    """
    return {"eps": "n/a" if record.epsilon is None else f"{record.epsilon:.4f}",
            "g_loss": f"{record.student_loss:.3g}",
            "passed": f"{record.pass_fraction:.3f}"}


def on_off(flag: bool | None) -> str:
    return "unknown" if flag is None else "on" if flag else "off"


class LazySummaryWriter:
    """A TensorBoard writer that creates its event file on first use, so an invocation
    that logs nothing (a finished run, an early error) leaves no empty event file."""

    def __init__(self, logdir: str):
        self.logdir = logdir
        self._writer = None

    def get(self):
        if self._writer is None:
            import tensorflow as tf  # pylint: disable=import-outside-toplevel

            self._writer = tf.summary.create_file_writer(self.logdir)
        return self._writer

    def flush(self) -> None:
        if self._writer is not None:
            self._writer.flush()
