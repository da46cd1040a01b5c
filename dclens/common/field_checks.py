"""Validation of a settings dataclass's fields, with errors that quote the bad value.

The private-classifier and GS-WGAN configs (``dclens.dpsgd.config``,
``dclens.gswgan.config``) check the same kinds of field: enums given as strings, integer
counts, positive finite rates, a privacy budget given either as a target epsilon or as a
noise multiplier.  :class:`FieldChecks` holds those checks once; each raises the config's
own error class with ``"<name> = <value>: <what to do>"``.
"""

from __future__ import annotations

from enum import Enum
import math
from typing import Any, Iterable, NoReturn


def is_int(value: Any) -> bool:
    """An integer that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_finite_number(value: Any) -> bool:
    """A finite int or float that is not a bool."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


class FieldChecks:
    """Checks on the fields of one (frozen) dataclass instance.

    Args:
      settings: the instance; enum fields are coerced on it in place (with
        ``object.__setattr__``, so frozen dataclasses work).
      error: the exception class to raise (a ``ValueError`` subclass).
    """

    def __init__(self, settings: Any, error: type[ValueError]) -> None:
        self._settings = settings
        self._error = error

    def fail(self, name: str, hint: str) -> NoReturn:
        """Raises the config's error naming ``name``, its value and ``hint``."""
        raise self._error(f"{name} = {getattr(self._settings, name)!r}: {hint}")

    def enum(self, name: str, kind: type[Enum]) -> None:
        """Coerces field ``name`` to the enum ``kind`` (from its value), or fails."""
        value = getattr(self._settings, name)
        if isinstance(value, kind):
            return
        try:
            object.__setattr__(self._settings, name, kind(value))
        except ValueError:
            self.fail(name, f"choose one of {[member.value for member in kind]}")

    def ints(self, names: Iterable[str], minimum: int, hint: str | None = None) -> None:
        """Each field is an integer (not a bool) >= ``minimum``."""
        for name in names:
            value = getattr(self._settings, name)
            if not is_int(value) or value < minimum:
                self.fail(name, hint or f"must be an integer >= {minimum}")

    def optional_int(self, name: str, minimum: int) -> None:
        """The field is None or an integer >= ``minimum``."""
        value = getattr(self._settings, name)
        if value is not None and (not is_int(value) or value < minimum):
            self.fail(name, f"must be None or an integer >= {minimum}")

    def positive(self, names: Iterable[str], *, allow_zero: bool = False) -> None:
        """Each field is a finite number > 0 (>= 0 with ``allow_zero``)."""
        for name in names:
            value = getattr(self._settings, name)
            if not (is_finite_number(value)
                    and (value >= 0 if allow_zero else value > 0)):
                self.fail(name, f"must be a finite number {'>=' if allow_zero else '>'} 0")

    def fraction(self, names: Iterable[str]) -> None:
        """Each field is a number in [0, 1) (a momentum, an Adam beta, an EMA decay)."""
        for name in names:
            value = getattr(self._settings, name)
            if not (is_finite_number(value) and 0 <= value < 1):
                self.fail(name, "must be in [0, 1)")

    def budget(self) -> None:
        """Exactly one of ``target_eps`` and ``sigma``, each finite and > 0 when given,
        and ``delta`` in (0, 1)."""
        target_eps, sigma = self._settings.target_eps, self._settings.sigma
        if (target_eps is None) == (sigma is None):
            raise self._error(
                f"give exactly one of target_eps ({target_eps!r}) and sigma ({sigma!r}): "
                "the budget to calibrate sigma to, or sigma itself")
        self.positive(name for name in ("target_eps", "sigma")
                      if getattr(self._settings, name) is not None)
        delta = self._settings.delta
        if not (is_finite_number(delta) and 0 < delta < 1):
            self.fail("delta", "must be in (0, 1), e.g. 1e-5")
