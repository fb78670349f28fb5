#!/usr/bin/env bash
# Builds the documentation site as a reader gets it, in strict mode: mkdocs.yml and docs/
# copied side by side, `mkdocs build --strict`. Fails on any mkdocs warning (a broken link,
# a page missing from docs/), on a page left out of the nav, on a link to an anchor that no
# page has, and when README.md grows past 160 lines (the details belong in docs/).
set -uo pipefail

fail() { echo "site_test: FAIL: $*" >&2; exit 1; }

root="${TEST_SRCDIR:-}/${TEST_WORKSPACE:-onebit}"
[ -f "$root/mkdocs.yml" ] || root="$(cd "$(dirname "$0")/.." && pwd)"
[ -f "$root/mkdocs.yml" ] || fail "mkdocs.yml not found (looked in $root)"

command -v mkdocs >/dev/null ||
  fail "mkdocs is not installed: apt-get install mkdocs (Debian 12's package; deploy/install-deps.sh installs it)"

max_readme=160
readme_lines=$(wc -l < "$root/README.md")
[ "$readme_lines" -le "$max_readme" ] ||
  fail "README.md has $readme_lines lines, more than $max_readme: move the details to a page under docs/"

work="${TEST_TMPDIR:-$(mktemp -d)}/site-src"
rm -rf "$work" && mkdir -p "$work"
cp -L "$root/mkdocs.yml" "$work/"
cp -rL "$root/docs" "$work/docs"
rm -f "$work"/docs/BUILD "$work"/docs/*.sh "$work"/docs/*.py  # the test's own files

site="$work/../site"
log="$work/../mkdocs.log"
(cd "$work" && mkdocs build --strict --site-dir "$site") >"$log" 2>&1
status=$?
cat "$log"
if [ "$status" -ne 0 ]; then
  fail "mkdocs build --strict failed (exit $status); the warnings above say why"
fi
if grep -q "WARNING" "$log"; then
  fail "mkdocs printed warnings (above)"
fi
if grep -q "exist in the docs directory, but are not included in the \"nav\"" "$log"; then
  grep -A20 "not included in the \"nav\"" "$log" | grep -E '^\s+- ' >&2
  fail "pages in docs/ that the nav of mkdocs.yml leaves out (above): add them to the nav"
fi

python3 "$(dirname "$0")/check_links.py" "$site" ||
  fail "links to anchors that do not exist (above)"

echo "site_test: OK: $(ls "$site"/*.html | grep -vc 404.html) pages built strictly, every link found; README.md $readme_lines lines"
