"""Cost of unrolling recurrent layers on a CPU: rewritten / original LSTM latency.

The zoo LSTM model (a bidirectional and a forward LSTM, Gemm head) is pinned to each
sequence length and batch with an input-shape override; the original runs onnxruntime's
LSTM kernels, the rewritten model runs the unrolled cells (input projection of all steps
hoisted into one MatMul per direction). Both in plain onnxruntime, same thread count,
timed interleaved; ratio = rewritten median / original median.
"""

from __future__ import annotations

import argparse
import os
import time


from onnxmlu import api
from onnxmlu.graph import normalize
from onnxmlu.timing import plain_session, time_interleaved
from onnxmlu.verify import random_inputs
from onnxmlu.zoo import build_model


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
    base = build_model("lstm", batch="N")
    for seq in args.seq:
        for batch in args.batch:
            shapes = {"input": [seq, batch, 64]}
            original = normalize(base, shapes)
            rewritten, _ = api.rewrite(base, input_shapes=shapes)
            feeds = random_inputs(original, seed=0)
            t = time_interleaved({"orig": plain_session(original, args.threads), "rw": plain_session(rewritten, args.threads)},
                                 feeds, runs=args.runs)
            print(f"| {seq} | {batch} | {t['orig'].median_ms:.3f} | {t['rw'].median_ms:.3f} | "
                  f"{t['rw'].median_ms / t['orig'].median_ms:.2f} | {len(rewritten.graph.node)} |", flush=True)


if __name__ == "__main__":
    main()
