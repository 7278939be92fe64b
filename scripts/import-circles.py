#!/usr/bin/env python3
"""List module-level dependency edges in Rust crates and print cycles.

Usage: scripts/import-circles.py CRATE_SRC_DIR... [--edges] [--literal] [--prod]
(CI runs it on crates/*/src and fails on any cycle.)

Counting:
- Edges come from `use crate::/super::/self::/child::...` lines and from
  `crate::x::`, `super::x::`, `self::x::` and `alias::x` paths in code, where
  alias is a module imported by a `use` or a child module's name.
- A path counts as an edge to the module it names (`super::route::Route`
  is an edge to route even where route re-exports Route from plan), except
  that a name looked up in one of the using module's ancestors (the crate
  root, a parent mod.rs: facades) is followed through the facade's
  `use`/`pub use` to the module it comes from (so `super::FilePair` in
  storage::stamp counts as an edge to storage::file_pair, not to storage).
  With --literal, no name is followed: every path counts as an edge to the
  module it names (`crate::Result` to the crate root).
- An imported name (`use a::X;`, pub or not) makes an edge only if X is used
  in the file's code outside `use` lines: a pure `pub use` re-export in a
  facade (mod.rs/lib.rs) does not make the parent depend on the child.
  Hence parent<->child counts as a cycle only when the parent's own code
  uses a child's item and the child uses an item defined in the parent.
- `mod` declarations are not edges. Inline `mod tests {}` belong to their
  file's module; edges made inside `#[cfg(test)]` inline modules are tagged
  [test].
"""
import os
import re
import sys
from collections import defaultdict

LITERAL = '--literal' in sys.argv

ITEM_RE = re.compile(
    r'^\s*(?:pub(?:\([^)]*\))?\s+)?(?:unsafe\s+|async\s+|const\s+|extern\s+"[^"]*"\s+)*'
    r'(fn|struct|enum|trait|type|const|static|mod|union|macro_rules!)\s+([A-Za-z_]\w*)',
    re.M)


def strip(src):
    """Blank comments, strings and char literals, keeping offsets/newlines."""
    out = []
    i, n = 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith('//', i):
            j = src.find('\n', i)
            j = n if j < 0 else j
            out.append(' ' * (j - i)); i = j; continue
        if src.startswith('/*', i):
            depth, j = 1, i + 2
            while j < n and depth:
                if src.startswith('/*', j): depth += 1; j += 2
                elif src.startswith('*/', j): depth -= 1; j += 2
                else: j += 1
            out.append(re.sub(r'[^\n]', ' ', src[i:j])); i = j; continue
        m = re.match(r'b?r(#*)"', src[i:i + 10])
        if m and (i == 0 or not (src[i - 1].isalnum() or src[i - 1] == '_')):
            hashes = m.group(1)
            end = src.find('"' + hashes, i + m.end())
            end = n if end < 0 else end + 1 + len(hashes)
            out.append('"' + re.sub(r'[^\n]', ' ', src[i + 1:end - 1]) + '"'); i = end; continue
        if c == '"':
            j = i + 1
            while j < n and src[j] != '"':
                j += 2 if src[j] == '\\' else 1
            out.append('"' + re.sub(r'[^\n]', ' ', src[i + 1:j]) + '"'); i = j + 1; continue
        if c == "'":
            m = re.match(r"'(\\.[^']*|[^\\'])'", src[i:i + 12])
            if m:
                out.append("'" + ' ' * (m.end() - 2) + "'"); i += m.end(); continue
        out.append(c); i += 1
    return ''.join(out)


def expand_use(tree):
    """Expand a use tree into (segments, local_name) pairs; '*' for globs.
    A renamed leaf `X as Y` gives segments ending in X and local name Y."""
    tree = re.sub(r'\s+as\s+', '@as@', tree)
    tree = re.sub(r'\s+', '', tree)
    res = []

    def split_top(s):
        parts, depth, cur = [], 0, ''
        for ch in s:
            if ch == '{': depth += 1
            if ch == '}': depth -= 1
            if ch == ',' and depth == 0:
                parts.append(cur); cur = ''
            else:
                cur += ch
        if cur: parts.append(cur)
        return parts

    def rec(prefix, s):
        if not s: return
        if '{' in s:
            k = s.find('{')
            head = s[:k].rstrip(':')
            body = s[k + 1:s.rfind('}')]
            pre = prefix + ([x for x in head.split('::') if x] if head else [])
            for part in split_top(body):
                rec(pre, part)
            return
        alias = None
        if '@as@' in s:
            s, alias = s.split('@as@')
        segs = [x for x in s.split('::') if x]
        if segs and segs[-1] == 'self':
            segs = segs[:-1]
        full = prefix + segs
        if not full: return
        res.append((full, alias or full[-1]))

    rec([], tree)
    return res


