#!/usr/bin/env bash
# Reproduce the vendored front-end libraries from the npm registry.
#
#   scripts/vendor_frontend.sh          fetch the pinned versions, copy the files, print sha256s
#   scripts/vendor_frontend.sh --check  the same into a temp dir, then compare with the tree
#
# Files are copied byte for byte from the published npm tarballs (no build step); only the
# names change where a browser or Django needs it (.mjs -> .js, so it is served as JavaScript).
# To update: change a version below, run the script, run the browser tests
# (pytest frontend/tests -m browser), and update the versions/sha256s in the vendor READMEs
# (the script prints them). Syntax colours are the app's own (app.css, light and dark), so
# no highlight.js theme is vendored.
set -euo pipefail

MARKED=18.2.1
DOMPURIFY=3.4.18
HIGHLIGHT=11.12.0
AXE=4.14.1

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
STATIC="$ROOT/frontend/static/frontend/vendor"
TESTS="$ROOT/frontend/tests/vendor"
CHECK=0
[[ "${1:-}" == "--check" ]] && CHECK=1

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
for spec in "marked@$MARKED" "dompurify@$DOMPURIFY" "@highlightjs/cdn-assets@$HIGHLIGHT" "axe-core@$AXE"; do
  tgz="$(npm pack "$spec" --silent)"
  name="${spec%@*}"; name="${name//@/}"; name="${name//\//-}"
  mkdir -p "x/$name" && tar xzf "$tgz" -C "x/$name"
done

if [[ $CHECK == 1 ]]; then OUT_STATIC="$WORK/out/static"; OUT_TESTS="$WORK/out/tests"; else OUT_STATIC="$STATIC"; OUT_TESTS="$TESTS"; fi
mkdir -p "$OUT_STATIC" "$OUT_TESTS"

cp x/marked/package/lib/marked.esm.js              "$OUT_STATIC/marked.esm.js"
cp x/marked/package/LICENSE                        "$OUT_STATIC/LICENSE.marked"
cp x/dompurify/package/dist/purify.es.mjs          "$OUT_STATIC/purify.es.js"
cp x/dompurify/package/LICENSE                     "$OUT_STATIC/LICENSE.dompurify"
cp x/highlightjs-cdn-assets/package/es/highlight.min.js   "$OUT_STATIC/highlight.min.js"
cp x/highlightjs-cdn-assets/package/LICENSE        "$OUT_STATIC/LICENSE.highlightjs"
cp x/axe-core/package/axe.min.js                   "$OUT_TESTS/axe.min.js"
cp x/axe-core/package/LICENSE                      "$OUT_TESTS/LICENSE.axe-core"

echo "marked $MARKED, dompurify $DOMPURIFY, highlight.js $HIGHLIGHT, axe-core $AXE"
(cd "$OUT_STATIC" && sha256sum marked.esm.js purify.es.js highlight.min.js)
(cd "$OUT_TESTS" && sha256sum axe.min.js)

if [[ $CHECK == 1 ]]; then
  status=0
  for f in "$OUT_STATIC"/*; do cmp -s "$f" "$STATIC/$(basename "$f")" || { echo "differs: $STATIC/$(basename "$f")"; status=1; }; done
  for f in "$OUT_TESTS"/*; do cmp -s "$f" "$TESTS/$(basename "$f")" || { echo "differs: $TESTS/$(basename "$f")"; status=1; }; done
  [[ $status == 0 ]] && echo "vendored files match npm"
  exit $status
fi
