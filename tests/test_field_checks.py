"""The shared settings checks: each bad value is refused with its name, value and a fix."""

import dataclasses
import enum

import pytest

from dclens.common.field_checks import FieldChecks


class Colour(enum.Enum):
    RED = "red"
    BLUE = "blue"


class SettingsError(ValueError):
    pass


@dataclasses.dataclass(frozen=True)
class Settings:
    colour: Colour | str = Colour.RED
    count: int = 3
    offset: int = 0
    limit: int | None = None
    rate: float = 0.5
    penalty: float = 0.0
    decay: float = 0.9
    target_eps: float | None = 1.0
    sigma: float | None = None
    delta: float = 1e-5

    def __post_init__(self) -> None:
        check = FieldChecks(self, SettingsError)
        check.enum("colour", Colour)
        check.ints(("count",), 1)
        check.ints(("offset",), 0)
        check.optional_int("limit", 1)
        check.positive(("rate",))
        check.positive(("penalty",), allow_zero=True)
        check.fraction(("decay",))
        check.budget()


def test_valid_settings_pass_and_enums_are_coerced():
    settings = Settings(colour="blue", limit=5, penalty=0, sigma=None, target_eps=2)
    assert settings.colour is Colour.BLUE
    assert Settings(target_eps=None, sigma=0.7).sigma == 0.7


@pytest.mark.parametrize("change, message", [
    ({"colour": "green"}, r"colour = 'green': choose one of \['red', 'blue'\]"),
    ({"count": 0}, "count = 0: must be an integer >= 1"),
    ({"count": True}, "count = True: must be an integer >= 1"),
    ({"count": 2.0}, "count = 2.0: must be an integer >= 1"),
    ({"offset": -1}, "offset = -1: must be an integer >= 0"),
    ({"limit": 0}, "limit = 0: must be None or an integer >= 1"),
    ({"rate": 0.0}, "rate = 0.0: must be a finite number > 0"),
    ({"rate": float("inf")}, "rate = inf: must be a finite number > 0"),
    ({"rate": "fast"}, "rate = 'fast': must be a finite number > 0"),
    ({"penalty": -0.1}, "penalty = -0.1: must be a finite number >= 0"),
    ({"decay": 1.0}, r"decay = 1.0: must be in \[0, 1\)"),
    ({"target_eps": None}, "give exactly one of target_eps"),
    ({"sigma": 1.0}, "give exactly one of target_eps"),
    ({"target_eps": -1.0}, "target_eps = -1.0: must be a finite number > 0"),
    ({"target_eps": None, "sigma": float("nan")}, "sigma = nan: must be a finite"),
    ({"delta": 1.0}, r"delta = 1.0: must be in \(0, 1\)"),
])
def test_each_bad_value_is_refused_with_its_value(change, message):
    with pytest.raises(SettingsError, match=message):
        Settings(**change)
