#!/usr/bin/env python3
"""Every code block of README.md and docs/*.md, found as the site renders it, either runs or
says why not.

A block is each <pre> of a page rendered with Python-Markdown and the extensions of
mkdocs.yml, as mkdocs renders it. The HTML comment right before it in the Markdown is its
marker (a blank line between the two is fine):

    <!-- code: run -->               this check runs it (below: what running means)
    <!-- code: run at onebit -->     a job config fragment whose keys sit at that path
    <!-- code: tested-by PATH -->    PATH (a test or CI script) runs each of its command
                                     lines, verbatim: checked here
    <!-- code: not run: REASON -->   not run, for the reason given (a GPU, a cluster, root,
                                     a long run, a placeholder only the reader can fill)
    <!-- code: text -->              not a command or a script: a formula, sample output,
                                     a file tree; a ```text fence says the same

A block with no marker, a marker with no block right after it, an unknown marker or a
`not run` without a reason fails, naming the page and the line.

How a `run` block runs (with --run; in //docs:code_blocks_test), by its kind:

- python (a ```python fence): the page's snippet as a script, after PRELUDE (the names the
  snippets take from the script around them: data, model, loss_fn, batch_of, ...) and
  before POSTLUDE (an optimizer the snippet built but never stepped trains a few steps, so
  that its job runs), as a 2-rank job under `python3 -m onebit.run` (onebit-run, onebit's
  torchrun stand-in), in an empty directory holding job.json (JOB_JSON). A line that is
  only `...` stands for the rest of the quick start's step (STEP). A job that says it
  failed fails the block even where the process exits 0 (JOB_FAILED).
- config (text starting with `{`, or a `"key": ...` fragment): a job config, loaded by
  onebit's own C++ parser through the package (onebit._native.check_config), so that an
  unknown key or a bad value fails. A fragment goes into the page's last whole config
  above it (none: an empty one), at the marker's `at` path; each object of it replaces
  the one in its place, except an object with `...` ("the rest": `{...,` or `, ...}`),
  which adds to it. A `...` value becomes the path of a fresh directory.
- shell (anything else): each command line with `bash -euo pipefail -c`, in a fresh copy
  of the files the test has (docs/BUILD's data; the repository's files when run from a
  checkout), with these stand-ins first on PATH: `python3` (the interpreter with torch,
  the package on PYTHONPATH), `onebit-run` (python3 -m onebit.run, on a free port unless
  the line gives one), `torchrun` (as onebit-run: Debian 12's torchrun fails at start, as
  README.md says), and `bazel` (only `bazel run //PKG:NAME -- ARGS`: the built target).
  Also:
    * train.py is the page's last python `run` block above, as that block runs;
    * a line's trailing `...` is the previous line's arguments;
    * a job config fragment in a line's comment (`# with "onebit": {"checkpoint": ...}`)
      is checked by the parser, then is that line's job config ($ONEBIT_CONFIG), so
      that a wrong key there fails.
Identical runs (README.md's quick start and docs/pytorch.md's) run once.

Usage: code_blocks.py ROOT [--run] [--python PY] [--page PAGE ...] [--only PAGE:LINE]
ROOT is the repository (or the test's runfiles); the pages are README.md and docs/*.md but
the generated docs/api.md and docs/config.md, which their own tests check
(//tools/api_reference:api_reference_test, //config:config_reference_test). BENCHMARKS.md
is left out while it is being rewritten; add it to PAGES when it settles.
"""
import argparse
import ast
import glob
import html.parser
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

# The pages checked: README.md and docs/*.md, but the generated ones. BENCHMARKS.md is left
# out for now (being rewritten); add it here when it settles.
PAGES = ["README.md", "docs/*.md"]
GENERATED = {"docs/api.md", "docs/config.md"}

MARKER = re.compile(r"^code\s*:\s*(.*)$", re.S)
TEXT_FENCES = {"text"}
MARKERS_HELP = ("put one of <!-- code: run -->, <!-- code: tested-by PATH -->, "
                "<!-- code: not run: REASON --> or <!-- code: text --> on the line before it "
                "(or fence a text block as ```text); docs/code_blocks.py says what each means")

# ---- Finding the blocks ----


