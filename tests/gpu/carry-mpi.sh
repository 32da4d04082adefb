#!/usr/bin/env bash
# carry-mpi.sh OUT [--no-xz] — Open MPI's launcher for the GPU machine
# (tests/gpu/run.sh build; ctest gpu.carry_mpi).
#
# World > 1 starts under mpirun (docs/engine.md, Ranks: the engine refuses
# world > 1 without an MPI launcher, and the NCCL unique id goes over MPI),
# and the GPU image has no Open MPI of its own that matches the libmpi the
# engine links. So the launcher travels with the engine: Debian's Open MPI
# 4.1 relocated under OUT/ompi, found through OPAL_PREFIX (its plugins and
# help files) and PMIX_MCA_mca_base_component_path (the external PMIx's
# plugins); OUT/ompi/bin/mpirun is a wrapper that sets both and
# LD_LIBRARY_PATH (the libraries orterun and its plugins load, bar libc's)
# and runs orterun. One node only: no orted, and the fabric plugins
# (UCX, OFI, verbs, PSM) stay behind, as Debian's own configuration
# disables them; shared memory and TCP between local ranks remain.
# Without --no-xz the tree is packed into OUT/ompi.tar.xz and removed
# (run.sh gpu unpacks it).
set -euo pipefail
out=${1:?usage: carry-mpi.sh OUT [--no-xz]}
orterun=$(readlink -f "$(command -v orterun || command -v mpirun || true)")
[ -x "$orterun" ] || { echo "carry-mpi.sh: no orterun / mpirun here (apt-get install openmpi-bin)" >&2; exit 1; }
info=$(ompi_info --path all --parsable)
field() { sed -n "s/^path:$1:\(.*\)/\1/p" <<<"$info" | head -1; }
prefix=$(field prefix)
pkglib=$(field pkglibdir)
pkgdata=$(field pkgdatadir)
[ -n "$prefix" ] && [ -d "$pkglib" ] || { echo "carry-mpi.sh: ompi_info gave no prefix / plugin directory" >&2; exit 1; }
# PMIx: Debian builds Open MPI against its external libpmix; its plugins
# sit beside it (pmix2/lib/pmix) and its help files under pmix2/share.
pmixlib=$(ldd "$pkglib"/mca_pmix_ext*.so 2>/dev/null | awk '/libpmix\.so/ {print $3; exit}')
pmixdir=$(dirname "$(dirname "$(readlink -f "${pmixlib:-/nonexistent/x/y}")")")
tree=$out/ompi
rm -rf "$tree"
# The same relative paths under OUT/ompi as under the prefix: OPAL_PREFIX
# swaps only the prefix.
rel_lib=${pkglib#"$prefix"/}
rel_data=${pkgdata#"$prefix"/}
mkdir -p "$tree/bin" "$tree/libs" "$tree/$rel_lib" "$tree/$rel_data" "$tree/pmix/lib/pmix" "$tree/pmix/share/pmix"
cp "$orterun" "$tree/bin/orterun"
for so in "$pkglib"/*.so; do
  case "$(basename "$so")" in
    *ucx*|*ofi*|*openib*|*psm*|*verbs*|*usnic*|*uct*|*portals*|*flux*) ;;
    *) cp "$so" "$tree/$rel_lib/" ;;
  esac
done
cp -r "$pkgdata"/. "$tree/$rel_data/"
if [ -d "$pmixdir/lib/pmix" ]; then
  cp "$pmixdir"/lib/pmix/*.so "$tree/pmix/lib/pmix/"
  [ -d "$pmixdir/share/pmix" ] && cp -r "$pmixdir/share/pmix/." "$tree/pmix/share/pmix/"
fi
shopt -s nullglob
objs=("$tree/bin/orterun" "$tree/$rel_lib"/*.so "$tree"/pmix/lib/pmix/*.so)
ldd "${objs[@]}" | awk '/=> \// {print $3}' | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*) ;;
    *) cp -L "$lib" "$tree/libs/" ;;
  esac
done
if ldd "${objs[@]}" | grep -q "not found"; then
  echo "carry-mpi.sh: a library of orterun or a plugin is missing here:" >&2
  ldd "${objs[@]}" | grep "not found" | sort -u >&2
  exit 1
fi
cat >"$tree/bin/mpirun" <<'EOF'
#!/bin/sh
# mpirun carried by tests/gpu/carry-mpi.sh: Debian's Open MPI, relocated.
d=$(cd "$(dirname "$0")/.." && pwd)
OPAL_PREFIX=$d PMIX_MCA_mca_base_component_path=$d/pmix/lib/pmix
LD_LIBRARY_PATH=$d/libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export OPAL_PREFIX PMIX_MCA_mca_base_component_path LD_LIBRARY_PATH
exec "$d/bin/orterun" "$@"
EOF
chmod +x "$tree/bin/mpirun"
if [ "${2:-}" != "--no-xz" ]; then
  tar -C "$out" -cJf "$out/ompi.tar.xz" ompi
  rm -rf "$tree"
  echo "carry-mpi.sh: $out/ompi.tar.xz ($(du -h "$out/ompi.tar.xz" | cut -f1))"
fi
