"""report.md of a reproduction: the markdown rendering of its report.json.

One function per section (configuration, scale, accuracy, quality, privacy, run), each
returning its lines; :func:`render_markdown` joins them.  Pure formatting: nothing here
reads files or trains.
"""

from __future__ import annotations

from dclens.datalens import config as cfg
from dclens.evaluation import evaluate


def _fmt(value, digits: int = 4) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _duration(seconds) -> str:
    if seconds is None:
        return "n/a (training skipped: --skip_train)"
    minutes, secs = divmod(int(round(seconds)), 60)
    return f"{seconds:.0f} s ({minutes} min {secs} s)"


def render_markdown(report: dict) -> str:
    """report.md from report.json's dictionary."""
    lines = (_configuration_lines(report) + _scale_lines(report) + _accuracy_lines(report)
             + _quality_lines(report) + _privacy_lines(report) + _run_lines(report))
    return "\n".join(lines)


def _configuration_lines(r: dict) -> list[str]:
    """The title, whether this is the paper's configuration, and the note."""
    lines = [f"# DataLens reproduction: {r['dataset']}, eps = {r['eps']}", ""]
    if r["paper_config"]:
        lines += ["Configuration: **the paper config** (authors' README flags, docs/design.md).", ""]
    else:
        lines += ["> **NOT the paper config.** This run deviates from the paper's "
                  "configuration; its numbers are not the paper's experiment:", ">"]
        lines += [f"> - {d}" for d in r["deviations"]]
        lines += [""]
    if r.get("note"):
        lines += [f"**Note:** {r['note']}", ""]
    return lines


def _scale_lines(r: dict) -> list[str]:
    """How far the run is scaled down from the paper's teachers, and what that costs."""
    scale = r.get("scale") or {}
    if not scale or scale.get("teachers") == scale.get("paper_teachers"):
        return []
    lines = ["## Scale", ""]
    text = f"Scaled down from the paper's {scale['paper_teachers']} teachers."
    if scale.get("seconds_per_step"):
        hours = scale["paper_seconds_extrapolated"] / 3600
        text += (f" This run took {scale['seconds_per_step']:.1f} s per generator step "
                 f"with {scale['teachers']} teachers (training wall time / steps, "
                 f"data loading and sampling included); linear in the teachers, the "
                 f"paper's {scale['paper_steps']} steps with {scale['paper_teachers']} "
                 f"teachers would take about {hours:.1f} h here, plus the evaluation.")
    if scale.get("paper_teacher_state_bytes"):
        text += (f" Their weights and Adam state are "
                 f"{scale['paper_teacher_state_bytes'] / 2**30:.1f} GiB")
        text += (f" (this machine has {scale['memory_bytes'] / 2**30:.1f} GiB of RAM; "
                 f"the teacher bank then lives on disk)."
                 if scale.get("memory_bytes") else ".")
    if r["config"]["train"]["non_private"]:
        text += (" This run adds no noise: it shows what the scaled-down teacher "
                 "ensemble can teach the generator in this many steps.")
    else:
        text += (f" With {scale['teachers']} teachers and the paper's sigma "
                 f"({r['config']['topagg']['sigma']:g}), the vote sum (at most "
                 f"{scale['teachers']} per coordinate) is far below the noise, so the "
                 f"aggregated gradient is mostly noise: expect accuracy near or below "
                 f"chance, not the paper's.")
    lines += [text, ""]
    return lines