class Block:
    """One code block of a page: its text, where it is, its marker and what that says."""

    def __init__(self, page, text, marker, marker_line=None):
        self.page = page
        self.text = text
        self.marker = marker  # the comment's text after "code:", or None
        self.marker_line = marker_line
        self.line = 0  # of its first line in the Markdown
        self.fence = None  # the fence's language ("" for a bare fence; None: indented)
        self.status = None  # run, tested-by, not run, text
        self.arg = ""  # the path of `run at` and `tested-by`, or the reason of `not run`
        self.kind = None  # python, config or shell, for `run`

    @property
    def where(self):
        return f"{self.page}:{self.line}"


class _Walker(html.parser.HTMLParser):
    """The <pre> blocks of rendered HTML, each with the `code:` comment right before it.

    Between the comment and the block only whitespace and the highlighter's wrapper
    (<div class="... highlight">) may stand; anything else leaves the comment orphaned."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.blocks = []  # (marker text or None, code text)
        self.orphans = []  # markers that stand before no block
        self._pending = None
        self._in_pre = False
        self._text = []

    def _orphan(self):
        if self._pending is not None:
            self.orphans.append(self._pending)
            self._pending = None

    def handle_comment(self, data):
        if self._in_pre:
            return
        m = MARKER.match(data.strip())
        if m:
            self._orphan()
            self._pending = m.group(1).strip()

    def handle_starttag(self, tag, attrs):
        if self._in_pre:
            return
        if tag == "pre":
            self._in_pre, self._text = True, []
        elif not (tag == "div" and "highlight" in (dict(attrs).get("class") or "").split()):
            self._orphan()

    def handle_endtag(self, tag):
        if tag == "pre" and self._in_pre:
            self._in_pre = False
            self.blocks.append((self._pending, "".join(self._text)))
            self._pending = None
        elif not self._in_pre and tag != "div":
            self._orphan()

    def handle_data(self, data):
        if self._in_pre:
            self._text.append(data)
        elif data.strip():
            self._orphan()

    def close(self):
        super().close()
        self._orphan()


def markdown_renderer(root):
    """A Markdown converter with mkdocs.yml's extensions and their settings. The highlighter
    also tags each block with its language (pygments_lang_class), which changes no block."""
    import markdown  # the docs venv's (python/envs/docs.txt)
    import yaml

    class _Loader(yaml.SafeLoader):
        pass

    # mkdocs.yml may hold the Python tags of mkdocs' own YAML loader: none matter here.
    _Loader.add_multi_constructor("tag:yaml.org,2002:python/", lambda *a: None)
    _Loader.add_multi_constructor("!", lambda *a: None)
    with open(os.path.join(root, "mkdocs.yml")) as f:
        config = yaml.load(f, Loader=_Loader)
    names, settings = [], {}
    for entry in config.get("markdown_extensions") or []:
        if isinstance(entry, dict):
            for name, value in entry.items():
                names.append(name)
                settings[name] = dict(value or {})
        else:
            names.append(entry)
    if "pymdownx.snippets" in settings:
        # Its paths are relative to where mkdocs runs: the repository's root.
        settings["pymdownx.snippets"]["base_path"] = [
            os.path.join(root, p) for p in settings["pymdownx.snippets"].get("base_path", ["."])]
    return lambda: markdown.Markdown(extensions=names, extension_configs=settings)


def _first_line_index(lines, text, start):
    """The index in `lines` (the page) of the block's first line, searching from `start`."""
    code = text.split("\n")
    lead = 0
    while lead < len(code) and not code[lead].strip():
        lead += 1
    if lead == len(code):
        return None, 0
    want = code[lead].strip()
    for i in range(start, len(lines)):
        if lines[i].strip() == want:
            return i, lead
    return None, lead


