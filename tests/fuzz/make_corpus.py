#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets (tests/fuzz/corpus/TARGET/): a handful
of small valid files of each format and a few near-valid ones (one field wrong).

    python3 tests/fuzz/make_corpus.py [--attnbench build/attnbench]

The files are committed; run this again when a format changes. Everything is made
here from the formats' definitions, except the training checkpoints, which come from
short runs of `attnbench train` (two steps of a tiny copy model: a transformer and an
LSTM) and from the legacy fixture tests/fixtures/copy-legacy-step4.ckpt, and the
Kaldi archive tests/fixtures/speech/matrices.ark (every matrix type). Standard
library only; the same files every time, but for the times the runs record in their
checkpoints."""

import argparse
import gzip
import io
import json
import math
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import wave
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
OUT = os.path.join(HERE, "corpus")


def put(target, name, data):
    d = os.path.join(OUT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)


# ---- .npy (harness/npy.h: float32, int32, int64, little-endian, C order) ----

def npy(descr, shape, payload, version=1, fortran=False):
    hdr = "{'descr': '%s', 'fortran_order': %s, 'shape': %r, }" % (descr, fortran, tuple(shape))
    pre = 10 if version == 1 else 12
    pad = (64 - (pre + len(hdr) + 1) % 64) % 64
    hdr = hdr + " " * pad + "\n"
    if version == 1:
        head = b"\x93NUMPY\x01\x00" + struct.pack("<H", len(hdr))
    else:
        head = b"\x93NUMPY" + bytes([version, 0]) + struct.pack("<I", len(hdr))
    return head + hdr.encode() + payload


def npy_corpus():
    f32 = struct.pack("<6f", 0.5, -1.0, 2.0, 3.25, -0.0, 1e-3)
    put("npy", "f32_2x3.npy", npy("<f4", (2, 3), f32))
    put("npy", "i32_4.npy", npy("<i4", (4,), struct.pack("<4i", 1, -2, 3, 2**31 - 1)))
    put("npy", "i64_scalar.npy", npy("<i8", (), struct.pack("<q", -5)))
    put("npy", "f32_0x3.npy", npy("<f4", (0, 3), b""))
    put("npy", "v2_f32_1x1x2.npy", npy("<f4", (1, 1, 2), struct.pack("<2f", 1, 2), version=2))
    put("npy", "v3_i32_2.npy", npy("<i4", (2,), struct.pack("<2i", 7, 8), version=3))
    # near-valid: refused
    put("npy", "bad_fortran.npy", npy("<f4", (2, 3), f32, fortran=True))
    put("npy", "bad_f8.npy", npy("<f8", (1,), struct.pack("<d", 1.0)))
    put("npy", "bad_truncated.npy", npy("<f4", (2, 3), f32[:10]))
    put("npy", "bad_trailing.npy", npy("<f4", (2, 3), f32 + b"\0"))


# ---- JSON configs ----

def config_corpus():
    base = {"name": "x", "steps": 3, "model": {"d_model": 8, "heads": 2, "attention": {"variant": "linear"}},
            "lengths": [1, 2]}
    text = json.dumps(base)
    put("config", "plain.json", text)
    put("config", "with_sets", text + "\0steps=5\0model.d_model=16\0model.attention.variant=\"softmax\""
        "\0lengths.1=3\0name=y")
    put("config", "new_key", text + "\0\0model.extra={\"a\": [1, 2.5, true, null]}\0model.extra.a.0=2")
    put("config", "bad_keys", text + "\0.=1\0model..x=1\0nosuch=1\0=2\0model")
    put("config", "bad_top_level.json", "[1, 2, 3]")
    put("config", "bad_syntax.json", '{"name": "x", "steps": }')
    put("config", "duplicate_key.json", '{"name": "x", "name": "y"}')


def copy_file(target, src, name=None):
    with open(os.path.join(ROOT, src), "rb") as f:
        put(target, name or os.path.basename(src), f.read())


def bench_config_corpus():
    for f in ("smoke.json", "figure1-cpu.json", "compare-torch.json"):
        copy_file("bench_config", os.path.join("experiments", "sweep", f))
    cfg = {"name": "tiny", "variants": [{"variant": "lsh", "label": "lsh-2", "set": {"rounds": 2, "bits": 4},
                                         "modes": ["parallel"]},
                                        {"variant": "polynomial", "set": {"c": 0.5}}],
           "lengths": [8, 16], "heads": 1, "qk_dim": 4, "v_dim": 4, "causal": False,
           "batch": {"rule": "scaled", "tokens": 64, "max": 4}, "warmup": 0, "repeats": 1,
           "time_budget_s": 0.1, "memory_limit_gib": 0.5, "seed": 3,
           "recurrent": {"contexts": [0, 4], "steps": 2, "batch": 1}, "gemm": {"size": 0, "repeats": 1}}
    put("bench_config", "tiny.json", json.dumps(cfg))
    bad = dict(cfg, name="../x")
    put("bench_config", "bad_name.json", json.dumps(bad))
    bad = dict(cfg, variants=[{"variant": "linear", "set": {"feature_map": "nope"}}])
    put("bench_config", "bad_option.json", json.dumps(bad))


def train_configs():
    copy = json.load(open(os.path.join(ROOT, "experiments", "copy", "smoke.json")))
    tiny = dict(copy, name="tiny", steps=2, batch=2, eval_every=1, eval_batches=1, checkpoint_every=1, log_every=1)
    tiny["task"] = {"name": "copy", "max_symbols": 3, "symbols": 3}
    tiny["model"] = {"d_model": 8, "heads": 2, "layers": 1, "d_ff": 8, "dropout": 0.0,
                     "attention": {"variant": "linear"}}
    lstm = dict(tiny, name="tiny-lstm")
    lstm["model"] = {"body": "lstm", "d_model": 4, "layers": 1, "hidden": 4, "bidirectional": False}
    return copy, tiny, lstm


def train_config_corpus():
    copy, tiny, lstm = train_configs()
    for f in ("smoke.json", "copy-cpu-lsh-1.json", "copy-cpu-softmax.json"):
        copy_file("train_config", os.path.join("experiments", "copy", f))
    put("train_config", "tiny.json", json.dumps(tiny))
    put("train_config", "tiny_lstm.json", json.dumps(lstm))
    # dataset tasks: their data is not there when fuzzing (refused after the options)
    seq = dict(tiny, name="seq", task={"name": "sequences", "path": "seq"}, epochs=2, eval_split="valid",
               test_split="test")
    del seq["eval_batches"], seq["steps"]
    put("train_config", "sequences.json", json.dumps(seq))
    img = dict(seq, name="img", task={"name": "images", "dataset": "mnist", "path": "mnist", "valid_rows": 4})
    put("train_config", "images.json", json.dumps(img))
    put("train_config", "bad_step_key.json", json.dumps(dict(tiny, epochs=2)))
    put("train_config", "bad_model.json", json.dumps(dict(tiny, model={"d_model": 9, "heads": 2})))


# ---- checkpoints (harness/checkpoint.h, version 1) ----

ALIGN = 64


def align(x):
    return (x + ALIGN - 1) // ALIGN * ALIGN


def container(blobs, capacity=None):
    """A checkpoint holding `blobs` [(name, bytes)], as the writer lays it out."""
    cap = len(blobs) if capacity is None else capacity
    data_off = align(64 + 64 * cap)
    table = b""
    body = b""
    end = data_off
    for name, data in blobs:
        off = align(end)
        body += b"\0" * (off - end) + data
        end = off + len(data)
        table += name.encode().ljust(40, b"\0") + struct.pack("<QQII", off, len(data), zlib.crc32(data), 0)
    table += b"\0" * (64 * cap - len(table))
    table += b"\0" * (data_off - 64 - len(table))
    head = bytearray(b"\x89ABK\r\n\x1a\n" + struct.pack("<IIIIIIII", 1, 0x01020304, 64, 64, len(blobs), cap, ALIGN, 0)
                     + struct.pack("<QQII", data_off, end, zlib.crc32(table[:64 * cap]), 0))
    struct.pack_into("<I", head, 36, zlib.crc32(bytes(head)))
    return bytes(head) + table + body


def read_container(data):
    count, cap = struct.unpack_from("<II", data, 24)
    blobs = []
    for i in range(count):
        t = 64 + 64 * i
        name = data[t:t + 40].rstrip(b"\0").decode()
        off, n = struct.unpack_from("<QQ", data, t + 40)
        blobs.append((name, data[off:off + n]))
    return blobs


def sections(blobs):
    """fuzz_train_checkpoint's input: "\\0@@NAME\\n" then the bytes, per blob."""
    return b"".join(b"\0@@" + name.encode() + b"\n" + data for name, data in blobs)


