#!/usr/bin/env python3
"""Checks shardtrain's module layering in src/.

The modules' rule (docs/design.md, "The modules and their dependency rule"; the order is
core, ops, model, dist, fsdp, optim, io, data, train, cli): a module includes only itself and the
modules its table row names, directly or through them. The CMake libraries link only those
modules, but a header-only include the wrong way still builds; this check catches it.

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


def check(root):
    """Every broken rule under root/src, as messages; empty when the tree keeps them."""
    if not os.path.isdir(os.path.join(root, "src")):
        return [f"{root}: no src/ folder; pass the repository's root with --root"]
    edges = [(rel, number, written, target)
             for rel in source_files(root) for number, written, target in includes(root, rel)]
    return check_layering(root, edges)


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
    print(f"layering: {files} files in src/ keep the module order")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