def page_blocks(root, page, renderer):
    """The page's code blocks in order, and its errors (orphaned markers, lost blocks)."""
    with open(os.path.join(root, page), encoding="utf-8") as f:
        source = f.read()
    walker = _Walker()
    walker.feed(renderer().convert(source))
    walker.close()
    lines = source.split("\n")
    errors, blocks, cursor = [], [], 0
    marker_lines = {}
    for i, line in enumerate(lines):
        for m in re.finditer(r"<!--(.*?)-->", line):
            mm = MARKER.match(m.group(1).strip())
            if mm:
                marker_lines.setdefault(mm.group(1).strip(), []).append(i + 1)
    for marker in walker.orphans:
        where = marker_lines.get(marker, ["?"])[0]
        errors.append(f"{page}:{where}: the marker <!-- code: {marker} --> stands before no "
                      "code block: put it on the line right before the block it marks")
    for marker, text in walker.blocks:
        text = text[:-1] if text.endswith("\n") else text
        b = Block(page, text, marker)
        i, lead = _first_line_index(lines, text, cursor)
        if i is None:
            errors.append(f"{page}: a code block not found in the Markdown: {text[:60]!r}")
            continue
        b.line, cursor = i + 1, i + 1
        fence = lines[i - lead - 1].strip() if i - lead - 1 >= 0 else ""
        m = re.match(r"^(`{3,}|~{3,})\s*\{?\s*\.?([\w+-]*)", fence)
        b.fence = m.group(2).lower() if m else None
        if marker is not None:
            above = [n for n in marker_lines.get(marker, []) if n < b.line]
            b.marker_line = above[-1] if above else None
        blocks.append(b)
    return blocks, errors


def pages(root):
    """The pages checked, relative to root, README.md first."""
    found = []
    for pattern in PAGES:
        found += sorted(os.path.relpath(p, root) for p in glob.glob(os.path.join(root, pattern)))
    return [p for p in found if p not in GENERATED]


# ---- Classifying ----


def classify(b):
    """Sets the block's status, arg and kind from its marker; returns the errors."""
    if b.marker is None:
        if b.fence in TEXT_FENCES:
            b.status = "text"
            return []
        return [f"{b.where}: a code block with no marker ({b.text.splitlines()[0][:50]!r}): "
                + MARKERS_HELP]
    m = b.marker
    if m == "text":
        b.status = "text"
    elif m == "run" or m.startswith("run "):
        b.status = "run"
        rest = m[3:].strip()
        if rest:
            at = re.fullmatch(r"at\s+([A-Za-z_][\w.]*)", rest)
            if not at:
                return [f"{b.where}: <!-- code: {m} -->: after `run` only `at PATH` (a config "
                        "fragment's place in the job config) may follow"]
            b.arg = at.group(1)
        b.kind = block_kind(b)
        if b.arg and b.kind != "config":
            return [f"{b.where}: <!-- code: {m} -->: `at` is for a job config fragment, and "
                    "this block is not one"]
    elif m.startswith("tested-by"):
        b.status, b.arg = "tested-by", m[len("tested-by"):].strip()
        if not b.arg or " " in b.arg:
            return [f"{b.where}: <!-- code: {m} -->: name one file, the test or CI script "
                    "that runs this block (tested-by PATH)"]
    elif m.startswith("not run"):
        b.status = "not run"
        reason = re.match(r"not run\s*:?\s*(.*)$", m, re.S).group(1).strip()
        if not reason:
            return [f"{b.where}: <!-- code: not run: REASON -->: the reason is missing (a GPU, "
                    "a cluster, root, a long run, ...)"]
        b.arg = " ".join(reason.split())
    else:
        return [f"{b.where}: unknown marker <!-- code: {m} -->: " + MARKERS_HELP]
    if b.fence in TEXT_FENCES and b.status != "text":
        return [f"{b.where}: a ```text block marked `{b.status}`: a text block is not run"]
    return []


def block_kind(b):
    if b.fence in ("python", "py"):
        return "python"
    if b.fence in ("json", "jsonc"):
        return "config"
    if b.fence in ("bash", "sh", "shell", "console"):
        return "shell"
    if b.text.lstrip().startswith(("{", '"')):
        return "config"
    return "shell"


# ---- Shell lines ----


def strip_comment(line):
    """A shell line without its comment (a # at the start or after a blank, outside quotes),
    and the comment."""
    quote = None
    for i, c in enumerate(line):
        if quote:
            if c == quote:
                quote = None
            elif c == "\\" and quote == '"':
                continue
        elif c in "'\"":
            quote = c
        elif c == "#" and (i == 0 or line[i - 1] in " \t"):
            return line[:i].rstrip(), line[i + 1:]
    return line.rstrip(), ""


