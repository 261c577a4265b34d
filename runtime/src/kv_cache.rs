//! The static-shape KV cache of mllm's NPU runtime (`KVCacheManager`), without its full-context
//! off-by-one.
//!
//! Per layer, K is `[Hkv, D, ctx-ar]`: `Hkv*D` rows, one column per position; V is
//! `[Hkv, ctx-ar, D]`: one `D`-row per position inside each head block. The graph in use reads the
//! first `Hkv*D*(ctx-ar)` elements of each buffer directly, so the row stride must equal `ctx - ar`
//! of that graph: 992 for a chunk-32 prefill graph at ctx 1024, 1023 for the decode graph.
//! [`KvCache::rearrange`] re-strides in place when switching graphs. Buffers hold `ctx - 1` columns,
//! the widest stride (ar = 1).
//!
//! Invariant: columns at or past [`KvCache::len`] hold `T::default()`. A graph that lets masked
//! columns leak a tiny weight (`rowmin - 20` masking) then sees the same values whatever the cache's
//! history, which keeps runs reproducible.

use super::error::RuntimeError;
use super::model::ModelLayout;
use std::sync::Arc;

/// K/V every sequence starts from at positions `0..len` (an attention-sink prefix computed ahead
/// of time), per layer: K `[Hkv, D, len]`, V `[Hkv, len, D]`, in the cache's element type.
#[derive(Debug, Clone, PartialEq)]
pub struct KvPrefix<T> {
    pub len: usize,
    pub keys: Vec<Vec<T>>,
    pub values: Vec<Vec<T>>,
}

/// KV cache of all layers, generic over the stored element (`u8` codes of a quantized cache, `f32`
/// values of a float one).
#[derive(Debug, Clone)]
pub struct KvCache<T> {
    layout: ModelLayout,
    ar: usize,
    len: usize,
    /// Per layer; shared (not copied) with a backend that reads the past in place during a chunk
    /// ([`KvCache::key_buffer`]). Writes go through `Arc::make_mut`, which copies only while a
    /// backend still holds a buffer (it does not outside `run_chunk`).
    keys: Vec<Arc<Vec<T>>>,
    values: Vec<Arc<Vec<T>>>,
}

impl<T: Copy + Default> KvCache<T> {
    /// An empty cache laid out for chunks of `ar` tokens.
    pub fn new(layout: ModelLayout, ar: usize) -> Result<Self, RuntimeError> {
        layout.validate()?;
        layout.check_chunk_len(ar)?;
        let capacity = layout.kv_elems(layout.context_len - 1);
        // Written now, not zero pages mapped lazily: a K row holds one column per position, so the
        // first chunk touches every page of the cache (ctx 1024 at f32: 60 000 page faults).
        // Taking them here keeps them out of the first prompt's latency.
        let buffer = || {
            let mut buf = Vec::with_capacity(capacity);
            // Before the first write: each K row read is a context wide, a page apart on 4 KiB pages.
            let spare = buf.spare_capacity_mut();
            crate::huge_pages::advise(spare.as_ptr().cast(), std::mem::size_of_val(spare));
            buf.resize(capacity, T::default());
            Arc::new(buf)
        };
        Ok(Self {
            layout,
            ar,
            len: 0,
            keys: (0..layout.num_layers).map(|_| buffer()).collect(),
            values: (0..layout.num_layers).map(|_| buffer()).collect(),
        })
    }

    /// Chunk length the rows are strided for.
    pub fn ar(&self) -> usize {
        self.ar
    }

    /// Past columns of the current layout, `ctx - ar` (the row stride).
    pub fn past_cols(&self) -> usize {
        self.layout.context_len - self.ar
    }

    /// Positions stored (columns `[0, len)` are valid in every layer that was updated).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no position is stored.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Shapes this cache was built for.
    pub fn layout(&self) -> &ModelLayout {
        &self.layout
    }

