"""The operator runs on uvloop's event loop (controller/main.py): libuv transports and TLS in C
for the apiserver's watch streams and writes, where asyncio's are Python."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import kopf
import pytest
import uvloop

from multislice_operator.cli.main import build_parser
from multislice_operator.controller import discovery, handlers
from multislice_operator.controller import main as controller_main


def test_the_operator_runs_kopf_on_uvloops_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    loops: list[type] = []

    async def operator(**_: Any) -> None:
        loops.append(type(asyncio.get_running_loop()))

    monkeypatch.setattr(kopf, "operator", operator)
    monkeypatch.setattr(handlers, "configure", lambda *_: None)
    monkeypatch.setattr(discovery, "install", lambda *_, **__: None)
    monkeypatch.setattr(controller_main, "setup_logging", lambda _: None)
    args = build_parser().parse_args(["run", "--all-namespaces"])
    try:
        assert controller_main.run_operator(args) == 0
    finally:
        logging.getLogger("multislice_operator").handlers.clear()
    assert loops == [uvloop.Loop]