def command_lines(text):
    """The block's commands: continuation lines joined, comments taken off. Each is
    (command, comment), where comment gathers the comments of the command's lines and of
    the comment-only lines after it."""
    out = []
    pending = ""
    for raw in text.split("\n"):
        command, comment = strip_comment(raw)
        if pending:
            command = pending + " " + command.strip()
            pending = ""
        if command.endswith("\\"):
            pending = command[:-1].rstrip()
            if comment and out:
                out[-1] = (out[-1][0], out[-1][1] + " " + comment)
            continue
        if command.strip():
            out.append((" ".join(command.split()), comment))
        elif comment and out:
            out[-1] = (out[-1][0], out[-1][1] + " " + comment)
    if pending:
        out.append((" ".join(pending.split()), ""))
    return out


def check_tested_by(b, root):
    """Each command line of the block appears, whitespace aside, in a command (not a
    comment) of the file the marker names."""
    path = os.path.join(root, b.arg)
    if not os.path.isfile(path):
        return [f"{b.where}: tested-by {b.arg}: no such file (in a Bazel test, add it to the "
                "data of //docs:code_blocks_test)"]
    with open(path, encoding="utf-8", errors="replace") as f:
        theirs = [c for c, _ in command_lines(f.read())]
    errors = []
    for command, _ in command_lines(b.text):
        pattern = re.compile(r"(?:^|(?<=[\s;&|(]))" + re.escape(command) + r"(?=$|[\s;&|)])")
        if not any(pattern.search(line) for line in theirs):
            errors.append(f"{b.where}: tested-by {b.arg}: `{command}` is not a command there: "
                          "the claim does not hold (run it there, or mark the block otherwise)")
    return errors


# ---- Running ----

# The names the pages' Python snippets take from the script around them: a tiny synthetic
# classification job. Every rank builds the same model (the seed); `model` is also `bert`,
# whose position embeddings (512 of them) the momentum-mask snippet masks past 128.
PRELUDE = '''\
import types
import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
import onebit.torch as ot

torch.manual_seed(0)
data = TensorDataset(torch.randn(512, 8), torch.randint(0, 2, (512,)))


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embeddings = types.SimpleNamespace()
        self.position_embeddings = torch.nn.Embedding(512, 8)
        self.embeddings.position_embeddings = self.position_embeddings
        self.mlp = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                       torch.nn.Linear(16, 2))

    def forward(self, x):  # positions 0..127 only, as BERT's first phase
        return self.mlp(x + self.position_embeddings.weight[:128].mean(0))


model = bert = Model()
other_params = list(model.mlp.parameters())
loss_fn = torch.nn.CrossEntropyLoss()
steps = ot.load_config("job.json")["steps"]


def batch_of(step):
    g = torch.Generator().manual_seed(1000 * step + ot.rank())
    return torch.randn(64, 8, generator=g), torch.randint(0, 2, (64,), generator=g)

# ---- the page's block ----
'''

# A line of only `...` in a snippet: the quick start's step, on its x and y.
STEP = "opt.zero_grad(); loss = loss_fn(model(x), y); loss.backward(); opt.step(loss=loss)"

# An optimizer the snippet built but never stepped: its job (open-ended) runs a few steps,
# since a job whose script ends before its first step fails.
POSTLUDE = '''
# ---- after the block ----
if isinstance(globals().get("opt"), torch.optim.Optimizer) and opt.next_step == 1:
    for step in range(1, 4):
        x, y = batch_of(step)
        opt.zero_grad(); loss = loss_fn(model(x), y); loss.backward(); opt.step(loss=loss)
'''

# job.json beside the snippet (the checkpoint snippet's config="job.json").
JOB_JSON = {"steps": 6, "onebit": {"checkpoint": {"dir": "checkpoints", "every_steps": 2}}}

RANKS = 2
TIMEOUT_S = 120
# onebit's script exits 0 when its job fails at the script's exit (the worker prints
# "exiting with 78" but the process does not): a job that failed fails the block too.
JOB_FAILED = re.compile(r"onebit-coordinator: job failed|: the job failed")


def python_script(text):
    """The snippet as the script that runs: PRELUDE, the snippet (each `...` line as STEP),
    POSTLUDE. A SyntaxError is the block's failure."""
    lines = []
    for line in text.split("\n"):
        if line.strip() == "...":
            line = line[: len(line) - len(line.lstrip())] + STEP
        lines.append(line)
    body = "\n".join(lines)
    ast.parse(body)
    return PRELUDE + body + "\n" + POSTLUDE


