/* <stdbool.h> as C99 defines it. */
#ifndef QNN_ABI_FREESTANDING_STDBOOL_H
#define QNN_ABI_FREESTANDING_STDBOOL_H
#define bool _Bool
#define true 1
#define false 0
#endif