    /// Past keys of `layer` as the current graph reads them: `[Hkv, D, ctx-ar]`.
    ///
    /// # Panics
    /// If `layer >= num_layers` (a backend bug, not an input error).
    pub fn past_key(&self, layer: usize) -> &[T] {
        &self.keys[layer][..self.layout.kv_elems(self.past_cols())]
    }

    /// Past values of `layer`: `[Hkv, ctx-ar, D]`.
    ///
    /// # Panics
    /// If `layer >= num_layers`.
    pub fn past_value(&self, layer: usize) -> &[T] {
        &self.values[layer][..self.layout.kv_elems(self.past_cols())]
    }

    /// The whole buffer [`past_key`](Self::past_key) is the start of, to share instead of copy.
    ///
    /// # Panics
    /// If `layer >= num_layers`.
    pub fn key_buffer(&self, layer: usize) -> &Arc<Vec<T>> {
        &self.keys[layer]
    }

    /// The whole buffer [`past_value`](Self::past_value) is the start of.
    ///
    /// # Panics
    /// If `layer >= num_layers`.
    pub fn value_buffer(&self, layer: usize) -> &Arc<Vec<T>> {
        &self.values[layer]
    }

    /// Forgets every stored position (restores the all-default invariant).
    pub fn clear(&mut self) {
        let (rows, heads, d, stride) = self.dims();
        for layer in 0..self.layout.num_layers {
            for r in 0..rows {
                Arc::make_mut(&mut self.keys[layer])[r * stride..r * stride + self.len].fill(T::default());
            }
            for h in 0..heads {
                let start = h * stride * d;
                Arc::make_mut(&mut self.values[layer])[start..start + self.len * d].fill(T::default());
            }
        }
        self.len = 0;
    }

    /// Re-strides every buffer for chunks of `new_ar`, keeping the stored positions.
    ///
    /// Growing rows (32 -> 1: 992 -> 1023 columns) moves rows from the last to the first, so a
    /// row's new place never overwrites a row not yet moved; shrinking walks forwards. Fails if the
    /// stored positions do not fit the new rows.
    pub fn rearrange(&mut self, new_ar: usize) -> Result<(), RuntimeError> {
        self.layout.check_chunk_len(new_ar)?;
        if new_ar == self.ar {
            return Ok(());
        }
        let old_stride = self.past_cols();
        let new_stride = self.layout.context_len - new_ar;
        if self.len > new_stride {
            return Err(RuntimeError::RearrangeLosesData { ar: new_ar, len: self.len, past_cols: new_stride });
        }
        let rows = self.layout.num_kv_heads * self.layout.head_dim;
        let heads = self.layout.num_kv_heads;
        let d = self.layout.head_dim;
        let len = self.len;
        for layer in 0..self.layout.num_layers {
            // K: `rows` rows of `len` valid columns; V: `heads` blocks of `len * d` valid elements.
            restride(Arc::make_mut(&mut self.keys[layer]).as_mut_slice(), rows, old_stride, new_stride, len);
            restride(
                Arc::make_mut(&mut self.values[layer]).as_mut_slice(),
                heads,
                old_stride * d,
                new_stride * d,
                len * d,
            );
        }
        self.ar = new_ar;
        Ok(())
    }

