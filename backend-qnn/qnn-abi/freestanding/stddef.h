/* The one <stddef.h> name the clean-room QNN declarations use, for x86_64 / aarch64 Linux (LP64),
 * so that generating the bindings needs no C library or compiler headers. */
#ifndef QNN_ABI_FREESTANDING_STDDEF_H
#define QNN_ABI_FREESTANDING_STDDEF_H
typedef unsigned long size_t;
#endif
