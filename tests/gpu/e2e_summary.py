"""The summary of a GPU harness run, $OUT/table.txt: a header, the tables the test files
fill in, the blocks they add (the benchmark's), and the overall verdict. It exists so
that a test file owns its rows: it declares them when it is imported (with "not run"
until its test fills them in) and a new measure adds rows or a table without touching the
others. The layout and the rows are those scripts/gpu-e2e.sh printed before issue 24.
"""

from e2e import H

_PARTS = []     # (order, seq, Table or block function)
_AT_END = []    # functions run before the table is written (e.g. writing bench.txt)


class Row:
    """`| label | cell | ... |`; label and cells may be functions, read when written."""

    def __init__(self, label, cells):
        self.label, self.cells = label, cells

    def set(self, *cells):
        self.cells = list(cells)

    def render(self):
        label = self.label() if callable(self.label) else self.label
        cells = self.cells() if callable(self.cells) else self.cells
        return f"| {label} | {' | '.join(cells)} |"


class Table:
    def __init__(self, group, header, footer=None):
        self.group, self.header, self.footer = group, header, footer
        self._rows = []

    def row(self, order, label, cells):
        """A row, placed by order (then by declaration) among the table's rows."""
        r = Row(label, cells)
        self._rows.append((order, len(self._rows), r))
        return r

    def lines(self):
        out = list(self.header) + [r.render() for _, _, r in sorted(self._rows, key=lambda t: t[:2])] + [""]
        foot = self.footer() if self.footer else []
        return out + foot + [""] if foot else out


def enabled(group):
    """Whether a group's tests run: "cuda" (the driver-API programs and the measures on
    them) unless --rt-only, "rt" (the runtime-API programs and the benchmark) unless --no-rt,
    "serving" (the serving benchmark) with --serving or --serving-only, "host" (its tests
    that need no GPU) with --serving-fake; --serving-only and --serving-fake run theirs alone."""
    return {"cuda": H.cuda, "rt": H.rt, "serving": H.serving, "host": H.host}.get(group, False)


def table(order, group, header, footer=None):
    t = Table(group, header, footer)
    _PARTS.append((order, len(_PARTS), t))
    return t


def block(order, fn):
    """fn() -> lines to put at this place of table.txt (or [])."""
    _PARTS.append((order, len(_PARTS), fn))


def at_end(fn):
    _AT_END.append(fn)


# The tables that several files add rows to; a file with a table of its own declares it.
DRIVER = table(10, "cuda", ["| test | native | omps | result |", "|---|---|---|---|"])
RT = table(20, "rt", ["| test | native | omps preload | omps libpath | result |", "|---|---|---|---|---|"],
           footer=lambda: [
               f"rt/*: tests/cuda/rt, nvcc -arch={H.rt_arch}, static cudart "
               "(rt/per_thread_stream: --default-stream per-thread);",
               "preload = LD_PRELOAD=libomps_shim.so; libpath = LD_LIBRARY_PATH=<dir with libcuda.so.1 -> libomps_shim.so>",
           ])


def write():
    """Runs the at-end functions, then writes table.txt; its text goes to e2e.log, and
    conftest prints it last."""
    for fn in _AT_END:
        fn()
    lines = [f"## omps end-to-end: {H.gpu_desc}", "", H.omps_note, ""]
    for _, _, part in sorted(_PARTS, key=lambda t: t[:2]):
        if isinstance(part, Table):
            if enabled(part.group):
                lines += part.lines()
        else:
            lines += part() or []
    lines.append("overall: FAIL" if H.any_fail else "overall: PASS")
    text = "\n".join(lines) + "\n"
    (H.out / "table.txt").write_text(text)
    H.table_text = text
    H.write_log(f"\n==================== summary ====================\n{text}", console=False)
