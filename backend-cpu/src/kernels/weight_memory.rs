//! [`WeightBuf`]: the memory of packed weight panels, carved from slabs on transparent huge pages.
//!
//! Linux backs anonymous memory with huge pages in THP's `madvise` mode only where the range
//! was advised before first touch, and only whole, aligned 2 MiB pages ([`runtime::huge_pages`]
//! says why panels want them). Most matrices of a small model are under 2 MiB (Qwen3-0.6B's
//! projections are 0.5–1.5 MiB of int4 codes), so an allocation of their own could never hold
//! one. Buffers of [`SLAB_MIN`] bytes or more are therefore carved one after another from shared
//! slabs: fresh anonymous mappings, 2 MiB-aligned and advised before use. A slab is unmapped when
//! the last buffer carved from it is dropped (the slab still being carved from is also held by
//! the allocator until the next one replaces it). A slab that cannot be mapped is not an error;
//! the buffer then comes from the heap.

use bytemuck::Zeroable;
use memmap2::MmapMut;
use runtime::huge_pages::{self, HUGE_PAGE};
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

/// Buffers below this come from the heap: too small for a TLB miss per page to matter.
const SLAB_MIN: usize = 64 << 10;

/// Usable bytes of a shared slab; a buffer over half of it gets a slab of its own.
const SLAB_BYTES: usize = 32 << 20;

/// Start alignment of every buffer carved from a slab (a cache line, and a whole number of any
/// element's alignment).
const ALIGN: usize = 64;

/// An anonymous mapping whose usable part starts on a huge-page boundary.
struct Slab {
    _map: MmapMut,
    /// The first 2 MiB-aligned byte of the mapping.
    base: NonNull<u8>,
    /// Usable bytes from `base`.
    len: usize,
}

// SAFETY: the mapping is only reached through `base`, in the disjoint ranges `carve` hands out.
unsafe impl Send for Slab {}
unsafe impl Sync for Slab {}

impl Slab {
    fn new(len: usize) -> Option<Arc<Slab>> {
        let mut map = MmapMut::map_anon(len + HUGE_PAGE).ok()?;
        let mapped = map.as_mut_ptr();
        let start = (mapped as usize).next_multiple_of(HUGE_PAGE) - mapped as usize;
        // SAFETY: `start < HUGE_PAGE`, inside the mapping.
        let base = NonNull::new(unsafe { mapped.add(start) })?;
        huge_pages::advise(base.as_ptr(), len);
        Some(Arc::new(Slab { _map: map, base, len }))
    }
}

/// The slab buffers are being carved from, and how many of its bytes are taken.
static CURRENT: Mutex<Option<(Arc<Slab>, usize)>> = Mutex::new(None);

/// `bytes` of fresh zeroed memory inside a slab, or `None` when no slab can be mapped.
fn carve(bytes: usize) -> Option<(Arc<Slab>, NonNull<u8>)> {
    if bytes > SLAB_BYTES / 2 {
        let slab = Slab::new(bytes.next_multiple_of(HUGE_PAGE))?;
        let ptr = slab.base;
        return Some((slab, ptr));
    }
    let mut current = CURRENT.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let fits = |(slab, used): &(Arc<Slab>, usize)| used.next_multiple_of(ALIGN) + bytes <= slab.len;
    if !current.as_ref().is_some_and(fits) {
        *current = Some((Slab::new(SLAB_BYTES)?, 0));
    }
    let (slab, used) = current.as_mut()?;
    let offset = used.next_multiple_of(ALIGN);
    *used = offset + bytes;
    // Each byte range is handed out once and slabs are never reused, so it is still zero.
    let ptr = unsafe { slab.base.add(offset) };
    Some((slab.clone(), ptr))
}

/// A fixed-length buffer of weight elements: a range of a huge-page slab, or a heap `Vec` when
/// small. Dereferences to a slice.
pub struct WeightBuf<T> {
    repr: Repr<T>,
}

