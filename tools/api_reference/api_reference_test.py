"""api_reference.py's own test, on small packages written here: what it prints, and that it
fails, naming the item, where a docstring leaves an argument out, describes one that does
not exist, or disagrees with docs/config.md; and --check on a reference that drifted."""
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

GENERATOR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "api_reference.py")

GOOD = '''
    """A fixture package.

    Its second paragraph is not in the summary.
    """
    __all__ = ["add", "Counter"]


    def add(a, b=1):
        """a + b.

        Args:
            a: The first number.
            b: The second
                number, on two lines.

        Returns:
            The sum.
        """
        return a + b


    class Counter:
        """Counts.

        Args:
            start: Where it starts.
        """

        def __init__(self, start=0):
            self.n = start

        def bump(self, by=1):
            """Adds to the count.

            Args:
                by: How much.
            """
            self.n += by
'''

# A module with _KEYWORDS, as onebit.torch has, and the config reference it is checked
# against (docs/config.md's optimizer.params table).
KEYWORDS = '''
    """Optimizers."""
    import collections
    __all__ = ["Fast", "Slow"]
    _Keyword = collections.namedtuple("_Keyword", "default meaning config_default",
                                      defaults=(None,))
    _KEYWORDS = {"lr": _Keyword(0.5, "The step size."),
                 "clip": _Keyword(2.0, "The bound.")}


    class _Base:
        """The shared part.

        Args:
            params: What it trains.
            **hyper: The type's own.
        """
        _own = ()

        def __init__(self, params, lr=None, **hyper):
            pass


    class Fast(_Base):
        """Fast."""
        _own = ("clip",)


    class Slow(_Base):
        """Slow."""
'''
CONFIG_MD = """
## `optimizer.params`

| Key | Type | Types | Default | Allowed | Meaning |
|---|---|---|---|---|---|
| `clip` | number | Fast | `{clip}` | `[0, 1]` | The bound. |
| `lr` | number | all | `0.5` | `[0, 1]` | The step size. |
"""


