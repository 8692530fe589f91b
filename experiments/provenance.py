"""Where a run's code came from, for the scripts that print the results tables.

Every run document records "git": {"commit", "dirty", "diff_sha1"} (harness/results.h).
A run made from a tree with changes not committed cannot be rebuilt from its commit
alone; the tables say so: a single run's header names its source (source_line), and a
table of many runs marks the rows that rest on such a run with MARK and ends with NOTE
(notes). Standard library only; imported by the tables' scripts (sys.path holds
experiments/).
"""

MARK = "†"
NOTE = (f"{MARK} rests on a run made from a source tree with changes not committed (its document's "
        "git.dirty): not reproducible from its commit alone")


def git_of(doc):
    g = doc.get("git") if isinstance(doc, dict) else None
    return g if isinstance(g, dict) else {}


def is_dirty(doc):
    """True when the run document says its tree had changes not committed."""
    return git_of(doc).get("dirty") is True


def source_line(doc):
    """One phrase: the commit (10 digits) and whether the tree was clean."""
    g = git_of(doc)
    c = g.get("commit")
    if not isinstance(c, str) or not c:
        return "no commit recorded"
    if g.get("dirty") is True:
        h = g.get("diff_sha1")
        diff = f", diff {h[:12]}" if isinstance(h, str) and h else ""
        return f"commit {c[:10]} with changes not committed{diff} {MARK}"
    if g.get("dirty") is False:
        return f"commit {c[:10]}, clean"
    return f"commit {c[:10]} (clean or not: not recorded)"


def mark(label, docs):
    """label with MARK appended when any of docs is dirty."""
    return f"{label} {MARK}" if any(is_dirty(d) for d in docs) else label


def notes(docs):
    """The lines to print under a table built from docs: NOTE when any is dirty."""
    return [NOTE] if any(is_dirty(d) for d in docs) else []