# In a parsed fragment: this object has "the rest" (`{...,`): it adds to the base's object
# of its place instead of replacing it.
REST = "\u2026"


def config_fragment(text, fill_dir):
    """A config block's text as a dict: an object with `...` for "the rest" marked REST, a
    `...` value a fresh directory (fill_dir() gives one), a `"key": value` fragment wrapped
    in braces (an object that adds to the config it goes into)."""
    t = text.strip()
    rest = json.dumps(REST, ensure_ascii=False) + ": true"
    t = re.sub(r"\{\s*\.\.\.\s*\}", "{" + rest + "}", t)
    t = re.sub(r"\{\s*\.\.\.\s*,", "{" + rest + ",", t)
    t = re.sub(r",\s*\.\.\.\s*(?=})", ", " + rest, t)
    t = re.sub(r"(?<=:)\s*\.\.\.", lambda m: " " + json.dumps(fill_dir()), t)
    if t.startswith('"'):
        t = "{" + rest + ", " + t + "}"
    return json.loads(t)


def place(fragment, at):
    """The fragment at a dotted path (onebit.exchange), each level adding to the base's."""
    for key in reversed(at.split(".") if at else []):
        fragment = {REST: True, key: fragment}
    return fragment


def merge(base, extra):
    """extra put into base: an object of extra marked REST adds to base's object of its
    place; any other value (an object too) replaces base's. No REST mark is left."""
    if not (isinstance(extra, dict) and extra.get(REST)):
        return unmark(extra)
    out = dict(base) if isinstance(base, dict) else {}
    for k, v in extra.items():
        if k != REST:
            out[k] = merge(out.get(k), v)
    return out


def unmark(value):
    if isinstance(value, dict):
        return {k: unmark(v) for k, v in value.items() if k != REST}
    if isinstance(value, list):
        return [unmark(v) for v in value]
    return value


def fragments_in(comment):
    """The job config fragments in a comment: `"key": {...}` with balanced braces."""
    found, end = [], 0
    for m in re.finditer(r'"[\w.-]+"\s*:\s*\{', comment):
        if m.start() < end:
            continue  # inside the last one
        depth = 0
        for j in range(m.end() - 1, len(comment)):
            depth += {"{": 1, "}": -1}.get(comment[j], 0)
            if depth == 0:
                found.append(comment[m.start(): j + 1])
                end = j + 1
                break
    return found


