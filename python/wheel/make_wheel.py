"""Packs onebit's Python package, its native core and the job binaries into a wheel.

    make_wheel.py --out onebit-VERSION-py3-none-linux_x86_64.whl --version VERSION \
        --license LICENSE --package onebit/__init__.py ... --core libonebit_core.so \
        --binary coordinator/onebit-coordinator=PATH ...

A wheel is a zip with the files, a METADATA, a WHEEL and a RECORD of every file's sha256
(PEP 427); pip installs it without setuptools or a network. The core is a C library the
package loads with ctypes (python/c_api.h), so the wheel is py3-none: any CPython from 3.9
on. The binaries go to onebit/bin/<dir>/<name> (the layout onebit-launch's --bin_dir
expects), executable, and entry_points.txt makes pip put onebit-coordinator, onebit-server,
onebit-worker, onebitctl and onebit-launch on PATH (python/onebit/_cli.py).

This wheel still loads Debian 12's shared libraries (gRPC, Abseil, protobuf, gloo, ...):
python/wheel/repair.sh bundles them (auditwheel repair) into the manylinux wheel users get.
"""
import argparse
import base64
import hashlib
import os
import re
import sys
import zipfile

SUMMARY = "1-bit Adam, 0/1 Adam and 1-bit LAMB: communication-compressed distributed training"
CONSOLE_SCRIPTS = {
    "onebit-coordinator": "coordinator", "onebit-server": "server", "onebit-worker": "worker",
    "onebitctl": "ctl", "onebit-launch": "launch", "onebit-run": "run",
}


def record_hash(data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--version", required=True)
    ap.add_argument("--package", nargs="+", required=True, help="the onebit/*.py files")
    ap.add_argument("--core", required=True, help="libonebit_core.so")
    ap.add_argument("--binary", nargs="+", default=[], help="DIR/NAME=PATH")
    ap.add_argument("--license", required=True, help="the LICENSE file (Apache-2.0)")
    a = ap.parse_args()
    m = re.match(r"^onebit-([^-]+)-(py3)-(none)-(linux_x86_64)\.whl$", os.path.basename(a.out))
    if not m or m.group(1) != a.version:
        sys.exit(f"make_wheel: {a.out} is not onebit-{a.version}-py3-none-linux_x86_64.whl")
    dist = f"onebit-{a.version}.dist-info"
    files = []  # (name in the wheel, bytes, executable)
    for path in a.package:
        with open(path, "rb") as f:
            files.append((f"onebit/{os.path.basename(path)}", f.read(), False))
    with open(a.core, "rb") as f:
        files.append(("onebit/libonebit_core.so", f.read(), False))
    for spec in a.binary:
        name, path = spec.split("=", 1)
        with open(path, "rb") as f:
            files.append((f"onebit/bin/{name}", f.read(), True))
    metadata = [
        "Metadata-Version: 2.1", "Name: onebit", f"Version: {a.version}", f"Summary: {SUMMARY}",
        "License: Apache-2.0",
        "Classifier: License :: OSI Approved :: Apache Software License",
        "Requires-Python: >=3.9",
        # 1.13.0a0: Debian 12's python3-torch calls itself that, a pre-release of 1.13,
        # which ">=1.13" would refuse.
        "Requires-Dist: torch>=1.13.0a0",
        "Requires-External: libnccl.so.2 (NCCL 2, for jobs on GPUs only: CUDA's, or pip's "
        "nvidia-nccl, which torch's CUDA wheels bring)",
    ]
    wheel = ["Wheel-Version: 1.0", "Generator: onebit make_wheel.py", "Root-Is-Purelib: false",
             f"Tag: {m.group(2)}-{m.group(3)}-{m.group(4)}"]
    entry = ["[console_scripts]"] + [f"{s} = onebit._cli:{f}" for s, f in CONSOLE_SCRIPTS.items()]
    with open(a.license, "rb") as f:
        files.append((f"{dist}/LICENSE", f.read(), False))
    files += [(f"{dist}/METADATA", ("\n".join(metadata) + "\n").encode(), False),
              (f"{dist}/WHEEL", ("\n".join(wheel) + "\n").encode(), False),
              (f"{dist}/entry_points.txt", ("\n".join(entry) + "\n").encode(), False),
              (f"{dist}/top_level.txt", b"onebit\n", False)]
    record = [f"{name},{record_hash(data)},{len(data)}" for name, data, _ in files]
    record.append(f"{dist}/RECORD,,")
    files.append((f"{dist}/RECORD", ("\n".join(record) + "\n").encode(), False))
    tmp = a.out + ".tmp"
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for name, data, executable in files:
            info = zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, 0))  # reproducible
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = (0o100755 if executable else 0o100644) << 16
            z.writestr(info, data)
    os.replace(tmp, a.out)


if __name__ == "__main__":
    main()
