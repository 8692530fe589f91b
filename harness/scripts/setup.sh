#!/usr/bin/env bash
# Installs what attnbench needs to build, test and plot, with apt-get, when missing
# (python3-numpy: the crosscheck test's independent reference; libsndfile and FFTW:
# the speech experiment's audio and filterbanks; clang, its libFuzzer
# (libclang-rt-14-dev) and its OpenMP (libomp-14-dev): the fuzz targets, fuzz.sh;
# Slurm and OpenMPI: the cluster scripts and data-parallel training, below).
# Idempotent: a second run installs nothing. Needs root or sudo on Debian 12.
set -euo pipefail
# A shell started with no PATH in its environment has a default one it does not
# export; the compilers that meson and gcc start need it exported.
export PATH

pkgs=(meson ninja-build pkg-config gcc g++ libjansson-dev libcriterion-dev
      libopenblas-openmp-dev libopenblas0-openmp zlib1g-dev gnuplot-nox
      python3-numpy libsndfile1-dev libfftw3-dev clang libclang-rt-14-dev libomp-14-dev)
# A one-node Slurm for the tests of harness/scripts/slurm-sweep.sh (suite
# slurm_scripts, tests/scripts/slurm/): the test starts its own munged, slurmctld and
# slurmd with a config of its own (in a network namespace of its own: iproute2's ip);
# the packages' services are never started (below).
pkgs+=(munge slurmctld slurmd slurm-client iproute2)
# OpenMPI for data-parallel training (train --dist mpi; meson finds it) and its test
# (suite dist: mpirun with 1, 2 and 4 ranks).
pkgs+=(openmpi-bin libopenmpi-dev)

missing=()
for p in "${pkgs[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
        missing+=("$p")
    fi
done

if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: installing ${missing[*]}"
    sudo=""
    [ "$(id -u)" -ne 0 ] && sudo="sudo"
    export DEBIAN_FRONTEND=noninteractive
    # munge's and slurmctld's postinst start their services (invoke-rc.d ... || exit 1):
    # slurmctld has no config yet and fails, which fails the install, and where it
    # would start it would run beside the tests' own. A policy-rc.d that refuses every
    # start (exit 101, as in Debian's container images) is put in place for the
    # install when none is there, and removed after it.
    policy=/usr/sbin/policy-rc.d
    if [ ! -e "$policy" ]; then
        trap '$sudo rm -f "$policy"' EXIT
        printf '#!/bin/sh\n# setup.sh: no service starts during its install\nexit 101\n' | $sudo tee "$policy" >/dev/null
        $sudo chmod 755 "$policy"
    fi
    $sudo apt-get update -qq
    $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Debian's alternatives may point libblas/libcblas at another OpenBLAS build or the
# reference BLAS; attnbench links the OpenMP build explicitly (see meson.build), so
# one OpenMP thread pool serves both our loops and OpenBLAS.
echo "setup: dependencies present"
