#!/usr/bin/env python3
"""Fails when source files of a Rust crate import each other in a circle.

Issue 24 asks that no file depend, through any chain of others, on itself: a circle
means neither file can be read, changed or moved without the other, and it is how the
server's client/worker/session knot grew. rustc allows such circles inside a crate, so
this checks what rustc does not.

    python3 scripts/check-import-cycles.py DIR...      # each DIR a crate's src/
    python3 scripts/check-import-cycles.py --allow FILE DIR...  # FILE: known circles
    python3 scripts/check-import-cycles.py --self-test DIR...

What counts as an edge A -> B: code in file A names an item defined in file B, through a
`use` or a path in an expression or type (`crate::x::Y`, `super::Y`, `self::m::f`, or a
path starting with a child module's name). A path is resolved to the longest module
prefix that is a file; if the next segment is a name that file only re-exports
(`pub use child::Name`, or a glob), the edge goes on to the file that defines it. Not
edges: `mod child;` declarations, `pub use` re-exports themselves (a folder's mod.rs that
lists its children's public items does not depend on them), and code under `#[cfg(test)]`
inside a file (its tests may use shared test helpers that use the file); a test file of
its own is checked like any other. Macros invoked by path and paths into other crates are
not followed.

--self-test also proves the check can fail: for DIR's first edge A -> B it copies the
crate, adds a reference from B back to A, and requires the check to report the circle.
--allow FILE names circles known and being taken apart (blocks of paths relative to the
repository root, a blank line between blocks): a circle within one block passes, any
other circle, or one that grew past its block, fails. The file shrinks as the layout
work goes on and is empty when it is done.
Exit status 1 when a circle is found (or the self-test's circle is not).
"""

import os
import re
import shutil
import sys
import tempfile

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
ITEM_DEF = re.compile(
    r"\b(?:fn|struct|enum|union|trait|type|const|static|mod)\s+(" + IDENT + r")"
    r"|macro_rules!\s*(" + IDENT + r")"
)


def strip(src):
    """Source with comments, string and char literals blanked (newlines kept)."""
    out, i, n = [], 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
            i = j
        elif src.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if src.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif src.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append("\n" * src.count("\n", i, j))
            i = j
        elif c == "r" and re.match(r'r#*"', src[i:i + 260]) and not re.match(r"\w", src[i - 1:i] or " "):
            hashes = re.match(r'r(#*)"', src[i:]).group(1)
            end = src.find('"' + hashes, i + 2 + len(hashes))
            end = n if end < 0 else end + 1 + len(hashes)
            out.append('""' + "\n" * src.count("\n", i, end))
            i = end
        elif c == '"':
            j = i + 1
            while j < n and src[j] != '"':
                j += 2 if src[j] == "\\" else 1
            out.append('""' + "\n" * src.count("\n", i, j))
            i = j + 1
        elif c == "'":
            if src.startswith("\\", i + 1):
                j = src.find("'", i + 2)
                i = n if j < 0 else j + 1
                out.append("' '")
            elif i + 2 < n and src[i + 2] == "'":
                out.append("' '")
                i += 3
            else:  # a lifetime
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def strip_test_items(code):
    """Blank `#[cfg(test)]` items: test code may use helpers that use the file under test."""
    out, pos = [], 0
    for m in re.finditer(r"#\[cfg\(test\)\]", code):
        if m.start() < pos:
            continue
        j = m.end()
        brace, semi = code.find("{", j), code.find(";", j)
        if brace < 0 or (0 <= semi < brace):
            end = len(code) if semi < 0 else semi + 1
        else:
            depth, end = 0, brace
            while end < len(code):
                depth += {"{": 1, "}": -1}.get(code[end], 0)
                end += 1
                if depth == 0:
                    break
        out.append(code[pos:m.start()])
        out.append("\n" * code.count("\n", m.start(), end))
        pos = end
    out.append(code[pos:])
    return "".join(out)


def split_top(text, sep=","):
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        if ch == sep and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


def expand_use(tree, prefix=()):
    """`a::{b, c::d as e, self}` -> [(('a','b'), 'b'), ...] as (path, bound name)."""
    tree = re.sub(r"\s+", "", tree)
    m = re.match(r"^((?:" + IDENT + r"::)*)\{(.*)\}$", tree)
    if m:
        head = tuple(s for s in m.group(1).split("::") if s)
        out = []
        for part in split_top(m.group(2)):
            out += expand_use(part, prefix + head)
        return out
    segs = tree.split("::")
    path = prefix + tuple(segs)
    if path and path[-1] == "self":
        path = path[:-1]
    bound = path[-1] if path else None
    return [(path, bound)]