class Module:
    def __init__(self, path, file):
        self.path = path  # tuple of names; () is the crate root
        self.file = file
        self.children = set()
        self.defs = set()
        self.imports = {}  # local name -> (abs segments, is_pub, line, test)
        self.globs = []


def module_path_of(src_dir, file):
    rel = os.path.relpath(file, src_dir)[:-3].split(os.sep)
    if rel == ['lib'] or rel == ['main']:
        return ()
    if rel[-1] == 'mod':
        rel = rel[:-1]
    return tuple(rel)


def analyse(src_dir):
    files = []
    for root, _, names in os.walk(src_dir):
        for nm in names:
            if nm.endswith('.rs'):
                files.append(os.path.join(root, nm))
    mods = {}
    texts = {}
    for f in sorted(files):
        p = module_path_of(src_dir, f)
        mods[p] = Module(p, f)
        raw = open(f).read()
        texts[p] = strip(raw)
    for p in mods:
        if p:
            parent = p[:-1]
            if parent in mods:
                mods[parent].children.add(p[-1])

    # Inline module ranges per file: (start, end, depth-contribution, is_test)
    inline = {}
    for p, t in texts.items():
        ranges = []
        for m in re.finditer(r'\bmod\s+(\w+)\s*\{', t):
            start = m.end() - 1
            depth, j = 0, start
            while j < len(t):
                if t[j] == '{': depth += 1
                elif t[j] == '}':
                    depth -= 1
                    if depth == 0: break
                j += 1
            before = t[max(0, m.start() - 200):m.start()]
            is_test = bool(re.search(r'#\[cfg\(test\)\]\s*(pub(\([^)]*\))?\s*)?$', before))
            ranges.append((start, j, is_test))
        inline[p] = ranges

    def ctx(p, pos):
        depth, test = 0, False
        for s, e, it in inline[p]:
            if s <= pos <= e:
                depth += 1
                test = test or it
        return depth, test

    def line_of(p, pos):
        return texts[p].count('\n', 0, pos) + 1

    use_re = re.compile(r'(?m)^[ \t]*(pub(?:\([^)]*\))?\s+)?use\s+([^;]+);')

    def absolute(p, segs, depth):
        """Make a path absolute (tuple of names from the crate root), or
        None if external."""
        if not segs: return None
        base = list(p)
        i = 0
        if segs[0] == 'crate':
            base = []; i = 1
        elif segs[0] in ('super', 'self'):
            eff = depth  # inline modules below the file module
            while i < len(segs) and segs[i] in ('super', 'self'):
                if segs[i] == 'super':
                    if eff > 0: eff -= 1
                    else: base = base[:-1]
                i += 1
            if eff > 0:
                # Path still inside an inline module (e.g. tests::x): treat
                # as the file's own module.
                return None
        elif segs[0] in mods[p].children:
            pass
        else:
            return None
        return tuple(base) + tuple(segs[i:])

    code_nouse = {}
    for p, t in texts.items():
        m_ = mods[p]
        for m in use_re.finditer(t):
            is_pub = bool(m.group(1))
            depth, test = ctx(p, m.start())
            for segs, local in expand_use(m.group(2)):
                a = absolute(p, segs, depth)
                if a is None: continue
                if local == '*':
                    m_.globs.append((a[:-1], line_of(p, m.start()), test))
                    continue
                name = a[-1]
                loc = local
                if depth > 0:
                    # Imports inside inline (test) modules: record separately.
                    m_.imports.setdefault(('@inline', loc, m.start()), (a, is_pub, line_of(p, m.start()), test))
                else:
                    m_.imports[loc] = (a, is_pub, line_of(p, m.start()), test)
        blank = use_re.sub(lambda m: re.sub(r'[^\n]', ' ', m.group(0)), t)
        code_nouse[p] = blank
        for m in ITEM_RE.finditer(t):
            depth, _ = ctx(p, m.start())
            if depth == 0 and m.group(1) != 'mod':
                m_.defs.add(m.group(2))

    def resolve(a, frm, seen=None):
        """Module a path names, as seen from module frm: the module the path
        names literally, except that a name looked up in an ancestor of frm
        (the crate root, a parent's mod.rs: the facades) is followed
        through the facade's `use`/`pub use` to the module it comes from."""
        seen = seen or set()
        if a in seen: return None
        seen.add(a)
        cur = ()
        i = 0
        while i < len(a) and cur + (a[i],) in mods:
            cur = cur + (a[i],); i += 1
        if i == len(a):
            return cur  # a module itself
        if frm[:len(cur)] != cur or LITERAL:
            return cur  # named through a module that is not an ancestor
        name = a[i]
        m_ = mods[cur]
        if name in m_.defs:
            return cur
        if name in m_.imports:
            tgt = m_.imports[name][0]
            r = resolve(tgt + a[i + 1:], frm, seen)
            if r is not None:
                return r
        return cur

    edges = defaultdict(list)  # (src, dst) -> [(file:line, test)]

    def add(src, dst, where, test):
        if dst is None or src == dst: return
        edges[(src, dst)].append((where, test))

    for p, t in texts.items():
        m_ = mods[p]
        code = code_nouse[p]
        rel = os.path.relpath(m_.file, os.path.dirname(src_dir))
        # imports used in code
        module_aliases = {}
        for key, (a, is_pub, line, test) in m_.imports.items():
            loc = key[1] if isinstance(key, tuple) else key
            tgt_mod = a in mods
            if tgt_mod:
                module_aliases[loc] = a
                continue
            uses = [mm.start() for mm in re.finditer(r'(?<![\w:])' + re.escape(loc) + r'\b', code)]
            if not uses:
                continue
            r = resolve(a, p)
            if r is None: continue
            alltest = test or all(ctx(p, u)[1] for u in uses)
            add(p, r, f'{rel}:{line}', alltest)
        for a, line, test in m_.globs:
            add(p, resolve(a, p) if a not in mods else a, f'{rel}:{line}', test)
        for ch in m_.children:
            module_aliases.setdefault(ch, p + (ch,))
        # paths in code
        pat = re.compile(r'(?<![\w:])((?:crate|super|self|[a-z_]\w*)(?:::[A-Za-z_]\w*)+)')
        for mm in pat.finditer(code):
            segs = mm.group(1).split('::')
            depth, test = ctx(p, mm.start())
            if segs[0] in ('crate', 'super', 'self'):
                a = absolute(p, segs, depth)
            elif segs[0] in module_aliases:
                a = module_aliases[segs[0]] + tuple(segs[1:])
            else:
                continue
            if a is None: continue
            r = resolve(a, p)
            add(p, r, f'{rel}:{line_of(p, mm.start())}', test)
    return mods, edges


