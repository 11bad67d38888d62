#!/bin/sh
# Copies FILEs into ROOT at the same paths, plus every shared library they load that the runtime
# base image (gcr.io/distroless/cc-debian12: glibc, libgcc, libstdc++, libssl, CA certificates) does
# not already provide, into ROOT/usr/lib/<multiarch>/. Used by the Dockerfile so the final image
# needs no package manager and no shell; run it by hand to inspect what the image will contain.
#
# usage: collect-runtime-files.sh ROOT FILE...
set -eu
root=$1
shift
for file in "$@"; do
    mkdir -p "$root$(dirname "$file")"
    cp -L "$file" "$root$file"
done
# ldd lists the whole transitive closure: "libz.so.1 => /lib/x86_64-linux-gnu/libz.so.1 (0x…)".
for lib in $(for file in "$@"; do ldd "$file"; done | awk '$2 == "=>" && $3 ~ /^\// { print $3 }' | sort -u); do
    name=$(basename "$lib")
    case "$name" in
        # In the base image, and must match its dynamic loader.
        libc.so.* | libm.so.* | libgcc_s.so.* | libpthread.so.* | libdl.so.* | librt.so.* | ld-linux*) continue ;;
    esac
    dir="$root/usr/lib/$(basename "$(dirname "$lib")")"
    mkdir -p "$dir"
    cp -L "$lib" "$dir/$name"
    echo "$name"
done
