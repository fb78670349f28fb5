"""Sentence lengths of the prose that users read: README, RELIABILITY, BENCHMARKS and the
site's pages (docs/*.md but the generated config.md).

    python3 docs/prose_check.py REPO_ROOT            # the report; exit 1 over a budget
    python3 docs/prose_check.py REPO_ROOT --update   # write today's counts as the budgets

A sentence is counted in prose only: code blocks, inline code, tables, headings and link
targets are left out, and each list item starts a sentence. The goal is sentences of about
20 words (the median) and none over 40. Pages written before that goal carry a budget in
docs/prose_budget.json: the number of their sentences over 40 words. The check fails when
a page has more than its budget, or when a page without one has any; it says when a budget
can come down. So the count can only fall.
"""
import json
import os
import re
import statistics
import sys

LIMIT = 40
PAGES = ["README.md", "RELIABILITY.md", "BENCHMARKS.md", "CHANGELOG.md", "examples/README.md",
         "results/README.md"]
SKIP = {"docs/config.md"}  # generated from the config parser
BUDGET = "docs/prose_budget.json"

# Abbreviations whose period ends no sentence.
ABBREVIATIONS = ("e.g.", "i.e.", "vs.", "etc.", "cf.", "approx.", "Fig.", "No.")


def pages(root):
    found = [p for p in PAGES if os.path.exists(os.path.join(root, p))]
    docs = os.path.join(root, "docs")
    found += sorted(f"docs/{f}" for f in os.listdir(docs)
                    if f.endswith(".md") and f"docs/{f}" not in SKIP)
    return found


def prose_units(text):
    """The page's prose as paragraphs and list items (strings), without code or tables."""
    units, current, fenced = [], [], False

    def flush():
        if current:
            units.append(" ".join(current))
            current.clear()

    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("```"):
            fenced = not fenced
            flush()
            continue
        if fenced or line.startswith("    ") and not current:
            continue  # a code block (fenced, or indented after a blank line)
        if not stripped or stripped.startswith(("#", "|", "<!--", "![", "---")):
            flush()
            continue
        if re.match(r"^(\s*)([-*+]|\d+\.)\s+", line):
            flush()  # a list item begins a unit of its own
            stripped = re.sub(r"^([-*+]|\d+\.)\s+", "", stripped)
        current.append(stripped)
    flush()
    return units


def sentences(unit):
    text = re.sub(r"`[^`]*`", "CODE", unit)                 # inline code: one word
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # links: their text
    text = re.sub(r"<[^>]+>", " ", text)                     # inline HTML
    for abbreviation in ABBREVIATIONS:
        text = text.replace(abbreviation, abbreviation.replace(".", ""))
    parts = re.split(r"(?<=[.!?])\s+(?=[A-Z0-9(\"*])", text)
    return [p for p in parts if re.search(r"[A-Za-z]", p)]


def words(sentence):
    return [w for w in sentence.split() if re.search(r"[A-Za-z0-9]", w)]


def measure(path):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    lengths, longest = [], ("", 0)
    for unit in prose_units(text):
        for s in sentences(unit):
            n = len(words(s))
            lengths.append(n)
            if n > longest[1]:
                longest = (s, n)
    return lengths, longest


def main(argv):
    if len(argv) < 2:
        sys.exit(__doc__)
    root, update = argv[1], "--update" in argv[2:]
    budget_path = os.path.join(root, BUDGET)
    budgets = {}
    if os.path.exists(budget_path):
        with open(budget_path) as f:
            budgets = json.load(f)
    counts, failures, lower = {}, [], []
    print(f"{'page':<24} {'sentences':>9} {'median':>6} {'over ' + str(LIMIT):>8} {'budget':>6}  longest")
    for page in pages(root):
        lengths, longest = measure(os.path.join(root, page))
        over = sum(1 for n in lengths if n > LIMIT)
        counts[page] = over
        median = statistics.median(lengths) if lengths else 0
        budget = budgets.get(page, 0)
        print(f"{page:<24} {len(lengths):>9} {median:>6.0f} {over:>8} {budget:>6}  {longest[1]} words")
        if over > budget:
            failures.append(f"{page}: {over} sentences over {LIMIT} words (budget {budget}); "
                            f"the longest ({longest[1]} words): {longest[0][:200]}...")
        elif over < budget:
            lower.append(f"{page}: {over} < budget {budget}")
    if update:
        with open(budget_path, "w") as f:
            json.dump({p: n for p, n in counts.items() if n > 0}, f, indent=1, sort_keys=True)
            f.write("\n")
        print(f"wrote {BUDGET}")
        return 0
    for line in lower:
        print(f"lower the budget in {BUDGET}: {line}")
    for line in failures:
        print(f"FAIL: {line}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
