"""References to files the repository lacks, in its docs and code comments.

    python3 tools/refs_check.py [REPO_ROOT]    # exit 1, listing each, when there are any

It reads every file git tracks (recorded results left out) and looks at two kinds of
reference:
- a path under one of the repository's top-level folders, such as `worker/optim/onebit_adam.h` or
  `docs/design.md`: it must be a tracked file, a folder, or a Bazel target (`pkg/name`
  with `name = "name"` in pkg/BUILD);
- a root-level page in capitals, such as `BENCHMARKS.md`: it must exist.

Tests are not read: they make files and trees of their own. Not references: `#include` lines (the compiler checks those), URLs, paths with a part in
capitals (placeholders such as `fuzz/corpus/TARGET`), paths through an `out/` folder
(outputs), and a path that begins the name of a tracked file (a prefix such as
`results/bench/DAY/run7_`). deploy/test.sh runs it before the build; outside a git
checkout it says that it skips.
"""
import os
import re
import subprocess
import sys

SKIP_PARTS = ("/results/",)  # recorded runs: their logs name what was there then


def tracked(root):
    out = subprocess.run(["git", "-C", root, "ls-files"], capture_output=True, text=True,
                         check=True).stdout
    return [f for f in out.split("\n") if f]


def bazel_targets(root, files):
    targets = set()
    for f in files:
        if os.path.basename(f) != "BUILD":
            continue
        package = os.path.dirname(f)
        with open(os.path.join(root, f), encoding="utf-8") as b:
            for name in re.findall(r'\bname\s*=\s*"([^"]+)"', b.read()):
                targets.add(f"{package}/{name}" if package else name)
    return targets


def missing_references(root):
    files = tracked(root)
    present = set(files)
    folders = {os.path.dirname(f) for f in files}
    for d in list(folders):
        while d:
            folders.add(d)
            d = os.path.dirname(d)
    targets = bazel_targets(root, files)
    tops = sorted(d for d in folders if "/" not in d and d and not d.startswith("."))
    path = re.compile(r"(?<![\w/.$~-])((?:%s)/[\w./-]*\w)" % "|".join(map(re.escape, tops)))
    page = re.compile(r"(?<![\w/.$-])([A-Z][A-Z_]+\.md)\b")
    found = []
    for f in files:
        if any(p in f"/{f}" for p in SKIP_PARTS) or "_test." in os.path.basename(f):
            continue  # recorded runs; tests, which make trees of their own
        try:
            with open(os.path.join(root, f), encoding="utf-8") as handle:
                lines = handle.read().splitlines()
        except (UnicodeDecodeError, IsADirectoryError, FileNotFoundError):
            continue  # binary files, submodules
        for number, line in enumerate(lines, 1):
            if line.lstrip().startswith("#include") or "://" in line and "http" in line:
                line = re.sub(r"https?://\S+", "", line)
                if line.lstrip().startswith("#include"):
                    continue
            for m in path.finditer(line):
                ref = m.group(1).rstrip(".")
                parts = ref.split("/")
                if (ref in present or ref in folders or ref in targets or "out" in parts or
                        any(re.search(r"(?<![A-Za-z])[A-Z]{3,}(?![a-z])", p) for p in parts) or
                        any(p.startswith(ref) for p in present)):
                    continue
                found.append((f, number, ref))
            for m in page.finditer(line):
                if m.group(1) not in present and f"{os.path.dirname(f)}/{m.group(1)}".lstrip("/") not in present:
                    found.append((f, number, m.group(1)))
    return found


def main(argv):
    root = argv[1] if len(argv) > 1 else "."
    if subprocess.run(["git", "-C", root, "rev-parse"], capture_output=True).returncode != 0:
        print(f"refs_check: skipped: {root} is not a git checkout (it reads what git tracks)")
        return 0
    found = missing_references(root)
    for f, number, ref in found:
        print(f"{f}:{number}: {ref}: no such file, folder or target in the repository")
    if found:
        print(f"refs_check: {len(found)} references to files the repository lacks")
        return 1
    print("refs_check: every reference names a file, folder or target of the repository")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
