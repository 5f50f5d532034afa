"""Check DLFusion's findings (issue 4) under the performance model, for calibration.

    .venv/bin/python scripts/calibrate_model.py [key=value ...]

``key=value`` overrides entries of the profile's ``"model"`` dict (e.g. core_sync_us=8).
Prints, per zoo CNN, each strategy's simulated latency and speedup over ``none``, and then
every finding of ``tests/perf/test_paper_findings.py`` with PASS/FAIL.  Uses the synthetic
layer tables unless ``--real`` is given (they match the real pipeline's layers).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "perf")]

from onnxmlu.plan.perf.hardware import load_hardware  # noqa: E402
from onnxmlu.plan.perf.model import make_cost  # noqa: E402
from onnxmlu.plan.strategies import BUILTIN_ORDER, get_strategy  # noqa: E402
from onnxmlu.plan.strategies.basic import best_single_mp  # noqa: E402
from onnxmlu.plan.plan import Block  # noqa: E402


def main(argv: list[str]) -> int:
    if "--real" not in argv:
        os.environ["ONNXMLU_SYNTHETIC_ZOO"] = "1"
    from zoo_layers import CNN_NAMES, conv_chain, zoo_layers

    hw = load_hardware()
    overrides = dict(a.split("=", 1) for a in argv if "=" in a)
    hw = hw.with_params(**{k: float(v) for k, v in overrides.items()})
    cost = make_cost(hw)
    ok = True
    rows = {}
    for name in CNN_NAMES:
        layers = zoo_layers(name)
        lat = {}
        for s in BUILTIN_ORDER:
            plan = get_strategy(s)(layers, hw, cost)
            plan.validate(layers, hw.cores)
            lat[s] = (sum(cost(b.layers(layers), b.mp) for b in plan.blocks), plan)
        rows[name] = lat
        base = lat["none"][0]
        print(f"{name:12s}" + " ".join(f"{s}={v/1e3:.3f}ms({base/v:.2f}x,{len(p.blocks)})" for s, (v, p) in lat.items()))
        d = lat["dlfusion"][1]
        print("   dlfusion blocks/mp:", [(b.stop - b.start, b.mp) for b in d.blocks])
        o = lat["optimal"][1]
        print("   optimal blocks/mp: ", [(b.stop - b.start, b.mp) for b in o.blocks])
        print("   fixed-mp:", lat["fixed-mp"][1].notes.get("mp"), " ffmp:", lat["fusion-fixed-mp"][1].notes.get("mp"))

    def check(label, cond):
        nonlocal ok
        ok &= bool(cond)
        print(("PASS " if cond else "FAIL ") + label)

    r18 = rows["resnet18"]["fixed-mp"][1].notes["mp"]
    v19 = rows["vgg19"]["fixed-mp"][1].notes["mp"]
    check(f"F1 best fixed MP resnet18={r18} in {{2,4,8}}, vgg19={v19} in {{8,16,24}}, vgg>resnet",
          r18 in (2, 4, 8) and v19 in (8, 16, 24) and v19 > r18)
    best_sizes = []
    for c, size in ((64, 56), (256, 56), (512, 28)):
        t = chain_times(conv_chain(c, size), hw, cost)
        best = min(t, key=t.get)
        best_sizes.append(best)
        print(f"   chain {c}x{size}: " + ", ".join(f"B={b}:{v/1e3:.3f}ms@{m}" for b, (v, m) in t_full(conv_chain(c, size), hw, cost).items()))
    check(f"F2 best block sizes {best_sizes} non-increasing, last < first",
          all(a >= b for a, b in zip(best_sizes, best_sizes[1:])) and best_sizes[-1] < best_sizes[0])
    t14 = chain_times(conv_chain(512, 14), hw, cost)
    t28 = chain_times(conv_chain(512, 28), hw, cost)
    print(f"   14x14: B16/B4 = {t14[16]/t14[4]:.3f}; 28x28: B4/B16 = {t28[4]/t28[16]:.3f}")
    check("F3 14x14 fuse16 < fuse4 and 28x28 fuse4 < fuse16", t14[16] < t14[4] and t28[4] < t28[16])
    for name, lat in rows.items():
        d = lat["dlfusion"][0]
        beats = all(d < lat[s][0] for s in ("none", "fixed-mp", "dynamic-mp"))
        ties = all(d <= 1.02 * lat[s][0] for s in ("all-fusion", "fusion-fixed-mp"))
        print(f"   {name}: dlf/allf={d/lat['all-fusion'][0]:.3f} dlf/ffmp={d/lat['fusion-fixed-mp'][0]:.3f} "
              f"dlf/dyn={d/lat['dynamic-mp'][0]:.3f} speedup={lat['none'][0]/d:.2f} dlf/opt={d/lat['optimal'][0]:.3f} "
              f"opt<=oracle={lat['optimal'][0] <= lat['oracle'][0] + 1e-9}")
        check(f"F4 {name} dlfusion beats 1-3, within 2% of 4-5", beats and ties)
        check(f"F5 {name} speedup {lat['none'][0]/d:.2f} in [3.6, 7.9]", 3.6 <= lat["none"][0] / d <= 7.9)
        check(f"F6 {name} dlfusion/optimal {d/lat['optimal'][0]:.3f} <= 1.10", d <= 1.10 * lat["optimal"][0])
    return 0 if ok else 1


def t_full(layers, hw, cost):
    out = {}
    for size in (1, 2, 4, 8, 16):
        blocks = [Block(i, i + size, 1) for i in range(0, len(layers), size)]
        mp, totals = best_single_mp(blocks, layers, hw, cost)
        out[size] = (totals[mp], mp)
    return out


def chain_times(layers, hw, cost):
    return {k: v for k, (v, _) in t_full(layers, hw, cost).items()}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
