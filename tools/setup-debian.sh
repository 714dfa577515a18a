#!/bin/sh
# Installs what building and testing braid needs on Debian 12 (as root, or
# through sudo). Optional parts: CUDA is found in /usr/local/cuda when
# present; libibverbs-dev enables the InfiniBand transport; python3-torch,
# libtorch-dev and pybind11-dev build braid_torch, the PyTorch backend. With
# --fuzz it also installs clang and its libFuzzer, for -Dfuzzers=enabled.
set -eu
packages="build-essential meson ninja-build pkg-config python3 libssl-dev libhwloc-dev
  libgtest-dev libbenchmark-dev libcxxopts-dev nlohmann-json3-dev openmpi-bin
  gnuplot-nox zlib1g-dev libopenblas-dev dataset-fashion-mnist iproute2 libibverbs-dev
  python3-torch libtorch-dev pybind11-dev python3-dev
  qemu-system-x86 busybox-static ibverbs-utils rdma-core"
if [ "${1:-}" = "--fuzz" ]; then packages="$packages clang libclang-rt-14-dev"; fi
if [ "$(id -u)" -eq 0 ]; then sudo=""; else sudo="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -q
# shellcheck disable=SC2086
$sudo apt-get install -y -q --no-install-recommends $packages
