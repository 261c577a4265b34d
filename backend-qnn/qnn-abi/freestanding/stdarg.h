/* <stdarg.h>'s va_list, the compiler's builtin type as clang's own header names it. */
#ifndef QNN_ABI_FREESTANDING_STDARG_H
#define QNN_ABI_FREESTANDING_STDARG_H
typedef __builtin_va_list va_list;
#endif