    /// The same positions in a new cache for `layout` (another context length of the same model,
    /// e.g. a larger graph of its family) laid out for chunks of `ar`: every stored K column and V
    /// row copied into rows of the new stride `layout.context_len - ar`.
    pub fn moved_to(&self, layout: ModelLayout, ar: usize) -> Result<KvCache<T>, RuntimeError> {
        let same = ModelLayout { context_len: self.layout.context_len, ..layout };
        if same != self.layout {
            return Err(RuntimeError::InvalidLayout {
                field: "num_layers/num_kv_heads/head_dim/vocab_size",
                value: layout.num_layers,
                expected: "the layout of the cache being moved (only the context length may change)",
            });
        }
        let mut moved = KvCache::new(layout, ar)?;
        let (rows, heads, d, old) = self.dims();
        let new = moved.past_cols();
        let len = self.len;
        if len > new {
            return Err(RuntimeError::ContextTooSmall { context_len: layout.context_len, len });
        }
        for layer in 0..self.layout.num_layers {
            let keys = Arc::make_mut(&mut moved.keys[layer]);
            for r in 0..rows {
                keys[r * new..r * new + len].copy_from_slice(&self.keys[layer][r * old..r * old + len]);
            }
            let values = Arc::make_mut(&mut moved.values[layer]);
            for h in 0..heads {
                let (src, dst) = (h * old * d, h * new * d);
                values[dst..dst + len * d].copy_from_slice(&self.values[layer][src..src + len * d]);
            }
        }
        moved.len = len;
        Ok(moved)
    }

    /// Copies the first `n_update` positions of a chunk's present K `[Hkv, D, ar]` and V
    /// `[Hkv, ar, D]` into `layer`'s cache at positions `[n_past, n_past + n_update)`.
    ///
    /// Unlike mllm (which writes one column past a 1023-wide row at position 1023), a write that
    /// does not fit the `ctx - ar` past columns is an error.
    pub fn update(
        &mut self,
        layer: usize,
        present_k: &[T],
        present_v: &[T],
        ar: usize,
        n_past: usize,
        n_update: usize,
    ) -> Result<(), RuntimeError> {
        if layer >= self.layout.num_layers {
            return Err(RuntimeError::LayerOutOfRange { layer, num_layers: self.layout.num_layers });
        }
        if ar != self.ar {
            return Err(RuntimeError::CacheChunkMismatch { cache_ar: self.ar, ar });
        }
        if n_update > ar {
            return Err(RuntimeError::UpdateLongerThanChunk { n_update, ar });
        }
        let expected = self.layout.kv_elems(ar);
        for (tensor, got) in [("present_key", present_k.len()), ("present_value", present_v.len())] {
            if got != expected {
                return Err(RuntimeError::TensorSize { tensor, layer, expected, got });
            }
        }
        self.write_columns(layer, (present_k, present_v), ar, n_past, n_update)
    }

    /// Writes `prefix` at positions `[0, prefix.len)` of every layer (the cache is then at least
    /// that long).
    pub fn write_prefix(&mut self, prefix: &KvPrefix<T>) -> Result<(), RuntimeError> {
        let layers = self.layout.num_layers;
        if prefix.keys.len() != layers || prefix.values.len() != layers {
            return Err(RuntimeError::PrefixLayers {
                keys: prefix.keys.len(),
                values: prefix.values.len(),
                num_layers: layers,
            });
        }
        // Every layer checked before any is written: a refused prefix leaves the cache as it was.
        let expected = self.layout.kv_elems(prefix.len);
        for layer in 0..layers {
            for (tensor, got) in
                [("prefix key", prefix.keys[layer].len()), ("prefix value", prefix.values[layer].len())]
            {
                if got != expected {
                    return Err(RuntimeError::TensorSize { tensor, layer, expected, got });
                }
            }
        }
        for layer in 0..layers {
            let (k, v) = (&prefix.keys[layer], &prefix.values[layer]);
            self.write_columns(layer, (k, v), prefix.len.max(1), 0, prefix.len)?;
        }
        Ok(())
    }