class Runner:
    """Runs `run` blocks (see the module's docstring) and remembers identical runs."""

    def __init__(self, root, python, work):
        self.root = root
        self.python = python
        self.work = work
        self.done = {}  # what ran -> (ok, output, where it first ran)
        self.count = 0
        bin_root = os.path.join(root, "bazel-bin")
        self.bin_root = bin_root if os.path.isdir(bin_root) else root
        paths = [os.path.join(root, "python"), os.path.join(self.bin_root, "python")]
        self.pythonpath = os.pathsep.join(dict.fromkeys(p for p in paths if os.path.isdir(p)))
        self.standins = os.path.join(work, "bin")
        os.makedirs(self.standins, exist_ok=True)
        self._write_standins()

    def _write_standins(self):
        scripts = {
            "python3": f'exec {self.python} "$@"\n',
            # A free port unless the line gives one (tests run side by side).
            "onebit-run": f'exec {self.python} -m onebit.run --master_port=0 "$@"\n',
            # Debian 12's torchrun fails at start (README.md): onebit-run takes its flags.
            "torchrun": f'exec {self.python} -m onebit.run --master_port=0 "$@"\n',
            "bazel": (
                '# `bazel run //PKG:NAME -- ARGS` as the built target; no Bazel inside a test.\n'
                'if [ "${1:-}" = run ] && [[ "${2:-}" == //*:* ]]; then\n'
                '  t=${2#//}; shift 2; [ "${1:-}" = -- ] && shift\n'
                f'  exe="{self.bin_root}/${{t%%:*}}/${{t#*:}}"\n'
                '  [ -x "$exe" ] || { echo "bazel stand-in: //$t is not in the data of'
                ' //docs:code_blocks_test" >&2; exit 127; }\n'
                '  BUILD_WORKING_DIRECTORY=$PWD exec "$exe" "$@"\n'
                'fi\n'
                'echo "bazel stand-in: only \\`bazel run //PKG:NAME -- ARGS\\` runs in this '
                'test: mark the block not run or tested-by" >&2\n'
                'exit 127\n'),
        }
        for name, body in scripts.items():
            path = os.path.join(self.standins, name)
            with open(path, "w") as f:
                f.write("#!/usr/bin/env bash\n" + body)
            os.chmod(path, 0o755)

    def env(self, **extra):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("ONEBIT_", "MASTER_"))}
        env.update(PATH=self.standins + os.pathsep + env.get("PATH", "/usr/bin:/bin"),
                   PYTHONPATH=self.pythonpath, OMP_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")
        env.update(extra)
        return env

    def fresh_dir(self, name):
        self.count += 1
        path = os.path.join(self.work, f"{self.count:02d}-{name}")
        os.makedirs(path)
        return path

    def mirror(self, dest):
        """A copy of the test's files to run shell lines in: small files copied, large ones
        (binaries) linked; so that no line writes through into the source tree."""
        for top, dirs, files in os.walk(self.root):
            dirs[:] = [d for d in dirs if not d.startswith((".git", "bazel-", "_"))
                       and not d.endswith(".runfiles") and (top != self.root or d not in (
                           "out", "site", "dist"))]
            rel = os.path.relpath(top, self.root)
            os.makedirs(os.path.join(dest, rel), exist_ok=True)
            for name in files:
                src = os.path.join(top, name)
                dst = os.path.join(dest, rel, name)
                real = os.path.realpath(src)
                if not os.path.isfile(real):
                    continue
                if os.path.getsize(real) < (1 << 20):
                    shutil.copy2(real, dst)
                else:
                    os.symlink(real, dst)

    def _exec(self, key, where, argv, cwd, env):
        """Runs argv once per key: (ok, output, first place it ran or None)."""
        if key in self.done:
            ok, out, first = self.done[key]
            return ok, out, first
        # A session of its own: whatever it started (a job's ranks) ends with it.
        p = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, start_new_session=True)
        try:
            raw, _ = p.communicate(timeout=TIMEOUT_S)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if timed_out:
            raw, _ = p.communicate()
        out = raw.decode(errors="replace")
        ok = p.returncode == 0 and not timed_out
        if timed_out:
            out += f"\n(timed out after {TIMEOUT_S} s)"
        elif ok and JOB_FAILED.search(out):
            ok, out = False, out + "\n(exit 0, but the job failed: the lines above)"
        elif not ok:
            out += f"\n(exit {p.returncode})"
        self.done[key] = (ok, out, where)
        return ok, out, None

    def run(self, b, page_blocks):
        """(ok, what ran, output, first place an identical run ran or None)."""
        if b.kind == "python":
            return self.run_python(b)
        if b.kind == "config":
            return self.run_config(b, page_blocks)
        return self.run_shell(b, page_blocks)

    def _write_job_json(self, cwd):
        job = json.loads(json.dumps(JOB_JSON))
        job["onebit"]["checkpoint"]["dir"] = os.path.join(cwd, "checkpoints")
        with open(os.path.join(cwd, "job.json"), "w") as f:
            json.dump(job, f)

    def run_python(self, b):
        try:
            script = python_script(b.text)
        except SyntaxError as e:
            return False, "python", f"not Python: {e}", None
        cwd = self.fresh_dir("python")
        with open(os.path.join(cwd, "snippet.py"), "w") as f:
            f.write(script)
        self._write_job_json(cwd)
        argv = [self.python, "-m", "onebit.run", f"--nproc_per_node={RANKS}", "--master_port=0",
                "snippet.py"]
        what = f"python3 -m onebit.run --nproc_per_node={RANKS} (the block after the prelude)"
        ok, out, first = self._exec(("python", b.text), b.where, argv, cwd, self.env())
        return ok, what, out, first

    def config_of(self, b, page_blocks, fill_dir):
        """The whole job config the block stands for (see the module's docstring)."""
        cfg = place(config_fragment(b.text, fill_dir), b.arg)
        base = self.base_of(b, page_blocks)
        if base is None:
            return unmark(cfg)
        return merge(unmark(config_fragment(base.text, fill_dir)), cfg)

    @staticmethod
    def base_of(b, page_blocks):
        """The whole config a fragment goes into: the page's last one above it, or None."""
        if b.text.lstrip().startswith("{") and not b.arg:
            return None  # a whole config itself
        base = None
        for other in page_blocks[:page_blocks.index(b)]:
            if (other.status == "run" and other.kind == "config" and not other.arg
                    and other.text.lstrip().startswith("{")):
                base = other
        return base

    def run_config(self, b, page_blocks):
        cwd = self.fresh_dir("config")
        n = [0]

        def fill_dir():
            n[0] += 1
            return os.path.join(cwd, f"dir-{n[0]}")

        try:
            cfg = self.config_of(b, page_blocks, fill_dir)
        except json.JSONDecodeError as e:
            return False, "json", f"not JSON (after `...` and fragments are resolved): {e}", None
        base = self.base_of(b, page_blocks)
        what = ("onebit._native.check_config (the C++ parser) on " + json.dumps(cfg) +
                (f" (the block put into the config of {base.where})" if base else ""))
        ok, out, first = self.check_config(cfg, cwd, b.where)
        return ok, what, out, first

    def check_config(self, cfg, cwd, where, name="job.json"):
        """The config loaded by onebit's C++ parser, through the package."""
        path = os.path.join(cwd, name)
        with open(path, "w") as f:
            json.dump(cfg, f, indent=1)
        code = ("import sys; from onebit import _native\n"
                "try:\n"
                "    notices = _native.check_config(sys.argv[1])\n"
                "except ValueError as e:\n"
                "    sys.exit(f'the C++ parser refused it: {e}')\n"
                "print('config OK' + ''.join('; notice: ' + n for n in notices))\n")
        return self._exec(("config", json.dumps(cfg, sort_keys=True).replace(cwd, "")),
                          where, [self.python, "-c", code, path], cwd, self.env())

    def run_shell(self, b, page_blocks):
        lines = command_lines(b.text)
        if not lines:
            return False, "bash", "no command in the block", None
        cwd = self.fresh_dir("shell")
        self.mirror(cwd)
        files = {}
        if any(re.search(r"(?:^|\s)train\.py(?:\s|$)", c) for c, _ in lines):
            above = [o for o in page_blocks[:page_blocks.index(b)]
                     if o.status == "run" and o.kind == "python"]
            if not above:
                return False, "bash", ("train.py: no python `run` block above on the page to "
                                       "run as it"), None
            files["train.py"] = python_script(above[-1].text)
            self._write_job_json(cwd)
        for name, body in files.items():
            with open(os.path.join(cwd, name), "w") as f:
                f.write(body)
        outputs, what, previous, firsts = [], [], None, set()
        for i, (command, comment) in enumerate(lines):
            if command.endswith(" ...") or command.endswith("\t..."):
                if previous is None:
                    return False, command, "`...` on the first line: no line above", None
                command = command[:-3].rstrip() + " " + previous.split(" ", 1)[1]
            previous = command
            # torchrun runs as onebit-run (the stand-ins are the same): one run for both.
            effective = re.sub(r"^torchrun(?=\s)", "onebit-run", command)
            env = self.env()
            config = None
            frags = fragments_in(comment)
            if frags:
                n = [0]

                def fill_dir(i=i, n=n):
                    n[0] += 1
                    return os.path.join(cwd, f"line{i + 1}-dir-{n[0]}")

                config = {}
                for frag in frags:
                    try:
                        config = merge(config, config_fragment(frag, fill_dir))
                    except json.JSONDecodeError as e:
                        return False, command, f"the config in its comment is not JSON: {e}", None
                # The parser first, whatever the line does with the config.
                ok, out, _ = self.check_config(config, cwd, b.where, f"line{i + 1}.json")
                if not ok:
                    outputs.append(f"the job config in the comment of `{command}`: "
                                   f"{json.dumps(config)}\n{out}")
                    return False, command, "\n".join(outputs), None
                env["ONEBIT_CONFIG"] = os.path.join(cwd, f"line{i + 1}.json")
            shown = command + (" (as onebit-run)" if effective != command else "") + (
                f"    (ONEBIT_CONFIG: {json.dumps(config)})".replace(cwd, ".") if config else "")
            what.append(shown)
            key = ("shell", effective, json.dumps(config, sort_keys=True).replace(cwd, ""),
                   json.dumps(files, sort_keys=True))
            ok, out, first = self._exec(key, b.where, ["bash", "-euo", "pipefail", "-c",
                                                       effective], cwd, env)
            firsts.add(first)
            if not ok:
                outputs.append(f"$ {shown}\n{out}")
                return False, "\n".join(what), "\n".join(outputs), None
            outputs.append(f"$ {shown}: ok")
        first = firsts.pop() if len(firsts) == 1 else None  # every line ran before, there
        return True, "\n".join(what), "\n".join(outputs), first


