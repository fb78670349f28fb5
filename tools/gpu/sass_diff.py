#!/usr/bin/env python3
"""Whether nvcc made the same machine code for every kernel before and after a change.

    python3 tools/gpu/sass_diff.py BEFORE AFTER    # exit 0 iff every kernel is the same

BEFORE and AFTER are nvcc objects, or folders of them (*.o), such as copies of
bazel-bin/kernels/*_cu_o.pic.o built at the base and at the change. It needs no GPU, only
cuobjdump ($CUOBJDUMP, else on PATH, under /usr/local/cuda/bin or in a Python package:
`pip install nvidia-cuda-cuobjdump` brings one).

For each kernel and each SASS architecture of the objects it compares, as text:
  - the SASS of `cuobjdump -sass` (every instruction with its address and encoding), byte
    for byte: everything between the kernel's "Function :" line and the next one, blank
    lines at the end left out;
  - the resource usage of `cuobjdump -res-usage` (registers, stack, shared, local, constant);
and for each PTX architecture, the kernel's PTX (`cuobjdump -ptx`), with every mangled name
in it written as its key (below), and the module-level PTX lines (shared arrays) as a set.

A kernel is known by its demangled name with the namespaces left out, so that a kernel moved
to another file (whose unnamed namespace has another mangled name) or another namespace is
still the same kernel. Two kernels of one side with the same key are an error.
"""
import collections
import difflib
import glob
import os
import re
import shutil
import site
import subprocess
import sys

QUALIFIER = re.compile(r"(?:\(anonymous namespace\)|[A-Za-z_]\w*)::")
MANGLED = re.compile(r"(_Z\w+?)(_param_\d+)?(?!\w)")
# PTX names that number a function's labels and local memory by its place in the module.
PTX_NUMBERED = re.compile(r"(\$L__BB|\$L__tmp|__local_depot)\d+")


def find_cuobjdump():
    candidates = [os.environ.get("CUOBJDUMP"), shutil.which("cuobjdump"),
                  "/usr/local/cuda/bin/cuobjdump"]
    roots = list(site.getsitepackages()) + glob.glob("/opt/*/venvs/*/lib/python3*/site-packages")
    for root in roots:
        candidates += glob.glob(os.path.join(root, "nvidia/cu*/bin/cuobjdump"))
        candidates += glob.glob(os.path.join(root, "nvidia/cuda_cuobjdump/bin/cuobjdump"))
        candidates += glob.glob(os.path.join(root, "triton/backends/nvidia/bin/cuobjdump"))
    for c in candidates:
        if c and os.access(c, os.X_OK):
            return c
    sys.exit("sass_diff: no cuobjdump (set CUOBJDUMP, or pip install nvidia-cuda-cuobjdump)")


def objects(path):
    if os.path.isdir(path):
        found = sorted(glob.glob(os.path.join(path, "*.o")))
        if not found:
            sys.exit(f"sass_diff: no *.o in {path}")
        return found
    return [path]


def demangle(names):
    names = sorted(set(names))
    if not names:
        return {}
    out = subprocess.run(["c++filt"], input="\n".join(names) + "\n", capture_output=True,
                         text=True, check=True).stdout.split("\n")
    return dict(zip(names, out))


def key(demangled):
    return QUALIFIER.sub("", demangled)


def split_sections(text):
    """Yields (arch, kind, lines) for each fatbin entry: kind "elf" or "ptx"."""
    kind, arch, lines = None, None, []
    for line in text.split("\n"):
        m = re.match(r"Fatbin (elf|ptx) code:", line)
        if m:
            if kind:
                yield arch, kind, lines
            kind, arch, lines = m.group(1), None, []
            continue
        if arch is None and line.startswith("arch = "):
            arch = line.split("=", 1)[1].strip()
            continue
        lines.append(line)
    if kind:
        yield arch, kind, lines


def sass_functions(text):
    """{(arch, mangled): SASS text} of `cuobjdump -sass`."""
    found = {}
    for arch, kind, lines in split_sections(text):
        if kind != "elf":
            continue
        name, body = None, []
        for line in lines + ["\t\tFunction : <end>"]:
            m = re.match(r"\s*Function : (\S+)", line)
            if m:
                if name:
                    while body and not body[-1].strip():
                        body.pop()
                    found[(arch, name)] = "\n".join(body)
                name, body = m.group(1), []
            elif name:
                # The columns' padding depends on the longest instruction of the whole
                # object: one space between address, instruction and encoding.
                body.append(" ".join(line.split()))
    return found


