"""Small helpers the result reports share: a mean and sample standard deviation over runs,
its table cell, publishing a file into results/ without overwriting a different one, and
rewriting the generated part of a hand-written markdown file."""

from __future__ import annotations

import math
import os
from typing import Iterable

from dclens.common import export


class ReportError(ValueError):
    """A file to publish or read is missing or is not what it should be."""


def copy_once(source: str, target: str, *, replace: bool = False) -> str:
    """Copies ``source`` to ``target`` atomically. An existing ``target`` with the same
    bytes is left alone; one with other bytes is an error unless ``replace`` (a result
    is never overwritten by accident). Returns ``target``."""
    with open(source, "rb") as handle:
        content = handle.read()
    if os.path.exists(target) and not replace:
        with open(target, "rb") as handle:
            if handle.read() == content:
                return target
        raise ReportError(f"{target} exists with other content; choose another --name or "
                          f"remove it first")
    os.makedirs(os.path.dirname(target) or ".", exist_ok=True)
    export.atomic_write(target, lambda out: out.write(content))
    return target


def mean_sd(values: Iterable[float]) -> tuple[int, float | None, float | None]:
    """(n, mean, sample standard deviation with ddof = 1, None for n < 2)."""
    values = [float(v) for v in values]
    if not values:
        return 0, None, None
    mean = math.fsum(values) / len(values)
    if len(values) < 2:
        return len(values), mean, None
    variance = math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1)
    return len(values), mean, math.sqrt(variance)


def mean_sd_cell(values: Iterable[float], digits: int = 4, absent: str = "not run") -> str:
    """``0.1234 +- 0.0056 (3 runs)``, ``0.1234 (1 run)``, or ``absent``."""
    n, mean, sd = mean_sd(values)
    if n == 0:
        return absent
    if sd is None:
        return f"{mean:.{digits}f} (1 run)"
    return f"{mean:.{digits}f} +- {sd:.{digits}f} ({n} runs)"


def write_marked_section(markdown_path: str, body: str, begin: str, end: str) -> None:
    """Replaces the text between the ``begin`` and ``end`` marker lines of
    ``markdown_path`` with ``body`` (atomically; the text outside is kept as written); a
    file without the markers gets them, with ``body``, at its end."""
    text = ""
    if os.path.exists(markdown_path):
        with open(markdown_path, encoding="utf-8") as handle:
            text = handle.read()
    section = f"{begin}\n{body}\n{end}"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        tail = rest.split(end, 1)[1]
        text = head + section + tail
    elif begin in text or end in text:
        raise ValueError(f"{markdown_path} has only one of the markers; restore both "
                         f"({begin!r} and {end!r}) or remove the one left")
    else:
        text = (text.rstrip("\n") + "\n\n" if text else "") + section + "\n"
    export.atomic_write(markdown_path, lambda s: s.write(text), mode="w")