def checkpoint_corpora(attnbench):
    _, tiny, lstm = train_configs()
    ckpts = {}
    with tempfile.TemporaryDirectory() as tmp:
        for cfg in (tiny, lstm):
            path = os.path.join(tmp, cfg["name"] + ".json")
            with open(path, "w") as f:
                json.dump(cfg, f)
            out = os.path.join(tmp, cfg["name"])
            subprocess.run([attnbench, "--threads", "1", "train", path, "--out", out, "--quiet"], check=True,
                           stdout=subprocess.DEVNULL)
            with open(os.path.join(out, "checkpoint.bin"), "rb") as f:
                ckpts[cfg["name"]] = f.read()
    with open(os.path.join(ROOT, "tests", "fixtures", "copy-legacy-step4.ckpt"), "rb") as f:
        ckpts["legacy-v1"] = f.read()

    for name, data in ckpts.items():
        put("checkpoint", name + ".ckpt", data)
        put("train_checkpoint", name, sections(read_container(data)))
    # small containers of every shape the writer makes, and near-valid ones
    put("checkpoint", "empty.ckpt", container([]))
    put("checkpoint", "one_blob.ckpt", container([("config", b'{"a": 1}')]))
    put("checkpoint", "spare_slots.ckpt", container([("a", b"x" * 3), ("b", b""), ("c", b"yz")], capacity=5))
    bad = bytearray(container([("a", b"x" * 3), ("b", b"y")]))
    bad[-1] ^= 1  # a blob's CRC no longer matches
    put("checkpoint", "bad_crc.ckpt", bytes(bad))
    put("checkpoint", "bad_truncated.ckpt", container([("a", b"x" * 100)])[:-7])
    # training checkpoints with one blob missing or odd
    blobs = read_container(ckpts["tiny"])
    put("train_checkpoint", "no_state", sections([b for b in blobs if b[0] != "state"]))
    put("train_checkpoint", "short_params", sections([(n, d[:-4] if n == "params" else d) for n, d in blobs]))


