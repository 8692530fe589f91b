#!/usr/bin/env python3
"""CIFAR-10 into its binary format, for get-data.sh (experiments/images/README.md).

    cifar10_bin.py SOURCE OUT_DIR

SOURCE is a folder, a .zip or a .tar.gz / .tgz holding either
- the official binary release: data_batch_1.bin .. data_batch_5.bin and test_batch.bin
  (at the top or in a folder such as cifar-10-batches-bin/), copied as they are; or
- a tree of image files train/<class>/* and test/<class>/* (at the top or in one
  folder), <class> one of the ten CIFAR-10 class names, each image 32 x 32 (any format
  PIL reads; greyscale is taken as R = G = B), converted into that format.

OUT_DIR receives data_batch_1.bin .. data_batch_5.bin, test_batch.bin (records of 1
label byte + 3072 pixel bytes: the R plane, then G, then B, each row-major),
batches.meta.txt (the class names, label order) and SOURCE.txt (what they were made
from). Conversion order: within a split, the files of each class sorted by name, the
classes interleaved (airplane 0, automobile 0, ..., truck 0, airplane 1, ...), so any
prefix of a split and the end of the training set have the classes in equal shares;
the training records are cut into five files of equal size (10,000 each for the full
set). Every file written is then read back and checked (whole records, labels in
0..9) and the counts per class are printed.

Exit status 0, or 1 with one line "cifar10_bin.py: error: ..." on stderr (a bad
archive, a missing split, an unknown class, an image that is not 32 x 32 or does not
decode, a binary file that is not CIFAR-10). Needs numpy and PIL (Debian: python3-numpy,
python3-pil; get-data.sh installs them)."""
import hashlib
import io
import os
import re
import sys
import tarfile
import zipfile

CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
RECORD = 1 + 3 * 32 * 32
BIN_NAMES = [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"]
# The JPEG re-encoding of all 60,000 images described in the project's shared data
# notes (quality 75, 4:2:0): results made from it must say "CIFAR-10 (JPEG q75
# re-encoding)".
JPEG_ZIP_SHA256 = "f7625fc6a42ead0a462a6e36eb4b53cc89da86f36a0e011313c8c9a582622870"


class Fail(Exception):
    pass


def sha256_of(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class Source:
    """The files of a folder, zip or tar archive: names (relative, '/'-separated) and
    their bytes."""

    def __init__(self, path):
        self.path = path
        self.zip = self.tar = None
        if os.path.isdir(path):
            self.names = []
            for d, _, files in os.walk(path):
                for f in files:
                    self.names.append(os.path.relpath(os.path.join(d, f), path).replace(os.sep, "/"))
        elif os.path.isfile(path) and zipfile.is_zipfile(path):
            try:
                self.zip = zipfile.ZipFile(path)
                self.names = [n for n in self.zip.namelist() if not n.endswith("/")]
            except (zipfile.BadZipFile, OSError) as e:
                raise Fail(f"{path}: not a readable zip archive ({e})")
        elif os.path.isfile(path):
            try:
                self.tar = tarfile.open(path)
                self.members = {m.name: m for m in self.tar.getmembers() if m.isfile()}
                self.names = list(self.members)
            except (tarfile.TarError, OSError, EOFError) as e:
                raise Fail(f"{path}: not a folder, a zip or a tar archive ({e})")
        else:
            raise Fail(f"{path}: no such folder or file")

    def read(self, name):
        try:
            if self.zip:
                return self.zip.read(name)
            if self.tar:
                return self.tar.extractfile(self.members[name]).read()
            with open(os.path.join(self.path, name), "rb") as f:
                return f.read()
        except (zipfile.BadZipFile, tarfile.TarError, OSError, EOFError, KeyError) as e:
            raise Fail(f"{self.path}: cannot read {name} ({e})")


def find_binary(src):
    """The folder prefix holding all six binary files, or None."""
    by_dir = {}
    for n in src.names:
        d, _, base = n.rpartition("/")
        if base in BIN_NAMES:
            by_dir.setdefault(d, set()).add(base)
    full = [d for d, s in by_dir.items() if len(s) == len(BIN_NAMES)]
    if len(full) > 1:
        raise Fail(f"{src.path}: more than one folder holds the CIFAR-10 binary files: {', '.join(sorted(full))}")
    if not full and by_dir:
        d, s = max(by_dir.items(), key=lambda kv: len(kv[1]))
        missing = ", ".join(b for b in BIN_NAMES if b not in s)
        raise Fail(f"{src.path}: the CIFAR-10 binary release lacks {missing}")
    return full[0] if full else None


def check_binary(name, data):
    import numpy as np
    if len(data) == 0 or len(data) % RECORD:
        raise Fail(f"{name}: {len(data)} bytes are not a whole number of {RECORD}-byte records (truncated, or not "
                   "CIFAR-10)")
    labels = np.frombuffer(data, dtype=np.uint8).reshape(-1, RECORD)[:, 0]
    if labels.max() >= 10:
        i = int(np.argmax(labels >= 10))
        raise Fail(f"{name}: record {i} has label {labels[i]}, outside 0..9 (not CIFAR-10)")
    return np.bincount(labels, minlength=10)


IMAGE_RE = re.compile(r"^(?:(.*)/)?(train|test)/([^/]+)/([^/]+)$")
IMAGE_EXTS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".ppm", ".tif", ".tiff", ".webp")


def find_tree(src):
    """{split: {class: [names sorted]}} of the image tree."""
    tree = {"train": {}, "test": {}}
    prefixes = set()
    for n in src.names:
        m = IMAGE_RE.match(n)
        if not m or not n.lower().endswith(IMAGE_EXTS):
            continue
        prefix, split, cls, _ = m.groups()
        if cls not in CLASSES:
            raise Fail(f"{src.path}: {n}: '{cls}' is not a CIFAR-10 class ({', '.join(CLASSES)})")
        prefixes.add(prefix or "")
        tree[split].setdefault(cls, []).append(n)
    if len(prefixes) > 1:
        raise Fail(f"{src.path}: image trees in more than one folder: {', '.join(sorted(prefixes))}")
    for split in ("train", "test"):
        if not tree[split]:
            raise Fail(f"{src.path}: neither the CIFAR-10 binary files nor images under {split}/<class>/ were found")
        for cls in tree[split]:
            tree[split][cls].sort()
    return tree


def interleave(by_class):
    """Names in the order airplane 0, automobile 0, ..., truck 0, airplane 1, ...: a
    class that runs out drops out of the rotation."""
    lists = [(CLASSES.index(c), by_class[c]) for c in CLASSES if c in by_class]
    out, k = [], 0
    while True:
        row = [(label, names[k]) for label, names in lists if k < len(names)]
        if not row:
            return out
        out.extend(row)
        k += 1


def convert(src, names):
    from PIL import Image
    buf = bytearray()
    for label, n in names:
        try:
            im = Image.open(io.BytesIO(src.read(n)))
            im.load()
        except Fail:
            raise
        except Exception as e:  # PIL raises many kinds for an undecodable file
            why = re.sub(r" ?<_io\.BytesIO object at 0x[0-9a-f]+>", "", str(e)) or type(e).__name__
            raise Fail(f"{src.path}: {n}: not an image PIL can decode ({why})")
        if im.size != (32, 32):
            raise Fail(f"{src.path}: {n}: {im.size[0]} x {im.size[1]} pixels, CIFAR-10 images are 32 x 32")
        r, g, b = im.convert("RGB").split()
        buf.append(label)
        buf += r.tobytes() + g.tobytes() + b.tobytes()
    return bytes(buf)


def write(path, data):
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def main(argv):
    if len(argv) != 3:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    source, out = argv[1], argv[2]
    src = Source(source)
    os.makedirs(out, exist_ok=True)
    base = os.path.basename(os.path.normpath(source))
    binary = find_binary(src)
    files = {}
    if binary is not None:
        prefix = binary + "/" if binary else ""
        for b in BIN_NAMES:
            files[b] = src.read(prefix + b)
            check_binary(f"{source}: {prefix + b}", files[b])
        note = f"CIFAR-10 binary release, copied from {base}"
        print(f"cifar10: the binary release in {base}{'/' + binary if binary else ''}: copied")
    else:
        tree = find_tree(src)
        sha = sha256_of(source) if os.path.isfile(source) else None
        jpeg_zip = sha == JPEG_ZIP_SHA256
        train, test = interleave(tree["train"]), interleave(tree["test"])
        print(f"cifar10: converting {len(train)} training and {len(test)} test images from {base}"
              + (" (sha256 matches the CIFAR-10 JPEG q75 re-encoding)" if jpeg_zip else ""), flush=True)
        data = convert(src, train)
        k, n5 = 0, len(train)
        for i in range(5):
            m = n5 // 5 + (1 if i < n5 % 5 else 0)
            files[BIN_NAMES[i]] = data[k * RECORD:(k + m) * RECORD]
            k += m
        files["test_batch.bin"] = convert(src, test)
        if any(len(v) == 0 for v in files.values()):
            raise Fail(f"{source}: too few training images to fill five files ({n5})")
        if jpeg_zip:
            note = ("CIFAR-10 (JPEG q75 re-encoding): converted from the JPEG tree " + base +
                    " (sha256 " + JPEG_ZIP_SHA256 + "); lossy, so bits/dim on it is not comparable with the "
                    "paper's CIFAR-10 numbers")
        else:
            note = (f"CIFAR-10 converted from the image tree {base}" +
                    (f" (sha256 {sha})" if sha else "") + "; if its images are lossy (JPEG), say so with every result")
    for name, data in files.items():
        write(os.path.join(out, name), data)
    write(os.path.join(out, "batches.meta.txt"), ("\n".join(CLASSES) + "\n").encode())
    # read back what was written
    lines = [note, ""]
    totals = {}
    for name in BIN_NAMES:
        p = os.path.join(out, name)
        with open(p, "rb") as f:
            data = f.read()
        counts = check_binary(p, data)
        md5 = hashlib.md5(data).hexdigest()
        lines.append(f"{md5}  {name}  {len(data) // RECORD} records")
        split = "test" if name == "test_batch.bin" else "train"
        totals[split] = totals.get(split, 0) + counts
    write(os.path.join(out, "SOURCE.txt"), ("\n".join(lines) + "\n").encode())
    for split in ("train", "test"):
        c = totals[split]
        print(f"cifar10: {split}: {int(c.sum())} images, per class {' '.join(str(int(x)) for x in c)}")
    print(f"cifar10: wrote {' '.join(BIN_NAMES)}, batches.meta.txt, SOURCE.txt, read back and checked")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv))
    except Fail as e:
        print("cifar10_bin.py: error: " + " ".join(str(e).split()), file=sys.stderr)
        sys.exit(1)
    except MemoryError:
        print("cifar10_bin.py: error: out of memory", file=sys.stderr)
        sys.exit(1)