def name(p):
    return '::'.join(p) if p else 'crate'


def sccs(nodes, adj):
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = [0]
    sys.setrecursionlimit(10000)

    def strong(v):
        index[v] = low[v] = counter[0]; counter[0] += 1
        stack.append(v); on.add(v)
        for w in adj.get(v, ()):
            if w not in index:
                strong(w); low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop(); on.discard(w); comp.append(w)
                if w == v: break
            out.append(comp)
    for v in nodes:
        if v not in index: strong(v)
    return out


def simple_cycles(comp, adj, limit=50):
    comp = set(comp)
    cycles = []
    order = sorted(comp, key=name)
    for s in order:
        # cycles whose smallest node is s
        allowed = {v for v in comp if name(v) >= name(s)}
        path = [s]

        def dfs(v):
            for w in sorted(adj.get(v, ()), key=name):
                if w not in allowed: continue
                if w == s:
                    cycles.append(list(path))
                    if len(cycles) >= limit: return True
                elif w not in path:
                    path.append(w)
                    if dfs(w): return True
                    path.pop()
            return False
        if dfs(s): break
    return cycles


def main():
    args = [a for a in sys.argv[1:] if not a.startswith('--')]
    show_edges = '--edges' in sys.argv
    prod_only = '--prod' in sys.argv
    total = 0
    for src in args:
        src = os.path.abspath(src)
        mods, edges = analyse(src)
        crate = os.path.basename(os.path.dirname(src))
        adj = defaultdict(set)
        for (a, b), ev in edges.items():
            if prod_only and all(t for _, t in ev): continue
            adj[a].add(b)
        print(f'== {crate}: {len(mods)} modules, {len(edges)} edges')
        if show_edges:
            for (a, b), ev in sorted(edges.items(), key=lambda kv: (name(kv[0][0]), name(kv[0][1]))):
                tag = ' [test]' if all(t for _, t in ev) else ''
                print(f'   {name(a)} -> {name(b)}{tag}   ({ev[0][0]})')
        found = 0
        for comp in sccs(list(mods), adj):
            if len(comp) < 2: continue
            found += 1
            print(f'  CYCLE among: {", ".join(sorted(name(c) for c in comp))}')
            for cyc in simple_cycles(comp, adj):
                print('    ' + ' -> '.join(name(c) for c in cyc + [cyc[0]]))
            for (a, b), ev in sorted(edges.items(), key=lambda kv: (name(kv[0][0]), name(kv[0][1]))):
                if a in comp and b in comp and b in adj[a]:
                    tag = ' [test only]' if all(t for _, t in ev) else ''
                    wh = ', '.join(sorted({w for w, _ in ev})[:4])
                    print(f'      {name(a)} -> {name(b)}{tag}: {wh}')
        if not found:
            print('  no cycles')
        total += found
    print(f'cycles (strongly connected groups) in total: {total}')
    return total


if __name__ == '__main__':
    sys.exit(1 if main() else 0)
