"""The per-rank p90 step time is numpy's default (linear) percentile to the bit, without importing numpy.ma."""

from __future__ import annotations

import random

import numpy as np

from ddpdoctor.analyses.rank import _p


def test_p_equals_numpy_percentile() -> None:
    rng = random.Random(29)
    for _ in range(3000):
        values = [rng.choice([rng.random() * 1e6, rng.randint(0, 10**7) / 7, 1e5]) for _ in range(rng.randint(1, 40))]
        for q in (10, 50, 90, 95, 99, 100, 0):
            assert _p(values, q) == float(np.percentile(values, q)), (values, q)
    assert _p([], 90) is None
