"""Diagnostics (docs/methods.md §6): spike detection, cross-process reduction. The callback in tiny runs:
tests/e2e/test_diagnostics.py."""


import pytest

from diffusion_rl.app.train import build
from diffusion_rl.core.errors import ConfigError
from diffusion_rl.training.diagnostics import (
    DiagnosticsConfig,
    GradSpikeTracker,
)
from tests.helpers.common import compose_cfg

# min_history=3: the first three norms are never spikes; factor 3 x the running median.
SERIES = [1.0, 1.2, 0.9, 1.1, 5.0, 1.0, 3.1, 2.9, 40.0, 1.0]
# 5.0 > 3 x median(1, 1.2, 0.9, 1.1) = 3.15; 3.1 < 3 x median(.., 5, 1) = 3.15; 2.9 < 3 x 1.1; 40 > 3 x 1.1
SPIKES = [0, 0, 0, 0, 1, 0, 0, 0, 1, 0]


def test_spike_detection_on_a_hand_made_series():
    cfg = DiagnosticsConfig(spike_factor=3.0, window=50, min_history=3, ema_decay=0.5)
    tr = GradSpikeTracker(cfg)
    rows = [tr.update(x) for x in SERIES]
    assert [int(r["grad/spike"]) for r in rows] == SPIKES
    assert [r["grad/spikes_total"] for r in rows] == [float(sum(SPIKES[: i + 1])) for i in range(len(SERIES))]
    ema = SERIES[0]
    for x, r in zip(SERIES, rows):
        ema = x if r is rows[0] else 0.5 * ema + 0.5 * x
        assert r["grad/norm_ema"] == pytest.approx(ema)
    s = tr.summary()
    assert s["grad_spikes"] == 2 and s["grad_norm_max"] == 40.0 and s["updates"] == len(SERIES)
    assert s["grad_norm_mean"] == pytest.approx(sum(SERIES) / len(SERIES))


def test_a_large_first_norm_is_not_a_spike_and_the_window_slides():
    tr = GradSpikeTracker(DiagnosticsConfig(min_history=2, window=2))
    assert [tr.update(x)["grad/spike"] for x in (100.0, 1.0, 1.0, 10.0, 10.0, 10.0)] == [0, 0, 0, 1, 0, 0]


def test_tracker_state_round_trip_continues_the_same_series():
    cfg = DiagnosticsConfig(min_history=3)
    whole = GradSpikeTracker(cfg)
    expected = [whole.update(x) for x in SERIES]
    first = GradSpikeTracker(cfg)
    for x in SERIES[:5]:
        first.update(x)
    second = GradSpikeTracker(cfg)
    second.load_state_dict(first.state_dict())
    assert [second.update(x) for x in SERIES[5:]] == expected[5:]


@pytest.mark.parametrize("bad", ["diagnostics.spike_factor=0.5", "diagnostics.min_history=0",
                                 "diagnostics.samples_every_n_steps=-1"])
def test_bad_diagnostics_values_fail_at_start(tmp_path, bad):
    with pytest.raises(ConfigError, match=bad.split("=")[0]):
        build(compose_cfg([bad], tmp_path))
