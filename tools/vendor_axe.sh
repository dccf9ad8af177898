#!/usr/bin/env bash
# Vendor axe-core, the accessibility rules engine the browser tests run on every page
# (tests/site/test_site.py), into tests/vendor/axe-core/, so that `make test` needs no network.
# Re-run to refresh it (the version is pinned below; needs npm and network):
#   bash tools/vendor_axe.sh
set -euo pipefail
if [ "${1:-}" = "--help" ] || [ "${1:-}" = "-h" ]; then
  sed -n '2,5p' "$0" | sed 's/^# \{0,1\}//'
  exit 0
fi
AXE_CORE=4.14.1

root="$(cd "$(dirname "$0")/.." && pwd)"
dest="$root/tests/vendor/axe-core"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
npm pack --silent "axe-core@$AXE_CORE" >/dev/null
tar xzf "axe-core-$AXE_CORE.tgz"
rm -rf "$dest" && mkdir -p "$dest"
cp package/axe.min.js package/LICENSE package/LICENSE-3RD-PARTY.txt package/package.json "$dest/"
cat > "$dest/README.md" <<README
# axe-core $AXE_CORE (vendored)

The accessibility rules engine (Deque Systems, MPL-2.0: LICENSE; third-party notices in
LICENSE-3RD-PARTY.txt), copied from the npm registry by \`bash tools/vendor_axe.sh\`.
tests/browser.py injects \`axe.min.js\` into every page of the built site and fails on any
critical or serious violation.
README
echo "vendored axe-core $AXE_CORE into $dest"