def _accuracy_lines(r: dict) -> list[str]:
    """The classifier accuracies under each protocol, against the paper's."""
    ev, acc = r["evaluation"], r["accuracy"]
    lines: list[str] = []
    schedule = ev["classifier"]["schedule"]
    lines += [
        "## Accuracy of a classifier trained on the synthetic data, tested on the real "
        "test set", "",
        "| protocol | ours | paper (Table 1) |", "|---|---|---|",
        f"| `val` (headline: epoch chosen on held-out synthetic data) | "
        f"**{_fmt(acc['val'])}** | -- |",
        f"| `sen` (authors': best test accuracy over epochs) | {_fmt(acc['sen'])} | "
        f"{_fmt(acc['paper'])} |",
    ]
    for authors in evaluate.authors_entries(ev["protocols"]):
        settings = authors["settings"]
        done = "" if authors.get("finished", True) else (
            f"; unfinished: {len(authors['curve']['epoch'])} of {settings['epochs']} epochs")
        lines.append(
            f"| `authors`, range {settings['range']} (their script: SGD lr "
            f"{settings['learning_rate']:g}, {settings['epochs']} epochs on the first "
            f"{settings['real_rows']} samples in a {settings['rows']}-row zero array; best "
            f"test accuracy, epoch {authors['epoch']}; {authors['seconds'] / 60:.0f} min{done}) "
            f"| {_fmt(authors['accuracy'])} | -- |")
    chance = 1.0 / len(ev["input"]["class_counts"])
    lines.append(f"| chance (1 / classes) | {_fmt(chance)} | -- |")
    if acc.get("independent"):
        lines.append(f"| independent re-run of the authors' code | -- | "
                     f"{_fmt(acc['independent']['accuracy'])} ({acc['independent']['source']}) |")
    if r.get("real_reference"):
        real = r["real_reference"]
        lines.append(f"| reference: same classifier on the real training data "
                     f"({real['samples']} images) | val {_fmt(real['val'])}, sen "
                     f"{_fmt(real['sen'])} | -- |")
    lines += [
        "",
        f"Paper value: {acc['paper_source']}.",
        f"Classifier: the authors' CNN, {schedule['optimizer']} lr {schedule['learning_rate']:g}, "
        f"batch {schedule['batch_size']}, {schedule['epochs']} epochs"
        + (" (the authors' schedule)" if ev["classifier"]["official_schedule"] else
           " (NOT the authors' 600-epoch SGD schedule; `--official` runs it)")
        + f"; {ev['input']['samples']} synthetic samples "
        f"({ev['split']['train']} train / {ev['split']['val']} held-out val), "
        f"{ev['test']['samples']} real test images; `val` chose epoch "
        f"{ev['protocols']['val']['epoch']}, `sen` epoch {ev['protocols']['sen']['epoch']} "
        f"(sen trained on {ev['protocols']['sen']['trained_on']}). Seeds: "
        + ", ".join(f"{k} {v}" for k, v in ev["seeds"].items()) + ".",
        "",
    ]
    for warning in ev.get("warnings", []):
        lines.append(f"**Warning:** {warning}")
    return lines


def _quality_lines(r: dict) -> list[str]:
    """Domain-classifier IS / FID, label agreement and per-class scores, if measured."""
    lines: list[str] = []
    q = r.get("quality")
    if q:
        real_q = (r.get("real_reference") or {}).get("quality")
        lines += [
            "## Visual quality (domain-classifier IS / FID)", "",
            "| | Inception Score | FID to the real test set |", "|---|---|---|",
            f"| synthetic ({q['samples']} samples) | {q['inception_score']:.3f} +- "
            f"{q['inception_score_std']:.3f} | {q['fid']:.3f} |",
            f"| real test images ({q['reference_samples']}) | "
            f"{q['reference_inception_score']:.3f} | 0 |",
        ]
        if real_q:
            lines.append(f"| real training images ({real_q['samples']}) | "
                         f"{real_q['inception_score']:.3f} | {real_q['fid']:.3f} |")
        if q.get("label_agreement") is not None:
            lines += ["", f"Label agreement (the domain classifier's class equals the "
                      f"sample's label; class-conditional fidelity): "
                      f"**{q['label_agreement']:.4f}** (real test images "
                      f"{_fmt(q.get('reference_label_agreement'))})."]
        per_class = q.get("per_class")
        if per_class and per_class.get("intra_fid") is not None:
            lines += ["", f"Per class ({per_class['classes_scored']} classes, each label's "
                      f"samples against the real test images of that class): intra-class "
                      f"FID **{per_class['intra_fid']:.3f}**, spread ratio "
                      f"**{per_class['spread_ratio']:.3f}** (1 = as diverse as the real "
                      f"class). By class: "
                      + ", ".join(f"{e['class']}: {_fmt(e['intra_fid'], 1)} / "
                                  f"{_fmt(e['spread_ratio'], 2)}"
                                  for e in per_class["per_class"]) + "."]
        lines += ["", f"Note: {q['note']}. Domain classifier key `{q['classifier_key']}`, its "
                  f"real test accuracy {_fmt(q.get('classifier_test_accuracy'))}."
                  + (f" Measured after the evaluation, by `{q['provenance']['command']}` at "
                     f"commit `{(q['provenance'].get('commit') or 'unknown')[:7]}`."
                     if q.get("provenance") else ""), ""]
    return lines


