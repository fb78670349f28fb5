#!/usr/bin/env python3
"""docs/code_blocks.py on small fixture pages: each way a page can fail fails, naming the
page and the line, and the right forms pass.

    code_blocks_test.py ROOT     (ROOT: the repository, or the test's runfiles of it)

The fixtures render with ROOT's mkdocs.yml; their `run` blocks run with ROOT's package and
native core (no Python snippet: the page check runs those).
"""
import io
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.abspath(sys.argv.pop(1) if len(sys.argv) > 1 else
                       os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(ROOT, "docs"))
import code_blocks as cb  # noqa: E402

PYTHON = os.environ.get("CODE_BLOCKS_PYTHON", "/usr/bin/python3")


class CodeBlocksTest(unittest.TestCase):
    def setUp(self):
        self.root = tempfile.mkdtemp(prefix="fixture-", dir=os.environ.get("TEST_TMPDIR"))
        shutil.copy(os.path.join(ROOT, "mkdocs.yml"), self.root)
        os.makedirs(os.path.join(self.root, "docs"))
        for name in ("python", "bazel-bin"):  # the package and its core, for `run` blocks
            if os.path.isdir(os.path.join(ROOT, name)):
                os.symlink(os.path.join(ROOT, name), os.path.join(self.root, name))

    def tearDown(self):
        shutil.rmtree(self.root, ignore_errors=True)

    def check(self, page, run=False, files=None):
        """The errors of docs/page.md with this text (and other files beside it)."""
        for name, text in dict(files or {}, **{"docs/page.md": page}).items():
            with open(os.path.join(self.root, name), "w") as f:
                f.write(text)
        out = io.StringIO()
        errors = cb.check(self.root, ["docs/page.md"], run=run, python=PYTHON, out=out)
        self.output = out.getvalue()
        return errors

    def assertFailsWith(self, errors, *parts):
        self.assertEqual(len(errors), 1, errors)
        for part in parts:
            self.assertIn(part, errors[0])

    # ---- markers ----
    def test_an_unmarked_block_fails_naming_page_line_and_the_four_markers(self):
        errors = self.check("# Page\n\nSome text:\n\n    echo hello\n")
        self.assertFailsWith(errors, "docs/page.md:5: a code block with no marker",
                             "<!-- code: run -->", "<!-- code: tested-by PATH -->",
                             "<!-- code: not run: REASON -->", "<!-- code: text -->")
        # Fenced blocks too, with or without a language, wherever mkdocs renders one.
        self.assertEqual(len(self.check("```python\nprint(1)\n```\n\n```\nls\n```\n")), 2)
        self.assertFailsWith(self.check("!!! note\n    A note.\n\n        echo in a note\n"),
                             "docs/page.md:4")

    def test_text_blocks_need_no_command(self):
        self.assertEqual(self.check("```text\nx = y + 1\n```\n"), [])
        self.assertEqual(self.check("Text.\n\n<!-- code: text -->\n    a/\n      b.txt\n"), [])
        self.assertEqual(self.check("```text\na\n```\n\n<!-- code: text -->\n    b\n"), [])
        self.assertIn("docs/page.md                 0 / 0 / 0 / 2", self.output)

    def test_not_run_needs_a_reason(self):
        self.assertFailsWith(self.check("<!-- code: not run -->\n    sudo reboot\n"),
                             "docs/page.md:2", "the reason is missing")
        self.assertFailsWith(self.check("<!-- code: not run:  -->\n    sudo reboot\n"),
                             "the reason is missing")
        self.assertEqual(self.check("<!-- code: not run: needs root -->\n    sudo reboot\n"), [])

    def test_an_unknown_or_misplaced_marker_fails(self):
        self.assertFailsWith(self.check("<!-- code: runn -->\n    ls\n"), "docs/page.md:2",
                             "unknown marker")
        errors = self.check("<!-- code: run -->\nA paragraph, not a block.\n\n"
                            "<!-- code: text -->\n    x\n")
        self.assertFailsWith(errors, "docs/page.md:1", "stands before no code block")
        self.assertFailsWith(self.check("<!-- code: run -->\n```text\nx\n```\n"),
                             "a ```text block marked `run`")

    # ---- tested-by ----
    def test_a_tested_by_claim_that_does_not_hold_fails(self):
        ci = "#!/bin/bash\n# bash deploy/test.sh   (only in a comment)\nbash deploy/other.sh\n"
        page = "<!-- code: tested-by ci.sh -->\n    bash deploy/test.sh   # every test\n"
        self.assertFailsWith(self.check(page, files={"ci.sh": ci}), "docs/page.md:2",
                             "tested-by ci.sh: `bash deploy/test.sh` is not a command there")
        self.assertFailsWith(self.check(page.replace("ci.sh", "missing.sh")),
                             "tested-by missing.sh: no such file")
        # Whitespace aside, inside a longer command line: it holds.
        ci = "#!/bin/bash\nset -e\nexec   bash  deploy/test.sh \"$@\"\n"
        self.assertEqual(self.check(page, files={"ci.sh": ci}), [])
        # Not a prefix of a longer word.
        ci = "bash deploy/test.sh.orig\n"
        self.assertEqual(len(self.check(page, files={"ci.sh": ci})), 1)

    # ---- run ----
    def test_a_run_block_that_fails_fails_with_its_output(self):
        page = "<!-- code: run -->\n    echo before the failure\n    exit 3\n    echo never\n"
        errors = self.check(page, run=True)
        self.assertFailsWith(errors, "docs/page.md:2: this shell block failed",
                             "before the failure", "(exit 3)")
        self.assertNotIn("never\n", errors[0].split("output")[1])
        self.assertEqual(self.check("<!-- code: run -->\n    echo fine\n    true\n", run=True), [])

    def test_a_run_block_that_hangs_fails_and_leaves_nothing_behind(self):
        timeout, cb.TIMEOUT_S = cb.TIMEOUT_S, 2
        try:
            page = "<!-- code: run -->\n    (sleep 300; touch late) & echo started; sleep 300\n"
            errors = self.check(page, run=True)
        finally:
            cb.TIMEOUT_S = timeout
        self.assertFailsWith(errors, "docs/page.md:2", "started", "(timed out after 2 s)")
        gone = subprocess.run(["pgrep", "-f", "sleep 300; touch late"], capture_output=True)
        self.assertNotEqual(gone.returncode, 0, gone.stdout)

    def test_a_job_config_with_a_wrong_key_fails(self):
        good = '{"steps": 10, "onebit": {"workers": 2, "exchange": {"mode": "peer"}}}'
        self.assertEqual(self.check("<!-- code: run -->\n    " + good + "\n", run=True), [])
        errors = self.check("<!-- code: run -->\n    " + good.replace("workers", "workerz") + "\n",
                            run=True)
        self.assertFailsWith(errors, "docs/page.md:2: this config block failed",
                             "onebit.workerz: unknown key")
        # A fragment, put into the page's last whole config above, at its `at` path.
        page = ("<!-- code: run -->\n    " + good + "\n\nThen:\n\n<!-- code: run at onebit -->\n"
                '    "exchange": {"mode": "ps", "servers": 2, "colour": "red"}\n')
        self.assertFailsWith(self.check(page, run=True), "docs/page.md:7",
                             "onebit.exchange.colour: unknown key")
        # `{...,` keeps the rest; a `...` value is a fresh directory.
        page = ("<!-- code: run -->\n"
                '    "onebit": {..., "checkpoint": {"dir": ..., "every_steps": 5}}\n')
        self.assertEqual(self.check(page, run=True), [])
        self.assertFailsWith(self.check(page.replace("every_steps", "every_step"), run=True),
                             "onebit.checkpoint.every_step: unknown key")

    def test_a_wrong_key_in_a_command_comment_fails(self):
        page = ('<!-- code: run -->\n'
                '    true    # with "onebit": {"checkpoint": {"dir": ...}}, it resumes\n')
        self.assertEqual(self.check(page, run=True), [])
        self.assertFailsWith(self.check(page.replace('"checkpoint"', '"checkpoints"'), run=True),
                             "docs/page.md:2", "onebit.checkpoints: unknown key")

    def test_a_python_block_that_is_not_python_fails(self):
        page = "<!-- code: run -->\n```python\nopt = ot.OneBitAdam(model.parameters(), lr=\n```\n"
        self.assertFailsWith(self.check(page, run=True), "docs/page.md:3: this python block",
                             "not Python")

    def test_a_python_block_whose_job_fails_fails_even_at_exit_0(self):
        # The prelude's job.json has 6 steps; the loop stops after 2: the job fails at the
        # script's exit, which onebit's script survives with exit 0.
        page = ("<!-- code: run -->\n```python\n"
                'opt = ot.OneBitAdam(model.parameters(), lr=1e-3, config="job.json")\n'
                "for step in range(1, 3):\n    x, y = batch_of(step)\n    ...\n```\n")
        self.assertFailsWith(self.check(page, run=True), "docs/page.md:3: this python block",
                             "the training loop is shorter than the job")

    def test_train_py_is_the_python_block_above(self):
        page = "<!-- code: run -->\n    python3 train.py\n"
        self.assertFailsWith(self.check(page, run=True), "train.py: no python `run` block above")

    def test_bazel_runs_only_built_targets(self):
        page = "<!-- code: run -->\n    bazel build //...\n"
        self.assertFailsWith(self.check(page, run=True), "bazel stand-in: only")


if __name__ == "__main__":
    unittest.main(verbosity=2)
