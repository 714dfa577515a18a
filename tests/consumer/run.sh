#!/bin/sh
# Installs braid into a staging prefix, builds all_collectives.c against it
# the way a framework would (the installed header, pkg-config, -lbraid), and
# runs it on 2, 3, 4 and 8 processes sharing one unique id.
set -eu
build_dir=$1
source_dir=$(cd "$(dirname "$0")" && pwd)
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
meson install -C "$build_dir" --destdir "$stage" --no-rebuild --quiet
pc=$(find "$stage" -name braid.pc | head -n 1)
lib_dir=$(dirname "$(find "$stage" -name 'libbraid.so' | head -n 1)")
export PKG_CONFIG_PATH="$(dirname "$pc")"
prefix=$(pkg-config --variable=prefix braid)
flags=$(pkg-config --define-variable=prefix="$stage$prefix" --cflags --libs braid)
cc -std=c99 -Wall -Wextra -Werror -D_POSIX_C_SOURCE=200809L "$source_dir/all_collectives.c" \
  $flags ${CONSUMER_FLAGS:-} -o "$stage/all_collectives"
for n in 2 3 4 8; do
  LD_LIBRARY_PATH=$lib_dir BRAID_TIMEOUT=60 "$stage/all_collectives" "$n"
done
