"""Screenshot a model as Netron shows it: scripts/netron_snapshot.py MODEL OUT.png

Serves MODEL with the `netron` package on 127.0.0.1 and drives Debian's headless Chromium
(via playwright, no browser download) to take the picture; prints the op types Netron drew.
"""

import argparse
from collections import Counter

from onnxmlu.view import snapshot


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("model")
    parser.add_argument("png")
    parser.add_argument("--port", type=int, default=18080)
    parser.add_argument("--width", type=int, default=1600)
    parser.add_argument("--height", type=int, default=1000)
    args = parser.parse_args()
    labels = snapshot(args.model, args.png, port=args.port, size=(args.width, args.height))
    print(f"wrote {args.png}; boxes drawn: {dict(Counter(labels))}")


if __name__ == "__main__":
    main()
