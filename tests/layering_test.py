#!/usr/bin/env python3
"""Checks shardtrain's module layering and include cycles in src/.

The modules' rule (docs/design.md, "The modules and their dependency rule"; the order is
core, ops, model, dist, fsdp, optim, io, data, train, cli): a module includes only itself and the
modules its table row names, directly or through them. The CMake libraries link only those
modules, but a header-only include the wrong way still builds; this check catches it.

It also refuses include cycles between the files of src/, counting a header and its
implementation (plan.h, plan.cpp) as one unit: a .cpp that includes a header which includes the
.cpp's own header is a cycle, even though no single file includes itself.

Run: python3 tests/layering_test.py [--root REPO]. Exits 0 when the tree keeps the rules, 1 with
one line per broken rule (file:line, the include, the rule) otherwise.
"""

import argparse
import os
import re
import sys

# docs/design.md's table: module -> the modules it uses directly. What a module may include is
# this closed over (train uses optim, which uses fsdp, ...).
USES = {
    "core": [],
    "ops": ["core"],
    "model": ["ops"],
    "dist": ["core"],
    "fsdp": ["model", "dist"],
    "optim": ["fsdp", "ops"],
    "io": ["core"],
    "data": ["core", "io"],
    "train": ["optim", "io", "data"],
    "cli": ["train"],
}
ORDER = ["core", "ops", "model", "dist", "fsdp", "optim", "io", "data", "train", "cli"]

# Wrong-way includes kept on purpose: (file relative to the repository, include as written) ->
# why. Empty: src/ keeps the rule everywhere. An entry that no longer matches an include fails
# the check, so that the list only shrinks.
LAYERING_ALLOWED = {}

# Includes that close an include cycle and are kept on purpose, same form. The check drops these
# edges and then refuses any cycle that remains.
CYCLE_ALLOWED = {
    # load_tokenizer(), declared beside the Tokenizer interface, builds the concrete tokenizers,
    # whose headers include the interface. Breaking it means moving the factory to a header of
    # its own and changing every caller's include.
    ("src/data/tokenizer.cpp", "data/bpe_tokenizer.h"):
        "the tokenizer factory in tokenizer.cpp builds the BPE tokenizer",
    ("src/data/tokenizer.cpp", "data/byte_tokenizer.h"):
        "the tokenizer factory in tokenizer.cpp builds the byte tokenizer",
}

SOURCE_EXTENSIONS = (".h", ".cpp", ".cu", ".cuh")
INCLUDE_RE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')


def closure(module):
    """The modules `module` may include: its table row, closed over."""
    seen, todo = set(), list(USES[module])
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo.extend(USES[m])
    return seen


def source_files(root):
    src = os.path.join(root, "src")
    for dirpath, dirnames, filenames in os.walk(src):
        dirnames.sort()
        for name in sorted(filenames):
            if name.endswith(SOURCE_EXTENSIONS):
                yield os.path.relpath(os.path.join(dirpath, name), root).replace(os.sep, "/")


def includes(root, rel):
    """(line number, include as written, the file it names under src/ or None) of each quoted include."""
    with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, 1):
            m = INCLUDE_RE.match(line)
            if not m:
                continue
            written = m.group(1)
            target = None
            for candidate in ("src/" + written, os.path.join(os.path.dirname(rel), written)):
                candidate = os.path.normpath(candidate).replace(os.sep, "/")
                if os.path.isfile(os.path.join(root, candidate)):
                    target = candidate
                    break
            yield number, written, target


def module_of(rel):
    """src/<module>/... -> module, or None for a file outside the modules."""
    parts = rel.split("/")
    return parts[1] if len(parts) > 2 and parts[1] in USES else None


def unit_of(rel):
    """A file's unit for the cycle check: its path without extension, and without the suffix
    _internal of a unit's private header (plan.h and plan.cpp: src/train/plan; parquet.h,
    parquet_internal.h and parquet.cpp: src/io/parquet)."""
    stem = os.path.splitext(rel)[0]
    return stem[:-len("_internal")] if stem.endswith("_internal") else stem


