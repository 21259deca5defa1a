#!/usr/bin/env bash
# Debian's Chromium for the browser tests (Playwright drives it via executable_path; we never
# use Playwright's own browser download, which fails offline).
set -euo pipefail
if [ -x /usr/lib/chromium/chromium ] || [ -n "${CHROMIUM_PATH:-}" ]; then exit 0; fi
if [ "$(id -u)" = "0" ]; then
  echo "[bootstrap] installing Debian's chromium" >&2
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
else
  echo "[bootstrap] chromium is missing: run 'sudo apt-get install -y chromium' (browser tests will be skipped)" >&2
fi