    /// Copies the first `n` columns of K `[Hkv, D, cols]` and V `[Hkv, cols, D]` into `layer`'s
    /// cache at positions `[at, at + n)`.
    fn write_columns(
        &mut self,
        layer: usize,
        kv: (&[T], &[T]),
        cols: usize,
        at: usize,
        n: usize,
    ) -> Result<(), RuntimeError> {
        let (rows, heads, d, stride) = self.dims();
        if at + n > stride {
            return Err(RuntimeError::CacheOverflow {
                layer,
                n_past: at,
                n_update: n,
                ar: self.ar,
                past_cols: stride,
                context_len: self.layout.context_len,
            });
        }
        let keys = Arc::make_mut(&mut self.keys[layer]);
        if n == 1 {
            // A decode step writes one element per K row, each row a cache line of its own that
            // the step's weight streaming has evicted: ask for all the layer's lines into L2
            // first, so that many misses are in flight at once, then store directly (a copy
            // call per element cost as much again). Qwen3-0.6B's 28 x 1024 rows after 256 MB of
            // streaming: 318-342 us without prefetching, 337-355 us prefetching 16 rows ahead
            // into L1, 231-240 us this way.
            for r in 0..rows {
                prefetch_l2(&keys[r * stride + at]);
            }
            for r in 0..rows {
                keys[r * stride + at] = kv.0[r * cols];
            }
        } else {
            for (dst, src) in keys.chunks_exact_mut(stride).zip(kv.0.chunks_exact(cols)).take(rows) {
                dst[at..at + n].copy_from_slice(&src[..n]);
            }
        }
        let value_blocks =
            Arc::make_mut(&mut self.values[layer]).chunks_exact_mut(stride * d).zip(kv.1.chunks_exact(cols * d));
        for (dst, src) in value_blocks.take(heads) {
            dst[at * d..(at + n) * d].copy_from_slice(&src[..n * d]);
        }
        self.len = self.len.max(at + n);
        Ok(())
    }

    /// (K rows, heads, head_dim, row stride) of the current layout.
    fn dims(&self) -> (usize, usize, usize, usize) {
        let l = &self.layout;
        (l.num_kv_heads * l.head_dim, l.num_kv_heads, l.head_dim, self.past_cols())
    }
}

/// Asks the CPU to bring the cache line holding `x` into its L2 cache (a hint; nothing elsewhere).
#[inline(always)]
fn prefetch_l2<T>(x: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch reads nothing architecturally and `x` is a valid reference.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>((x as *const T).cast())
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = x;
}