def check_layering(root, edges):
    problems, used = [], set()
    for rel, number, written, target in edges:
        module = module_of(rel)
        # the included module: by the resolved file, or by the written path's first part (a
        # generated header that is not in the tree)
        included = module_of(target) if target else (written.split("/")[0] if "/" in written else None)
        if module is None or included not in USES or included == module or included in closure(module):
            continue
        if (rel, written) in LAYERING_ALLOWED:
            used.add((rel, written))
            continue
        allowed = sorted(closure(module), key=ORDER.index)
        problems.append(
            f'{rel}:{number}: includes "{written}": module `{module}` may include only '
            f'{", ".join(allowed) or "nothing of ours"} (docs/design.md: a module uses only the modules '
            f'beneath it, in the order {", ".join(ORDER)}); `{included}` is not among them. Move what is '
            f'needed down to a module `{module}` may use, or pass it in from above.')
    for key in sorted(set(LAYERING_ALLOWED) - used):
        problems.append(f'{key[0]}: the layering allow-list names the include "{key[1]}", which no longer '
                        f'breaks the rule (or is gone); remove the entry from LAYERING_ALLOWED in {__file__}')
    return problems


def find_cycle(graph, nodes):
    """One cycle inside the strongly connected `nodes`, as a list of units whose last leads to its first."""
    start = min(nodes)
    parent, queue = {start: None}, [start]
    while queue:
        u = queue.pop(0)
        for v in sorted(graph[u]):
            if v not in nodes:
                continue
            if v == start:
                path = [u]
                while parent[path[-1]] is not None:
                    path.append(parent[path[-1]])
                return list(reversed(path))
            if v not in parent:
                parent[v] = u
                queue.append(v)
    return [start]


def strongly_connected(graph):
    """Tarjan's components of more than one unit (or a unit that includes itself), iteratively."""
    index, low, on_stack, stack, found, counter = {}, {}, set(), [], [], [0]
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.add(w)
                    if w == node:
                        break
                if len(component) > 1 or node in graph[node]:
                    found.append(component)
    return found


def reaches(graph, start, goal):
    seen, todo = {start}, [start]
    while todo:
        u = todo.pop()
        if u == goal:
            return True
        for v in graph.get(u, ()):
            if v not in seen:
                seen.add(v)
                todo.append(v)
    return False


def check_cycles(edges):
    problems = []
    graph, full, where, allowed = {}, {}, {}, {}
    for rel, number, written, target in edges:
        graph.setdefault(unit_of(rel), set())
        full.setdefault(unit_of(rel), set())
        if target is None or unit_of(target) == unit_of(rel):
            continue
        a, b = unit_of(rel), unit_of(target)
        full[a].add(b)
        if (rel, written) in CYCLE_ALLOWED:
            allowed[(rel, written)] = (a, b)
            continue
        graph[a].add(b)
        graph.setdefault(b, set())
        where.setdefault((a, b), []).append(f'{rel}:{number} includes "{written}"')
    for component in strongly_connected(graph):
        cycle = find_cycle(graph, component)
        steps = [s for i in range(len(cycle)) for s in where[(cycle[i], cycle[(i + 1) % len(cycle)])]]
        names = " -> ".join(u[len("src/"):] for u in cycle + cycle[:1])
        problems.append(f"include cycle {names} (a header and its .cpp count as one unit):\n    " +
                        "\n    ".join(steps) +
                        "\n  Move what one side needs into a header of its own that includes neither.")
    for key in sorted(CYCLE_ALLOWED):
        if key not in allowed:
            problems.append(f'{key[0]}: the cycle allow-list names the include "{key[1]}", which is gone; '
                            f'remove the entry from CYCLE_ALLOWED in {__file__}')
        elif not reaches(full, allowed[key][1], allowed[key][0]):
            problems.append(f'{key[0]}: the cycle allow-list names the include "{key[1]}", which no longer '
                            f'closes a cycle; remove the entry from CYCLE_ALLOWED in {__file__}')
    return problems


def check(root):
    """Every broken rule under root/src, as messages; empty when the tree keeps them."""
    if not os.path.isdir(os.path.join(root, "src")):
        return [f"{root}: no src/ folder; pass the repository's root with --root"]
    edges = [(rel, number, written, target)
             for rel in source_files(root) for number, written, target in includes(root, rel)]
    return check_layering(root, edges) + check_cycles(edges)


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        help="the repository's root (default: this file's)")
    args = parser.parse_args(argv)
    problems = check(args.root)
    for p in problems:
        print(p)
    if problems:
        print(f"{len(problems)} layering problem(s) in {os.path.join(args.root, 'src')}")
        return 1
    files = sum(1 for _ in source_files(args.root))
    print(f"layering: {files} files in src/ keep the module order and have no include cycle")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
