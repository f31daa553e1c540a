#!/usr/bin/env bash
# Vendors the browser libraries at exact versions from the npm registry: the browser builds
# and their licences go to static/vendor/<name>-<version>/ (served to users, no build step);
# axe-core, used only by the accessibility tests, goes to tests/support/vendor/ (never served).
# Run it (`make vendor`) after changing a version below; commit what it writes.
set -euo pipefail
cd "$(dirname "$0")/.."

MARKDOWN_IT=15.0.3
DOMPURIFY=3.5.0
HIGHLIGHT=11.12.0
AXE=4.14.1

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# unpack NPM_SPEC: npm pack the exact version into the temp dir and unpack it under $work/<dir>
unpack() {
  local spec=$1 dir=$2
  (cd "$work" && npm pack --silent "$spec" >/dev/null)
  mkdir -p "$work/$dir"
  tar -xzf "$work"/$(ls -t "$work" | grep '\.tgz$' | head -1) -C "$work/$dir" --strip-components=1
  rm -f "$work"/*.tgz
}

place() { # place SRC_DIR DEST_DIR FILE...: copy the listed files, keeping their names
  local src=$1 dest=$2
  shift 2
  rm -rf "$dest"
  mkdir -p "$dest"
  for file in "$@"; do cp "$src/$file" "$dest/"; done
}

unpack "markdown-it@$MARKDOWN_IT" markdown-it
place "$work/markdown-it" "static/vendor/markdown-it-$MARKDOWN_IT" dist/browser/markdown-it.umd.min.js LICENSE

unpack "dompurify@$DOMPURIFY" dompurify
place "$work/dompurify" "static/vendor/dompurify-$DOMPURIFY" dist/purify.min.js LICENSE LICENSE-MPL

unpack "@highlightjs/cdn-assets@$HIGHLIGHT" highlight
place "$work/highlight" "static/vendor/highlight.js-$HIGHLIGHT" \
  highlight.min.js styles/github-dark.min.css LICENSE

unpack "axe-core@$AXE" axe
place "$work/axe" "tests/support/vendor/axe-core-$AXE" axe.min.js LICENSE LICENSE-3RD-PARTY.txt

ls -l static/vendor/*/ tests/support/vendor/*/
