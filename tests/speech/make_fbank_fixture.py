#!/usr/bin/env python3
"""Makes the filterbank parity fixture of the speech_data suite (tests/tasks/test_speech_data.c):
a clip of real speech and torchaudio's Kaldi-compatible filterbanks of it.

    make_fbank_fixture.py SOURCE_WAV START_S DURATION_S OUT_WAV OUT_NPY

Cuts DURATION_S seconds from START_S of SOURCE_WAV (16 kHz, 16-bit, mono) into OUT_WAV
(the same format) and writes torchaudio.compliance.kaldi.fbank of the clip, with the
options of ta_fbank.OPTIONS, computed in float64 and stored as float32 (frames x 40),
to OUT_NPY. The committed fixture (tests/fixtures/speech/README.md) came from

    python3 tests/speech/make_fbank_fixture.py \\
        data/speech/festvox-ru/source/wav/ru_0001.wav 0.25 1.5 \\
        tests/fixtures/speech/ru_0001_clip.wav tests/fixtures/speech/ru_0001_clip.fbank.npy

with Debian 12's python3-torchaudio 0.13.1 (torch 1.13)."""
import os
import sys
import wave

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ta_fbank  # noqa: E402


def main():
    if len(sys.argv) != 6:
        print(__doc__, file=sys.stderr)
        return 2
    src, start, dur, out_wav, out_npy = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4], sys.argv[5]
    x, rate = ta_fbank.read_wav16(src)
    a, b = int(round(start * rate)), int(round((start + dur) * rate))
    if not 0 <= a < b <= len(x):
        print(f"error: {src} has {len(x) / rate:.3f} s, no clip [{start}, {start + dur}) s", file=sys.stderr)
        return 1
    clip = x[a:b]
    with wave.open(out_wav, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(clip.astype("<i2").tobytes())
    feats = ta_fbank.fbank(clip, rate, "float64")
    np.save(out_npy, feats.astype(np.float32))
    f32 = ta_fbank.fbank(clip, rate, "float32").astype(np.float64)
    print(f"{out_wav}: {len(clip)} samples; {out_npy}: {feats.shape[0]} x {feats.shape[1]}, "
          f"values {feats.min():.3f} .. {feats.max():.3f}; torchaudio in float32 differs from float64 "
          f"by at most {np.abs(f32 - feats).max():.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