def _privacy_lines(r: dict) -> list[str]:
    """The epsilon spent and every reason it is not a guarantee."""
    priv = r["privacy"]
    lines: list[str] = []
    lines += ["## Privacy", ""]
    if priv.get("private"):
        eps = priv.get("epsilon") or {}
        both = priv.get("epsilon_all_conversions") or {}
        lines.append(f"Spent **epsilon = {_fmt(eps.get('epsilon'))}** at delta = "
                     f"{priv['delta']:g} ({priv['conversion']} conversion; budget "
                     f"{priv['max_eps']:g}) after {priv['steps']} generator steps, "
                     f"{priv['queries']} TopAgg queries; stopped by: {priv['stop_reason']}.")
        if both:
            lines.append("All conversions: " + ", ".join(
                f"{name} {_fmt(v.get('epsilon'))}" for name, v in sorted(both.items())) + ".")
        if priv.get("reproducible_noise"):
            lines.append("The run used a fixed --seed: its DP noise is reproducible, so its "
                         "outputs must not be published as private.")
        if cfg.partition_kind(r.get("config", {}).get("train", {})) == "class-balanced":
            lines.append("**The epsilon is not a proven guarantee:** the run used the "
                         "class-balanced partition (the authors'), under which one replaced "
                         "record can move many records between teachers (results/README.md).")
        elif priv.get("accounting_proven") is False:
            lines.append("**The epsilon is not a proven guarantee:** the run's privacy.json "
                         "says accounting_proven: false (an accounting option no proof "
                         "supports; see its warnings).")
    else:
        lines.append(f"**NOT PRIVATE** (non-private run): {priv['steps']} steps, no noise, "
                     f"no budget.")
    return lines


def _run_lines(r: dict) -> list[str]:
    """What the epsilon covers, the figures, and how and where the run was made."""
    prov = r["provenance"]
    lines: list[str] = []
    lines += ["", "The epsilon covers the generator and its samples. The evaluation above "
              "uses real data outside the mechanism: accuracies are measured on the real "
              "test split, and the domain classifier (IS / FID / label agreement) and the "
              "real-data reference row are trained on the real training split. Those "
              "numbers are for the researcher; the epsilon does not cover them.",
              "", "![epsilon vs step](epsilon.png)", "",
              "## Samples", "", "![samples, one row per class](samples.png)", "",
              "![classifier curves](evaluation.png)", "",
              "## Run", "",
              f"- wall time: training {_duration(r['seconds']['train'])}, evaluation "
              f"{_fmt(r['seconds']['evaluate'], 0)} s, total {_fmt(r['seconds']['total'], 0)} s",
              f"- teachers: {r['config']['train']['num_teachers']}, partition size "
              f"{r['partition_size']}, batch {r['batch']}; k = {r['config']['topagg']['topk']}, "
              f"sigma = {r['config']['topagg']['sigma']:g}, beta = "
              f"{r['config']['topagg']['thresh']:g}",
              f"- partition: {cfg.partition_kind(r['config']['train'])}; fake batches: "
              f"{r['config']['train'].get('fake_rendering', 'class_grid')}",
              f"- command: `{prov['command']}`",
              f"- commit: `{prov['commit']}`"
              + (" (with uncommitted changes)" if prov.get("uncommitted_changes") else ""),
              f"- machine: {prov['machine']['platform']}, {prov['machine']['cpu_count']} CPUs "
              f"({prov['machine']['processor']}), Python {prov['machine']['python']}, "
              f"TensorFlow {prov['machine']['tensorflow']}, Keras {prov['machine']['keras']}",
              f"- run directory (large files, not committed): `{r['run_dir']}`", ""]
    return lines