# ---- images (experiments/tasks/images/image_data.h) ----

def idx(dims, payload):
    return bytes([0, 0, 8, len(dims)]) + b"".join(struct.pack(">I", d) for d in dims) + payload


def images_corpora():
    pix = bytes(range(18))
    put("idx", "images_2x3x3.idx", idx((2, 3, 3), pix))
    put("idx", "labels_2.idx", idx((2,), b"\x03\x09"))
    put("idx", "images_2x3x3.idx.gz", gzip.compress(idx((2, 3, 3), pix), mtime=0))
    put("idx", "labels_2.idx.gz", gzip.compress(idx((2,), b"\x00\x01"), mtime=0))
    put("idx", "bad_label_10.idx", idx((2,), b"\x01\x0a"))
    put("idx", "bad_type_int.idx", bytes([0, 0, 0x0C, 1]) + struct.pack(">I", 1) + b"\0\0\0\1")
    put("idx", "bad_truncated.idx", idx((2, 3, 3), pix[:-1]))
    put("idx", "bad_gz_truncated.idx.gz", gzip.compress(idx((2, 3, 3), pix), mtime=0)[:-6])
    # idx_gz (fuzz_idx_gz.c): a damage byte (its high nibble the deflate level), its
    # parameter, then the IDX file, which the target compresses itself
    for damage, level, param, name in ((0, 6, 0, "whole"), (1, 9, 3, "trailer_cut_4"), (2, 1, 7, "tail_8"),
                                       (3, 0, 128, "two_members_stored"), (4, 6, 2, "flip_header")):
        put("idx_gz", name + "_images", bytes([damage | level << 4, param]) + idx((2, 3, 3), pix))
    put("idx_gz", "whole_labels", bytes([0x60, 0]) + idx((2,), b"\x03\x09"))
    put("idx_gz", "two_members_bad_label", bytes([0x63, 200]) + idx((2,), b"\x01\x0a"))

    def record(label, seed):
        return bytes([label]) + bytes((seed * 7 + i) % 256 for i in range(3072))
    put("cifar", "one.bin", record(3, 1))
    put("cifar", "two.bin", record(0, 2) + record(9, 3))
    put("cifar", "bad_label.bin", record(10, 4))
    put("cifar", "bad_truncated.bin", record(1, 5)[:-1])


