#!/usr/bin/env python3
"""Whether a merged sweep document (attnbench merge) holds the records of an unsharded
run of the same config, point for point, apart from what is measured:

    same_records.py MERGED.json FULL.json

Left out of the comparison: times and rates (and the floors and ratios made from the
copy rate), and memory peaks (a point measures a fresh attention object; a full run
reuses one per variant, so a workspace kept from a shorter length is not counted
again). Everything else must be equal: kind, variant, options, shape, status, reason,
estimated, saved, workspace and state bytes. Also: both documents' schema and
config, and the merged one's points object. Exit 0, or 1 listing the differences.
"""
import json
import sys

MEASURED = {
    "first_call_ms", "fwd_ms", "fwd_bwd_ms", "per_sample_fwd_ms", "per_sample_fwd_bwd_ms", "fwd_gflops",
    "fwd_bwd_gflops", "floor_fwd_ms", "floor_fwd_bwd_ms", "fwd_over_floor", "fwd_bwd_over_floor", "step_ms",
    "per_position_ms", "positions_per_s", "prefill_ms", "floor_step_ms", "step_over_floor", "peak_bytes",
    "peak_bytes_per_sample", "process_peak_rss_bytes", "device_used_bytes", "device_total_bytes",
}


def load(path):
    with open(path) as f:
        return json.load(f)


def main(merged_path, full_path):
    merged, full = (load(p) for p in (merged_path, full_path))
    bad = []
    for key in ("schema", "config"):
        if merged.get(key) != full.get(key):
            bad.append(f"{key} differs")
    pts = merged.get("points", {})
    if pts.get("count") != len(full["records"]) or pts.get("held") != list(range(len(full["records"]))):
        bad.append(f"points: {pts.get('count')} held {pts.get('held')}, the full run has {len(full['records'])} records")
    if merged.get("status") != full.get("status"):
        bad.append(f"status {merged.get('status')} != {full.get('status')}")
    if len(merged["records"]) != len(full["records"]):
        bad.append(f"{len(merged['records'])} records, the full run {len(full['records'])}")
    for i, (m, f) in enumerate(zip(merged["records"], full["records"])):
        mk, fk = set(m) - MEASURED, set(f) - MEASURED
        if mk != fk:
            bad.append(f"record {i}: keys {sorted(mk ^ fk)}")
        for k in sorted(mk & fk):
            if m[k] != f[k]:
                bad.append(f"record {i} ({f.get('variant')} {f.get('kind')} {f.get('len')}): {k} {m[k]!r} != {f[k]!r}")
    for k in ("sgemm", "copy", "summary", "machine"):
        if not isinstance(merged.get(k), dict):
            bad.append(f"merged document without {k}")
    for b in bad:
        print(f"same_records: {b}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
