"""docs/prose_check.py on pages made for it: what counts as a sentence, and the budget."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import prose_check  # noqa: E402

LONG = " ".join(["word"] * 41) + "."


class ProseCheckTest(unittest.TestCase):
    def test_only_prose_counts(self):
        units = prose_check.prose_units(
            "# A heading of many words " + LONG + "\n\n"
            "Short one. Another short one, e.g. this.\n\n"
            "```\n" + LONG + "\n```\n\n"
            "| " + LONG + " |\n\n"
            "- an item\n- " + LONG + "\n")
        lengths = [len(prose_check.words(s)) for u in units for s in prose_check.sentences(u)]
        self.assertEqual(lengths, [2, 5, 2, 41])  # "e.g." ends no sentence

    def run_check(self, page, budget):
        root = tempfile.mkdtemp(prefix="prose-")
        os.makedirs(os.path.join(root, "docs"))
        with open(os.path.join(root, "docs", "page.md"), "w") as f:
            f.write(page)
        if budget is not None:
            with open(os.path.join(root, prose_check.BUDGET), "w") as f:
                json.dump({"docs/page.md": budget}, f)
        return subprocess.run([sys.executable, os.path.join(HERE, "prose_check.py"), root],
                              capture_output=True, text=True)

    def test_a_sentence_over_forty_words_fails_unless_budgeted(self):
        r = self.run_check("Fine. " + LONG + "\n", None)
        self.assertEqual(r.returncode, 1, r.stdout)
        self.assertIn("FAIL: docs/page.md: 1 sentences over 40 words (budget 0)", r.stdout)
        self.assertEqual(self.run_check("Fine. " + LONG + "\n", 1).returncode, 0)
        r = self.run_check("Fine.\n", 1)
        self.assertEqual(r.returncode, 0)
        self.assertIn("lower the budget", r.stdout)


if __name__ == "__main__":
    unittest.main()