# ---- speech (experiments/tasks/speech/kaldi_ark.h, kaldi_dir.h, audio.h) ----

def kaldi_fm(rows, cols, seed, double=False):
    """A Kaldi binary float (or double) matrix object: "\\0BFM " 4 rows 4 cols values."""
    vals = [math.sin(seed + 0.7 * i) * (3 + i % 5) for i in range(rows * cols)]
    tok, fmt = (b"DM ", "<%dd") if double else (b"FM ", "<%df")
    return b"\0B" + tok + b"\x04" + struct.pack("<i", rows) + b"\x04" + struct.pack("<i", cols) + \
        struct.pack(fmt % (rows * cols), *vals)


def kaldi_cm(rows, cols, seed, kind="CM"):
    """A compressed matrix: the global header (min, range, rows, cols), then for CM per
    column four uint16 percentiles and the bytes column by column, for CM2 uint16 and for
    CM3 uint8 values row by row."""
    head = struct.pack("<ffii", -2.0 - seed, 5.0, rows, cols)
    if kind == "CM":
        cols_hdr = b"".join(struct.pack("<4H", 0, 16000 + 100 * c, 50000 - 100 * c, 65535) for c in range(cols))
        body = bytes((seed * 31 + 7 * i) % 256 for i in range(rows * cols))
        return b"\0BCM " + head + cols_hdr + body
    if kind == "CM2":
        return b"\0BCM2 " + head + struct.pack("<%dH" % (rows * cols), *((seed * 9973 + 4099 * i) % 65536
                                                                        for i in range(rows * cols)))
    return b"\0BCM3 " + head + bytes((seed * 37 + 11 * i) % 256 for i in range(rows * cols))


def archive(records):
    """An archive of (key, object) records, and each object's offset."""
    out, offsets = b"", {}
    for key, obj in records:
        out += key.encode() + b" "
        offsets[key] = len(out)
        out += obj
    return out, offsets