# ---- The check ----


def check(root, page_list, run=False, python="/usr/bin/python3", only=None, out=sys.stdout):
    """Finds, classifies and (with run) runs the blocks; returns the errors."""
    root = os.path.abspath(root)
    renderer = markdown_renderer(root)
    errors, by_page = [], {}
    for page in page_list:
        blocks, errs = page_blocks(root, page, renderer)
        errors += errs
        for b in blocks:
            errors += classify(b)
        by_page[page] = blocks
    for blocks in by_page.values():
        for b in blocks:
            if b.status == "tested-by":
                errors += check_tested_by(b, root)
    if run and not errors:
        errors += run_blocks(root, by_page, python, only, out)
    inventory(by_page, out)
    return errors


def run_blocks(root, by_page, python, only, out):
    errors = []
    work = tempfile.mkdtemp(prefix="code-blocks-", dir=os.environ.get("TEST_TMPDIR"))
    runner = Runner(root, python, work)
    for page, blocks in by_page.items():
        for b in blocks:
            if b.status != "run" or (only and b.where not in only):
                continue
            start = time.monotonic()
            try:
                ok, what, output, first = runner.run(b, blocks)
            except Exception as e:  # a bug here, not in the block: say so
                ok, what, output, first = False, "?", f"the runner failed: {e!r}", None
            took = time.monotonic() - start
            same = f" (the same run as {first})" if first else ""
            state = "ok" if ok else "FAILED"
            print(f"{b.where}: run ({b.kind}): {state} in {took:.1f} s{same}", file=out)
            for line in what.split("\n"):
                print(f"    {line}", file=out)
            last = [line for line in output.split("\n") if line.strip()][-1:]
            if ok and last:
                print(f"    | {last[0][:150]}", file=out)
            if not ok:
                tail = output.strip().split("\n")[-60:]
                errors.append(f"{b.where}: this {b.kind} block failed:\n" + _indent(b.text) +
                              f"\n  ran: {what}\n  output (last lines):\n" + _indent("\n".join(tail)))
    return errors


