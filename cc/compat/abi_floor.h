// Force-included (-include) into every translation unit of the setup.py builds, so the
// libraries need no newer glibc/libstdc++ than the TensorFlow wheel they load into
// (TF 2.21: manylinux_2_27; glibc <= 2.27, GLIBCXX <= 3.4.22, CXXABI <= 1.3.11).
// Built with g++ 12 on glibc 2.36, a few references would otherwise bind to symbol
// versions that only new systems have. Where the old version of the same function is
// still exported, the reference is pinned to it here; the rest are defined in
// abi_floor.cc. tools/check_wheel.sh's auditwheel run is the test that nothing newer is left.
#pragma once

#if defined(__x86_64__) && defined(__linux__)
// pthread_once moved into libc in glibc 2.34; its 2.2.5 version is the same function.
__asm__(".symver pthread_once,pthread_once@GLIBC_2.2.5");
// std::condition_variable::wait: GCC 12 re-versioned it (GLIBCXX_3.4.30, so that thread
// cancellation can unwind through it); the 3.4.11 one waits the same way.
__asm__(
    ".symver _ZNSt18condition_variable4waitERSt11unique_lockISt5mutexE,"
    "_ZNSt18condition_variable4waitERSt11unique_lockISt5mutexE@GLIBCXX_3.4.11");
#endif
