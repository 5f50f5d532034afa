// Keeps libonnxmlu_ops.so loadable next to the libstdc++ of older Linux distributions.
//
// The allocators of GCC >= 11's headers call std::__throw_bad_array_new_length(), which
// libstdc++.so exports only from GLIBCXX_3.4.29 on (GCC 11; RHEL 9, Ubuntu 22.04). That one
// symbol alone would make the wheel manylinux_2_34. A hidden definition here (what the
// manylinux toolchains' libstdc++_nonshared.a does for their compilers) binds inside the library,
// so it needs nothing newer than GLIBCXX_3.4.21 (GCC 5). `auditwheel show` checks the result.
#include <new>

#if defined(__GLIBCXX__)
namespace std {
__attribute__((visibility("hidden"), noreturn)) void __throw_bad_array_new_length() {
  throw bad_array_new_length();
}
}  // namespace std
#endif