enum Repr<T> {
    Heap(Vec<T>),
    /// `len` elements at `ptr`, a range of `_slab` no other buffer covers.
    Slab {
        _slab: Arc<Slab>,
        ptr: NonNull<T>,
        len: usize,
    },
}

// SAFETY: a slab buffer owns its range exclusively, like a `Vec` owns its allocation; the shared
// `Slab` is only unmapped when the last buffer holding it is dropped.
unsafe impl<T: Send> Send for WeightBuf<T> {}
unsafe impl<T: Sync> Sync for WeightBuf<T> {}

impl<T: Zeroable + Clone> WeightBuf<T> {
    /// `len` zeroed elements.
    pub fn zeroed(len: usize) -> Self {
        let bytes = len * std::mem::size_of::<T>();
        debug_assert!(std::mem::align_of::<T>() <= ALIGN);
        if bytes >= SLAB_MIN {
            if let Some((slab, ptr)) = carve(bytes) {
                return WeightBuf { repr: Repr::Slab { _slab: slab, ptr: ptr.cast(), len } };
            }
        }
        WeightBuf { repr: Repr::Heap(vec![T::zeroed(); len]) }
    }
}

impl<T> Deref for WeightBuf<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        match &self.repr {
            Repr::Heap(v) => v,
            // SAFETY: `len` initialized (zeroed, then written) elements this buffer owns.
            Repr::Slab { ptr, len, .. } => unsafe { std::slice::from_raw_parts(ptr.as_ptr(), *len) },
        }
    }
}

impl<T> DerefMut for WeightBuf<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        match &mut self.repr {
            Repr::Heap(v) => v,
            // SAFETY: as `deref`, and `&mut self` makes this the only reference to the range.
            Repr::Slab { ptr, len, .. } => unsafe { std::slice::from_raw_parts_mut(ptr.as_ptr(), *len) },
        }
    }
}

impl<T: Zeroable + Clone> Clone for WeightBuf<T> {
    fn clone(&self) -> Self {
        let mut copy = WeightBuf::zeroed(self.len());
        copy.clone_from_slice(self);
        copy
    }
}

impl<T: PartialEq> PartialEq for WeightBuf<T> {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Buffers carved from one slab do not overlap, start zeroed, and a clone is its own copy.
    #[test]
    fn carved_buffers_are_disjoint_zeroed_and_clone_deeply() {
        let mut bufs: Vec<WeightBuf<u32>> = (0..40).map(|i| WeightBuf::zeroed(SLAB_MIN / 4 + 37 * i)).collect();
        for (i, b) in bufs.iter_mut().enumerate() {
            assert!(b.iter().all(|&x| x == 0), "buffer {i} is not zeroed");
            assert_eq!(b.as_ptr() as usize % ALIGN, 0);
            b.fill(i as u32 + 1);
        }
        for (i, b) in bufs.iter().enumerate() {
            assert!(b.iter().all(|&x| x == i as u32 + 1), "buffer {i} was overwritten by another");
        }
        let copy = bufs[3].clone();
        assert!(copy == bufs[3] && copy.as_ptr() != bufs[3].as_ptr());
        drop(bufs);
        assert!(copy.iter().all(|&x| x == 4));
        let small: WeightBuf<u8> = WeightBuf::zeroed(100);
        assert_eq!(small.len(), 100);
    }

    /// The slabs reach the kernel advised: `/proc/self/smaps` lists a carved buffer's mapping with
    /// the `hg` flag (MADV_HUGEPAGE; set whether or not THP then backs it).
    #[cfg(target_os = "linux")]
    #[test]
    fn a_carved_buffer_lies_in_a_mapping_advised_onto_huge_pages() {
        for bytes in [SLAB_MIN, 1 << 20, SLAB_BYTES] {
            let buf: WeightBuf<u8> = WeightBuf::zeroed(bytes);
            let flags = huge_pages::vm_flags(buf.as_ptr() as usize);
            let flags = flags.expect("the buffer's mapping is in /proc/self/smaps");
            assert!(flags.split_whitespace().any(|f| f == "hg"), "{bytes} bytes: VmFlags without hg: {flags}");
        }
    }
}