def wav_bytes(samples, rate=16000, width=2, channels=1):
    """A PCM WAV written by Python's wave module (integer samples, interleaved)."""
    f = io.BytesIO()
    with wave.open(f, "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(width)
        w.setframerate(rate)
        if width == 1:
            w.writeframes(bytes((s // 256 + 128) & 255 for s in samples))
        else:
            w.writeframes(struct.pack("<%dh" % len(samples), *samples))
    return f.getvalue()


def wav_float(samples, rate=16000):
    """A WAV of IEEE floats (format 3, which the wave module does not write)."""
    data = struct.pack("<%df" % len(samples), *samples)
    fmt = struct.pack("<HHIIHH", 3, 1, rate, rate * 4, 4, 32)
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(data)) + data
    return b"RIFF" + struct.pack("<I", len(body)) + body


def tone(n, seed):
    return [int(8000 * math.sin(0.05 * (i + 1) * (1 + seed)) + 3000 * math.sin(0.31 * i)) for i in range(n)]


def speech_corpora():
    # kaldi_ark: archives of each matrix type, and near-valid ones
    put("kaldi_ark", "fm.ark", archive([("u1", kaldi_fm(3, 4, 1)), ("u2", kaldi_fm(2, 4, 2))])[0])
    put("kaldi_ark", "one_fm_object", kaldi_fm(2, 3, 3))  # a file holding one matrix (read at offset 0)
    put("kaldi_ark", "dm.ark", archive([("d", kaldi_fm(2, 2, 4, double=True))])[0])
    put("kaldi_ark", "cm.ark", archive([("c", kaldi_cm(5, 3, 5)), ("f", kaldi_fm(1, 3, 6))])[0])
    put("kaldi_ark", "cm2_cm3.ark", archive([("c2", kaldi_cm(2, 3, 7, "CM2")), ("c3", kaldi_cm(3, 2, 8, "CM3"))])[0])
    copy_file("kaldi_ark", os.path.join("tests", "fixtures", "speech", "matrices.ark"))
    put("kaldi_ark", "bad_truncated.ark", archive([("u", kaldi_fm(3, 4, 9))])[0][:-3])
    put("kaldi_ark", "bad_text_mode.ark", b"u  [\n  1 2 3\n  4 5 6 ]\n")
    put("kaldi_ark", "bad_vector.ark", b"v \0BFV \x04" + struct.pack("<i", 2) + struct.pack("<2f", 1, 2))
    bad = bytearray(archive([("u", kaldi_fm(1, 2, 10))])[0])
    bad[-4:] = struct.pack("<f", float("nan"))
    put("kaldi_ark", "bad_nan.ark", bytes(bad))

    # kaldi_dir: data directories as sections (fuzz_kaldi_dir.c)
    def sections_of(files):
        return b"".join(b"\0@@" + n.encode() + b"\n" + (d.encode() if isinstance(d, str) else d) for n, d in files)
    ark, off = archive([("u1", kaldi_fm(4, 3, 1)), ("u2", kaldi_fm(3, 3, 2)), ("u3", kaldi_fm(2, 3, 3))])
    text = "u1 a b c\nu2 b a\nu3 c\n"
    feats = "".join("%s a.ark:%d\n" % (k, off[k]) for k in ("u1", "u2", "u3"))
    put("kaldi_dir", "feats", sections_of([("text", text), ("utt2spk", "u1 s1\nu2 s1\nu3 s2\n"),
                                           ("feats.scp", feats), ("a.ark", ark)]))
    cm, coff = archive([("x", kaldi_cm(4, 2, 4)), ("y", kaldi_cm(3, 2, 5, "CM2"))])
    put("kaldi_dir", "feats_compressed_phones_txt_drop",
        sections_of([("text", "x sil a b sil\ny b b\n"), ("feats.scp", "x b.ark:%d\ny b.ark:%d\n" % (coff["x"], coff["y"])),
                     ("b.ark", cm), ("phones.txt", "<eps> 0\nsil 1\na 2\nb 3\n#0 4\n"), ("drop", "sil")]))
    put("kaldi_dir", "feats_lexicon",
        sections_of([("text", "u1 hello world\nu2 world\n"), ("feats.scp", feats),
                     ("lexicon", "hello h e l ou\nworld w er l d\nworld w o l d\n"), ("a.ark", ark)]))
    one = kaldi_fm(3, 2, 6)
    put("kaldi_dir", "feats_single_matrix_file",
        sections_of([("text", "u a\n"), ("feats.scp", "u a.ark\n"), ("a.ark", one)]))
    put("kaldi_dir", "wav", sections_of([("text", "w1 a b\nw2 b\n"), ("wav.scp", "w1 a.wav\nw2 b.wav\n"),
                                         ("utt2spk", "w1 s\nw2 s\n"), ("a.wav", wav_bytes(tone(600, 1))),
                                         ("b.wav", wav_bytes(tone(420, 2)))]))
    # near-valid: refused, or (a command, a path outside the folder) read but not loaded
    put("kaldi_dir", "bad_no_features", sections_of([("text", text), ("feats.scp", feats.split("\n")[0] + "\n"),
                                                     ("a.ark", ark)]))
    put("kaldi_dir", "bad_segments", sections_of([("text", text), ("feats.scp", feats), ("a.ark", ark),
                                                  ("segments", "u1 r 0 1\n")]))
    put("kaldi_dir", "bad_offset", sections_of([("text", "u1 a\n"), ("feats.scp", "u1 a.ark:5\n"), ("a.ark", ark)]))
    put("kaldi_dir", "command_not_run", sections_of([("text", "w1 a\n"), ("wav.scp", "w1 cat a.wav |\n"),
                                                     ("a.wav", wav_bytes(tone(600, 3)))]))

    # kaldi_text (fuzz_kaldi_text.c): wav.scp, text and utt2spk as sections
    put("kaldi_text", "paths_and_speakers", sections_of([("wav.scp", "u1 a.wav\nu2\tb.wav \n\nu3 c.wav\n"),
                                                         ("text", "u2 b a\nu1 a  c\n u3\n"),
                                                         ("utt2spk", "u1 s1\nu2 s2\nu3 s1\n")]))
    put("kaldi_text", "commands_need_consent", sections_of([("wav.scp", "u1 sph2pipe -f wav u1.wv1 |\nu2 cat b.wav|\n"),
                                                            ("text", "u1 a\nu2 b b\n")]))
    put("kaldi_text", "no_utt2spk_crlf", sections_of([("wav.scp", "x a.wav\r\ny b.wav\r\n"), ("text", "x p q\r\ny q\r\n")]))
    put("kaldi_text", "bad_no_audio", sections_of([("wav.scp", "u1 a.wav\n"), ("text", "u1 a\nu2 b\n")]))
    put("kaldi_text", "bad_spaced_path", sections_of([("wav.scp", "u1 a b.wav\n"), ("text", "u1 a\n")]))
    put("kaldi_text", "bad_duplicate_speaker_line", sections_of([("wav.scp", "u1 a.wav\n"), ("text", "u1 a\n"),
                                                                 ("utt2spk", "u1 s\nu1 t\n")]))

    # wav: files libsndfile reads, and near-valid ones
    put("wav", "pcm16_16k.wav", wav_bytes(tone(600, 1)))
    put("wav", "pcm8_8k.wav", wav_bytes(tone(300, 2), rate=8000, width=1))
    put("wav", "float32_16k.wav", wav_float([s / 32768.0 for s in tone(450, 3)]))
    put("wav", "bad_stereo.wav", wav_bytes(tone(200, 4), channels=2))
    put("wav", "bad_truncated.wav", wav_bytes(tone(600, 5))[:-100])
    put("wav", "bad_empty.wav", wav_bytes([]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--attnbench", default=os.path.join(ROOT, "build", "attnbench"),
                    help="the attnbench binary that writes the training checkpoints (default build/attnbench)")
    args = ap.parse_args()
    if not os.access(args.attnbench, os.X_OK):
        sys.exit("make_corpus: %s is not an executable (build first: harness/scripts/build.sh)" % args.attnbench)
    shutil.rmtree(OUT, ignore_errors=True)
    npy_corpus()
    config_corpus()
    bench_config_corpus()
    train_config_corpus()
    checkpoint_corpora(args.attnbench)
    images_corpora()
    speech_corpora()
    for t in sorted(os.listdir(OUT)):
        files = os.listdir(os.path.join(OUT, t))
        size = sum(os.path.getsize(os.path.join(OUT, t, f)) for f in files)
        print("%-16s %2d files, %6d bytes" % (t, len(files), size))


if __name__ == "__main__":
    main()
