#!/usr/bin/env bash
# Debian packages the tests need: Qt's xcb platform libraries, plus Xvfb, a tray host (trayer),
# a window manager, xdotool and ImageMagick for the desktop end-to-end test and screenshots.
# Installs only what is missing; does nothing where apt-get or root is not available.
set -euo pipefail
PKGS=(libglib2.0-0 libegl1 libgl1 libfontconfig1 libxkbcommon0 libdbus-1-3 libxcb-cursor0
      libxcb-icccm4 libxcb-image0 libxcb-keysyms1 libxcb-render-util0 libxcb-shape0 libxcb-xkb1
      libxkbcommon-x11-0 xvfb xauth xdotool imagemagick trayer openbox fonts-dejavu-core)
command -v dpkg-query >/dev/null 2>&1 || { echo "system-deps: not a Debian system; skipping"; exit 0; }
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "system-deps: missing ${missing[*]} (install them as root); GUI tests that need them will fail" >&2
  exit 0
fi
echo "system-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
