"""Screenshot a model as Netron shows it: scripts/netron_snapshot.py MODEL OUT.png

Serves MODEL with the `netron` package on 127.0.0.1 and drives Debian's headless Chromium
(via playwright, no browser download) to take the picture; prints the op types Netron drew.
The docs' pictures were taken with:

    scripts/netron_snapshot.py out/resnet18.fused.onnx docs/netron-fused.png \\
        --width 1000 --height 640 --scale 2 --select block_0
    onnxmlu fuse out/resnet18.onnx out/resnet18.portable.onnx --portable   # the exploded model
    scripts/netron_snapshot.py out/resnet18.portable.onnx docs/netron-exploded.png \\
        --width 1000 --height 640 --scale 2 --select block_0 --function
"""

import argparse
from collections import Counter

from onnxmlu.tools.view import snapshot


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model")
    parser.add_argument("png")
    parser.add_argument("--port", type=int, default=18080)
    parser.add_argument("--width", type=int, default=1600)
    parser.add_argument("--height", type=int, default=1000)
    parser.add_argument("--scale", type=float, default=1.0, help="device pixel ratio (2 = sharper text)")
    parser.add_argument("--select", metavar="NAME", help="open the properties of the node named NAME…")
    parser.add_argument("--function", action="store_true",
                        help="…and show its function definition (exploded models: fuse --portable)")
    args = parser.parse_args()
    shot = snapshot(args.model, args.png, port=args.port, size=(args.width, args.height), scale=args.scale,
                      select=args.select, open_function=args.function)
    print(f"wrote {args.png}; boxes drawn: {dict(Counter(shot.labels))}")
    for name, text in shot.sidebar.items():
        print(f"  {name}: {text[:100]}")


if __name__ == "__main__":
    main()