class Crate:
    def __init__(self, src_dir):
        self.src_dir = os.path.abspath(src_dir)
        self.files = {}  # module path tuple -> file
        self.by_file = {}
        self._code, self._defs, self._reexports = {}, {}, {}
        for root in ("lib.rs", "main.rs"):
            f = os.path.join(self.src_dir, root)
            if os.path.exists(f):
                self._walk(f, (root[:-3],), root[:-3])

    def _walk(self, f, modpath, root):
        if f in self.by_file:
            return
        self.files[modpath] = f
        self.by_file[f] = modpath
        code = strip(open(f, encoding="utf-8").read())
        base = os.path.dirname(f)
        name = os.path.basename(f)
        if name not in ("lib.rs", "main.rs", "mod.rs"):
            base = os.path.join(base, name[:-3])
        for m in re.finditer(r"(#\[path\s*=\s*\"[^\"]*\"\]\s*)?\bmod\s+(" + IDENT + r")\s*;", code):
            child = m.group(2)
            for cand in (os.path.join(base, child + ".rs"), os.path.join(base, child, "mod.rs")):
                if os.path.exists(cand):
                    self._walk(cand, modpath + (child,), root)
                    break

    def module_file(self, path):
        return self.files.get(tuple(path))

    def code(self, f):
        if f not in self._code:
            self._code[f] = strip(open(f, encoding="utf-8").read())
        return self._code[f]

    def defines(self, f, name):
        if f not in self._defs:
            self._defs[f] = {m.group(1) or m.group(2) for m in ITEM_DEF.finditer(self.code(f))}
        return name in self._defs[f]


def reexports(crate, f):
    """Name -> list of absolute paths it is re-exported from, plus glob sources."""
    if f in crate._reexports:
        return crate._reexports[f]
    code = crate.code(f)
    mod = crate.by_file[f]
    names, globs = {}, []
    for m in re.finditer(r"\bpub(?:\s*\([^)]*\))?\s+use\s+([^;]+);", code):
        for path, bound in uses_of(m.group(1)):
            absp = absolute(crate, mod, path)
            if absp is None:
                continue
            if path and path[-1] == "*":
                globs.append(absp[:-1])
            elif bound:
                names.setdefault(bound, []).append(absp)
    crate._reexports[f] = (names, globs)
    return names, globs


def uses_of(text):
    """Expand a use tree, keeping `as` aliases."""
    out = []
    for path, _ in expand_use(re.sub(r"\s+as\s+", " AS ", text).replace(" AS ", "@")):
        path = list(path)
        bound = None
        if path and "@" in path[-1]:
            path[-1], bound = path[-1].split("@", 1)
        path = tuple(path)
        out.append((path, bound or (path[-1] if path else None)))
    return out


def absolute(crate, mod, path):
    """Absolute module path of `path` used inside module `mod`, or None (another crate)."""
    if not path:
        return None
    root = mod[:1]
    if path[0] == "crate":
        return root + path[1:]
    if path[0] in ("self", "super"):
        cur = list(mod)
        i = 0
        while i < len(path) and path[i] in ("self", "super"):
            if path[i] == "super":
                if len(cur) <= 1:
                    return None
                cur.pop()
            i += 1
        return tuple(cur) + path[i:]
    if crate.module_file(mod + (path[0],)):
        return mod + path
    return None


def resolve(crate, absp, seen=None):
    """The file defining what absolute path `absp` names (following re-exports)."""
    seen = seen or set()
    for k in range(len(absp), 0, -1):
        f = crate.module_file(absp[:k])
        if f is None:
            continue
        if k == len(absp):
            return f
        name = absp[k]
        if (f, name) in seen:
            return f
        seen.add((f, name))
        if crate.defines(f, name):
            return f
        names, globs = reexports(crate, f)
        for src in names.get(name, []):
            return resolve(crate, src, seen)
        for g in globs:
            target = resolve(crate, g + (name,), seen)
            if target and target != crate.module_file(g) or (target and crate.defines(target, name)):
                return target
        return f
    return None


