#!/usr/bin/env bash
# Checks `pip install .` from the checkout: a scratch virtual environment that sees Debian's
# packages (numpy, torch), pip with no index and no build isolation, then `import asyncinfer`
# from another directory. ASYNCINFER_CMAKE_BUILD_DIR makes setup.py reuse the build tree that
# ctest runs in, so this costs seconds instead of a full build (README, "Python", gives the
# user's command, which configures build/pip and builds the library once).
#
#   pip_install_check.sh <python> <source dir> <build dir> <scratch dir>
set -euo pipefail
python=$1 src=$2 build=$3 work=$4
rm -rf "$work"
mkdir -p "$work"
"$python" -m venv --system-site-packages "$work/venv"
ASYNCINFER_CMAKE_BUILD_DIR="$build" "$work/venv/bin/python" -m pip install --no-index \
  --no-build-isolation --disable-pip-version-check "$src"
cd "$work"
"$work/venv/bin/python" - "$work/venv" <<'PY'
import importlib.metadata, os, sys
import numpy as np
import asyncinfer
venv = os.path.realpath(sys.argv[1])
assert os.path.realpath(asyncinfer.__file__).startswith(venv), asyncinfer.__file__
assert importlib.metadata.version("asyncinfer") == asyncinfer.__version__
here = os.path.dirname(asyncinfer.__file__)
assert os.path.exists(os.path.join(here, "__init__.pyi")) and os.path.exists(os.path.join(here, "py.typed"))
with asyncinfer.Engine("builtin:identity", "cpu") as e:
    out, = e.submit(np.arange(4, dtype=np.float32).reshape(1, 4)).result(30)
    assert out.tolist() == [[0, 1, 2, 3]], out
print("pip install . ok:", asyncinfer.__file__, asyncinfer.__version__)
PY
# No installed file may search the current directory for libraries: an empty RUNPATH entry
# (CMake pads build-tree RUNPATHs with ':') would load a library planted there.
pkg=$("$work/venv/bin/python" -c 'import asyncinfer, os; print(os.path.dirname(asyncinfer.__file__))')
# The backend modules (src/backend_modules.hpp) beside the library, found by the installed package:
# a python model whose file is missing fails in the backend's words, not the module loader's.
"$work/venv/bin/python" - <<'PY'
import os
import asyncinfer
try:
    asyncinfer.Engine("python:/nonexistent/model.py", "cpu")
    raise SystemExit("a python model with no file loaded")
except Exception as e:  # the backend's own error about the file
    assert "did not load" not in str(e), str(e)
    print("backend module found:", str(e).splitlines()[0][:120])
PY
for f in "$pkg"/*.so* "$pkg"/asyncinfer/backends/*.so; do
  [ -e "$f" ] || continue
  readelf -d "$f" | grep -q '(RUNPATH)' || { echo "RUNPATH of $(basename "$f"): none"; continue; }
  runpath=$(readelf -d "$f" | sed -n 's/.*(RUNPATH).*\[\(.*\)\]/\1/p')
  case ":$runpath:" in
    *::*) echo "pip_install_check: $f has an empty RUNPATH entry: [$runpath]" >&2; exit 1 ;;
  esac
  echo "RUNPATH of $(basename "$f"): [$runpath]"
done
# And it still imports from a directory holding a file named like a library it needs.
mkdir -p "$work/planted" && : >"$work/planted/libc10.so.1.13"
(cd "$work/planted" && "$work/venv/bin/python" -c 'import asyncinfer')
"$work/venv/bin/python" -m pip uninstall -y -q asyncinfer
rm -rf "$work"
