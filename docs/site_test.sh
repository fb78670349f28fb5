#!/usr/bin/env bash
# Builds the documentation site as a reader gets it, in strict mode: mkdocs.yml and docs/
# copied side by side, mkdocs-material's `mkdocs build --strict`. Fails on any mkdocs
# warning (a broken link, a page missing from docs/), on a page left out of the nav, on a
# build file that reaches the site, on a link to an anchor that no page has, and when
# README.md grows past 160 lines (the details belong in docs/).
set -uo pipefail

fail() { echo "site_test: FAIL: $*" >&2; exit 1; }

root="${TEST_SRCDIR:-}/${TEST_WORKSPACE:-onebit}"
[ -f "$root/mkdocs.yml" ] || root="$(cd "$(dirname "$0")/.." && pwd)"
[ -f "$root/mkdocs.yml" ] || fail "mkdocs.yml not found (looked in $root)"

mkdocs="${ONEBIT_VENVS:-/opt/onebit/venvs}/docs/bin/mkdocs"
[ -x "$mkdocs" ] ||
  fail "$mkdocs is missing: bash python/envs/setup.sh docs (mkdocs-material from PyPI; deploy/install-deps.sh runs it)"

max_readme=160
readme_lines=$(wc -l < "$root/README.md")
[ "$readme_lines" -le "$max_readme" ] ||
  fail "README.md has $readme_lines lines, more than $max_readme: move the details to a page under docs/"

work="${TEST_TMPDIR:-$(mktemp -d)}/site-src"
rm -rf "$work" && mkdir -p "$work"
cp -L "$root/mkdocs.yml" "$root/README.md" "$work/"
cp -rL "$root/docs" "$work/docs"

site="$work/../site"
log="$work/../mkdocs.log"
(cd "$work" && NO_MKDOCS_2_WARNING=1 "$mkdocs" build --strict --site-dir "$site") >"$log" 2>&1
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

# The build's own files (BUILD, the checks' scripts) stay out of the site (exclude_docs).
strays=$(cd "$site" && find . -path ./search -prune -o -type f \( -name BUILD -o -name '*.py' -o -name '*.sh' -o -name '*.json' \) -print | sort)
[ -z "$strays" ] || fail "files that are not pages reached the site (mkdocs.yml's exclude_docs): $strays"

python3 "$(dirname "$0")/check_links.py" "$site" ||
  fail "links to anchors that do not exist (above)"

echo "site_test: OK: $(ls "$site"/*.html | grep -vc 404.html) pages built strictly, every link found; README.md $readme_lines lines"
