#!/usr/bin/env python3
"""experiments/provenance.py: the source line, the mark and the note that the results
tables print for a run document's git section (clean, dirty, unknown, missing).

    python3 tests/scripts/results_tables/test_provenance.py SOURCE_ROOT
"""
import os
import sys
import unittest

ROOT = sys.argv.pop(1) if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..", "..")
sys.path.insert(0, os.path.join(ROOT, "experiments"))
import provenance  # noqa: E402

C = "0123456789abcdef0123456789abcdef01234567"
D = "89abcdef0123456789abcdef0123456789abcdef"


def doc(**git):
    return {"git": git}


class Provenance(unittest.TestCase):
    def test_source_line(self):
        self.assertEqual(provenance.source_line(doc(commit=C, dirty=False, diff_sha1=None)), "commit 0123456789, clean")
        self.assertEqual(provenance.source_line(doc(commit=C, dirty=True, diff_sha1=D)),
                         "commit 0123456789 with changes not committed, diff 89abcdef0123 †")
        # documents older than diff_sha1, and copies that did not know
        self.assertEqual(provenance.source_line(doc(commit=C, dirty=True)),
                         "commit 0123456789 with changes not committed †")
        self.assertEqual(provenance.source_line(doc(commit=C, dirty=None)),
                         "commit 0123456789 (clean or not: not recorded)")
        for d in (doc(commit=None, dirty=None), {}, {"git": "x"}, None):
            self.assertEqual(provenance.source_line(d), "no commit recorded")

    def test_mark_and_notes(self):
        clean, dirty, unknown = doc(commit=C, dirty=False), doc(commit=C, dirty=True), doc(commit=C, dirty=None)
        self.assertEqual(provenance.mark("linear", [clean, unknown]), "linear")
        self.assertEqual(provenance.mark("linear", [clean, dirty]), "linear †")
        self.assertEqual(provenance.notes([clean, unknown, {}]), [])
        self.assertEqual(provenance.notes([clean, dirty]), [provenance.NOTE])
        self.assertTrue(provenance.NOTE.startswith(provenance.MARK))


if __name__ == "__main__":
    unittest.main()
