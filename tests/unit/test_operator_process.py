"""The harness's operator process is never left behind: one that does not come live in time (a
loaded machine: issue 56's benchmark runs) is stopped before the error goes up, or it outlives
its control plane, retrying a login against a kubeconfig that is gone."""

from __future__ import annotations

from pathlib import Path

import pytest

from multislice_local.harness import OperatorProcess


def test_an_operator_that_never_came_live_is_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def never(self: OperatorProcess, timeout: float = 60) -> None:
        raise TimeoutError("operator liveness endpoint")

    monkeypatch.setattr(OperatorProcess, "wait_live", never)
    op = OperatorProcess(tmp_path / "no-kubeconfig", log_path=tmp_path / "op.log")
    with pytest.raises(TimeoutError):
        op.start()
    assert op.proc is not None
    assert op.proc.poll() is not None, "the operator process still runs"
