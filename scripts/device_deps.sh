#!/usr/bin/env bash
# The Debian 12 libraries kvq builds against, packed small enough to travel with the tree to a GPU machine whose image
# lacks them (the device tool sends at most 64 MiB: the tree is ~52 MB, the .deb files of ../shared/tools/gpu-deps.sh
# ~41 MB, this pack ~10 MB).
#   scripts/device_deps.sh pack [OUT]        here: OUT (default .device/deps.tar.xz, ignored by git) from the .debs
#   source scripts/device_deps.sh env [TAR]  there: unpack TAR under /opt/deps once and export PKG_CONFIG_*,
#                                            CMAKE_PREFIX_PATH, LD_LIBRARY_PATH and CPATH for cmake
# What the pack leaves out: static libraries, docs, programs, ICU's i18n / io libraries, PCRE2's 16/32-bit and POSIX
# libraries, OpenSSL's engines, Google Benchmark and gmock (kvq uses none of them), LAPACK, Eigen's unsupported
# modules; and ICU's 30 MB data library is replaced by an empty one (ICU's "stubdata"): kvq asks ICU only for NFC and
# two binary properties, which libicuuc carries compiled in (tests/test_tokenizer.cpp passes against the stub).
set -euo pipefail
PKGS="libpcre2-dev libpcre2-8-0 libicu-dev libicu72 libeigen3-dev nlohmann-json3-dev libfmt-dev libfmt9 libcli11-dev
libopenblas-dev libopenblas0 libopenblas0-pthread libopenblas-pthread-dev libgtest-dev libcpp-httplib-dev libgfortran5
libcpp-httplib0.11 libbrotli-dev libbrotli1 libssl-dev libssl3 zlib1g-dev"  # and Boost's headers kvq serve uses (below)
case "${1:-}" in
  pack)
    out=$(realpath -m "${2:-.device/deps.tar.xz}")
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    (cd "$work" && { apt-get download $PKGS >/dev/null 2>&1 || { apt-get update -qq && apt-get download $PKGS >/dev/null; }; })
    mkdir "$work/root"
    for f in "$work"/*.deb; do dpkg -x "$f" "$work/root"; done
    A=$work/root/usr/lib/x86_64-linux-gnu
    find "$work/root" -name '*.a' ! -name 'libgtest*.a' -delete  # GoogleTest is static only
    rm -rf "$work"/root/usr/{share/doc,share/man,share/lintian,bin,sbin} "$work/root/usr/include/eigen3/unsupported" \
           "$work/root/usr/include/gmock" "$A"/engines-3 "$A"/ossl-modules "$A"/icu "$A"/libicui18n* "$A"/libicuio* \
           "$A"/libicutu* "$A"/libicutest* "$A"/libpcre2-16* "$A"/libpcre2-32* "$A"/libpcre2-posix* "$A"/libgmock* \
           "$A"/openblas-pthread/liblapack*
    # ICU's stubdata: the common-data symbol of an empty package
    icu=$(basename "$(ls "$A"/libicudata.so.*.* | head -1)")  # libicudata.so.72.1
    major=${icu#libicudata.so.}
    major=${major%%.*}
    command -v icupkg >/dev/null || apt-get install -y -qq icu-devtools >/dev/null
    icupkg -tl new "$work/empty.dat"
    printf '  .section .rodata\n  .globl icudt%s_dat\n  .type icudt%s_dat,@object\n  .balign 16\nicudt%s_dat:\n  .incbin "%s"\n  .size icudt%s_dat, .-icudt%s_dat\n  .section .note.GNU-stack,"",@progbits\n' \
      "$major" "$major" "$major" "$work/empty.dat" "$major" "$major" > "$work/stub.S"
    gcc -shared -o "$A/$icu" "$work/stub.S" -Wl,-soname,libicudata.so.$major
    # Boost's headers are 160 MB; kvq serve needs Asio and Beast: the headers its transport files reach (g++ -M, plain
    # and Release), and the CMake config find_package(Boost) reads.
    (cd "$work" && apt-get download libboost1.74-dev >/dev/null && dpkg -x libboost1.74-dev_*.deb boost)
    for f in $(grep -rl '#include <boost/' src); do
      for flags in "" "-O2 -DNDEBUG"; do g++ -std=c++20 $flags -M -Isrc "$f"; done
    done | tr ' \\' '\n\n' | grep '^/usr/include/boost/' | sort -u |
      sed 's|^/||' | tar -C "$work/boost" -cf - -T - | tar -C "$work/root" -xf -
    cp -a "$work"/boost/usr/lib/x86_64-linux-gnu/cmake "$A/"
    mkdir -p "$(dirname "$out")"
    tar -C "$work/root" -cf - . | xz -T0 -9 > "$out"
    echo "$out: $(du -h "$out" | cut -f1)" ;;
  env)
    D=/opt/deps
    if [ ! -f $D/.done ]; then mkdir -p $D && tar -C $D -xJf "${2:-.device/deps.tar.xz}" && touch $D/.done; fi
    A=$D/usr/lib/x86_64-linux-gnu
    export PKG_CONFIG_LIBDIR=$A/pkgconfig:$D/usr/share/pkgconfig:$A/openblas-pthread/pkgconfig
    export PKG_CONFIG_SYSROOT_DIR=$D
    export CMAKE_PREFIX_PATH=$D/usr
    export LD_LIBRARY_PATH=$A:$A/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export CPATH=$D/usr/include${CPATH:+:$CPATH} ;;
  *) echo "usage: scripts/device_deps.sh pack [OUT] | source scripts/device_deps.sh env [TAR]" >&2
     return 2 2>/dev/null || exit 2 ;;
esac
