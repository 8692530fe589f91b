#!/usr/bin/env python3
"""Kaldi data directories from the festvox-ru voice (experiments/speech/README.md);
run by get-data.sh. Python's standard library only.

    festvox_dirs.py SOURCE OUT

SOURCE holds the voice's wav/ru_NNNN.wav (16 kHz, 16-bit, mono), lab/ru_NNNN.lab
(festival labels: header lines up to a line "#", then one line per phone: its end time
in seconds, a number, the phone) and txt.done.data. Writes OUT/train, OUT/valid,
OUT/test (wav.scp with absolute paths to SOURCE's WAVs, text with the phones of each
utterance in order less "pau", utt2spk and spk2utt with the one speaker "nsh"; utterance
ids nsh_ru_NNNN) and OUT/phones.txt (<eps> 0, then the phones sorted, 1..P).

Split by utterance number NNNN: test when NNNN % 10 == 0, valid when NNNN % 10 == 5,
train otherwise. Every WAV is opened and checked (rate, width, channels, samples),
every label file parsed (times non-decreasing, the last phone ending within the audio),
every transcript in txt.done.data matched to a WAV. Any problem: one line "error: ..."
on stderr, exit status 1, nothing written."""
import os
import sys
import wave

SPEAKER = "nsh"
SILENCE = "pau"
RATE = 16000
EXPECTED = 620          # utterances in festvox-ru 0.5+dfsg-6
EXPECTED_SYMBOLS = 51   # phone symbols in its labels, pau included


class Bad(Exception):
    pass


def split_of(num):
    if num % 10 == 0:
        return "test"
    if num % 10 == 5:
        return "valid"
    return "train"


def read_labels(path, duration):
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    try:
        start = lines.index("#") + 1
    except ValueError:
        raise Bad(f"{path}: no '#' line ends the header (not a festival label file)")
    phones, last = [], 0.0
    for k, line in enumerate(lines[start:], start + 1):
        if not line.strip():
            continue
        f = line.split()
        if len(f) != 3:
            raise Bad(f"{path}:{k}: '{line}' is not END_TIME NUMBER PHONE")
        try:
            t = float(f[0])
            float(f[1])
        except ValueError:
            raise Bad(f"{path}:{k}: '{line}' is not END_TIME NUMBER PHONE")
        if t < last:
            raise Bad(f"{path}:{k}: time {t} before the previous phone's end {last}")
        last = t
        phones.append(f[2])
    if not phones:
        raise Bad(f"{path}: no phones")
    if last > duration + 0.02:
        raise Bad(f"{path}: the last phone ends at {last} s, after the audio's {duration:.3f} s")
    return phones


def main():
    if len(sys.argv) != 3:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    src, out = os.path.abspath(sys.argv[1]), sys.argv[2]
    wavs = sorted(f for f in os.listdir(os.path.join(src, "wav")) if f.endswith(".wav"))
    utts = {}
    for name in wavs:
        stem = name[:-4]
        if not (stem.startswith("ru_") and stem[3:].isdigit()):
            raise Bad(f"{src}/wav/{name}: not a ru_NNNN.wav name")
        path = os.path.join(src, "wav", name)
        try:
            with wave.open(path, "rb") as w:
                rate, width, ch, n = w.getframerate(), w.getsampwidth(), w.getnchannels(), w.getnframes()
                data = w.readframes(n)
        except (wave.Error, EOFError, OSError) as e:
            raise Bad(f"{path}: not a readable WAV file ({e})")
        if (rate, width, ch) != (RATE, 2, 1):
            raise Bad(f"{path}: {rate} Hz, {8 * width}-bit, {ch} channels (expected 16000 Hz, 16-bit, mono)")
        if n == 0 or len(data) != 2 * n:
            raise Bad(f"{path}: {len(data) // 2} samples of the {n} its header announces")
        lab = os.path.join(src, "lab", stem + ".lab")
        if not os.path.isfile(lab):
            raise Bad(f"{lab}: missing (every WAV has a label file)")
        utts[stem] = (path, n / RATE, read_labels(lab, n / RATE))
    labs = sorted(f[:-4] for f in os.listdir(os.path.join(src, "lab")) if f.endswith(".lab"))
    if labs != sorted(utts):
        raise Bad(f"{src}/lab: {len(labs)} label files for {len(utts)} WAVs (not the same names)")
    with open(os.path.join(src, "txt.done.data"), encoding="utf-8") as f:
        said = [line.split()[1] for line in f if line.startswith("( ")]
    if sorted(said) != sorted(utts):
        raise Bad(f"{src}/txt.done.data: {len(said)} sentences for {len(utts)} WAVs (not the same names)")
    if len(utts) != EXPECTED:
        raise Bad(f"{src}: {len(utts)} utterances, expected {EXPECTED}")
    symbols = sorted({p for _, _, ph in utts.values() for p in ph})
    if len(symbols) != EXPECTED_SYMBOLS or SILENCE not in symbols:
        raise Bad(f"{src}/lab: {len(symbols)} phone symbols, expected {EXPECTED_SYMBOLS} with '{SILENCE}'")
    phones = [p for p in symbols if p != SILENCE]

    # everything checked: write
    files = {}
    for s in ("train", "valid", "test"):
        os.makedirs(os.path.join(out, s), exist_ok=True)
        files[s] = {k: [] for k in ("wav.scp", "text", "utt2spk")}
    stats = {s: [0, 0.0, 0] for s in files}
    for stem in sorted(utts):
        path, dur, ph = utts[stem]
        s = split_of(int(stem[3:]))
        uid = f"{SPEAKER}_{stem}"
        targets = [p for p in ph if p != SILENCE]
        if not targets:
            raise Bad(f"{src}/lab/{stem}.lab: nothing but '{SILENCE}'")
        files[s]["wav.scp"].append(f"{uid} {path}\n")
        files[s]["text"].append(f"{uid} {' '.join(targets)}\n")
        files[s]["utt2spk"].append(f"{uid} {SPEAKER}\n")
        stats[s][0] += 1
        stats[s][1] += dur
        stats[s][2] += len(targets)
    for s, fs in files.items():
        for name, lines in fs.items():
            write(os.path.join(out, s, name), lines)
        write(os.path.join(out, s, "spk2utt"),
              [f"{SPEAKER} {' '.join(l.split()[0] for l in fs['utt2spk'])}\n"])
    write(os.path.join(out, "phones.txt"), ["<eps> 0\n"] + [f"{p} {i}\n" for i, p in enumerate(phones, 1)])
    for s in ("train", "valid", "test"):
        n, dur, tok = stats[s]
        print(f"festvox-ru: {s:5s} {n:3d} utterances, {dur / 3600:.3f} h, {tok} phones")
    total = sum(v[1] for v in stats.values())
    print(f"festvox-ru: {len(utts)} utterances, {total / 3600:.3f} h, {len(phones)} phones "
          f"(the labels' {len(symbols)} symbols less '{SILENCE}')")
    return 0


def write(path, lines):
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.writelines(lines)
    os.replace(tmp, path)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Bad as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
    except OSError as e:
        print(f"error: {e.filename}: {e.strerror}", file=sys.stderr)
        sys.exit(1)
