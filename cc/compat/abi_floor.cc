// Hidden definitions of the few symbols g++ 12's headers reference that have no older
// version to pin to (see abi_floor.h). Hidden: references inside this library bind here,
// and nothing is exported to interpose on the process's libstdc++. No standard header is
// included: each would declare these names with default visibility.
#if defined(__x86_64__) && defined(__linux__)

#define FUSEDOPT_HIDDEN __attribute__((visibility("hidden")))

extern "C" {
// glibc 2.32's flag that lets libstdc++ skip atomics while a process has one thread.
// 0 ("there may be other threads") keeps every reference count atomic: always correct.
FUSEDOPT_HIDDEN char __libc_single_threaded = 0;

// Exported by every libstdc++ since GCC 4.x (CXXABI_1.3.3 / GLIBCXX_3.4 / 3.4.21).
void fusedopt_exception_ptr_copy(void* self, const void* other);
void fusedopt_exception_ptr_destroy(void* self);
__attribute__((noreturn)) void fusedopt_throw_bad_alloc();
void fusedopt_stringstream_with_mode(void* self, int mode);
}
__asm__(".symver fusedopt_exception_ptr_copy,_ZNSt15__exception_ptr13exception_ptrC1ERKS0_@CXXABI_1.3.3");
__asm__(".symver fusedopt_exception_ptr_destroy,_ZNSt15__exception_ptr13exception_ptrD1Ev@CXXABI_1.3.3");
__asm__(".symver fusedopt_throw_bad_alloc,_ZSt17__throw_bad_allocv@GLIBCXX_3.4");
__asm__(
    ".symver fusedopt_stringstream_with_mode,"
    "_ZNSt7__cxx1118basic_stringstreamIcSt11char_traitsIcESaIcEEC1ESt13_Ios_Openmode@GLIBCXX_3.4.21");

// std::__exception_ptr::exception_ptr::_M_addref / _M_release (CXXABI_1.3.13, GCC 11),
// which GCC 11+'s inline copy constructor and destructor call: done by the old
// out-of-line copy constructor (one more reference, the copy is never destroyed) and
// destructor (on a copy of the pointer: one reference fewer, freed at zero).
extern "C" FUSEDOPT_HIDDEN void fusedopt_exception_ptr_addref(void* self) __asm__(
    "_ZNSt15__exception_ptr13exception_ptr9_M_addrefEv");
extern "C" FUSEDOPT_HIDDEN void fusedopt_exception_ptr_release(void* self) __asm__(
    "_ZNSt15__exception_ptr13exception_ptr10_M_releaseEv");
void fusedopt_exception_ptr_addref(void* self) {
  void* extra_reference = nullptr;
  fusedopt_exception_ptr_copy(&extra_reference, self);
}
void fusedopt_exception_ptr_release(void* self) {
  void* reference = *static_cast<void**>(self);
  fusedopt_exception_ptr_destroy(&reference);
}

// std::__throw_bad_array_new_length (GLIBCXX_3.4.29, GCC 11): new[] of a negative or
// overflowing count. bad_array_new_length is a bad_alloc; callers catch that.
extern "C" FUSEDOPT_HIDDEN __attribute__((noreturn)) void fusedopt_throw_bad_array_new_length() __asm__(
    "_ZSt28__throw_bad_array_new_lengthv");
void fusedopt_throw_bad_array_new_length() { fusedopt_throw_bad_alloc(); }

// std::stringstream's default constructor (GLIBCXX_3.4.26, GCC 9), which XLA's FFI
// headers use for error messages: the constructor with a mode, in | out, as the default
// one is specified to be.
extern "C" FUSEDOPT_HIDDEN void fusedopt_stringstream_default(void* self) __asm__(
    "_ZNSt7__cxx1118basic_stringstreamIcSt11char_traitsIcESaIcEEC1Ev");
void fusedopt_stringstream_default(void* self) {
  constexpr int kIn = 1 << 3, kOut = 1 << 4;  // std::ios_base::in, out (_S_in, _S_out)
  fusedopt_stringstream_with_mode(self, kIn | kOut);
}

#endif