def edges(crate):
    """(from file, to file) -> first line number of a reference."""
    found = {}
    for f, mod in crate.by_file.items():
        raw = strip_test_items(crate.code(f))
        aliases, glob_mods = {}, []
        # use statements (re-exports aside)
        for m in re.finditer(r"(\bpub(?:\s*\([^)]*\))?\s+)?\buse\s+([^;]+);", raw):
            line = raw.count("\n", 0, m.start()) + 1
            for path, bound in uses_of(m.group(2)):
                glob = bool(path) and path[-1] == "*"
                if glob:
                    path = path[:-1]
                absp = absolute(crate, mod, path)
                if absp is None:
                    continue
                if glob and crate.module_file(absp):
                    glob_mods.append((absp, line))
                if bound and crate.module_file(absp):
                    aliases[bound] = absp
                if m.group(1):
                    continue  # a re-export
                t = resolve(crate, absp)
                if t and t != f:
                    found.setdefault((f, t), line)
        code = re.sub(r"\buse\s+[^;]+;", lambda m: "\n" * m.group(0).count("\n"), raw)
        # A glob import (`use super::*`) depends on the files defining the names used.
        if glob_mods:
            idents = set(re.findall(r"\b" + IDENT + r"\b", code))
            for absp, line in glob_mods:
                for ident in idents:
                    t = resolve(crate, absp + (ident,))
                    if t and t != f and crate.defines(t, ident):
                        found.setdefault((f, t), line)
        for m in re.finditer(r"\b(" + IDENT + r")((?:\s*::\s*" + IDENT + r")+)(\s*!)?", code):
            if m.group(3):
                continue
            segs = (m.group(1),) + tuple(s.strip() for s in m.group(2).split("::")[1:])
            if segs[0] in aliases:
                absp = aliases[segs[0]] + segs[1:]
            else:
                absp = absolute(crate, mod, segs)
            if absp is None:
                continue
            t = resolve(crate, absp)
            if t and t != f:
                found.setdefault((f, t), raw.count("\n", 0, m.start()) + 1)
    return found


def circles(graph_edges):
    adj = {}
    for (a, b) in graph_edges:
        adj.setdefault(a, []).append(b)
        adj.setdefault(b, [])
    index, low, stack, on, sccs, counter = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in adj[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                sccs.append(sorted(comp))

    for v in sorted(adj):
        if v not in index:
            visit(v)
    return sccs


def check(src_dir, quiet=False):
    crate = Crate(src_dir)
    es = edges(crate)
    sccs = circles(es)
    rel = lambda f: os.path.relpath(f, os.path.dirname(crate.src_dir))
    for comp in sccs:
        members = set(comp)
        if not quiet:
            print(f"circle of {len(comp)} files in {src_dir}:")
            for (a, b), line in sorted(es.items()):
                if a in members and b in members:
                    print(f"  {rel(a)}:{line} -> {rel(b)}")
    return crate, es, sccs


def self_test(src_dir):
    crate, es, sccs = check(src_dir, quiet=True)
    if sccs:
        print(f"self-test: {src_dir} has circles already", file=sys.stderr)
        return False
    for (a, b) in sorted(es):
        mod_a = crate.by_file[a]
        if len(mod_a) < 2:
            continue
        tmp = tempfile.mkdtemp()
        try:
            copy = os.path.join(tmp, "src")
            shutil.copytree(crate.src_dir, copy)
            target = os.path.join(copy, os.path.relpath(b, crate.src_dir))
            with open(target, "a", encoding="utf-8") as fh:
                fh.write("\n#[allow(unused_imports)]\nuse crate::" + "::".join(mod_a[1:]) + " as _;\n")
            _, _, found = check(copy, quiet=True)
            ok = any(len(c) > 1 for c in found)
            rel = lambda f: os.path.relpath(f, crate.src_dir)
            print(f"self-test: added {rel(b)} -> {rel(a)} beside {rel(a)} -> {rel(b)}: "
                  f"{'circle found' if ok else 'NOT found'}")
            return ok
        finally:
            shutil.rmtree(tmp)
    print(f"self-test: {src_dir} has no edge to reverse", file=sys.stderr)
    return False


def read_allowed(path):
    """Known circles still being taken apart: blocks of file paths, blank-line separated."""
    blocks, cur = [], set()
    for line in open(path, encoding="utf-8"):
        line = line.split("#", 1)[0].strip()
        if not line:
            if cur:
                blocks.append(cur)
            cur = set()
        else:
            cur.add(os.path.normpath(line))
    if cur:
        blocks.append(cur)
    return blocks


def main(argv):
    if argv and argv[0] == "--self-test":
        return 0 if all(self_test(d) for d in argv[1:]) else 1
    allowed = []
    if len(argv) >= 2 and argv[0] == "--allow":
        allowed, argv = read_allowed(argv[1]), argv[2:]
    bad = False
    for d in argv:
        crate, es, sccs = check(d, quiet=True)
        for comp in sccs:
            files = {os.path.normpath(os.path.relpath(f)) for f in comp}
            if any(files <= a for a in allowed):
                print(f"{d}: a known circle of {len(comp)} files (allowed, still to take apart)")
                continue
            bad = True
            members = set(comp)
            print(f"circle of {len(comp)} files in {d}:")
            for (a, b), line in sorted(es.items()):
                if a in members and b in members:
                    print(f"  {os.path.relpath(a)}:{line} -> {os.path.relpath(b)}")
        if not sccs:
            print(f"{d}: {len(crate.by_file)} files, {len(es)} edges, no circles")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