/// Moves `blocks` blocks from stride `old` to stride `new` in place, keeping the first `valid`
/// elements of each. Given the cache invariant (everything outside the valid elements holds the
/// default value), only the old valid elements that no new block covers need clearing: nothing at
/// all for an empty cache, instead of a pass over the whole buffer.
fn restride<T: Copy + Default>(buf: &mut [T], blocks: usize, old: usize, new: usize, valid: usize) {
    if valid == 0 {
        return;
    }
    let mut move_block = |b: usize| buf.copy_within(b * old..b * old + valid, b * new);
    if new > old {
        // Block b lands at or after its old start, over blocks > b: move those first.
        (0..blocks).rev().for_each(&mut move_block);
    } else {
        // Block b lands at or before its old start, over blocks < b: move those first.
        (0..blocks).for_each(&mut move_block);
    }
    for b in 0..blocks {
        let (mut at, end) = (b * old, b * old + valid);
        while at < end {
            let block = at / new;
            let (kept, block_end) = (block * new + valid, (block + 1) * new);
            if block < blocks && at < kept {
                at = kept.min(end);
            } else {
                let stop = if block < blocks { block_end.min(end) } else { end };
                buf[at..stop].fill(T::default());
                at = stop;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(ctx: usize) -> ModelLayout {
        ModelLayout {
            num_layers: 2,
            num_kv_heads: 3,
            head_dim: 4,
            vocab_size: 10,
            context_len: ctx,
            sliding_window: None,
        }
    }

    /// A cache buffer spanning huge pages is advised onto them before its first write.
    #[cfg(target_os = "linux")]
    #[test]
    fn large_buffers_are_advised_onto_huge_pages() {
        use crate::huge_pages::{vm_flags, HUGE_PAGE};
        // 8 MiB buffers: the huge page that starts below their middle lies wholly inside them.
        let l = ModelLayout { num_kv_heads: 8, head_dim: 128, context_len: 2048, ..layout(2048) };
        let cache = KvCache::<f32>::new(l, 1).unwrap();
        for buf in [cache.key_buffer(1), cache.value_buffer(0)] {
            let middle = (buf.as_ptr() as usize + buf.len() * 2) / HUGE_PAGE * HUGE_PAGE;
            let flags = vm_flags(middle).expect("the buffer is mapped");
            assert!(flags.split_whitespace().any(|f| f == "hg"), "VmFlags without hg: {flags}");
            assert!(buf.iter().all(|&x| x == 0.0));
        }
    }

    /// Distinct value for every (layer, head, dim, position) of K or V.
    fn val(kind: u8, layer: usize, h: usize, d: usize, pos: usize) -> u16 {
        1 + kind as u16 * 5000 + layer as u16 * 1000 + h as u16 * 200 + d as u16 * 40 + pos as u16
    }

    /// Present K `[H, D, ar]` and V `[H, ar, D]` for positions `start..start+ar`.
    fn present(l: &ModelLayout, layer: usize, ar: usize, start: usize) -> (Vec<u16>, Vec<u16>) {
        let (h_n, d_n) = (l.num_kv_heads, l.head_dim);
        let mut k = vec![0; h_n * d_n * ar];
        let mut v = vec![0; h_n * d_n * ar];
        for h in 0..h_n {
            for d in 0..d_n {
                for i in 0..ar {
                    k[(h * d_n + d) * ar + i] = val(0, layer, h, d, start + i);
                    v[(h * ar + i) * d_n + d] = val(1, layer, h, d, start + i);
                }
            }
        }
        (k, v)
    }

    /// Checks every element of the visible past K/V against `val` for positions < len, 0 after (and
    /// 0 in the rest of each buffer).
    fn assert_contents(cache: &KvCache<u16>, len: usize) {
        let l = *cache.layout();
        let s = cache.past_cols();
        for layer in 0..l.num_layers {
            let (k, v) = (cache.past_key(layer), cache.past_value(layer));
            assert_eq!(k.len(), l.num_kv_heads * l.head_dim * s);
            // The buffers' tails past the visible layout keep the invariant too.
            assert!(cache.keys[layer][k.len()..].iter().all(|&x| x == 0), "K tail l{layer}");
            assert!(cache.values[layer][v.len()..].iter().all(|&x| x == 0), "V tail l{layer}");
            for h in 0..l.num_kv_heads {
                for d in 0..l.head_dim {
                    for c in 0..s {
                        let (ek, ev) = if c < len { (val(0, layer, h, d, c), val(1, layer, h, d, c)) } else { (0, 0) };
                        assert_eq!(k[(h * l.head_dim + d) * s + c], ek, "K l{layer} h{h} d{d} c{c}");
                        assert_eq!(v[(h * s + c) * l.head_dim + d], ev, "V l{layer} h{h} d{d} c{c}");
                    }
                }
            }
        }
    }

    fn fill(cache: &mut KvCache<u16>, ar: usize, n: usize) {
        let l = *cache.layout();
        let mut n_past = 0;
        while n_past < n {
            let n_update = ar.min(n - n_past);
            for layer in 0..l.num_layers {
                let (k, v) = present(&l, layer, ar, n_past);
                cache.update(layer, &k, &v, ar, n_past, n_update).unwrap();
            }
            n_past += n_update;
        }
    }

    #[test]
    fn update_places_columns_and_rows() {
        let mut cache = KvCache::<u16>::new(layout(16), 4).unwrap();
        fill(&mut cache, 4, 7);
        assert_eq!(cache.len(), 7);
        assert_contents(&cache, 7);
    }

    #[test]
    fn a_prefix_fills_the_first_columns_then_updates_continue_after_it() {
        let l = layout(16);
        let mut cache = KvCache::<u16>::new(l, 4).unwrap();
        // A 3-position prefix: present() of positions 0..3 with a chunk of exactly 3.
        let (keys, values): (Vec<_>, Vec<_>) = (0..l.num_layers).map(|layer| present(&l, layer, 3, 0)).unzip();
        let prefix = KvPrefix { len: 3, keys, values };
        cache.write_prefix(&prefix).unwrap();
        assert_eq!(cache.len(), 3);
        assert_contents(&cache, 3);
        for layer in 0..l.num_layers {
            let (k, v) = present(&l, layer, 4, 3);
            cache.update(layer, &k, &v, 4, 3, 4).unwrap();
        }
        assert_contents(&cache, 7);
        // Survives re-striding for the decode graph.
        cache.rearrange(1).unwrap();
        assert_contents(&cache, 7);

        let mut short = prefix.clone();
        short.values[1].pop();
        let err = cache.write_prefix(&short).unwrap_err();
        assert!(matches!(err, RuntimeError::TensorSize { tensor: "prefix value", layer: 1, .. }), "{err}");
        let mut one_layer = prefix.clone();
        one_layer.keys.pop();
        let err = cache.write_prefix(&one_layer).unwrap_err();
        assert_eq!(err.to_string(), "the K/V prefix holds 1 key and 2 value layers; the model has 2 layers");
        let mut long = prefix.clone();
        long.len = 16;
        assert!(cache.write_prefix(&long).is_err());
    }

    #[test]
    fn rearrange_preserves_contents_both_ways() {
        let l = layout(16);
        let mut cache = KvCache::<u16>::new(l, 4).unwrap();
        fill(&mut cache, 4, 10);
        cache.rearrange(1).unwrap(); // 12 -> 15 columns: rows walk backwards
        assert_eq!(cache.past_cols(), 15);
        assert_contents(&cache, 10);
        // Continue the sequence in the decode layout, then shrink back.
        for layer in 0..l.num_layers {
            let (k, v) = present(&l, layer, 1, 10);
            cache.update(layer, &k, &v, 1, 10, 1).unwrap();
        }
        cache.rearrange(5).unwrap(); // 15 -> 11 columns: rows walk forwards
        assert_contents(&cache, 11);
        cache.rearrange(2).unwrap();
        assert_contents(&cache, 11);
    }

    #[test]
    fn rearrange_works_for_u8_and_refuses_to_drop_positions() {
        let l = layout(8);
        let mut cache = KvCache::<u8>::new(l, 1).unwrap();
        let k: Vec<u8> = (0..12).map(|i| i as u8 + 1).collect();
        for n_past in 0..6 {
            for layer in 0..2 {
                cache.update(layer, &k, &k, 1, n_past, 1).unwrap();
            }
        }
        let before: Vec<u8> = (0..12).flat_map(|r| cache.past_key(0)[r * 7..r * 7 + 6].to_vec()).collect();
        let err = cache.rearrange(4).unwrap_err();
        assert!(matches!(err, RuntimeError::RearrangeLosesData { len: 6, past_cols: 4, .. }), "{err}");
        cache.rearrange(2).unwrap();
        let after: Vec<u8> = (0..12).flat_map(|r| cache.past_key(0)[r * 6..r * 6 + 6].to_vec()).collect();
        assert_eq!(before, after);
    }

    #[test]
    fn update_past_the_row_is_an_error_not_a_silent_write() {
        // ctx 8, decode layout: 7 past columns. mllm writes position 7 one past the row.
        let l = layout(8);
        let mut cache = KvCache::<u16>::new(l, 1).unwrap();
        let (k, v) = present(&l, 0, 1, 0);
        cache.update(0, &k, &v, 1, 6, 1).unwrap();
        let err = cache.update(0, &k, &v, 1, 7, 1).unwrap_err();
        assert!(matches!(err, RuntimeError::CacheOverflow { n_past: 7, n_update: 1, past_cols: 7, .. }), "{err}");
        // Prefill layout ar = 4: 4 past columns; a 3-token update at 2 does not fit.
        let mut cache = KvCache::<u16>::new(l, 4).unwrap();
        let (k, v) = present(&l, 1, 4, 0);
        assert!(cache.update(1, &k, &v, 4, 2, 3).is_err());
        cache.update(1, &k, &v, 4, 1, 3).unwrap();
        assert_eq!(cache.len(), 4);
    }

    #[test]
    fn update_rejects_wrong_shapes() {
        let l = layout(8);
        let mut cache = KvCache::<u16>::new(l, 4).unwrap();
        let (k, v) = present(&l, 0, 4, 0);
        assert!(matches!(
            cache.update(0, &k, &v, 1, 0, 1),
            Err(RuntimeError::CacheChunkMismatch { cache_ar: 4, ar: 1 })
        ));
        assert!(matches!(
            cache.update(0, &k[1..], &v, 4, 0, 1),
            Err(RuntimeError::TensorSize { tensor: "present_key", .. })
        ));
        assert!(matches!(
            cache.update(2, &k, &v, 4, 0, 1),
            Err(RuntimeError::LayerOutOfRange { layer: 2, num_layers: 2 })
        ));
        assert!(matches!(cache.update(0, &k, &v, 4, 0, 5), Err(RuntimeError::UpdateLongerThanChunk { .. })));
        assert!(KvCache::<u16>::new(l, 0).is_err());
        assert!(KvCache::<u16>::new(l, 9).is_err());
    }

    #[test]
    fn moving_to_a_larger_context_keeps_every_position() {
        let mut cache = KvCache::<u16>::new(layout(16), 4).unwrap();
        fill(&mut cache, 4, 9);
        let moved = cache.moved_to(layout(40), 1).unwrap();
        assert_eq!((moved.len(), moved.past_cols()), (9, 39));
        assert_contents(&moved, 9);
        // And back into a context whose rows still hold them.
        let back = moved.moved_to(layout(12), 2).unwrap();
        assert_contents(&back, 9);
        assert!(matches!(moved.moved_to(layout(8), 1), Err(RuntimeError::ContextTooSmall { context_len: 8, len: 9 })));
    }

    #[test]
    fn clear_restores_defaults() {
        let mut cache = KvCache::<u16>::new(layout(16), 4).unwrap();
        fill(&mut cache, 4, 9);
        cache.clear();
        assert!(cache.is_empty());
        assert_contents(&cache, 0);
    }

    #[test]
    fn a_shared_buffer_is_the_past_and_a_write_leaves_the_holder_its_copy() {
        let mut cache = KvCache::<u16>::new(layout(16), 1).unwrap();
        fill(&mut cache, 1, 5);
        // The shared buffers start with exactly the past the graph reads.
        let (held_k, held_v) = (cache.key_buffer(1).clone(), cache.value_buffer(1).clone());
        assert_eq!(&held_k[..cache.past_key(1).len()], cache.past_key(1));
        assert_eq!(&held_v[..cache.past_value(1).len()], cache.past_value(1));
        // Written while a holder still shares them: the cache gets the new column, the holder keeps
        // what it was given.
        let before = held_k.to_vec();
        let (k, v) = present(&layout(16), 1, 1, 5);
        cache.update(1, &k, &v, 1, 5, 1).unwrap();
        assert_eq!(held_k.to_vec(), before);
        let stride = cache.past_cols();
        assert_eq!(cache.past_key(1)[5], val(0, 1, 0, 0, 5));
        assert_eq!(cache.past_key(1)[stride + 5], val(0, 1, 0, 1, 5));
        assert_eq!(held_k[5], u16::default());
        // Released, the buffer is written in place again.
        drop((held_k, held_v));
        let at = std::sync::Arc::as_ptr(cache.key_buffer(0));
        let (k, v) = present(&layout(16), 0, 1, 6);
        cache.update(0, &k, &v, 1, 6, 1).unwrap();
        assert_eq!(std::sync::Arc::as_ptr(cache.key_buffer(0)), at);
    }
}
