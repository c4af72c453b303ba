#!/usr/bin/env bash
# Builds the Kiln Grafana datasource plugin and packages it for Grafana:
#
#   grafana-plugin/dist/kiln-datasource/      plugin directory (copy into Grafana's plugins dir;
#                                             the plugin id is kiln-profiles-datasource)
#   grafana-plugin/dist/kiln-datasource.zip   the same directory, zipped
#
# Steps: 1. frontend: `npm ci && npm run build && npm run test:dist` in grafana-plugin/frontend
#           (npm registry only);
#        2. backend: `cargo build --release -p kiln-grafana-plugin --bin gpx_kiln`, unless
#           KILN_PLUGIN_BIN names an already built binary, which is then used instead;
#        3. assemble plugin.json, module.js(.map), img/, README.md and gpx_kiln_linux_amd64;
#        4. zip.
#
# Environment:
#   KILN_PLUGIN_BIN       path of a prebuilt gpx_kiln binary (skips cargo)
#   KILN_SKIP_NPM_CI=1    reuse the existing frontend/node_modules instead of `npm ci`
#   CARGO_TARGET_DIR      honoured when locating the cargo-built binary
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$HERE/.." && pwd)"
PLUGIN_ID="kiln-profiles-datasource"
FRONTEND="$HERE/frontend"
OUT_DIR="$HERE/dist"
DIR_NAME="kiln-datasource"
PKG_DIR="$OUT_DIR/$DIR_NAME"
ZIP="$OUT_DIR/$DIR_NAME.zip"
BIN_NAME="gpx_kiln_linux_amd64"

log() { printf '==> %s\n' "$*"; }
die() { printf 'build.sh: error: %s\n' "$*" >&2; exit 1; }

# 1. frontend ---------------------------------------------------------------------------------------
command -v npm >/dev/null || die "npm not found (Node >= 20 is needed)"
log "frontend: $FRONTEND"
(
  cd "$FRONTEND"
  if [[ "${KILN_SKIP_NPM_CI:-}" == "1" && -d node_modules ]]; then
    log "reusing frontend/node_modules (KILN_SKIP_NPM_CI=1)"
  else
    log "npm ci"
    npm ci --no-audit --no-fund
  fi
  log "npm run build"
  npm run build
  log "npm run test:dist (load dist/module.js as Grafana does)"
  npm run test:dist
)
for f in plugin.json module.js README.md img; do
  [[ -e "$FRONTEND/dist/$f" ]] || die "frontend build did not produce dist/$f"
done

# 2. backend binary ---------------------------------------------------------------------------------
if [[ -n "${KILN_PLUGIN_BIN:-}" ]]; then
  BIN="$KILN_PLUGIN_BIN"
  log "backend: using prebuilt binary $BIN (KILN_PLUGIN_BIN)"
else
  log "backend: cargo build --release -p kiln-grafana-plugin --bin gpx_kiln"
  (cd "$REPO_ROOT" && cargo build --release -p kiln-grafana-plugin --bin gpx_kiln)
  BIN="${CARGO_TARGET_DIR:-$REPO_ROOT/target}/release/gpx_kiln"
fi
[[ -f "$BIN" ]] || die "backend binary not found: $BIN"

# 3. assemble ---------------------------------------------------------------------------------------
log "assembling $PKG_DIR"
rm -rf "$PKG_DIR" "$ZIP"
mkdir -p "$PKG_DIR"
cp "$FRONTEND/dist/plugin.json" "$FRONTEND/dist/module.js" "$FRONTEND/dist/README.md" "$PKG_DIR/"
[[ -f "$FRONTEND/dist/module.js.map" ]] && cp "$FRONTEND/dist/module.js.map" "$PKG_DIR/"
cp -R "$FRONTEND/dist/img" "$PKG_DIR/img"
cp "$BIN" "$PKG_DIR/$BIN_NAME"
chmod 0755 "$PKG_DIR/$BIN_NAME"

# plugin.json must name this directory and the executable prefix of the binary.
node - "$PKG_DIR" "$PLUGIN_ID" "$BIN_NAME" <<'JS'
const fs = require('fs');
const path = require('path');
const [pkg, pluginId, binName] = process.argv.slice(2);
const meta = JSON.parse(fs.readFileSync(path.join(pkg, 'plugin.json'), 'utf8'));
const errors = [];
if (meta.id !== pluginId) errors.push(`plugin.json id is ${meta.id}, expected ${pluginId}`);
if (meta.backend !== true) errors.push('plugin.json backend is not true');
if (!binName.startsWith(`${meta.executable}_`)) errors.push(`plugin.json executable ${meta.executable} does not match ${binName}`);
if (JSON.stringify(meta).includes('%VERSION%')) errors.push('plugin.json still has %VERSION%');
if (errors.length) {
  console.error(`build.sh: error: ${errors.join('; ')}`);
  process.exit(1);
}
JS

# 4. zip --------------------------------------------------------------------------------------------
log "zipping $ZIP"
(
  cd "$OUT_DIR"
  if command -v zip >/dev/null; then
    zip -qr "$DIR_NAME.zip" "$DIR_NAME"
  else
    python3 -m zipfile -c "$DIR_NAME.zip" "$DIR_NAME"
  fi
)
log "done:"
(cd "$OUT_DIR" && find "$DIR_NAME" -type f -exec ls -l {} + | awk '{print "    " $1, $5, $9}')
printf '    %s (%s bytes)\n' "$ZIP" "$(stat -c %s "$ZIP")"
