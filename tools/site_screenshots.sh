#!/usr/bin/env bash
# Screenshots of every page of the documentation site, as a reader sees it at two widths.
#
#   tools/site_screenshots.sh [OUT]     # default OUT: out/site-screenshots
#
# Builds the site with the docs venv (python/envs/setup.sh docs), then has headless
# chromium (apt-get install chromium) draw each page at 1280 and 800 pixels wide, the first
# 1600 pixels of it: OUT/PAGE-1280.png and OUT/PAGE-800.png.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-$root/out/site-screenshots}"
mkdocs="${ONEBIT_VENVS:-/opt/onebit/venvs}/docs/bin/mkdocs"
[ -x "$mkdocs" ] || { echo "site_screenshots: $mkdocs is missing: bash python/envs/setup.sh docs" >&2; exit 1; }
command -v chromium >/dev/null || { echo "site_screenshots: chromium is missing: apt-get install chromium" >&2; exit 1; }
site="$(mktemp -d)"
trap 'rm -rf "$site"' EXIT
(cd "$root" && NO_MKDOCS_2_WARNING=1 "$mkdocs" build -q --strict --site-dir "$site")
mkdir -p "$out"
for page in "$site"/*.html; do
  name="$(basename "$page" .html)"
  [ "$name" = 404 ] && continue
  for width in 1280 800; do
    timeout 60 chromium --headless --no-sandbox --disable-gpu --hide-scrollbars \
      --window-size="$width,1600" --screenshot="$out/$name-$width.png" "file://$page" \
      >/dev/null 2>&1 || echo "site_screenshots: $name at $width px failed" >&2
  done
done
echo "site_screenshots: $(ls "$out"/*.png | wc -l) screenshots in $out"