class ApiReferenceTest(unittest.TestCase):
    def generate(self, module_text, *args, config_md=None, modules=None):
        """Runs the generator on package `fixture` with module_text as its __init__.py and
        `modules` ({name: text}) beside it: (exit code, stdout, stderr)."""
        tmp = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
        os.makedirs(os.path.join(tmp, "fixture"))
        for name, text in dict(modules or {}, __init__=module_text).items():
            with open(os.path.join(tmp, "fixture", name + ".py"), "w") as f:
                f.write(textwrap.dedent(text))
        config = os.path.join(tmp, "config.md")
        with open(config, "w") as f:
            f.write(config_md or "")
        p = subprocess.run([sys.executable, GENERATOR, "--package", "fixture", "--path", tmp,
                            "--config_md", config, *args], capture_output=True, text=True)
        return p.returncode, p.stdout, p.stderr

    def test_a_documented_package(self):
        code, out, err = self.generate(GOOD)
        self.assertEqual(code, 0, err)
        self.assertIn("## fixture\n\nA fixture package.\n\n", out)
        self.assertNotIn("second paragraph", out)
        self.assertIn("```python\nadd(a, b=1)\n```", out)
        self.assertIn("| `a` | required | The first number. |", out)
        self.assertIn("| `b` | `1` | The second number, on two lines. |", out)
        self.assertIn("**Returns:** The sum.", out)
        self.assertIn("```python\nCounter(start=0)\n```", out)
        self.assertIn("| `start` | `0` | Where it starts. |", out)
        self.assertIn("#### bump\n\n```python\nbump(by=1)\n```", out)

    def test_an_undocumented_argument_fails_naming_it(self):
        code, out, err = self.generate(GOOD.replace("            b: The second\n"
                                                    "                number, on two lines.\n",
                                                    ""))
        self.assertEqual(code, 1)
        self.assertEqual(out, "")
        self.assertIn("FAIL: fixture.add: argument `b` has no description in the docstring's "
                      "Args: section", err)

    def test_an_undocumented_method_argument_fails_naming_it(self):
        code, _, err = self.generate(GOOD.replace("def bump(self, by=1):",
                                                  "def bump(self, by=1, twice=False):"))
        self.assertEqual(code, 1)
        self.assertIn("FAIL: fixture.Counter.bump: argument `twice` has no description", err)

    def test_a_described_argument_that_does_not_exist_fails(self):
        code, _, err = self.generate(GOOD.replace("def add(a, b=1):", "def add(a):"))
        self.assertEqual(code, 1)
        self.assertIn("FAIL: fixture.add: the docstring's Args: describes `b`, which the "
                      "signature (a) does not have", err)

    def test_a_public_function_without_a_docstring_fails(self):
        helper = "\n\n    def helper():\n        pass\n"
        code, _, err = self.generate(GOOD + helper)
        self.assertEqual(code, 0, err)  # not in __all__: not public
        code, _, err = self.generate(GOOD.replace('__all__ = ["add", "Counter"]',
                                                  '__all__ = ["add", "Counter", "helper"]')
                                     + helper)
        self.assertEqual(code, 1)
        self.assertIn("FAIL: fixture.helper: has no docstring", err)

    def test_check_passes_on_the_same_text_and_fails_on_a_drift(self):
        code, out, err = self.generate(GOOD)
        self.assertEqual(code, 0, err)
        path = os.path.join(tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR")), "api.md")
        with open(path, "w") as f:
            f.write(out)
        code, _, err = self.generate(GOOD, "--check", path)
        self.assertEqual(code, 0, err)
        with open(path, "w") as f:
            f.write(out.replace("The first number.", "The first number, edited by hand."))
        code, _, err = self.generate(GOOD, "--check", path)
        self.assertEqual(code, 1)
        self.assertIn("-| `a` | required | The first number, edited by hand. |", err)
        self.assertIn("Regenerate it: python3 tools/api_reference/api_reference.py > "
                      "docs/api.md", err)

    def test_keywords_agree_with_the_config_reference(self):
        code, out, err = self.generate(KEYWORDS, config_md=CONFIG_MD.format(clip="2"))
        self.assertEqual(code, 0, err)
        self.assertIn("### Common to Fast, Slow", out)
        self.assertIn("| `lr` | `0.5` | The step size. |", out)  # the constructor's
        self.assertIn("| `clip` | `2.0` | The bound. |", out)   # Fast's own
        self.assertIn("| `**hyper` |  | The type's own. |", out)

    def test_a_private_base_in_a_private_module_is_shared(self):
        # As onebit.torch's optimizers and their _OnebitOptimizer in onebit/_optimizer.py.
        start = KEYWORDS.index("    class _Base:")
        end = KEYWORDS.index("    class Fast(_Base):")
        base = '    """The base."""\n' + KEYWORDS[start:end]
        code, out, err = self.generate(
            KEYWORDS[:start] + "    from fixture._base import _Base\n\n\n" + KEYWORDS[end:],
            config_md=CONFIG_MD.format(clip="2"), modules={"_base": base})
        self.assertEqual(code, 0, err)
        self.assertIn("### Common to Fast, Slow", out)
        self.assertIn("| `clip` | `2.0` | The bound. |", out)

    def test_a_default_or_a_type_that_disagrees_with_the_config_reference_fails(self):
        code, _, err = self.generate(KEYWORDS, config_md=CONFIG_MD.format(clip="3"))
        self.assertEqual(code, 1)
        self.assertIn("FAIL: fixture._KEYWORDS['clip']: default 2.0, docs/config.md's 3", err)
        code, _, err = self.generate(KEYWORDS.replace('_own = ("clip",)', ""),
                                     config_md=CONFIG_MD.format(clip="2"))
        self.assertEqual(code, 1)
        self.assertIn("FAIL: fixture._KEYWORDS['clip']: describes a keyword argument that no "
                      "optimizer takes", err)
        self.assertIn("taken by none; docs/config.md's Types say Fast", err)


if __name__ == "__main__":
    unittest.main(verbosity=2)
