"""tools/refs_check.py on small git trees made for it: a missing file fails; files,
folders, Bazel targets, placeholders, outputs and includes pass."""
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import refs_check  # noqa: E402


def tree(files):
    root = tempfile.mkdtemp(prefix="refs-")
    for name, text in files.items():
        path = os.path.join(root, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
    subprocess.run(["git", "init", "-q", root], check=True)
    subprocess.run(["git", "-C", root, "add", "-A"], check=True)
    return root


class RefsCheckTest(unittest.TestCase):
    def test_what_passes(self):
        root = tree({
            "README.md": "See docs/page.md, docs/, CHANGES.md and lib/tool (a target).\n",
            "CHANGES.md": "x\n",
            "docs/page.md": "Results in lib/out/run.json and lib/corpus/TARGET; "
                            "recorded in lib/results/day/run7_.\n",
            "lib/BUILD": 'cc_binary(name = "tool")\n',
            "lib/results/day/run7_a.log": "mentions lib/gone.h, which is history\n",
            "lib/a.cc": '#include "lib/generated.pb.h"\n// see https://x.org/lib/none.h\n',
        })
        self.assertEqual(refs_check.missing_references(root), [])

    def test_a_missing_file_or_page_fails(self):
        root = tree({
            "README.md": "The contract is ALGORITHM.md; the layout is lib/layout.h.\n",
            "lib/a.h": "// lib/gone.h has it\n",
        })
        found = refs_check.missing_references(root)
        self.assertEqual(sorted(found), [("README.md", 1, "ALGORITHM.md"),
                                         ("README.md", 1, "lib/layout.h"),
                                         ("lib/a.h", 1, "lib/gone.h")])
        r = subprocess.run([sys.executable, os.path.join(HERE, "refs_check.py"), root],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 1)
        self.assertIn("lib/a.h:1: lib/gone.h: no such file", r.stdout)


if __name__ == "__main__":
    unittest.main()
