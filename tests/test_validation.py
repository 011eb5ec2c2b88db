"""The shared validation helpers (brorl_lab.core.validation) that every public function's checks go through."""

import numpy as np
import pytest

from brorl_lab.core.validation import check_int, check_seeds, did_you_mean, is_finite_number, is_int, is_number


@pytest.mark.parametrize("value, integer, number", [
    (3, True, True), (np.int64(3), True, True), (True, False, False), (np.bool_(True), False, False),
    (2.0, False, True), (np.float32(0.5), False, True), ("3", False, False), (None, False, False),
])
def test_bool_is_never_a_number(value, integer, number):
    assert is_int(value) is integer and is_number(value) is number


def test_finite_and_check_int_name_the_argument():
    assert is_finite_number(1.5) and not is_finite_number(float("nan")) and not is_finite_number(float("inf"))
    assert check_int("samples", 4) == 4
    for bad in (0, True, 2.0, "4"):
        with pytest.raises(ValueError, match=r"^samples: got .*; allowed: an integer >= 1$"):
            check_int("samples", bad)


def test_did_you_mean_offers_the_nearest_name_only_when_close():
    assert did_you_mean("grp", ["grpo", "rloo"]) == " (did you mean 'grpo'?)"
    assert did_you_mean("zzz", ["grpo", "rloo"]) == ""


@pytest.mark.parametrize("seeds", [[], [0, 0], [-1], [True], [0.5], "01", 3, None])
def test_check_seeds_rejects_nonsense_naming_the_field(seeds):
    with pytest.raises(ValueError, match="seeds: got"):
        check_seeds(seeds)


def test_check_seeds_returns_a_list():
    assert check_seeds((2, 0, 1)) == [2, 0, 1] and check_seeds(range(3)) == [0, 1, 2]
