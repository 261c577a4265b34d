//! The start-up object of an Android (bionic) dynamic executable, in place of the NDK's
//! `crtbegin_dynamic.o` / `crtend_android.o`: `scripts/check-android` links it into `generate`
//! for aarch64-linux-android without the NDK.
//!
//! What bionic expects of it (bionic's `libc/arch-common/bionic/crtbegin.c`, public AOSP source):
//! the kernel enters `_start` with the stack pointer at argc/argv/envp/auxv; `_start` hands that
//! address to `__libc_init(raw_args, onexit, main, structors)`, exported by `libc.so`, which
//! initialises libc, runs `main` and exits with its status. For a dynamic executable the dynamic
//! linker (`/system/bin/linker64`) has already run `.preinit_array` and `.init_array`; only the
//! `.fini_array` is passed, to run at exit (this program's Rust code registers none, so the
//! table is left empty). `__dso_handle` identifies the executable to `__cxa_atexit` and
//! `__cxa_thread_atexit_impl` (Rust's thread-local destructors pass it).
#![no_std]

use core::ffi::c_void;

/// bionic's `structors_array_t` for a dynamic executable (the three table pointers; the counts
/// after them are read only for static executables).
#[repr(C)]
pub struct Structors {
    preinit_array: *const c_void,
    init_array: *const c_void,
    fini_array: *const c_void,
    preinit_array_count: usize,
    init_array_count: usize,
    fini_array_count: usize,
}

extern "C" {
    fn __libc_init(
        raw_args: *mut c_void,
        onexit: Option<extern "C" fn()>,
        main: extern "C" fn(i32, *const *const u8, *const *const u8) -> i32,
        structors: *const Structors,
    ) -> !;
    fn main(argc: i32, argv: *const *const u8, envp: *const *const u8) -> i32;
}

/// Called by `_start` with the initial stack pointer.
#[no_mangle]
unsafe extern "C" fn mllm_dsl_start_main(raw_args: *mut c_void) -> ! {
    extern "C" fn call_main(argc: i32, argv: *const *const u8, envp: *const *const u8) -> i32 {
        // SAFETY: bionic calls this once with the process's arguments, as it would call `main`.
        unsafe { main(argc, argv, envp) }
    }
    let structors = Structors {
        preinit_array: core::ptr::null(),
        init_array: core::ptr::null(),
        fini_array: core::ptr::null(),
        preinit_array_count: 0,
        init_array_count: 0,
        fini_array_count: 0,
    };
    // SAFETY: the documented entry of bionic's libc for a dynamic executable.
    unsafe { __libc_init(raw_args, None, call_main, &structors) }
}

// The entry point: clear the frame and link registers (the end of the frame chain), pass the
// initial stack pointer.
core::arch::global_asm!(
    ".text",
    ".globl _start",
    ".type _start, %function",
    "_start:",
    "    mov x29, #0",
    "    mov x30, #0",
    "    mov x0, sp",
    "    b mllm_dsl_start_main",
    ".size _start, . - _start",
    ".hidden __dso_handle",
);

/// The executable's own handle for `__cxa_atexit` and `__cxa_thread_atexit_impl` (hidden: each
/// module has its own).
#[no_mangle]
#[used]
static __dso_handle: usize = 0;
