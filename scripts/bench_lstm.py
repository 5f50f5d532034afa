"""Cost of unrolling recurrent layers on a CPU: rewritten / original LSTM latency.

The zoo LSTM model (a bidirectional and a forward LSTM, Gemm head) is built at each static
sequence length and batch (pins only choose a plan's pricing shape, so the model itself is
made static); the original runs onnxruntime's LSTM kernels, the rewritten model runs the unrolled cells (input projection of all steps
hoisted into one MatMul per direction). Both in plain onnxruntime, same thread count,
timed interleaved; ratio = rewritten median / original median.
"""

from __future__ import annotations

import argparse
import os
import time

from onnxmlu import api
from onnxmlu.frontend.normalize import normalize
from onnxmlu.tools.timing import plain_session, time_interleaved
from onnxmlu.tools.verify import random_inputs
from onnxmlu.tools.zoo import build_model


def bench(seqs, batches, threads: int, runs: int) -> list[tuple]:
    """Rows (seq, batch, original ms, rewritten ms, ratio, rewritten nodes, original Timing,
    rewritten Timing), printed as they come; ``scripts/bench.py`` puts them in BENCHMARKS.md."""
    rows = []
    for seq in seqs:
        for batch in batches:
            static = _static_lstm(seq, batch)
            original = normalize(static)
            rewritten, _ = api.rewrite(static)
            feeds = random_inputs(original, seed=0)
            t = time_interleaved({"orig": plain_session(original, threads), "rw": plain_session(rewritten, threads)},
                                 feeds, runs=runs)
            rows.append((seq, batch, t["orig"].median_ms, t["rw"].median_ms,
                         t["rw"].median_ms / t["orig"].median_ms, len(rewritten.graph.node), t["orig"], t["rw"]))
            print(f"| {seq} | {batch} | {rows[-1][2]:.3f} | {rows[-1][3]:.3f} | {rows[-1][4]:.2f} | {rows[-1][5]} |",
                  flush=True)
    return rows


def _static_lstm(seq: int, batch: int):
    """The zoo LSTM with input [seq, batch, 64] fixed in the model."""
    model = build_model("lstm", batch=batch)
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = seq
    return model


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq", nargs="+", type=int, default=[16, 64])
    parser.add_argument("--batch", nargs="+", type=int, default=[1, 8])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args(argv)
    print(f"# LSTM unrolling · {os.cpu_count()} cores · {args.threads} thread(s) · median of {args.runs} "
          f"interleaved runs · {time.strftime('%Y-%m-%d')}")
    print("| seq | batch | original ms | rewritten ms | ratio | rewritten nodes |")
    print("|---|---|---|---|---|---|")
    bench(args.seq, args.batch, args.threads, args.runs)


if __name__ == "__main__":
    main()