def resource_usage(text):
    """{(arch, mangled): resource line} of `cuobjdump -res-usage`."""
    found = {}
    for arch, kind, lines in split_sections(text):
        for i, line in enumerate(lines):
            m = re.match(r"\s*Function (\S+):$", line)
            if m and i + 1 < len(lines):
                found[(arch, m.group(1))] = lines[i + 1].strip()
    return found


def ptx_functions(text):
    """({(arch, mangled): PTX text}, {arch: [module-level lines]}) of `cuobjdump -ptx`."""
    found, module = {}, collections.defaultdict(list)
    for arch, kind, lines in split_sections(text):
        if kind != "ptx":
            continue
        name, body = None, []
        for line in lines:
            m = re.match(r"(?:\.visible |\.weak )?\.(?:entry|func) (?:\([^)]*\) )?(\w+)", line)
            if name is None and m:
                name, body = m.group(1), [line]
            elif name is not None:
                body.append(line)
                if line == "}":
                    found[(arch, name)] = "\n".join(body)
                    name = None
            elif line.strip() and not line.startswith("//"):
                module[arch].append(line)
    return found, module


def run(cuobjdump, flag, path):
    return subprocess.run([cuobjdump, flag, path], capture_output=True, text=True,
                          check=True).stdout


def load(cuobjdump, path):
    """{(what, arch, key): text} over the objects of `path`, what in sass, res, ptx, module."""
    sass, res, ptx, module = {}, {}, {}, collections.defaultdict(list)
    for obj in objects(path):
        for k, v in sass_functions(run(cuobjdump, "-sass", obj)).items():
            sass[k + (obj,)] = v
        for k, v in resource_usage(run(cuobjdump, "-res-usage", obj)).items():
            res[k + (obj,)] = v
        funcs, mod = ptx_functions(run(cuobjdump, "-ptx", obj))
        for k, v in funcs.items():
            ptx[k + (obj,)] = v
        for arch, lines in mod.items():
            module[arch] += lines
    names = {n for d in (sass, res, ptx) for (_, n, _) in d}
    texts = list(ptx.values()) + [l for ls in module.values() for l in ls]
    for t in texts:
        names.update(m.group(1) for m in MANGLED.finditer(t))
    plain = {n: key(d) for n, d in demangle(names).items()}

    def unmangle(t):
        return MANGLED.sub(lambda m: "<" + plain.get(m.group(1), m.group(1)) + ">"
                           + (m.group(2) or ""), t)

    out, where = {}, {}
    for what, table in (("sass", sass), ("res", res), ("ptx", ptx)):
        for (arch, name, obj), text in table.items():
            k = (what, arch, plain[name])
            if k in out:
                sys.exit(f"sass_diff: two kernels {plain[name]!r} ({arch}) in {path}: "
                         f"{where[k]} and {obj}")
            if what == "ptx":
                text = PTX_NUMBERED.sub(r"\1#", unmangle(text))
            out[k], where[k] = text, obj
    for arch, lines in module.items():
        out[("module", arch, "")] = "\n".join(sorted(set(unmangle(l) for l in lines)))
    return out


def main(argv):
    if len(argv) != 3:
        sys.exit(__doc__)
    cuobjdump = find_cuobjdump()
    before, after = load(cuobjdump, argv[1]), load(cuobjdump, argv[2])
    counts = collections.Counter()
    failed = False
    for k in sorted(set(before) | set(after)):
        what, arch, name = k
        if k not in after or k not in before:
            print(f"ONLY {'BEFORE' if k in before else 'AFTER'}: {what} {arch} {name}")
            failed = True
            continue
        counts[(what, arch, "all")] += 1
        if before[k] == after[k]:
            counts[(what, arch, "same")] += 1
            continue
        failed = True
        print(f"DIFFERS: {what} {arch} {name}")
        diff = difflib.unified_diff(before[k].split("\n"), after[k].split("\n"), "before",
                                    "after", lineterm="", n=2)
        for i, line in enumerate(diff):
            if i == 40:
                print("  ...")
                break
            print("  " + line)
    for what, arch, tag in sorted(counts):
        if tag == "all":
            n, same = counts[(what, arch, "all")], counts[(what, arch, "same")]
            label = {"sass": "kernels' SASS", "res": "kernels' resource usage",
                     "ptx": "kernels' PTX", "module": "module-level PTX"}[what]
            print(f"{arch} {label}: {same} of {n} identical")
    print("sass_diff: " + ("DIFFERENT" if failed else "identical"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
