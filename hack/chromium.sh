#!/usr/bin/env bash
# Chromium for tests/checks/test_report_html.py, which opens a `datagen verify --html` page headless and counts what
# each plot drew: Debian's package, /usr/bin/chromium. Installed once (CI runs as root on Debian); a warm run costs
# nothing. Where it cannot install, it says what to install and fails.
set -euo pipefail

CHROMIUM=/usr/bin/chromium
if [ -x "$CHROMIUM" ]; then exit 0; fi

root=()  # the command prefix that runs as root: none when we are root, sudo when it needs no password
if [ "$(id -u)" != 0 ]; then
  if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then root=(sudo -n); else root=(cannot); fi
fi
if command -v apt-get >/dev/null 2>&1 && [ "${root[*]-}" != cannot ]; then
  echo "==> installing Debian's chromium for the HTML report test (apt-get install -y chromium)" >&2
  export DEBIAN_FRONTEND=noninteractive
  if "${root[@]}" apt-get update -qq && "${root[@]}" apt-get install -y -qq --no-install-recommends chromium >/dev/null \
    && [ -x "$CHROMIUM" ]; then
    exit 0
  fi
fi
echo "error: $CHROMIUM is missing and could not be installed here: the test of \`datagen verify --html\`" >&2
echo "       (tests/checks/test_report_html.py) opens its page in headless Chromium. Install Debian's package as" >&2
echo "       root ('apt-get install -y chromium') and rerun 'make test'." >&2
exit 3
