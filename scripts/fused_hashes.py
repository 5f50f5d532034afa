"""SHA-256 of the fused file of every zoo model and every real-world corpus model.

A refactoring that must not change behaviour must not change a byte of what ``fuse`` writes.
Run this once on the old checkout and once on the new one, then compare the lists:

    python scripts/fused_hashes.py --src /path/to/old/checkout --out before.txt
    python scripts/fused_hashes.py --out after.txt --compare before.txt

Every fuse runs in its own process (``python -m onnxmlu fuse``, or the in-memory API path
``api.fuse`` + ``api.save_model``) with the package of ``--src`` on ``PYTHONPATH``. Zoo models
are built once into ``--zoo``; corpus models come from ``.cache/realworld`` (see
``tests/realworld/corpus.py``) with their pins. Nothing is written into the repository.

Each child runs with a random ``PYTHONHASHSEED``: a fused file is a function of its
input and options, so two runs of one checkout give the same list (two runs of this script on
one checkout are the whole-corpus determinism check).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ZOO = ("resnet18", "resnet50", "vgg19", "alexnet", "mobilenetv2", "lstm")
#: Extra option sets, on the small zoo models only: every strategy family, BN folding, forced MP.
VARIANTS = {
    "resnet18": (["-s", "all-fusion"], ["-s", "none"], ["-s", "optimal"], ["--bn", "fold"], ["--mp", "4"]),
    "mobilenetv2": (["-s", "oracle"], ["-s", "fusion-fixed-mp"], ["--bn", "fold"]),
    "lstm": (["-s", "dynamic-mp"],),
}
#: First in every child: the checkout on PYTHONPATH wins over an editable install's import hook
#: (setuptools' and scikit-build-core's finders sit in front of sys.path).
PRELUDE = "import sys; sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in type(f).__module__]; "
CLI = PRELUDE + "import runpy; runpy.run_module('onnxmlu', run_name='__main__', alter_sys=True)"
IN_MEMORY = (PRELUDE + "from onnxmlu import api; "
             "r = api.fuse(sys.argv[1], strategy=sys.argv[3]); api.save_model(r.model, sys.argv[2])")


def cases(zoo: Path) -> list[tuple[str, list[str]]]:
    """(label, command after the interpreter) per fuse."""
    found = []
    for name in ZOO:
        src = str(zoo / f"{name}.onnx")
        found.append((f"zoo/{name}", ["-c", CLI, "fuse", src, "{out}", "-q"]))
        found.append((f"zoo/{name}/in-memory", ["-c", IN_MEMORY, src, "{out}", "dlfusion"]))
        for options in VARIANTS.get(name, ()):
            found.append((f"zoo/{name}/{' '.join(options)}", ["-c", CLI, "fuse", src, "{out}", "-q", *options]))
    return found + corpus_cases()


def corpus_cases() -> list[tuple[str, list[str]]]:
    sys.path.insert(0, str(REPO / "tests" / "realworld"))
    import corpus

    found = []
    for case in corpus.MODELS:
        try:
            src = corpus.model_path(case)
        except corpus.FetchError:
            continue
        found.append((f"realworld/{case.id}", ["-c", CLI, "fuse", str(src), "{out}", "-q", *case.shape_args()]))
    return found


def fused_hash(src: Path, label: str, command: list[str], scratch: Path, keep: Path | None) -> str:
    out = (keep or scratch) / (label.replace("/", "_").replace(" ", "") + ".fused.onnx")
    env = dict(os.environ, PYTHONPATH=str(src), PYTHONHASHSEED="random")  # a fuse must not depend on it
    args = [sys.executable, *(str(out) if a == "{out}" else a for a in command)]
    proc = subprocess.run(args, capture_output=True, text=True, env=env, cwd=scratch)
    if proc.returncode != 0:
        return f"failed:{proc.returncode}:{(proc.stderr.strip().splitlines() or [''])[-1][:120]}"
    if not out.exists():
        return "failed:no output"
    digest = hashlib.sha256(out.read_bytes()).hexdigest()
    if keep is None:
        out.unlink()
    return digest


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", type=Path, default=REPO, help="checkout whose onnxmlu package fuses")
    parser.add_argument("--zoo", type=Path, default=Path(tempfile.gettempdir()) / "onnxmlu-zoo")
    parser.add_argument("--out", type=Path, help="write 'sha256  label' lines here")
    parser.add_argument("--compare", type=Path, help="a list written before: report every difference")
    parser.add_argument("--keep", type=Path, help="keep the fused files in this folder")
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    if not all((args.zoo / f"{n}.onnx").exists() for n in ZOO):
        args.zoo.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "onnxmlu", "zoo", "all", str(args.zoo), "-q"], check=True,
                       env=dict(os.environ, PYTHONPATH=str(args.src)))
    _check_source(args.src)
    todo = cases(args.zoo)
    with tempfile.TemporaryDirectory(prefix="onnxmlu-hashes-") as scratch, ThreadPoolExecutor(args.jobs) as pool:
        digests = list(pool.map(lambda c: fused_hash(args.src, c[0], c[1], Path(scratch), args.keep), todo))
    lines = [f"{digest}  {label}" for (label, _), digest in zip(todo, digests)]
    text = "\n".join(lines) + "\n"
    if args.out:
        args.out.write_text(text)
    sys.stdout.write(text)
    return compare(lines, args.compare) if args.compare else 0


def _check_source(src: Path) -> None:
    """The children must import the package of ``src``, not an installed one."""
    code = PRELUDE + "import onnxmlu; print(onnxmlu.__file__)"
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env=dict(os.environ, PYTHONPATH=str(src)), cwd=tempfile.gettempdir()).stdout.strip()
    if not Path(found).resolve().is_relative_to(src.resolve()):
        raise SystemExit(f"the children import {found}, not the package of {src}")


def compare(lines: list[str], before_file: Path) -> int:
    before = dict(reversed(line.split("  ", 1)) for line in before_file.read_text().splitlines() if line)
    now = dict(reversed(line.split("  ", 1)) for line in lines)
    changed = [label for label in before.keys() | now.keys() if before.get(label) != now.get(label)]
    for label in sorted(changed):
        print(f"DIFFERENT {label}: {before.get(label)} -> {now.get(label)}", file=sys.stderr)
    print(f"{len(now) - len(changed)} of {len(now)} fused files identical", file=sys.stderr)
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main())
