"""benchmarks/run.py's targets: each judged at the size its goal names (make bench prints them)."""

from __future__ import annotations

from benchmarks.run import targets


def _by_name(results: dict) -> dict[str, dict]:
    return {t["target"]: t for t in targets(results)["targets"]}


def test_the_gang_target_is_the_operators_share_added_over_one_slice() -> None:
    best = {
        "1": {"slices": 1, "ready_s": 5.6, "operator_share_s": 0.15, "ratio_to_one_slice": 1.0},
        "256": {"slices": 256, "ready_s": 9.0, "operator_share_s": 0.50, "ratio_to_one_slice": 1.6},
    }
    got = _by_name({"gang": {"best": best, "one_slice_s": 5.6}})
    share = got["gang 256 slices: operator share added vs one slice (s)"]
    assert abs(share["value"] - 0.35) < 1e-9 and share["met"] is False
    best["256"]["operator_share_s"] = 0.30  # the simulator slow, the operator not: met
    assert _by_name({"gang": {"best": best, "one_slice_s": 5.6}})[
        "gang 256 slices: operator share added vs one slice (s)"
    ]["met"]


def test_rss_is_judged_at_1000_jobs_and_5000_is_reported_without_a_goal() -> None:
    rows = [
        {"jobs": n, "idle": {"rss_mib": rss, "writes_per_min": 0, "cpu_percent": 0.0}}
        for n, rss in ((0, 76.0), (100, 85.0), (1000, 120.0), (5000, 260.0))
    ]
    got = _by_name({"footprint": {"results": rows}})
    assert got["RSS at 1000 jobs (MiB)"]["value"] == 120.0
    assert got["RSS at 1000 jobs (MiB)"]["met"] is True
    assert got["RSS at 5000 jobs (MiB)"]["met"] is None
