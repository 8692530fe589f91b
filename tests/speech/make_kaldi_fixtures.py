#!/usr/bin/env python3
"""Makes the Kaldi archive fixtures of the speech_data suite (tests/tasks/test_speech_data.c):
an archive holding one matrix of each binary type attnbench reads, written byte by
byte from Kaldi's documented layouts (experiments/tasks/speech/kaldi_ark.h), its index, and
each matrix's values decoded here in float64 from the same documentation.

    make_kaldi_fixtures.py OUT_DIR

Writes OUT_DIR/matrices.ark, OUT_DIR/matrices.scp ("KEY matrices.ark:OFFSET") and
OUT_DIR/matrices_KEY.npy (float32, rows x cols) for the keys fm, dm, cm, cm_codes,
cm2, cm3. Deterministic (numpy's generator, seed 15). The committed fixtures came from
`python3 tests/speech/make_kaldi_fixtures.py tests/fixtures/speech`.

The layouts, after "KEY " and the binary marker "\\0B":
  "FM " 0x04 int32 rows 0x04 int32 cols, float32 values row by row ("DM ": float64)
  "CM " float32 min, float32 range, int32 rows, int32 cols; per column four uint16
        (percentiles 0, 25, 75, 100, each min + range * q / 65535); then the uint8
        codes column by column: c in [0, 64] maps linearly p0 -> p25, (64, 192]
        p25 -> p75, (192, 255] p75 -> p100 (c = 64 is p25, 192 is p75, 255 is p100)
  "CM2 " the same header; uint16 codes row by row: min + range * q / 65535
  "CM3 " the same header; uint8 codes row by row: min + range * q / 255
Everything little-endian."""
import os
import struct
import sys

import numpy as np


def fm(key, a, dtype):
    tok = b"FM " if dtype == "<f4" else b"DM "
    r, c = a.shape
    body = tok + b"\x04" + struct.pack("<i", r) + b"\x04" + struct.pack("<i", c) + a.astype(dtype).tobytes()
    return body, a.astype(dtype).astype(np.float64)


def header(tok, mn, rng, r, c):
    return tok + struct.pack("<ffii", mn, rng, r, c)


def f32(x):
    return float(np.float32(x))


def cm(codes, pct, mn, rng):
    """codes (rows, cols) uint8, pct (cols, 4) uint16 sorted."""
    mn, rng = f32(mn), f32(rng)
    r, c = codes.shape
    body = header(b"CM ", mn, rng, r, c) + pct.astype("<u2").tobytes() + codes.T.astype(np.uint8).tobytes()
    p = mn + rng * pct.astype(np.float64) / 65535.0          # (cols, 4)
    out = np.empty((r, c))
    for j in range(c):
        p0, p25, p75, p100 = p[j]
        for i in range(r):
            v = int(codes[i, j])
            if v <= 64:
                out[i, j] = p0 + (p25 - p0) * v / 64.0
            elif v <= 192:
                out[i, j] = p25 + (p75 - p25) * (v - 64) / 128.0
            else:
                out[i, j] = p75 + (p100 - p75) * (v - 192) / 63.0
    return body, out


def cm2(q, mn, rng):
    mn, rng = f32(mn), f32(rng)
    r, c = q.shape
    return header(b"CM2 ", mn, rng, r, c) + q.astype("<u2").tobytes(), mn + rng * q.astype(np.float64) / 65535.0


def cm3(q, mn, rng):
    mn, rng = f32(mn), f32(rng)
    r, c = q.shape
    return header(b"CM3 ", mn, rng, r, c) + q.astype(np.uint8).tobytes(), mn + rng * q.astype(np.float64) / 255.0


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    out = sys.argv[1]
    g = np.random.default_rng(15)
    recs = []
    recs.append(("fm",) + fm("fm", g.normal(0, 3, (3, 4)), "<f4"))
    recs.append(("dm",) + fm("dm", g.normal(0, 1e3, (2, 5)), "<f8"))
    # CM: random codes with the branch edges 0, 64, 65, 192, 193, 255 in every column
    codes = g.integers(0, 256, (7, 5))
    codes[:6, :] = np.array([0, 64, 65, 192, 193, 255])[:, None]
    codes[:6, :] = g.permuted(codes[:6, :], axis=0)
    pct = np.sort(g.integers(0, 65536, (5, 4)), axis=1)
    pct[0] = [0, 0, 65535, 65535]          # a column with flat parts
    recs.append(("cm",) + cm(codes, pct, -3.7, 12.25))
    # CM: every code 0..255 down column 0 (and reversed down column 1)
    every = np.stack([np.arange(256), np.arange(255, -1, -1)], axis=1)
    recs.append(("cm_codes",) + cm(every, np.array([[1000, 20000, 40000, 65000], [0, 100, 200, 65535]]), 2.5, -7.0))
    q = g.integers(0, 65536, (4, 6))
    q[0, 0], q[3, 5] = 0, 65535
    recs.append(("cm2",) + cm2(q, -100.5, 333.0))
    q = g.integers(0, 256, (3, 5))
    q[0, 0], q[2, 4] = 0, 255
    recs.append(("cm3",) + cm3(q, 0.125, 64.0))

    os.makedirs(out, exist_ok=True)
    ark, scp = bytearray(), []
    for key, body, vals in recs:
        ark += key.encode() + b" "
        scp.append(f"{key} matrices.ark:{len(ark)}\n")
        ark += b"\0B" + body
        np.save(os.path.join(out, f"matrices_{key}.npy"), vals.astype(np.float32))
    with open(os.path.join(out, "matrices.ark"), "wb") as f:
        f.write(bytes(ark))
    with open(os.path.join(out, "matrices.scp"), "w") as f:
        f.writelines(scp)
    print(f"{out}/matrices.ark: {len(recs)} matrices, {len(ark)} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
