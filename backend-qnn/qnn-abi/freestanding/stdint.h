/* The fixed-width integers of <stdint.h> for LP64 Linux, as the C library defines them. */
#ifndef QNN_ABI_FREESTANDING_STDINT_H
#define QNN_ABI_FREESTANDING_STDINT_H
typedef signed char int8_t;
typedef short int16_t;
typedef int int32_t;
typedef long int64_t;
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef unsigned long uint64_t;
#endif
