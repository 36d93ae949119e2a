"""report.json's rounding (``precision``): significant digits kept, float noise dropped, the tree
as it was."""

import math

from vapo_lab.report import precision


def test_json_floats_keep_their_significant_digits_and_drop_float_noise():
    assert precision.JSON_DIGITS == 8
    assert (
        precision.json_float(0.11515151515151512)
        == precision.json_float(0.11515151515151509)
        == 0.11515152
    )
    assert precision.json_float(43.359375) == 43.359375  # exact, under 8 digits: as it is
    assert precision.json_float(-0.032552083333328596) == -0.032552083
    assert precision.json_float(2.0000000000000004e-05) == 2e-05
    assert (
        precision.json_float(3.5e-15) == 0.0
        and math.copysign(1, precision.json_float(-3.5e-15)) == 1
    )
    assert (
        math.isnan(precision.json_float(float("nan")))
        and precision.json_float(math.inf) == math.inf
    )


def test_json_rounding_keeps_the_tree():
    tree = {
        "seeds": 3,
        "ok": True,
        "ci": (41.11328125, 43.066406251),
        "ids": ["a1"],
        "n": None,
        "at": {5: 0.9200000000000002},
    }
    assert precision.json_rounded(tree) == {
        "seeds": 3,
        "ok": True,
        "ci": [41.113281, 43.066406],
        "ids": ["a1"],
        "n": None,
        "at": {5: 0.92},
    }


def test_fixed_writes_the_places_asked_with_an_optional_sign():
    assert precision.fixed(43.359375, precision.SCORE) == "43.4"
    assert precision.fixed(-0.0325, precision.SCORE, signed=True) == "-0.0"
    assert precision.fixed(0.012, precision.DIAGNOSTIC, signed=True) == "+0.012"
