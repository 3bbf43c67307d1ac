"""Loss-curve shapes (playbook §1.1)."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from syncdoctor.doctor.shape import classify, classify_many

PLAYBOOK = [0.25, 0.34, 0.49, 0.28, 0.52, 0.81, 0.96, 0.67, 1.12, 1.56]


def _decay(n: int) -> np.ndarray:
    return 0.1 + 2.2 * np.exp(-np.arange(n) / (n / 5))


def test_playbook_ten_values_are_sawtooth():
    s = classify(PLAYBOOK, steps=list(range(1, 11)))
    assert s.shape == "sawtooth"
    assert s.n_points == 10
    assert s.amplitude is not None and s.amplitude > 0.3
    assert s.rhythm == pytest.approx(0.5)
    assert s.trend is not None and s.trend > 1
    assert "sync" in s.detail


@pytest.mark.parametrize("seed", range(20))
def test_small_noise_around_030_is_noise(seed):
    values = 0.30 + np.random.default_rng(seed).uniform(-0.01, 0.01, 100)
    s = classify(values)
    assert s.shape == "noise", s.detail
    assert s.amplitude is not None and s.amplitude < 0.05


@pytest.mark.parametrize("seed", range(20))
def test_exponential_decay_with_5pct_noise_is_decreasing(seed):
    rng = np.random.default_rng(seed)
    values = 2.3 * np.exp(-np.arange(150) / 40) * (1 + rng.normal(0, 0.05, 150))
    s = classify(values)
    assert s.shape == "decreasing", s.detail
    assert s.trend is not None and s.trend < -0.5


@pytest.mark.parametrize("n", [50, 150, 1000, 10_000])
@pytest.mark.parametrize("seed", range(5))
def test_small_batch_sgd_jitter_is_still_decreasing(n, seed):
    # A 32-sample batch of a 10-class problem: 2.3 → 0.1 with ±30 % jitter per step.
    rng = np.random.default_rng(seed)
    uniform = _decay(n) * (1 + rng.uniform(-0.3, 0.3, n))
    assert classify(uniform).shape == "decreasing", classify(uniform).detail
    # Per-sample cross-entropy is heavy-tailed; the batch mean of 32 of them too.
    batch = rng.exponential(1.0, (n, 32)).mean(axis=1) * _decay(n)
    assert classify(batch).shape == "decreasing", classify(batch).detail


@pytest.mark.parametrize(
    "values",
    [
        0.3 * 1.05 ** np.arange(60),
        np.linspace(0.3, 3.0, 100),
        np.linspace(0.3, 3.0, 100) * (1 + np.random.default_rng(1).normal(0, 0.05, 100)),
    ],
    ids=["exponential", "linear", "linear+noise"],
)
def test_steady_growth_is_diverging(values):
    s = classify(values)
    assert s.shape == "diverging", s.detail
    assert s.trend is not None and s.trend > 1


def test_single_5x_spike_that_recovers_is_spike():
    rng = np.random.default_rng(3)
    values = 2.3 * np.exp(-np.arange(150) / 40) * (1 + rng.normal(0, 0.05, 150))
    values[70] *= 5
    s = classify(values, steps=list(range(1000, 1150)))
    assert s.shape == "spike", s.detail
    assert "step 1070" in s.detail


def test_unrecovered_blow_up_at_the_end_is_diverging():
    values = list(2.3 * np.exp(-np.arange(50) / 20)) + [40.0]
    assert classify(values).shape == "diverging"


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_nonfinite_reports_first_step(bad):
    values = list(_decay(40))
    values[17] = bad
    values[30] = math.nan
    s = classify(values, steps=list(range(100, 140)))
    assert s.shape == "nonfinite"
    assert "step 117" in s.detail
    assert "2 of 40" in s.detail


def test_nonfinite_wins_over_too_short():
    assert classify([1.0, math.nan]).shape == "nonfinite"


def test_too_short():
    s = classify([0.5, 0.4, 0.3, 0.2])
    assert s.shape == "too_short"
    assert s.amplitude is None


def test_flat_and_plateau_at_chance():
    assert classify([0.693] * 30).shape == "flat"
    chance = math.log(10)
    assert classify([chance] * 30, chance_loss=chance).shape == "plateau_chance"
    noisy = chance + np.random.default_rng(0).normal(0, 0.03, 200)
    assert classify(noisy, chance_loss=chance).shape == "plateau_chance"
    assert classify(noisy).shape == "noise"  # without a chance level it is just noise
    assert classify(_decay(200), chance_loss=chance).shape == "decreasing"


def test_alternating_and_staged_jumps_are_sawtooth():
    rng = np.random.default_rng(0)
    alternating = np.tile([0.3, 1.2], 30) * (1 + rng.normal(0, 0.03, 60))
    assert classify(alternating).shape == "sawtooth"
    stages = np.repeat([0.3, 0.9, 0.3, 0.9, 0.4, 1.0, 0.3, 0.9], 25) * (1 + rng.normal(0, 0.03, 200))
    assert classify(stages).shape == "sawtooth", classify(stages).detail


def test_detail_is_one_line_with_numbers():
    s = classify(PLAYBOOK)
    assert "\n" not in s.detail
    assert "%" in s.detail and "0.295" in s.detail


def test_long_series_is_fast():
    rng = np.random.default_rng(0)
    values = _decay(10_000) * (1 + rng.uniform(-0.3, 0.3, 10_000))
    start = time.perf_counter()
    for _ in range(10):
        classify(values)
    assert (time.perf_counter() - start) / 10 < 0.25


def test_steps_length_must_match():
    with pytest.raises(ValueError):
        classify([1.0] * 10, steps=[1, 2, 3])


def test_classify_many_accepts_pairs_and_flat_lists():
    pairs = [[s, v] for s, v in zip(range(5, 15), PLAYBOOK, strict=True)]
    shapes = classify_many({3: pairs, 1: list(_decay(100)), 2: np.asarray(PLAYBOOK)})
    assert [s.rank for s in shapes] == [1, 2, 3]
    assert [s.shape for s in shapes] == ["decreasing", "sawtooth", "sawtooth"]
    nan_pairs = [[10, 1.0], [11, 0.9], [12, math.nan]]
    assert "step 12" in classify_many({0: nan_pairs})[0].detail


@pytest.mark.parametrize("window", [1, 3, 4, 25, 51])
def test_the_sliding_median_is_numpys_to_the_bit(window: int) -> None:
    """sliding_median takes polars' rolling median for odd windows (ten times faster):
    it must give what numpy's median of each window gives, bit for bit, on values with
    ties, tiny and huge magnitudes, and fewer values than the window."""
    from numpy.lib.stride_tricks import sliding_window_view

    from syncdoctor.doctor.shape import sliding_median

    rng = np.random.default_rng(window)
    series = [
        rng.normal(size=4000),
        np.round(rng.normal(size=999), 1),
        np.exp(rng.normal(size=500)) * 1e-200,
        np.r_[np.full(60, 0.25), np.full(60, 1.56)],
        rng.normal(size=window) * 1e300,
        np.r_[rng.normal(size=80), np.nan, rng.normal(size=80), np.inf],
    ]
    for x in series:
        want = np.median(sliding_window_view(x, window), axis=1)
        got = sliding_median(x, window)
        assert got.dtype == want.dtype and np.array_equal(got, want, equal_nan=True)
