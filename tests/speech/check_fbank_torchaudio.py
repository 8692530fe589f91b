#!/usr/bin/env python3
"""attnbench's filterbanks (experiments/tasks/speech/fbank.h) against torchaudio's
Kaldi-compatible fbank on whole utterances of real speech: the meson test
`speech_torchaudio`.

    check_fbank_torchaudio.py ATTNBENCH SOURCE_ROOT [N]

Takes N (default 8) utterances spread over the festvox-ru WAVs that
experiments/speech/get-data.sh puts in SOURCE_ROOT/data/speech/festvox-ru/source/wav
(or the folder $ATTNBENCH_SPEECH_WAVS names), has `ATTNBENCH features` compute their
features into a cache archive, reads the archive, and compares every value with
torchaudio.compliance.kaldi.fbank computed in float64 (ta_fbank.py), with the tolerance
of the speech_data suite (tests/tasks/test_speech_kaldi.c, expect_near_exact): 1e-4 where a
value is within 10 nats of its frame's largest, min(2e-3, 2e-5 exp(d / 2)) where it is
d nats below it (the float32 FFT's error, relative to a bin's power, grows as
sqrt(P_max / P)). Prints the largest differences; exit status 0 when all hold, 1 when
not, 77 (SKIP) without torchaudio or without the data."""
import os
import struct
import subprocess
import sys
import tempfile

SKIP = 77


def read_ark(path):
    """The float matrices ("FM") of a Kaldi binary archive, as {key: array}."""
    import numpy as np
    with open(path, "rb") as f:
        data = f.read()
    out, i = {}, 0
    while i < len(data):
        j = data.index(b" ", i)
        key = data[i:j].decode()
        i = j + 1
        if data[i:i + 5] != b"\0BFM ":
            raise ValueError(f"{path}: record '{key}' is not a binary float matrix")
        rows, cols = struct.unpack("<xixi", data[i + 5:i + 15])
        i += 15
        out[key] = np.frombuffer(data, dtype="<f4", count=rows * cols, offset=i).reshape(rows, cols)
        i += 4 * rows * cols
    return out


def main():
    if len(sys.argv) not in (3, 4):
        print(__doc__, file=sys.stderr)
        return 2
    exe, root = sys.argv[1], sys.argv[2]
    count = int(sys.argv[3]) if len(sys.argv) == 4 else 8
    try:
        import numpy as np
        import torchaudio  # noqa: F401
    except ImportError as e:
        print(f"speech_torchaudio: SKIP: {e} (Debian: apt-get install python3-torchaudio)")
        return SKIP
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import ta_fbank
    wavs = os.environ.get("ATTNBENCH_SPEECH_WAVS") or os.path.join(root, "data", "speech", "festvox-ru", "source", "wav")
    names = sorted(f for f in os.listdir(wavs) if f.endswith(".wav")) if os.path.isdir(wavs) else []
    if not names:
        print(f"speech_torchaudio: SKIP: no WAVs in {wavs} (experiments/speech/get-data.sh puts them there)")
        return SKIP
    pick = [names[round(k * (len(names) - 1) / max(1, count - 1))] for k in range(min(count, len(names)))]
    with tempfile.TemporaryDirectory() as tmp:
        d = os.path.join(tmp, "data")
        os.mkdir(d)
        with open(os.path.join(d, "wav.scp"), "w") as f:
            f.writelines(f"{n[:-4]} {os.path.join(wavs, n)}\n" for n in pick)
        with open(os.path.join(d, "text"), "w") as f:
            f.writelines(f"{n[:-4]} x\n" for n in pick)
        r = subprocess.run([exe, "features", d, "--out", os.path.join(tmp, "f")], capture_output=True, text=True)
        if r.returncode != 0:
            print(f"speech_torchaudio: attnbench features failed ({r.returncode}): {r.stderr.strip()}")
            return 1
        ours = read_ark(os.path.join(tmp, "f.ark"))
    bad, values, worst_near, worst_far_ratio = 0, 0, 0.0, 0.0
    for n in pick:
        x, rate = ta_fbank.read_wav16(os.path.join(wavs, n))
        want = ta_fbank.fbank(x, rate, "float64")
        got = ours[n[:-4]].astype(np.float64)
        if got.shape != want.shape:
            print(f"{n}: {got.shape} frames x bins, torchaudio {want.shape}")
            bad += 1
            continue
        err = np.abs(got - want)
        d = want.max(axis=1, keepdims=True) - want
        near = err[d <= 10]
        ratio = err[d > 10] / np.minimum(2e-3, 2e-5 * np.exp(d[d > 10] / 2))
        wn, wr = near.max(initial=0.0), ratio.max(initial=0.0)
        worst_near, worst_far_ratio = max(worst_near, wn), max(worst_far_ratio, wr)
        values += err.size
        ok = wn <= 1e-4 and wr <= 1
        bad += not ok
        print(f"{n}: {want.shape[0]} frames, largest difference {err.max():.2e} ({wn:.2e} within 10 nats of the "
              f"frame's largest value; {wr:.2f} of the tolerance further down){'' if ok else '  FAILED'}")
    print(f"speech_torchaudio: {len(pick)} utterances, {values} values: {worst_near:.2e} within 10 nats "
          f"(tolerance 1e-4), {worst_far_ratio:.2f} of the tolerance beyond; {'ok' if not bad else f'{bad} failed'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