def _indent(text, by="    "):
    return "\n".join(by + line for line in text.split("\n"))


def inventory(by_page, out):
    print("\nblocks per page (run / tested-by / not run / text):", file=out)
    total = {"run": 0, "tested-by": 0, "not run": 0, "text": 0}
    for page, blocks in by_page.items():
        counts = {k: sum(1 for b in blocks if b.status == k) for k in total}
        for k in total:
            total[k] += counts[k]
        print(f"  {page:28} " + " / ".join(str(counts[k]) for k in total), file=out)
    print(f"  {'all':28} " + " / ".join(str(total[k]) for k in total), file=out)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("root", help="the repository, or a Bazel test's runfiles of it")
    p.add_argument("--run", action="store_true", help="run the `run` blocks too")
    p.add_argument("--python", default="/usr/bin/python3",
                   help="the interpreter with torch that runs the blocks")
    p.add_argument("--page", action="append", help="only this page (relative to root)")
    p.add_argument("--only", action="append", help="run only the block at PAGE:LINE")
    a = p.parse_args(argv)
    page_list = a.page or pages(a.root)
    start = time.monotonic()
    errors = check(a.root, page_list, run=a.run, python=a.python, only=a.only)
    took = time.monotonic() - start
    if errors:
        print(f"\ncode_blocks: FAIL ({len(errors)}):", file=sys.stderr)
        for e in errors:
            print(e, file=sys.stderr)
        return 1
    print(f"code_blocks: OK: {len(page_list)} pages, every code block marked"
          + (", every `run` block ran" if a.run else "") + f" ({took:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
