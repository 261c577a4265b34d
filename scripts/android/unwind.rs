//! The `_Unwind_*` entry points (the Itanium C++ ABI's unwinder interface) the Rust standard library
//! refers to, for `generate` built for Android by `scripts/check-android` without the NDK, whose
//! static `libunwind.a` would otherwise provide them.
//!
//! The binary is built with `-C panic=abort`, so no panic ever unwinds: a panic prints its message
//! and aborts. What remains are the standard library's backtrace walk and its (unused) personality
//! routine; here the walk finds no frames (`RUST_BACKTRACE` prints an empty backtrace), the
//! accessors return 0 and raising an exception reports that nothing can catch it.
#![no_std]

use core::ffi::{c_int, c_void};

/// `_URC_END_OF_STACK`: the walk (or the search for a handler) reached the end of the stack.
const END_OF_STACK: c_int = 5;

extern "C" {
    fn abort() -> !;
}

#[no_mangle]
extern "C" fn _Unwind_Backtrace(_trace: *const c_void, _arg: *mut c_void) -> c_int {
    END_OF_STACK
}

#[no_mangle]
extern "C" fn _Unwind_RaiseException(_exception: *mut c_void) -> c_int {
    END_OF_STACK
}

#[no_mangle]
extern "C" fn _Unwind_Resume(_exception: *mut c_void) -> ! {
    // SAFETY: libc's abort ends the process; unwinding cannot continue without an unwinder.
    unsafe { abort() }
}

#[no_mangle]
extern "C" fn _Unwind_DeleteException(_exception: *mut c_void) {}

#[no_mangle]
extern "C" fn _Unwind_GetIP(_context: *mut c_void) -> usize {
    0
}

#[no_mangle]
extern "C" fn _Unwind_GetIPInfo(_context: *mut c_void, ip_before_insn: *mut c_int) -> usize {
    if !ip_before_insn.is_null() {
        // SAFETY: the caller passes a valid out-pointer or null.
        unsafe { *ip_before_insn = 0 };
    }
    0
}

#[no_mangle]
extern "C" fn _Unwind_GetCFA(_context: *mut c_void) -> usize {
    0
}

#[no_mangle]
extern "C" fn _Unwind_FindEnclosingFunction(_pc: *mut c_void) -> *mut c_void {
    core::ptr::null_mut()
}

#[no_mangle]
extern "C" fn _Unwind_GetLanguageSpecificData(_context: *mut c_void) -> *mut c_void {
    core::ptr::null_mut()
}

#[no_mangle]
extern "C" fn _Unwind_GetRegionStart(_context: *mut c_void) -> usize {
    0
}

#[no_mangle]
extern "C" fn _Unwind_GetTextRelBase(_context: *mut c_void) -> usize {
    0
}

#[no_mangle]
extern "C" fn _Unwind_GetDataRelBase(_context: *mut c_void) -> usize {
    0
}

#[no_mangle]
extern "C" fn _Unwind_SetGR(_context: *mut c_void, _index: c_int, _value: usize) {}

#[no_mangle]
extern "C" fn _Unwind_SetIP(_context: *mut c_void, _value: usize) {}
