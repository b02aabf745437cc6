"""The workload's transformer LM on this machine's CPU: tokens/s and MFU at 1 and 2 slices, and
the optimizer state each device holds with FSDP 1 vs 4.

Not a test. The LM trains on the prepared corpus (`prepare`: the Language Reference CPython
ships, a 4096-token BPE trained on it) with its tokenizer. Each "slice" is one host process with
--devices CPU devices (local launcher, gloo between processes). Cases: 1 slice (ici_fsdp =
devices); 2 slices with data parallelism over DCN (dcn_data=2); 2 slices as two pipeline stages
(dcn_pipeline=2, GPipe; its bubble measured per stage with --measure_bubble, next to the
schedule's bound). Step time is the interval between completed steps (data
loading included: the loop never idles the devices for it, it just is inside), mean and median
over the steady state (every step after the first 2; the run's `finished` event), not a best-of.
MFU is the workload's own, from the mean: 6 x matmul parameters + causal attention FLOPs
(6 x layers x heads x head_dim x seq_len, half of PaLM's non-causal 12 x ...) per token, the
rematerialized forward not counted, against peak / devices, the peak being this machine's
single-process matmul peak (workload_common.py). Then two 1-slice runs with 4 devices,
ici_fsdp=4 vs ici_data=4, report the bytes of Adam state per device (expect about 1/4).

    .venv/bin/python -m benchmarks.workload_lm [--devices 2] [--steps 12]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.workload_common import launch_case, load_average, machine, measure_peak
from multislice_workload.env import Parallelism

RESULTS = Path(__file__).resolve().parent / "results" / "workload_lm.json"


def prepare_corpus(directory: str) -> dict[str, Any]:
    from multislice_workload import prepare

    docs = prepare.builtin_documents(["python-docs"])
    return prepare.prepare(docs, Path(directory), vocab_size=4096, source="python-docs")


def model_args(args: argparse.Namespace) -> list[str]:
    return [
        "train",
        "--dataset", args.dataset,
        "--batch_size", str(args.batch_size),
        "--seq_len", str(args.seq_len),
        "--embed", str(args.embed),
        "--heads", str(args.heads),
        "--head_dim", str(args.embed // args.heads),
        "--mlp", str(4 * args.embed),
        "--num_layers", str(args.layers),
        "--dtype", "float32",
        "--hang_timeout_s", "0",
    ]  # fmt: skip


def run_case(
    name: str, slices: int, parallelism: Parallelism, peak: float, args: argparse.Namespace
) -> dict[str, Any]:
    devices = slices * args.devices
    run_args = [*model_args(args), "--steps", str(args.steps)]
    run_args += ["--log_every", str(args.steps // 3), "--peak_flops", str(peak / devices)]
    if parallelism.dcn_pipeline > 1:
        run_args.append("--measure_bubble")
    result = launch_case(
        slices,
        args.devices,
        run_args,
        parallelism=parallelism,
    )
    config = result.events_named("train_config")[0]
    steady = next(e for e in result.events_named("finished") if e["launch_process"] == 0)
    return {
        "case": name,
        "slices": slices,
        "global_devices": devices,
        "parameters": config["parameters"],
        "flops_per_token": config["flops_per_token"],
        "stages": config["stages"],
        "microbatches": config["microbatches"],
        "bubble_bound": config["bubble_bound"],
        # Per stage, its own work timed alone against the pipelined blocks; the worst stage.
        "bubble_measured": max(
            (e["bubble_measured"] for e in result.events_named("pipeline_bubble")), default=0.0
        ),
        "compile_seconds": config["compile_seconds"],
        "attention_flops_per_token": config["attention_flops_per_token"],
        "attention_impl": config["attention_impl"],
        "vocab_size": config["vocab_size"],
        "steady_steps": steady["steady_steps"],
        "step_seconds": steady["step_seconds"],
        "step_seconds_p50": steady["step_seconds_p50"],
        "tokens_per_sec": steady["tokens_per_sec"],
        "tokens_per_sec_per_device": steady["tokens_per_sec_per_device"],
        "mfu": steady["mfu"],
        "first_loss": result.events_named("step")[0]["loss"],
        "final_loss": result.events_named("step")[-1]["loss"],
    }


def optimizer_bytes(fsdp: bool, args: argparse.Namespace) -> int:
    devices = 4
    layout = Parallelism(ici_fsdp=devices) if fsdp else Parallelism(ici_data=devices)
    from multislice_workload.local import launch

    result = launch(1, 1, devices, args=[*model_args(args), "--steps", "1"], parallelism=layout)
    if not result.succeeded:
        raise SystemExit(f"optimizer-state run failed: {result.format_timeline()}")
    return int(result.events_named("train_config")[0]["opt_state_bytes_per_device"])


def print_table(peak: float, rows: list[dict[str, Any]], fsdp1: int, fsdp4: int) -> None:
    print(f"single-process float32 matmul peak: {peak / 1e9:.1f} GFLOP/s")
    first = rows[0]
    print(f"model: {first['parameters']:,} parameters, {first['flops_per_token']:,.0f} FLOPs/token")
    header = f"{'case':<24} {'devices':>7} {'mean s':>8} {'p50 s':>8} {'tokens/s':>9} "
    print(header + f"{'/device':>8} {'MFU':>6} {'bubble':>6} {'bound':>6} {'loss':>13}")
    for r in rows:
        print(
            f"{r['case']:<24} {r['global_devices']:>7} {r['step_seconds']:>8.3f} "
            f"{r['step_seconds_p50']:>8.3f} {r['tokens_per_sec']:>9.0f} "
            f"{r['tokens_per_sec_per_device']:>8.0f} {100 * r['mfu']:>5.1f}% "
            f"{r['bubble_measured']:>6.3f} {r['bubble_bound']:>6.3f} "
            f"{r['first_loss']:>6.2f}>{r['final_loss']:<6.2f}"
        )
    print(
        f"Adam state per device: FSDP 1 {fsdp1 / 1e6:.2f} MB, FSDP 4 {fsdp4 / 1e6:.2f} MB "
        f"(ratio {fsdp4 / fsdp1:.3f})"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=2, help="CPU devices per slice")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch_size", type=int, default=16, help="global, sequences")
    parser.add_argument("--seq_len", type=int, default=256)
    parser.add_argument("--embed", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=4)
    args = parser.parse_args()
    corpus = tempfile.TemporaryDirectory(prefix="workload-corpus-")
    args.dataset = corpus.name
    manifest = prepare_corpus(corpus.name)

    peak = measure_peak()
    d = args.devices
    rows = [
        run_case("1 slice (fsdp)", 1, Parallelism(ici_fsdp=d), peak, args),
        run_case("2 slices (dcn data)", 2, Parallelism(ici_fsdp=d, dcn_data=2), peak, args),
        run_case("2 slices (dcn pipeline)", 2, Parallelism(ici_fsdp=d, dcn_pipeline=2), peak, args),
    ]
    fsdp1, fsdp4 = optimizer_bytes(False, args), optimizer_bytes(True, args)
    print_table(peak, rows, fsdp1, fsdp4)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "benchmark": "workload_lm",
        "machine": machine(),
        "config": {k: v for k, v in vars(args).items() if k != "dataset"},
        "corpus": {
            "source": manifest["source"],
            "vocab_size": manifest["vocab_size"],
            "train_tokens": manifest["splits"]["train"]["tokens"],
        },
        "single_process_matmul_peak_gflops": peak / 1e9,
        "cases": rows,
        "two_slices_tokens_per_sec_vs_one": rows[1]["tokens_per_sec"] / rows[0]["tokens_per_sec"],
        "opt_state_bytes_per_device": {"fsdp_1": fsdp1, "fsdp_4": fsdp4, "ratio": fsdp4 / fsdp1},
        "load_average_1m_at_end": load_average(),
    }
    RESULTS.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
