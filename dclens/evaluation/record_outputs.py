"""What an evaluation writes: ``<name>.json``, the curves' PNG, the summary line, and where
the authors' protocol keeps its resume state."""

from __future__ import annotations

import os

from dclens.common import export
from dclens.evaluation import authors_protocol
from dclens.evaluation.evaluate import authors_entries


def plot_curves(record: dict, path: str | os.PathLike, *, title: str = "") -> None:
    """PNG of the per-epoch accuracies with both protocols' epochs marked."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib import pyplot

    curves = record["curves"]
    figure = pyplot.figure(figsize=(6.4, 4.0), dpi=100)
    axes = figure.add_subplot(1, 1, 1)
    epochs = curves["epoch"]
    axes.plot(epochs, curves["train_accuracy"], color="0.6",
              label="train part (running, dropout on)")
    axes.plot(epochs, curves["val_accuracy"], color="tab:blue", label="held-out val part")
    axes.plot(epochs, curves["test_accuracy"], color="tab:red", label="real test")
    if record.get("sen_curves"):
        axes.plot(record["sen_curves"]["epoch"], record["sen_curves"]["test_accuracy"],
                  color="tab:orange", linestyle="--", label="real test (sen, all data)")
    val, sen = record["protocols"]["val"], record["protocols"]["sen"]
    axes.axvline(val["epoch"], color="tab:blue", linestyle=":",
                 label=f"val protocol: {val['accuracy']:.4f} (epoch {val['epoch']})")
    axes.axvline(sen["epoch"], color="tab:red", linestyle=":",
                 label=f"sen protocol: {sen['accuracy']:.4f} (epoch {sen['epoch']})")
    longest = max(epochs)
    for authors, color in zip(authors_entries(record["protocols"]),
                              ("tab:green", "tab:purple", "tab:brown", "tab:olive")):
        axes.plot(authors["curve"]["epoch"], authors["curve"]["test_accuracy"],
                  color=color, linewidth=0.8,
                  label=f"real test (authors protocol, range "
                        f"{authors['settings']['range']}): best {authors['accuracy']:.4f} "
                        f"(epoch {authors['epoch']})")
        longest = max(longest, max(authors["curve"]["epoch"]))
    axes.set_xlabel("epoch")
    axes.set_ylabel("accuracy")
    if longest > 100:
        axes.set_xscale("log")        # tens of epochs beside the authors' 600
    else:
        axes.xaxis.get_major_locator().set_params(integer=True)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=7, loc="best")
    axes.set_title(title or f"{record['dataset']}: classifier trained on "
                   f"{record['input']['kind']} ({record['input']['samples']} samples)",
                   fontsize=9)
    figure.tight_layout()
    export.atomic_write(path, lambda s: figure.savefig(s, format="png"))
    pyplot.close(figure)


def authors_state_file(out_dir: str | os.PathLike, name: str,
                       protocol: authors_protocol.AuthorsProtocol) -> str:
    """Where ``scripts/evaluate.py`` keeps the authors' protocol's resume state: beside
    the outputs, ``<out>/<name>-authors-range<R>.npz`` (kept after the end, so the same
    evaluation run again returns at once; another input or setting is refused by name)."""
    return os.path.join(os.fspath(out_dir), f"{name}-authors-range{protocol.range}.npz")


def write_outputs(record: dict, out_dir: str | os.PathLike,
                  name: str = "evaluation") -> dict[str, str]:
    """``<name>.json`` and ``<name>.png`` in ``out_dir`` (atomic); returns their paths."""
    out_dir = os.fspath(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    paths = {"json": os.path.join(out_dir, f"{name}.json"),
             "png": os.path.join(out_dir, f"{name}.png")}
    export.write_json(paths["json"], record)
    plot_curves(record, paths["png"])
    return paths


def summary_line(record: dict) -> str:
    """One line with both protocols and the quality scores."""
    p = record["protocols"]
    text = (f"{record['dataset']}: val {p['val']['accuracy']:.4f} (headline) | "
            f"sen {p['sen']['accuracy']:.4f}")
    for authors in authors_entries(p):
        text += f" | authors (range {authors['settings']['range']}) {authors['accuracy']:.4f}"
    if "dpimagebench" in p:
        names = ", ".join(p["dpimagebench"]["classifiers"])
        text += f" | DPImageBench ({names}) {p['dpimagebench']['accuracy']:.4f}"
    text += f" | {record['input']['samples']} samples"
    if record.get("quality"):
        q = record["quality"]
        text += (f" | domain IS {q['inception_score']:.3f} (real "
                 f"{q['reference_inception_score']:.3f}) | domain FID {q['fid']:.3f}")
    return text
